"""Backend selection shared by every op in seer_kernels.

Each public op validates its inputs and then asks :func:`use_triton` whether to launch the
Triton kernel or to run the torch reference:

* CUDA tensor                       -> Triton kernel;
* CPU tensor                        -> torch reference (also the router's eager fallback);
* CPU tensor and ``TRITON_INTERPRET=1`` -> Triton kernel in the interpreter (how CI tests kernels).

``SEER_KERNEL_BACKEND=reference|triton|auto`` (default ``auto``) or the :func:`kernel_backend`
context manager override the choice, e.g. to keep whole-model CPU tests on the fast reference
path while the interpreter is enabled for the kernel tests in the same process.

Nothing here touches ``triton.runtime.driver`` or queries a device at import time.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import torch

_VALID_BACKENDS = ("auto", "triton", "reference")
_override = threading.local()


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def current_backend() -> str:
    """The backend in force: the innermost :func:`kernel_backend` or ``SEER_KERNEL_BACKEND``."""
    forced = getattr(_override, "backend", None)
    if forced is not None:
        return forced
    backend = os.environ.get("SEER_KERNEL_BACKEND", "auto").lower()
    if backend not in _VALID_BACKENDS:
        raise ValueError(f"SEER_KERNEL_BACKEND must be one of {_VALID_BACKENDS}, got {backend!r}")
    return backend


@contextlib.contextmanager
def kernel_backend(backend: str) -> Iterator[None]:
    """Force ``"triton"``, ``"reference"`` or ``"auto"`` dispatch inside a ``with`` block (per thread)."""
    if backend not in _VALID_BACKENDS:
        raise ValueError(f"backend must be one of {_VALID_BACKENDS}, got {backend!r}")
    previous = getattr(_override, "backend", None)
    _override.backend = backend
    try:
        yield
    finally:
        _override.backend = previous


def use_triton(tensor: torch.Tensor) -> bool:
    """Whether an op on ``tensor`` should launch its Triton kernel rather than the torch reference."""
    backend = current_backend()
    if backend == "reference":
        return False
    if tensor.is_cuda:
        return True
    if tensor.device.type == "cpu" and (backend == "triton" or interpreting()):
        if not interpreting():
            raise RuntimeError(
                "the triton backend was forced for a CPU tensor, but TRITON_INTERPRET=1 is not set "
                "(Triton runs on CPU only in its interpreter)"
            )
        return True
    return False


def check_tensor(
    name: str,
    tensor: object,
    *,
    dtypes: tuple[torch.dtype, ...] | None = None,
    min_dim: int | None = None,
    dim: int | None = None,
) -> torch.Tensor:
    """Validate a tensor argument, raising ``TypeError``/``ValueError`` that names ``name``."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if dtypes is not None and tensor.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({allowed}), got {str(tensor.dtype).replace('torch.', '')}")
    if dim is not None and tensor.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(tensor.shape)}")
    if min_dim is not None and tensor.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dims, got shape {tuple(tensor.shape)}")
    return tensor


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """Raise ``ValueError`` naming the arguments when the given tensors live on different devices."""
    present = {k: v for k, v in tensors.items() if v is not None}
    devices = {v.device for v in present.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{k} on {v.device}" for k, v in present.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def single_config_when_interpreting(configs: list) -> list:
    """Autotune with more than one config fails in the interpreter: keep the first there."""
    return configs[:1] if interpreting() else configs
