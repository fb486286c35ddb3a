"""DyLLM calibration: the choice rule, and a run on a tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from seer_runtime import DyLLMConfig, GenerationConfig
from seer_runtime.calibration.dyllm import (
    calibrate_dyllm,
    choose,
    confirm_in_order,
    eligible,
    expected_drops,
    ideal_speedup,
    ranked_choices,
)
from seer_runtime.evaluate import Request
from tests.tiny_models import tiny

pytestmark = [pytest.mark.dyllm, pytest.mark.usefixtures("reference_kernels")]


def cand(acc, speed, keeps=True, beats=None, changed=0, expected_drop=0.0, **cfg):
    c = {"accuracy": acc, "ideal_speedup": speed, "keeps_accuracy": keeps, "changed": changed,
         "expected_drop": expected_drop, "config": DyLLMConfig(**cfg)}
    if beats is not None:
        c["beats_authors_update"] = beats
    return c


def test_choose_the_cheapest_that_keeps_the_accuracy():
    authors, fast_bad, ok, ok_fast = cand(0.70, 2.5, keeps=False), cand(0.80, 4.0, keeps=False, tau=0.9), \
        cand(0.86, 2.6, tau=0.98), cand(0.855, 2.8, tau=0.97)
    assert choose([authors, fast_bad, ok, ok_fast]) == (ok_fast, True)
    none_kept = [authors, fast_bad, {**ok, "keeps_accuracy": False}]
    assert choose(none_kept) == (none_kept[2], False)  # none qualifies: the most accurate, said so


def test_key_correction_must_keep_more_answers_than_the_authors_update():
    authors = cand(0.9, 2.0, tau=0.98)
    corrected = cand(0.9, 2.1, beats=False, tau=0.98, key_correction=True)
    assert choose([authors, corrected]) == (authors, True)  # faster, but keeps no more answers
    better = {**corrected, "beats_authors_update": True}
    assert choose([authors, better]) == (better, True)
    assert not eligible(cand(0.9, 2.1, tau=0.98, key_correction=True))  # not measured: not eligible


def test_choose_ties_and_edge_cases():
    a, b = cand(0.9, 2.0), cand(0.9, 2.0, tau=0.98)
    assert choose([a, b]) == (a, True)  # exact tie: the earlier (the authors' settings)
    assert choose([b, a]) == (b, True)
    higher = cand(0.95, 2.0, tau=0.97)
    assert choose([a, higher]) == (higher, True)  # same speed: the more accurate
    assert choose([{**a, "keeps_accuracy": False}])[1] is False
    with pytest.raises(ValueError, match="candidates is empty"):
        choose([])


def test_expected_drop_pools_the_loss_per_changed_answer():
    """The arith 128-request choose set's case (bench/records/arith_dyllm_calibration_128x128.json, exact
    attention): 0.999 and 0.9995 both keep every answer there (0 right->wrong), but 0.999 changes 32 answers
    against 22, and at the calibration's pooled net loss per changed answer that predicts more than a point."""
    flips = [(14, 3, 104), (6, 1, 107), (2, 1, 77), (0, 1, 32), (0, 1, 22)]
    cands = [{"right_to_wrong": a, "wrong_to_right": b, "changed": c} for a, b, c in flips]
    rate = expected_drops(cands, 128)
    assert rate == pytest.approx((22 - 7) / 342)
    assert [c["expected_drop"] for c in cands] == pytest.approx([c * rate / 128 for _, _, c in flips])
    assert cands[3]["expected_drop"] > 0.01 > cands[4]["expected_drop"]
    gaining = [{"right_to_wrong": 0, "wrong_to_right": 3, "changed": 5}, {"right_to_wrong": 1, "wrong_to_right": 0,
                                                                         "changed": 2}]
    assert expected_drops(gaining, 10) == 0.0 and [c["expected_drop"] for c in gaining] == [0.0, 0.0]
    unchanged = [{"right_to_wrong": 0, "wrong_to_right": 0, "changed": 0}]
    assert expected_drops(unchanged, 4) == 0.0 and unchanged[0]["expected_drop"] == 0.0
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="requests must be a positive int"):
            expected_drops(cands, bad)


