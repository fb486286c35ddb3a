"""Early stop at the end token on the arith workload: forwards per request, work and wall time,
with and without ``GenerationConfig(early_stop=True)``, side by side in one process.

The embedded arith model (answers of 21-112 tokens in a 128-position window, blocks of 32, one
token per step) on held-out requests, with its shipped decoding. Per configuration - the
baseline, DyLLM (the shipped ``dyllm_config.json``), Seer (the shipped ``seer_config.json``),
threshold decoding 0.9 with the dual block cache - and batch size, the runs without and with
early stop alternate, ``--repeats`` times each (this machine is shared and noisy: the median is
reported). Printed per row:

* forwards per request: the denoising steps each request went through (``stats.steps``), mean;
  their ratio is the ideal speed-up for one request alone;
* positions computed (``stats.positions_computed``: positions x layers, the work the hardware
  pays for): their ratio is the ideal for a batch, whose forwards shrink as requests end;
* the measured wall-time ratio (median of the repeats) beside those ideals;
* final-answer accuracy of both runs and how many answers differ (early stop must change none).

Run: ``OMP_NUM_THREADS=2 python -m bench.bench_early_stop --requests 64 --json out/early_stop.json``
"""

from __future__ import annotations

import argparse
import statistics

import torch

from model_adapters.embedded.arith import serving
from seer_runtime.evaluate import run_requests
from seer_runtime.files import write_json


def configurations(gen) -> dict:
    return {
        "baseline": (gen, {}),
        "dyllm": (gen, {"dyllm": serving.default_dyllm_config()}),
        "seer": (gen, {"seer": serving.default_seer_config()}),
        "threshold 0.9 + dual cache": (gen.replace(threshold=0.9, steps=None, block_cache="dual"), {}),
    }


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
    rows = []
    for name, (g, kwargs) in configurations(gen).items():
        if args.only and name not in args.only:
            continue
        for batch_size, n in ((16, args.requests), (1, min(args.single_requests, args.requests))):
            runs = {False: [], True: []}
            for _ in range(args.repeats):
                for early in (False, True):  # alternated: the machine's drift hits both alike
                    runs[early].append(run_requests(model, requests[:n], g.replace(early_stop=early),
                                                    batch_size=batch_size, **kwargs))
            off, on = runs[False][0], runs[True][0]
            acc_off = serving.answer_figures(requests[:n], off.answers, tok)["exact_match"]
            acc_on = serving.answer_figures(requests[:n], on.answers, tok)["exact_match"]
            wall_off = statistics.median(r.wall_s for r in runs[False])
            wall_on = statistics.median(r.wall_s for r in runs[True])
            row = {"config": name, "batch": batch_size, "requests": n,
                   "forwards_per_request": [statistics.mean(off.steps), statistics.mean(on.steps)],
                   "ideal_forwards": statistics.mean(off.steps) / statistics.mean(on.steps),
                   "ideal_work": off.positions_computed / on.positions_computed,
                   "batch_forwards": [sum(off.nfe), sum(on.nfe)],
                   "wall_s": [wall_off, wall_on], "measured": wall_off / wall_on,
                   "wall_spread": [[round(r.wall_s, 2) for r in runs[e]] for e in (False, True)],
                   "accuracy": [acc_off, acc_on],
                   "answers_differ": sum(a != b for a, b in zip(off.answers, on.answers)),
                   "stopped_early": sum(s > 0 for s in on.steps_saved)}
            rows.append(row)
            print(f"{name:28s} batch {batch_size:2d} x{n}: forwards/request {row['forwards_per_request'][0]:.1f} -> "
                  f"{row['forwards_per_request'][1]:.1f} (ideal x{row['ideal_forwards']:.2f}; "
                  f"work x{row['ideal_work']:.2f}), wall {wall_off:.2f}s -> {wall_on:.2f}s "
                  f"measured x{row['measured']:.2f}; accuracy "
                  f"{acc_off:.3f} / {acc_on:.3f}, {row['answers_differ']} answers differ, "
                  f"{row['stopped_early']} stopped early", flush=True)
    result = {"threads": torch.get_num_threads(), "rows": rows}
    if args.json:
        write_json(args.json, result, indent=1)
    return result


if __name__ == "__main__":
    main()
