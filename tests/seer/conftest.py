"""Fixtures of the Seer tests: a scripted LM head (a known answer per request, decoded left to
right) and planted SNR boundaries."""

from __future__ import annotations

import pytest
import torch

import seer_kernels
from seer_runtime import GenerationConfig, generate
from seer_runtime.evaluate import pad_left
from seer_runtime.runner import ModelRunner

from ..tiny_models import tiny

#: the response window of the scripted tests (the script pads every answer to it with EOS)
W = 12


@pytest.fixture
def scripted(monkeypatch):
    """Make ``model.head`` emit a fixed window per request: answer, end-of-turn, EOS padding,
    earlier positions more confident (so decoding goes left to right)."""
    rows_of_forward = {}
    original = ModelRunner._compute

    def compute(self, fwd):  # remember which requests the forward's rows are
        rows_of_forward["rows"] = fwd.rows
        try:
            return original(self, fwd)
        finally:
            rows_of_forward.pop("rows", None)

    monkeypatch.setattr(ModelRunner, "_compute", compute)
    return lambda model, answers: _scripted(model, answers, rows_of_forward)


def _scripted(model, answers, rows_of_forward):
    ids = model.token_ids

    def head(hidden):
        rows, length = hidden.shape[0], hidden.shape[1]
        logits = torch.zeros(rows, length, model.vocab_size)
        requests = rows_of_forward.get("rows", list(range(rows)))
        for r in range(rows):
            script = answers[requests[r]] + [ids.eot] + [ids.eos] * W
            for j in range(length):
                logits[r, j, script[j]] = 12.0 + 0.1 * (W - j)
        return logits

    model.head = head
    return model


@pytest.fixture
def plant(monkeypatch):
    """Replace the SNR scan with fixed lengths: plant(first=[...], later=[...])."""
    def _plant(first, later=None):
        calls = []

        def fake(profile, valid_len, **kw):
            calls.append((tuple(profile.shape), kw))
            if kw.get("min_position", 1) > 1 and later is not None:
                return torch.tensor(later[: profile.shape[0]], dtype=torch.int32)
            return torch.tensor(first[: profile.shape[0]], dtype=torch.int32)

        monkeypatch.setattr(seer_kernels, "snr_boundary", fake)
        return calls
    return _plant


#: a left-padded batch of three prompts and the boundaries planted for them (keep 4, 11 and 7)
MIXED_PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
MIXED_KEEPS = [4, 11, 7]


def mixed_cuts_batch_and_alone(kind, plant, cfg):
    """Decode :data:`MIXED_PROMPTS` together with :data:`MIXED_KEEPS` planted, then each alone with
    its own planted boundary, assert every request's response is the same both ways, and return the
    batch's output (tiny ``kind`` model, seed 3, window ``W``, stable ties, blocks of 4 on LLaDA,
    Dream's entropy order)."""
    model = tiny(kind, seed=3)
    gen = GenerationConfig(gen_length=W, tie_break="stable", block_length=4 if model.family == "llada" else None,
                           alg="entropy" if model.family == "dream" else "origin")
    ids, mask = pad_left(MIXED_PROMPTS, model.token_ids.pad)
    plant(MIXED_KEEPS)
    batch = generate(model, ids, attention_mask=mask, gen=gen, seer=cfg)
    for r, p in enumerate(MIXED_PROMPTS):
        plant([MIXED_KEEPS[r]])
        alone = generate(model, torch.tensor([p]), gen=gen, seer=cfg)
        assert batch.responses[r].tolist() == alone.responses[0].tolist(), f"request {r}"
    return batch
