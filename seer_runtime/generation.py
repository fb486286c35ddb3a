"""``generate``: the public entry. It validates a request batch, composes the call once and runs it.

One call flows one way: the batch state is made (``batch.BatchState``), the model runner embeds
the prompts and runs the prefill (``runner.ModelRunner``), the call is composed (:func:`compose`:
the policies in their one documented order, the layout that lays each step out, the commit rule),
then the scheduler runs the steps (``scheduler.Scheduler``).

Policy order: Seer (it cuts the windows every later hook reads), DyLLM (it chooses which rows a
layer computes), then the caller's own policies in the order given. Layouts: the block cache of
``gen.block_cache``, or the PWR router, or the rows padded to their longest window.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from .adapter import missing_adapter_members
from .batch import BatchState, GenerationOutput, GenerationStats, first_end_positions
from .block_cache import BlockCacheLayouts
from .commit import rule_for
from .config import MAX_SEED, GenerationConfig, warn_caller
from .dyllm import DyLLMConfig, DyLLMPolicy
from .graphs import Graphs, resolve_backend
from .memory import ModelDims, RequestShape, plan_micro_batches
from .plans import DecodingRules, steps_per_block
from .policy import Policy
from .profiling import prange
from .runner import ModelRunner, PaddedLayouts
from .scheduler import Scheduler
from .seer import SeerConfig, SeerPolicy
from .serving.routed import RoutedLayouts
from .serving.router import RouterConfig


def validate_request(model, input_ids, attention_mask, images, gen):
    """Raise ``TypeError``/``ValueError`` naming the offending argument; returns ``images`` as the
    model prepares them (its ``prepare_images``: paths and PIL images per request become its
    image inputs), or as given when the model has no such method."""
    missing = missing_adapter_members(model)
    if missing:
        raise TypeError(f"model does not implement the adapter surface (missing {missing}); "
                        "load it with model_adapters.load_model or build_model")
    if not isinstance(gen, GenerationConfig):
        raise TypeError(f"gen must be a GenerationConfig, got {type(gen).__name__}")
    check_prompt_ids(model, input_ids, attention_mask)
    if images is not None:
        if not model.is_multimodal:
            raise ValueError(f"images were given, but {type(model).__name__} is a text-only model")
        prepare_images = getattr(model, "prepare_images", None)
        if prepare_images is not None:  # the model layer reads paths and converts PIL images (by name on error)
            images = prepare_images(images, batch=input_ids.shape[0])
        elif len(images) != input_ids.shape[0]:
            raise ValueError(f"images must have one entry per request ({input_ids.shape[0]}), got {len(images)}")
    check_sequence_length(model, input_ids.shape[1], gen, images_counted=images is None)
    check_family_options(gen, DecodingRules.of(model))
    return images


def check_prompt_ids(model, input_ids, attention_mask) -> None:
    """``input_ids`` (int64 ``[B, L]`` on the model's device, ids in the vocabulary, no mask id in
    a prompt) and ``attention_mask`` (0/1, left padding, a real token in every request)."""
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
    ids = input_ids[real]
    allowed = (ids >= 0) & (ids < model.vocab_size)
    if model.is_multimodal:
        allowed |= ids == model.token_ids.image
    if not bool(allowed.all()):
        bad = ids[~allowed][:5].tolist()
        raise ValueError(f"input_ids has token ids outside the vocabulary [0, {model.vocab_size}): {bad}")
    pad_ids = input_ids[~real]
    if pad_ids.numel() and not bool(((pad_ids >= 0) & (pad_ids < model.vocab_size)).all()):
        raise ValueError("input_ids has padding ids outside the vocabulary")
    if bool((ids == model.token_ids.mask).any()):
        raise ValueError(f"input_ids contains the mask id {model.token_ids.mask} inside a prompt")


def check_family_options(gen: GenerationConfig, rules: DecodingRules) -> None:
    """The options of ``gen`` that belong to the other family, or that its rule cannot take."""
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
        warn_caller(f"steps={gen.steps} is not used with threshold={gen.threshold}: each block runs until no "
                      "mask is left in it", UserWarning)


def warn_idle_steps(gen: GenerationConfig, rules: DecodingRules) -> None:
    """Warn (the reference generators accept it too) when more denoising steps are planned than
    window positions: the extra forwards commit no token."""
    if gen.steps is None:
        return
    if rules.family == "llada":
        steps = steps_per_block(gen) * gen.num_blocks
    elif rules.lavida or gen.step_ratio is not None:
        return  # LaViDa-Dream caps steps at gen_length; with step_ratio Dream takes int(gen_length * ratio)
    else:
        steps = gen.steps
    if steps > gen.gen_length:
        warn_caller(f"steps ({gen.steps}) plans {steps} denoising steps for {gen.gen_length} window positions "
                      f"(gen_length): {steps - gen.gen_length} forwards will commit no token (the reference "
                      "generators do the same)", UserWarning)


def check_request_seeds(request_seeds, batch_size: int, gen: GenerationConfig) -> None:
    """``request_seeds``: a ``TypeError``/``ValueError`` naming it unless it is one int in
    [0, 2**62] per request and ``gen.rng`` is "per_request" (None passes)."""
    if request_seeds is None:
        return
    if gen.rng != "per_request":
        raise ValueError(f"request_seeds needs GenerationConfig(rng='per_request'), got rng={gen.rng!r} (the global "
                         "generator has no per-request seed)")
    if isinstance(request_seeds, (str, bytes)) or not isinstance(request_seeds, Sequence):
        raise TypeError(f"request_seeds must be a sequence of ints, got {type(request_seeds).__name__}")
    if len(request_seeds) != batch_size:
        raise ValueError(f"request_seeds must have one seed per request ({batch_size}), got {len(request_seeds)}")
    for i, seed in enumerate(request_seeds):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"request_seeds[{i}] must be an int, got {type(seed).__name__}")
        if not 0 <= seed <= MAX_SEED:
            raise ValueError(f"request_seeds[{i}] must be in [0, 2**62], got {seed}")


def compose_policies(*, seer=None, dyllm=None, policies: Sequence = ()) -> list[Policy]:
    """The policies of one ``generate`` call, in the documented order (module docstring)."""
    composed: list[Policy] = []
    if seer is not None:
        if not isinstance(seer, SeerConfig):
            raise TypeError(f"seer must be a SeerConfig, got {type(seer).__name__}")
        composed.append(SeerPolicy(seer))
    if dyllm is not None:
        if not isinstance(dyllm, DyLLMConfig):
            raise TypeError(f"dyllm must be a DyLLMConfig, got {type(dyllm).__name__}")
        composed.append(DyLLMPolicy(dyllm))
    if isinstance(policies, Policy) or not isinstance(policies, Sequence):
        raise TypeError(f"policies must be a sequence of Policy objects, got {type(policies).__name__}")
    for i, p in enumerate(policies):
        if not isinstance(p, Policy):
            raise TypeError(f"policies[{i}] must be a Policy, got {type(p).__name__}")
        composed.append(p)
    return composed


def compose_layouts(model, state: BatchState, policies: Sequence[Policy], router):
    """How each step lays its rows out: the block cache, the router, or padded; the capabilities
    the policies declared are checked against them (and against guidance) here, once."""
    gen = state.gen
    if router is not None and router is not True and not isinstance(router, RouterConfig):
        raise TypeError(f"router must be a RouterConfig or True, got {type(router).__name__}")
    if gen.cfg_scale > 0:
        refusing = [p.name for p in policies if not p.guidance]
        if refusing:
            raise ValueError(f"cfg_scale: {', '.join(refusing)} does not support classifier-free guidance "
                             f"(cfg_scale={gen.cfg_scale}); use cfg_scale=0 with it")
    if gen.block_cache is not None:
        refusing = [p.name for p in policies if not p.block_caches] + (["router"] if router is not None else [])
        if refusing:
            raise ValueError(f"block_cache runs the step's forwards itself: it composes with neither DyLLM (its own "
                             f"caches) nor the router (its own layouts) ({refusing})")
        return BlockCacheLayouts(gen.block_cache, state, model)
    if router is not None:
        padded_only = gen.cfg_scale > 0 or not all(p.packed_layouts for p in policies)
        return RoutedLayouts(None if router is True else router, state, model, padded_only=padded_only)
    return PaddedLayouts()


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
    policies: Sequence[Policy] = (),
    request_seeds: Sequence[int] | None = None,
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
    graphs: how steps replay (``graphs``): "auto" (CUDA graphs on a CUDA device, eagerly elsewhere,
        said once), "cuda" (CUDA graphs, an error elsewhere and on any failed capture), None (plain
        eager), or a graph backend object.
    policies: further ``Policy`` objects, called after the built-in ones.
    request_seeds: with ``GenerationConfig(rng="per_request")``, each request's own seed (instead
        of ``seed + index``), so that a request draws the same whatever batch or shard it is in.
    progress: a progress bar over the denoising steps.
    """
    t0 = time.perf_counter()
    sizes = micro_batches(model, input_ids, gen if gen is not None else GenerationConfig(), seer=seer, dyllm=dyllm,
                          router=router)
    if len(sizes) > 1:  # the prompt cache of the whole batch would not fit: decode it in parts that do
        return _in_micro_batches(sizes, model, input_ids, attention_mask=attention_mask, images=images, gen=gen,
                                 seer=seer, dyllm=dyllm, router=router, graphs=graphs, policies=policies,
                                 request_seeds=request_seeds, progress=progress)
    with prange("generate"):
        scheduler = prepare(model, input_ids, attention_mask=attention_mask, images=images, gen=gen, seer=seer,
                            dyllm=dyllm, router=router, graphs=graphs, policies=policies,
                            request_seeds=request_seeds, progress=progress)
        try:
            scheduler.run()
            out = output(scheduler)
            if scheduler.runner.finite is not None:  # the NaN/inf watch's one read (GenerationConfig.check_finite)
                scheduler.runner.finite.raise_if_found(out)
        finally:
            scheduler.release()  # graphs and caches go with the call (not at Python's next cyclic collection)
    out.stats.add_time("total", time.perf_counter() - t0)
    return out


