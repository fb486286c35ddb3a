"""An analytic memory plan of one ``generate`` call: what each part holds, and the peak (issue 33).

Memory is planned, not discovered: from a model's dimensions (:class:`ModelDims`) and
a request's shape (:class:`RequestShape`: batch, prompt positions, window, dtype, prefix cache,
layout, DyLLM, block cache, graphs) :func:`memory_plan` returns the bytes of every part of a call
and its peak, with no device and no allocation; :func:`largest_batch_that_fits` and
:func:`plan_micro_batches` say how a batch splits into micro-batches that fit a device's free
memory (the same tokens: requests decode independently), or raise :class:`DoesNotFitError` naming
the sizes when even one request does not fit.

The parts, as the runtime allocates them (``runner.py``'s prefill, ``adapter.PrefixKV``,
``serving/routed.py`` with ``graphs.BucketInputs``, ``dyllm/caches.py``, ``block_cache.py``,
``sampling.py``): the router's bucket buffers sized to the batch bucket and the length bucket
actually served (one bucket's at a time, never a ``max_batch`` up front), and the prefix cache held
once (a bucket gathers its rows from it directly; a padded forward of a subset of the rows holds
one selection at a time).

Resident (held for the whole call, ``MemoryPlan.resident``):

* ``weights``: ``ModelDims.weight_bytes``.
* ``prompt_embeds``: the prompt's embeddings, which the run keeps for the whole call.
* ``prefix_kv``: with the prefix cache, every layer's rotated keys and values of the prompt,
  ``layers * 2 * batch * kv_heads * prompt * head_dim`` elements.
* ``dyllm_caches``: DyLLM's per-layer caches of keys, values, attention contexts and FFN outputs
  over the cached positions (the window, and the prompt without a prefix cache).
* ``block_cache``: Fast-dLLM's per-layer keys/values of every position, plus the kept keys/values
  each span layout gathers; ``block_cache.py`` keeps up to :data:`BLOCK_CACHE_LAYOUTS_KEPT`
  layouts (one per block when every row is in the same block), each with its own gathered copy.
* ``router_buffers``: the router's static-graph inputs at its batch bucket and length bucket
  (window ids, positions, key mask, a copy of every layer's prefix keys/values); only with the
  prefix cache (``RoutedLayouts``; on a machine without CUDA the same buffers run eagerly).
* ``graph_pool``: with graphs, a captured step holds its activations in the graphs' private pool
  while eager forwards (a key's first sight) allocate theirs again outside it; the router's
  captured static step holds its logits there too.

Transient (one at a time, ``MemoryPlan.transient``):

* ``prefill``: the prompt's forward through one layer at the widest (prefix cache only).
* ``forward``: one layer of the widest step (step 0 before any cut: the whole window, and the
  prompt without a prefix cache), the prefix keys concatenated in front of the window's.
* ``varlen``: the router's packed groups gather the prefix keys/values per layer (three copies).
* ``sampling``: the window logits and the copies the token choice makes (a clone; a float64 cast
  and its softmax for LLaDA's confidences, ``sampling_fp64``).

``peak = sum(resident) + max(transient)``. The per-layer activation counts follow the layer's
code (projections, rotary embedding in float32, the concatenated keys, SDPA's boolean mask
materialised as a bias, the SwiGLU intermediates), so they are upper bounds of what the caching
allocator holds at once, not its fragmentation; a caller keeps a margin
(``largest_batch_that_fits(reserve=...)``). ``tests/runtime/test_memory_plan.py`` checks the
resident parts byte for byte against the tensors ``generate`` holds on tiny models and the peak
against the CPU allocator's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from .serving.buckets import batch_buckets as default_batch_buckets
from .serving.buckets import micro_buckets as default_micro_buckets

__all__ = [
    "BLOCK_CACHE_LAYOUTS_KEPT",
    "GB",
    "GiB",
    "LAYOUTS",
    "DoesNotFitError",
    "MemoryPlan",
    "ModelDims",
    "RequestShape",
    "largest_batch_that_fits",
    "memory_plan",
    "micro_batch_sizes",
    "plan_micro_batches",
]

GB = 10**9
GiB = 2**30
#: vanilla: the full window every step; pad_to_longest: after a cut, rows padded to the longest
#: window left; router: after a cut, the PWR router's static / varlen / eager paths
LAYOUTS = ("vanilla", "pad_to_longest", "router")
BLOCK_CACHES = (None, "prefix", "dual")
#: span layouts ``BlockCachePolicy`` keeps (each with its gathered keys/values) before clearing them
BLOCK_CACHE_LAYOUTS_KEPT = 16
_FLOAT32 = 4
_INT64 = 8
_FLOAT64 = 8


class DoesNotFitError(ValueError):
    """Even the smallest micro-batch (one request) needs more memory than is free."""


def _check_int(name: str, value, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class ModelDims:
    """A decoder's dimensions, as the plan counts them.

    hidden: the residual width D; layers; heads and kv_heads (GQA: heads a multiple of kv_heads);
    head_dim; intermediate: the SwiGLU width; vocab: logit columns; weight_bytes: every parameter
    and buffer on the device (a LaViDa model's vision tower and projector included).
    """

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    weight_bytes: int

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_int(f.name, getattr(self, f.name), minimum=0 if f.name == "weight_bytes" else 1)
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")

    @classmethod
    def from_model(cls, model) -> ModelDims:
        """The dimensions of a ``model_adapters`` model (any device, ``meta`` included): the
        adapter's ``num_layers``, ``num_heads``, ``num_kv_heads``, ``head_dim`` and ``vocab_size``,
        the residual and SwiGLU widths from its config (``d_model`` / ``hidden_size``,
        ``mlp_hidden_size`` / ``intermediate_size``), and the bytes of its parameters and buffers."""
        config = getattr(model, "config", None) or {}
        hidden = config.get("d_model") or config.get("hidden_size")
        intermediate = config.get("mlp_hidden_size") or config.get("intermediate_size")
        if not hidden or not intermediate:
            raise ValueError("model.config names neither d_model/hidden_size nor mlp_hidden_size/intermediate_size")
        weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
        weight_bytes += sum(t.numel() * t.element_size() for t in model.buffers())
        return cls(hidden=int(hidden), layers=int(model.num_layers), heads=int(model.num_heads),
                   kv_heads=int(model.num_kv_heads), head_dim=int(model.head_dim), intermediate=int(intermediate),
                   vocab=int(model.vocab_size), weight_bytes=int(weight_bytes))


@dataclass(frozen=True)
class RequestShape:
    """What one ``generate`` call decodes, as the plan counts it.

    batch: requests; prompt: padded prompt positions (image features included); window:
    ``gen_length``; dtype: the model's floating dtype; prefix_cache: the prompt's keys/values
    computed once (LaViDa's cache); layout: one of :data:`LAYOUTS`; kept_window: the longest window
    left after Seer's cut (``pad_to_longest`` / ``router``; None: the whole window); dyllm: DyLLM's
    caches; block_cache: None, ``"prefix"`` or ``"dual"``; block_length: the block of the block
    cache (None: the window); cfg: classifier-free guidance (twice the rows per forward); graphs:
    steady steps replay CUDA graphs; sampling_fp64: the token choice casts the logits to float64
    (LLaDA's confidences; a conservative default for Dream); router_batch_buckets /
    router_micro_buckets: the router's tables (None: ``RouterConfig.for_window(window,
    max_batch=batch)``'s, what ``generate(router=True)`` builds); materialized_scores: attention
    materialises its float32 scores and their softmax (SDPA's math path, the CPU's; on a GPU, bf16
    with a boolean key mask runs the memory-efficient kernel, which does not).
    """

    batch: int
    prompt: int
    window: int
    dtype: torch.dtype = torch.bfloat16
    prefix_cache: bool = True
    layout: str = "vanilla"
    kept_window: int | None = None
    dyllm: bool = False
    block_cache: str | None = None
    block_length: int | None = None
    cfg: bool = False
    graphs: bool = True
    sampling_fp64: bool = True
    router_batch_buckets: tuple[int, ...] | None = None
    router_micro_buckets: tuple[int, ...] | None = None
    materialized_scores: bool = False

    def __post_init__(self) -> None:
        _check_int("batch", self.batch)
        _check_int("prompt", self.prompt)
        _check_int("window", self.window)
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {self.dtype!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.kept_window is not None:
            _check_int("kept_window", self.kept_window)
            if self.kept_window > self.window:
                raise ValueError(f"kept_window ({self.kept_window}) must be <= window ({self.window})")
            if self.layout == "vanilla" and self.kept_window != self.window:
                raise ValueError("kept_window: the vanilla layout keeps the whole window (no cut)")
        if self.block_cache not in BLOCK_CACHES:
            raise ValueError(f"block_cache must be one of {BLOCK_CACHES}, got {self.block_cache!r}")
        if self.block_length is not None:
            _check_int("block_length", self.block_length)
        if self.block_cache is not None and (self.dyllm or self.layout == "router"):
            raise ValueError("block_cache composes with neither DyLLM nor the router (block_cache.py)")
        for name in ("router_batch_buckets", "router_micro_buckets"):
            table = getattr(self, name)
            if table is not None:
                table = tuple(table)
                if not table or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in table):
                    raise ValueError(f"{name} must be a non-empty sequence of ints >= 1, got {table!r}")
                object.__setattr__(self, name, tuple(sorted(table)))

    def replace(self, **changes) -> RequestShape:
        return replace(self, **changes)

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def rows(self) -> int:
        """Rows of one forward: the batch, twice with classifier-free guidance."""
        return self.batch * (2 if self.cfg else 1)

    @property
    def longest_kept(self) -> int:
        return self.window if self.kept_window is None else self.kept_window


@dataclass(frozen=True)
class MemoryPlan:
    """The bytes of each part of one call (module docstring) and the peak, ``sum(resident) +
    max(transient)``. ``request_bytes``: the peak less the weights (what a call needs beyond a
    loaded model)."""

    dims: ModelDims
    shape: RequestShape
    resident: dict[str, int] = field(default_factory=dict)
    transient: dict[str, int] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return sum(self.resident.values()) + max(self.transient.values(), default=0)

    @property
    def request_bytes(self) -> int:
        return self.peak - self.resident.get("weights", 0)

    @property
    def parts(self) -> dict[str, int]:
        """Every part, resident then transient."""
        return {**self.resident, **self.transient}

    def describe(self, unit: int = GiB) -> str:
        """One line: the peak and its non-zero parts in ``unit`` (GiB by default)."""
        name = "GiB" if unit == GiB else "GB" if unit == GB else f"x{unit} B"
        parts = ", ".join(f"{k} {v / unit:.2f}" for k, v in self.parts.items() if v)
        return f"peak {self.peak / unit:.2f} {name} ({parts})"


# ------------------------------------------------------------------------------------ the parts
def _layer_activations(dims: ModelDims, rows: int, queries: int, keys: int, elem: int, *,
                       keep_taps: bool = False, scores: bool = False) -> int:
    """Bytes one layer of a padded forward holds at its widest: ``rows x queries`` positions
    attending to ``keys`` keys each (``model_adapters.common.block_forward``).

    Held through the layer: the residual in and out, RoPE's float32 cos/sin. Attention phase: the
    normed input, q/k/v, the rotated q and k, the float32 temporaries of the rotation (LLaDA
    rotates in float32), the keys and values concatenated with the prefix (and repeated to every
    head under GQA), the boolean key mask as SDPA's additive bias, the context. MLP phase: the
    normed input, gate, up, silu(gate) and the product. ``keep_taps``: DyLLM's warm-up keeps a
    copy of the context and the FFN output (``Taps.keep_attn_ctx`` / ``keep_ffn_out``);
    ``scores``: the attention's float32 scores and their softmax are materialised."""
    D, H, Hk, d, inter = dims.hidden, dims.heads, dims.kv_heads, dims.head_dim, dims.intermediate
    tokens = rows * queries
    held = 2 * tokens * D * elem + 2 * rows * queries * d * _FLOAT32
    concatenated = 2 * rows * keys * Hk * d * elem
    if H != Hk:
        concatenated += 2 * rows * keys * H * d * elem
    attention = (tokens * (D + (H + 2 * Hk) * d + (H + Hk) * d + H * d) * elem
                 + 3 * tokens * H * d * _FLOAT32 + concatenated + rows * queries * keys * elem
                 + (2 * rows * H * queries * keys * _FLOAT32 if scores else 0))
    mlp = tokens * (2 * D + 4 * inter) * elem
    taps = tokens * (H * d + D) * elem if keep_taps else 0
    return held + max(attention, mlp) + taps


def _sampling(dims: ModelDims, shape: RequestShape) -> int:
    """The window logits of every row and the copies the token choice makes (``sampling.py``:
    a clone, and with ``sampling_fp64`` a float64 cast and its softmax); the router's packed
    path scatters its logits into a second ``[R, W, V]`` tensor."""
    entries = shape.batch * shape.window * dims.vocab
    per_entry = 2 * shape.element_bytes + (2 * _FLOAT64 if shape.sampling_fp64 else shape.element_bytes)
    extra = entries * shape.element_bytes if shape.layout == "router" else 0
    return entries * per_entry + extra


def _bucket(table: tuple[int, ...], value: int, name: str) -> int:
    for b in table:
        if b >= value:
            return b
    raise ValueError(f"{name}: no bucket holds {value} (largest {table[-1]})")


def _router_buffers(dims: ModelDims, shape: RequestShape, elem: int) -> int:
    """The static bucket's inputs (``graphs.BucketInputs``, one bucket's at a time: the largest
    the call serves), and its captured graph's logits there: ``(inputs, logits)``."""
    if shape.layout != "router" or not shape.prefix_cache or not shape.graphs:
        return 0, 0
    batch_table = shape.router_batch_buckets or default_batch_buckets(shape.batch)
    micro_table = shape.router_micro_buckets or default_micro_buckets(shape.window)
    rows = _bucket(batch_table, shape.batch, "router_batch_buckets")
    length = min(_bucket(micro_table, shape.longest_kept, "router_micro_buckets"), shape.window)
    P, L = shape.prompt, length
    inputs = rows * L * _INT64 * 2 + rows * (L + P)  # ids, positions, the bool key mask
    prefix = dims.layers * 2 * rows * dims.kv_heads * P * dims.head_dim * elem
    logits = rows * L * dims.vocab * elem
    return inputs + prefix, logits


def memory_plan(dims: ModelDims, shape: RequestShape) -> MemoryPlan:
    """The bytes of every part of one call of ``shape`` on a model of ``dims`` (module docstring)."""
    if not isinstance(dims, ModelDims):
        raise TypeError(f"dims must be a ModelDims, got {type(dims).__name__}")
    if not isinstance(shape, RequestShape):
        raise TypeError(f"shape must be a RequestShape, got {type(shape).__name__}")
    elem = shape.element_bytes
    B, P, W, R = shape.batch, shape.prompt, shape.window, shape.rows
    L, Hk, d = dims.layers, dims.kv_heads, dims.head_dim
    resident = {"weights": dims.weight_bytes, "prompt_embeds": B * P * dims.hidden * elem}
    resident["prefix_kv"] = L * 2 * B * Hk * P * d * elem if shape.prefix_cache else 0
    if shape.dyllm:
        cached = W + (0 if shape.prefix_cache else P)
        per_position = (2 * Hk * d + dims.heads * d + dims.hidden) * elem
        resident["dyllm_caches"] = L * B * cached * per_position + B * W * _INT64  # + the window snapshot
    else:
        resident["dyllm_caches"] = 0
    if shape.block_cache is not None:
        block = min(shape.block_length or W, W)
        kept = P + W - block
        layouts = min(BLOCK_CACHE_LAYOUTS_KEPT, -(-W // block))
        resident["block_cache"] = L * 2 * B * Hk * d * elem * ((P + W) + layouts * kept)
    else:
        resident["block_cache"] = 0
    resident["router_buffers"], router_logits = _router_buffers(dims, shape, elem)

    queries = W if shape.prefix_cache else P + W
    keys = P + W
    scores = shape.materialized_scores
    forward = _layer_activations(dims, R, queries, keys, elem, keep_taps=shape.dyllm, scores=scores)
    transient = {
        "prefill": _layer_activations(dims, B, P, P, elem, scores=scores) if shape.prefix_cache else 0,
        "forward": forward,
        "varlen": 0,
        "sampling": _sampling(dims, shape),
    }
    if shape.layout == "router":
        kept_tokens = B * shape.longest_kept
        packed_keys = (B * P if shape.prefix_cache else 0) + kept_tokens
        gathers = 3 if shape.prefix_cache else 1  # PrefixKV.packed, the concatenation, its index_select
        transient["varlen"] = (gathers * 2 * packed_keys * Hk * d * elem
                               + _layer_activations(dims, 1, kept_tokens + (0 if shape.prefix_cache else B * P),
                                                    0, elem))
    resident["graph_pool"] = max(forward, transient["sampling"]) + router_logits if shape.graphs else 0
    return MemoryPlan(dims, shape, resident, transient)


# ------------------------------------------------------------------------------- micro-batches
def _need(plan: MemoryPlan, weights_resident: bool) -> int:
    return plan.request_bytes if weights_resident else plan.peak


def largest_batch_that_fits(free_bytes: int, dims: ModelDims, shape: RequestShape, *, weights_resident: bool = True,
                            reserve: float = 0.0) -> int:
    """The largest batch ``b <= shape.batch`` whose plan needs at most ``free_bytes * (1 -
    reserve)`` (beyond the weights when ``weights_resident``: a loaded model's free memory already
    excludes them). Raises :class:`DoesNotFitError` naming the sizes when one request does not fit.
    The plan grows with the batch (bucket tables included), so a binary search finds it."""
    _check_int("free_bytes", free_bytes, minimum=0)
    if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not 0.0 <= reserve < 1.0:
        raise ValueError(f"reserve must be a float in [0, 1), got {reserve!r}")
    budget = int(free_bytes * (1.0 - reserve))

    def fits(b: int) -> bool:
        return _need(memory_plan(dims, shape.replace(batch=b)), weights_resident) <= budget

    if not fits(1):
        one = memory_plan(dims, shape.replace(batch=1))
        raise DoesNotFitError(
            f"one request (prompt {shape.prompt} positions, window {shape.window}, layout {shape.layout}) needs "
            f"{_need(one, weights_resident) / GiB:.2f} GiB beyond the weights but only {budget / GiB:.2f} GiB is "
            f"free ({one.describe()})")
    lo, hi = 1, shape.batch
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def micro_batch_sizes(batch: int, largest: int) -> list[int]:
    """``batch`` requests split into the fewest micro-batches of at most ``largest``, as even as
    possible (the larger ones first): ``micro_batch_sizes(256, 100) == [86, 85, 85]``."""
    _check_int("batch", batch)
    _check_int("largest", largest)
    n = -(-batch // largest)
    base, extra = divmod(batch, n)
    return [base + 1] * extra + [base] * (n - extra)


def plan_micro_batches(free_bytes: int, dims: ModelDims, shape: RequestShape, *, weights_resident: bool = True,
                       reserve: float = 0.0) -> tuple[list[int], MemoryPlan]:
    """The micro-batch sizes ``shape.batch`` decodes in under ``free_bytes`` and the plan of the
    largest of them (whose peak is the call's); one micro-batch when the whole batch fits."""
    largest = largest_batch_that_fits(free_bytes, dims, shape, weights_resident=weights_resident, reserve=reserve)
    sizes = micro_batch_sizes(shape.batch, largest)
    return sizes, memory_plan(dims, shape.replace(batch=sizes[0]))
