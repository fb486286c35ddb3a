"""Compose the engine with its policies: Seer (step-0 cut) and DyLLM (sparse steps).

A policy is a mixin over :class:`~seer_runtime.engine.DecodeRun` that overrides the fixed points
it needs (Seer: step 0's forward and the end of each step; DyLLM: the layer loop), so any
combination is one class: ``SeerPolicy``, ``RoutedPolicy`` (after the cut, every step through
the PWR router), ``DyLLMPolicy``, then ``DecodeRun``.
"""

from __future__ import annotations

from .engine import DecodeRun


def build_run(model, input_ids, attention_mask, images, gen, *, seer=None, dyllm=None, router=None,
              graphs="auto", progress=False) -> DecodeRun:
    bases = []
    if seer is not None:
        from .seer import SeerConfig, SeerPolicy

        if not isinstance(seer, SeerConfig):
            raise TypeError(f"seer must be a SeerConfig, got {type(seer).__name__}")
        bases.append(SeerPolicy)
    if router is not None:
        from .routed import RoutedPolicy
        from .router import RouterConfig

        if router is not True and not isinstance(router, RouterConfig):
            raise TypeError(f"router must be a RouterConfig or True, got {type(router).__name__}")
        bases.append(RoutedPolicy)
    if dyllm is not None:
        from .dyllm import DyLLMConfig, DyLLMPolicy

        if not isinstance(dyllm, DyLLMConfig):
            raise TypeError(f"dyllm must be a DyLLMConfig, got {type(dyllm).__name__}")
        bases.append(DyLLMPolicy)
    cls = type("PolicyRun", (*bases, DecodeRun), {})
    run = cls(model, input_ids, attention_mask, images, gen, progress=progress)
    if dyllm is not None:
        run.init_dyllm(dyllm)
    if router is not None:
        run.init_router(None if router is True else router, graphs=graphs)
    if seer is not None:
        run.init_seer(seer)
    return run
