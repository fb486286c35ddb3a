"""Train the embedded demo model: a small LaViDa-LLaDA on the procedural tasks of ``tasks.py``.

    python -m model_adapters.embedded.train [--minutes 60] [--seed 0] [--out DIR]
    python -m model_adapters.embedded.train --workload arith ...

``--workload`` chooses the model (:data:`WORKLOADS`): ``demo`` (this docstring's DMLLM, the
default) or ``arith``, a text-only LLaDA on the word problems of ``arith/tasks.py`` (window 128,
decoded in blocks of 32 at its held-out checks, scored by the final answer); the same recipe,
without the vision options.

Recipe (LLaDA SFT, ``reference/MODELS.md`` §1.7; LaViDa §4.4-4.5):

* prompt = BOS, user header, [image], question, end of turn, assistant header; left-padded;
  never masked. Embeddings come from ``model.embed_prompt`` (image features replace -200).
* response window of ``RESPONSE_WINDOW`` = 32 positions: answer, ``<|eot_id|>``, then
  ``<|endoftext|>`` padding to the end; every response position is masked independently with
  probability t, t ~ U(eps, 1) per sample (stratified over the batch);
* loss = sum over masked positions of CE / t, divided by the window length W per sample and
  averaged over the batch (LLaDA's SFT normalisation);
* attention: per sample either full bidirectional or the prefix-LM mask (prompt rows attend only
  to the prompt; response rows to everything), ``--prefix-lm-fraction`` (0.5) of the samples,
  because inference uses LaViDa's prefix K/V cache (the prompt computed once, seeing itself).

The shipped weights come from one run of ``make train-demo-model``, which then calibrates Seer
and DyLLM for the result (the command, curves and held-out figures are in ``bench/RESULTS.md``;
``train_log.json`` records them). ``--image-focus`` draws part of each batch from the image
families only; ``--window-cut`` trains part of the samples on a window cut after their answer,
so that the model answers the same in a window Seer shortened. ``--init-from`` starts a later
phase from a run's weights (earlier recipes had up to five phases).

The learning rate matters more than anything else here: at a peak of 3e-3 (the earlier
recipes') the backbone never learnt to find the cell a question names, in any recipe tried over
four sessions; at 3e-4 it does within the first thousand steps (``bench/embedded_lookup_lr.py``
isolates it on the lookup questions alone).

The vision stage (first phase): ``--vision-steps N`` first trains the SigLIP tower alone to name
each pooled cell's colour, shape and place (:func:`pretrain_vision_tower`; LaViDa starts from a
pretrained SigLIP), re-initialises the projector for it (:func:`init_projector_whitened`), keeps
the tower frozen during the SFT (``--train-vision`` keeps training it) and computes the image
tokens in fp32; ``--align-steps`` then fits the projector so that a cell token is the sum of its
words' embeddings (:func:`align_projector_to_words`) and ``--freeze-projector`` keeps it so
during the SFT (a trained projector lets the image tokens grow to hundreds of times a word's
norm); ``--drill p`` draws part of each batch as reading drills (list every cell's colour or
shape). A later phase started with ``--init-from`` from such a run keeps its tower frozen and its
fp32 image path.

Determinism: the data stream, the masks and the initialisation come from ``--seed``, the thread
count is fixed (``--threads``, 2), and the run length is a number of optimizer steps:
``--minutes`` converts to steps with a fixed rate measured on the reference machine (2 shared
AMD EPYC cores), not with a clock, so the same command gives the same weights on any machine
with the same thread count (a faster machine just finishes sooner). ``--steps`` overrides.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import EMBEDDED_DIR, RESPONSE_WINDOW, EmbeddedTokenizer, build_tokenizer, write_tokenizer_config
from .tasks import HELDOUT_SEED, IMAGE_SIZE, RequestStream, TaskRequest, make_requests

# Optimizer steps per reference minute (1 thread on a shared 2-core AMD EPYC, batch 48, default size:
# measured ~1.3 steps/s, so --minutes 60 took ~48 min there).
STEPS_PER_REFERENCE_MINUTE = 60.0


def model_config(tok: EmbeddedTokenizer, *, d_model: int = 192, n_layers: int = 7, n_heads: int = 6,
                 mlp_hidden: int = 512, vision_hidden: int = 64, vision_layers: int = 2) -> dict:
    """The ``config.json`` of the demo model (a ``llava_llada`` with a small SigLIP tower)."""
    from model_adapters.configs import LLADA_8B_INSTRUCT

    vocab = tok.vocab_size
    cfg = dict(LLADA_8B_INSTRUCT)
    cfg.update(
        model_type="llava_llada", architectures=["LlavaLladaForMaskedDiffusion"],
        d_model=d_model, n_heads=n_heads, n_kv_heads=n_heads, n_layers=n_layers, mlp_hidden_size=mlp_hidden,
        mlp_ratio=mlp_hidden / d_model, vocab_size=vocab, embedding_size=vocab, rope_theta=10000.0,
        max_sequence_length=128, precision="fp32", **tok.config_ids(),
        # LaViDa's LLaVA fields, sized for 48 px images: 6x6 patches -> 3x3 pooled + 1 newline
        mm_vision_tower="embedded-siglip-tiny", mm_projector_type="mlp2x_gelu", mm_hidden_size=vision_hidden,
        mm_vision_select_layer=-2, mm_spatial_pool_mode="bilinear", mm_spatial_pool_stride=2,
        mm_patch_merge_type="spatial_unpad", image_aspect_ratio="square", mm_newline_position="one_token",
        vision_drop_last_layers=1,
        vision_config={"hidden_size": vision_hidden, "intermediate_size": 2 * vision_hidden,
                       # one more layer than kept: LaViDa builds SigLIP then drops its last layer
                       "num_hidden_layers": vision_layers + 1,
                       "num_attention_heads": max(1, vision_hidden // 32),
                       "patch_size": 8, "image_size": IMAGE_SIZE, "layer_norm_eps": 1e-6, "num_channels": 3},
        response_window=RESPONSE_WINDOW,
    )
    cfg.pop("image_grid_pinpoints", None)
    return cfg


def text_model_config(tok: EmbeddedTokenizer, *, window: int, d_model: int, n_layers: int, n_heads: int,
                      mlp_hidden: int, max_prompt: int = 96) -> dict:
    """The ``config.json`` of a text-only embedded model (an ``llada`` of the given size, LLaDA's
    architecture and special-token roles; room for ``max_prompt`` prompt tokens and ``window``)."""
    from model_adapters.configs import LLADA_8B_INSTRUCT

    vocab = tok.vocab_size
    cfg = dict(LLADA_8B_INSTRUCT)
    cfg.update(d_model=d_model, n_heads=n_heads, n_kv_heads=n_heads, n_layers=n_layers, mlp_hidden_size=mlp_hidden,
               mlp_ratio=mlp_hidden / d_model, vocab_size=vocab, embedding_size=vocab, rope_theta=10000.0,
               max_sequence_length=max_prompt + window, precision="fp32", response_window=window,
               **tok.config_ids())
    return cfg


def init_weights(model: torch.nn.Module, n_layers: int, generator: torch.Generator) -> None:
    """GPT-style init everywhere, the vision tower included: N(0, 0.02) weights (residual output
    projections scaled by 1/sqrt(2 n_layers)), zero biases, unit norms.

    The vision tower matters most: with PyTorch's default init (position embedding N(0, 1),
    kaiming convolutions and linears) and no final norm (LaViDa reads SigLIP before
    ``post_layernorm``), projected image tokens came out ~2500x the norm of text embeddings, and
    after 1200 steps the model still ignored the image."""
    small = 0.02 / math.sqrt(2 * n_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("image_newline"):
                p.normal_(0.0, 0.02, generator=generator)
            elif name.endswith(".bias"):
                p.zero_()
            elif p.dim() < 2:
                continue  # RMSNorm / LayerNorm weights stay 1
            elif name.endswith(("attn_out.weight", "self_attn.out_proj.weight", "mlp.fc2.weight")) or (
                    ".blocks." in name and name.endswith("ff_out.weight")):
                p.normal_(0.0, small, generator=generator)
            else:
                p.normal_(0.0, 0.02, generator=generator)


def init_number_values(model: torch.nn.Module, tok: EmbeddedTokenizer, *, scale: float = 0.05) -> list[int]:
    """Give every number token's input embedding its value: dimension 0 holds ``v / 100 * 20 *
    scale`` (a ramp), dimensions 1-4 ``scale * (cos, sin)(2 pi v / 10)`` and ``(2 pi v / 100)``;
    the other dimensions keep their random init. Returns the token ids set.

    Why: with value features in the embedding, ``x + k`` is a sum of two fetched vectors and the
    readout a linear map, where random embeddings leave every fact to be memorised; the arith
    workload's results are such sums (a number word is one token, ``"0"`` .. ``"99"``)."""
    vocab = tok.tokenizer.get_vocab()
    emb = model.model.transformer.wte.weight
    ids = []
    with torch.no_grad():
        for word, i in vocab.items():
            if not word.isdigit():
                continue
            v = int(word)
            two_pi = 2 * math.pi
            emb[i, 0] = 20 * scale * v / 100
            emb[i, 1], emb[i, 2] = scale * math.cos(two_pi * v / 10), scale * math.sin(two_pi * v / 10)
            emb[i, 3], emb[i, 4] = scale * math.cos(two_pi * v / 100), scale * math.sin(two_pi * v / 100)
            ids.append(i)
    return ids


