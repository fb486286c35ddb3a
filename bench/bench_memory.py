"""Peak memory of ``generate`` at batch 256 on the embedded model, and the graph cache's footprint.

Each mode runs in a fresh process (so one mode's freed memory cannot hide the next one's peak):
the embedded model is loaded, the process's peak resident set is reset
(``/proc/self/clear_refs``), one batch of held-out requests is decoded, and the rise of the peak
(``VmHWM``) over the resident set before the call is reported: activations, caches, logits and
the allocator's own slack, the weights excluded. Beside it, the sizes the design predicts:

* ``prefix KV`` - the prompt cache, ``layers x 2 x B x kv_heads x prompt_len x head_dim x bytes``;
* ``logits`` - one step's window logits, ``B x window x vocab x 4`` bytes;
* ``bucket buffers`` - the router's persistent input buffers of the static buckets it served (ids,
  positions, key mask, the group's prefix K/V per layer), allocated when a bucket is first served.

    .venv/bin/python -m bench.bench_memory [--batch 256] [--json out/memory.json]
    .venv/bin/pytest bench/bench_memory.py -m bench --benchmark-disable   # smoke: batch 8 (CI)

Measured figures: bench/RESULTS.md ("Memory at batch 256").
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import warnings

import pytest

pytestmark = pytest.mark.bench

#: "static+graphs": every group on the static path (tau_pad 1), replayed through the fake graph backend
MODES = ("baseline", "seer", "seer+router", "seer+router:static+graphs", "seer+dyllm")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(mode: str, batch: int, threads: int) -> dict:
    """One mode in this process: peak resident rise of one ``generate`` call and the predicted sizes."""
    import torch

    torch.set_num_threads(threads)
    from model_adapters.embedded.serving import (
        default_seer_config,
        demo_generation_config,
        demo_requests,
        load_embedded,
    )
    from seer_kernels import kernel_backend
    from seer_runtime import DyLLMConfig, generate
    from seer_runtime.evaluate import pad_left
    from seer_runtime.graphs import BucketInputs, FakeGraphBackend
    from seer_runtime.serving import routed
    from seer_runtime.serving.router import RouterConfig

    buckets: list[BucketInputs] = []

    class RecordedBucket(BucketInputs):  # the bench's window on the buckets a routed run allocates
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            buckets.append(self)

    model, tokenizer = load_embedded()
    requests, _ = demo_requests(batch, tokenizer)
    gen = demo_generation_config()
    ids, mask = pad_left([r.prompt_ids for r in requests], model.token_ids.pad)
    images = [r.image for r in requests]
    kwargs = {}
    if mode != "baseline":
        kwargs["seer"] = default_seer_config()
    if "router" in mode:
        kwargs["router"] = RouterConfig.for_window(gen.gen_length, max_batch=batch,
                                                   tau_pad=1.0 if "static" in mode else 0.2)
        kwargs["graphs"] = FakeGraphBackend() if "graphs" in mode else "auto"
    if "dyllm" in mode:
        kwargs["dyllm"] = DyLLMConfig.for_model(model)
    routed.BucketInputs = RecordedBucket
    try:
        with kernel_backend("reference"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the eager graph cache says so once; not a figure
            before = _status_kib("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current resident set
            t0 = time.perf_counter()
            out = generate(model, ids, attention_mask=mask, images=images, gen=gen, **kwargs)
            seconds = time.perf_counter() - t0
            peak = _status_kib("VmHWM")
    finally:
        routed.BucketInputs = BucketInputs
    prompt_len = _prompt_len(model, ids, mask, images)
    item = torch.finfo(model.dtype).bits // 8
    prefix_kv = model.num_layers * 2 * batch * model.num_kv_heads * prompt_len * model.head_dim * item
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    result = {
        "mode": mode, "batch": batch, "threads": threads, "seconds": round(seconds, 2),
        "peak_rise_mib": round((peak - before) / 1024, 1), "rss_before_mib": round(before / 1024, 1),
        "weights_mib": round(weights / 2**20, 2), "prompt_len": prompt_len,
        "prefix_kv_mib": round(prefix_kv / 2**20, 1),
        "logits_mib": round(batch * gen.gen_length * model.vocab_size * 4 / 2**20, 2),
        "positions_computed": out.stats.positions_computed,
        "paths": "/".join(sorted(out.stats.extra.get("router", {}))),
    }
    if buckets:
        graphs = out.stats.extra.get("graphs", {})
        result.update(buckets_served=len(buckets), graphs_captured=graphs.get("captures", 0),
                      bucket_buffers_mib=round(sum(b.nbytes for b in buckets) / 2**20, 1),
                      largest_bucket=max(f"{b.batch}x{b.length}" for b in buckets))
    return result


def _prompt_len(model, ids, mask, images) -> int:
    embeds, _ = model.embed_prompt(ids, mask, images)
    return embeds.shape[1]


def _child(mode: str, batch: int, threads: int, queue) -> None:
    queue.put(measure(mode, batch, threads))


def run_modes(modes, batch: int, threads: int) -> list[dict]:
    ctx = mp.get_context("spawn")
    results = []
    for mode in modes:
        queue = ctx.Queue()
        proc = ctx.Process(target=_child, args=(mode, batch, threads, queue))
        proc.start()
        results.append(queue.get())
        proc.join()
    return results


def table(results: list[dict]) -> str:
    cols = ["mode", "paths", "seconds", "peak_rise_mib", "prefix_kv_mib", "logits_mib", "bucket_buffers_mib",
            "buckets_served", "largest_bucket", "graphs_captured"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in results]
    return "\n".join(lines)


def test_memory_smoke():
    """Batch 8, the static path: the figures are produced and the buckets' buffers are seen (CI smoke)."""
    results = [measure("seer+router:static+graphs", 8, 1)]
    r = results[0]
    assert r["peak_rise_mib"] >= 0 and r["prefix_kv_mib"] > 0 and r["bucket_buffers_mib"] > 0, r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    results = run_modes(args.modes, args.batch, args.threads)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
