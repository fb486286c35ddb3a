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
