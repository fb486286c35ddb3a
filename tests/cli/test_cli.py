"""The ``seer`` console script on a tiny checkpoint with its own word-level tokenizer."""

from __future__ import annotations

import json
import re

import pytest
import torch

import model_adapters as ma
from seer_runtime.cli import main, model_services

pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("reference_kernels")]


def write_checkpoint(path, kind="llada-8b-instruct"):
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    model = ma.build_model(ma.tiny_config(kind))
    ma.save_model(model, path)
    template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} <|eot_id|>{% endfor %}"
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|startoftext|>", "chat_template": template}))
    vocab = {f"w{i}": i for i in range(250)}
    vocab.update({"<|mdm_mask|>": 250, "<|endoftext|>": 251, "<|eot_id|>": 252, "<|startoftext|>": 253, "<unk>": 254})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|mdm_mask|>", "<|endoftext|>", "<|eot_id|>", "<|startoftext|>", "<unk>"])
    tok.save(str(path / "tokenizer.json"))
    return model


def test_entry_point_finds_the_model_layer():
    svc = model_services()
    assert svc.load_model is ma.load_model


def summary_of(err: str) -> dict[str, str]:
    """``seer generate``'s summary on stderr as {label: text} (the aligned ``label  text`` lines)."""
    rows = {}
    for line in err.splitlines():
        label, sep, text = line.partition("  ")
        if sep and label and not label.startswith(" ") and "\r" not in line:
            rows[label] = text.strip()
    return rows


def test_generate_prints_the_answer_and_statistics(tmp_path, capsys):
    write_checkpoint(tmp_path)
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1 w2 w3", "--gen-length", "8", "--steps", "8",
               "--block-length", "4"])
    captured = capsys.readouterr()
    assert rc == 0
    rows = summary_of(captured.err)
    assert rows["forwards"] == "8 (NFE; 8 denoising steps)"
    # a tiny llada without a prefix cache: 8 forwards of the templated prompt + 8 window positions, every layer
    prompt = len(model_services().load_tokenizer(tmp_path).encode_prompt("w1 w2 w3"))
    layers = ma.load_model(tmp_path).num_layers
    assert rows["work"] == f"{8 * (prompt + 8) * layers:,} positions computed (positions x layers)"
    assert rows["answer"].endswith("tokens/s)") and "decoding" in rows and "time" in rows
    assert "{" not in captured.err  # no raw dict
    assert captured.out.strip() == "" or captured.out.split()[0].startswith("w")


def test_generate_stats_json_holds_every_statistic(tmp_path, capsys):
    """``--stats json``: one JSON object on stdout (the answer, the configuration, every figure of
    ``GenerationStats`` with the policies' reports), nothing but the progress bar on stderr."""
    write_checkpoint(tmp_path)
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1 w2", "--gen-length", "8", "--dyllm", "default",
               "--stats", "json"])
    captured = capsys.readouterr()
    assert rc == 0
    doc = json.loads(captured.out)
    st = doc["stats"]
    assert set(doc) == {"answer", "answer_tokens", "complete", "chat_template", "generation", "stats"}
    assert doc["generation"]["gen_length"] == 8 and st["nfe"] == 8  # no prefix cache: no prefill
    assert st["positions_computed"] == st["extra"]["dyllm"]["positions_computed"] <= st["positions_computed_dense"]
    assert len(st["extra"]["dyllm"]["steps"]) == 8  # DyLLM's record per forward: there, not on the terminal
    assert "positions computed" not in captured.err
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1 w2", "--gen-length", "8", "--stats", "none"])
    captured = capsys.readouterr()
    assert rc == 0 and "positions computed" not in captured.err and len(captured.out.splitlines()) == 1


