"""What ``test_data_parallel`` runs once with one process and once under ``torchrun`` with two
gloo ranks: lm-eval's ``simple_evaluate`` with ``seer`` (generate_until: baseline, Seer, DyLLM,
threshold, sampled; loglikelihood: the multiple-choice task), lmms-eval's with ``seer_lavida``
(greedy and sampled) and ``seer run``, on the embedded model, an odd number of documents each.

Run: ``python -m tests.harness.data_parallel_driver OUT_DIR REQUESTS.jsonl [RESUMED.jsonl]`` (alone,
or under ``torchrun --standalone --nproc_per_node 2``). Rank 0 writes ``OUT_DIR/results.json``
(metrics, the per-sample answers in document order, the speed figures) and ``seer run`` writes
``OUT_DIR/answers.jsonl``; given RESUMED.jsonl (whose parts a killed run left), ``seer run`` also
finishes that one. Each rank uses one torch thread and a 60 s collective timeout.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED = ROOT / "model_adapters" / "embedded"
DOCS = 3  # odd: with two ranks, rank 1 decodes one document and lm-eval pads it with a copy
COMMON = f"pretrained={EMBEDDED},batch_size=4,dist_timeout=60"
#: sampling hot enough that some answers go wrong (the tasks' own keywords say do_sample=False)
SAMPLED = "do_sample=True,temperature=2.5"
#: generate_until configurations: name -> (extra model arguments, the harness's gen_kwargs)
TEXT_CONFIGS = {
    "baseline": ("", None),
    "seer": (f",seer={EMBEDDED / 'seer_config.json'}", None),
    "dyllm": (f",dyllm={EMBEDDED / 'dyllm_config.json'}", None),
    "threshold": (",threshold=0.9", None),
    "sampled": (",seed=7", SAMPLED),
}
IMAGE_CONFIGS = {"baseline": ("", None), "sampled": (",seed=7", SAMPLED)}


def samples_in_order(out: dict, task: str) -> list:
    return [s["filtered_resps"] for s in sorted(out["samples"][task], key=lambda s: s["doc_id"])]


def metrics(out: dict, task: str) -> dict:
    return {k: v for k, v in out["results"][task].items() if k != "alias"}


def run_lm_eval(results: dict) -> None:
    import lm_eval
    from lm_eval.tasks import TaskManager

    from seer_runtime.harness.lm_eval import SeerLM

    manager = TaskManager(include_path=str(ROOT / "bench" / "lm_eval_tasks"), include_defaults=False)
    for name, (extra, gen_kwargs) in TEXT_CONFIGS.items():
        lm = SeerLM.create_from_arg_string(COMMON + extra + ",mc_num=4,mc_batch_size=4,check_greedy=False")
        tasks = ["seer_embedded_text"] + (["seer_embedded_choice"] if name == "baseline" else [])
        out = lm_eval.simple_evaluate(model=lm, tasks=tasks, limit=DOCS, task_manager=manager,
                                      apply_chat_template=True, log_samples=True, gen_kwargs=gen_kwargs)
        speed = lm.speed
        if out is None:  # not rank 0
            continue
        results[f"lm-eval:{name}"] = {"metrics": metrics(out, "seer_embedded_text"),
                                      "answers": samples_in_order(out, "seer_embedded_text"),
                                      "speed": [speed.tokens, speed.nfe, speed.requests]}
        if name == "baseline":
            results["lm-eval:loglikelihood"] = {"metrics": metrics(out, "seer_embedded_choice"),
                                                "answers": samples_in_order(out, "seer_embedded_choice")}


def run_lmms_eval(results: dict) -> None:
    from lmms_eval.evaluator import simple_evaluate
    from lmms_eval.tasks import TaskManager

    from seer_runtime.harness.lmms_eval import SeerLavida

    manager = TaskManager(include_path=str(ROOT / "bench" / "lmms_eval_tasks"), include_defaults=False)
    for name, (extra, gen_kwargs) in IMAGE_CONFIGS.items():
        lm = SeerLavida.create_from_arg_string(COMMON + extra)
        out = simple_evaluate(model=lm, tasks=["seer_embedded_image"], limit=DOCS, log_samples=True,
                              task_manager=manager, gen_kwargs=gen_kwargs)
        speed = lm.speed
        if out is None:
            continue
        results[f"lmms-eval:{name}"] = {"metrics": metrics(out, "seer_embedded_image"),
                                        "answers": samples_in_order(out, "seer_embedded_image"),
                                        "speed": [speed.tokens, speed.nfe, speed.requests]}


def seer_run(requests: str, output: str) -> None:
    from seer_runtime.cli import main as seer_main

    code = seer_main(["run", "--model", str(EMBEDDED), "--input", requests, "--output", output, "--batch-size", "4",
                      "--dist-timeout", "60", "--no-progress"])
    if code:
        raise SystemExit(f"seer run exited with {code}")


def main(out_dir: str, requests: str, resumed: str | None = None) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    os.chdir(ROOT)  # the image task's JSONL path is relative to the repository root
    results: dict = {}
    t0 = time.perf_counter()
    run_lm_eval(results)
    t1 = time.perf_counter()
    run_lmms_eval(results)
    t2 = time.perf_counter()
    seer_run(requests, str(out / "answers.jsonl"))
    if resumed is not None:
        seer_run(requests, resumed)
    print(f"[driver] lm-eval {t1 - t0:.1f} s, lmms-eval {t2 - t1:.1f} s, seer run {time.perf_counter() - t2:.1f} s",
          file=sys.stderr)
    if int(os.environ.get("RANK", "0")) == 0:
        (out / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(*sys.argv[1:])
