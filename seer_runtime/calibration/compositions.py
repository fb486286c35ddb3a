"""Compositions that pay: decode what a user can combine side by side, and recommend the fastest
at equal accuracy.

What combines (``seer demo`` and ``seer calibrate`` search it): Fast-dLLM's confidence-threshold
parallel decoding at a few thresholds (``GenerationConfig.threshold``), its block caches
(``block_cache="prefix"|"dual"``), Seer (its calibrated probe) and DyLLM (its calibrated config;
DyLLM keeps caches of its own and does not compose with a block cache). A
:class:`Composition` is one of them, named by its parts joined with ``+`` in a fixed order
(:func:`composition_name`): ``seer``, ``threshold:0.9``, ``prefix`` or ``dual``, ``dyllm`` - e.g.
``seer+threshold:0.9+dual``.

How they are measured (:func:`decode_side_by_side`, :func:`time_side_by_side`): every batch is
decoded by every configuration in turn, so all see the same load on a shared machine; the first
pass gives the answers (decoding is deterministic: later passes only time); then the
configurations in contention are decoded again, ``repeats`` more passes, each batch's order
rotated from pass to pass. A configuration's wall time is the median over its passes, and the
spread of its passes ((max - min) / median) says how far to trust it (:data:`NOISY_SPREAD`). In
contention: the configurations that keep the baseline's accuracy with a first pass at most
:data:`CONTENTION` times the fastest of theirs (a slower one is not timed again: it cannot win).

The recommendation (:func:`recommend`): among the baseline and the configurations that keep its
accuracy (``calibration.accuracy``'s rule: at most one point below it, no significant loss by
McNemar's exact test), the one with the smallest median wall time.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..config import GenerationConfig
from ..dyllm import DyLLMConfig
from ..evaluate import Request, RunResult, run_requests
from ..seer import SeerConfig
from .accuracy import MAX_DROP, paired_figures, right_answers

#: a configuration whose timed passes spread more than this ((max - min) / median) is noisy
NOISY_SPREAD = 0.15
#: a configuration is timed again when its first pass took at most this many times the fastest
#: first pass among those that keep the accuracy (a slower one cannot win on a few repeats)
CONTENTION = 2.0
#: the block caches the search tries (None: no block cache)
BLOCK_CACHES = (None, "prefix", "dual")


def composition_name(*, seer: str | None = None, threshold: float | None = None, block_cache: str | None = None,
                     dyllm: bool = False) -> str:
    """``seer[:probe]``, ``threshold:T``, ``prefix``/``dual`` and ``dyllm``, those present, joined by ``+``
    (``"baseline"`` when none is)."""
    parts = ([seer] if seer else []) + ([f"threshold:{threshold:g}"] if threshold is not None else []) \
        + ([block_cache] if block_cache else []) + (["dyllm"] if dyllm else [])
    return "+".join(parts) or "baseline"


@dataclass(frozen=True)
class Composition:
    """One way to decode: ``gen`` (with or without a threshold and a block cache) and the policies
    ``generate`` takes (``seer``, ``dyllm``; None: not used)."""

    name: str
    gen: GenerationConfig
    seer: SeerConfig | None = None
    dyllm: DyLLMConfig | None = None

    @property
    def kwargs(self) -> dict:
        """``generate``'s policy arguments."""
        return {k: v for k, v in (("seer", self.seer), ("dyllm", self.dyllm)) if v is not None}

    def describe(self, baseline: GenerationConfig) -> dict:
        """The JSON form: ``generation`` (the fields that differ from the baseline's decoding),
        ``seer`` and ``dyllm`` (their fields, or None)."""
        base, mine = baseline.to_dict(), self.gen.to_dict()
        return {"name": self.name, "generation": {k: v for k, v in mine.items() if base.get(k) != v},
                "seer": self.seer.to_dict() if self.seer else None,
                "dyllm": self.dyllm.to_dict() if self.dyllm else None}

    def options(self, *, seer_file: str | None = None, dyllm_file: str | None = None) -> str:
        """The ``seer generate`` options that decode this way (``seer_file`` / ``dyllm_file``: where the
        policies' JSON lies; the placeholder ``SEER.json`` / ``DYLLM.json`` without them)."""
        out = []
        if self.gen.threshold is not None:
            out.append(f"--threshold {self.gen.threshold:g}")
        if self.gen.block_cache is not None:
            out.append(f"--block-cache {self.gen.block_cache}")
        if self.gen.early_stop:
            out.append("--early-stop")
        if self.seer is not None:
            out.append(f"--seer {seer_file or 'SEER.json'}")
        if self.dyllm is not None:
            out.append(f"--dyllm {dyllm_file or 'DYLLM.json'}")
        return " ".join(out)


