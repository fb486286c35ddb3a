"""The ``seer`` command line: ``generate``, ``demo``, ``calibrate``, ``calibrate-dyllm``, ``run``.

One module per command (``generate``, ``demo``, ``calibrate``, ``run``), each adding its parser; the
options they share in ``options``. ``seer --version`` prints the installed package's version;
every command's ``--help`` lists each option with its help and default (``options.HelpFormatter``).
Errors in the input exit with status 2 and a one-line message naming the option, file, line or
field; Ctrl-C exits with status 130 and one line saying how many requests were decoded and which
files were written (``progress``). Output paths are checked before a model is loaded and results
written atomically (``seer_runtime.files``). A warning raised while a command runs is printed as
one line, ``seer COMMAND: warning: MESSAGE``, without Python's source line under it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from contextlib import contextmanager

from . import calibrate, demo, generate, run
from .options import HelpFormatter, model_services
from .progress import CommandProgress

__all__ = ["build_parser", "main", "model_services", "package_version"]


def package_version() -> str:
    """The installed ``seer`` distribution's version (package metadata), or a note that it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("seer")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e . in the repository)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seer", description="Fast inference for diffusion LLMs and diffusion MLLMs.",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"seer {package_version()}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="generate, run, demo, calibrate or calibrate-dyllm (each has --help)")
    generate.add_parsers(sub)
    demo.add_parsers(sub)
    calibrate.add_parsers(sub)
    run.add_parsers(sub)
    verbose_help = "print the runtime's notices (INFO logs of seer_runtime, e.g. that steps run eagerly without CUDA)"
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    for command in sub.choices.values():  # every option's help with its default
        command.formatter_class = HelpFormatter
        # after the command too (seer generate -v ...); SUPPRESS keeps the top level's value when absent
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
    return parser


@contextmanager
def runtime_notices(command: str, verbose: bool):
    """With ``verbose``, ``seer_runtime``'s INFO logs print to stderr as ``seer COMMAND: MESSAGE``
    for the block (the logger's level and handlers come back after it)."""
    if not verbose:
        yield
        return
    log = logging.getLogger("seer_runtime")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"seer {command}: %(message)s"))
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


@contextmanager
def warnings_as_lines(command: str):
    """Within the block, a warning prints as one line naming the command (no source line); only the
    format changes: filters and ``catch_warnings(record=True)`` see warnings as before."""
    formatted = warnings.formatwarning

    def one_line(message, category, filename, lineno, line=None):
        return f"seer {command}: warning: {message}\n"

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = formatted


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.progress = CommandProgress()
    try:
        with warnings_as_lines(args.command), runtime_notices(args.command, args.verbose):
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
