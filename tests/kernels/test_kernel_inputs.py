"""Bad input to every public seer_kernels op: a TypeError/ValueError naming the argument, never a
silent clamp (issue 20). One enumerated case per bad input (shape, dtype, device, scalar, count),
then hypothesis over the scalar arguments (NaN, inf, 0, negative, huge, wrong types).

Devices: a ``meta`` tensor is a cheap second device. Cases a kernel still accepts silently are
marked ``xfail(strict=True)`` with what it does instead, so a fix turns them into passes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seer_kernels as sk

pytestmark = pytest.mark.usefixtures("reference_kernels")

NAN, INF = float("nan"), float("inf")
HYPOTHESIS = settings(max_examples=25, deadline=None, derandomize=True,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])


# ------------------------------------------------------------------------------------ valid inputs
def act(t=5, f=8, dtype=torch.float32):
    return torch.randn(2, t, f, dtype=dtype)


def sparsity(b=2, n=9):
    return torch.rand(b, n)


def varlen(lens_q=(3, 4), lens_k=(3, 4), h=2, hk=1, d=8):
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    return dict(q=torch.randn(tq, h, d), k=torch.randn(tk, hk, d), v=torch.randn(tk, hk, d), cu_seqlens_q=cu_q,
                cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))


def partial(**over):
    base = varlen()
    tq, tk = base["q"].shape[0], base["k"].shape[0]
    cap = tk
    index = torch.full((cap,), -1, dtype=torch.int32)
    index[:2] = torch.tensor([1, 4], dtype=torch.int32)
    base.update(ctx_cache=torch.randn_like(base["q"]), delta_v=torch.randn(cap, 1, 8),
                salient_q_mask=torch.zeros(tq, dtype=torch.bool), salient_k_index=index,
                salient_k_count=torch.tensor([2], dtype=torch.int32))
    base.update(over)
    return base


def call_partial(**over):
    a = partial(**over)
    return sk.partial_attention(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("ctx_cache"), a.pop("delta_v"),
                                a.pop("cu_seqlens_q"), a.pop("cu_seqlens_k"), a.pop("max_seqlen_q"),
                                a.pop("max_seqlen_k"), a.pop("salient_q_mask"), a.pop("salient_k_index"),
                                a.pop("salient_k_count"), **a)


def call_varlen(**over):
    a = {**varlen(), **over}
    return sk.varlen_attention(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("cu_seqlens_q"), a.pop("cu_seqlens_k"),
                               a.pop("max_seqlen_q"), a.pop("max_seqlen_k"), **a)


TABLES = dict(micro_buckets=(8, 16), packed_buckets=(16, 32, 64), batch_buckets=(1, 2, 4))


def call_repack(values=None, keep_len=None, **over):
    values = torch.arange(2 * 16).reshape(2, 16) if values is None else values
    keep_len = torch.tensor([5, 9]) if keep_len is None else keep_len
    return sk.slice_repack(values, keep_len, **{**TABLES, **over})


def ctx(n=6, d=8):
    return torch.randn(n, d)


def rows(n=6, f=4):
    return torch.randn(n, f)


IDX = torch.tensor([0, 2, 5, -1], dtype=torch.int32)  # capacity 4, 3 live slots


# ------------------------------------------------------------------------------------ the cases
@dataclass(frozen=True)
class Bad:
    id: str
    call: Callable[[], object]
    error: type[Exception]
    names: str  # regex: the argument the message must name
    silent: str | None = None  # what the op does instead of raising (xfail strict)


def meta(t: torch.Tensor) -> torch.Tensor:
    return t.to("meta")


CASES = [
    # mlp_sparsity / swiglu_sparsity
    Bad("mlp_sparsity-act-int", lambda: sk.mlp_sparsity(torch.ones(2, 3, dtype=torch.int32), 0.1), TypeError, "act"),
    Bad("mlp_sparsity-act-1d", lambda: sk.mlp_sparsity(torch.ones(3), 0.1), ValueError, "act"),
    Bad("mlp_sparsity-act-list", lambda: sk.mlp_sparsity([[1.0]], 0.1), TypeError, "act"),
    Bad("mlp_sparsity-act-F0", lambda: sk.mlp_sparsity(torch.ones(2, 3, 0), 0.1), ValueError, "act"),
    Bad("mlp_sparsity-eps-nan", lambda: sk.mlp_sparsity(act(), NAN), ValueError, "eps"),
    Bad("mlp_sparsity-eps-negative", lambda: sk.mlp_sparsity(act(), -0.5), ValueError, "eps"),
    Bad("mlp_sparsity-eps-bool", lambda: sk.mlp_sparsity(act(), True), TypeError, "eps"),
    Bad("mlp_sparsity-eps-str", lambda: sk.mlp_sparsity(act(), "0.1"), TypeError, "eps"),
    Bad("mlp_sparsity-lengths-shape", lambda: sk.mlp_sparsity(act(), 0.1, lengths=torch.tensor([1, 2, 3])),
        ValueError, "lengths"),
    Bad("mlp_sparsity-lengths-float", lambda: sk.mlp_sparsity(act(), 0.1, lengths=torch.tensor([1.0, 2.0])),
        TypeError, "lengths"),
    Bad("mlp_sparsity-lengths-negative", lambda: sk.mlp_sparsity(act(), 0.1, lengths=torch.tensor([-1, 2])),
        ValueError, "lengths"),
    Bad("mlp_sparsity-lengths-past-T", lambda: sk.mlp_sparsity(act(), 0.1, lengths=torch.tensor([6, 2])),
        ValueError, "lengths"),
    Bad("mlp_sparsity-lengths-meta", lambda: sk.mlp_sparsity(act(), 0.1, lengths=meta(torch.tensor([1, 2]))),
        ValueError, "lengths"),
    Bad("swiglu_sparsity-shape", lambda: sk.swiglu_sparsity(act(), act(f=9), 0.1), ValueError, "up"),
    Bad("swiglu_sparsity-dtype", lambda: sk.swiglu_sparsity(act(), act(dtype=torch.float16), 0.1), TypeError, "up"),
    Bad("swiglu_sparsity-device", lambda: sk.swiglu_sparsity(act(), meta(act()), 0.1), ValueError, "up"),
    Bad("swiglu_sparsity-out-shape", lambda: sk.swiglu_sparsity(act(), act(), 0.1, out=act(t=4)), ValueError, "out"),
    # snr_boundary
    Bad("snr_boundary-sparsity-1d", lambda: sk.snr_boundary(torch.rand(9), torch.tensor([9])), ValueError,
        "sparsity"),
    Bad("snr_boundary-sparsity-int", lambda: sk.snr_boundary(torch.ones(2, 9, dtype=torch.long),
                                                             torch.tensor([9, 9])), TypeError, "sparsity"),
    Bad("snr_boundary-valid_len-rows", lambda: sk.snr_boundary(sparsity(), torch.tensor([9])), ValueError,
        "valid_len"),
    Bad("snr_boundary-valid_len-float", lambda: sk.snr_boundary(sparsity(), torch.tensor([9.0, 9.0])), TypeError,
        "valid_len"),
    Bad("snr_boundary-valid_len-past-N", lambda: sk.snr_boundary(sparsity(), torch.tensor([10, 9])), ValueError,
        "valid_len"),
    Bad("snr_boundary-valid_len-negative", lambda: sk.snr_boundary(sparsity(), torch.tensor([-1, 9])), ValueError,
        "valid_len"),
    Bad("snr_boundary-valid_len-meta", lambda: sk.snr_boundary(sparsity(), meta(torch.tensor([9, 9]))),
        ValueError, "valid_len"),
    Bad("snr_boundary-tau_jump-0", lambda: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), tau_jump=0.0),
        ValueError, "tau_jump"),
    Bad("snr_boundary-tau_jump-nan", lambda: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), tau_jump=NAN),
        ValueError, "tau_jump"),
    Bad("snr_boundary-tau_jump-inf", lambda: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), tau_jump=INF),
        ValueError, "tau_jump"),
    Bad("snr_boundary-gamma-inf", lambda: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), gamma=INF),
        ValueError, "gamma"),
    Bad("snr_boundary-gamma-negative", lambda: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), gamma=-0.1),
        ValueError, "gamma"),
    Bad("snr_boundary-window-0", lambda: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), window=0), ValueError,
        "window"),
    Bad("snr_boundary-window-float", lambda: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), window=2.5),
        TypeError, "window"),
    Bad("snr_boundary-window-bool", lambda: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), window=True),
        TypeError, "window"),
    Bad("snr_boundary-baseline_window-0",
        lambda: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), baseline_window=0), ValueError, "baseline_window"),
    Bad("snr_boundary-min_position-0", lambda: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), min_position=0),
        ValueError, "min_position"),
    # varlen_attention
    Bad("varlen_attention-q-2d", lambda: call_varlen(q=torch.randn(7, 16)), ValueError, "q"),
    Bad("varlen_attention-q-int", lambda: call_varlen(q=torch.ones(7, 2, 8, dtype=torch.long)), TypeError, "q"),
    Bad("varlen_attention-k-dtype", lambda: call_varlen(k=torch.randn(7, 1, 8, dtype=torch.float16)), TypeError,
        "k"),
    Bad("varlen_attention-head_dim-300", lambda: call_varlen(**varlen(d=300)), ValueError, "head dim"),
    Bad("varlen_attention-heads-not-multiple", lambda: call_varlen(**varlen(h=3, hk=2)), ValueError, "head count"),
    Bad("varlen_attention-cu-int64", lambda: call_varlen(cu_seqlens_q=torch.tensor([0, 3, 7])), TypeError,
        "cu_seqlens_q"),
    Bad("varlen_attention-cu-decreasing",
        lambda: call_varlen(cu_seqlens_q=torch.tensor([0, 5, 3], dtype=torch.int32)), ValueError, "cu_seqlens_q"),
    Bad("varlen_attention-cu-first-not-0",
        lambda: call_varlen(cu_seqlens_q=torch.tensor([1, 3, 7], dtype=torch.int32)), ValueError, "cu_seqlens_q"),
    Bad("varlen_attention-cu-past-total",
        lambda: call_varlen(cu_seqlens_q=torch.tensor([0, 3, 9], dtype=torch.int32)), ValueError, "cu_seqlens_q"),
    Bad("varlen_attention-cu-count-mismatch",
        lambda: call_varlen(cu_seqlens_k=torch.tensor([0, 7], dtype=torch.int32)), ValueError, "cu_seqlens"),
    Bad("varlen_attention-max_seqlen-too-small", lambda: call_varlen(max_seqlen_q=2), ValueError, "max_seqlen_q"),
    Bad("varlen_attention-max_seqlen-negative", lambda: call_varlen(max_seqlen_q=-1), ValueError, "max_seqlen_q"),
    Bad("varlen_attention-max_seqlen-float", lambda: call_varlen(max_seqlen_q=4.0), TypeError, "max_seqlen_q"),
    Bad("varlen_attention-max_seqlen-tensor", lambda: call_varlen(max_seqlen_q=torch.tensor(4)), TypeError,
        "max_seqlen_q"),
    Bad("varlen_attention-softmax_scale-nan", lambda: call_varlen(softmax_scale=NAN), ValueError, "softmax_scale"),
    Bad("varlen_attention-softmax_scale-inf", lambda: call_varlen(softmax_scale=INF), ValueError, "softmax_scale"),
    Bad("varlen_attention-causal-str", lambda: call_varlen(causal="yes"), TypeError, "causal"),
    Bad("varlen_attention-out-shape", lambda: call_varlen(out=torch.empty(6, 2, 8)), ValueError, "out"),
    Bad("varlen_attention-device", lambda: call_varlen(v=meta(torch.randn(7, 1, 8))), ValueError, "v on meta"),
    # slice_repack
    Bad("slice_repack-values-1d", lambda: call_repack(values=torch.arange(5), keep_len=torch.tensor([3])),
        ValueError, "values"),
    Bad("slice_repack-values-float-ids", lambda: call_repack(values=torch.rand(2, 16)), TypeError, "values"),
    Bad("slice_repack-keep_len-rows", lambda: call_repack(keep_len=torch.tensor([5])), ValueError, "keep_len"),
    Bad("slice_repack-keep_len-past-N", lambda: call_repack(keep_len=torch.tensor([5, 17])), ValueError, "keep_len"),
    Bad("slice_repack-keep_len-negative", lambda: call_repack(keep_len=torch.tensor([-1, 3])), ValueError,
        "keep_len"),
    Bad("slice_repack-row_ids-range", lambda: call_repack(row_ids=torch.tensor([0, 2])), ValueError, "row_ids"),
    Bad("slice_repack-keep_len-meta", lambda: call_repack(keep_len=meta(torch.tensor([5, 9]))), ValueError,
        "keep_len"),
    Bad("slice_repack-tau_pad-nan", lambda: call_repack(tau_pad=NAN), TypeError, "tau_pad"),
    Bad("slice_repack-tau_pad-negative", lambda: call_repack(tau_pad=-0.5), ValueError, "tau_pad"),
    Bad("slice_repack-tau_pad-above-1", lambda: call_repack(tau_pad=2.0), ValueError, "tau_pad"),
    Bad("slice_repack-eager_max_bucket-negative", lambda: call_repack(eager_max_bucket=-1), ValueError,
        "eager_max_bucket"),
    Bad("slice_repack-pad_value-float-ids", lambda: call_repack(pad_value=0.5), TypeError, "pad_value"),
    Bad("slice_repack-pad_value-overflow", lambda: call_repack(values=torch.zeros(2, 16, dtype=torch.int32),
                                                               pad_value=2**40), ValueError, "pad_value"),
    Bad("slice_repack-table-unsorted", lambda: call_repack(micro_buckets=(16, 8)), ValueError, "micro_buckets"),
    Bad("slice_repack-table-zero", lambda: call_repack(batch_buckets=(0, 2)), ValueError, "batch_buckets"),
    Bad("slice_repack-table-float", lambda: call_repack(packed_buckets=(16.0, 32.0)), TypeError, "packed_buckets"),
    # cosine_saliency
    Bad("cosine_saliency-shape", lambda: sk.cosine_saliency(ctx(), ctx(n=5), 0.9), ValueError, "ctx_cache"),
    Bad("cosine_saliency-dtype", lambda: sk.cosine_saliency(ctx(), ctx().half(), 0.9), TypeError, "ctx_cache"),
    Bad("cosine_saliency-device", lambda: sk.cosine_saliency(ctx(), meta(ctx()), 0.9), ValueError, "ctx_cache"),
    Bad("cosine_saliency-tau-nan", lambda: sk.cosine_saliency(ctx(), ctx(), NAN), ValueError, "tau"),
    Bad("cosine_saliency-tau-str", lambda: sk.cosine_saliency(ctx(), ctx(), "0.9"), TypeError, "tau"),
    Bad("cosine_saliency-n_rows-negative", lambda: sk.cosine_saliency(ctx(), ctx(), 0.9, n_rows=-1), ValueError,
        "n_rows"),
    Bad("cosine_saliency-n_rows-past-N", lambda: sk.cosine_saliency(ctx(), ctx(), 0.9, n_rows=7), ValueError,
        "n_rows"),
    Bad("cosine_saliency-n_rows-float", lambda: sk.cosine_saliency(ctx(), ctx(), 0.9, n_rows=2.0), TypeError,
        "n_rows"),
    Bad("cosine_saliency-n_rows-int64-tensor",
        lambda: sk.cosine_saliency(ctx(), ctx(), 0.9, n_rows=torch.tensor([3])), ValueError, "n_rows"),
    Bad("cosine_saliency-out_index-small",
        lambda: sk.cosine_saliency(ctx(), ctx(), 0.9, out_index=torch.empty(5, dtype=torch.int32)), ValueError,
        "out_index"),
    Bad("cosine_saliency-index_pad-float", lambda: sk.cosine_saliency(ctx(), ctx(), 0.9, index_pad=0.0), TypeError,
        "index_pad"),
    Bad("cosine_saliency-index_pad-past-int32", lambda: sk.cosine_saliency(ctx(), ctx(), 0.9, index_pad=2**31),
        ValueError, "index_pad"),
    Bad("cosine_saliency-out_salient-dtype",
        lambda: sk.cosine_saliency(ctx(), ctx(), 0.9, out_salient=torch.empty(6, dtype=torch.uint8)), TypeError,
        "out_salient"),
    Bad("cosine_saliency-out_salient-length",
        lambda: sk.cosine_saliency(ctx(), ctx(), 0.9, out_salient=torch.empty(5, dtype=torch.bool)), ValueError,
        "out_salient"),
    Bad("cosine_saliency-out_count-dtype",
        lambda: sk.cosine_saliency(ctx(), ctx(), 0.9, out_count=torch.empty(1, dtype=torch.long)), TypeError,
        "out_count"),
    # gather_rows / scatter_rows
    Bad("gather_rows-src-1d", lambda: sk.gather_rows(torch.randn(6), IDX, 3), ValueError, "src"),
    Bad("gather_rows-index-float", lambda: sk.gather_rows(rows(), IDX.float(), 3), TypeError, "index"),
    Bad("gather_rows-index-range", lambda: sk.gather_rows(rows(), torch.tensor([0, 6, -1, -1],
                                                                                dtype=torch.int32), 2),
        ValueError, "index"),
    Bad("gather_rows-count-past-capacity", lambda: sk.gather_rows(rows(), IDX, 5), ValueError, "count"),
    Bad("gather_rows-count-negative", lambda: sk.gather_rows(rows(), IDX, -1), ValueError, "count"),
    Bad("gather_rows-count-float", lambda: sk.gather_rows(rows(), IDX, 2.0), TypeError, "count"),
    Bad("gather_rows-out-dtype", lambda: sk.gather_rows(rows(), IDX, 3, out=torch.empty(4, 4, dtype=torch.half)),
        TypeError, "out"),
    Bad("gather_rows-device", lambda: sk.gather_rows(rows(), meta(IDX), 3), ValueError, "index"),
    Bad("scatter_rows-duplicates", lambda: sk.scatter_rows(rows(), torch.tensor([1, 1, -1, -1], dtype=torch.int32),
                                                           2, torch.randn(4, 4)), ValueError, "index"),
    Bad("scatter_rows-src-shape", lambda: sk.scatter_rows(rows(), IDX, 3, torch.randn(3, 4)), ValueError, "src"),
    Bad("scatter_rows-src-dtype", lambda: sk.scatter_rows(rows(), IDX, 3, torch.randn(4, 4, dtype=torch.float64)),
        TypeError, "src"),
    Bad("exchange_rows-duplicates", lambda: sk.exchange_rows(rows(), torch.tensor([1, 1, -1, -1], dtype=torch.int32),
                                                             2, torch.randn(4, 4)), ValueError, "index"),
    Bad("exchange_rows-rows-shape", lambda: sk.exchange_rows(rows(), IDX, 3, torch.randn(3, 4)), ValueError, "rows"),
    Bad("exchange_rows-rows-dtype", lambda: sk.exchange_rows(rows(), IDX, 3, torch.randn(4, 4).half()), TypeError,
        "rows"),
    Bad("exchange_rows-count-past-capacity", lambda: sk.exchange_rows(rows(), IDX, 5, torch.randn(4, 4)), ValueError,
        "count"),
    Bad("exchange_rows-delta-int", lambda: sk.exchange_rows(rows(), IDX, 3, torch.randn(4, 4), delta=1), TypeError,
        "delta"),
    Bad("exchange_rows-device", lambda: sk.exchange_rows(rows(), IDX, 3, meta(torch.randn(4, 4))), ValueError,
        "rows"),
    # partial_attention
    Bad("partial_attention-q-int", lambda: call_partial(q=torch.ones(7, 2, 8, dtype=torch.long)), TypeError, "q"),
    Bad("partial_attention-ctx_cache-shape", lambda: call_partial(ctx_cache=torch.randn(6, 2, 8)), ValueError,
        "ctx_cache"),
    Bad("partial_attention-delta_v-shape", lambda: call_partial(delta_v=torch.randn(3, 1, 8)), ValueError,
        "delta_v"),
    Bad("partial_attention-salient_q_mask-dtype", lambda: call_partial(salient_q_mask=torch.zeros(7)), TypeError,
        "salient_q_mask"),
    Bad("partial_attention-salient_k_index-unsorted",
        lambda: call_partial(salient_k_index=torch.tensor([4, 1, -1, -1, -1, -1, -1], dtype=torch.int32)),
        ValueError, "salient_k_index"),
    Bad("partial_attention-salient_k_index-range",
        lambda: call_partial(salient_k_index=torch.tensor([1, 7, -1, -1, -1, -1, -1], dtype=torch.int32)),
        ValueError, "salient_k_index"),
    Bad("partial_attention-count-past-capacity", lambda: call_partial(salient_k_count=8), ValueError,
        "salient_k_count"),
    Bad("partial_attention-count-int64", lambda: call_partial(salient_k_count=torch.tensor([2])), ValueError,
        "salient_k_count"),
    Bad("partial_attention-max_seqlen-too-small", lambda: call_partial(max_seqlen_k=1), ValueError,
        "cu_seqlens_k.*max_seqlen"),
    Bad("partial_attention-softmax_scale-inf", lambda: call_partial(softmax_scale=INF), ValueError, "softmax_scale"),
    Bad("partial_attention-k_old-shape", lambda: call_partial(k_old=torch.randn(2, 1, 8)), ValueError, "k_old"),
    Bad("partial_attention-device", lambda: call_partial(salient_q_mask=meta(torch.zeros(7, dtype=torch.bool))),
        ValueError, "salient_q_mask"),
    # row_linear
    Bad("row_linear-x-1d", lambda: sk.row_linear(torch.randn(4), torch.randn(3, 4), None, 2), ValueError, "x"),
    Bad("row_linear-K-mismatch", lambda: sk.row_linear(torch.randn(4, 5), torch.randn(3, 4), None, 2), ValueError,
        "weight"),
    Bad("row_linear-count-past-capacity", lambda: sk.row_linear(torch.randn(4, 4), torch.randn(3, 4), None, 5),
        ValueError, "count"),
    Bad("row_linear-count-negative", lambda: sk.row_linear(torch.randn(4, 4), torch.randn(3, 4), None, -1),
        ValueError, "count"),
    Bad("row_linear-count-float", lambda: sk.row_linear(torch.randn(4, 4), torch.randn(3, 4), None, 2.5),
        TypeError, "count"),
    Bad("row_linear-bias-shape", lambda: sk.row_linear(torch.randn(4, 4), torch.randn(3, 4), torch.randn(5), 2),
        ValueError, "bias"),
    Bad("row_linear-dtype-mismatch", lambda: sk.row_linear(torch.randn(4, 4), torch.randn(3, 4).half(), None, 2),
        TypeError, "weight"),
    Bad("row_linear_pair-weight_b-shape",
        lambda: sk.row_linear_pair(torch.randn(4, 4), torch.randn(3, 4), None, torch.randn(2, 4), None, 2), ValueError,
        "weight_b"),
    Bad("row_linear_pair-weight_a-dtype",
        lambda: sk.row_linear_pair(torch.randn(4, 4), torch.randn(3, 4).half(), None, torch.randn(3, 4), None, 2),
        TypeError, "weight_a"),
    Bad("row_linear_pair-bias_b-shape",
        lambda: sk.row_linear_pair(torch.randn(4, 4), torch.randn(3, 4), None, torch.randn(3, 4), torch.randn(4), 2),
        ValueError, "bias_b"),
    Bad("row_linear_pair-count-past-capacity",
        lambda: sk.row_linear_pair(torch.randn(4, 4), torch.randn(3, 4), None, torch.randn(3, 4), None, 5), ValueError,
        "count"),
    Bad("row_linear-device", lambda: sk.row_linear(torch.randn(4, 4), meta(torch.randn(3, 4)), None, 2),
        ValueError, "weight"),
    # rms_norm
    Bad("rms_norm-x-1d", lambda: sk.rms_norm(torch.randn(4), torch.ones(4), 1e-6), ValueError, "x"),
    Bad("rms_norm-x-int", lambda: sk.rms_norm(torch.ones(2, 4, dtype=torch.long), torch.ones(4), 1e-6), TypeError,
        "x"),
    Bad("rms_norm-weight-shape", lambda: sk.rms_norm(rows(), torch.ones(5), 1e-6), ValueError, "weight"),
    Bad("rms_norm-eps-0", lambda: sk.rms_norm(rows(), torch.ones(4), 0.0), ValueError, "eps"),
    Bad("rms_norm-eps-nan", lambda: sk.rms_norm(rows(), torch.ones(4), NAN), ValueError, "eps"),
    Bad("rms_norm-index-without-count", lambda: sk.rms_norm(rows(), torch.ones(4), 1e-6, index=IDX), ValueError,
        "count"),
    Bad("rms_norm-index-range", lambda: sk.rms_norm(rows(), torch.ones(4), 1e-6,
                                                    index=torch.tensor([0, 6, -1, -1], dtype=torch.int32), count=2),
        ValueError, "index"),
    Bad("rms_norm-count-past-capacity", lambda: sk.rms_norm(rows(), torch.ones(4), 1e-6, index=IDX, count=5),
        ValueError, "count"),
    Bad("rms_norm-device", lambda: sk.rms_norm(rows(), meta(torch.ones(4)), 1e-6), ValueError, "weight"),
    # rotary_embedding
    Bad("rotary_embedding-x-2d", lambda: sk.rotary_embedding(rows(), rows(), rows(), full_precision=True),
        ValueError, "x"),
    Bad("rotary_embedding-head_dim-odd",
        lambda: sk.rotary_embedding(torch.randn(6, 2, 5), torch.randn(6, 5), torch.randn(6, 5), full_precision=True),
        ValueError, "head dimension"),
    Bad("rotary_embedding-cos-width",
        lambda: sk.rotary_embedding(torch.randn(6, 2, 4), torch.randn(6, 6), torch.randn(6, 6), full_precision=True),
        ValueError, "cos"),
    Bad("rotary_embedding-cos-rows",
        lambda: sk.rotary_embedding(torch.randn(6, 2, 4), torch.randn(5, 4), torch.randn(5, 4), full_precision=True),
        ValueError, "cos"),
    Bad("rotary_embedding-sin-shape",
        lambda: sk.rotary_embedding(torch.randn(6, 2, 4), rows(), torch.randn(7, 4), full_precision=True),
        ValueError, "sin"),
    Bad("rotary_embedding-index-capacity",
        lambda: sk.rotary_embedding(torch.randn(6, 2, 4), rows(), rows(), full_precision=True, index=IDX, count=3),
        ValueError, "index"),
    Bad("rotary_embedding-index-range",
        lambda: sk.rotary_embedding(torch.randn(4, 2, 4), rows(), rows(), full_precision=True,
                                    index=torch.tensor([0, 6, -1, -1], dtype=torch.int32), count=2),
        ValueError, "index"),
    Bad("rotary_embedding-count-without-index",
        lambda: sk.rotary_embedding(torch.randn(6, 2, 4), rows(), rows(), full_precision=True, count=3),
        ValueError, "index"),
    Bad("rotary_embedding-device",
        lambda: sk.rotary_embedding(torch.randn(6, 2, 4), rows(), meta(rows()), full_precision=True),
        ValueError, "sin"),
]


def _param(case: Bad):
    marks = [pytest.mark.xfail(strict=True, reason=case.silent)] if case.silent else []
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_kernel_input_is_rejected_by_name(case: Bad):
    with pytest.raises(case.error, match=case.names):
        case.call()


def test_every_public_op_has_bad_input_cases():
    ops = {c.id.split("-")[0] for c in CASES}
    public = {"mlp_sparsity", "swiglu_sparsity", "snr_boundary", "varlen_attention", "slice_repack",
              "cosine_saliency", "gather_rows", "scatter_rows", "partial_attention", "row_linear", "rms_norm",
              "rotary_embedding", "exchange_rows", "row_linear_pair"}
    assert public <= ops, public - ops
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be distinct"


# ------------------------------------------------------------------------------------ hypothesis
BAD_SCALARS = st.sampled_from([NAN, INF, -INF, -1.0, -1e30, True, "0.1", None, [0.1]])
HUGE_INTS = st.sampled_from([-1, -(2**40), 2**40, 2.0, True, "3", None])


def _names(exc: Exception, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", str(exc)) is not None


def rejected_by_name_unless_documented(call, value, op: str, documented) -> None:
    """``call(value)`` raises TypeError/ValueError naming the argument of ``op`` ("function.argument"),
    or ``documented(value)`` says the value has a documented meaning."""
    try:
        call(value)
    except (TypeError, ValueError) as exc:
        assert _names(exc, op.split(".")[1]), f"{op}={value!r}: {exc}"
        return
    assert documented is not None and documented(value), f"{op}={value!r} was accepted silently"


@HYPOTHESIS
@given(value=BAD_SCALARS, op=st.sampled_from(["mlp_sparsity.eps", "snr_boundary.tau_jump", "snr_boundary.gamma",
                                                "varlen_attention.softmax_scale", "partial_attention.softmax_scale",
                                                "cosine_saliency.tau", "slice_repack.tau_pad"]))
def test_bad_float_scalars_are_rejected(value, op):
    """NaN, +-inf, negatives, bools, strings, None, lists: each float argument rejects them by name,
    except where the value has a documented meaning (cosine_saliency's tau: +-inf, negatives;
    attention's softmax_scale: negatives; None: the default scale)."""
    documented = {
        "mlp_sparsity.eps": lambda v: v == INF,  # nothing is above it: every entry counts
        "cosine_saliency.tau": lambda v: isinstance(v, float) and not math.isnan(v),
        "varlen_attention.softmax_scale": lambda v: v is None or (isinstance(v, float) and math.isfinite(v)),
        "partial_attention.softmax_scale": lambda v: v is None or (isinstance(v, float) and math.isfinite(v)),
    }
    calls = {
        "mlp_sparsity.eps": lambda v: sk.mlp_sparsity(act(), v),
        "snr_boundary.tau_jump": lambda v: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), tau_jump=v),
        "snr_boundary.gamma": lambda v: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), gamma=v),
        "varlen_attention.softmax_scale": lambda v: call_varlen(softmax_scale=v),
        "partial_attention.softmax_scale": lambda v: call_partial(softmax_scale=v),
        "cosine_saliency.tau": lambda v: sk.cosine_saliency(ctx(), ctx(), v),
        "slice_repack.tau_pad": lambda v: call_repack(tau_pad=v),
    }
    rejected_by_name_unless_documented(calls[op], value, op, documented.get(op))


