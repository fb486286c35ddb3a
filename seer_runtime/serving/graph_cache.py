"""CUDA graphs captured per graph key and replayed per step, over persistent input buffers.

A :class:`GraphCache` wraps a user function ``fn(key, buffers) -> outputs``. ``buffers`` maps
names to *views* of persistent max-size tensors, allocated once and sliced per key
(``buf[:key.batch, :key.length]``, see :class:`BufferSpec`); ``outputs`` is a tensor, or a
tuple / list / dict of tensors. For each key (from ``Router.valid_keys()``, the single source of
truth) the cache

* runs ``warmup`` eager calls (default 2: lazy initialisation, autotuning, allocator growth),
  then captures one call into a graph; all graphs share one memory pool
  (``torch.cuda.graph_pool_handle()``); :meth:`GraphCache.capture` captures the largest keys
  first so the smaller ones fit in the memory the larger ones left in the pool;
* keeps the captured outputs as static tensors: every replay overwrites them in place, so a
  caller copies what it must keep past the next replay of the same key;
* at :meth:`GraphCache.run`, copies the caller's inputs into the leading region of the key's
  views, writes each buffer's benign fill into the rest of the view (token pad id, position 0,
  a key mask with one True per padded row so softmax never sees an all-masked row,
  ``cu_seqlens`` repeating its last offset), and replays;
* evicts the least recently used graph beyond ``max_graphs``;
* in ``debug`` mode records the ``data_ptr()`` of every input view at capture and raises at
  replay, naming the buffers that moved (a graph reads the addresses it was captured with);
* counts captures, replays, evictions, warm-up and eager runs (:class:`GraphCacheCounters`);
* marks ``graph/capture[key]`` and ``graph/replay[key]`` ranges with
  :func:`seer_runtime.profiling.prange`, outside the captured region.

Backends: :class:`CudaGraphBackend` (``torch.cuda.CUDAGraph``), :class:`RecordingGraphBackend`
(CPU tests with a graph's semantics: a replay re-executes the recorded ops, not the Python that
issued them) and :class:`FakeGraphBackend` (tests: records the keys it captured, replayed and
released; a "replay" calls the function eagerly and copies its results into the captured
outputs). ``backend="auto"`` picks CUDA graphs
on a CUDA device; on a machine without CUDA, or with ``backend=None``, the cache calls ``fn``
eagerly on the same buffers at every :meth:`GraphCache.run` and says so once per process.
Nothing here queries a device at import time.
"""

from __future__ import annotations

import re
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..profiling import prange

__all__ = [
    "FILL_EDGE",
    "FILL_FIRST_TRUE",
    "BufferSpec",
    "CudaGraphBackend",
    "FakeGraphBackend",
    "GraphBackend",
    "RecordingGraphBackend",
    "GraphCache",
    "GraphCacheCounters",
]

# fills that depend on the real region
FILL_FIRST_TRUE = "first_true"  # bool masks: False, except index 0 of the last dim in every padded row
FILL_EDGE = "edge"  # 1-D offsets (cu_seqlens): the last real value repeated over the padding

_DIM_RE = re.compile(r"^\s*(batch|length)\s*(?:\+\s*(\d+))?\s*$")


