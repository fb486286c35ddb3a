"""Where Seer changes answers that end inside its window, why, and what each choice costs
(issue 34 item 4), on the ``arith`` workload's held-out requests, teacher-free.

Every batch of held-out requests is decoded by the baseline (the workload's decoder: a 128-position
window in blocks of 32, one token per step, the prompt cached) and by each configuration named on
the command line, interleaved batch by batch (the order rotated each batch) so that all see the
same machine load. Then the answers are compared request by request with the baseline's. A
configuration is named by a small grammar:

* ``baseline``; ``threshold`` (Fast-dLLM's confidence-threshold decoding at ``--threshold``);
* ``seer`` (the shipped ``SeerConfig`` of the workload) followed by ``,field=value`` overrides of
  its fields (``seer,probe=sparsity``, ``seer,eos_threshold=0.95``, ``seer,slack=16``); a value is
  read as JSON when it parses (``0.95``, ``true``, ``null``), else as a string;
* ``+threshold`` after any Seer name composes it with threshold decoding
  (``seer,slack=8+threshold``).

Tables printed (the JSON holds every request's record, so ``--report FILE`` reprints them):

1. **choices**: final-answer accuracy, flips against the baseline (right->wrong, wrong->right) and
   McNemar's exact p (``seer_runtime.significance``), answers that differ from the baseline's,
   cuts that fell before the baseline's end token (over-truncated), answers with no end token in
   their final window (lost), guard events, forwards and positions computed (positions x layers,
   padding included: what the machine paid) per request, wall time, and the speed-up measured
   side by side beside the ideal one (the baseline's positions over the configuration's);
2. **by distance to the cut**: the requests binned by how many positions the cut kept after the
   baseline's end token (``keep - (end + 1)``; below 0: over-truncated; ``uncut``: no boundary
   found, the full window), with how many answers differ there and how their verdicts flip;
3. **first difference**: for each differing answer, where its first differing token lies: in a
   block before the block that holds the cut (the only change those positions saw is the masked
   suffix that is gone: the bidirectional context) or in the cut's block (whose schedule and
   commits changed too), and how far before the cut, and before the baseline's end;
4. **changed answers**: of the differing answers, how many are right in both, wrong in both,
   right->wrong and wrong->right.

With ``--trace`` the requests are decoded again, untimed, with a recorder of every commit
(:class:`CommitTrace`: the step, the position, the token, and from that step's logits the token's
probability, the runner-up token's, and the confidence of the most confident other masked position
of the block), and a fifth table says where each differing answer's decoding first parted from
the baseline's (the first step whose commit differs, a different position or a different token)
and how close the baseline's own choice was there against its choices everywhere (the margins).

Run (the issue's screen, then the 500; ``--out`` is rewritten after every batch, ``--resume``
continues a run from its file)::

    python -m bench.arith_seer_changes --requests 128 --out out/seer_changes_128.json \\
        seer seer,probe=sparsity seer,probe=both seer,slack=8 seer,eos_threshold=0.95
    python -m bench.arith_seer_changes --report out/seer_changes_128.json
    python -m bench.arith_seer_changes --trace --requests 64 --out out/seer_trace_64.json seer seer,slack=16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from model_adapters.embedded.arith import BLOCK_LENGTH, serving
from model_adapters.embedded.arith.tasks import score
from seer_runtime import GenerationConfig, generate
from seer_runtime.evaluate import pad_left
from seer_runtime.files import check_output_path, write_json
from seer_runtime.policy import Policy
from seer_runtime.seer import SeerConfig
from seer_runtime.significance import compare_answers

THRESHOLD_SUFFIX = "+threshold"
#: bins of ``keep - (baseline end + 1)`` (positions kept after the baseline's end token)
DISTANCE_BINS = ((None, -1, "< 0 (over-truncated)"), (0, 3, "0-3"), (4, 7, "4-7"), (8, 15, "8-15"),
                 (16, 31, "16-31"), (32, None, ">= 32"))


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_config(spec: str, *, shipped: SeerConfig, gen: GenerationConfig,
                 threshold: float) -> tuple[GenerationConfig, SeerConfig | None]:
    """``(GenerationConfig, SeerConfig or None)`` of a configuration name (module docstring);
    ``ValueError`` naming ``spec`` when it is not one."""
    fast = spec.endswith(THRESHOLD_SUFFIX)
    core = spec[: -len(THRESHOLD_SUFFIX)] if fast else spec
    gen_of = gen.replace(threshold=threshold, steps=None) if fast else gen
    if core == "baseline" and not fast:
        return gen, None
    if core == "threshold" and not fast:
        return gen.replace(threshold=threshold, steps=None), None
    head, *overrides = core.split(",")
    if head != "seer":
        raise ValueError(f"configuration {spec!r}: expected baseline, threshold or seer[,field=value...][+threshold]")
    changes = {}
    for item in overrides:
        field, sep, text = item.partition("=")
        if not sep or not field:
            raise ValueError(f"configuration {spec!r}: {item!r} is not field=value")
        changes[field] = _value(text)
    try:
        return gen_of, shipped.replace(**changes)
    except TypeError as exc:
        raise ValueError(f"configuration {spec!r}: {exc}") from None


class CommitTrace(Policy):
    """Every commit of a ``generate`` call, per request: ``[step, position, token, p_token, p_second,
    second_token, other_confidence]`` - the token's probability in that step's logits, the
    runner-up token's probability and id at that position, and the highest confidence (top
    probability) of the other positions of the block that were still masked (-1 when none).
    Positions re-masked by Seer's re-decoding are not commits. Reads every forward's logits and
    the tokens after every step (host copies): a measuring tool, never timed."""

    name = "commit_trace"
    replayable = False

    def start(self, state, model) -> None:
        self.before = state.tokens.clone()
        self.seen: dict[int, tuple] = {}
        self.commits: list[list[list]] = [[] for _ in range(state.batch_size)]

    def on_logits(self, state, fwd, logits: torch.Tensor) -> None:
        probs = torch.softmax(logits.float(), dim=-1)
        top = probs.topk(2, dim=-1)
        width = logits.shape[1]
        for local, b in enumerate(fwd.rows):
            plan = state.plans[b]
            lo, hi = plan.block_starts[fwd.step], min(plan.block_ends[fwd.step], width)
            masked = torch.zeros(width, dtype=torch.bool)
            masked[lo:hi] = state.tokens[b, lo:hi].cpu() == state.token_ids.mask
            self.seen[b] = (top.values[local].cpu(), top.indices[local].cpu(), masked)

    def after_step(self, state, step: int, values) -> list:
        now = state.tokens.cpu()
        changed = (now != self.before) & (now != state.token_ids.mask)
        for b, j in changed.nonzero().tolist():
            p, tok, masked = self.seen[b]
            others = masked.clone()
            others[j] = False
            other = float(p[others, 0].max()) if others.any() else -1.0
            token = int(now[b, j])
            p_token = float(p[j, 0]) if int(tok[j, 0]) == token else float("nan")
            self.commits[b].append([step, j, token, p_token, float(p[j, 1]), int(tok[j, 1]), other])
        self.before = now.clone()
        self.seen.clear()
        return []


def decode_batch(model, requests, gen: GenerationConfig, seer: SeerConfig | None, *, tokenizer, tasks,
                 trace: bool = False) -> dict:
    """One batch decoded by one configuration: its wall time, forwards, positions computed (the
    batch's, padding included) and one record per request (with ``trace``, its commits too:
    :class:`CommitTrace`)."""
    ids, mask = pad_left([r.prompt_ids for r in requests], model.token_ids.pad)
    recorder = CommitTrace() if trace else None
    t0 = time.perf_counter()
    out = generate(model, ids, attention_mask=mask, gen=gen, seer=seer, policies=[recorder] if trace else ())
    wall = time.perf_counter() - t0
    st = out.stats
    extra = st.extra.get("seer")
    records = []
    for i, task in enumerate(tasks):
        answer = out.answer_ids(i)
        rec = {"answer": answer, "end": int(out.end_positions[i]), "right": score(task, tokenizer.decode(answer)),
               "steps": st.steps[i], "positions": st.positions_computed_per_request[i]}
        if extra is not None:
            rec.update(keep=extra["keep_len"][i], boundary=extra["boundary"][i], final_window=extra["final_window"][i],
                       guard_events=extra["guard_events"][i])
        if trace:
            rec["commits"] = recorder.commits[i]
        records.append(rec)
    return {"wall_s": wall, "nfe": st.nfe, "positions_computed": st.positions_computed, "records": records}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where answers ``a`` and ``b`` (each followed by its end token) differ; None when equal."""
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


