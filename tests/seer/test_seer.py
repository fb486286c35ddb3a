"""Issue: Seer end to end. The mechanics on tiny models: the cut is honoured, later layers and
steps see only L* positions, over-truncation is detected and recovered, probes and their
combination, prefix cache and blocks, batches with mixed L*."""

from __future__ import annotations

import pytest
import torch

import seer_kernels
from seer_runtime import GenerationConfig, LayerHook, Policy, generate
from seer_runtime.seer import SeerConfig

from ..tiny_models import tiny
from .conftest import W, mixed_cuts_batch_and_alone

pytestmark = [pytest.mark.seer]


class LayerInputs(Policy):
    """Records (step, layer, positions of the layer's input) of every layer that runs."""

    replayable = False

    def __init__(self):
        self.seen = []

    def layers(self, state, fwd):
        seen = self.seen

        class Record(LayerHook):
            def taps(self, layer, taps):
                seen.append((fwd.step, layer, fwd.hidden.shape[1]))

        return Record()


@pytest.mark.usefixtures("reference_kernels")
@pytest.mark.parametrize("kind", ["llada-8b-instruct", "dream-v0-instruct-7b", "lavida-llada", "lavida-dream"])
def test_cut_is_honoured_and_later_layers_see_only_the_survivors(kind, plant, monkeypatch):
    model = tiny(kind)
    calls = plant([5, 7])
    recorder = LayerInputs()
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    gen = GenerationConfig(gen_length=W, tie_break="stable", block_length=4 if model.family == "llada" else None)
    out = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, eps=0.05, guard=False), policies=[recorder])
    seen = recorder.seen
    assert calls and calls[0][0] == (2, W), "the probe reads the sparsity of every response position"
    st = out.stats.extra["seer"]
    assert st["keep_len"] == [5, 7] and st["final_window"] == [5, 7]
    assert (out.responses[0, 5:] == model.token_ids.eos).all() and (out.responses[1, 7:] == model.token_ids.eos).all()
    assert (out.responses != model.token_ids.mask).all()
    offset = 0 if model.is_multimodal else 4  # LaViDa runs the window alone (prefix cache)
    step0 = [(i, n) for s, i, n in seen if s == 0]
    assert step0[:2] == [(0, offset + W), (1, offset + W)], "layers 0..probe_layer run the full window"
    assert all(n == offset + 7 for i, n in step0[2:]), "layers after the probe run the survivors only"
    assert all(n <= offset + 7 for s, i, n in seen if s > 0), "later steps never see the cut suffix"
    # the step schedule follows the shorter windows at the configured one-token-per-step rate
    expected_steps = [5, 7] if kind != "lavida-dream" else None
    if expected_steps:
        assert out.stats.steps == expected_steps
    assert out.stats.positions_computed < generate(model, ids, gen=gen).stats.positions_computed


@pytest.mark.usefixtures("reference_kernels")
@pytest.mark.parametrize("kind", ["llada-8b-instruct", "dream-v0-instruct-7b", "lavida-llada"])
@pytest.mark.parametrize("mode", ["extend", "redecode"])
def test_planted_over_truncation_is_detected_and_recovered(kind, mode, plant, scripted):
    model = scripted(tiny(kind), [[20, 21, 22, 23, 24, 25, 26]])  # 7 answer tokens, end token at 7
    ids = torch.tensor([[5, 6, 7]])
    gen = GenerationConfig(gen_length=W, tie_break="stable")
    base = generate(model, ids, gen=gen)
    assert base.answer_ids(0) == [20, 21, 22, 23, 24, 25, 26] and int(base.end_positions[0]) == 7
    plant([4])  # cut far before the end token
    out = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, guard_mode=mode))
    st = out.stats.extra["seer"]
    assert st["keep_len"] == [4] and st["guard_events"][0] >= 1
    assert out.answer_ids(0) == base.answer_ids(0), "the guard recovers the tail"
    unguarded = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, guard=False))
    assert unguarded.answer_ids(0) == [20, 21, 22, 23], "without the guard the tail is lost (what it prevents)"


