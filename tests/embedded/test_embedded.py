"""Issue: the embedded demo model. The shipped weights load offline, the tokenizer round-trips,
the task generator is deterministic, and held-out requests decode to their answers."""

from __future__ import annotations

import json
import math

import pytest
import torch

import model_adapters as ma
from model_adapters.embedded import (
    EMBEDDED_DIR,
    RESPONSE_WINDOW,
    EmbeddedTokenizer,
    build_tokenizer,
    load_embedded,
)
from model_adapters.embedded.tasks import (
    MAX_ANSWER_TOKENS,
    RequestStream,
    make_drill,
    make_lookup_request,
    make_requests,
    vocabulary_words,
)

pytestmark = pytest.mark.models

N_DECODE = 48  # held-out requests decoded end to end (fast: one batch, 32 steps)


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return load_embedded()


def test_shipped_files_are_there_and_small():
    for name in ("config.json", "model.safetensors", "tokenizer.json", "train_log.json"):
        assert (EMBEDDED_DIR / name).is_file(), name
    assert (EMBEDDED_DIR / "model.safetensors").stat().st_size < 8_000_000
    log = json.loads((EMBEDDED_DIR / "train_log.json").read_text())
    assert log["window"] == RESPONSE_WINDOW and log["loss_curve"] and "heldout" in log


def test_shipped_model_loads_offline(shipped):
    model, tok = shipped
    assert isinstance(model, ma.LlavaLladaForMaskedDiffusion)
    assert model.num_layers >= 6 and model.dtype == torch.float32
    assert model.token_ids == tok.token_ids  # config.json ids == tokenizer ids
    assert model.vocab_size == tok.vocab_size
    cfg = json.loads((EMBEDDED_DIR / "config.json").read_text())
    assert cfg["model_type"] == "llava_llada" and cfg["mm_projector_type"] == "mlp2x_gelu"
    # one extra SigLIP layer is built-then-dropped, as LaViDa does
    kept = len(model.model.vision_tower.vision_tower.vision_model.encoder.layers)
    assert kept == cfg["vision_config"]["num_hidden_layers"] - cfg["vision_drop_last_layers"]
    half, _ = load_embedded(dtype=torch.float16)
    assert half.dtype == torch.float16
    # a 48 px image gives 3x3 pooled tokens + one newline
    req = next(r for r in make_requests(10, "heldout") if r.has_image)
    assert model.image_embeddings(req.image_input()).shape == (10, model.hidden_size)


def test_tokenizer_round_trips(shipped):
    _, tok = shipped
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(EMBEDDED_DIR / "tokenizer.json"))
    assert raw.get_vocab() == build_tokenizer().get_vocab()
    texts = ["how many red shapes are there ?", "red red red", "a b c d", "seventeen", "count to four"]
    for text in texts:
        ids = tok.encode(text)
        assert tok.unk_id not in ids and tok.decode(ids) == text
    assert tok.encode("how many?") == tok.encode("how many ?")
    ids = tok.encode("<image> what is in the top left ?")
    assert ids[0] == ma.IMAGE_TOKEN_INDEX and tok.decode(ids) == "what is in the top left ?"
    prompt = tok.chat_prompt("count to three", with_image=True)
    assert prompt[:4] == [tok.bos_id, tok.start_header_id, tok.encode("user")[0], tok.end_header_id]
    assert prompt[4] == ma.IMAGE_TOKEN_INDEX
    assert prompt[-4:] == [tok.eot_id, tok.start_header_id, tok.encode("assistant")[0], tok.end_header_id]
    head = "<|startoftext|> <|start_header_id|> user"
    assert tok.decode(prompt, skip_special_tokens=False).startswith(head)
    window = tok.response_window("a b c")
    assert len(window) == RESPONSE_WINDOW and window[3] == tok.eot_id and set(window[4:]) == {tok.eos_id}
    assert tok.pad_id == tok.eos_id and tok.mask_id not in (tok.eos_id, tok.eot_id)


