"""CUDA graphs of the runtime's captured units, keyed by what the host decided for them: the one
graph mechanism (step forwards, the router's bucket forwards, token choices).

Once the host has decided a unit (a forward's rows, window lengths and width, each policy's
choice for it; a bucket's shape; a token choice's counts), the unit is a function of device
state at fixed addresses: the token windows, the prompt cache, the policies' caches, the layout
tensors made for it, a bucket's persistent input buffers (:class:`BucketInputs`). :class:`Graphs`
runs the first call of a key eagerly (lazy initialisation, Triton's autotuning, the host-side
caches a layout fills: the warm-up), captures the second and replays every later one, so a
steady step costs the host one replay.

Contract of a key: two calls with equal keys issue the same device work on the same tensors;
whatever the host would decide differently belongs in the key. Every tensor a capture reads
stays referenced by its entry, so no address a graph holds is freed while it lives. A capture
that fails runs its key eagerly from then on, said once (RuntimeWarning) - or, with a strict
backend (``generate(graphs="cuda")``), raises :class:`GraphCaptureError`. Timing and statistics
are the caller's, outside the captured call.

Backends (``generate(graphs=...)``, resolved by :func:`resolve_backend`): ``"auto"`` (CUDA graphs
on a CUDA device; elsewhere every unit runs eagerly, noted once per process on the
``seer_runtime`` logger at INFO level - expected there, so not a warning), ``"cuda"`` (strict
CUDA graphs; an error on any other device), None (eager), or a backend object:
:class:`RecordingGraphBackend` replays the recorded ops on the CPU with a graph's semantics (what
the tests use), :class:`FakeGraphBackend` calls the function again at every replay.
"""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .profiling import prange

_announced: set[str] = set()
_log = logging.getLogger("seer_runtime")


def say_once(message: str, *, stacklevel: int = 3) -> None:
    """A RuntimeWarning, once per process and message."""
    if message not in _announced:
        _announced.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


class GraphCaptureError(RuntimeError):
    """A unit could not be captured while CUDA graphs were asked for explicitly (``graphs="cuda"``)."""


# ------------------------------------------------------------------------------------ backends
class GraphBackend(Protocol):
    """How graphs are captured and replayed. ``capture_executes``: whether ``capture`` runs the
    function (True) or only records it for replays (CUDA); ``strict``: a failed capture raises."""

    name: str
    capture_executes: bool
    strict: bool

    def new_pool(self) -> Any: ...

    def capture(self, fn: Callable[[], Any], pool: Any, key: Any) -> tuple[Any, Any]: ...

    def replay(self, handle: Any) -> None: ...

    def release(self, handle: Any) -> None: ...


class CudaGraphBackend:
    """``torch.cuda.CUDAGraph`` captured under ``torch.cuda.graph(graph, pool=pool)``; all graphs
    of a run share one memory pool. ``strict``: a failed capture raises instead of running eagerly."""

    name = "cuda"
    capture_executes = False

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict

    def new_pool(self):
        return torch.cuda.graph_pool_handle()

    def capture(self, fn, pool, key):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            outputs = fn()
        return graph, outputs

    def replay(self, handle) -> None:
        handle.replay()

    def release(self, handle) -> None:
        handle.reset()


@dataclass
class _FakeGraph:
    key: Any
    fn: Callable[[], Any]
    outputs: Any


class FakeGraphBackend:
    """A stand-in for tests: records ``captured`` / ``replayed`` / ``released`` keys in order; a
    replay calls the function again and copies its results into the captured outputs (so the
    static-output semantics hold, and a change of shape raises). ``fail_capture(key) -> bool``
    makes a capture fail."""

    name = "fake"
    capture_executes = True
    strict = False

    def __init__(self) -> None:
        self.captured: list[Any] = []
        self.replayed: list[Any] = []
        self.released: list[Any] = []
        self.fail_capture: Callable[[Any], bool] | None = None

    def new_pool(self):
        return None

    def capture(self, fn, pool, key):
        if self.fail_capture is not None and self.fail_capture(key):
            raise RuntimeError("operation not permitted when stream is capturing (fake)")
        outputs = fn()
        self.captured.append(key)
        return _FakeGraph(key, fn, outputs), outputs

    def replay(self, handle: _FakeGraph) -> None:
        fresh = handle.fn()
        static, new = tree_flatten(handle.outputs)[0], tree_flatten(fresh)[0]
        for s, n in zip(static, new, strict=True):
            if s.shape != n.shape or s.dtype != n.dtype:
                raise RuntimeError(f"a replay returned {tuple(n.shape)} {n.dtype} where the capture returned "
                                   f"{tuple(s.shape)} {s.dtype}: a graph's outputs are static")
            s.copy_(n)
        self.replayed.append(handle.key)

    def release(self, handle) -> None:
        self.released.append(handle.key)


