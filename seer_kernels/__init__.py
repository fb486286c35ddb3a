"""Fused Triton kernels for diffusion-LM inference, each beside its torch reference.

Public ops, one module per op family named after its op (see each for shapes, dtypes, edges):

* :func:`mlp_sparsity`, :func:`swiglu_sparsity` (``mlp_sparsity.py``) - per-token MLP
  activation sparsity (Seer probe);
* :func:`snr_boundary` (``snr_boundary.py``) - the Seer jump-to-plateau boundary scan;
* :func:`varlen_attention` (``varlen_attention.py``) - bidirectional varlen attention,
  flash-attention argument order;
* :func:`slice_repack` (``slice_repack.py``) - cut rows to ``L*``, pack or bucket-pad them,
  rewrite positions and mask; its host routing rule :func:`slice_repack_decision`, control
  word and buffers live in ``slice_repack_control.py``;
* :func:`cosine_saliency` (``cosine_saliency.py``), :func:`gather_rows` /
  :func:`scatter_rows`, :func:`exchange_rows` (``row_gather_scatter.py``), :func:`partial_attention`
  (``partial_attention.py``), :func:`row_linear` / :func:`row_linear_pair` (``row_linear.py``) -
  DyLLM saliency selection, partial attention, and the linear layers of the salient rows;
* :func:`rms_norm` (``rms_norm.py``), :func:`rotary_embedding` (``rotary_embedding.py``) -
  RMSNorm and rotate-half RoPE of whole rows or of a row set (DyLLM's sparse layers).

Every public op validates its arguments and computes through a registered torch op,
``torch.ops.seer.<op>``, with a fake implementation (shapes from shapes) and its written
buffers declared, so ``torch.compile(fullgraph=True)`` traces a layer with the ops inside and
other frameworks' CUDA graphs can hold them. Dispatch (``_dispatch.py``): CUDA tensors run
the Triton kernel, CPU tensors run the torch reference, and with ``TRITON_INTERPRET=1`` CPU
tensors run the Triton kernel in the interpreter (:func:`kernel_backend` overrides).

Host reads: counts and lengths may live on the device and are never read on the host on the
CUDA path; value checks (ranges, ``cu_seqlens``, index order) run only for CPU tensors in
eager mode. :func:`emulate_device` makes the public functions take the CUDA path on CPU
tensors (the references compute), and :func:`in_kernel` is True inside an op's
implementation, so an audit of host reads can run on a CPU and tell the kernels' stand-ins
from their callers. Importing the package touches no device (kernels compile on first launch).

A module and its op share a name. The functions are imported here eagerly, so the package
attribute ``seer_kernels.<op>`` is bound to the function after the import system bound it to
the submodule; a later ``import seer_kernels.<op>`` finds the submodule in ``sys.modules``
and does not rebind it. Reach a module itself with ``importlib.import_module`` or
``from seer_kernels.<op> import ...`` (``import seer_kernels.<op> as m`` yields the function).
"""

from __future__ import annotations

from ._dispatch import current_backend, emulate_device, in_kernel, interpreting, kernel_backend, use_triton
from .cosine_saliency import cosine_saliency, cosine_saliency_reference
from .mlp_sparsity import mlp_sparsity, mlp_sparsity_reference, swiglu_sparsity, swiglu_sparsity_reference
from .partial_attention import partial_attention, partial_attention_reference
from .rms_norm import rms_norm, rms_norm_reference
from .rotary_embedding import rotary_embedding, rotary_embedding_reference
from .row_gather_scatter import (
    exchange_rows,
    exchange_rows_reference,
    gather_rows,
    gather_rows_reference,
    scatter_rows,
    scatter_rows_reference,
)
from .row_linear import row_linear, row_linear_pair, row_linear_pair_reference, row_linear_reference
from .slice_repack import slice_repack, slice_repack_reference
from .slice_repack_control import ControlValues, SliceRepackOutput, slice_repack_buffers, slice_repack_decision
from .snr_boundary import snr_boundary, snr_boundary_reference
from .varlen_attention import varlen_attention, varlen_attention_reference

__all__ = [
    "ControlValues",
    "SliceRepackOutput",
    "cosine_saliency",
    "cosine_saliency_reference",
    "current_backend",
    "emulate_device",
    "exchange_rows",
    "exchange_rows_reference",
    "gather_rows",
    "gather_rows_reference",
    "in_kernel",
    "interpreting",
    "kernel_backend",
    "mlp_sparsity",
    "mlp_sparsity_reference",
    "partial_attention",
    "partial_attention_reference",
    "rms_norm",
    "rms_norm_reference",
    "rotary_embedding",
    "rotary_embedding_reference",
    "row_linear",
    "row_linear_pair",
    "row_linear_pair_reference",
    "row_linear_reference",
    "scatter_rows",
    "scatter_rows_reference",
    "slice_repack",
    "slice_repack_buffers",
    "slice_repack_decision",
    "slice_repack_reference",
    "snr_boundary",
    "snr_boundary_reference",
    "swiglu_sparsity",
    "swiglu_sparsity_reference",
    "use_triton",
    "varlen_attention",
    "varlen_attention_reference",
]
