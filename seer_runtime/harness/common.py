"""What the harness adapters share: loading a checkpoint from the harness's model arguments, the
decoding configuration of a task's generation keywords, batched decoding of requests with
answers cut as LLaDA's evaluation cuts them, the speed figures Fast-dLLM prints, and data
parallelism under ``accelerate launch`` / ``torchrun``.

Data parallelism: launched with several processes (WORLD_SIZE > 1), each process joins the
launcher's process group (``batch_inference.init_data_parallel``: NCCL on CUDA, gloo on CPU, a
collective timeout of ``dist_timeout`` seconds), loads the model on cuda:LOCAL_RANK (cpu on CPU)
and reports the global rank and world size to the harness, which gives it its share of the
documents and gathers the results. Each request is seeded from its own content
(:func:`request_seed`: the prompt, the images and the configured ``seed``; ``rng="per_request"``
unless ``rng="global"`` is asked for on one process), so an answer does not depend on the shard
or the batch. The speed figures of a call are summed over the ranks (tokens, NFE and requests
added, the wall time of the slowest rank) and printed once, by rank 0. The harnesses' padding
requests (copies a short rank decodes so that every rank runs as many) are not decoded: lm-eval's
get the answer of the request they copy, lmms-eval's (marked ``__padding_only__``) an empty one,
and neither is counted in the figures.

No harness is imported here.
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from tqdm.auto import tqdm

from ..batch_inference import DEFAULT_DIST_TIMEOUT_S, all_gather_objects, init_data_parallel, request_seed
from ..batch_inference import Speed as RunSpeed  # the harnesses add answers cut to max_gen_toks
from ..config import GenerationConfig
from ..evaluate import pad_left
from ..generation import generate

#: the adapters' shared model arguments (every other key is a GenerationConfig field)
MODEL_ARGS = ("pretrained", "seer", "dyllm", "chat_template", "dtype", "device", "batch_size", "max_batch_size",
              "show_speed", "dist_timeout")
#: generation keywords of a task that are not GenerationConfig fields
TASK_KEYS = ("until", "max_gen_toks", "do_sample")
#: Fast-dLLM's model arguments (its eval_llada.py) that seer names otherwise
FAST_DLLM_ARGS = ("use_cache", "dual_cache", "factor")


def _truthy(value) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"))


def fast_dllm_pointer(args: dict) -> str | None:
    """What to write instead when ``args`` (model arguments) holds Fast-dLLM's names: ``use_cache=True``
    -> ``block_cache=prefix``, with ``dual_cache=True`` -> ``block_cache=dual``, ``use_cache=False`` ->
    nothing (no block cache); ``factor`` (its factor-based parallel decoding) has no counterpart here,
    ``threshold`` has. None when none of those names is there."""
    given = [k for k in FAST_DLLM_ARGS if k in args]
    if not given:
        return None
    written = ",".join(f"{k}={args[k]}" for k in given)
    if "factor" in given:
        return (f"{written}: Fast-dLLM's factor-based parallel decoding is not implemented in seer; its confidence "
                "threshold is (threshold=0.9), with its block caches (block_cache=prefix or block_cache=dual)")
    if _truthy(args.get("dual_cache")):
        instead = "block_cache=dual"
    elif _truthy(args.get("use_cache")):
        instead = "block_cache=prefix"
    else:
        instead = "nothing (no block cache is the default: leave block_cache unset)"
    return (f"{written} are Fast-dLLM's argument names; seer's is block_cache: write {instead} "
            "(use_cache=True -> block_cache=prefix, use_cache=True,dual_cache=True -> block_cache=dual)")


@dataclass
class Speed(RunSpeed):
    """Totals over ``generate_until`` calls (:class:`seer_runtime.batch_inference.Speed`'s figures: answer
    tokens before the end token, forward passes, requests, wall seconds of ``generate``, the work) and
    the answers cut to the task's ``max_gen_toks``."""

    cut_to_max_gen_toks: int = 0

    def lines(self) -> list[str]:
        """Fast-dLLM's ``show_speed`` lines, the work figure, and the requests and cut answers."""
        return [f"Total number of tokens generated: {self.tokens}", f"Total time taken: {self.wall_s:.3f} seconds",
                f"Tokens per second: {self.tok_per_s:.2f}", f"Total NFE is {self.nfe}",
                f"Positions computed (positions x layers): {self.positions_computed:,}",
                f"Requests: {self.requests}; answers cut to max_gen_toks: {self.cut_to_max_gen_toks}"]


