"""Data-parallel evaluation throughput: the embedded text task (lm-eval's ``seer_embedded_text``,
124 held-out questions, the model's own decoding defaults) with one rank of one torch thread
against two ranks of one thread each (``torchrun --standalone``, gloo), side by side, alternating.

    python bench/bench_data_parallel.py [--repeats 2] [--limit N] [--batch-size 16] [--model-args ,seer=FILE]
    python bench/bench_data_parallel.py --tool seer-run    # the same questions through `seer run`

Each launch is ``torchrun --standalone --nproc_per_node R`` of this file's worker (the same
launcher for 1 and 2 ranks). Printed per launch: its wall time from start to exit (processes,
imports, model load, evaluation: "finishing the task"), the evaluation's own time on rank 0
(``simple_evaluate``, or ``run_file`` for ``seer run``: rank 0 waits for the slowest rank at the
gather), the slowest rank's time inside ``generate``, NFE summed over ranks, answer tokens and
exact match; then the medians' ratios beside the ideal (2.0: each rank decodes half of the
batches) and whether the launches' answers are identical. The goal (issue 35): 2 ranks >= 1.7x
one rank. ``--tool seer-run`` needs no lm-eval (the task's questions are written to a JSONL file
of requests; exact match against the task's answers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "model_adapters" / "embedded"
TASK = "seer_embedded_text"


def worker(out: str, limit: int | None, batch_size: int, model_args: str) -> None:
    """One rank: lm-eval's simple_evaluate of the task; rank 0 writes its figures to ``out``."""
    import torch

    torch.set_num_threads(1)
    import lm_eval
    from lm_eval.tasks import TaskManager

    from seer_runtime.harness.lm_eval import SeerLM

    lm = SeerLM.create_from_arg_string(f"pretrained={EMBEDDED},batch_size={batch_size},show_speed=False{model_args}")
    manager = TaskManager(include_path=str(ROOT / "bench" / "lm_eval_tasks"), include_defaults=False)
    t0 = time.perf_counter()
    result = lm_eval.simple_evaluate(model=lm, tasks=[TASK], limit=limit, task_manager=manager,
                                     apply_chat_template=True, log_samples=True)
    evaluate_s = time.perf_counter() - t0
    if result is None:
        return
    samples = sorted(result["samples"][TASK], key=lambda s: s["doc_id"])
    Path(out).write_text(json.dumps({
        "evaluate_s": evaluate_s, "generate_s": lm.speed.wall_s, "nfe": lm.speed.nfe, "tokens": lm.speed.tokens,
        "requests": lm.speed.requests, "exact_match": result["results"][TASK]["exact_match,none"],
        "answers": [s["filtered_resps"][0] for s in samples]}))


def worker_seer_run(out: str, limit: int | None, batch_size: int) -> None:
    """One rank of ``seer run`` over the task's questions; rank 0 writes its figures to ``out``."""
    import torch

    torch.set_num_threads(1)
    from seer_runtime.batch_inference import BatchDecoder, init_data_parallel, run_file

    folder = Path(out).parent
    docs = [json.loads(line) for line in (ROOT / "bench" / "lm_eval_tasks" / f"{TASK}.jsonl").read_text().splitlines()]
    docs = docs[:limit] if limit else docs
    requests = folder / "requests.jsonl"
    ranks, device = init_data_parallel("cpu", timeout_s=600)
    if ranks.is_main:
        requests.write_text("".join(json.dumps({"prompt": d["question"], "id": d["id"]}) + "\n" for d in docs))
    from seer_runtime.batch_inference import all_gather_objects

    all_gather_objects(None, ranks)  # the requests file is written before any rank reads it
    decoder = BatchDecoder.load(str(EMBEDDED), device=device, batch_size=batch_size)
    t0 = time.perf_counter()
    summary = run_file(decoder, requests, folder / "answers.jsonl", ranks=ranks, progress=False)
    evaluate_s = time.perf_counter() - t0
    if not ranks.is_main:
        return
    answers = [json.loads(line)["answer"] for line in (folder / "answers.jsonl").read_text().splitlines()]
    Path(out).write_text(json.dumps({
        "evaluate_s": evaluate_s, "generate_s": summary.speed.wall_s, "nfe": summary.speed.nfe,
        "tokens": summary.speed.tokens, "requests": summary.speed.requests,
        "exact_match": sum(a == d["answer"] for a, d in zip(answers, docs)) / len(docs), "answers": answers}))


