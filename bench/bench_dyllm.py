"""DyLLM end to end on CPU: baseline vs DyLLM decoding, side by side in one run.

Mid-size LLaDA-architecture config (d_model 1024, 16 heads, 4 layers, MLP 2816, vocabulary
32000, as ``bench_engine.py``) with **random weights**, batch 2, prompt 64, window 32 (one token
per step, one block; the smoke run with ``--benchmark-disable`` uses prompt 16, window 8).
Configurations, timed in alternation (these machines are noisy):

* baseline - the plain engine;
* DyLLM defaults (the authors' code) - tau 0.99, 4 warm-up steps, prompt fed every 4th step,
  ``C_cache + P[:, A] @ dV`` for the rows outside the gating set;
* DyLLM key-corrected attention - the same with our update that also accounts for the change
  of the gating rows' keys (``key_correction=True``);
* DyLLM exact attention - the same with exact attention for every fed row;
* DyLLM prompt every step - the saliency gating alone (no response-only steps);
* DyLLM tau 1.01 - every row salient: the cost of the sparse machinery when nothing is skipped.

Per configuration: seconds per generate (median), answer tok/s, positions computed (positions
whose K/V or FFN were computed, summed over layers; baseline: positions fed), the measured
speed-up, the ideal speed-up from the salient fractions over the transformer layers
(``1 / stats.extra["dyllm"]["ideal_flop_ratio"]``) and the same including the LM head, which
every configuration pays in full for the window (Amdahl's cap at this vocabulary).

Random weights give unrealistic saliency (contexts barely move, so almost nothing is salient);
the numbers show the mechanics and the CPU overheads, not the paper's accuracy/speed trade-off.
The lead measures the embedded trained model separately.

    .venv/bin/pytest bench/bench_dyllm.py -m bench -s                      # timings
    .venv/bin/pytest bench/bench_dyllm.py -m bench --benchmark-disable -s  # smoke (CI)

CPU timings run on ``SEER_BENCH_THREADS`` torch threads (default 1; see bench_dyllm_kernels).
"""

from __future__ import annotations

import time

import pytest
import torch

import model_adapters as ma
from seer_kernels import kernel_backend
from seer_runtime import DyLLMConfig, GenerationConfig, generate

pytestmark = pytest.mark.bench

MID = dict(d_model=1024, n_heads=16, n_kv_heads=16, n_layers=4, mlp_hidden_size=2816, vocab_size=32000,
           embedding_size=32000, mask_token_id=31999, eos_token_id=31998, eot_token_id=31997, pad_token_id=31998,
           bos_token_id=31996)

CONFIGS = [
    ("baseline", None),
    ("DyLLM defaults", DyLLMConfig()),
    ("DyLLM key-corrected attention", DyLLMConfig(key_correction=True)),
    ("DyLLM exact attention", DyLLMConfig(approx_attention=False)),
    ("DyLLM prompt every step", DyLLMConfig(prompt_period=1)),
    ("DyLLM tau 1.01 (all salient)", DyLLMConfig(tau=1.01, prompt_period=1)),
]


@pytest.fixture(scope="module")
def mid_model():
    torch.manual_seed(0)
    return ma.build_model(ma.tiny_config("llada-8b-instruct", **MID))


def _run(model, ids, gen, dyllm):
    with kernel_backend("reference"):
        return generate(model, ids, gen=gen, dyllm=dyllm)


def test_dyllm_vs_baseline_cpu(benchmark, mid_model, cpu_threads):
    model = mid_model
    smoke = benchmark.disabled
    batch, prompt, window = (2, 16, 8) if smoke else (2, 64, 32)
    repeats = 1 if smoke else 3
    torch.manual_seed(1)
    ids = torch.randint(0, 30000, (batch, prompt))
    gen = GenerationConfig(gen_length=window, steps=window)
    head_per_position = MID["d_model"] * MID["vocab_size"]

    times: dict[str, list[float]] = {name: [] for name, _ in CONFIGS}
    outs = {}
    for _ in range(repeats):  # interleaved, so machine noise hits every configuration alike
        for name, cfg in CONFIGS:
            start = time.perf_counter()
            outs[name] = _run(model, ids, gen, cfg)
            times[name].append(time.perf_counter() - start)
    benchmark.pedantic(lambda: _run(model, ids, gen, CONFIGS[1][1]), rounds=1, iterations=1, warmup_rounds=0)

    med = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    base = outs["baseline"]
    base_tokens = base.stats.positions_computed  # positions fed x layers (no padding here)
    answer_tokens = batch * window
    lines = [
        f"\nDyLLM vs baseline, random-weight LLaDA d_model 1024 x 4 layers, V 32000, B={batch}, prompt {prompt}, "
        f"window {window}, 1 token/step, CPU {cpu_threads} thread(s), {repeats} interleaved repeat(s), medians.",
        "Random weights: saliency is unrealistic (almost nothing moves); the trained model is measured separately.",
        f"{'configuration':30s} {'s/run':>7s} {'tok/s':>7s} {'tokens':>8s} {'salient':>8s} {'speed-up':>9s} "
        f"{'ideal(layers)':>14s} {'ideal(+head)':>13s}",
    ]
    results = {}
    for name, cfg in CONFIGS:
        out = outs[name]
        assert not (out.responses == model.token_ids.mask).any(), name
        if cfg is None:
            tokens, salient, ideal_layers, ideal_head = base_tokens, 1.0, 1.0, 1.0
        else:
            st = out.stats.extra["dyllm"]
            tokens, salient = st["positions_computed"], st["salient_fraction"]
            ideal_layers = 1.0 / st["ideal_flop_ratio"]
            dense = sum(r["dense_macs"] for r in st["steps"])
            sparse = sum(r["macs"] for r in st["steps"])
            head = sum(r["rows"] for r in st["steps"]) * window * head_per_position
            ideal_head = (dense + head) / (sparse + head)
            assert tokens <= base_tokens
        speedup = med["baseline"] / med[name]
        results[name] = dict(seconds=med[name], speedup=speedup, ideal_layers=ideal_layers, ideal_head=ideal_head,
                             tokens=tokens, salient=salient)
        lines.append(f"{name:30s} {med[name]:7.2f} {answer_tokens / med[name]:7.1f} {tokens:8d} {salient:8.3f} "
                     f"{speedup:8.2f}x {ideal_layers:13.2f}x {ideal_head:12.2f}x")
    print("\n".join(lines))
    benchmark.extra_info.update(results)
    # every row salient: the sparse steps compute what dense steps compute (same tokens)
    assert torch.equal(outs["DyLLM tau 1.01 (all salient)"].responses, base.responses)
    assert results["DyLLM defaults"]["ideal_layers"] > 1.0
    assert results["DyLLM exact attention"]["ideal_layers"] > 1.0
