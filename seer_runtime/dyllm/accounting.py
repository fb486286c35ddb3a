"""What DyLLM computed against the dense forwards of the same rows (:class:`DyLLMAccounting`): per
forward the fed rows, per layer the gating / salient / exact-attention counts and the FFN rows
computed and skipped, and the ideal multiply-accumulates; the totals in ``stats.extra["dyllm"]``.
The sparse layers' counts stay on the device (:meth:`DyLLMAccounting.account`) and are read once,
when the call reports."""

from __future__ import annotations

import torch

from ..batch import BatchState
from .config import DyLLMConfig
from .sparse import SparseForward, SparseMaps


class DyLLMAccounting:
    """Records and totals of one call (module docstring); ``model`` gives the widths."""

    def __init__(self, config: DyLLMConfig, model) -> None:
        self.config, self.num_layers = config, int(model.num_layers)
        self.dims = {"D": model.hidden_size, "Hd": model.num_heads * model.head_dim,
                     "Hkd": model.num_kv_heads * model.head_dim, "I": model.intermediate_size}
        self.records: list[dict] = []
        self._dense_cost: dict[tuple, tuple[float, int]] = {}  # (rows, windows) -> dense MACs, tokens

    def record(self, state: BatchState, plan: SparseForward, maps: SparseMaps | None, fwd) -> int:
        """A forward ran (or replayed): its record, against what the baseline computes for these
        rows at these window lengths (kept per layout: a replayed step's host work stays a lookup;
        the windows as they are now: Seer cuts them inside step 0's forward). ``maps``: a sparse
        forward's layout (its buffers hold the counts, also after a replay); ``fwd``: the forward
        as the runner charged it (positions per layer, each request's rows). Returns the positions
        a dense forward of the rows feeds."""
        rows, layers = plan.rows, self.num_layers
        key = (plan.row_key, state.window.lengths_of(rows))
        cost = self._dense_cost.get(key)
        if cost is None:
            tokens = sum(state.window[b] + (0 if state.prefix_cache else state.prompt_lengths[b]) for b in rows)
            cost = self._dense_cost[key] = (self.dense_macs(state, rows) * layers, tokens)
        dense, dense_tokens = cost
        record = {"step": plan.step, "mode": plan.mode, "rows": len(rows), "dense_macs": dense,
                  "positions_dense": dense_tokens * layers, "row_ids": list(rows)}
        if plan.mode == "full":
            record.update(fed=dense_tokens, layer_stats=None)
        else:  # kept, read once in stats(); what the runner charged for it, to tell the rows reused
            per_request = [(n + (state.prompt_lengths[b] if fwd.prompt_fed else 0)) * layers
                           for b, n in zip(fwd.rows, fwd.lengths)]
            record.update(fed=maps.num_queries, layer_stats=maps.layer_stats.clone(),
                          request_rows=maps.request_rows.clone(), charged=(fwd.positions * layers, per_request))
        self.records.append(record)
        return dense_tokens

    def dense_macs(self, state: BatchState, rows: list[int]) -> float:
        """Multiply-accumulates of one dense layer over ``rows`` as the baseline engine feeds them."""
        d = self.dims
        per_row = d["D"] * d["Hd"] * 2 + 2 * d["D"] * d["Hkd"] + 3 * d["D"] * d["I"]
        total = 0.0
        for b in rows:
            nk = state.prompt_lengths[b] + state.window[b]
            n = state.window[b] if state.prefix_cache else nk
            total += n * per_row + 2.0 * n * nk * d["Hd"]
        return total

    def account(self, plan: SparseForward) -> None:
        """The sparse layers' counts and ideal multiply-accumulates into ``plan.layer_stats``
        ``[layers, 5]`` (on the device), all layers at once after the loop: per layer the gating
        and salient rows (``plan.gate_masks`` / ``plan.salient_masks``, bool ``[num_queries]``
        each), their union, the rows with exact attention, and the MACs of :meth:`macs_weights`."""
        maps = plan.maps
        base, per_gate, gate_squared, per_salient = maps.macs_weights
        gate, salient = torch.stack(plan.gate_masks), torch.stack(plan.salient_masks)  # [L, Tq]
        cols = torch.stack([gate, salient, gate | salient], dim=2).to(torch.float64)  # [L, Tq, 3]
        per_request = cols.new_zeros(cols.shape[0], len(plan.rows), 3).index_add_(1, maps.query_row, cols)
        totals = per_request.sum(dim=1)  # [L, 3]
        gating = per_request[:, :, 0]
        macs = base + (gating * (per_gate - gate_squared * gating)).sum(dim=1) + per_salient * totals[:, 1]
        exact = totals[:, 0] if self.config.approx_attention else totals.new_full((cols.shape[0],), maps.num_queries)
        plan.layer_stats.copy_(torch.stack([totals[:, 0], totals[:, 1], totals[:, 2], exact, macs], dim=1))
        maps.request_rows.copy_(per_request[:, :, 2].sum(dim=0))

    def macs_weights(self, nq: list[int], nk: list[int], upload) -> tuple[float, torch.Tensor, float, float]:
        """The ideal MACs of a sparse layer as ``base + sum_r a_r (per_gate_r - gate_squared a_r)
        + per_salient * b`` for ``a_r`` gating rows of request r and ``b`` salient rows in all
        (built once per layout). Per request with ``nq`` fed rows and ``nk`` keys: Q for every row
        and K/V for the gating ones; ``QK^T`` over every (query, key) pair (the normaliser needs
        them all); ``P @ V`` over every key for the exact rows and over the gating keys for the
        others (three times that with the key correction: scores against the old keys and a
        ``P[:, A] @ V_old``); the FFN for the salient rows. With partial attention the exact rows
        are the gating ones; with exact attention every row is exact."""
        d = self.dims
        hd = d["Hd"]
        base = sum(q * (2 * d["D"] * hd) + q * k * hd for q, k in zip(nq, nk))
        if self.config.approx_attention:
            cost = 3 if self.config.attention_mode == "partial" else 1
            per_gate = [2 * d["D"] * d["Hkd"] + k * hd + q * cost * hd for q, k in zip(nq, nk)]
            gate_squared = float(cost * hd)
        else:
            base += sum(q * k * hd for q, k in zip(nq, nk))
            per_gate, gate_squared = [2 * d["D"] * d["Hkd"]] * len(nq), 0.0
        return float(base), upload(per_gate, torch.float64), gate_squared, float(3 * d["D"] * d["I"])

    def saved(self, batch_size: int) -> tuple[int, list[int]]:
        """Positions (x layers) the runner charged for the sparse forwards that their layers did not
        compute: padding, and the rows reused from the caches; in all and per request (one read)."""
        sparse = [r for r in self.records if r["layer_stats"] is not None]
        if not sparse:
            return 0, [0] * batch_size
        flat = torch.cat([t for r in sparse for t in (r["layer_stats"][:, 2].sum().reshape(1), r["request_rows"])])
        values, start, read = flat.tolist(), 0, []
        for r in sparse:
            read.append(values[start: start + 1 + len(r["row_ids"])])
            start += 1 + len(r["row_ids"])
        total, per_request = 0, [0] * batch_size
        for r, values in zip(sparse, read):
            charged_total, charged_rows = r["charged"]
            total += charged_total - int(round(values[0]))
            for b, charged, computed in zip(r["row_ids"], charged_rows, values[1:]):
                per_request[b] += charged - int(round(computed))
        return total, per_request

    def stats(self, tau: float) -> dict:
        """Totals over the run plus one record per forward (see the module docstring); the
        per-layer counts the sparse forwards kept on the device are read here, once."""
        layers = self.num_layers
        sparse_stats = [r["layer_stats"] for r in self.records if r["layer_stats"] is not None]
        read = torch.stack(sparse_stats).tolist() if sparse_stats else []
        recs, k = [], 0
        for r in self.records:
            fed = r["fed"]
            if r["layer_stats"] is None:
                gating = salient = union = exact = [fed] * layers
                macs = r["dense_macs"]
            else:
                per_layer = read[k]
                k += 1
                gating, salient, union, exact = ([int(row[j]) for row in per_layer] for j in range(4))
                macs = sum(row[4] for row in per_layer)
            recs.append({
                "step": r["step"], "mode": r["mode"], "rows": r["rows"], "fed": fed,
                "salient_fraction": [x / fed if fed else 0.0 for x in salient],
                "gating": gating,
                "attn_exact": exact, "attn_approx": [fed - e for e in exact],
                "ffn_computed": salient, "ffn_skipped": [fed - x for x in salient],
                "positions_computed": sum(union), "positions_dense": r["positions_dense"],
                "macs": macs, "dense_macs": r["dense_macs"],
            })
        sparse = [r for r in recs if r["mode"] != "full"]
        fed = sum(r["fed"] for r in sparse)
        per_layer = [sum(r["ffn_computed"][layer] for r in sparse) / fed if fed else None for layer in range(layers)]
        fed_sparse = fed * layers
        dense_macs = sum(r["dense_macs"] for r in recs)
        return {
            "tau": tau,
            "full_steps": self.config.full_steps,
            "prompt_period": self.config.prompt_period,
            "approx_attention": self.config.approx_attention,
            "key_correction": self.config.key_correction,
            "forwards": {m: sum(r["mode"] == m for r in recs) for m in ("full", "prompt", "response")},
            "salient_fraction": (sum(sum(r["ffn_computed"]) for r in sparse) / fed_sparse) if fed_sparse else None,
            "salient_fraction_per_layer": per_layer,
            "ffn_computed": sum(sum(r["ffn_computed"]) for r in recs),
            "ffn_skipped": sum(sum(r["ffn_skipped"]) for r in recs),
            "attn_exact": sum(sum(r["attn_exact"]) for r in recs),
            "attn_approx": sum(sum(r["attn_approx"]) for r in recs),
            "positions_computed": sum(r["positions_computed"] for r in recs),
            "positions_computed_dense": sum(r["positions_dense"] for r in recs),
            "ideal_flop_ratio": (sum(r["macs"] for r in recs) / dense_macs) if dense_macs else None,
            "macs": sum(r["macs"] for r in recs),
            "dense_macs": dense_macs,
            "steps": recs,
        }
