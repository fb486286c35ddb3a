"""Host overhead of the engine: microseconds per step and per layer-step, and ops dispatched.

A model whose compute is negligible (LLaDA or Dream architecture, d_model 32, 3 layers, batch 4,
prompt 32, window 32, one token per step) makes wall time the host's work: Python, policy hooks
and op dispatch. The CUDA code path runs on the CPU (``seer_kernels.emulate_device``: no host-side
value checks; a kernel's stand-in, the torch reference, counts as one op, as a launch would).
Per mode:

* ``us/step`` - median host time of a step over the decode (step 0, which probes and cuts, and
  set-up excluded): wall time minus the time the kernels' stand-ins took (:class:`KernelClock`);
* ``us/layer-step`` - the same inside the layer loop, divided by the layers it ran (eager
  forwards only: a replayed graph runs no layer loop on the host);
* ``ops/layer-step`` - ops dispatched inside the layer loop per layer;
* ``ops/step`` - ops dispatched per step outside the layer loop;
* with graphs (the recording backend: a CUDA graph's semantics on the CPU), ``host us/replayed
  step``: a step's wall time minus the time its replays took (``graph/replay``, the bucket units'
  included), median (p10-p90) over the steps whose
  every graph unit replayed (the host's own work per step once forwards replay; the replay itself
  is the GPU's; a step that also ran a forward's layers on the host, captured a unit or ran one
  eagerly at its first sight, ``graph/capture`` / ``graph/eager``, is not counted); and ``best
  of repeats``: each such step's least host time over the repeats (the same decode each time,
  step for step), median over the steps - the estimate that other tenants' interruptions of a
  shared machine do not move, as ``timeit``'s best of repeats (the first replays after a
  capture, slower while the host's caches refill, still count).
  On the CPU the replay re-runs every recorded op in Python, which costs the host and leaves its
  caches cold for the code after it; the ``played back`` rows (:class:`PlaybackGraphBackend`)
  run the same decode a second time with replays that write back what the first run's replays
  left (as a GPU replay looks to the host: one launch, the device's results in place). The
  host takes the same decisions on the same tokens (checked: the played-back decode equals the
  recorded one), so those rows are the host's own work per replayed step, in both families.

    .venv/bin/pytest bench/bench_host_overhead.py -m bench -s                      # the table
    .venv/bin/pytest bench/bench_host_overhead.py -m bench --benchmark-disable -s  # smoke (CI)

Measured figures: bench/RESULTS.md ("Host overhead per step").
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import model_adapters as ma
import seer_kernels
from bench.workloads import OracleCut
from seer_runtime import DyLLMConfig, GenerationConfig, SeerConfig, generate
from seer_runtime.graphs import FakeGraphBackend, RecordingGraphBackend
from seer_runtime.profiling import observe
from seer_runtime.serving.router import RouterConfig

pytestmark = pytest.mark.bench

WINDOW, PROMPT, BATCH = 32, 32, 4


def _in_kernel() -> bool:
    return getattr(seer_kernels, "in_kernel", lambda: False)()


class KernelClock:
    """Seconds spent inside the kernels' stand-ins (every ``seer_kernels.<module>.<op>_reference``,
    nested calls counted once), so that a kernel's CPU compute is not charged to the host: on a
    GPU it is the device's work. The public functions' checks and dispatch stay host time."""

    MODULES = ("cosine_saliency", "mlp_sparsity", "partial_attention", "rms_norm", "rotary_embedding",
               "row_gather_scatter", "row_linear", "slice_repack", "snr_boundary", "varlen_attention")

    def __init__(self):
        self.total, self._depth, self._t0, self._saved = 0.0, 0, 0.0, []

    def _wrap(self, fn):
        def timed(*args, **kwargs):
            if self._depth == 0:
                self._t0 = time.perf_counter()
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.total += time.perf_counter() - self._t0
        return timed

    def __enter__(self):
        import importlib

        package = Path(seer_kernels.__file__).parent
        for name in self.MODULES:
            if not (package / f"{name}.py").is_file():  # an op the tree being measured does not have
                continue
            module = importlib.import_module(f"seer_kernels.{name}")
            for attr in [a for a in vars(module) if a.endswith("_reference") and callable(getattr(module, a))]:
                self._saved.append((module, attr, getattr(module, attr)))
                setattr(module, attr, self._wrap(getattr(module, attr)))
        return self

    def __exit__(self, *exc):
        for module, attr, fn in reversed(self._saved):
            setattr(module, attr, fn)
        self._saved.clear()


class _Ops(TorchDispatchMode):
    def __init__(self, meter):
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not _in_kernel():  # inside a kernel's stand-in: the launch itself was the one op
            self.meter.ops[self.meter.where] += 1
        return func(*args, **(kwargs or {}))


class HostMeter:
    """Times the ``step``, ``layers`` and ``graph/replay`` ranges of ``seer_runtime.profiling``
    and counts the ops dispatched inside and outside the layer loop."""

    def __init__(self, clock: KernelClock):
        self.clock = clock
        self.step_s, self.layers_s, self.loops = [], [], 0
        self.replay_s: list[float] = []  # per step: seconds spent replaying (0.0: no replay)
        self.step_loops: list[int] = []  # per step: layer loops run on the host (eager or captured forwards)
        self.step_unreplayed: list[int] = []  # per step: graph units captured or run eagerly at their first sight
        self.ops = {"layers": 0, "step": 0, "other": 0}
        self.where = "other"
        self._t = {}

    def _now(self) -> float:
        """Host seconds: wall time minus what the kernels' stand-ins took."""
        return time.perf_counter() - self.clock.total

    def enter(self, name):
        if name.startswith(("graph/capture", "graph/eager")) and self.step_unreplayed:
            self.step_unreplayed[-1] += 1
        if name.startswith("graph/replay"):
            name = "graph/replay"
        if name in ("step", "layers", "graph/replay"):
            self._t[name] = self._now()
            if name == "step":
                self.replay_s.append(0.0)
                self.step_loops.append(0)
                self.step_unreplayed.append(0)
            if name != "graph/replay":
                self.where = name
            if name == "layers":
                self.loops += 1
                if self.step_loops:
                    self.step_loops[-1] += 1

    def exit(self, name):
        if name.startswith("graph/replay"):
            name = "graph/replay"
        if name in self._t:
            dt = self._now() - self._t.pop(name)
            if name == "graph/replay":
                self.replay_s[-1] += dt
                return
            (self.step_s if name == "step" else self.layers_s).append(dt)
            self.where = "step" if name == "layers" else "other"


