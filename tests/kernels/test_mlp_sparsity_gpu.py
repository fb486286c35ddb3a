"""mlp_sparsity / swiglu_sparsity compiled on CUDA: bitwise against the torch reference on the
same device (both do the same fp32 operations) and the fused SwiGLU against torch eager."""

from __future__ import annotations

import pytest
import torch

from seer_kernels import mlp_sparsity, mlp_sparsity_reference, swiglu_sparsity
from tests.kernels.cuda import bits, nan_equal, requires_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.mlp_sparsity, requires_cuda]


# [R, T, F] and the activation's scale: LLaDA/MMaDA and Dream MLP widths, a ragged edge, and the
# benchmark's batch-64 shapes at unit scale
@pytest.mark.parametrize(
    "shape, scale",
    [((8, 256, 12288), 0.05), ((4, 64, 18944), 0.05), ((3, 5, 1000), 0.05), ((64, 256, 12288), 1.0),
     ((64, 256, 18944), 1.0)],
)  # fmt: skip
def test_mlp_sparsity_bf16_bitwise(shape, scale):
    R, T, F = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    act = (scale * torch.randn(R, T, F, device="cuda", generator=g)).to(torch.bfloat16)
    lengths = torch.randint(0, T + 1, (R,), device="cuda", generator=g)
    for ln in (None, lengths):
        out = mlp_sparsity(act, 0.01, lengths=ln)
        assert nan_equal(out, mlp_sparsity_reference(act, 0.01, lengths=ln)), (shape, ln is None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_swiglu_sparsity_bitwise_to_torch_eager(dtype):
    """The product bit for bit as F.silu(g) * u; its sparsity is mlp_sparsity of the product."""
    R, T, F = (8, 256, 12288) if dtype == torch.bfloat16 else (4, 64, 12288)
    g = torch.Generator(device="cuda").manual_seed(1)
    gate = (3 * torch.randn(R, T, F, device="cuda", generator=g)).to(dtype)
    up = torch.randn(R, T, F, device="cuda", generator=g).to(dtype)
    lengths = torch.randint(0, T + 1, (R,), device="cuda", generator=g)
    product, sparsity = swiglu_sparsity(gate, up, 0.02, lengths=lengths)
    diff = (bits(product) - bits(torch.nn.functional.silu(gate) * up)).abs()
    assert int((diff > 0).sum()) == 0, f"{int((diff > 0).sum())} of {product.numel()} differ, max {int(diff.max())} ulp"
    assert torch.equal(bits(sparsity), bits(mlp_sparsity(product, 0.02, lengths=lengths)))
    assert nan_equal(sparsity, mlp_sparsity_reference(product, 0.02, lengths=lengths))
