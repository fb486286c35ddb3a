"""Issue 18: the ``arith`` workload. The word-problem generator is deterministic and its answers
are right and uncertain in wording; the step checker catches a wrong step; the shipped model
loads offline, meets its recorded held-out quality and decodes a few held-out requests live;
``seer demo --workload arith`` writes the demo's figures with DyLLM rows."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import torch

from model_adapters.embedded import EmbeddedTokenizer
from model_adapters.embedded.arith import ARITH_DIR, BLOCK_LENGTH, RESPONSE_WINDOW, build_arith_tokenizer, tasks
from model_adapters.embedded.arith.tasks import check_solution, make_problem, make_requests, score, write_solution

pytestmark = pytest.mark.models

N_DECODE = 6  # held-out requests decoded live (128 steps each)


@pytest.fixture(scope="module")
def shipped():
    from model_adapters.embedded.arith import load_arith

    return load_arith()


def test_generator_is_deterministic_and_every_reference_is_right():
    a, b = make_requests(40, "heldout"), make_requests(40, "heldout")
    assert [(r.question, r.answer) for r in a] == [(r.question, r.answer) for r in b]
    assert [r.question for r in make_requests(40, "train")] != [r.question for r in a]
    tok = EmbeddedTokenizer(build_arith_tokenizer())
    words = set(tasks.vocabulary_words())
    reqs = make_requests(400, "train", seed=7)
    for r in reqs:
        assert tasks.MIN_ANSWER_TOKENS <= r.answer_tokens <= tasks.MAX_ANSWER_TOKENS
        assert len(tok.encode(r.answer)) == r.answer_tokens and tok.unk_id not in tok.encode(r.question)
        assert set((r.question + " " + r.answer).split()) <= words
        got = check_solution(r.answer)
        assert got.steps_right and got.final == r.value and len(got.steps) == r.steps, (r.answer, got)
        assert tasks.MIN_STEPS <= r.steps <= tasks.MAX_STEPS and 0 <= r.value <= tasks.RANGES.max_value
        assert score(r, r.answer) and r.answer.split()[-2:] == ["answer", str(r.value)]
    assert {r.steps for r in reqs} == set(range(tasks.MIN_STEPS, tasks.MAX_STEPS + 1))
    # the response window holds every answer with its end of turn
    assert tasks.MAX_ANSWER_TOKENS + 1 <= RESPONSE_WINDOW and RESPONSE_WINDOW % BLOCK_LENGTH == 0
    with pytest.raises(ValueError, match="split"):
        make_requests(1, "test")
    with pytest.raises(ValueError, match="n must be"):
        make_requests(-1)


def test_one_problem_has_many_valid_wordings_of_varying_length():
    """Step order, optional sentences and synonyms: the same story, many right solutions."""
    rng = np.random.default_rng(5)
    story = make_problem(rng)
    while sum(c.is_group for c in story.changes) == 0 or len(story.changes) < 3:
        story = make_problem(rng)
    value = story.start + sum(c.sign * c.amount for c in story.changes)
    sols = [write_solution(rng, story) for _ in range(60)]
    assert all(check_solution(s).steps_right and check_solution(s).final == value for s in sols)
    assert len(set(sols)) > 40 and len({len(s.split()) for s in sols}) > 8
    # both step orders occur: a product computed before the first change is applied, and after it
    first_op = Counter(check_solution(s).steps[0][1] for s in sols)
    assert first_op["*"] > 0 and first_op["+"] + first_op["-"] > 0, first_op


def test_every_change_has_its_day_and_every_solution_names_the_days_in_order():
    """The story's changes happen on monday, tuesday, ... in order; a solution names each change's
    day before that change's arithmetic (the products computed first name theirs too)."""
    for r in make_requests(200, "train", seed=11):
        story_days = [w for w in r.question.split() if w in tasks.DAYS]
        assert story_days == tasks.DAYS[: len(r.changes)]
        words = r.answer.split()
        said = [w for w in words if w in tasks.DAYS]
        groups = [d for d, c in zip(tasks.DAYS, r.changes) if c.is_group]
        assert said in (story_days, groups + story_days), (r.question, r.answer)


