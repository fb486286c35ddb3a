"""Named ranges for Nsight Systems and the torch profiler, free unless switched on.

``SEER_PROFILE=nvtx`` wraps ranges in ``nvtx.annotate`` (the ``nvtx`` package, extra ``cuda``),
or ``torch.cuda.nvtx`` when that package is absent; ``SEER_PROFILE=torch`` uses
``torch.profiler.record_function``. Unset (the default), :func:`prange` returns a shared
``nullcontext``. The choice is made once, at the first call.

Range names: ``generate``, ``embed``, ``prefill``, ``step``, ``forward``, ``layers`` (one
forward's layer loop), ``sample``, ``graph/capture[...]``, ``graph/replay[...]`` (the router's
graph cache, per key), ``graph/capture``, ``graph/replay`` and ``graph/eager`` (the step graphs:
a keyed unit captured, replayed, or run eagerly at its first sight). Keep them out
of CUDA-graph captures (a range inside a capture is recorded once, not per replay).
:func:`observe` lets a tool see the ranges too (``sync_audit`` counts syncs per range).
"""

from __future__ import annotations

import contextlib
import os

_NULL = contextlib.nullcontext()
_factory = None


def _choose():
    mode = os.environ.get("SEER_PROFILE", "").lower()
    if mode == "nvtx":
        try:
            import nvtx

            return lambda name: nvtx.annotate(name)
        except ImportError:
            import torch

            @contextlib.contextmanager
            def _torch_nvtx(name):
                torch.cuda.nvtx.range_push(name)
                try:
                    yield
                finally:
                    torch.cuda.nvtx.range_pop()

            return _torch_nvtx
    if mode == "torch":
        import torch

        return lambda name: torch.profiler.record_function(name)
    if mode not in ("", "off", "0"):
        raise ValueError(f"SEER_PROFILE must be nvtx, torch or unset, got {mode!r}")
    return None


_observers: list = []


def prange(name: str):
    """A context manager marking ``name`` for the profiler in use (a no-op by default)."""
    global _factory
    if _factory is None:
        _factory = _choose() or (lambda name: _NULL)
    if _observers:
        return _Observed(name, _factory(name))
    return _factory(name)


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
