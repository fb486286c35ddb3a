"""Calibrate Seer for a checkpoint: which layer, which threshold, which SNR test.

The paper leaves the sparsity tensor and threshold unspecified; every checkpoint needs its own.
Calibration, on a set of requests with their baseline answers:

1. **Profile** step-0 MLP sparsity of every early layer for a grid of thresholds
   ``eps = factor x RMS(layer)`` (the RMS of the layer's MLP activation over the window,
   measured on the first batch), and the step-0 end-of-answer probability.
2. **Clarity** per (layer, eps): the jump of the sparsity at the true answer end (aligned over
   requests) over the position-to-position wobble - where the jump-to-plateau is clearest.
3. **Simulate** the boundary test on the stored profiles for a grid of (layers, eps, tau_jump,
   gamma, baseline window, earliest position, probe): predicted over-truncation and the
   tokens-computed speed-up under the engine's own step rule, and the paper's knee criterion
   ``U = accuracy ratio + lambda log(speed-up)`` (over-truncations counted as failures).
4. **Verify** the best few with real Seer runs on the same requests, together with the best
   candidate of the paper's sparsity-only probe and the best thresholds of the end-probability
   probe (``eos_prob``: nothing to simulate but its step-0 cut, its boundary needs the final
   logits), each reported with its paired flips against the baseline and McNemar's exact p.
5. **Choose** the best measured U among the candidates that keep the baseline's accuracy
   (``calibration.accuracy``: at most one point below it, no significant loss); the best U of all
   when none does (``keeps_accuracy: false`` in the record says so).
6. **Confirm** the choice on a disjoint held-out set (``confirm``): the baseline and the choice
   decoded there, the choice's accuracy, flips and p, and whether it holds (keeps the
   baseline's accuracy there too).

The choice is a :class:`SeerConfig` that ``generate(..., seer=...)`` takes; ``seer calibrate``
writes it as JSON with the measurements beside it.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

import seer_kernels

from ..adapter import Taps
from ..batch import BatchState
from ..config import GenerationConfig, check_int, check_real
from ..evaluate import Request, pad_left, run_requests
from ..files import atomic_write
from ..generation import first_forward
from ..plans import DecodingRules, dream_plan, llada_plan
from ..policy import LayerHook, Policy
from ..runner import Forward
from ..seer import SeerConfig, end_probability, first_reaching
from .accuracy import MAX_DROP, paired_figures, right_answers

EPS_FACTORS = (0.05, 0.1, 0.2, 0.3, 0.5)
TAU_GRID = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06)
GAMMA_GRID = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass
class Profiles:
    """sparsity [layers, eps, N, W]; eps [layers, eps] absolute thresholds; rms [layers];
    end_prob [N, W] step-0 P(EOS) + P(end-of-turn); layers: the profiled layer indices."""

    sparsity: torch.Tensor
    eps: torch.Tensor
    rms: torch.Tensor
    end_prob: torch.Tensor
    layers: list[int]
    factors: tuple[float, ...]


class Step0Recorder(Policy):
    """Records step 0's MLP activation of ``layer_indices`` (window positions) and its end probability."""

    name = "step0_recorder"
    replayable = False

    def __init__(self, layer_indices: list[int]) -> None:
        self.layer_indices = set(layer_indices)
        self.activations: list[torch.Tensor] = []
        self.end_prob: torch.Tensor | None = None

    def layers(self, state: BatchState, fwd: Forward) -> LayerHook:
        recorder = self

        class Record(LayerHook):
            def taps(self, layer: int, taps: Taps) -> None:
                if layer in recorder.layer_indices:
                    taps.keep_mlp_act = True

            def after(self, layer: int, fwd: Forward, taps: Taps) -> None:
                if layer in recorder.layer_indices:
                    recorder.activations.append(taps.mlp_act[: len(fwd.rows), fwd.offset: fwd.offset + state.width]
                                                .float())

        return Record()

    def on_logits(self, state: BatchState, fwd: Forward, logits: torch.Tensor) -> None:
        self.end_prob = end_probability(logits, state.token_ids.end_ids).cpu()
        return None


