"""Frozen, self-validating configuration objects, and the one rule they are stored by.

:class:`StoredConfig` gives every config (``GenerationConfig`` here, ``SeerConfig``,
``DyLLMConfig``, ``RouterConfig``) the same JSON form: an object holding the dataclass fields,
tuples as lists, and optionally a ``calibration`` record beside them (what ``seer calibrate``
measured; kept for people, ignored when loading). Any other key is an error that names it.
"""

from __future__ import annotations

import json
import math
import numbers
import sys
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .files import write_json
from .schedules import SCHEDULES

LLADA_REMASKING = ("low_confidence", "random", "margin", "entropy")
DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
BLOCK_CACHES = (None, "prefix", "dual")

#: the key a stored config may carry beside its fields (measurements, not settings)
CALIBRATION_KEY = "calibration"
#: the largest base seed (``seed + request index`` must fit a torch generator's int64 seed)
MAX_SEED = 2**62


_PACKAGE_DIR = str(Path(__file__).resolve().parent)


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` pointing at the first frame outside ``seer_runtime`` (and torch's
    ``no_grad`` wrapper): the user's line that asked for what is warned about."""
    frame, level = sys._getframe(1), 2  # stacklevel 1 is this function, 2 the one that called it
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE_DIR)
                                 or frame.f_code.co_filename.endswith("torch/utils/_contextlib.py")):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def check(cond: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``cond`` (the configs' validation idiom)."""
    if not cond:
        raise ValueError(message)


def _range_text(minimum, maximum, open_minimum: bool = False, open_maximum: bool = False) -> str:
    if maximum is None:
        return f"{'>' if open_minimum else '>='} {minimum}"
    if minimum is None:
        return f"{'<' if open_maximum else '<='} {maximum}"
    return f"in {'(' if open_minimum else '['}{minimum}, {maximum}{')' if open_maximum else ']'}"


def check_int(name: str, value, *, minimum: int | None = None, maximum: int | None = None) -> None:
    """``value`` must be an int (not a bool, not a float that happens to be whole) in
    ``[minimum, maximum]``; raises ``TypeError``/``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be an int {_range_text(minimum, maximum)}, got {value!r}")


def check_real(name: str, value, *, minimum: float | None = None, maximum: float | None = None,
               open_minimum: bool = False, open_maximum: bool = False) -> None:
    """``value`` must be a finite real number (not a bool, not NaN or inf) in ``[minimum, maximum]``
    (an open end with ``open_minimum`` / ``open_maximum``); raises ``TypeError``/``ValueError``
    naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    low_ok = minimum is None or (value > minimum if open_minimum else value >= minimum)
    high_ok = maximum is None or (value < maximum if open_maximum else value <= maximum)
    if not (math.isfinite(value) and low_ok and high_ok):
        bounds = "" if minimum is None and maximum is None else " " + _range_text(minimum, maximum, open_minimum,
                                                                                  open_maximum)
        raise ValueError(f"{name} must be{bounds} (a finite number), got {value!r}")


def check_bool(name: str, value, *, optional: bool = False) -> None:
    """``value`` must be True or False (or None when ``optional``): no 0/1, no strings."""
    if not (isinstance(value, bool) or (optional and value is None)):
        form = "a bool or None" if optional else "a bool"
        raise TypeError(f"{name} must be {form}, got {type(value).__name__} {value!r}")


def _object_without_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """``json`` object hook: a key written twice is an error (Python's json keeps the last silently)."""
    data: dict = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"the key {key!r} appears twice in one object")
        data[key] = value
    return data


def parse_json_text(text: str, where: str):
    """The JSON value in ``text``; ``ValueError`` naming ``where`` (a file, ``file:line``) when it is
    not JSON or an object repeats a key."""
    try:
        return json.loads(text, object_pairs_hook=_object_without_duplicates)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not valid JSON ({exc})") from None
    except ValueError as exc:  # a repeated key
        raise ValueError(f"{where}: {exc}") from None


def read_text_file(path: str | Path, what: str) -> str:
    """The UTF-8 text of the file ``path``. Errors name ``what`` and the file: ``OSError`` (of the
    same class) when it cannot be read (missing, a directory, no permission), ``ValueError`` when
    it is not UTF-8 (the first bad byte and its offset; UTF-16 / UTF-32 named by their byte-order
    mark). A UTF-8 byte-order mark at the start is dropped."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise type(exc)(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    boms = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16",
            b"\xfe\xff": "UTF-16"}
    for bom, name in boms.items():
        if raw.startswith(bom):
            raise ValueError(f"{what} {path} is {name} text, not UTF-8: save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{what} {path} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
                         f"(line {line}); save it as UTF-8") from None


def read_json_object(path: str | Path, what: str = "config") -> dict:
    """The JSON object in the file ``path``. Errors name ``what`` and the file: ``ValueError`` when
    the file is not UTF-8, not JSON, repeats a key in an object or holds something else than an
    object; ``OSError`` when it cannot be opened (see :func:`read_text_file`)."""
    data = parse_json_text(read_text_file(path, what), f"{what} {path}")
    if not isinstance(data, dict):
        raise ValueError(f"{what} {path} must hold a JSON object, got {type(data).__name__}")
    return data


class StoredConfig:
    """Dictionary and JSON (de)serialisation shared by the frozen config dataclasses."""

    def to_dict(self) -> dict:
        """The fields as plain JSON values (tuples become lists)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    def replace(self, **changes):
        """A copy with ``changes`` applied (validated again)."""
        return type(self)(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})

    def to_json(self, path: str | Path, *, calibration: dict | None = None) -> None:
        """Write the fields, and the ``calibration`` record beside them when given, atomically (a
        temporary file renamed into place: ``seer_runtime.files.write_json``)."""
        data = self.to_dict()
        if calibration is not None:
            data[CALIBRATION_KEY] = calibration
        write_json(path, data)

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
        """The config stored in the JSON file ``path``; a file that is not JSON, or whose
        content is not a valid config, raises ``ValueError`` naming the file."""
        data = read_json_object(path, cls.__name__)
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{path}: {exc}") from None


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
    logits_eos_inf / confidence_eos_eot_inf: LLaDA's EOS knobs (its paper's evaluation, Appendix B.4).
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
    threshold:    None (a fixed count per step, from ``steps``) or a confidence in (0, 1]: every
                  step commits each masked position of the request's current block whose
                  confidence reaches it, and at least the most confident one (Fast-dLLM's
                  parallel decoding); a block ends when no mask is left in it, so the number of
                  steps follows the model (``steps`` is not used). Dream family: ``alg`` must be
                  "maskgit_plus" (the confidence is the chosen token's probability). A step that
                  commits only the model's own mask token ends its block (Fast-dLLM would loop):
                  the masks stay in the answer and a RuntimeWarning says so.
    block_cache:  None, "prefix" or "dual" (Fast-dLLM's block caches): a block's first step runs
                  the whole sequence and keeps every position's keys/values; its later steps feed
                  the block and what follows it ("prefix": the keys/values before the block are
                  reused) or the block alone ("dual": those after it too). An approximation, as
                  in Fast-dLLM (the cached keys/values are those of the block's first step).
    check_finite: watch every layer's output and the logits for NaN / inf on the device and
                  raise ``NonFiniteError`` (naming the step and layer) at the end of the call
                  (default True; one reduction per layer, one host read per call).
    early_stop:   end a request on the step that commits one of its end tokens (EOS, end of
                  turn) with every earlier window position committed, as DyLLM's and dInfer's
                  schedulers do: its answer cannot change after that step, so its later steps
                  are not run (a finished request stops costing compute while the others go on)
                  and the window positions after the end token are returned as EOS. The check
                  joins the step's one device->host read. Off by default (the reference
                  generators run every step; the answers are the same either way, the tokens
                  after the end token may differ); ``stats.steps_saved`` says what it saved.
                  Random draws (temperature, random remasking, Dream's "origin") keep the
                  answers with ``rng="per_request"``; a global generator's draws depend on which
                  requests still run, as they do after Seer's cut.
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
    threshold: float | None = None
    block_cache: str | None = None
    check_finite: bool = True
    early_stop: bool = False

    def __post_init__(self) -> None:
        check_int("gen_length", self.gen_length, minimum=1)
        if self.steps is not None:
            check_int("steps", self.steps, minimum=1)
        if self.block_length is not None:
            check_int("block_length", self.block_length, minimum=1)
            check(self.gen_length % self.block_length == 0,
                  f"gen_length ({self.gen_length}) must be divisible by block_length ({self.block_length})")
        if self.step_ratio is not None:
            check_real("step_ratio", self.step_ratio, minimum=0, maximum=1, open_minimum=True)
        if self.steps is not None and self.step_ratio is None:
            check(self.steps % self.num_blocks == 0,
                  f"steps ({self.steps}) must be divisible by the number of blocks ({self.num_blocks})")
        check_real("temperature", self.temperature, minimum=0)
        check_real("cfg_scale", self.cfg_scale, minimum=0)
        check(self.remasking in LLADA_REMASKING, f"remasking must be one of {LLADA_REMASKING}, got {self.remasking!r}")
        check(self.alg in DREAM_ALGS, f"alg must be one of {DREAM_ALGS}, got {self.alg!r}")
        if self.alg_temp is not None:
            check_real("alg_temp", self.alg_temp, minimum=0)
        if self.top_p is not None:
            check_real("top_p", self.top_p, minimum=0, maximum=1, open_minimum=True)
        if self.top_k is not None:
            check_int("top_k", self.top_k, minimum=1)
        check_real("eps", self.eps, minimum=0, maximum=1, open_minimum=True, open_maximum=True)
        for name in ("logits_eos_inf", "confidence_eos_eot_inf"):
            check_bool(name, getattr(self, name))
        check_bool("prefix_cache", self.prefix_cache, optional=True)
        check_bool("check_finite", self.check_finite)
        check_bool("early_stop", self.early_stop)
        check(self.schedule is None or self.schedule in SCHEDULES,
              f"schedule must be None or one of {SCHEDULES}, got {self.schedule!r}")
        check_real("schedule_shift", self.schedule_shift, minimum=0, open_minimum=True)
        check(self.tie_break in ("reference", "stable"),
              f"tie_break must be 'reference' or 'stable', got {self.tie_break!r}")
        check(self.rng in ("global", "per_request"), f"rng must be 'global' or 'per_request', got {self.rng!r}")
        if self.seed is not None:
            # per-request generators are seeded with seed + request index: keep them in int64
            check_int("seed", self.seed, minimum=0, maximum=MAX_SEED)
        check(not (self.cfg_scale > 0 and self.prefix_cache),
              "cfg_scale > 0 needs the full prompt every step: it cannot be combined with prefix_cache=True")
        if self.threshold is not None:
            check_real("threshold", self.threshold, minimum=0, maximum=1, open_minimum=True)
            check(self.schedule is None and self.step_ratio is None,
                  "threshold decides how many tokens each step commits: it cannot be combined with schedule or "
                  "step_ratio (which set the counts)")
        check(self.block_cache in BLOCK_CACHES, f"block_cache must be one of {BLOCK_CACHES}, got {self.block_cache!r}")
        check(not (self.block_cache is not None and self.cfg_scale > 0),
              "block_cache with cfg_scale > 0: the unconditional copy would need caches of its own (not supported)")

    @property
    def block(self) -> int:
        return self.block_length or self.gen_length

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block
