"""The ``arith`` workload's requests and defaults, as the demo, calibration and benchmarks use them
(the same functions as ``model_adapters.embedded.serving``, the demo model's).

* :func:`demo_generation_config` - a 128-position window in 4 blocks of 32, one token per step
  (128 steps), low-confidence remasking, the prompt cached once (the model was trained with
  the prefix-LM mask on half of its samples), the position-stable tie-break.
* :func:`demo_requests` - held-out requests; their ``truth_ids`` are one reference solution
  (the score is the final answer, :func:`answer_figures`).
* :func:`calibration_requests` - a split disjoint from the demo's, with reference solutions: the
  calibrations score each candidate by its final answer, as the demo does (a wording is not wrong,
  only different), and compare its verdicts with the baseline's request by request.
* :func:`answer_figures` - final-answer accuracy (``exact_match``: GSM8K's score) and the share
  of answers whose every arithmetic step is right.
"""

from __future__ import annotations

from pathlib import Path

from . import ARITH_DIR, BLOCK_LENGTH, RESPONSE_WINDOW
from . import load_arith as load_embedded  # noqa: F401 (the demo's name for the loader)
from .tasks import check_solution, make_requests

WORKLOAD = "arith"
MODEL_DIR = ARITH_DIR  # weights, tokenizer, decoding defaults and calibrated configs
DESCRIPTION = "arithmetic word problems (text-only LLaDA, 128-position window in blocks of 32)"
CALIBRATION_SEED = 2_000_029
SEER_CONFIG_FILE = ARITH_DIR / "seer_config.json"
DYLLM_CONFIG_FILE = ARITH_DIR / "dyllm_config.json"
GENERATION_FILE = ARITH_DIR / "seer_generation_config.json"  # written by the trainer
# every request decodes 128 steps on its full window: fewer requests than the demo model's 192
DEMO_REQUESTS = 64
DEMO_BATCH = 16


def demo_generation_config():
    from seer_runtime import GenerationConfig

    return GenerationConfig(gen_length=RESPONSE_WINDOW, steps=RESPONSE_WINDOW, block_length=BLOCK_LENGTH,
                            remasking="low_confidence", prefix_cache=True, tie_break="stable")


def _tokenizer(tokenizer):
    from .. import EmbeddedTokenizer

    return tokenizer or EmbeddedTokenizer(ARITH_DIR / "tokenizer.json")


def to_requests(tasks, tokenizer, *, with_answers: bool = True):
    from seer_runtime.evaluate import Request

    return [Request(tokenizer.chat_prompt(t.question), None, tokenizer.encode(t.answer) if with_answers else None)
            for t in tasks]


def demo_requests(n: int, tokenizer=None):
    """``n`` held-out requests (the split the model was evaluated on) and their tasks."""
    tokenizer = _tokenizer(tokenizer)
    tasks = make_requests(n, "heldout")
    return to_requests(tasks, tokenizer), tasks


def calibration_requests(data: str | Path | None = None, n: int | None = None, model=None, tokenizer=None):
    """(requests, generation config) for ``seer calibrate --workload arith``.

    data: a JSONL file (``question``, optional ``answer``; any other key, ``image`` included, is an
    error naming the file and line) or None: ``n`` (default 128) generated
    requests from a seed disjoint from training and the demo's split, each with a reference
    solution (:func:`answer_figures` scores its final answer; a wording is not wrong, only different).
    """
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"requests must be an int >= 1, got {n!r}")
    tokenizer = _tokenizer(tokenizer)
    if data is None:
        tasks = make_requests(128 if n is None else n, "heldout", seed=CALIBRATION_SEED)
        return to_requests(tasks, tokenizer), demo_generation_config()
    from seer_runtime.evaluate import read_requests_jsonl
    from seer_runtime.request_files import TEXT_CALIBRATION_REQUEST

    def no_image(path):  # never called: the schema refuses an "image" key, naming the line
        raise ValueError(f"the arith workload is text only: --data names an image ({path})")

    requests = read_requests_jsonl(data, encode_prompt=lambda q, with_image=False: tokenizer.chat_prompt(q),
                                   encode_answer=tokenizer.encode, load_image=no_image, limit=n,
                                   schema=TEXT_CALIBRATION_REQUEST)
    return requests, demo_generation_config()


def answer_figures(requests, answers, tokenizer=None) -> dict:
    """Figures of decoded ``answers`` (id lists before the first end token) against ``requests``
    (their ``truth_ids`` hold a reference solution): ``exact_match`` = final-answer accuracy (the
    ``answer N`` closing the decoded solution equals the reference's), ``steps_right`` = share of
    answers with at least one arithmetic step and every step right, ``answer_tokens`` = mean
    answer length."""
    tokenizer = _tokenizer(tokenizer)
    if len(requests) != len(answers):
        raise ValueError(f"{len(requests)} requests but {len(answers)} answers")
    finals, steps = [], []
    for r, a in zip(requests, answers):
        got = check_solution(tokenizer.decode(a))
        steps.append(got.steps_right)
        if r.truth_ids is not None:
            finals.append(got.final is not None and got.final == check_solution(tokenizer.decode(r.truth_ids)).final)
    n = max(len(answers), 1)
    return {"exact_match": sum(finals) / len(finals) if finals else float("nan"),
            "steps_right": sum(steps) / n, "answer_tokens": sum(len(a) for a in answers) / n}


def default_seer_config():
    """The Seer configuration chosen by ``seer calibrate --workload arith`` for the shipped weights."""
    from seer_runtime.seer import SeerConfig

    if not SEER_CONFIG_FILE.is_file():
        raise FileNotFoundError(f"{SEER_CONFIG_FILE} is missing: run "
                                f"`seer calibrate --workload arith --out {SEER_CONFIG_FILE}`")
    return SeerConfig.from_json(SEER_CONFIG_FILE)


def default_dyllm_config():
    """The DyLLM configuration chosen by ``seer calibrate-dyllm --workload arith``."""
    from seer_runtime.dyllm import DyLLMConfig

    if not DYLLM_CONFIG_FILE.is_file():
        raise FileNotFoundError(f"{DYLLM_CONFIG_FILE} is missing: run "
                                f"`seer calibrate-dyllm --workload arith --out {DYLLM_CONFIG_FILE}`")
    return DyLLMConfig.from_json(DYLLM_CONFIG_FILE)

