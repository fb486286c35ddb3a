"""Batch inference over a Ray Data dataset: :class:`SeerPredictor`, the callable class
``ray.data.Dataset.map_batches`` runs in a pool of actors, each holding one loaded model (one GPU
each on a cluster), work pulled by whichever actor is free.

    import ray
    from seer_runtime.ray_data import SeerPredictor

    ds = ray.data.read_json("/shared/requests.jsonl", lines=True)  # rows: prompt, image, options, id
    out = ds.map_batches(SeerPredictor, fn_constructor_kwargs={"model": "/shared/LLaDA-8B-Instruct",
                                                              "generation": {"gen_length": 256}},
                         batch_size=64, batch_format="numpy", num_gpus=1,
                         compute=ray.data.ActorPoolStrategy(size=8))
    out.write_json("/shared/answers")

(:func:`map_requests` writes that call.) A row is a request as ``seer run`` reads one
(``seer_runtime.batch_inference``): ``prompt``; optional ``image`` (a path, relative to
``image_root``), ``options`` (GenerationConfig fields, a dict or its JSON text; null values are
dropped, since Arrow fills a struct's absent fields with null) and any other columns, which are
passed through. The output rows add ``answer``, ``answer_tokens``, ``complete``, ``steps``,
``positions_computed``, ``seed`` (and ``window`` with Seer), as ``seer run`` writes them: each
request seeded from its content, so that its answer does not depend on the actor or the batch.

Ray itself is imported only by :func:`map_requests` (``pip install -e ".[ray]"``); the class is a
plain callable on dicts of numpy arrays.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from .batch_inference import BatchDecoder, Speed, run_request

#: the columns a batch gains (``window`` only with Seer)
RESULT_COLUMNS = ("answer", "answer_tokens", "complete", "steps", "positions_computed", "seed", "window")


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


class SeerPredictor:
    """One loaded checkpoint answering batches of requests (module docstring).

    model: a local checkpoint directory (every actor must see it: a shared file system).
    generation: GenerationConfig fields over the checkpoint's ``seer_generation_config.json``.
    seer / dyllm / chat_template / dtype: as ``seer run``'s options (files, "default" for DyLLM).
    device: None -> "cuda" when the actor has a GPU (Ray gives it one with ``num_gpus=1``), else "cpu".
    batch_size: requests per ``generate`` call inside a Ray batch.
    image_root: the folder relative image paths are read from (None: the actor's working folder).
    """

    def __init__(self, model: str, *, generation: dict | None = None, seer: str | None = None,
                 dyllm: str | None = None, chat_template: str | None = None, dtype: str | None = None,
                 device: str | None = None, batch_size: int = 16, image_root: str | None = None):
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.decoder = BatchDecoder.load(model, generation=generation, seer=seer, dyllm=dyllm,
                                         chat_template=chat_template, dtype=dtype, device=device,
                                         batch_size=batch_size)
        self.image_root = None if image_root is None else Path(image_root)
        #: what this actor decoded, over all its batches
        self.speed = Speed()

    def _request(self, batch: dict, r: int):
        item = {"prompt": batch["prompt"][r]}
        image = batch["image"][r] if "image" in batch else None
        if not _missing(image):
            item["image"] = str(image)
        options = batch["options"][r] if "options" in batch else None
        if isinstance(options, str):
            try:
                options = json.loads(options)
            except json.JSONDecodeError as exc:
                raise ValueError(f"batch row {r}: options is not JSON ({exc})") from None
        if isinstance(options, dict):
            options = {k: v for k, v in options.items() if not _missing(v)}
        if not _missing(options):
            item["options"] = options
        return run_request(item, index=r, line=r + 1, where=f"batch row {r}", folder=self.image_root)

    def __call__(self, batch: dict) -> dict:
        """``batch``: a dict of equal-length columns (numpy arrays, as ``batch_format="numpy"`` gives
        them) with a ``prompt`` column; returns it with the result columns added."""
        if "prompt" not in batch:
            raise ValueError(f"a batch needs a 'prompt' column; it has {sorted(batch)}")
        taken = sorted(set(batch) & set(RESULT_COLUMNS))
        if taken:
            raise ValueError(f"the input already has columns {taken}, which SeerPredictor writes: rename them")
        rows = len(batch["prompt"])
        prepared = self.decoder.prepare([self._request(batch, r) for r in range(rows)])
        records, speed = self.decoder.decode(prepared)
        self.speed.add(speed)
        out = dict(batch)
        for key in RESULT_COLUMNS:
            if records and key in records[0]:
                values = [record[key] for record in records]
                out[key] = np.array(values, dtype=object) if key == "answer" else np.array(values)
        return out


def map_requests(dataset, model: str, *, actors: int = 1, gpus_per_actor: float = 1, cpus_per_actor: float = 1,
                 batch_size: int = 64, **predictor_options):
    """``dataset.map_batches(SeerPredictor, ...)`` with ``actors`` actors of ``gpus_per_actor`` GPUs
    (0 on CPU) and ``cpus_per_actor`` CPUs each, ``batch_size`` rows per call and
    ``predictor_options`` for the constructor. Leave the cluster a CPU beyond the actors' for
    Ray's read tasks: with every CPU held by an actor the read never runs (Ray waits, no error)."""
    import ray.data

    return dataset.map_batches(SeerPredictor, fn_constructor_kwargs={"model": model, **predictor_options},
                               batch_size=batch_size, batch_format="numpy", num_gpus=gpus_per_actor,
                               num_cpus=cpus_per_actor, compute=ray.data.ActorPoolStrategy(size=actors))
