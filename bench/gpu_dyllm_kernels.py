"""GPU check for the DyLLM kernels: cosine_saliency, gather_rows/scatter_rows, partial_attention.

Run through ``bash bench/gpu_check.sh --only dyllm_kernels`` (not in CI). ``run(quick)`` returns
rows for ``bench/gpu_check.py``:

* bf16 correctness against the torch references on the same device: the salient index and
  count exactly (rows whose fp32 similarity lies within 1e-5 of ``tau`` may legitimately flip
  and are reported), gather/scatter bitwise, partial attention within 2x the error of torch
  computing the same formula in bf16 (against an fp64 reference, plus a 1e-2 floor), with
  GQA (Dream) and without (LLaDA), with and without the key correction (``k_old``);
* one CUDA-graph capture of the whole DyLLM sequence (saliency -> gather -> scatter ->
  partial attention) replayed on new data and compared with eager calls;
* device-event timings (``triton.testing.do_bench``, median) at LLaDA-8B shapes (32 heads,
  head dim 128, batch 16, prompt 1000 + response 256): partial attention at 5%, 20% and
  100% salient rows (random and clustered) for a response-only step (queries = response,
  keys = prompt + response) and a full step, against dense attention (the same kernel with
  every row salient, ``varlen_attention`` and torch SDPA), with the ideal FLOP ratio next to
  the measured one, and the 20% random case again with the key correction; saliency and
  gather/scatter as a fraction of peak memory bandwidth
  (``SEER_PEAK_BW`` in B/s, default an H200's 4.8e12).

Importable on a CPU-only machine: nothing touches CUDA before ``run`` is called.
"""

from __future__ import annotations

import importlib
import math
import os
import traceback
from collections.abc import Callable

import torch

H200_PEAK_BW = 4.8e12  # B/s, HBM3e

# LLaDA-8B attention and the DyLLM evaluation setting (batch 16, 256 new tokens)
LLADA = dict(H=32, Hk=32, d=128)
DREAM = dict(H=28, Hk=4, d=128)
BATCH, PROMPT, RESPONSE, D_MODEL = 16, 1000, 256, 4096


def peak_bandwidth() -> float:
    """Peak memory bandwidth in B/s: ``SEER_PEAK_BW`` if set, else the H200's."""
    return float(os.environ.get("SEER_PEAK_BW", H200_PEAK_BW))


# ------------------------------------------------------------------------------- shared helpers


def attention_flops(lq: int, lk: int, n_sal_q: int, n_sal_k: int, H: int, d: int) -> tuple[int, int]:
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


def dyllm_attention_inputs(
    batch: int,
    prompt: int,
    response: int,
    H: int,
    Hk: int,
    d: int,
    frac: float,
    *,
    response_only: bool,
    pattern: str = "random",
    device="cpu",
    dtype=torch.float32,
    seed: int = 0,
) -> tuple[dict, int, int]:
    """Packed inputs of :func:`partial_attention` for one DyLLM sparse step.

    Keys are prompt + response for every sequence; queries are the response alone
    (``response_only``) or prompt + response. ``frac`` of the query rows are salient, chosen
    uniformly (``pattern="random"``) or as one contiguous run at the start of the response
    (``"clustered"``, as in semi-autoregressive block decoding); the same token positions are
    the salient keys (their K/V were recomputed). Returns ``(kwargs, dense_flops,
    ideal_partial_flops)``.
    """
    g = torch.Generator().manual_seed(seed)
    gd = torch.Generator(device=device).manual_seed(seed)  # big tensors are drawn on the device

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(shape, generator=gd, device=device)).to(dtype)

    lk = prompt + response
    lq = response if response_only else lk
    Tq, Tk = batch * lq, batch * lk
    q, k, v = randn(Tq, H, d), randn(Tk, Hk, d), randn(Tk, Hk, d)
    cache = randn(Tq, H, d)
    n_sal = round(frac * lq)
    q_mask = torch.zeros(Tq, dtype=torch.bool)
    key_rows = []
    for b in range(batch):
        if pattern == "random":
            local = torch.randperm(lq, generator=g)[:n_sal].sort().values
        elif pattern == "clustered":
            start = (lq - response) if n_sal <= response else 0
            local = torch.arange(start, start + n_sal)
        else:
            raise ValueError(f"pattern must be 'random' or 'clustered', got {pattern!r}")
        q_mask[b * lq + local] = True
        key_local = local + (prompt if response_only else 0)  # same token, key coordinates
        key_rows.append(b * lk + key_local)
    key_rows = torch.cat(key_rows).to(torch.int32)
    index = torch.full((Tk,), -1, dtype=torch.int32)
    index[: key_rows.numel()] = key_rows
    kwargs = dict(
        q=q,
        k=k,
        v=v,
        ctx_cache=cache,
        delta_v=randn(Tk, Hk, d, scale=0.1),
        cu_seqlens_q=torch.arange(0, Tq + 1, lq, dtype=torch.int32, device=device),
        cu_seqlens_k=torch.arange(0, Tk + 1, lk, dtype=torch.int32, device=device),
        max_seqlen_q=lq,
        max_seqlen_k=lk,
        salient_q_mask=q_mask.to(device),
        salient_k_index=index.to(device),
        salient_k_count=torch.tensor([key_rows.numel()], dtype=torch.int32, device=device),
    )
    dense, partial = attention_flops(lq, lk, n_sal, n_sal, H, d)
    return kwargs, batch * dense, batch * partial


