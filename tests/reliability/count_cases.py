"""The distinct bad-input cases the reliability tests enumerate (the README's count).

``python -m tests.reliability.count_cases`` prints them per entry; a case marked silent in the
kernel list is a known defect, still counted (its test is a strict xfail).
"""

from __future__ import annotations


def enumerated() -> dict[str, int]:
    from ..kernels.test_kernel_inputs import CASES
    from .test_checkpoints import BROKEN
    from .test_cli_inputs import BAD_CLI
    from .test_inputs import BAD_CONFIGS, BAD_FORWARD, BAD_REQUESTS

    return {"configs": len(BAD_CONFIGS), "generate": len(BAD_REQUESTS), "forward": len(BAD_FORWARD),
            "checkpoints": len(BROKEN), "cli": len(BAD_CLI), "kernels": len(CASES),
            "kernels accepted silently (xfail)": -sum(c.silent is not None for c in CASES)}


if __name__ == "__main__":
    counts = enumerated()
    for name, n in counts.items():
        print(f"{name:36s} {n:4d}")
    print(f"{'enumerated':36s} {sum(n for n in counts.values() if n > 0):4d}")
    print(f"{'rejected with a named error':36s} {sum(counts.values()):4d}")
