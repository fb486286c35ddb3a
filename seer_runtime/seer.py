"""Seer: step-zero end estimation and one-shot truncation of the response window (SPEC.md §1).

Where Seer cuts the window: :class:`SeerPolicy`. At step 0 layers ``0..probe_layer`` run on the
full window; after the probe layer (``after_layer``) the MLP activation sparsity of the
response positions gives each request's boundary by the SNR jump-to-plateau test
(``seer_kernels.snr_boundary``), the windows are cut to ``L*`` (``run.window``) and the rest of
step 0 and every later step run on the survivors; the cut suffix is reported as EOS.

Probes (``SeerConfig.probe``): ``"sparsity"`` (the paper's); ``"eos_prob"`` (the first position
whose step-0 ``P(EOS) + P(end-of-turn)`` reaches ``eos_threshold``; costs the rest of step 0
on the full window); ``"both"`` (the sparsity cut, then checked by the end probability of the
surviving positions: none looks like an end -> premature, re-extended to the next boundary;
an earlier one does -> tightened to it).

After a cut the configured tokens-per-step rate is kept (``plans``). The over-truncation guard:
a window fully decoded with no end token may have lost its tail; ``guard_mode="extend"``
doubles it (up to ``gen_length``) with fresh masks, ``"redecode"`` restarts it on the full
window. Every event is counted per request in ``stats.extra["seer"]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import seer_kernels

from .adapter import Taps
from .config import StoredConfig, check, check_bool, check_int, check_real
from .engine import DecodeRun, Forward, read_to_host
from .plans import dream_plan
from .policy import DecodePolicy

PROBES = ("sparsity", "eos_prob", "both")


@dataclass(frozen=True)
class SeerConfig(StoredConfig):
    """Seer's settings; validated on construction. See the module docstring.

    probe_layer: the layer whose MLP activation is read (0-based; the paper uses 3).
    eps: absolute threshold: an entry counts as near-zero when ``|a| < eps``; with several
        probe layers, one value for all or a tuple with one value per probe layer.
    tau_jump, gamma, window: the SNR test (defaults: the paper's knee 0.03, 0.6, 3).
    probe_layers: average the sparsity of several layers (the cut follows the last of them);
        None -> ``(probe_layer,)``.
    baseline_window / min_position: robust variants of the test (``snr_boundary``); 1 / 1 is
        the paper's exact test.
    eos_threshold: the ``eos_prob`` probe's threshold on ``P(EOS) + P(end-of-turn)``.
    confirm_threshold: ``both``: a cut is confirmed when a surviving position reaches it
        (None -> ``eos_threshold``).
    guard / guard_mode: the over-truncation guard (``extend`` or ``redecode``).
    """

    probe_layer: int = 3
    eps: float | tuple[float, ...] = 0.1
    tau_jump: float = 0.03
    gamma: float = 0.6
    window: int = 3
    probe: str = "sparsity"
    probe_layers: tuple[int, ...] | None = None
    baseline_window: int = 1
    min_position: int = 1
    eos_threshold: float = 0.5
    confirm_threshold: float | None = None
    guard: bool = True
    guard_mode: str = "extend"

    def __post_init__(self) -> None:
        check_int("probe_layer", self.probe_layer, minimum=0)
        if isinstance(self.eps, list):
            object.__setattr__(self, "eps", tuple(self.eps))
        for i, e in enumerate(self.eps if isinstance(self.eps, tuple) else (self.eps,)):
            check_real("eps" if not isinstance(self.eps, tuple) else f"eps[{i}]", e, minimum=0)
        check_real("tau_jump", self.tau_jump, minimum=0, open_minimum=True)
        # gamma = 0 accepts only a perfectly flat plateau (noise == 0): Seer would then almost never cut
        check_real("gamma", self.gamma, minimum=0, open_minimum=True)
        check_int("window", self.window, minimum=1)
        check(self.probe in PROBES, f"probe must be one of {PROBES}, got {self.probe!r}")
        if self.probe_layers is not None:
            if isinstance(self.probe_layers, (str, bytes)) or not isinstance(self.probe_layers, (tuple, list)):
                raise TypeError(f"probe_layers must be a tuple of layer indices or None, got {self.probe_layers!r}")
            object.__setattr__(self, "probe_layers", tuple(self.probe_layers))
            for i, layer in enumerate(self.probe_layers):
                check_int(f"probe_layers[{i}]", layer, minimum=0)
            check(len(self.probe_layers) > 0, "probe_layers must hold at least one layer (or be None)")
            check(len(set(self.probe_layers)) == len(self.probe_layers),
                  f"probe_layers must not repeat a layer (it would count twice in the average), "
                  f"got {self.probe_layers}")
        check_int("baseline_window", self.baseline_window, minimum=1)
        check_int("min_position", self.min_position, minimum=1)
        check_real("eos_threshold", self.eos_threshold, minimum=0, maximum=1, open_minimum=True)
        if self.confirm_threshold is not None:
            check_real("confirm_threshold", self.confirm_threshold, minimum=0, maximum=1, open_minimum=True)
        check_bool("guard", self.guard)
        check(self.guard_mode in ("extend", "redecode"),
              f"guard_mode must be extend or redecode, got {self.guard_mode!r}")
        if isinstance(self.eps, tuple):
            check(len(self.eps) == len(self.layers),
                  f"eps has {len(self.eps)} values for {len(self.layers)} probe layers")
        check(max(self.layers) == self.probe_layer or self.probe_layers is None,
              f"probe_layer ({self.probe_layer}) must be the last of probe_layers {self.probe_layers}")

    @property
    def layers(self) -> tuple[int, ...]:
        return self.probe_layers if self.probe_layers is not None else (self.probe_layer,)

    def eps_for(self, layer: int) -> float:
        """The threshold used at probe layer ``layer``."""
        if isinstance(self.eps, tuple):
            return float(self.eps[self.layers.index(layer)])
        return float(self.eps)


def end_probability(logits: torch.Tensor, end_ids: tuple[int, ...]) -> torch.Tensor:
    """``P(EOS) + P(end-of-turn)`` per position, fp32: ``[R, W, V] -> [R, W]``."""
    probs = torch.softmax(logits.float(), dim=-1)
    return sum(probs[..., t] for t in end_ids)


def first_reaching(values: torch.Tensor, threshold: float, live: torch.Tensor | None = None) -> torch.Tensor:
    """Per row of ``values [R, W]``, the first position with ``values >= threshold`` (among the
    ``live`` ones, bool ``[R, W]``), or ``W`` when there is none: int64 ``[R]`` on the device."""
    hits = values >= threshold
    if live is not None:
        hits &= live
    positions = torch.arange(values.shape[1], device=values.device)
    return torch.where(hits, positions, values.shape[1]).amin(dim=1)


class SeerPolicy(DecodePolicy):
    """The step-0 probe and cut, the confirmation of ``both``, and the over-truncation guard."""

    name = "seer"

    def __init__(self, config: SeerConfig) -> None:
        self.config = config

    def on_request(self, run: DecodeRun) -> None:
        bad = [layer for layer in self.config.layers if layer >= run.num_layers]
        if bad:
            raise ValueError(f"seer probe layer(s) {bad} out of range: the model has {run.num_layers} layers")
        batch = run.batch_size
        self.cut_done = False
        self.keep_len = [run.width] * batch
        self.boundary: list[int | None] = [None] * batch
        self.guard_events = [0] * batch
        self.premature = [0] * batch
        self.tightened = [0] * batch
        self.profile: torch.Tensor | None = None  # step-0 sparsity of the window, averaged over the probe layers
        self.pending: dict[int, int] = {}  # `both`: re-extensions applied after step 0
        self._profile_sum: torch.Tensor | None = None
        self.confirm_due = False
        self._checked: set[int] = set()  # cut windows found complete with an end token (final)
        self._asked: list[int] = []  # the windows whose status this step's read brings
        run.window.cut_pending = True

    # -- the cut ---------------------------------------------------------------------------------
    def _probing(self, fwd: Forward) -> bool:
        return fwd.step == 0 and not self.cut_done and self.config.probe in ("sparsity", "both")

    def cut(self, run: DecodeRun, keep: list[int]) -> None:
        """Request ``b`` keeps ``keep[b]`` positions from now on (its plan follows the shorter window)."""
        for b, n in enumerate(keep):
            run.window.set(b, n)
            self.keep_len[b] = n
            run.plans[b] = run.make_plan(b, n)
        self.cut_done = True
        run.window.cut_pending = False

    def graph_key(self, run: DecodeRun, fwd: Forward) -> tuple | None:
        """Step 0 probes and cuts (inside its layer loop, or from its logits): never replayed."""
        return None if fwd.step == 0 else ()

    def layer_taps(self, run: DecodeRun, fwd: Forward, layer: int, taps: Taps) -> None:
        if self._probing(fwd) and layer in self.config.layers:
            taps.mlp_sparsity_eps = self.config.eps_for(layer)

    def after_layer(self, run: DecodeRun, fwd: Forward, layer: int, taps: Taps) -> None:
        """After the probe layer(s) of step 0: the boundary of every request, and the cut."""
        if not self._probing(fwd) or layer not in self.config.layers:
            return
        s, width, rows = self.config, run.width, len(fwd.rows)
        part = taps.mlp_sparsity[:rows, fwd.offset: fwd.offset + width]
        self._profile_sum = part if self._profile_sum is None else self._profile_sum + part
        if layer != max(s.layers):
            return
        self.profile = self._profile_sum / len(s.layers)
        valid = torch.full((rows,), width, dtype=torch.int32, device=run.device)
        # LaViDa-Dream's pre-filled first token is part of the answer
        keep = seer_kernels.snr_boundary(self.profile, valid, tau_jump=s.tau_jump, gamma=s.gamma, window=s.window,
                                         baseline_window=s.baseline_window,
                                         min_position=max(s.min_position, run.first_masked))
        keep_list = keep.tolist()  # the one host read of L* per generation
        self.boundary = [k - 1 if k < width else None for k in keep_list]
        self.cut(run, keep_list)
        self.confirm_due = s.probe == "both"
        run.narrow_forward(fwd, after_layer=layer)

    def on_logits(self, run: DecodeRun, fwd: Forward, logits: torch.Tensor) -> torch.Tensor:
        if fwd.step != 0:
            return logits
        if self.config.probe == "eos_prob" and not self.cut_done:
            p_end = end_probability(logits, run.token_ids.end_ids)
            keep = []
            # the one host read of the boundaries per generation
            for b, j in enumerate(first_reaching(p_end, self.config.eos_threshold).tolist()):
                j = max(j, run.first_masked) if j < p_end.shape[1] else None
                self.boundary[b] = j
                keep.append(run.width if j is None else j + 1)
            self.cut(run, keep)
            return logits[:, : run.window.longest()]
        if self.confirm_due:  # `both`: the sparsity cut of this forward, checked by its logits
            self.confirm_due = False
            self._confirm(run, fwd, logits)
        return logits

    def _confirm(self, run: DecodeRun, fwd: Forward, logits: torch.Tensor) -> None:
        """``both``: check each cut with the end probability of its surviving positions."""
        s = self.config
        threshold = s.confirm_threshold if s.confirm_threshold is not None else s.eos_threshold
        p_end = end_probability(logits, run.token_ids.end_ids)
        first = first_reaching(p_end, threshold, run.window.live_mask(fwd.index, p_end.shape[1]))
        cut = [(local, b) for local, b in enumerate(fwd.rows) if run.window[b] < run.width]
        # where a premature cut re-extends to: the next sparsity boundary after it (or the end)
        valid = torch.full((1,), run.width, dtype=torch.int32, device=run.device)
        later = [seer_kernels.snr_boundary(self.profile[local: local + 1], valid, tau_jump=s.tau_jump, gamma=s.gamma,
                                           window=s.window, baseline_window=s.baseline_window,
                                           min_position=run.window[b]) for local, b in cut]
        hits, *later = read_to_host([first, *later])  # one read for every row's check
        for (local, b), nxt in zip(cut, later):
            j = hits[local]
            if j >= p_end.shape[1]:  # premature: no surviving position looks like an end
                self.premature[b] += 1
                self.pending[b] = nxt[0]
            elif j + 1 < run.window[b]:
                # an earlier surviving position already ends the answer: tighten to it
                self.tightened[b] += 1
                n = max(j + 1, run.first_masked + 1)
                run.window.set(b, n)
                self.keep_len[b] = n
                run.plans[b] = run.make_plan(b, n)
                self.boundary[b] = j

    # -- extension and guard ---------------------------------------------------------------------
    def extend(self, run: DecodeRun, b: int, new_len: int, step: int) -> None:
        """Give request ``b`` the masked positions ``[length, new_len)`` (at most the full window)
        from step ``step + 1`` on."""
        old = run.window[b]
        new_len = min(run.width, new_len)
        if new_len <= old:
            return
        old_masks = run.window.masks.left(b, 0, old)
        run.window.set(b, new_len)
        plan = run.plans[b]
        if run.rules.family == "dream":
            # one global schedule: re-plan every mask left (Dream's last step commits all of them)
            masks = run.window.masks.left(b)
            run.plans[b] = plan.keep_first(step + 1).then(
                dream_plan(new_len, run.gen, run.rules, masks=masks, positions=masks))
            return
        region = run.make_plan(b, new_len, start=old)
        if not old_masks:
            plan = plan.keep_first(step + 1)  # the old window is done: drop its idle remaining steps
        run.plans[b] = plan.then(region)

    def redecode(self, run: DecodeRun, b: int, step: int) -> None:
        """Decode request ``b`` again on the full window from step ``step + 1`` on."""
        run.tokens[b, run.first_masked:] = run.token_ids.mask
        run.window.reset(b)
        run.plans[b] = run.plans[b].keep_first(step + 1).then(run.make_plan(b, run.width))

    def _guard_candidates(self, run: DecodeRun) -> list[int]:
        """Cut windows that may have just been filled: those with no mask left on the host's
        count, or every unchecked cut window while the count is still to be read (Dream)."""
        pending = run.window.masks.pending
        return [b for b in range(run.batch_size) if run.window[b] < run.width and b not in self._checked
                and (pending or not run.window.masks.left(b))]

    def step_reads(self, run: DecodeRun, step: int) -> dict[str, torch.Tensor] | None:
        """The guard's question, asked on the steps where a cut window may have been filled:
        does each such window still hold a mask, and does it hold an end token."""
        self._asked = []
        if not (self.config.guard and self.cut_done):
            return None
        self._asked = self._guard_candidates(run)
        if not self._asked:
            return None
        # every request's status (one cached index, no upload of the candidates' rows)
        return {"seer/window_status": self._window_status(run, list(range(run.batch_size)))}

    def after_step(self, run: DecodeRun, step: int) -> bool:
        for b, target in list(self.pending.items()):
            self.extend(run, b, target, step)
        self.pending.clear()
        guarded = False
        if self._asked:
            status = run.step_values["seer/window_status"]
            for b in self._asked:
                has_mask, has_end = status[2 * b], status[2 * b + 1]
                if run.window.masks.left(b) or has_mask:  # not filled yet (or the model wrote the mask id)
                    continue
                if has_end:
                    self._checked.add(b)
                    continue
                n = run.window[b]
                self.guard_events[b] += 1  # fully decoded, no end token: the answer ran into the cut
                if self.config.guard_mode == "extend":
                    self.extend(run, b, max(2 * n, n + 4), step)
                else:
                    self.redecode(run, b, step)
                guarded = True
            self._asked = []
        return guarded or any(step + 1 < p.steps for p in run.plans)

    @staticmethod
    def _window_status(run: DecodeRun, rows: list[int]) -> torch.Tensor:
        """bool ``[len(rows), 2]``: (a mask left, an end token) in each of ``rows``' live windows."""
        index = run.row_index(rows)
        width = run.window.longest(rows)
        window = run.tokens[index, :width]
        live = run.window.live_mask(index, width)
        is_end = torch.zeros_like(window, dtype=torch.bool)
        for t in run.token_ids.end_ids:
            is_end |= window == t
        return torch.stack([((window == run.token_ids.mask) & live).any(dim=1), (is_end & live).any(dim=1)], 1)

    def report(self, run: DecodeRun) -> dict:
        return {"seer": {
            "keep_len": list(self.keep_len),
            "boundary": list(self.boundary),
            "final_window": run.window.lengths,
            "guard_events": list(self.guard_events),
            "premature_cuts": list(self.premature),
            "tightened": list(self.tightened),
        }}
