"""The ``arith`` workload: a small text-only LLaDA trained on arithmetic word problems with long,
uncertain worked solutions (``tasks.py``), shipped beside the embedded demo model.

Where the demo model answers in 1-30 tokens of a 32-position window and is near-certain at step
0, this one answers in 20-120 tokens of a 128-position window decoded in blocks of 32, and the
wording of each answer is uncertain (step order, optional sentences, synonyms), as LLaDA's GSM8K
answers are: every speed-up is measured where steps and lengths matter.

Files (in :data:`ARITH_DIR`, written by ``python -m model_adapters.embedded.train --workload
arith``): ``config.json`` and ``model.safetensors`` (fp16), ``tokenizer.json`` (word-level, the
demo tokenizer's special tokens and chat template, numbers ``0``..``99`` one token each),
``seer_generation_config.json`` (the decoding defaults a checkpoint carries), ``train_log.json``, and the calibrated
``seer_config.json`` and ``dyllm_config.json``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .. import EmbeddedTokenizer, build_tokenizer

ARITH_DIR = Path(__file__).resolve().parent
RESPONSE_WINDOW = 128
BLOCK_LENGTH = 32


def build_arith_tokenizer():
    """The workload's word-level ``tokenizers.Tokenizer`` (special tokens first, as the demo's)."""
    from .tasks import vocabulary_words

    return build_tokenizer(vocabulary_words())


def load_arith(dtype: torch.dtype | None = None, device: str | torch.device = "cpu", path=None):
    """Load the shipped model and tokenizer offline: ``(model, EmbeddedTokenizer)``.

    dtype: None -> float32 (stored in fp16, upcast for CPU use); path: another directory the
    trainer wrote for this workload.
    """
    from model_adapters.loading import load_model

    folder = Path(path) if path is not None else ARITH_DIR
    model = load_model(folder, dtype=torch.float32 if dtype is None else dtype, device=device)
    return model, EmbeddedTokenizer(folder / "tokenizer.json")


__all__ = ["ARITH_DIR", "BLOCK_LENGTH", "RESPONSE_WINDOW", "build_arith_tokenizer", "load_arith"]
