"""``seer demo``'s per-configuration figures: an over-truncated answer (the first cut fell before the
baseline's end) is recovered (equal to the baseline's), completed differently (its end token
inside its window: a complete answer the model finished sooner) or lost (no end token inside its
window: content cut off), and nothing else."""

from __future__ import annotations

import json

import pytest

from seer_runtime.cli.demo import _figures
from seer_runtime.evaluate import RunResult

pytestmark = pytest.mark.cli

WINDOW = 16


def _result(answers, ends, **seer) -> RunResult:
    res = RunResult(answers=answers, end_positions=ends, nfe=[4], positions_computed=100, wall_s=1.0)
    res.seer = seer
    return res


def test_over_truncated_answers_are_recovered_completed_differently_or_lost():
    base = _result([[1] * 10, [2] * 10, [3] * 10, [4] * 3], [10, 10, 10, 3])
    seer = _result(
        [[1] * 10, [2] * 5, [3] * 6, [4] * 3],
        [10, 5, 6, 3],  # row 2 decoded to its cut (6) with no end token inside its window
        keep_len=[6, 6, 6, 8], boundary=[5, 5, 5, 7], final_window=[16, 6, 6, 8], guard_events=[1, 0, 0, 0],
        premature_cuts=[0, 0, 0, 0],
    )
    fig = _figures(seer, base, WINDOW, lambda answers: {"exact_match": 1.0})
    assert fig["over_truncated"] == 3  # rows 0-2: cut at 6 before the baseline's end at 10
    assert (fig["recovered"], fig["completed_differently"], fig["lost_answers"]) == (1, 1, 1)
    assert fig["differs_from_baseline"] == 2


@pytest.mark.usefixtures("reference_kernels")
def test_only_decodes_the_named_configurations_and_the_recommended_probe(tmp_path):
    from seer_runtime.cli import main

    out = tmp_path / "demo.json"
    assert main(["demo", "--workload", "arith", "--requests", "2", "--batch-size", "2", "--only", "dyllm",
                 "--json", str(out), "--plot", str(tmp_path / "profiles.png")]) == 0
    fig = json.loads(out.read_text())
    assert set(fig["probes"]) == {"eos_prob"} and set(fig["methods"]) == {"dyllm"}

def test_an_unknown_only_name_is_refused_before_the_model_loads(capsys, monkeypatch):
    import model_adapters.embedded.arith.serving as arith
    from seer_runtime.cli import main

    monkeypatch.setattr(arith, "load_embedded", lambda *a, **k: pytest.fail("the model must not be loaded"))
    assert main(["demo", "--workload", "arith", "--requests", "2", "--only", "seer:nonsense"]) == 2
    assert "seer demo: error: --only: unknown configuration(s) ['seer:nonsense']" in capsys.readouterr().err