def with_k_old(args: dict, noise: float = 0.5, seed: int = 0) -> dict:
    """``args`` plus ``k_old`` for the key correction: the live salient keys moved by ``noise``
    x N(0, 1) (zeros past the count; never read)."""
    k, index = args["k"], args["salient_k_index"]
    n = int(args["salient_k_count"])
    g = torch.Generator(device=k.device).manual_seed(seed)
    k_old = torch.zeros((index.numel(), *k.shape[1:]), dtype=k.dtype, device=k.device)
    moved = k[index[:n].long()].float() + noise * torch.randn((n, *k.shape[1:]), generator=g, device=k.device)
    k_old[:n] = moved.to(k.dtype)
    return dict(args, k_old=k_old)


def saliency_pair(N: int, D: int, frac: float, *, device="cpu", dtype=torch.float32, seed: int = 0):
    """ctx and ctx_cache where about ``frac`` of the rows changed a lot and the rest barely."""
    g = torch.Generator(device=device).manual_seed(seed)
    ctx = torch.randn(N, D, generator=g, device=device)
    noise = torch.randn(N, D, generator=g, device=device)
    changed = torch.rand(N, generator=g, device=device) < frac
    amp = torch.where(changed, 1.0, 0.01).view(N, 1)
    return ctx.to(dtype), (ctx + amp * noise).to(dtype)


def _ops():
    # the modules (the package attributes of the same names are the ops)
    return (
        importlib.import_module("seer_kernels.cosine_saliency"),
        importlib.import_module("seer_kernels.row_gather_scatter"),
        importlib.import_module("seer_kernels.partial_attention"),
    )


def _lowp_partial(args: dict) -> torch.Tensor:
    """The reference's formula evaluated in the inputs' own dtype (torch's same-dtype error)."""
    q, k, v, cache, dv = args["q"], args["k"], args["v"], args["ctx_cache"], args["delta_v"]
    group = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[2])
    out = torch.zeros_like(q)
    cq, ck = args["cu_seqlens_q"].tolist(), args["cu_seqlens_k"].tolist()
    n = int(args["salient_k_count"])
    kidx = args["salient_k_index"][:n].long()
    for b in range(len(cq) - 1):
        qs, qe, ks, ke = cq[b], cq[b + 1], ck[b], ck[b + 1]
        qb = q[qs:qe].transpose(0, 1)
        kb = k[ks:ke].repeat_interleave(group, 1).transpose(0, 1)
        vb = v[ks:ke].repeat_interleave(group, 1).transpose(0, 1)
        p = torch.softmax((qb @ kb.transpose(1, 2)) * scale, dim=-1)
        pos = torch.nonzero((kidx >= ks) & (kidx < ke)).flatten()
        dvb = dv[pos].repeat_interleave(group, 1).transpose(0, 1)
        cols = kidx[pos] - ks
        approx = cache[qs:qe].transpose(0, 1) + p[:, :, cols] @ dvb
        if args.get("k_old") is not None and len(pos):
            # the key correction: its dot in the inputs' dtype, scores and sums in fp32 (as
            # torch.softmax inside; in bf16 they would flip rows near the old-mass limit)
            pa = _ops()[2]
            clamp = pa.KEY_CORRECTION_MAX_GAP_LOG2 * math.log(2)
            s = (qb.float() @ kb.float().transpose(1, 2)) * scale
            m = s.amax(-1, keepdim=True)
            l = torch.exp(s - m).sum(-1, keepdim=True)
            ko = args["k_old"][pos].float().repeat_interleave(group, 1).transpose(0, 1)
            gap = (qb.float() @ ko.transpose(1, 2)) * scale - m
            e_new, e_old = torch.exp(s[:, :, cols] - m), torch.exp(gap.clamp(max=clamp))
            sn, so = e_new.sum(-1, keepdim=True), e_old.sum(-1, keepdim=True)
            dpv = ((e_new - e_old).to(q.dtype) @ (vb[:, cols] - dvb)).float()
            corrected = approx + ((dpv - (sn - so) * cache[qs:qe].transpose(0, 1).float()) / l).to(q.dtype)
            use = (l - sn + so > 0) & (so <= pa.KEY_CORRECTION_MAX_OLD_MASS * (l - sn + so))
            approx = torch.where(use & (gap.amax(-1, keepdim=True) <= clamp), corrected, approx)
        sal = args["salient_q_mask"][qs:qe].view(1, -1, 1)
        out[qs:qe] = torch.where(sal, p @ vb, approx).transpose(0, 1)
    return out


