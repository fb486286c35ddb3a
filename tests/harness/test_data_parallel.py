"""Data-parallel evaluation and batch inference (issue 35): two gloo ranks under ``torchrun`` give
what one process gives, answer for answer, on the embedded model.

One run of ``tests/harness/data_parallel_driver.py`` in this process (one rank) and one under
``torchrun --standalone --nproc_per_node 2`` (one torch thread and a 60 s collective timeout per
rank, so a hang fails): lm-eval (generate_until with the baseline, Seer, DyLLM, threshold and
sampled decoding; the Monte-Carlo log-likelihood), lmms-eval (greedy and sampled) and ``seer run``,
3 documents each (odd: lm-eval pads rank 1). Before them, ``seer run`` is killed (SIGKILL) after
its first answers, a torn line is appended to its part file, and the two-rank launch finishes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.harness import data_parallel_driver as driver

pytestmark = [pytest.mark.cli]

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED = ROOT / "model_adapters" / "embedded"


def write_requests(folder: Path) -> Path:
    """Five requests for ``seer run``: text, a sampled one (its own options), an image, ids."""
    from model_adapters.embedded.tasks import make_requests

    heldout = make_requests(192, "heldout")
    heldout[1].image.convert("RGB").save(folder / "shapes.png")
    lines = [{"prompt": heldout[0].question, "id": "first"},
             {"prompt": heldout[3].question},
             {"prompt": heldout[4].question, "options": {"temperature": 2.5}, "id": 3},
             {"prompt": heldout[1].question, "image": "shapes.png"},
             {"prompt": heldout[11].question, "options": {"gen_length": 16}}]
    path = folder / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def subprocess_env(folder: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_CACHE": str(folder / "datasets"),
           "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)  # CPU tensors run the kernels' torch references, as in this process
    return env


def kill_after_first_answers(requests: Path, output: Path, env: dict) -> int:
    """Start ``seer run`` (one request per batch), SIGKILL it once its part file holds two answers,
    and tear its last line as a kill during a write would; returns the answers it kept."""
    part = output.with_name(output.name + ".parts") / "rank-00000-of-00001.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "seer_runtime.cli", "run", "--model", str(EMBEDDED), "--input",
                             str(requests), "--output", str(output), "--batch-size", "1", "--no-progress"],
                            env=env, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if part.exists() and part.read_bytes().count(b"\n") >= 3:  # the header and two answers
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    kept = part.read_bytes().count(b"\n") - 1
    with open(part, "ab") as f:
        f.write(b'{"line": 5, "input": "a torn wri')
    return kept


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from seer_kernels import kernel_backend

    folder = tmp_path_factory.mktemp("data_parallel")
    requests = write_requests(folder)
    env = subprocess_env(folder)
    resumed = folder / "resumed.jsonl"
    one, two = folder / "one", folder / "two"
    one.mkdir()
    two.mkdir()
    with ThreadPoolExecutor(1) as pool:  # the run to kill beside the one-process run: one core each
        killed = pool.submit(kill_after_first_answers, requests, resumed, env)
        with pytest.MonkeyPatch.context() as mp, kernel_backend("reference"):
            mp.setenv("HF_DATASETS_CACHE", str(folder / "datasets"))
            mp.chdir(ROOT)
            driver.main(str(one), str(requests))
        kept = killed.result()
    launch = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "-m", "tests.harness.data_parallel_driver", str(two), str(requests), str(resumed)],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert launch.returncode == 0, launch.stderr[-4000:]
    return {"one": one, "two": two, "resumed": resumed, "kept": kept, "log": launch.stderr,
            "results": [json.loads((d / "results.json").read_text()) for d in (one, two)]}


def compare(runs, prefix: str) -> list[str]:
    one, two = runs["results"]
    names = sorted(k for k in one if k.startswith(prefix))
    assert names and names == sorted(k for k in two if k.startswith(prefix))
    for name in names:
        assert two[name]["answers"] == one[name]["answers"], name  # per sample, in document order
        assert two[name]["metrics"] == one[name]["metrics"], name
        if "speed" in one[name]:  # answer tokens and requests summed over ranks, lm-eval's padding not counted
            tokens, _, requests = one[name]["speed"]
            assert two[name]["speed"][0] == tokens and two[name]["speed"][2] == requests == driver.DOCS, name
    return names


def test_lm_eval_two_ranks_give_one_process_answers_and_metrics(runs):
    names = compare(runs, "lm-eval:")
    assert set(names) == {f"lm-eval:{n}" for n in driver.TEXT_CONFIGS} | {"lm-eval:loglikelihood"}
    one = runs["results"][0]
    assert one["lm-eval:sampled"]["answers"] != one["lm-eval:baseline"]["answers"]  # the draws are used
    assert len(one["lm-eval:loglikelihood"]["answers"]) == driver.DOCS
    # the speed lines: once per generate_until call (rank 0), the ranks' figures together
    calls = len(driver.TEXT_CONFIGS) + len(driver.IMAGE_CONFIGS)
    assert runs["log"].count("[seer] Total NFE is") == calls
    assert runs["log"].count("(2 ranks: counts summed, the slowest rank's time)") == calls


def test_lmms_eval_two_ranks_give_one_process_answers_and_metrics(runs):
    compare(runs, "lmms-eval:")
    one = runs["results"][0]
    assert one["lmms-eval:sampled"]["answers"] != one["lmms-eval:baseline"]["answers"]


def test_seer_run_two_ranks_write_the_same_bytes(runs):
    expected = (runs["one"] / "answers.jsonl").read_bytes()
    assert (runs["two"] / "answers.jsonl").read_bytes() == expected
    records = [json.loads(line) for line in expected.decode().splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3, 4, 5]  # every input line once, in order
    assert records[0]["id"] == "first" and records[2]["id"] == 3 and "id" not in records[1]
    assert all(r["complete"] for r in records) and records[3]["answer"] == "red"
    assert not (runs["two"] / "answers.jsonl.parts").exists()


def test_seer_run_killed_and_resumed_writes_the_same_bytes(runs):
    assert 1 <= runs["kept"] < 5  # killed mid-way
    assert runs["resumed"].read_bytes() == (runs["one"] / "answers.jsonl").read_bytes()
    assert f"{runs['kept']} answered in earlier parts" in runs["log"]
