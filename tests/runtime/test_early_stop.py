"""Early stop at the end token (``GenerationConfig(early_stop=True)``): a request ends on the step
that commits an end token with every earlier window position committed. For every family and
every mode the engine composes (tests/runtime/workloads.py: Seer's probes, DyLLM, the router,
threshold decoding, block caches, CFG, every commit rule, graph replays), batched, the answers
equal those of running every step, no request runs more steps or forwards, the positions after
the end token come back as EOS, and the statistics say what was saved."""

from __future__ import annotations

import pytest
import torch

from seer_runtime import GenerationConfig, generate
from seer_runtime.batch import first_end_positions
from seer_runtime.graphs import RecordingGraphBackend
from tests.runtime.workloads import KINDS, batch, modes
from tests.tiny_models import tiny

pytestmark = pytest.mark.usefixtures("reference_kernels")  # the decoding is under test, not the kernels

#: how each tiny model is made to end its answers inside the window (random weights rarely pick an
#: end token): its end-of-turn row of the LM head scaled, or set to the row of the token its
#: baseline picks most (the end token then wins where that token would)
ENDING = {"llada-8b-instruct": 3.0, "mmada-8b": "common", "dream-v0-instruct-7b": 3.0, "lavida-llada": 2.0,
          "lavida-dream": "common"}


def ending_model(kind: str):
    model = tiny(kind)
    head = model._lm_head_weight()
    with torch.no_grad():
        if ENDING[kind] == "common":
            ids, mask, images = batch(model)
            gen, _ = modes(model)["baseline"]
            out = generate(model, ids, attention_mask=mask, images=images, gen=gen, graphs=None)
            head[model.token_ids.eot] = head[torch.mode(out.responses.flatten()).values.item()] * 1.02
        else:
            for t in model.token_ids.end_ids:
                head[t] *= ENDING[kind]
    return model


@pytest.fixture(scope="module", params=KINDS)
def model(request):
    return ending_model(request.param)


def _decode(model, gen, kwargs):
    ids, mask, images = batch(model)
    kwargs = dict(kwargs)
    if kwargs.get("graphs") == "fake":
        kwargs["graphs"] = RecordingGraphBackend()
    kwargs.setdefault("graphs", None)
    return generate(model, ids, attention_mask=mask, images=images, gen=gen, **kwargs)


def test_every_mode_keeps_the_answers(model):
    saved_somewhere = []
    for name, (gen, kwargs) in modes(model).items():
        if gen.early_stop:
            continue
        if gen.seed is not None:  # random draws: from each request's own generator (a global one's
            gen = gen.replace(rng="per_request")  # draws depend on which requests still run)
        full = _decode(model, gen, kwargs)
        early = _decode(model, gen.replace(early_stop=True), kwargs)
        for i in range(full.responses.shape[0]):
            assert early.answer_ids(i) == full.answer_ids(i), (name, i)
        assert all(e <= f for e, f in zip(early.stats.steps, full.stats.steps)), name
        assert early.stats.nfe <= full.stats.nfe and early.stats.positions_computed <= full.stats.positions_computed
        assert full.stats.steps_saved == [0] * 4
        for i, saved in enumerate(early.stats.steps_saved):
            if saved:  # ended early: its answer ends, EOS after the end token
                end = int(early.end_positions[i])
                assert end >= 0 and (early.responses[i, end + 1:] == model.token_ids.eos).all(), (name, i)
        saved_somewhere.append(sum(early.stats.steps_saved))
    assert saved_somewhere[0] > 0  # the baseline ends some request early on this model


def test_steps_saved_are_the_steps_not_run(model):
    """Fixed-count plans: each request's steps with early stop plus its steps saved are the steps
    of running every step; forwards fall by the steps no request needed."""
    gen, _ = modes(model)["baseline"]
    full = _decode(model, gen, {})
    early = _decode(model, gen.replace(early_stop=True), {})
    assert [s + d for s, d in zip(early.stats.steps, early.stats.steps_saved)] == full.stats.steps
    assert early.stats.nfe == full.stats.nfe - (max(full.stats.steps) - max(early.stats.steps))
    assert any(early.stats.steps_saved)


def test_sampled_requests_keep_their_answers(model):
    """With temperature and per-request generators a request draws the same whatever else stopped."""
    gen, _ = modes(model)["baseline"]
    gen = gen.replace(temperature=0.7, rng="per_request", seed=11)
    full = _decode(model, gen, {})
    early = _decode(model, gen.replace(early_stop=True), {})
    assert [early.answer_ids(i) for i in range(4)] == [full.answer_ids(i) for i in range(4)]


def test_a_complete_answer_is_recognised_on_the_device():
    """The rule itself: an end token before the first masked position, in the live window only."""
    model = ending_model("llada-8b-instruct")
    ids, mask, _ = batch(model)
    from seer_runtime.generation import prepare

    scheduler = prepare(model, ids, attention_mask=mask, gen=GenerationConfig(gen_length=8, early_stop=True),
                        graphs=None)
    try:
        t, state = model.token_ids, scheduler.state
        M, E, T = t.mask, t.eos, t.eot
        state.tokens[:] = torch.tensor([[5, E, M, M, M, M, M, M],    # end, all before committed
                                        [M, E, 5, 5, 5, 5, 5, 5],    # a mask before the end token
                                        [5, 6, 7, 8, 9, 5, 6, T],    # end of turn at the last position
                                        [5, 6, M, 8, 9, 5, 6, 7]])   # no end token
        assert scheduler.answer_complete([0, 1, 2, 3]).tolist() == [True, False, True, False]
        state.window.set(2, 6)  # a cut window: the end of turn is outside it
        assert scheduler.answer_complete([2]).tolist() == [False]
        assert first_end_positions(state.tokens, t.end_ids).tolist() == [1, 1, 7, -1]
    finally:
        scheduler.release()


def test_early_stop_must_be_a_bool():
    with pytest.raises(TypeError, match="early_stop must be a bool"):
        GenerationConfig(early_stop=1)


def test_run_requests_keeps_each_requests_steps_and_steps_saved():
    """``RunResult.steps`` / ``steps_saved``: per request, in request order, over batches."""
    from seer_runtime.evaluate import Request, run_requests

    model = ending_model("llada-8b-instruct")
    ids, mask, _ = batch(model)
    prompts = [row[m.bool()].tolist() if m is not None else row.tolist()
               for row, m in zip(ids, mask if mask is not None else [None] * len(ids))]
    requests = [Request(p, None, None) for p in prompts]
    gen, _ = modes(model)["baseline"]
    full = run_requests(model, requests, gen, batch_size=3, graphs=None)
    early = run_requests(model, requests, gen.replace(early_stop=True), batch_size=3, graphs=None)
    assert early.answers == full.answers and len(early.steps) == len(requests) == len(early.steps_saved)
    assert full.steps_saved == [0] * len(requests) and any(early.steps_saved)
    assert [s + d for s, d in zip(early.steps, early.steps_saved)] == full.steps