@pytest.mark.usefixtures("reference_kernels")
def test_end_probability_probe_and_the_combination(plant, scripted):
    model = scripted(tiny("lavida-llada"), [[20, 21, 22], [30, 31, 32, 33, 34, 35]])
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    gen = GenerationConfig(gen_length=W, tie_break="stable")
    base = generate(model, ids, gen=gen)
    eos = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, probe="eos_prob"))
    st = eos.stats.extra["seer"]
    assert st["boundary"] == [3, 6] and st["keep_len"] == [4, 7]
    assert [eos.answer_ids(i) for i in range(2)] == [base.answer_ids(i) for i in range(2)]
    # the sparsity probe fires too early for request 1 (at 2) and too late for request 0 (at 9):
    # the end-of-step-0 logits re-extend request 1 to the next boundary and tighten request 0
    plant(first=[10, 3], later=[9])  # the re-scan runs per premature request
    both = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, probe="both"))
    st = both.stats.extra["seer"]
    assert st["premature_cuts"] == [0, 1] and st["tightened"] == [1, 0]
    assert st["keep_len"] == [4, 3] and st["final_window"] == [4, 9] and st["guard_events"] == [0, 0]
    assert [both.answer_ids(i) for i in range(2)] == [base.answer_ids(i) for i in range(2)]


@pytest.mark.usefixtures("reference_kernels")
@pytest.mark.parametrize("kind", ["llada-8b-instruct", "lavida-llada", "dream-v0-instruct-7b", "lavida-dream"])
def test_batch_with_mixed_cuts_gives_each_request_what_it_gets_alone(kind, plant):
    mixed_cuts_batch_and_alone(kind, plant, SeerConfig(probe_layer=1, guard=False))


def test_seer_through_the_triton_kernels_in_the_interpreter():
    """The probe reads the tap through the fused SwiGLU+sparsity kernel and the scan kernel."""
    model = tiny("llada-8b-instruct")
    ids = torch.tensor([[5, 6, 7]])
    gen = GenerationConfig(gen_length=8, tie_break="stable")
    # eps larger than every activation: sparsity 1 everywhere, a flat profile never fires
    flat = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=0, eps=1e9))
    assert flat.stats.extra["seer"]["keep_len"] == [8] and flat.stats.extra["seer"]["boundary"] == [None]
    with seer_kernels.kernel_backend("reference"):
        ref = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, eps=0.02))
    tri = generate(model, ids, gen=gen, seer=SeerConfig(probe_layer=1, eps=0.02))
    assert tri.stats.extra["seer"]["keep_len"] == ref.stats.extra["seer"]["keep_len"]


def test_seer_config_validation_and_json(tmp_path):
    with pytest.raises(ValueError, match="tau_jump must be > 0"):
        SeerConfig(tau_jump=0)
    with pytest.raises(ValueError, match="probe must be one of"):
        SeerConfig(probe="magic")
    with pytest.raises(ValueError, match="eps has 1 values for 2 probe layers"):
        SeerConfig(probe_layer=4, probe_layers=(3, 4), eps=(0.1,))
    with pytest.raises(ValueError, match="guard_mode"):
        SeerConfig(guard_mode="pray")
    cfg = SeerConfig(probe_layer=4, probe_layers=(2, 4), eps=(0.1, 0.2), probe="both")
    cfg.to_json(tmp_path / "s.json", calibration={"note": "kept beside"})
    assert SeerConfig.from_json(tmp_path / "s.json") == cfg
    with pytest.raises(ValueError, match=r"probe layer\(s\) \[7\] out of range"):
        generate(tiny("llada-8b-instruct"), torch.tensor([[5]]), gen=GenerationConfig(gen_length=4),
                 seer=SeerConfig(probe_layer=7))
    with pytest.raises(TypeError, match="seer must be a SeerConfig"):
        generate(tiny("llada-8b-instruct"), torch.tensor([[5]]), gen=GenerationConfig(gen_length=4), seer={"x": 1})
