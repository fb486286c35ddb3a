"""Host overhead of the engine: microseconds per step and per layer-step, and ops dispatched.

A model whose compute is negligible (LLaDA or Dream architecture, d_model 32, 3 layers, batch 4,
prompt 32, window 32, one token per step, reference kernels on the CPU) makes wall time the host's
work: Python, policy hooks and op dispatch. Per mode:

* ``us/step`` - median wall time of a step over the decode (prefill and set-up excluded);
* ``us/layer-step`` - median time inside the layer loop divided by the layers it ran;
* ``ops/layer-step`` - aten ops dispatched inside the layer loop per layer (TorchDispatchMode);
* ``ops/step`` - aten ops dispatched per step outside the layer loop.

    .venv/bin/pytest bench/bench_host_overhead.py -m bench -s                      # the table
    .venv/bin/pytest bench/bench_host_overhead.py -m bench --benchmark-disable -s  # smoke (CI)

Measured figures: bench/RESULTS.md ("Host overhead per step").
"""

from __future__ import annotations

import statistics
import time
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import model_adapters as ma
from bench.workloads import OracleCut
from seer_kernels import kernel_backend
from seer_runtime import DyLLMConfig, GenerationConfig, SeerConfig, generate
from seer_runtime.profiling import observe
from seer_runtime.serving.graph_cache import FakeGraphBackend
from seer_runtime.serving.router import RouterConfig

pytestmark = pytest.mark.bench

WINDOW, PROMPT, BATCH = 32, 32, 4


class _Ops(TorchDispatchMode):
    def __init__(self, meter):
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.meter.ops[self.meter.where] += 1
        return func(*args, **(kwargs or {}))


class HostMeter:
    """Times the ``step`` and ``layers`` ranges of ``seer_runtime.profiling`` and counts the ops
    dispatched inside and outside the layer loop."""

    def __init__(self):
        self.step_s, self.layers_s, self.loops = [], [], 0
        self.ops = {"layers": 0, "step": 0, "other": 0}
        self.where = "other"
        self._t = {}

    def enter(self, name):
        if name in ("step", "layers"):
            self._t[name] = time.perf_counter()
            self.where = name
            if name == "layers":
                self.loops += 1

    def exit(self, name):
        if name in self._t:
            dt = time.perf_counter() - self._t.pop(name)
            (self.step_s if name == "step" else self.layers_s).append(dt)
            self.where = "step" if name == "layers" else "other"


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
    out = {
        "baseline": {},
        "seer (sparsity probe)": {"seer": SeerConfig(probe_layer=1, eps=0.05, tau_jump=0.01, gamma=1.0, guard=False)},
        "dyllm": {"dyllm": DyLLMConfig(tau=0.999, full_steps=2)},
        "cut + router (eager)": {"policies": [OracleCut(keep)], "router": router, "graphs": None},
        "cut + router (graphs)": {"policies": [OracleCut(keep)], "router": router, "graphs": "fake",
                                  "prefix_cache": True},
    }
    if family == "llada":
        out["cfg"] = {"cfg_scale": 1.0}
    return out


def measure(model, family: str, name: str, kw: dict, repeats: int) -> dict:
    kw = dict(kw)
    gen = GenerationConfig(gen_length=WINDOW, steps=WINDOW, block_length=None if family == "dream" else WINDOW,
                           tie_break="stable", alg="entropy" if family == "dream" else "origin",
                           cfg_scale=kw.pop("cfg_scale", 0.0), prefix_cache=kw.pop("prefix_cache", None))
    ids = torch.randint(0, 240, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))

    def run(count_ops: bool) -> HostMeter:
        meter = HostMeter()
        run_kw = {**kw, "graphs": FakeGraphBackend()} if kw.get("graphs") == "fake" else kw
        with kernel_backend("reference"), warnings.catch_warnings(), observe(meter):
            warnings.simplefilter("ignore", RuntimeWarning)
            if count_ops:  # a separate run: the counting mode itself costs host time
                with _Ops(meter):
                    generate(model, ids, gen=gen, **run_kw)
            else:
                generate(model, ids, gen=gen, **run_kw)
        return meter

    timed = [run(False) for _ in range(repeats)]
    counted = run(True)
    layers = model.num_layers
    step_s = statistics.median([s for m in timed for s in m.step_s[1:]])  # step 0 probes and cuts
    layer_s = statistics.median([s for m in timed for s in m.layers_s[1:]]) / layers
    return {"mode": name, "us_step": 1e6 * step_s, "us_layer_step": 1e6 * layer_s,
            "ops_layer_step": counted.ops["layers"] / max(1, counted.loops * layers),
            "ops_step": counted.ops["step"] / max(1, len(counted.step_s))}


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_host_overhead(benchmark, family):
    model = tiny_model(family)
    repeats = 1 if benchmark.disabled else 5
    rows = []
    benchmark.pedantic(lambda: rows.extend(measure(model, family, n, kw, repeats) for n, kw in modes(family).items()),
                       rounds=1, iterations=1, warmup_rounds=0)
    print(f"\n[{family}] d_model 32, 3 layers, batch {BATCH}, prompt {PROMPT}, window {WINDOW} (CPU, 1 thread)")
    print("| mode | us/step | us/layer-step | ops/layer-step | ops/step outside the layers |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['us_step']:.0f} | {r['us_layer_step']:.0f} | {r['ops_layer_step']:.1f} | "
              f"{r['ops_step']:.1f} |")
        assert r["us_step"] > 0 and r["ops_layer_step"] > 0
