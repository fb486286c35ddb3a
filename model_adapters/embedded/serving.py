"""The embedded model's requests and defaults, as the demo, calibration and benchmarks use them.

* :func:`demo_generation_config` - how the embedded model is decoded: a 32-position window,
  one token per step, one block, LaViDa's prefix KV cache, low-confidence remasking, and the
  position-stable tie-break (so that a shorter window never changes which of two equally
  confident positions is committed: baseline and Seer differ only by what Seer changes).
* :func:`demo_requests` - held-out requests as ``seer_runtime.evaluate.Request`` objects.
* :func:`calibration_requests` - the calibration set: a JSONL file (``question``, optional
  ``image`` path, optional ``answer``) or, by default, a split disjoint from the demo's.
* :func:`default_seer_config` - the calibrated Seer configuration shipped beside the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import EMBEDDED_DIR, RESPONSE_WINDOW, EmbeddedTokenizer, load_embedded  # noqa: F401 (re-exported)
from .tasks import make_requests

WORKLOAD = "demo"
MODEL_DIR = EMBEDDED_DIR  # weights, tokenizer, decoding defaults and calibrated configs
DESCRIPTION = "a LaViDa-LLaDA DMLLM with short answers (32-position window)"
CALIBRATION_SEED = 2_000_029
# 192, not 96: one answer is 1.04 points of 96, so "exact match within one point of the
# baseline" could not be read at 96 requests (a single changed answer already misses it)
DEMO_REQUESTS = 192
DEMO_BATCH = 16
SEER_CONFIG_FILE = EMBEDDED_DIR / "seer_config.json"
DYLLM_CONFIG_FILE = EMBEDDED_DIR / "dyllm_config.json"


def demo_generation_config():
    from seer_runtime import GenerationConfig

    return GenerationConfig(gen_length=RESPONSE_WINDOW, steps=RESPONSE_WINDOW, block_length=RESPONSE_WINDOW,
                            remasking="low_confidence", prefix_cache=True, tie_break="stable")


def to_requests(tasks, tokenizer: EmbeddedTokenizer):
    from seer_runtime.evaluate import Request

    return [Request(tokenizer.chat_prompt(t.question, with_image=t.has_image), t.image_input(),
                    tokenizer.encode(t.answer)) for t in tasks]


def demo_requests(n: int, tokenizer: EmbeddedTokenizer | None = None):
    """``n`` held-out requests (the split the model was evaluated on) and their tasks."""
    tokenizer = tokenizer or EmbeddedTokenizer()
    tasks = make_requests(n, "heldout")
    return to_requests(tasks, tokenizer), tasks


def calibration_requests(data: str | Path | None = None, n: int | None = None, model=None,
                         tokenizer: EmbeddedTokenizer | None = None):
    """(requests, generation config) for ``seer calibrate`` on the embedded model.

    data: a JSONL file with one object per line: ``question`` (str), optional ``image`` (a path,
    relative to the file) and optional ``answer`` (the reference answer; without it the
    baseline's own answer is the reference); every line is checked first, and any other key is
    an error naming the file and line (``seer_runtime.request_files.CALIBRATION_REQUEST``). None:
    ``n`` (default 128) generated requests from a seed disjoint from training and from the
    demo's held-out split.
    """

    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"requests must be an int >= 1, got {n!r}")
    tokenizer = tokenizer or EmbeddedTokenizer()
    if data is None:
        tasks = make_requests(128 if n is None else n, "heldout", seed=CALIBRATION_SEED)
        return to_requests(tasks, tokenizer), demo_generation_config()
    from model_adapters.images import open_image
    from model_adapters.lavida import process_image
    from seer_runtime.evaluate import read_requests_jsonl

    from .tasks import IMAGE_SIZE

    def load_image(path):
        return process_image(open_image(path), image_size=IMAGE_SIZE, anyres=False)

    requests = read_requests_jsonl(data, encode_prompt=tokenizer.chat_prompt, encode_answer=tokenizer.encode,
                                   load_image=load_image, limit=n)
    return requests, demo_generation_config()


def write_calibration_jsonl(path: str | Path, n: int = 64) -> Path:
    """Write ``n`` calibration requests as JSONL with PNG images beside it (a ``--data`` example)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, t in enumerate(make_requests(n, "heldout", seed=CALIBRATION_SEED)):
        item = {"question": t.question, "answer": t.answer}
        if t.image is not None:
            name = f"{path.stem}_{i:04d}.png"
            t.image.save(path.parent / name)
            item["image"] = name
        lines.append(json.dumps(item))
    path.write_text("\n".join(lines) + "\n")
    return path


def answer_figures(requests, answers, tokenizer=None) -> dict:
    """``exact_match``: the share of decoded ``answers`` (ids before the first end token) equal
    to their request's reference ids (requests without one are left out); ``answer_tokens``: the
    mean answer length."""
    if len(requests) != len(answers):
        raise ValueError(f"{len(requests)} requests but {len(answers)} answers")
    ok = [a == r.truth_ids for a, r in zip(answers, requests) if r.truth_ids is not None]
    return {"exact_match": sum(ok) / len(ok) if ok else float("nan"),
            "answer_tokens": sum(len(a) for a in answers) / max(len(answers), 1)}


def default_seer_config():
    """The Seer configuration chosen by ``seer calibrate`` for the shipped weights."""
    from seer_runtime.seer import SeerConfig

    if not SEER_CONFIG_FILE.is_file():
        raise FileNotFoundError(f"{SEER_CONFIG_FILE} is missing: run `seer calibrate --out {SEER_CONFIG_FILE}`")
    return SeerConfig.from_json(SEER_CONFIG_FILE)


def default_dyllm_config():
    """The DyLLM configuration chosen by ``seer calibrate-dyllm`` for the shipped weights."""
    from seer_runtime.dyllm import DyLLMConfig

    if not DYLLM_CONFIG_FILE.is_file():
        raise FileNotFoundError(f"{DYLLM_CONFIG_FILE} is missing: run `seer calibrate-dyllm --out {DYLLM_CONFIG_FILE}`")
    return DyLLMConfig.from_json(DYLLM_CONFIG_FILE)
