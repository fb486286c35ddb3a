"""Adapters for the evaluation harnesses users measure models with.

* :mod:`seer_runtime.harness.lm_eval` - lm-evaluation-harness (text): the model ``seer``
  (``python -m seer_runtime.harness.lm_eval --model seer --model_args pretrained=DIR,...``).
* :mod:`seer_runtime.harness.lmms_eval` - lmms-eval (images): the model ``seer_lavida``, found
  by lmms-eval through the entry point ``lmms_eval.models`` (:func:`lmms_eval_models`).

Importing ``seer_runtime`` or this package imports no harness: each adapter module imports its
harness (``pip install -e ".[eval]"``; lmms-eval as the Makefile installs it) when imported itself.
"""

from __future__ import annotations

LMMS_MODEL_NAME = "seer_lavida"


def lmms_eval_models() -> list:
    """The ``lmms_eval.models`` entry point's payload: the manifest of ``seer_lavida`` (its class is
    imported by lmms-eval when the model is asked for)."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return [ModelManifest(model_id=LMMS_MODEL_NAME,
                          simple_class_path="seer_runtime.harness.lmms_eval.SeerLavida")]
