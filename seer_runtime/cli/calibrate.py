"""``seer calibrate`` and ``seer calibrate-dyllm``: read the requests, split them into a choose set
and a disjoint confirm set, run the calibration, write the chosen configuration as JSON (with the
measurements beside it).

The split (:func:`choose_and_confirm_counts`, :func:`split_disjoint`): on an embedded model
without ``--data``, the first ``--requests`` (default 64) distinct requests of its calibration
split choose and the next ``--confirm-requests`` (default 64) distinct ones not among them confirm
(a stream drawn from a seed of its own, apart from the training stream's and the demo's held-out
one); with ``--data``, the file's first ``--requests`` lines choose and the next
``--confirm-requests`` confirm (default: the first half and the rest), a line repeating an
earlier request left out. Both counts are printed and written into the ``calibration`` record.

``seer calibrate`` then searches the compositions a user can combine with the chosen Seer
configuration (``calibration.compositions``: thresholds, block caches, DyLLM) on the choose set,
recommends the fastest at equal accuracy and confirms it on the confirm set, side by side with
Fast-dLLM's threshold and block cache alone (``--no-compositions`` skips it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

import torch

from ..calibration.accuracy import MAX_DROP
from ..calibration.compositions import against, measure, search_grid
from ..calibration.dyllm import CONFIRM_TRIES, TAU_GRID, calibrate_dyllm, check_max_drop, check_taus
from ..calibration.seer import calibrate, exact_match
from ..config import GenerationConfig, check_real
from ..dyllm import DyLLMConfig
from ..files import check_output_path, check_plot_path
from ..request_files import CALIBRATION_REQUEST, read_jsonl
from .options import add_calibration_inputs, load_calibration_inputs, path_text, positive_int, progress_of

#: the choose and the confirm set's sizes on an embedded model without --data
DEFAULT_SET = 64
#: below this many requests a set is said to be small (a few answers then read as noise)
SMALL_SET = 64
#: the thresholds the composition search of ``seer calibrate`` tries by default
COMPOSITION_THRESHOLDS = (0.8, 0.9, 0.95)


def _add_split_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--confirm-requests", type=positive_int, default=None,
                   help="the confirm set's size: requests after the choose set's (--requests), disjoint from them "
                        f"(default: {DEFAULT_SET} on an embedded model; with --data the lines after the choose set's)")


def add_parsers(sub) -> None:
    p = sub.add_parser("calibrate", help="choose Seer's probe layer, eps, tau_jump and gamma for a checkpoint, "
                                         "and the fastest composition at equal accuracy")
    add_calibration_inputs(p)
    _add_split_options(p)
    p.add_argument("--out", default="seer_config.json", type=path_text,
                   help="where to write the chosen SeerConfig (JSON accepted by `generate --seer` and the demo)")
    p.add_argument("--lam", type=float, default=0.1, help="lambda of U = accuracy ratio + lambda log(speed-up)")
    p.add_argument("--plot", default=None, type=path_text,
                   help="write the per-layer step-0 sparsity profiles (PNG) to this path")
    p.add_argument("--guard-mode", default="extend", choices=["extend", "redecode"],
                   help="the over-truncation guard written into the choice: extend the window with masks "
                        "(cheaper) or decode the request again on the full window (answers equal the baseline's)")
    p.add_argument("--rank-by", default="tokens", choices=["tokens", "wall"],
                   help="speed-up inside U: tokens-computed ratio (deterministic) or wall clock")
    p.add_argument("--eos-thresholds", type=float, nargs="+", default=[0.5],
                   help="thresholds of the eos_prob probe to simulate; the best two are verified (default 0.5; a "
                        "model unsure of its answer length at step 0 needs higher ones, e.g. 0.5 0.9 0.99)")
    p.add_argument("--max-drop", type=float, default=MAX_DROP,
                   help="the accuracy a choice may lose against the baseline and still keep it (0.01 = one point; "
                        "with no significant loss by McNemar's exact test)")
    p.add_argument("--no-compositions", dest="compositions", action="store_false",
                   help="skip the search of compositions (thresholds, block caches, DyLLM) with the chosen Seer")
    p.add_argument("--thresholds", type=float, nargs="+", default=list(COMPOSITION_THRESHOLDS),
                   help="the confidence thresholds the composition search tries (default "
                        f"{' '.join(map(str, COMPOSITION_THRESHOLDS))})")
    p.add_argument("--dyllm", default=None, type=path_text,
                   help="the DyLLMConfig JSON the composition search combines ('none': no DyLLM; default: the "
                        "checkpoint's dyllm_config.json, else the authors' settings for its family)")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="timed passes of each composition that keeps the baseline's accuracy (default 3)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("calibrate-dyllm", help="choose DyLLM's tau and attention mode for a checkpoint")
    add_calibration_inputs(p)
    _add_split_options(p)
    p.add_argument("--out", default="dyllm_config.json", type=path_text,
                   help="where to write the chosen DyLLMConfig (JSON accepted by `generate --dyllm`)")
    p.add_argument("--max-drop", type=float, default=MAX_DROP,
                   help="largest exact-match loss against the baseline a choice may have (0.01 = one point; with "
                        "no significant loss by McNemar's exact test, and no larger loss predicted by the answers "
                        "it changes)")
    p.add_argument("--full-steps", type=positive_int, default=4, help="warm-up steps of every candidate")
    p.add_argument("--prompt-period", type=positive_int, default=4,
                   help="prompt fed every N-th step in every candidate")
    p.add_argument("--taus", type=float, nargs="+", default=None,
                   help="the saliency thresholds tried (default: " + " ".join(map(str, TAU_GRID))
                        + "; the family's default is always added)")
    p.add_argument("--confirm-tries", type=positive_int, default=CONFIRM_TRIES,
                   help="how many of the choose set's keepers are confirmed, fastest first, until one holds on "
                        f"the confirm set (default {CONFIRM_TRIES})")
    p.set_defaults(func=cmd_calibrate_dyllm)


def _outputs(args, progress) -> None:
    """--out (and --plot) checked before the model is loaded: parents created, or refused by name."""
    args.out = check_output_path(args.out, option="--out")
    progress.outputs.append(str(args.out))
    if getattr(args, "plot", None):
        args.plot = check_plot_path(args.plot, option="--plot")
        progress.outputs.append(str(args.plot))


def choose_and_confirm_counts(args) -> tuple[int, int]:
    """The choose and the confirm set's sizes (module docstring), checked before the model loads: with
    ``--data``, a file with fewer lines than both sets need is a ``ValueError`` naming it."""
    if args.data is None:
        if args.model:
            raise ValueError("--model needs --data (a JSONL of requests: question, optional image and answer)")
        return args.requests or DEFAULT_SET, args.confirm_requests or DEFAULT_SET
    lines = len(read_jsonl(args.data, CALIBRATION_REQUEST, what="--data"))
    choose = args.requests or (lines - args.confirm_requests if args.confirm_requests else math.ceil(lines / 2))
    confirm = args.confirm_requests or lines - choose
    if choose < 1 or confirm < 1 or choose + confirm > lines:
        raise ValueError(f"--data {args.data} holds {lines} requests: not enough for a choose set of "
                         f"{max(choose, 1)} and a disjoint confirm set of {max(confirm, 1)} (--requests, "
                         "--confirm-requests)")
    return choose, confirm


def request_key(request) -> tuple:
    """What makes two requests the same: the prompt ids and the image's pixels (an image without
    ``pixel_values`` or tensor form counts as its own object)."""
    image = request.image
    pixels = getattr(image, "pixel_values", image)
    if image is None:
        seen = None
    elif isinstance(pixels, torch.Tensor):
        seen = (tuple(pixels.shape), hashlib.sha1(pixels.detach().cpu().contiguous().numpy().tobytes()).hexdigest())
    else:
        seen = id(image)
    return tuple(request.prompt_ids), seen


def split_disjoint(requests: list, choose_n: int, confirm_n: int) -> tuple[list, list, int]:
    """The first ``choose_n`` distinct requests, then the next ``confirm_n`` distinct ones that are not
    among them (a repeated request would count twice in a set, or in both sets); returns
    ``(choose, confirm, dropped)``, either set shorter when ``requests`` runs out."""
    seen, sets, dropped = set(), ([], []), 0
    for r in requests:
        which = 0 if len(sets[0]) < choose_n else 1
        if len(sets[1]) >= confirm_n:
            break
        key = request_key(r)
        if key in seen:
            dropped += 1
            continue
        seen.add(key)
        sets[which].append(r)
    return sets[0], sets[1], dropped


def load_sets(args, progress):
    """(model, choose requests, confirm requests, gen, score): the calibrate commands' inputs split in
    two disjoint sets (:func:`split_disjoint`; a generated split is drawn twice as long, so that
    repeated requests leave both sets full)."""
    choose_n, confirm_n = choose_and_confirm_counts(args)
    pool = choose_n + confirm_n if args.data else 2 * (choose_n + confirm_n)
    model, requests, gen, score = load_calibration_inputs(argparse.Namespace(**{**vars(args), "requests": pool}))
    score = score or exact_match  # a checkpoint's requests: the whole answer equals the reference
    choose, confirm, dropped = split_disjoint(requests, choose_n, confirm_n)
    if not choose or not confirm:
        raise ValueError(f"{len(requests)} calibration requests hold {len(choose) + len(confirm)} distinct ones: "
                         "too few for a choose set and a disjoint confirm set")
    small = "" if min(len(choose), len(confirm)) >= SMALL_SET else \
        f" (fewer than {SMALL_SET} in a set: a difference of a few answers will read as noise)"
    repeated = f"; {dropped} repeated requests left out" if dropped else ""
    print(f"calibration requests: {len(choose)} to choose on, {len(confirm)} held out to confirm on, distinct"
          f"{repeated}{small}", file=sys.stderr)
    progress.stage = f"calibrating on {len(choose)} + {len(confirm)} requests"  # several passes: no single "N of M"
    return model, choose, confirm, gen, score


def _dyllm_for_search(args, model) -> DyLLMConfig | None:
    """``--dyllm``'s configuration for the composition search (see its help)."""
    if args.dyllm == "none":
        return None
    if args.dyllm and args.dyllm != "default":
        return DyLLMConfig.from_json(args.dyllm)
    if args.dyllm is None:
        folder = Path(args.model) if args.model else Path(_embedded(args).MODEL_DIR)
        if (folder / "dyllm_config.json").is_file():
            return DyLLMConfig.from_json(folder / "dyllm_config.json")
    if getattr(model, "family", None) not in ("llada", "dream"):
        return None
    return DyLLMConfig.for_model(model)