# what a CUDA graph cannot capture: host reads and outputs whose shape depends on the data
_NOT_CAPTURABLE = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique_dim",
                   "aten._unique2", "aten.unique_consecutive", "aten.equal", "aten.is_nonzero"}


class _Recording(TorchDispatchMode):
    """Records every aten op with its arguments and outputs; refuses what a CUDA graph cannot hold."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if str(func.overloadpacket) in _NOT_CAPTURABLE:
            raise RuntimeError(f"{func} is not capturable (operation not permitted when stream is capturing)")
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


@dataclass
class _RecordedGraph:
    key: Any
    ops: list
    outputs: Any


class RecordingGraphBackend(FakeGraphBackend):
    """A CPU stand-in with a CUDA graph's semantics, so that graph safety is tested without a GPU:
    ``capture`` runs the function once under a dispatch mode that records every aten op with the
    tensors it read and wrote, and raises on what a CUDA graph refuses (``.item()``, ``nonzero``,
    boolean indexing); ``replay`` re-executes the recorded ops on the same tensors and writes each
    op's fresh outputs into the tensors the capture produced. The Python that issued the ops does
    not run again, so host values and decisions taken during the capture are frozen, as on a GPU."""

    name = "recording"

    def capture(self, fn, pool, key):
        with _Recording() as recording:
            outputs = fn()
        self.captured.append(key)
        return _RecordedGraph(key, recording.ops, outputs), outputs

    def replay(self, handle: _RecordedGraph) -> None:
        for func, args, kwargs, out in handle.ops:
            fresh = func(*args, **kwargs)
            returns = func._schema.returns
            outs, news = (out, fresh) if isinstance(out, (tuple, list)) else ((out,), (fresh,))
            for i, (o, n) in enumerate(zip(outs, news)):
                aliased = i < len(returns) and returns[i].alias_info is not None  # a view or an in-place result
                if isinstance(o, torch.Tensor) and not aliased and o is not n:
                    o.copy_(n)
        self.replayed.append(handle.key)


def resolve_backend(graphs: Any, device: torch.device) -> GraphBackend | None:
    """The backend ``generate(graphs=...)`` asks for on ``device`` (None: eager)."""
    if graphs == "auto":
        if device.type == "cuda":
            return CudaGraphBackend()
        message = f"steps run eagerly on {device} (CUDA graphs need a CUDA device)"
        if message not in _announced:
            _announced.add(message)
            _log.info(message)
        return None
    if graphs == "cuda":
        if device.type != "cuda":
            raise ValueError(f"graphs='cuda' needs a CUDA device, got {device}")
        return CudaGraphBackend(strict=True)
    if graphs is None:
        return None
    if isinstance(graphs, str):
        raise ValueError(f"graphs must be 'auto', 'cuda', None or a graph backend object, got {graphs!r}")
    for method in ("new_pool", "capture", "replay", "release"):
        if not callable(getattr(graphs, method, None)):
            raise TypeError(f"graphs: {type(graphs).__name__} lacks the method {method}()")
    return graphs


# ------------------------------------------------------------------------------------ the graphs
class _Reads(TorchDispatchMode):
    """Keeps every tensor from outside the capture that an op reads during it (the graph holds
    their addresses). Tensors the capture itself allocates are not kept: their memory belongs to
    the graphs' pool, which later captures may reuse once this one is done with them (holding them
    would keep every intermediate of every captured unit allocated)."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: dict[int, torch.Tensor] = {}
        self._outside: set[int] = set()  # storages from outside the capture (views of them too)
        self._made: set[int] = set()  # storages allocated during the capture

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and id(t) not in self.tensors:
                storage = _storage(t)
                if storage not in self._made:
                    self.tensors[id(t)] = t
                    self._outside.add(storage)
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and _storage(t) not in self._outside:
                self._made.add(_storage(t))
        return out


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a fake, a meta one)
        return id(t)


@dataclass
class GraphCounters:
    eager_runs: int = 0  # first sight of a key, failed captures, unkeyed calls, eager mode
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
    capture: int = 0  # which capture made it (1, 2, ...): its outputs keep their addresses while it lives