def test_generate_with_a_seer_config_and_bad_options(tmp_path, capsys):
    write_checkpoint(tmp_path)
    seer = tmp_path / "seer.json"
    seer.write_text(json.dumps({"probe_layer": 1, "eps": 0.01, "probe": "sparsity"}))
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1", "--gen-length", "8", "--seer", str(seer)])
    err = capsys.readouterr().err
    assert rc == 0 and summary_of(err)["seer"].startswith("kept ") and " of 8 window positions after step 0" in err
    assert "{" not in err
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1", "--gen-length", "10", "--block-length", "4"])
    assert rc == 2 and "gen_length (10) must be divisible by block_length (4)" in capsys.readouterr().err
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1", "--image", "x.png"])
    assert rc == 2 and "text-only" in capsys.readouterr().err
    (tmp_path / "tokenizer.json").unlink()
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1"])
    assert rc == 2 and "has no tokenizer.json" in capsys.readouterr().err


@pytest.mark.parametrize("choice", ["default", "file"])
def test_generate_with_dyllm(tmp_path, capsys, choice):
    write_checkpoint(tmp_path)
    if choice == "file":  # as `seer calibrate-dyllm` writes it: the fields and a calibration record
        (tmp_path / "dyllm.json").write_text(json.dumps({"tau": 0.98, "full_steps": 2, "approx_attention": False,
                                                         "calibration": {"requests": 3}}))
        choice = str(tmp_path / "dyllm.json")
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1 w2", "--gen-length", "8", "--dyllm", choice])
    err = capsys.readouterr().err
    assert rc == 0
    rows = summary_of(err)
    assert "positions computed (positions x layers)" in rows["work"] and "{" not in err
    if choice == "default":
        assert rows["dyllm"].startswith("4 dense forwards, 4 sparse") and rows["dyllm"].endswith("(tau 0.99)")
    else:
        assert rows["dyllm"].startswith("2 dense forwards, 6 sparse") and rows["dyllm"].endswith("(tau 0.98)")


def test_generate_with_an_image_on_a_lavida_checkpoint(tmp_path, capsys):
    from PIL import Image

    write_checkpoint(tmp_path, kind="lavida-llada")
    Image.new("RGB", (50, 40), (10, 200, 30)).save(tmp_path / "img.png")
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w7 w8", "--image", str(tmp_path / "img.png"),
               "--gen-length", "4"])
    assert rc == 0 and summary_of(capsys.readouterr().err)["forwards"].startswith("5 (NFE")  # prefill + 4 steps


def checkpoint_and_requests(tmp_path, n):
    """A tiny checkpoint and a JSONL of ``n`` questions without answers, for the calibrate commands."""
    ckpt, data = tmp_path / "ckpt", tmp_path / "requests.jsonl"
    write_checkpoint(ckpt)
    data.write_text("\n".join(json.dumps({"question": f"w{i} w{i + 1} w{i + 2}"}) for i in range(n)) + "\n")
    return ckpt, data


def test_calibrate_a_checkpoint_from_jsonl(tmp_path, capsys):
    """``seer calibrate --model DIR --data FILE`` uses the checkpoint's own tokenizer and the
    generation options given, and writes a SeerConfig that ``generate --seer`` accepts."""
    from seer_runtime.seer import SeerConfig

    ckpt, data = checkpoint_and_requests(tmp_path, 6)
    out = tmp_path / "seer.json"
    rc = main(["calibrate", "--model", str(ckpt), "--data", str(data), "--out", str(out), "--gen-length", "8",
               "--steps", "8", "--block-length", "8", "--guard-mode", "redecode"])
    assert rc == 0, capsys.readouterr().err
    cfg = SeerConfig.from_json(out)
    assert 0 <= cfg.probe_layer < 2 and cfg.guard_mode == "redecode"
    record = json.loads(out.read_text())["calibration"]
    assert record["requests"] == 3 and record["confirm"]["requests"] == 3  # the file's halves
    assert record["confirm"]["holds"] == record["confirm"]["chosen"]["keeps_accuracy"]
    comp = record["compositions"]  # thresholds 0.8 0.9 0.95 x (no cache, prefix, dual) with Seer and DyLLM
    assert comp["requests"] == 3 and comp["recommended"] in comp["rows"] and len(comp["rows"]) == 1 + 3 + 3 * 8
    for name, row in comp["rows"].items():
        assert row["wall_s_median"] > 0 and (name == "baseline" or "p_value" in row)
    if comp["recommended"] != "baseline":
        assert comp["confirm"]["requests"] == 3 and comp["recommended_form"]["name"] == comp["recommended"]
    rc = main(["generate", "--model", str(ckpt), "--prompt", "w1", "--gen-length", "8", "--seer", str(out)])
    assert rc == 0
    data.write_text("{\"prompt\": \"w1\"}\n")
    rc = main(["calibrate", "--model", str(ckpt), "--data", str(data), "--out", str(out)])
    assert rc == 2 and "requests.jsonl:1: unknown key 'prompt'" in capsys.readouterr().err
    rc = main(["calibrate", "--model", str(ckpt), "--out", str(out)])
    assert rc == 2 and "--model needs --data" in capsys.readouterr().err


