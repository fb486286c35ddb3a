"""Record what ``generate`` returns in every mode, and check that a change left it unchanged.

A refactor of the runtime proves itself by unchanged outputs, token for token. This script
decodes a fixed set of workloads in every mode the engine offers and writes, per mode, the
returned sequences and the statistics that should not move either (NFE, tokens computed, steps,
Seer's cuts and guard events, DyLLM's computed rows):

* the embedded demo model on its 192 held-out demo requests (batch 16): the baseline, each Seer
  probe, DyLLM in each attention mode, Seer+DyLLM, the router with and without the prefix cache
  (eager and through the fake graph backend), Seer+router+DyLLM;
* every model family on tiny random models (LLaDA, MMaDA, Dream, LaViDa-LLaDA, LaViDa-Dream),
  left-padded batches: greedy and sampled decoding (per-request and global generators), the
  remasking strategies and Dream's algorithms, classifier-free guidance, Seer, DyLLM, the router
  (with a fixed cut, as the serving benchmarks drive it) and their compositions.

Usage (from the repository root; a path ending in ``.gz`` is read and written gzipped)::

    PYTHONPATH=. .venv/bin/python -m bench.outputs_unchanged record out/before.json.gz   # old tree
    PYTHONPATH=. .venv/bin/python -m bench.outputs_unchanged compare out/before.json.gz  # new tree

``bench/records/outputs_1ed0d9b.json.gz`` is the record of commit 1ed0d9b (before the runtime
redesign); ``compare`` against it checks that nothing a refactor touched changed what it returns.

``compare`` decodes again and reports every mode whose sequences or statistics differ; it exits 1
when any does. ``--only SUBSTRING`` restricts both to the modes whose name contains it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
import warnings
from pathlib import Path

import torch

import model_adapters as ma
from seer_runtime import DyLLMConfig, GenerationConfig, generate

try:  # the runtime's layout after the engine's split (issue 32)
    from seer_runtime.graphs import FakeGraphBackend, RecordingGraphBackend
    from seer_runtime.seer import SeerConfig
    from seer_runtime.serving.router import RouterConfig
except ImportError:
    try:  # the layout from the first redesign to 558b74e
        from seer_runtime.serving.graph_cache import FakeGraphBackend, RecordingGraphBackend

        from seer_runtime.seer import SeerConfig
        from seer_runtime.serving.router import RouterConfig
    except ImportError:  # the layout before it (commit 1ed0d9b)
        from seer_runtime.graph_cache import FakeGraphBackend
        from seer_runtime.router import RouterConfig

        RecordingGraphBackend = None

        from seer_runtime.seer import SeerConfig


def fixed_cut(keep_len: list[int]) -> dict:
    """generate() keywords that cut every request to ``keep_len`` at step 0 (no probe, no guard)."""
    try:
        from bench.workloads import OracleCut
    except ImportError:
        return {"seer": SeerConfig(probe="oracle", oracle_keep_len=tuple(keep_len), guard=False)}
    return {"policies": [OracleCut(keep_len)]}


def summary(out) -> dict:
    """What must not change: sequences and the statistics a refactor leaves alone."""
    st = out.stats
    # the work figures as the records name them (positions x layers: tokens_computed before issue 37's
    # rename; the dense figure is the one a layout charges, DyLLM's reused rows included)
    dense = getattr(st, "positions_computed_dense", None)
    rec = {"sequences": out.sequences.tolist(), "nfe": st.nfe,
           "tokens_computed": dense if dense is not None else st.tokens_computed,
           "tokens_computed_per_request": list(getattr(st, "positions_computed_per_request", None)
                                               or st.tokens_computed_per_request), "steps": list(st.steps)}
    seer = st.extra.get("seer")
    if seer is not None:
        rec["seer"] = {k: seer[k] for k in ("keep_len", "boundary", "final_window", "guard_events",
                                            "premature_cuts", "tightened")}
    dy = st.extra.get("dyllm")
    if dy is not None:
        renamed = {"tokens_computed": "positions_computed", "tokens_computed_dense": "positions_computed_dense"}
        rec["dyllm"] = {k: dy[renamed[k]] if renamed.get(k) in dy else dy[k]
                        for k in ("forwards", "ffn_computed", "ffn_skipped", "attn_exact", "attn_approx",
                                  "tokens_computed", "tokens_computed_dense")}
    router = st.extra.get("router")
    if router is not None:
        rec["router"] = router
    return rec


# ------------------------------------------------------------------------------------ embedded
def embedded_modes(only: str | None):
    from model_adapters.embedded import serving

    model, tokenizer = serving.load_embedded()
    requests, _ = serving.demo_requests(192, tokenizer)
    gen = serving.demo_generation_config()
    shipped = serving.default_seer_config()
    dyllm = serving.default_dyllm_config()
    seer = {p: SeerConfig.from_dict({**shipped.__dict__, "probe": p}) for p in ("sparsity", "eos_prob", "both")}
    seer_extend = SeerConfig.from_dict({**shipped.__dict__, "probe": "sparsity", "guard_mode": "extend"})
    router = RouterConfig.for_window(gen.gen_length, max_batch=16)
    fast = gen.replace(threshold=0.9)
    modes = {
        "embedded/baseline": {},
        "embedded/seer:sparsity": {"seer": seer["sparsity"]},
        "embedded/seer:sparsity:extend": {"seer": seer_extend},
        "embedded/seer:eos_prob": {"seer": seer["eos_prob"]},
        "embedded/seer:both": {"seer": seer["both"]},
        "embedded/dyllm:shipped": {"dyllm": dyllm},
        "embedded/dyllm:partial": {"dyllm": DyLLMConfig.for_model(model)},
        "embedded/dyllm:paper": {"dyllm": DyLLMConfig.for_model(model, key_correction=False)},
        "embedded/dyllm:exact": {"dyllm": DyLLMConfig.for_model(model, approx_attention=False)},
        "embedded/seer:eos_prob+dyllm": {"seer": seer["eos_prob"], "dyllm": dyllm},
        "embedded/seer:sparsity+dyllm": {"seer": seer["sparsity"], "dyllm": dyllm},
        "embedded/seer:eos_prob+router": {"seer": seer["eos_prob"], "router": router},
        "embedded/seer:eos_prob+router:graphs": {"seer": seer["eos_prob"], "router": router, "graphs": "fake"},
        "embedded/seer:eos_prob+router:no_cache": {"seer": seer["eos_prob"], "router": router,
                                                   "gen": gen.replace(prefix_cache=False)},
        "embedded/router": {"router": router},
        "embedded/seer:sparsity+router+dyllm": {"seer": seer["sparsity"], "router": router, "dyllm": dyllm},
        "embedded/threshold": {"gen": fast},
        "embedded/seer:eos_prob+threshold": {"seer": seer["eos_prob"], "gen": fast},
        "embedded/seer:eos_prob+threshold+dyllm": {"seer": seer["eos_prob"], "dyllm": dyllm, "gen": fast},
        "embedded/threshold+cache:dual": {"gen": fast.replace(block_cache="dual")},
        "embedded/seer:eos_prob+threshold+cache:dual": {"seer": seer["eos_prob"],
                                                         "gen": fast.replace(block_cache="dual")},
        "embedded/graphs:baseline": {"graphs": "recording"},
        "embedded/graphs:seer:eos_prob+dyllm": {"seer": seer["eos_prob"], "dyllm": dyllm, "graphs": "recording"},
        "embedded/graphs:seer:eos_prob+threshold": {"seer": seer["eos_prob"], "gen": fast, "graphs": "recording"},
    }
    for name, kw in modes.items():
        if only and only not in name:
            continue
        yield name, lambda kw=kw: [
            summary(_generate(model, batch, kw.get("gen", gen), kw))
            for batch in _batches(requests, 16, model)
        ]


def arith_modes(only: str | None):
    """The long-answer workload (text-only LLaDA, 128 positions in blocks of 32) on 32 held-out requests."""
    from model_adapters.embedded.arith import serving

    model, tokenizer = serving.load_embedded()
    requests, _ = serving.demo_requests(32, tokenizer)
    gen = serving.demo_generation_config()
    seer = serving.default_seer_config()
    dyllm = serving.default_dyllm_config()
    fast = gen.replace(threshold=0.9, steps=None)
    modes = {
        "arith/baseline": {},
        "arith/seer": {"seer": seer},
        "arith/dyllm": {"dyllm": dyllm},
        "arith/threshold+cache:dual": {"gen": fast.replace(block_cache="dual")},
        "arith/seer+threshold+cache:dual": {"seer": seer, "gen": fast.replace(block_cache="dual")},
        "arith/seer+threshold+dyllm:graphs": {"seer": seer, "dyllm": dyllm, "gen": fast, "graphs": "recording"},
    }
    for name, kw in modes.items():
        if only and only not in name:
            continue
        yield name, lambda kw=kw: [
            summary(_generate(model, batch, kw.get("gen", gen), kw))
            for batch in _batches(requests, 16, model)
        ]


def _batches(requests, size, model):
    from seer_runtime.evaluate import pad_left

    for start in range(0, len(requests), size):
        part = requests[start: start + size]
        ids, mask = pad_left([r.prompt_ids for r in part], model.token_ids.pad)
        yield ids, mask, [r.image for r in part] if model.is_multimodal else None


def _generate(model, batch, gen, kw):
    ids, mask, images = batch
    kw = {k: v for k, v in kw.items() if k != "gen"}
    if kw.get("graphs") == "fake":
        kw["graphs"] = FakeGraphBackend()
    elif kw.get("graphs") == "recording":  # a CUDA graph's semantics on the CPU
        kw["graphs"] = RecordingGraphBackend()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return generate(model, ids, attention_mask=mask, images=images, gen=gen, **kw)


# ------------------------------------------------------------------------------------ tiny models
def tiny(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    model = ma.build_model(ma.tiny_config(kind))
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    return model


def tiny_batch(kind: str):
    gen = torch.Generator().manual_seed(7)
    lengths = [9, 5, 12, 7]
    prompts = [torch.randint(0, 240, (n,), generator=gen).tolist() for n in lengths]
    from seer_runtime.evaluate import pad_left

    images = None
    if kind.startswith("lavida"):
        prompts = [[p[0], ma.IMAGE_TOKEN_INDEX, *p[1:]] for p in prompts]
        images = [ma.ImageInput(torch.randn(1, 3, 32, 32, generator=gen), (32, 32)) for _ in prompts]
    ids, mask = pad_left(prompts, 251)
    return ids, mask, images


def tiny_modes(only: str | None):
    kinds = ["llada-8b-instruct", "mmada-8b", "dream-v0-instruct-7b", "lavida-llada", "lavida-dream"]
    for kind in kinds:
        family = "dream" if "dream" in kind else "llada"
        lavida = kind.startswith("lavida")
        base = GenerationConfig(gen_length=16, steps=16, block_length=None if family == "dream" else 8)
        seer_probe = SeerConfig(probe_layer=1, eps=0.05, tau_jump=0.01, gamma=1.0)
        seer_eos = SeerConfig(probe="eos_prob", probe_layer=1, eos_threshold=0.004)
        modes = {
            "baseline": {"gen": base},
            "sampled:per_request": {"gen": base.replace(temperature=0.8, rng="per_request", seed=3)},
            "sampled:global": {"gen": base.replace(temperature=0.7, seed=5)},
            "stable": {"gen": base.replace(tie_break="stable")},
            "seer:sparsity": {"gen": base, "seer": seer_probe},
            "seer:eos_prob": {"gen": base, "seer": seer_eos},
            "seer:both": {"gen": base, "seer": SeerConfig(probe="both", probe_layer=1, eps=0.05, tau_jump=0.01,
                                                           gamma=1.0, eos_threshold=0.004)},
            "seer:redecode": {"gen": base, "seer": SeerConfig(probe_layer=1, eps=0.05, tau_jump=0.01, gamma=1.0,
                                                              guard_mode="redecode")},
            "dyllm": {"gen": base, "dyllm": DyLLMConfig(tau=0.999, full_steps=2, prompt_period=3)},
            "dyllm:paper": {"gen": base, "dyllm": DyLLMConfig(tau=0.999, full_steps=2, key_correction=False)},
            "dyllm:exact": {"gen": base, "dyllm": DyLLMConfig(tau=0.999, full_steps=2, approx_attention=False)},
            "dyllm:all_salient": {"gen": base, "dyllm": DyLLMConfig(tau=2.0, full_steps=1, prompt_period=1)},
            "seer+dyllm": {"gen": base, "seer": seer_probe, "dyllm": DyLLMConfig(tau=0.999, full_steps=2)},
            "router": {"gen": base, "router": RouterConfig.for_window(16, max_batch=4)},
            "cut+router": {"gen": base, "router": RouterConfig.for_window(16, max_batch=4),
                           **fixed_cut([3, 16, 9, 12])},
            "cut+router:graphs": {"gen": base.replace(prefix_cache=True), "graphs": "fake",
                                  "router": RouterConfig.for_window(16, max_batch=4), **fixed_cut([11, 12, 9, 12])},
            "cut+router:packed": {"gen": base.replace(prefix_cache=True),
                                  "router": RouterConfig.for_window(16, max_batch=4), **fixed_cut([2, 16, 9, 5])},
            "seer+router+dyllm": {"gen": base, "seer": seer_eos, "router": RouterConfig.for_window(16, max_batch=4),
                                  "dyllm": DyLLMConfig(tau=0.999, full_steps=2)},
        }
        # thresholds at which these random models commit varied numbers of tokens per step
        threshold = 0.017 if kind == "llada-8b-instruct" else 0.021
        fast = base.replace(steps=None, threshold=threshold, alg="maskgit_plus" if family == "dream" else "origin")
        modes.update({
            "threshold": {"gen": fast},
            "threshold:stable": {"gen": fast.replace(tie_break="stable")},
            "threshold+seer": {"gen": fast, "seer": seer_eos},
            "threshold+dyllm": {"gen": fast, "dyllm": DyLLMConfig(tau=0.999, full_steps=2)},
            "threshold+seer+dyllm": {"gen": fast, "seer": seer_eos, "dyllm": DyLLMConfig(tau=0.999, full_steps=2)},
            "graphs:baseline": {"gen": base, "graphs": "recording"},
            "graphs:stable": {"gen": base.replace(tie_break="stable"), "graphs": "recording"},
            "graphs:seer": {"gen": base, "seer": seer_eos, "graphs": "recording"},
            "graphs:dyllm": {"gen": base, "dyllm": DyLLMConfig(tau=0.999, full_steps=2), "graphs": "recording"},
            "graphs:threshold": {"gen": fast, "graphs": "recording"},
            "graphs:threshold:stable": {"gen": fast.replace(tie_break="stable"), "graphs": "recording"},
            "graphs:cut+router:packed": {"gen": base.replace(prefix_cache=True), "graphs": "recording",
                                         "router": RouterConfig.for_window(16, max_batch=4),
                                         **fixed_cut([2, 16, 9, 5])},
            "graphs:cut+router:static": {"gen": base.replace(prefix_cache=True), "graphs": "recording",
                                         "router": RouterConfig.for_window(16, max_batch=4),
                                         **fixed_cut([11, 12, 9, 12])},
        })
        if family == "llada":
            modes.update({
                "cache:prefix": {"gen": base.replace(block_cache="prefix")},
                "cache:dual": {"gen": base.replace(block_cache="dual")},
                "threshold+cache:prefix": {"gen": fast.replace(block_cache="prefix")},
                "threshold+cache:dual": {"gen": fast.replace(block_cache="dual")},
                "threshold+cache:dual+seer": {"gen": fast.replace(block_cache="dual"), "seer": seer_eos},
                "graphs:threshold+cache:dual": {"gen": fast.replace(block_cache="dual"), "graphs": "recording"},
                "random": {"gen": base.replace(remasking="random", temperature=0.5, seed=11)},
                "margin": {"gen": base.replace(remasking="margin")},
                "entropy": {"gen": base.replace(remasking="entropy")},
                "eos_knobs": {"gen": base.replace(logits_eos_inf=True, confidence_eos_eot_inf=True)},
            })
            if not lavida:
                modes["cfg"] = {"gen": base.replace(cfg_scale=1.5)}
                modes["cfg+seer"] = {"gen": base.replace(cfg_scale=1.5), "seer": seer_probe}
                modes["cfg+seer+router"] = {"gen": base.replace(cfg_scale=1.5), "seer": seer_eos,
                                            "router": RouterConfig.for_window(16, max_batch=4)}
        else:
            for alg in ("maskgit_plus", "topk_margin", "entropy"):
                modes[alg] = {"gen": base.replace(alg=alg)}
                modes[f"{alg}+seer"] = {"gen": base.replace(alg=alg), "seer": seer_probe}
            modes["alg_temp"] = {"gen": base.replace(alg="entropy", alg_temp=0.3, temperature=0.6, top_p=0.9,
                                                     seed=2)}
        if lavida:
            modes["no_cache"] = {"gen": base.replace(prefix_cache=False)}
            modes["no_cache+dyllm"] = {"gen": base.replace(prefix_cache=False),
                                       "dyllm": DyLLMConfig(tau=0.999, full_steps=2, prompt_period=2)}
            modes["schedule:shift"] = {"gen": base.replace(schedule="shift", schedule_shift=0.33, step_ratio=0.5)}
            modes["schedule:cosine"] = {"gen": base.replace(schedule="cosine")}
        for mode, kw in modes.items():
            name = f"tiny/{kind}/{mode}"
            if only and only not in name:
                continue

            def run(kind=kind, kw=kw):
                model = tiny(kind)
                return [summary(_generate(model, tiny_batch(kind), kw["gen"], kw))]

            yield name, run


def all_modes(only: str | None):
    yield from tiny_modes(only)
    yield from embedded_modes(only)
    yield from arith_modes(only)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["record", "compare"])
    parser.add_argument("path", help="the record (JSON) to write or to compare against")
    parser.add_argument("--only", default=None, help="only the modes whose name contains this")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from seer_kernels import kernel_backend

    results, seconds = {}, {}
    with kernel_backend("reference"):
        for name, run in all_modes(args.only):
            t0 = time.perf_counter()
            torch.manual_seed(0)
            results[name] = run()
            seconds[name] = time.perf_counter() - t0
            print(f"{name:60s} {seconds[name]:6.1f}s", file=sys.stderr, flush=True)
    path = Path(args.path)
    opener = gzip.open if path.suffix == ".gz" else open
    if args.action == "record":
        path.parent.mkdir(parents=True, exist_ok=True)
        with opener(path, "wt") as f:
            json.dump({"modes": results, "seconds": seconds}, f)
        print(f"recorded {len(results)} modes in {args.path}")
        return 0
    with opener(path, "rt") as f:
        before = json.load(f)["modes"]
    changed = []
    for name, got in results.items():
        if name not in before:
            print(f"NEW      {name} (not in the record)")
            continue
        want = before[name]
        if "cut+router" in name:  # the fixed cut was Seer's "oracle" probe before the redesign, a bench
            # policy (bench.workloads.OracleCut) after it: only the former reported Seer statistics
            want = [{k: v for k, v in w.items() if k != "seer"} for w in want]
        same_tokens = [g["sequences"] for g in got] == [w["sequences"] for w in want]
        diff = sorted({k for g, w in zip(got, want) for k in set(g) | set(w) if g.get(k) != w.get(k)})
        if diff:
            changed.append(name)
        status = "same" if not diff else ("STATS" if same_tokens else "TOKENS")
        print(f"{status:8s} {name}" + (f"  (differs: {', '.join(diff)})" if diff else ""))
    missing = [n for n in before if n not in results and not (args.only and args.only not in n)]
    for n in missing:
        print(f"MISSING  {n}")
    print(f"{len(results) - len(changed)} of {len(results)} modes unchanged" + (f"; changed: {changed}" if changed
                                                                             else ""))
    return 1 if changed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
