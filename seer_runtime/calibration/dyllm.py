"""Calibrate DyLLM for a checkpoint: its saliency threshold and its attention mode.

DyLLM's paper fixes tau per model family (0.99 LLaDA, 0.995 Dream; its sweeps span
0.98-0.9975) and approximates the attention of the rows outside the gating set by
``C_cache + P[:, A] @ dV`` (the default, as its authors' code does); we also offer that update
corrected for the change of the salient keys and exact attention (``DyLLMConfig.attention_mode``). What each
costs in accuracy depends on the checkpoint (bench/RESULTS.md, "DyLLM"), so, as
``seer calibrate`` does for Seer, this measures the choice on requests with their baseline
answers:

1. decode the baseline (the references are the given answers; a request without one is
   scored against the baseline's own answer, so accuracy is then agreement with the baseline;
   the caller's requests are not modified);
2. decode every candidate: tau in :data:`TAU_GRID` plus the family default, each with the
   paper's partial attention (the default), our key-corrected partial attention and exact
   attention (:data:`ATTENTION_MODES`; warm-up and prompt period as given, the paper's 4 and
   4 by default);
3. keep the candidates whose exact match is at most ``max_drop`` below the baseline's and
   choose the one with the highest ideal speed-up (dense over DyLLM multiply-accumulates, from
   the measured salient fractions: deterministic, unlike the wall clock of a shared CPU); ties
   go to the more accurate, then to the defaults. When no candidate qualifies, the
   most accurate one is chosen and the result says so (``within_tolerance: false``).

The choice is a :class:`~seer_runtime.dyllm.DyLLMConfig`; ``seer calibrate-dyllm`` writes it as
JSON with every candidate's measurements beside it under ``calibration``.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import replace

from ..config import GenerationConfig
from ..dyllm import DyLLMConfig
from ..evaluate import Request, run_requests
from .seer import exact_match

#: the taus tried besides the family default (the paper's sweep range)
TAU_GRID = (0.98, 0.99, 0.995, 0.9975)
#: the attention modes tried with each tau (``DyLLMConfig.attention_mode`` -> its fields)
ATTENTION_MODES = {
    "paper": {"approx_attention": True, "key_correction": False},
    "partial": {"approx_attention": True, "key_correction": True},
    "exact": {"approx_attention": False, "key_correction": False},
}


def check_max_drop(max_drop) -> None:
    if isinstance(max_drop, bool) or not isinstance(max_drop, (int, float)) or not 0 <= max_drop < 1:
        raise ValueError(f"max_drop must be a number in [0, 1), got {max_drop!r}")


def ideal_speedup(dyllm_stats: list[dict]) -> float:
    """Dense over DyLLM multiply-accumulates summed over the batches of a run (``RunResult.dyllm``)."""
    dense = sum(r["dense_macs"] for d in dyllm_stats for r in d["steps"])
    sparse = sum(r["macs"] for d in dyllm_stats for r in d["steps"])
    return dense / sparse if sparse else 1.0


def choose(candidates: list[dict], baseline_accuracy: float, max_drop: float) -> tuple[dict, bool]:
    """The chosen candidate and whether it is within the tolerance (see the module docstring).

    candidates: dicts with ``accuracy``, ``ideal_speedup`` and ``config`` (a DyLLMConfig);
    candidates earlier in the list win exact ties (list the defaults first).
    """
    if not candidates:
        raise ValueError("candidates is empty")
    order = {id(c): i for i, c in enumerate(candidates)}
    ok = [c for c in candidates if c["accuracy"] >= baseline_accuracy - max_drop - 1e-12]
    if ok:
        return max(ok, key=lambda c: (c["ideal_speedup"], c["accuracy"], -order[id(c)])), True
    return max(candidates, key=lambda c: (c["accuracy"], c["ideal_speedup"], -order[id(c)])), False


def calibrate_dyllm(model, requests: list[Request], gen: GenerationConfig, *, max_drop: float = 0.01,
                    taus: tuple[float, ...] | None = None, full_steps: int = 4, prompt_period: int = 4,
                    batch_size: int = 16, progress: bool = False, score=None, log=print) -> dict:
    """Choose a :class:`DyLLMConfig` for ``model`` on ``requests`` (see the module docstring).

    max_drop: the largest exact-match loss against the baseline a candidate may have (absolute,
    in [0, 1); 0.01 = one point). taus: the grid (default :data:`TAU_GRID`; the family default
    is always added). Returns a dict with ``config`` (the choice), ``within_tolerance``, the
    baseline's figures and every candidate's (accuracy, answers changed, ideal speed-up,
    salient fraction, wall seconds). score: ``(requests, answers) -> accuracy`` against the
    requests' ``truth_ids`` (default: exact match; a workload scored by its final answer passes
    its own).
    """
    check_max_drop(max_drop)
    if not requests:
        raise ValueError("requests is empty")
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    # every candidate is built (and validated) before anything is decoded
    default = DyLLMConfig.for_model(model, full_steps=full_steps, prompt_period=prompt_period)
    taus = TAU_GRID if taus is None else tuple(taus)
    for t in taus:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"taus must hold finite numbers > 0 (cosine-similarity thresholds), got {t!r}")
    grid = sorted({float(t) for t in taus} | {default.tau})
    # the defaults first (they win exact ties), each configuration once
    configs = list(dict.fromkeys([default] + [default.replace(tau=t, **mode)
                                              for mode in ATTENTION_MODES.values() for t in grid]))

    with tqdm(total=len(requests), desc="baseline", disable=not progress, file=sys.stderr) as bar:
        base = run_requests(model, requests, gen, batch_size=batch_size, progress=bar)
    # a request without a reference is scored against the baseline's answer (on copies)
    requests = [r if r.truth_ids is not None else replace(r, truth_ids=list(a))
                for r, a in zip(requests, base.answers)]
    score = score or exact_match
    base_acc = score(requests, base.answers)
    log(f"baseline: exact match {base_acc:.3f}, {base.tok_per_s:.1f} tok/s, {base.wall_s:.1f}s")

    candidates = []
    for cfg in configs:
        mode = cfg.attention_mode
        with tqdm(total=len(requests), desc=f"tau {cfg.tau} {mode}", disable=not progress, file=sys.stderr) as bar:
            res = run_requests(model, requests, gen, batch_size=batch_size, dyllm=cfg, progress=bar)
        fed = sum(sum(r["fed"] for r in d["steps"] if r["mode"] != "full") for d in res.dyllm) * model.num_layers
        computed = sum(sum(sum(r["ffn_computed"]) for r in d["steps"] if r["mode"] != "full") for d in res.dyllm)
        cand = {"config": cfg, "accuracy": score(requests, res.answers),
                "changed": sum(a != b for a, b in zip(res.answers, base.answers)),
                "ideal_speedup": ideal_speedup(res.dyllm), "salient_fraction": computed / fed if fed else None,
                "wall_s": res.wall_s}
        candidates.append(cand)
        log(f"  tau {cfg.tau:<6} {mode:7s}: exact match {cand['accuracy']:.3f} ({cand['changed']} answers changed), "
            f"ideal x{cand['ideal_speedup']:.2f}")
    best, within = choose(candidates, base_acc, max_drop)
    note = "" if within else f" - no candidate within {max_drop} of the baseline: the most accurate"
    log(f"chosen: tau {best['config'].tau}, {best['config'].attention_mode} attention "
        f"(exact match {best['accuracy']:.3f} vs {base_acc:.3f}, ideal x{best['ideal_speedup']:.2f}){note}")
    return {
        "config": best["config"],
        "within_tolerance": within,
        "max_drop": max_drop,
        "requests": len(requests),
        "baseline": {"exact_match": base_acc, "tok_per_s": base.tok_per_s, "wall_s": base.wall_s},
        "candidates": [{**{k: v for k, v in c.items() if k != "config"}, "config": c["config"].to_dict()}
                       for c in candidates],
        "seconds": time.perf_counter() - t0,
    }
