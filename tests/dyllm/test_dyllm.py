"""Issue: DyLLM as an engine policy. tau > 1 equals the baseline token for token (every family,
batches, Seer, prefix cache); one sparse layer against an independent per-request oracle of
the algorithm; the defaults finish with real savings; response-only steps feed the window
alone; Seer's cut slices the caches; statistics; bad configurations."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import model_adapters as ma
import seer_kernels
from seer_kernels.partial_attention import KEY_CORRECTION_MAX_GAP_LOG2, KEY_CORRECTION_MAX_OLD_MASS
from seer_runtime import DyLLMConfig, GenerationConfig, LayerHook, Policy, generate
from seer_runtime.calibration.dyllm import ATTENTION_MODES
from seer_runtime.dyllm import DyLLMPolicy, SparseForward
from seer_runtime.dyllm.accounting import DyLLMAccounting
from seer_runtime.dyllm.caches import KINDS
from seer_runtime.evaluate import pad_left
from seer_runtime.generation import prepare
from seer_runtime.runner import ModelRunner
from seer_runtime.seer import SeerConfig, SeerPolicy

from ..tiny_models import tiny

pytestmark = [pytest.mark.dyllm, pytest.mark.usefixtures("reference_kernels")]

ALL = ["llada-8b-instruct", "mmada-8b", "dream-v0-instruct-7b", "lavida-llada", "lavida-dream"]
EXACT = DyLLMConfig(tau=1.01, full_steps=1, prompt_period=1)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one torch thread is faster and steadier on a shared machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def batch(model):
    """Three left-padded requests (LaViDa: two with images of different sizes)."""
    prompts, images = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]], None
    if model.is_multimodal:
        prompts = [[5, ma.IMAGE_TOKEN_INDEX, 6, 7], [8, 9], [ma.IMAGE_TOKEN_INDEX, 10]]
        torch.manual_seed(4)
        images = [ma.ImageInput(torch.randn(1, 3, 32, 32), (32, 32)), None,
                  ma.ImageInput(torch.randn(5, 3, 32, 32), (64, 48), (2, 2))]
    ids, mask = pad_left(prompts, model.token_ids.pad)
    return ids, mask, images


def gen_for(model, length=8, **kw):
    return GenerationConfig(gen_length=length, block_length=4 if model.family == "llada" else None,
                            tie_break="stable", alg="entropy" if model.family == "dream" else "origin", **kw)


def run_both(model, gen, dyllm, seer=None):
    ids, mask, images = batch(model)
    base = generate(model, ids, attention_mask=mask, images=images, gen=gen, seer=seer)
    dy = generate(model, ids, attention_mask=mask, images=images, gen=gen, seer=seer, dyllm=dyllm)
    return base, dy


def sparse_records(out):
    return [r for r in out.stats.extra["dyllm"]["steps"] if r["mode"] != "full"]


# ------------------------------------------------------------------------------------ tau > 1 = baseline
@pytest.mark.parametrize("kind,cache", [(k, None) for k in ALL] + [("lavida-llada", False)])
def test_tau_above_one_equals_the_baseline_token_for_token(kind, cache):
    model = tiny(kind)
    base, dy = run_both(model, gen_for(model, prefix_cache=cache), EXACT)
    assert torch.equal(dy.sequences, base.sequences)
    sparse = sparse_records(dy)
    assert len(sparse) >= 6  # one warm-up step, then sparse steps
    for rec in sparse:  # every fed row salient at every layer: nothing approximated or skipped
        assert rec["salient_fraction"] == [1.0] * model.num_layers
        assert rec["attn_approx"] == [0] * model.num_layers and rec["ffn_skipped"] == [0] * model.num_layers
    assert dy.stats.nfe == base.stats.nfe and dy.stats.steps == base.stats.steps


def started_call(model, ids, mask, images, gen, *policies):
    """A ``generate`` call with ``policies`` set up to its first step (its scheduler)."""
    return prepare(model, ids, attention_mask=mask, images=images, gen=gen, policies=policies, graphs=None)


def first_logits(model, ids, mask, images, gen, *policies) -> torch.Tensor:
    """Step 0's window logits of requests 0-2, the call's state kept (the policies' caches)."""
    return started_call(model, ids, mask, images, gen, *policies).runner.run([0, 1, 2], 0)[0]


@pytest.mark.parametrize("kind", ["llada-8b-instruct", "dream-v0-instruct-7b", "lavida-dream"])
def test_warm_up_forward_is_bitwise_the_baseline_forward(kind):
    """A warm-up forward runs the model's own layers (asking them for K/V, context and FFN output):
    its logits equal the baseline's bit for bit, and it fills the caches of every layer."""
    model = tiny(kind)
    ids, mask, images = batch(model)
    policy = DyLLMPolicy(DyLLMConfig())
    with torch.no_grad():
        got = first_logits(model, ids, mask, images, gen_for(model), policy)
        want = first_logits(model, ids, mask, images, gen_for(model))
    assert torch.equal(got, want)
    c = policy.caches
    assert all(t is not None for t in c.keys + c.values + c.contexts + c.ffn_outputs)
    assert policy.accounting.records[0]["mode"] == "full" and policy.dense_forwards == [1, 1, 1]


# ------------------------------------------------------------------------------------ one sparse layer
def _rope(x, cos, sin, full):
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    rot = lambda t: torch.cat((-t[..., t.shape[-1] // 2:], t[..., : t.shape[-1] // 2]), -1)  # noqa: E731
    if full:
        return (x.float() * cos + rot(x.float()) * sin).to(x.dtype)
    return x * cos.to(x.dtype) + rot(x) * sin.to(x.dtype)


def oracle_layer(run, policy, i, hidden, caches, gate_rows, fw_offset, rows, prefix, tau, mode="partial"):
    """``run``: the call's batch state."""
    """The algorithm restated per request on the padded layout (attention in float64, no packing).

    mode: the attention of the rows outside the gating set: "partial" (the key-corrected
    update, the default), "paper" (``C_cache + P[:, A] dV``) or "exact"."""
    model, blk = policy.model, policy.model.block(i)
    K, V, C, Fc = (t.clone().double() for t in caches)
    out = hidden.clone()
    salient = []
    pre = policy.caches.cached_prompt
    for r, b in enumerate(rows):
        wl, lp = run.window[b], run.prompt_len
        pm = run.prompt_mask[b] if run.prompt_mask is not None else torch.ones(lp, dtype=torch.bool)
        fed_real = torch.cat([pm, torch.arange(hidden.shape[1] - lp) < wl]) if fw_offset else (
            torch.arange(hidden.shape[1]) < wl)
        fed = fed_real.nonzero().flatten()
        coord = fed + (pre - fw_offset)  # cache coordinates
        pos = run.positions[b, coord + (run.prompt_len if run.prefix_cache else 0)]
        cos, sin = model.rope(pos)
        h = hidden[r, fed]
        x_n = blk.attn_norm(h)
        q, k, v = blk.project_qkv(x_n)
        q = _rope(q, cos, sin, model.rope_full_precision).double()
        k = _rope(k, cos, sin, model.rope_full_precision).double()
        a = torch.tensor(sorted(gate_rows[r]), dtype=torch.long)  # indices into `fed`
        k_old, v_old = K[b, coord[a]].clone(), V[b, coord[a]].clone()
        K[b, coord[a]], V[b, coord[a]] = k[a], v.double()[a]
        cap = policy.caches.capacity
        real_keys = torch.cat([pm, torch.arange(cap) < wl]) if pre else torch.arange(cap) < wl
        kk, vv = K[b, real_keys], V[b, real_keys]
        if prefix is not None:
            pk = prefix.keys[i][r].transpose(0, 1).double()
            pv = prefix.values[i][r].transpose(0, 1).double()
            real = prefix.key_mask[r] if prefix.key_mask is not None else torch.ones(pk.shape[0], dtype=torch.bool)
            kk, vv = torch.cat([pk[real], kk]), torch.cat([pv[real], vv])
        group = q.shape[1] // kk.shape[1]
        kk, vv = kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1)
        scale = 1 / math.sqrt(q.shape[-1])
        scores = torch.einsum("qhd,khd->hqk", q, kk) * scale
        p = torch.softmax(scores, -1)
        exact = torch.einsum("hqk,khd->qhd", p, vv).reshape(len(fed), -1)
        key_index = torch.cumsum(real_keys.long(), 0) - 1 + (kk.shape[0] - int(real_keys.sum()))
        cols = key_index[coord[a]]
        dv = (V[b, coord[a]] - v_old).repeat_interleave(group, 1)
        old = C[b, coord]
        approx = old + torch.einsum("hqa,ahd->qhd", p[:, :, cols], dv).reshape(len(fed), -1)
        if mode == "partial" and len(a):  # take the old salient part out of the cache, put the new one in
            m = scores.amax(-1, keepdim=True)
            e = torch.exp(scores - m)
            l_new, e_new = e.sum(-1), e[:, :, cols]  # [H, q], [H, q, |a|]
            gap = torch.einsum("qhd,ahd->hqa", q, k_old.repeat_interleave(group, 1)) * scale - m
            max_exponent = KEY_CORRECTION_MAX_GAP_LOG2 * math.log(2)
            e_old = torch.exp(gap.clamp(max=max_exponent))
            l_old = l_new - e_new.sum(-1) + e_old.sum(-1)
            old_h = old.view(len(fed), q.shape[1], -1).transpose(0, 1)  # [H, q, d]
            corrected = (l_old[..., None] * old_h + torch.einsum("hqa,ahd->hqd", e_new, vv[cols])
                         - torch.einsum("hqa,ahd->hqd", e_old, v_old.repeat_interleave(group, 1))) / l_new[..., None]
            use = ((l_old > 0) & (e_old.sum(-1) <= KEY_CORRECTION_MAX_OLD_MASS * l_old)
                   & (gap.amax(-1) <= max_exponent))[..., None]
            approx = torch.where(use, corrected, approx.view(len(fed), q.shape[1], -1).transpose(0, 1))
            approx = approx.transpose(0, 1).reshape(len(fed), -1)
        ctx = exact.clone() if mode == "exact" else approx.clone()
        ctx[a] = exact[a]
        sim = F.cosine_similarity(ctx, old, dim=-1)
        sal = (sim < tau).nonzero().flatten()
        salient.append((sal.tolist(), sim))
        C[b, coord] = ctx
        h = h.double() + blk.project_out(ctx.float()).double()
        if len(sal):
            g, u = blk.mlp_gate_up(blk.ffn_norm(h[sal].float()))
            Fc[b, coord[sal]] = blk.mlp_down(F.silu(g) * u).double()
        out[r, fed] = (h + Fc[b, coord]).float()
    return out, salient, (K, V, C, Fc)


@pytest.mark.parametrize("kind,period,mode", [("llada-8b-instruct", 1, "partial"), ("llada-8b-instruct", 3, "partial"),
                                              ("dream-v0-instruct-7b", 3, "partial"), ("lavida-llada", 1, "partial"),
                                              ("llada-8b-instruct", 3, "paper"), ("dream-v0-instruct-7b", 3, "paper"),
                                              ("llada-8b-instruct", 3, "exact"), ("dream-v0-instruct-7b", 1, "exact")])
def test_sparse_layer_matches_a_per_request_oracle(kind, period, mode, monkeypatch):
    """tau < 1: gated K/V, attention (key-corrected partial, the paper's partial or exact),
    saliency and FFN reuse against a float64 restatement."""
    model = tiny(kind)
    ids, mask, images = batch(model)
    tau = 0.99
    cfg = DyLLMConfig(tau=tau, full_steps=2, prompt_period=period, **ATTENTION_MODES[mode])
    assert cfg.attention_mode == mode
    seen, history, state = [], {}, {}
    original_forward, original_layer = ModelRunner.run, model.layer

    def forward(self, rows, step, choice=None):  # the window each request had at its previous forward
        now = self.state.tokens.clone()
        state["prev"] = dict(history)
        out = original_forward(self, rows, step, choice)
        history.update({b: now[b] for b in rows})
        return out

    def spy(i, hidden, layout, *, rope=None, prefix=None, taps=None):
        sparse = taps.rows if taps is not None else None
        if sparse is None:  # a warm-up layer
            return original_layer(i, hidden, layout, rope=rope, prefix=prefix, taps=taps)
        run, policy, fw = sparse.state, sparse.policy, sparse.plan
        maps, padded = fw.maps, fw.padded_input
        dim, lq = padded.shape[-1], padded.shape[1]

        def unpack(rows):  # the packed rows of the forward in its padded layout (pad rows: the input)
            out = padded.clone()
            out.view(-1, dim).index_copy_(0, maps.query_src, rows)
            return out

        def live(index, count):  # a fixed-capacity row set's live rows
            return index[: int(count)]

        gate_in = live(fw.gate, fw.gate_count)
        if i == 0:  # layer 0's gating set: the positions committed since the previous forward
            mask_id = run.token_ids.mask
            got = {(int(r), int(c)) for r, c in zip(maps.query_row[gate_in], maps.query_src[gate_in] % lq)}
            want = {(r, fw.offset + p) for r, b in enumerate(fw.rows)
                    for p in ((state["prev"][b] == mask_id) & (run.tokens[b] != mask_id)).nonzero().flatten().tolist()
                    if p < run.window[b]}
            assert got == want and want
        qrow = maps.query_row
        starts = maps.cu_q[:-1].long()
        gate = [(gate_in[qrow[gate_in] == r] - starts[r]).tolist() for r in range(len(fw.rows))]
        layer_caches = lambda: [getattr(policy.caches, k)[i].clone() for k in KINDS]  # noqa: E731
        caches = layer_caches()
        want = oracle_layer(run, policy, i, unpack(hidden), caches, gate, fw.offset, fw.rows, fw.prefix, tau, mode)
        n_in = gate_in.numel()
        got = original_layer(i, hidden, layout, rope=rope, prefix=prefix, taps=taps)
        seen.append((fw.mode, unpack(got), want, n_in, live(fw.gate, fw.gate_count).clone(), qrow, starts,
                     layer_caches()))
        return got

    monkeypatch.setattr(ModelRunner, "run", forward)
    monkeypatch.setattr(model, "layer", spy)
    generate(model, ids, attention_mask=mask, images=images, gen=gen_for(model), dyllm=cfg)
    if model.is_multimodal:  # prefix cache: the prompt is never fed
        assert {m for m, *_ in seen} == {"response"}
    else:
        assert {m for m, *_ in seen} == ({"prompt"} if period == 1 else {"prompt", "response"})
    approximated = skipped = 0
    for _mode, got, (want, salient, want_caches), n_in, gate, qrow, starts, caches in seen:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for c, w in zip(caches, want_caches):
            torch.testing.assert_close(c.double(), w, rtol=1e-4, atol=1e-4)
        for r, (sal, sim) in enumerate(salient):
            mine = set((gate[qrow[gate] == r] - starts[r]).tolist())
            clear = {j for j in range(len(sim)) if abs(float(sim[j]) - tau) > 1e-6}
            assert {j for j in sal if j in clear} == {j for j in mine if j in clear}
            skipped += len(sim) - len(sal)
        approximated += qrow.numel() - n_in
    assert skipped > 0  # the FFN reuse did run
    assert approximated > 0  # query rows outside the gating set ran (partial attention unless exact)


@pytest.mark.interpreter
@pytest.mark.parametrize("kind,mode", [("llada-8b-instruct", "partial"), ("lavida-dream", "partial"),
                                       ("llada-8b-instruct", "paper"), ("dream-v0-instruct-7b", "exact")])
def test_triton_kernels_in_the_interpreter_agree_with_the_references(kind, mode):
    """The Triton path of every DyLLM op (as on a GPU) with this policy's shapes, strides and index maps
    (exact attention: the varlen kernel against its reference)."""
    from seer_kernels import kernel_backend

    model = tiny(kind)
    ids, mask = torch.tensor([[251, 5, 6, 7], [8, 9, 10, 11]]), torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    gen = gen_for(model, length=6 if model.family == "dream" else 8)
    cfg = DyLLMConfig(full_steps=1, prompt_period=2, **ATTENTION_MODES[mode])
    ref = generate(model, ids, attention_mask=mask, gen=gen, dyllm=cfg)
    with kernel_backend("triton"):
        tri = generate(model, ids, attention_mask=mask, gen=gen, dyllm=cfg)
    assert torch.equal(tri.sequences, ref.sequences)
    assert [r["ffn_computed"] for r in tri.stats.extra["dyllm"]["steps"]] == [
        r["ffn_computed"] for r in ref.stats.extra["dyllm"]["steps"]]
    assert {r["mode"] for r in ref.stats.extra["dyllm"]["steps"]} >= {"full", "response"}


# ------------------------------------------------------------------------------------ defaults
@pytest.mark.parametrize("kind", ALL)
def test_defaults_finish_with_savings(kind):
    model = tiny(kind)
    ids, mask, images = batch(model)
    cfg = DyLLMConfig.for_model(model)
    assert cfg.tau == (0.99 if model.family == "llada" else 0.995)
    out = generate(model, ids, attention_mask=mask, images=images, gen=gen_for(model, length=16), dyllm=DyLLMConfig())
    assert not (out.responses == model.token_ids.mask).any()
    st = out.stats.extra["dyllm"]
    assert st["tau"] == cfg.tau and st["forwards"]["full"] == 4
    sparse = sparse_records(out)
    assert len(sparse) == len(st["steps"]) - 4 > 0
    # some sparse forward skips rows (on these random tiny models a forward may find every row salient)
    assert st["salient_fraction"] < 1 and any(min(r["salient_fraction"]) < 1 for r in sparse)
    assert 0 < st["ideal_flop_ratio"] < 1 and st["ffn_skipped"] > 0
    assert st["approx_attention"] is True and st["key_correction"] is False and st["attn_approx"] > 0
    assert st["positions_computed"] < st["positions_computed_dense"]
    for r in st["steps"]:
        for layer in range(model.num_layers):
            assert r["ffn_computed"][layer] + r["ffn_skipped"][layer] == r["fed"]
            assert r["attn_exact"][layer] + r["attn_approx"][layer] == r["fed"]
            assert r["positions_computed"] <= r["fed"] * model.num_layers
    full = [r for r in st["steps"] if r["mode"] == "full"]
    assert all(r["macs"] == r["dense_macs"] and r["positions_computed"] == r["positions_dense"] for r in full)


@pytest.mark.parametrize("kind", ["llada-8b-instruct", "lavida-dream"])
def test_the_three_attention_modes(kind):
    """The rows outside the gating set: the paper's C_cache + P[:, A] dV (default), our
    key-corrected partial attention, or exact attention for every fed row. All finish; the statistics say
    which ran, and the corrected update costs more multiply-accumulates than the paper's."""
    model = tiny(kind)
    ids, mask, images = batch(model)
    gen = gen_for(model, length=16)
    outs = {mode: generate(model, ids, attention_mask=mask, images=images, gen=gen,
                           dyllm=DyLLMConfig.for_model(model, **fields))
            for mode, fields in ATTENTION_MODES.items()}
    assert DyLLMConfig().attention_mode == "paper"
    for mode, out in outs.items():
        st = out.stats.extra["dyllm"]
        assert not (out.responses == model.token_ids.mask).any()
        assert (st["approx_attention"], st["key_correction"]) == tuple(ATTENTION_MODES[mode].values())
        for r in sparse_records(out):  # exact attention exactly for the gating set or for every fed row
            if mode == "exact":
                assert r["attn_exact"] == [r["fed"]] * model.num_layers
            else:
                assert r["attn_exact"] == r["gating"] and r["attn_approx"] == [r["fed"] - g for g in r["gating"]]
    assert outs["partial"].stats.extra["dyllm"]["attn_approx"] > 0
    assert outs["exact"].stats.extra["dyllm"]["attn_approx"] == 0


def test_the_key_correction_is_counted_in_the_ideal_flops():
    """The per-layer MACs equal the direct count: Q for every row, K/V for the gating ones, QK^T over
    every (query, key) pair, P @ V over every key for the exact rows and over the gating keys for
    the others (three products per pair with the key correction: scores against the old keys, one
    more P[:, A] product), the FFN for the salient rows. So the correction adds exactly
    2 * (nq - a) * a * Hd."""
    from types import SimpleNamespace

    nq, nk, a, b = 6, 10, 2, 1  # one request: 6 fed rows, 10 keys, gating {1, 4}, salient {4}
    gate_mask = torch.zeros(nq, dtype=torch.bool)
    gate_mask[torch.tensor([1, 4])] = True
    salient_mask = torch.zeros(nq, dtype=torch.bool)
    salient_mask[4] = True
    dims = {"D": 8, "Hd": 8, "Hkd": 8, "I": 16}
    macs = {}
    for mode in ("partial", "paper", "exact"):
        accounting = DyLLMAccounting(DyLLMConfig(**ATTENTION_MODES[mode]),
                                     SimpleNamespace(num_layers=1, hidden_size=8, num_heads=1, head_dim=8,
                                                     num_kv_heads=1, intermediate_size=16))
        assert accounting.dims == dims
        fw = SparseForward(rows=[0], index=torch.tensor([0]), step=5, mode="response")
        fw.layer_stats = torch.zeros(1, 5, dtype=torch.float64)
        fw.maps = SimpleNamespace(query_row=torch.zeros(nq, dtype=torch.long), num_queries=nq,
                                  request_rows=torch.zeros(1, dtype=torch.float64),
                                  macs_weights=accounting.macs_weights([nq], [nk],
                                                                       lambda v, dt: torch.tensor(v, dtype=dt)))
        fw.gate_masks, fw.salient_masks = [gate_mask], [salient_mask]
        accounting.account(fw)
        gating, salient, union, n_exact, macs[mode] = fw.layer_stats[0].tolist()
        exact = nq if mode == "exact" else a
        cost = 3 if mode == "partial" else 1
        d, hd = dims["D"], dims["Hd"]
        want = (nq * 2 * d * hd + a * 2 * d * dims["Hkd"] + b * 3 * d * dims["I"] + nq * nk * hd
                + (exact * nk + (nq - exact) * a * cost) * hd)
        assert (gating, salient, union, n_exact) == (a, b, 2, exact)
        assert macs[mode] == want, mode
    assert macs["partial"] - macs["paper"] == 2 * (nq - a) * a * dims["Hd"]


# ------------------------------------------------------------------------------------ response-only steps
@pytest.mark.parametrize("kind", ["llada-8b-instruct", "dream-v0-instruct-7b"])
def test_response_only_steps_feed_only_the_window(kind):
    model = tiny(kind)
    ids, mask, _ = batch(model)
    shapes = {}

    class FedPositions(Policy):  # composed after DyLLM: sees the layout DyLLM asked for
        def layers(self, state, fwd):
            shapes.setdefault(fwd.step, set()).add((fwd.offset + fwd.width, fwd.feed_prompt))

    W, Lp = 16, ids.shape[1]
    out = generate(model, ids, attention_mask=mask, gen=gen_for(model, length=W),
                   dyllm=DyLLMConfig(tau=0.999, full_steps=3, prompt_period=4), policies=[FedPositions()])
    assert not (out.responses == model.token_ids.mask).any()
    for step, seen in shapes.items():  # the authors' phase: the prompt on steps t with (t + 1) % 4 == 0
        fed = Lp + W if step < 3 or (step + 1) % 4 == 0 else W
        assert seen == {(fed, fed > W)}, step
    modes = [r["mode"] for r in out.stats.extra["dyllm"]["steps"]]
    assert modes[:9] == ["full", "full", "full", "prompt", "response", "response", "response", "prompt", "response"]
    assert modes.count("prompt") == len([s for s in shapes if s >= 3 and (s + 1) % 4 == 0])


def test_sparse_steps_of_the_first_period_feed_the_prompt():
    """The authors' model runner feeds the window alone only when ``n > 4 and n % 4 != 0`` (n = t + 1):
    with fewer warm-up steps than the period, the sparse steps before it feed the prompt too."""
    model = tiny("llada-8b-instruct")
    ids, mask, _ = batch(model)
    out = generate(model, ids, attention_mask=mask, gen=gen_for(model, length=12),
                   dyllm=DyLLMConfig(tau=0.999, full_steps=1, prompt_period=4))
    modes = [r["mode"] for r in out.stats.extra["dyllm"]["steps"]]
    assert modes == ["full", "prompt", "prompt", "prompt", "response", "response", "response", "prompt",
                     "response", "response", "response", "prompt"]


# ------------------------------------------------------------------------------------ composition
@pytest.fixture
def plant(monkeypatch):
    """Seer's boundary planted: snr_boundary returns fixed lengths."""
    def _plant(lengths):
        def fake(profile, valid_len, **kw):
            return torch.tensor(lengths[: profile.shape[0]], dtype=torch.int32)

        monkeypatch.setattr(seer_kernels, "snr_boundary", fake)
    return _plant


@pytest.mark.parametrize("kind,cache", [("llada-8b-instruct", None), ("dream-v0-instruct-7b", None),
                                        ("lavida-llada", None), ("lavida-dream", None), ("lavida-llada", False)])
def test_seer_dyllm_prefix_cache_compose(kind, cache, plant):
    model = tiny(kind)
    plant([3, 6, 2])
    seer = SeerConfig(probe_layer=1, guard=False)  # the guard's extensions: test_seer_guard_extension_rebuilds
    gen = gen_for(model, prefix_cache=cache)
    cuts = []
    dyllm = DyLLMPolicy(EXACT)

    class CacheWidths(Policy):  # composed after DyLLM: the caches as each forward finds them
        def layers(self, state, fwd):
            class Widths(LayerHook):
                def taps(self, layer, taps):
                    if (fwd.step, layer) == (0, 1) or fwd.step == 1:
                        cuts.append((fwd.step, layer, fwd.width, dyllm.caches.capacity,
                                     [None if k is None else k.shape[1] - dyllm.caches.cached_prompt
                                      for k in dyllm.caches.keys]))

            return Widths()

    ids, mask, images = batch(model)
    base = generate(model, ids, attention_mask=mask, images=images, gen=gen, seer=seer)
    dy = generate(model, ids, attention_mask=mask, images=images, gen=gen, seer=seer, policies=[dyllm, CacheWidths()])
    assert torch.equal(dy.sequences, base.sequences)
    assert dy.stats.extra["seer"] == base.stats.extra["seer"]
    # the cut came after layer 1: layers 0-1 ran on the full window (layer 2 not yet cached), and
    # from the next forward on every cache holds the 6 surviving positions
    W = gen.gen_length
    assert cuts[0] == (0, 1, W, W, [W, None, None])
    assert all(c == (1, c[1], 6, 6, [6, 6, 6]) for c in cuts[1:]) and len(cuts) == 1 + model.num_layers
    st = dy.stats.extra["dyllm"]
    assert min(r["rows"] for r in st["steps"]) < 3  # requests left the forward when done
    assert st["forwards"]["full"] == 1 and len(st["steps"]) > 3
    # the defaults compose too, and so do the paper's partial attention and exact attention
    ids, mask, images = batch(model)
    for cfg in (DyLLMConfig(**fields) for fields in ATTENTION_MODES.values()):
        out = generate(model, ids, attention_mask=mask, images=images, gen=gen, seer=seer, dyllm=cfg)
        seer_stats, st = out.stats.extra["seer"], out.stats.extra["dyllm"]
        for b, n in enumerate(seer_stats["final_window"]):
            assert not (out.responses[b, :n] == model.token_ids.mask).any()
            assert (out.responses[b, n:] == model.token_ids.eos).all()
        assert st["forwards"]["full"] >= 4 and st["ideal_flop_ratio"] < 1


@pytest.mark.parametrize("kind", ["llada-8b-instruct", "lavida-dream"])
def test_seer_router_dyllm_compose(kind, plant):
    """With the PWR router a step runs one padded forward per group, windows padded to the group's bucket."""
    from seer_runtime.serving.router import RouterConfig

    model = tiny(kind)
    plant([3, 13, 9, 2, 12])  # the longest window (13) is shorter than its bucket (16)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15], [16, 17, 18, 19]]
    ids, mask = pad_left(prompts, model.token_ids.pad)
    gen, seer = gen_for(model, length=16), SeerConfig(probe_layer=1, guard=False)
    naive = generate(model, ids, attention_mask=mask, gen=gen, seer=seer)
    # one static group padded to its bucket, past every window (one forward per step); and the packed
    # path's decision, which DyLLM's padded rows turn into a padded forward of the longest window
    for tau_pad in (1.0, 0.0):
        router = RouterConfig.for_window(16, max_batch=8, tau_pad=tau_pad)
        out = generate(model, ids, attention_mask=mask, gen=gen, seer=seer, router=router, dyllm=EXACT)
        assert torch.equal(out.responses, naive.responses), tau_pad
        steps = out.stats.extra["dyllm"]["steps"]
        assert len(steps) == max(r["step"] for r in steps) + 1  # one forward per step
        assert ("STATIC" if tau_pad == 1.0 else "VARLEN") in out.stats.extra["router"]  # (a lone request: EAGER)
        for cfg in (DyLLMConfig(**fields) for fields in ATTENTION_MODES.values()):
            out = generate(model, ids, attention_mask=mask, gen=gen, seer=seer, router=router, dyllm=cfg)
            for b, n in enumerate(out.stats.extra["seer"]["final_window"]):
                assert not (out.responses[b, :n] == model.token_ids.mask).any()


@pytest.mark.parametrize("kind", ["llada-8b-instruct", "dream-v0-instruct-7b"])
def test_seer_guard_extension_rebuilds_the_caches(kind, plant):
    """Seer's guard grows a window after the cut: the caches grow and one dense forward rebuilds them."""
    model = tiny(kind)
    plant([2, 3, 2])
    seer = SeerConfig(probe_layer=1)
    base, dy = run_both(model, gen_for(model), EXACT, seer=seer)
    assert torch.equal(dy.sequences, base.sequences)
    assert any(dy.stats.extra["seer"]["guard_events"])
    recs = dy.stats.extra["dyllm"]["steps"]
    assert [r["step"] for r in recs if r["mode"] == "full"][:2] == [0, 2]  # rebuilt after the first extension


def test_seer_cut_slices_the_caches(plant):
    model = tiny("llada-8b-instruct")
    ids, mask, _ = batch(model)
    plant([5, 9, 3])
    dyllm = DyLLMPolicy(DyLLMConfig())
    call = started_call(model, ids, mask, None, gen_for(model, 16), SeerPolicy(SeerConfig(probe_layer=1, guard=False)),
                        dyllm)
    caches = lambda: dyllm.caches.keys + dyllm.caches.values + dyllm.caches.contexts + dyllm.caches.ffn_outputs  # noqa: E731
    with torch.no_grad():
        call.step(0)
        assert call.state.window.lengths == [5, 9, 3]
        call.step(1)  # the next forward fits the caches to the longest surviving window
    assert dyllm.caches.capacity == 9 and all(t.shape[1] == call.state.prompt_len + 9 for t in caches())
    assert dyllm.valid == [5, 9, 3]
    with torch.no_grad():
        call.run()
    assert dyllm.caches.keys[0].shape[1] == call.state.prompt_len + 9


# ------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("make,err,match", [
    (lambda: DyLLMConfig(tau=0.0), ValueError, "tau must be a finite number > 0"),
    (lambda: DyLLMConfig(tau=float("nan")), ValueError, "tau must be a finite number"),
    (lambda: DyLLMConfig(tau="0.9"), TypeError, "tau must be a real number"),
    (lambda: DyLLMConfig(full_steps=0), ValueError, "full_steps must be an int >= 1"),
    (lambda: DyLLMConfig(prompt_period=1.5), TypeError, "prompt_period must be an int, got float"),
    (lambda: DyLLMConfig(approx_attention=1), TypeError, "approx_attention must be a bool"),
    (lambda: DyLLMConfig(key_correction="yes"), TypeError, "key_correction must be a bool"),
    (lambda: DyLLMConfig.from_dict({"tau": 0.9, "threshold": 1}), ValueError, "unknown DyLLMConfig fields"),
])
def test_bad_config(make, err, match):
    with pytest.raises(err, match=match):
        make()


def test_config_round_trip_and_defaults(tmp_path):
    cfg = DyLLMConfig(tau=0.98, full_steps=2, prompt_period=3, approx_attention=False)
    cfg.to_json(tmp_path / "d.json")
    assert DyLLMConfig.from_json(tmp_path / "d.json") == cfg
    paper = DyLLMConfig(key_correction=False)
    assert DyLLMConfig.from_dict(paper.to_dict()) == paper and paper.attention_mode == "paper"
    # a calibration record beside the fields is skipped; the fields missing take their defaults
    calibrated = {"tau": 0.98, "full_steps": 4, "prompt_period": 4, "approx_attention": True, "calibration": {}}
    assert DyLLMConfig.from_dict(calibrated).attention_mode == "paper"
    assert DyLLMConfig.from_dict({"tau": 0.98}).attention_mode == "paper"
    assert cfg.attention_mode == "exact" and DyLLMConfig().attention_mode == "paper"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tau = 0.5
    assert DyLLMConfig().tau is None and DyLLMConfig().tau_for("dream") == 0.995
    assert DyLLMConfig().tau_for("llada") == 0.99 and cfg.tau_for("dream") == 0.98
    for kind in ALL:
        model = tiny(kind)
        assert DyLLMConfig.for_model(model, full_steps=2) == DyLLMConfig(
            tau=0.99 if model.family == "llada" else 0.995, full_steps=2)


def test_bad_requests_name_the_argument():
    model = tiny("llada-8b-instruct")
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="cfg_scale"):
        generate(model, ids, gen=GenerationConfig(gen_length=4, cfg_scale=1.0), dyllm=DyLLMConfig())
    with pytest.raises(TypeError, match="dyllm must be a DyLLMConfig"):
        generate(model, ids, gen=GenerationConfig(gen_length=4), dyllm={"tau": 0.99})

    class AskMlp(Policy):  # the MLP activation of a layer that computes some rows does not exist
        def layers(self, state, fwd):
            class Ask(LayerHook):
                def taps(self, layer, taps):
                    taps.keep_mlp_act = True

            return Ask()

    with pytest.raises(ValueError, match="taps cannot be served"):
        generate(model, ids, gen=GenerationConfig(gen_length=4), dyllm=DyLLMConfig(full_steps=1), policies=[AskMlp()])