def _fp64(args: dict) -> dict:
    return {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in args.items()}


def _fp64_references(args: dict) -> list[torch.Tensor]:
    """The fp64 reference; with ``k_old``, twice, at old-mass limits 1e-3 below and above the
    real one: a (row, head) that close to the limit may take either branch."""
    pa = _ops()[2]
    if args.get("k_old") is None:
        return [pa.partial_attention_reference(**_fp64(args))]
    limit = pa.KEY_CORRECTION_MAX_OLD_MASS
    refs = []
    try:
        for shifted in (limit - 1e-3, limit + 1e-3):
            pa.KEY_CORRECTION_MAX_OLD_MASS = shifted
            refs.append(pa.partial_attention_reference(**_fp64(args)))
    finally:
        pa.KEY_CORRECTION_MAX_OLD_MASS = limit
    return refs


def _max_err(x: torch.Tensor, refs: list[torch.Tensor]) -> float:
    """Max abs error, each (row, head) against the nearest of ``refs``."""
    return float(torch.stack([(x.double() - r).abs().amax(-1) for r in refs]).amin(0).max())


def _bench(fn: Callable[[], object], quick: bool) -> float:
    import triton.testing

    warmup, rep = (5, 20) if quick else (25, 100)
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def _bench_graph(fn: Callable[[], object], quick: bool) -> float | None:
    """Median ms replayed from a CUDA graph (no launch overhead), or None if capture fails."""
    import triton.testing

    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=10 if quick else 50, return_mode="median"))
    except Exception:
        traceback.print_exc()
        return None


def _bandwidth(nbytes: int, ms: float) -> str:
    achieved = nbytes / (ms * 1e-3)
    return f"{achieved / 1e9:.0f} GB/s = {achieved / peak_bandwidth():.1%} of peak"


# --------------------------------------------------------------------------------- correctness


def _check_saliency() -> list[dict]:
    cs, _, _ = _ops()
    rows = []
    tau = 0.99
    for N, D in [(16 * RESPONSE, D_MODEL), (1000, 4096), (37, 130)]:
        ctx, cache = saliency_pair(N, D, 0.2, device="cuda", dtype=torch.bfloat16, seed=N)
        cache[3] = ctx[3]
        ctx[5, 7] = float("nan")
        index, count, sim = cs.cosine_saliency(ctx, cache, tau)
        r_index, r_count, r_sim = cs.cosine_saliency_reference(ctx, cache, tau)
        got = set(index[: int(count)].tolist())
        want = set(r_index[: int(r_count)].tolist())
        near = set(torch.nonzero((r_sim - tau).abs() < 1e-5).flatten().tolist())
        flips = got ^ want
        tail_ok = bool((index[int(count) :] == cs.INDEX_PAD).all())
        ascending = bool((index[1 : int(count)] > index[: int(count) - 1]).all()) if int(count) > 1 else True
        both = ~(sim.isnan() | r_sim.isnan())
        sim_err = float((sim[both] - r_sim[both]).abs().max())
        same_nan = bool(torch.equal(sim.isnan(), r_sim.isnan()))
        ok = (
            flips <= near
            and tail_ok
            and ascending
            and sim_err < 1e-5
            and same_nan
            and 5 in got
            and 3 not in got
        )
        rows.append(
            {
                "check": f"cosine_saliency bf16 [{N},{D}] vs reference",
                "ok": ok,
                "ms": None,
                "note": f"count {int(count)} (ref {int(r_count)}), {len(flips)} flips near tau: "
                f"{flips <= near}; max |sim diff| {sim_err:.1e}",
            }
        )
    return rows


