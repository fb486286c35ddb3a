"""Seer: step-zero end estimation and one-shot truncation of the response window (the Seer
paper, arXiv 2607.14557).

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

A cut window keeps ``SeerConfig.slack`` masked positions after ``L*`` (default 0, the paper's
cut). A cut changes answers that end well inside it: the answer positions no longer attend to the
masked suffix the baseline's window holds, and the low-confidence ranking of near-tied positions
moves (bench/RESULTS.md, "Where Seer changes answers"); a slack gives part of that context back,
at its cost in steps and positions. After a cut the configured tokens-per-step rate is kept
(``plans``). The over-truncation guard: a window fully decoded with no end token may have lost
its tail; ``guard_mode="extend"`` doubles it (up to ``gen_length``) with fresh masks,
``"redecode"`` restarts it on the full window. Every event is counted per request in
``stats.extra["seer"]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import seer_kernels

from .adapter import Taps
from .batch import BatchState, first_true, is_end_token, read_to_host
from .config import StoredConfig, check, check_bool, check_int, check_real
from .policy import LayerHook, Policy
from .profiling import prange
from .runner import Cut, Forward
from .window import Extend, Redecode

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
    slack: masked positions kept after the boundary: a request cut at ``L*`` keeps
        ``min(gen_length, L* + slack)`` positions (decoded like the others, at the configured
        rate: ``slack`` more steps and positions per step). 0 (the default) is the paper's cut. A
        request with no boundary keeps the full window whatever the slack. With ``both``, the
        confirmation looks at every kept position (the slack's too) and a tightened or
        re-extended window gets the slack after its new boundary.
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
    slack: int = 0

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
        check_int("slack", self.slack, minimum=0)
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
    return first_true(hits)


class SeerPolicy(Policy):
    """The step-0 probe and cut, the confirmation of ``both``, and the over-truncation guard."""

    name = "seer"
    cuts_at_step0 = True

    def __init__(self, config: SeerConfig) -> None:
        self.config = config

    def start(self, state: BatchState, model) -> None:
        bad = [layer for layer in self.config.layers if layer >= model.num_layers]
        if bad:
            raise ValueError(f"seer probe layer(s) {bad} out of range: the model has {model.num_layers} layers")
        batch = state.batch_size
        self.cut_done = False
        self.keep_len = [state.width] * batch
        self.boundary: list[int | None] = [None] * batch
        self.guard_events = [0] * batch
        self.premature = [0] * batch
        self.tightened = [0] * batch
        self.profile: torch.Tensor | None = None  # step-0 sparsity of the window, averaged over the probe layers
        self.pending: dict[int, int] = {}  # `both`: re-extensions applied after step 0
        self.confirm_due = False
        self._checked: set[int] = set()  # cut windows found complete with an end token (final)
        self._asked: list[int] = []  # the windows whose status this step's read brings

    # -- the cut ---------------------------------------------------------------------------------
    def plan(self, state: BatchState, fwd: Forward) -> tuple | None:
        """Step 0 probes and cuts (inside its layer loop, or from its logits): never replayed."""
        return None if fwd.step == 0 else ()

    def layers(self, state: BatchState, fwd: Forward) -> LayerHook | None:
        if fwd.step == 0 and not self.cut_done and self.config.probe in ("sparsity", "both"):
            return _Probe(self, state)
        return None

    def with_slack(self, state: BatchState, keep: int) -> int:
        """The positions a window cut to ``keep`` keeps: ``slack`` more, at most the full window
        (an uncut window, ``keep == width``, stays as it is)."""
        return min(state.width, keep + self.config.slack)

    def cut(self, state: BatchState, keep: list[int], *, narrow_logits: bool = False) -> Cut:
        """Request ``b`` is cut to ``keep[b]`` positions (its boundary + 1, or the full window) and
        keeps that many plus the slack from now on (the scheduler plans the shorter windows)."""
        with prange("seer/cut"):
            keep = [self.with_slack(state, k) for k in keep]
            self.keep_len = list(keep)
            self.cut_done = True
            return Cut(dict(enumerate(keep)), narrow_logits)

    def on_logits(self, state: BatchState, fwd: Forward, logits: torch.Tensor) -> Cut | None:
        if fwd.step != 0:
            return None
        if self.config.probe == "eos_prob" and not self.cut_done:
            with prange("seer/probe"):
                p_end = end_probability(logits, state.token_ids.end_ids)
                keep = []
                # the one host read of the boundaries per generation
                for b, j in enumerate(first_reaching(p_end, self.config.eos_threshold).tolist()):
                    j = max(j, state.first_masked) if j < p_end.shape[1] else None
                    self.boundary[b] = j
                    keep.append(state.width if j is None else j + 1)
            return self.cut(state, keep, narrow_logits=True)
        if self.confirm_due:  # `both`: the sparsity cut of this forward, checked by its logits
            self.confirm_due = False
            with prange("seer/probe"):
                return self._confirm(state, fwd, logits)
        return None

    def _confirm(self, state: BatchState, fwd: Forward, logits: torch.Tensor) -> Cut | None:
        """``both``: check each cut with the end probability of its surviving positions; a window
        tightened to an earlier end is returned as a Cut, a premature one re-extended after step 0."""
        s = self.config
        threshold = s.confirm_threshold if s.confirm_threshold is not None else s.eos_threshold
        p_end = end_probability(logits, state.token_ids.end_ids)
        first = first_reaching(p_end, threshold, state.window.live_mask(fwd.index, p_end.shape[1]))
        cut = [(local, b) for local, b in enumerate(fwd.rows) if state.window[b] < state.width]
        # where a premature cut re-extends to: the next sparsity boundary after it (or the end)
        valid = torch.full((1,), state.width, dtype=torch.int32, device=state.device)
        later = [seer_kernels.snr_boundary(self.profile[local: local + 1], valid, tau_jump=s.tau_jump, gamma=s.gamma,
                                           window=s.window, baseline_window=s.baseline_window,
                                           min_position=state.window[b]) for local, b in cut]
        hits, *later = read_to_host([first, *later])  # one read for every row's check
        tightened = {}
        for (local, b), nxt in zip(cut, later):
            j = hits[local]
            if j >= p_end.shape[1]:  # premature: no surviving position looks like an end
                self.premature[b] += 1
                self.pending[b] = self.with_slack(state, nxt[0])
            elif self.with_slack(state, max(j + 1, state.first_masked + 1)) < state.window[b]:
                # an earlier surviving position already ends the answer: tighten to it
                self.tightened[b] += 1
                tightened[b] = self.keep_len[b] = self.with_slack(state, max(j + 1, state.first_masked + 1))
                self.boundary[b] = j
        return Cut(tightened) if tightened else None

    # -- the guard -------------------------------------------------------------------------------
    def _guard_candidates(self, state: BatchState) -> list[int]:
        """Cut windows that may have just been filled: those with no mask left on the host's
        count, or every unchecked cut window while the count is still to be read (Dream)."""
        pending, window = state.window.masks.pending, state.window
        return [b for b in range(state.batch_size) if window[b] < state.width and b not in self._checked
                and (pending or not window.masks.left(b))]

    def step_reads(self, state: BatchState, step: int) -> dict[str, torch.Tensor] | None:
        """The guard's question, asked on the steps where a cut window may have been filled:
        does each such window still hold a mask, and does it hold an end token."""
        self._asked = []
        if not (self.config.guard and self.cut_done):
            return None
        self._asked = self._guard_candidates(state)
        if not self._asked:
            return None
        with prange("seer/guard"):  # every request's status (one cached index, no upload of the candidates' rows)
            return {"seer/window_status": self._window_status(state, list(range(state.batch_size)))}

    def after_step(self, state: BatchState, step: int, values: dict[str, list[int]]) -> list[Extend | Redecode]:
        changes: list[Extend | Redecode] = [Extend(b, target) for b, target in self.pending.items()]
        extended = {b for b, target in self.pending.items() if min(state.width, target) > state.window[b]}
        self.pending.clear()
        status = values.get("seer/window_status") if self._asked else None
        for b in self._asked:
            has_mask, has_end = status[2 * b], status[2 * b + 1]
            if b in extended or state.window.masks.left(b) or has_mask:  # not filled (or it wrote the mask id)
                continue
            if has_end:
                self._checked.add(b)
                continue
            n = state.window[b]
            self.guard_events[b] += 1  # fully decoded, no end token: the answer ran into the cut
            changes.append(Extend(b, max(2 * n, n + 4)) if self.config.guard_mode == "extend" else Redecode(b))
        self._asked = []
        return changes

    @staticmethod
    def _window_status(state: BatchState, rows: list[int]) -> torch.Tensor:
        """bool ``[len(rows), 2]``: (a mask left, an end token) in each of ``rows``' live windows."""
        index = state.row_index(rows)
        width = state.window.longest(rows)
        window = state.tokens[index, :width]
        live = state.window.live_mask(index, width)
        return torch.stack([((window == state.token_ids.mask) & live).any(dim=1),
                            (is_end_token(window, state.token_ids.end_ids) & live).any(dim=1)], 1)

    def report(self, state: BatchState) -> dict:
        return {"seer": {
            "keep_len": list(self.keep_len),
            "boundary": list(self.boundary),
            "final_window": state.window.lengths,
            "guard_events": list(self.guard_events),
            "premature_cuts": list(self.premature),
            "tightened": list(self.tightened),
        }}


