"""DyLLM: saliency-based token selection, cached FFN reuse and partial attention (SPEC.md §2).

The algorithm (per request, per layer ``l``, per denoising step ``t``):

* **Warm-up** - the first ``full_steps`` steps compute everything, exactly as the baseline
  engine does (the same sub-steps in the same order: the logits are bitwise the baseline's),
  and fill per-layer caches of the rotated keys K, the values V, the attention context C
  (``softmax(QK^T)V`` over all heads, before the output projection, heads concatenated) and
  the FFN output (the output of the down projection, before the residual add).
* **Sparse steps** - layer ``l`` is gated by a set ``A`` of positions: at ``l = 0`` the
  positions committed in the previous step (every fed position when ``tau > 1``), at
  ``l > 0`` the set found at ``l - 1``. K/V are projected only for the rows in ``A`` and
  merged into the cache (``dV = V_new[A] - V_old[A]``); Q for every fed row. Query rows in
  ``A`` get exact attention; the others a partial attention (``seer_kernels.partial_attention``)
  from their cached context and the columns of ``A`` only, with ``P`` the exact softmax over
  **all** keys: the paper's ``C = C_cache + P[:, A] @ dV`` (``key_correction=False``) or, the
  default, the same update corrected for the change of ``A``'s keys (below); or exact
  attention for every fed row (``approx_attention=False``). The new salient set is
  ``A' = {i : cos(C_i, C_cache_i) < tau}`` (strict, ``seer_kernels.cosine_saliency``). The
  output projection and the residual run for every fed row; the FFN (ffn_norm, gate/up,
  down) only for the rows in ``A'`` (gathered with ``gather_rows``), the other rows add their
  cached FFN output; the C cache takes the new context of every fed row and the FFN cache
  the new outputs (``scatter_rows``). ``A'`` gates layer ``l + 1``.

What is exact and what is approximated: a warm-up step is the baseline. In a sparse step
the K/V of rows outside ``A`` are the cached ones (computed from an older hidden state), the
context of a non-salient query row is approximated (below), and rows outside ``A'`` reuse an
older FFN output. With
``tau > 1`` every row is salient at every layer (the initial set included), so a sparse step
computes exactly what a dense step computes (up to the summation order of the attention reference) and, with
``prompt_period = 1``, the output equals the baseline token for token.

Response-only steps (no prefix cache): on sparse steps with ``t % prompt_period != 0`` only
the response window is fed; the prompt's K/V come from the per-layer cache and the prompt
rows keep their cached C and FFN output, so their hidden states - in particular the final
state of the last prompt position, which the Dream family reads to predict window position
0 - are those of the last step that fed them (kept in a small cache). Every
``prompt_period``-th step the prompt rows are fed too, still saliency-gated (the gating set
of layer 0 holds only the window's committed positions, so prompt rows keep their cached K/V
at layer 0 and recompute their FFN only when their context moved). There is never a full
recompute after warm-up.

Composition. The prefix KV cache (LaViDa): the prompt is never fed, its K/V come from the
``PrefixKV``; DyLLM's caches cover the window only. Seer: its step 0 is a warm-up step;
``on_cut`` slices the caches to the shorter windows and later steps run on them. The PWR
router (``routed.py``) keeps DyLLM on the padded layout and runs one forward per group of a
step; each forward is planned on its own (a window padded to its group's bucket, past every
live position, caches only the live part). Batches: caches are per request, addressed by the
global request index, so requests can leave the forward when they are done; each forward
packs its real rows back to back (left padding of the prompt and dead window positions past a
request's own window length are excluded from the queries and from the keys) with index maps
built once per forward.

The attention of the rows outside the gating set, three first-class modes
(``DyLLMConfig.attention_mode``):

* ``"paper"`` (``key_correction=False``): ``C = C_cache + P[:, A] @ dV``. This accounts for
  the change of ``A``'s values but not of their keys: ``P_new V_new - P_old V_old =
  P_new[:, A] dV + (P_new - P_old) V_old``, and the paper drops the second term. When a
  masked position is committed its key changes as much as its value, so on the embedded demo
  model this changes 92 of 288 held-out answers (exact match 0.583 vs the baseline's 0.819).
* ``"partial"`` (the default): the same columns, with the key change accounted for. With the
  row's current query, ``C_cache`` is taken apart into the unchanged keys' part and ``A``'s old
  part (their old keys, the cached ones before the update, and old values ``V - dV``), ``A``'s
  part is swapped for the new one and the row renormalised (``seer_kernels.partial_attention``
  with ``k_old``). It is exact when the row's query, the keys and values outside ``A`` and
  ``A``'s cached keys and values are the ones ``C_cache`` was computed with (a prompt row's
  context, refreshed only every ``prompt_period`` steps, is older than that), reduces to the
  paper's update when ``A``'s keys did not change, and costs ``O(N |A| d)`` like it (scores
  against the old keys and one more ``P[:, A]`` product). Where ``A``'s old keys held more than
  half of a row's attention the split is ill-conditioned and the row takes the paper's update
  (so every row of a request whose keys are all in ``A`` does). On the previous embedded model
  (0.832 held out): 17 of 288 answers changed, exact match 0.819 (the baseline's); on the
  current one `seer calibrate-dyllm` finds no change at tau 0.98-0.995 on 128 requests.
* ``"exact"`` (``approx_attention=False``): exact attention for every fed row (previous
  model: 13 changed, 0.830).

The partial attentions save only the ``P @ V`` half of the non-salient rows' attention
(``QK^T`` over every key is needed for the softmax normaliser either way), which at LLaDA-8B
shapes (d_model 4096, FFN 12288, 10% salient rows) is 2% (300 keys) to 9% (1200 keys) of a
sparse step's multiply-accumulates, but their error feeds the saliency test downstream (more
rows turn salient). As for Seer, a checkpoint can get its own choice:
:func:`seer_runtime.calibrate_dyllm.calibrate_dyllm` (``seer calibrate-dyllm``) measures tau
and the attention mode on requests with their baseline answers and writes the cheapest
configuration that keeps the accuracy within a tolerance; the embedded model ships its
choice (``model_adapters/embedded/dyllm_config.json``).

Where the sparse step's attention runs: through ``seer_kernels.partial_attention`` (or
``varlen_attention`` for exact attention) on every device: the Triton kernels where
``seer_kernels.use_triton`` says (CUDA, the interpreter), their torch references otherwise
(``partial_attention_reference`` pads all requests of the forward at once).

Choices where the papers are silent (ours, documented here):

* The step index ``t`` of the warm-up and period rules is the engine's step (steps are
  shared by the batch); the prompt is fed on steps with ``t % prompt_period == 0``.
* A forward runs dense when any of its requests is not warm: fewer than ``full_steps`` dense
  forwards so far, or a window longer than its caches (Seer's over-truncation guard extends
  or re-decodes a window): one dense forward rebuilds the caches.
* The initial set of a sparse step is the set of positions committed since the request's
  previous forward (DyLLM's code: the last decoded positions), never the prompt.
* The C cache is overwritten with the new context of every fed row (exact or approximated),
  as DyLLM's code does: the test compares consecutive steps, not a row's last salient step.
* Classifier-free guidance is not supported (``cfg_scale`` must be 0).
* K/V are projected for the gating set only when the block exposes ``project_q`` and
  ``project_kv``; blocks that expose only ``project_qkv`` project K/V for every fed row and
  keep the gating set's (same result, less saving). The rotation and the dense attention of
  a warm-up step mirror ``model_adapters.common`` (``seer_runtime`` does not import the model
  layer); ``tests/dyllm`` checks that a warm-up layer equals ``model.layer`` bitwise.

Statistics (``stats.extra["dyllm"]``): one record per forward (mode, fed rows, per layer the
gating and salient counts, exact vs approximated attention rows, FFN rows computed and
skipped, tokens computed = positions whose K/V or FFN were computed, and the ideal
multiply-accumulate count against the dense forward of the same rows), and totals with the
ideal FLOP ratio.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from .layout import PaddedLayout, PrefixKV, Taps

#: tau when ``DyLLMConfig.tau`` is None, per model family (the paper's defaults)
DEFAULT_TAU = {"llada": 0.99, "dream": 0.995}


@dataclass(frozen=True)
class DyLLMConfig:
    """DyLLM's settings; validated on construction. See the module docstring.

    tau: cosine-similarity threshold, a row is salient when ``cos < tau``; None -> the family
        default (0.99 LLaDA, MMaDA, LaViDa-LLaDA; 0.995 Dream, LaViDa-Dream). ``tau > 1``
        makes every row salient (sparse steps then compute what dense steps compute).
    full_steps: warm-up steps computed in full (>= 1: the caches must be filled first).
    prompt_period: without a prefix cache, the prompt is fed on steps ``t`` with
        ``t % prompt_period == 0`` and only the window on the others (1: always fed).
    approx_attention: True (the default) approximates the rows outside the gating set from
        their cached context and the salient columns only (``partial_attention``; the paper's
        update together with ``key_correction=False``);
        False gives every fed query row exact attention (see the module docstring;
        ``seer calibrate-dyllm`` chooses per checkpoint).
    key_correction: with ``approx_attention``, True (the default) also accounts for the change
        of the salient rows' keys (``partial_attention(..., k_old=...)``; see the module
        docstring for when it is exact); False is the paper's ``C_cache + P[:, A] @ dV``
        verbatim, which accounts for the change of their values only. A JSON file without this
        field but with a ``calibration`` record (``seer calibrate-dyllm`` before the field
        existed) measured the paper's update, so it loads with False.
    """

    tau: float | None = None
    full_steps: int = 4
    prompt_period: int = 4
    approx_attention: bool = True
    key_correction: bool = True

    def __post_init__(self) -> None:
        if self.tau is not None:
            if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)):
                raise TypeError(f"tau must be a real number or None, got {type(self.tau).__name__}")
            if not math.isfinite(self.tau) or self.tau <= 0:
                raise ValueError(f"tau must be a finite number > 0 (a cosine-similarity threshold), got {self.tau!r}")
            object.__setattr__(self, "tau", float(self.tau))
        for name in ("full_steps", "prompt_period"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("approx_attention", "key_correction"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")

    @property
    def attention_mode(self) -> str:
        """``"partial"`` (key-corrected partial attention), ``"paper"`` (the paper's partial
        attention verbatim) or ``"exact"``."""
        if not self.approx_attention:
            return "exact"
        return "partial" if self.key_correction else "paper"

    def tau_for(self, family: str) -> float:
        """The threshold in force for a model ``family`` ("llada" or "dream")."""
        if self.tau is not None:
            return self.tau
        if family not in DEFAULT_TAU:
            raise ValueError(f"no default tau for model family {family!r}; set tau explicitly")
        return DEFAULT_TAU[family]

    @classmethod
    def for_model(cls, model, **changes) -> DyLLMConfig:
        """The defaults for ``model`` with its family's tau filled in (``changes`` override)."""
        family = getattr(model, "family", None)
        if family not in DEFAULT_TAU:
            raise ValueError(f"model family {family!r} has no DyLLM default (known: {sorted(DEFAULT_TAU)})")
        return cls(**{"tau": DEFAULT_TAU[family], **changes})

    def replace(self, **changes) -> DyLLMConfig:
        return type(self)(**{**asdict(self), **changes})

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, path: str | Path, **extra) -> None:
        """Write the fields (and ``extra`` keys beside them, e.g. ``calibration=``) as JSON."""
        clash = sorted(set(extra) & {f.name for f in fields(self)})
        if clash:
            raise ValueError(f"extra keys {clash} would overwrite DyLLMConfig fields; use replace() instead")
        with open(path, "w") as f:
            json.dump({**self.to_dict(), **extra}, f, indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> DyLLMConfig:
        """The fields of ``data``; a ``calibration`` record (``seer calibrate-dyllm``) is skipped,
        any other unknown key is an error. A calibrated record without ``key_correction`` was
        written before that field existed and measured the paper's update: it loads with False."""
        if not isinstance(data, dict):
            raise TypeError(f"a DyLLMConfig must be read from a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        if "calibration" in data and "key_correction" not in data:  # calibrated before the field existed
            data = {**data, "key_correction": False}
        data = {k: v for k, v in data.items() if k != "calibration"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown DyLLMConfig fields: {unknown}")
        return cls(**data)

    @classmethod
    def from_json(cls, path: str | Path) -> DyLLMConfig:
        with open(path) as f:
            return cls.from_dict(json.load(f))


# ------------------------------------------------------------------------------------ per forward
@dataclass
class _Forward:
    """One forward's plan; the sparse fields (packed index maps) are built once per forward."""

    rows: list[int]
    idx: torch.Tensor
    step: int | None
    mode: str  # "full" (warm-up / rebuild), "prompt" (sparse, prompt fed) or "response" (sparse, window only)
    offset: int = 0  # fed prompt positions before the window
    # sparse: packed query rows (real fed rows, row-major)
    tq: int = 0
    q_src: torch.Tensor | None = None  # int64 [Tq]: flat index into the fed hidden [R * Lq]
    q_row: torch.Tensor | None = None  # int64 [Tq]: local row of each query
    q_cache: torch.Tensor | None = None  # int64 [Tq]: flat index into a cache [B * Lc]
    q_pk: torch.Tensor | None = None  # int64 [Tq]: packed key row of each query's own key
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    cu_q: torch.Tensor | None = None
    cu_k: torch.Tensor | None = None
    max_q: int = 0
    max_k: int = 0
    tk: int = 0
    kc_src: torch.Tensor | None = None  # cache keys: flat cache index -> packed key row kc_dst
    kc_dst: torch.Tensor | None = None
    kp_row: torch.Tensor | None = None  # prefix keys (row, position) -> packed key row kp_dst
    kp_pos: torch.Tensor | None = None
    kp_dst: torch.Tensor | None = None
    gate: torch.Tensor | None = None  # int64 ascending packed query rows: the current gating set
    nq_r: torch.Tensor | None = None  # float64 [R] real fed rows per request
    nk_r: torch.Tensor | None = None  # float64 [R] keys per request
    record: dict = field(default_factory=dict)


class DyLLMPolicy:
    """Mixed into ``DecodeRun`` (after ``SeerPolicy``): saliency-gated sparse steps.

    Overrides ``forward`` (to learn the step), ``window_inputs`` (chooses the mode and feeds
    the window alone on response-only steps), ``run_layer`` (the warm-up and sparse layers),
    ``on_cut`` (slices the caches), ``window_logits`` (closes the forward's bookkeeping) and
    ``output`` (adds ``stats.extra["dyllm"]``).
    """

    dyllm: DyLLMConfig

    def init_dyllm(self, cfg: DyLLMConfig) -> None:
        if not isinstance(cfg, DyLLMConfig):
            raise TypeError(f"dyllm must be a DyLLMConfig, got {type(cfg).__name__}")
        if self.gen.cfg_scale > 0:
            raise ValueError(f"cfg_scale: DyLLM does not support classifier-free guidance (cfg_scale="
                             f"{self.gen.cfg_scale}); use cfg_scale=0 with dyllm")
        if not hasattr(self.model, "block"):
            raise TypeError(f"{type(self.model).__name__} does not expose block(i) (the sub-steps DyLLM runs)")
        self.dyllm = cfg
        self.tau = cfg.tau_for(self.model.family)
        self._dy_pre = 0 if self.use_cache else self.Lp  # prompt positions held in DyLLM's caches
        self._dy_cap = self.W  # window positions held in DyLLM's caches
        n = self.layers
        self._dy_k: list[torch.Tensor | None] = [None] * n
        self._dy_v: list[torch.Tensor | None] = [None] * n
        self._dy_c: list[torch.Tensor | None] = [None] * n
        self._dy_f: list[torch.Tensor | None] = [None] * n
        self._dy_full_done = [0] * self.B
        self._dy_valid = [0] * self.B  # window positions covered by valid caches, per request
        self._dy_snap = self.x.clone()  # the window at each request's previous forward
        self._dy_last: torch.Tensor | None = None  # Dream, no prefix cache: last prompt position's final state
        self._dy_step: int | None = None
        self._dy_fw: _Forward | None = None
        self._dy_dims: dict[str, int] | None = None
        self._dy_records: list[dict] = []

    # -- engine fixed points -------------------------------------------------------------------
    def forward(self, rows, step, **kw):
        self._dy_step = step
        return super().forward(rows, step, **kw)

    def window_inputs(self, rows: list[int], wmax: int):
        step, self._dy_step = self._dy_step, None  # None: a forward the engine did not announce (Seer's step 0)
        self._dy_fit(max(self.wlen))
        cfg = self.dyllm
        idx = torch.tensor(rows, device=self.device)
        cold = any(self._dy_full_done[b] < cfg.full_steps or self._dy_valid[b] < self.wlen[b] for b in rows)
        if step is None or cold:
            hidden, layout, prefix, offset = super().window_inputs(rows, wmax)
            self._dy_fw = _Forward(rows, idx, step, "full", offset)
            return hidden, layout, prefix, offset
        if self.use_cache or step % cfg.prompt_period == 0:
            hidden, layout, prefix, offset = super().window_inputs(rows, wmax)
            mode = "prompt" if offset else "response"
        else:
            mode = "response"
            live = self._live(rows, wmax)
            hidden = self.model.embed(self.x[idx, :wmax])
            layout = PaddedLayout(self.positions[idx, self.Lp: self.Lp + wmax], None if bool(live.all()) else live)
            prefix, offset = None, 0
        fw = _Forward(rows, idx, step, mode, offset)
        self._dy_plan(fw, wmax, layout, prefix)
        self._dy_fw = fw
        return hidden, layout, prefix, offset

    def run_layer(self, i, hidden, layout, *, rope, prefix, rows: list[int], step: int, taps=None):
        fw = self._dy_fw
        if fw is None:  # outside a forward this policy planned: the plain layer, no caching
            return super().run_layer(i, hidden, layout, rope=rope, prefix=prefix, rows=rows, step=step, taps=taps)
        if fw.step is None:
            fw.step = step
        if fw.mode == "full":
            return self._dy_full_layer(i, hidden, layout, rope, prefix, taps, fw)
        if taps is not None:
            raise ValueError("taps cannot be served on a DyLLM sparse step (only the salient rows are computed)")
        return self._dy_sparse_layer(i, hidden, prefix, fw)

    def on_cut(self, rows: list[int], offset: int, new_wmax: int) -> None:
        super().on_cut(rows, offset, new_wmax)
        self._dy_fit(max(self.wlen))

    def window_logits(self, hidden, offset: int, wmax: int) -> torch.Tensor:
        fw = self._dy_fw
        if fw is None:
            return super().window_logits(hidden, offset, wmax)
        self._dy_fw = None
        if self.shift and not self.use_cache and offset > 0:
            if self._dy_last is None:
                self._dy_last = hidden.new_zeros(self.B, hidden.shape[-1])
            self._dy_last[fw.idx] = hidden[: len(fw.rows), offset - 1]
        self._dy_finish(fw)
        if fw.mode == "response" and self.shift and not self.use_cache:
            # the state that predicts window position 0 is the last prompt position's, not fed this step
            last = self._dy_last[fw.idx].to(hidden.dtype)
            return self.model.head(torch.cat([last[:, None], hidden[:, : wmax - 1]], dim=1))
        return super().window_logits(hidden, offset, wmax)

    def output(self):
        out = super().output()
        out.stats.extra["dyllm"] = self.dyllm_stats()
        return out

    # -- caches --------------------------------------------------------------------------------
    def _live(self, rows: list[int], wmax: int) -> torch.Tensor:
        return torch.arange(wmax, device=self.device)[None, :] < torch.tensor(
            [self.wlen[r] for r in rows], device=self.device)[:, None]

    def _dy_fit(self, cap: int) -> None:
        """Resize every cache to ``cap`` window positions (Seer's cut shrinks, its guard grows)."""
        if cap == self._dy_cap:
            return
        keep = self._dy_pre + min(cap, self._dy_cap)
        for caches in (self._dy_k, self._dy_v, self._dy_c, self._dy_f):
            for i, t in enumerate(caches):
                if t is None:
                    continue
                new = t.new_zeros((t.shape[0], self._dy_pre + cap, *t.shape[2:]))
                new[:, :keep] = t[:, :keep]
                caches[i] = new
        self._dy_cap = cap
        self._dy_valid = [min(v, cap) for v in self._dy_valid]

    def _dy_alloc(self, caches: list, i: int, like: torch.Tensor) -> torch.Tensor:
        if caches[i] is None:
            caches[i] = like.new_zeros((self.B, self._dy_pre + self._dy_cap, *like.shape[2:]))
        return caches[i]

    # -- the warm-up layer ---------------------------------------------------------------------
    def _dy_full_layer(self, i, hidden, layout, rope, prefix: PrefixKV | None, taps: Taps | None, fw: _Forward):
        """One block computed in full (``block_forward``'s sub-steps), filling layer ``i``'s caches."""
        if not isinstance(layout, PaddedLayout):
            raise TypeError("DyLLM drives padded layouts only")
        blk = self.model.block(i)
        cos, sin = rope
        x_n = blk.attn_norm(hidden)
        q, k, v = blk.project_qkv(x_n)
        q = self.model.apply_rope(q, cos, sin)
        k = self.model.apply_rope(k, cos, sin)
        if taps is not None and taps.keep_kv:
            taps.kv = (k, v)
        pk = pv = None
        if prefix is not None:
            pk, pv = prefix.keys[i].transpose(1, 2), prefix.values[i].transpose(1, 2)
        ctx = self.model.attend(q, k, v, layout, prefix_k=pk, prefix_v=pv)
        ctx = ctx.reshape(*ctx.shape[:-2], -1)
        if taps is not None and taps.keep_attn_ctx:
            taps.attn_ctx = ctx
        hidden = hidden + blk.project_out(ctx)
        gate, up = blk.mlp_gate_up(blk.ffn_norm(hidden))
        ffn = blk.mlp_down(self.model.swiglu(gate, up, taps))
        if self._dy_dims is None:
            self._dy_dims = {"D": hidden.shape[-1], "Hd": ctx.shape[-1], "Hkd": k.shape[-2] * k.shape[-1],
                             "I": gate.shape[-1]}
        # full forwards feed [prompt | window] (no prefix cache) or the window: cache coordinates.
        # A window padded past every live position (the router's buckets) keeps only the live part.
        n = len(fw.rows)
        length = min(hidden.shape[1], self._dy_pre + self._dy_cap)
        for caches, val in ((self._dy_k, k), (self._dy_v, v), (self._dy_c, ctx), (self._dy_f, ffn)):
            self._dy_alloc(caches, i, val)[fw.idx, :length] = val[:n, :length]
        return hidden + ffn

    # -- the sparse layer ----------------------------------------------------------------------
    def _dy_plan(self, fw: _Forward, wmax: int, layout: PaddedLayout, prefix: PrefixKV | None) -> None:
        """Index maps of a sparse forward: real fed rows packed, keys packed per request."""
        dev = self.device
        R = len(fw.rows)
        idx = fw.idx
        pre, lc = self._dy_pre, self._dy_pre + self._dy_cap
        live = self._live(fw.rows, wmax)
        pmask = None
        if pre or fw.offset:
            pmask = (self.prompt_mask[idx] if self.prompt_mask is not None
                     else torch.ones(R, self.Lp, dtype=torch.bool, device=dev))
        fed = torch.cat([pmask, live], dim=1) if fw.offset else live  # [R, Lq]
        lq = fed.shape[1]
        shift = pre - fw.offset  # cache coordinate of fed coordinate p is p + shift
        kc = torch.cat([pmask, live], dim=1) if pre else live  # real cache keys, coordinates [0, pre + wmax)
        lk = kc.shape[1]
        if prefix is not None:
            kp = prefix.key_mask if prefix.key_mask is not None else torch.ones(
                R, prefix.length, dtype=torch.bool, device=dev)
            np_r = kp.sum(1)
        else:
            kp, np_r = None, torch.zeros(R, dtype=torch.long, device=dev)
        nk_r = np_r + kc.sum(1)
        nq_r = fed.sum(1)
        zero = torch.zeros(1, dtype=torch.long, device=dev)
        cu_k = torch.cat([zero, nk_r.cumsum(0)])
        cu_q = torch.cat([zero, nq_r.cumsum(0)])
        pk_map = cu_k[:-1, None] + np_r[:, None] + kc.long().cumsum(1) - 1  # [R, lk] packed key row
        q_src = fed.reshape(-1).nonzero().squeeze(1)
        q_row, q_pos = q_src // lq, q_src % lq
        fw.q_src, fw.q_row = q_src, q_row
        fw.q_cache = idx[q_row] * lc + q_pos + shift
        fw.q_pk = pk_map[q_row, q_pos + shift]
        fw.tq = int(q_src.numel())
        kc_flat = kc.reshape(-1).nonzero().squeeze(1)
        kr, kj = kc_flat // lk, kc_flat % lk
        fw.kc_src = idx[kr] * lc + kj
        fw.kc_dst = pk_map[kr, kj]
        if kp is not None:
            kp_flat = kp.reshape(-1).nonzero().squeeze(1)
            fw.kp_row, fw.kp_pos = kp_flat // kp.shape[1], kp_flat % kp.shape[1]
            fw.kp_dst = cu_k[fw.kp_row] + kp.long().cumsum(1)[fw.kp_row, fw.kp_pos] - 1
        fw.cu_q, fw.cu_k = cu_q.to(torch.int32), cu_k.to(torch.int32)
        fw.max_q, fw.max_k = int(nq_r.max()), int(nk_r.max())
        fw.tk = int(cu_k[-1])
        fw.nq_r, fw.nk_r = nq_r.double(), nk_r.double()
        fw.cos, fw.sin = self.model.rope(layout.positions.reshape(-1)[q_src])
        # layer 0's gating set: the positions committed since the request's previous forward
        if self.tau > 1:
            fw.gate = torch.arange(fw.tq, device=dev)
        else:
            qmap = torch.full((R * lq,), -1, dtype=torch.long, device=dev)
            qmap[q_src] = torch.arange(fw.tq, device=dev)
            win = self.x[idx, :wmax]
            committed = (self._dy_snap[idx, :wmax] == self.ids.mask) & (win != self.ids.mask) & live
            fw.gate = qmap.view(R, lq)[:, fw.offset:][committed]
        fw.record = {"fed": fw.tq, "gating": [], "salient": [], "union": [], "macs": 0.0}

    def _pack(self, cache: torch.Tensor, pre: torch.Tensor | None, fw: _Forward) -> torch.Tensor:
        """Keys (or values) of the forward packed per request: ``[prefix keys, cache keys]``."""
        part = cache.view(-1, *cache.shape[2:]).index_select(0, fw.kc_src)
        if pre is None:
            return part  # no prefix: the cache keys are the packed keys, in order
        out = part.new_empty((fw.tk, *part.shape[1:]))
        out.index_copy_(0, fw.kc_dst, part)
        out.index_copy_(0, fw.kp_dst, pre[fw.kp_row, :, fw.kp_pos])
        return out

    def _dy_sparse_layer(self, i, hidden, prefix: PrefixKV | None, fw: _Forward):
        from seer_kernels import (
            cosine_saliency,
            gather_rows,
            partial_attention,
            scatter_rows,
            varlen_attention,
        )

        blk = self.model.block(i)
        R, lq, D = hidden.shape
        tq = fw.tq
        gate = fw.gate
        n_a = int(gate.numel())
        # whole-forward maps are plain index ops; the saliency-gated rows go through gather/scatter_rows
        hq = hidden.reshape(R * lq, D).index_select(0, fw.q_src)
        x_n = blk.attn_norm(hq)
        project_q, project_kv = getattr(blk, "project_q", None), getattr(blk, "project_kv", None)
        if project_q is not None and project_kv is not None:
            q = project_q(x_n)
            k_a, v_a = project_kv(gather_rows(x_n, gate, n_a))
        else:  # the block projects Q, K and V together: keep the gating set's K/V
            q, k_all, v_all = blk.project_qkv(x_n)
            k_a, v_a = gather_rows(k_all, gate, n_a), gather_rows(v_all, gate, n_a)
        q = self.model.apply_rope(q, fw.cos, fw.sin)
        k_a = self.model.apply_rope(k_a, fw.cos.index_select(0, gate), fw.sin.index_select(0, gate))
        kc = self._dy_k[i].view(-1, *self._dy_k[i].shape[2:])
        vc = self._dy_v[i].view(-1, *self._dy_v[i].shape[2:])
        at = fw.q_cache.index_select(0, gate)
        dv = v_a - gather_rows(vc, at, n_a)
        # the salient rows' keys before the update (the key-corrected partial attention)
        k_old = gather_rows(kc, at, n_a) if self.dyllm.attention_mode == "partial" else None
        scatter_rows(kc, at, n_a, k_a)
        scatter_rows(vc, at, n_a, v_a)
        pre_k = pre_v = None
        if prefix is not None:
            pre_k, pre_v = prefix.keys[i], prefix.values[i]
        keys, values = self._pack(self._dy_k[i], pre_k, fw), self._pack(self._dy_v[i], pre_v, fw)
        cc = self._dy_c[i].view(-1, self._dy_c[i].shape[-1])
        ctx_old = cc.index_select(0, fw.q_cache)  # [Tq, H*d]
        heads, d = q.shape[1], q.shape[2]
        if self.dyllm.approx_attention:
            exact = torch.zeros(tq, dtype=torch.bool, device=self.device)
            exact[gate] = True
            key_rows = fw.q_pk.index_select(0, gate)
            ctx = partial_attention(q, keys, values, ctx_old.view(tq, heads, d), dv, fw.cu_q, fw.cu_k,
                                    fw.max_q, fw.max_k, exact, key_rows.to(torch.int32), n_a, k_old=k_old)
        else:
            exact = torch.ones(tq, dtype=torch.bool, device=self.device)
            ctx = varlen_attention(q, keys, values, fw.cu_q, fw.cu_k, fw.max_q, fw.max_k)
        ctx = ctx.reshape(tq, heads * d)
        index, count, _ = cosine_saliency(ctx, ctx_old, self.tau)
        n_b = int(count)
        sal = index[:n_b].long()
        cc.index_copy_(0, fw.q_cache, ctx)
        hq = hq + blk.project_out(ctx)
        fc = self._dy_f[i].view(-1, self._dy_f[i].shape[-1])
        if n_b:
            gate_up = blk.mlp_gate_up(blk.ffn_norm(gather_rows(hq, sal, n_b)))
            scatter_rows(fc, fw.q_cache.index_select(0, sal), n_b, blk.mlp_down(F.silu(gate_up[0]) * gate_up[1]))
        hq = hq + fc.index_select(0, fw.q_cache)
        out = hidden.clone(memory_format=torch.contiguous_format)  # pad rows pass through unchanged
        out.view(R * lq, D).index_copy_(0, fw.q_src, hq)
        self._dy_account(fw, gate, sal, exact)
        fw.gate = sal
        return out

    # -- statistics ----------------------------------------------------------------------------
    def _dense_macs(self, rows: list[int]) -> float:
        """Multiply-accumulates of one dense layer over ``rows`` as the baseline engine feeds them."""
        d = self._dy_dims
        per_row = d["D"] * d["Hd"] * 2 + 2 * d["D"] * d["Hkd"] + 3 * d["D"] * d["I"]
        total = 0.0
        for b in rows:
            nk = self.prompt_real[b] + self.wlen[b]
            n = self.wlen[b] if self.use_cache else nk
            total += n * per_row + 2.0 * n * nk * d["Hd"]
        return total

    def _dy_account(self, fw: _Forward, gate: torch.Tensor, sal: torch.Tensor, exact: torch.Tensor) -> None:
        d = self._dy_dims
        R = len(fw.rows)
        a_r = torch.bincount(fw.q_row.index_select(0, gate), minlength=R).double()
        b_r = torch.bincount(fw.q_row.index_select(0, sal), minlength=R).double()
        e_r = torch.bincount(fw.q_row[exact], minlength=R).double()
        nq, nk = fw.nq_r, fw.nk_r
        approx_cost = 3 if self.dyllm.attention_mode == "partial" else 1
        macs = (nq * (2 * d["D"] * d["Hd"]) + a_r * (2 * d["D"] * d["Hkd"]) + b_r * (3 * d["D"] * d["I"])
                + nq * nk * d["Hd"]  # QK^T: every (query, key) pair, the softmax normaliser needs them all
                + (e_r * nk + (nq - e_r) * a_r * approx_cost) * d["Hd"])  # P @ V for exact rows, P[:, A] @ dV
        # for the others (the key correction adds their scores against A's old keys and a P[:, A] @ V_old)
        union = torch.zeros(fw.tq, dtype=torch.bool, device=self.device)
        union[gate] = True
        union[sal] = True
        rec = fw.record
        rec["gating"].append(int(gate.numel()))
        rec["salient"].append(int(sal.numel()))
        rec["union"].append(int(union.sum()))
        rec.setdefault("exact", []).append(int(exact.sum()))
        rec["macs"] += float(macs.sum())

    def _dy_finish(self, fw: _Forward) -> None:
        rows = fw.rows
        L = self.layers
        dense = self._dense_macs(rows) * L if self._dy_dims is not None else 0.0
        dense_tokens = sum((self.wlen[b] + (0 if self.use_cache else self.prompt_real[b])) for b in rows)
        if fw.mode == "full":
            n = dense_tokens
            rec = {"fed": n, "gating": [n] * L, "salient": [n] * L, "union": [n] * L, "exact": [n] * L,
                   "macs": dense}
            for b in rows:
                self._dy_full_done[b] += 1
                self._dy_valid[b] = self.wlen[b]
        else:
            rec = fw.record
        fed = rec["fed"]
        self._dy_records.append({
            "step": fw.step, "mode": fw.mode, "rows": len(rows), "fed": fed,
            "salient_fraction": [s / fed if fed else 0.0 for s in rec["salient"]],
            "gating": rec["gating"],
            "attn_exact": rec["exact"], "attn_approx": [fed - e for e in rec["exact"]],
            "ffn_computed": rec["salient"], "ffn_skipped": [fed - s for s in rec["salient"]],
            "tokens_computed": sum(rec["union"]), "tokens_dense": dense_tokens * L,
            "macs": rec["macs"], "dense_macs": dense,
        })
        self._dy_snap[fw.idx] = self.x[fw.idx]

    def dyllm_stats(self) -> dict:
        """Totals over the run plus the per-forward records (see the module docstring)."""
        recs = self._dy_records
        sparse = [r for r in recs if r["mode"] != "full"]
        per_layer = []
        for layer in range(self.layers):
            fed = sum(r["fed"] for r in sparse)
            per_layer.append(sum(r["ffn_computed"][layer] for r in sparse) / fed if fed else None)
        fed_sparse = sum(r["fed"] * self.layers for r in sparse)
        dense_macs = sum(r["dense_macs"] for r in recs)
        return {
            "tau": self.tau,
            "full_steps": self.dyllm.full_steps,
            "prompt_period": self.dyllm.prompt_period,
            "approx_attention": self.dyllm.approx_attention,
            "key_correction": self.dyllm.key_correction,
            "forwards": {m: sum(r["mode"] == m for r in recs) for m in ("full", "prompt", "response")},
            "salient_fraction": (sum(sum(r["ffn_computed"]) for r in sparse) / fed_sparse) if fed_sparse else None,
            "salient_fraction_per_layer": per_layer,
            "ffn_computed": sum(sum(r["ffn_computed"]) for r in recs),
            "ffn_skipped": sum(sum(r["ffn_skipped"]) for r in recs),
            "attn_exact": sum(sum(r["attn_exact"]) for r in recs),
            "attn_approx": sum(sum(r["attn_approx"]) for r in recs),
            "tokens_computed": sum(r["tokens_computed"] for r in recs),
            "tokens_computed_dense": sum(r["tokens_dense"] for r in recs),
            "ideal_flop_ratio": (sum(r["macs"] for r in recs) / dense_macs) if dense_macs else None,
            "steps": recs,
        }
