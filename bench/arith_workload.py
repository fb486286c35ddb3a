"""Held-out evaluation of the ``arith`` workload: accuracy, answer lengths, and its parallelism.

The embedded word-problem model (``model_adapters/embedded/arith``) on held-out requests, with
its shipped decoding (128-position window, blocks of 32, one token per step, prompt cached):

* **accuracy** of the baseline decoder: final answer (GSM8K's score), every arithmetic step
  right, whole solution equal to the sampled reference (a lower bound: any wording is valid);
* **answer lengths** of the decoded answers and of the references: mean, spread, min, max;
* **parallelism**: (a) while decoding greedily one token per step, the number of masked
  positions of the current block whose max-softmax confidence passes ``--threshold`` at each
  forward (:class:`ConfidenceCounter`, a policy on the engine's ``on_logits`` hook), averaged
  over forwards, also split into blocks that hold answer content and blocks after the answer;
  (b) Fast-dLLM's threshold rule run for real (``GenerationConfig(threshold=...)``, the engine's
  confidence-threshold decoding, token-identical to Fast-dLLM's generate in bench/RESULTS.md):
  window positions committed per forward, forwards per batch, and that decoder's final-answer
  accuracy beside the baseline's on the same requests.

Seer's step-0 length signal per probe (boundary MAE, over-truncation before the guard) comes
from ``seer demo --workload arith --json`` (its ``probes`` figures), not from here. Run:

    python -m bench.arith_workload --requests 200 --parallel-requests 64 --threads 2 --json out/arith_eval.json
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from model_adapters.embedded.arith import serving
from model_adapters.embedded.arith.tasks import check_solution
from seer_runtime.evaluate import run_requests
from seer_runtime.policy import Policy


class ConfidenceCounter(Policy):
    """At every forward, per request still decoding: how many masked positions of its current
    block (the block of its first masked position) have max-softmax confidence >= threshold.

    ``counts``: one ``(count, block_index)`` per request and forward. Reads the engine's public
    state only (``state.tokens``, ``state.token_ids``); changes nothing.
    """

    name = "confidence_counter"
    replayable = False  # it reads every forward's logits

    def __init__(self, threshold: float, block: int) -> None:
        self.threshold, self.block = threshold, block
        self.counts: list[tuple[int, int]] = []

    def on_logits(self, state, fwd, logits: torch.Tensor) -> None:
        width = logits.shape[1]
        tokens = state.tokens[fwd.rows, :width]
        masked = tokens == state.token_ids.mask
        conf = torch.softmax(logits.float(), dim=-1).amax(-1)
        for r in range(len(fwd.rows)):
            where = masked[r].nonzero()
            if not where.numel():
                continue
            start = int(where[0, 0]) // self.block * self.block
            sure = (conf[r, start: start + self.block] >= self.threshold) & masked[r, start: start + self.block]
            self.counts.append((int(sure.sum()), start // self.block))
        return logits


def length_figures(lengths: list[int]) -> dict:
    n = len(lengths)
    mean = sum(lengths) / n
    return {"mean": mean, "std": math.sqrt(sum((x - mean) ** 2 for x in lengths) / n), "min": min(lengths),
            "max": max(lengths)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=200, help="held-out requests for accuracy and lengths")
    p.add_argument("--parallel-requests", type=int, default=64, help="of those, decoded for the parallelism figures")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default=None, help="a directory the trainer wrote (default: the shipped model)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, tok = serving.load_embedded(path=args.model) if args.model else serving.load_embedded()
    gen = serving.demo_generation_config()
    block = gen.block_length
    requests, tasks = serving.demo_requests(args.requests, tok)

    # accuracy and lengths: the baseline on every request; the counter on the first ones
    counter = ConfidenceCounter(args.threshold, block)
    npar = min(args.parallel_requests, args.requests)
    base = run_requests(model, requests[:npar], gen, batch_size=args.batch_size, policies=[counter])
    if args.requests > npar:
        base.extend(run_requests(model, requests[npar:], gen, batch_size=args.batch_size))
    checks = [check_solution(tok.decode(a)) for a in base.answers]
    final_ok = [c.final == t.value for c, t in zip(checks, tasks)]
    per_steps: dict[str, list[int]] = {}
    for t, ok in zip(tasks, final_ok):
        per_steps.setdefault(t.kind, []).append(int(ok))
    out = {
        "requests": args.requests, "window": gen.gen_length, "block_length": block,
        "final_answer_accuracy": sum(final_ok) / len(final_ok),
        "steps_right": sum(c.steps_right for c in checks) / len(checks),
        "wrong_steps": sum(len(c.wrong_steps) for c in checks),
        "no_final_answer": sum(c.final is None for c in checks),
        "same_as_reference": sum(a == r.truth_ids for a, r in zip(base.answers, requests)) / len(requests),
        "per_steps": {k: round(sum(v) / len(v), 4) for k, v in sorted(per_steps.items())},
        "answer_length": length_figures([len(a) for a in base.answers]),
        "reference_length": length_figures([len(r.truth_ids) for r in requests]),
        "baseline_tok_per_s": base.tok_per_s,
    }

    # (a) confident positions per forward while decoding one token per step
    ends = base.end_positions[:npar]
    counts = [c for c, _ in counter.counts]
    out["confident_per_forward"] = {"threshold": args.threshold, "forwards": len(counts),
                                    "mean": sum(counts) / len(counts)}
    # the counter's records come batch by batch, each forward one record per live request
    content, after = [], []
    k = 0
    for s in range(0, npar, args.batch_size):
        rows = list(range(s, min(s + args.batch_size, npar)))
        for _ in range(gen.steps):
            for r in rows:
                c, blk = counter.counts[k]
                k += 1
                end = ends[r] if ends[r] >= 0 else gen.gen_length
                (content if blk * block < end else after).append(c)
    if k != len(counter.counts):
        raise AssertionError(f"{len(counter.counts)} counter records, {k} expected (one per request and step)")
    out["confident_per_forward"].update(
        content_blocks=sum(content) / max(1, len(content)), content_forwards=len(content),
        after_answer_blocks=sum(after) / max(1, len(after)), after_answer_forwards=len(after))

    # (b) the threshold rule run for real: the engine's confidence-threshold decoding
    fast = run_requests(model, requests[:npar], gen.replace(threshold=args.threshold, steps=None),
                        batch_size=args.batch_size)
    thr_ok = [check_solution(tok.decode(a)).final == t.value for a, t in zip(fast.answers, tasks)]
    nfe = sum(fast.nfe) / len(fast.nfe)
    out["threshold_decoding"] = {
        "threshold": args.threshold, "requests": npar, "forwards_per_batch": nfe,
        "baseline_forwards_per_batch": sum(base.nfe[: len(fast.nfe)]) / len(fast.nfe),
        "window_positions_per_forward": gen.gen_length / nfe,
        "answer_tokens_per_forward": sum(len(a) for a in fast.answers) / len(fast.answers) / nfe,
        "final_answer_accuracy": sum(thr_ok) / len(thr_ok),
        "baseline_final_answer_accuracy_same_requests": sum(final_ok[:npar]) / npar,
        "tok_per_s": fast.tok_per_s}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
