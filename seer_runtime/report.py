"""What one ``generate`` call did, for a person (:func:`summary`) and for a program (:func:`stats_dict`).

The work figure is :attr:`GenerationStats.positions_computed <seer_runtime.batch.GenerationStats>`:
positions a layer computed, summed over layers and forwards (positions x layers), padding included,
the rows DyLLM's sparse layers reuse not counted; ``positions_computed_dense`` beside it is the
same forwards computed dense. Every place that shows the work (``seer generate``, ``seer run``,
the harnesses' speed lines, the demo) shows this figure under this name.

:func:`summary` gives a few aligned lines: the answer tokens, time and tokens per second, the
forwards, the work, then one line per method that ran saying what it saved (Seer's cut: window
positions kept of the window; DyLLM: rows reused, its share of the dense work; the router: the
path of each group and its padding; a block cache: forwards over the whole sequence against those
over the current block), and the time per phase. :func:`stats_dict` is everything, JSON-safe
(DyLLM's per-forward records included): what ``seer generate --stats json`` prints.
"""

from __future__ import annotations

import dataclasses
import math

import torch

#: the phases of ``GenerationStats.time_s`` in the order a call runs them
PHASES = ("embed", "prefill", "forward", "sample")


def jsonable(value):
    """``value`` with tensors as lists, tuples as lists, dict keys as strings and non-finite floats
    as None (JSON has no NaN), recursively; anything else must already be a JSON scalar."""
    if isinstance(value, torch.Tensor):
        return jsonable(value.tolist())
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"statistics hold a {type(value).__name__} that JSON cannot write: {value!r}")


def stats_dict(stats) -> dict:
    """Every field of a ``GenerationStats`` (the policies' reports in ``extra``, DyLLM's records
    per forward included), JSON-safe (:func:`jsonable`)."""
    return jsonable(dataclasses.asdict(stats))


def _count(n: int) -> str:
    return f"{n:,}"