def threshold_gen(gen: GenerationConfig, threshold: float | None, block_cache: str | None) -> GenerationConfig:
    """``gen`` with Fast-dLLM's threshold (the step count then follows the model) and block cache."""
    if threshold is None:
        return gen.replace(block_cache=block_cache)
    return gen.replace(threshold=threshold, steps=None, block_cache=block_cache)


def search_grid(gen: GenerationConfig, *, seer: SeerConfig | None, dyllm: DyLLMConfig | None,
                thresholds: Sequence[float], block_caches: Sequence[str | None] = BLOCK_CACHES,
                seer_label: str = "seer") -> list[Composition]:
    """Every composition of ``thresholds`` (and none), ``block_caches`` (with a threshold: Fast-dLLM's
    pairing; a block cache under the baseline's one-token steps is left out, it pays only with a
    threshold's few steps per block), Seer (``seer``, when given) and DyLLM (``dyllm``, when given;
    never with a block cache), the baseline left out; ordered by threshold, then cache, then Seer,
    then DyLLM. Each is validated here (a bad threshold is a ``ValueError`` before anything is
    decoded)."""
    out = []
    for t in (None, *thresholds):
        for cache in block_caches if t is not None else (None,):
            g = threshold_gen(gen, t, cache)
            for s in (None, seer) if seer is not None else (None,):
                for d in (None, dyllm) if (dyllm is not None and cache is None) else (None,):
                    if t is None and cache is None and s is None and d is None:
                        continue
                    name = composition_name(seer=seer_label if s is not None else None, threshold=t,
                                            block_cache=cache, dyllm=d is not None)
                    out.append(Composition(name, g, s, d))
    return out


def decode_side_by_side(model, requests: list[Request], plans: dict[str, Composition], *, batch_size: int,
                        progress: bool = True, on_batch=None, desc: str = "decoding") -> dict[str, RunResult]:
    """Decode ``requests`` with every plan, batch by batch: each batch by every plan in turn (so all
    see the same machine load), after one untimed warm-up decode of the first request by each plan.
    ``on_batch(n)``: called when a batch of ``n`` requests is done by all."""
    from tqdm.auto import tqdm

    results = {name: RunResult() for name in plans}
    for plan in plans.values():  # each code path's first call (allocations, first dispatches) is not timed
        run_requests(model, requests[:1], plan.gen, batch_size=1, **plan.kwargs)
    with tqdm(total=len(requests) * len(plans), desc=desc, unit="req", disable=not progress, file=sys.stderr) as bar:
        for start in range(0, len(requests), batch_size):
            batch = requests[start: start + batch_size]
            for name, plan in plans.items():
                results[name].extend(run_requests(model, batch, plan.gen, batch_size=batch_size, progress=bar,
                                                  **plan.kwargs))
            if on_batch is not None:
                on_batch(len(batch))
    return results


