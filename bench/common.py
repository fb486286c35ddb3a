"""Helpers shared by the kernel benchmarks: peak bandwidth, timers, rows, byte and FLOP counts.

The kernel benchmarks (``bench_<family>_kernels.py``) each hold the CPU pytest-benchmark tests
of one op family and its GPU timing harness ``run(quick, dry_run)``, which ``bench/gpu_check.py``
drives. A harness returns rows: dicts with ``check`` (what was measured), ``ok`` (None for a
timing row), ``ms`` (median) and ``note`` (bandwidth, FLOP rate, ratio against the ideal).
Correctness on the GPU lives in the ``gpu``-marked tests of ``tests/kernels``, not here.

Importable anywhere: nothing touches CUDA or Triton's driver until a timer runs.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

H200_PEAK_BW = 4.8e12  # B/s, HBM3e


def peak_bandwidth() -> float:
    """Peak memory bandwidth in B/s: ``SEER_PEAK_BW`` if set, else the H200's."""
    return float(os.environ.get("SEER_PEAK_BW", H200_PEAK_BW))


def bandwidth_note(nbytes: int, ms: float) -> str:
    """``nbytes`` moved in ``ms``: GB/s and the fraction of :func:`peak_bandwidth`."""
    achieved = nbytes / (ms * 1e-3)
    peak = peak_bandwidth()
    return f"{achieved / 1e9:.0f} GB/s = {achieved / peak:.1%} of peak {peak / 1e12:.2f} TB/s"


def tflops_note(flops: int, ms: float) -> str:
    return f"{flops / (ms * 1e-3) / 1e12:.1f} TFLOP/s"


# ------------------------------------------------------------------------------------ timers


@dataclass(frozen=True)
class Timing:
    """How a harness times: device events on CUDA, or a CPU dry run of the same code.

    ``dry_run`` runs every call of the harness once more on the CPU at tiny shapes (the torch
    references) with ``time.perf_counter``: it checks that the harness works, not the numbers.
    """

    quick: bool = False
    dry_run: bool = False

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    def ms(self, fn: Callable[[], object]) -> float:
        """Median milliseconds of ``fn`` (``triton.testing.do_bench``, or perf_counter when dry)."""
        if self.dry_run:
            return 1e3 * median_of_calls(fn, 3)
        import triton.testing

        warmup, rep = (5, 20) if self.quick else (25, 100)
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))

    def graph_ms(self, fn: Callable[[], object]) -> float | None:
        """Median ms replayed from a CUDA graph (no launch overhead); None if capture fails or dry."""
        if self.dry_run:
            return None
        import triton.testing

        try:
            return float(triton.testing.do_bench_cudagraph(fn, rep=10 if self.quick else 50, return_mode="median"))
        except Exception:  # report the eager time alone rather than lose the row
            traceback.print_exc()
            return None

    def empty_cache(self) -> None:
        if not self.dry_run:
            import torch

            torch.cuda.empty_cache()