# ------------------------------------------------------------------------------------ buffers
@dataclass(frozen=True)
class BufferSpec:
    """One persistent input buffer.

    dims: one entry per dimension: ``"batch"`` or ``"length"`` (the key's field), optionally
        ``"+ k"`` (``"batch+1"`` for cu_seqlens, ``"length+64"`` for a key mask over a 64-key
        prefix), or a fixed int (e.g. the hidden size). The buffer is allocated at the largest
        size over the keys and viewed as ``buf[:d0(key), :d1(key), ...]`` per key.
    dtype: the buffer's dtype; inputs copied in must have the same dtype.
    fill: what the padding holds: a scalar (token pad id, position 0, False), or
        ``FILL_FIRST_TRUE`` (bool buffers of >= 1 dim: padded rows, i.e. slices along the last
        dim outside the real region, hold one True at index 0 so softmax never sees an
        all-masked row; padding inside real rows is False), or ``FILL_EDGE`` (1-D buffers: the
        last real value repeated, e.g. ``cu_seqlens`` of zero-length padding sequences).
    """

    dims: tuple[int | str, ...]
    dtype: torch.dtype = torch.int64
    fill: bool | int | float | str = 0

    def __post_init__(self) -> None:
        dims = tuple(self.dims) if isinstance(self.dims, (tuple, list)) else None
        if not dims:
            raise ValueError(f"dims must be a non-empty tuple, got {self.dims!r}")
        parsed = []
        for d in dims:
            if isinstance(d, bool) or not isinstance(d, (int, str)):
                raise TypeError(f"dims entries must be ints or 'batch'/'length'[+k] strings, got {d!r}")
            if isinstance(d, int):
                if d < 1:
                    raise ValueError(f"a fixed dim must be >= 1, got {d}")
                parsed.append((None, d))
            else:
                m = _DIM_RE.match(d)
                if m is None:
                    raise ValueError(f"dims entry {d!r} must be 'batch', 'length', 'batch+k' or 'length+k'")
                parsed.append((m.group(1), int(m.group(2) or 0)))
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "_parsed", tuple(parsed))
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {self.dtype!r}")
        fill = self.fill
        if isinstance(fill, str):
            if fill == FILL_FIRST_TRUE:
                if self.dtype != torch.bool:
                    raise ValueError(f"fill={FILL_FIRST_TRUE!r} needs a bool buffer, got {self.dtype}")
            elif fill == FILL_EDGE:
                if len(dims) != 1 or self.dtype.is_floating_point or self.dtype == torch.bool:
                    raise ValueError(f"fill={FILL_EDGE!r} needs a 1-D integer buffer")
            else:
                raise ValueError(f"fill must be a number, {FILL_FIRST_TRUE!r} or {FILL_EDGE!r}, got {fill!r}")
        elif not isinstance(fill, (bool, int, float)):
            raise TypeError(f"fill must be a number or a fill name, got {type(fill).__name__}")
        elif isinstance(fill, float) and not self.dtype.is_floating_point:
            raise TypeError(f"fill {fill!r} is a float but the buffer is {self.dtype}")
        elif self.dtype == torch.bool and not isinstance(fill, bool) and fill not in (0, 1):
            raise ValueError(f"a bool buffer's fill must be True or False, got {fill!r}")

    def shape(self, key: Any) -> tuple[int, ...]:
        """The view shape for ``key`` (an object with ``batch`` and ``length`` fields)."""
        out = []
        for name, extra in self._parsed:
            out.append(extra if name is None else getattr(key, name) + extra)
        return tuple(out)


def _fill_padding(view: torch.Tensor, real: Sequence[int], fill) -> None:
    """Write ``fill`` into ``view`` outside its leading region ``[:real[0], :real[1], ...]``."""
    if fill == FILL_EDGE and isinstance(fill, str):
        n = real[0]
        if n < view.shape[0]:
            if n == 0:
                view[n:].zero_()
            else:
                view[n:] = view[n - 1]
        return
    value = False if isinstance(fill, str) else fill
    ndim = view.dim()
    for d in range(ndim):
        if real[d] >= view.shape[d]:
            continue
        index = tuple(slice(0, real[i]) for i in range(d)) + (slice(real[d], None),)
        view[index] = value
        if isinstance(fill, str) and ndim >= 1 and d < ndim - 1:
            # FILL_FIRST_TRUE: every padded row (a slice along the last dim) gets one real key
            view[index + (slice(None),) * (ndim - 2 - d) + (0,)] = True
    if isinstance(fill, str) and ndim == 1 and real[0] == 0 and view.shape[0] > 0:
        view[0] = True  # a 1-D mask with no real entry is one all-padding row


def _initial_fill(buf: torch.Tensor, fill) -> None:
    _fill_padding(buf, (0,) * buf.dim(), fill)


