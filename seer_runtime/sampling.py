"""Token choice and remasking for one denoising step, per model family.

LLaDA family (LLaDA generate.py, MMaDA ``mmu_generate``, LaViDa-LLaDA): Gumbel-max in float64,
confidence by low_confidence / random / margin / entropy, top-k per row inside the current
block. Dream family (``diffusion_generate``, LaViDa-Dream): temperature / top-p / top-k
sampling, algorithms origin / maskgit_plus / topk_margin / entropy, optional ``alg_temp``.

The functions work on the response window only (``[R, W, V]`` logits of the rows being
decoded). ``RandomSource`` supplies uniform draws either from torch's global generator in the
reference's order (reference-equal under a seed) or from one generator per request
(batch-invariant).
"""

from __future__ import annotations

import torch
import torch.distributions as dists
import torch.nn.functional as F

NEG_INF = float("-inf")


class RandomSource:
    """Uniform draws for one step. ``rows`` are the global request indices of the decoded rows.

    mode "global": one draw over the reference's full shape from torch's global generator, sliced
    to the window (``full_shape`` and ``window`` give the reference layout).
    mode "per_request": each row draws from its own generator (created once, seeded seed + index,
    on the run's device, so that no draw crosses between host and device).
    """

    def __init__(self, mode: str, generators: list[torch.Generator] | None = None):
        self.mode = mode
        self.generators = generators

    def uniform(self, rows: list[int], shape_per_row: tuple[int, ...], *, dtype=torch.float32,
                device=None, full_len: int | None = None, offset: int = 0) -> torch.Tensor:
        """Uniform [0, 1) draws ``[len(rows), *shape_per_row]``.

        Global mode draws ``[len(rows), full_len, *shape_per_row[1:]]`` (the reference's tensor
        covers prompt + window) and keeps positions ``offset : offset + shape_per_row[0]``.
        """
        if self.mode == "global":
            if full_len is None:
                return torch.rand((len(rows), *shape_per_row), dtype=dtype, device=device)
            full = torch.rand((len(rows), full_len, *shape_per_row[1:]), dtype=dtype, device=device)
            return full[:, offset: offset + shape_per_row[0]]
        return torch.stack([
            torch.rand(shape_per_row, dtype=dtype, generator=self.generators[r], device=self.generators[r].device)
            for r in rows
        ]).to(device)

    def categorical(self, probs: torch.Tensor, item_counts: list[int], row_ids: list[int]) -> torch.Tensor:
        """One categorical sample per item ``probs [N, V]``; the items are the rows' in order,
        ``item_counts[local]`` of them for row ``row_ids[local]``."""
        if self.mode == "global":
            return dists.Categorical(probs=probs).sample()
        out = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
        start = 0
        for n, r in zip(item_counts, row_ids):
            if n:
                draw = torch.multinomial(probs[start: start + n].float(), 1, generator=self.generators[r]).flatten()
                out[start: start + n] = draw
            start += n
        return out

    def multinomial(self, weights: torch.Tensor, k: int, row: int) -> torch.Tensor:
        if self.mode == "global":
            return torch.multinomial(weights, num_samples=k)
        return torch.multinomial(weights, num_samples=k, generator=self.generators[row])


def pad_front(conf: torch.Tensor, pad: int) -> torch.Tensor:
    """``conf [..., W]`` with ``pad`` entries of -inf in front of its last dimension: the reference's
    vectors cover the prompt too, and ``torch.topk``'s ties depend on where an entry lies in them."""
    return torch.cat([conf.new_full((*conf.shape[:-1], pad), NEG_INF), conf], dim=-1) if pad else conf


