"""The runtime's pieces alone (the end-to-end oracles are in test_engine.py and test_parallel_decoding.py):
the window state and its masks, the commit rules, the scheduler's window changes and its one read,
and what a call is composed of."""

from __future__ import annotations

import warnings

import pytest
import torch

from seer_runtime import DyLLMConfig, GenerationConfig, Policy
from seer_runtime.block_cache import BlockCacheLayouts
from seer_runtime.commit import DreamRule, LLaDARule, ThresholdRule
from seer_runtime.generation import prepare
from seer_runtime.runner import PaddedLayouts
from seer_runtime.serving.routed import RoutedLayouts
from seer_runtime.serving.router import RouterConfig
from seer_runtime.window import Extend, Redecode, WindowState

from ..tiny_models import tiny

pytestmark = [pytest.mark.engine]

IDS = torch.tensor([[5, 6, 7], [8, 9, 10]])


def call(kind="llada-8b-instruct", **kw):
    gen = kw.pop("gen", GenerationConfig(gen_length=8, block_length=4, steps=8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return prepare(tiny(kind), IDS, gen=gen, graphs=None, **kw)


# ------------------------------------------------------------------------------------ window state
def test_window_lengths_and_masks_follow_every_change():
    w = WindowState(2, 8, torch.device("cpu"), block=4)
    assert w.lengths == [8, 8] and w.masks.left(0) == 8 and w.masks.left(0, 4, 8) == 4
    w.set(0, 3)  # a cut: the lost positions were masks
    assert w.lengths == [3, 8] and w.masks.left(0) == 3 and w.version == 1
    assert torch.equal(w.live_mask(torch.tensor([0, 1]), 4), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool())
    assert w.masks.commit(0, 0, 5) == 3 and w.masks.left(0) == 0  # at most the masks its block has
    w.set(0, 6)  # an extension: fresh masks
    assert w.masks.left(0) == 3 and w.masks.left(0, 4, 8) == 2
    w.reset(0)
    assert w[0] == 8 and w.masks.left(0) == 8
    with pytest.raises(ValueError, match="a window keeps 1..8 positions"):
        w.set(1, 0)


# ------------------------------------------------------------------------------------ commit rules
def test_each_request_is_composed_with_its_family_rule():
    assert isinstance(call().rule, LLaDARule)
    assert isinstance(call("dream-v0-instruct-7b", gen=GenerationConfig(gen_length=8)).rule, DreamRule)
    fast = GenerationConfig(gen_length=8, block_length=4, threshold=0.5)
    assert isinstance(call(gen=fast).rule, ThresholdRule)


def test_llada_choices_hold_in_a_graph_only_when_greedy():
    s = call()
    choice = s.rule.choice(s.state, [0, 1], 0)
    assert choice is not None and choice.detail == ("llada", (1, 1), ((0, 4), (0, 4)))
    for gen in (GenerationConfig(gen_length=8, block_length=4, steps=8, temperature=0.5),
                GenerationConfig(gen_length=8, block_length=4, steps=8, remasking="random")):
        s = call(gen=gen)
        assert s.rule.choice(s.state, [0, 1], 0) is None


def test_llada_commits_are_counted_on_the_host():
    s = call()
    logits = torch.randn(2, 8, s.runner.model.vocab_size)
    s.rule.commit(s.state, [0, 1], 0, logits)
    assert s.state.window.masks.left(0) == 7 and s.rule.step_reads(s.state) is None  # nothing to read back
    assert int((s.state.tokens == s.state.token_ids.mask).sum()) == 14


def test_dream_counts_its_commits_by_the_masks_left_read_once():
    s = call("dream-v0-instruct-7b", gen=GenerationConfig(gen_length=8, steps=4, alg="entropy", tie_break="stable"))
    per_row = s.state.window.masks.window_left([0, 1])
    # int(8 * (1 - s / t)) at the first of 4 steps of linspace(1, 1e-3, 5): 8 * 0.24975 -> 1
    assert s.rule.counts(s.state, [0, 1], 0, per_row) == [1, 1]
    choice = s.rule.choice(s.state, [0, 1], 0)
    assert choice.detail == ("dream", "per-row")  # the counts live in a buffer, not the key
    left = choice.choose(torch.randn(2, 8, s.runner.model.vocab_size))
    choice.commit(left)
    assert s.state.window.masks.pending and s.rule.step_reads(s.state)["masks_left"] is left
    s.rule.after_read(s.state, 0, {"masks_left": left.tolist()})
    assert not s.state.window.masks.pending and s.state.window.masks.window_left([0, 1]) == [7, 7]
    origin = call("dream-v0-instruct-7b", gen=GenerationConfig(gen_length=8, steps=4))
    assert origin.rule.choice(origin.state, [0, 1], 0) is None  # origin draws which positions commit


def test_threshold_plans_one_block_step_at_a_time_and_ends_a_stalled_block():
    s = call(gen=GenerationConfig(gen_length=8, block_length=4, threshold=0.5))
    state, rule = s.state, s.rule
    assert [(p.block_starts, p.block_ends) for p in state.plans] == [([0], [4]), ([0], [4])]
    state.window.masks.set_block_left(0, 0, 0)  # request 0's first block is done
    assert rule.after_step(state, 0)
    assert state.plans[0].block_starts == [0, 4] and state.plans[1].block_starts == [0, 0]
    rule._read_later(state, [1], torch.tensor([4]), 1)  # a step that left request 1's block as it was
    with pytest.warns(RuntimeWarning, match="request 1 committed only its mask token at step 1"):
        rule.after_read(state, 1, {"masks_left": [4]})
    assert state.window.masks.left(1, 0, 4) == 0  # the block ends, its masks stay in the answer


# ------------------------------------------------------------------------------------ the scheduler
def test_window_changes_extend_and_redecode_from_the_next_step():
    s = call()
    state = s.state
    state.window.set(0, 3)
    s.plan_cut(type("Cut", (), {"lengths": {0: 3}})())
    assert state.plans[0].steps == 3 and state.plans[0].block_ends == [3, 3, 3]  # the cut block keeps the rate
    assert not s.apply([Extend(0, 2)], 1)  # nothing to add
    assert s.apply([Extend(0, 6)], 1) and state.window[0] == 6
    assert state.plans[0].block_starts[-2:] == [4, 4]  # the extension's own steps after the kept ones
    state.tokens[1, :2] = 7
    assert s.apply([Redecode(1)], 1) and state.window[1] == 8
    assert bool((state.tokens[1] == state.token_ids.mask).all()) and state.plans[1].steps == 2 + 8


def test_the_step_reads_everything_in_one_transfer_and_refuses_a_name_asked_twice():
    class Asks(Policy):
        def step_reads(self, state, step):
            return {"mine": torch.tensor([step, 1])}

    s = call(policies=[Asks()])
    assert s.read(3) == {"mine": [3, 1]}
    twice = call(policies=[Asks(), Asks()])
    with pytest.raises(ValueError, match="step value 'mine' is asked for twice"):
        twice.read(0)


def test_a_policy_cut_before_step_zero_is_planned_by_the_scheduler():
    from bench.workloads import OracleCut

    s = call(policies=[OracleCut([2, 5])])
    assert s.state.window.lengths == [2, 5] and [p.steps for p in s.state.plans] == [2, 5]


# ------------------------------------------------------------------------------------ composition
def test_the_layout_is_picked_once_and_the_capabilities_checked():
    assert isinstance(call().runner.layouts, PaddedLayouts)
    assert isinstance(call(router=RouterConfig.for_window(8, max_batch=2)).runner.layouts, RoutedLayouts)
    cached = GenerationConfig(gen_length=8, block_length=4, steps=8, block_cache="dual")
    assert isinstance(call(gen=cached).runner.layouts, BlockCacheLayouts)
    with pytest.raises(ValueError, match=r"composes with neither DyLLM .*'router'"):
        call(gen=cached, router=True)
    with pytest.raises(ValueError, match=r"composes with neither DyLLM .*'dyllm'"):
        call(gen=cached, dyllm=DyLLMConfig())
    with pytest.raises(ValueError, match="cfg_scale: dyllm does not support classifier-free guidance"):
        call(gen=GenerationConfig(gen_length=8, block_length=4, steps=8, cfg_scale=1.0), dyllm=DyLLMConfig())
    routed = call(router=True, dyllm=DyLLMConfig())
    assert routed.runner.layouts.padded_only  # DyLLM's caches are laid out per padded row
