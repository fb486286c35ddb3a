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
