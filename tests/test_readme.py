"""The README's code runs as written: every ```python block is executed (in order, each in a fresh
namespace) and every ``seer`` line of a ```sh block is run through the console script's ``main``,
on the embedded models, on the CPU. A line ending in ``# -> TEXT`` must print TEXT (a Python
``print`` its line exactly; a command a line of its stdout containing TEXT).

Skipped, and said so in the block itself: a ```python block whose first line is a comment starting
with ``# needs`` (a published checkpoint or a GPU). Blocks without a language tag (synopses,
launcher and harness commands that take minutes, recorded output) are text, not run.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from seer_runtime.cli import main

pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("reference_kernels")]

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXPECT = "  # -> "


def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, first line number, code) of every fenced block of ``text``, in order."""
    return [(m.group(1), text.count("\n", 0, m.start()) + 2, m.group(2))
            for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, flags=re.M | re.S)]


def blocks(language: str) -> list[tuple[int, str]]:
    return [(line, code) for lang, line, code in fenced_blocks(README.read_text()) if lang == language]


def expectations(code: str) -> list[str]:
    return [line.split(EXPECT, 1)[1].strip() for line in code.splitlines() if EXPECT in line]


def test_the_readme_has_the_blocks_this_test_runs():
    python, sh = blocks("python"), blocks("sh")
    run = [code for _, code in python if not code.lstrip().startswith("# needs")]
    assert len(run) >= 1 and any("with_image=True" in code for code in run)  # text and image, as documented
    skipped = [code for _, code in python if code.lstrip().startswith("# needs")]
    assert len(skipped) <= 2, "keep the blocks that cannot run here few"
    assert sum(line.startswith("seer ") for _, code in sh for line in code.splitlines()) >= 4


@pytest.mark.parametrize("line, code", blocks("python"), ids=lambda x: f"README.md:{x}" if isinstance(x, int) else "")
def test_python_blocks_run_as_written(line, code, capsys):
    if code.lstrip().startswith("# needs"):
        pytest.skip(code.lstrip().splitlines()[0])
    exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "readme"})  # noqa: S102
    printed = capsys.readouterr().out.splitlines()
    for expected in expectations(code):
        assert expected in printed, f"README.md:{line}: printed {printed}, the README says {expected!r}"


@pytest.mark.parametrize("line, code", blocks("sh"), ids=lambda x: f"README.md:{x}" if isinstance(x, int) else "")
def test_seer_commands_run_as_written(line, code, tmp_path, monkeypatch, capsys):
    """From a directory holding the repository's ``model_adapters`` (the paths the README uses are
    relative to the repository's root), so that the files a command writes land in ``tmp_path``."""
    (tmp_path / "model_adapters").symlink_to(ROOT / "model_adapters")
    monkeypatch.chdir(tmp_path)
    commands = [c for c in code.splitlines() if c.startswith("seer ")]
    assert commands, f"README.md:{line}: an sh block without a seer command"
    for command in commands:
        written, _, expected = command.partition(EXPECT)
        argv = shlex.split(written)
        rc = main(argv[1:])
        out, err = capsys.readouterr()
        assert rc == 0, f"README.md:{line}: `{written.strip()}` exited {rc}: {err[-2000:]}"
        if expected:
            assert any(expected.strip() in x for x in out.splitlines()), (
                f"README.md:{line}: `{written.strip()}` printed {out!r}, the README says {expected.strip()!r}")
        if "--profile" in argv:
            assert (tmp_path / argv[argv.index("--profile") + 1]).stat().st_size > 0