@torch.no_grad()
def step0_profiles(model, requests: list[Request], gen: GenerationConfig, *, layers: list[int],
                   factors=EPS_FACTORS, batch_size: int = 16) -> Profiles:
    """Run step 0 of every request and record the per-layer MLP sparsity for each threshold."""
    sparsity, end_prob = [], []
    eps = None
    rms = None
    for start in range(0, len(requests), batch_size):
        batch = requests[start: start + batch_size]
        ids, mask = pad_left([r.prompt_ids for r in batch], model.token_ids.pad)
        recorder = Step0Recorder(layers)
        first_forward(model, ids.to(model.device), attention_mask=None if mask is None else mask.to(model.device),
                      images=[r.image for r in batch] if model.is_multimodal else None, gen=gen, policies=[recorder])
        per_layer = recorder.activations
        if rms is None:
            rms = torch.stack([a.pow(2).mean().sqrt() for a in per_layer])
            eps = torch.stack([r * torch.tensor(factors) for r in rms])
        sparsity.append(torch.stack([
            torch.stack([seer_kernels.mlp_sparsity(a, float(e)) for e in eps[j]]) for j, a in enumerate(per_layer)
        ]))
        end_prob.append(recorder.end_prob)
    return Profiles(torch.cat(sparsity, dim=2).cpu(), eps.cpu(), rms.cpu(), torch.cat(end_prob), list(layers),
                    tuple(factors))


def clarity(profile: torch.Tensor, true_end: list[int]) -> tuple[float, float, float]:
    """(jump, wobble, clarity) of a ``[N, W]`` profile aligned at each request's true end.

    jump: mean of s[e] - s[e-1]; wobble: mean |s[i] - s[i-1]| away from the end (both sides).
    """
    jumps, wobble = [], []
    w = profile.shape[1]
    for n, e in enumerate(true_end):
        if 1 <= e < w:
            jumps.append(float(profile[n, e] - profile[n, e - 1]))
        d = (profile[n, 1:] - profile[n, :-1]).abs()
        keep = torch.ones_like(d, dtype=torch.bool)
        if 1 <= e < w:
            keep[e - 1] = False
        wobble.extend(d[keep].tolist())
    j = sum(jumps) / max(1, len(jumps))
    wb = sum(wobble) / max(1, len(wobble))
    return j, wb, (j / wb if wb > 0 else 0.0)


def request_tokens(window: int, gen: GenerationConfig, rules: DecodingRules, prompt: int, layers: int) -> int:
    """Positions x layers a request costs with a window of ``window`` under the engine's rules."""
    if rules.family == "llada":
        steps = llada_plan(window, gen).steps
    else:
        steps = dream_plan(window, gen, rules, masks=window).steps
    return steps * (prompt + window) * layers


def simulate(profiles: Profiles, true_end: list[int], cfg: SeerConfig, *, layer_ids: tuple[int, ...], eps_index: int,
             window: int) -> list[int]:
    """The windows Seer would keep for every profiled request under ``cfg`` (step-0 decisions)."""
    idx = [profiles.layers.index(layer) for layer in layer_ids]
    prof = profiles.sparsity[idx, eps_index].mean(0)
    n = prof.shape[0]
    valid = torch.full((n,), window, dtype=torch.int32)
    keep = seer_kernels.snr_boundary_reference(prof, valid, tau_jump=cfg.tau_jump, gamma=cfg.gamma, window=cfg.window,
                                  baseline_window=cfg.baseline_window, min_position=cfg.min_position).tolist()
    if cfg.probe == "both":
        thr = cfg.confirm_threshold if cfg.confirm_threshold is not None else cfg.eos_threshold
        hits = profiles.end_prob >= thr
        for r in range(n):
            k = keep[r]
            if k >= window:
                continue
            where = hits[r, :k].nonzero()
            if where.numel() == 0:  # premature: the next boundary after this one
                keep[r] = int(seer_kernels.snr_boundary_reference(
                    prof[r: r + 1], torch.tensor([window], dtype=torch.int32), tau_jump=cfg.tau_jump, gamma=cfg.gamma,
                    window=cfg.window, baseline_window=cfg.baseline_window, min_position=k)[0])
            elif int(where[0, 0]) + 1 < k:
                keep[r] = int(where[0, 0]) + 1
    return keep


def exact_match(requests: list[Request], answers: list[list[int]]) -> float:
    """The share of ``answers`` equal to their request's ``truth_ids`` (requests without one left out)."""
    ok = [a == r.truth_ids for a, r in zip(answers, requests) if r.truth_ids is not None]
    return sum(ok) / len(ok) if ok else float("nan")


def simulate_eos(profiles: Profiles, threshold: float, *, window: int) -> list[int]:
    """The windows the ``eos_prob`` probe would keep at ``threshold`` (its step-0 decision)."""
    first = first_reaching(profiles.end_prob[:, :window], threshold)  # W where no position reaches it
    return [min(j + 1, window) for j in first.tolist()]