# -- the tables -----------------------------------------------------------------------------------
def _merge(run: dict, name: str) -> dict:
    batches = [b[name] for b in run["batches"]]
    return {"wall_s": sum(b["wall_s"] for b in batches), "nfe": sum(b["nfe"] for b in batches),
            "positions_computed": sum(b["positions_computed"] for b in batches),
            "records": [r for b in batches for r in b["records"]]}


def _table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def choices_table(run: dict) -> tuple[str, dict]:
    base = _merge(run, "baseline")
    n = len(base["records"])
    base_right = [r["right"] for r in base["records"]]
    figures, rows = {}, []
    for name in run["configs"]:
        m = _merge(run, name)
        recs = m["records"]
        cmp = compare_answers(base_right, [r["right"] for r in recs])
        differ = sum(r["answer"] != b["answer"] for r, b in zip(recs, base["records"]))
        window = run["window"]
        over = sum(1 for r, b in zip(recs, base["records"])
                   if "keep" in r and r["keep"] < min(window, (b["end"] if b["end"] >= 0 else window) + 1))
        lost = sum(1 for r in recs if not 0 <= r["end"] < r.get("final_window", window))
        f = {"accuracy": cmp.accuracy, "right_to_wrong": cmp.right_to_wrong, "wrong_to_right": cmp.wrong_to_right,
             "p_value": cmp.p_value, "differ": differ, "over_truncated": over, "lost": lost,
             "guard_events": sum(r.get("guard_events", 0) for r in recs),
             "forwards_per_request": sum(r["steps"] for r in recs) / n,
             "positions_per_request": m["positions_computed"] / n, "wall_s": m["wall_s"],
             "speedup": base["wall_s"] / m["wall_s"], "ideal": base["positions_computed"] / m["positions_computed"]}
        figures[name] = f
        rows.append([name, f"{f['accuracy']:.3f}", f"{f['right_to_wrong']} / {f['wrong_to_right']}",
                     f"{f['p_value']:.3g}", f["differ"], f["over_truncated"], f["lost"], f["guard_events"],
                     f"{f['forwards_per_request']:.1f}", f"{f['positions_per_request']:,.0f}", f"{f['wall_s']:.0f}",
                     f"x{f['speedup']:.2f}", f"x{f['ideal']:.2f}"])
    head = ["config", "accuracy", "r->w / w->r", "McNemar p", "!= base", "over-trunc", "lost", "guard",
            "forwards/req", "positions/req", "wall s", "speed-up", "ideal"]
    return _table(head, rows), figures