def test_task_generator_is_deterministic():
    a, b = make_requests(24, "heldout"), make_requests(24, "heldout")
    assert [(r.question, r.answer, r.kind) for r in a] == [(r.question, r.answer, r.kind) for r in b]
    for x, y in zip(a, b):
        assert (x.image is None) == (y.image is None)
        if x.image is not None:
            assert x.image.tobytes() == y.image.tobytes()
            assert torch.equal(x.image_input().pixel_values, y.image_input().pixel_values)
    train = make_requests(24, "train")
    assert [r.question + r.answer for r in train] != [r.question + r.answer for r in a]
    tok = EmbeddedTokenizer(build_tokenizer())
    words = set(vocabulary_words())
    for r in make_requests(300, "train", seed=7):
        assert 1 <= r.answer_tokens <= MAX_ANSWER_TOKENS
        assert len(tok.encode(r.answer)) == r.answer_tokens
        assert set((r.question + " " + r.answer).split()) <= words
    with pytest.raises(ValueError, match="split"):
        make_requests(1, "test")


def test_reading_drills_are_training_only_and_well_formed():
    """Drills answer with one word per cell in reading order; a stream without drills draws
    exactly what it drew before drills existed (the held-out split never holds one)."""
    import numpy as np

    words = set(vocabulary_words())
    tok = EmbeddedTokenizer(build_tokenizer())
    rng = np.random.default_rng(3)
    for _ in range(40):
        r = make_drill(rng)
        cells = r.answer.split()
        assert len(cells) == 9 and set(r.question.split()) | set(cells) <= words
        part = 0 if r.kind == "list_colours" else 1
        assert cells == ["nothing" if c is None else c[part] for c in r.grid]
        assert len(tok.encode(r.answer)) == 9 and r.has_image
    plain = [(r.question, r.answer) for r in RequestStream(5).next_batch(30)]
    assert plain == [(r.question, r.answer) for r in RequestStream(5, drill=0.0).next_batch(30)]
    mixed = RequestStream(5, drill=0.5).next_batch(60)
    assert 10 < sum(r.kind.startswith("list_") for r in mixed) < 50
    assert not any(r.kind.startswith("list_") for r in make_requests(300, "heldout"))


def test_lookup_requests_name_one_cell_and_answer_from_it():
    """The lookup diagnostic's requests (bench/embedded_lookup_lr.py) come from the lookup
    families only, and each answer is what the named cell holds (or whether the asked shape is
    there)."""
    import numpy as np

    from model_adapters.embedded.tasks import COLS, ROWS

    rng = np.random.default_rng(11)
    reqs = [make_lookup_request(rng) for _ in range(200)]
    assert {r.kind for r in reqs} == {"cell", "cell_colour", "cell_shape", "yesno"}
    for r in reqs:
        assert r.has_image and r.answer_tokens in (1, 2)
        if r.kind == "yesno":
            colour, shape = r.question.split()[3:5]
            assert r.answer == ("yes" if (colour, shape) in r.grid else "no")
            continue
        words = r.question.split()
        row, col = words[-3], words[-2]
        cell = r.grid[3 * ROWS.index(row) + COLS.index(col)]
        expected = {"cell_colour": None if cell is None else cell[0], "cell_shape": None if cell is None else cell[1],
                    "cell": "nothing" if cell is None else f"{cell[0]} {cell[1]}"}[r.kind]
        assert r.answer == expected
    again = np.random.default_rng(11)
    assert [(r.question, r.answer) for r in reqs[:20]] == [
        (r.question, r.answer) for r in (make_lookup_request(again) for _ in range(20))]


def test_vision_stage_learns_cells_and_projector_init_is_centred():
    """Stage 0 teaches a fresh tiny tower to name each pooled cell's colour, shape and place
    (chance: 1/5, 1/4, 1/9); the whitened projector then gives cell tokens whose shared part is
    small against their differences (a plain init gives nearly one token for every cell)."""
    import numpy as np

    from model_adapters.embedded.tasks import TaskRequest, _random_grid, draw_grid
    from model_adapters.embedded.train import (
        align_projector_to_words,
        init_projector_whitened,
        init_weights,
        model_config,
        pretrain_vision_tower,
    )
    from model_adapters.loading import build_model

    torch.manual_seed(0)
    tok = EmbeddedTokenizer(build_tokenizer())
    model = build_model(model_config(tok, d_model=64, n_layers=1, n_heads=2, mlp_hidden=64, vision_hidden=32))
    init_weights(model, 1, torch.Generator().manual_seed(0))
    rng = np.random.default_rng(4)
    probe = [TaskRequest("grid", "", "", draw_grid(g, rng), g).image_input()
             for g in (_random_grid(rng, 5) for _ in range(16))]

    def shared_over_spread():
        with torch.no_grad():
            cells = torch.cat([model.image_embeddings(x)[:9] for x in probe])
        return float(cells.mean(0).norm() / (cells - cells.mean(0)).norm(dim=1).mean())

    before = shared_over_spread()
    acc = pretrain_vision_tower(model, steps=60, seed=0, batch_size=32)
    assert acc["colour"] > 0.6 and acc["shape"] > 0.4 and acc["cell"] > 0.5, acc
    init_projector_whitened(model, seed=0, n_images=64)
    after = shared_over_spread()
    assert after < 0.5 < before, (before, after)
    # the optional alignment: cell tokens move towards their words' embedding sums
    first = align_projector_to_words(model, tok, steps=1, seed=0, batch_size=16)
    later = align_projector_to_words(model, tok, steps=60, seed=1, batch_size=16)
    assert later < 0.5 * first, (first, later)
    assert not any(p.requires_grad for p in model.model.vision_tower.parameters())


