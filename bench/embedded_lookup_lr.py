"""Does the embedded model's backbone learn to find a named cell? A learning-rate sweep.

A fresh demo-size model (the trainer's vision stage: tower pretrained on the cells, projector
aligned to the cells' words and frozen) is trained on the lookup families only
(:func:`model_adapters.embedded.tasks.make_lookup_request`: "what colour is the shape in the top
left ?", "what is in the ...", "is there a red circle ?") with LLaDA's SFT loss on a short
response window, and every ``--eval-every`` steps prints the step-0 exact match per family on
400 fresh lookups (window argmax == answer, end of turn, EOS padding).

This is the experiment that found why four sessions of recipes never learnt the lookups: at the
recipe's old peak learning rate (3e-3) they stay at their priors for 2500 steps, at 3e-4 they
form within 750 (bench/RESULTS.md, "Fifth attempt"). A script, not a test: about 10 minutes
per 1000 steps and learning rate on one CPU thread. Run:

    python bench/embedded_lookup_lr.py --lr 3e-3 3e-4 --steps 1000 --threads 2
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from model_adapters.embedded import EmbeddedTokenizer, build_tokenizer
from model_adapters.embedded.tasks import make_lookup_request
from model_adapters.embedded.train import (
    evaluate_step0,
    init_weights,
    model_config,
    run_vision_stage,
    sft_step,
    training_loss,
)
from model_adapters.loading import build_model


def lookup_accuracy(model, tok, probe, window: int) -> dict[str, float]:
    """Step-0 exact match of the whole window, per family, on ``probe``."""
    per_kind = evaluate_step0(model, tok, probe, window=window, per_kind=True)["per_kind"]
    return {k: round(v["window_exact"], 3) for k, v in per_kind.items()}


def run(lr: float, *, steps: int, window: int, eval_every: int, seed: int, batch_size: int) -> list[dict]:
    tok = EmbeddedTokenizer(build_tokenizer())
    torch.manual_seed(seed)
    model = build_model(model_config(tok), device="cpu")
    init_weights(model, int(model.config["n_layers"]), torch.Generator().manual_seed(seed))
    run_vision_stage(model, tok, vision_steps=300, align_steps=300, seed=seed)
    for p in model.model.mm_projector.parameters():
        p.requires_grad_(False)
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in trained if p.dim() >= 2], "weight_decay": 0.05},
                             {"params": [p for p in trained if p.dim() < 2], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98))
    probe_rng = np.random.default_rng([seed, 99])
    probe = [make_lookup_request(probe_rng) for _ in range(400)]
    rng, gen = np.random.default_rng([seed, 100]), torch.Generator().manual_seed(seed + 1)
    model.train()
    curve, running, start = [], 0.0, time.perf_counter()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 100)
        reqs = [make_lookup_request(rng) for _ in range(batch_size)]
        loss = training_loss(model, tok, reqs, gen, window=window, eps=1e-3, prefix_lm_fraction=0.5,
                             vision_fp32=True)
        sft_step(model, opt, loss)
        running += loss.item()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            n = (step % eval_every) + 1
            row = {"lr": lr, "step": step + 1, "loss": round(running / n, 4),
                   "elapsed_s": round(time.perf_counter() - start), **lookup_accuracy(model, tok, probe, window)}
            print(row, flush=True)
            curve.append(row)
            running = 0.0
    return curve


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lr", type=float, nargs="+", default=[3e-3, 3e-4])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--window", type=int, default=4, help="response window (answers here are 1-2 words)")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.window < 3:
        raise SystemExit(f"--window must be >= 3 (two answer words and the end of turn), got {args.window}")
    torch.set_num_threads(args.threads)
    rows = [run(lr, steps=args.steps, window=args.window, eval_every=args.eval_every, seed=args.seed,
                batch_size=args.batch_size)[-1] for lr in args.lr]
    families = [k for k in rows[0] if k not in ("lr", "step", "loss", "elapsed_s")]
    print(f"\n| lr | steps | loss | {' | '.join(families)} |\n|" + "---|" * (len(families) + 3))
    for r in rows:
        print(f"| {r['lr']:g} | {r['step']} | {r['loss']:.4f} | " + " | ".join(f"{r[k]:.3f}" for k in families) + " |")


if __name__ == "__main__":
    main()
