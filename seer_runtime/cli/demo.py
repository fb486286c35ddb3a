"""``seer demo`` (what ``make demo`` runs): baseline vs Seer, DyLLM and threshold decoding on an
embedded model, batched.

``--workload`` picks the embedded model: ``demo`` (the default: the LaViDa-LLaDA DMLLM with
short answers in a 32-position window) or ``arith`` (a text-only LLaDA answering arithmetic word
problems with worked solutions of 20-120 tokens in a 128-position window decoded in blocks of
32). On its held-out requests, every batch is decoded by the
baseline, by Seer with each probe (the sparsity probe of the paper, the step-0 end
probability, and both combined), by DyLLM (its calibrated config), by confidence-threshold
parallel decoding (``GenerationConfig.threshold``, ``--threshold``) and by their compositions
(Seer + threshold, Seer + threshold + DyLLM), interleaved batch by batch so that all see the
same machine load (``--only`` picks some of them; the recommended probe always runs). One
table, the same figures as JSON with ``--json``, and a PNG of the step-0 sparsity profiles with
the detected boundary and the true end (``--plot``).

Figures (per configuration): ``tok_per_s`` (valid answer tokens per second of wall time),
``latency_s`` (mean request latency = its batch's wall time), ``nfe`` (forward passes per
batch, mean), ``positions_computed`` (positions x layers, summed), ``exact_match`` (the
workload's score: the whole answer equals the reference on ``demo``; the final ``answer N``
on ``arith``, as GSM8K is scored, which also reports ``steps_right``, the share of answers
whose every arithmetic step is right), ``answer_tokens`` (mean answer length); for every
configuration but the baseline: ``speedup`` (tok/s over the baseline's), ``ideal_speedup``
(baseline over its tokens computed, times DyLLM's FLOP fraction ``dyllm_flop_ratio`` where
DyLLM runs), ``differs_from_baseline`` (any answer difference); and for those with Seer:
``boundary_mae`` (|predicted end - baseline's end|), ``over_truncation_rate`` (the first cut
fell before the baseline's end token), and of those: ``recovered`` (answers equal to the
baseline's after the guard), ``completed_differently`` (a complete answer, its end token inside
its window, that differs from the baseline's: the model finished sooner in the shorter window)
and ``lost_answers`` (differs and has no end token inside its window: content cut off). JSON: the
Seer probes under ``probes``, the other configurations under ``methods``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import torch

from ..calibration.seer import plot_profiles, step0_profiles
from ..config import GenerationConfig
from ..evaluate import RunResult, boundary_mae, run_requests
from ..files import check_output_path, check_plot_path, write_json
from .options import EMBEDDED_WORKLOADS, model_services, path_text, positive_int, progress_of


def _figures(res: RunResult, base: RunResult | None, window: int, score) -> dict:
    """One configuration's figures (module docstring); ``score(answers) -> dict`` is the workload's
    (``exact_match``, ``answer_tokens`` and, on ``arith``, ``steps_right``)."""
    out = {
        "tok_per_s": res.tok_per_s,
        "latency_s": res.latency_s,
        "nfe": sum(res.nfe) / len(res.nfe),
        "positions_computed": res.positions_computed,
        **score(res.answers),
        "wall_s": res.wall_s,
    }
    if base is None:
        return out
    same = [a == b for a, b in zip(res.answers, base.answers)]
    # DyLLM computes a fraction of each forward's FLOPs (its MACs over the dense forward's)
    flop_ratio = 1.0
    if res.dyllm:
        dense = sum(d["dense_macs"] for d in res.dyllm)
        flop_ratio = sum(d["macs"] for d in res.dyllm) / dense if dense else 1.0
        out["dyllm_flop_ratio"] = flop_ratio
    out.update(speedup=res.tok_per_s / base.tok_per_s if base.tok_per_s else 0.0,
               ideal_speedup=base.positions_computed / max(1e-9, res.positions_computed * flop_ratio),
               differs_from_baseline=sum(not s for s in same))
    if not res.seer:
        return out
    true_end = [e if e >= 0 else window for e in base.end_positions]
    keep = res.seer["keep_len"]
    over = [k < min(t + 1, window) for k, t in zip(keep, true_end)]
    # an answer is complete when its end token lies inside the window it was finally decoded in
    final = res.seer.get("final_window", [window] * len(keep))
    ended = [0 <= e < f for e, f in zip(res.end_positions, final)]
    out.update(
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
    return out


def run_demo(model, requests, gen, configs: dict, *, batch_size: int, progress: bool = True,
             on_batch=None) -> dict:
    """Decode ``requests`` with the baseline (``gen``) and every configuration, interleaved per
    batch. ``configs``: name -> ``(GenerationConfig, generate's keyword arguments)``;
    ``on_batch(n)``: called when the ``n`` requests of a batch are decoded by every configuration."""
    from tqdm.auto import tqdm

    plans = {"baseline": (gen, {}), **configs}
    names = list(plans)
    results = {name: RunResult() for name in names}
    # the bar is closed before an interrupt reaches the command line (its one line comes last)
    with tqdm(total=len(requests) * len(names), desc="demo", unit="req", disable=not progress,
              file=sys.stderr) as bar:
        for start in range(0, len(requests), batch_size):
            batch = requests[start: start + batch_size]
            for name in names:
                gen_of, kwargs = plans[name]
                part = run_requests(model, batch, gen_of, batch_size=batch_size, progress=bar, **kwargs)
                results[name].extend(part)
            if on_batch is not None:
                on_batch(len(batch))
    return results


def format_table(figures: dict) -> str:
    cols = [("tok/s", "tok_per_s", "{:.1f}"), ("latency s", "latency_s", "{:.3f}"), ("NFE", "nfe", "{:.1f}"),
            ("tokens", "positions_computed", "{:,}"), ("EM", "exact_match", "{:.3f}"),
            ("steps ok", "steps_right", "{:.3f}"),
            ("answer len", "answer_tokens", "{:.1f}"), ("speed-up", "speedup", "x{:.2f}"),
            ("ideal", "ideal_speedup", "x{:.2f}"), ("MAE", "boundary_mae", "{:.2f}"),
            ("over-trunc", "over_truncation_rate", "{:.3f}"), ("recovered", "recovered", "{}"),
            ("ended sooner", "completed_differently", "{}"), ("lost", "lost_answers", "{}"),
            ("!= base", "differs_from_baseline", "{}")]
    head = "| config | " + " | ".join(c[0] for c in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 1)]
    for name, f in figures.items():
        cells = [fmt.format(f[key]) if key in f else "" for _, key, fmt in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_parsers(sub) -> None:
    p = sub.add_parser("demo", help="baseline vs Seer, DyLLM and threshold decoding on an embedded model "
                                    "(what `make demo` runs)")
    p.add_argument("--workload", default="demo", choices=EMBEDDED_WORKLOADS,
                   help="the embedded model: demo (short answers, the default) or arith (word problems with long, "
                        "uncertain worked solutions)")
    p.add_argument("--requests", type=positive_int, default=None,
                   help="held-out requests (default: the workload's)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="requests per batch (default: the workload's)")
    p.add_argument("--json", default=None, type=path_text, help="write the figures as JSON to this path")
    p.add_argument("--plot", default=None, type=path_text, help="write the step-0 sparsity plot (PNG) to this path")
    p.add_argument("--model", default=None, type=path_text,
                   help="a model directory the trainer wrote for this workload")
    p.add_argument("--only", nargs="+", default=None, metavar="CONFIG",
                   help="decode only these configurations beside the baseline (names as in the table, e.g. "
                        "seer:eos_prob dyllm); the recommended Seer probe is always decoded")
    p.add_argument("--threshold", type=float, default=0.9,
                   help="the confidence threshold of the parallel-decoding rows (default 0.9, Fast-dLLM's)")
    p.set_defaults(func=main)


#: where the step-0 sparsity figure goes without --plot
DEFAULT_PLOT = "out/seer_demo_sparsity.png"


def _check_outputs(args, progress) -> str | None:
    """--json and --plot checked before the model loads (parents created, or refused by name);
    returns the plot path to write (the default one only when matplotlib is installed), or None."""
    if args.json:
        args.json = check_output_path(args.json, option="--json")
        progress.outputs.append(str(args.json))
    if args.plot:
        plot = check_plot_path(args.plot, option="--plot")
    else:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("matplotlib is not installed: no plot (pip install -e '.[plot]')", file=sys.stderr)
            return None
        plot = check_plot_path(DEFAULT_PLOT, option="the default plot path")
    progress.outputs.append(str(plot))
    return str(plot)



def main(args) -> int:
    GenerationConfig(threshold=args.threshold)  # --threshold checked before the model loads
    progress = progress_of(args)
    svc = model_services()
    emb = svc.embedded(args.workload)
    default = emb.default_seer_config()
    gen = emb.demo_generation_config()
    dyllm = emb.default_dyllm_config()
    fast = gen.replace(threshold=args.threshold, steps=None)
    configs = {
        **{f"seer:{probe}": (gen, {"seer": replace(default, probe=probe)})
           for probe in ("sparsity", "eos_prob", "both")},
        "dyllm": (gen, {"dyllm": dyllm}),
        f"threshold:{args.threshold:g}": (fast, {}),
        "seer+threshold": (fast, {"seer": default}),
        "seer+threshold+dyllm": (fast, {"seer": default, "dyllm": dyllm}),
    }
    recommended = f"seer:{default.probe}"
    if args.only is not None:  # before the model loads
        unknown = sorted(set(args.only) - set(configs))
        if unknown:
            raise ValueError(f"--only: unknown configuration(s) {unknown}; choose among {sorted(configs)}")
    plot = _check_outputs(args, progress)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.perf_counter()
    progress.stage = "loading the model"
    model, tokenizer = emb.load_embedded(path=args.model) if args.model else emb.load_embedded()
    n = args.requests or emb.DEMO_REQUESTS
    bs = args.batch_size or emb.DEMO_BATCH
    requests, _tasks = emb.demo_requests(n, tokenizer)
    if args.only is not None:
        configs = {name: plan for name, plan in configs.items() if name in args.only or name == recommended}
    params = sum(p.numel() for p in model.parameters())
    print(f"embedded {args.workload} model: {emb.DESCRIPTION} ({params:,} parameters), {n} held-out requests, "
          f"batch {bs}, window {gen.gen_length}, {torch.get_num_threads()} threads", file=sys.stderr)
    progress.start(len(requests))
    results = run_demo(model, requests, gen, configs, batch_size=bs, on_batch=progress.advance)
    base = results["baseline"]

    def score(answers):
        return emb.answer_figures(requests, answers, tokenizer)

    figures = {name: _figures(res, None if name == "baseline" else base, gen.gen_length, score)
               for name, res in results.items()}
    print(format_table(figures))
    rec = figures[recommended]
    print(f"\nrecommended: {recommended} ({default}); speed-up x{rec['speedup']:.2f} measured vs "
          f"x{rec['ideal_speedup']:.2f} ideal (tokens computed); exact match {rec['exact_match']:.3f} vs baseline "
          f"{figures['baseline']['exact_match']:.3f}")
    payload = {
        "workload": args.workload,
        "requests": n,
        "batch_size": bs,
        "window": gen.gen_length,
        "block_length": gen.block_length,
        "baseline": figures["baseline"],
        "seer": {**rec, "config": recommended},
        "speedup": rec["speedup"],
        "ideal_speedup": rec["ideal_speedup"],
        "boundary_mae": rec["boundary_mae"],
        "over_truncation_rate": rec["over_truncation_rate"],
        "recovered": rec["recovered"],
        "completed_differently": rec["completed_differently"],
        "lost_answers": rec["lost_answers"],
        "probes": {name.split(":", 1)[1]: f for name, f in figures.items() if name.startswith("seer:")},
        "methods": {name: f for name, f in figures.items() if name != "baseline" and not name.startswith("seer:")},
        "threshold": args.threshold,
        "seconds": time.perf_counter() - t0,
    }
    if args.json:  # the figures first: the plot below decodes again and must not cost them
        write_json(args.json, payload)
        progress.wrote(args.json)
        print(f"figures: {args.json}")
    if plot is not None:
        prof = step0_profiles(model, requests[:16], gen, layers=list(range(1, min(model.num_layers, 7))))
        true_end = [e if e >= 0 else gen.gen_length for e in base.end_positions[:16]]
        plot_profiles(prof, true_end, replace(default, probe="sparsity"), plot, window=gen.gen_length)
        progress.wrote(plot)
        print(f"step-0 sparsity profiles: {plot}")
    return 0
