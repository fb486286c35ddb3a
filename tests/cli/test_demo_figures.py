"""``seer demo``'s per-configuration figures and output: an over-truncated answer (the first cut fell
before the baseline's end) is recovered (equal to the baseline's), completed differently (its end
token inside its window: a complete answer the model finished sooner) or lost (no end token inside
its window: content cut off), and nothing else; the table's columns are JSON keys and none is
empty; files are written only where asked."""

from __future__ import annotations

import json

import pytest

from seer_runtime.cli.demo import _seer_figures, format_table
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
    fig = _seer_figures(seer, base, WINDOW)
    assert fig["over_truncated"] == 3  # rows 0-2: cut at 6 before the baseline's end at 10
    assert (fig["recovered"], fig["completed_differently"], fig["lost_answers"]) == (1, 1, 1)
    assert fig["boundary_mae"] == pytest.approx((5 + 5 + 5 + 4) / 4)


def test_the_table_shows_json_keys_and_no_empty_column():
    figures = {"baseline": {"exact_match": 0.95, "nfe": 33.0, "tok_per_s": 10.0},
               "seer:eos_prob": {"exact_match": 0.9375, "right_to_wrong": 3, "wrong_to_right": 2,
                                 "verdict": "within noise (p=1)", "speedup": 2.5, "ideal_speedup": 3.0, "nfe": 27.0}}
    table = format_table(figures, recommended="seer:eos_prob").splitlines()
    assert table[0].split() == ["config", "exact_match", "right_to_wrong", "wrong_to_right", "verdict", "speedup",
                                "ideal_speedup", "nfe"]
    assert table[2].split() == ["baseline", "0.950", "-", "-", "-", "-", "-", "33.0"]
    assert "seer:eos_prob *" in table[3] and "within noise (p=1)" in table[3] and "x2.50" in table[3]
    assert len({len(line) for line in table[:2]}) == 1  # aligned
    no_speed = {name: {k: v for k, v in f.items() if k not in ("speedup", "ideal_speedup")}
                for name, f in figures.items()}
    assert "speedup" not in format_table(no_speed)  # a column no row has is left out


@pytest.mark.usefixtures("reference_kernels")
def test_only_decodes_the_named_configurations_and_the_recommended_probe(tmp_path):
    from seer_runtime.cli import main

    out = tmp_path / "demo.json"
    assert main(["demo", "--workload", "arith", "--requests", "2", "--batch-size", "2", "--only", "dyllm",
                 "--json", str(out), "--plot", str(tmp_path / "profiles.png")]) == 0
    from model_adapters.embedded.arith.serving import default_seer_config

    shipped = default_seer_config().probe  # the shipped probe's row comes with any --only
    fig = json.loads(out.read_text())
    assert set(fig["probes"]) == {shipped} and set(fig["methods"]) == {"dyllm"}
    assert list(fig["configurations"]) == [f"seer:{shipped}", "dyllm"]
    for row in fig["configurations"].values():  # accuracy with its uncertainty on every row
        for key in ("exact_match", "right_to_wrong", "wrong_to_right", "p_value", "verdict", "keeps_accuracy",
                    "wall_s_passes", "wall_s_median", "timing_noisy"):
            assert key in row, key
    rec = fig["recommended"]
    assert rec["name"] in ["baseline", *fig["configurations"]] and "against" in rec


@pytest.mark.usefixtures("reference_kernels")
def test_the_demo_writes_no_file_it_was_not_asked_for(tmp_path, monkeypatch, capsys):
    from seer_runtime.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--requests", "2", "--batch-size", "2", "--only", "threshold:0.9+dual",
                 "--repeats", "1"]) == 0
    assert list(tmp_path.iterdir()) == []  # no out/seer_demo_sparsity.png without --plot
    out = capsys.readouterr().out
    assert "recommended:" in out and "as JSON: " in out and "one timed pass" in out
    assert "SeerConfig(" not in out