def test_later_phase_keeps_the_frozen_tower_and_projector(tmp_path):
    """A run with the vision stage and ``--freeze-projector`` trains the backbone only; a later
    phase started from it with ``--init-from`` keeps the tower frozen (inherited from the first
    phase's log) and, with ``--freeze-projector`` again, the projector too. A vision stage on top
    of ``--init-from``, or an alignment without the vision stage, is refused."""
    from safetensors.torch import load_file

    from model_adapters.embedded.train import main

    tiny = ["--d-model", "32", "--layers", "1", "--heads", "2", "--mlp", "32", "--vision-hidden", "16",
            "--batch-size", "4", "--eval-every", "2", "--eval-requests", "2", "--final-eval-requests", "2",
            "--save-dtype", "float32", "--no-bf16", "--device", "cpu"]
    first, second = tmp_path / "phase1", tmp_path / "phase2"
    log1 = main([*tiny, "--steps", "2", "--vision-steps", "2", "--align-steps", "2", "--freeze-projector",
                 "--out", str(first)])
    log2 = main([*tiny, "--steps", "2", "--seed", "1", "--freeze-projector", "--init-from", str(first),
                 "--out", str(second)])
    assert log1["projector_frozen"] and log1["vision_tower_frozen"]
    assert log2["vision_staged"] and log2["vision_tower_frozen"] and log2["projector_frozen"]
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    image_path = [k for k in a if "vision_tower" in k or "mm_projector" in k]
    assert image_path and all(torch.equal(a[k], b[k]) for k in image_path)
    assert any(not torch.equal(a[k], b[k]) for k in a if k not in image_path)
    with pytest.raises(ValueError, match="--vision-steps"):
        main([*tiny, "--steps", "2", "--vision-steps", "2", "--init-from", str(first), "--out", str(tmp_path / "x")])
    with pytest.raises(ValueError, match="--align-steps"):
        main([*tiny, "--steps", "2", "--align-steps", "2", "--out", str(tmp_path / "y")])


def test_heldout_requests_decode_correctly(shipped):
    """Held-out requests decode to their answers with the baseline decoder, at the quality the
    training run recorded in train_log.json (a regression check of weights, tokenizer, engine
    and prompt format together). The recorded quality itself must meet the issue's bar of 90%
    exact match on the 1000 held-out requests (the shipped model: 95%; bench/RESULTS.md,
    "Embedded demo model (training)")."""
    from model_adapters.embedded.train import decode_requests, evaluate_step0, exact_matches

    model, tok = shipped
    recorded = json.loads((EMBEDDED_DIR / "train_log.json").read_text())["heldout"]
    reqs = make_requests(N_DECODE, "heldout")
    out = decode_requests(model, tok, reqs)
    hits = exact_matches(tok, reqs, out)
    # a binomial 3-sigma margin below the rate measured on 1000 held-out requests
    rate = recorded["decoding"]["exact_match"]
    assert recorded["requests"] == 1000 and rate >= 0.90, rate
    floor = N_DECODE * rate - 3 * math.sqrt(N_DECODE * rate * (1 - rate))
    assert sum(hits) >= floor, [(r.question, r.answer, tok.decode(out.answer_ids(i)))
                                for i, (r, h) in enumerate(zip(reqs, hits)) if not h]
    # both paths work: some image questions and some text tasks come out exactly right
    assert any(h and r.has_image for r, h in zip(reqs, hits))
    assert any(h and not r.has_image for r, h in zip(reqs, hits))
    for i, (r, h) in enumerate(zip(reqs, hits)):
        if h:
            assert tok.decode(out.responses[i]) == r.answer
            assert int(out.end_positions[i]) == r.answer_tokens  # the window ends right after it
    # step 0 already knows where many answers end (first EOS / end of turn of the argmax)
    length_acc = evaluate_step0(model, tok, reqs)["step0_length_acc"]
    rate = recorded["step0_length_acc"]
    assert length_acc >= rate - 3 * math.sqrt(rate * (1 - rate) / N_DECODE)