def _bin(distance: int | None) -> str:
    if distance is None:
        return "uncut"
    for lo, hi, label in DISTANCE_BINS:
        if (lo is None or distance >= lo) and (hi is None or distance <= hi):
            return label
    raise AssertionError(distance)


def distance_table(run: dict) -> str:
    base = _merge(run, "baseline")["records"]
    window = run["window"]
    labels = [label for _, _, label in DISTANCE_BINS] + ["uncut"]
    rows = []
    for name in run["configs"]:
        recs = _merge(run, name)["records"]
        if not recs or "keep" not in recs[0]:
            continue
        cells = {label: [0, 0, 0, 0] for label in labels}  # requests, differ, r->w, w->r
        for r, b in zip(recs, base):
            end = b["end"] if b["end"] >= 0 else window
            c = cells[_bin(None if r["keep"] >= window else r["keep"] - (end + 1))]
            c[0] += 1
            c[1] += r["answer"] != b["answer"]
            c[2] += b["right"] and not r["right"]
            c[3] += r["right"] and not b["right"]
        rows.append([name] + [f"{d}/{n} ({rw}/{wr})" if n else "" for n, d, rw, wr in (cells[x] for x in labels)])
    return _table(["config"] + labels, rows)


def first_difference_table(run: dict) -> str:
    base = _merge(run, "baseline")["records"]
    window = run["window"]
    head = ["config", "differ", "before the cut's block", "in the cut's block", "uncut", "median to cut",
            "median to base end", "median index", "in block 0"]
    rows = []
    for name in run["configs"]:
        recs = _merge(run, name)["records"]
        if not recs or "keep" not in recs[0]:
            continue
        before = inside = uncut = block0 = 0
        to_cut, to_end, index = [], [], []
        for r, b in zip(recs, base):
            i = first_difference(r["answer"], b["answer"])
            if i is None:
                continue
            index.append(i)
            block0 += i < BLOCK_LENGTH
            to_end.append((b["end"] if b["end"] >= 0 else window) - i)
            if r["keep"] >= window:
                uncut += 1
                continue
            to_cut.append(r["keep"] - 1 - i)
            if i // BLOCK_LENGTH < (r["keep"] - 1) // BLOCK_LENGTH:
                before += 1
            else:
                inside += 1
        rows.append([name, len(index), before, inside, uncut, _median(to_cut), _median(to_end), _median(index),
                     block0])
    return _table(head, rows)


