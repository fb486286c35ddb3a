"""GPU check, end to end: batched serving after Seer's cut and DyLLM, at real-model shapes.

Run through ``bash bench/gpu_check.sh --only end_to_end`` (not in CI). Random weights with the
real models' layer shapes (LLaDA-8B: d_model 4096, 32 heads, MLP 12288, vocabulary 126464;
Dream-7B: 3584, 28/4 heads, MLP 18944, vocabulary 152064) but only ``SEER_GPU_LAYERS`` layers
(default 4) so that the script stays within a few minutes; bf16; times are device-synchronised
wall times of whole ``generate`` calls (the host loop is part of what a server pays).

* serving (SPEC.md §1.4-1.6, the paper's Fig. 5 setting): LaViDa-LLaDA shapes, a 1000-position
  cached prefix (image + prompt), window 32, answer lengths from a realistic mixture through an
  oracle L*, batches 32..256: vanilla vs pad-to-longest vs the PWR router (CUDA graphs on the
  static path); the paper's bar: 1.6x over vanilla at batch 256 on A100.
* DyLLM (SPEC.md §2.3 setting): LLaDA-8B and Dream-7B shapes, batch 16, prompt 256, window 256,
  block 32, one token per step: baseline vs DyLLM (the defaults, with the key-corrected partial
  attention; the paper's partial attention; exact attention), measured beside the ideal FLOP
  ratio from the salient fractions (random weights: saliency is not the trained models').

Importable on a CPU-only machine: nothing touches CUDA before ``run`` is called.
"""

from __future__ import annotations

import os
import time

import torch

from bench.workloads import answer_lengths

LLADA_8B = dict(d_model=4096, n_heads=32, n_kv_heads=32, mlp_hidden_size=12288, vocab_size=126464,
                embedding_size=126464, rope_theta=500000.0, mask_token_id=126336, eos_token_id=126081,
                eot_token_id=126348, pad_token_id=126081, bos_token_id=126080)
DREAM_7B = dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
                vocab_size=152064, rope_theta=1000000.0, mask_token_id=151666, eos_token_id=151643,
                eot_token_id=151645, pad_token_id=151643, bos_token_id=151643)


def _model(kind: str, layers: int):
    import model_adapters as ma

    torch.manual_seed(0)
    if kind == "dream":
        cfg = ma.tiny_config("dream-v0-instruct-7b", num_hidden_layers=layers, **DREAM_7B)
    else:
        cfg = ma.tiny_config(kind, n_layers=layers, **LLADA_8B)
    return ma.build_model(cfg, device="cuda", dtype=torch.bfloat16)


def _timed(fn, *args, **kwargs):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def serving_rows(quick: bool, layers: int) -> list[dict]:
    from bench.workloads import OracleCut
    from seer_runtime import GenerationConfig, generate
    from seer_runtime.serving.router import RouterConfig

    model = _model("llada-8b-instruct", layers)  # the LaViDa language model; the prefix stands for image + prompt
    window, prefix = 32, 1000
    gen = GenerationConfig(gen_length=window, steps=window, prefix_cache=True, tie_break="stable")
    rows = []
    for batch in ((32, 128) if quick else (32, 64, 128, 256)):
        lengths = answer_lengths(batch, window=window, seed=batch)
        keep = [min(window, n + 1) for n in lengths]
        ids = torch.randint(0, 120000, (batch, prefix), device="cuda")
        modes = {"vanilla": {}, "pad to longest": {"policies": [OracleCut(keep)]},
                 "router": {"policies": [OracleCut(keep)], "router": RouterConfig.for_window(window, max_batch=256)}}
        times = {}
        for name, kw in modes.items():
            generate(model, ids[:2], gen=gen, **{k: v for k, v in kw.items() if k == "router"})  # warm-up
            out, t = _timed(generate, model, ids, gen=gen, **kw)
            times[name] = t
            rows.append({"check": f"serving batch {batch}: {name}", "ok": None, "ms": 1e3 * t,
                         "note": f"{sum(lengths) / t:.1f} answer tok/s, x{times['vanilla'] / t:.2f} vs vanilla, "
                                 f"{out.stats.tokens_computed:,} tokens"})
    return rows


def dyllm_rows(quick: bool, layers: int) -> list[dict]:
    from seer_runtime import DyLLMConfig, GenerationConfig, generate

    rows = []
    for kind in ("llada-8b-instruct", "dream"):
        model = _model(kind, layers)
        window = 64 if quick else 256
        gen = GenerationConfig(gen_length=window, steps=window, block_length=32 if kind != "dream" else None,
                               tie_break="stable", alg="entropy" if kind == "dream" else "origin")
        ids = torch.randint(0, 120000, (16, 256), device="cuda")
        generate(model, ids[:1], gen=gen.replace(gen_length=32, steps=32, block_length=32 if kind != "dream" else None))
        base, tb = _timed(generate, model, ids, gen=gen)
        for label, mode in (("defaults (key-corrected partial attention)", {}),
                            ("the paper's partial attention", {"key_correction": False}),
                            ("exact attention", {"approx_attention": False})):
            cfg = DyLLMConfig.for_model(model, **mode)
            # compile and autotune the sparse step's kernels outside the timing (the first call
            # of a kernel variant takes seconds to tens of seconds)
            short = gen.replace(gen_length=32, steps=32, block_length=32 if kind != "dream" else None)
            generate(model, ids[:2], gen=short, dyllm=cfg)
            dy, td = _timed(generate, model, ids, gen=gen, dyllm=cfg)
            ratio = dy.stats.extra.get("dyllm", {}).get("ideal_flop_ratio")
            ideal = f"x{1 / ratio:.2f}" if ratio else "n/a"
            rows.append({"check": f"dyllm {kind} shapes ({layers} layers), batch 16, window {window}, {label}",
                         "ok": None, "ms": 1e3 * td,
                         "note": f"measured x{tb / td:.2f} over baseline ({1e3 * tb:.0f} ms); "
                                 f"ideal {ideal} (layer FLOPs)"})
    return rows


def run(quick: bool) -> list[dict]:
    layers = int(os.environ.get("SEER_GPU_LAYERS", "4"))
    return serving_rows(quick, layers) + dyllm_rows(quick, layers)
