"""``seer demo`` (what ``make demo`` runs): the baseline against Seer, DyLLM, Fast-dLLM's threshold
decoding and block caches, and their compositions, on an embedded model; the fastest at equal
accuracy recommended.

``--workload`` picks the embedded model: ``demo`` (the default: the LaViDa-LLaDA DMLLM with
short answers in a 32-position window) or ``arith`` (a text-only LLaDA answering arithmetic word
problems with worked solutions of 20-120 tokens in a 128-position window decoded in blocks of
32). On its held-out requests every batch is decoded by the baseline and by every configuration
in turn, so that all see the same machine load (``calibration.compositions``):

* Seer with each probe (``seer:sparsity`` - the paper's -, ``seer:eos_prob``, ``seer:both``; the
  shipped configuration's other settings);
* the compositions (names: the parts joined by ``+``): ``seer`` (the shipped probe),
  ``threshold:T`` (confidence-threshold parallel decoding at each ``--thresholds``), ``prefix`` /
  ``dual`` (Fast-dLLM's block caches) and ``dyllm`` (the shipped DyLLM configuration; never with a
  block cache). By default the thresholds given and the dual cache; ``--search`` tries
  thresholds 0.7 0.8 0.9 0.95 and both caches.

``--early-stop`` decodes every configuration, the baseline too, with
``GenerationConfig(early_stop=True)`` (answers unchanged; on arith about x1.7 fewer forwards).
``--only`` decodes some of them (the shipped Seer probe always runs: its row feeds the plot).
Then the configurations that keep the baseline's accuracy are decoded ``--repeats`` - 1 more
times, alternating, to time them, and the fastest of those by median wall time is recommended.

Accuracy with its uncertainty: every row's ``exact_match`` (the whole answer equals the reference
on ``demo``; the final ``answer N`` on ``arith``, as GSM8K is scored) comes with its paired flips
against the baseline (``right_to_wrong``, ``wrong_to_right``), McNemar's exact two-sided
``p_value`` and a ``verdict`` in words ("within noise (p=0.62)"); ``keeps_accuracy`` is the rule
for "equal accuracy" (``calibration.accuracy``: at most one point below the baseline and no
significant loss).

Figures per configuration (JSON keys; the table shows a few of them): ``exact_match``,
``tok_per_s`` (valid answer tokens per second), ``latency_s`` (mean request latency = its batch's
wall time), ``nfe`` (forwards per batch, mean), ``positions_computed`` (positions x layers),
``wall_s`` (the first pass), ``wall_s_passes`` / ``wall_s_median`` / ``wall_spread`` /
``timing_noisy`` (the timed passes), ``answer_tokens`` and, on ``arith``, ``steps_right`` (every
arithmetic step right); besides the baseline's: the accuracy figures above,
``differs_from_baseline``, ``speedup`` (tok/s over the baseline's, same pass), ``ideal_speedup``
(positions computed, with DyLLM's ``dyllm_flop_ratio``), ``ideal_forwards``; and where Seer runs:
``boundary_mae`` (|predicted end - baseline's end|), ``exact_boundary``, ``over_truncation_rate``
/ ``over_truncated`` (the first cut fell before the baseline's end token), ``guard_events``,
``premature_cuts``, ``mean_keep_len`` and, of the over-truncated: ``recovered`` (equal to the
baseline's after the guard), ``completed_differently`` (its end token inside its window, an
answer the model finished sooner) and ``lost_answers`` (no end token inside its window).
JSON: every row under ``configurations`` (in table order), the Seer probes also under ``probes``
and the rest under ``methods``, what each row decoded under ``forms`` (its generation fields that
differ from the baseline's, its Seer and DyLLM configurations), the files those came from under
``config_files`` (``--model DIR``'s own where it holds them), and the ``recommended`` configuration
in its JSON form.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..calibration.accuracy import MAX_DROP
from ..calibration.compositions import BLOCK_CACHES, NOISY_SPREAD, Composition, against, measure, search_grid
from ..config import GenerationConfig
from ..dyllm import DyLLMConfig
from ..evaluate import RunResult, boundary_mae
from ..files import check_output_path, check_plot_path, write_json
from ..seer import SeerConfig
from .options import EMBEDDED_WORKLOADS, model_services, path_text, positive_int, progress_of

#: the probes of Seer's rows
PROBES = ("sparsity", "eos_prob", "both")
#: ``--search``'s thresholds and block caches
SEARCH_THRESHOLDS = (0.7, 0.8, 0.9, 0.95)


def _seer_figures(res: RunResult, base: RunResult, window: int) -> dict:
    """Where Seer cut and what it cost (module docstring), against the baseline's answers and ends."""
    same = [a == b for a, b in zip(res.answers, base.answers)]
    true_end = [e if e >= 0 else window for e in base.end_positions]
    keep = res.seer["keep_len"]
    over = [k < min(t + 1, window) for k, t in zip(keep, true_end)]
    # an answer is complete when its end token lies inside the window it was finally decoded in
    final = res.seer.get("final_window", [window] * len(keep))
    ended = [0 <= e < f for e, f in zip(res.end_positions, final)]
    return dict(
        boundary_mae=boundary_mae(res.seer["boundary"], true_end, window),
        exact_boundary=sum((b if b is not None else window) == t for b, t in zip(res.seer["boundary"], true_end))
        / len(true_end),
        over_truncation_rate=sum(over) / len(over),
        over_truncated=sum(over),
        guard_events=sum(res.seer["guard_events"]),
        premature_cuts=sum(res.seer["premature_cuts"]),
        recovered=sum(o and s for o, s in zip(over, same)),
        completed_differently=sum(o and not s and e for o, s, e in zip(over, same, ended)),
        lost_answers=sum(o and not s and not e for o, s, e in zip(over, same, ended)),
        mean_keep_len=sum(keep) / len(keep),
    )