def time_side_by_side(model, requests: list[Request], plans: dict[str, Composition], *, batch_size: int,
                      repeats: int, progress: bool = True) -> dict[str, list[float]]:
    """``repeats`` more timed passes over ``requests`` of every plan, alternating: each batch is
    decoded by every plan in turn, the order rotated by one from batch to batch and from pass to
    pass (so that no plan always runs first or after the same one). Returns each plan's total wall
    seconds per pass."""
    from tqdm.auto import tqdm

    names = list(plans)
    walls = {name: [0.0] * repeats for name in names}
    batches = [requests[s: s + batch_size] for s in range(0, len(requests), batch_size)]
    with tqdm(total=len(requests) * len(names) * repeats, desc="timing", unit="req", disable=not progress,
              file=sys.stderr) as bar:
        for r in range(repeats):
            for b, batch in enumerate(batches):
                shift = (r + b) % len(names)
                for name in names[shift:] + names[:shift]:
                    plan = plans[name]
                    res = run_requests(model, batch, plan.gen, batch_size=batch_size, progress=bar, **plan.kwargs)
                    walls[name][r] += res.wall_s
    return walls


def spread(walls: Sequence[float]) -> float | None:
    """(max - min) / median of a plan's pass times; None with fewer than two passes."""
    if len(walls) < 2:
        return None
    mid = statistics.median(walls)
    return (max(walls) - min(walls)) / mid if mid > 0 else None


def recommend(figures: dict[str, dict]) -> str:
    """The name of the fastest configuration at equal accuracy: among ``"baseline"`` and the rows whose
    ``keeps_accuracy`` is true, the smallest ``wall_s_median`` (ties: the earlier row)."""
    if "baseline" not in figures:
        raise ValueError("figures must hold the baseline's row")
    eligible = [name for name, f in figures.items() if name == "baseline" or f.get("keeps_accuracy")]
    return min(eligible, key=lambda name: (figures[name]["wall_s_median"], list(figures).index(name)))


def run_figures(res: RunResult, base: RunResult | None, right: list[bool], base_right: list[bool], *,
                max_drop: float = MAX_DROP) -> dict:
    """One configuration's figures against the baseline decoded on the same requests.

    Every row: ``exact_match`` (share of ``right``), ``tok_per_s``, ``latency_s``, ``nfe`` (forwards
    per batch, mean), ``positions_computed`` (positions x layers), ``wall_s`` (the first pass).
    Besides the baseline's: the paired figures (``right_to_wrong``, ``wrong_to_right``, ``p_value``,
    ``within_noise``, ``verdict``, ``keeps_accuracy``: ``calibration.accuracy``),
    ``differs_from_baseline`` (answers not equal to the baseline's), ``speedup`` (tok/s over the
    baseline's, side by side in the same pass), ``ideal_speedup`` (the baseline's positions
    computed over this one's dense positions times DyLLM's multiply-accumulate fraction
    ``dyllm_flop_ratio`` where DyLLM runs) and ``ideal_forwards`` (the baseline's forwards over
    this one's)."""
    out = {
        "exact_match": sum(right) / len(right),
        "tok_per_s": res.tok_per_s,
        "latency_s": res.latency_s,
        "nfe": sum(res.nfe) / len(res.nfe),
        "positions_computed": res.positions_computed,
        "wall_s": res.wall_s,
    }
    if base is None:
        return out
    flop_ratio, work = 1.0, res.positions_computed
    if res.dyllm:  # DyLLM computes a fraction of each forward's multiply-accumulates
        dense = sum(d["dense_macs"] for d in res.dyllm)
        flop_ratio = sum(d["macs"] for d in res.dyllm) / dense if dense else 1.0
        out["dyllm_flop_ratio"] = flop_ratio
        work = res.positions_computed_dense * flop_ratio
    out.update(**paired_figures(base_right, right, max_drop=max_drop),
               differs_from_baseline=sum(a != b for a, b in zip(res.answers, base.answers)),
               speedup=res.tok_per_s / base.tok_per_s if base.tok_per_s else 0.0,
               ideal_speedup=base.positions_computed / max(1e-9, work),
               ideal_forwards=sum(base.nfe) / max(1, sum(res.nfe)))
    return out