class PlaybackGraphBackend(RecordingGraphBackend):
    """The recording backend, in two passes over the same decode, so that a replayed step's host
    work is timed without the CPU replay's own cost and side effects.

    Recording pass (``tape`` empty): every replay re-runs its ops, as the recording backend's,
    then keeps the values it left in the memory the host can see (what it wrote into tensors
    that outlive the graph: the capture's inputs and persistent buffers, its outputs). Playback
    pass (``tape`` from a recording pass): each replay writes the kept values back instead,
    in the same order, one copy per written buffer - as a GPU replay looks to the host, one
    launch that leaves the device's results. The host path then takes the same decisions on the
    same tokens (the bench checks the playback decodes what the recording pass decoded); the
    playback's copies count as replay time, not host time."""

    def __init__(self, tape: list | None = None):
        super().__init__()
        self.recording = tape is None
        self.tape = [] if tape is None else tape
        self._position = 0
        self._written: dict[int, tuple[object, list[torch.Tensor]]] = {}  # per handle (kept: ids stay unique)

    def capture(self, fn, pool, key):
        handle, outputs = super().capture(fn, pool, key)
        # what its replays will write, found now: a step that captures is not timed, one that
        # replays is (walking the recorded ops at the first replay charged the harness to it)
        self._written[id(handle)] = (handle, _visible_writes(handle))
        return handle, outputs

    def replay(self, handle) -> None:
        _, written = self._written[id(handle)]
        if self.recording:
            super().replay(handle)
            self.tape.append((handle.key, [w.clone() for w in written]))
            return
        key, values = self.tape[self._position]
        self._position += 1
        if key != handle.key or len(values) != len(written):
            raise RuntimeError(f"playback diverged at replay {self._position}: {handle.key} vs recorded {key}")
        for w, v in zip(written, values):
            w.copy_(v)
        self.replayed.append(handle.key)