def launch(ranks: int, args) -> dict:
    """One ``torchrun`` launch of ``ranks`` worker processes; its figures and wall time."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
               __file__, "--worker", str(out), "--tool", args.tool, "--batch-size", str(args.batch_size),
               "--model-args", args.model_args]
        if args.limit:
            cmd += ["--limit", str(args.limit)]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode:
            raise SystemExit(f"{ranks}-rank launch failed:\n{done.stderr[-3000:]}")
        return {"ranks": ranks, "launch_s": wall, **json.loads(out.read_text())}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2, help="launches of each rank count, alternating (default 2)")
    p.add_argument("--limit", type=int, default=None, help="the task's first N questions (default: all 124)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--model-args", default="", help="more --model_args for seer, e.g. ',seer=FILE' (leading comma)")
    p.add_argument("--ranks", type=int, default=2, help="the data-parallel launch's ranks (default 2; ideal xRANKS)")
    p.add_argument("--tool", default="lm-eval", choices=["lm-eval", "seer-run"],
                   help="lm-eval's simple_evaluate (default), or `seer run` over the same questions")
    p.add_argument("--json", default=None, help="write every launch's figures here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tool == "seer-run" and args.model_args:
        p.error("--model-args goes with --tool lm-eval")
    if args.worker:
        if args.tool == "seer-run":
            worker_seer_run(args.worker, args.limit, args.batch_size)
        else:
            worker(args.worker, args.limit, args.batch_size, args.model_args)
        return
    load = os.getloadavg()
    print(f"[bench_data_parallel] {TASK}{f' (first {args.limit})' if args.limit else ''} through {args.tool}, "
          f"batch {args.batch_size}, "
          f"1 torch thread per rank, {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} "
          "at the start")
    print(f"{'repeat':>6} {'ranks':>5} {'launch s':>9} {'evaluate s':>10} {'generate s':>10} {'NFE':>5} "
          f"{'tokens':>6} {'exact':>6}")
    runs = []
    for repeat in range(args.repeats):
        for ranks in ((1, args.ranks) if repeat % 2 == 0 else (args.ranks, 1)):  # alternate which goes first
            r = launch(ranks, args)
            runs.append(r)
            print(f"{repeat:>6} {ranks:>5} {r['launch_s']:>9.1f} {r['evaluate_s']:>10.1f} {r['generate_s']:>10.1f} "
                  f"{r['nfe']:>5} {r['tokens']:>6} {r['exact_match']:>6.4f}", flush=True)
    one = [r for r in runs if r["ranks"] == 1]
    two = [r for r in runs if r["ranks"] == args.ranks]
    for key, what in (("launch_s", "launch to exit"), ("evaluate_s", "evaluation (rank 0)"),
                      ("generate_s", "generate, slowest rank")):
        m1, m2 = statistics.median(r[key] for r in one), statistics.median(r[key] for r in two)
        print(f"median {what}: 1 rank {m1:.1f} s, {args.ranks} ranks {m2:.1f} s: measured x{m1 / m2:.2f} "
              f"(ideal x{args.ranks:.2f})")
    same = all(r["answers"] == one[0]["answers"] for r in runs)
    print(f"answers identical across launches: {'yes' if same else 'NO'}; requests counted: "
          f"{sorted({r['requests'] for r in runs})}; load average at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "answers"} for r in runs],
                                              indent=1))


if __name__ == "__main__":
    main()
