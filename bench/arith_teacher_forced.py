"""What an ``arith`` model has learnt, number by number: teacher-forced accuracy of each number kind.

For held-out requests, the reference solution is given up to one of its numbers and masked from
there to the end of the window (as a left-to-right decoder meets it); the model's argmax at that
position is scored. Number kinds, by the word before them:

* ``k``: the second operand of a step (after plus / minus / times / + / - / x / adding / taking /
  of): read from the story (binding);
* ``x``: the first operand (before plus / minus / + / -): the previous result or the start,
  copied from the answer so far;
* ``y``: a result (after is / equals / = / gives / leaves / make): the arithmetic itself;
* ``final``: the number after ``answer``: a copy of the last result.

This is the diagnostic that showed, during the first training runs, that the story's structure
was learnt long before the sums (bench/RESULTS.md, "The arith workload"). One forward per
number, without the prompt cache (prompt and window attend to each other). Run:

    python -m bench.arith_teacher_forced --model DIR --requests 24
"""

from __future__ import annotations

import argparse
import json

import torch

from model_adapters.embedded.arith import RESPONSE_WINDOW, serving
from seer_runtime.adapter import PaddedLayout

RESULT_BEFORE = {"is", "equals", "=", "gives", "leaves", "make"}
OPERAND_BEFORE = {"plus", "minus", "times", "+", "-", "x", "of", "adding", "taking"}
FIRST_BEFORE = {"plus", "minus", "+", "-"}


def number_kinds(words: list[str]) -> list[tuple[str, int]]:
    """``(kind, index)`` of every number of a solution (module docstring); others are skipped."""
    out = []
    for i, w in enumerate(words):
        if not w.isdigit():
            continue
        before = words[i - 1] if i else ""
        after = words[i + 1] if i + 1 < len(words) else ""
        if before in RESULT_BEFORE:
            out.append(("y", i))
        elif before in OPERAND_BEFORE:
            out.append(("k", i))
        elif before == "answer":
            out.append(("final", i))
        elif after in FIRST_BEFORE:
            out.append(("x", i))
    return out


@torch.no_grad()
def teacher_forced(model, tok, tasks, prompts) -> dict:
    hits: dict[str, list[int]] = {}
    for t, prompt_ids in zip(tasks, prompts):
        target = tok.response_window(t.answer, RESPONSE_WINDOW)
        probes = number_kinds(t.answer.split())
        if not probes:
            continue
        prompt = torch.tensor([prompt_ids])
        lp = prompt.shape[1]
        rows = torch.tensor([target] * len(probes))
        for r, (_, i) in enumerate(probes):
            rows[r, i:] = tok.mask_id
        n = len(probes)
        embeds = torch.cat([model.embed(prompt).expand(n, lp, -1), model.embed(rows)], 1)
        layout = PaddedLayout(torch.arange(lp + RESPONSE_WINDOW).expand(n, -1),
                              key_mask=torch.ones(n, lp + RESPONSE_WINDOW, dtype=torch.bool))
        pred = model.forward_embeds(embeds, layout)[:, lp:].argmax(-1)
        for r, (kind, i) in enumerate(probes):
            hits.setdefault(kind, []).append(int(pred[r, i] == target[i]))
    return {k: {"n": len(v), "accuracy": round(sum(v) / len(v), 4)} for k, v in sorted(hits.items())}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a directory the trainer wrote (default: the shipped model)")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = serving.load_embedded(path=args.model) if args.model else serving.load_embedded()
    requests, tasks = serving.demo_requests(args.requests, tok)
    out = teacher_forced(model, tok, tasks, [r.prompt_ids for r in requests])
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