def measure(model, requests: list[Request], gen: GenerationConfig, plans: dict[str, Composition], *,
            batch_size: int, score, repeats: int = 1, max_drop: float = MAX_DROP, also_time: Sequence[str] = (),
            progress: bool = True, on_batch=None) -> tuple[dict[str, RunResult], dict[str, dict], str]:
    """Decode ``requests`` with the baseline (``gen``) and every plan side by side
    (:func:`decode_side_by_side`), score them against the requests' references (a request without
    one: the baseline's answer), then time the configurations in contention - those that keep the
    baseline's accuracy with a first pass at most :data:`CONTENTION` times the fastest of them, and
    ``also_time`` - in ``repeats - 1`` more alternating passes (:func:`time_side_by_side`).

    score: ``(requests, answers) -> accuracy`` (per request: :func:`~.accuracy.right_answers`).
    Returns ``(results, figures, recommended)``: each configuration's first-pass
    :class:`RunResult`; its figures (:func:`run_figures`, plus ``wall_s_passes``,
    ``wall_s_median``, ``wall_spread`` and ``timing_noisy``: spread above :data:`NOISY_SPREAD`); and
    the name :func:`recommend` picks ("baseline" included)."""
    if "baseline" in plans:
        raise ValueError("'baseline' is the name of gen's own row: name the plans otherwise")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    unknown = sorted(set(also_time) - set(plans))
    if unknown:
        raise ValueError(f"also_time names no plan: {unknown}")
    every = {"baseline": Composition("baseline", gen), **plans}
    results = decode_side_by_side(model, requests, every, batch_size=batch_size, progress=progress,
                                  on_batch=on_batch)
    base = results["baseline"]
    requests = [r if r.truth_ids is not None else replace(r, truth_ids=list(a)) for r, a in zip(requests, base.answers)]
    base_right = right_answers(requests, base.answers, score)
    figures = {name: run_figures(res, None if name == "baseline" else base, right_answers(requests, res.answers, score),
                                 base_right, max_drop=max_drop)
               for name, res in results.items()}
    keeping = [name for name in plans if figures[name]["keeps_accuracy"]]
    fastest = min((figures[name]["wall_s"] for name in keeping), default=0.0)
    contention = {name: plan for name, plan in plans.items()
                  if (name in keeping and figures[name]["wall_s"] <= CONTENTION * fastest) or name in also_time}
    walls = time_side_by_side(model, requests, contention, batch_size=batch_size, repeats=repeats - 1,
                              progress=progress) if repeats > 1 and contention else {}
    for name, f in figures.items():
        passes = [f["wall_s"], *walls.get(name, [])]
        f.update(wall_s_passes=passes, wall_s_median=statistics.median(passes), wall_spread=spread(passes))
        f["timing_noisy"] = f["wall_spread"] is not None and f["wall_spread"] > NOISY_SPREAD
    return results, figures, recommend(figures)


def against(figures: dict[str, dict], name: str, other: str) -> dict:
    """``name`` against ``other`` (both rows of :func:`measure`'s figures): the measured ratio of their
    median wall times (``measured``: >1 when ``name`` is faster), the ideal ratios (positions
    computed, with DyLLM's fraction: ``ideal``; forwards: ``ideal_forwards``) and the passes each
    median is over."""
    a, b = figures[name], figures[other]
    ideal_a = b.get("ideal_speedup", 1.0)  # relative to the baseline: the ratio of ratios
    ideal_b = a.get("ideal_speedup", 1.0)
    return {"name": name, "other": other, "measured": b["wall_s_median"] / a["wall_s_median"],
            "ideal": ideal_b / ideal_a if ideal_a else None,
            "ideal_forwards": b["nfe"] / a["nfe"] if a["nfe"] else None,
            "passes": [len(a["wall_s_passes"]), len(b["wall_s_passes"])],
            "noisy": bool(a["timing_noisy"] or b["timing_noisy"])}
