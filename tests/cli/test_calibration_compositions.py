"""Accuracy with its uncertainty (``calibration.accuracy``: the equal-accuracy rule, the verdict in
words) and compositions that pay (``calibration.compositions``: the grid, side-by-side decoding
and timing, the recommendation)."""

from __future__ import annotations

import pytest
import torch

from seer_runtime import DyLLMConfig, GenerationConfig, SeerConfig
from seer_runtime.calibration.accuracy import keeps_accuracy, paired_figures, right_answers, verdict
from seer_runtime.calibration.compositions import (
    CONTENTION,
    Composition,
    against,
    composition_name,
    measure,
    recommend,
    search_grid,
    spread,
)
from seer_runtime.calibration.seer import exact_match
from seer_runtime.evaluate import Request
from seer_runtime.significance import compare_answers
from tests.tiny_models import tiny

pytestmark = pytest.mark.cli


def flips(n: int, right_to_wrong: int, wrong_to_right: int, both_wrong: int = 0):
    """Paired verdicts of ``n`` requests with the given flips (the rest right in both)."""
    base = [True] * right_to_wrong + [False] * wrong_to_right + [False] * both_wrong
    other = [False] * right_to_wrong + [True] * wrong_to_right + [False] * both_wrong
    rest = n - len(base)
    return base + [True] * rest, other + [True] * rest


def test_equal_accuracy_needs_one_point_and_no_significant_loss():
    # 500 requests: 5 answers lost net is one point; 7 right->wrong against 2 back is within noise
    assert keeps_accuracy(compare_answers(*flips(500, 7, 2)))
    # 6 net is more than a point, though McNemar's p (0.15) calls it noise
    c = compare_answers(*flips(500, 9, 3))
    assert c.within_noise and not keeps_accuracy(c)
    # 64 requests: one answer lost net is 1.6 points
    assert not keeps_accuracy(compare_answers(*flips(64, 2, 1)))
    assert keeps_accuracy(compare_answers(*flips(64, 2, 2)))
    # 2000 requests: 12 lost and 1 gained is within a point (0.55) but a significant loss (p = 0.003)
    c = compare_answers(*flips(2000, 12, 1))
    assert not c.within_noise and not keeps_accuracy(c)
    # a significant gain is not a loss
    c = compare_answers(*flips(64, 0, 8))
    assert not c.within_noise and keeps_accuracy(c)
    assert keeps_accuracy(compare_answers(*flips(64, 2, 1)), max_drop=0.02)


def test_verdicts_in_words_and_json():
    assert verdict(compare_answers(*flips(64, 0, 0, both_wrong=3))) == "same verdicts"
    assert verdict(compare_answers(*flips(64, 3, 2))) == "within noise (p=1)"
    assert verdict(compare_answers(*flips(64, 8, 0))) == "worse (p=0.0078)"
    assert verdict(compare_answers(*flips(64, 0, 8))) == "better (p=0.0078)"
    f = paired_figures(*flips(64, 3, 1))
    assert (f["right_to_wrong"], f["wrong_to_right"]) == (3, 1) and f["p_value"] == pytest.approx(0.625)
    assert f["within_noise"] and not f["keeps_accuracy"] and f["verdict"] == "within noise (p=0.62)"


def test_right_answers_scores_each_request_alone():
    reqs = [Request([1], None, [5, 6]), Request([2], None, [7]), Request([3], None, None)]
    assert right_answers(reqs[:2], [[5, 6], [8]], exact_match) == [True, False]
    with pytest.raises(ValueError, match="request 2 has no reference"):
        right_answers(reqs, [[5, 6], [7], [1]], exact_match)
    with pytest.raises(ValueError, match="2 requests but 1 answers"):
        right_answers(reqs[:2], [[5]], exact_match)


def test_the_grid_names_every_composition_once_and_never_dyllm_with_a_block_cache():
    gen = GenerationConfig(gen_length=16, steps=16, block_length=8)
    grid = search_grid(gen, seer=SeerConfig(), dyllm=DyLLMConfig(tau=0.99), thresholds=(0.9, 0.8))
    names = [c.name for c in grid]
    # no threshold: seer, dyllm, seer+dyllm; each threshold: 3 caches x (seer or not) + dyllm (with seer or not)
    assert len(names) == len(set(names)) == 3 + 2 * (3 * 2 + 2)
    assert "baseline" not in names and names[:3] == ["dyllm", "seer", "seer+dyllm"]
    assert {"threshold:0.9+dual", "seer+threshold:0.9+dual", "seer+threshold:0.8+dyllm",
            "threshold:0.8+prefix"} <= set(names)
    assert "dual" not in names and "prefix" not in names
    for c in grid:
        assert (c.dyllm is not None) == c.name.endswith("dyllm")
        assert c.dyllm is None or c.gen.block_cache is None
        if c.gen.threshold is not None:
            assert c.gen.steps is None and f"threshold:{c.gen.threshold:g}" in c.name
    assert [c.name for c in search_grid(gen, seer=None, dyllm=None, thresholds=(0.9,), block_caches=(None,))] == [
        "threshold:0.9"]
    assert composition_name(seer="seer", threshold=0.95, block_cache="prefix", dyllm=False) == \
        "seer+threshold:0.95+prefix"
    with pytest.raises(ValueError, match="threshold"):
        search_grid(gen, seer=None, dyllm=None, thresholds=(1.5,))
    c = next(c for c in grid if c.name == "seer+threshold:0.9+dual")
    form = c.describe(gen)
    assert form["generation"] == {"steps": None, "threshold": 0.9, "block_cache": "dual"} and form["dyllm"] is None
    assert c.options(seer_file="s.json") == "--threshold 0.9 --block-cache dual --seer s.json"
    stopping = next(c for c in search_grid(gen.replace(early_stop=True), seer=None, dyllm=None, thresholds=(0.9,),
                                           block_caches=(None,)))
    assert stopping.options() == "--threshold 0.9 --early-stop"


