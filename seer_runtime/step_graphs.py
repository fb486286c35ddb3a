"""CUDA graphs of the engine's forwards, keyed by what the host decided for them.

Once the host has decided a forward (its rows, their window lengths, the width, what it feeds,
each policy's choice for it: ``DecodeRun.forward_key``), the forward is a function of device
state at fixed addresses: the run's token windows, the prompt cache, the policies' caches and
the layout tensors made for it. :class:`ForwardGraphs` runs the first forward of a key eagerly
(lazy initialisation, Triton's autotuning, the host-side caches a layout fills), captures the
second and replays every later one, so a steady step costs the host one replay.

Contract of a key: two forwards with equal keys issue the same device work on the same tensors;
whatever the host would decide differently belongs in the key (``DecodePolicy.graph_key``).
Every tensor a capture reads stays referenced by its entry, so no address a graph holds is freed
while it lives. A capture that fails is said once (RuntimeWarning) and its key runs eagerly from
then on. Timing and statistics are the caller's, outside the captured call.

Backends (``graphs=`` of ``generate``): ``"auto"`` (CUDA graphs on a CUDA device; elsewhere
every forward runs eagerly, said once per process), ``"cuda"`` (CUDA graphs; an error on any
other device), None (eager), or a backend object from
``serving.graph_cache`` (``RecordingGraphBackend`` replays recorded ops on the CPU with a
graph's semantics: what the tests use).
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .profiling import prange
from .serving.graph_cache import CudaGraphBackend, GraphBackend

_announced: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _announced:
        _announced.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def resolve_backend(graphs: Any, device: torch.device) -> GraphBackend | None:
    """The backend ``generate(graphs=...)`` asks for on ``device`` (None: eager)."""
    if graphs == "auto":
        if device.type == "cuda":
            return CudaGraphBackend()
        _say_once(f"forwards run eagerly (no CUDA graphs): no CUDA device ({device})")
        return None
    if graphs == "cuda":
        if device.type != "cuda":
            raise ValueError(f"graphs='cuda' needs a CUDA device, got {device}")
        return CudaGraphBackend()
    if graphs is None:
        return None
    if isinstance(graphs, str):
        raise ValueError(f"graphs must be 'auto', 'cuda', None or a graph backend object, got {graphs!r}")
    for method in ("new_pool", "warmup", "capture", "replay", "release"):
        if not callable(getattr(graphs, method, None)):
            raise TypeError(f"graphs: {type(graphs).__name__} lacks the method {method}()")
    return graphs


class _Reads(TorchDispatchMode):
    """Keeps every tensor an op reads during a capture (the graph holds their addresses)."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: dict[int, torch.Tensor] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor):
                self.tensors.setdefault(id(t), t)
        return func(*args, **kwargs)


@dataclass
class ForwardGraphCounters:
    eager_runs: int = 0  # first sight of a key, failed captures, eager mode
    captures: int = 0
    replays: int = 0
    failures: int = 0
    evictions: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Entry:
    handle: Any = None
    outputs: Any = None
    held: list[torch.Tensor] = field(default_factory=list)
    failed: bool = False
    extra: Any = None  # what the caller keeps with the key (host figures of the forward)


class ForwardGraphs:
    """Graphs of forwards per key (module docstring); ``backend`` None runs everything eagerly.

    max_graphs: keep at most this many captured graphs, releasing the least recently used.
    """

    def __init__(self, backend: GraphBackend | None, *, max_graphs: int = 64) -> None:
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"max_graphs must be an int >= 1, got {max_graphs!r}")
        self.backend = backend
        self.max_graphs = max_graphs
        self.counters = ForwardGraphCounters()
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._pool = None

    def __len__(self) -> int:
        """Keys seen (captured or not)."""
        return len(self._entries)

    def extra(self, key: Hashable) -> Any:
        """What :meth:`run` was given as ``extra`` for ``key`` (None: nothing, or an unknown key)."""
        entry = self._entries.get(key)
        return None if entry is None else entry.extra

    def run(self, key: Hashable | None, fn: Callable[[], Any], *, extra: Any = None) -> Any:
        """``fn()``'s outputs for the forward of ``key``: eager on its first sight (or with no
        backend, or when ``key`` is None), captured on the second, replayed after. ``extra`` is
        kept with the key on its first sight. With graphs, the outputs are the capture's static
        tensors, overwritten by the next replay of the same key."""
        if key is None or self.backend is None:
            self.counters.eager_runs += 1
            return fn()
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = _Entry(extra=extra)
            self._trim()
            self.counters.eager_runs += 1
            with prange("graph/eager"):  # a key's first sight: what a profile shows between replays
                return fn()
        self._entries.move_to_end(key)
        if entry.failed:
            self.counters.eager_runs += 1
            with prange("graph/eager"):
                return fn()
        if entry.handle is None:
            return self._capture(key, entry, fn)
        with prange("graph/replay"):
            self.backend.replay(entry.handle)
        self.counters.replays += 1
        return entry.outputs

    def _capture(self, key: Hashable, entry: _Entry, fn: Callable[[], Any]) -> Any:
        backend = self.backend
        if self._pool is None:
            self._pool = backend.new_pool()
        reads = _Reads()
        try:
            with prange("graph/capture"), reads:
                entry.handle, entry.outputs = backend.capture(fn, self._pool, key)
        except Exception as exc:  # noqa: BLE001 - any capture failure falls back to eager for this key
            entry.failed, entry.handle = True, None
            self.counters.failures += 1
            _say_once(f"a forward could not be captured in a graph and runs eagerly ({type(exc).__name__}: {exc})")
            if getattr(backend, "capture_executes", False):
                raise  # the capture ran part of the forward: its effects cannot be undone
            self.counters.eager_runs += 1
            return fn()
        entry.held = list(reads.tensors.values())
        self.counters.captures += 1
        self._trim()
        if not getattr(backend, "capture_executes", False):  # CUDA records without running: run it now
            with prange("graph/replay"):
                backend.replay(entry.handle)
            self.counters.replays += 1
        return entry.outputs

    def _trim(self) -> None:
        captured = [k for k, e in self._entries.items() if e.handle is not None]
        while len(captured) > self.max_graphs:
            key = captured.pop(0)
            entry = self._entries.pop(key)
            self.backend.release(entry.handle)
            self.counters.evictions += 1
        while len(self._entries) > 4 * self.max_graphs:  # keys seen once, never captured
            key, entry = next(iter(self._entries.items()))
            if entry.handle is not None:
                self.backend.release(entry.handle)
                self.counters.evictions += 1
            self._entries.pop(key)

    def clear(self) -> None:
        """Release every graph."""
        for entry in self._entries.values():
            if entry.handle is not None:
                self.backend.release(entry.handle)
        self._entries.clear()
