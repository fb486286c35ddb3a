"""``seer calibrate`` and ``seer calibrate-dyllm``: read the requests, run the calibration, write
the chosen configuration as JSON (with the measurements beside it)."""

from __future__ import annotations

import argparse
import json
import sys

from ..calibration.dyllm import calibrate_dyllm, check_max_drop
from ..calibration.seer import calibrate
from ..config import check_real
from ..dyllm import DyLLMConfig
from ..files import check_output_path, check_plot_path
from .options import add_calibration_inputs, load_calibration_inputs, path_text, positive_int, progress_of


def add_parsers(sub) -> None:
    p = sub.add_parser("calibrate", help="choose Seer's probe layer, eps, tau_jump and gamma for a checkpoint")
    add_calibration_inputs(p)
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
                   help="thresholds of the eos_prob probe to simulate; the best is verified (default 0.5; a model "
                        "unsure of its answer length at step 0 needs higher ones, e.g. 0.5 0.9 0.99)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("calibrate-dyllm", help="choose DyLLM's tau and attention mode for a checkpoint")
    add_calibration_inputs(p)
    p.add_argument("--out", default="dyllm_config.json", type=path_text,
                   help="where to write the chosen DyLLMConfig (JSON accepted by `generate --dyllm`)")
    p.add_argument("--max-drop", type=float, default=0.01,
                   help="largest exact-match loss against the baseline a choice may have (0.01 = one point)")
    p.add_argument("--full-steps", type=positive_int, default=4, help="warm-up steps of every candidate")
    p.add_argument("--prompt-period", type=positive_int, default=4,
                   help="prompt fed every N-th step in every candidate")
    p.set_defaults(func=cmd_calibrate_dyllm)


def _outputs(args, progress) -> None:
    """--out (and --plot) checked before the model is loaded: parents created, or refused by name."""
    args.out = check_output_path(args.out, option="--out")
    progress.outputs.append(str(args.out))
    if getattr(args, "plot", None):
        args.plot = check_plot_path(args.plot, option="--plot")
        progress.outputs.append(str(args.plot))


def cmd_calibrate(args: argparse.Namespace) -> int:
    check_real("lam", args.lam, minimum=0)  # before the model is loaded
    progress = progress_of(args)
    _outputs(args, progress)
    model, requests, gen, score = load_calibration_inputs(args)
    progress.stage = f"calibrating on {len(requests)} requests"  # several passes: no single "N of M" to report
    out = calibrate(model, requests, gen, lam=args.lam, progress=True, plot=args.plot, rank_by=args.rank_by,
                    guard_mode=args.guard_mode, eos_thresholds=tuple(args.eos_thresholds), score=score)
    cfg = out.pop("config")
    plot_error = out.pop("plot_error", None)
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


def cmd_calibrate_dyllm(args: argparse.Namespace) -> int:
    check_max_drop(args.max_drop)  # before the model is loaded
    DyLLMConfig(full_steps=args.full_steps, prompt_period=args.prompt_period)
    progress = progress_of(args)
    _outputs(args, progress)
    model, requests, gen, score = load_calibration_inputs(args)
    progress.stage = f"calibrating on {len(requests)} requests"  # several passes: no single "N of M" to report
    out = calibrate_dyllm(model, requests, gen, max_drop=args.max_drop, full_steps=args.full_steps,
                          prompt_period=args.prompt_period, progress=True, score=score)
    cfg = out.pop("config")
    cfg.to_json(args.out, calibration=out)
    progress.wrote(args.out)
    print(f"wrote {args.out}: {json.dumps(cfg.to_dict())}")
    if not out["within_tolerance"]:
        print(f"seer calibrate-dyllm: no candidate kept the exact match within {args.max_drop} of the "
              f"baseline; {args.out} holds the most accurate one", file=sys.stderr)
        return 1
    return 0
