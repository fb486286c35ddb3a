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


def _describe(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


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
    expected = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    # keep_vars: the Parameter objects themselves (and persistent buffers), not detached copies
    theirs = module.state_dict(keep_vars=True)
    missing = sorted(set(expected) - set(theirs))
    unexpected = sorted(set(theirs) - set(expected))
    wrong = sorted(f"{k} {tuple(theirs[k].shape)} != {expected[k]}" for k in set(theirs) & set(expected)
                   if tuple(theirs[k].shape) != expected[k])
    problems = []
    if missing:
        problems.append(f"missing ({len(missing)}): {_describe(missing)}")
    if unexpected:
        problems.append(f"unexpected ({len(unexpected)}): {_describe(unexpected)}")
    if wrong:
        problems.append(f"wrong shapes ({len(wrong)}): {_describe(wrong)}")
    if problems:
        raise ValueError(f"{type(module).__name__} does not carry the names of {type(ours).__name__} "
                         f"(model_type {cfg.get('model_type')!r}): " + "; ".join(problems))
    for name, tensor in theirs.items():
        owner_name, _, leaf = name.rpartition(".")
        owner = ours.get_submodule(owner_name)
        if leaf in owner._parameters:
            # a tensor that is a buffer upstream but a parameter here is wrapped, still without a copy
            owner._parameters[leaf] = (tensor if isinstance(tensor, nn.Parameter)
                                       else nn.Parameter(tensor, requires_grad=False))
        else:
            owner._buffers[leaf] = tensor
    left = [n for n, t in [*ours.named_parameters(), *ours.named_buffers()] if t.device == torch.device("meta")]
    if left:  # state our definition holds outside its state_dict: nothing to share it from
        raise ValueError(f"{type(ours).__name__} has tensors no upstream name provides: {_describe(left)}")
    return ours.eval()
