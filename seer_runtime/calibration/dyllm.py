"""Calibrate DyLLM for a checkpoint: its saliency threshold and its attention mode, chosen on one set
of requests and confirmed on a disjoint one.

DyLLM's paper fixes tau per model family (0.99 LLaDA, 0.995 Dream; its sweeps span
0.98-0.9975; we try 0.999 too) and approximates the attention of the rows outside the gating set by
``C_cache + P[:, A] @ dV`` (the authors' update, the default); we also offer that update
corrected for the change of the salient keys (key correction, our change) and exact attention
(``DyLLMConfig.attention_mode``). What each costs in accuracy depends on the checkpoint
(bench/RESULTS.md, "DyLLM"), so, as ``seer calibrate`` does for Seer, this measures the choice:

1. **choose set**: decode the baseline (the references are the requests' answers; a request
   without one is scored against the baseline's own answer, so accuracy is then agreement with
   the baseline; the caller's requests are not modified), then every candidate: tau in
   :data:`TAU_GRID` plus the family default, each with the authors' update, key correction and
   exact attention (:data:`ATTENTION_MODES`; warm-up and prompt period as given). Each candidate
   is reported with its paired flips against the baseline and McNemar's exact p-value.
2. **choose** (:func:`choose`): the candidates that keep the baseline's accuracy
   (``calibration.accuracy``: at most ``max_drop`` below it and no significant loss) and, for key
   correction, that measurably keep more answers than the authors' update - strictly more right
   answers than the authors' update at the same tau on the choose set (and, step 3, not fewer on
   the confirm set); of those, the highest ideal speed-up (dense over DyLLM multiply-accumulates,
   from the measured salient fractions: deterministic, unlike the wall clock of a shared CPU);
   ties go to the more accurate, then to the earlier candidate (the authors' settings first). When
   none qualifies, the most accurate candidate is chosen and the result says so
   (``within_tolerance: false``).
3. **confirm set** (disjoint from the choose set): decode the baseline and the choice (and, for a
   key-corrected choice, the authors' update at the same tau: when key correction keeps fewer
   answers there, the best choice without it replaces it and is confirmed instead); report the
   choice's accuracy, flips and p there, and whether it holds (keeps the baseline's accuracy).

The choice is a :class:`~seer_runtime.dyllm.DyLLMConfig`; ``seer calibrate-dyllm`` writes it as
JSON with every candidate's measurements and the confirmation beside it under ``calibration``.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import replace

from ..config import GenerationConfig
from ..dyllm import DyLLMConfig
from ..evaluate import Request, run_requests
from .accuracy import MAX_DROP, paired_figures, right_answers
from .seer import exact_match

#: the taus tried besides the family default: the paper's sweep range (0.98-0.9975) and one step
#: past it - on long answers (the arith model's 21-112 tokens) only 0.999 keeps the accuracy
#: (bench/RESULTS.md, "Arith on 500 held-out requests")
TAU_GRID = (0.98, 0.99, 0.995, 0.9975, 0.999)
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


def authors_update_of(cfg: DyLLMConfig) -> DyLLMConfig:
    """The same configuration with the authors' attention update (no key correction)."""
    return cfg.replace(**ATTENTION_MODES["paper"])


def eligible(candidate: dict) -> bool:
    """Keeps the baseline's accuracy, and, when key-corrected, keeps more answers than the authors'
    update at the same tau (``beats_authors_update``)."""
    if not candidate["keeps_accuracy"]:
        return False
    return candidate["config"].attention_mode != "partial" or bool(candidate.get("beats_authors_update"))


def choose(candidates: list[dict]) -> tuple[dict, bool]:
    """The chosen candidate and whether it is within the tolerance (see the module docstring).

    candidates: dicts with ``accuracy``, ``ideal_speedup``, ``keeps_accuracy``, ``config`` (a
    DyLLMConfig) and, for key-corrected ones, ``beats_authors_update``; candidates earlier in the
    list win exact ties (list the defaults first).
    """
    if not candidates:
        raise ValueError("candidates is empty")
    order = {id(c): i for i, c in enumerate(candidates)}
    ok = [c for c in candidates if eligible(c)]
    if ok:
        return max(ok, key=lambda c: (c["ideal_speedup"], c["accuracy"], -order[id(c)])), True
    return max(candidates, key=lambda c: (c["accuracy"], c["ideal_speedup"], -order[id(c)])), False