# ------------------------------------------------------------------------------------ vision stage
def _random_grids(rng, n: int):
    """``n`` random grids of 0..MAX_SHAPES shapes, drawn lazily (one per iteration)."""
    from .tasks import MAX_SHAPES, _random_grid

    return (_random_grid(rng, int(rng.integers(0, MAX_SHAPES + 1))) for _ in range(n))


def _grid_pixels(grids, rng, device) -> torch.Tensor:
    """Pixel values ``[n, 3, S, S]`` of ``grids`` drawn with ``rng`` (as the tasks draw them).

    ``grids`` may be a lazy iterable: each grid is then chosen just before it is drawn, which
    is a different ``rng`` sequence from choosing every grid first (a list)."""
    from .tasks import draw_grid

    return torch.cat([TaskRequest("grid", "", "", draw_grid(g, rng), g).image_input().pixel_values
                      for g in grids]).to(device)


def pretrain_vision_tower(model, *, steps: int, seed: int, batch_size: int = 64, lr: float = 3e-3) -> dict:
    """Stage 0: train the SigLIP tower alone to say, per 2x2-pooled cell of a drawn grid, its
    colour (or empty), its shape (or empty) and which cell it is, through a linear head that is
    then thrown away. LaViDa starts from a pretrained SigLIP; this is ours, on our images.

    Returns the held-out (256 images) accuracies of the head. Deterministic given ``seed``.
    """
    import numpy as np

    from .tasks import COLOURS, SHAPES

    tower = model.model.vision_tower
    pool = int(model.config.get("mm_spatial_pool_stride", 2))
    hidden = int(model.config["mm_hidden_size"])
    head = torch.nn.Linear(hidden, 5 + 4 + 9).to(model.device)
    torch.nn.init.normal_(head.weight, 0.0, 0.02, generator=torch.Generator().manual_seed(seed))
    torch.nn.init.zeros_(head.bias)
    opt = torch.optim.AdamW(list(tower.parameters()) + list(head.parameters()), lr=lr, weight_decay=0.0)

    def images(rng, n):
        grids = list(_random_grids(rng, n))
        px = _grid_pixels(grids, rng, model.device)
        colour = torch.tensor([[0 if c is None else 1 + COLOURS.index(c[0]) for c in g] for g in grids])
        shape = torch.tensor([[0 if c is None else 1 + SHAPES.index(c[1]) for c in g] for g in grids])
        return px, colour.to(model.device), shape.to(model.device)

    def cell_logits(px):
        feats = tower(px)  # [n, side * side, hidden]
        n, length, d = feats.shape
        side = math.isqrt(length)
        grid = F.avg_pool2d(feats.transpose(1, 2).reshape(n, d, side, side), pool)
        if grid.shape[-1] != 3:
            raise ValueError(f"the vision stage needs 3x3 pooled cells, got {tuple(grid.shape[-2:])}")
        return head(grid.flatten(2).transpose(1, 2))  # [n, 9, 18]

    def loss_and_acc(px, colour, shape):
        z = cell_logits(px)
        where = torch.arange(9, device=px.device).expand(px.shape[0], 9)
        loss = (F.cross_entropy(z[..., :5].flatten(0, 1), colour.flatten())
                + F.cross_entropy(z[..., 5:9].flatten(0, 1), shape.flatten())
                + F.cross_entropy(z[..., 9:].flatten(0, 1), where.flatten()))
        acc = {"colour": (z[..., :5].argmax(-1) == colour).float().mean().item(),
               "shape": (z[..., 5:9].argmax(-1) == shape).float().mean().item(),
               "cell": (z[..., 9:].argmax(-1) == where).float().mean().item()}
        return loss, acc

    rng = np.random.default_rng([seed, 7])
    held = images(np.random.default_rng([seed, 8]), 256)
    with torch.autocast(model.device.type, enabled=False):
        for _ in range(steps):
            loss, _ = loss_and_acc(*images(rng, batch_size))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            _, acc = loss_and_acc(*held)
    return acc


