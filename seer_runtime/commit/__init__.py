"""Commit rules: which masked positions a denoising step commits, and to which tokens.

One small object per rule, picked once when a request is composed (:func:`rule_for`):

* :class:`~seer_runtime.commit.llada.LLaDARule` - LLaDA's ``generate`` (MMaDA's ``mmu_generate``,
  LaViDa-LLaDA): a fixed count per step inside the current block, by low-confidence, random,
  margin or entropy remasking;
* :class:`~seer_runtime.commit.dream.DreamRule` - Dream's ``diffusion_generate`` (LaViDa-Dream):
  origin, maskgit_plus, topk_margin, entropy, with ``alg_temp``;
* :class:`~seer_runtime.commit.threshold.ThresholdRule` - Fast-dLLM's parallel decoding: every
  masked position of the current block whose confidence reaches the threshold, at least one.

A rule plans a request's steps (:meth:`CommitRule.plan`), chooses on the device (as one graph unit
with the forward when :meth:`CommitRule.choice` can give it fixed shapes, eagerly otherwise:
:meth:`CommitRule.commit`) and then does the host's bookkeeping: the masks each request has left,
counted on the host where the count is known, read with the step's one read where it is not
(:meth:`CommitRule.step_reads` / :meth:`CommitRule.after_read`). A rule sees the batch state it
is handed and nothing above it.
"""

from __future__ import annotations

from ..batch import BatchState
from .base import CommitRule, masks_left
from .dream import DreamRule
from .llada import LLaDARule
from .threshold import ThresholdRule

__all__ = ["CommitRule", "DreamRule", "LLaDARule", "ThresholdRule", "masks_left", "rule_for"]


def rule_for(state: BatchState) -> CommitRule:
    """The commit rule of ``state.gen`` for the family of ``state.rules``."""
    if state.gen.threshold is not None:
        return ThresholdRule(state)
    return LLaDARule() if state.rules.family == "llada" else DreamRule(state)