def positive_int(name: str, value) -> int:
    """``value`` (an int, or digits as the harnesses' argument strings give them) checked >= 1."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def positive_seconds(name: str, value) -> float:
    """``value`` (a number, or its text as the harnesses' argument strings give it) checked > 0."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def image_identity(image) -> str:
    """What a request's image contributes to its seed: a digest of a PIL image's mode, size and
    pixels (the same picture gives the same seed in any process), or the text of anything else
    (a path)."""
    if hasattr(image, "tobytes") and hasattr(image, "size") and hasattr(image, "mode"):
        h = hashlib.blake2b(f"{image.mode}:{image.size}:".encode(), digest_size=16)
        h.update(image.tobytes())
        return h.hexdigest()
    return str(image)


def repeat_indices(requests: list, repeats_of) -> tuple[list[int], dict[int, int]]:
    """How lm-eval lays out a call's requests: each request object appears ``repeats`` times in a
    row (its samples), and a rank with fewer documents appends more copies of its last request
    (padding, whose results are dropped). Returns the sample index of every position (the k-th
    occurrence of its object) and, for each padding position, the position whose answer it takes."""
    seen: dict[int, list[int]] = {}
    samples, padding = [], {}
    for i, req in enumerate(requests):
        where = seen.setdefault(id(req), [])
        k = len(where)
        repeats = repeats_of(req) or 1
        if k >= repeats:
            padding[i] = where[k % repeats]
        where.append(i)
        samples.append(k % repeats)
    return samples, padding


class HarnessModel:
    """A checkpoint loaded from a harness's model arguments (``MODEL_ARGS`` and GenerationConfig
    fields, over the checkpoint's decoding defaults), and its batched decoding.

    own_args: the calling adapter's full argument list, named in the error for an unknown key.
    """

    def __init__(self, pretrained: str, *, seer=None, dyllm=None, chat_template=None, dtype=None, device="cpu",
                 batch_size=1, max_batch_size=None, show_speed=True, dist_timeout=DEFAULT_DIST_TIMEOUT_S,
                 generation: dict, own_args=MODEL_ARGS):
        from ..cli.options import DTYPES, checkpoint_generation_fields, model_path, model_services, policies

        if not isinstance(pretrained, str) or not pretrained:
            raise ValueError("pretrained must be a local checkpoint directory (--model_args pretrained=DIR)")
        pretrained = model_path(pretrained)  # or an embedded model by name (demo, arith), as seer generate takes
        pointer = fast_dllm_pointer(generation)
        if pointer is not None:
            raise ValueError(f"--model_args {pointer}")
        fields = {**checkpoint_generation_fields(pretrained), **generation}
        #: each request seeded from its content (rng "per_request") unless rng="global" was asked for
        self.content_seeds = fields.get("rng", "per_request") == "per_request"
        try:
            self.gen = GenerationConfig.from_dict({"rng": "per_request", **fields})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--model_args: {exc}; seer's own arguments are {list(own_args)}") from None
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {[k for k in DTYPES if k]}, got {dtype!r}")
        self.ranks, device = init_data_parallel("cpu" if device is None else str(device),
                                                timeout_s=positive_seconds("dist_timeout", dist_timeout))
        if self.ranks.world_size > 1 and not self.content_seeds:
            raise ValueError(f"rng='global' under {self.ranks.world_size} processes: the global generator's draws "
                             "depend on the shard and the batch; leave rng unset (each request is seeded from its "
                             "content)")
        if isinstance(batch_size, str) and batch_size.startswith("auto"):
            raise ValueError("batch_size 'auto' is not supported: give the number of requests per batch")
        if max_batch_size is not None:
            raise ValueError("max_batch_size goes with --batch_size auto, which seer does not support")
        self.batch_size = positive_int("batch_size", 1 if batch_size is None else batch_size)
        self.show_speed = flag("show_speed", show_speed)
        self.services = model_services()
        self.pretrained = pretrained
        self.tokenizer = self.services.load_tokenizer(pretrained, chat_template=chat_template, require_template=False)
        self.model = self.services.load_model(pretrained, dtype=DTYPES[dtype], device=device)
        self.seer, self.dyllm = policies(SimpleNamespace(seer=seer, dyllm=dyllm), self.model)
        #: the figures of every call, all ranks together (the same on every rank)
        self.speed = Speed()
        #: this rank's own figures
        self.rank_speed = Speed()
        #: accelerate's Accelerator over the process group, for harnesses that use one (lmms-eval)
        self.accelerator = None
        if self.ranks.world_size > 1:
            from accelerate import Accelerator

            self.accelerator = Accelerator(cpu=self.model.device.type == "cpu")
            if (self.accelerator.process_index, self.accelerator.num_processes) != (self.ranks.rank,
                                                                                   self.ranks.world_size):
                raise RuntimeError(f"accelerate sees process {self.accelerator.process_index} of "
                                   f"{self.accelerator.num_processes}, the launcher rank {self.ranks.rank} of "
                                   f"{self.ranks.world_size}: its state was made before the model, for one "
                                   "process (lmms-eval's command line makes an Accelerator first; on CPU it needs "
                                   "ACCELERATE_USE_CPU=1 to make it for all the ranks)")
            if self.ranks.is_main:
                print(f"[seer] data parallel: {self.ranks.world_size} processes, rank 0 on {self.model.device}",
                      file=sys.stderr)

    @property
    def tokenizer_name(self) -> str:
        source = self.tokenizer.template.source if self.tokenizer.template else "no chat template"
        return f"{self.pretrained}|{source}"

    def request_config(self, kwargs: dict) -> tuple[GenerationConfig, list[str], int | None]:
        """The GenerationConfig, stop strings and answer-token cap of a task's generation keywords:
        ``until``, ``max_gen_toks``, ``do_sample`` (False: temperature 0), and GenerationConfig
        fields over the model arguments' (an unknown key is an error naming it)."""
        if not isinstance(kwargs, dict):
            raise TypeError(f"generation keywords must be a dict, got {type(kwargs).__name__}")
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        if not all(isinstance(u, str) and u for u in until):
            raise ValueError(f"until must be non-empty strings, got {until!r}")
        cap = kwargs.get("max_gen_toks")
        cap = None if cap is None else positive_int("max_gen_toks", cap)
        fields = {k: v for k, v in kwargs.items() if k not in TASK_KEYS}
        sample = kwargs.get("do_sample")
        if sample is False:
            if fields.get("temperature", 0.0) > 0:
                raise ValueError(f"do_sample=False with temperature={fields['temperature']}: pick one")
            fields["temperature"] = 0.0
        try:
            gen = GenerationConfig.from_dict({**self.gen.to_dict(), **fields})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the task's generation keywords {kwargs}: {exc}") from None
        if gen.rng == "global" and self.ranks.world_size > 1:
            raise ValueError(f"the task's generation keywords {kwargs}: rng='global' under {self.ranks.world_size} "
                             "processes (its draws depend on the shard and the batch)")
        if sample is True and gen.temperature == 0:
            raise ValueError("do_sample=True needs temperature > 0 (in the task's keywords or --model_args)")
        return gen, until, cap

    def answer_text(self, ids: list[int], until: list[str]) -> str:
        """Decoded answer ids, cut before the first ``until`` string, special tokens removed."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        cut = min([text.index(u) for u in until if u in text], default=len(text))
        text = text[:cut]
        for special in self.tokenizer.special_tokens:
            text = text.replace(special, "")
        return text

    def decode(self, prompts: list[list[int]], images: list | None, kwargs: list[dict], *, desc: str,
               disable_tqdm: bool = False, on_answer=None, identities: list[tuple] | None = None) -> list[str]:
        """Answers to requests ``prompts[i]`` (ids, ``<image>`` as -200) with ``images[i]`` (None, or
        one entry per request as ``generate`` takes them) and generation keywords ``kwargs[i]``.

        Requests with equal keywords are decoded together in order, ``batch_size`` at a time;
        ``on_answer(i, text)`` is called for each answer (the harness's cache hook).
        identities: per request ``(prompt text, image identities, sample index)``, what its seed is
        made of (:func:`request_seed`, with the configured ``seed``) when its GenerationConfig has
        ``rng="per_request"``; None: the prompt ids, no image, sample 0.

        A collective under several processes: every rank calls it once per harness call (with
        its share, possibly empty), and the figures are gathered from all of them."""
        groups: dict[str, list[int]] = {}
        for i, kw in enumerate(kwargs):
            groups.setdefault(repr(sorted(kw.items())), []).append(i)
        answers: list[str] = [""] * len(prompts)
        bar = tqdm(total=len(prompts), desc=desc, disable=disable_tqdm or not self.ranks.is_main, file=sys.stderr)
        call = Speed()
        device = self.model.device
        for rows in groups.values():
            gen, until, cap = self.request_config(kwargs[rows[0]])
            for start in range(0, len(rows), self.batch_size):
                batch = rows[start: start + self.batch_size]
                seeds = None
                if gen.rng == "per_request":
                    seeds = []
                    for i in batch:
                        prompt, image_ids, sample = identities[i] if identities is not None else (prompts[i], (), 0)
                        seeds.append(request_seed(gen.seed, prompt, images=image_ids, sample=sample))
                ids, mask = pad_left([prompts[i] for i in batch], self.model.token_ids.pad)
                t0 = time.perf_counter()
                out = generate(self.model, ids.to(device), attention_mask=None if mask is None else mask.to(device),
                               images=None if images is None else [images[i] for i in batch], gen=gen,
                               seer=self.seer, dyllm=self.dyllm, request_seeds=seeds)
                if out.sequences.is_cuda:  # the time of the work, not of its launch
                    torch.cuda.synchronize(out.sequences.device)
                call.wall_s += time.perf_counter() - t0
                call.nfe += out.stats.nfe
                call.positions_computed += out.stats.positions_computed
                for r, i in enumerate(batch):
                    answer = out.answer_ids(r)
                    if cap is not None and len(answer) > cap:
                        answer = answer[:cap]
                        call.cut_to_max_gen_toks += 1
                    call.tokens += len(answer)
                    answers[i] = self.answer_text(answer, until)
                    if on_answer is not None:
                        on_answer(i, answers[i])
                call.requests += len(batch)
                bar.update(len(batch))
        bar.close()
        self.rank_speed.add(call)
        total = Speed.combined(all_gather_objects(call, self.ranks))
        self.speed.add(total)
        if self.show_speed and self.ranks.is_main:
            ranks = f" ({self.ranks.world_size} ranks: counts summed, the slowest rank's time)" \
                if self.ranks.world_size > 1 else ""
            print("\n".join(f"[seer] {line}" for line in total.lines()) + ranks, file=sys.stderr)
        return answers
