"""``generate``: the public entry. It validates a request batch, composes the policies in their
one documented order, and runs the engine (``engine.DecodeRun``).

Policy order (``compose_policies``): Seer (it cuts the windows every later hook reads), the
block cache of ``gen.block_cache`` (it runs each step's forwards), the PWR router (it runs each
step's forwards), DyLLM (it chooses which rows a layer computes), then the caller's own
policies in the order given.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence

import torch

from .adapter import REQUIRED
from .block_cache import BlockCachePolicy
from .config import GenerationConfig
from .dyllm import DyLLMConfig, DyLLMPolicy
from .engine import DecodeRun, GenerationOutput
from .plans import DecodingRules
from .policy import DecodePolicy
from .profiling import prange
from .seer import SeerConfig, SeerPolicy
from .serving.execution import RoutedExecution
from .serving.router import RouterConfig


def validate_request(model, input_ids, attention_mask, images, gen):
    """Raise ``TypeError``/``ValueError`` naming the offending argument; returns ``images`` as the
    model prepares them (its ``prepare_images``: paths and PIL images per request become its
    image inputs), or as given when the model has no such method."""
    missing = [name for name in REQUIRED if not hasattr(model, name)]
    if missing:
        raise TypeError(f"model does not implement the adapter surface (missing {missing}); "
                        "load it with model_adapters.load_model or build_model")
    if not isinstance(gen, GenerationConfig):
        raise TypeError(f"gen must be a GenerationConfig, got {type(gen).__name__}")
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dtype != torch.long:
        raise TypeError(f"input_ids must be int64, got {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be 2-D [batch, prompt_len], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] == 0:
        raise ValueError("input_ids is an empty batch (0 requests)")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids has prompts of length 0")
    if input_ids.device != model.device:
        raise ValueError(f"input_ids is on {input_ids.device} but the model is on {model.device}")
    real = torch.ones_like(input_ids, dtype=torch.bool)
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must be a tensor shaped like input_ids {tuple(input_ids.shape)}")
        if attention_mask.device != input_ids.device:
            raise ValueError(f"attention_mask is on {attention_mask.device}, input_ids on {input_ids.device}")
        if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask must contain only 0 and 1")
        real = attention_mask.bool()
        if not bool(real.any(dim=1).all()):
            raise ValueError("attention_mask has a request with no real token")
        if bool((real[:, :-1] & ~real[:, 1:]).any()):
            raise ValueError("attention_mask must be left padding (zeros only before a request's tokens)")
    multimodal = bool(model.is_multimodal)
    ids = input_ids[real]
    allowed = (ids >= 0) & (ids < model.vocab_size)
    if multimodal:
        allowed |= ids == model.token_ids.image
    if not bool(allowed.all()):
        bad = ids[~allowed][:5].tolist()
        raise ValueError(f"input_ids has token ids outside the vocabulary [0, {model.vocab_size}): {bad}")
    pad_ids = input_ids[~real]
    if pad_ids.numel() and not bool(((pad_ids >= 0) & (pad_ids < model.vocab_size)).all()):
        raise ValueError("input_ids has padding ids outside the vocabulary")
    if bool((ids == model.token_ids.mask).any()):
        raise ValueError(f"input_ids contains the mask id {model.token_ids.mask} inside a prompt")
    if images is not None:
        if not multimodal:
            raise ValueError(f"images were given, but {type(model).__name__} is a text-only model")
        prepare_images = getattr(model, "prepare_images", None)
        if prepare_images is not None:  # the model layer reads paths and converts PIL images (by name on error)
            images = prepare_images(images, batch=input_ids.shape[0])
        elif len(images) != input_ids.shape[0]:
            raise ValueError(f"images must have one entry per request ({input_ids.shape[0]}), got {len(images)}")
    check_sequence_length(model, input_ids.shape[1], gen, images_counted=images is None)
    rules = DecodingRules.of(model)
    if gen.threshold is not None:
        check_threshold(gen, rules)
    else:
        warn_idle_steps(gen, rules)
    if rules.family == "dream":
        if gen.cfg_scale > 0:
            raise ValueError("cfg_scale: Dream's diffusion_generate has no classifier-free guidance")
        if gen.block_length not in (None, gen.gen_length):
            raise ValueError("block_length: Dream decodes the whole window with one schedule (no blocks)")
        if gen.logits_eos_inf or gen.confidence_eos_eot_inf:
            raise ValueError("logits_eos_inf / confidence_eos_eot_inf are LLaDA options")
        if gen.remasking != "low_confidence":
            raise ValueError("remasking is an LLaDA-family option; Dream uses alg")
    elif gen.alg != "origin" or gen.alg_temp is not None or gen.top_p is not None or gen.top_k is not None:
        raise ValueError("alg / alg_temp / top_p / top_k are Dream options; the LLaDA family uses remasking")
    return images


def check_sequence_length(model, prompt_positions: int, gen: GenerationConfig, *, images_counted: bool) -> None:
    """Raise ``ValueError`` when the prompt's positions plus the window exceed the model's
    ``max_sequence_length`` (an adapter without one has no limit). Before the images are embedded
    each ``<image>`` placeholder counts as one position (``images_counted=False``): a lower bound,
    checked again with the embedded length."""
    limit = getattr(model, "max_sequence_length", None)
    if limit is None or prompt_positions + gen.gen_length <= limit:
        return
    images = "" if images_counted else " (image features not yet counted)"
    raise ValueError(f"the prompt ({prompt_positions} positions{images}) plus gen_length ({gen.gen_length}) is "
                     f"{prompt_positions + gen.gen_length} positions, more than the model's max_sequence_length "
                     f"({limit}): shorten the prompt or gen_length")


def check_threshold(gen: GenerationConfig, rules: DecodingRules) -> None:
    """What threshold decoding needs of the family's options (``GenerationConfig.threshold``)."""
    if rules.family == "dream" and (gen.alg != "maskgit_plus" or gen.alg_temp is not None):
        raise ValueError("threshold compares the chosen token's probability: the Dream family needs "
                         f"alg='maskgit_plus' and no alg_temp with it (got alg={gen.alg!r}, alg_temp={gen.alg_temp!r})")
    if rules.family == "llada" and gen.remasking == "entropy":
        raise ValueError("threshold compares a confidence in [0, 1]: remasking='entropy' gives negative "
                         "confidences; use low_confidence, margin or random")
    if gen.steps is not None:
        warnings.warn(f"steps={gen.steps} is not used with threshold={gen.threshold}: each block runs until no "
                      "mask is left in it", UserWarning, stacklevel=5)


