"""How a request is decoded: the engine, its policies (Seer, DyLLM, routed serving), calibration.

``generate(model, input_ids, *, attention_mask=None, images=None, gen=GenerationConfig(...),
seer=None, dyllm=None, router=None, graphs="auto", policies=(), request_seeds=None)`` decodes a
batch with any model implementing ``seer_runtime.adapter.DiffusionAdapter`` (every
``model_adapters`` model does).

The names below are imported on first use, so that a model definition importing the adapter
contract (``seer_runtime.adapter``) does not load the engine.
"""

from __future__ import annotations

import importlib

# public name -> module that defines it
_EXPORTS = {
    "generate": "generation",
    "GenerationConfig": "config",
    "GenerationOutput": "batch",
    "GenerationStats": "batch",
    "Policy": "policy",
    "LayerHook": "policy",
    "SeerConfig": "seer",
    "DyLLMConfig": "dyllm",
    "RouterConfig": "serving.router",
    "NonFiniteError": "finite_check",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'seer_runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