def changed_table(run: dict) -> str:
    base = _merge(run, "baseline")["records"]
    rows = []
    for name in run["configs"]:
        recs = _merge(run, name)["records"]
        pairs = [(b["right"], r["right"]) for r, b in zip(recs, base) if r["answer"] != b["answer"]]
        rows.append([name, len(pairs), sum(x and y for x, y in pairs), sum(not x and not y for x, y in pairs),
                     sum(x and not y for x, y in pairs), sum(y and not x for x, y in pairs)])
    return _table(["config", "differ", "both right", "both wrong", "right->wrong", "wrong->right"], rows)


def _margin(commit: list) -> tuple[float, float]:
    """(position margin, token margin) of one baseline commit: its confidence over the most
    confident other masked position of its block, its token's probability over the runner-up's."""
    _, _, _, p_token, p_second, _, other = commit
    return (p_token - other if other >= 0 else float("nan")), p_token - p_second


def divergence_table(run: dict) -> str | None:
    """Where each differing answer's decoding first parted from the baseline's (module docstring);
    None when the run holds no traces."""
    base = _merge(run, "baseline")["records"]
    if not base or "commits" not in base[0]:
        return None
    all_pos, all_tok = [], []
    for b in base:  # the answer's commits (those after its end are near-certain padding: margins ~0 and ~1)
        end = b["end"] if b["end"] >= 0 else run["window"]
        for c in b["commits"]:
            if c[1] >= end:
                continue
            pm, tm = _margin(c)
            if pm == pm:
                all_pos.append(pm)
            all_tok.append(tm)
    rows = [["baseline (every answer commit)", "", "", "", f"{_median(all_pos):.3f}", f"{_median(all_tok):.3f}",
             f"{_share(all_pos, 0.05):.2f}", "", "", ""]]
    for name in run["configs"]:
        recs = _merge(run, name)["records"]
        if not recs or "commits" not in recs[0]:
            continue
        by_pos = by_tok = runner_up = before_cut = 0
        pos_m, tok_m, steps = [], [], []
        differ = 0
        for r, b in zip(recs, base):
            if r["answer"] == b["answer"]:
                continue
            differ += 1
            k = next((i for i, (x, y) in enumerate(zip(b["commits"], r["commits"])) if x[1:3] != y[1:3]), None)
            if k is None:
                continue
            mine, theirs = b["commits"][k], r["commits"][k]
            steps.append(mine[0])
            pm, tm = _margin(mine)
            if mine[1] != theirs[1]:
                by_pos += 1
                pos_m.append(pm)
            else:
                by_tok += 1
                tok_m.append(tm)
                runner_up += theirs[2] == mine[5]
            keep = r.get("keep", run["window"])
            before_cut += keep < run["window"] and min(mine[1], theirs[1]) // BLOCK_LENGTH < (keep - 1) // BLOCK_LENGTH
        rows.append([name, differ, f"{by_pos} / {by_tok}", runner_up,
                     f"{_median(pos_m):.3f}" if pos_m else "", f"{_median(tok_m):.3f}" if tok_m else "",
                     f"{_share(pos_m + tok_m, 0.05):.2f}" if pos_m or tok_m else "", before_cut,
                     _median(steps), differ - by_pos - by_tok])
    head = ["config", "differ", "parted by position / token", "its token = base runner-up",
            "median position margin", "median token margin", "share of margins < 0.05",
            "before the cut's block", "median step", "no parting commit"]
    return _table(head, rows)


