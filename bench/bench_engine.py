"""Engine overhead per denoising step: time outside the model forward as a fraction of the step.

Mid-size LLaDA-architecture config (d_model 1024, 4 layers, MLP 2816, vocabulary 32000) with
random weights, batch 4, prompt 64, window 64, one token per step. Run:

    .venv/bin/pytest bench/bench_engine.py -m bench -s

The fraction is measured inside one generate() call (stats.time_s), so both sides see the
same machine load. Measurements only: under ``make test`` (``--benchmark-disable``) they are skipped.
"""

from __future__ import annotations

import pytest
import torch

import model_adapters as ma
from seer_kernels import kernel_backend
from seer_runtime import GenerationConfig, generate

pytestmark = pytest.mark.bench

MID = dict(d_model=1024, n_heads=16, n_kv_heads=16, n_layers=4, mlp_hidden_size=2816, vocab_size=32000,
           embedding_size=32000, mask_token_id=31999, eos_token_id=31998, eot_token_id=31997, pad_token_id=31998,
           bos_token_id=31996)


@pytest.fixture(scope="module")
def mid_model():
    torch.manual_seed(0)
    return ma.build_model(ma.tiny_config("llada-8b-instruct", **MID))


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_engine_overhead_per_step(benchmark, mid_model, kind):
    if benchmark.disabled:
        pytest.skip("a measurement (no assertion): run with -m bench")
    model = mid_model
    if kind == "dream":
        torch.manual_seed(0)
        model = ma.build_model(ma.tiny_config(
            "dream-v0-instruct-7b", hidden_size=1024, num_attention_heads=16, num_key_value_heads=4,
            num_hidden_layers=4, intermediate_size=2816, vocab_size=32000, mask_token_id=31999,
            eos_token_id=31998, eot_token_id=31997, pad_token_id=31998, bos_token_id=31996))
    window = 64
    ids = torch.randint(0, 30000, (4, 64))
    gen = GenerationConfig(gen_length=window, steps=window, block_length=16 if kind == "llada" else None,
                           alg="entropy" if kind == "dream" else "origin")
    results = []

    def run():
        with kernel_backend("reference"):
            results.append(generate(model, ids, gen=gen).stats)

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    st = results[-1]
    steps = st.nfe
    total, fwd = st.time_s["total"], st.time_s["forward"]
    overhead = st.engine_overhead_s
    frac = overhead / total
    benchmark.extra_info.update(overhead_fraction=frac, step_ms=1e3 * total / steps)
    print(f"\n[{kind}] d_model 1024, 4 layers, B=4, prompt 64, window {window}, V=32000: "
          f"{1e3 * total / steps:.1f} ms/step, forward {1e3 * fwd / steps:.1f} ms, "
          f"outside the forward {1e3 * overhead / steps:.2f} ms = {100 * frac:.1f}% of the step")


def test_finite_check_cost(benchmark, mid_model):
    """The NaN/inf watch (``GenerationConfig.check_finite``): generate with and without it,
    interleaved in one process (3 rounds each, the median), same inputs; prints the measured
    ratio beside the ideal one (the watch's reductions over the layers' FLOPs: one read of each
    layer's output per position, against ~2 x 12 d^2 multiply-adds of the layer)."""
    import time

    if benchmark.disabled:
        pytest.skip("a measurement (no assertion): run with -m bench")
    model = mid_model
    window = 64
    ids = torch.randint(0, 30000, (4, 64))
    gen = GenerationConfig(gen_length=window, steps=window, block_length=16)
    times = {True: [], False: []}
    rounds = 3

    def run():
        with kernel_backend("reference"):
            for _ in range(rounds):
                for on in (True, False):
                    t0 = time.perf_counter()
                    generate(model, ids, gen=gen.replace(check_finite=on), graphs=None)
                    times[on].append(time.perf_counter() - t0)

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    on, off = sorted(times[True])[len(times[True]) // 2], sorted(times[False])[len(times[False]) // 2]
    d = MID["d_model"]
    layer_flops = 2 * (4 * d * d + 3 * d * MID["mlp_hidden_size"])  # per position
    print(f"\ncheck_finite on {1e3 * on:.1f} ms, off {1e3 * off:.1f} ms: measured x{on / off:.3f}, "
          f"ideal x{1 + d / layer_flops:.5f} (one sum over d per position and layer)")
    benchmark.extra_info.update(on_ms=1e3 * on, off_ms=1e3 * off)
