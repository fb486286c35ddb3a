"""Tiny models shared by the engine, Seer, DyLLM and router tests."""

from __future__ import annotations

import torch

import model_adapters as ma


def tiny(kind: str, *, scale: float = 0.05, seed: int = 0):
    """``ma.tiny_config(kind)`` built with ``seed``, every weight perturbed by ``scale`` x N(0, 1)
    so that logits are not near-uniform (distinct confidences, real answers to decode)."""
    torch.manual_seed(seed)
    model = ma.build_model(ma.tiny_config(kind))
    for p in model.parameters():
        p.data.add_(scale * torch.randn_like(p))
    return model
