"""Adapters for the evaluation harnesses users measure models with.

* :mod:`seer_runtime.harness.lm_eval` - lm-evaluation-harness (text): the model ``seer``
  (``python -m seer_runtime.harness.lm_eval --model seer --model_args pretrained=DIR,...``).

Importing ``seer_runtime`` or this package imports no harness: each adapter module imports its
harness (installed with ``pip install -e ".[eval]"``) when it is imported itself.
"""