def _leaves(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _leaves(v)]
    return []


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor over the whole of ``t``'s storage."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _visible_writes(handle) -> list[torch.Tensor]:
    """The storages a recorded graph writes that the host can see after a replay: written by one
    of its ops (a fresh output, or an argument the op mutates) and either there before the
    capture (inputs, persistent buffers) or reachable from the graph's outputs."""
    produced, external, written = set(), {}, {}
    for func, args, kwargs, out in handle.ops:
        schema = func._schema
        for t in _leaves(list(args) + list(kwargs.values())):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in produced:
                external.setdefault(ptr, t)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        for i, o in enumerate(outs):
            if isinstance(o, torch.Tensor):
                alias = schema.returns[i].alias_info if i < len(schema.returns) else None
                if alias is None:
                    produced.add(o.untyped_storage().data_ptr())
                if alias is None or alias.is_write:
                    written.setdefault(o.untyped_storage().data_ptr(), o)
        for argument, value in zip(schema.arguments, list(args) + [kwargs.get(a.name) for a in
                                                                   schema.arguments[len(args):]]):
            if argument.alias_info is not None and argument.alias_info.is_write:
                for t in _leaves(value):
                    written.setdefault(t.untyped_storage().data_ptr(), t)
    visible = set(external) | {t.untyped_storage().data_ptr() for t in _leaves(handle.outputs)}
    return [_storage_bytes(t) for ptr, t in written.items() if ptr in visible and t.numel() > 0]


def tiny_model(family: str):
    torch.manual_seed(0)
    if family == "llada":
        cfg = ma.tiny_config("llada-8b-instruct", d_model=32, n_heads=2, n_kv_heads=2, mlp_hidden_size=64)
    else:
        cfg = ma.tiny_config("dream-v0-instruct-7b", hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                             intermediate_size=64)
    model = ma.build_model(cfg)
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    return model


def modes(family: str) -> dict:
    keep = [9, 32, 17, 25]
    router = RouterConfig.for_window(WINDOW, max_batch=BATCH)
    seer = SeerConfig(probe_layer=1, eps=0.05, tau_jump=0.01, gamma=1.0, guard=False)
    dyllm = DyLLMConfig(tau=0.999, full_steps=2)
    out = {
        "baseline": {},
        "seer (sparsity probe)": {"seer": seer},
        "dyllm": {"dyllm": dyllm},
        "cut + router (eager)": {"policies": [OracleCut(keep)], "router": router},
        "cut + router (static graphs)": {"policies": [OracleCut(keep)], "router": router, "graphs": "recording",
                                         "prefix_cache": True},
        "baseline, graphs": {"graphs": "recording"},
        "seer, graphs": {"seer": seer, "graphs": "recording"},
        "dyllm, graphs": {"dyllm": dyllm, "graphs": "recording"},
    }
    if family == "llada":
        out["cfg"] = {"cfg_scale": 1.0}
        out["cfg, graphs"] = {"cfg_scale": 1.0, "graphs": "recording"}
    for name in [n for n, kw in out.items() if kw.get("graphs") == "recording"]:  # the same decode, played back
        out[f"{name}, played back"] = dict(out[name], graphs="playback")
    return out