def _with_references(requests: list[Request], answers: list[list[int]]) -> list[Request]:
    """Copies of ``requests`` where one without a reference takes the baseline's answer as its own."""
    return [r if r.truth_ids is not None else replace(r, truth_ids=list(a)) for r, a in zip(requests, answers)]


def calibrate_dyllm(model, requests: list[Request], gen: GenerationConfig, *, confirm: list[Request],
                    max_drop: float = MAX_DROP, taus: tuple[float, ...] | None = None, full_steps: int = 4,
                    prompt_period: int = 4, batch_size: int = 16, progress: bool = False, score=None,
                    log=print) -> dict:
    """Choose a :class:`DyLLMConfig` for ``model`` on ``requests`` and confirm it on ``confirm`` (a
    disjoint set; see the module docstring).

    max_drop: the largest accuracy loss against the baseline a candidate may have (absolute, in
    [0, 1); 0.01 = one point). taus: the grid (default :data:`TAU_GRID`; the family default is
    always added). score: ``(requests, answers) -> accuracy`` against the requests' ``truth_ids``
    (default: exact match; a workload scored by its final answer passes its own).

    Returns a dict with ``config`` (the choice), ``within_tolerance``, ``requests`` (the choose
    set's size), the baseline's figures and every candidate's (accuracy, its flips against the
    baseline and McNemar's p, answers changed, ideal speed-up, salient fraction, wall seconds),
    and ``confirm`` (the confirm set's size, the baseline's and the choice's figures there, and
    ``holds``).
    """
    check_max_drop(max_drop)
    if not requests:
        raise ValueError("requests is empty")
    if not confirm:
        raise ValueError("confirm is empty: the choice is confirmed on a disjoint set of requests")
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
    score = score or exact_match

    def decode(reqs, cfg, desc):
        with tqdm(total=len(reqs), desc=desc, disable=not progress, file=sys.stderr) as bar:
            return run_requests(model, reqs, gen, batch_size=batch_size, dyllm=cfg, progress=bar)

    base = decode(requests, None, "baseline")
    requests = _with_references(requests, base.answers)
    base_right = right_answers(requests, base.answers, score)
    base_acc = sum(base_right) / len(base_right)
    log(f"choose set: {len(requests)} requests; baseline exact match {base_acc:.3f}, {base.tok_per_s:.1f} tok/s, "
        f"{base.wall_s:.1f}s")

    candidates = []
    for cfg in configs:
        mode = cfg.attention_mode
        res = decode(requests, cfg, f"tau {cfg.tau} {mode}")
        fed = sum(sum(r["fed"] for r in d["steps"] if r["mode"] != "full") for d in res.dyllm) * model.num_layers
        computed = sum(sum(sum(r["ffn_computed"]) for r in d["steps"] if r["mode"] != "full") for d in res.dyllm)
        right = right_answers(requests, res.answers, score)
        cand = {"config": cfg, "accuracy": sum(right) / len(right), "right": right,
                **paired_figures(base_right, right, max_drop=max_drop),
                "changed": sum(a != b for a, b in zip(res.answers, base.answers)),
                "ideal_speedup": ideal_speedup(res.dyllm), "salient_fraction": computed / fed if fed else None,
                "wall_s": res.wall_s}
        candidates.append(cand)
    by_config = {c["config"]: c for c in candidates}
    for cand in candidates:  # key correction must keep more answers than the authors' update at its tau
        if cand["config"].attention_mode == "partial":
            authors = by_config.get(authors_update_of(cand["config"]))
            cand["beats_authors_update"] = authors is not None and sum(cand["right"]) > sum(authors["right"])
    for cand in candidates:
        cfg = cand["config"]
        extra = ""
        if cfg.attention_mode == "partial":
            extra = ", keeps more than the authors' update" if cand["beats_authors_update"] else \
                ", not more than the authors' update"
        log(f"  tau {cfg.tau:<6} {cfg.attention_mode:7s}: exact match {cand['accuracy']:.3f} "
            f"({cand['right_to_wrong']} right->wrong, {cand['wrong_to_right']} wrong->right: {cand['verdict']}; "
            f"{cand['changed']} of {len(requests)} answers changed), ideal x{cand['ideal_speedup']:.2f}{extra}")
    best, within = choose(candidates)
    note = "" if within else f" - no candidate keeps the baseline's accuracy (within {max_drop}): the most accurate"
    log(f"chosen on the choose set: tau {best['config'].tau}, {best['config'].attention_mode} attention "
        f"(exact match {best['accuracy']:.3f} vs {base_acc:.3f}, ideal x{best['ideal_speedup']:.2f}){note}")

    # the confirm set: the baseline, the choice, and for key correction the authors' update beside it
    confirm_base = decode(confirm, None, "confirm: baseline")
    confirm = _with_references(confirm, confirm_base.answers)
    confirm_base_right = right_answers(confirm, confirm_base.answers, score)
    decoded = {}

    def confirm_right(cfg):
        if cfg not in decoded:
            res = decode(confirm, cfg, f"confirm: tau {cfg.tau} {cfg.attention_mode}")
            decoded[cfg] = (res, right_answers(confirm, res.answers, score))
        return decoded[cfg][1]

    chosen = best
    replaced = None
    if within and best["config"].attention_mode == "partial":
        authors_cfg = authors_update_of(best["config"])
        if sum(confirm_right(best["config"])) < sum(confirm_right(authors_cfg)):
            replaced = best["config"].to_dict()
            rest = [c for c in candidates if c["config"].attention_mode != "partial"]
            chosen, within = choose(rest)
            log(f"key correction kept fewer answers than the authors' update on the confirm set "
                f"({sum(confirm_right(best['config']))} vs {sum(confirm_right(authors_cfg))}): chosen instead "
                f"tau {chosen['config'].tau}, {chosen['config'].attention_mode} attention")
    right = confirm_right(chosen["config"])
    res = decoded[chosen["config"]][0]
    figures = paired_figures(confirm_base_right, right, max_drop=max_drop)
    confirm_acc = sum(confirm_base_right) / len(confirm_base_right)
    held = figures["keeps_accuracy"]
    log(f"confirmed on {len(confirm)} held-out requests: exact match {sum(right) / len(right):.3f} vs baseline "
        f"{confirm_acc:.3f} ({figures['right_to_wrong']} right->wrong, {figures['wrong_to_right']} wrong->right: "
        f"{figures['verdict']}) - " + ("it holds there" if held else "it does NOT hold there: it loses accuracy"))
    authors_on_confirm = None
    if chosen["config"].attention_mode == "partial" or replaced is not None:
        cfg = authors_update_of(best["config"])
        authors_on_confirm = {"config": cfg.to_dict(), "right_answers": sum(confirm_right(cfg))}
    return {
        "config": chosen["config"],
        "within_tolerance": within,
        "max_drop": max_drop,
        "rule": "keeps accuracy: at most max_drop below the baseline and no significant loss (McNemar exact, "
                "p > 0.05 or more wrong->right than right->wrong); key correction only with strictly more right "
                "answers than the authors' update at the same tau on the choose set and not fewer on the confirm "
                "set; then the highest ideal speed-up",
        "requests": len(requests),
        "baseline": {"exact_match": base_acc, "tok_per_s": base.tok_per_s, "wall_s": base.wall_s},
        "candidates": [{**{k: v for k, v in c.items() if k not in ("config", "right")}, "config": c["config"].to_dict()}
                       for c in candidates],
        "confirm": {
            "requests": len(confirm),
            "baseline": {"exact_match": confirm_acc, "tok_per_s": confirm_base.tok_per_s},
            "chosen": {"config": chosen["config"].to_dict(), "exact_match": sum(right) / len(right),
                       "tok_per_s": res.tok_per_s, "ideal_speedup": ideal_speedup(res.dyllm), **figures},
            "holds": held,
            **({"authors_update": authors_on_confirm} if authors_on_confirm else {}),
            **({"replaced_key_correction": replaced} if replaced else {}),
        },
        "seconds": time.perf_counter() - t0,
    }
