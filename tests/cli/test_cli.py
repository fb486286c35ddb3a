"""The ``seer`` console script on a tiny checkpoint with its own word-level tokenizer."""

from __future__ import annotations

import json

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


def test_generate_prints_the_answer_and_statistics(tmp_path, capsys):
    write_checkpoint(tmp_path)
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1 w2 w3", "--gen-length", "8", "--steps", "8",
               "--block-length", "4"])
    captured = capsys.readouterr()
    assert rc == 0
    assert "[stats] NFE 8  steps 8" in captured.err
    assert captured.out.strip() == "" or captured.out.split()[0].startswith("w")


def test_generate_with_a_seer_config_and_bad_options(tmp_path, capsys):
    write_checkpoint(tmp_path)
    seer = tmp_path / "seer.json"
    seer.write_text(json.dumps({"probe_layer": 1, "eps": 0.01, "probe": "sparsity"}))
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1", "--gen-length", "8", "--seer", str(seer)])
    assert rc == 0 and "[stats] seer:" in capsys.readouterr().err
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
    line = next(x for x in err.splitlines() if x.startswith("[stats] dyllm:"))
    if choice == "default":
        assert "'tau': 0.99" in line and "'approx_attention': True" in line and "'full_steps': 4" in line
    else:
        assert "'tau': 0.98" in line and "'approx_attention': False" in line and "'full_steps': 2" in line


def test_generate_with_an_image_on_a_lavida_checkpoint(tmp_path, capsys):
    from PIL import Image

    write_checkpoint(tmp_path, kind="lavida-llada")
    Image.new("RGB", (50, 40), (10, 200, 30)).save(tmp_path / "img.png")
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w7 w8", "--image", str(tmp_path / "img.png"),
               "--gen-length", "4"])
    assert rc == 0 and "[stats] NFE 5" in capsys.readouterr().err  # prefill + 4 steps (prefix cache)


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

    ckpt, data = checkpoint_and_requests(tmp_path, 4)
    out = tmp_path / "dyllm.json"
    rc = main(["calibrate-dyllm", "--model", str(ckpt), "--data", str(data), "--out", str(out), "--gen-length", "8",
               "--full-steps", "2", "--max-drop", "0.5"])
    assert rc == 0, capsys.readouterr().err
    cfg = DyLLMConfig.from_json(out)
    assert cfg.full_steps == 2 and cfg.prompt_period == 4
    record = json.loads(out.read_text())["calibration"]
    assert record["requests"] == 4 and record["max_drop"] == 0.5 and record["within_tolerance"]
    assert len(record["candidates"]) == 12  # 4 taus (0.99 among them) x 3 attention modes
    assert cfg.to_dict() in [c["config"] for c in record["candidates"]]
    rc = main(["generate", "--model", str(ckpt), "--prompt", "w1", "--gen-length", "8", "--dyllm", str(out)])
    assert rc == 0
    # this random tiny model changes at least one of four answers with every candidate (the
    # prompt fed every fourth step changes one even where every row is recomputed): none within
    # 0.2, the most accurate is written and the command says so with a non-zero status
    rc = main(["calibrate-dyllm", "--model", str(ckpt), "--data", str(data), "--out", str(out), "--gen-length", "8",
               "--full-steps", "2", "--max-drop", "0.2"])
    assert rc == 1 and "no candidate kept the exact match within 0.2" in capsys.readouterr().err
    assert json.loads(out.read_text())["calibration"]["within_tolerance"] is False
    rc = main(["calibrate-dyllm", "--model", str(ckpt), "--data", str(data), "--max-drop", "1.5"])
    assert rc == 2 and "max_drop must be a number in [0, 1)" in capsys.readouterr().err
