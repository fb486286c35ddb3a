"""Seer: step-zero end estimation and one-shot truncation of the response window (SPEC.md §1).

At denoising step 0 the engine runs layers ``0..probe_layer`` on the full window, reads the MLP
activation sparsity of the response positions at the probe layer(s) (the fused SwiGLU+sparsity
kernel, through the adapter's tap), finds each request's boundary with the SNR jump-to-plateau
test (``seer_kernels.snr_boundary``), and from the next layer on runs only the first ``L*``
positions: the suffix never runs again and is reported as EOS.

Probes (``SeerConfig.probe``):

* ``"sparsity"`` - the paper's probe, decided inside step 0 after the probe layer;
* ``"eos_prob"`` - the step-0 end-of-answer probability ``P(EOS) + P(end-of-turn)`` from the
  final logits: the first position reaching ``eos_threshold`` ends the answer (costs the rest of
  step 0 on the full window);
* ``"oracle"`` - the lengths in ``oracle_keep_len`` (benchmarks of the serving path on
  random-weight models, which have no answer end to find);
* ``"both"`` - the sparsity cut, then the end-of-step-0 logits of the surviving positions check
  it: when none of them looks like an end (``confirm_threshold``), the cut is premature and the
  window is re-extended to the next sparsity boundary (or the full window) before step 1; when
  an earlier surviving position already ends the answer, the window is tightened to it.

Step schedule after a cut (our rule; the paper sets steps = window length): the configured
tokens-per-step rate is kept. LLaDA family: blocks keep the configured grid, full blocks keep
their steps, a block cut to m positions gets ceil(m x steps_per_block / block_length) steps.
Dream family: ceil(L* x steps / gen_length) steps over the one schedule.

Over-truncation guard (on by default): a request whose surviving window is fully decoded with no
EOS / end-of-turn in it may have lost its tail. ``guard_mode="extend"`` doubles its window (up
to ``gen_length``) with fresh masks and keeps decoding; ``"redecode"`` restarts it on the full
window. Every event is counted per request in ``stats.extra["seer"]``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .layout import PaddedLayout, Taps

PROBES = ("sparsity", "eos_prob", "both", "oracle")


@dataclass(frozen=True)
class SeerConfig:
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
    oracle_keep_len: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        def check(cond, msg):
            if not cond:
                raise ValueError(msg)

        check(isinstance(self.probe_layer, int) and self.probe_layer >= 0,
              f"probe_layer must be >= 0, got {self.probe_layer!r}")
        eps = self.eps if isinstance(self.eps, (tuple, list)) else (self.eps,)
        if isinstance(self.eps, list):
            object.__setattr__(self, "eps", tuple(self.eps))
        check(all(isinstance(e, (int, float)) and math.isfinite(e) and e >= 0 for e in eps),
              f"eps must be finite numbers >= 0, got {self.eps!r}")
        check(self.tau_jump > 0, f"tau_jump must be > 0, got {self.tau_jump!r}")
        check(self.gamma >= 0, f"gamma must be >= 0, got {self.gamma!r}")
        check(isinstance(self.window, int) and self.window >= 1, f"window must be an int >= 1, got {self.window!r}")
        check(self.probe in PROBES, f"probe must be one of {PROBES}, got {self.probe!r}")
        if self.probe_layers is not None:
            object.__setattr__(self, "probe_layers", tuple(int(x) for x in self.probe_layers))
            check(len(self.probe_layers) > 0 and min(self.probe_layers) >= 0,
                  f"probe_layers must be a non-empty tuple of layers >= 0, got {self.probe_layers!r}")
        check(self.baseline_window >= 1, f"baseline_window must be >= 1, got {self.baseline_window!r}")
        check(self.min_position >= 1, f"min_position must be >= 1, got {self.min_position!r}")
        check(0 < self.eos_threshold <= 1, f"eos_threshold must be in (0, 1], got {self.eos_threshold!r}")
        check(self.confirm_threshold is None or 0 < self.confirm_threshold <= 1,
              f"confirm_threshold must be in (0, 1], got {self.confirm_threshold!r}")
        if self.oracle_keep_len is not None:
            object.__setattr__(self, "oracle_keep_len", tuple(int(x) for x in self.oracle_keep_len))
        check((self.probe == "oracle") == (self.oracle_keep_len is not None),
              "probe='oracle' and oracle_keep_len go together")
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

    def to_json(self, path: str | Path, **extra) -> None:
        data = asdict(self)
        for key in ("probe_layers", "eps", "oracle_keep_len"):
            if isinstance(data[key], tuple):
                data[key] = list(data[key])
        with open(path, "w") as f:
            json.dump({**data, **extra}, f, indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> SeerConfig:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, path: str | Path) -> SeerConfig:
        with open(path) as f:
            return cls.from_dict(json.load(f))


def end_probability(logits: torch.Tensor, end_ids: tuple[int, ...]) -> torch.Tensor:
    """``P(EOS) + P(end-of-turn)`` per position, fp32: ``[R, W, V] -> [R, W]``."""
    probs = torch.softmax(logits.float(), dim=-1)
    return sum(probs[..., t] for t in end_ids)


def first_reaching(values: torch.Tensor, threshold: float, live: list[int]) -> list[int | None]:
    """Per row, the first position < live[r] with ``values >= threshold`` (None when none)."""
    hits = values >= threshold
    out = []
    for r, n in enumerate(live):
        idx = hits[r, :n].nonzero()
        out.append(int(idx[0, 0]) if idx.numel() else None)
    return out


class SeerPolicy:
    """Mixed into ``DecodeRun``: the step-0 probe and cut, the confirmation, and the guard."""

    seer: SeerConfig

    def init_seer(self, seer: SeerConfig) -> None:
        self.seer = seer
        bad = [layer for layer in seer.layers if layer >= self.layers] if seer.probe != "oracle" else []
        if bad:
            raise ValueError(f"seer probe layer(s) {bad} out of range: the model has {self.layers} layers")
        self.cut_done = False
        self.keep_len = [self.W] * self.B
        self.boundary: list[int | None] = [None] * self.B
        self.guard_events = [0] * self.B
        self.premature = [0] * self.B
        self.tightened = [0] * self.B
        self.sparsity_profile: torch.Tensor | None = None
        self.step0_end_prob: torch.Tensor | None = None
        self._pending: dict[int, int] = {}

    # -- the cut ---------------------------------------------------------------------------------
    def apply_cut(self, keep: list[int]) -> None:
        for b, n in enumerate(keep):
            n = max(1, min(int(n), self.W))
            self.wlen[b] = n
            self.keep_len[b] = n
            self.plans[b] = self.make_plan(b, n)
        self.cut_done = True

    def _cut_inputs(self, rows, hidden, layout, rope, offset, wmax, cfg):
        hidden = hidden[:, : offset + wmax]
        cos, sin = rope
        rope = (cos[:, : offset + wmax], sin[:, : offset + wmax])
        live = torch.arange(wmax, device=self.device)[None, :] < torch.tensor(
            [self.wlen[r] for r in rows], device=self.device)[:, None]
        lead = layout.key_mask[:, : layout.key_mask.shape[1] - self.W] if layout.key_mask is not None else None
        if lead is None:
            n_lead = self.Lp  # prompt keys (cached or not) come first
            lead = torch.ones(len(rows), n_lead, dtype=torch.bool, device=self.device)
        else:
            lead = lead[: len(rows)]
        key_mask = torch.cat([lead, live], dim=1)
        if cfg:
            key_mask = torch.cat([key_mask, key_mask])
        key_mask = None if bool(key_mask.all()) else key_mask
        return hidden, PaddedLayout(layout.positions[:, : offset + wmax], key_mask), rope

    def _probe_profile(self, rows, step) -> tuple[torch.Tensor, torch.Tensor]:
        """Run step 0 with the sparsity probe; returns (window logits after the cut, profile)."""
        from seer_kernels import snr_boundary

        s = self.seer
        W = self.W
        hidden, layout, prefix, offset = self.window_inputs(rows, W)
        hidden, layout, cfg = self.guidance_inputs(hidden, layout, offset)
        n = len(rows)
        rope = self.model.rope(layout.positions)
        probe_set, last = set(s.layers), max(s.layers)
        acc = None
        positions_full = hidden.shape[0] * hidden.shape[1]
        for i in range(self.layers):
            taps = Taps(mlp_sparsity_eps=s.eps_for(i)) if i in probe_set else None
            hidden = self.run_layer(i, hidden, layout, rope=rope, prefix=prefix, rows=rows, step=step, taps=taps)
            if taps is not None:
                part = taps.mlp_sparsity[:n, offset: offset + W]
                acc = part if acc is None else acc + part
            if i == last:
                profile = acc / len(s.layers)
                valid = torch.full((n,), W, dtype=torch.int32, device=self.device)
                with_first = self.first_mask  # LaViDa-Dream's pre-filled first token is part of the answer
                keep = snr_boundary(profile, valid, tau_jump=s.tau_jump, gamma=s.gamma, window=s.window,
                                    baseline_window=s.baseline_window,
                                    min_position=max(s.min_position, with_first))
                keep_list = keep.tolist()  # one host read per generation (the router removes it)
                for b, k in enumerate(keep_list):
                    self.boundary[b] = k - 1 if k < W else None
                self.apply_cut(keep_list)
                wmax = max(self.wlen[r] for r in rows)
                hidden, layout, rope = self._cut_inputs(rows, hidden, layout, rope, offset, wmax, cfg)
                self.on_cut(rows, offset, wmax)
                self.stats.tokens_computed += positions_full * (last + 1)
                self.cut_positions = hidden.shape[0] * hidden.shape[1]
        self.stats.tokens_computed += self.cut_positions * (self.layers - last - 1)
        for r in rows:
            own_prompt = self.prompt_real[r] if offset else 0
            self.per_request_tokens[r] += (own_prompt + W) * (last + 1) + (own_prompt + self.wlen[r]) * (
                self.layers - last - 1)
        logits = self.window_logits(hidden, offset, max(self.wlen[r] for r in rows))
        self.stats.nfe += 1
        return self.combine_guidance(logits, cfg), profile

    def forward(self, rows, step):
        if step != 0 or self.cut_done:
            return super().forward(rows, step)
        s = self.seer
        if s.probe == "oracle":
            if len(s.oracle_keep_len) != self.B:
                raise ValueError(f"oracle_keep_len has {len(s.oracle_keep_len)} lengths for {self.B} requests")
            self.apply_cut(list(s.oracle_keep_len))
            for b, k in enumerate(s.oracle_keep_len):
                self.boundary[b] = k - 1 if k < self.W else None
            return super().forward(rows, step)
        if s.probe == "eos_prob":
            logits = super().forward(rows, step)
            p_end = end_probability(logits, self.ids.end_ids)
            self.step0_end_prob = p_end
            keep = []
            for b, j in enumerate(first_reaching(p_end, s.eos_threshold, [self.W] * len(rows))):
                j = max(j, self.first_mask) if j is not None else None
                self.boundary[b] = j
                keep.append(self.W if j is None else j + 1)
            self.apply_cut(keep)
            return logits[:, : max(self.wlen)]
        logits, profile = self._probe_profile(rows, step)
        self.sparsity_profile = profile
        if s.probe == "both":
            self._confirm(rows, logits, profile)
        return logits

    def _confirm(self, rows, logits, profile) -> None:
        """``both``: check each cut with the end probability of its surviving positions."""
        from seer_kernels import snr_boundary

        s = self.seer
        threshold = s.confirm_threshold if s.confirm_threshold is not None else s.eos_threshold
        p_end = end_probability(logits, self.ids.end_ids)
        self.step0_end_prob = p_end
        hits = first_reaching(p_end, threshold, [self.wlen[r] for r in rows])
        for local, b in enumerate(rows):
            if self.wlen[b] >= self.W:
                continue
            j = hits[local]
            if j is None:
                # premature: re-extend to the next sparsity boundary after this one (or the end)
                nxt = snr_boundary(profile[local: local + 1], torch.tensor([self.W], device=self.device),
                                   tau_jump=s.tau_jump, gamma=s.gamma, window=s.window,
                                   baseline_window=s.baseline_window, min_position=self.wlen[b]).tolist()[0]
                self.premature[b] += 1
                self._pending[b] = nxt
            elif j + 1 < self.wlen[b]:
                # an earlier surviving position already ends the answer: tighten to it
                self.tightened[b] += 1
                self.wlen[b] = self.keep_len[b] = max(j + 1, self.first_mask + 1)
                self.plans[b] = self.make_plan(b, self.wlen[b])
                self.boundary[b] = j

    # -- extension and guard ---------------------------------------------------------------------
    def extend(self, b: int, new_len: int, step: int) -> None:
        """Give request ``b`` the masked positions ``[wlen, new_len)`` from step ``step + 1`` on."""
        old = self.wlen[b]
        new_len = min(self.W, new_len)
        if new_len <= old:
            return
        self.wlen[b] = new_len
        plan = self.plans[b]
        if self.model.family == "dream":
            # one global schedule: re-plan every mask left (Dream's last step commits all of them)
            from .engine import dream_plan

            masks = int((self.x[b, :new_len] == self.ids.mask).sum())
            self.plans[b] = plan.keep_first(step + 1).then(
                dream_plan(new_len, self.gen, self.flavor, masks=masks, positions=masks))
            return
        region = self.make_plan(b, new_len, start=old)
        if not bool((self.x[b, :old] == self.ids.mask).any()):
            plan = plan.keep_first(step + 1)  # the old window is done: drop its idle remaining steps
        self.plans[b] = plan.then(region)

    def redecode(self, b: int, step: int) -> None:
        self.x[b, self.first_mask:] = self.ids.mask
        self.wlen[b] = self.W
        self.plans[b] = self.plans[b].keep_first(step + 1).then(self.make_plan(b, self.W))

    def step(self, step: int) -> bool:
        more = super().step(step)
        for b, target in list(self._pending.items()):
            self.extend(b, target, step)
        self._pending.clear()
        if self.seer.guard and self.cut_done:
            for b in range(self.B):
                n = self.wlen[b]
                if n >= self.W:
                    continue
                window = self.x[b, :n]
                if bool((window == self.ids.mask).any()):
                    continue
                if any(bool((window == t).any()) for t in self.ids.end_ids):
                    continue
                self.guard_events[b] += 1  # fully decoded, no end token: the answer ran into the cut
                if self.seer.guard_mode == "extend":
                    self.extend(b, max(2 * n, n + 4), step)
                else:
                    self.redecode(b, step)
                more = True
        return more or any(step + 1 < p.steps for p in self.plans)

    def seer_stats(self) -> dict:
        return {
            "keep_len": list(self.keep_len),
            "boundary": list(self.boundary),
            "final_window": list(self.wlen),
            "guard_events": list(self.guard_events),
            "premature_cuts": list(self.premature),
            "tightened": list(self.tightened),
        }