def test_the_last_day_is_marked_in_the_story_and_the_solution_unless_asked_not_to():
    """With the end marker (every split, the last two training phases) the story's last change and
    the solution's last step read "at the end , on <day>", once each; without it (the first two
    phases) neither does and the stream is otherwise the workload's (same checker, same values)."""
    for r in make_requests(150, "train", seed=12):
        last = tasks.DAYS[len(r.changes) - 1]
        marker = tasks.LAST_DAY_TAG.format(day=last)
        assert r.question.count("at the end ,") == 1 and marker in r.question, r.question
        assert r.answer.count("at the end ,") == 1 and marker + " ," in r.answer, r.answer
    plain = tasks.RequestStream(3, end_marker=False).next_batch(150)
    assert not any("at the end ," in r.question or "at the end ," in r.answer for r in plain)
    assert all(check_solution(r.answer).final == r.value and check_solution(r.answer).steps_right for r in plain)


def test_semi_autoregressive_masking_leaves_what_block_decoding_leaves():
    from model_adapters.embedded.train import semi_autoregressive_mask

    masked = torch.rand(3, 128, generator=torch.Generator().manual_seed(0)) < 0.5
    got = semi_autoregressive_mask(masked, torch.tensor([0, 32, 96]), 32)
    for row, start in enumerate([0, 32, 96]):
        assert not got[row, :start].any()  # the blocks before: decoded
        assert torch.equal(got[row, start:start + 32], masked[row, start:start + 32])  # the current block
        assert got[row, start + 32:].all()  # the blocks after: all masks


def test_checker_reads_every_wording_and_catches_a_wrong_step():
    text = ("ann has 5 pens . 5 plus 3 is 8 . 8 + 2 = 10 . adding 4 to 10 gives 14 . 14 minus 1 equals 13 . "
            "13 - 3 = 10 . taking 2 from 10 leaves 8 . 2 times 3 is 6 . 2 x 4 = 8 . 3 groups of 5 make 15 . answer 8")
    got = check_solution(text)
    assert got.final == 8 and got.steps_right and len(got.steps) == 9
    assert got.steps[2] == (10, "+", 4, 14) and got.steps[5] == (10, "-", 2, 8)  # reversed wordings
    wrong = check_solution(text.replace("14 minus 1 equals 13", "14 minus 1 equals 12"))
    assert wrong.wrong_steps == ((14, "-", 1, 12),) and not wrong.steps_right and wrong.final == 8
    assert check_solution(text.replace("2 x 4 = 8", "2 x 4 = 9")).wrong_steps == ((2, "*", 4, 9),)
    assert check_solution("5 plus 3 is 8 .").final is None  # no closing "answer N"
    assert check_solution("answer 8 . 5 plus 3 is 8").final is None  # "answer N" must close the text
    assert not check_solution("answer 7").steps_right  # no step at all
    assert score(8, text) and not score(9, text)
    with pytest.raises(TypeError, match="text must be a str"):
        check_solution(None)


def test_drills_are_training_only_and_work_out_their_prompt():
    """An arithmetic drill's answer works out, in order, exactly the facts its prompt lists; a
    stream without drills draws what the training split draws; no held-out request is a drill."""
    rng = np.random.default_rng(3)
    words = set(tasks.vocabulary_words())
    for _ in range(50):
        d = tasks.make_drill(rng)
        listed = d.question.removeprefix("practice : ").removesuffix(" .").split(" , ")
        got = check_solution(d.answer)
        assert got.steps_right and len(got.steps) == len(listed) and 8 <= len(listed) <= 14
        op = {"+": "plus", "-": "minus", "*": "times"}
        assert [f"{a} {op[o]} {b}" for a, o, b, _ in got.steps] == listed
        assert set((d.question + " " + d.answer).split()) <= words and d.answer_tokens <= tasks.MAX_ANSWER_TOKENS
    plain = [r.question for r in tasks.RequestStream(5).next_batch(30)]
    assert plain == [r.question for r in make_requests(30, "train", seed=5)]
    mixed = tasks.RequestStream(5, drill=0.5).next_batch(60)
    assert 10 < sum(r.kind == "drill" for r in mixed) < 50
    assert not any(r.kind == "drill" for r in make_requests(300, "heldout"))
    with pytest.raises(ValueError, match="drill must be a probability"):
        tasks.RequestStream(0, drill=1.5)


