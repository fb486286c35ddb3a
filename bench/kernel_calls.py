"""One small call of every public ``seer_kernels`` op, for the tests that walk every op
(``tests/kernels/test_custom_ops.py``) and the GPU memory and race checks
(``bench/sanitize_kernels.py``).

Shapes are small and odd (rows 4-9, widths 5-7, heads of 6 and 8), so every kernel runs its
masked tails; row sets are padded with -1 and their device counts are below their capacity.
Every host-checked value is valid, so the host path and the device path agree.
"""

from __future__ import annotations

import torch

import seer_kernels as sk
from seer_kernels.slice_repack_control import BUFFER_FIELDS, slice_repack_buffers

# slice_repack's bucket tables in the calls below
TABLES = dict(micro_buckets=[4, 8], packed_buckets=[8, 16], batch_buckets=[2, 4])


def device_count(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A row set's live count as the ops take it: int32 ``[1]`` on the device."""
    return torch.tensor([n], dtype=torch.int32, device=device)


def repack_buffers(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> sk.SliceRepackOutput:
    """Zeroed ``slice_repack`` output buffers for the call below (hidden size 4)."""
    out = slice_repack_buffers(batch_cap=4, bucket_cap=8, packed_cap=18, cu_len=4, dtype=dtype,
                               device=device, hidden_dim=4)  # fmt: skip
    return type(out)(*(getattr(out, f).zero_() for f in BUFFER_FIELDS))


def kernel_calls(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """One call of every public op, ``op -> (function, args, kwargs)``, its floating tensors in
    ``dtype`` and every tensor on ``device`` (the same values on every device: drawn on the CPU
    from seed 0)."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(shape, generator=g).to(device=device, dtype=dtype)

    def rand(*shape):
        return torch.rand(shape, generator=g).to(device=device, dtype=dtype)

    def ints(values, int_dtype=torch.int64):
        return torch.tensor(values, dtype=int_dtype, device=device)

    def count(n):
        return device_count(n, device)

    T, H, d = 9, 2, 8
    cu = ints([0, 4, 9], torch.int32)
    key_index = ints([1, 5, 7, -1, -1, -1, -1, -1, -1], torch.int32)
    attention = (randn(T, H, d), randn(T, H, d), randn(T, H, d), cu, cu, 5, 5)
    return {
        "mlp_sparsity": (sk.mlp_sparsity, (randn(2, 5, 7), 0.3), dict(lengths=ints([5, 2]))),
        "swiglu_sparsity": (sk.swiglu_sparsity, (randn(2, 5, 7), randn(2, 5, 7), 0.3), dict(lengths=ints([3, 5]))),
        "snr_boundary": (sk.snr_boundary, (rand(3, 12), ints([12, 7, 0])), {}),
        "varlen_attention": (sk.varlen_attention, attention, {}),
        "slice_repack": (sk.slice_repack, (randn(3, 6, 4), ints([5, 2, 6])),
                         dict(TABLES, out=repack_buffers(device, dtype))),
        "cosine_saliency": (sk.cosine_saliency, (randn(7, 6), randn(7, 6), 0.5), dict(n_rows=count(6))),
        "gather_rows": (sk.gather_rows, (randn(6, 5), ints([4, 0, 2, -1], torch.int32), count(3)), {}),
        "scatter_rows": (sk.scatter_rows, (randn(6, 5), ints([4, 0, 2, -1]), count(3), randn(4, 5)), {}),
        "partial_attention": (
            sk.partial_attention,
            (*attention[:3], randn(T, H, d), randn(T, H, d), cu, cu, 5, 5,
             torch.rand(T, generator=g).to(device) < 0.3, key_index, count(3)),
            dict(k_old=randn(T, H, d)),
        ),
        "row_linear": (sk.row_linear, (randn(6, 5), randn(3, 5), randn(3), count(4)), {}),
        "row_linear_pair": (sk.row_linear_pair, (randn(6, 5), randn(3, 5), None, randn(3, 5), randn(3), count(4)), {}),
        "exchange_rows": (sk.exchange_rows, (randn(6, 5), ints([4, 0, 2, -1]), count(3), randn(4, 5)), {}),
        "rms_norm": (sk.rms_norm, (randn(6, 5), randn(5), 1e-6),
                     dict(index=ints([4, 0, 2, -1], torch.int32), count=count(3))),
        "rotary_embedding": (sk.rotary_embedding, (randn(4, 2, 6), randn(7, 6), randn(7, 6)),
                             dict(full_precision=True, index=ints([6, 0, 2, -1], torch.int32), count=count(3))),
    }  # fmt: skip


#: LLaDA-8B's dimensions (hidden, heads, head dim, MLP) and the decode the GPU check times
#: (batch 16, prompt 256, window 256): what :func:`model_shape_calls` sizes its calls by
EIGHT_B = dict(hidden=4096, heads=32, head_dim=128, mlp=12288, batch=16, prompt=256, window=256)


def model_shape_calls(device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16) -> dict:
    """One call of every public op at LLaDA-8B shapes (:data:`EIGHT_B`), ``op -> (function, args,
    kwargs)``, for ``bench/compile_kernels.py``: the kernels specialise on their sizes' divisibility,
    so these compile what a GPU run at those shapes launches (the odd sizes of :func:`kernel_calls`
    specialise differently). Float tensors are ``torch.empty`` (never read: the compile check
    launches nothing); index tensors and counts are valid. Biases are left out as LLaDA has none.
    """
    e = EIGHT_B
    D, H, d, F = e["hidden"], e["heads"], e["head_dim"], e["mlp"]
    B, W = e["batch"], e["window"]
    rows = B * W  # the window rows of one forward (a DyLLM layer's row capacity)
    seqs, seq_len = 4, e["prompt"] + W  # four [prompt | window] sequences for the attention kernels
    T = seqs * seq_len

    def empty(*shape):
        return torch.empty(shape, device=device, dtype=dtype)

    def ints(values, int_dtype=torch.int64):
        return torch.tensor(values, dtype=int_dtype, device=device)

    def count(n):
        return device_count(n, device)

    cu = ints([i * seq_len for i in range(seqs + 1)], torch.int32)
    key_index = ints(list(range(0, T, 3)) + [-1] * (T - len(range(0, T, 3))), torch.int32)
    attention = (empty(T, H, d), empty(T, H, d), empty(T, H, d), cu, cu, seq_len, seq_len)
    row_index32 = ints(list(range(0, rows, 2)) + [-1] * (rows - len(range(0, rows, 2))), torch.int32)
    row_index64 = row_index32.to(torch.int64)
    live = rows // 2
    micro = [8, 16, 32, 64, 128, 256]
    repack_out = slice_repack_buffers(batch_cap=B, bucket_cap=W, packed_cap=B * W, cu_len=B + 1, dtype=dtype,
                                      device=device, hidden_dim=D)  # fmt: skip
    ids_out = slice_repack_buffers(batch_cap=B, bucket_cap=W, packed_cap=B * W, cu_len=B + 1, dtype=torch.int64,
                                   device=device)  # fmt: skip
    tables = dict(micro_buckets=micro, packed_buckets=[64 * 2 ** k for k in range(7)], batch_buckets=[1, 2, 4, 8, B])
    keep = ints([W - 3 * i for i in range(B)])
    return {
        "mlp_sparsity": (sk.mlp_sparsity, (empty(B, W, F), 0.1), dict(lengths=ints([W] * B))),
        "swiglu_sparsity": (sk.swiglu_sparsity, (empty(B, W, F), empty(B, W, F), 0.1), dict(lengths=ints([W] * B))),
        "snr_boundary": (sk.snr_boundary, (empty(B, W), ints([W] * B)), {}),
        "varlen_attention": (sk.varlen_attention, attention, {}),
        "slice_repack": (sk.slice_repack, (empty(B, W, D), keep), dict(tables, out=repack_out)),
        "slice_repack (token ids)": (
            sk.slice_repack, (torch.zeros(B, W, dtype=torch.int64, device=device), keep), dict(tables, out=ids_out)),
        "cosine_saliency": (sk.cosine_saliency, (empty(rows, D), empty(rows, D), 0.99), dict(n_rows=count(rows))),
        "gather_rows": (sk.gather_rows, (empty(rows, D), row_index32, count(live)), {}),
        "scatter_rows": (sk.scatter_rows, (empty(rows, D), row_index64, count(live), empty(rows, D)), {}),
        "partial_attention": (
            sk.partial_attention,
            (*attention[:3], empty(T, H, d), empty(T, H, d), cu, cu, seq_len, seq_len,
             torch.zeros(T, dtype=torch.bool, device=device), key_index, count(T // 3)),
            dict(k_old=empty(T, H, d)),
        ),
        "row_linear": (sk.row_linear, (empty(rows, D), empty(F, D), None, count(live)), {}),
        "row_linear_pair": (sk.row_linear_pair, (empty(rows, D), empty(F, D), None, empty(F, D), None, count(live)),
                            {}),
        "exchange_rows": (sk.exchange_rows, (empty(rows, D), row_index64, count(live), empty(rows, D)), {}),
        "rms_norm": (sk.rms_norm, (empty(rows, D), empty(D), 1e-5), dict(index=row_index32, count=count(live))),
        "rotary_embedding": (sk.rotary_embedding, (empty(rows, H, d), empty(rows, d), empty(rows, d)),
                             dict(full_precision=True, index=row_index32, count=count(live))),
    }  # fmt: skip