def _guard_cost(keep: int, end: int, window: int) -> int:
    """Window after the guard's doublings when the cut fell before the end token."""
    while keep < min(end + 1, window):
        keep = min(window, max(2 * keep, keep + 4))
    return keep


def calibrate(model, requests: list[Request], gen: GenerationConfig, *, confirm: list[Request], lam: float = 0.1,
              progress: bool = False, verify_top: int = 4, verify_eos: int = 2, batch_size: int = 16,
              layers: list[int] | None = None, plot: str | None = None, rank_by: str = "tokens",
              guard_mode: str = "extend", eos_thresholds: tuple[float, ...] = (0.5,), max_drop: float = MAX_DROP,
              score=None, log=print) -> dict:
    """Choose a :class:`SeerConfig` for ``model`` on ``requests`` and confirm it on ``confirm``, a
    disjoint set (see the module docstring).

    rank_by: the speed-up inside the measured U: ``"tokens"`` (baseline over Seer tokens
    computed: deterministic, the default) or ``"wall"`` (wall-clock; on a shared CPU, runs made
    one after the other varied too much to rank configurations: the same eos_prob config
    measured x1.48 here and x2.81 interleaved in the demo). Both are recorded.

    guard_mode: the over-truncation guard of every verified candidate and of the choice
    (``"extend"``, the default, or ``"redecode"``: a guarded request is decoded again on the full
    window, so it ends as the baseline's answer; the simulated costs assume ``"extend"``).

    eos_thresholds: the ``eos_prob`` probe's thresholds to simulate; the best ``verify_eos`` by
    simulated U are verified (the simulation sees over-truncation, not the answers a shorter
    window words differently; the default, 0.5 alone, is what a model whose answer lengths are certain at
    step 0 needs; a model unsure of its length cuts at the median with 0.5 and needs a higher one).

    score: ``(requests, answers) -> accuracy`` against the requests' ``truth_ids`` (default
    :func:`exact_match`; a workload scored by its final answer passes its own).

    plot: a path for the step-0 sparsity figure (:func:`plot_profiles`); when it cannot be
    written the result still comes back, with ``plot_error`` saying why.

    max_drop: the accuracy a choice may lose against the baseline and still keep it (with no
    significant loss by McNemar's exact test; ``calibration.accuracy``).

    Returns a dict with ``config`` (the choice), ``requests`` (the choose set's size), the clarity
    table, the simulated and verified candidates (with their flips and p), the baseline figures
    and ``confirm`` (the confirm set's size, the baseline's and the choice's figures there, ``holds``).
    """
    if rank_by not in ("tokens", "wall"):
        raise ValueError(f"rank_by must be 'tokens' or 'wall', got {rank_by!r}")
    if guard_mode not in ("extend", "redecode"):
        raise ValueError(f"guard_mode must be 'extend' or 'redecode', got {guard_mode!r}")
    check_real("lam", lam, minimum=0)
    check_int("verify_top", verify_top, minimum=1)
    check_int("verify_eos", verify_eos, minimum=1)
    if not requests:
        raise ValueError("requests is empty")
    if not confirm:
        raise ValueError("confirm is empty: the choice is confirmed on a disjoint set of requests")
    if not eos_thresholds:
        raise ValueError("eos_thresholds must not be empty")
    for t in eos_thresholds:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 1:
            raise ValueError(f"eos_thresholds must hold numbers in (0, 1], got {t!r}")
    from tqdm.auto import tqdm

    n_layers = model.num_layers
    layers = layers or list(range(1, min(n_layers, 8)))
    W = gen.gen_length
    rules = DecodingRules.of(model)
    t0 = time.perf_counter()
    with tqdm(total=len(requests), desc="baseline", disable=not progress, file=sys.stderr) as bar:
        base = run_requests(model, requests, gen, batch_size=batch_size, progress=bar)
    true_end = [e if e >= 0 else W for e in base.end_positions]
    score = score or exact_match
    # a request without a reference is scored against the baseline's answer (on copies)
    requests = [r if r.truth_ids is not None else replace(r, truth_ids=list(a)) for r, a in zip(requests, base.answers)]
    base_right = right_answers(requests, base.answers, score)
    base_acc = sum(base_right) / len(base_right)
    log(f"choose set: {len(requests)} requests; baseline exact match {base_acc:.3f}, {base.tok_per_s:.1f} tok/s, "
        f"{base.wall_s:.1f}s")

    prof = step0_profiles(model, requests, gen, layers=layers, batch_size=batch_size)
    table = []
    for j, layer in enumerate(layers):
        for e, factor in enumerate(prof.factors):
            jmp, wob, clr = clarity(prof.sparsity[j, e], true_end)
            table.append({"layer": layer, "eps_factor": factor, "eps": float(prof.eps[j, e]), "jump": jmp,
                          "wobble": wob, "clarity": clr})
    table.sort(key=lambda r: -r["clarity"])
    log("step-0 sparsity: clearest jump-to-plateau (jump at the true end / wobble elsewhere)")
    for r in table[:8]:
        log(f"  layer {r['layer']}  eps {r['eps']:.4f} ({r['eps_factor']} x RMS)  jump {r['jump']:+.3f}  "
            f"wobble {r['wobble']:.3f}  clarity {r['clarity']:.2f}")

    prompt_len = 0 if (gen.prefix_cache if gen.prefix_cache is not None else model.is_multimodal) \
        else max(len(r.prompt_ids) for r in requests)
    cost = {w: request_tokens(w, gen, rules, prompt_len, n_layers) for w in range(1, W + 1)}
    base_tokens = cost[W] * len(requests)
    # candidate layer sets: the clearest single layers, and the clearest layers averaged
    best_single = []
    for r in table:
        key = (r["layer"], r["eps_factor"])
        if key not in best_single:
            best_single.append(key)
    by_factor = {}
    for r in table:
        by_factor.setdefault(r["eps_factor"], []).append(r["layer"])
    candidates = [((layer,), prof.factors.index(f)) for layer, f in best_single[:4]]
    for f, ls in list(by_factor.items())[:2]:
        candidates.append((tuple(sorted(ls[:3])), prof.factors.index(f)))
    sims = []

    def figures(keep: list[int]) -> dict:
        over = sum(k < min(t + 1, W) for k, t in zip(keep, true_end))
        tokens = sum(cost[_guard_cost(k, t, W)] for k, t in zip(keep, true_end))
        mae = sum(abs((k - 1 if k < W else W) - t) for k, t in zip(keep, true_end)) / len(keep)
        speed = base_tokens / max(1, tokens)
        return {"U": 1 - over / len(keep) + lam * math.log(speed), "over_truncation": over / len(keep),
                "ideal_speedup": speed, "mae": mae,
                "exact_end": sum(k - 1 == t for k, t in zip(keep, true_end)) / len(keep)}

    for (layer_ids, e), tau, gamma, bw, mp, probe in itertools.product(
            candidates, TAU_GRID, GAMMA_GRID, (1, 2, 3), (1, 2), ("sparsity", "both")):
        per_layer_eps = tuple(float(prof.eps[prof.layers.index(x), e]) for x in layer_ids)
        cfg = SeerConfig(probe_layer=max(layer_ids), probe_layers=layer_ids if len(layer_ids) > 1 else None,
                         eps=per_layer_eps if len(layer_ids) > 1 else per_layer_eps[0],
                         tau_jump=tau, gamma=gamma, baseline_window=bw, min_position=mp, probe=probe)
        keep = simulate(prof, true_end, cfg, layer_ids=layer_ids, eps_index=e, window=W)
        sims.append({"config": cfg, **figures(keep)})
    sims.sort(key=lambda s: -s["U"])
    # the end-probability probe: its step-0 decision at each threshold (the best settings of the
    # sparsity probe kept beside it, so that switching its probe back stays calibrated)
    eos_sims = sorted(({"config": replace(sims[0]["config"], probe="eos_prob", eos_threshold=float(t)),
                        **figures(simulate_eos(prof, float(t), window=W))} for t in eos_thresholds),
                      key=lambda s: -s["U"])
    for s in eos_sims:
        log(f"  eos_prob threshold {s['config'].eos_threshold}: U {s['U']:.3f}, over-trunc "
            f"{s['over_truncation']:.3f}, MAE {s['mae']:.2f}, ideal x{s['ideal_speedup']:.2f}")
    log(f"simulated {len(sims)} configurations; best by U = accuracy ratio + {lam} log(speed-up):")
    for s in sims[:verify_top]:
        c = s["config"]
        log(f"  layers {c.layers} eps {c.eps} tau {c.tau_jump} gamma {c.gamma} baseline {c.baseline_window} "
            f"min_pos {c.min_position} probe {c.probe}: U {s['U']:.3f}, over-trunc {s['over_truncation']:.3f}, "
            f"MAE {s['mae']:.2f}, ideal x{s['ideal_speedup']:.2f}")
    # decode the best simulated candidates, the best one of the paper's own probe (reported even
    # when it loses), and the best threshold of the end-probability probe, then choose by the
    # measured U
    distinct, seen = [], set()
    for s in sims:  # two candidate layer sets can coincide (SeerConfig is frozen: hashable)
        if s["config"] not in seen:
            seen.add(s["config"])
            distinct.append(s)
    to_verify = distinct[:verify_top]
    if all(s["config"].probe != "sparsity" for s in to_verify):
        to_verify += [s for s in distinct if s["config"].probe == "sparsity"][:1]
    to_verify += eos_sims[:verify_eos]
    verified = []
    for s in to_verify:
        c = replace(s["config"], guard_mode=guard_mode)
        with tqdm(total=len(requests), desc=f"verify {c.probe}", disable=not progress, file=sys.stderr) as bar:
            res = run_requests(model, requests, gen, seer=c, batch_size=batch_size, progress=bar)
        right = right_answers(requests, res.answers, score)
        acc = sum(right) / len(right)
        speed = base.wall_s / res.wall_s
        tokens_ratio = base.positions_computed / max(1, res.positions_computed)
        ranked = tokens_ratio if rank_by == "tokens" else speed
        verified.append({**{k: v for k, v in s.items() if k != "config"}, "config": c,
                         "exact_match": acc, **paired_figures(base_right, right, max_drop=max_drop),
                         "accuracy_ratio": acc / base_acc if base_acc else 0.0,
                         "measured_speedup": speed, "tokens_ratio": tokens_ratio, "rank_by": rank_by,
                         "U_measured": (acc / base_acc if base_acc else 0.0) + lam * math.log(ranked)})
        v = verified[-1]
        what = f"eos_threshold {c.eos_threshold}" if c.probe == "eos_prob" else \
            f"layers {c.layers} tau {c.tau_jump} gamma {c.gamma}"
        log(f"  verified {c.probe:8s} {what}: exact match {acc:.3f} ({v['right_to_wrong']} right->wrong, "
            f"{v['wrong_to_right']} wrong->right: {v['verdict']}), measured x{v['measured_speedup']:.2f}, "
            f"tokens x{v['tokens_ratio']:.2f}, U {v['U_measured']:.3f}")
    verified.sort(key=lambda v: -v["U_measured"])
    keeping = [v for v in verified if v["keeps_accuracy"]]
    best = (keeping or verified)[0]
    log(f"chosen on the choose set: {json.dumps(best['config'].to_dict())} (exact match {best['exact_match']:.3f} vs "
        f"{base_acc:.3f}: {best['verdict']}; measured x{best['measured_speedup']:.2f}, tokens "
        f"x{best['tokens_ratio']:.2f})" + ("" if keeping else " - no candidate keeps the baseline's accuracy: the "
                                           "best U"))
    confirmed = confirm_choice(model, confirm, gen, best["config"], batch_size=batch_size,
                               score=score, max_drop=max_drop, progress=progress, log=log)
    plot_error = None
    if plot:  # the figure must not cost the choice: a failure is returned (and said), not raised
        try:
            plot_profiles(prof, true_end, best["config"], plot, window=W)
        except (OSError, ValueError, ImportError, RuntimeError) as exc:
            plot_error = f"{type(exc).__name__}: {exc}"
            log(f"the plot {plot} was not written: {plot_error}")
    return {
        **({"plot_error": plot_error} if plot_error else {}),
        "config": best["config"],
        "lambda": lam,
        "max_drop": max_drop,
        "rule": "the best measured U among the verified candidates that keep the baseline's accuracy (at most "
                "max_drop below it, no significant loss by McNemar's exact test); the best U when none does",
        "requests": len(requests),
        "keeps_accuracy": bool(keeping),
        "baseline": {"exact_match": base_acc, "tok_per_s": base.tok_per_s, "wall_s": base.wall_s},
        "confirm": confirmed,
        "clarity": table[:12],
        "eos_thresholds": [{**{k: x for k, x in s.items() if k != "config"}, "threshold": s["config"].eos_threshold}
                           for s in eos_sims],
        "verified": [{**{k: x for k, x in v.items() if k != "config"}, "config": v["config"].to_dict()}
                     for v in verified],
        "seconds": time.perf_counter() - t0,
    }