def test_trainer_runs_the_text_workload_and_refuses_vision_options(tmp_path):
    from model_adapters.embedded.train import main

    tiny = ["--workload", "arith", "--d-model", "32", "--layers", "1", "--heads", "2", "--mlp", "32", "--batch-size",
            "2", "--eval-every", "2", "--eval-requests", "2", "--eval-decode", "1", "--final-eval-requests", "1",
            "--save-dtype", "float32", "--device", "cpu"]
    log = main([*tiny, "--steps", "2", "--window-cut", "0.5", "--drill", "0.5", "--out", str(tmp_path / "m")])
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert log["workload"] == "arith" and log["window"] == RESPONSE_WINDOW and cfg["model_type"] == "llada"
    assert "mm_vision_tower" not in cfg and cfg["response_window"] == RESPONSE_WINDOW
    gen = json.loads((tmp_path / "m" / "seer_generation_config.json").read_text())
    assert gen["gen_length"] == RESPONSE_WINDOW and gen["block_length"] == BLOCK_LENGTH
    for flag in (["--vision-steps", "2"], ["--image-focus", "0.1"], ["--freeze-projector"]):
        with pytest.raises(ValueError, match="text only"):
            main([*tiny, "--steps", "1", *flag, "--out", str(tmp_path / "x")])
    # the options of the shipped run's phases: semi-autoregressive masking, the stories before the marker
    log = main([*tiny, "--steps", "2", "--semi-ar", "1.0", "--no-end-marker", "--out", str(tmp_path / "p")])
    assert log["workload"] == "arith" and len(log["loss_curve"]) >= 1
    with pytest.raises(ValueError, match="--no-end-marker"):
        main(["--workload", "demo", "--steps", "1", "--no-end-marker", "--out", str(tmp_path / "d")])


def test_number_ranges_bound_every_quantity_and_the_wide_phase_draws_wider():
    """Problems and drills keep every number in their ranges: the workload's own (every split) and
    the wider ones of the trainer's first phase; --number-ranges is an arith option only."""
    from model_adapters.embedded.train import main

    def numbers(reqs):
        return [int(w) for r in reqs for w in (r.question + " " + r.answer).split() if w.isdigit()]

    shipped = tasks.RequestStream(1, drill=0.3).next_batch(300)
    wide = tasks.RequestStream(1, drill=0.3, ranges=tasks.WIDE_RANGES).next_batch(300)
    assert max(numbers(shipped)) <= tasks.RANGES.max_value < max(numbers(wide)) <= tasks.WIDE_RANGES.max_value
    assert max(numbers(make_requests(300, "heldout"))) <= tasks.RANGES.max_value
    with pytest.raises(ValueError, match="--number-ranges is an option of the arith workload"):
        main(["--steps", "1", "--number-ranges", "wide", "--d-model", "32", "--layers", "1", "--heads", "2",
              "--mlp", "32"])


def test_workload_option_and_unknown_workloads():
    from model_adapters import services
    from seer_runtime.cli import build_parser

    assert services.embedded("arith").WORKLOAD == "arith" and services.embedded().WORKLOAD == "demo"
    with pytest.raises(ValueError, match="workload must be one of"):
        services.embedded("gsm8k")
    parser = build_parser()
    assert parser.parse_args(["demo"]).workload == "demo"
    assert parser.parse_args(["demo", "--workload", "arith"]).workload == "arith"
    assert parser.parse_args(["calibrate", "--workload", "arith"]).workload == "arith"
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--workload", "gsm8k"])