# ------------------------------------------------------------------------------------ outputs
def _map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        mapped = [_map_tensors(fn, x) for x in obj]
        return type(obj)(*mapped) if hasattr(obj, "_fields") else tuple(mapped)
    if isinstance(obj, list):
        return [_map_tensors(fn, x) for x in obj]
    if isinstance(obj, dict):
        return {k: _map_tensors(fn, v) for k, v in obj.items()}
    raise TypeError(f"fn must return a tensor or a tuple/list/dict of tensors, got {type(obj).__name__}")


def _narrow_outputs(outputs: Any, narrow: int) -> Any:
    """Every output tensor's first ``narrow`` entries along dim 0 (views)."""

    def cut(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or narrow > t.shape[0]:
            raise ValueError(f"narrow={narrow} exceeds an output of shape {tuple(t.shape)}")
        return t[:narrow]

    return _map_tensors(cut, outputs)


def _copy_into(static: Any, fresh: Any) -> None:
    """Copy ``fresh`` outputs into ``static`` ones of the same structure and shapes."""
    if isinstance(static, torch.Tensor):
        if not isinstance(fresh, torch.Tensor) or fresh.shape != static.shape or fresh.dtype != static.dtype:
            raise RuntimeError(
                "fn returned outputs of another shape or dtype than at capture "
                f"({tuple(static.shape)} {static.dtype} vs {getattr(fresh, 'shape', type(fresh).__name__)}): "
                "a graph's outputs are static"
            )
        static.copy_(fresh)
        return
    if isinstance(static, dict):
        if not isinstance(fresh, dict) or fresh.keys() != static.keys():
            raise RuntimeError("fn returned another output structure than at capture")
        for k in static:
            _copy_into(static[k], fresh[k])
        return
    if not isinstance(fresh, (tuple, list)) or len(fresh) != len(static):
        raise RuntimeError("fn returned another output structure than at capture")
    for s, f in zip(static, fresh):
        _copy_into(s, f)


# ------------------------------------------------------------------------------------ backends
class GraphBackend(Protocol):
    """How graphs are captured and replayed (see :class:`CudaGraphBackend`)."""

    name: str

    capture_executes: bool  # whether capture() runs fn (True) or only records it for replays (CUDA)

    def new_pool(self) -> Any: ...

    def synchronize(self) -> None: ...

    def warmup(self, fn: Callable[[], Any], runs: int) -> None: ...

    def capture(self, fn: Callable[[], Any], pool: Any, key: Any) -> tuple[Any, Any]: ...

    def replay(self, handle: Any) -> None: ...

    def release(self, handle: Any) -> None: ...


class CudaGraphBackend:
    """``torch.cuda.CUDAGraph`` captured under ``torch.cuda.graph(graph, pool=pool)``; a capture
    records the work without running it (``capture_executes`` False: a replay runs it)."""

    name = "cuda"
    capture_executes = False

    def new_pool(self):
        return torch.cuda.graph_pool_handle()

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def warmup(self, fn, runs: int) -> None:
        if runs <= 0:
            return
        # on a side stream, as the capture itself runs on one (torch's CUDA graph notes)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(runs):
                fn()
        torch.cuda.current_stream().wait_stream(stream)

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
    pool: Any


class FakeGraphBackend:
    """A stand-in for tests: records ``captured`` / ``replayed`` / ``released`` keys in order and
    ``warmup_runs``; a replay calls the function eagerly and copies its results into the outputs
    of the capture (so static-output semantics hold, and shape changes raise)."""

    name = "fake"
    capture_executes = True

    def __init__(self) -> None:
        self.captured: list[Any] = []
        self.replayed: list[Any] = []
        self.released: list[Any] = []
        self.pools: list[Any] = []
        self.capture_pools: list[Any] = []
        self.warmup_runs = 0
        self.fail_capture: Callable[[Any], bool] | None = None  # tests: make a capture fail

    def new_pool(self):
        pool = ("fake-pool", len(self.pools))
        self.pools.append(pool)
        return pool

    def synchronize(self) -> None:
        pass

    def warmup(self, fn, runs: int) -> None:
        for _ in range(runs):
            fn()
        self.warmup_runs += runs

    def capture(self, fn, pool, key):
        if self.fail_capture is not None and self.fail_capture(key):
            raise RuntimeError("operation not permitted when stream is capturing (fake)")
        outputs = fn()
        self.captured.append(key)
        self.capture_pools.append(pool)
        return _FakeGraph(key, fn, outputs, pool), outputs

    def replay(self, handle: _FakeGraph) -> None:
        _copy_into(handle.outputs, handle.fn())
        self.replayed.append(handle.key)

    def release(self, handle: _FakeGraph) -> None:
        self.released.append(handle.key)


class _Recording(TorchDispatchMode):
    """Records every aten op with its arguments and outputs; refuses what a CUDA graph cannot
    hold (a host read of device memory, a data-dependent shape)."""

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


# what a CUDA graph cannot capture: host reads and outputs whose shape depends on the data
_NOT_CAPTURABLE = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique_dim",
                   "aten._unique2", "aten.unique_consecutive", "aten.equal", "aten.is_nonzero"}


