"""Driver for ``bench/gpu_check.sh``: runs every ``bench/gpu_<family>.py`` and prints one table.

Each family module defines ``run(quick: bool) -> list[dict]``; every dict is one row with the
keys ``check`` (what was measured), ``ok`` (bf16 correctness against the reference, or None
for a pure timing row), ``ms`` (median device time), and ``note`` (bandwidth fraction, ratio
against the ideal, ...). Rows are printed as they come and again as one table at the end.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
import traceback

import bench


def _families() -> list[str]:
    return sorted(m.name[len("gpu_"):] for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("gpu_")
                  and m.name != "gpu_check")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="comma-separated families (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repeats")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing to check", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    wanted = [f for f in args.only.split(",") if f] or _families()
    rows: list[dict] = []
    failed = False
    for family in wanted:
        start = time.perf_counter()
        try:
            module = importlib.import_module(f"bench.gpu_{family}")
            for row in module.run(quick=args.quick):
                row.setdefault("family", family)
                rows.append(row)
                print(f"  [{family}] {row['check']}: ok={row.get('ok')} ms={row.get('ms')} {row.get('note', '')}",
                      flush=True)
        except Exception:  # one family failing must not hide the others' numbers
            failed = True
            traceback.print_exc()
            rows.append({"family": family, "check": "crashed", "ok": False, "ms": None, "note": ""})
        print(f"[{family}] done in {time.perf_counter() - start:.1f}s", flush=True)

    print("\n| family | check | bf16 ok | ms (median) | note |\n|---|---|---|---|---|")
    for r in rows:
        ms = "" if r.get("ms") is None else f"{r['ms']:.4f}"
        print(f"| {r['family']} | {r['check']} | {r.get('ok', '')} | {ms} | {r.get('note', '')} |")
        failed |= r.get("ok") is False
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