def measure(model, family: str, name: str, kw: dict, repeats: int) -> dict:
    kw = dict(kw)
    gen = GenerationConfig(gen_length=WINDOW, steps=WINDOW, block_length=None if family == "dream" else WINDOW,
                           tie_break="stable", alg="entropy" if family == "dream" else "origin",
                           cfg_scale=kw.pop("cfg_scale", 0.0), prefix_cache=kw.pop("prefix_cache", None))
    ids = torch.randint(0, 240, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))
    graphs = kw.pop("graphs", None)
    emulate = getattr(seer_kernels, "emulate_device", contextlib.nullcontext)  # absent before the custom ops

    tape, decoded = None, None
    if graphs == "playback":  # the recording pass, untimed: what each replay leaves, and the tokens
        with seer_kernels.kernel_backend("reference"), emulate(), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            recorder = PlaybackGraphBackend()
            decoded = generate(model, ids, gen=gen, graphs=recorder, **kw).sequences
            tape = recorder.tape

    def run(count_ops: bool) -> HostMeter:
        clock = KernelClock()
        meter = HostMeter(clock)
        backend = {"fake": FakeGraphBackend, "recording": RecordingGraphBackend,
                   "playback": lambda: PlaybackGraphBackend(tape)}.get(graphs, lambda: None)()
        with (seer_kernels.kernel_backend("reference"), emulate(), warnings.catch_warnings(), clock,
              observe(meter)):
            warnings.simplefilter("ignore", RuntimeWarning)
            if count_ops:  # a separate run: the counting mode itself costs host time
                with _Ops(meter):
                    out = generate(model, ids, gen=gen, graphs=backend, **kw)
            else:
                out = generate(model, ids, gen=gen, graphs=backend, **kw)
        if decoded is not None and not torch.equal(out.sequences, decoded):
            raise AssertionError(f"{name}: the played-back decode differs from the recorded one")
        return meter

    timed = [run(False) for _ in range(repeats)]
    counted = run(True)
    layers = model.num_layers
    step_s = statistics.median([s for m in timed for s in m.step_s[1:]])  # step 0 probes and cuts
    loops = [s for m in timed for s in m.layers_s[1:]]
    per_run = [[s - r if r > 0 and n == 0 and u == 0 else None  # None: some graph unit did not replay
                for s, r, n, u in zip(m.step_s[1:], m.replay_s[1:], m.step_loops[1:], m.step_unreplayed[1:])]
               for m in timed]
    replayed = [t for run_steps in per_run for t in run_steps if t is not None]
    # each replayed step's best over the repeats (the same decode, step for step), then the median
    # over steps: robust to other tenants' interruptions, as timeit's best of repeats
    best = [min(ts) for ts in zip(*per_run) if None not in ts]
    return {"mode": name, "us_step": 1e6 * step_s,
            "us_layer_step": 1e6 * statistics.median(loops) / layers if loops else None,
            "us_replayed_step": 1e6 * statistics.median(replayed) if replayed else None,
            "us_replayed_spread": _spread(replayed),
            "us_replayed_best": 1e6 * statistics.median(best) if best else None,
            "ops_layer_step": counted.ops["layers"] / max(1, counted.loops * layers),
            "ops_step": counted.ops["step"] / max(1, len(counted.step_s))}


def _spread(seconds: list[float]) -> tuple[float, float] | None:
    """(p10, p90) in us of the replayed steps' host times (None: too few to say)."""
    if len(seconds) < 10:
        return None
    deciles = statistics.quantiles(seconds, n=10)
    return 1e6 * deciles[0], 1e6 * deciles[-1]


def _us(value, spread=None) -> str:
    if value is None:
        return ""
    return f"{value:.0f}" if spread is None else f"{value:.0f} ({spread[0]:.0f}-{spread[1]:.0f})"


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_host_overhead(benchmark, family):
    model = tiny_model(family)
    repeats = 1 if benchmark.disabled else 5
    rows = []
    benchmark.pedantic(lambda: rows.extend(measure(model, family, n, kw, repeats) for n, kw in modes(family).items()),
                       rounds=1, iterations=1, warmup_rounds=0)
    print(f"\n[{family}] d_model 32, 3 layers, batch {BATCH}, prompt {PROMPT}, window {WINDOW} (CPU, the CUDA path)")
    print("| mode | us/step | us/layer-step | host us/replayed step (p10-p90) | the same, best of repeats | "
          "ops/layer-step | ops/step outside the layers |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        replayed = _us(r["us_replayed_step"], r["us_replayed_spread"])
        print(f"| {r['mode']} | {r['us_step']:.0f} | {_us(r['us_layer_step'])} | {replayed} | "
              f"{_us(r['us_replayed_best'])} | {r['ops_layer_step']:.1f} | {r['ops_step']:.1f} |")
        assert r["us_step"] > 0
        if "graphs" in r["mode"] and "static" not in r["mode"]:
            assert r["us_replayed_step"] is not None, f"{r['mode']}: no step replayed"
