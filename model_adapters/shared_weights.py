"""Bring your own model: our definition of a model object someone already built, sharing its tensors.

A user who loads LLaDA or Dream with their remote code (``trust_remote_code=True``), LaViDa
with its ``llava_llada`` / ``llava_dream`` builder, or MMaDA with its own classes, holds a
module whose ``state_dict()`` keys are the checkpoint's keys, which are ours
(``reference/MODELS.md``). :func:`from_module` builds our definition around that module's own
parameter objects: nothing is copied, so the memory is the user's, a change to their weights is
a change to ours, and the engine (Seer, DyLLM) drives the result like any loaded model.
"""

from __future__ import annotations

import torch
from torch import nn

from .loading import build_model


def _config_of(module: nn.Module) -> dict:
    """The config dict of an upstream model: a Hugging Face ``PretrainedConfig`` (``to_dict()``)
    or a plain dict at ``module.config``."""
    config = getattr(module, "config", None)
    if isinstance(config, dict):
        return dict(config)
    if callable(getattr(config, "to_dict", None)):
        return dict(config.to_dict())
    raise TypeError(f"{type(module).__name__} has no config (a dict or an object with to_dict() at .config, as "
                    "Hugging Face models carry); pass config= (the checkpoint's config.json as a dict)")


def from_module(module: nn.Module, *, config: dict | None = None) -> nn.Module:
    """Our model for an already-built upstream ``module``, sharing its parameters (no copy).

    module: an ``nn.Module`` whose persistent state (``state_dict()`` names) is a supported
        checkpoint's: LLaDA / MMaDA (``model.transformer.blocks.{i}.ff_proj`` ...), Dream (Qwen2
        names), LaViDa-LLaDA / LaViDa-Dream (those plus ``model.vision_tower``,
        ``model.mm_projector``, ``model.image_newline``).
    config: the checkpoint's config.json as a dict; default ``module.config`` (its ``to_dict()``).

    Returns our definition (the architecture chosen from the config, as ``load_model`` does) in
    eval mode, whose every parameter *is* the upstream module's parameter object under the same
    name (same storage, dtype, device and ``requires_grad``). Raises ``TypeError`` for a
    non-module, ``ValueError`` naming the missing keys, unexpected keys and wrong shapes when
    the module's names do not match the config's architecture.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    cfg = dict(config) if config is not None else _config_of(module)
    ours = build_model(cfg, device="meta")
    # keep_vars: the Parameter objects themselves (and persistent buffers), not detached copies
    theirs = module.state_dict(keep_vars=True)
    for name, param in ours.named_parameters():
        if name in theirs:  # assignment below gives their objects our flag: make ours theirs first
            param.requires_grad_(theirs[name].requires_grad)
    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(False)  # assign, never swap their tensors' contents
    try:
        ours.load_state_dict(theirs, strict=True, assign=True)
    except RuntimeError as exc:  # torch lists the missing and unexpected names and the wrong shapes
        raise ValueError(f"{type(module).__name__} does not carry the names of {type(ours).__name__} "
                         f"(model_type {cfg.get('model_type')!r}): {exc}") from None
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swapping)
    left = [n for n, t in [*ours.named_parameters(), *ours.named_buffers()] if t.device == torch.device("meta")]
    if left:  # state our definition holds outside its state_dict: nothing to share it from
        raise ValueError(f"{type(ours).__name__} has tensors no upstream name provides: {left}")
    return ours.eval()
