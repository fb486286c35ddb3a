"""One table of tolerances for every test (DESIGN.md, Conventions).

* elementwise, gather/scatter, mask kernels: :data:`ELEMENTWISE` keyed by dtype;
  integer and index outputs are compared exactly;
* attention and reductions: :func:`assert_within_baseline_error` - the kernel's error against
  an fp64 reference is at most twice the error of torch in the same dtype, plus a small floor
  (flash-attention's rule).
"""

from __future__ import annotations

import torch

ELEMENTWISE: dict[torch.dtype, dict[str, float]] = {
    torch.float32: {"rtol": 1.3e-6, "atol": 1e-5},
    torch.float16: {"rtol": 1e-3, "atol": 1e-3},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2},
}

# absolute floor added to the 2x-baseline rule, per dtype
BASELINE_FLOOR: dict[torch.dtype, float] = {
    torch.float32: 1e-5,
    torch.float16: 1e-3,
    torch.bfloat16: 1e-2,
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, dtype: torch.dtype | None = None, msg: str = ""):
    """``torch.testing.assert_close`` with the table's tolerance for ``dtype`` (default: actual's)."""
    tol = ELEMENTWISE[dtype or actual.dtype]
    torch.testing.assert_close(actual, expected, rtol=tol["rtol"], atol=tol["atol"], msg=lambda m: f"{msg}\n{m}")


def assert_within_baseline_error(
    actual: torch.Tensor, torch_same_dtype: torch.Tensor, exact: torch.Tensor, *, factor: float = 2.0, msg: str = ""
):
    """Kernel error vs ``exact`` (fp64) must be <= factor x torch's same-dtype error + floor."""
    exact = exact.double()
    err_kernel = (actual.double() - exact).abs().max().item() if actual.numel() else 0.0
    err_torch = (torch_same_dtype.double() - exact).abs().max().item() if actual.numel() else 0.0
    floor = BASELINE_FLOOR[actual.dtype]
    assert err_kernel <= factor * err_torch + floor, (
        f"{msg} kernel error {err_kernel:.3e} exceeds {factor} x torch error {err_torch:.3e} + {floor:.0e}"
    )