def _embedded(args):
    from .options import model_services

    return model_services().embedded(args.workload or "demo")


def cmd_calibrate(args: argparse.Namespace) -> int:
    check_real("lam", args.lam, minimum=0)  # before the model is loaded
    check_max_drop(args.max_drop)
    for t in args.thresholds:
        GenerationConfig(threshold=t)
    if args.dyllm not in (None, "none", "default"):
        DyLLMConfig.from_json(args.dyllm)
    progress = progress_of(args)
    _outputs(args, progress)
    model, choose, confirm, gen, score = load_sets(args, progress)
    out = calibrate(model, choose, gen, confirm=confirm, lam=args.lam, progress=True, plot=args.plot,
                    rank_by=args.rank_by, guard_mode=args.guard_mode, eos_thresholds=tuple(args.eos_thresholds),
                    max_drop=args.max_drop, score=score)
    cfg = out.pop("config")
    plot_error = out.pop("plot_error", None)
    if args.compositions:
        out["compositions"] = search_compositions(model, choose, confirm, gen, cfg, _dyllm_for_search(args, model),
                                                  thresholds=args.thresholds, repeats=args.repeats,
                                                  max_drop=args.max_drop, score=score, seer_file=str(args.out))
    cfg.to_json(args.out, calibration=out)
    progress.wrote(args.out)
    print(f"wrote {args.out}: {json.dumps(cfg.to_dict())}")
    if args.plot and plot_error is None:
        progress.wrote(args.plot)
    if plot_error is not None:
        print(f"seer calibrate: error: --plot {args.plot} not written ({plot_error}); {args.out} holds the "
              "chosen configuration", file=sys.stderr)
        return 1
    return 0