@torch.no_grad()
def init_projector_whitened(model, *, seed: int, n_images: int = 256, out_scale: float = 0.01) -> None:
    """Re-initialise the mlp2x_gelu projector for the tower it sits on: the first linear layer
    standardises every tower channel (its mean and spread over ``n_images`` drawn grids folded
    into weight and bias) into small pre-activations where GELU is nearly linear, the second
    maps to tokens of about a word embedding's norm, with the mean image token removed.

    Why: the tower (read before ``post_layernorm``, as LaViDa reads SigLIP) outputs channels
    with means of several units; a projector with a plain N(0, 0.02) init then gives every
    cell nearly the same token (a large shared part, a small content part), and the backbone
    never learned to read them (measured: a reading drill stayed at its prior for 500 steps;
    with this init it read 86% of cells after 300).
    """
    import numpy as np

    rng = np.random.default_rng([seed, 9])
    px = _grid_pixels(_random_grids(rng, n_images), rng, model.device)
    with torch.autocast(model.device.type, enabled=False):
        feats = model.model.vision_tower(px).flatten(0, 1).float()
    mean, spread = feats.mean(0), feats.std(0) + 1e-3
    first, second = model.model.mm_projector[0], model.model.mm_projector[2]
    gen = torch.Generator().manual_seed(seed)
    w1 = torch.randn(first.weight.shape, generator=gen).to(feats) * (0.3 / math.sqrt(feats.shape[1])) / spread
    first.weight.copy_(w1)
    first.bias.copy_(-(w1 @ mean))
    hidden = F.gelu(feats @ w1.T + first.bias)
    w2 = torch.randn(second.weight.shape, generator=gen).to(feats) * out_scale
    second.weight.copy_(w2)
    second.bias.copy_(-(hidden @ w2.T).mean(0))


def align_projector_to_words(model, tok: EmbeddedTokenizer, *, steps: int, seed: int, batch_size: int = 64,
                             lr: float = 3e-3) -> float:
    """Fit the projector so that each pooled cell token is the sum of the word embeddings of
    its colour, shape, row and column ("nothing" twice for an empty cell), the way LLaVA's
    first stage aligns image features with the LLM's embedding space. Freezes the tower (its
    parameters stop requiring grad). Returns the last batch's mean squared error per token."""
    import numpy as np

    from .tasks import COLOURS, COLS, ROWS, SHAPES

    for p in model.model.vision_tower.parameters():
        p.requires_grad_(False)
    rng = np.random.default_rng([seed, 10])
    proj = model.model.mm_projector
    opt = torch.optim.Adam(proj.parameters(), lr=lr)
    word = {w: tok.encode(w)[0] for w in ["nothing", *COLOURS, *SHAPES, *ROWS, *COLS]}
    loss = torch.zeros(())
    for _ in range(steps):
        grids = list(_random_grids(rng, batch_size))
        px = _grid_pixels(grids, rng, model.device)
        ids = []
        for g in grids:
            for idx, cell in enumerate(g):
                r, c = divmod(idx, 3)
                what = ["nothing", "nothing"] if cell is None else list(cell)
                ids.append([word[w] for w in (*what, ROWS[r], COLS[c])])
        with torch.no_grad():
            target = model.embed(torch.tensor(ids, device=model.device)).sum(1).view(batch_size, 9, -1)
        with torch.autocast(model.device.type, enabled=False):
            out = model.encode_images(px).reshape(batch_size, 9, -1)
            loss = ((out - target) ** 2).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return float(loss.detach())


def run_vision_stage(model, tok: EmbeddedTokenizer, *, vision_steps: int, align_steps: int, seed: int) -> dict:
    """The first phase's vision stage: :func:`pretrain_vision_tower`, then
    :func:`init_projector_whitened`, then (``align_steps > 0``) :func:`align_projector_to_words`.
    Returns the tower's held-out cell accuracies, with ``align_mse`` when aligned."""
    stage = pretrain_vision_tower(model, steps=vision_steps, seed=seed)
    init_projector_whitened(model, seed=seed)
    if align_steps > 0:
        stage["align_mse"] = align_projector_to_words(model, tok, steps=align_steps, seed=seed)
    return stage


