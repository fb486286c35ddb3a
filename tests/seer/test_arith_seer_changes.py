"""bench/arith_seer_changes: the configuration grammar, the commit recorder on a tiny model, and
the tables on a run whose answers are known (what the RESULTS figures of issue 34 item 4 rest on)."""

from __future__ import annotations

import pytest
import torch

from bench.arith_seer_changes import (
    CommitTrace,
    changed_table,
    choices_table,
    distance_table,
    divergence_table,
    first_difference,
    margin_table,
    parse_config,
)
from seer_runtime import GenerationConfig, generate
from seer_runtime.seer import SeerConfig

from ..tiny_models import tiny

pytestmark = [pytest.mark.seer]

SHIPPED = SeerConfig(probe="eos_prob", eos_threshold=0.8, guard_mode="redecode")
GEN = GenerationConfig(gen_length=16, steps=16, block_length=8, tie_break="stable")


def test_configuration_names():
    assert parse_config("baseline", shipped=SHIPPED, gen=GEN, threshold=0.9) == (GEN, None)
    gen, seer = parse_config("threshold", shipped=SHIPPED, gen=GEN, threshold=0.7)
    assert seer is None and gen.threshold == 0.7 and gen.steps is None
    gen, seer = parse_config("seer,slack=8,eos_threshold=0.95+threshold", shipped=SHIPPED, gen=GEN, threshold=0.9)
    assert gen.threshold == 0.9 and seer == SHIPPED.replace(slack=8, eos_threshold=0.95)
    assert parse_config("seer,probe=both", shipped=SHIPPED, gen=GEN, threshold=0.9)[1].probe == "both"
    for bad in ("bogus", "seer,slack", "seer,=3", "baseline+threshold"):
        with pytest.raises(ValueError, match="configuration"):
            parse_config(bad, shipped=SHIPPED, gen=GEN, threshold=0.9)
    with pytest.raises(ValueError, match="unexpected keyword argument 'slak'"):
        parse_config("seer,slak=8", shipped=SHIPPED, gen=GEN, threshold=0.9)
    with pytest.raises(ValueError, match="slack must be an int >= 0"):
        parse_config("seer,slack=-1", shipped=SHIPPED, gen=GEN, threshold=0.9)


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2, "the shorter answer's end token is where they part"


@pytest.mark.usefixtures("reference_kernels")
def test_commit_trace_records_each_commit_once():
    model = tiny("llada-8b-instruct")
    trace = CommitTrace()
    out = generate(model, torch.tensor([[5, 6, 7], [8, 9, 10]]), gen=GEN, policies=[trace])
    for b in range(2):
        commits = trace.commits[b]
        assert sorted(c[1] for c in commits) == list(range(16)), "every window position committed once"
        assert [c[0] for c in commits] == list(range(16)), "one commit per step"
        for step, j, token, p_token, p_second, second, other in commits:
            assert token == int(out.responses[b, j])
            assert 0 < p_second <= p_token <= 1 and second != token
            assert other <= p_token + 1e-6, "low-confidence remasking commits the block's most confident position"
            assert (other == -1.0) == (step % 8 == 7), "no other masked position left for a block's last commit"


def _record(answer, end, right, steps, *, keep=None, final_window=None, commits=None):
    rec = {"answer": answer, "end": end, "right": right, "steps": steps, "positions": 10 * steps}
    if keep is not None:
        rec.update(keep=keep, boundary=keep - 1, final_window=final_window or keep, guard_events=0)
    if commits is not None:
        rec["commits"] = commits
    return rec


def _run():
    """Four requests, window 64 (blocks of 32): the baseline and a Seer run that rewords request 1
    (parting at step 1 by position, 10 kept after the end: right->wrong), ends request 2 at its cut
    (parting at step 3 by token, the baseline's runner-up; wrong->right: a margin guard would
    re-decode it back to wrong), keeps request 0's answer and leaves request 3 uncut."""
    c = [[0, 0, 7, 0.9, 0.05, 8, 0.5], [1, 1, 7, 0.6, 0.3, 9, 0.58], [2, 2, 7, 0.8, 0.1, 9, 0.2]]
    base = [_record([7, 7], 2, True, 64, commits=c[:2]), _record([7, 7, 7], 3, True, 64, commits=c),
            _record([7, 7, 7], 3, False, 64, commits=c + [[3, 3, 2, 0.55, 0.4, 5, -1.0]]),
            _record([7] * 50, 50, True, 64, commits=c)]
    parted = [c[0], [1, 2, 8, 0.62, 0.3, 9, 0.6], [2, 1, 7, 0.8, 0.1, 9, 0.2]]
    seer = [_record([7, 7], 2, True, 10, keep=10, commits=c[:2]),
            _record([7, 8, 7], 3, False, 14, keep=14, commits=parted),
            _record([7, 7, 7, 5], 4, True, 5, keep=5, commits=c + [[3, 3, 5, 0.5, 0.45, 2, -1.0]]),
            _record([7] * 50, 50, True, 64, keep=64, commits=c)]
    batch = {"baseline": {"wall_s": 8.0, "nfe": 65, "positions_computed": 4000, "records": base},
             "seer": {"wall_s": 2.0, "nfe": 15, "positions_computed": 1000, "records": seer}}
    return {"requests": 4, "batch_size": 4, "threshold": 0.9, "configs": ["seer"], "window": 64, "threads": 1,
            "batches": [batch]}


def test_tables_on_a_run_with_known_answers():
    run = _run()
    text, figures = choices_table(run)
    f = figures["seer"]
    assert (f["accuracy"], f["right_to_wrong"], f["wrong_to_right"], f["p_value"]) == (0.75, 1, 1, 1.0)
    assert f["differ"] == 2 and f["over_truncated"] == 0 and f["lost"] == 0
    assert f["speedup"] == 4.0 and f["ideal"] == 4.0 and f["forwards_per_request"] == (10 + 14 + 5 + 64) / 4
    assert "| seer | 0.750 | 1 / 1 |" in text
    rows = distance_table(run).splitlines()
    # request 1 keeps 10 after its end (8-15), request 2 keeps 1 (0-3), request 0 keeps 7 (4-7)
    assert rows[2] == "| seer |  | 1/1 (0/1) | 0/1 (0/0) | 1/1 (1/0) |  |  | 0/1 (0/0) |"
    assert "| seer | 2 | 0 | 0 | 1 | 1 |" in changed_table(run)
    sim = {line.split(" | ")[0]: line for line in margin_table(run).splitlines()}
    # margin 1 re-decodes request 2 only (its end token is the last kept position)
    assert sim["| seer, margin 1"].startswith("| seer, margin 1 | 1 | 0 | 1 | 0.500 | 1 / 0 |")
    assert sim["| seer, margin 8"].startswith("| seer, margin 8 | 2 | 0 | 1 | 0.500 | 1 / 0 |")
    parted = divergence_table(run).splitlines()
    assert parted[3] == "| seer | 2 | 1 / 1 | 1 | 0.020 | 0.150 | 0.50 | 0 | 2.0 | 0 |"
    untraced = {**run, "batches": [{name: dict(part, records=[{k: v for k, v in r.items() if k != "commits"}
                                                             for r in part["records"]])
                                    for name, part in run["batches"][0].items()}]}
    assert divergence_table(untraced) is None, "no traces, no table"