@dataclass
class _RecordedGraph:
    key: Any
    ops: list
    outputs: Any
    pool: Any


class RecordingGraphBackend(FakeGraphBackend):
    """A CPU stand-in with a CUDA graph's semantics, so that graph safety is tested without a GPU.

    ``capture`` runs ``fn`` once (``capture_executes``: the call is the step's real work) under a
    dispatch mode that records every aten op with the tensors it read and wrote, and raises on
    what a CUDA graph refuses (``.item()``, ``nonzero``, boolean indexing: host reads and
    data-dependent shapes). ``replay`` re-executes the recorded ops on the same tensors and writes
    each op's fresh outputs into the tensors the capture produced: the Python that issued the ops
    does not run again, so host values and decisions taken during the capture are frozen, as on
    a GPU. ``captured`` / ``replayed`` / ``released`` list the keys in order (warm-up and
    bookkeeping as :class:`FakeGraphBackend`'s).
    """

    name = "recording"

    def new_pool(self):
        return None

    def capture(self, fn, pool, key):
        with _Recording() as recording:
            outputs = fn()
        self.captured.append(key)
        return _RecordedGraph(key, recording.ops, outputs, pool), outputs

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


_eager_announced = False


def _announce_eager(reason: str) -> None:
    global _eager_announced
    if not _eager_announced:
        _eager_announced = True
        warnings.warn(f"GraphCache runs eagerly (no CUDA graphs): {reason}", RuntimeWarning, stacklevel=3)


# ------------------------------------------------------------------------------------ the cache
def _key_size(key: Any) -> tuple[int, int, int]:
    """Capture order: positions computed (``key.tokens`` when defined, else batch * length)."""
    tokens = getattr(key, "tokens", None)
    if not isinstance(tokens, int):
        tokens = key.batch * key.length
    return (tokens, key.length, key.batch)


@dataclass
class GraphCacheCounters:
    captures: int = 0
    replays: int = 0
    evictions: int = 0
    warmup_runs: int = 0
    eager_runs: int = 0


@dataclass
class _Entry:
    handle: Any
    outputs: Any
    views: dict[str, torch.Tensor]
    pointers: dict[str, int] = field(default_factory=dict)
    capture: int = 0  # which capture of this cache made it (1, 2, ...)
    narrowed: dict[int, Any] = field(default_factory=dict)  # narrow -> the outputs' leading views


