"""Forwards replayed from graphs (``seer_runtime.graphs``): the first forward of a key runs
eagerly, the second is captured, later ones replay; a replay re-runs no Python. With the
recording backend (a CUDA graph's semantics on the CPU: recorded ops re-executed, host decisions
frozen, host reads refused during a capture) every family and mode decodes token for token what
it decodes eagerly, with the same statistics."""

from __future__ import annotations

import warnings

import pytest
import torch

from seer_kernels import emulate_device, kernel_backend
from seer_runtime import generate
from seer_runtime.commit import DreamRule
from seer_runtime.graphs import Graphs, RecordingGraphBackend, resolve_backend
from seer_runtime.plans import DecodingRules

from ..tiny_models import tiny
from .workloads import KINDS, batch, modes

pytestmark = [pytest.mark.engine]


def _decode(model, gen, kw, graphs):
    ids, mask, images = batch(model)
    kw = {**kw, "graphs": graphs}
    with kernel_backend("reference"), emulate_device(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return generate(model, ids, attention_mask=mask, images=images, gen=gen, **kw)


@pytest.mark.parametrize("kind", KINDS)
def test_replayed_forwards_decode_what_eager_ones_do(kind):
    model = tiny(kind)
    replayed = 0
    for name, (gen, kw) in modes(model).items():
        eager = _decode(model, gen, kw, None)
        backend = RecordingGraphBackend()
        graphed = _decode(model, gen, kw, backend)
        assert torch.equal(eager.sequences, graphed.sequences), f"{kind} {name}: sequences differ"
        a, b = eager.stats, graphed.stats
        assert (a.nfe, a.positions_computed, a.positions_computed_per_request, a.steps) == (
            b.nfe, b.positions_computed, b.positions_computed_per_request, b.steps), f"{kind} {name}: statistics differ"
        for policy in ("seer", "dyllm", "router"):
            assert a.extra.get(policy) == b.extra.get(policy), f"{kind} {name}: {policy} statistics differ"
        assert len(set(backend.captured)) == len(backend.captured), "each key is captured once"
        replayed += len(backend.replayed)
        if name in ("baseline", "dyllm:partial", "cut+router:packed"):
            assert backend.replayed, f"{kind} {name}: steady forwards must replay"
        if name == "cut+router:packed":  # the router's packed groups hold the step's token choice
            chosen = [k for k in backend.replayed if k[0] == "packed" and k[3] in ("llada", "dream")]
            assert chosen, f"{kind} {name}: no packed unit with its token choice replayed"
        if name == "cut+router:static":  # a static group's choice replays after its bucket's forward
            chosen = [k for k in backend.replayed if isinstance(k, tuple) and k[0] == "bucket+chosen"]
            assert chosen, f"{kind} {name}: no static group's token choice replayed"
    assert replayed > 50


def test_a_key_runs_eagerly_then_is_captured_then_replays():
    backend = RecordingGraphBackend()
    graphs = Graphs(backend)
    state = torch.zeros(3)
    calls = []

    def forward():
        calls.append(1)  # Python: runs at the first sight and the capture only
        state.add_(1.0)
        return state * 2

    outs = [graphs.run(("k",), forward).clone() for _ in range(4)]
    assert len(calls) == 2 and backend.captured == [("k",)] and len(backend.replayed) == 2
    assert [float(o[0]) for o in outs] == [2.0, 4.0, 6.0, 8.0]  # the replays re-ran the device work
    assert graphs.counters.as_dict() == {"eager_runs": 1, "captures": 1, "replays": 2, "failures": 0,
                                         "evictions": 0}
    assert graphs.run(None, forward) is not None and len(calls) == 3  # no key: always eager


def test_a_capture_that_reads_the_host_fails_loudly():
    graphs = Graphs(RecordingGraphBackend())
    x = torch.ones(2)
    graphs.run("k", lambda: x * int(x.sum()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(RuntimeError, match="not capturable"):
            graphs.run("k", lambda: x * int(x.sum()))
    assert graphs.counters.failures == 1


def test_graphs_are_bounded_and_released():
    backend = RecordingGraphBackend()
    graphs = Graphs(backend, max_graphs=2)
    x = torch.ones(1)
    for key in range(4):
        for _ in range(2):
            graphs.run(key, lambda: x + 1)
    assert backend.released == [0, 1] and graphs.counters.evictions == 2
    graphs.clear()
    assert backend.released == [0, 1, 2, 3] and len(graphs) == 0


def test_backend_choice():
    assert resolve_backend(None, torch.device("cpu")) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert resolve_backend("auto", torch.device("cpu")) is None
    recording = RecordingGraphBackend()
    assert resolve_backend(recording, torch.device("cpu")) is recording
    with pytest.raises(ValueError, match="graphs must be"):
        resolve_backend("cuda-please", torch.device("cpu"))
    with pytest.raises(ValueError, match="graphs='cuda' needs a CUDA device"):
        resolve_backend("cuda", torch.device("cpu"))
    with pytest.raises(TypeError, match="lacks the method"):
        resolve_backend(object(), torch.device("cpu"))
    with pytest.raises(ValueError, match="max_graphs"):
        Graphs(None, max_graphs=0)


@pytest.mark.parametrize("kind", ["dream-v0-instruct-7b", "lavida-dream"])
def test_dream_steps_replay_their_token_choice_with_the_forward(kind):
    """A greedy Dream step is one graph unit (forward and token choice;
    ``commit.DreamRule.choice``) when its rows commit the same number of positions, or with
    ``tie_break="stable"`` any numbers: same tokens as eager for every ranking, tie-break and
    commit count. Where the choice needs a ranking per row (LaViDa-Dream ranks the masked
    positions only, with ``torch.topk``'s ties) or a draw, it runs eagerly."""
    model = tiny(kind)
    base = modes(model)["baseline"][0]
    for alg in ("entropy", "topk_margin", "maskgit_plus"):
        for tie_break in ("stable", "reference"):
            for steps in (base.gen_length, base.gen_length // 2):
                gen = base.replace(alg=alg, tie_break=tie_break, steps=steps)
                eager = _decode(model, gen, {}, None)
                backend = RecordingGraphBackend()
                graphed = _decode(model, gen, {}, backend)
                where = f"{kind} {alg} {tie_break} steps={steps}"
                assert torch.equal(eager.sequences, graphed.sequences), where
                assert (eager.stats.nfe, eager.stats.steps) == (graphed.stats.nfe, graphed.stats.steps), where
                units = [key for key in backend.captured if key[:2] == ("padded", "dream")]
                if tie_break == "reference" and DecodingRules.of(model).ranks_masked_only:
                    assert not units, where
                else:
                    assert units and backend.replayed, where
    sampled = _decode(model, base.replace(temperature=0.5), {}, backend := RecordingGraphBackend())
    assert sampled.sequences.shape[0] and not [key for key in backend.captured if key[:2] == ("padded", "dream")]


@pytest.mark.parametrize("kind", ["dream-v0-instruct-7b", "lavida-dream"])
def test_dream_rows_with_their_own_counts_replay_their_choice(kind, monkeypatch):
    """Rows cut to different windows commit different numbers of positions at some Dream steps;
    with ``tie_break="stable"`` such a step is still one graph unit, its counts read from a
    buffer (no count in the key: one graph per layout), and it decodes the eager tokens, padded
    and routed. Before, each such step sampled eagerly."""
    from bench.workloads import OracleCut

    steps_seen = {}  # step -> [rows commit different counts, the choice ran Python]
    current = []
    choice_of, choose, commit = DreamRule.choice, DreamRule._choose, DreamRule.commit

    def watched_choice(self, state, rows, step):
        counts = self.counts(state, rows, step, state.window.masks.window_left(rows))
        choice = choice_of(self, state, rows, step)
        current[:] = [step]
        steps_seen[step] = [choice is not None and len(set(counts)) > 1, False]
        return choice

    def ran(method):
        def run(self, *args, **kwargs):
            if current:  # (the eager decode chooses no unit: it never asks for the choice)
                steps_seen[current[0]][1] = True  # a replayed unit runs no Python
            return method(self, *args, **kwargs)
        return run

    monkeypatch.setattr(DreamRule, "choice", watched_choice)
    monkeypatch.setattr(DreamRule, "_choose", ran(choose))
    monkeypatch.setattr(DreamRule, "commit", ran(commit))
    model = tiny(kind)
    base = modes(model)["baseline"][0]
    router = modes(model)["cut+router:packed"][1]["router"]
    replayed_differing = 0
    for steps in (base.gen_length, base.gen_length // 2, base.gen_length // 4):
        for cut in ([2, 16, 9, 5], [16, 12, 16, 12]):
            for extra in ({}, {"router": router}):
                gen = base.replace(steps=steps)
                kw = {"policies": [OracleCut(cut)], **extra}
                eager = _decode(model, gen, kw, None)
                steps_seen.clear()
                current.clear()
                graphed = _decode(model, gen, kw, RecordingGraphBackend())
                where = f"{kind} steps={steps} cut={cut} {'routed' if extra else 'padded'}"
                assert torch.equal(eager.sequences, graphed.sequences), where
                assert (eager.stats.nfe, eager.stats.steps) == (graphed.stats.nfe, graphed.stats.steps), where
                replayed_differing += sum(differ and not python for differ, python in steps_seen.values())
    assert replayed_differing >= 4, "steps whose rows commit different counts must replay their choice"


@pytest.mark.parametrize("kind", ["llada-8b-instruct", "dream-v0-instruct-7b"])
def test_played_back_replays_decode_the_recorded_tokens_and_need_their_writes(kind):
    """bench/bench_host_overhead.py times a replayed step's host work with replays that write back
    what a recorded decode's replays left. Played back, the decode is the recorded one token for
    token; with the writes dropped it is not (the host's next step reads the replay's results)."""
    from bench.bench_host_overhead import PlaybackGraphBackend

    model = tiny(kind)
    gen, kw = modes(model)["dyllm:partial"]
    recorder = PlaybackGraphBackend()
    recorded = _decode(model, gen, kw, recorder)
    assert recorder.tape, "steady forwards must replay"
    played = _decode(model, gen, kw, PlaybackGraphBackend(recorder.tape))
    assert torch.equal(played.sequences, recorded.sequences)
    emptied = [(key, [torch.zeros_like(v) for v in values]) for key, values in recorder.tape]
    with pytest.raises((AssertionError, RuntimeError)):  # a diverging decode, or the playback noticing
        assert torch.equal(_decode(model, gen, kw, PlaybackGraphBackend(emptied)).sequences, recorded.sequences)
