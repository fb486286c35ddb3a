"""Calibrate DyLLM for a checkpoint: its saliency threshold and its attention mode, chosen on one set
of requests and confirmed on a disjoint one.

DyLLM's paper fixes tau per model family (0.99 LLaDA, 0.995 Dream; its sweeps span
0.98-0.9975; we try 0.999 and 0.9995 too) and approximates the attention of the rows outside the gating set by
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
   (``calibration.accuracy``: at most ``max_drop`` below it and no significant loss), whose changed
   answers predict no larger loss either (``expected_drop`` at most ``max_drop``;
   :func:`expected_drops`) and, for key correction, that measurably keep more answers than the
   authors' update - strictly more right answers than the authors' update at the same tau on the
   choose set (and, step 3, not fewer on the confirm set); of those, the highest ideal speed-up
   (dense over DyLLM multiply-accumulates, from the measured salient fractions: deterministic,
   unlike the wall clock of a shared CPU); ties go to the more accurate, then to the earlier
   candidate (the authors' settings first). When none qualifies, the most accurate candidate is
   chosen (ties: the fewer answers changed) and the result says so (``within_tolerance: false``).

   Why the second test: on a few dozen requests exact match counts a handful of flips, and two
   candidates a point apart on a larger sample can both show none (arith, 128 requests: tau 0.999 and
   0.9995 with exact attention, 0 right->wrong each; on 500 held-out ones 10 and 2). The answers a
   candidate changes are several times as many, and each costs about the same on average: the net
   loss per changed answer, pooled over every candidate of the calibration, times a candidate's
   changed answers predicts its loss with far less noise (arith: 1.3 points predicted for tau 0.999
   exact on the 500, 1.2 measured; bench/RESULTS.md, "DyLLM: a choice that survives 500 requests").
   Pooled over every mode, the rate overstates what key correction's changes cost on that model
   (3.3 points predicted, 1.2 measured): there the test errs on the side of caution.
3. **confirm set** (disjoint from the choose set; :func:`confirm_in_order`): decode the baseline,
   then the choose set's keepers in the order step 2 prefers them, until one holds there: it keeps
   the baseline's accuracy and, when key-corrected, keeps at least as many answers as the authors'
   update at its tau. At most ``confirm_tries`` (default :data:`CONFIRM_TRIES`) are confirmed; when
   none holds, the one of them with the most right answers there is chosen and the result says so
   (``holds: false``). Each try is reported (``confirm.tried``). Trying a second keeper makes the
   confirm set part of the choice: on a workload where a few answers decide, a larger held-out set
   is the final word (bench/RESULTS.md measures the shipped choices on 500 held-out requests).

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

#: the taus tried besides the family default: the paper's sweep range (0.98-0.9975) and two steps
#: past it - on long answers (the arith model's 21-112 tokens) DyLLM alone keeps the accuracy of 500
#: held-out requests only at 0.9995 (bench/RESULTS.md, "DyLLM on arith, confirmed in order")
TAU_GRID = (0.98, 0.99, 0.995, 0.9975, 0.999, 0.9995)
#: the attention modes tried with each tau (``DyLLMConfig.attention_mode`` -> its fields)
ATTENTION_MODES = {
    "paper": {"approx_attention": True, "key_correction": False},
    "partial": {"approx_attention": True, "key_correction": True},
    "exact": {"approx_attention": False, "key_correction": False},
}


#: how many of the choose set's keepers are confirmed, fastest first, before the calibration gives up
CONFIRM_TRIES = 3


def check_max_drop(max_drop) -> None:
    if isinstance(max_drop, bool) or not isinstance(max_drop, (int, float)) or not 0 <= max_drop < 1:
        raise ValueError(f"max_drop must be a number in [0, 1), got {max_drop!r}")


def check_taus(taus, *, option: str = "taus") -> None:
    """A grid of saliency thresholds: finite numbers > 0 (cosine similarities; above 1 every row is salient)."""
    if not taus:
        raise ValueError(f"{option} is empty")
    for t in taus:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"{option} must hold finite numbers > 0 (cosine-similarity thresholds), got {t!r}")


def ideal_speedup(dyllm_stats: list[dict]) -> float:
    """Dense over DyLLM multiply-accumulates summed over the batches of a run (``RunResult.dyllm``)."""
    dense = sum(r["dense_macs"] for d in dyllm_stats for r in d["steps"])
    sparse = sum(r["macs"] for d in dyllm_stats for r in d["steps"])
    return dense / sparse if sparse else 1.0


def authors_update_of(cfg: DyLLMConfig) -> DyLLMConfig:
    """The same configuration with the authors' attention update (no key correction)."""
    return cfg.replace(**ATTENTION_MODES["paper"])