def median_of_calls(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after one warm-up call."""
    fn()
    return interleaved_medians([fn], repeats)[0]


def interleaved_medians(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each function, timed in alternation so machine noise hits all alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - start)
    return [sorted(t)[len(t) // 2] for t in times]


def benchmark_median(benchmark, fn: Callable[[], object]) -> float:
    """pytest-benchmark's median when it ran; with --benchmark-disable, the median of 3 calls."""
    if benchmark.stats is not None:
        return benchmark.stats.stats.median
    return interleaved_medians([fn], 3)[0]


# -------------------------------------------------------------------------------------- rows


def row(check: str, ms: float | None, note: str = "", ok: bool | None = None) -> dict:
    return {"check": check, "ok": ok, "ms": ms, "note": note}


def time_parts(name: str, parts: Iterable[Callable[[Timing], list[dict]]], *, quick: bool, dry_run: bool) -> list[dict]:
    """A harness's ``run``: the rows of ``parts`` on CUDA, or on the CPU at tiny shapes when dry."""
    import torch

    from seer_kernels import interpreting

    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError(f"{name} needs a CUDA device (or dry_run=True)")
    if not dry_run and interpreting():
        raise RuntimeError("TRITON_INTERPRET is set: the kernels would run in the interpreter")
    timing = Timing(quick=quick, dry_run=dry_run)
    rows: list[dict] = []
    for part in parts:  # a part that raises becomes one failed row; the others still run
        try:
            rows.extend(part(timing))
        except Exception as exc:
            traceback.print_exc()
            rows.append(row(f"{part.__name__} crashed", None, repr(exc)[:200], ok=False))
        timing.empty_cache()
    return rows


def format_row(family: str, r: dict) -> str:
    ms = "" if r.get("ms") is None else f" {r['ms']:.4f} ms"
    ok = "" if r.get("ok") is None else f" ok={r['ok']}"
    return f"  [{family}] {r['check']}:{ok}{ms} {r.get('note', '')}".rstrip()


def table(rows: list[dict]) -> str:
    """A markdown table of rows (each with a ``family``)."""
    lines = ["| family | check | ok | ms (median) | note |", "|---|---|---|---|---|"]
    for r in rows:
        ms = "" if r.get("ms") is None else f"{r['ms']:.4f}"
        ok = "" if r.get("ok") is None else str(r["ok"])
        lines.append(f"| {r['family']} | {r['check']} | {ok} | {ms} | {r.get('note', '')} |")
    return "\n".join(lines)


# --------------------------------------------------------------------- ideal bytes and FLOPs


def mlp_sparsity_bytes(tokens: int, F: int, elem: int) -> int:
    """Ideal traffic of ``mlp_sparsity``: read the activation once, write one fp32 per token."""
    return tokens * F * elem + tokens * 4


def swiglu_sparsity_bytes(tokens: int, F: int, elem: int) -> int:
    """Ideal traffic of the fused op: read gate and up, write the product and one fp32 per token."""
    return 3 * tokens * F * elem + tokens * 4


def snr_boundary_bytes(B: int, N: int, elem: int) -> int:
    """Upper bound of ``snr_boundary`` traffic: every row read once, lengths in, L* out."""
    return B * N * elem + B * 8 + B * 4


def cosine_saliency_bytes(N: int, D: int, elem: int) -> int:
    """Read ctx and its cache; write the fp32 similarity, read it back to compact, write the index."""
    return 2 * N * D * elem + N * 4 * 2 + N * 4


def gather_rows_bytes(n_live: int, N: int, D: int, elem: int, *, zero_tail: bool) -> int:
    """Read and write the live rows, zero the tail rows when asked, read the index."""
    return 2 * n_live * D * elem + (N - n_live) * D * elem * zero_tail + N * 4


def scatter_rows_bytes(n_live: int, N: int, D: int, elem: int) -> int:
    return 2 * n_live * D * elem + N * 4


def partial_attention_flops(lq: int, lk: int, n_sal_q: int, n_sal_k: int, H: int, d: int) -> tuple[int, int]:
    """(dense, partial) matmul FLOPs of one sequence's attention.

    Dense: ``QK^T`` and ``PV`` over every (query, key) pair, ``2 * 2 * lq * lk * d`` per head.
    Partial: the same ``QK^T`` (the softmax normaliser needs every key), ``PV`` over every key
    for the ``n_sal_q`` exact rows, and over the ``n_sal_k`` salient keys only for the other
    rows. The Triton kernel also recomputes the salient columns' scores (another
    ``2 * (lq - n_sal_q) * n_sal_k * d``), which this ideal leaves out.
    """
    dense = 4 * lq * lk * d * H
    partial = 2 * lq * lk * d * H + 2 * n_sal_q * lk * d * H + 2 * (lq - n_sal_q) * n_sal_k * d * H
    return dense, partial


def row_linear_flops(rows: int, K: int, N: int) -> int:
    """Matmul FLOPs of ``rows`` rows of a ``[K] -> [N]`` linear layer (the bias add left out)."""
    return 2 * rows * K * N


def varlen_attention_flops(lq: list[int], lk: list[int], heads: int, head_dim: int) -> int:
    return 4 * sum(a * b for a, b in zip(lq, lk)) * heads * head_dim


def varlen_ideal_ratio(lq: list[int], lk: list[int]) -> float:
    """Work of varlen over work of the padded batch: sum(Lq*Lk) / (B * maxLq * maxLk)."""
    return sum(a * b for a, b in zip(lq, lk)) / (len(lq) * max(lq) * max(lk))


def slice_repack_bytes(total: int, bucket: int, D: int, elem: int) -> int:
    """Read the T kept rows, write the bucket's slots (values only; the int side buffers are small)."""
    return (total + bucket) * D * elem