# ------------------------------------------------------------------------------------ the shipped model
def test_shipped_files_are_there_and_small():
    from model_adapters.embedded.arith import serving
    from seer_runtime import GenerationConfig

    for name in ("config.json", "model.safetensors", "tokenizer.json", "train_log.json", "seer_generation_config.json",
                 "seer_config.json", "dyllm_config.json"):
        assert (ARITH_DIR / name).is_file(), name
    assert (ARITH_DIR / "model.safetensors").stat().st_size <= 20_000_000
    log = json.loads((ARITH_DIR / "train_log.json").read_text())
    assert log["workload"] == "arith" and log["window"] == RESPONSE_WINDOW and log["loss_curve"]
    shipped_gen = GenerationConfig.from_dict(json.loads(serving.GENERATION_FILE.read_text()))
    assert shipped_gen == serving.demo_generation_config()
    assert shipped_gen.steps == shipped_gen.gen_length and shipped_gen.block_length == BLOCK_LENGTH


def test_shipped_model_loads_offline(shipped):
    import model_adapters as ma

    model, tok = shipped
    assert isinstance(model, ma.LLaDAModelLM) and not model.is_multimodal and model.dtype == torch.float32
    assert model.token_ids == tok.token_ids and model.vocab_size == tok.vocab_size
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(ARITH_DIR / "tokenizer.json")).get_vocab() == build_arith_tokenizer().get_vocab()
    text = "ann has 12 apples . she buys 3 bags of 4 apples . how many apples does ann have now ?"
    assert tok.decode(tok.encode(text)) == text and tok.unk_id not in tok.encode(text)


@pytest.mark.usefixtures("reference_kernels")
def test_heldout_requests_decode_to_right_answers(shipped):
    """A few held-out requests decode live to right final answers with right steps, at the
    quality the training run recorded (a regression check of weights, tokenizer, engine and
    prompt format together); the recorded quality itself is the issue's bar."""
    from model_adapters.embedded.arith import serving
    from seer_runtime.evaluate import run_requests

    model, tok = shipped
    recorded = json.loads((ARITH_DIR / "train_log.json").read_text())["heldout"]
    rate = recorded["decoding"]["exact_match"]
    assert recorded["decoding"]["requests"] >= 500 and rate >= 0.90, rate
    requests, reqs = serving.demo_requests(N_DECODE, tok)
    res = run_requests(model, requests, serving.demo_generation_config(), batch_size=N_DECODE)
    texts = [tok.decode(a) for a in res.answers]
    hits = [score(r, t) for r, t in zip(reqs, texts)]
    floor = N_DECODE * rate - 3 * math.sqrt(N_DECODE * rate * (1 - rate))
    assert sum(hits) >= floor, list(zip(texts, [r.value for r in reqs]))
    for t, h in zip(texts, hits):
        if h:
            assert check_solution(t).steps_right
            assert tasks.MIN_ANSWER_TOKENS <= len(t.split()) <= tasks.MAX_ANSWER_TOKENS