def select_topk(conf: torch.Tensor, k: int, *, tie_break: str, pad: int = 0) -> torch.Tensor:
    """Indices of the ``k`` largest of ``conf [W]``.

    tie_break "reference": ``torch.topk`` on the reference's vector, which has ``pad`` entries of
    -inf (the prompt) in front; "stable": the leftmost among equals.
    """
    if k <= 0:
        return torch.empty(0, dtype=torch.long, device=conf.device)
    if tie_break == "stable":
        return torch.sort(conf, descending=True, stable=True).indices[:k]
    return torch.topk(pad_front(conf, pad), k).indices - pad


def threshold_picks(conf: torch.Tensor, threshold: float, *, tie_break: str, pad: int = 0,
                    candidates: list[int] | None = None) -> torch.Tensor:
    """Fast-dLLM's parallel commit rule: bool ``[R, W]``, every position whose confidence reaches
    ``threshold`` and, in each row with a candidate, its most confident one (so every step commits
    at least one token). ``conf [R, W]`` is -inf where a position is no candidate (not masked, or
    outside the current block). The most confident position among equals: the leftmost with
    ``tie_break="stable"``; with "reference", ``torch.topk`` over the reference's own vector
    (``pad`` -inf entries in front, ``candidates[r]`` positions asked for, as Fast-dLLM's
    ``get_transfer_index`` asks for every masked position of the block)."""
    picks = conf >= threshold
    if tie_break == "stable":
        first = conf.argmax(dim=1, keepdim=True)  # the leftmost maximum
        has_candidate = (conf.amax(dim=1, keepdim=True) > NEG_INF) | picks.gather(1, first)
        return picks.scatter(1, first, has_candidate)
    if candidates is None or len(candidates) != conf.shape[0]:
        raise ValueError("candidates: one count of candidate positions per row is needed with tie_break='reference'")
    for r, k in enumerate(candidates):
        if k > 0:  # on the device: no host read of the index, no copy of the value
            picks[r].scatter_(0, select_topk(conf[r], int(k), tie_break="reference", pad=pad)[:1], True)
    return picks


