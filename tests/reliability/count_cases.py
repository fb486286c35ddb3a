"""The distinct bad-input cases the reliability tests enumerate (the README's count).

``python -m tests.reliability.count_cases`` prints them per entry; a case marked silent in the
kernel list is a known defect, still counted (its test is a strict xfail). Below the total:
inputs that were mishandled before issue 36 and are now handled correctly, and the Ctrl-C cases
(not errors, so not in the total of rejected inputs).
"""

from __future__ import annotations


def enumerated() -> dict[str, int]:
    from ..kernels.test_kernel_inputs import CASES
    from .test_checkpoints import BROKEN, BROKEN_CONFIGS
    from .test_cli_inputs import BAD_CLI, BAD_CLI_FILES
    from .test_inputs import BAD_CONFIGS, BAD_FORWARD, BAD_REQUESTS
    from .test_user_files import BAD_DATA, BAD_IMAGES, BAD_OUTPUTS, BAD_TEMPLATES

    return {"configs": len(BAD_CONFIGS), "generate": len(BAD_REQUESTS), "forward": len(BAD_FORWARD),
            "checkpoints": len(BROKEN), "cli": len(BAD_CLI), "kernels": len(CASES),
            "checkpoint files (fields, dtypes, JSON)": len(BROKEN_CONFIGS), "chat templates": len(BAD_TEMPLATES),
            "images": len(BAD_IMAGES), "request files": len(BAD_DATA), "output paths": len(BAD_OUTPUTS),
            "cli (files, modes, before loading)": len(BAD_CLI_FILES),
            "kernels accepted silently (xfail)": -sum(c.silent is not None for c in CASES)}


def handled() -> dict[str, int]:
    """Inputs handled correctly since issue 36 (before: silently wrong, an error or a traceback),
    and the places a Ctrl-C is tested at (one line, exit 130)."""
    from .test_cli_inputs import INTERRUPTS
    from .test_user_files import HANDLED

    return {**HANDLED, "Ctrl-C: one line, exit 130": len(INTERRUPTS)}


if __name__ == "__main__":
    counts = enumerated()
    for name, n in counts.items():
        print(f"{name:40s} {n:4d}")
    print(f"{'enumerated':40s} {sum(n for n in counts.values() if n > 0):4d}")
    print(f"{'rejected with a named error':40s} {sum(counts.values()):4d}")
    for name, n in handled().items():
        print(f"{'handled: ' + name:60s} {n:4d}")
