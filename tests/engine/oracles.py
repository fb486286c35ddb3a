"""Independent restatements of the reference generators, used as test oracles.

Each is a direct, unbatched-in-spirit transcription of the algorithm described in
``reference/MODELS.md`` (§1.8 LLaDA generate.py, §2.6 Dream ``_sample``, §4.6 LaViDa), written
against a ``logits_fn(x) -> [B, L, V]`` so that it does not share code with the engine. The
engine was also checked token for token against the upstream files themselves (bench/RESULTS.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def llada_reference(logits_fn, prompt, *, mask_id, gen_length, steps, block_length, temperature=0.0,
                    cfg_scale=0.0, remasking="low_confidence", eos_id=None, eot_id=None,
                    logits_eos_inf=False, confidence_eos_eot_inf=False, softmax_fp64=False,
                    skip_empty_blocks=False):
    b, lp = prompt.shape
    x = torch.full((b, lp + gen_length), mask_id, dtype=torch.long)
    x[:, :lp] = prompt
    prompt_index = x != mask_id
    blocks = gen_length // block_length
    spb = steps // blocks
    for blk in range(blocks):
        lo, hi = lp + blk * block_length, lp + (blk + 1) * block_length
        n = (x[:, lo:hi] == mask_id).sum(1)
        plan = n[:, None] // spb + (torch.arange(spb)[None, :] < (n % spb)[:, None]).long()
        for i in range(spb):
            mask_index = x == mask_id
            if skip_empty_blocks and not bool(mask_index[:, lo:hi].any()):
                continue
            if cfg_scale > 0:
                un = x.clone()
                un[prompt_index] = mask_id
                both = logits_fn(torch.cat([x, un]))
                cond, unc = both.chunk(2)
                logits = unc + (cfg_scale + 1) * (cond - unc)
            else:
                logits = logits_fn(x)
            if logits_eos_inf:
                logits[:, :, eos_id] = -torch.inf
            if temperature > 0:
                lg = logits.to(torch.float64)
                u = torch.rand_like(lg, dtype=torch.float64)
                noisy = lg.exp() / (-torch.log(u)) ** temperature
            else:
                noisy = logits
            x0 = noisy.argmax(-1)
            if confidence_eos_eot_inf:
                noisy[:, :, eos_id] = -torch.inf
                logits[:, :, eot_id] = -torch.inf
            if remasking == "low_confidence":
                p = F.softmax(logits.to(torch.float64) if softmax_fp64 else logits, dim=-1)
                conf = p.gather(-1, x0[..., None])[..., 0]
            elif remasking == "random":
                conf = torch.rand(x0.shape)
            elif remasking == "margin":
                p = F.softmax(logits.to(torch.float64), dim=-1).sort(-1, descending=True).values
                conf = p[..., 0] - p[..., 1]
            else:  # entropy
                p = F.softmax(logits.to(torch.float64), dim=-1)
                conf = (p * torch.log(p + 1e-10)).sum(-1)
            conf[:, hi:] = -torch.inf
            x0 = torch.where(mask_index, x0, x)
            conf = torch.where(mask_index, conf, torch.tensor(-torch.inf, dtype=conf.dtype))
            for r in range(b):
                _, sel = torch.topk(conf[r], k=int(plan[r, i]))
                x[r, sel] = x0[r, sel]
    return x


def dream_reference(logits_fn, prompt, *, mask_id, gen_length, steps, eps=1e-3, alg="maskgit_plus",
                    alg_temp=None, temperature=0.0, top_p=None, top_k=None):
    x = F.pad(prompt, (0, gen_length), value=mask_id)
    ts = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == mask_id
        raw = logits_fn(x)
        logits = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)
        ml = logits[mask_index]
        t, s = ts[i], ts[i + 1]
        lg = ml / temperature if temperature > 0 else ml
        if top_p is not None and top_p < 1:
            srt, order = torch.sort(lg, descending=True)
            drop = torch.cumsum(F.softmax(srt, -1), -1) > top_p
            drop[..., 1:] = drop[..., :-1].clone()
            drop[..., 0] = False
            lg = lg.masked_fill(torch.zeros_like(lg, dtype=torch.bool).scatter_(-1, order, drop),
                                torch.finfo(lg.dtype).min)
        if top_k is not None:
            lg = lg.masked_fill(lg < torch.topk(lg, top_k)[0][..., -1:], torch.finfo(lg.dtype).min)
        probs = torch.softmax(lg, -1)
        if alg == "origin":
            p_transfer = 1 - s / t if i < steps - 1 else 1
            x0 = torch.full((ml.shape[0],), mask_id, dtype=torch.long)
            sel = torch.rand(ml.shape[0]) < p_transfer
            if sel.any():
                sub = probs[sel]
                x0[sel] = (torch.distributions.Categorical(probs=sub).sample() if temperature > 0
                           else sub.max(-1).indices)
            x[mask_index] = x0
            continue
        if temperature > 0:
            x0 = torch.distributions.Categorical(probs=probs).sample()
            conf = probs.gather(-1, x0[:, None])[:, 0]
        else:
            conf, x0 = probs.max(-1)
        if alg == "topk_margin":
            top = probs.sort(-1, descending=True).values
            conf = top[:, 0] - top[:, 1]
        elif alg == "entropy":
            conf = (probs * torch.log(probs + 1e-10)).sum(-1)
        n_mask = mask_index.sum() / mask_index.shape[0]
        k = int(n_mask * (1 - s / t)) if i < steps - 1 else int(n_mask)
        full = torch.full_like(x, -torch.inf, dtype=logits.dtype)
        full[mask_index] = conf
        if k > 0:
            if alg_temp:
                pick = torch.multinomial(F.softmax(full / alg_temp, -1), num_samples=k)
            else:
                pick = torch.topk(full, k).indices
            cand = torch.full_like(x, mask_id)
            cand[mask_index] = x0
            rows = torch.arange(x.shape[0])[:, None].expand_as(pick)
            x[rows, pick] = cand[rows, pick]
    return x


def _commit_fast_dllm(conf, x0, x, mask_index, threshold, counts):
    """Fast-dLLM's ``get_transfer_index`` after the confidences: top-k of each row's candidates,
    then (with a threshold, k = every candidate) the ones below it dropped but the first."""
    conf = torch.where(mask_index, conf, torch.tensor(-torch.inf, dtype=conf.dtype))
    x0 = torch.where(mask_index, x0, x)
    for r in range(x.shape[0]):
        k = int(mask_index[r].sum()) if threshold is not None else int(counts[r])
        if k == 0:
            continue
        values, sel = torch.topk(conf[r], k=k)
        keep = torch.ones(k, dtype=torch.bool)
        if threshold is not None:
            keep[1:] = values[1:] >= threshold
        x[r, sel[keep]] = x0[r, sel[keep]]


def fast_dllm_reference(model, prompt, *, mask_id, gen_length, steps, block_length, threshold=None, cache=None):
    """Fast-dLLM's ``generate`` / ``generate_with_prefix_cache`` / ``generate_with_dual_cache``
    (NVlabs/Fast-dLLM llada/generate.py), greedy, low-confidence remasking, one request at a time
    (``prompt [1, Lp]``), restated with the model's pieces: a block's first forward runs the whole
    sequence (and keeps every layer's rotated keys/values); with ``cache`` its later forwards
    feed ``x[:, block_start:]`` ("prefix") or the block ("dual") against the kept keys/values of
    the other positions. A block ends when it holds no mask; unlike Fast-dLLM's cached loops, no
    forward runs once the block is full (that forward would commit nothing). Returns
    ``(x, forwards)``."""
    from seer_runtime.adapter import PaddedLayout, PrefixKV, Taps

    lp = prompt.shape[1]
    x = torch.full((1, lp + gen_length), mask_id, dtype=torch.long)
    x[:, :lp] = prompt
    positions = torch.arange(lp + gen_length)[None]

    def run(fed_lo, fed_hi, kept=None, keep=False):
        hidden = model.embed(x[:, fed_lo:fed_hi])
        layout = PaddedLayout(positions[:, fed_lo:fed_hi], None)
        rope = model.rope(layout.positions)
        prefix = None
        if kept is not None:
            kv_kept, index = kept
            prefix = PrefixKV([k[:, index].transpose(1, 2) for k, _ in kv_kept],
                              [v[:, index].transpose(1, 2) for _, v in kv_kept], None, len(index))
        kv = []
        for i in range(model.num_layers):
            taps = Taps(keep_kv=keep)
            hidden = model.layer(i, hidden, layout, rope=rope, prefix=prefix, taps=taps if keep else None)
            if keep:
                kv.append(taps.kv)
        return model.head(hidden), kv

    blocks = gen_length // block_length
    spb = steps // blocks
    forwards = 0
    for blk in range(blocks):
        lo, hi = lp + blk * block_length, lp + (blk + 1) * block_length
        n = int((x[:, lo:hi] == mask_id).sum())
        plan = [n // spb + (i < n % spb) for i in range(spb)]
        kv = None
        i = 0
        # a block ends when it holds no mask, after its planned steps (the fixed rule: Fast-dLLM
        # would run out of its schedule where the model chose its own mask token), or with a
        # threshold after a forward that changed no token (Fast-dLLM would loop forever there)
        stalled = False
        while bool((x[:, lo:hi] == mask_id).any()) and (i < spb if threshold is None else not stalled):
            before = x.clone()
            if cache is None or kv is None:
                logits, kv_new = run(0, lp + gen_length, keep=cache is not None)
                kv = kv_new if cache is not None else None
                fed_lo = 0
            else:
                fed_lo, fed_hi = (lo, lp + gen_length) if cache == "prefix" else (lo, hi)
                kept = [p for p in range(lp + gen_length) if not fed_lo <= p < fed_hi]
                logits, _ = run(fed_lo, fed_hi, kept=(kv, torch.tensor(kept)))
            forwards += 1
            full = torch.zeros(1, lp + gen_length, logits.shape[-1])
            full[:, fed_lo: fed_lo + logits.shape[1]] = logits
            mask_index = x == mask_id
            mask_index[:, hi:] = False
            if threshold is not None:  # a stalled block's masks stay (only there can one be left)
                mask_index[:, :lo] = False
            x0 = full.argmax(-1)
            conf = F.softmax(full.to(torch.float64), dim=-1).gather(-1, x0[..., None])[..., 0]
            _commit_fast_dllm(conf, x0, x, mask_index, threshold, [plan[i]] if i < len(plan) else [0])
            stalled = torch.equal(before, x)
            i += 1
    return x, forwards


def dream_threshold_reference(logits_fn, prompt, *, mask_id, gen_length, threshold):
    """Threshold decoding of the Dream family over one block, the whole window: every masked
    position whose probability (the argmax's) reaches ``threshold``, and at least the most
    probable one, until no mask is left or a forward changed no token. Returns ``(x, forwards)``."""
    x = F.pad(prompt, (0, gen_length), value=mask_id)
    forwards = 0
    stalled = False  # a forward that changed no token ends it (as the engine does; Fast-dLLM loops)
    while bool((x == mask_id).any()) and not stalled:
        before = x.clone()
        raw = logits_fn(x)
        forwards += 1
        logits = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)
        mask_index = x == mask_id
        conf, x0 = torch.softmax(logits, -1).max(-1)
        _commit_fast_dllm(conf, x0, x, mask_index, threshold, None)
        stalled = torch.equal(before, x)
    return x, forwards
