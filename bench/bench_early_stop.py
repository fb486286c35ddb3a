"""Early stop at the end token on the arith workload: forwards per request, work and wall time,
with and without ``GenerationConfig(early_stop=True)``, side by side in one process.

The embedded arith model (answers of 21-112 tokens in a 128-position window, blocks of 32, one
token per step) on held-out requests, with its shipped decoding. Per configuration - the
baseline, DyLLM (the shipped ``dyllm_config.json``), Seer (the shipped ``seer_config.json``),
threshold decoding 0.9 with the dual block cache (Fast-dLLM's best batched decoding) and the
composition ``seer calibrate`` recommends for this model (Seer on top of it) - and batch size,
every configuration's runs without and with early stop alternate within each of ``--repeats``
repeats (this machine is shared and noisy: the median is reported). Printed per row:

* forwards per request: the denoising steps each request went through (``stats.steps``), mean;
  their ratio is the ideal speed-up for one request alone;
* positions computed (``stats.positions_computed``: positions x layers, the work the hardware
  pays for): their ratio is the ideal for a batch, whose forwards shrink as requests end;
* the measured wall-time ratio (median of the repeats) beside those ideals;
* final-answer accuracy of both runs and how many answers differ (early stop must change none).

Then, per batch size, the recommended composition with early stop against Fast-dLLM's threshold +
dual cache run every step, as its authors run it: the measured wall-time ratio beside the ideal
(positions computed), and the accuracy of both with the paired flips and McNemar's p.

Run: ``OMP_NUM_THREADS=2 python -m bench.bench_early_stop --requests 64 --json out/early_stop.json``
"""

from __future__ import annotations

import argparse
import statistics

import torch

from model_adapters.embedded.arith import serving
from seer_runtime.calibration.accuracy import paired_figures, right_answers
from seer_runtime.evaluate import run_requests
from seer_runtime.files import write_json

#: Fast-dLLM's best batched decoding, as its authors run it (every step of every block)
FAST_DLLM = "threshold 0.9 + dual cache"
#: the composition ``seer calibrate`` recommends for the arith model (seer_config.json's record)
RECOMMENDED = "seer + threshold 0.9 + dual cache"


def configurations(gen) -> dict:
    fast = gen.replace(threshold=0.9, steps=None, block_cache="dual")
    return {
        "baseline": (gen, {}),
        "dyllm": (gen, {"dyllm": serving.default_dyllm_config()}),
        "seer": (gen, {"seer": serving.default_seer_config()}),
        FAST_DLLM: (fast, {}),
        RECOMMENDED: (fast, {"seer": serving.default_seer_config()}),
    }


def exact_match(requests, answers, tok) -> float:
    """The arith workload's final-answer accuracy of ``answers`` (``serving.answer_figures``)."""
    return serving.answer_figures(requests, answers, tok)["exact_match"]


def row_of(name: str, batch_size: int, requests, runs: dict, tok) -> dict:
    """One configuration's figures without (``runs[False]``) and with (``runs[True]``) early stop."""
    off, on = runs[False][0], runs[True][0]
    acc_off, acc_on = exact_match(requests, off.answers, tok), exact_match(requests, on.answers, tok)
    wall_off = statistics.median(r.wall_s for r in runs[False])
    wall_on = statistics.median(r.wall_s for r in runs[True])
    return {"config": name, "batch": batch_size, "requests": len(requests),
            "forwards_per_request": [statistics.mean(off.steps), statistics.mean(on.steps)],
            "ideal_forwards": statistics.mean(off.steps) / statistics.mean(on.steps),
            "ideal_work": off.positions_computed / on.positions_computed,
            "batch_forwards": [sum(off.nfe), sum(on.nfe)],
            "wall_s": [wall_off, wall_on], "measured": wall_off / wall_on,
            "wall_spread": [[round(r.wall_s, 2) for r in runs[e]] for e in (False, True)],
            "accuracy": [acc_off, acc_on],
            "answers_differ": sum(a != b for a, b in zip(off.answers, on.answers)),
            "stopped_early": sum(s > 0 for s in on.steps_saved)}