def warn_idle_steps(gen: GenerationConfig, rules: DecodingRules) -> None:
    """Warn (the reference generators accept it too) when more denoising steps are planned than
    window positions: the extra forwards commit no token."""
    if gen.steps is None:
        return
    if rules.family == "llada":
        per_block = gen.steps // gen.num_blocks
        if gen.step_ratio is not None:
            per_block = int(per_block * gen.step_ratio)
        steps = per_block * gen.num_blocks
    elif rules.lavida or gen.step_ratio is not None:
        return  # LaViDa-Dream caps steps at gen_length; with step_ratio Dream takes int(gen_length * ratio)
    else:
        steps = gen.steps
    if steps > gen.gen_length:
        warnings.warn(f"steps ({gen.steps}) plans {steps} denoising steps for {gen.gen_length} window positions "
                      f"(gen_length): {steps - gen.gen_length} forwards will commit no token (the reference "
                      "generators do the same)", UserWarning, stacklevel=5)


def compose_policies(*, seer=None, router=None, dyllm=None, policies: Sequence = (), graphs="auto",
                     block_cache: str | None = None) -> list:
    """The policies of one ``generate`` call, in the documented order (module docstring)."""
    composed: list[DecodePolicy] = []
    if seer is not None:
        if not isinstance(seer, SeerConfig):
            raise TypeError(f"seer must be a SeerConfig, got {type(seer).__name__}")
        composed.append(SeerPolicy(seer))
    if block_cache is not None:
        composed.append(BlockCachePolicy(block_cache))
    if router is not None:
        if router is not True and not isinstance(router, RouterConfig):
            raise TypeError(f"router must be a RouterConfig or True, got {type(router).__name__}")
        composed.append(RoutedExecution(None if router is True else router, graphs=graphs))
    if dyllm is not None:
        if not isinstance(dyllm, DyLLMConfig):
            raise TypeError(f"dyllm must be a DyLLMConfig, got {type(dyllm).__name__}")
        composed.append(DyLLMPolicy(dyllm))
    if isinstance(policies, DecodePolicy) or not isinstance(policies, Sequence):
        raise TypeError(f"policies must be a sequence of DecodePolicy objects, got {type(policies).__name__}")
    for i, p in enumerate(policies):
        if not isinstance(p, DecodePolicy):
            raise TypeError(f"policies[{i}] must be a DecodePolicy, got {type(p).__name__}")
        composed.append(p)
    return composed


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    images=None,
    gen: GenerationConfig | None = None,
    seer: SeerConfig | None = None,
    dyllm: DyLLMConfig | None = None,
    router: RouterConfig | bool | None = None,
    graphs="auto",
    policies: Sequence[DecodePolicy] = (),
    progress: bool = False,
) -> GenerationOutput:
    """Decode a batch of requests with a masked-diffusion model.

    model: any ``model_adapters`` model (LLaDA, MMaDA, Dream, LaViDa-LLaDA, LaViDa-Dream), or
        any object implementing ``adapter.DiffusionAdapter``.
    input_ids: int64 ``[B, L]``, left-padded prompts (LaViDa: with ``<image>`` placeholders -200;
        MMaDA: image token ids already in the sequence, see ``model_adapters.mmada_mmu_input_ids``).
    attention_mask: ``[B, L]`` of 0/1 (left padding), or None.
    images: LaViDa only: a list with one entry per request, each None, an image file path, a PIL
        image, an ``ImageInput``, or a list of those (one per ``<image>`` placeholder, in order).
    gen: the decoding configuration (default ``GenerationConfig()``).
    seer: a ``SeerConfig`` to cut each request's window at step 0 (``seer_runtime.seer``).
    dyllm: a ``DyLLMConfig`` for saliency-gated sparse steps (``seer_runtime.dyllm``).
    router: a ``RouterConfig`` (or True for defaults sized to the window): after Seer's cut every
        step runs through the Padding-Waste-Ratio router (static / varlen / eager); None pads
        the batch to its longest surviving window.
    graphs: how steady forwards replay (``step_graphs``; the router's static groups through its
        own graph cache): "auto" (CUDA graphs on a CUDA device, eagerly elsewhere, said once),
        "cuda" (CUDA graphs, an error elsewhere), None (plain eager), or a graph backend object
        (``serving.graph_cache``).
    policies: further ``DecodePolicy`` objects, called after the built-in ones.
    progress: a progress bar over the denoising steps.
    """
    gen = gen if gen is not None else GenerationConfig()
    images = validate_request(model, input_ids, attention_mask, images, gen)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool, got {type(progress).__name__}")
    composed = compose_policies(seer=seer, router=router, dyllm=dyllm, policies=policies, graphs=graphs,
                                block_cache=gen.block_cache)
    t0 = time.perf_counter()
    with prange("generate"):
        run = DecodeRun(model, input_ids, attention_mask, images, gen, policies=composed, progress=progress,
                        graphs=graphs)
        if images is not None:  # the image features are embedded now: the exact prompt length
            check_sequence_length(model, run.prompt_len, gen, images_counted=True)
        try:
            for p in composed:
                p.on_request(run)
            run.decode()
            out = run.output()
            if run.finite is not None:  # the NaN/inf watch's one read (GenerationConfig.check_finite)
                run.finite.raise_if_found(out)
        finally:
            run.release()  # graphs and caches go with the call (not at Python's next cyclic collection)
    out.stats.add_time("total", time.perf_counter() - t0)
    return out
