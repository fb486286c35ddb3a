"""DyLLM calibration: the choice rule, and a run on a tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from seer_runtime import DyLLMConfig, GenerationConfig
from seer_runtime.calibration.dyllm import calibrate_dyllm, choose, ideal_speedup
from seer_runtime.evaluate import Request
from tests.tiny_models import tiny

pytestmark = [pytest.mark.dyllm, pytest.mark.usefixtures("reference_kernels")]


def cand(acc, speed, **cfg):
    return {"accuracy": acc, "ideal_speedup": speed, "config": DyLLMConfig(**cfg)}


def test_choose_the_cheapest_within_the_tolerance():
    paper, fast_bad, ok, ok_fast = cand(0.70, 2.5), cand(0.80, 4.0, tau=0.9), cand(0.86, 2.6, tau=0.98), cand(
        0.855, 2.8, tau=0.97)
    best, within = choose([paper, fast_bad, ok, ok_fast], 0.865, 0.01)
    assert best is ok_fast and within  # 0.855 is exactly one point below: allowed
    assert choose([paper, fast_bad, ok, ok_fast], 0.865, 0.0) == (ok, False)  # none qualifies: the most accurate


def test_choose_ties_and_edge_cases():
    a, b = cand(0.9, 2.0), cand(0.9, 2.0, tau=0.98)
    assert choose([a, b], 0.9, 0.01) == (a, True)  # exact tie: the earlier (the paper's settings)
    assert choose([b, a], 0.9, 0.01) == (b, True)
    higher = cand(0.95, 2.0, tau=0.97)
    assert choose([a, higher], 0.9, 0.01) == (higher, True)  # same speed: the more accurate
    assert choose([a], 0.99, 0.0) == (a, False)
    with pytest.raises(ValueError, match="candidates is empty"):
        choose([], 0.9, 0.01)


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
    gen = GenerationConfig(gen_length=8, steps=8)
    logs = []
    out = calibrate_dyllm(model, requests, gen, taus=(0.98,), full_steps=2, batch_size=2, log=logs.append)
    default_tau = 0.99 if model.family == "llada" else 0.995
    got = [(c["config"]["tau"], DyLLMConfig.from_dict(c["config"]).attention_mode) for c in out["candidates"]]
    assert got == [(default_tau, "paper"), (0.98, "paper"), (0.98, "partial"), (default_tau, "partial"),
                   (0.98, "exact"), (default_tau, "exact")]
    assert out["candidates"][0]["config"] == DyLLMConfig.for_model(model, full_steps=2).to_dict()  # the defaults first
    assert out["baseline"]["exact_match"] == 1.0  # no references: agreement with the baseline
    for c in out["candidates"]:
        assert c["accuracy"] == pytest.approx(1.0 - c["changed"] / len(requests)) and c["ideal_speedup"] > 0
    chosen = out["config"]
    best, within = choose([{**c, "config": DyLLMConfig.from_dict(c["config"])} for c in out["candidates"]], 1.0, 0.01)
    assert chosen == best["config"] and out["within_tolerance"] == within
    assert any("chosen:" in line for line in logs)
    chosen.to_json(tmp_path / "d.json", calibration={k: v for k, v in out.items() if k != "config"})
    assert DyLLMConfig.from_json(tmp_path / "d.json") == chosen
    assert json.loads((tmp_path / "d.json").read_text())["calibration"]["requests"] == 3
    assert all(r.truth_ids is None for r in requests)  # the caller's requests are not modified
    for c in out["candidates"]:
        assert 0 < c["salient_fraction"] <= 1
    with pytest.raises(ValueError, match="max_drop"):
        calibrate_dyllm(model, requests, gen, max_drop=-0.1)
    with pytest.raises(ValueError, match="requests is empty"):
        calibrate_dyllm(model, [], gen)
    for bad in ((0.99, float("nan")), (0.0,), ("0.9",)):
        with pytest.raises(ValueError, match="taus must hold finite numbers > 0"):
            calibrate_dyllm(model, requests, gen, taus=bad)


def test_config_json_errors(tmp_path):
    with pytest.raises(TypeError, match="must be read from a JSON object"):
        DyLLMConfig.from_dict([1])
    with pytest.raises(TypeError, match="unexpected keyword argument 'tau'"):  # only a calibration record
        DyLLMConfig().to_json(tmp_path / "d.json", tau=0.5)
    with pytest.raises(ValueError, match=r"unknown DyLLMConfig fields: \['threshold'\]"):
        DyLLMConfig.from_dict({"tau": 0.9, "threshold": 0.5, "calibration": {}})
