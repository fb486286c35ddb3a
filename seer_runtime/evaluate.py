"""Requests, and running them in batches with the figures a serving system cares about.

Used by ``seer demo``, the calibrations and the benchmarks. A request is prompt ids (with
``<image>`` placeholders), an optional image and, optionally, its reference answer ids;
:func:`read_requests_jsonl` reads them from a file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import GenerationConfig
from .generation import generate
from .request_files import CALIBRATION_REQUEST, LineSchema, RequestLine, line_errors, read_jsonl


@dataclass
class Request:
    prompt_ids: list[int]
    image: object | None = None
    truth_ids: list[int] | None = None


@dataclass
class RunResult:
    """Per-request answers and the run's totals. ``answers[i]``: ids before the first end token;
    ``steps[i]`` / ``steps_saved[i]``: the denoising steps request ``i`` ran and those early stop
    saved it (``GenerationStats``); ``nfe``: per batch;
    ``positions_computed`` / ``positions_computed_dense``: ``GenerationStats``' work figures summed
    over the batches (equal without DyLLM)."""

    answers: list[list[int]] = field(default_factory=list)
    end_positions: list[int] = field(default_factory=list)
    windows: list[list[int]] = field(default_factory=list)
    wall_s: float = 0.0
    batch_wall_s: list[float] = field(default_factory=list)
    nfe: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    steps_saved: list[int] = field(default_factory=list)
    positions_computed: int = 0
    positions_computed_dense: int = 0
    seer: dict = field(default_factory=dict)
    dyllm: list[dict] = field(default_factory=list)
    per_request_latency_s: list[float] = field(default_factory=list)

    @property
    def answer_tokens(self) -> int:
        return sum(len(a) for a in self.answers)

    @property
    def tok_per_s(self) -> float:
        """Valid (non-padding) answer tokens per second of wall time."""
        return self.answer_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def latency_s(self) -> float:
        """Mean end-to-end latency of a request (the wall time of its batch)."""
        lat = self.per_request_latency_s
        return sum(lat) / len(lat) if lat else 0.0

    def extend(self, part: RunResult) -> None:
        """Append another run's requests and totals (results of consecutive batches)."""
        self.answers += part.answers
        self.end_positions += part.end_positions
        self.windows += part.windows
        self.wall_s += part.wall_s
        self.batch_wall_s += part.batch_wall_s
        self.nfe += part.nfe
        self.positions_computed += part.positions_computed
        self.positions_computed_dense += part.positions_computed_dense
        self.per_request_latency_s += part.per_request_latency_s
        self.dyllm += part.dyllm
        for k, v in part.seer.items():
            self.seer.setdefault(k, []).extend(v)

    def exact_match(self, requests: list[Request]) -> float:
        ok = [a == r.truth_ids for a, r in zip(self.answers, requests) if r.truth_ids is not None]
        return sum(ok) / len(ok) if ok else float("nan")


def pad_left(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[r, width - len(p):] = 1
    return ids, (None if bool(mask.all()) else mask)


def run_requests(model, requests: list[Request], gen: GenerationConfig, *, seer=None, dyllm=None, router=None,
                 graphs="auto", policies=(), batch_size: int = 16, progress=None) -> RunResult:
    """Decode ``requests`` in batches of ``batch_size`` (in order) and gather the figures.

    seer / dyllm / router / graphs / policies: as :func:`seer_runtime.generate` takes them;
    progress: a tqdm-like bar advanced by the number of requests of each batch, or None.
    """
    if not requests:
        raise ValueError("requests is empty")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    result = RunResult()
    multimodal = bool(getattr(model, "is_multimodal", False))
    keys = ("keep_len", "boundary", "final_window", "guard_events", "premature_cuts", "tightened")
    for start in range(0, len(requests), batch_size):
        batch = requests[start: start + batch_size]
        ids, mask = pad_left([r.prompt_ids for r in batch], model.token_ids.pad)
        ids = ids.to(model.device)
        mask = None if mask is None else mask.to(model.device)
        images = [r.image for r in batch] if multimodal else None
        t0 = time.perf_counter()
        out = generate(model, ids, attention_mask=mask, images=images, gen=gen, seer=seer, dyllm=dyllm,
                       router=router, graphs=graphs, policies=policies)
        wall = time.perf_counter() - t0
        result.wall_s += wall
        result.batch_wall_s.append(wall)
        result.per_request_latency_s.extend([wall] * len(batch))
        result.nfe.append(out.stats.nfe)
        result.positions_computed += out.stats.positions_computed
        result.positions_computed_dense += out.stats.positions_computed_dense
        result.steps += out.stats.steps
        result.steps_saved += out.stats.steps_saved
        for i in range(len(batch)):
            result.answers.append(out.answer_ids(i))
            result.end_positions.append(int(out.end_positions[i]))
            result.windows.append(out.responses[i].tolist())
        if "seer" in out.stats.extra:
            for k in keys:
                result.seer.setdefault(k, []).extend(out.stats.extra["seer"][k])
        if "dyllm" in out.stats.extra:
            result.dyllm.append(out.stats.extra["dyllm"])
        if progress is not None:
            progress.update(len(batch))
    return result


def boundary_mae(predicted: list[int | None], true_end: list[int], window: int) -> float:
    """Mean |predicted end - true end| in tokens; a request with no detected boundary counts as
    predicting the window's end."""
    errs = [abs((window if p is None else p) - t) for p, t in zip(predicted, true_end)]
    return sum(errs) / len(errs) if errs else float("nan")


def read_requests_jsonl(path, *, encode_prompt, encode_answer, load_image, limit: int | None = None,
                        schema: LineSchema = CALIBRATION_REQUEST, what: str = "--data") -> list[Request]:
    """Requests from a JSONL file: one object per line with ``question`` (str), optional
    ``image`` (a path relative to the file) and optional ``answer`` (the reference; without it
    the baseline's own answer is the reference); ``schema`` says which keys a line may hold
    (``request_files``: every line is checked before any is turned into a request; an unknown
    key, a wrong type, a missing image file or a non-UTF-8 byte is a ``ValueError`` naming the
    file and line). The callables come from the model layer; their errors are named by the
    line too. ``limit``: only the first ``limit`` requests (every line is still checked)."""
    lines = read_jsonl(path, schema, what=what)
    return requests_from_lines(lines[:limit] if limit is not None else lines, path, encode_prompt=encode_prompt,
                               encode_answer=encode_answer, load_image=load_image, what=what)


def requests_from_lines(lines: list[RequestLine], path, *, encode_prompt, encode_answer, load_image,
                        what: str = "--data") -> list[Request]:
    """:class:`Request` objects from checked lines (``request_files.read_jsonl``): the prompt encoded
    with ``encode_prompt(question, with_image=...)``, the image read with ``load_image(path)``
    (or taken as is when it is no path: already read), the answer with ``encode_answer``. Errors
    name the file and line."""
    requests = []
    for line in lines:
        item = line.values
        with line_errors(what, path, line.line):
            image = item.get("image")
            if isinstance(image, Path):
                image = load_image(image)
            truth = encode_answer(item["answer"]) if "answer" in item else None
            requests.append(Request(encode_prompt(item["question"], with_image=image is not None), image, truth))
    return requests