def expected_drops(candidates: list[dict], requests: int) -> float:
    """Set each candidate's ``expected_drop``, the accuracy loss its changed answers predict, and
    return the net loss per changed answer it is built on.

    candidates: dicts with ``changed`` (answers that differ from the baseline's), ``right_to_wrong``
    and ``wrong_to_right`` (flips against the baseline), all on the same ``requests`` requests. The
    net loss per changed answer is pooled over every candidate: (sum of right->wrong - sum of
    wrong->right) / sum of changed, at least 0 (a calibration whose changes gain answers predicts no
    loss), 0 when no answer changed. ``expected_drop`` = changed x that rate / requests, in the units
    of ``max_drop`` (0.01 = one point).
    """
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise ValueError(f"requests must be a positive int, got {requests!r}")
    changed = sum(c["changed"] for c in candidates)
    net_loss = sum(c["right_to_wrong"] - c["wrong_to_right"] for c in candidates)
    loss_per_change = max(net_loss, 0) / changed if changed else 0.0
    for c in candidates:
        c["expected_drop"] = c["changed"] * loss_per_change / requests
    return loss_per_change


def eligible(candidate: dict, *, max_drop: float = MAX_DROP) -> bool:
    """Keeps the baseline's accuracy, its changed answers predict no larger loss than ``max_drop``
    (``expected_drop``, :func:`expected_drops`), and, when key-corrected, it keeps more answers than
    the authors' update at the same tau (``beats_authors_update``)."""
    if not candidate["keeps_accuracy"] or candidate["expected_drop"] > max_drop + 1e-12:
        return False
    return candidate["config"].attention_mode != "partial" or bool(candidate.get("beats_authors_update"))


def choose(candidates: list[dict], *, max_drop: float = MAX_DROP) -> tuple[dict, bool]:
    """The chosen candidate and whether it is within the tolerance (see the module docstring).

    candidates: dicts with ``accuracy``, ``ideal_speedup``, ``keeps_accuracy``, ``changed``,
    ``expected_drop`` (:func:`expected_drops`), ``config`` (a DyLLMConfig) and, for key-corrected
    ones, ``beats_authors_update``; candidates earlier in the list win exact ties (list the defaults
    first).
    """
    ranked, within = ranked_choices(candidates, max_drop=max_drop)
    return ranked[0], within


def ranked_choices(candidates: list[dict], *, max_drop: float = MAX_DROP) -> tuple[list[dict], bool]:
    """The choose set's choices in the order :func:`choose` prefers them, and whether they keep the
    accuracy: every eligible candidate, fastest first (ties: the more accurate, then the earlier),
    or, when none is eligible, the most accurate candidate alone (ties: the fewer answers changed,
    then the faster, then the earlier)."""
    if not candidates:
        raise ValueError("candidates is empty")
    order = {id(c): i for i, c in enumerate(candidates)}
    ok = [c for c in candidates if eligible(c, max_drop=max_drop)]
    if ok:
        return sorted(ok, key=lambda c: (-c["ideal_speedup"], -c["accuracy"], order[id(c)])), True
    return [max(candidates, key=lambda c: (c["accuracy"], -c["changed"], c["ideal_speedup"], -order[id(c)]))], False