def recommended_vs_fast_dllm(batch_size: int, requests, runs: dict, tok) -> dict:
    """The recommended composition with early stop against Fast-dLLM's threshold + dual cache run as
    its authors run it (every step): measured wall-time ratio (medians), the ideal (positions
    computed), and the recommended's answers against Fast-dLLM's (paired flips, McNemar's p)."""
    fast, rec = runs[(FAST_DLLM, False)], runs[(RECOMMENDED, True)]
    def score(reqs, answers):
        return exact_match(reqs, answers, tok)

    fast_right, rec_right = (right_answers(requests, r[0].answers, score) for r in (fast, rec))
    wall_fast = statistics.median(r.wall_s for r in fast)
    wall_rec = statistics.median(r.wall_s for r in rec)
    return {"batch": batch_size, "requests": len(requests), "wall_s": [wall_fast, wall_rec],
            "measured": wall_fast / wall_rec,
            "ideal_work": fast[0].positions_computed / rec[0].positions_computed,
            "accuracy": [sum(fast_right) / len(requests), sum(rec_right) / len(requests)],
            **paired_figures(fast_right, rec_right)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=64, help="held-out arith requests (batch 16)")
    p.add_argument("--single-requests", type=int, default=16, help="of those, decoded one at a time (batch 1)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", nargs="+", default=None, help="configuration names to run")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    model, tok = serving.load_embedded()
    gen = serving.demo_generation_config()
    requests, _ = serving.demo_requests(args.requests, tok)
    configs = configurations(gen)
    unknown = sorted(set(args.only or ()) - set(configs))
    if unknown:
        p.error(f"--only: unknown configuration(s) {unknown}; choose among {list(configs)}")
    names = [name for name in configs if not args.only or name in args.only]
    rows, comparisons = [], []
    for batch_size, n in ((16, args.requests), (1, min(args.single_requests, args.requests))):
        runs = {(name, early): [] for name in names for early in (False, True)}
        for _ in range(args.repeats):
            for name in names:  # every configuration, without and with early stop, alternated within a repeat
                g, kwargs = configs[name]
                for early in (False, True):
                    runs[(name, early)].append(run_requests(model, requests[:n], g.replace(early_stop=early),
                                                            batch_size=batch_size, **kwargs))
        for name in names:
            row = row_of(name, batch_size, requests[:n], {e: runs[(name, e)] for e in (False, True)}, tok)
            rows.append(row)
            print(f"{name:34s} batch {batch_size:2d} x{n}: forwards/request {row['forwards_per_request'][0]:.1f} -> "
                  f"{row['forwards_per_request'][1]:.1f} (ideal x{row['ideal_forwards']:.2f}; "
                  f"work x{row['ideal_work']:.2f}), wall {row['wall_s'][0]:.2f}s -> {row['wall_s'][1]:.2f}s "
                  f"measured x{row['measured']:.2f}; accuracy {row['accuracy'][0]:.3f} / {row['accuracy'][1]:.3f}, "
                  f"{row['answers_differ']} answers differ, {row['stopped_early']} stopped early", flush=True)
        if FAST_DLLM in names and RECOMMENDED in names:
            cmp = recommended_vs_fast_dllm(batch_size, requests[:n], runs, tok)
            comparisons.append(cmp)
            print(f"{RECOMMENDED} with early stop against {FAST_DLLM} (every step), batch {batch_size} x{n}: "
                  f"wall {cmp['wall_s'][0]:.2f}s -> {cmp['wall_s'][1]:.2f}s measured x{cmp['measured']:.2f} "
                  f"(ideal x{cmp['ideal_work']:.2f}, positions computed); accuracy {cmp['accuracy'][0]:.3f} -> "
                  f"{cmp['accuracy'][1]:.3f}, {cmp['right_to_wrong']} right->wrong, {cmp['wrong_to_right']} "
                  f"wrong->right ({cmp['verdict']})", flush=True)
    result = {"threads": torch.get_num_threads(), "rows": rows, "recommended_vs_fast_dllm": comparisons}
    if args.json:
        write_json(args.json, result, indent=1)
    return result


if __name__ == "__main__":
    main()
