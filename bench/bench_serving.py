"""Batched serving after Seer's cut: vanilla vs pad-to-longest vs the full PWR router.

LaViDa-like requests: a long cached prefix (the image + prompt positions; LaViDa's prefix KV
cache), a 32-position window decoded one token per step, and answer lengths drawn from a
realistic mixture (60% short answers of 1-8 tokens, 35% long of 9-30, 5% that fill the window:
the window sizes of SPEC.md §1.6 put most answers far below the window). L* comes from an
oracle (random weights have no answer end to find): this measures the serving path alone.
Random-weight LaViDa-LLaDA architecture, d_model 256, 4 layers. Run:

    .venv/bin/pytest bench/bench_serving.py -m bench -s          # batches 32 and 64, prefix 512

(the CI smoke run, with --benchmark-disable, uses batch 4 and a 16-position prefix.)
Printed per batch size: wall time of the decode (prefill excluded: it is the same for every
mode), answer tok/s, tokens computed, and the router's useful / padded tokens per path.
"""

from __future__ import annotations

import pytest
import torch

import model_adapters as ma
from bench.workloads import OracleCut, answer_lengths
from seer_kernels import kernel_backend
from seer_runtime import GenerationConfig, generate
from seer_runtime.serving.router import RouterConfig

pytestmark = pytest.mark.bench

WINDOW = 32


@pytest.fixture(scope="module")
def serving_model():
    torch.manual_seed(0)
    return ma.build_model(ma.tiny_config("lavida-llada", d_model=256, n_heads=4, n_kv_heads=4, n_layers=4,
                                         mlp_hidden_size=704, vocab_size=4096, embedding_size=4096,
                                         mask_token_id=4095, eos_token_id=4094, eot_token_id=4093,
                                         pad_token_id=4094, bos_token_id=4092))


def test_serving_modes(benchmark, serving_model):
    quick = benchmark.disabled
    batches, prefix = ((4,), 16) if quick else ((32, 64), 512)
    gen = GenerationConfig(gen_length=WINDOW, steps=WINDOW, prefix_cache=True, tie_break="stable")
    rows = []

    def run():
        for batch in batches:
            ids = torch.randint(0, 4000, (batch, prefix))
            lengths = answer_lengths(batch, window=WINDOW, seed=batch)
            keep = [min(WINDOW, n + 1) for n in lengths]  # the answer plus its end token
            modes = {
                "vanilla": dict(),
                "pad to longest": dict(policies=[OracleCut(keep)]),
                "router": dict(policies=[OracleCut(keep)], router=RouterConfig.for_window(WINDOW, max_batch=256)),
            }
            for name, kw in modes.items():
                with kernel_backend("reference"):
                    out = generate(serving_model, ids, gen=gen, graphs=None, **kw)
                st = out.stats
                decode = st.time_s["total"] - st.time_s.get("prefill", 0.0) - st.time_s.get("embed", 0.0)
                rows.append((batch, name, decode, sum(lengths) / decode, st.positions_computed,
                             st.extra.get("router", {})))

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    print(f"\nprefix {prefix}, window {WINDOW}, d_model 256, 4 layers (CPU, reference kernels)")
    print("| batch | mode | decode s | answer tok/s | tokens computed | vs vanilla | per path useful/computed |")
    print("|---|---|---|---|---|---|---|")
    base = {}
    for batch, name, decode, tps, tokens, router in rows:
        base.setdefault(batch, decode)
        paths = ", ".join(f"{p} {v['useful_tokens']}/{v['computed_tokens']}" for p, v in router.items())
        print(f"| {batch} | {name} | {decode:.2f} | {tps:.1f} | {tokens:,} | x{base[batch] / decode:.2f} | {paths} |")
    for batch in batches:
        mine = [r for r in rows if r[0] == batch]
        assert mine[1][4] < mine[0][4], "the cut must reduce the tokens computed"
        assert mine[2][4] <= mine[1][4], "routing never computes more than padding to the longest"