def prepare(model, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None, images=None,
            gen: GenerationConfig | None = None, seer: SeerConfig | None = None, dyllm: DyLLMConfig | None = None,
            router: RouterConfig | bool | None = None, graphs="auto", policies: Sequence[Policy] = (),
            request_seeds: Sequence[int] | None = None, progress: bool = False) -> Scheduler:
    """One ``generate`` call validated, composed and set up to its first step (the arguments are
    :func:`generate`'s): the batch state with its prompts embedded and prefilled, the model runner
    with its layout, the commit rule, the policies started. Returns the call's scheduler;
    ``scheduler.run()`` decodes, ``scheduler.release()`` lets the call's graphs and caches go."""
    gen = gen if gen is not None else GenerationConfig()
    images = validate_request(model, input_ids, attention_mask, images, gen)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool, got {type(progress).__name__}")
    check_request_seeds(request_seeds, input_ids.shape[0], gen)
    composed = compose_policies(seer=seer, dyllm=dyllm, policies=policies)
    state = BatchState(model, input_ids, gen, request_seeds=request_seeds)
    runner = ModelRunner(model, state, policies=composed, graphs=Graphs(resolve_backend(graphs, state.device)),
                         check_finite=gen.check_finite)
    try:
        runner.embed_prompt(attention_mask, images)
        if images is not None:  # the image features are embedded now: the exact prompt length
            check_sequence_length(model, state.prompt_len, gen, images_counted=True)
        if state.prefix_cache:
            runner.prefill()
        state.open_windows()
        runner.layouts = compose_layouts(model, state, composed, router)
        scheduler = Scheduler(state, runner, rule_for(state), policies=composed, progress=progress)
        for p in composed:
            cut = p.start(state, model)
            if cut is not None:  # windows cut before step 0
                for b, n in cut.lengths.items():
                    state.window.set(b, n)
                scheduler.plan_cut(cut)
    except BaseException:
        runner.release()
        state.release()
        raise
    return scheduler


