"""The ``seer`` command line on bad options: exit status 2 and a one-line error naming the
option or file, never a traceback (issue 20); issue 36's cases (``BAD_CLI_FILES``): output paths,
request files, templates, images and options that do not apply. Nothing here decodes or loads a
model: every case fails before (``no_model_loads``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from seer_runtime.cli import main

from ..cli.test_cli import write_checkpoint

pytestmark = [pytest.mark.reliability, pytest.mark.cli]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("cli")
    write_checkpoint(d)
    (d / "bad.json").write_text("{not json")
    (d / "list.json").write_text("[1, 2]")
    (d / "picture.png").write_text("not an image")
    (d / "afile").write_text("a file where a directory is expected")
    (d / "zero.jinja").write_text("{{ 1 / 0 }}")
    (d / "lavida").mkdir()
    write_checkpoint(d / "lavida", kind="lavida-llada")
    (d / "nomask").mkdir()
    write_checkpoint(d / "nomask")
    config = json.loads((d / "nomask/config.json").read_text())
    del config["mask_token_id"]
    (d / "nomask/config.json").write_text(json.dumps(config))
    Image.new("RGB", (40, 30), (200, 10, 10)).save(d / "red.png")
    red = (d / "red.png").read_bytes()
    (d / "cut.png").write_bytes(red[: len(red) // 2])
    question = {"question": "what colour is the circle ?"}
    lines = {
        "answr.jsonl": [question, {"question": "count to two", "answr": "one two"}],
        "image.jsonl": [{"question": "w1 w2", "image": "red.png"}, {"question": "w2 w1", "image": "red.png"}],
        "cut.jsonl": [question, {**question, "image": "red.png"}, {**question, "image": "cut.png"}],
    }
    for name, items in lines.items():
        (d / name).write_text("".join(json.dumps(x) + "\n" for x in items))
    (d / "latin1.jsonl").write_bytes(b'{"question": "count to two"}\n{"question": "caf\xe9 ?"}\n')
    # two requests: one to choose on, one to confirm on
    (d / "data.jsonl").write_text(json.dumps({"question": "w1 w2"}) + "\n" + json.dumps({"question": "w2 w1"}) + "\n")
    return d


@pytest.fixture
def no_model_loads(monkeypatch):
    """Every case here must fail before a model is loaded (the long part on a real checkpoint)."""
    import model_adapters.embedded.arith.serving as arith
    import model_adapters.embedded.serving as demo
    import model_adapters.services as services

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(services, "load_model", refuse)
    monkeypatch.setattr(demo, "load_embedded", refuse)
    monkeypatch.setattr(arith, "load_embedded", refuse)


@dataclass(frozen=True)
class BadOption:
    id: str
    argv: tuple[str, ...]  # {d}: the checkpoint directory
    names: str  # a substring of the error line


GEN = ("generate", "--model", "{d}", "--prompt", "w1")
BAD_CLI = [
    BadOption("gen-length-negative", (*GEN, "--gen-length", "-4"), "gen_length must be an int >= 1, got -4"),
    BadOption("gen-length-not-int", (*GEN, "--gen-length", "8.5"), "argument --gen-length: invalid int value"),
    BadOption("steps-zero", (*GEN, "--steps", "0"), "steps must be an int >= 1, got 0"),
    BadOption("temperature-nan", (*GEN, "--temperature", "nan"), "temperature must be >= 0 (a finite number)"),
    BadOption("threshold-above-1", (*GEN, "--threshold", "1.5"), "threshold must be in (0, 1] (a finite number)"),
    BadOption("block-cache-unknown", (*GEN, "--block-cache", "full"), "argument --block-cache: invalid choice"),
    BadOption("demo-threshold-0", ("demo", "--threshold", "0"), "threshold must be in (0, 1]"),
    BadOption("remasking-unknown", (*GEN, "--remasking", "best"), "remasking must be one of"),
    BadOption("model-missing", ("generate", "--model", "{d}/absent", "--prompt", "w1"), "absent does not exist"),
    BadOption("gen-json-missing", (*GEN, "--gen-json", "{d}/none.json"), "No such file or directory"),
    BadOption("gen-json-not-json", (*GEN, "--gen-json", "{d}/bad.json"), "--gen-json {d}/bad.json is not valid JSON"),
    BadOption("gen-json-not-object", (*GEN, "--gen-json", "{d}/list.json"), "must hold a JSON object, got list"),
    BadOption("gen-json-directory", (*GEN, "--gen-json", "{d}"), "Is a directory"),
    BadOption("seer-json-not-json", (*GEN, "--seer", "{d}/bad.json"), "SeerConfig {d}/bad.json is not valid JSON"),
    BadOption("dyllm-json-missing", (*GEN, "--dyllm", "{d}/none.json"), "none.json"),
    BadOption("image-not-an-image", ("generate", "--model", "{d}", "--prompt", "w1", "--image", "{d}/picture.png"),
              "text-only"),
    BadOption("device-unknown", (*GEN, "--device", "tpu9"), "argument --device: expected a device"),
    BadOption("dtype-unknown", (*GEN, "--dtype", "float8"), "argument --dtype: invalid choice"),
    BadOption("demo-requests-negative", ("demo", "--requests", "-1"), "argument --requests: expected an int >= 1"),
    BadOption("demo-batch-size-zero", ("demo", "--batch-size", "0"), "argument --batch-size: expected an int >= 1"),
    BadOption("calibrate-requests-zero", ("calibrate", "--requests", "0"), "argument --requests: expected an int >= 1"),
    BadOption("calibrate-lam-nan", ("calibrate", "--lam", "nan"), "lam must be >= 0 (a finite number), got nan"),
    BadOption("calibrate-model-without-data", ("calibrate", "--model", "{d}"), "--model needs --data"),
    BadOption("calibrate-dyllm-max-drop", ("calibrate-dyllm", "--max-drop", "-1"), "max_drop must be a number in"),
    BadOption("calibrate-dyllm-full-steps", ("calibrate-dyllm", "--full-steps", "0"),
              "argument --full-steps: expected an int >= 1"),
]
#: issue 36: commands meeting files and options that do not apply, each refused before any model loads
CAL = ("calibrate", "--model", "{d}", "--data", "{d}/data.jsonl")
BAD_CLI_FILES = [
    BadOption("prompt-empty", ("generate", "--model", "{d}", "--prompt", ""),
              "argument --prompt: must not be empty or only whitespace, got ''"),
    BadOption("prompt-whitespace", ("generate", "--model", "{d}", "--prompt", " \t "),
              "argument --prompt: must not be empty or only whitespace"),
    BadOption("calibrate-model-with-workload", (*CAL, "--workload", "arith"),
              "--workload arith picks an embedded model; it does not apply with --model {d}"),
    BadOption("calibrate-dyllm-model-with-workload", ("calibrate-dyllm", *CAL[1:], "--workload", "demo"),
              "--workload demo picks an embedded model"),
    BadOption("calibrate-out-under-a-file", ("calibrate", "--out", "{d}/afile/seer.json"),
              "--out {d}/afile/seer.json: {d}/afile is a file, not a directory"),
    BadOption("calibrate-out-a-directory", ("calibrate", "--out", "{d}"), "--out {d} is a directory"),
    BadOption("calibrate-plot-format", ("calibrate", "--out", "{d}/s.json", "--plot", "{d}/profiles.txt"),
              "--plot {d}/profiles.txt: the suffix '.txt' is not a figure format matplotlib writes"),
    BadOption("calibrate-plot-under-a-file", ("calibrate", "--out", "{d}/s.json", "--plot", "{d}/afile/p.png"),
              "--plot {d}/afile/p.png: {d}/afile is a file"),
    BadOption("calibrate-dyllm-out-under-a-file", ("calibrate-dyllm", "--out", "{d}/afile/d.json"),
              "--out {d}/afile/d.json: {d}/afile is a file"),
    BadOption("demo-json-under-a-file", ("demo", "--json", "{d}/afile/demo.json"),
              "--json {d}/afile/demo.json: {d}/afile is a file"),
    BadOption("demo-json-a-directory", ("demo", "--json", "{d}"), "--json {d} is a directory"),
    BadOption("demo-plot-format", ("demo", "--plot", "{d}/p.doc"), "--plot {d}/p.doc: the suffix '.doc'"),
    BadOption("demo-only-unknown", ("demo", "--only", "seer:nonsense"),
              "--only: unknown configuration(s) ['seer:nonsense']"),
    BadOption("data-misspelled-key", ("calibrate", "--workload", "arith", "--data", "{d}/answr.jsonl"),
              "--data {d}/answr.jsonl:2: unknown key 'answr' (did you mean 'answer'?)"),
    BadOption("data-latin1", ("calibrate-dyllm", "--data", "{d}/latin1.jsonl"),
              "--data {d}/latin1.jsonl:2: not UTF-8: byte 0xe9 at column 18"),
    BadOption("data-image-for-a-text-checkpoint", ("calibrate", "--model", "{d}", "--data", "{d}/image.jsonl"),
              "--data {d}/image.jsonl:1: key 'image' is not accepted here: this model is text only"),
    BadOption("data-truncated-image", ("calibrate", "--data", "{d}/cut.jsonl"),
              "--data {d}/cut.jsonl:3: image file {d}/cut.png cannot be decoded"),
    BadOption("data-truncated-image-checkpoint", ("calibrate", "--model", "{d}/lavida", "--data", "{d}/cut.jsonl"),
              "--data {d}/cut.jsonl:3: image file {d}/cut.png cannot be decoded"),
    BadOption("template-raises", (*GEN, "--chat-template", "{d}/zero.jinja"),
              "chat template from {d}/zero.jinja failed while rendering: ZeroDivisionError: division by zero"),
    BadOption("config-without-mask-id", ("generate", "--model", "{d}/nomask", "--prompt", "w1"),
              "{d}/nomask/config.json: mask_token_id is not set"),
    BadOption("image-truncated", ("generate", "--model", "{d}/lavida", "--prompt", "w1", "--image", "{d}/cut.png"),
              "--image {d}/cut.png cannot be decoded"),
    BadOption("image-missing", ("generate", "--model", "{d}/lavida", "--prompt", "w1", "--image", "{d}/none.png"),
              "--image {d}/none.png does not exist"),
    BadOption("image-on-a-text-checkpoint", ("generate", "--model", "{d}", "--prompt", "w1", "--image", "{d}/red.png"),
              "--image was given, but {d} holds a text-only model (llada)"),
    BadOption("seer-file-missing", (*GEN, "--seer", "{d}/none.json"),
              "SeerConfig {d}/none.json cannot be read: No such file or directory"),
    BadOption("seer-file-empty-string", (*GEN, "--seer", ""), "argument --seer: expected a path, got ''"),
    BadOption("data-empty-string", ("calibrate", "--data", " "), "argument --data: expected a path, got ' '"),
    BadOption("model-a-file", ("generate", "--model", "{d}/config.json", "--prompt", "w1"),
              "model directory {d}/config.json is a file"),
]


@pytest.mark.usefixtures("reference_kernels", "no_model_loads")
@pytest.mark.parametrize("case", BAD_CLI + BAD_CLI_FILES, ids=lambda c: c.id)
def test_bad_option_exits_2_with_one_line(case: BadOption, ckpt, capsys):
    argv = [a.format(d=ckpt) for a in case.argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"seer {argv[0]}: error: "), err
    assert case.names.format(d=ckpt) in line, line


@pytest.mark.usefixtures("reference_kernels")
def test_unreadable_image_exits_2_naming_it(tmp_path, capsys):
    write_checkpoint(tmp_path, kind="lavida-llada")
    (tmp_path / "picture.png").write_text("not an image")
    code = main(["generate", "--model", str(tmp_path), "--prompt", "w1", "--image", str(tmp_path / "picture.png")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"seer generate: error: --image {tmp_path / 'picture.png'} is not an image file PIL can read" in err, err


# ---------------------------------------------------------------------------------- Ctrl-C
def _interrupt_at(monkeypatch, module, name: str, after_calls: int = 0):
    """Make ``module.name`` raise KeyboardInterrupt on call number ``after_calls + 1``."""
    real = getattr(module, name)
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) > after_calls:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)


def _generate_interrupted(d, monkeypatch):
    from seer_runtime.cli import generate

    _interrupt_at(monkeypatch, generate, "generate")
    return ["generate", "--model", str(d), "--prompt", "w1 w2", "--gen-length", "8"], []


def _demo_interrupted(d, monkeypatch):
    from seer_runtime.calibration import compositions

    # one warm-up call per configuration, batch 1 (baseline, seer), then batch 2 stops
    _interrupt_at(monkeypatch, compositions, "run_requests", after_calls=4)
    out = d / "demo_out"
    return ["demo", "--requests", "4", "--batch-size", "2", "--only", "seer:eos_prob", "--json",
            str(out / "demo.json"), "--plot", str(out / "p.png")], [out / "demo.json", out / "p.png"]


def _demo_interrupted_in_the_plot(d, monkeypatch):
    from seer_runtime.calibration import plots

    _interrupt_at(monkeypatch, plots, "plot_demo")
    out = d / "demo_plot"
    return ["demo", "--requests", "2", "--batch-size", "2", "--only", "seer:eos_prob", "--json",
            str(out / "demo.json"), "--plot", str(out / "p.png")], [out / "p.png"]


def _calibrate_interrupted(d, monkeypatch):
    from seer_runtime.cli import calibrate

    _interrupt_at(monkeypatch, calibrate, "calibrate")
    return ["calibrate", "--model", str(d), "--data", str(d / "data.jsonl"), "--out", str(d / "c1/seer.json")], \
        [d / "c1/seer.json"]


def _calibrate_interrupted_while_writing(d, monkeypatch):
    import seer_runtime.files as files

    _interrupt_at(monkeypatch, files.os, "replace")
    return ["calibrate-dyllm", "--model", str(d), "--data", str(d / "data.jsonl"), "--out", str(d / "c2/dyllm.json"),
            "--gen-length", "8", "--full-steps", "2", "--max-drop", "0.5"], [d / "c2/dyllm.json"]


#: Ctrl-C at each kind of place: one line saying how far the command got and what is on disk, exit 130
INTERRUPTS = [
    ("generate-while-decoding", _generate_interrupted, "interrupted after 0 of 1 requests; nothing written"),
    ("demo-between-batches", _demo_interrupted, "interrupted after 2 of 4 requests; nothing written"),
    ("demo-in-the-plot-after-the-json", _demo_interrupted_in_the_plot,
     "interrupted after 2 of 2 requests; wrote {d}/demo_plot/demo.json; not written: {d}/demo_plot/p.png"),
    ("calibrate-while-calibrating", _calibrate_interrupted,
     "interrupted while calibrating on 1 + 1 requests; nothing written"),
    ("calibrate-dyllm-while-writing", _calibrate_interrupted_while_writing,
     "interrupted while calibrating on 1 + 1 requests; nothing written"),
]


@pytest.mark.usefixtures("reference_kernels")
@pytest.mark.parametrize("case", INTERRUPTS, ids=lambda c: c[0])
def test_ctrl_c_ends_with_one_line_and_exit_130(case, ckpt, capsys, monkeypatch):
    _, arrange, line = case
    argv, never_written = arrange(ckpt, monkeypatch)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last == f"seer {argv[0]}: " + line.format(d=ckpt), err[-400:]
    for path in never_written:
        assert not path.exists(), path
        assert not path.parent.exists() or not [p for p in path.parent.iterdir() if p.name.startswith(".")], \
            "a temporary file was left behind"


@pytest.mark.usefixtures("reference_kernels")
def test_a_plot_that_fails_after_calibrating_does_not_cost_the_configuration(ckpt, tmp_path, capsys, monkeypatch):
    import seer_runtime.calibration.seer as calibration

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(calibration, "plot_profiles", disk_full)
    out, plot = tmp_path / "seer.json", tmp_path / "profiles.png"
    assert main(["calibrate", "--model", str(ckpt), "--data", str(ckpt / "data.jsonl"), "--out", str(out), "--plot",
                 str(plot), "--gen-length", "8"]) == 1
    err = capsys.readouterr().err
    assert f"seer calibrate: error: --plot {plot} not written (OSError: No space left on device); {out} holds the " \
           "chosen configuration" in err
    assert json.loads(out.read_text())["calibration"]["requests"] == 1 and not plot.exists()