def _check_gather_scatter() -> list[dict]:
    cs, rg, _ = _ops()
    rows = []
    for N, D in [(16 * 1256, D_MODEL), (77, 1000)]:
        g = torch.Generator(device="cuda").manual_seed(N)
        src = torch.randn(N, D, device="cuda", generator=g).to(torch.bfloat16)
        ctx, cache = saliency_pair(N, 256, 0.2, device="cuda", dtype=torch.bfloat16, seed=N)
        index, count, _ = cs.cosine_saliency(ctx, cache, 0.99)
        out = rg.gather_rows(src, index, count)
        ok = bool(torch.equal(out, rg.gather_rows_reference(src, index, count)))
        upd = torch.randn(N, D, device="cuda", generator=g).to(torch.bfloat16)
        dst, dst_ref = src.clone(), src.clone()
        rg.scatter_rows(dst, index, count, upd)
        rg.scatter_rows_reference(dst_ref, index, count, upd)
        ok &= bool(torch.equal(dst, dst_ref))
        rows.append(
            {
                "check": f"gather/scatter bf16 [{N},{D}] vs reference",
                "ok": ok,
                "ms": None,
                "note": f"bitwise, {int(count)} live rows",
            }
        )
    return rows


def _check_partial_attention() -> list[dict]:
    _, _, pa = _ops()
    rows = []
    for name, shape in (("LLaDA", LLADA), ("Dream GQA", DREAM)):
        for response_only, key_correction in ((True, False), (False, False), (True, True), (False, True)):
            args, _, _ = dyllm_attention_inputs(
                3,
                300,
                64,
                shape["H"],
                shape["Hk"],
                shape["d"],
                0.2,
                response_only=response_only,
                device="cuda",
                dtype=torch.bfloat16,
                seed=1,
            )
            if key_correction:
                args = with_k_old(args, seed=1)
            out = pa.partial_attention(**args)
            refs = _fp64_references(args)
            err, base = _max_err(out, refs), _max_err(_lowp_partial(args), refs)
            ok = err <= 2 * base + 1e-2
            step = ("response-only" if response_only else "full") + (" + k_old" if key_correction else "")
            rows.append(
                {
                    "check": f"partial_attention bf16 {name} {step} vs fp64",
                    "ok": ok,
                    "ms": None,
                    "note": f"max err {err:.2e} vs torch bf16 {base:.2e} (rule: <= 2x + 1e-2)",
                }
            )
    return rows