def device_free_bytes(device: torch.device) -> int | None:
    """Bytes free on ``device`` (CUDA: ``torch.cuda.mem_get_info``); None elsewhere (no split)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.mem_get_info(device)[0])


def micro_batches(model, input_ids: torch.Tensor, gen: GenerationConfig, *, seer=None, dyllm=None,
                  router=None) -> list[int]:
    """The micro-batch sizes a call with a prefix cache decodes in, so that its planned memory
    (``memory.memory_plan``: the prompt cache, the forwards, the caches of its layout) fits what the
    device has free (``device_free_bytes``, less 10%); one micro-batch (the whole batch) without a
    prefix cache, off CUDA, or when it fits. Raises ``memory.DoesNotFitError`` naming the sizes
    when one request alone does not fit. Image features are counted as one prompt position each
    here (a lower bound: LaViDa's real prompt is checked again once embedded)."""
    if not (isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and isinstance(gen, GenerationConfig)):
        return [1]  # not a request batch: generate's validation names what is wrong
    batch = input_ids.shape[0]
    prefix_cache = gen.prefix_cache if gen.prefix_cache is not None else bool(getattr(model, "is_multimodal", False))
    free = device_free_bytes(input_ids.device) if prefix_cache else None
    if free is None or batch <= 1:
        return [batch]
    layout = "router" if router is not None else ("pad_to_longest" if seer is not None else "vanilla")
    shape = RequestShape(batch, input_ids.shape[1], gen.gen_length, dtype=model.dtype, prefix_cache=True,
                         layout=layout, dyllm=dyllm is not None, block_cache=gen.block_cache,
                         block_length=gen.block_length, cfg=gen.cfg_scale > 0)
    sizes, _ = plan_micro_batches(free, ModelDims.from_model(model), shape, reserve=0.1)
    return sizes


def _in_micro_batches(sizes: list[int], model, input_ids: torch.Tensor, *, attention_mask, images, gen,
                      request_seeds, **kwargs) -> GenerationOutput:
    """``generate`` over consecutive parts of the batch of ``sizes`` requests each, merged: the same
    sequences as one call (each request decodes alone in a batch; with ``rng="per_request"`` each part
    keeps its requests' own seeds), statistics added (per-request lists in order, counts summed)."""
    gen = gen if gen is not None else GenerationConfig()
    if request_seeds is None and gen.rng == "per_request":
        base = 0 if gen.seed is None else gen.seed
        request_seeds = [base + b for b in range(input_ids.shape[0])]
    outs, start = [], 0
    for n in sizes:
        part = slice(start, start + n)
        outs.append(generate(model, input_ids[part], attention_mask=None if attention_mask is None
                             else attention_mask[part], images=None if images is None else images[part], gen=gen,
                             request_seeds=None if request_seeds is None else request_seeds[part], **kwargs))
        start += n
    stats = GenerationStats(nfe=sum(o.stats.nfe for o in outs),
                            positions_computed=sum(o.stats.positions_computed for o in outs),
                            positions_computed_dense=sum(o.stats.positions_computed_dense for o in outs),
                            positions_computed_per_request=[n for o in outs
                                                            for n in o.stats.positions_computed_per_request],
                            steps=[n for o in outs for n in o.stats.steps],
                            steps_saved=[n for o in outs for n in o.stats.steps_saved],
                            extra=_merged([o.stats.extra for o in outs], sizes))
    for o in outs:
        for phase, seconds in o.stats.time_s.items():
            stats.add_time(phase, seconds)
    stats.extra["micro_batches"] = list(sizes)
    return GenerationOutput(torch.cat([o.sequences for o in outs]), torch.cat([o.responses for o in outs]),
                            torch.cat([o.end_positions for o in outs]), stats, outs[0].end_ids)


def _merged(parts: list, sizes: list[int]):
    """Micro-batches' reports as one: dicts key by key, per-request lists (one entry per request of
    each part) joined in order, ints added, anything else kept where equal and listed per part
    where not."""
    first = parts[0]
    if all(isinstance(p, dict) for p in parts):
        return {k: _merged([p.get(k) for p in parts], sizes) for k in first}
    if all(isinstance(p, list) and len(p) == n for p, n in zip(parts, sizes)):
        return [x for p in parts for x in p]
    if all(isinstance(p, int) and not isinstance(p, bool) for p in parts):
        return sum(parts)
    return first if all(p == first for p in parts) else list(parts)


@torch.no_grad()
def first_forward(model, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None, images=None,
                  gen: GenerationConfig | None = None, policies: Sequence[Policy] = ()) -> torch.Tensor:
    """Step 0's forward of a batch alone, every request's full window padded, with ``policies``
    watching it (what a calibration records); nothing is committed. Returns the window logits
    ``[B, gen_length, V]``."""
    scheduler = prepare(model, input_ids, attention_mask=attention_mask, images=images, gen=gen, policies=policies,
                        graphs=None)
    try:
        logits, _, _ = scheduler.runner.run(list(range(scheduler.state.batch_size)), 0)
    finally:
        scheduler.release()
    return logits


def output(scheduler: Scheduler) -> GenerationOutput:
    """The call's sequences, windows (a cut suffix reported as EOS padding) and statistics."""
    state, runner, policies = scheduler.state, scheduler.runner, scheduler.policies
    window = state.tokens.clone()
    for b in range(state.batch_size):
        if state.window[b] < state.width:
            window[b, state.window[b]:] = state.token_ids.eos
    if state.ended:  # early stop: the positions after the end token were never decoded
        index = state.device_tensor(sorted(state.ended))
        ended = window.index_select(0, index)
        end = first_end_positions(ended, state.token_ids.end_ids)
        after = torch.arange(state.width, device=state.device) > end[:, None]
        window.index_copy_(0, index, ended.masked_fill(after, state.token_ids.eos))
    stats = state.stats
    per_request = list(state.positions_per_request)
    for p in policies:
        saved = p.saved_positions(state)
        if saved is not None:
            stats.positions_computed -= saved[0]
            per_request = [n - s for n, s in zip(per_request, saved[1])]
    stats.positions_computed_per_request = per_request
    stats.steps = list(state.steps_done)
    stats.steps_saved = list(state.steps_saved)
    for p in policies:
        stats.extra.update(p.report(state) or {})
    stats.extra.update(runner.report())
    sequences = torch.cat([state.input_ids, window], dim=1)
    return GenerationOutput(sequences, window, first_end_positions(window, state.token_ids.end_ids), stats,
                            state.token_ids.end_ids)