def test_a_keeper_whose_changed_answers_predict_a_loss_is_not_eligible():
    risky, safe = cand(0.906, 1.89, changed=32, expected_drop=0.0125, tau=0.999, approx_attention=False), \
        cand(0.906, 1.72, changed=22, expected_drop=0.0086, tau=0.9995, approx_attention=False)
    assert not eligible(risky) and eligible(safe)
    assert choose([risky, safe]) == (safe, True)
    assert choose([risky, safe], max_drop=0.02) == (risky, True)  # a looser tolerance admits the faster
    # none eligible: the most accurate; a tie goes to the fewer answers changed, not the faster
    assert choose([risky, {**safe, "expected_drop": 0.011}]) == ({**safe, "expected_drop": 0.011}, False)
    with pytest.raises(KeyError):
        eligible({k: v for k, v in safe.items() if k != "expected_drop"})  # not measured: an error, not a pass


def test_ranked_choices_put_the_keepers_fastest_first():
    slow, fast, lost, tie_later = cand(0.9, 1.9, tau=0.999), cand(0.9, 2.0, tau=0.99), \
        cand(0.95, 3.0, keeps=False, tau=0.98), cand(0.9, 1.9, tau=0.9975)
    assert ranked_choices([slow, fast, lost, tie_later]) == ([fast, slow, tie_later], True)
    assert ranked_choices([lost, {**slow, "keeps_accuracy": False}]) == ([lost], False)  # the most accurate alone


def confirm_with(verdicts: dict, baseline: list[bool], ranked: list[dict], **kw):
    """confirm_in_order with each configuration's confirm-set verdicts from ``verdicts`` (by tau and
    mode), counting the decodes."""
    asked = []

    def right_on_confirm(cfg):
        asked.append((cfg.tau, cfg.attention_mode))
        return verdicts[(cfg.tau, cfg.attention_mode)]

    chosen, tried = confirm_in_order(ranked, right_on_confirm, baseline, log=lambda line: None, **kw)
    return chosen, tried, asked


def test_confirm_tries_the_keepers_in_order_until_one_holds():
    """The arith calibration's case: the fastest keeper (key-corrected) loses an answer on the confirm set
    of 64 (1.6 points), the next (exact attention) keeps them all and is chosen."""
    base = [True] * 58 + [False] * 6
    corrected, exact = cand(0.89, 2.04, tau=0.999, key_correction=True), cand(0.89, 1.89, tau=0.999,
                                                                               approx_attention=False)
    verdicts = {(0.999, "partial"): [False] + [True] * 57 + [False] * 6,
                (0.999, "paper"): [True] * 55 + [False] * 9,
                (0.999, "exact"): [True] * 59 + [False] * 5}
    chosen, tried, asked = confirm_with(verdicts, base, [corrected, exact])
    assert chosen["config"] == exact["config"] and chosen["holds"] and chosen["right_answers"] == 59
    assert [t["holds"] for t in tried] == [False, True] and tried[0]["right_to_wrong"] == 1
    assert tried[0]["authors_update_right"] == 55  # the key-corrected try is beside the authors' update
    assert asked == [(0.999, "partial"), (0.999, "paper"), (0.999, "exact")]
    # the first holds: nothing else is decoded
    chosen, tried, asked = confirm_with({**verdicts, (0.999, "partial"): base}, base, [corrected, exact])
    assert chosen["config"] == corrected["config"] and len(tried) == 1 and "exact" not in {m for _, m in asked}


def test_confirm_key_correction_must_not_keep_fewer_than_the_authors_update():
    base = [True] * 50 + [False] * 14
    corrected, authors = cand(0.9, 2.1, tau=0.98, key_correction=True), cand(0.9, 2.0, tau=0.98)
    verdicts = {(0.98, "partial"): [True] * 50 + [False] * 14, (0.98, "paper"): [True] * 51 + [False] * 13}
    chosen, tried, _ = confirm_with(verdicts, base, [corrected, authors])
    assert not tried[0]["holds"] and tried[0]["keeps_accuracy"]  # keeps the baseline's, not the authors' update's
    assert chosen["config"] == authors["config"] and chosen["holds"]


def test_confirm_when_none_holds_gives_the_most_accurate_tried():
    base = [True] * 60 + [False] * 4
    a, b, c, d = (cand(0.9, s, tau=t) for s, t in ((4.0, 0.97), (3.0, 0.98), (2.0, 0.99), (1.0, 0.995)))
    verdicts = {(0.97, "paper"): [True] * 55 + [False] * 9, (0.98, "paper"): [True] * 57 + [False] * 7,
                (0.99, "paper"): [True] * 57 + [False] * 7, (0.995, "paper"): base}
    chosen, tried, asked = confirm_with(verdicts, base, [a, b, c, d])  # three tries by default: d is never decoded
    assert len(tried) == 3 and not any(t["holds"] for t in tried) and (0.995, "paper") not in asked
    assert chosen["config"] == b["config"] and not chosen["holds"]  # 57 right; a tie goes to the earlier
    chosen, tried, _ = confirm_with(verdicts, base, [a, b, c, d], tries=4)
    assert chosen["config"] == d["config"] and chosen["holds"]
    for bad in (0, True):
        with pytest.raises(ValueError, match="tries must be a positive int"):
            confirm_in_order([a], lambda cfg: base, base, tries=bad)
    with pytest.raises(ValueError, match="ranked is empty"):
        confirm_in_order([], lambda cfg: base, base)