def test_calibrate_dyllm_a_checkpoint_from_jsonl(tmp_path, capsys):
    """``seer calibrate-dyllm --model DIR --data FILE`` measures every candidate against the
    baseline's answers and writes a DyLLMConfig that ``generate --dyllm`` accepts."""
    from seer_runtime.dyllm import DyLLMConfig

    ckpt, data = checkpoint_and_requests(tmp_path, 6)
    out = tmp_path / "dyllm.json"
    rc = main(["calibrate-dyllm", "--model", str(ckpt), "--data", str(data), "--out", str(out), "--gen-length", "8",
               "--full-steps", "2", "--max-drop", "0.5"])
    assert rc == 0, capsys.readouterr().err
    cfg = DyLLMConfig.from_json(out)
    assert cfg.full_steps == 2 and cfg.prompt_period == 4
    record = json.loads(out.read_text())["calibration"]
    # the file's first half chooses, the rest confirms (counted in the record)
    assert record["requests"] == 3 and record["confirm"]["requests"] == 3
    assert record["max_drop"] == 0.5 and record["within_tolerance"]
    assert record["confirm"]["holds"] == record["confirm"]["chosen"]["holds"]
    assert 1 <= len(record["confirm"]["tried"]) <= 3 and record["confirm"]["chosen"]["config"] == cfg.to_dict()
    assert len(record["candidates"]) == 18  # 6 taus (0.99 among them) x 3 attention modes
    assert cfg.to_dict() in [c["config"] for c in record["candidates"]]
    rc = main(["generate", "--model", str(ckpt), "--prompt", "w1", "--gen-length", "8", "--dyllm", str(out)])
    assert rc == 0
    # this random tiny model changes at least one of the first four answers with every candidate: none
    # within 0.1, the most accurate is written and the command says so with a non-zero status
    rc = main(["calibrate-dyllm", "--model", str(ckpt), "--data", str(data), "--out", str(out), "--gen-length", "8",
               "--full-steps", "2", "--max-drop", "0.1", "--requests", "4", "--confirm-requests", "2"])
    assert rc == 1 and "no candidate kept the exact match within 0.1" in capsys.readouterr().err
    assert json.loads(out.read_text())["calibration"]["within_tolerance"] is False
    rc = main(["calibrate-dyllm", "--model", str(ckpt), "--data", str(data), "--max-drop", "1.5"])
    assert rc == 2 and "max_drop must be a number in [0, 1)" in capsys.readouterr().err
    rc = main(["calibrate-dyllm", "--model", str(ckpt), "--data", str(data), "--requests", "5",
               "--confirm-requests", "2"])
    assert rc == 2 and "holds 6 requests: not enough for a choose set of 5 and a disjoint confirm set of 2" in \
        capsys.readouterr().err


