"""Baseline vs DyLLM vs Seer vs Seer+DyLLM (and Seer with the router) on the embedded DMLLM.

The trained LaViDa-LLaDA demo model, held-out requests, batches of 16, interleaved batch by
batch so every configuration sees the same machine load. Run:

    .venv/bin/pytest bench/bench_embedded.py -m bench -s          # 96 requests

(the CI smoke run, with --benchmark-disable, decodes one batch of 4.) Printed: answer tok/s,
mean latency, tokens computed (positions x layers), exact match, measured speed-up over the
baseline beside the ideal one (the tokens-computed ratio; for DyLLM also the layer-FLOP ratio
from the measured salient fractions). DyLLM three times: the defaults (the paper's tau 0.99,
warm-up 4, prompt period 4, with the key-corrected partial attention), the same with the
paper's partial attention verbatim, and the configuration ``seer calibrate-dyllm`` chose for
the shipped weights (``model_adapters/embedded/dyllm_config.json``).
"""

from __future__ import annotations

import pytest
import torch

from seer_kernels import kernel_backend
from seer_runtime import DyLLMConfig
from seer_runtime.calibration.dyllm import ideal_speedup
from seer_runtime.evaluate import RunResult, run_requests
from seer_runtime.serving.router import RouterConfig

pytestmark = pytest.mark.bench


def test_embedded_methods(benchmark):
    from model_adapters.embedded import serving

    n, bs = (4, 4) if benchmark.disabled else (96, 16)
    model, tok = serving.load_embedded()
    requests, _ = serving.demo_requests(n, tok)
    gen = serving.demo_generation_config()
    seer = serving.default_seer_config()
    defaults = DyLLMConfig.for_model(model)
    paper = defaults.replace(key_correction=False)
    calibrated = serving.default_dyllm_config()
    configs = {
        "baseline": {},
        "dyllm (defaults)": {"dyllm": defaults},
        "dyllm (the paper's partial attention)": {"dyllm": paper},
        "dyllm (calibrated for the checkpoint)": {"dyllm": calibrated},
        "seer": {"seer": seer},
        "seer+dyllm (defaults)": {"seer": seer, "dyllm": defaults},
        "seer+dyllm (calibrated)": {"seer": seer, "dyllm": calibrated},
        "seer+router": {"seer": seer, "router": RouterConfig.for_window(gen.gen_length, max_batch=bs)},
    }
    results = {name: RunResult() for name in configs}
    dyllm_stats = {name: [] for name in configs}  # RunResult.dyllm of every batch

    def run():
        with kernel_backend("reference"):
            for start in range(0, n, bs):
                batch = requests[start: start + bs]
                for name, kw in configs.items():
                    part = run_requests(model, batch, gen, batch_size=bs, graphs=None, **kw)
                    results[name].extend(part)
                    dyllm_stats[name] += part.dyllm

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    base = results["baseline"]
    print(f"\nembedded LaViDa-LLaDA, {n} held-out requests, batch {bs}, window {gen.gen_length}, "
          f"{torch.get_num_threads()} thread(s)")
    print("| config | answer tok/s | latency s | tokens computed | exact match | speed-up | ideal (tokens) | "
          "ideal (DyLLM FLOPs) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, res in results.items():
        # dense over DyLLM multiply-accumulates, summed over all batches
        dy = f"x{ideal_speedup(dyllm_stats[name]):.2f}" if dyllm_stats[name] else ""
        print(f"| {name} | {res.tok_per_s:.1f} | {res.latency_s:.3f} | {res.positions_computed:,} | "
              f"{res.exact_match(requests):.3f} | x{res.tok_per_s / base.tok_per_s:.2f} | "
              f"x{base.positions_computed / max(1, res.positions_computed):.2f} | {dy} |")
    assert all(len(r.answers) == n for r in results.values())
