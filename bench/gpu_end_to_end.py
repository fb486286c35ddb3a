"""GPU check, end to end at full depth: the rows ``bash bench/gpu_check.sh`` times, their plan, and
their timing (issue 33).

Every row is a whole ``generate`` call on random weights with a real model's shapes and depth,
bf16, steady forwards replayed from CUDA graphs (``graphs="cuda"``: a failed capture is an error).
Two groups, in order of value:

* ``decode`` (SPEC.md §2.3's setting, LLaDA-8B: 32 layers, d_model 4096, MLP 12288, vocabulary
  126464): batch 16, prompt 256, window 256, block 32, 32 steps (8 tokens per step: the paper's
  one token per step would take 256 full-depth forwards a row; the steady-step figures below do
  not depend on it): the baseline; DyLLM; Seer with an oracle ``L*`` (``bench.workloads.OracleCut``:
  random weights have no answer end to find); Seer + DyLLM; a threshold every position passes (a
  block per forward) alone and with Seer. Extended rows (run when the stage has time left):
  DyLLM's paper update and exact attention, the block caches, and the baseline and DyLLM at the
  paper's 256 steps.
* ``serving`` (SPEC.md §1.4-1.6, the paper's Fig. 5 setting): LaViDa-LLaDA's language model,
  a 1000-position cached prefix (image + prompt), window 32, batch 64 (128 and 256 extended): vanilla
  vs pad-to-longest vs the PWR router after the same oracle cut. A batch whose memory plan
  (``seer_runtime.memory``) does not fit the device's free memory decodes in micro-batches.

Timing (bench/.library METHOD.md): each row is warmed up by one call of exactly its timed
configuration (same requests, shapes, cut, policies: Triton's autotuning at its row capacities
and the graph captures happen there), then timed :data:`REPEATS` times with CUDA events around
the call; the median and the spread (min-max) are reported, with the steady step's median (CUDA
events at every step's end, ``StepEvents``, over the steps that replayed a graph) and the
ratio to the row's base beside the ideal one (FLOPs or tokens computed). A row whose timed calls
captured a graph or compiled a Triton kernel is marked (``generate`` releases its graphs at the
end of a call, so every call captures its own: the steady-step figure is the one without them).

Plan (``plan_rows`` / ``estimate``): each row's forwards from its schedule (blocks, steps, the
oracle cut), their FLOPs and bytes, and a device time at the H200's rates (``RATES``: measured
on this workplace's H200s, KINDS.md; the smoke stage measures them again and the run uses its
own) at :data:`EFFICIENCY` of each, plus a per-forward and per-call overhead; its peak memory
from ``seer_runtime.memory``. ``dry_run``: every row at tiny shapes on the CPU (the code path,
not the numbers). Importable on a CPU-only machine: nothing touches CUDA before ``run``.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import torch

from bench.workloads import OracleCut, answer_lengths
from seer_runtime.memory import GB, GiB, ModelDims, RequestShape, plan_micro_batches
from seer_runtime.policy import Policy

LLADA_8B = dict(n_layers=32, d_model=4096, n_heads=32, n_kv_heads=32, mlp_hidden_size=12288, vocab_size=126464,
                embedding_size=126464, rope_theta=500000.0, mask_token_id=126336, eos_token_id=126081,
                eot_token_id=126348, pad_token_id=126081, bos_token_id=126080)
TINY_LLADA = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=4, mlp_hidden_size=128)
#: LLaDA-8B's dimensions as the plan counts them (the dry run checks them against the meta model)
LLADA_8B_DIMS = ModelDims(hidden=4096, layers=32, heads=32, kv_heads=32, head_dim=128, intermediate=12288,
                          vocab=126464, weight_bytes=16_031_162_368)
#: device rates used for the plan (KINDS.md, H200s of this workplace: a 8.6 GB device copy at
#: about 4.3 TB/s counting bytes read and written; an 8192^3 bf16 product at 769-798 TFLOP/s)
RATES = {"copy_bytes_per_s": 4.3e12, "bf16_flops_per_s": 788e12}
#: fractions of those ceilings a full-depth forward is assumed to reach (leads, not readings)
EFFICIENCY = {"matmul": 0.6, "memory": 0.7}
FORWARD_OVERHEAD_S = 2e-3  # per forward: launches and host work a replay does not hide (DyLLM's eager layers)
CALL_OVERHEAD_S = 0.5  # per call: set-up, first-sight eager forwards and their captures
SALIENT_FRACTION = 0.25  # DyLLM's salient rows per sparse layer assumed by the plan (random weights)
REPEATS = 3
DEVICE_LIMIT_BYTES = 120 * GB  # no row may plan more (the H200 has about 139 GiB)


@dataclass(frozen=True)
class Row:
    """One timed ``generate`` configuration.

    group: "decode" or "serving"; base: the label of the row its ratio is taken against (None:
    it is a base); dyllm: None, "paper" (the default: the authors' update), "key" (ours, key-corrected) or "exact";
    cut: the oracle ``L*``; threshold: a confidence threshold every position passes; router: the
    PWR router; extended: run only when the stage has time left after the default rows.
    """

    label: str
    group: str
    batch: int
    prompt: int
    window: int
    steps: int
    block: int | None
    prefix_cache: bool
    base: str | None = None
    dyllm: str | None = None
    cut: bool = False
    threshold: bool = False
    block_cache: str | None = None
    router: bool = False
    extended: bool = False

    @property
    def layout(self) -> str:
        return "router" if self.router else "pad_to_longest" if self.cut else "vanilla"


@dataclass(frozen=True)
class Setting:
    """Shapes of the rows: the full ones on the GPU, tiny ones in a dry run."""

    device: str
    dtype: torch.dtype
    full_size: bool
    batch: int = 16
    prompt: int = 256
    window: int = 256
    block: int = 32
    steps: int = 32
    paper_steps: int = 256
    serving_batches: tuple[int, ...] = (64, 128, 256)
    serving_default: tuple[int, ...] = (64,)
    serving_prefix: int = 1000
    serving_window: int = 32


def setting(dry_run: bool) -> Setting:
    if dry_run:
        return Setting("cpu", torch.float32, False, batch=4, prompt=16, window=32, block=8, steps=8, paper_steps=32,
                       serving_batches=(4, 8), serving_default=(4,), serving_prefix=40, serving_window=16)
    return Setting("cuda", torch.bfloat16, True)


def plan_rows(s: Setting) -> list[Row]:
    """Every row of the stage, default rows first (module docstring)."""
    d = dict(group="decode", batch=s.batch, prompt=s.prompt, window=s.window, steps=s.steps, block=s.block,
             prefix_cache=False)
    base = "baseline"
    rows = [
        Row(base, **d),
        Row("dyllm", base=base, dyllm="paper", **d),
        Row("seer (oracle L*)", base=base, cut=True, **d),
        Row("seer (oracle L*) + dyllm", base=base, cut=True, dyllm="paper", **d),
        Row("threshold (a block per forward)", base=base, threshold=True, **d),
        Row("seer (oracle L*) + threshold", base=base, cut=True, threshold=True, **d),
    ]
    for batch in s.serving_batches:
        v = dict(group="serving", batch=batch, prompt=s.serving_prefix, window=s.serving_window,
                 steps=s.serving_window, block=None, prefix_cache=True, extended=batch not in s.serving_default)
        vanilla = f"serving batch {batch}: vanilla"
        rows += [Row(vanilla, **v), Row(f"serving batch {batch}: pad to longest", base=vanilla, cut=True, **v),
                 Row(f"serving batch {batch}: router", base=vanilla, cut=True, router=True, **v)]
    rows += [
        Row("dyllm (key-corrected attention)", base=base, dyllm="key", extended=True, **d),
        Row("dyllm (exact attention)", base=base, dyllm="exact", extended=True, **d),
        Row("block cache: prefix", base=base, block_cache="prefix", extended=True, **d),
        Row("block cache: dual", base=base, block_cache="dual", extended=True, **d),
        Row(f"baseline, {s.paper_steps} steps", **{**d, "steps": s.paper_steps}, extended=True),
        Row(f"dyllm, {s.paper_steps} steps", base=f"baseline, {s.paper_steps} steps", dyllm="paper", extended=True,
            **{**d, "steps": s.paper_steps}),
    ]
    default = [r for r in rows if not r.extended]
    return default + [r for r in rows if r.extended]


# ------------------------------------------------------------------------------------ the plan
def keep_lengths(row: Row) -> list[int]:
    """Each request's kept window under the oracle cut: its answer and its end token."""
    return [min(row.window, n + 1) for n in answer_lengths(row.batch, window=row.window, seed=row.batch)]


def forward_shapes(row: Row) -> list[tuple[int, int, int, float]]:
    """The row's forwards as ``(rows, queries per row, keys per row, fraction of the rows' linear
    work computed)``: the prefill (prefix cache), then each step's forward (its active rows padded to
    the longest window left, the prompt fed without a prefix cache)."""
    P, W, B = row.prompt, row.window, row.batch
    out = [(B, P, P, 1.0)] if row.prefix_cache else []
    feed = 0 if row.prefix_cache else P
    keep = keep_lengths(row) if row.cut else [W] * B
    block = row.block or W
    per_block = max(1, row.steps * block // W)
    if row.threshold:  # every position passes: one forward per block of each row's window
        steps = [math.ceil(n / block) for n in keep]
    else:
        steps = [sum(per_block if min(block, n - s) == block else max(1, math.ceil((n - s) * per_block / block))
                     for s in range(0, n, block)) for n in keep]
    for t in range(max(steps)):
        active = [n for n, k in zip(keep, steps) if k > t]
        width = W if t == 0 else max(active)  # step 0 runs the whole window (Seer cuts inside it)
        if row.router and t > 0:
            width = sum(active) / len(active)  # packed: each row its own window (padding left out)
        fraction = 1.0
        if row.dyllm and t >= 4:
            fraction = SALIENT_FRACTION
        if row.block_cache and t % per_block:
            width = block if row.block_cache == "dual" else max(block, width - (t % per_block) * block // per_block)
        out.append((len(active), feed + width, P + width if row.prefix_cache or feed else width, fraction))
    return out


def forward_cost(dims: ModelDims, rows: int, queries: float, keys: float, fraction: float, elem: int) -> tuple:
    """(FLOPs, bytes) of one forward: the layers' linear work (``fraction`` of its rows), attention,
    the LM head over the window; every weight read once, the keys/values and activations moved."""
    D, L, V = dims.hidden, dims.layers, dims.vocab
    per_token = 2 * (4 * D * D + 3 * D * dims.intermediate)  # q, k, v, o and the SwiGLU, per layer
    tokens = rows * queries
    flops = L * (per_token * tokens * fraction + 4 * tokens * keys * D) + 2 * rows * min(queries, 256) * D * V
    nbytes = dims.weight_bytes + L * rows * (keys * 2 * dims.kv_heads * dims.head_dim + 4 * queries * D) * elem
    return flops, nbytes


def estimate(row: Row, *, dims: ModelDims = LLADA_8B_DIMS, rates: dict | None = None, free_bytes: int | None = None,
             elem: int = 2) -> dict:
    """The row's plan: FLOPs and bytes per call, device seconds per call and for the row (one warm-up
    and :data:`REPEATS` timed calls), its micro-batches and the peak memory of the largest."""
    rates = rates or RATES
    flops = nbytes = seconds = 0.0
    shapes = forward_shapes(row)
    for rows_, q, k, frac in shapes:
        f, b = forward_cost(dims, rows_, q, k, frac, elem)
        flops, nbytes = flops + f, nbytes + b
        seconds += max(f / (rates["bf16_flops_per_s"] * EFFICIENCY["matmul"]),
                       b / (rates["copy_bytes_per_s"] * EFFICIENCY["memory"])) + FORWARD_OVERHEAD_S
    keep = keep_lengths(row) if row.cut else None
    shape = RequestShape(row.batch, row.prompt, row.window, prefix_cache=row.prefix_cache, layout=row.layout,
                         kept_window=max(keep) if keep else None, dyllm=row.dyllm is not None,
                         block_cache=row.block_cache, block_length=row.block if row.block_cache else None)
    free = free_bytes if free_bytes is not None else DEVICE_LIMIT_BYTES - dims.weight_bytes
    sizes, plan = plan_micro_batches(free, dims, shape)
    call = seconds + CALL_OVERHEAD_S * len(sizes)
    return {"forwards": len(shapes), "flops": flops, "bytes": nbytes, "call_s": call,
            "row_s": call * (1 + REPEATS), "micro_batches": sizes, "peak_bytes": plan.peak,
            "memory": plan.describe(GB)}


def describe_shape(row: Row) -> str:
    """The row's shape in one short phrase (batch B, prompt P, window W, steps, block, options)."""
    extras = [x for x in ("prefix cache" if row.prefix_cache else "", f"dyllm={row.dyllm}" if row.dyllm else "",
                          "cut" if row.cut else "", "threshold" if row.threshold else "",
                          f"block_cache={row.block_cache}" if row.block_cache else "", "router" if row.router else "")
              if x]
    return f"B{row.batch} P{row.prompt} W{row.window} {row.steps} steps" + (f", {', '.join(extras)}" if extras else "")


# ------------------------------------------------------------------------------------ timing
class _Stop(Exception):
    """Raised from a policy hook to end a ``generate`` call early (the profile stage)."""


class StepEvents(Policy):
    """A CUDA event at the start of a call and at each step's end, and whether the step was steady:
    it replayed a graph and neither ran a key eagerly for its first sight nor captured one (the
    call's ``state.graph_counters``). A step's device time is the difference of consecutive events. On the
    CPU it records host times (and no step is steady: nothing replays)."""

    name = "step_events"

    def __init__(self) -> None:
        self.marks: list = []
        self.steady: list[bool] = []
        self.counters: dict = {}  # the graph counters at the last step

    def _mark(self, state) -> None:
        if state.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def _counters(self, state) -> tuple[int, int, int]:
        return tuple(getattr(state.graph_counters, name, 0) for name in ("captures", "eager_runs", "replays"))

    def start(self, state, model) -> None:
        self._last = self._counters(state)
        self._mark(state)

    def after_step(self, state, step: int, values) -> list:
        self._mark(state)
        now = self._counters(state)
        captures, eager, replays = (a - b for a, b in zip(now, self._last))
        self.steady.append(replays > 0 and captures == 0 and eager == 0)
        self._last = now
        self.counters = state.graph_counters.as_dict()
        return []

    def step_ms(self) -> list[float]:
        """Milliseconds of each step (synchronise first on CUDA)."""
        out = []
        for a, b in zip(self.marks, self.marks[1:]):
            out.append(a.elapsed_time(b) if isinstance(a, torch.cuda.Event) else 1e3 * (b - a))
        return out

    def steady_ms(self) -> float | None:
        """The median steady step (None: no step replayed)."""
        steady = [t for t, ok in zip(self.step_ms(), self.steady) if ok]
        return statistics.median(steady) if steady else None


class CompileCounter:
    """Counts Triton compiles inside the block (``knobs.runtime.jit_post_compile_hook`` where the
    installed Triton has it; None where it cannot tell)."""

    def __enter__(self):
        self.count: int | None = None
        try:
            from triton import knobs

            self._runtime = knobs.runtime
            self._previous = getattr(self._runtime, "jit_post_compile_hook", None)
            self.count = 0

            def hook(*args, **kwargs):
                self.count += 1
                return self._previous(*args, **kwargs) if self._previous else False

            self._runtime.jit_post_compile_hook = hook
        except Exception:  # noqa: BLE001 - an older Triton: the row says it could not tell
            self._runtime = None
        return self

    def __exit__(self, *exc):
        if self._runtime is not None:
            self._runtime.jit_post_compile_hook = self._previous
        return False


def build(s: Setting, *, device: str | None = None):
    """LLaDA at the setting's shapes (full depth on the GPU), random weights made in its dtype."""
    import model_adapters as ma

    fields = dict(LLADA_8B) if s.full_size else dict(TINY_LLADA)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(s.dtype)  # built in bf16 directly: no float32 copy of 8B parameters
    try:
        return ma.build_model(ma.tiny_config("llada-8b-instruct", **fields), device=device or s.device, dtype=s.dtype)
    finally:
        torch.set_default_dtype(previous)


def generate_kwargs(row: Row, model, keep: list[int] | None):
    """``(gen, kwargs)`` of the row's ``generate`` call (``keep``: the rows' oracle cut)."""
    from seer_runtime import DyLLMConfig, GenerationConfig
    from seer_runtime.serving.router import RouterConfig

    gen = GenerationConfig(gen_length=row.window, steps=row.steps, block_length=row.block, tie_break="stable",
                           prefix_cache=row.prefix_cache)
    if row.threshold:  # random weights: a threshold every position passes fills a block per forward
        gen = gen.replace(threshold=1e-6, steps=None)
    if row.block_cache:
        gen = gen.replace(block_cache=row.block_cache)
    kwargs: dict = {"policies": [OracleCut(keep)] if keep else []}
    if row.dyllm:
        options = {"paper": {}, "key": {"key_correction": True}, "exact": {"approx_attention": False}}[row.dyllm]
        kwargs["dyllm"] = DyLLMConfig.for_model(model, **options)
    if row.router:
        kwargs["router"] = RouterConfig.for_window(row.window, max_batch=len(keep) if keep else row.batch)
    return gen, kwargs


@dataclass
class Timed:
    """One row's timing: ``calls_ms`` of the timed calls, ``steady_ms`` the median steady step, and
    what the timed calls did besides (captures, compiles, eager runs, capture failures)."""

    calls_ms: list[float] = field(default_factory=list)
    steady_ms: float | None = None
    graphs: dict = field(default_factory=dict)
    compiles: int | None = 0
    positions_computed: int = 0
    nfe: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.calls_ms)

    @property
    def spread(self) -> str:
        return f"{min(self.calls_ms):.0f}-{max(self.calls_ms):.0f} ms"


def _call(model, ids, row: Row, keep, graphs, events: StepEvents | None):
    from seer_runtime import generate

    gen, kwargs = generate_kwargs(row, model, keep)
    if events is not None:
        kwargs["policies"] = [*kwargs["policies"], events]
    return generate(model, ids, gen=gen, graphs=graphs, **kwargs)


def time_row(model, row: Row, s: Setting, *, micro_batches: list[int], seconds_left: float) -> Timed | str:
    """Warm up on exactly the timed configuration, then :data:`REPEATS` timed calls (each call a
    sequence of its micro-batches); a string when the row cannot be timed in ``seconds_left``."""
    cuda = s.device == "cuda"
    graphs = "cuda" if cuda else None
    g = torch.Generator().manual_seed(row.batch)
    ids = torch.randint(0, 200, (row.batch, row.prompt), generator=g).to(s.device)
    keep = keep_lengths(row) if row.cut else None
    parts, start = [], 0
    for n in micro_batches:
        parts.append((ids[start: start + n], keep[start: start + n] if keep else None))
        start += n
    t0 = time.perf_counter()
    with torch.no_grad():
        for part_ids, part_keep in parts:  # warm-up: the same calls
            _call(model, part_ids, row, part_keep, graphs, None)
    if cuda:
        torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    if warm_s * REPEATS > seconds_left:
        return (f"not timed: {REPEATS} calls after a {warm_s:.1f} s warm-up would pass the stage deadline "
                f"({seconds_left:.0f} s left)")
    timed = Timed()
    steady: list[float] = []
    with CompileCounter() as compiles, torch.no_grad():
        for _ in range(REPEATS):
            total = 0.0
            for part_ids, part_keep in parts:
                events = StepEvents()
                if cuda:
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    begin.record()
                h0 = time.perf_counter()
                out = _call(model, part_ids, row, part_keep, graphs, events)
                if cuda:
                    end.record()
                    torch.cuda.synchronize()
                    total += begin.elapsed_time(end)
                else:
                    total += 1e3 * (time.perf_counter() - h0)
                if events.steady_ms() is not None:
                    steady.append(events.steady_ms())
                for k, v in (out.stats.extra.get("graphs") or events.counters).items():
                    timed.graphs[k] = timed.graphs.get(k, 0) + v
                timed.positions_computed, timed.nfe = out.stats.positions_computed, out.stats.nfe
                timed.extra = out.stats.extra
            timed.calls_ms.append(total)
    timed.compiles = compiles.count
    timed.steady_ms = statistics.median(steady) if steady else None
    return timed


def _ideal(row: Row, timed: Timed, base: Timed | None) -> float | None:
    """The ideal speed-up over the base row: tokens computed, and DyLLM's layer-FLOP ratio."""
    if base is None:
        return None
    ideal = base.positions_computed / max(1, timed.positions_computed)
    dy = timed.extra.get("dyllm") if isinstance(timed.extra, dict) else None
    if dy and dy.get("ideal_flop_ratio"):
        dense = dy.get("positions_computed_dense") or timed.positions_computed
        ideal = base.positions_computed / max(1, dense) / dy["ideal_flop_ratio"]
    return ideal


def marks(timed: Timed) -> str:
    """What the timed calls did besides replaying: captures, compiles, eager first sights, failures."""
    g = timed.graphs
    out = []
    if g.get("captures"):
        out.append(f"timing includes {g['captures']} graph captures")
    if timed.compiles:
        out.append(f"and {timed.compiles} Triton compiles")
    if timed.compiles is None:
        out.append("Triton compiles not countable")
    if g.get("failures"):
        out.append(f"{g['failures']} CAPTURE FAILURES")
    if not g:
        out.append("no graph counters reported (stats.extra['graphs'] missing)")
    return "; ".join(out)


def result_row(row: Row, timed: Timed | str, base: Timed | None, est: dict) -> dict:
    from bench.common import row as make_row

    check = f"{row.group}: {row.label} ({describe_shape(row)})"
    if isinstance(timed, str):
        return make_row(check, None, timed)
    note = [f"median of {REPEATS} {timed.median_ms:.0f} ms (spread {timed.spread})"]
    if timed.steady_ms is not None:
        note.append(f"steady step {timed.steady_ms:.2f} ms")
    if base is not None:
        note.append(f"measured x{base.median_ms / timed.median_ms:.2f} over {row.base}")
        if timed.steady_ms and base.steady_ms:
            note.append(f"steady step x{base.steady_ms / timed.steady_ms:.2f}")
        ideal = _ideal(row, timed, base)
        if ideal is not None:
            note.append(f"ideal x{ideal:.2f}")
    note.append(f"NFE {timed.nfe}, planned {est['call_s']:.1f} s/call")
    failed = bool(timed.graphs.get("failures"))
    r = make_row(check, timed.median_ms, ", ".join(note) + (f"; {marks(timed)}" if marks(timed) else ""),
                 ok=False if failed else None)
    r.update(steady_ms=timed.steady_ms, calls_ms=timed.calls_ms, graphs=timed.graphs, compiles=timed.compiles,
             positions_computed=timed.positions_computed)
    return r


def run(*, dry_run: bool = False, deadline_s: float = 240.0, emit=None, rates: dict | None = None,
        extended: bool = True) -> list[dict]:
    """Time every row in order while the stage's ``deadline_s`` allows (default rows first, then the
    extended ones); ``emit(row)`` prints each as it comes. A row whose plan does not fit the time
    left is reported as not run."""
    from bench.common import row as make_row

    start = time.perf_counter()
    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError("the end-to-end stage needs a CUDA device (or dry_run=True)")
    s = setting(dry_run)
    emit = emit or (lambda r: None)
    rows: list[dict] = []
    model = build(s)
    dims = ModelDims.from_model(model)
    free = None
    if s.device == "cuda":
        free, _ = torch.cuda.mem_get_info()
    timings: dict[str, Timed] = {}
    for row in plan_rows(s):
        if row.extended and not extended:
            continue
        left = deadline_s - (time.perf_counter() - start)
        est = estimate(row, dims=dims, rates=rates, free_bytes=None if free is None else int(free * 0.9),
                       elem=torch.empty((), dtype=s.dtype).element_size())
        if not dry_run and est["call_s"] * (1 + REPEATS) > left:
            r = make_row(f"{row.group}: {row.label} ({describe_shape(row)})", None,
                         f"not run: planned {est['row_s']:.0f} s, {left:.0f} s left before the stage deadline")
        else:
            try:
                timed = time_row(model, row, s, micro_batches=est["micro_batches"], seconds_left=left)
                if not isinstance(timed, str):
                    timings[row.label] = timed
                r = result_row(row, timed, timings.get(row.base) if row.base else None, est)
            except Exception as exc:  # one row failing must not hide the others'
                import traceback

                traceback.print_exc()
                r = make_row(f"{row.group}: {row.label}", None, f"crashed: {exc!r}"[:300], ok=False)
            if s.device == "cuda":
                torch.cuda.empty_cache()
        r.update(family="end_to_end", peak_planned_gib=round(est["peak_bytes"] / GiB, 2),
                 micro_batches=est["micro_batches"])
        rows.append(r)
        emit(r)
    return rows


def plan_summary(s: Setting | None = None, *, rates: dict | None = None) -> list[dict]:
    """Every row's plan at the full shapes (the dry run's table)."""
    s = s or setting(False)
    out = []
    for row in plan_rows(s):
        est = estimate(row, rates=rates)
        out.append({"stage": "end_to_end", "row": row.label, "shape": describe_shape(row), "default": not row.extended,
                    "forwards": est["forwards"], "flops": est["flops"], "bytes": est["bytes"],
                    "device_s": round(est["row_s"], 1), "peak_gib": round(est["peak_bytes"] / GiB, 2),
                    "micro_batches": est["micro_batches"], "memory": est["memory"]})
    return out