def _cell(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


#: the table's columns: (JSON key, format)
COLUMNS = (("exact_match", "{:.3f}"), ("right_to_wrong", "{}"), ("wrong_to_right", "{}"), ("verdict", "{}"),
           ("speedup", "x{:.2f}"), ("ideal_speedup", "x{:.2f}"), ("nfe", "{:.1f}"))


def format_table(figures: dict[str, dict], *, recommended: str | None = None) -> str:
    """Configurations as rows, a few of their JSON figures as columns (named by their keys), aligned
    as plain text; a column no row has is left out; the recommended row is marked with ``*``."""
    cols = [(key, fmt) for key, fmt in COLUMNS if any(key in f for f in figures.values())]
    rows = [["config", *[key for key, _ in cols]]]
    for name, f in figures.items():
        rows.append([name + (" *" if name == recommended else ""), *[_cell(f.get(key), fmt) for key, fmt in cols]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _short(value):
    """JSON values for a person: floats to 4 significant digits (the files keep every digit)."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _short(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_short(v) for v in value]
    return value


def add_parsers(sub) -> None:
    p = sub.add_parser("demo", help="baseline vs Seer, DyLLM, threshold decoding, block caches and their "
                                    "compositions on an embedded model (what `make demo` runs)")
    p.add_argument("--workload", default="demo", choices=EMBEDDED_WORKLOADS,
                   help="the embedded model: demo (short answers, the default) or arith (word problems with long, "
                        "uncertain worked solutions)")
    p.add_argument("--requests", type=positive_int, default=None,
                   help="held-out requests (default: the workload's: 192 on demo, 64 on arith)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="requests per batch (default: the workload's, 16)")
    p.add_argument("--json", default=None, type=path_text, help="write the figures as JSON to this path")
    p.add_argument("--plot", default=None, type=path_text,
                   help="write a figure (PNG) to this path: the recommended Seer probe's step-0 signal with its cut "
                        "and the true end for four requests, and speed-up beside accuracy per configuration")
    p.add_argument("--model", default=None, type=path_text,
                   help="a model directory the trainer wrote for this workload; its own seer_config.json and "
                        "dyllm_config.json (as seer calibrate and calibrate-dyllm write them) are used when it "
                        "holds them, else the shipped ones (the run says which)")
    p.add_argument("--only", nargs="+", default=None, metavar="CONFIG",
                   help="decode only these configurations beside the baseline (names as in the table, e.g. "
                        "seer:eos_prob dyllm seer+threshold:0.9+dual); the shipped Seer probe is always decoded")
    p.add_argument("--threshold", "--thresholds", dest="thresholds", type=float, nargs="+", default=[0.9],
                   help="the confidence thresholds of the parallel-decoding rows (default 0.9, Fast-dLLM's)")
    p.add_argument("--search", action="store_true",
                   help=f"search wider: thresholds {' '.join(map(str, SEARCH_THRESHOLDS))} (and --thresholds), "
                        "the prefix and the dual block cache")
    p.add_argument("--early-stop", action="store_true",
                   help="every configuration (the baseline too) ends a request on the step that commits its end "
                        "token with every earlier position committed: answers unchanged, fewer forwards on long-"
                        "answer workloads (arith); default: every planned step runs")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="timed passes of the configurations that keep the baseline's accuracy (the first pass, "
                        "which every configuration runs, counts as one; default 3; 1: no extra pass)")
    p.set_defaults(func=main)


def _check_outputs(args, progress) -> str | None:
    """--json and --plot checked before the model loads (parents created, or refused by name); the plot
    path, or None: nothing is written that was not asked for."""
    if args.json:
        args.json = check_output_path(args.json, option="--json")
        progress.outputs.append(str(args.json))
    if not args.plot:
        return None
    plot = check_plot_path(args.plot, option="--plot")
    progress.outputs.append(str(plot))
    return str(plot)


def plans_of(gen: GenerationConfig, seer, dyllm, *, thresholds, search: bool) -> dict[str, Composition]:
    """Every configuration the demo can decode, in table order: Seer's probes, then the compositions
    (:func:`~seer_runtime.calibration.compositions.search_grid`; ``seer`` alone is the shipped probe's row)."""
    probes = {f"seer:{probe}": Composition(f"seer:{probe}", gen, replace(seer, probe=probe)) for probe in PROBES}
    thresholds = sorted(set(thresholds) | (set(SEARCH_THRESHOLDS) if search else set()))
    caches = BLOCK_CACHES if search else (None, "dual")
    grid = search_grid(gen, seer=seer, dyllm=dyllm, thresholds=thresholds, block_caches=caches)
    return {**probes, **{c.name: c for c in grid if c.name != "seer"}}


def main(args) -> int:
    for t in args.thresholds:  # checked before the model loads
        GenerationConfig(threshold=t)
    progress = progress_of(args)
    svc = model_services()
    emb = svc.embedded(args.workload)
    seer_file, dyllm_file = config_files(emb, args.model)
    shipped = SeerConfig.from_json(seer_file) if seer_file != emb.SEER_CONFIG_FILE else emb.default_seer_config()
    dyllm = DyLLMConfig.from_json(dyllm_file) if dyllm_file != emb.DYLLM_CONFIG_FILE else emb.default_dyllm_config()
    if args.model:
        print(f"configurations: Seer from {seer_file}, DyLLM from {dyllm_file}", file=sys.stderr)
    gen = emb.demo_generation_config()
    if args.early_stop:
        gen = gen.replace(early_stop=True)
    plans = plans_of(gen, shipped, dyllm, thresholds=args.thresholds, search=args.search)
    shipped_probe = f"seer:{shipped.probe}"
    if args.only is not None:  # before the model loads
        unknown = sorted(set(args.only) - set(plans))
        if unknown:
            raise ValueError(f"--only: unknown configuration(s) {unknown}; choose among {list(plans)} (thresholds "
                             f"from --thresholds; --search adds more)")
        plans = {name: plan for name, plan in plans.items() if name in args.only or name == shipped_probe}
    plot = _check_outputs(args, progress)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.perf_counter()
    progress.stage = "loading the model"
    model, tokenizer = emb.load_embedded(path=args.model) if args.model else emb.load_embedded()
    n = args.requests or emb.DEMO_REQUESTS
    bs = args.batch_size or emb.DEMO_BATCH
    requests, _tasks = emb.demo_requests(n, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    print(f"embedded {args.workload} model: {emb.DESCRIPTION} ({params:,} parameters), {n} held-out requests, "
          f"batch {bs}, window {gen.gen_length}{', early stop' if gen.early_stop else ''}, {len(plans)} "
          f"configurations beside the baseline, "
          f"{torch.get_num_threads()} threads", file=sys.stderr)
    progress.start(len(requests))

    def score(reqs, answers):
        return emb.answer_figures(reqs, answers, tokenizer)["exact_match"]

    results, figures, recommended = measure(model, requests, gen, plans, batch_size=bs, score=score,
                                            repeats=args.repeats, on_batch=progress.advance)
    base = results["baseline"]
    for name, res in results.items():  # the workload's own figures, and Seer's cut where it runs
        extra = emb.answer_figures(requests, res.answers, tokenizer)
        figures[name].update({k: v for k, v in extra.items() if k != "exact_match"})
        if res.seer:
            figures[name].update(_seer_figures(res, base, gen.gen_length))
    print(format_table(figures, recommended=recommended))
    print(f"\n* recommended: the fastest at equal accuracy (median wall time over its timed passes, among the "
          f"configurations at most {MAX_DROP * 100:g} point below the baseline's exact match with no significant loss "
          f"by McNemar's exact test, p > 0.05); n = {n}")
    recommendation = _recommendation(recommended, plans, figures, gen, seer_file=seer_file, dyllm_file=dyllm_file)
    _print_recommendation(recommendation, figures, shipped_probe)
    noisy = [name for name, f in figures.items() if f["timing_noisy"]]
    if noisy:
        print(f"note: timings are noisy - the passes of {', '.join(noisy)} spread more than "
              f"{NOISY_SPREAD:.0%} ((max - min) / median); a shared machine: rerun or raise --repeats")
    elif args.repeats == 1:
        print("note: one timed pass (--repeats 1): the timings' noise is not measured")
    payload = {
        "workload": args.workload,
        "requests": n,
        "batch_size": bs,
        "window": gen.gen_length,
        "block_length": gen.block_length,
        "early_stop": gen.early_stop,
        "thresholds": sorted(set(args.thresholds)),
        "repeats": args.repeats,
        "rule": "equal accuracy: exact match at most max_drop below the baseline's and no significant loss "
                "(McNemar exact, two-sided, p > 0.05, or more wrong->right than right->wrong); recommended: the "
                "smallest median wall time among those and the baseline",
        "max_drop": MAX_DROP,
        "baseline": figures["baseline"],
        "configurations": {name: f for name, f in figures.items() if name != "baseline"},
        "probes": {name.split(":", 1)[1]: f for name, f in figures.items() if name.startswith("seer:")},
        "methods": {name: f for name, f in figures.items() if name != "baseline" and not name.startswith("seer:")},
        "forms": {name: plan.describe(gen) for name, plan in plans.items()},  # what each row decoded
        "config_files": {"seer": str(seer_file), "dyllm": str(dyllm_file)},
        "recommended": recommendation,
        "seer": {**figures[shipped_probe], "config": shipped_probe},
        "speedup": figures[shipped_probe]["speedup"],
        "ideal_speedup": figures[shipped_probe]["ideal_speedup"],
        "boundary_mae": figures[shipped_probe]["boundary_mae"],
        "over_truncation_rate": figures[shipped_probe]["over_truncation_rate"],
        "recovered": figures[shipped_probe]["recovered"],
        "completed_differently": figures[shipped_probe]["completed_differently"],
        "lost_answers": figures[shipped_probe]["lost_answers"],
        "timing_noisy": bool(noisy),
        "seconds": time.perf_counter() - t0,
    }
    if args.json:  # the figures first: the plot below decodes step 0 again and must not cost them
        write_json(args.json, payload)
        progress.wrote(args.json)
        print(f"figures: {args.json}")
    if plot is not None:
        from ..calibration.plots import plot_demo

        plot_demo(model, requests, gen, plans[shipped_probe].seer, results[shipped_probe], base, figures, plot,
                  recommended=recommended)
        progress.wrote(plot)
        print(f"figure: {plot}")
    return 0


def config_files(emb, model_dir) -> tuple[Path, Path]:
    """The Seer and the DyLLM configuration files the demo decodes with: a ``--model`` directory's own
    ``seer_config.json`` and ``dyllm_config.json`` where it holds them, else the workload's shipped ones
    (``emb.SEER_CONFIG_FILE``, ``emb.DYLLM_CONFIG_FILE``)."""
    folder = Path(model_dir) if model_dir else None
    own = [folder / name if folder is not None and (folder / name).is_file() else None
           for name in ("seer_config.json", "dyllm_config.json")]
    return own[0] or emb.SEER_CONFIG_FILE, own[1] or emb.DYLLM_CONFIG_FILE


def _recommendation(name: str, plans: dict[str, Composition], figures: dict, gen: GenerationConfig, *,
                    seer_file, dyllm_file) -> dict:
    """The recommended configuration in its JSON form, how to run it, and how it compares with the other
    configurations that keep the baseline's accuracy (median wall times; ideal ratios beside)."""
    plan = plans[name] if name != "baseline" else Composition("baseline", gen)  # the baseline's options: its gen's
    out = {**plan.describe(gen), "options": plan.options(seer_file=str(seer_file), dyllm_file=str(dyllm_file))}
    out["figures"] = figures[name]
    out["against"] = [against(figures, name, other) for other, f in figures.items()
                      if other != name and (other == "baseline" or f.get("keeps_accuracy"))]
    return out


def _print_recommendation(rec: dict, figures: dict, shipped_probe: str) -> None:
    f = rec["figures"]
    print(f"recommended: {rec['name']}")
    form = {k: _short(rec[k]) for k in ("generation", "seer", "dyllm") if rec[k]}
    print(f"  as JSON: {json.dumps(form) if form else '{} (the baseline decoding)'}")
    if rec["options"]:
        print(f"  seer generate {rec['options']}")
    if rec["name"] != "baseline":
        print(f"  exact match {f['exact_match']:.3f} vs baseline {figures['baseline']['exact_match']:.3f} "
              f"({f['right_to_wrong']} right->wrong, {f['wrong_to_right']} wrong->right: {f['verdict']})")
    for a in rec["against"]:  # the baseline and Fast-dLLM alone (every row is in the JSON)
        if a["other"] != "baseline" and ("seer" in a["other"] or "dyllm" in a["other"]):
            continue
        noisy = " (noisy)" if a["noisy"] else ""
        print(f"  vs {a['other']}: x{a['measured']:.2f} measured (median of {a['passes'][0]} and {a['passes'][1]} "
              f"passes){noisy}, x{a['ideal']:.2f} ideal (positions computed), x{a['ideal_forwards']:.2f} forwards")
    s = figures[shipped_probe]
    print(f"{shipped_probe} (the shipped Seer probe): boundary MAE {s['boundary_mae']:.2f} positions, "
          f"{s['over_truncated']} over-truncated ({s['recovered']} recovered, {s['completed_differently']} completed "
          f"differently, {s['lost_answers']} lost)")