MARGINS = (1, 2, 4, 8)


def margin_table(run: dict) -> str:
    """A guard that re-decodes on the full window every answer whose end token lies within ``m``
    positions of its cut (``final window - 1 - end < m``), simulated from the recorded decodes: such a
    request's answer becomes the baseline's (a re-decode on the full window is the baseline's
    decoding: the uncut rows of a cut batch equal the baseline's, table 2's ``uncut`` column) and
    costs the full window's forwards on top of those it ran. Not run: what the option would give."""
    base = _merge(run, "baseline")["records"]
    n = len(base)
    window = run["window"]
    rows = []
    for name in run["configs"]:
        recs = _merge(run, name)["records"]
        if not recs or "keep" not in recs[0] or name.endswith(THRESHOLD_SUFFIX):
            continue
        for m in MARGINS:
            # the final window (a guard's re-decode already holds the full one) and its end token
            hit = [r["final_window"] < window and 0 <= r["end"] and r["final_window"] - 1 - r["end"] < m
                   for r in recs]
            verdicts = [b["right"] if h else r["right"] for r, b, h in zip(recs, base, hit)]
            cmp = compare_answers([b["right"] for b in base], verdicts)
            over = sum(h and r["keep"] < (b["end"] if b["end"] >= 0 else window) + 1
                       for r, b, h in zip(recs, base, hit))
            fixed = sum(h and r["answer"] != b["answer"] for r, b, h in zip(recs, base, hit))
            added = sum(b["steps"] for b, h in zip(base, hit) if h) / n
            rows.append([f"{name}, margin {m}", sum(hit), over, fixed, f"{cmp.accuracy:.3f}",
                         f"{cmp.right_to_wrong} / {cmp.wrong_to_right}", f"{cmp.p_value:.3g}", f"+{added:.1f}"])
    head = ["config", "re-decoded", "of them over-truncated", "of them differing", "accuracy", "r->w / w->r",
            "McNemar p", "forwards/req added"]
    return _table(head, rows)


def _share(values: list[float], below: float) -> float:
    return sum(v < below for v in values) / len(values) if values else float("nan")


def _median(values: list[float]):
    if not values:
        return ""
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def report(run: dict) -> dict:
    done = sum(len(b["baseline"]["records"]) for b in run["batches"])
    print(f"{done} of {run['requests']} held-out arith requests, batch {run['batch_size']}, "
          f"{run['threads']} thread(s), threshold {run['threshold']}")
    text, figures = choices_table(run)
    print("\nChoices against the baseline:\n" + text)
    print("\nAnswers that differ, by positions kept after the baseline's end token "
          "(differ/requests (right->wrong/wrong->right)):\n" + distance_table(run))
    print("\nWhere the first differing token lies:\n" + first_difference_table(run))
    print("\nThe differing answers' verdicts:\n" + changed_table(run))
    print("\nA guard re-decoding answers that end within m positions of the cut, simulated (not run):\n"
          + margin_table(run))
    parted = divergence_table(run)
    if parted is not None:
        print("\nWhere the decoding first parted from the baseline's (the baseline's margins there, "
              "against its margins at every commit):\n" + parted)
    return figures


