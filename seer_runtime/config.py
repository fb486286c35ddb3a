"""Frozen, self-validating configuration objects, and the one rule they are stored by.

:class:`StoredConfig` gives every config (``GenerationConfig`` here, ``SeerConfig``,
``DyLLMConfig``, ``RouterConfig``) the same JSON form: an object holding the dataclass fields,
tuples as lists, and optionally a ``calibration`` record beside them (what ``seer calibrate``
measured; kept for people, ignored when loading). Any other key is an error that names it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .schedules import SCHEDULES

LLADA_REMASKING = ("low_confidence", "random", "margin", "entropy")
DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")

#: the key a stored config may carry beside its fields (measurements, not settings)
CALIBRATION_KEY = "calibration"


def check(cond: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``cond`` (the configs' validation idiom)."""
    if not cond:
        raise ValueError(message)


class StoredConfig:
    """Dictionary and JSON (de)serialisation shared by the frozen config dataclasses."""

    def to_dict(self) -> dict:
        """The fields as plain JSON values (tuples become lists)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    def replace(self, **changes):
        """A copy with ``changes`` applied (validated again)."""
        return type(self)(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})

    def to_json(self, path: str | Path, *, calibration: dict | None = None) -> None:
        """Write the fields, and the ``calibration`` record beside them when given."""
        data = self.to_dict()
        if calibration is not None:
            data[CALIBRATION_KEY] = calibration
        with open(path, "w") as f:
            json.dump(data, f, indent=2)

    @classmethod
    def from_dict(cls, data: dict):
        """The config stored in ``data``; a ``calibration`` record is skipped, any other key that
        is not a field raises ``ValueError`` naming it."""
        if not isinstance(data, dict):
            raise TypeError(f"a {cls.__name__} must be read from a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - {CALIBRATION_KEY})
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields: {unknown} (known: {sorted(known)})")
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, path: str | Path):
        with open(path) as f:
            return cls.from_dict(json.load(f))


@dataclass(frozen=True)
class GenerationConfig(StoredConfig):
    """How a batch is decoded; validated on construction.

    gen_length:   response window length (LLaDA ``gen_length``, Dream/LaViDa ``max_new_tokens``).
    steps:        denoising steps; None -> the family default (``gen_length``; LaViDa:
                  ``gen_length``, scaled by ``step_ratio``). LLaDA: divisible by the block count.
    block_length: semi-autoregressive block (LLaDA family); None -> ``gen_length``.
    temperature:  0 -> argmax; > 0 -> Gumbel-max in float64 (LLaDA) or categorical (Dream).
    cfg_scale:    classifier-free guidance, LLaDA family without prefix cache:
                  ``uncond + (s + 1)(cond - uncond)`` with the prompt masked.
    remasking:    LLaDA family: low_confidence | random | margin | entropy.
    alg / alg_temp / top_p / top_k / eps: Dream family (``diffusion_generate``).
    logits_eos_inf / confidence_eos_eot_inf: LLaDA's EOS knobs (EVAL.md, Appendix B.4).
    prefix_cache: compute the prompt (and image) once and run every step on the window only
                  (LaViDa's prefix-DLM cache); None -> on for multimodal models, off otherwise.
    schedule:     None (the family's linear rule) or LaViDa's shift | cosine | logit_normal |
                  uniform; ``schedule_shift`` is the shift's s.
    step_ratio:   LaViDa: steps = int(steps_per_block * ratio) (Dream: int(gen_length * ratio)).
    tie_break:    "reference" selects among equal confidences as ``torch.topk`` does on the
                  reference's own vector; "stable" takes the leftmost (position-stable, so a
                  shorter window or another batch never changes the choice).
    rng:          "global": draw from torch's global generator in the reference's order (token
                  for token equal to the reference under the same seed, but batch-dependent,
                  as the reference is); "per_request": one generator per request seeded with
                  ``seed + index`` (a request gets the same draws alone or in any batch).
    seed:         with rng="per_request" the base seed (default 0); with "global", when set,
                  ``torch.manual_seed(seed)`` is called first.
    """

    gen_length: int = 128
    steps: int | None = None
    block_length: int | None = None
    temperature: float = 0.0
    cfg_scale: float = 0.0
    remasking: str = "low_confidence"
    alg: str = "origin"
    alg_temp: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    eps: float = 1e-3
    logits_eos_inf: bool = False
    confidence_eos_eot_inf: bool = False
    prefix_cache: bool | None = None
    schedule: str | None = None
    schedule_shift: float = 3.0
    step_ratio: float | None = None
    tie_break: str = "reference"
    rng: str = "global"
    seed: int | None = None

    def __post_init__(self) -> None:
        check(isinstance(self.gen_length, int) and self.gen_length >= 1,
              f"gen_length must be an int >= 1, got {self.gen_length!r}")
        check(self.steps is None or (isinstance(self.steps, int) and self.steps >= 1),
              f"steps must be an int >= 1, got {self.steps!r}")
        if self.block_length is not None:
            check(isinstance(self.block_length, int) and self.block_length >= 1,
                  f"block_length must be an int >= 1, got {self.block_length!r}")
            check(self.gen_length % self.block_length == 0,
                  f"gen_length ({self.gen_length}) must be divisible by block_length ({self.block_length})")
        if self.steps is not None and self.step_ratio is None:
            check(self.steps % self.num_blocks == 0,
                  f"steps ({self.steps}) must be divisible by the number of blocks ({self.num_blocks})")
        check(math.isfinite(self.temperature) and self.temperature >= 0,
              f"temperature must be >= 0, got {self.temperature!r}")
        check(math.isfinite(self.cfg_scale) and self.cfg_scale >= 0, f"cfg_scale must be >= 0, got {self.cfg_scale!r}")
        check(self.remasking in LLADA_REMASKING, f"remasking must be one of {LLADA_REMASKING}, got {self.remasking!r}")
        check(self.alg in DREAM_ALGS, f"alg must be one of {DREAM_ALGS}, got {self.alg!r}")
        check(self.alg_temp is None or self.alg_temp >= 0, f"alg_temp must be >= 0, got {self.alg_temp!r}")
        check(self.top_p is None or 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")
        check(self.top_k is None or (isinstance(self.top_k, int) and self.top_k >= 1),
              f"top_k must be an int >= 1, got {self.top_k!r}")
        check(0 < self.eps < 1, f"eps must be in (0, 1), got {self.eps!r}")
        check(self.schedule is None or self.schedule in SCHEDULES,
              f"schedule must be None or one of {SCHEDULES}, got {self.schedule!r}")
        check(self.schedule_shift > 0, f"schedule_shift must be > 0, got {self.schedule_shift!r}")
        check(self.step_ratio is None or 0 < self.step_ratio <= 1,
              f"step_ratio must be in (0, 1], got {self.step_ratio!r}")
        check(self.tie_break in ("reference", "stable"),
              f"tie_break must be 'reference' or 'stable', got {self.tie_break!r}")
        check(self.rng in ("global", "per_request"), f"rng must be 'global' or 'per_request', got {self.rng!r}")
        check(not (self.cfg_scale > 0 and self.prefix_cache),
              "cfg_scale > 0 needs the full prompt every step: it cannot be combined with prefix_cache=True")

    @property
    def block(self) -> int:
        return self.block_length or self.gen_length

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block