def test_an_unknown_only_name_is_refused_before_the_model_loads(capsys, monkeypatch):
    import model_adapters.embedded.arith.serving as arith
    from seer_runtime.cli import main

    monkeypatch.setattr(arith, "load_embedded", lambda *a, **k: pytest.fail("the model must not be loaded"))
    assert main(["demo", "--workload", "arith", "--requests", "2", "--only", "seer:nonsense"]) == 2
    assert "seer demo: error: --only: unknown configuration(s) ['seer:nonsense']" in capsys.readouterr().err
    assert main(["demo", "--workload", "arith", "--only", "seer+threshold:0.8"]) == 2  # 0.8 is not in --thresholds


@pytest.mark.usefixtures("reference_kernels")
def test_early_stop_decodes_every_configuration_with_fewer_forwards(tmp_path):
    """``seer demo --early-stop``: the baseline and every row end each request at its end token (on
    arith an answer of at most 120 tokens in a 128-position window: fewer forwards than one per
    position), the figures say so, and the recommendation's options carry the flag."""
    from model_adapters.embedded.arith import RESPONSE_WINDOW
    from seer_runtime.cli import main

    out = tmp_path / "demo.json"
    assert main(["demo", "--workload", "arith", "--requests", "2", "--batch-size", "2", "--only", "threshold:0.9",
                 "--repeats", "1", "--early-stop", "--json", str(out)]) == 0
    fig = json.loads(out.read_text())
    assert fig["early_stop"] is True
    assert fig["baseline"]["nfe"] < RESPONSE_WINDOW + 1  # the prefill, then one step per token until the end
    rec = fig["recommended"]
    assert "--early-stop" in rec["options"]


@pytest.mark.usefixtures("reference_kernels")
def test_a_model_directory_brings_its_own_configurations(tmp_path, capsys):
    """``seer demo --model DIR`` decodes with DIR's own seer_config.json and dyllm_config.json when it
    holds them (a user's calibration of their own weights), else with the shipped ones, and says
    which; a broken file of its own is refused naming it before the model loads."""
    import shutil

    from model_adapters.embedded.arith import serving as arith
    from seer_runtime.cli import main
    from seer_runtime.cli.demo import config_files
    from seer_runtime.dyllm import DyLLMConfig

    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(arith.ARITH_DIR / name, tmp_path / name)
    assert config_files(arith, tmp_path) == (arith.SEER_CONFIG_FILE, arith.DYLLM_CONFIG_FILE)
    assert config_files(arith, None) == (arith.SEER_CONFIG_FILE, arith.DYLLM_CONFIG_FILE)
    own = DyLLMConfig(tau=0.97, approx_attention=False)
    own.to_json(tmp_path / "dyllm_config.json")
    assert config_files(arith, tmp_path) == (arith.SEER_CONFIG_FILE, tmp_path / "dyllm_config.json")
    out = tmp_path / "demo.json"
    assert main(["demo", "--workload", "arith", "--model", str(tmp_path), "--requests", "2", "--batch-size", "2",
                 "--only", "dyllm", "--repeats", "1", "--json", str(out)]) == 0
    assert f"DyLLM from {tmp_path / 'dyllm_config.json'}" in capsys.readouterr().err
    fig = json.loads(out.read_text())
    assert fig["forms"]["dyllm"]["dyllm"] == own.to_dict()  # the row decoded with the directory's own file
    assert fig["config_files"] == {"seer": str(arith.SEER_CONFIG_FILE), "dyllm": str(tmp_path / "dyllm_config.json")}
    (tmp_path / "dyllm_config.json").write_text("{\"tau\": 0.97, \"full_step\": 4}")
    assert main(["demo", "--workload", "arith", "--model", str(tmp_path), "--requests", "2", "--only", "dyllm"]) == 2
    assert "dyllm_config.json" in capsys.readouterr().err