# ------------------------------------------------------------------------------ LLaDA family
def llada_confidence(logits: torch.Tensor, x0: torch.Tensor, remasking: str, *, softmax_fp64: bool,
                     rand: RandomSource, rows: list[int], pad: int, full_len: int | None) -> torch.Tensor:
    """The confidence ``[R, W]`` a remasking strategy ranks the chosen tokens ``x0`` by: their
    probability (low_confidence; float64 softmax for LaViDa), a uniform draw (random), the negative
    entropy or the top-2 margin of the distribution (float64)."""
    if remasking == "low_confidence":
        p = F.softmax(logits.to(torch.float64) if softmax_fp64 else logits, dim=-1)
        return torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)
    if remasking == "random":
        return rand.uniform(rows, tuple(x0.shape[1:]), device=x0.device, full_len=full_len, offset=pad)
    if remasking not in ("entropy", "margin"):
        raise ValueError(f"remasking {remasking!r} is not an LLaDA-family strategy")
    p = F.softmax(logits.to(torch.float64), dim=-1)
    if remasking == "entropy":
        return (p * torch.log(p + 1e-10)).sum(-1)
    top2 = torch.topk(p, 2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def add_gumbel_noise(logits: torch.Tensor, temperature: float, uniform: torch.Tensor) -> torch.Tensor:
    """LLaDA's Gumbel-max in float64: exp(logits) / (-log u)^T (argmax == argmax of logits + T*Gumbel)."""
    logits = logits.to(torch.float64)
    return logits.exp() / (-torch.log(uniform)) ** temperature


def llada_step(logits: torch.Tensor, window: torch.Tensor, masked: torch.Tensor, block_end: torch.Tensor,
               counts: list[int] | None, *, gen, token_ids, rows: list[int], softmax_fp64: bool, pad: int,
               rand: RandomSource, full_len: int | None, candidates: list[int] | None = None,
               block_start: torch.Tensor | None = None) -> torch.Tensor:
    """Commit ``counts[r]`` tokens in each row, or with ``threshold`` (``counts`` None) every
    position of the block whose confidence reaches it and at least the most confident one
    (:func:`threshold_picks`; ``candidates[r]``: masked positions left in row r's block); returns
    the updated window ``[R, W]``.

    logits [R, W, V] (after guidance); window [R, W] current tokens; masked [R, W] bool (masked
    and inside the row's window); block_end [R]: positions >= block_end are outside the current
    block. ``gen``: the ``GenerationConfig`` (temperature, remasking, the EOS knobs, tie-break,
    threshold); ``token_ids``: the model's. ``pad``/``full_len`` describe the reference's layout
    (prompt positions in front).
    block_start [R] (threshold only): positions before it are no candidates either (none is
    masked unless an earlier block ended with the model's own mask token committed there, which
    then stays, rather than being decoded again inside a later block).
    """
    logits = logits.clone()
    if gen.logits_eos_inf:
        logits[..., token_ids.eos] = NEG_INF
    if gen.temperature > 0:
        uniform = rand.uniform(rows, tuple(logits.shape[1:]), dtype=torch.float64, device=logits.device,
                               full_len=full_len, offset=pad)
        noisy = add_gumbel_noise(logits, gen.temperature, uniform)
    else:
        noisy = logits
    x0 = noisy.argmax(dim=-1)
    if gen.confidence_eos_eot_inf:
        # As the reference writes it: EOS into the noisy logits (the same tensor as the clean
        # ones at temperature 0), end-of-turn into the clean logits.
        noisy[..., token_ids.eos] = NEG_INF
        logits[..., token_ids.eot] = NEG_INF
    conf = llada_confidence(logits, x0, gen.remasking, softmax_fp64=softmax_fp64, rand=rand, rows=rows, pad=pad,
                            full_len=full_len)
    positions = torch.arange(window.shape[1], device=window.device)
    outside = positions[None, :] >= block_end[:, None]
    if block_start is not None:
        outside |= positions[None, :] < block_start[:, None]
    conf = conf.masked_fill(outside, NEG_INF)
    conf = torch.where(masked, conf, torch.full_like(conf, NEG_INF))
    x0 = torch.where(masked, x0, window)
    if gen.threshold is not None:
        picks = threshold_picks(conf, gen.threshold, tie_break=gen.tie_break, pad=pad, candidates=candidates)
        return torch.where(picks, x0, window)
    out = window.clone()
    for r, k in enumerate(counts):
        idx = select_topk(conf[r], int(k), tie_break=gen.tie_break, pad=pad)
        out[r, idx] = x0[r, idx]
    return out


# ------------------------------------------------------------------------------ Dream family
def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, sorted_idx = torch.sort(logits, descending=True)
    cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    remove = cum > top_p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_idx, remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def _top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    top_k = min(top_k, logits.size(-1))
    kth = torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def dream_sample_tokens(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float | None,
    top_k: int | None,
    confidence: str,
    rand: RandomSource,
    item_counts: list[int],
    row_ids: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream's ``sample_tokens`` on ``logits [N, V]`` -> (confidence [N], tokens [N]); the items
    are the rows' in order, ``item_counts[i]`` of them for row ``row_ids[i]``.

    confidence: "prob" (maskgit_plus / origin), "margin" (topk_margin) or "neg_entropy".
    """
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = _top_p(logits, top_p)
    if top_k is not None:
        logits = _top_k(logits, top_k)
    probs = torch.softmax(logits, dim=-1)
    if temperature > 0 and probs.shape[0]:
        try:
            x0 = rand.categorical(probs, item_counts, row_ids)
            conf = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
        except (RuntimeError, ValueError):  # Dream's own fallback on an invalid distribution
            conf, x0 = probs.max(dim=-1)
    else:
        conf, x0 = probs.max(dim=-1)
    if confidence == "margin":
        top2 = torch.sort(probs, dim=-1, descending=True).values
        conf = top2[:, 0] - top2[:, 1]
    elif confidence == "neg_entropy":
        conf = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return conf, x0
