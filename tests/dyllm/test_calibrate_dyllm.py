"""DyLLM calibration: the choice rule, and a run on a tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from seer_runtime import DyLLMConfig, GenerationConfig
from seer_runtime.calibration.dyllm import calibrate_dyllm, choose, eligible, ideal_speedup
from seer_runtime.evaluate import Request
from tests.tiny_models import tiny

pytestmark = [pytest.mark.dyllm, pytest.mark.usefixtures("reference_kernels")]


def cand(acc, speed, keeps=True, beats=None, **cfg):
    c = {"accuracy": acc, "ideal_speedup": speed, "keeps_accuracy": keeps, "config": DyLLMConfig(**cfg)}
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
    assert out["confirm"]["holds"] == out["confirm"]["chosen"]["keeps_accuracy"]
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
    for bad in ((0.99, float("nan")), (0.0,), ("0.9",)):
        with pytest.raises(ValueError, match="taus must hold finite numbers > 0"):
            calibrate_dyllm(model, requests, gen, confirm=confirm, taus=bad)
