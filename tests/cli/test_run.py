"""``seer run`` in one process (issue 35; two ranks: tests/harness/test_data_parallel.py): bad input
named before the model loads, answers and their statistics, resumption from the part files
(an interrupted run, a torn last line, other settings, a changed input), the merge's exactly-once
check, the output path's checks, per-request seeds, and the ranks read from the launcher."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from seer_runtime.batch_inference import (
    BatchDecoder,
    Ranks,
    RunRequest,
    init_data_parallel,
    merge_parts,
    parts_folder,
    read_run_requests,
    request_seed,
)
from seer_runtime.cli import main
from seer_runtime.harness.common import repeat_indices
from tests.cli.test_cli import write_checkpoint

pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("reference_kernels")]

GEN = ["--gen-length", "8", "--steps", "8", "--block-length", "4"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llada")
    write_checkpoint(path)
    return path


def write_lines(path, lines) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


REQUESTS = [{"prompt": "w1 w2 w3", "id": "a"}, {"prompt": "w4"}, {"prompt": "w5 w6", "options": {"temperature": 1.5}},
            {"prompt": "w7 w8 w9 w10"}, {"prompt": "w11", "id": 5}]


def run(checkpoint, inp, out, *extra) -> int:
    return main(["run", "--model", str(checkpoint), "--input", str(inp), "--output", str(out), "--batch-size", "2",
                 "--no-progress", *GEN, *extra])


@pytest.mark.parametrize("line,message", [  # the request-file schema (seer_runtime.request_files.RUN_REQUEST)
    ("not json", r"in\.jsonl:2 is not valid JSON"),
    ('{"question": "w1"}', r"in\.jsonl:2: key 'question' is not accepted here: 'question' is 'prompt'"),
    ('{"prompt": "w1", "answr": 1}', r"in\.jsonl:2: unknown key 'answr'"),
    ('{"prompt": ""}', r"in\.jsonl:2: 'prompt' must not be empty"),
    ('{"prompt": "w1", "options": [1]}', r"in\.jsonl:2: 'options' must be an object"),
    ('{"prompt": "w1", "image": "absent.png"}', r"in\.jsonl:2: 'image' names 'absent\.png', which does not exist"),
    ("[1, 2]", r"in\.jsonl:2: a line must be a JSON object .*, got list"),
])
def test_a_bad_line_is_named_before_the_model_is_loaded(tmp_path, capsys, line, message):
    import re

    inp = write_lines(tmp_path / "in.jsonl", ['{"prompt": "w1"}', line, '{"prompt": "w2"}'])
    rc = main(["run", "--model", str(tmp_path / "no-such-model"), "--input", inp, "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(message, err), err


def test_bad_options_and_images_are_named_before_decoding(tmp_path, checkpoint, capsys, monkeypatch):
    import seer_runtime.batch_inference as bi

    monkeypatch.setattr(bi, "generate", lambda *a, **k: pytest.fail("decoded before every line was checked"))
    (tmp_path / "p.png").write_bytes(b"")
    cases = [({"prompt": "w1", "options": {"gen_lenght": 8}}, "unknown GenerationConfig fields ['gen_lenght']"),
             ({"prompt": "w1", "options": {"rng": "global"}}, "rng='global' is not supported"),
             ({"prompt": "w1", "image": "p.png"}, "an image was given, but LLaDA"),
             ({"prompt": " ".join(["w1"] * 5000)}, "more than the model's max_sequence_length")]
    for item, message in cases:
        inp = write_lines(tmp_path / "in.jsonl", [{"prompt": "w1"}, item])
        assert run(checkpoint, inp, tmp_path / "out.jsonl") == 2
        err = capsys.readouterr().err
        assert f"{inp}:2" in err and message in err, err
    gen_json = tmp_path / "gen.json"
    gen_json.write_text(json.dumps({"rng": "global"}))
    inp = write_lines(tmp_path / "in.jsonl", [{"prompt": "w1"}])
    assert run(checkpoint, inp, tmp_path / "out.jsonl", "--gen-json", str(gen_json)) == 2
    assert "rng='global' is not supported" in capsys.readouterr().err


def test_answers_come_in_input_order_with_their_statistics(tmp_path, checkpoint, capsys):
    inp = write_lines(tmp_path / "in.jsonl", REQUESTS)
    out = tmp_path / "out.jsonl"
    assert run(checkpoint, inp, out) == 0
    assert "wrote" in capsys.readouterr().err and not parts_folder(out).exists()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3, 4, 5]
    assert records[0]["id"] == "a" and records[4]["id"] == 5 and "id" not in records[1]
    assert [list(r) for r in records[1:2]] == [["line", "answer", "answer_tokens", "complete", "steps",
                                                 "positions_computed", "seed"]]
    assert all(r["steps"] == 8 and r["positions_computed"] > 0 for r in records)
    assert records[1]["seed"] == request_seed(None, "w4")
    # alone, a request gets the same bytes (its own seed, its own statistics)
    for i in (2, 3):
        write_lines(tmp_path / "one.jsonl", [REQUESTS[i]])
        assert run(checkpoint, tmp_path / "one.jsonl", tmp_path / "one.out", "--overwrite") == 0
        alone = json.loads((tmp_path / "one.out").read_text())
        assert {**alone, "line": i + 1} == records[i]
    # the output exists: refused without --overwrite
    assert run(checkpoint, inp, out) == 2 and "exists: pass --overwrite" in capsys.readouterr().err
    assert run(checkpoint, inp, inp) == 2 and "is the input file" in capsys.readouterr().err
    under_a_file = tmp_path / "one.out" / "o.jsonl"  # a folder cannot be made there (seer_runtime.files)
    assert run(checkpoint, inp, under_a_file) == 2 and f"--output {under_a_file}" in capsys.readouterr().err


def test_an_interrupted_run_resumes_to_the_same_bytes(tmp_path, checkpoint, capsys, monkeypatch):
    import seer_runtime.batch_inference as bi

    inp = write_lines(tmp_path / "in.jsonl", REQUESTS)
    assert run(checkpoint, inp, tmp_path / "whole.jsonl") == 0
    out = tmp_path / "out.jsonl"
    real, calls = bi.BatchDecoder.decode_batch, []

    def dies_on_the_second_batch(self, batch):
        calls.append(len(batch))
        if len(calls) == 2:
            raise KeyboardInterrupt  # as a kill would, after the first batch was written
        return real(self, batch)

    monkeypatch.setattr(bi.BatchDecoder, "decode_batch", dies_on_the_second_batch)
    capsys.readouterr()
    assert run(checkpoint, inp, out) == 130  # Ctrl-C: one line, what was done and where it is
    err = capsys.readouterr().err
    assert "interrupted after 2 of 5 requests; wrote" in err and "rank-00000-of-00001.jsonl" in err, err
    monkeypatch.undo()
    part = parts_folder(out) / "rank-00000-of-00001.jsonl"
    assert part.read_text().count("\n") == 1 + 2 and not out.exists()  # the header, the first batch's answers
    part.open("a").write('{"line": 4, "inp')  # a write cut short
    capsys.readouterr()
    # other settings or another input: refused, naming the part file
    assert run(checkpoint, inp, out, "--gen-length", "4", "--steps", "4") == 2
    err = capsys.readouterr().err
    assert str(part) in err and "generation differ" in err
    changed = write_lines(tmp_path / "changed.jsonl", [{"prompt": "w9"}, *REQUESTS[1:]])
    parts_folder(tmp_path / "x.jsonl").mkdir()
    shutil.copy(part, parts_folder(tmp_path / "x.jsonl") / part.name)  # these parts, another input
    assert run(checkpoint, changed, tmp_path / "x.jsonl") == 2
    assert "input line 1 changed since this answer was written" in capsys.readouterr().err
    # resumed: the rest decoded, the torn line dropped, the same bytes as the uninterrupted run
    assert run(checkpoint, inp, out) == 0
    assert "2 answered in earlier parts" in capsys.readouterr().err
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


def test_the_merge_writes_every_line_once(tmp_path, checkpoint):
    requests = read_run_requests(write_lines(tmp_path / "in.jsonl", REQUESTS[:3]))
    out = tmp_path / "out.jsonl"
    folder = parts_folder(out)
    folder.mkdir()
    fingerprint = {"run": 1}

    def part(name, lines, answers):
        rows = [{"seer_run_part": 1, "run": fingerprint}]
        rows += [{"line": n, "input": requests[n - 1].digest, "record": {"line": n, "answer": a}}
                 for n, a in zip(lines, answers)]
        write_lines(folder / name, rows)

    part("rank-00000-of-00002.jsonl", [1, 3], ["x", "z"])
    part("rank-00001-of-00002.jsonl", [2], ["y"])
    part("rank-00000-of-00001.jsonl", [3], ["z"])  # a later run's copy of line 3: identical, written once
    assert merge_parts(out, requests, fingerprint) == 1
    assert [json.loads(s)["answer"] for s in out.read_text().splitlines()] == ["x", "y", "z"]
    assert not folder.exists()
    folder.mkdir()
    part("rank-00000-of-00002.jsonl", [1, 3], ["x", "z"])
    with pytest.raises(RuntimeError, match=r"no answer for input lines \[2\]"):
        merge_parts(out, requests, fingerprint)
    part("rank-00001-of-00002.jsonl", [2, 3], ["y", "other"])
    with pytest.raises(RuntimeError, match="input line 3 has different answers"):
        merge_parts(out, requests, fingerprint)
    assert (folder / "rank-00000-of-00002.jsonl").exists()  # nothing removed after a failed merge


def test_request_seeds_are_stable_and_follow_the_content():
    assert request_seed(0, "count to ten") == request_seed(None, "count to ten") == 4489818635592179524
    seeds = {request_seed(0, "count to ten"), request_seed(1, "count to ten"), request_seed(0, "count to nine"),
             request_seed(0, "count to ten", images=["a.png"]), request_seed(0, "count to ten", sample=1),
             request_seed(0, [5, 6, 7])}
    assert len(seeds) == 6 and all(0 <= s < 2**62 for s in seeds)
    with pytest.raises(ValueError, match="sample must be an int >= 0"):
        request_seed(0, "x", sample=-1)


def test_lm_eval_repeats_and_padding_are_told_apart():
    class Req:
        def __init__(self, repeats):
            self.repeats = repeats

    a, b, c = Req(1), Req(2), Req(None)
    # a once, b twice (its samples 0 and 1), c once, then lm-eval's padding: one more copy of c
    samples, padding = repeat_indices([a, b, b, c, c], lambda r: r.repeats)
    assert samples == [0, 0, 1, 0, 0] and padding == {4: 3}
    samples, padding = repeat_indices([b, b, b, b], lambda r: r.repeats)  # b padded with its two samples
    assert samples == [0, 1, 0, 1] and padding == {2: 0, 3: 1}


@pytest.mark.parametrize("env,message", [
    ({"WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "WORLD_SIZE is 2 but RANK is not set"),
    ({"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"}, r"RANK must be in \[0, WORLD_SIZE=2\), got 2"),
    ({"WORLD_SIZE": "two", "RANK": "0", "LOCAL_RANK": "0"}, "WORLD_SIZE must be an int, got 'two'"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE must be >= 1"),
])
def test_ranks_come_from_the_launcher(env, message):
    with pytest.raises(ValueError, match=message):
        Ranks.from_environment(env)
    assert Ranks.from_environment({}) == Ranks(0, 1, 0)
    assert Ranks.from_environment({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}) == Ranks(3, 4, 1)
    assert Ranks.from_environment({"WORLD_SIZE": "1"}) == Ranks(0, 1, 0)


def test_devices_and_the_global_generator_are_checked(checkpoint):
    assert init_data_parallel("cpu", environ={}) == (Ranks(), torch.device("cpu"))
    with pytest.raises(ValueError, match="device must be cpu, cuda or cuda:N, got 'gpu'"):
        init_data_parallel("gpu", environ={})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available here: pass --device cpu"):
            init_data_parallel("cuda", environ={})
    from seer_runtime import GenerationConfig

    with pytest.raises(ValueError, match="rng='global': batch inference seeds every request from its content"):
        BatchDecoder(None, None, gen=GenerationConfig())
    decoder = BatchDecoder.load(str(checkpoint), generation={"gen_length": 8})
    assert decoder.gen.rng == "per_request" and decoder.fingerprint()["generation"]["gen_length"] == 8
    request = RunRequest(0, 1, "w1", options={"threshold": 0.5})
    (prepared,) = decoder.prepare([request])
    assert prepared.gen.threshold == 0.5 and prepared.gen.steps is None  # a threshold decides the steps


def test_the_ray_predictor_answers_a_batch_as_seer_run_does(tmp_path, checkpoint):
    """``SeerPredictor`` on a batch as Ray Data hands one over (numpy columns; Arrow's nulls in the
    options), without Ray: the records ``seer run`` writes for the same requests."""
    import numpy as np

    from seer_runtime.ray_data import SeerPredictor

    predictor = SeerPredictor(str(checkpoint), generation={"gen_length": 8, "steps": 8, "block_length": 4},
                              device="cpu", batch_size=2)
    batch = {"prompt": np.array([r["prompt"] for r in REQUESTS], dtype=object),
             "options": np.array([None, {"temperature": float("nan")}, {"temperature": 1.5}, "{}", None], dtype=object),
             "id": np.array(["a", "", "", "", "5"], dtype=object)}
    out = predictor(batch)
    assert out["id"] is batch["id"] and out["answer"].dtype == object and out["seed"].dtype == np.int64
    inp = write_lines(tmp_path / "in.jsonl", REQUESTS)
    assert run(checkpoint, inp, tmp_path / "out.jsonl") == 0
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    for r, record in enumerate(records):
        assert {k: out[k][r].item() if hasattr(out[k][r], "item") else out[k][r] for k in record
                if k not in ("line", "id")} == {k: v for k, v in record.items() if k not in ("line", "id")}
    assert predictor.speed.requests == 5
    with pytest.raises(ValueError, match="a batch needs a 'prompt' column"):
        predictor({"question": batch["prompt"]})
    with pytest.raises(ValueError, match=r"already has columns \['answer'\]"):
        predictor({**batch, "answer": batch["prompt"]})
    with pytest.raises(ValueError, match="batch row 1: options is not JSON"):
        predictor({"prompt": batch["prompt"][:2], "options": np.array([None, "{oops"], dtype=object)})