def _check_graph_capture() -> list[dict]:
    """Capture saliency -> gather -> scatter -> partial attention once, replay on new data."""
    cs, rg, pa = _ops()
    N, D = 2 * 300, 512
    args, _, _ = dyllm_attention_inputs(
        2, 236, 64, 8, 8, 64, 0.2, response_only=False, device="cuda", dtype=torch.bfloat16, seed=3
    )
    ctx, cache = saliency_pair(N, D, 0.2, device="cuda", dtype=torch.bfloat16, seed=4)
    hidden = torch.randn(N, D, device="cuda").to(torch.bfloat16)
    idx = torch.empty(N, dtype=torch.int32, device="cuda")
    cnt = torch.empty(1, dtype=torch.int32, device="cuda")
    sim = torch.empty(N, dtype=torch.float32, device="cuda")
    rows_buf = torch.empty(N, D, dtype=torch.bfloat16, device="cuda")
    ffn = torch.zeros(N, D, dtype=torch.bfloat16, device="cuda")
    attn_out = torch.empty_like(args["q"])

    def step():
        cs.cosine_saliency(ctx, cache, 0.99, out_index=idx, out_count=cnt, out_similarity=sim)
        rg.gather_rows(hidden, idx, cnt, out=rows_buf)
        rg.scatter_rows(ffn, idx, cnt, rows_buf * 2)
        pa.partial_attention(**args, out=attn_out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up compiles and autotunes outside the capture
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # new data in the same buffers, then replay
    new_ctx, new_cache = saliency_pair(N, D, 0.3, device="cuda", dtype=torch.bfloat16, seed=5)
    ctx.copy_(new_ctx)
    cache.copy_(new_cache)
    ffn.zero_()
    args["q"].copy_(torch.randn_like(args["q"]))
    graph.replay()
    torch.cuda.synchronize()
    e_idx, e_cnt, _ = cs.cosine_saliency(ctx, cache, 0.99)
    e_ffn = torch.zeros_like(ffn)
    rg.scatter_rows(e_ffn, e_idx, e_cnt, rg.gather_rows(hidden, e_idx, e_cnt) * 2)
    e_attn = pa.partial_attention(**args)
    ok = (
        torch.equal(idx, e_idx)
        and torch.equal(cnt, e_cnt)
        and torch.equal(ffn, e_ffn)
        and torch.equal(attn_out, e_attn)
    )
    return [
        {
            "check": "CUDA-graph capture + replay of saliency/gather/scatter/partial attention",
            "ok": bool(ok),
            "ms": None,
            "note": f"replayed count {int(cnt)} == eager {int(e_cnt)}",
        }
    ]


# ------------------------------------------------------------------------------------ timings


def _sdpa_dense(args: dict) -> Callable[[], object]:
    """Torch SDPA on the same problem (uniform lengths: padded batch without padding)."""
    lq, lk = args["max_seqlen_q"], args["max_seqlen_k"]
    B = args["cu_seqlens_q"].numel() - 1
    H, Hk = args["q"].shape[1], args["k"].shape[1]
    q = args["q"].view(B, lq, H, -1).transpose(1, 2)
    k = args["k"].view(B, lk, Hk, -1).transpose(1, 2)
    v = args["v"].view(B, lk, Hk, -1).transpose(1, 2)
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=H != Hk)


def _varlen_dense(args: dict) -> Callable[[], object] | None:
    try:
        va = importlib.import_module("seer_kernels.varlen_attention")
    except Exception:
        return None
    keys = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
    return lambda: va.varlen_attention(*(args[k] for k in keys))


def _time_partial_attention(quick: bool) -> list[dict]:
    _, _, pa = _ops()
    rows = []
    steps = [True] if quick else [True, False]
    fracs = [(0.05, "random"), (0.05, "clustered"), (0.2, "random"), (0.2, "clustered"), (1.0, "random")]
    for response_only in steps:
        label = "response-only" if response_only else "full"
        dense_ms = {}
        base_args, dense_flops, _ = dyllm_attention_inputs(
            BATCH,
            PROMPT,
            RESPONSE,
            LLADA["H"],
            LLADA["Hk"],
            LLADA["d"],
            1.0,
            response_only=response_only,
            device="cuda",
            dtype=torch.bfloat16,
        )
        dense_ms["sdpa"] = _bench(_sdpa_dense(base_args), quick)
        varlen = _varlen_dense(base_args)
        if varlen is not None:
            dense_ms["varlen_attention"] = _bench(varlen, quick)
        out = torch.empty_like(base_args["q"])
        dense_ms["partial@100%"] = _bench(lambda a=base_args, o=out: pa.partial_attention(**a, out=o), quick)
        for name, ms in dense_ms.items():
            tflops = dense_flops / (ms * 1e-3) / 1e12
            rows.append(
                {
                    "check": f"dense attention {name} LLaDA-8B {label} bf16",
                    "ok": None,
                    "ms": ms,
                    "note": f"{tflops:.0f} TFLOP/s",
                }
            )
        ref_name = "varlen_attention" if "varlen_attention" in dense_ms else "sdpa"
        ref_ms = dense_ms[ref_name]
        for frac, pattern in fracs:
            args, dense, ideal = dyllm_attention_inputs(
                BATCH,
                PROMPT,
                RESPONSE,
                LLADA["H"],
                LLADA["Hk"],
                LLADA["d"],
                frac,
                response_only=response_only,
                pattern=pattern,
                device="cuda",
                dtype=torch.bfloat16,
                seed=7,
            )
            out = torch.empty_like(args["q"])
            ms = _bench(lambda a=args, o=out: pa.partial_attention(**a, out=o), quick)
            rows.append(
                {
                    "check": f"partial_attention {frac:.0%} {pattern} LLaDA-8B {label} bf16",
                    "ok": None,
                    "ms": ms,
                    "note": (
                        f"ideal FLOP ratio {ideal / dense:.3f}; measured vs own 100% "
                        f"{ms / dense_ms['partial@100%']:.3f}, vs {ref_name} {ms / ref_ms:.3f}, "
                        f"vs sdpa {ms / dense_ms['sdpa']:.3f}"
                    ),
                }
            )
            if (frac, pattern) == (0.2, "random"):
                args = with_k_old(args, seed=7)
                ms_kc = _bench(lambda a=args, o=out: pa.partial_attention(**a, out=o), quick)
                rows.append(
                    {
                        "check": f"partial_attention {frac:.0%} {pattern} + k_old LLaDA-8B {label} bf16",
                        "ok": None,
                        "ms": ms_kc,
                        "note": f"{ms_kc / ms:.3f} x without the key correction",
                    }
                )
            del args, out
    return rows


