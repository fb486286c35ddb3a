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
  predicts token i). Seer and DyLLM act on generation only: a likelihood is the full model's.
* ``loglikelihood_rolling`` (perplexity) is not defined for these models: an error.

Speed, as Fast-dLLM's ``show_speed`` prints it after every ``generate_until`` call: generated
tokens (answer tokens before the end token), wall time, tokens per second, NFE (forward passes,
summed over batches); also in :attr:`SeerLM.speed`.

Data parallel (``accelerate launch`` or ``torchrun``, one process per GPU)::

    accelerate launch --num_processes 8 -m seer_runtime.harness.lm_eval --model seer \
        --model_args pretrained=DIR --tasks gsm8k --device cuda --batch_size 16 --apply_chat_template

Each rank reports its global rank and the world size, so lm-eval gives it every world_size-th
document; it implements lm-eval's ``all_gather`` / ``gather_object`` / ``barrier`` over the
process group (``dist_timeout`` seconds, default 3600, before a collective fails) and loads the
model on cuda:LOCAL_RANK. ``generate_until`` seeds each request from its context, its sample
index and ``seed`` (``rng="per_request"`` unless ``rng=global`` is given on one process), and
``loglikelihood`` from its ids and ``mc_seed``: answers and scores do not depend on the number of
processes or the batch. lm-eval's padding requests are not decoded (module ``common``). The
speed lines are the sums over ranks (the wall time of the slowest), printed by rank 0.
"""

from __future__ import annotations

import struct
import sys
import zlib

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from tqdm.auto import tqdm

from .common import MODEL_ARGS, HarnessModel, flag, positive_int, repeat_indices

MODEL_NAME = "seer"

#: the adapter's own --model_args (every other key is a GenerationConfig field)
ADAPTER_ARGS = (*MODEL_ARGS, "mc_num", "mc_batch_size", "mc_seed", "check_greedy", "add_bos_token")


class SeerLM(LM):
    """The lm-eval ``LM`` of a checkpoint decoded by ``seer_runtime.generate`` (module docstring)."""

    def __init__(self, pretrained: str, *, seer: str | None = None, dyllm: str | None = None,
                 chat_template: str | None = None, dtype: str | None = None, device: str | None = "cpu",
                 batch_size: int | str | None = 1, max_batch_size: int | None = None, mc_num: int = 128,
                 mc_batch_size: int = 32, mc_seed: int = 1234, check_greedy: bool = True,
                 add_bos_token: bool = False, show_speed: bool = True, dist_timeout: float = 3600.0, **generation):
        super().__init__()
        self.mc_num = positive_int("mc_num", mc_num)
        self.mc_batch_size = positive_int("mc_batch_size", mc_batch_size)
        if self.mc_num % self.mc_batch_size:
            raise ValueError(f"mc_num ({mc_num}) must be a multiple of mc_batch_size ({mc_batch_size})")
        if isinstance(mc_seed, bool) or not isinstance(mc_seed, int):
            raise ValueError(f"mc_seed must be an int, got {mc_seed!r}")
        self.mc_seed = mc_seed
        self.check_greedy = flag("check_greedy", check_greedy)
        self.add_bos_token = flag("add_bos_token", add_bos_token)
        self.harness = HarnessModel(pretrained, seer=seer, dyllm=dyllm, chat_template=chat_template, dtype=dtype,
                                    device=device, batch_size=batch_size, max_batch_size=max_batch_size,
                                    show_speed=show_speed, dist_timeout=dist_timeout, generation=generation,
                                    own_args=ADAPTER_ARGS)
        h = self.harness
        self.model, self.tokenizer, self.gen, self.speed, self.batch_size = (h.model, h.tokenizer, h.gen, h.speed,
                                                                             h.batch_size)
        self._device = self.model.device
        self._rank, self._world_size = h.ranks.rank, h.ranks.world_size
        if h.accelerator is not None:
            self.accelerator = h.accelerator

    # ------------------------------------------------------------------ lm-eval's collectives
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along dim 0 in rank order (a 0-d tensor counts as
        one element), as accelerate's ``gather``; the tensor itself on one process."""
        if self.world_size == 1:
            return tensor
        import torch.distributed as dist

        part = tensor.reshape(1) if tensor.dim() == 0 else tensor.contiguous()
        parts = [torch.empty_like(part) for _ in range(self.world_size)]
        dist.all_gather(parts, part)
        return torch.cat(parts)

    def gather_object(self, obj, dst: int = 0):
        """Every rank's ``obj`` in rank order on rank ``dst`` (None elsewhere); ``[obj]`` alone."""
        if self.world_size == 1:
            return [obj]
        import torch.distributed as dist

        gathered = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, gathered, dst=dst)
        return gathered

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    # ------------------------------------------------------------------------- chat templates
    @property
    def tokenizer_name(self) -> str:
        return self.harness.tokenizer_name

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
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Answers to ``(context, generation keywords)`` requests, in order (module docstring): the
        k-th copy of a request (lm-eval's repeats) is its sample k; lm-eval's padding copies get
        the answer of the request they copy without being decoded."""
        samples, padding = repeat_indices(requests, lambda r: getattr(r, "repeats", None))
        real = [i for i in range(len(requests)) if i not in padding]

        def cache(j, text):
            self.cache_hook.add_partial("generate_until", requests[real[j]].args, text)

        decoded = self.harness.decode([self._encode(requests[i].args[0]) for i in real], None,
                                      [requests[i].args[1] for i in real], desc="seer generate_until",
                                      disable_tqdm=disable_tqdm, on_answer=cache,
                                      identities=[(requests[i].args[0], (), samples[i]) for i in real])
        answers = dict(zip(real, decoded))
        return [answers[padding.get(i, i)] for i in range(len(requests))]

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
        """``(log p, is_greedy)`` per ``(context, continuation)`` request, in order; lm-eval's padding
        copies take the result of the request they copy (the estimate is seeded by its ids)."""
        _, padding = repeat_indices(requests, lambda r: getattr(r, "repeats", None))
        out = []
        bar = tqdm(requests, desc="seer loglikelihood", disable=disable_tqdm or self.rank != 0, file=sys.stderr)
        for i, req in enumerate(bar):
            if i in padding:
                out.append(out[padding[i]])
                continue
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