class GraphCache:
    """Graphs of ``fn`` per key over persistent buffers (module docstring).

    Args:
        fn: ``fn(key, buffers) -> outputs``; ``buffers`` maps each name of ``buffers`` to its view
            for ``key``. It must be capturable: no host sync (``.item()``, ``.tolist()``), no
            data-dependent shapes, no new pinned memory.
        buffers: name -> :class:`BufferSpec`.
        keys: every key the cache may run, e.g. ``router.valid_keys(PATH_STATIC)``; objects with
            ``batch`` and ``length`` int fields. Buffers are sized to the largest.
        device: where buffers live; default CUDA when available, else CPU (decided here, not at
            import).
        backend: ``"auto"`` (CUDA graphs on a CUDA device, else eager), ``"cuda"``, ``None``
            (eager), or a backend object (e.g. :class:`FakeGraphBackend`).
        warmup: eager runs before each capture (default 2).
        max_graphs: keep at most this many graphs, evicting the least recently used (None: all).
        debug: check at every replay that the input views are where they were at capture.
    """

    def __init__(
        self,
        fn: Callable[[Any, dict[str, torch.Tensor]], Any],
        buffers: Mapping[str, BufferSpec],
        keys: Iterable[Any],
        *,
        device: torch.device | str | None = None,
        backend: str | GraphBackend | None = "auto",
        warmup: int = 2,
        max_graphs: int | None = None,
        debug: bool = False,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        if not isinstance(buffers, Mapping) or not buffers:
            raise ValueError("buffers must be a non-empty mapping of name -> BufferSpec")
        for name, spec in buffers.items():
            if not isinstance(name, str):
                raise TypeError(f"buffers names must be strings, got {name!r}")
            if not isinstance(spec, BufferSpec):
                raise TypeError(f"buffers[{name!r}] must be a BufferSpec, got {type(spec).__name__}")
        key_list = list(keys) if keys is not None else []
        if not key_list:
            raise ValueError("keys must list at least one key (e.g. router.valid_keys(path))")
        for k in key_list:
            for f in ("batch", "length"):
                v = getattr(k, f, None)
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"keys: {k!r} needs an int field {f!r} >= 0")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
        if max_graphs is not None and (
            isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1
        ):
            raise ValueError(f"max_graphs must be None or an int >= 1, got {max_graphs!r}")

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if backend == "auto":
            if self.device.type == "cuda" and torch.cuda.is_available():
                backend = CudaGraphBackend()
            else:
                _announce_eager(f"no CUDA device (buffers on {self.device})")
                backend = None
        elif backend == "cuda":
            if self.device.type != "cuda":
                raise ValueError(f"backend='cuda' needs a CUDA device, got device={self.device}")
            backend = CudaGraphBackend()
        elif backend is None:
            _announce_eager("backend=None")
        elif isinstance(backend, str):
            raise ValueError(f"backend must be 'auto', 'cuda', None or a backend object, got {backend!r}")
        else:
            for method in ("new_pool", "synchronize", "warmup", "capture", "replay", "release"):
                if not callable(getattr(backend, method, None)):
                    raise TypeError(f"backend {type(backend).__name__} lacks the method {method}()")
        self.backend: GraphBackend | None = backend

        self.fn = fn
        self.specs: dict[str, BufferSpec] = dict(buffers)
        # largest first: the capture order
        self.keys: tuple[Any, ...] = tuple(sorted(dict.fromkeys(key_list), key=_key_size, reverse=True))
        self._key_set = frozenset(self.keys)
        self.warmup = warmup
        self.max_graphs = max_graphs
        self.debug = debug
        self.counters = GraphCacheCounters()
        self._graphs: OrderedDict[Any, _Entry] = OrderedDict()
        self._pool = None
        self._views: dict[Any, dict[str, torch.Tensor]] = {}  # views() per key, made once
        self._replay_ranges: dict[Any, str] = {}  # each key's NVTX range name, formatted once
        self.buffers: dict[str, torch.Tensor] = {}
        for name, spec in self.specs.items():
            shape = tuple(max(dims) for dims in zip(*(spec.shape(k) for k in self.keys)))
            buf = torch.empty(shape, dtype=spec.dtype, device=self.device)
            _initial_fill(buf, spec.fill)
            self.buffers[name] = buf

    # -- state ------------------------------------------------------------------------------
    @property
    def eager(self) -> bool:
        """True when ``run`` calls ``fn`` eagerly (no graphs)."""
        return self.backend is None

    def __contains__(self, key: object) -> bool:
        """Whether a graph for ``key`` is captured now."""
        return key in self._graphs

    def capture_number(self, key: Any) -> int | None:
        """Which capture of this cache made ``key``'s graph (1 for the first), None when none is
        held: the static outputs :meth:`run` returns keep their addresses while it stays the same,
        so work that reads them in a graph of its own can be keyed by it."""
        entry = self._graphs.get(key)
        return None if entry is None else entry.capture

    def captured_keys(self) -> list[Any]:
        """Captured keys, least recently used first."""
        return list(self._graphs)

    def views(self, key: Any) -> dict[str, torch.Tensor]:
        """The buffers' views for ``key`` (what ``fn`` receives); writing into them is how a
        caller that lays out inputs itself (e.g. ``slice_repack(out=...)``) feeds the graph.
        The views are made once per key (the buffers never move); each call returns a new dict."""
        views = self._views.get(key)
        if views is None:
            self._check_key(key)
            views = self._views[key] = self._slice_buffers(key)
        return dict(views)

    def _slice_buffers(self, key: Any) -> dict[str, torch.Tensor]:
        return {name: self.buffers[name][tuple(slice(0, s) for s in spec.shape(key))]
                for name, spec in self.specs.items()}

    def _check_key(self, key: Any) -> None:
        if key not in self._key_set:
            raise ValueError(f"key {key} is not one of this cache's keys (the router's valid_keys())")

    # -- inputs -----------------------------------------------------------------------------
    def write(self, key: Any, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Copy ``inputs[name]`` into the leading region of ``name``'s view for ``key`` and fill
        the rest of the view with the buffer's fill. Buffers not named keep their contents.
        Returns the views."""
        views = self.views(key)
        real = {}
        for name, src in inputs.items():
            if name not in views:
                raise ValueError(f"inputs: unknown buffer {name!r} (buffers: {sorted(views)})")
            view = views[name]
            if not isinstance(src, torch.Tensor):
                raise TypeError(f"inputs[{name!r}] must be a tensor, got {type(src).__name__}")
            if src.dtype != view.dtype:
                raise TypeError(f"inputs[{name!r}] must be {view.dtype}, got {src.dtype}")
            if src.dim() != view.dim() or any(s > v for s, v in zip(src.shape, view.shape)):
                raise ValueError(
                    f"inputs[{name!r}] of shape {tuple(src.shape)} does not fit the view "
                    f"{tuple(view.shape)} of key {key}"
                )
            view[tuple(slice(0, s) for s in src.shape)].copy_(src, non_blocking=True)
            real[name] = tuple(src.shape)
        self._fill(views, real)
        return views

    def fill_padding(self, key: Any, real: Mapping[str, Sequence[int]]) -> None:
        """Fill each named buffer's view for ``key`` outside its leading region of shape
        ``real[name]`` (for callers that wrote the real region themselves)."""
        views = self.views(key)
        for name, shape in real.items():
            if name not in views:
                raise ValueError(f"real: unknown buffer {name!r}")
            if len(shape) != views[name].dim() or any(
                s < 0 or s > v for s, v in zip(shape, views[name].shape)
            ):
                raise ValueError(
                    f"real[{name!r}] = {tuple(shape)} does not fit the view {tuple(views[name].shape)}"
                )
        self._fill(views, {n: tuple(s) for n, s in real.items()})

    def _fill(self, views, real) -> None:
        for name, shape in real.items():
            _fill_padding(views[name], shape, self.specs[name].fill)

    # -- graphs -----------------------------------------------------------------------------
    def capture(self, keys: Iterable[Any] | None = None) -> int:
        """Capture graphs for ``keys`` (default: all), largest first; already captured keys are
        skipped. Returns how many were captured. Raises ``ValueError`` when more than
        ``max_graphs`` are asked for (they would evict each other). Eager mode: returns 0."""
        todo = self.keys if keys is None else tuple(keys)
        for k in todo:
            self._check_key(k)
        todo = sorted(dict.fromkeys(todo), key=_key_size, reverse=True)
        if self.max_graphs is not None and len(todo) > self.max_graphs:
            raise ValueError(f"capture: {len(todo)} keys asked for but max_graphs={self.max_graphs}")
        if self.backend is None:
            return 0
        n = 0
        for k in todo:
            if k not in self._graphs:
                self._capture(k)
                n += 1
        return n

    def _capture(self, key: Any) -> _Entry:
        backend = self.backend
        if self.max_graphs is not None:
            while len(self._graphs) >= self.max_graphs:
                self._evict_lru()
        if self._pool is None:
            self._pool = backend.new_pool()
        views = self.views(key)
        fn = self.fn

        def call():
            return fn(key, views)

        with prange(f"graph/capture[{key}]"):
            backend.synchronize()
            backend.warmup(call, self.warmup)
            self.counters.warmup_runs += self.warmup
            backend.synchronize()
            try:
                handle, outputs = backend.capture(call, self._pool, key)
            except Exception as exc:
                raise RuntimeError(
                    f"capturing a graph for {key} failed: {exc}\nPossible remedies: 1. make fn capturable "
                    "(no .item()/.tolist()/print of device tensors, no data-dependent shapes, no pinned "
                    "allocation); 2. capture fewer or smaller keys (max_graphs, smaller bucket tables); "
                    "3. run eagerly (backend=None)."
                ) from exc
            backend.synchronize()
        _map_tensors(lambda t: t, outputs)  # raises TypeError for non-tensor outputs
        entry = _Entry(handle, outputs, views, capture=self.counters.captures + 1)
        if self.debug:
            entry.pointers = {name: v.data_ptr() for name, v in views.items()}
        self._graphs[key] = entry
        self.counters.captures += 1
        return entry

    def _evict_lru(self) -> None:
        key, entry = self._graphs.popitem(last=False)
        self.backend.release(entry.handle)
        self.counters.evictions += 1

    def evict(self, key: Any) -> bool:
        """Drop the graph of ``key``; False when none was captured."""
        entry = self._graphs.pop(key, None)
        if entry is None:
            return False
        self.backend.release(entry.handle)
        self.counters.evictions += 1
        return True

    def clear(self) -> None:
        """Drop every graph (the buffers stay)."""
        while self._graphs:
            self._evict_lru()

    def run(self, key: Any, inputs: Mapping[str, torch.Tensor] | None = None, *, narrow: int | None = None):
        """Run ``fn`` for ``key``: write ``inputs`` (see :meth:`write`), then replay the key's graph
        (capturing it first when needed) or, in eager mode, call ``fn`` on the views.

        narrow: slice every output tensor to its first ``narrow`` entries along dim 0 (the real
            rows or tokens). Without it the outputs are the key's full static outputs.
        Returns outputs with ``fn``'s structure; with graphs they are the static tensors that the
        next replay of this key overwrites.
        """
        self._check_key(key)
        if narrow is not None and (isinstance(narrow, bool) or not isinstance(narrow, int) or narrow < 0):
            raise ValueError(f"narrow must be an int >= 0, got {narrow!r}")
        if inputs:
            self.write(key, inputs)
        if self.backend is None:
            outputs = self.fn(key, self.views(key))
            self.counters.eager_runs += 1
        else:
            entry = self._graphs.get(key)
            if entry is None:
                entry = self._capture(key)
            else:
                self._graphs.move_to_end(key)
            if self.debug:
                self._check_pointers(key, entry)
            name = self._replay_ranges.get(key)
            if name is None:
                name = self._replay_ranges[key] = f"graph/replay[{key}]"
            with prange(name):
                self.backend.replay(entry.handle)
            self.counters.replays += 1
            outputs = entry.outputs
            if narrow is not None:  # the static outputs' views, made once per narrow
                narrowed = entry.narrowed.get(narrow)
                if narrowed is None:
                    narrowed = entry.narrowed[narrow] = _narrow_outputs(outputs, narrow)
                return narrowed
        if narrow is not None:
            outputs = _narrow_outputs(outputs, narrow)
        return outputs

    def _check_pointers(self, key: Any, entry: _Entry) -> None:
        now = self._slice_buffers(key)  # the buffers as bound now (views() keeps the first ones)
        moved = [name for name, ptr in entry.pointers.items() if now[name].data_ptr() != ptr]
        if moved:
            raise RuntimeError(
                f"graph {key}: input buffers moved since capture: {moved} "
                "(a replay reads the captured addresses; write into cache.views(key), "
                "never rebind cache.buffers)"
            )