def _time_saliency_and_rows(quick: bool) -> list[dict]:
    cs, rg, _ = _ops()
    rows = []
    for label, N in (("response-only", BATCH * RESPONSE), ("full", BATCH * (PROMPT + RESPONSE))):
        ctx, cache = saliency_pair(N, D_MODEL, 0.2, device="cuda", dtype=torch.bfloat16, seed=11)
        idx = torch.empty(N, dtype=torch.int32, device="cuda")
        cnt = torch.empty(1, dtype=torch.int32, device="cuda")
        sim = torch.empty(N, dtype=torch.float32, device="cuda")

        def fn(ctx=ctx, cache=cache, idx=idx, cnt=cnt, sim=sim):
            return cs.cosine_saliency(ctx, cache, 0.99, out_index=idx, out_count=cnt, out_similarity=sim)

        eager = _bench(fn, quick)
        graphed = _bench_graph(fn, quick)
        ms = graphed if graphed is not None else eager
        nbytes = 2 * N * D_MODEL * 2 + N * 4 * 2 + N * 4
        rows.append(
            {
                "check": f"cosine_saliency [{N},{D_MODEL}] bf16 ({label})",
                "ok": None,
                "ms": ms,
                "note": f"{'graph' if graphed is not None else 'eager'}; eager {eager:.4f} ms; "
                f"{_bandwidth(nbytes, ms)}",
            }
        )
        n_live = int(cnt)
        src = torch.randn(N, D_MODEL, device="cuda").to(torch.bfloat16)
        buf = torch.empty_like(src)
        for zero_tail in (True, False):
            ms = _bench(
                lambda zt=zero_tail, src=src, idx=idx, cnt=cnt, buf=buf: rg.gather_rows(
                    src, idx, cnt, out=buf, zero_tail=zt
                ),
                quick,
            )
            nbytes = 2 * n_live * D_MODEL * 2 + (N - n_live) * D_MODEL * 2 * zero_tail + N * 4
            rows.append(
                {
                    "check": f"gather_rows {n_live}/{N} rows x {D_MODEL} bf16 zero_tail={zero_tail}",
                    "ok": None,
                    "ms": ms,
                    "note": _bandwidth(nbytes, ms),
                }
            )
        dst = torch.empty_like(src)
        ms = _bench(lambda dst=dst, idx=idx, cnt=cnt, buf=buf: rg.scatter_rows(dst, idx, cnt, buf), quick)
        rows.append(
            {
                "check": f"scatter_rows {n_live}/{N} rows x {D_MODEL} bf16",
                "ok": None,
                "ms": ms,
                "note": _bandwidth(2 * n_live * D_MODEL * 2 + N * 4, ms),
            }
        )
        del ctx, cache, src, buf, dst
    return rows


def run(quick: bool) -> list[dict]:
    """All rows of the DyLLM kernel check; each part runs even if another one crashed."""
    rows: list[dict] = []
    parts = [_check_saliency, _check_gather_scatter, _check_partial_attention, _check_graph_capture]
    for part in parts:
        try:
            rows.extend(part())
        except Exception:
            traceback.print_exc()
            rows.append({"check": f"{part.__name__} crashed", "ok": False, "ms": None, "note": ""})
    for part in (_time_saliency_and_rows, _time_partial_attention):
        try:
            rows.extend(part(quick))
        except Exception:
            traceback.print_exc()
            rows.append({"check": f"{part.__name__} crashed", "ok": False, "ms": None, "note": "timing part"})
        torch.cuda.empty_cache()
    return rows