# ------------------------------------------------------------------------------------ attention on the CPU
@pytest.mark.interpreter
@pytest.mark.parametrize("key_correction", [False, True], ids=["paper", "partial"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)])
@pytest.mark.parametrize("salient", ["none", "all", "one", "some"])
def test_cpu_attention_equals_the_kernels(heads, kv_heads, salient, key_correction):
    """The sparse step's attention as the policy calls it (the public ops) on ragged requests (one
    with no query rows), GQA, no / every / one / some salient rows: on the CPU (the references,
    all requests at once) as through the Triton kernels (the interpreter, as on a GPU)."""
    from seer_kernels import kernel_backend, partial_attention, varlen_attention

    cu_q = torch.tensor([0, 3, 3, 10, 11], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 9, 19, 21], dtype=torch.int32)
    max_q, max_k = int(cu_q.diff().max()), int(cu_k.diff().max())
    tq, tk, d = 11, 21, 8
    g = torch.Generator().manual_seed(7)
    q, ctx = torch.randn(tq, heads, d, generator=g), torch.randn(tq, heads, d, generator=g)
    k, v = torch.randn(tk, kv_heads, d, generator=g), torch.randn(tk, kv_heads, d, generator=g)
    exact = torch.zeros(tq, dtype=torch.bool)
    gate = {"none": [], "all": list(range(tq)), "one": [4], "some": [0, 2, 5, 9, 10]}[salient]
    exact[gate] = True
    # each query row's own key: query i of request r is the last rows of its keys (prefix first)
    own = torch.cat([cu_k[r + 1] - (cu_q[r + 1] - cu_q[r]) + torch.arange(int(cu_q[r + 1] - cu_q[r]))
                     for r in range(4)]).long()
    key_rows = own[torch.tensor(gate, dtype=torch.long)]
    dv = torch.randn(len(gate), kv_heads, d, generator=g)
    k_old = k[key_rows] + torch.randn(len(gate), kv_heads, d, generator=g) if key_correction else None
    args = (q, k, v, ctx, dv, cu_q, cu_k, max_q, max_k, exact, key_rows.to(torch.int32), len(gate))
    got = partial_attention(*args, k_old=k_old)  # the reference_kernels fixture: the CPU path
    with kernel_backend("triton"):
        want = partial_attention(*args, k_old=k_old)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k)
    with kernel_backend("triton"):
        want = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ contiguous layouts