def _share(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole else "-"


def work_line(stats) -> str:
    """``positions_computed`` with its unit, and, where it differs, the dense figure and what
    DyLLM's reused rows saved of it."""
    computed, dense = stats.positions_computed, stats.positions_computed_dense
    text = f"{_count(computed)} positions computed (positions x layers)"
    if dense != computed:
        saved = dense - computed
        text += f", {_count(dense)} dense: {_count(saved)} reused by DyLLM ({_share(saved, dense)})"
    return text


def seer_line(report: dict, width: int | None) -> str:
    """Seer's cut: window positions kept of the window (per request for one, in all for a batch),
    where the end was found, and the guard's and the ``both`` probe's events."""
    kept, final = report.get("keep_len", []), report.get("final_window", [])
    boundary = report.get("boundary", [])
    n = len(kept)
    if n == 1:
        end = ("no end found, nothing cut" if not boundary or boundary[0] is None
               else f"end found at position {boundary[0]}")
        of = f" of {width}" if width else ""
        text = f"kept {kept[0]}{of} window positions after step 0 ({end})"
    else:
        of = f" of {_count(n * width)}" if width else ""
        found = sum(b is not None for b in boundary)
        text = f"kept {_count(sum(kept))}{of} window positions over {n} requests (an end found in {found})"
    if final and final != kept:
        text += f"; decoded {_count(sum(final))} after the guard"
    events = [(sum(report.get(key, [])), what) for key, what in
              (("guard_events", "guard re-opened a window the answer ran into"),
               ("premature_cuts", "cut found premature and re-extended"), ("tightened", "cut tightened"))]
    text += "".join(f"; {what} x{count}" for count, what in events if count)
    return text


def dyllm_line(report: dict) -> str:
    """DyLLM: its forwards by kind and the share of rows its sparse layers recomputed."""
    forwards = report.get("forwards", {})
    sparse = forwards.get("prompt", 0) + forwards.get("response", 0)
    text = f"{forwards.get('full', 0)} dense forwards, {sparse} sparse"
    fraction = report.get("salient_fraction")
    if fraction is not None:
        text += f": FFN on {100.0 * fraction:.0f}% of the rows fed"
    ratio = report.get("ideal_flop_ratio")
    if ratio is not None:
        text += f", {100.0 * ratio:.0f}% of the dense multiply-adds"
    return text + f" (tau {report.get('tau')})"


def router_line(report: dict) -> str:
    """The router: the path of each group (static / varlen / eager) and the padding it computed."""
    parts, useful, computed = [], 0, 0
    for path, figures in report.items():
        parts.append(f"{path.lower()} {figures['groups']} group{'s' if figures['groups'] != 1 else ''}")
        useful += figures["useful_tokens"]
        computed += figures["computed_tokens"]
    return f"{', '.join(parts)}; padding {_count(computed - useful)} of {_count(computed)} positions"


def block_cache_line(report: dict) -> str:
    """A block cache: forwards over the whole sequence (filling the cache) against forwards over
    the current block only, and the positions each fed (per layer)."""
    forwards, fed = report.get("forwards", {}), report.get("fed_positions", {})
    return (f"{report.get('mode')}: {_plural(forwards.get('full', 0), 'forward')} over the sequence "
            f"({_count(fed.get('full', 0))} positions), {forwards.get('cached', 0)} over the block alone "
            f"({_count(fed.get('cached', 0))})")


def graphs_line(report: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in report.items() if isinstance(v, (int, float)))


def time_line(stats) -> str:
    times = stats.time_s
    phases = [p for p in PHASES if p in times] + [p for p in times if p not in PHASES and p != "total"]
    return "  ".join(f"{p} {times[p]:.3f} s" for p in phases)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary_rows(out, *, gen=None, answer_tokens: int | None = None) -> list[tuple[str, str]]:
    """(label, text) rows of :func:`summary`. gen: the call's ``GenerationConfig`` (its window is
    what Seer's cut is out of; its threshold gets a line); answer_tokens: the answers' length in
    all (default: counted from ``out``)."""
    stats = out.stats
    window = gen.gen_length if gen is not None else out.responses.shape[1]
    if answer_tokens is None:
        answer_tokens = sum(len(out.answer_ids(i)) for i in range(out.responses.shape[0]))
    total = stats.time_s.get("total", 0.0)
    speed = f" ({answer_tokens / total:.1f} tokens/s)" if total > 0 else ""
    requests = out.responses.shape[0]
    of = f" for {requests} requests" if requests > 1 else ""
    rows = [("answer", f"{answer_tokens} tokens{of} in {total:.2f} s{speed}")]
    steps = stats.steps
    step_text = (_plural(steps[0], "denoising step") if len(set(steps)) == 1 else
                 f"{min(steps)}-{max(steps)} denoising steps per request") if steps else "no steps"
    saved = sum(stats.steps_saved)
    if saved:  # early stop: the steps the ended requests did not run
        step_text += f", {_plural(saved, 'step')} saved by early stop"
    rows.append(("forwards", f"{stats.nfe} (NFE; {step_text})"))
    if gen is not None and gen.threshold is not None:
        rows.append(("threshold", f"{gen.threshold} (every position at or above it committed): "
                                  f"{_plural(max(steps, default=0), 'step')} for a window of {window}"))
    rows.append(("work", work_line(stats)))
    extra = stats.extra
    if "seer" in extra:
        rows.append(("seer", seer_line(extra["seer"], window)))
    if "dyllm" in extra:
        rows.append(("dyllm", dyllm_line(extra["dyllm"])))
    if "router" in extra:
        rows.append(("router", router_line(extra["router"])))
    if "block_cache" in extra:
        rows.append(("block cache", block_cache_line(extra["block_cache"])))
    if "graphs" in extra:
        rows.append(("graphs", graphs_line(extra["graphs"])))
    if len(extra.get("micro_batches", [])) > 1:
        rows.append(("micro-batches", " + ".join(str(n) for n in extra["micro_batches"]) + " requests"))
    if stats.time_s:
        rows.append(("time", time_line(stats)))
    return rows


def format_rows(rows: list[tuple[str, str]], *, indent: str = "") -> str:
    """``label  text`` lines, the texts aligned."""
    width = max((len(label) for label, _ in rows), default=0)
    return "\n".join(f"{indent}{label:<{width}}  {text}" for label, text in rows)


def summary(out, *, gen=None, answer_tokens: int | None = None) -> str:
    """A few aligned lines saying what ``generate`` did (module docstring), for a person;
    ``out``: a ``GenerationOutput``; see :func:`summary_rows` for the keywords."""
    return format_rows(summary_rows(out, gen=gen, answer_tokens=answer_tokens))
