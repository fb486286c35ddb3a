"""The ``seer`` command line: ``generate``, ``demo``, ``calibrate``, ``calibrate-dyllm``.

One module per command (``generate``, ``demo``, ``calibrate``), each adding its parser; the
options they share in ``options``. Errors in the input exit with status 2 and a message.
"""

from __future__ import annotations

import argparse
import sys

from . import calibrate, demo, generate, run
from .options import model_services

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
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, OSError) as exc:  # bad input: unreadable files and values, named
        print(f"seer {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