def confirm_in_order(ranked: list[dict], right_on_confirm, baseline_right: list[bool], *,
                     max_drop: float = MAX_DROP, tries: int = CONFIRM_TRIES, log=print) -> tuple[dict, list[dict]]:
    """Confirm ``ranked`` (:func:`ranked_choices`) on the confirm set in order until one holds; returns
    ``(chosen, tried)``.

    right_on_confirm: ``DyLLMConfig -> list[bool]``, a configuration's verdicts on the confirm set
    (the caller decodes each configuration once). A candidate holds when it keeps the baseline's
    accuracy there (``baseline_right``, ``max_drop``) and, when key-corrected, keeps at least as many
    answers as the authors' update at its tau. ``tried``: per confirmed candidate its ``config``
    (a DyLLMConfig), ``right_answers``, flips and p (:func:`~.accuracy.paired_figures`), ``holds``
    and, when key-corrected, ``authors_update_right``. ``chosen``: the first ``tried`` entry that
    holds, else the one with the most right answers (ties: the earlier).
    """
    if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
        raise ValueError(f"tries must be a positive int, got {tries!r}")
    if not ranked:
        raise ValueError("ranked is empty")
    tried = []
    for cand in ranked[:tries]:
        cfg = cand["config"]
        right = right_on_confirm(cfg)
        entry = {"config": cfg, "right_answers": sum(right), **paired_figures(baseline_right, right, max_drop=max_drop)}
        entry["holds"] = entry["keeps_accuracy"]
        why = "" if entry["holds"] else ": it loses accuracy there"
        if cfg.attention_mode == "partial":
            entry["authors_update_right"] = sum(right_on_confirm(authors_update_of(cfg)))
            if entry["holds"] and entry["right_answers"] < entry["authors_update_right"]:
                entry["holds"] = False
                why = f": key correction keeps fewer answers than the authors' update there " \
                      f"({entry['right_answers']} vs {entry['authors_update_right']})"
        tried.append(entry)
        log(f"confirm try {len(tried)}: tau {cfg.tau}, {cfg.attention_mode} attention: {sum(right)} of {len(right)} "
            f"right vs the baseline's {sum(baseline_right)} ({entry['right_to_wrong']} right->wrong, "
            f"{entry['wrong_to_right']} wrong->right: {entry['verdict']}) - "
            + ("it holds" if entry["holds"] else f"it does NOT hold{why}"))
        if entry["holds"]:
            return entry, tried
    return max(tried, key=lambda e: (e["right_answers"], -tried.index(e))), tried


def _with_references(requests: list[Request], answers: list[list[int]]) -> list[Request]:
    """Copies of ``requests`` where one without a reference takes the baseline's answer as its own."""
    return [r if r.truth_ids is not None else replace(r, truth_ids=list(a)) for r, a in zip(requests, answers)]