class Graphs:
    """Captured units per key (module docstring); ``backend`` None runs everything eagerly.

    max_graphs: keep at most this many captured graphs, releasing the least recently used.
    """

    def __init__(self, backend: GraphBackend | None, *, max_graphs: int = 64) -> None:
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"max_graphs must be an int >= 1, got {max_graphs!r}")
        self.backend = backend
        self.max_graphs = max_graphs
        self.counters = GraphCounters()
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._pool = None

    def __len__(self) -> int:
        """Keys seen (captured or not)."""
        return len(self._entries)

    def capture_id(self, key: Hashable) -> int | None:
        """Which capture made ``key``'s graph (None: none is held). The outputs :meth:`run` returns
        for the key keep their addresses while this stays the same, so a unit that reads them in a
        graph of its own can be keyed by it."""
        entry = self._entries.get(key)
        return None if entry is None or entry.handle is None else entry.capture

    def run(self, key: Hashable | None, fn: Callable[[], Any]) -> Any:
        """``fn()``'s outputs for the unit of ``key``: eager on its first sight (or with no backend,
        or when ``key`` is None), captured on the second, replayed after. With graphs the outputs
        are the capture's static tensors, overwritten by the next replay of the same key."""
        if key is None or self.backend is None:
            self.counters.eager_runs += 1
            return fn()
        entry = self._entries.get(key)
        if entry is None or entry.failed:
            if entry is None:
                self._entries[key] = _Entry()
                self._trim()
            else:
                self._entries.move_to_end(key)
            self.counters.eager_runs += 1
            with prange("graph/eager"):  # a key's first sight: what a profile shows between replays
                return fn()
        self._entries.move_to_end(key)
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
            if getattr(backend, "strict", False):
                raise GraphCaptureError(f"capturing the unit {key!r} failed ({type(exc).__name__}: {exc}); "
                                        "graphs='auto' would run it eagerly") from exc
            say_once(f"a step could not be captured in a graph and runs eagerly ({type(exc).__name__}: {exc})")
            if backend.capture_executes:
                raise  # the capture ran part of the unit: its effects cannot be undone
            self.counters.eager_runs += 1
            return fn()
        entry.held = list(reads.tensors.values())
        self.counters.captures += 1
        entry.capture = self.counters.captures
        self._trim()
        if not backend.capture_executes:  # CUDA records without running: run it now
            with prange("graph/replay"):
                backend.replay(entry.handle)
            self.counters.replays += 1
        return entry.outputs

    def _trim(self) -> None:
        captured = [k for k, e in self._entries.items() if e.handle is not None]
        while len(captured) > self.max_graphs:
            self._drop(captured.pop(0))
        while len(self._entries) > 4 * self.max_graphs:  # keys seen once, never captured
            self._drop(next(iter(self._entries)))

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key)
        if entry.handle is not None:
            self.backend.release(entry.handle)
            self.counters.evictions += 1

    def drop(self, which: Callable[[Hashable], bool]) -> None:
        """Release the graphs of the keys ``which`` selects (and forget the keys)."""
        for key in [k for k in self._entries if which(k)]:
            self._drop(key)

    def clear(self) -> None:
        """Release every graph."""
        for entry in self._entries.values():
            if entry.handle is not None:
                self.backend.release(entry.handle)
        self._entries.clear()


# ------------------------------------------------------------------------------------ bucket inputs
class BucketInputs:
    """Persistent input buffers of one padded bucket (``batch`` rows of ``length`` window positions
    after a prompt cache of ``prompt_len`` positions), allocated when the bucket is first served:
    the window ids (padding: ``pad_id``), their positions (padding: 0), the key mask over prompt and
    window (a padded row keeps one real key, position 0, so that softmax never sees an all-masked
    row) and every layer's prompt keys / values ``[batch, Hk, prompt_len, d]`` (padding: 0). A
    graph of the bucket reads them where they are; :meth:`write` fills them for a group of
    ``R <= batch`` rows."""

    def __init__(self, batch: int, length: int, prompt_len: int, *, layers: int, kv_heads: int, head_dim: int,
                 kv_dtype: torch.dtype, pad_id: int, device: torch.device) -> None:
        self.batch, self.length, self.pad_id = batch, length, pad_id
        self.ids = torch.full((batch, length), pad_id, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, length, dtype=torch.long, device=device)
        self.key_mask = torch.zeros(batch, prompt_len + length, dtype=torch.bool, device=device)
        self.key_mask[:, 0] = True
        shape = (batch, kv_heads, prompt_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=kv_dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=kv_dtype, device=device) for _ in range(layers)]

    @property
    def nbytes(self) -> int:
        tensors = [self.ids, self.positions, self.key_mask, *self.keys, *self.values]
        return sum(t.numel() * t.element_size() for t in tensors)

    def write(self, ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor, keys: list[torch.Tensor],
              values: list[torch.Tensor], rows: torch.Tensor) -> None:
        """A group's inputs into the leading rows (``R`` rows each; ``keys`` / ``values`` the whole
        prompt cache, the group's ``rows`` gathered straight into the buffers: no copy of them in
        between); the other rows padded."""
        n = ids.shape[0]
        for buf, src, fill in ((self.ids, ids, self.pad_id), (self.positions, positions, 0)):
            buf[:n].copy_(src)
            buf[n:] = fill
        self.key_mask[:n].copy_(key_mask)
        self.key_mask[n:] = False
        self.key_mask[n:, 0] = True
        for bufs, srcs in ((self.keys, keys), (self.values, values)):
            for buf, src in zip(bufs, srcs):
                torch.index_select(src, 0, rows, out=buf[:n])
                buf[n:] = 0