@pytest.mark.usefixtures("reference_kernels")
def test_demo_with_the_arith_workload_writes_its_figures(tmp_path):
    """``seer demo --workload arith --json`` on two held-out requests: the demo's keys, the
    final-answer score and the steps check on every row, the DyLLM and threshold rows; Seer never
    computes more than the baseline and the guard accounts for every over-truncated answer."""
    from seer_runtime.cli import main

    out = tmp_path / "demo.json"
    methods = ["dyllm", "threshold:0.9", "seer+threshold:0.9", "threshold:0.9+dual", "seer+threshold:0.9+dual"]
    assert main(["demo", "--workload", "arith", "--requests", "2", "--batch-size", "2", "--json", str(out),
                 "--plot", str(tmp_path / "profiles.png"), "--repeats", "1", "--only", "seer:sparsity", "seer:eos_prob",
                 "seer:both", *methods]) == 0
    fig = json.loads(out.read_text())
    for key in ("requests", "baseline", "seer", "speedup", "ideal_speedup", "boundary_mae", "over_truncation_rate",
                "recovered", "lost_answers", "probes", "methods"):
        assert key in fig, key
    assert fig["workload"] == "arith" and fig["window"] == RESPONSE_WINDOW and fig["block_length"] == BLOCK_LENGTH
    assert set(fig["probes"]) == {"sparsity", "eos_prob", "both"}
    assert list(fig["methods"]) == methods
    for row in [fig["baseline"], *fig["probes"].values(), *fig["methods"].values()]:
        for key in ("tok_per_s", "latency_s", "nfe", "positions_computed", "exact_match", "steps_right",
                    "answer_tokens", "wall_s_median"):
            assert key in row, key
    assert fig["baseline"]["nfe"] == RESPONSE_WINDOW + 1  # the prefill, then one step per token
    assert fig["methods"]["threshold:0.9"]["nfe"] <= fig["baseline"]["nfe"]
    # the dual cache computes fewer positions than the threshold alone, in as many forwards or a few more
    assert fig["methods"]["threshold:0.9+dual"]["ideal_speedup"] > fig["methods"]["threshold:0.9"]["ideal_speedup"]
    for probe in fig["probes"].values():
        assert probe["positions_computed"] <= fig["baseline"]["positions_computed"]
        assert probe["recovered"] + probe["completed_differently"] + probe["lost_answers"] == probe["over_truncated"]
    assert (tmp_path / "profiles.png").stat().st_size > 0


@pytest.mark.usefixtures("reference_kernels")
def test_calibrate_simulates_each_eos_threshold_and_verifies_the_best(tmp_path, capsys):
    """``seer calibrate --eos-thresholds``: each threshold of the end-probability probe is
    simulated from the step-0 profiles and the best one by simulated U is the one decoded."""
    from seer_runtime.calibration.seer import Profiles, simulate_eos
    from seer_runtime.cli import main
    from tests.cli.test_cli import checkpoint_and_requests

    end_prob = torch.tensor([[0.1, 0.6, 0.95, 1.0], [0.0, 0.2, 0.4, 0.8], [0.0, 0.0, 0.0, 0.0]])
    prof = Profiles(torch.zeros(1, 1, 3, 4), torch.zeros(1, 1), torch.zeros(1), end_prob, [1], (0.1,))
    assert simulate_eos(prof, 0.5, window=4) == [2, 4, 4] and simulate_eos(prof, 0.9, window=4) == [3, 4, 4]
    ckpt, data = checkpoint_and_requests(tmp_path, 6)
    out = tmp_path / "seer.json"
    args = ["calibrate", "--model", str(ckpt), "--data", str(data), "--out", str(out), "--gen-length", "8",
            "--steps", "8", "--block-length", "8"]
    assert main([*args, "--eos-thresholds", "0.5", "0.9", "0.99", "--no-compositions"]) == 0, capsys.readouterr().err
    assert "compositions" not in json.loads(out.read_text())["calibration"]
    record = json.loads(out.read_text())["calibration"]
    sims = record["eos_thresholds"]
    assert sorted(s["threshold"] for s in sims) == [0.5, 0.9, 0.99]
    assert [s["U"] for s in sims] == sorted((s["U"] for s in sims), reverse=True)
    verified = [v for v in record["verified"] if v["config"]["probe"] == "eos_prob"]
    assert sorted(v["config"]["eos_threshold"] for v in verified) == sorted(s["threshold"] for s in sims[:2])
    assert main([*args, "--eos-thresholds", "1.5"]) == 2
    assert "eos_thresholds must hold numbers in (0, 1]" in capsys.readouterr().err
