"""lm-evaluation-harness model ``seer``: any checkpoint our model layer loads, decoded by our
``generate`` (optionally with Seer and DyLLM), scored the way LLaDA's own evaluation scores.

Run it (lm-eval 0.4 discovers models only through its registry, which this module fills when
imported, so the harness's command is started from here)::

    python -m seer_runtime.harness.lm_eval --model seer \\
        --model_args pretrained=DIR,seer=seer_config.json,dyllm=dyllm_config.json,gen_length=256,steps=256 \\
        --tasks gsm8k --device cuda --batch_size 16 --apply_chat_template

or, in Python, ``import seer_runtime.harness.lm_eval`` and then ``lm_eval.simple_evaluate(model="seer",
model_args=...)`` (or pass a :class:`SeerLM` instance).

``--model_args``: ``pretrained`` (a local checkpoint directory); ``seer`` (a SeerConfig JSON
file), ``dyllm`` (a DyLLMConfig JSON file, or ``default``); ``chat_template`` (instead of the
checkpoint's own: a jinja2 file or a family template's name); ``dtype`` (float32 | float16 |
bfloat16); the Monte-Carlo likelihood's ``mc_num`` (128), ``mc_batch_size`` (32), ``mc_seed``
(1234; each request's draws are seeded with it and the request's ids) and ``check_greedy``
(True); ``add_bos_token`` (False: the text is encoded as given, as lm-eval's HF model does; a
chat template writes its own BOS); ``show_speed`` (True). Every other
key is a ``GenerationConfig`` field (``gen_length``, ``steps``, ``block_length``, ``remasking``,
``temperature``, ...), over the checkpoint's decoding defaults (``seer_generation_config.json``)
and checked by ``GenerationConfig.from_dict``, which names an unknown key.

Requests:

* ``generate_until``: contexts are encoded as given (with ``--apply_chat_template``, lm-eval
  renders them with the checkpoint's template first), left-padded into batches of
  ``--batch_size`` and decoded by ``generate``; the answer is the window up to its first
  end-of-sequence / end-of-turn token, decoded, cut before the first ``until`` string, with
  special tokens removed (as LLaDA's eval_llada.py does). The task's ``max_gen_toks`` caps the
  answer's tokens (a diffusion model decodes its whole window; an autoregressive one would have
  stopped); ``do_sample`` / ``temperature`` and any other generation keyword of the task set
  the GenerationConfig of its requests.
* ``loglikelihood``: the Monte-Carlo estimate of ML-GSAI/LLaDA's eval_llada.py: ``mc_num``
  samples in batches of ``mc_batch_size``, each masking a stratified number of continuation
  positions, cross-entropy of the masked positions divided by the mask ratio; ``is_greedy`` by
  its suffix greedy prediction (one position committed per forward). Classifier-free guidance
  (``cfg_scale``) as its ``get_logits``. Dream-family logits are shifted (position i-1
  predicts token i).
* ``loglikelihood_rolling`` (perplexity) is not defined for these models: an error.

Speed, as Fast-dLLM's ``show_speed`` prints it after every ``generate_until`` call: generated
tokens (answer tokens before the end token), wall time, tokens per second, NFE (forward passes,
summed over batches); also in :attr:`SeerLM.speed`.
"""

from __future__ import annotations

import struct
import sys
import time
import zlib
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from tqdm.auto import tqdm

from ..config import GenerationConfig
from ..evaluate import pad_left
from ..generation import generate

MODEL_NAME = "seer"

#: the adapter's own --model_args (every other key is a GenerationConfig field)
ADAPTER_ARGS = ("pretrained", "seer", "dyllm", "chat_template", "dtype", "device", "batch_size", "max_batch_size",
                "mc_num", "mc_batch_size", "mc_seed", "check_greedy", "add_bos_token", "show_speed")
#: generation keywords of a task that are not GenerationConfig fields
_TASK_KEYS = ("until", "max_gen_toks", "do_sample")