def confirm_choice(model, confirm: list[Request], gen: GenerationConfig, cfg: SeerConfig, *, batch_size: int = 16,
                   score=None, max_drop: float = MAX_DROP, progress: bool = False, log=print) -> dict:
    """Decode ``confirm`` (held-out requests the choice was not made on) with the baseline and with
    Seer under ``cfg``, and report the choice there: its accuracy, its flips against the baseline,
    McNemar's p and ``holds`` (it keeps the baseline's accuracy: ``calibration.accuracy``)."""
    from tqdm.auto import tqdm

    score = score or exact_match
    with tqdm(total=len(confirm), desc="confirm: baseline", disable=not progress, file=sys.stderr) as bar:
        base = run_requests(model, confirm, gen, batch_size=batch_size, progress=bar)
    confirm = [r if r.truth_ids is not None else replace(r, truth_ids=list(a)) for r, a in zip(confirm, base.answers)]
    base_right = right_answers(confirm, base.answers, score)
    with tqdm(total=len(confirm), desc=f"confirm: {cfg.probe}", disable=not progress, file=sys.stderr) as bar:
        res = run_requests(model, confirm, gen, seer=cfg, batch_size=batch_size, progress=bar)
    right = right_answers(confirm, res.answers, score)
    figures = paired_figures(base_right, right, max_drop=max_drop)
    base_acc, acc = sum(base_right) / len(base_right), sum(right) / len(right)
    tokens_ratio = base.positions_computed / max(1, res.positions_computed)
    log(f"confirmed on {len(confirm)} held-out requests: exact match {acc:.3f} vs baseline {base_acc:.3f} "
        f"({figures['right_to_wrong']} right->wrong, {figures['wrong_to_right']} wrong->right: {figures['verdict']}), "
        f"tokens x{tokens_ratio:.2f} - " + ("it holds there" if figures["keeps_accuracy"] else
                                         "it does NOT hold there: it loses accuracy"))
    return {"requests": len(confirm),
            "baseline": {"exact_match": base_acc, "tok_per_s": base.tok_per_s, "wall_s": base.wall_s},
            "chosen": {"exact_match": acc, "tok_per_s": res.tok_per_s, "measured_speedup": base.wall_s / res.wall_s,
                       "tokens_ratio": tokens_ratio, **figures},
            "holds": figures["keeps_accuracy"]}


