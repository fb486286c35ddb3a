"""GPU check, end to end at full depth: DyLLM and Seer on LLaDA-8B / Dream-7B shapes, and batched
serving after Seer's cut on LaViDa-LLaDA shapes.

Run through ``bash bench/gpu_check.sh --only end_to_end``. Random weights with the real models'
shapes and depth (LLaDA-8B: 32 layers, d_model 4096, 32 heads, MLP 12288, vocabulary 126464;
Dream-7B: 28 layers, 3584, 28/4 heads, MLP 18944, vocabulary 152064), bf16. Every row is a whole
``generate`` call timed with the device synchronised before and after (the host loop is part of
what a server pays), after a warm-up call of the same configuration on a short window (Triton's
compilation and autotuning, cuBLAS set-up) and with steady forwards replayed from CUDA graphs
(``generate(graphs="auto")``). Each row prints as it comes, with the measured speed-up over the
baseline beside the ideal one.

* DyLLM and Seer (SPEC.md §2.3 setting): batch 16, prompt 256, window 256, block 32 for LLaDA,
  one token per step: the baseline; DyLLM with the key-corrected partial attention (the
  default), the paper's update and exact attention (ideal: the layer-FLOP ratio DyLLM counts;
  random weights make the salient sets unlike a trained model's); Seer with an oracle ``L*``
  (``bench.workloads.OracleCut`` over ``answer_lengths``: random weights have no answer end to
  find; ideal: tokens computed); Seer + DyLLM (ideal: the product).
* Serving (SPEC.md §1.4-1.6, the paper's Fig. 5 setting): LaViDa-LLaDA's language model, a
  1000-position cached prefix (image + prompt), window 32, batches 32..256: vanilla vs
  pad-to-longest vs the PWR router, after the same oracle cut (ideal: tokens computed).

``--quick`` keeps the depth and shapes but decodes a 64-position window and serves batches 32
and 256. ``dry_run=True`` builds every configuration, policy and full-size model (on the
``meta`` device: shapes without memory) and runs every row at tiny shapes on the CPU: what CI
checks. Importable on a CPU-only machine: nothing touches CUDA before ``run`` is called.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from bench.common import format_row, row
from bench.workloads import OracleCut, answer_lengths

LLADA_8B = dict(n_layers=32, d_model=4096, n_heads=32, n_kv_heads=32, mlp_hidden_size=12288, vocab_size=126464,
                embedding_size=126464, rope_theta=500000.0, mask_token_id=126336, eos_token_id=126081,
                eot_token_id=126348, pad_token_id=126081, bos_token_id=126080)
DREAM_7B = dict(num_hidden_layers=28, hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
                intermediate_size=18944, vocab_size=152064, rope_theta=1000000.0, mask_token_id=151666,
                eos_token_id=151643, eot_token_id=151645, pad_token_id=151643, bos_token_id=151643)
TINY_LLADA = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=4, mlp_hidden_size=128)
TINY_DREAM = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128)
KINDS = {"llada": ("llada-8b-instruct", LLADA_8B, TINY_LLADA), "dream": ("dream-v0-instruct-7b", DREAM_7B, TINY_DREAM)}


@dataclass(frozen=True)
class Setting:
    """What the check decodes (the full one on the GPU, a tiny one in a dry run)."""

    device: str
    dtype: torch.dtype
    full_size: bool
    batch: int = 16
    prompt: int = 256
    window: int = 256
    block: int = 32
    serving_batches: tuple[int, ...] = (32, 64, 128, 256)
    serving_prefix: int = 1000
    serving_window: int = 32


def setting(quick: bool, dry_run: bool) -> Setting:
    if dry_run:
        return Setting("cpu", torch.float32, False, batch=4, prompt=16, window=32, block=8, serving_batches=(4, 8),
                       serving_prefix=40, serving_window=16)
    return Setting("cuda", torch.bfloat16, True, window=64 if quick else 256,
                   serving_batches=(32, 256) if quick else (32, 64, 128, 256))


def build(kind: str, s: Setting, *, device: str | None = None):
    """The model of ``kind`` at the setting's shapes (full depth on the GPU), random weights."""
    import model_adapters as ma

    name, full, tiny = KINDS[kind]
    fields = dict(full) if s.full_size else dict(tiny)  # tiny: tiny_config's own vocabulary and ids
    layers = os.environ.get("SEER_GPU_LAYERS")  # fewer layers only when asked for explicitly
    if layers and s.full_size:
        fields["n_layers" if kind == "llada" else "num_hidden_layers"] = int(layers)
    torch.manual_seed(0)
    return ma.build_model(ma.tiny_config(name, **fields), device=device or s.device, dtype=s.dtype)