def test_ideal_speedup_sums_the_batches():
    stats = [{"steps": [{"macs": 10.0, "dense_macs": 10.0}, {"macs": 2.0, "dense_macs": 10.0}]},
             {"steps": [{"macs": 8.0, "dense_macs": 20.0}]}]
    assert ideal_speedup(stats) == pytest.approx(40.0 / 20.0)
    assert ideal_speedup([]) == 1.0


@pytest.mark.parametrize("kind", ["llada-8b-instruct", "lavida-dream"])
def test_calibrate_on_a_tiny_model(kind, tmp_path):
    model = tiny(kind)
    torch.manual_seed(3)
    requests = [Request(torch.randint(5, 200, (n,)).tolist(), None, None) for n in (3, 5, 4)]
    confirm = [Request(torch.randint(5, 200, (n,)).tolist(), None, None) for n in (4, 6)]
    gen = GenerationConfig(gen_length=8, steps=8)
    logs = []
    out = calibrate_dyllm(model, requests, gen, confirm=confirm, taus=(0.98,), full_steps=2, batch_size=2,
                          log=logs.append)
    default_tau = 0.99 if model.family == "llada" else 0.995
    got = [(c["config"]["tau"], DyLLMConfig.from_dict(c["config"]).attention_mode) for c in out["candidates"]]
    low, high = sorted({0.98, default_tau})
    assert got == [(default_tau, "paper"), (low, "paper"), (low, "partial"), (high, "partial"), (low, "exact"),
                   (high, "exact")]
    assert out["candidates"][0]["config"] == DyLLMConfig.for_model(model, full_steps=2).to_dict()  # the defaults first
    assert out["baseline"]["exact_match"] == 1.0  # no references: agreement with the baseline
    for c in out["candidates"]:
        assert c["accuracy"] == pytest.approx(1.0 - c["changed"] / len(requests)) and c["ideal_speedup"] > 0
        assert c["right_to_wrong"] == c["changed"] and c["wrong_to_right"] == 0 and 0 <= c["p_value"] <= 1
        assert 0 < c["salient_fraction"] <= 1
    assert out["requests"] == 3 and out["confirm"]["requests"] == 2
    assert out["confirm"]["chosen"]["config"] == out["config"].to_dict()
    assert out["confirm"]["holds"] == out["confirm"]["chosen"]["holds"]
    tried = out["confirm"]["tried"]
    for c in out["candidates"]:
        assert c["expected_drop"] == pytest.approx(c["changed"] * out["loss_per_change"] / len(requests))
    ranked, _ = ranked_choices([{**c, "config": DyLLMConfig.from_dict(c["config"])} for c in out["candidates"]])
    assert [t["config"] for t in tried] == [c["config"].to_dict() for c in ranked[:len(tried)]]  # in order
    assert all(not t["holds"] for t in tried[:-1]) and (tried[-1]["holds"] or len(tried) == min(3, len(ranked)))
    assert any("chosen on the choose set" in line for line in logs) and any("confirmed on 2" in line for line in logs)
    out["config"].to_json(tmp_path / "d.json", calibration={k: v for k, v in out.items() if k != "config"})
    assert DyLLMConfig.from_json(tmp_path / "d.json") == out["config"]
    assert json.loads((tmp_path / "d.json").read_text())["calibration"]["requests"] == 3
    assert all(r.truth_ids is None for r in requests + confirm)  # the caller's requests are not modified
    with pytest.raises(ValueError, match="max_drop"):
        calibrate_dyllm(model, requests, gen, confirm=confirm, max_drop=-0.1)
    with pytest.raises(ValueError, match="requests is empty"):
        calibrate_dyllm(model, [], gen, confirm=confirm)
    with pytest.raises(ValueError, match="confirm is empty"):
        calibrate_dyllm(model, requests, gen, confirm=[])
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="confirm_tries must be a positive int"):
            calibrate_dyllm(model, requests, gen, confirm=confirm, confirm_tries=bad)
    for bad in ((0.99, float("nan")), (0.0,), ("0.9",)):
        with pytest.raises(ValueError, match="taus must hold finite numbers > 0"):
            calibrate_dyllm(model, requests, gen, confirm=confirm, taus=bad)