def plot_profiles(prof: Profiles, true_end: list[int], cfg: SeerConfig, path: str, *, window: int,
                  requests: int = 4) -> None:
    """Step-0 sparsity per layer for a few requests, the detected boundary and the true end marked;
    written atomically to ``path`` in the format its suffix names (png when it has none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = cfg.layers[0]
    e = min(range(len(prof.factors)),
            key=lambda i: abs(float(prof.eps[prof.layers.index(first), i]) - cfg.eps_for(first)))
    # the chosen probe's own step-0 decision (the end probability's for eos_prob, not the sparsity test's)
    keep = simulate_eos(prof, cfg.eos_threshold, window=window) if cfg.probe == "eos_prob" else \
        simulate(prof, true_end, cfg, layer_ids=cfg.layers, eps_index=e, window=window)
    picks = sorted(range(len(true_end)), key=lambda r: true_end[r])
    picks = [picks[int(k * (len(picks) - 1) / max(1, requests - 1))] for k in range(requests)]
    fig, axes = plt.subplots(1, requests, figsize=(4 * requests, 3.2), sharey=True)
    for ax, r in zip(axes, picks):
        for j, layer in enumerate(prof.layers):
            ax.plot(prof.sparsity[j, e, r].numpy(), lw=1.2 if layer in cfg.layers else 0.7,
                    alpha=1.0 if layer in cfg.layers else 0.45, label=f"layer {layer}")
        ax.axvline(true_end[r], color="k", ls="--", lw=1, label="true end")
        if keep[r] < window:
            ax.axvline(keep[r] - 1, color="r", ls=":", lw=1.5, label=f"{cfg.probe} boundary")
        ax.set_title(f"request {r}: answer of {true_end[r]} token{'' if true_end[r] == 1 else 's'}", fontsize=9)
        ax.set_xlabel("response position")
    axes[0].set_ylabel(f"step-0 MLP sparsity (|a| < {prof.factors[e]} x RMS)")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the data, not over it
    fig.tight_layout()
    try:
        with atomic_write(path, "wb") as f:  # a figure interrupted while written leaves no partial file
            fig.savefig(f, dpi=110, bbox_inches="tight", format=Path(path).suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)