class _Probe(LayerHook):
    """Step 0's probe: after the probe layer(s) the MLP sparsity of the window gives each
    request's boundary (``seer_kernels.snr_boundary``) and the windows are cut."""

    def __init__(self, seer: SeerPolicy, state: BatchState) -> None:
        self.seer, self.state = seer, state
        self._sum: torch.Tensor | None = None

    def taps(self, layer: int, taps: Taps) -> None:
        if layer in self.seer.config.layers:
            taps.mlp_sparsity_eps = self.seer.config.eps_for(layer)

    def after(self, layer: int, fwd: Forward, taps: Taps) -> Cut | None:
        seer, state = self.seer, self.state
        s, width, rows = seer.config, state.width, len(fwd.rows)
        if layer not in s.layers:
            return None
        part = taps.mlp_sparsity[:rows, fwd.offset: fwd.offset + width]
        self._sum = part if self._sum is None else self._sum + part
        if layer != max(s.layers):
            return None
        with prange("seer/probe"):
            seer.profile = self._sum / len(s.layers)
            valid = torch.full((rows,), width, dtype=torch.int32, device=state.device)
            # LaViDa-Dream's pre-filled first token is part of the answer
            keep = seer_kernels.snr_boundary(seer.profile, valid, tau_jump=s.tau_jump, gamma=s.gamma,
                                             window=s.window, baseline_window=s.baseline_window,
                                             min_position=max(s.min_position, state.first_masked))
            keep_list = keep.tolist()  # the one host read of L* per generation
        seer.boundary = [k - 1 if k < width else None for k in keep_list]
        seer.confirm_due = s.probe == "both"
        return seer.cut(state, keep_list)
