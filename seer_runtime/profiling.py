"""Named ranges for Nsight Systems and the torch profiler, free unless switched on.

``SEER_PROFILE=nvtx`` wraps ranges in ``nvtx.annotate`` (the ``nvtx`` package, extra ``cuda``),
or ``torch.cuda.nvtx`` when that package is absent; ``SEER_PROFILE=torch`` uses
``torch.profiler.record_function``. Unset (the default), :func:`prange` returns a shared
``nullcontext``. The choice is made once, at the first call.

Range names: ``generate``, ``prefill``, ``step``, ``forward``, ``layer/{i}``, ``sample``,
``seer/probe``, ``seer/cut``, ``route``, ``graph/replay[...]``, ``dyllm/...``. Keep them out of
CUDA-graph captures (a range inside a capture is recorded once, not per replay).
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


def prange(name: str):
    """A context manager marking ``name`` for the profiler in use (a no-op by default)."""
    global _factory
    if _factory is None:
        _factory = _choose() or (lambda name: _NULL)
    return _factory(name)


def reset() -> None:
    """Re-read ``SEER_PROFILE`` at the next call (tests)."""
    global _factory
    _factory = None