def calibrate_dyllm(model, requests: list[Request], gen: GenerationConfig, *, confirm: list[Request],
                    max_drop: float = MAX_DROP, taus: tuple[float, ...] | None = None, full_steps: int = 4,
                    prompt_period: int = 4, batch_size: int = 16, confirm_tries: int = CONFIRM_TRIES,
                    progress: bool = False, score=None, log=print) -> dict:
    """Choose a :class:`DyLLMConfig` for ``model`` on ``requests`` and confirm it on ``confirm`` (a
    disjoint set; see the module docstring).

    max_drop: the largest accuracy loss against the baseline a candidate may have (absolute, in
    [0, 1); 0.01 = one point). taus: the grid (default :data:`TAU_GRID`; the family default is
    always added). score: ``(requests, answers) -> accuracy`` against the requests' ``truth_ids``
    (default: exact match; a workload scored by its final answer passes its own).

    Returns a dict with ``config`` (the choice), ``within_tolerance``, ``requests`` (the choose
    set's size), the baseline's figures and every candidate's (accuracy, its flips against the
    baseline and McNemar's p, answers changed and the loss they predict (``expected_drop``, with
    ``loss_per_change``: :func:`expected_drops`), ideal speed-up, salient fraction, wall seconds),
    and ``confirm`` (the confirm set's size, the baseline's and the choice's figures there,
    ``holds``, and ``tried``: every confirmed candidate, :func:`confirm_in_order`). confirm_tries:
    at most this many of the choose set's keepers are confirmed (a positive int).
    """
    check_max_drop(max_drop)
    if isinstance(confirm_tries, bool) or not isinstance(confirm_tries, int) or confirm_tries < 1:
        raise ValueError(f"confirm_tries must be a positive int, got {confirm_tries!r}")
    if not requests:
        raise ValueError("requests is empty")
    if not confirm:
        raise ValueError("confirm is empty: the choice is confirmed on a disjoint set of requests")
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    # every candidate is built (and validated) before anything is decoded
    default = DyLLMConfig.for_model(model, full_steps=full_steps, prompt_period=prompt_period)
    taus = TAU_GRID if taus is None else tuple(taus)
    check_taus(taus)
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
    loss_per_change = expected_drops(candidates, len(requests))
    log(f"net loss per changed answer, pooled over the {len(candidates)} candidates: {loss_per_change:.3f}")
    for cand in candidates:
        cfg = cand["config"]
        extra = ""
        if cfg.attention_mode == "partial":
            extra = ", keeps more than the authors' update" if cand["beats_authors_update"] else \
                ", not more than the authors' update"
        log(f"  tau {cfg.tau:<6} {cfg.attention_mode:7s}: exact match {cand['accuracy']:.3f} "
            f"({cand['right_to_wrong']} right->wrong, {cand['wrong_to_right']} wrong->right: {cand['verdict']}; "
            f"{cand['changed']} of {len(requests)} answers changed: expected drop {100 * cand['expected_drop']:.2f} "
            f"points), ideal x{cand['ideal_speedup']:.2f}{extra}")
    ranked, within = ranked_choices(candidates, max_drop=max_drop)
    best = ranked[0]
    note = "" if within else f" - no candidate keeps the baseline's accuracy (within {max_drop}): the most accurate"
    log(f"chosen on the choose set: tau {best['config'].tau}, {best['config'].attention_mode} attention "
        f"(exact match {best['accuracy']:.3f} vs {base_acc:.3f}, ideal x{best['ideal_speedup']:.2f}){note}")

    # the confirm set: the baseline, then the keepers in order until one holds
    confirm_base = decode(confirm, None, "confirm: baseline")
    confirm = _with_references(confirm, confirm_base.answers)
    confirm_base_right = right_answers(confirm, confirm_base.answers, score)
    decoded = {}

    def confirm_right(cfg):
        if cfg not in decoded:
            res = decode(confirm, cfg, f"confirm: tau {cfg.tau} {cfg.attention_mode}")
            decoded[cfg] = (res, right_answers(confirm, res.answers, score))
        return decoded[cfg][1]

    chosen, tried = confirm_in_order(ranked, confirm_right, confirm_base_right, max_drop=max_drop,
                                     tries=confirm_tries, log=log)
    res = decoded[chosen["config"]][0]
    confirm_acc = sum(confirm_base_right) / len(confirm_base_right)
    held = chosen["holds"]
    log(f"confirmed on {len(confirm)} held-out requests: tau {chosen['config'].tau}, "
        f"{chosen['config'].attention_mode} attention, exact match {chosen['right_answers'] / len(confirm):.3f} vs "
        f"baseline {confirm_acc:.3f} - " + ("it holds there" if held else
                                           f"none of the {len(tried)} tried holds there: the most accurate of them"))
    return {
        "config": chosen["config"],
        "within_tolerance": within,
        "max_drop": max_drop,
        "rule": "keeps accuracy: at most max_drop below the baseline and no significant loss (McNemar exact, "
                "p > 0.05 or more wrong->right than right->wrong), and expected_drop (answers changed x the net "
                "loss per changed answer pooled over every candidate / requests) at most max_drop; key "
                "correction only with strictly more right answers than the authors' update at the same tau on "
                "the choose set and not fewer on the confirm set; the keepers fastest first by ideal speed-up, "
                f"each confirmed until one holds (at most {confirm_tries})",
        "requests": len(requests),
        "loss_per_change": loss_per_change,
        "baseline": {"exact_match": base_acc, "tok_per_s": base.tok_per_s, "wall_s": base.wall_s},
        "candidates": [{**{k: v for k, v in c.items() if k not in ("config", "right")}, "config": c["config"].to_dict()}
                       for c in candidates],
        "confirm": {
            "requests": len(confirm),
            "baseline": {"exact_match": confirm_acc, "tok_per_s": confirm_base.tok_per_s},
            "chosen": {**{k: v for k, v in chosen.items() if k != "config"}, "config": chosen["config"].to_dict(),
                       "exact_match": chosen["right_answers"] / len(confirm), "tok_per_s": res.tok_per_s,
                       "ideal_speedup": ideal_speedup(res.dyllm),
                       "choose_set_ideal_speedup": by_config[chosen["config"]]["ideal_speedup"]},
            "holds": held,
            "tried": [{**{k: v for k, v in e.items() if k != "config"}, "config": e["config"].to_dict()}
                      for e in tried],
        },
        "seconds": time.perf_counter() - t0,
    }
