"""The demo's figure: what Seer's probe saw at step 0 and where it cut, and what each configuration
bought (speed-up beside accuracy).

Top row: four requests (answer lengths spread from the shortest to the longest of the first 16);
the step-0 signal of the probe the demo ran (the end probability ``P(EOS) + P(end-of-turn)`` for
``eos_prob``, the MLP sparsity of its probe layers for ``sparsity``, both for ``both``), the cut
Seer made in the real decode (not a re-simulation) and the baseline's true end; a cut that is not
at the true end is labelled as the probe's miss, with how far off it is. Bottom row: per
configuration, exact match with its 95% interval beside the measured speed-up (bar) and the
ideal one (marker). The legend sits outside the data.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

import seer_kernels

from ..config import GenerationConfig
from ..evaluate import Request, RunResult, pad_left
from ..files import atomic_write
from ..generation import first_forward
from ..seer import SeerConfig
from .seer import Step0Recorder


def plural(n: int, word: str) -> str:
    """``1 token``, ``2 tokens``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


@torch.no_grad()
def step0_signal(model, requests: list[Request], gen: GenerationConfig, cfg: SeerConfig) -> dict[str, torch.Tensor]:
    """The probe's step-0 signals of ``requests`` (one batch): ``end_prob`` ``[N, W]`` and ``sparsity``
    ``[N, W]`` (the mean over ``cfg``'s probe layers of the share of MLP activations below its eps)."""
    ids, mask = pad_left([r.prompt_ids for r in requests], model.token_ids.pad)
    recorder = Step0Recorder(list(cfg.layers))
    first_forward(model, ids.to(model.device), attention_mask=None if mask is None else mask.to(model.device),
                  images=[r.image for r in requests] if model.is_multimodal else None, gen=gen, policies=[recorder])
    per_layer = [seer_kernels.mlp_sparsity(act, cfg.eps_for(layer)) for layer, act in
                 zip(sorted(set(cfg.layers)), recorder.activations)]
    return {"end_prob": recorder.end_prob.float(), "sparsity": torch.stack(per_layer).mean(0).cpu().float()}


def _picks(true_end: list[int], count: int) -> list[int]:
    order = sorted(range(len(true_end)), key=lambda r: true_end[r])
    picks = [order[round(k * (len(order) - 1) / max(1, count - 1))] for k in range(count)]
    return list(dict.fromkeys(picks))


def plot_demo(model, requests: list[Request], gen: GenerationConfig, cfg: SeerConfig, seer_run: RunResult,
              base: RunResult, figures: dict[str, dict], path: str, *, recommended: str | None = None,
              panels: int = 4) -> None:
    """Write the demo's figure (module docstring) to ``path``, atomically, in the format its suffix
    names. ``seer_run``: the decode of Seer under ``cfg`` (its cuts); ``base``: the baseline's (its
    true ends); ``figures``: the demo's rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window = gen.gen_length
    first = requests[: min(16, len(requests))]
    signal = step0_signal(model, first, gen, cfg)
    true_end = [e if e >= 0 else window for e in base.end_positions[: len(first)]]
    picks = _picks(true_end, panels)
    fig = plt.figure(figsize=(4.2 * max(len(picks), 2), 3.2 + 0.32 * len(figures) + 1.2))
    grid = fig.add_gridspec(2, len(picks) * 2, height_ratios=[3.2, 0.32 * len(figures) + 1.2], hspace=0.45,
                            wspace=0.6)
    handles = {}
    for k, r in enumerate(picks):
        ax = fig.add_subplot(grid[0, 2 * k: 2 * k + 2])
        x = range(window)
        if cfg.probe in ("eos_prob", "both"):
            handles["step-0 P(end)"], = ax.plot(x, signal["end_prob"][r].numpy(), color="tab:blue", lw=1.3)
            handles[f"eos threshold {cfg.eos_threshold:g}"] = ax.axhline(cfg.eos_threshold, color="tab:blue", lw=0.8,
                                                                         ls=":")
        if cfg.probe in ("sparsity", "both"):
            handles[f"MLP sparsity, layers {list(cfg.layers)}"], = ax.plot(x, signal["sparsity"][r].numpy(),
                                                                           color="tab:green", lw=1.3)
        end = true_end[r]
        handles["true end (baseline)"] = ax.axvline(end, color="k", ls="--", lw=1)
        boundary = seer_run.seer["boundary"][r]
        cut = boundary if boundary is not None else window
        if boundary is not None:
            handles["Seer's cut"] = ax.axvline(boundary, color="tab:red", ls="-", lw=1.5, alpha=0.8)
        if cut == end:
            note = "cut at the true end"
        elif boundary is None:
            note = f"{cfg.probe}'s miss: no cut"
        else:
            off = cut - end
            note = f"{cfg.probe}'s miss: {plural(abs(off), 'position')} {'late' if off > 0 else 'early'}"
        ax.set_title(f"request {r}: answer of {plural(end, 'token')}\n{note}", fontsize=9)
        ax.set_xlabel("response position")
        ax.set_ylim(-0.02, 1.05)
        ax.set_xlim(0, window - 1)
        if k == 0:
            ax.set_ylabel(f"step-0 signal ({cfg.probe})")
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=len(handles), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 1.0))

    names = list(figures)
    n = len(requests)
    half = len(picks)
    acc_ax = fig.add_subplot(grid[1, :half])
    speed_ax = fig.add_subplot(grid[1, half:], sharey=acc_ax)
    ys = list(range(len(names)))[::-1]
    accs = [figures[m]["exact_match"] for m in names]
    # the 95% (Wilson) interval of each accuracy, for scale; the paired test is in the table
    errs = [[a - _wilson(a, n)[0] for a in accs], [_wilson(a, n)[1] - a for a in accs]]
    colors = ["tab:gray" if m == "baseline" else ("tab:green" if figures[m].get("keeps_accuracy") else "tab:orange")
              for m in names]
    acc_ax.barh(ys, accs, xerr=errs, color=colors, alpha=0.8, capsize=2)
    acc_ax.set_yticks(ys)
    acc_ax.set_yticklabels([m + (" *" if m == recommended else "") for m in names], fontsize=8)
    acc_ax.set_xlabel(f"exact match (95% interval, n={n}); orange: loses accuracy")
    acc_ax.set_xlim(max(0.0, min(a - e for a, e in zip(accs, errs[0])) - 0.05), 1.0)
    speeds = [figures[m].get("speedup", 1.0) for m in names]
    ideals = [figures[m].get("ideal_speedup", 1.0) for m in names]
    speed_ax.barh(ys, speeds, color=colors, alpha=0.8, label="measured")
    speed_ax.scatter(ideals, ys, marker="|", s=120, color="k", label="ideal (positions computed)", zorder=3)
    speed_ax.axvline(1.0, color="k", lw=0.6)
    speed_ax.set_xscale("log")
    speed_ax.set_xlabel("speed-up over the baseline (* recommended)")
    speed_ax.tick_params(labelleft=False)
    speed_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    try:
        with atomic_write(path, "wb") as f:  # a figure interrupted while written leaves no partial file
            fig.savefig(f, dpi=110, bbox_inches="tight", format=Path(path).suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)


def _wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``p`` of ``n``."""
    if n == 0:
        return 0.0, 1.0
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