def test_generate_on_an_embedded_model_by_name_from_any_directory(tmp_path, monkeypatch, capsys):
    """``--model demo`` (the ``--workload`` name; ``embedded`` too) from a directory that is not the
    repository's: the shipped model answers, and DyLLM's reused rows show in the one work figure."""
    monkeypatch.chdir(tmp_path)
    rc = main(["generate", "--model", "demo", "--prompt", "count to fourteen", "--dyllm", "default"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert captured.out.strip() == "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    rows = summary_of(captured.err)
    computed, dense = (int(x.replace(",", "")) for x in re.findall(r"([\d,]+) (?:positions computed|dense)",
                                                                    rows["work"]))
    assert f"{dense - computed:,} reused by DyLLM" in rows["work"] and computed < dense
    assert rows["answer"].startswith("14 tokens in ") and rows["dyllm"].startswith("4 dense forwards, 28 sparse")
    (tmp_path / "demo").mkdir()  # a directory of that name here wins over the embedded model
    rc = main(["generate", "--model", "demo", "--prompt", "count to fourteen"])
    assert rc == 2 and "demo" in capsys.readouterr().err


def test_every_option_of_every_command_has_help_and_its_default(capsys):
    """``seer COMMAND --help`` for every command: every option has help; an option with a default
    value shows it; ``seer --version`` prints the installed package's."""
    import argparse
    from importlib.metadata import version

    from seer_runtime.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) == {"generate", "run", "demo", "calibrate", "calibrate-dyllm"}
    for name, command in commands.items():
        text = command.format_help()
        for action in command._actions:
            if not action.option_strings:
                continue
            assert action.help and action.help.strip(), f"seer {name} {action.option_strings[0]} has no help"
            shown = action.default not in (None, argparse.SUPPRESS) and not isinstance(
                action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._HelpAction))
            if shown:
                default = action.default if not isinstance(action.default, list) else action.default[0]
                assert "default" in command._get_formatter()._get_help_string(action), (name, action.option_strings)
                forms = {str(default), f"{default:g}" if isinstance(default, float) else str(default)}
                assert any(f in " ".join(text.split()) for f in forms), (name, action.option_strings, default)
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"seer {version('seer')}"


def test_a_warning_prints_as_one_line_naming_the_command():
    """Inside a command a warning is ``seer COMMAND: warning: MESSAGE`` without Python's source line;
    filters and recorders see it as before, and the format comes back after the command."""
    import warnings

    from seer_runtime.cli import warnings_as_lines

    before = warnings.formatwarning
    with warnings_as_lines("generate"):
        assert warnings.formatwarning("words outside", UserWarning, "chat.py", 9) == \
            "seer generate: warning: words outside\n"
        with pytest.warns(UserWarning, match="still recorded"):
            warnings.warn("still recorded", UserWarning, stacklevel=1)
    assert warnings.formatwarning is before


def test_generate_early_stop_and_verbose(tmp_path, monkeypatch, capsys):
    """``--early-stop`` keeps the answer and the summary counts the steps it saved (the arith model
    decodes blocks of 32 in order, so its answer ends blocks before its window does; the demo
    model commits its end-of-text padding first and ends on its last step); ``-v`` prints the
    runtime's INFO notices, here that the CPU runs steps eagerly."""
    import logging

    from seer_runtime import graphs as graphs_module

    monkeypatch.chdir(tmp_path)
    question = "sam has 3 apples . he buys 4 more . how many apples does he have ?"
    monkeypatch.setattr(graphs_module, "_announced", set())
    rc = main(["generate", "--model", "arith", "--prompt", question])
    full = capsys.readouterr()
    assert rc == 0 and "eagerly" not in full.err
    monkeypatch.setattr(graphs_module, "_announced", set())  # the notice is said once per process
    rc = main(["generate", "--model", "arith", "--prompt", question, "--early-stop", "-v"])
    early = capsys.readouterr()
    assert rc == 0 and early.out == full.out and "answer" in early.out
    assert "seer generate: steps run eagerly on cpu" in early.err
    forwards = summary_of(early.err)["forwards"]
    saved = int(re.search(r"(\d+) steps saved by early stop", forwards).group(1))
    assert saved >= 32 and summary_of(full.err)["forwards"].startswith(f"{128 + 1} ")  # 128 steps and the prefill
    assert forwards.startswith(f"{128 + 1 - saved} ")
    assert logging.getLogger("seer_runtime").level == logging.NOTSET  # the command put it back