@dataclass
class Speed:
    """Totals over ``generate_until`` calls: answer tokens, wall seconds, forward passes, requests,
    and answers cut to the task's ``max_gen_toks``."""

    tokens: int = 0
    wall_s: float = 0.0
    nfe: int = 0
    requests: int = 0
    cut_to_max_gen_toks: int = 0

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def lines(self) -> list[str]:
        return [f"Total number of tokens generated: {self.tokens}", f"Total time taken: {self.wall_s:.3f} seconds",
                f"Tokens per second: {self.tok_per_s:.2f}", f"Total NFE is {self.nfe}",
                f"Requests: {self.requests}; answers cut to max_gen_toks: {self.cut_to_max_gen_toks}"]


def _positive_int(name: str, value) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


class SeerLM(LM):
    """The lm-eval ``LM`` of a checkpoint decoded by ``seer_runtime.generate`` (module docstring)."""

    def __init__(self, pretrained: str, *, seer: str | None = None, dyllm: str | None = None,
                 chat_template: str | None = None, dtype: str | None = None, device: str | None = "cpu",
                 batch_size: int | str | None = 1, max_batch_size: int | None = None, mc_num: int = 128,
                 mc_batch_size: int = 32, mc_seed: int = 1234, check_greedy: bool = True,
                 add_bos_token: bool = False, show_speed: bool = True, **generation):
        super().__init__()
        from ..cli.options import DTYPES, checkpoint_generation_fields, model_services, policies

        if not isinstance(pretrained, str) or not pretrained:
            raise ValueError("pretrained must be a local checkpoint directory (--model_args pretrained=DIR)")
        try:
            self.gen = GenerationConfig.from_dict({**checkpoint_generation_fields(pretrained), **generation})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--model_args: {exc}; seer's own arguments are {list(ADAPTER_ARGS)}") from None
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {[k for k in DTYPES if k]}, got {dtype!r}")
        device = "cpu" if device is None else str(device)
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={device!r}, but CUDA is not available here: pass --device cpu")
        if isinstance(batch_size, str) and batch_size.startswith("auto"):
            raise ValueError("batch_size 'auto' is not supported: give the number of requests per batch")
        if max_batch_size is not None:
            raise ValueError("max_batch_size goes with --batch_size auto, which seer does not support")
        self.batch_size = _positive_int("batch_size", 1 if batch_size is None else batch_size)
        self.mc_num = _positive_int("mc_num", mc_num)
        self.mc_batch_size = _positive_int("mc_batch_size", mc_batch_size)
        if self.mc_num % self.mc_batch_size:
            raise ValueError(f"mc_num ({mc_num}) must be a multiple of mc_batch_size ({mc_batch_size})")
        if isinstance(mc_seed, bool) or not isinstance(mc_seed, int):
            raise ValueError(f"mc_seed must be an int, got {mc_seed!r}")
        self.check_greedy = _flag("check_greedy", check_greedy)
        self.add_bos_token = _flag("add_bos_token", add_bos_token)
        self.show_speed = _flag("show_speed", show_speed)
        svc = model_services()
        self.pretrained = pretrained
        self.tokenizer = svc.load_tokenizer(pretrained, chat_template=chat_template, require_template=False)
        self.model = svc.load_model(pretrained, dtype=DTYPES[dtype], device=device)
        self.seer, self.dyllm = policies(SimpleNamespace(seer=seer, dyllm=dyllm), self.model)
        self._device = self.model.device
        self.mc_seed = mc_seed
        self.speed = Speed()

    # ------------------------------------------------------------------------- chat templates
    @property
    def tokenizer_name(self) -> str:
        source = self.tokenizer.template.source if self.tokenizer.template else "no chat template"
        return f"{self.pretrained}|{source}"

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tokenizer.template.template if self.tokenizer.template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt)

    # ---------------------------------------------------------------------------- encoding
    def _encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text)
        return [self.model.token_ids.bos, *ids] if self.add_bos_token else ids

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Trailing spaces of the context move to the continuation; the continuation's ids are
        the whole text's after the context's (lm-eval's and LLaDA's rule)."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self._encode(context + continuation)
        prefix = self._encode(context)
        target = whole[len(prefix):]
        if not target:
            raise ValueError(f"the continuation {continuation!r} encodes to no tokens after its context")
        return prefix, target

    # ------------------------------------------------------------------------ generate_until
    def _request_config(self, kwargs: dict) -> tuple[GenerationConfig, list[str], int | None]:
        """The GenerationConfig, stop strings and token cap of a task's generation keywords."""
        if not isinstance(kwargs, dict):
            raise TypeError(f"generation keywords must be a dict, got {type(kwargs).__name__}")
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        if not all(isinstance(u, str) and u for u in until):
            raise ValueError(f"until must be non-empty strings, got {until!r}")
        cap = kwargs.get("max_gen_toks")
        cap = None if cap is None else _positive_int("max_gen_toks", cap)
        fields = {k: v for k, v in kwargs.items() if k not in _TASK_KEYS}
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

    def _answer_text(self, ids: list[int], until: list[str]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        cut = min([text.index(u) for u in until if u in text], default=len(text))
        text = text[:cut]
        for special in self.tokenizer.special_tokens:
            text = text.replace(special, "")
        return text

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Answers to ``(context, generation keywords)`` requests, in order (module docstring)."""
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(repr(sorted(req.args[1].items())), []).append(i)
        answers: list[str | None] = [None] * len(requests)
        bar = tqdm(total=len(requests), desc="seer generate_until", disable=disable_tqdm, file=sys.stderr)
        call = Speed()
        for rows in groups.values():
            gen, until, cap = self._request_config(requests[rows[0]].args[1])
            for start in range(0, len(rows), self.batch_size):
                batch = rows[start: start + self.batch_size]
                ids, mask = pad_left([self._encode(requests[i].args[0]) for i in batch], self.model.token_ids.pad)
                ids = ids.to(self._device)
                mask = None if mask is None else mask.to(self._device)
                t0 = time.perf_counter()
                out = generate(self.model, ids, attention_mask=mask, gen=gen, seer=self.seer, dyllm=self.dyllm)
                call.wall_s += time.perf_counter() - t0
                call.nfe += out.stats.nfe
                for r, i in enumerate(batch):
                    answer = out.answer_ids(r)
                    if cap is not None and len(answer) > cap:
                        answer = answer[:cap]
                        call.cut_to_max_gen_toks += 1
                    call.tokens += len(answer)
                    answers[i] = self._answer_text(answer, until)
                    self.cache_hook.add_partial("generate_until", requests[i].args, answers[i])
                call.requests += len(batch)
                bar.update(len(batch))
        bar.close()
        for name in ("tokens", "wall_s", "nfe", "requests", "cut_to_max_gen_toks"):
            setattr(self.speed, name, getattr(self.speed, name) + getattr(call, name))
        if self.show_speed:
            print("\n".join(f"[seer] {line}" for line in call.lines()), file=sys.stderr)
        return answers

    # ------------------------------------------------------------------------- loglikelihood
    def _logits(self, batch: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """Float logits ``[B, L, V]`` where position i scores token i (classifier-free guidance
        with the prompt masked when ``cfg_scale`` > 0, as LLaDA's ``get_logits``)."""
        cfg = self.gen.cfg_scale
        if cfg > 0:
            uncond = batch.clone()
            uncond[:, :prompt_len] = self.model.token_ids.mask
            batch = torch.cat([batch, uncond])
        logits = self.model(batch).logits.float()
        if self.model.logits_shift:  # Dream's convention: the state at i-1 predicts token i
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        if cfg > 0:
            cond, uncond = logits.chunk(2, dim=0)
            logits = uncond + (cfg + 1) * (cond - uncond)
        return logits

    @staticmethod
    def _forward_process(batch: torch.Tensor, prompt_len: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """LLaDA's stratified masking: row r masks x_r of the T target positions, the x_r spread
        evenly over [1, T] from a random start; returns (mask [B, L] bool, ratio [B, L])."""
        b, length = batch.shape
        target_len = length - prompt_len
        k = torch.randint(1, target_len + 1, (), generator=g)
        x = torch.round(torch.linspace(float(k), k + (b - 1) * (target_len / b), steps=b)).long()
        x = ((x - 1) % target_len) + 1
        is_mask = torch.arange(target_len).repeat(b, 1) < x.unsqueeze(1)
        for r in range(b):
            is_mask[r] = is_mask[r][torch.randperm(target_len, generator=g)]
        is_mask = torch.cat([torch.zeros(b, prompt_len, dtype=torch.bool), is_mask], dim=1)
        ratio = (x / target_len).unsqueeze(1).repeat(1, length)
        return is_mask.to(batch.device), ratio.to(batch.device)

    @torch.no_grad()
    def mc_loglikelihood(self, prefix: list[int], target: list[int]) -> float:
        """LLaDA's Monte-Carlo estimate of log p(target | prefix): the mean over ``mc_num`` masked
        samples of -sum(CE of the masked positions / mask ratio).

        The draws come from a generator seeded with ``mc_seed`` and the request's ids (LLaDA draws
        from the global generator), so a request's estimate does not depend on the requests
        before it or on their order."""
        ids = prefix + target
        g = torch.Generator().manual_seed(self.mc_seed + zlib.crc32(struct.pack(f"<{len(ids)}q", *ids)))
        seq = torch.tensor([ids], dtype=torch.long, device=self._device).repeat(self.mc_batch_size, 1)
        losses = []
        for _ in range(self.mc_num // self.mc_batch_size):
            is_mask, ratio = self._forward_process(seq, len(prefix), g)
            noisy = torch.where(is_mask, self.model.token_ids.mask, seq)
            logits = self._logits(noisy, len(prefix))
            loss = F.cross_entropy(logits[is_mask], seq[is_mask], reduction="none") / ratio[is_mask]
            losses.append(loss.sum().item() / self.mc_batch_size)
        return -sum(losses) / len(losses)

    @torch.no_grad()
    def suffix_greedy(self, prefix: list[int], target: list[int]) -> bool:
        """LLaDA's ``suffix_greedy_prediction``: from an all-mask continuation, commit the most
        confident position per forward; is the result the target?"""
        mask_id = self.model.token_ids.mask
        seq = torch.tensor([prefix + [mask_id] * len(target)], dtype=torch.long, device=self._device)
        for _ in range(len(target)):
            masked = seq == mask_id
            logits = self._logits(seq, len(prefix))[masked]
            x0 = logits.argmax(dim=-1)
            confidence = torch.softmax(logits, dim=-1).gather(-1, x0[:, None]).squeeze(-1)
            order = torch.sort(confidence, descending=True).indices
            x0[order[1:]] = mask_id
            seq[masked] = x0
        return seq[0, len(prefix):].tolist() == target

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = []
        for req in tqdm(requests, desc="seer loglikelihood", disable=disable_tqdm, file=sys.stderr):
            prefix, target = self._encode_pair(*req.args)
            result = (self.mc_loglikelihood(prefix, target),
                      self.suffix_greedy(prefix, target) if self.check_greedy else False)
            self.cache_hook.add_partial("loglikelihood", req.args, result)
            out.append(result)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("loglikelihood_rolling (perplexity tasks) is not defined for masked diffusion "
                                  "models here: use generate_until or loglikelihood tasks")


def register() -> None:
    """Register :class:`SeerLM` with lm-eval as ``seer`` (idempotent). lm-eval's built-in models are
    registered first: its registry loads them only while it is empty."""
    import lm_eval.models  # noqa: F401
    from lm_eval.api.registry import model_registry

    current = model_registry.get(MODEL_NAME, None)
    if current is None:
        model_registry.register(MODEL_NAME, target=SeerLM)
    elif current is not SeerLM:
        raise ValueError(f"lm-eval already has a model named {MODEL_NAME!r}: {current}")


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line with ``seer`` registered (its arguments, e.g. ``--model seer ...``)."""
    from lm_eval.__main__ import cli_evaluate

    register()
    sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()


if __name__ == "__main__":  # run the package's module, so that the class is registered once
    from seer_runtime.harness.lm_eval import main as _main

    _main()
else:
    register()
