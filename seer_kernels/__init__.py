"""Fused Triton kernels for diffusion-LM inference, each beside its torch reference.

Public ops (see each module for shapes, dtypes and edge cases):

* :func:`mlp_sparsity`, :func:`swiglu_sparsity` - per-token MLP activation sparsity (Seer probe);
* :func:`snr_boundary` - the Seer jump-to-plateau boundary scan;
* :func:`varlen_attention` - bidirectional varlen attention, flash-attention argument order;
* :func:`slice_repack` - cut rows to ``L*``, pack or bucket-pad them, rewrite positions and mask;
* :func:`cosine_saliency`, :func:`gather_rows`, :func:`scatter_rows`, :func:`partial_attention`
  - DyLLM saliency selection and partial attention.

Dispatch: CUDA tensors run the Triton kernel, CPU tensors run the torch reference, and with
``TRITON_INTERPRET=1`` CPU tensors run the Triton kernel in the interpreter (``_dispatch.py``).
Modules are imported lazily so that importing the package never touches a device.
"""

from __future__ import annotations

import importlib

from ._dispatch import current_backend, interpreting, kernel_backend, use_triton

# public name -> module that defines it
_EXPORTS = {
    "mlp_sparsity": "mlp_sparsity",
    "mlp_sparsity_reference": "mlp_sparsity",
    "swiglu_sparsity": "mlp_sparsity",
    "swiglu_sparsity_reference": "mlp_sparsity",
    "snr_boundary": "snr_boundary",
    "snr_boundary_reference": "snr_boundary",
    "varlen_attention": "varlen_attention",
    "varlen_attention_reference": "varlen_attention",
    "slice_repack": "slice_repack",
    "slice_repack_reference": "slice_repack",
    "SliceRepackOutput": "slice_repack",
    "cosine_saliency": "cosine_saliency",
    "cosine_saliency_reference": "cosine_saliency",
    "gather_rows": "row_gather_scatter",
    "gather_rows_reference": "row_gather_scatter",
    "scatter_rows": "row_gather_scatter",
    "scatter_rows_reference": "row_gather_scatter",
    "partial_attention": "partial_attention",
    "partial_attention_reference": "partial_attention",
}

__all__ = sorted([*_EXPORTS, "current_backend", "interpreting", "kernel_backend", "use_triton"])


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'seer_kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