# ------------------------------------------------------------------------------------ batches
def prompt_batch(model, tok: EmbeddedTokenizer, reqs: list[TaskRequest]):
    """Prompt embeddings ``[B, Lp, D]`` and bool key mask ``[B, Lp]`` (left-padded) for requests."""
    ids, mask = tok.pad_batch([tok.chat_prompt(r.question, r.has_image) for r in reqs])
    images = [r.image_input() for r in reqs] if model.is_multimodal else None
    embeds, pmask = model.embed_prompt(ids.to(model.device), mask.to(model.device), images)
    if pmask is None:
        pmask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
    return embeds, pmask.bool()


def semi_autoregressive_mask(masked: torch.Tensor, start: torch.Tensor, block: int) -> torch.Tensor:
    """The mask semi-autoregressive decoding leaves: bool ``masked [B, W]`` (uniform at rate t)
    kept in the block ``[start, start + block)`` of each row (``start`` int ``[B]``), every
    position before it clean, every position after it masked."""
    pos = torch.arange(masked.shape[1], device=masked.device)[None]
    start = start.to(masked.device)[:, None]
    return (pos >= start) & ((pos >= start + block) | masked)


def training_loss(model, tok: EmbeddedTokenizer, reqs: list[TaskRequest], gen: torch.Generator, *,
                  window: int, eps: float, prefix_lm_fraction: float, window_cut: float = 0.0,
                  vision_fp32: bool = False, semi_ar: float = 0.0, block: int = 32) -> torch.Tensor:
    """LLaDA's SFT loss on one batch (see the module docstring).

    window_cut: the probability that a sample's window is cut to a random length between its
    answer plus end-of-turn and ``window`` (the positions after it are neither keys nor loss
    terms). LLaDA's SFT pads with EOS to the longest sequence of each batch, so its model sees
    many tail lengths; a model that only ever saw the full window changes its answers when Seer
    removes the tail (measured: 41 of 96 answers moved with an exact cut).

    vision_fp32: compute the prompt embeddings (image tokens included) outside autocast.

    semi_ar: the probability that a sample is masked as semi-autoregressive decoding leaves a
    window (block-aligned, ``block`` positions): a random number of leading blocks clean, the
    next block masked at rate t, every block after it fully masked. Uniform masking (LLaDA's)
    almost never shows a decoded prefix before an all-mask suffix, the state every block after
    the first is decoded from.
    """
    from seer_runtime.adapter import PaddedLayout

    b = len(reqs)
    dev = model.device
    target = torch.tensor([tok.response_window(r.answer, window) for r in reqs], dtype=torch.long)
    # t per sample, stratified over the batch, mapped to [eps, 1)
    strata = (torch.randperm(b, generator=gen) + torch.rand(b, generator=gen)) / b
    t = eps + (1.0 - eps) * strata
    masked = torch.rand(b, window, generator=gen) < t[:, None]
    if semi_ar > 0:
        start = torch.randint(0, -(-window // block), (b,), generator=gen) * block  # the block being decoded
        in_order = semi_autoregressive_mask(masked, start, block)
        masked = torch.where((torch.rand(b, generator=gen) < semi_ar)[:, None], in_order, masked)
    prefix_lm = torch.rand(b, generator=gen) < prefix_lm_fraction
    target, masked, t, prefix_lm = target.to(dev), masked.to(dev), t.to(dev), prefix_lm.to(dev)
    noisy = torch.where(masked, torch.full_like(target, tok.mask_id), target)

    # bf16 autocast rounds the image tokens' content away when the tower's outputs are large
    with torch.autocast(dev.type, enabled=False) if vision_fp32 else contextlib.nullcontext():
        p_embeds, p_mask = prompt_batch(model, tok, reqs)
    lp = p_embeds.shape[1]
    embeds = torch.cat([p_embeds, model.embed(noisy)], dim=1)
    length = lp + window
    in_window = torch.ones(b, window, dtype=torch.bool)
    if window_cut > 0:
        need = torch.tensor([r.answer_tokens + 1 for r in reqs])  # answer + end of turn
        cut = torch.rand(b, generator=gen) < window_cut
        span = (window - need + 1).clamp_min(1)
        keep = torch.where(cut, need + (torch.rand(b, generator=gen) * span).long(), torch.full_like(need, window))
        in_window = torch.arange(window)[None] < keep.clamp_max(window)[:, None]
    in_window = in_window.to(dev)
    masked = masked & in_window
    keys = torch.cat([p_mask, in_window], dim=1)
    allowed = keys[:, None, :].expand(b, length, length).clone()
    allowed[:, :lp, lp:] &= ~prefix_lm[:, None, None]  # prompt rows do not see the response
    positions = torch.arange(length, device=dev).expand(b, length)
    logits = model.forward_embeds(embeds, PaddedLayout(positions, attn_mask=allowed[:, None]))[:, lp:]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
    ce = ce.view(b, window)
    return (ce * masked / t[:, None]).sum() / (b * window)


def sft_step(model: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """One optimizer step of the SFT: backward, clip the whole model's gradient norm to 1, step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


# ------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def step0_logits(model, tok: EmbeddedTokenizer, reqs: list[TaskRequest], window: int = RESPONSE_WINDOW,
                 prefix_cache: bool = True) -> torch.Tensor:
    """Logits ``[B, W, V]`` of the all-mask response window at denoising step 0.

    prefix_cache=True: the prompt is prefilled once (attending only to itself) and the window
    attends to the cached prompt and itself, as LaViDa's prefix-DLM cache runs it.
    """
    from seer_runtime.adapter import PaddedLayout

    b = len(reqs)
    dev = model.device
    p_embeds, p_mask = prompt_batch(model, tok, reqs)
    lp = p_embeds.shape[1]
    w_embeds = model.embed(torch.full((b, window), tok.mask_id, dtype=torch.long, device=dev))
    keys = torch.cat([p_mask, torch.ones(b, window, dtype=torch.bool, device=dev)], dim=1)
    if prefix_cache:
        cache, _ = model.prefill(p_embeds, p_mask, torch.arange(lp, device=dev).expand(b, lp))
        layout = PaddedLayout(torch.arange(lp, lp + window, device=dev).expand(b, window), key_mask=keys)
        return model.forward_embeds(w_embeds, layout, prefix=cache)
    layout = PaddedLayout(torch.arange(lp + window, device=dev).expand(b, lp + window), key_mask=keys)
    return model.forward_embeds(torch.cat([p_embeds, w_embeds], 1), layout)[:, lp:]


def first_end(ids: torch.Tensor, end_ids: tuple[int, ...]) -> torch.Tensor:
    """Index of the first end token (EOS / end of turn) per row of ``ids [B, W]``; W when none."""
    is_end = torch.zeros_like(ids, dtype=torch.bool)
    for e in end_ids:
        is_end |= ids == e
    w = ids.shape[1]
    idx = torch.where(is_end, torch.arange(w, device=ids.device), torch.full_like(ids, w))
    return idx.min(dim=1).values


@torch.no_grad()
def evaluate_step0(model, tok: EmbeddedTokenizer, reqs: list[TaskRequest], *, window: int = RESPONSE_WINDOW,
                   batch_size: int = 64, per_kind: bool = False) -> dict:
    """Step-0 proxies on ``reqs``: answer-length accuracy (first end token of the step-0 argmax at
    the true answer end), per-token accuracy of the argmax (whole window / answer positions), and
    the fraction of windows whose step-0 argmax is already entirely right."""
    was_training = model.training
    model.eval()
    n_len = n_tok = n_ans_ok = n_ans = n_exact = 0
    kinds: dict[str, list[int]] = {}
    for s in range(0, len(reqs), batch_size):
        chunk = reqs[s: s + batch_size]
        target = torch.tensor([tok.response_window(r.answer, window) for r in chunk], device=model.device)
        pred = step0_logits(model, tok, chunk, window).argmax(-1)
        true_len = torch.tensor([r.answer_tokens for r in chunk], device=model.device)
        len_ok = first_end(pred, (tok.eos_id, tok.eot_id)) == true_len
        n_len += int(len_ok.sum())
        n_tok += int((pred == target).sum())
        ans_pos = torch.arange(window, device=model.device)[None] < true_len[:, None]
        n_ans_ok += int(((pred == target) & ans_pos).sum())
        n_ans += int(ans_pos.sum())
        exact = (pred == target).all(dim=1)
        n_exact += int(exact.sum())
        for r, lo, ex in zip(chunk, len_ok.tolist(), exact.tolist()):
            k = kinds.setdefault(r.kind, [0, 0, 0])
            k[0] += 1
            k[1] += lo
            k[2] += ex
    model.train(was_training)
    n = max(len(reqs), 1)
    out = {"requests": len(reqs), "step0_length_acc": n_len / n, "step0_token_acc": n_tok / (n * window),
           "step0_answer_token_acc": n_ans_ok / max(n_ans, 1), "step0_window_exact": n_exact / n}
    if per_kind:
        out["per_kind"] = {k: {"n": v[0], "length_acc": v[1] / v[0], "window_exact": v[2] / v[0]}
                           for k, v in sorted(kinds.items())}
    return out


@torch.no_grad()
def decode_requests(model, tok: EmbeddedTokenizer, reqs: list[TaskRequest], *, window: int = RESPONSE_WINDOW,
                    prefix_cache: bool = True, seer=None, gen=None):
    """Decode ``reqs`` with ``seer_runtime.generate`` -> the engine's ``GenerationOutput``.

    gen: the ``GenerationConfig`` (default: gen_length = steps = block_length = ``window``,
    argmax, low-confidence remasking, ``prefix_cache``)."""
    import seer_runtime

    if gen is None:
        gen = seer_runtime.GenerationConfig(gen_length=window, steps=window, block_length=window,
                                            prefix_cache=prefix_cache)
    ids, mask = tok.pad_batch([tok.chat_prompt(r.question, r.has_image) for r in reqs])
    images = [r.image_input() for r in reqs] if model.is_multimodal else None
    return seer_runtime.generate(model, ids.to(model.device), attention_mask=mask.to(model.device),
                                 images=images, gen=gen, seer=seer)


def exact_matches(tok: EmbeddedTokenizer, reqs: list[TaskRequest], out) -> list[bool]:
    """Per request: the window decodes to the answer (text before the first EOS / end of turn
    equals it) and only end tokens follow it."""
    ends = {tok.eos_id, tok.eot_id}
    hits = []
    for i, r in enumerate(reqs):
        answer = out.answer_ids(i)
        tail = out.responses[i].tolist()[len(answer):]
        hits.append(tok.decode(answer) == r.answer and all(t in ends for t in tail))
    return hits


@torch.no_grad()
def evaluate_decoding(model, tok: EmbeddedTokenizer, reqs: list[TaskRequest], *,
                      window: int = RESPONSE_WINDOW, batch_size: int = 50,
                      per_kind: bool = False, gen=None, score=None) -> dict:
    """Held-out score of the baseline decoder (prefix cache on).

    gen: the decoding (default: :func:`decode_requests`'s for ``window``); score:
    ``(tok, reqs, out) -> per-request bools`` (default :func:`exact_matches`), reported as
    ``exact_match``."""
    score = score or exact_matches
    was_training = model.training
    model.eval()
    hits: list[bool] = []
    for s in range(0, len(reqs), batch_size):
        chunk = reqs[s: s + batch_size]
        hits += score(tok, chunk, decode_requests(model, tok, chunk, window=window, gen=gen))
    model.train(was_training)
    res = {"requests": len(reqs), "exact_match": sum(hits) / max(len(reqs), 1)}
    if per_kind:
        kinds: dict[str, list[int]] = {}
        for r, h in zip(reqs, hits):
            k = kinds.setdefault(r.kind, [0, 0])
            k[0] += 1
            k[1] += h
        res["per_kind"] = {k: round(v[1] / v[0], 4) for k, v in sorted(kinds.items())}
    return res


# ------------------------------------------------------------------------------------ workloads
@dataclass(frozen=True)
class Workload:
    """What the trainer needs to know about one embedded model's tasks (``--workload``).

    out_dir: where the model ships; window: the response window; words: the tokenizer's ordinary
    words; model_config: ``(tok, args) -> config.json``; stream: ``args -> object with
    next_batch(k)``; heldout: ``n -> held-out requests`` (seed ``heldout_seed``); generation:
    ``() -> GenerationConfig`` of the held-out decoding (None: :func:`decode_requests`'s
    default); score: ``(tok, reqs, out) -> bools`` (None: :func:`exact_matches`);
    multimodal: whether the model has the vision path (the ``--vision-*``, ``--align-steps``,
    ``--freeze-projector``, ``--train-vision`` and ``--image-focus`` options need it).
    """

    name: str
    out_dir: Path
    window: int
    words: Callable[[], list[str]]
    model_config: Callable[[EmbeddedTokenizer, argparse.Namespace], dict]
    stream: Callable[[argparse.Namespace], object]
    heldout: Callable[[int], list]
    heldout_seed: int
    generation: Callable[[], object] | None = None
    score: Callable[[EmbeddedTokenizer, list, object], list[bool]] | None = None
    multimodal: bool = False


def _demo_workload() -> Workload:
    from .tasks import vocabulary_words

    return Workload(
        name="demo", out_dir=EMBEDDED_DIR, window=RESPONSE_WINDOW, words=vocabulary_words,
        model_config=lambda tok, a: model_config(tok, d_model=a.d_model, n_layers=a.layers, n_heads=a.heads,
                                                 mlp_hidden=a.mlp, vision_hidden=a.vision_hidden),
        stream=lambda a: RequestStream(a.seed, image_focus=a.image_focus, drill=a.drill),
        heldout=lambda n: make_requests(n, "heldout", seed=HELDOUT_SEED), heldout_seed=HELDOUT_SEED,
        multimodal=True)


def final_answer_matches(tok: EmbeddedTokenizer, reqs: list, out) -> list[bool]:
    """Per ``arith`` request: the decoded solution ends with ``answer N``, N the problem's answer."""
    from .arith.tasks import score

    return [score(r, tok.decode(out.answer_ids(i))) for i, r in enumerate(reqs)]


def _arith_workload() -> Workload:
    from .arith import ARITH_DIR
    from .arith import RESPONSE_WINDOW as ARITH_WINDOW
    from .arith import tasks as arith_tasks
    from .arith.serving import demo_generation_config

    return Workload(
        name="arith", out_dir=ARITH_DIR, window=ARITH_WINDOW, words=arith_tasks.vocabulary_words,
        model_config=lambda tok, a: text_model_config(tok, window=ARITH_WINDOW, d_model=a.d_model, n_layers=a.layers,
                                                      n_heads=a.heads, mlp_hidden=a.mlp),
        stream=lambda a: arith_tasks.RequestStream(a.seed, drill=a.drill,
                                                   ranges=getattr(arith_tasks, NUMBER_RANGES[a.number_ranges]),
                                                   end_marker=a.end_marker),
        heldout=lambda n: arith_tasks.make_requests(n, "heldout"), heldout_seed=arith_tasks.HELDOUT_SEED,
        generation=demo_generation_config, score=final_answer_matches)


WORKLOADS = {"demo": _demo_workload, "arith": _arith_workload}
#: ``--number-ranges`` of the arith workload (names in ``arith/tasks.py``): its own problems, or
#: the wider ones its first training phase draws
NUMBER_RANGES = {"shipped": "RANGES", "wide": "WIDE_RANGES"}


# ------------------------------------------------------------------------------------ main
def lr_at(step: int, total: int, peak: float, warmup: int, floor: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m model_adapters.embedded.train",
                                description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60.0,
                   help="budget in reference-machine minutes, converted to a fixed step count (default 60)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides --minutes)")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="demo",
                   help="which embedded model: the demo DMLLM (default) or the arith word-problem model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="output directory (default: the workload's shipped one)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on 2 shared busy cores, 2 threads ran 6x slower)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--lr", type=float, default=3e-4,
                   help="peak learning rate (at 3e-3 the cell lookups were never learnt: bench/RESULTS.md)")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--d-model", type=int, default=192)
    p.add_argument("--layers", type=int, default=7)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--mlp", type=int, default=512)
    p.add_argument("--vision-hidden", type=int, default=64)
    p.add_argument("--prefix-lm-fraction", type=float, default=0.5)
    p.add_argument("--eval-every", type=int, default=0, help="steps between held-out checks (0: 6 per run)")
    p.add_argument("--eval-requests", type=int, default=256)
    p.add_argument("--eval-decode", type=int, default=96, help="held-out requests decoded at each check")
    p.add_argument("--final-eval-requests", type=int, default=1000)
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from the weights and config of a directory this script wrote (phase 2)")
    p.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="also save the weights at every held-out check there (for inspection or --init-from)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: steps/20, at most 300)")
    p.add_argument("--stop-at", type=int, default=None,
                   help="stop after this many steps of a --steps schedule (the learning rate follows --steps)")
    p.add_argument("--image-focus", type=float, default=0.0,
                   help="fraction of each batch drawn from the image families only (a reading phase)")
    p.add_argument("--drill", type=float, default=0.0,
                   help="fraction of each batch drawn as drills (training only): reading drills for the demo model "
                        "(tasks.make_drill), arithmetic drills for arith (arith/tasks.make_drill)")
    p.add_argument("--vision-steps", type=int, default=0,
                   help="stage-0 steps of the vision tower alone, then a refit projector and a frozen tower "
                        "(fresh models only, not with --init-from; 0: none)")
    p.add_argument("--align-steps", type=int, default=0,
                   help="after the vision stage, fit the projector to word-embedding sums (align_projector_to_words)")
    p.add_argument("--train-vision", action="store_true",
                   help="keep training the tower during SFT (default: frozen after its stage 0, also in "
                        "later phases started with --init-from from such a run)")
    p.add_argument("--freeze-projector", action="store_true",
                   help="keep the projector as initialised or aligned (--align-steps) during SFT: image tokens stay "
                        "at the word embeddings' scale instead of growing hundreds of times larger")
    p.add_argument("--window-cut", type=float, default=0.0,
                   help="probability of training a sample on a window cut after its answer (Seer-robustness)")
    p.add_argument("--number-ranges", choices=sorted(NUMBER_RANGES), default="shipped",
                   help="arith only: the numbers the training problems draw (arith/tasks.py RANGES, or WIDE_RANGES "
                        "for a first phase)")
    p.add_argument("--no-end-marker", dest="end_marker", action="store_false",
                   help="arith only: train on the stories before the last-day marker (arith/tasks.py "
                        "make_problem; the shipped model's first two phases)")
    p.add_argument("--semi-ar", type=float, default=0.0,
                   help="fraction of samples masked as semi-autoregressive block decoding leaves a window "
                        "(clean blocks, the current block at rate t, later blocks all masked; training_loss)")
    p.add_argument("--number-values", action="store_true",
                   help="fresh models: number tokens' embeddings start with value features (init_number_values)")
    p.add_argument("--save-dtype", choices=["float16", "float32"], default="float16")
    p.add_argument("--no-bf16", dest="bf16", action="store_false",
                   help="train in plain fp32 (default on CPU: bf16 autocast, fp32 master weights)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    from tqdm import tqdm

    from model_adapters.loading import build_model, save_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    steps = args.steps if args.steps is not None else max(1, round(args.minutes * STEPS_PER_REFERENCE_MINUTE))
    eval_every = args.eval_every or max(1, steps // 6)
    stop_at = steps if args.stop_at is None else args.stop_at
    if not 1 <= stop_at <= steps:
        raise ValueError(f"--stop-at must be in [1, --steps={steps}], got {args.stop_at}")
    if args.vision_steps > 0 and args.init_from is not None:
        raise ValueError("--vision-steps starts a fresh model: it cannot be combined with --init-from "
                         "(a later phase inherits the frozen tower from the first phase's train_log.json)")
    if args.align_steps > 0 and args.vision_steps == 0:
        raise ValueError("--align-steps needs --vision-steps (the alignment follows the vision stage)")
    wl = WORKLOADS[args.workload]()
    if wl.name != "arith" and args.number_ranges != "shipped":
        raise ValueError(f"--number-ranges is an option of the arith workload, not of {wl.name}")
    if wl.name != "arith" and not args.end_marker:
        raise ValueError(f"--no-end-marker is an option of the arith workload, not of {wl.name}")
    if not wl.multimodal:
        used = [f"--{k.replace('_', '-')}" for k in ("vision_steps", "align_steps", "image_focus")
                if getattr(args, k)] + [f"--{k.replace('_', '-')}" for k in ("freeze_projector", "train_vision")
                                        if getattr(args, k)]
        if used:
            raise ValueError(f"{', '.join(used)} need the vision path; the {wl.name} workload is text only")
    window = wl.window

    tok = EmbeddedTokenizer(build_tokenizer(wl.words()))
    cfg = wl.model_config(tok, args)
    if args.init_from is not None:
        from model_adapters.loading import load_model

        model = load_model(args.init_from, dtype=torch.float32, device=device)
        cfg = dict(model.config)
        cfg.pop("torch_dtype", None)
        model.config = cfg
    else:
        model = build_model(cfg, device=device)
        init_weights(model, args.layers, torch.Generator().manual_seed(args.seed))
        if args.number_values:
            init_number_values(model, tok)
    vision_stage = None
    if args.vision_steps > 0:
        vision_stage = run_vision_stage(model, tok, vision_steps=args.vision_steps, align_steps=args.align_steps,
                                        seed=args.seed)
        print(f"vision stage ({args.vision_steps} steps): held-out cell accuracy {vision_stage}", flush=True)
    previous_log = None
    if args.init_from is not None and (Path(args.init_from) / "train_log.json").is_file():
        with open(Path(args.init_from) / "train_log.json") as f:
            previous_log = json.load(f)
    # a later phase of a run that had the vision stage keeps its frozen tower and fp32 image path
    vision_staged = args.vision_steps > 0 or bool(
        previous_log and previous_log.get("vision_staged", previous_log.get("vision_stage") is not None))
    frozen = vision_staged and not args.train_vision
    if wl.multimodal:
        for p in model.model.vision_tower.parameters():
            p.requires_grad_(not frozen)
        for p in model.model.mm_projector.parameters():
            p.requires_grad_(not args.freeze_projector)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())

    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in trained if p.dim() >= 2 and "wte" not in n]
    no_decay = [p for n, p in trained if p.dim() < 2 or "wte" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    warmup = args.warmup if args.warmup is not None else max(1, min(300, steps // 20))
    stream = wl.stream(args)
    mask_gen = torch.Generator().manual_seed(args.seed + 1)
    heldout = wl.heldout(max(args.eval_requests, args.final_eval_requests))
    gen = wl.generation() if wl.generation is not None else None
    semi_ar_block = (gen.block_length if gen is not None else None) or window  # the blocks it decodes in
    probe = heldout[: args.eval_requests]

    log = {"command": " ".join([sys.executable.split("/")[-1], "-m", "model_adapters.embedded.train",
                                *(argv if argv is not None else sys.argv[1:])]),
           "seed": args.seed, "minutes": args.minutes, "steps": steps, "stopped_at": stop_at,
           "init_from": None if args.init_from is None else str(args.init_from),
           "args": {k: str(v) for k, v in vars(args).items()},
           "workload": wl.name, "parameters": n_params, "window": window, "vision_stage": vision_stage,
           "vision_staged": vision_staged, "vision_tower_frozen": frozen,
           "projector_frozen": args.freeze_projector,
           "machine": f"{platform.machine()} {platform.processor()} {torch.get_num_threads()} threads, "
                      f"device {device}", "torch": torch.__version__,
           "loss_curve": [], "eval_curve": []}
    if previous_log is not None:
        log["previous_phase"] = previous_log
    print(f"embedded {wl.name} model: {n_params:,} parameters, {steps} steps of batch {args.batch_size}, "
          f"window {window}, device {device}", flush=True)
    start = time.perf_counter()
    running, running_n = 0.0, 0
    bar = tqdm(range(stop_at), desc="train", dynamic_ncols=True, mininterval=2.0)
    for step in bar:
        lr = lr_at(step, steps, args.lr, warmup, args.lr * 0.03)
        for group in opt.param_groups:
            group["lr"] = lr
        reqs = stream.next_batch(args.batch_size)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16 and device.type == "cpu"):
            loss = training_loss(model, tok, reqs, mask_gen, window=window, eps=1e-3,
                                 prefix_lm_fraction=args.prefix_lm_fraction, window_cut=args.window_cut,
                                 semi_ar=args.semi_ar, block=semi_ar_block,
                                 vision_fp32=vision_staged)
        sft_step(model, opt, loss)
        running += loss.item()
        running_n += 1
        if (step + 1) % 25 == 0 or step + 1 == stop_at:
            log["loss_curve"].append({"step": step + 1, "loss": running / running_n, "lr": lr,
                                      "elapsed_s": round(time.perf_counter() - start, 1)})
            bar.set_postfix(loss=f"{running / running_n:.4f}", lr=f"{lr:.2e}")
            running, running_n = 0.0, 0
        if (step + 1) % eval_every == 0 and step + 1 < stop_at:
            m = evaluate_step0(model, tok, probe, window=window)
            dec = evaluate_decoding(model, tok, probe[: args.eval_decode], window=window, gen=gen, score=wl.score)
            m.update(step=step + 1, elapsed_s=round(time.perf_counter() - start, 1),
                     exact_match_96=dec["exact_match"], decoded=args.eval_decode)
            log["eval_curve"].append(m)
            if args.checkpoint_dir is not None:
                save_model(model, Path(args.checkpoint_dir) / f"step{step + 1}")
                build_tokenizer(wl.words()).save(str(Path(args.checkpoint_dir) / f"step{step + 1}" / "tokenizer.json"))
            bar.write(f"step {step + 1}: held-out step-0 length acc {m['step0_length_acc']:.3f}, "
                      f"token acc {m['step0_token_acc']:.3f}, window exact {m['step0_window_exact']:.3f}, "
                      f"decoded exact match ({args.eval_decode}) {m['exact_match_96']}")
    train_s = time.perf_counter() - start
    log["train_seconds"] = round(train_s, 1)

    model.eval()
    out_dir = Path(args.out) if args.out is not None else wl.out_dir
    save_dtype = torch.float16 if args.save_dtype == "float16" else torch.float32
    stored = {k: v.detach().cpu().to(save_dtype) for k, v in model.state_dict().items()}
    shipped = build_model(cfg, device="cpu", dtype=save_dtype)
    shipped.load_state_dict(stored)
    # evaluate what is shipped: the stored weights, upcast to fp32 as load_embedded does
    final_model = build_model(cfg, device=device)
    final_model.load_state_dict({k: v.float() for k, v in stored.items()})
    final = evaluate_step0(final_model, tok, heldout[: args.final_eval_requests], window=window, per_kind=True)
    dec = evaluate_decoding(final_model, tok, heldout[: args.final_eval_requests], window=window, per_kind=True,
                            gen=gen, score=wl.score)
    log["heldout"] = {"seed": wl.heldout_seed, **final, "decoding": dec, "weights": args.save_dtype}
    print(json.dumps({k: v for k, v in final.items() if k != "per_kind"}, indent=1))
    print(f"held-out exact match (baseline decoder): {dec['exact_match']:.4f}")

    out_dir.mkdir(parents=True, exist_ok=True)
    save_model(shipped, out_dir)
    build_tokenizer(wl.words()).save(str(out_dir / "tokenizer.json"))
    write_tokenizer_config(out_dir, cfg["max_sequence_length"])  # the chat template seer generate renders
    if gen is not None:  # the decoding defaults ship beside the weights, as a checkpoint's (`seer generate`)
        from dataclasses import asdict, fields

        from seer_runtime import GenerationConfig
        from seer_runtime.cli.options import GENERATION_FILE

        default = GenerationConfig()
        changed = {f.name: v for f, v in zip(fields(gen), asdict(gen).values())
                   if f.name in ("gen_length", "steps", "block_length") or v != getattr(default, f.name)}
        (out_dir / GENERATION_FILE).write_text(json.dumps(changed, indent=1, sort_keys=True) + "\n")
    with open(out_dir / "train_log.json", "w") as f:
        json.dump(log, f, indent=1)
    print(f"wrote {out_dir} ({train_s / 60:.1f} min of training)")
    return log


if __name__ == "__main__":
    main()