def _timed(s: Setting, fn, *args, **kwargs):
    if s.device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    if s.device == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def _emit(rows: list[dict], r: dict) -> None:
    print(format_row("end_to_end", r), flush=True)
    r["printed"] = True
    rows.append(r)


def _oracle_keep(batch: int, window: int, seed: int) -> list[int]:
    """Each request's kept window: its answer and its end token (at most the window)."""
    return [min(window, n + 1) for n in answer_lengths(batch, window=window, seed=seed)]


def decode_rows(kind: str, s: Setting, rows: list[dict]) -> None:
    from seer_runtime import DyLLMConfig, GenerationConfig, generate

    model = build(kind, s)
    block = s.block if kind == "llada" else None
    gen = GenerationConfig(gen_length=s.window, steps=s.window, block_length=block, tie_break="stable",
                           alg="entropy" if kind == "dream" else "origin")
    short = gen.replace(gen_length=min(32, s.window), steps=min(32, s.window),
                        block_length=None if block is None else min(block, 32))
    ids = torch.randint(0, 200, (s.batch, s.prompt), device=s.device)
    keep = _oracle_keep(s.batch, s.window, seed=s.batch)
    warm_keep = [min(k, short.gen_length) for k in keep]
    modes = {
        "baseline": ({}, {}),
        "dyllm (key-corrected partial attention)": ({"dyllm": DyLLMConfig.for_model(model)}, {}),
        "dyllm (the paper's partial attention)": ({"dyllm": DyLLMConfig.for_model(model, key_correction=False)}, {}),
        "dyllm (exact attention)": ({"dyllm": DyLLMConfig.for_model(model, approx_attention=False)}, {}),
        "seer (oracle L*)": ({}, {"cut": True}),
        "seer (oracle L*) + dyllm": ({"dyllm": DyLLMConfig.for_model(model)}, {"cut": True}),
    }
    if kind == "llada":  # random weights: a threshold every position passes fills a block per forward
        modes["threshold (a block per forward)"] = ({}, {"gen": {"threshold": 1e-6, "steps": None}})
        modes["seer (oracle L*) + threshold"] = ({}, {"cut": True, "gen": {"threshold": 1e-6, "steps": None}})
        modes["block cache: prefix"] = ({}, {"gen": {"block_cache": "prefix"}})
        modes["block cache: dual"] = ({}, {"gen": {"block_cache": "dual"}})
    where = f"{kind} shapes, {model.num_layers} layers, batch {s.batch}, window {s.window}"
    base = None
    for label, (kw, opts) in modes.items():
        cut = opts.get("cut", False)
        changes = opts.get("gen", {})
        generate(model, ids, gen=short.replace(**changes), policies=[OracleCut(warm_keep)] if cut else [],
                 **kw)  # warm-up
        out, t = _timed(s, generate, model, ids, gen=gen.replace(**changes),
                        policies=[OracleCut(keep)] if cut else [], **kw)
        stats = out.stats
        if base is None:
            base = (t, stats.tokens_computed)
            note = f"{s.batch * s.window / t:.1f} window tok/s, NFE {stats.nfe}"
            _emit(rows, row(f"{where}: {label}", 1e3 * t, note))
            continue
        ideal = 1.0
        if cut or changes:  # fewer positions per forward, or fewer forwards
            ideal *= base[1] / max(1, stats.tokens_computed)
        dy = stats.extra.get("dyllm")
        if dy and dy.get("ideal_flop_ratio"):
            ideal /= dy["ideal_flop_ratio"]
            if cut:  # DyLLM's own count already covers the cut windows
                ideal = base[1] / max(1, dy["tokens_computed_dense"]) / dy["ideal_flop_ratio"]
        salient = f", salient {dy['salient_fraction']:.3f}" if dy and dy.get("salient_fraction") is not None else ""
        _emit(rows, row(f"{where}: {label}", 1e3 * t,
                        f"measured x{base[0] / t:.2f} over the baseline, ideal x{ideal:.2f}{salient}, NFE {stats.nfe}"))
    del model
    if s.device == "cuda":
        torch.cuda.empty_cache()


