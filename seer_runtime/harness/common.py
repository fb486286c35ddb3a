"""What the harness adapters share: loading a checkpoint from the harness's model arguments, the
decoding configuration of a task's generation keywords, batched decoding of requests with
answers cut as LLaDA's evaluation cuts them, and the speed figures Fast-dLLM prints.

No harness is imported here.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from tqdm.auto import tqdm

from ..config import GenerationConfig
from ..evaluate import pad_left
from ..generation import generate

#: the adapters' shared model arguments (every other key is a GenerationConfig field)
MODEL_ARGS = ("pretrained", "seer", "dyllm", "chat_template", "dtype", "device", "batch_size", "max_batch_size",
              "show_speed")
#: generation keywords of a task that are not GenerationConfig fields
TASK_KEYS = ("until", "max_gen_toks", "do_sample")


@dataclass
class Speed:
    """Totals over ``generate_until`` calls: answer tokens (before the end token), wall seconds of
    ``generate``, forward passes (NFE, summed over batches), requests, and answers cut to the
    task's ``max_gen_toks``."""

    tokens: int = 0
    wall_s: float = 0.0
    nfe: int = 0
    requests: int = 0
    cut_to_max_gen_toks: int = 0

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def add(self, other: Speed) -> None:
        for name in ("tokens", "wall_s", "nfe", "requests", "cut_to_max_gen_toks"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def lines(self) -> list[str]:
        """Fast-dLLM's ``show_speed`` lines, and the requests and cut answers."""
        return [f"Total number of tokens generated: {self.tokens}", f"Total time taken: {self.wall_s:.3f} seconds",
                f"Tokens per second: {self.tok_per_s:.2f}", f"Total NFE is {self.nfe}",
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


class HarnessModel:
    """A checkpoint loaded from a harness's model arguments (``MODEL_ARGS`` and GenerationConfig
    fields, over the checkpoint's decoding defaults), and its batched decoding.

    own_args: the calling adapter's full argument list, named in the error for an unknown key.
    """

    def __init__(self, pretrained: str, *, seer=None, dyllm=None, chat_template=None, dtype=None, device="cpu",
                 batch_size=1, max_batch_size=None, show_speed=True, generation: dict, own_args=MODEL_ARGS):
        from ..cli.options import DTYPES, checkpoint_generation_fields, model_services, policies

        if not isinstance(pretrained, str) or not pretrained:
            raise ValueError("pretrained must be a local checkpoint directory (--model_args pretrained=DIR)")
        try:
            self.gen = GenerationConfig.from_dict({**checkpoint_generation_fields(pretrained), **generation})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--model_args: {exc}; seer's own arguments are {list(own_args)}") from None
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {[k for k in DTYPES if k]}, got {dtype!r}")
        device = "cpu" if device is None else str(device)
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={device!r}, but CUDA is not available here: pass --device cpu")
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
        self.speed = Speed()

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
               disable_tqdm: bool = False, on_answer=None) -> list[str]:
        """Answers to requests ``prompts[i]`` (ids, ``<image>`` as -200) with ``images[i]`` (None, or
        one entry per request as ``generate`` takes them) and generation keywords ``kwargs[i]``.

        Requests with equal keywords are decoded together in order, ``batch_size`` at a time;
        ``on_answer(i, text)`` is called for each answer (the harness's cache hook)."""
        groups: dict[str, list[int]] = {}
        for i, kw in enumerate(kwargs):
            groups.setdefault(repr(sorted(kw.items())), []).append(i)
        answers: list[str] = [""] * len(prompts)
        bar = tqdm(total=len(prompts), desc=desc, disable=disable_tqdm, file=sys.stderr)
        call = Speed()
        device = self.model.device
        for rows in groups.values():
            gen, until, cap = self.request_config(kwargs[rows[0]])
            for start in range(0, len(rows), self.batch_size):
                batch = rows[start: start + self.batch_size]
                ids, mask = pad_left([prompts[i] for i in batch], self.model.token_ids.pad)
                t0 = time.perf_counter()
                out = generate(self.model, ids.to(device), attention_mask=None if mask is None else mask.to(device),
                               images=None if images is None else [images[i] for i in batch], gen=gen,
                               seer=self.seer, dyllm=self.dyllm)
                if out.sequences.is_cuda:  # the time of the work, not of its launch
                    torch.cuda.synchronize(out.sequences.device)
                call.wall_s += time.perf_counter() - t0
                call.nfe += out.stats.nfe
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
        self.speed.add(call)
        if self.show_speed:
            print("\n".join(f"[seer] {line}" for line in call.lines()), file=sys.stderr)
        return answers
