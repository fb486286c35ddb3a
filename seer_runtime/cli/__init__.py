"""The ``seer`` command line: ``generate``, ``demo``, ``calibrate``, ``calibrate-dyllm``.

One module per command (``generate``, ``demo``, ``calibrate``), each adding its parser; the
options they share in ``options``. Errors in the input exit with status 2 and a one-line message
naming the option, file, line or field; Ctrl-C exits with status 130 and one line saying how
many requests were decoded and which files were written (``progress``). Output paths are
checked before a model is loaded and results written atomically (``seer_runtime.files``).
"""

from __future__ import annotations

import argparse
import sys

from . import calibrate, demo, generate, run
from .options import model_services
from .progress import CommandProgress

__all__ = ["build_parser", "main", "model_services"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seer", description="Fast inference for diffusion LLMs and diffusion MLLMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    generate.add_parsers(sub)
    demo.add_parsers(sub)
    calibrate.add_parsers(sub)
    run.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.progress = CommandProgress()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: one line saying how far it got and what is on disk, no traceback
        # a new line first: the terminal's "^C" (and any progress bar) leave the cursor mid-line
        print(f"\nseer {args.command}: {args.progress.interrupted()}", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError) as exc:  # bad input: unreadable files and values, named
        print(f"seer {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