# -- the run ----------------------------------------------------------------------------------------
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("configs", nargs="*", help="configurations to decode beside the baseline (module docstring)")
    p.add_argument("--requests", type=int, default=128, help="held-out requests (the demo's split, in order)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threshold", type=float, default=0.9, help="the +threshold rows' confidence (Fast-dLLM's 0.9)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="JSON written after every batch (every request's record)")
    p.add_argument("--resume", action="store_true", help="continue the run stored in --out")
    p.add_argument("--report", default=None, help="print the tables of a stored run and exit")
    p.add_argument("--early-stop", action="store_true",
                   help="every configuration, the baseline too, ends a request at its end token (answers unchanged, "
                        "about half the forwards: what makes --requests 500 fit a session)")
    p.add_argument("--trace", action="store_true",
                   help="record every commit (CommitTrace; slower, the wall times are not comparable)")
    args = p.parse_args(argv)
    if args.report:
        return report(json.loads(Path(args.report).read_text()))
    if args.requests < 1 or args.batch_size < 1 or args.threads < 1:
        raise ValueError("--requests, --batch-size and --threads must be >= 1")
    GenerationConfig(threshold=args.threshold)  # checked before the model loads
    shipped = serving.default_seer_config()
    gen = serving.demo_generation_config().replace(early_stop=args.early_stop)
    names = [c for c in args.configs if c != "baseline"]
    if len(set(names)) != len(names):
        raise ValueError(f"a configuration is named twice: {names}")
    plans = {"baseline": (gen, None)}
    for name in names:
        plans[name] = parse_config(name, shipped=shipped, gen=gen, threshold=args.threshold)
    out = check_output_path(args.out, option="--out") if args.out else None
    settings = {"requests": args.requests, "batch_size": args.batch_size, "threshold": args.threshold,
                "configs": names, "window": gen.gen_length, "trace": args.trace, "early_stop": args.early_stop}
    run = {**settings, "threads": args.threads, "shipped_seer": shipped.to_dict(), "batches": []}
    if args.resume:
        if out is None or not out.is_file():
            raise ValueError("--resume needs --out naming the file of the run to continue")
        stored = json.loads(out.read_text())
        stored.setdefault("trace", False)  # a run stored before the options
        stored.setdefault("early_stop", False)
        differs = {k: (stored.get(k), v) for k, v in settings.items() if stored.get(k) != v}
        if differs:
            raise ValueError(f"--resume: {out} was run with other settings (stored, asked): {differs}")
        run = stored
    torch.set_num_threads(args.threads)
    model, tokenizer = serving.load_embedded()
    requests, tasks = serving.demo_requests(args.requests, tokenizer)
    for gen_of, seer in plans.values():  # one small warm-up decode each, untimed
        decode_batch(model, requests[:2], gen_of, seer, tokenizer=tokenizer, tasks=tasks[:2])
    order = list(plans)
    starts = list(range(0, len(requests), args.batch_size))
    t0 = time.perf_counter()
    for k, start in enumerate(starts):
        if k < len(run["batches"]):
            continue
        part = requests[start: start + args.batch_size]
        rotated = order[k % len(order):] + order[: k % len(order)]
        batch = {}
        for name in rotated:
            gen_of, seer = plans[name]
            batch[name] = decode_batch(model, part, gen_of, seer, tokenizer=tokenizer,
                                       tasks=tasks[start: start + len(part)], trace=args.trace)
        run["batches"].append(batch)
        if out is not None:
            write_json(out, run, indent=None)
        print(f"batch {k + 1}/{len(starts)} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return report(run)


if __name__ == "__main__":
    main()