def test_shipped_seer_config_and_demo_json(tmp_path, reference_kernels):
    """The calibrated SeerConfig ships beside the weights, and ``seer demo --json`` writes the
    figures the README promises (a short run: one batch of 8 held-out requests; the kernels on
    their references, as DyLLM's in the interpreter would take minutes)."""
    from model_adapters.embedded.serving import SEER_CONFIG_FILE, default_seer_config
    from seer_runtime.cli import main

    cfg = default_seer_config()
    saved = json.loads(SEER_CONFIG_FILE.read_text())
    assert cfg.probe == saved["probe"] and cfg.guard
    out = tmp_path / "demo.json"
    methods = ["dyllm", "threshold:0.9", "seer+threshold:0.9", "seer+threshold:0.9+dyllm", "seer+threshold:0.9+dual"]
    assert main(["demo", "--requests", "8", "--batch-size", "8", "--json", str(out), "--repeats", "1",
                 "--plot", str(tmp_path / "profiles.png"), "--only", "seer:sparsity", "seer:both", *methods]) == 0
    fig = json.loads(out.read_text())
    for key in ("requests", "baseline", "seer", "speedup", "ideal_speedup", "boundary_mae",
                "over_truncation_rate", "recovered", "lost_answers", "probes"):
        assert key in fig, key
    for part in (fig["baseline"], fig["seer"]):
        for key in ("tok_per_s", "latency_s", "nfe", "positions_computed", "exact_match"):
            assert key in part, key
    assert fig["requests"] == 8 and set(fig["probes"]) == {"sparsity", "eos_prob", "both"}
    # Seer never computes more positions than the baseline, and the guard loses nothing it
    # cannot report: every over-truncated answer is either recovered or counted as lost
    for probe in fig["probes"].values():
        assert probe["positions_computed"] <= fig["baseline"]["positions_computed"]
        assert probe["recovered"] + probe["completed_differently"] + probe["lost_answers"] == probe["over_truncated"]
    # DyLLM, threshold parallel decoding and their compositions with Seer, beside the probes
    assert list(fig["methods"]) == methods
    methods = fig["methods"]
    assert methods["dyllm"]["dyllm_flop_ratio"] < 1 and methods["dyllm"]["ideal_speedup"] > 1
    for name in ("threshold:0.9", "seer+threshold:0.9"):  # a threshold cuts the steps, hence the forwards
        assert methods[name]["nfe"] < fig["baseline"]["nfe"], name
    assert methods["seer+threshold:0.9"]["positions_computed"] <= methods["threshold:0.9"]["positions_computed"]
    assert (tmp_path / "profiles.png").stat().st_size > 0


def test_shipped_dyllm_config_is_the_calibrated_choice():
    """``seer calibrate-dyllm`` wrote each embedded model's shipped DyLLMConfig with every candidate's figures; the
    choice is the fastest candidate that keeps the baseline's accuracy on the choose set (its changed answers
    predicting no larger loss either) and holds on a disjoint confirm set, the keepers confirmed in order (checked
    from the record); both sets at least 64 requests."""
    from model_adapters.embedded.arith import serving as arith
    from model_adapters.embedded.serving import DYLLM_CONFIG_FILE, default_dyllm_config

    check_dyllm_record(DYLLM_CONFIG_FILE, default_dyllm_config())
    check_dyllm_record(arith.DYLLM_CONFIG_FILE, arith.default_dyllm_config())