@HYPOTHESIS
@given(value=HUGE_INTS, op=st.sampled_from(["snr_boundary.window", "snr_boundary.baseline_window",
                                              "snr_boundary.min_position", "varlen_attention.max_seqlen_q",
                                              "cosine_saliency.n_rows", "gather_rows.count",
                                              "partial_attention.salient_k_count", "slice_repack.eager_max_bucket"]))
def test_bad_int_scalars_are_rejected(value, op):
    """Negative, huge, float, bool, string: every count or size rejects them by name (None is the
    documented default of n_rows; a huge eager_max_bucket means "every group eager")."""
    calls = {
        "snr_boundary.window": lambda v: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), window=v),
        "snr_boundary.baseline_window": lambda v: sk.snr_boundary(sparsity(), torch.tensor([9, 9]),
                                                                  baseline_window=v),
        "snr_boundary.min_position": lambda v: sk.snr_boundary(sparsity(), torch.tensor([9, 9]), min_position=v),
        "varlen_attention.max_seqlen_q": lambda v: call_varlen(max_seqlen_q=v),
        "cosine_saliency.n_rows": lambda v: sk.cosine_saliency(ctx(), ctx(), 0.9, n_rows=v),
        "gather_rows.count": lambda v: sk.gather_rows(rows(), IDX, v),
        "partial_attention.salient_k_count": lambda v: call_partial(salient_k_count=v),
        "slice_repack.eager_max_bucket": lambda v: call_repack(eager_max_bucket=v),
    }
    documented = {
        "cosine_saliency.n_rows": lambda v: v is None,
        "varlen_attention.max_seqlen_q": lambda v: v == 2**40 and type(v) is int,  # an upper bound: too big is safe
        "snr_boundary.window": lambda v: v == 2**40 and type(v) is int,  # never fires: a window past every row
        "snr_boundary.baseline_window": lambda v: v == 2**40 and type(v) is int,  # averages what there is
        "snr_boundary.min_position": lambda v: v == 2**40 and type(v) is int,  # no candidate: nothing cut
        "slice_repack.eager_max_bucket": lambda v: v == 2**40 and type(v) is int,  # every group eager
    }
    rejected_by_name_unless_documented(calls[op], value, op, documented.get(op))


@HYPOTHESIS
@given(b=st.integers(0, 3), n=st.integers(0, 6), extra=st.integers(-3, 3), dtype=st.sampled_from(
    [torch.float32, torch.float16, torch.int32, torch.int64, torch.bool]))
def test_snr_boundary_shapes_dtypes_and_ranges(b, n, extra, dtype):
    """Random shapes, dtypes and valid_len ranges: a result exactly when the input is valid
    (float sparsity, integer valid_len of one entry per row, each in [0, N]), else a named error."""
    s = torch.rand(b, n).to(dtype)
    valid = torch.full((b,), n + extra, dtype=torch.int64) if extra else torch.full((b,), n, dtype=torch.int64)
    ok = dtype in (torch.float32, torch.float16) and (b == 0 or 0 <= n + extra <= n)
    if ok:
        out = sk.snr_boundary(s, valid)
        assert out.shape == (b,) and out.dtype == torch.int32 and bool(((out >= 0) & (out <= valid)).all())
    else:
        with pytest.raises((TypeError, ValueError), match="sparsity|valid_len"):
            sk.snr_boundary(s, valid)
