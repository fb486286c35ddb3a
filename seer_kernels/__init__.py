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
Modules are imported lazily so that importing the package never touches a device. Module
names differ from the op names on purpose: ``import seer_kernels.<module>`` binds the module
as a package attribute, which would otherwise shadow the function of the same name.
"""

from __future__ import annotations

import importlib

from ._dispatch import current_backend, interpreting, kernel_backend, use_triton  # noqa: F401 (re-exported)

# public name -> module that defines it
_EXPORTS = {
    "mlp_sparsity": "sparsity_reduce",
    "mlp_sparsity_reference": "sparsity_reduce",
    "swiglu_sparsity": "sparsity_reduce",
    "swiglu_sparsity_reference": "sparsity_reduce",
    "snr_boundary": "boundary_scan",
    "snr_boundary_reference": "boundary_scan",
    "varlen_attention": "varlen_attn",
    "varlen_attention_reference": "varlen_attn",
    "slice_repack": "slice_repack_mask",
    "slice_repack_reference": "slice_repack_mask",
    "SliceRepackOutput": "slice_repack_mask",
    "cosine_saliency": "saliency",
    "cosine_saliency_reference": "saliency",
    "gather_rows": "token_gather_scatter",
    "gather_rows_reference": "token_gather_scatter",
    "scatter_rows": "token_gather_scatter",
    "scatter_rows_reference": "token_gather_scatter",
    "partial_attention": "partial_attn",
    "partial_attention_reference": "partial_attn",
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