def _trim(figures: dict) -> dict:
    """A composition row for the calibration record (the per-pass lists kept, the rest as measured)."""
    return {k: v for k, v in figures.items() if k not in ("latency_s",)}


def search_compositions(model, choose, confirm, gen, seer, dyllm, *, thresholds, repeats: int, max_drop: float,
                        score, seer_file: str | None = None, batch_size: int = 16, log=print) -> dict:
    """The compositions of ``seer`` with ``thresholds``, the block caches and ``dyllm`` measured side by
    side on ``choose`` (``calibration.compositions.measure``), the recommendation, and the
    recommendation confirmed on ``confirm`` beside Fast-dLLM alone (the fastest threshold-and-block-
    cache row that kept the accuracy on ``choose``). Returns the record written under
    ``calibration.compositions``."""
    from .demo import format_table

    plans = {c.name: c for c in search_grid(gen, seer=seer, dyllm=dyllm, thresholds=thresholds)}
    log(f"compositions: {len(plans)} beside the baseline on the {len(choose)} choose requests "
        f"(thresholds {' '.join(f'{t:g}' for t in thresholds)}, block caches prefix/dual, Seer"
        f"{', DyLLM' if dyllm else ''})")
    _, figures, recommended = measure(model, choose, gen, plans, batch_size=batch_size, score=score, repeats=repeats,
                                      max_drop=max_drop)
    log(format_table(figures, recommended=recommended))
    fast_only = [name for name, plan in plans.items() if plan.seer is None and plan.dyllm is None
                 and plan.gen.threshold is not None and figures[name].get("keeps_accuracy")]
    reference = min(fast_only, key=lambda name: figures[name]["wall_s_median"]) if fast_only else None
    record = {"requests": len(choose), "thresholds": list(thresholds), "repeats": repeats,
              "rows": {name: _trim(f) for name, f in figures.items()}, "recommended": recommended,
              "fast_dllm_alone": reference}
    if recommended == "baseline":
        log("recommended: the baseline (no composition keeps its accuracy)")
        return record
    plan = plans[recommended]
    record["recommended_form"] = {**plan.describe(gen), "options": plan.options(seer_file=seer_file)}
    log(f"recommended: {recommended}: seer generate {record['recommended_form']['options']}")
    # confirm: the recommendation and Fast-dLLM alone, side by side on the held-out requests
    side = {recommended: plan}
    if reference is not None and reference != recommended:
        side[reference] = plans[reference]
    _, confirmed, _ = measure(model, confirm, gen, side, batch_size=batch_size, score=score, repeats=repeats,
                              max_drop=max_drop, also_time=list(side))
    f = confirmed[recommended]
    record["confirm"] = {"requests": len(confirm), "baseline_exact_match": confirmed["baseline"]["exact_match"],
                         "rows": {name: _trim(x) for name, x in confirmed.items()}, "holds": f["keeps_accuracy"]}
    log(f"confirmed on {len(confirm)} held-out requests: {recommended} exact match {f['exact_match']:.3f} vs baseline "
        f"{confirmed['baseline']['exact_match']:.3f} ({f['right_to_wrong']} right->wrong, {f['wrong_to_right']} "
        f"wrong->right: {f['verdict']}) - " + ("it holds there" if f["keeps_accuracy"] else
                                            "it does NOT hold there: it loses accuracy"))
    if reference is not None and reference != recommended:
        a = against(confirmed, recommended, reference)
        record["confirm"]["against_fast_dllm_alone"] = a
        log(f"  vs {reference}: x{a['measured']:.2f} measured (median of {a['passes'][0]} passes each"
            f"{', noisy' if a['noisy'] else ''}), x{a['ideal']:.2f} ideal (positions computed), "
            f"x{a['ideal_forwards']:.2f} forwards")
    return record