def check_dyllm_record(path, cfg) -> None:
    """The shipped DyLLM choice against its calibration record (shared with the arith model's test)."""
    from seer_runtime.calibration.dyllm import expected_drops, ranked_choices
    from seer_runtime.dyllm import DyLLMConfig

    record = json.loads(path.read_text())["calibration"]
    cands = [{**c, "config": DyLLMConfig.from_dict(c["config"])} for c in record["candidates"]]
    recorded = [c["expected_drop"] for c in cands]
    loss_per_change = expected_drops(cands, record["requests"])  # re-derived from the flips and changes
    assert loss_per_change == pytest.approx(record["loss_per_change"])
    assert [c["expected_drop"] for c in cands] == pytest.approx(recorded)
    ranked, within = ranked_choices(cands, max_drop=record["max_drop"])
    confirm = record["confirm"]
    tried = confirm["tried"]  # the choose set's keepers, fastest first, confirmed until one holds
    assert [DyLLMConfig.from_dict(t["config"]) for t in tried] == [c["config"] for c in ranked[:len(tried)]]
    assert not any(t["holds"] for t in tried[:-1])
    for t in tried:
        assert t["holds"] == (t["keeps_accuracy"] and t.get("authors_update_right", 0) <= t["right_answers"])
    held = [t for t in tried if t["holds"]]
    chosen = held[0] if held else max(tried, key=lambda t: (t["right_answers"], -tried.index(t)))
    assert cfg == DyLLMConfig.from_dict(chosen["config"]) and within == record["within_tolerance"]
    assert {(c["config"].tau, c["config"].attention_mode) for c in cands} >= {
        (0.99, "partial"), (0.99, "paper"), (0.99, "exact")}
    for c in cands:  # flips and p beside each accuracy
        assert {"right_to_wrong", "wrong_to_right", "p_value", "keeps_accuracy"} <= set(c)
    assert record["requests"] >= 64 and confirm["requests"] >= 64
    assert DyLLMConfig.from_dict(confirm["chosen"]["config"]) == cfg
    assert confirm["holds"] == confirm["chosen"]["holds"] == bool(held)


def test_shipped_seer_config_records_its_choose_and_confirm_sets():
    """``seer calibrate`` chose the shipped SeerConfig on at least 64 requests and confirmed it on at
    least 64 others, with the flips and McNemar's p of every verified candidate; the composition
    it recommends was confirmed beside Fast-dLLM alone."""
    from model_adapters.embedded import arith
    from model_adapters.embedded.serving import SEER_CONFIG_FILE

    for path in (SEER_CONFIG_FILE, arith.ARITH_DIR / "seer_config.json"):
        record = json.loads(path.read_text())["calibration"]
        assert record["requests"] >= 64 and record["confirm"]["requests"] >= 64, path
        assert record["confirm"]["holds"] == record["confirm"]["chosen"]["keeps_accuracy"]
        for v in record["verified"]:
            assert {"right_to_wrong", "wrong_to_right", "p_value", "keeps_accuracy"} <= set(v)
        comp = record["compositions"]
        assert comp["requests"] == record["requests"] and comp["recommended"] in comp["rows"]
        if comp["recommended"] != "baseline":
            assert comp["confirm"]["requests"] == record["confirm"]["requests"]


def test_calibration_jsonl_round_trips(tmp_path):
    """The JSONL ``seer calibrate --data`` reads (questions, PNG images beside the file, answers)
    gives back the calibration split's requests."""
    from model_adapters.embedded.serving import calibration_requests, write_calibration_jsonl

    path = write_calibration_jsonl(tmp_path / "cal.jsonl", n=24)
    from_file, _ = calibration_requests(path)
    generated, _ = calibration_requests(None, n=24)
    assert len(from_file) == len(generated) == 24
    assert any(r.image is not None for r in from_file)
    for a, b in zip(from_file, generated):
        assert a.prompt_ids == b.prompt_ids and a.truth_ids == b.truth_ids
        assert (a.image is None) == (b.image is None)
        if a.image is not None:  # PNG is lossless: the pixels survive the round trip
            assert torch.equal(a.image.pixel_values, b.image.pixel_values)
    (tmp_path / "bad.jsonl").write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a line must be a JSON object"):
        calibration_requests(tmp_path / "bad.jsonl")
    for bad in (0, -3, 2.5):  # --requests 0 used to mean the default 128
        with pytest.raises(ValueError, match="requests must be an int >= 1"):
            calibration_requests(None, n=bad)