@pytest.mark.parametrize("kind,cache", [("llada-8b-instruct", None), ("llada-8b-instruct", True),
                                        ("dream-v0-instruct-7b", None)])
@pytest.mark.parametrize("mode", sorted(ATTENTION_MODES))
def test_contiguous_layouts_read_the_caches_as_views_with_the_same_result(kind, cache, mode, monkeypatch):
    """Equal-length prompts (no padding) make a sparse forward's queries and keys consecutive
    cache rows (``SparseMaps.query_range`` / ``key_range``): the layers then slice the caches
    instead of gathering and scattering. Same tokens and the same statistics as the index path."""
    model = tiny(kind)
    ids = torch.randint(5, 60, (3, 6), generator=torch.Generator().manual_seed(2))
    gen = gen_for(model, length=12, prefix_cache=cache)
    dyllm = DyLLMConfig.for_model(model, prompt_period=2, **ATTENTION_MODES[mode])
    seen = {"query": 0, "key": 0}
    from seer_runtime.dyllm import policy as dyllm_policy

    build = dyllm_policy.build_maps

    def counted(*args, **kwargs):
        maps = build(*args, **kwargs)
        seen["query"] += maps.query_range is not None
        seen["key"] += maps.key_range is not None
        return maps

    monkeypatch.setattr(dyllm_policy, "build_maps", counted)
    fast = generate(model, ids, gen=gen, dyllm=dyllm)
    assert seen["query"] > 0 and (seen["key"] > 0) == (not cache)  # a prefix cache interleaves the keys

    def index_path(*args, **kwargs):
        return dataclasses.replace(build(*args, **kwargs), query_range=None, key_range=None)

    monkeypatch.setattr(dyllm_policy, "build_maps", index_path)
    slow = generate(model, ids, gen=gen, dyllm=dyllm)
    assert torch.equal(fast.responses, slow.responses)
    assert fast.stats.extra["dyllm"]["steps"] == slow.stats.extra["dyllm"]["steps"]
    assert any(min(r["salient_fraction"]) < 1 for r in sparse_records(fast))


