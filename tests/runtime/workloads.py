"""The tiny workloads the sync audit and the graph-replay tests decode: every family, a left-padded
batch of four (images for LaViDa), and every mode the engine composes (baseline, each Seer probe,
DyLLM's attention modes, Seer+DyLLM, the router's static / packed paths after a fixed cut, with
and without the prefix cache, Seer+router+DyLLM, CFG, confidence thresholds alone and with Seer,
DyLLM and the block caches, every commit rule greedy - LLaDA's remasking strategies (random too),
Dream's algorithms - both tie-breaks, and early stop at the end token)."""

from __future__ import annotations

import torch

import model_adapters as ma
from bench.workloads import OracleCut
from seer_runtime import DyLLMConfig, GenerationConfig, SeerConfig
from seer_runtime.evaluate import pad_left
from seer_runtime.serving.router import RouterConfig

W, PROMPT, B = 16, 8, 4
KINDS = ["llada-8b-instruct", "mmada-8b", "dream-v0-instruct-7b", "lavida-llada", "lavida-dream"]


def batch(model):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 240, (n,), generator=g).tolist() for n in (PROMPT, 5, 7, 3)]
    images = None
    if model.is_multimodal:
        prompts = [[p[0], ma.IMAGE_TOKEN_INDEX, *p[1:]] for p in prompts]
        images = [ma.ImageInput(torch.randn(1, 3, 32, 32, generator=g), (32, 32)) for _ in prompts]
    ids, mask = pad_left(prompts, model.token_ids.pad)
    return ids, mask, images


def modes(model):
    gen = GenerationConfig(gen_length=W, steps=W, block_length=None if model.family == "dream" else 8,
                           tie_break="stable", alg="entropy" if model.family == "dream" else "origin")
    router = RouterConfig.for_window(W, max_batch=B)
    seer = dict(probe_layer=1, eps=0.05, tau_jump=0.01, gamma=1.0)
    out = {
        "baseline": (gen, {}),
        "seer:sparsity": (gen, {"seer": SeerConfig(**seer)}),
        "seer:eos_prob": (gen, {"seer": SeerConfig(probe="eos_prob", probe_layer=1, eos_threshold=0.004)}),
        "dyllm:partial": (gen, {"dyllm": DyLLMConfig(tau=0.999, full_steps=2, prompt_period=3)}),
        "dyllm:exact": (gen, {"dyllm": DyLLMConfig(tau=0.999, full_steps=2, approx_attention=False)}),
        "seer+dyllm": (gen, {"seer": SeerConfig(**seer), "dyllm": DyLLMConfig(tau=0.999, full_steps=2)}),
        "cut+router:static": (gen.replace(prefix_cache=True), {"policies": [OracleCut([16, 16, 15, 16])],
                                                              "router": router, "graphs": "fake"}),
        "cut+router:packed": (gen, {"policies": [OracleCut([2, 16, 9, 5])], "router": router}),
        "cut+router:packed+cache": (gen.replace(prefix_cache=True), {"policies": [OracleCut([2, 16, 9, 5])],
                                                                    "router": router}),
        "seer+router+dyllm": (gen, {"seer": SeerConfig(**seer), "router": router,
                                    "dyllm": DyLLMConfig(tau=0.999, full_steps=2)}),
    }
    # confidence-threshold parallel decoding (a step's commits decided on the device) and its
    # compositions; Fast-dLLM's block caches for the LLaDA family
    fast = gen.replace(threshold=0.3, steps=None, alg="maskgit_plus" if model.family == "dream" else "origin")
    out["threshold"] = (fast, {})
    out["threshold+seer"] = (fast, {"seer": SeerConfig(**seer)})
    out["threshold+dyllm"] = (fast, {"dyllm": DyLLMConfig(tau=0.999, full_steps=2)})
    out["threshold:reference"] = (fast.replace(tie_break="reference"), {})
    out["reference"] = (gen.replace(tie_break="reference"), {})
    if model.family == "llada":
        for remasking in ("random", "margin", "entropy"):  # (seeded: random draws)
            out[f"remasking:{remasking}"] = (gen.replace(remasking=remasking, seed=5), {})
        out["threshold:reference+block_cache:dual"] = (fast.replace(tie_break="reference", block_cache="dual"), {})
    else:
        for alg in ("origin", "maskgit_plus", "topk_margin"):  # (seeded: origin draws which positions commit)
            out[f"alg:{alg}"] = (gen.replace(alg=alg, seed=5), {})
    if model.family == "llada":
        out["threshold+block_cache:prefix"] = (fast.replace(block_cache="prefix"), {})
        out["threshold+block_cache:dual"] = (fast.replace(block_cache="dual"), {"seer": SeerConfig(**seer)})
        out["block_cache:dual"] = (gen.replace(block_cache="dual"), {})
    # early stop's check joins the step's one read (tests/runtime/test_early_stop.py: the answers)
    out["early_stop"] = (gen.replace(early_stop=True), {})
    out["early_stop+threshold+seer+dyllm"] = (fast.replace(early_stop=True), {"seer": SeerConfig(**seer),
                                                                             "dyllm": DyLLMConfig(tau=0.999,
                                                                                                  full_steps=2)})
    if model.family == "llada" and not model.is_multimodal:
        out["cfg"] = (gen.replace(cfg_scale=1.0), {})
        out["cfg+seer"] = (gen.replace(cfg_scale=1.0), {"seer": SeerConfig(**seer)})
    return out