def cmd_calibrate_dyllm(args: argparse.Namespace) -> int:
    check_max_drop(args.max_drop)  # before the model is loaded
    if args.taus is not None:
        check_taus(args.taus, option="--taus")
    DyLLMConfig(full_steps=args.full_steps, prompt_period=args.prompt_period)
    progress = progress_of(args)
    _outputs(args, progress)
    model, choose, confirm, gen, score = load_sets(args, progress)
    out = calibrate_dyllm(model, choose, gen, confirm=confirm, max_drop=args.max_drop, full_steps=args.full_steps,
                          prompt_period=args.prompt_period, taus=args.taus, confirm_tries=args.confirm_tries,
                          progress=True, score=score)
    cfg = out.pop("config")
    cfg.to_json(args.out, calibration=out)
    progress.wrote(args.out)
    print(f"wrote {args.out}: {json.dumps(cfg.to_dict())}")
    if not out["within_tolerance"]:
        print(f"seer calibrate-dyllm: no candidate kept the exact match within {args.max_drop} of the "
              f"baseline (measured and predicted from the answers it changes); {args.out} holds the most "
              "accurate one", file=sys.stderr)
        return 1
    if not out["confirm"]["holds"]:
        print(f"seer calibrate-dyllm: none of the {len(out['confirm']['tried'])} confirmed choices kept the "
              f"baseline's accuracy on the confirm set; {args.out} holds the most accurate of them there",
              file=sys.stderr)
    return 0
