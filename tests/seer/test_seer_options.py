"""Issue 34 item 4: the choices Seer gives users where its cut changes answers that end inside
its window - a slack of masked positions kept after the boundary - with every probe, the guard,
batches with mixed cuts, and the configuration's validation and JSON."""

from __future__ import annotations

import pytest
import torch

from seer_runtime import GenerationConfig, generate
from seer_runtime.seer import SeerConfig

from ..tiny_models import tiny
from .conftest import W, mixed_cuts_batch_and_alone

pytestmark = [pytest.mark.seer]


@pytest.mark.usefixtures("reference_kernels")
@pytest.mark.parametrize("kind", ["llada-8b-instruct", "dream-v0-instruct-7b", "lavida-llada", "lavida-dream"])
def test_slack_keeps_masked_positions_after_the_boundary(kind, plant):
    model = tiny(kind)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]])
    # Dream's "entropy" ranks positions deterministically ("origin" draws them from the global generator)
    gen = GenerationConfig(gen_length=W, tie_break="stable", block_length=4 if model.family == "llada" else None,
                           alg="entropy" if model.family == "dream" else "origin")
    plant([5, 10, W])  # cut at 5 and 10; the third request has no boundary
    out = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, guard=False, slack=3))
    st = out.stats.extra["seer"]
    assert st["boundary"] == [4, 9, None], "the boundary is the probe's, not moved by the slack"
    assert st["keep_len"] == [8, W, W] and st["final_window"] == [8, W, W], "L* + 3, at most the window"
    assert (out.responses[0, 8:] == model.token_ids.eos).all() and (out.responses != model.token_ids.mask).all()
    plant([5, 10, W])
    plain = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, guard=False))
    assert plain.stats.extra["seer"]["keep_len"] == [5, 10, W]
    # the slack's positions are decoded at the configured rate (one token per step here)
    if kind != "lavida-dream":
        assert out.stats.steps == [8, W, W] and plain.stats.steps == [5, 10, W]
    assert out.stats.positions_computed > plain.stats.positions_computed
    # a slack as long as the window keeps every position: the baseline's decoding, token for token
    plant([5, 10, W])
    whole = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, guard=False, slack=W))
    assert whole.responses.tolist() == generate(model, ids, gen=gen).responses.tolist()


@pytest.mark.usefixtures("reference_kernels")
def test_slack_with_the_end_probability_probe_and_the_combination(plant, scripted):
    model = scripted(tiny("lavida-llada"), [[20, 21, 22], [30, 31, 32, 33, 34, 35]])
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    gen = GenerationConfig(gen_length=W, tie_break="stable")
    base = generate(model, ids, gen=gen)
    eos = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, probe="eos_prob", slack=2))
    st = eos.stats.extra["seer"]
    assert st["boundary"] == [3, 6] and st["keep_len"] == [6, 9]
    assert [eos.answer_ids(i) for i in range(2)] == [base.answer_ids(i) for i in range(2)]
    # `both`: request 0's sparsity cut (10, +1 slack: 11) is tightened to its end token at 3
    # (+1: 5); request 1's (3, +1: 4) holds no end-like position: premature, re-extended to
    # the next boundary 9, +1
    plant(first=[10, 3], later=[9])
    both = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, probe="both", slack=1))
    st = both.stats.extra["seer"]
    assert st["premature_cuts"] == [0, 1] and st["tightened"] == [1, 0]
    assert st["keep_len"] == [5, 4] and st["final_window"] == [5, 10] and st["guard_events"] == [0, 0]
    assert [both.answer_ids(i) for i in range(2)] == [base.answer_ids(i) for i in range(2)]
    # request 1's cut at 5 is premature without a slack; a slack of 2 reaches its end token at 6:
    # confirmed (nothing premature, nothing tightened); request 0 (9 + 2) is tightened to 3 + 1 + 2
    plant(first=[9, 5], later=[9])
    wide = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, probe="both", slack=2))
    st = wide.stats.extra["seer"]
    assert st["premature_cuts"] == [0, 0] and st["tightened"] == [1, 0] and st["final_window"] == [6, 7]
    assert [wide.answer_ids(i) for i in range(2)] == [base.answer_ids(i) for i in range(2)]


@pytest.mark.usefixtures("reference_kernels")
@pytest.mark.parametrize("mode", ["extend", "redecode"])
def test_the_guard_still_recovers_an_answer_cut_inside_the_slack(mode, plant, scripted):
    model = scripted(tiny("llada-8b-instruct"), [[20, 21, 22, 23, 24, 25, 26]])  # end token at 7
    ids = torch.tensor([[5, 6, 7]])
    gen = GenerationConfig(gen_length=W, tie_break="stable")
    base = generate(model, ids, gen=gen)
    plant([3])  # 3 + 2 slack = 5 positions: still before the end token
    out = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, guard_mode=mode, slack=2))
    st = out.stats.extra["seer"]
    assert st["keep_len"] == [5] and st["guard_events"][0] >= 1
    assert out.answer_ids(0) == base.answer_ids(0)


@pytest.mark.usefixtures("reference_kernels")
@pytest.mark.parametrize("kind", ["llada-8b-instruct", "dream-v0-instruct-7b"])
def test_slack_in_a_batch_gives_each_request_what_it_gets_alone(kind, plant):
    batch = mixed_cuts_batch_and_alone(kind, plant, SeerConfig(probe_layer=1, guard=False, slack=2))
    assert batch.stats.extra["seer"]["keep_len"] == [6, W, 9]


@pytest.mark.usefixtures("reference_kernels")
def test_slack_composes_with_threshold_decoding_and_the_dual_cache(plant):
    model = tiny("llada-8b-instruct", seed=2)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    fast = GenerationConfig(gen_length=W, block_length=4, tie_break="stable", threshold=0.3)
    for gen in (fast, fast.replace(block_cache="dual")):
        plant([5, 9])
        out = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, guard=False, slack=2))
        assert out.stats.extra["seer"]["keep_len"] == [7, 11]
        assert (out.responses[0, 7:] == model.token_ids.eos).all() and (out.responses != model.token_ids.mask).all()


def test_slack_validation_and_json(tmp_path):
    with pytest.raises(ValueError, match="slack must be an int >= 0"):
        SeerConfig(slack=-1)
    for bad in (1.5, True, "4"):
        with pytest.raises(TypeError, match="slack must be an int"):
            SeerConfig(slack=bad)
    cfg = SeerConfig(probe="eos_prob", eos_threshold=0.9, slack=16, guard_mode="redecode")
    cfg.to_json(tmp_path / "s.json")
    assert SeerConfig.from_json(tmp_path / "s.json") == cfg
    stored = cfg.to_dict()
    del stored["slack"]  # a file written before the option: the default, the paper's cut
    assert SeerConfig.from_dict(stored).slack == 0