def serving_rows(s: Setting, rows: list[dict]) -> None:
    from seer_runtime import GenerationConfig, generate
    from seer_runtime.serving.router import RouterConfig

    model = build("llada", s)  # LaViDa-LLaDA's language model; the cached prefix stands for image + prompt
    window = s.serving_window
    gen = GenerationConfig(gen_length=window, steps=window, prefix_cache=True, tie_break="stable")
    router = RouterConfig.for_window(window, max_batch=max(s.serving_batches))
    for batch in s.serving_batches:
        keep = _oracle_keep(batch, window, seed=batch)
        ids = torch.randint(0, 200, (batch, s.serving_prefix), device=s.device)
        modes = {"vanilla": {}, "pad to longest": {"policies": [OracleCut(keep)]},
                 "router": {"policies": [OracleCut(keep)], "router": router}}
        base = None
        for name, kw in modes.items():
            warm = {**kw, "policies": [OracleCut(keep[:2])]} if "policies" in kw else kw
            generate(model, ids[:2], gen=gen, **warm)  # warm-up
            out, t = _timed(s, generate, model, ids, gen=gen, **kw)
            tokens = out.stats.tokens_computed
            base = base or (t, tokens)
            _emit(rows, row(f"serving batch {batch}, prefix {s.serving_prefix}, window {window}: {name}", 1e3 * t,
                            f"{sum(keep) / t:.1f} answer tok/s, measured x{base[0] / t:.2f} vs vanilla, "
                            f"ideal x{base[1] / max(1, tokens):.2f} (tokens computed)"))
    del model
    if s.device == "cuda":
        torch.cuda.empty_cache()


def check_full_shapes(rows: list[dict]) -> None:
    """Dry run: every full-size model builds (on the meta device) with the parameter count its
    checkpoint has, so the GPU run decodes the shapes it claims."""
    full = Setting("meta", torch.bfloat16, True)
    for kind, expected in (("llada", 8.0e9), ("dream", 7.6e9)):
        model = build(kind, full, device="meta")
        n = sum(p.numel() for p in model.parameters())
        ok = abs(n - expected) / expected < 0.05
        _emit(rows, row(f"{kind} full-size model on the meta device", None,
                        f"{n / 1e9:.2f}B parameters, {model.num_layers} layers", ok=ok))


def run(quick: bool = False, dry_run: bool = False) -> list[dict]:
    """Every row (module docstring); each printed as it comes."""
    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError("the end-to-end check needs a CUDA device (or dry_run=True)")
    s = setting(quick, dry_run)
    rows: list[dict] = []
    if dry_run:
        check_full_shapes(rows)
    for part in (lambda: decode_rows("llada", s, rows), lambda: decode_rows("dream", s, rows),
                 lambda: serving_rows(s, rows)):
        try:
            with torch.no_grad():
                part()
        except Exception as exc:  # one part failing must not hide the others' rows
            import traceback

            traceback.print_exc()
            _emit(rows, row("end_to_end part crashed", None, repr(exc)[:200], ok=False))
    return rows