@pytest.mark.parametrize("kind", ["llada-8b-instruct", "dream-v0-instruct-7b"])
def test_the_work_figure_counts_the_rows_dyllm_recomputes(kind):
    """``stats.positions_computed`` is one figure for every method: with DyLLM it counts the rows
    its sparse layers recompute (what DyLLM's own statistics count), ``positions_computed_dense``
    what the same forwards cost dense; per request the same. With every row salient they agree."""
    model = tiny(kind)
    ids = torch.randint(5, 60, (3, 6), generator=torch.Generator().manual_seed(4))  # no padding
    gen = gen_for(model, length=12, prefix_cache=False)
    out = generate(model, ids, gen=gen, dyllm=DyLLMConfig(tau=0.99, full_steps=2, prompt_period=2))
    st, dy = out.stats, out.stats.extra["dyllm"]
    assert st.positions_computed == dy["positions_computed"] < st.positions_computed_dense
    assert sum(st.positions_computed_per_request) == st.positions_computed
    base = generate(model, ids, gen=gen)  # without DyLLM one figure (its response-only steps feed fewer rows)
    assert base.stats.positions_computed == base.stats.positions_computed_dense > st.positions_computed_dense
    every = generate(model, ids, gen=gen, dyllm=EXACT)  # every row salient: nothing reused
    assert every.stats.positions_computed == every.stats.positions_computed_dense
