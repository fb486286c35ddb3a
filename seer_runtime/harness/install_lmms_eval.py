"""Install lmms-eval beside the CPU build of torch without leaving unmet requirements behind.

lmms-eval 0.7.3 lists 50 requirements for all its tasks and models, among them torchvision (and
timm, which needs it), which has no build for the CPU torch 2.13 this project installs, and heavy
packages its evaluator never imports (wandb, opencv, yt-dlp, sentence-transformers...). Installed
with ``pip install --no-deps`` it works for ``seer_lavida`` but leaves ~30 unmet requirements that
every later ``pip install`` touching one of its dependencies prints as conflicts.

This installs the same release with its metadata trimmed to what is installed: the wheel is
downloaded from the package index (``pip download --no-deps``), its ``Requires-Dist`` entries that
the environment does not satisfy are dropped (listed on stdout and in the wheel's ``Summary``), the
wheel's RECORD is brought up to date, and pip installs it (``--no-deps``, ``--force-reinstall``).
The code is the release's, byte for byte; ``pip check`` is then clean. Run it after
``pip install -e ".[eval]"`` (the ``eval`` extra holds what the evaluator imports)::

    python -m seer_runtime.harness.install_lmms_eval            # what the Makefile runs
    python -m seer_runtime.harness.install_lmms_eval --dry-run  # only say what would be dropped
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from email.parser import HeaderParser
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

#: the lmms-eval release the harness adapter (``seer_runtime.harness.lmms_eval``) is tested with
LMMS_EVAL_VERSION = "0.7.3"


def satisfied(requirement: str) -> bool:
    """Whether the installed environment satisfies ``requirement`` (a ``Requires-Dist`` value); one
    with an environment marker that does not apply here (an extra) counts as satisfied."""
    from packaging.requirements import Requirement

    req = Requirement(requirement)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        return True
    try:
        installed = version(req.name)
    except PackageNotFoundError:
        return False
    return req.specifier.contains(installed, prereleases=True)


def trimmed_metadata(text: str) -> tuple[str, list[str]]:
    """``METADATA`` text with the ``Requires-Dist`` lines the environment does not satisfy removed,
    and the removed requirements (in order). The Summary says what was dropped."""
    dropped, lines = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith("Requires-Dist:"):
            requirement = line.split(":", 1)[1].strip()
            if not satisfied(requirement):
                dropped.append(requirement)
                continue
        lines.append(line)
    out = "".join(lines)
    if dropped:
        note = f" [installed by seer without: {', '.join(dropped)}]"
        head, sep, body = out.partition("\n\n")
        head = "\n".join(h + note if h.startswith("Summary:") else h for h in head.split("\n"))
        out = head + sep + body
    return out, dropped


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def trim_wheel(wheel: Path, out: Path) -> list[str]:
    """Write ``wheel`` to ``out`` with its METADATA trimmed (:func:`trimmed_metadata`) and its RECORD
    entry for METADATA rehashed; every other member is copied unchanged. Returns the dropped
    requirements. Raises ``ValueError`` when the wheel has no single ``*.dist-info/METADATA``."""
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        metas = [n for n in names if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        if len(metas) != 1:
            raise ValueError(f"{wheel.name}: expected one *.dist-info/METADATA, found {metas}")
        meta_name = metas[0]
        record_name = meta_name.rsplit("/", 1)[0] + "/RECORD"
        text, dropped = trimmed_metadata(src.read(meta_name).decode("utf-8"))
        metadata = text.encode("utf-8")
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                data = src.read(info.filename)
                if info.filename == meta_name:
                    data = metadata
                elif info.filename == record_name:
                    rows = []
                    for row in data.decode("utf-8").splitlines():
                        if row.split(",", 1)[0] == meta_name:
                            row = f"{meta_name},{_record_hash(metadata)},{len(metadata)}"
                        rows.append(row)
                    data = ("\n".join(rows) + "\n").encode("utf-8")
                dst.writestr(info, data)
    HeaderParser().parsestr(text)  # still a valid header block
    return dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seer_runtime.harness.install_lmms_eval",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=LMMS_EVAL_VERSION, help="the lmms-eval release (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be dropped; install nothing")
    args = parser.parse_args(argv)
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", str(tmp / "dl"),
                        f"lmms-eval=={args.version}"], check=True)
        wheels = sorted((tmp / "dl").glob("*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"expected one lmms-eval wheel, pip downloaded {[w.name for w in wheels]}")
        (tmp / "out").mkdir()
        trimmed = tmp / "out" / wheels[0].name
        dropped = trim_wheel(wheels[0], trimmed)
        print(f"lmms-eval {args.version}: {len(dropped)} requirements not installed here are left out of its "
              f"metadata: {', '.join(dropped) if dropped else 'none'}")
        if args.dry_run:
            return 0
        subprocess.run([*pip, "install", "-q", "--no-deps", "--force-reinstall", str(trimmed)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