def row(wall, keeps=True, **extra):
    return {"wall_s_median": wall, "keeps_accuracy": keeps, **extra}


def test_recommend_the_fastest_that_keeps_the_accuracy():
    figures = {"baseline": row(10.0), "a": row(2.0, keeps=False), "b": row(3.0), "c": row(3.0), "d": row(4.0)}
    assert recommend(figures) == "b"  # a is faster but loses accuracy; b and c tie: the earlier
    assert recommend({"baseline": row(10.0), "a": row(1.0, keeps=False)}) == "baseline"
    with pytest.raises(ValueError, match="baseline"):
        recommend({"a": row(1.0)})
    assert spread([1.0]) is None and spread([1.0, 1.2, 0.9]) == pytest.approx(0.3)
    figs = {"baseline": {"wall_s_median": 8.0, "nfe": 33.0, "wall_s_passes": [8.0], "timing_noisy": False},
            "x": {"wall_s_median": 2.0, "nfe": 11.0, "ideal_speedup": 5.0, "wall_s_passes": [2.0, 2.1],
                  "timing_noisy": True}}
    a = against(figs, "x", "baseline")
    assert a["measured"] == 4.0 and a["ideal"] == 5.0 and a["ideal_forwards"] == 3.0 and a["noisy"]
    assert a["passes"] == [2, 1]


@pytest.mark.usefixtures("reference_kernels")
def test_measure_decodes_side_by_side_and_times_the_configurations_in_contention():
    model = tiny("llada-8b-instruct")
    torch.manual_seed(5)
    requests = [Request(torch.randint(5, 200, (n,)).tolist(), None, None) for n in (3, 5, 4, 6)]
    gen = GenerationConfig(gen_length=8, steps=8, block_length=4)
    grid = search_grid(gen, seer=None, dyllm=None, thresholds=(0.001,), block_caches=(None, "dual"))
    plans = {c.name: c for c in grid}
    plans["dual"] = Composition("dual", gen.replace(block_cache="dual"))
    plans["never_right"] = Composition("never_right", gen.replace(steps=2))  # 4 tokens per step: changes answers
    plans["same"] = Composition("same", gen)  # the baseline's decoding under another name: keeps every answer
    results, figures, best = measure(model, requests, gen, plans, batch_size=2, score=exact_match, repeats=3,
                                     progress=False)
    assert list(figures) == ["baseline", "threshold:0.001", "threshold:0.001+dual", "dual", "never_right", "same"]
    assert figures["same"]["keeps_accuracy"] and figures["same"]["verdict"] == "same verdicts"
    assert figures["baseline"]["exact_match"] == 1.0  # no references: the baseline's answers are
    for name, f in figures.items():
        assert len(results[name].answers) == 4
        fastest = min(g["wall_s"] for n, g in figures.items() if n != "baseline" and g["keeps_accuracy"])
        timed = name != "baseline" and f["keeps_accuracy"] and f["wall_s"] <= CONTENTION * fastest
        assert len(f["wall_s_passes"]) == (3 if timed else 1), name
        assert f["wall_s_median"] > 0 and (f["wall_spread"] is None) == (not timed)
        if name != "baseline":  # the references are the baseline's answers: every change is a loss
            assert f["exact_match"] == 1 - f["differs_from_baseline"] / 4
            assert (f["right_to_wrong"], f["wrong_to_right"]) == (f["differs_from_baseline"], 0)
            assert f["ideal_speedup"] == pytest.approx(results["baseline"].positions_computed
                                                       / results[name].positions_computed)
    # the dual cache runs the same steps on fewer positions; a threshold runs fewer steps
    assert figures["dual"]["nfe"] == figures["baseline"]["nfe"] and figures["dual"]["ideal_speedup"] > 1
    assert figures["threshold:0.001"]["nfe"] < figures["baseline"]["nfe"]
    assert figures["never_right"]["differs_from_baseline"] > 0 and not figures["never_right"]["keeps_accuracy"]
    assert best == recommend(figures)
    with pytest.raises(ValueError, match="'baseline' is the name"):
        measure(model, requests, gen, {"baseline": plans["dual"]}, batch_size=2, score=exact_match)
    with pytest.raises(ValueError, match="also_time names no plan"):
        measure(model, requests, gen, {"dual": plans["dual"]}, batch_size=2, score=exact_match, also_time=["x"])
