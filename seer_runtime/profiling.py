"""Named ranges for Nsight Systems and the torch profiler, free unless switched on.

``SEER_PROFILE=nvtx`` wraps ranges in ``nvtx.annotate`` (the ``nvtx`` package, extra ``cuda``),
or ``torch.cuda.nvtx`` when that package is absent; a torch without NVTX (the CPU build) makes
them no-ops, said once (RuntimeWarning). ``SEER_PROFILE=torch`` uses
``torch.profiler.record_function``. Unset (the default), :func:`prange` returns a shared
``nullcontext``. The choice is made once, at the first call; :func:`enabled` switches a mode on
for a block, and :func:`trace` takes a torch profile of a block and writes it as a Chrome trace
(what ``seer generate --profile PATH`` does). While ranges are on, every ``seer::`` op call goes
through the torch dispatcher (so the torch profiler records it as ``seer::<op>``), inside an NVTX
range of that name in the nvtx mode (``seer_kernels._dispatch.set_op_ranges``).

Range names: ``generate``, ``embed``, ``prefill``, ``step``, ``forward``, ``layers`` (one
forward's layer loop), ``sample``, ``commit/<rule>`` (the commit rule: llada, dream, threshold),
``seer/probe`` (step 0's boundary: the sparsity SNR test or the end probability), ``seer/cut``,
``seer/guard``, ``dyllm/attention`` (a sparse layer's K/V exchange and attention) with
``dyllm/partial_attention`` inside, ``dyllm/saliency``, ``dyllm/ffn_rows`` (the FFN of the
salient rows), ``router/route`` and ``router/static`` / ``router/varlen`` / ``router/eager`` (the
path picked and its layout), ``graph/capture[...]``, ``graph/replay[...]`` (the router's graph
cache, per key), ``graph/capture``, ``graph/replay`` and ``graph/eager`` (the step graphs: a keyed
unit captured, replayed, or run eagerly at its first sight). Keep them out of CUDA-graph captures
(a range inside a capture is recorded once, not per replay): a replayed step shows as its
``graph/replay`` range. :func:`observe` lets a tool see the ranges too (``sync_audit`` counts
syncs per range).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path

_NULL = contextlib.nullcontext()
_factory = None
MODES = ("nvtx", "torch")


def _null(name: str):
    return _NULL


def _nvtx_factory():
    """NVTX ranges: the ``nvtx`` package, else torch's; None (said once) when neither works here."""
    try:
        import nvtx

        return lambda name: nvtx.annotate(name)
    except ImportError:
        pass
    import torch

    try:  # the CPU build of torch has no NVTX: "NVTX functions not installed"
        torch.cuda.nvtx.range_push("seer")
        torch.cuda.nvtx.range_pop()
    except (RuntimeError, AttributeError) as exc:
        warnings.warn(f"SEER_PROFILE=nvtx: no NVTX in this torch build ({exc}); the ranges are off "
                      "(pip install nvtx, or a CUDA build of torch)", RuntimeWarning, stacklevel=4)
        return None

    @contextlib.contextmanager
    def _torch_nvtx(name):
        torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()

    return _torch_nvtx


def _factory_for(mode: str):
    """The range factory of ``mode`` (None: ranges off)."""
    mode = mode.lower()
    if mode == "nvtx":
        return _nvtx_factory()
    if mode == "torch":
        import torch

        return lambda name: torch.profiler.record_function(name)
    if mode not in ("", "off", "0"):
        raise ValueError(f"SEER_PROFILE must be nvtx, torch or unset, got {mode!r}")
    return None


def _set_op_ranges(mode: str, factory) -> object:
    """Route the ``seer::`` ops through the dispatcher while ranges are on (module docstring);
    returns what was set before."""
    from seer_kernels._dispatch import set_op_ranges

    if factory is None:
        return set_op_ranges(None)
    return set_op_ranges(factory if mode == "nvtx" else _null)  # torch: the profiler records the op itself


def _choose():
    mode = os.environ.get("SEER_PROFILE", "")
    factory = _factory_for(mode)
    if factory is not None:
        _set_op_ranges(mode.lower(), factory)
    return factory


_observers: list = []


def prange(name: str):
    """A context manager marking ``name`` for the profiler in use (a no-op by default)."""
    global _factory
    if _factory is None:
        _factory = _choose() or _null
    if _observers:
        return _Observed(name, _factory(name))
    return _factory(name)


@contextlib.contextmanager
def enabled(mode: str = "torch"):
    """Within the block, ranges go to ``mode`` (``"torch"``: ``record_function``; ``"nvtx"``),
    whatever ``SEER_PROFILE`` says; the previous choice comes back after it."""
    global _factory
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    factory = _factory_for(mode)
    previous = _factory
    previous_ops = _set_op_ranges(mode, factory)
    _factory = factory or _null
    try:
        yield
    finally:
        _factory = previous
        from seer_kernels._dispatch import set_op_ranges

        set_op_ranges(previous_ops)


@contextlib.contextmanager
def trace(path: str | os.PathLike):
    """Profile the block with ``torch.profiler`` (CPU, and CUDA when a device is there) with the
    ranges on (:func:`enabled`), then write a Chrome trace to ``path`` (JSON: open it in Perfetto,
    https://ui.perfetto.dev, or chrome://tracing), replacing it atomically; nothing is written
    when the block raises. Yields the ``torch.profiler.profile`` object."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    path = Path(path)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = profile(activities=activities)
    with enabled("torch"):
        with _quiet_stderr():  # the profiler's C++ side prints "profiler_start" / "_stop" lines there
            prof.start()
        try:
            yield prof
        finally:
            with _quiet_stderr():
                prof.stop()
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        prof.export_chrome_trace(str(part))
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 sent to the null device within the block (what C++ code prints there)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no descriptor 2 to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class _Observed:
    """A range seen by the observers (``enter`` before ``inner``'s, ``exit`` after, also on an
    error) as a plain class: a generator-based context manager costs a replayed step's host several
    microseconds per range."""

    __slots__ = ("name", "inner")

    def __init__(self, name: str, inner) -> None:
        self.name, self.inner = name, inner

    def __enter__(self):
        for o in _observers:
            o.enter(self.name)
        if self.inner is _NULL:
            return None
        try:
            return self.inner.__enter__()
        except BaseException:
            self._exit_observers()
            raise

    def __exit__(self, *exc):
        if self.inner is _NULL:
            self._exit_observers()
            return None
        try:
            return self.inner.__exit__(*exc)
        finally:
            self._exit_observers()

    def _exit_observers(self) -> None:
        for o in reversed(_observers):
            o.exit(self.name)


@contextlib.contextmanager
def observe(observer):
    """Within the block, ``observer.enter(name)`` / ``observer.exit(name)`` are called around every range."""
    _observers.append(observer)
    try:
        yield observer
    finally:
        _observers.remove(observer)


def reset() -> None:
    """Re-read ``SEER_PROFILE`` at the next call (tests)."""
    global _factory
    _factory = None
    from seer_kernels._dispatch import set_op_ranges

    set_op_ranges(None)
