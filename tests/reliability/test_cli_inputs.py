"""The ``seer`` command line on bad options: exit status 2 and a one-line error naming the
option or file, never a traceback (issue 20). Nothing here decodes: every case fails before."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from seer_runtime.cli import main

from ..cli.test_cli import write_checkpoint

pytestmark = [pytest.mark.reliability, pytest.mark.cli]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    write_checkpoint(d)
    (d / "bad.json").write_text("{not json")
    (d / "list.json").write_text("[1, 2]")
    (d / "picture.png").write_text("not an image")
    return d


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


@pytest.mark.usefixtures("reference_kernels")
@pytest.mark.parametrize("case", BAD_CLI, ids=lambda c: c.id)
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
