"""lmms-eval model ``seer_lavida``: LaViDa-LLaDA and LaViDa-Dream checkpoints (any multimodal model
our model layer loads) decoded by our ``generate``, batched, with Seer and DyLLM if asked.

Installed with the package, lmms-eval finds it through the entry point ``lmms_eval.models``
(``seer_runtime.harness:lmms_eval_models``)::

    lmms-eval --model seer_lavida --model_args pretrained=DIR,seer=seer_config.json,gen_length=32 \\
        --tasks chartqa --device cuda --batch_size 16

or, in Python, ``import seer_runtime.harness.lmms_eval`` (which registers it) and
``lmms_eval.evaluator.simple_evaluate(model="seer_lavida", ...)``.

``--model_args`` as for lm-eval's ``seer`` (``pretrained``, ``seer``, ``dyllm``,
``chat_template``, ``dtype``, ``show_speed``; every other key a ``GenerationConfig`` field over
the checkpoint's ``seer_generation_config.json``). LaViDa's own checkpoints carry no LaViDa
conversation template: pass ``chat_template=lavida-llada`` (or ``lavida-dream``) to prompt as
LaViDa's lmms-eval wrapper does.

``generate_until``: each request's images (``doc_to_visual``) are prepared as the model's
processor does, its prompt is the chat template rendered for one user turn whose content is
``<image>\\n`` per image and then the context (LaViDa's wrapper's layout), and requests are
decoded ``--batch_size`` at a time; answers and speed figures as in the lm-eval adapter.
``loglikelihood`` and multi-round generation are not supported (errors).

Data parallel (``accelerate launch`` or ``torchrun``, one process per GPU)::

    accelerate launch --num_processes 8 -m lmms_eval --model seer_lavida \
        --model_args pretrained=DIR,chat_template=lavida-llada --tasks chartqa --device cuda --batch_size 16

The model is loaded on cuda:LOCAL_RANK (lmms-eval creates its Accelerator after the model), the
global rank and world size come from the launcher (RANK, WORLD_SIZE), and ``accelerator`` is
accelerate's Accelerator over the process group, whose ``gather`` lmms-eval uses. Each request is
seeded from its context, its images' pixels, its sample index and ``seed``. lmms-eval's padding
requests (``__padding_only__``) are not decoded: they get an empty answer, which lmms-eval drops.
"""

from __future__ import annotations

from lmms_eval.api.model import lmms

from . import LMMS_MODEL_NAME as MODEL_NAME
from .common import HarnessModel, image_identity, repeat_indices


class SeerLavida(lmms):
    """The lmms-eval model of a multimodal checkpoint decoded by ``seer_runtime.generate``."""

    is_simple = True

    def __init__(self, pretrained: str, *, seer: str | None = None, dyllm: str | None = None,
                 chat_template: str | None = None, dtype: str | None = None, device: str | None = "cpu",
                 batch_size: int | str | None = 1, max_batch_size: int | None = None, show_speed: bool = True,
                 dist_timeout: float = 3600.0, **generation):
        super().__init__()
        self.harness = HarnessModel(pretrained, seer=seer, dyllm=dyllm, chat_template=chat_template, dtype=dtype,
                                    device=device, batch_size=batch_size, max_batch_size=max_batch_size,
                                    show_speed=show_speed, dist_timeout=dist_timeout, generation=generation)
        h = self.harness
        if not getattr(h.model, "is_multimodal", False):
            raise ValueError(f"{pretrained} holds a text-only model ({type(h.model).__name__}): use lm-eval's "
                             "'seer' model for it")
        if h.tokenizer.template is None:
            raise ValueError(f"{pretrained} has no chat template: pass chat_template=lavida-llada (or lavida-dream, "
                             "or a jinja2 file)")
        self.model, self.tokenizer, self.gen, self.speed, self.batch_size = (h.model, h.tokenizer, h.gen, h.speed,
                                                                             h.batch_size)
        self._device = self.model.device
        self._rank, self._world_size = h.ranks.rank, h.ranks.world_size
        if h.accelerator is not None:
            self.accelerator = h.accelerator

    @property
    def device(self):
        """The model's device (lmms-eval puts its rank-count tensors there)."""
        return self._device

    def _prompt(self, context: str, n_images: int) -> list[int]:
        content = "<image>\n" * n_images + context
        return self.tokenizer.encode(self.tokenizer.apply_chat_template([{"role": "user", "content": content}]))

    def generate_until(self, requests) -> list[str]:
        """Answers to ``(context, generation keywords, doc_to_visual, doc_id, task, split)`` requests
        (padding requests: an empty answer, not decoded; the k-th copy of a request: sample k)."""
        samples, _ = repeat_indices(requests, lambda r: getattr(r, "repeats", None))
        real = [i for i, r in enumerate(requests) if not (getattr(r, "metadata", None) or {}).get("__padding_only__")]
        prompts, images, kwargs, identities = [], [], [], []
        for i in real:
            context, gen_kwargs, doc_to_visual, doc_id, task, split = requests[i].args
            visuals = [v for v in (doc_to_visual(self.task_dict[task][split][doc_id]) or []) if v is not None]
            prompts.append(self._prompt(context, len(visuals)))
            images.append([self.harness.services.prepare_image(self.model, v) for v in visuals])
            kwargs.append(dict(gen_kwargs))
            identities.append((context, [image_identity(v) for v in visuals], samples[i]))

        def cache(j, text):
            self.cache_hook.add_partial("generate_until", (requests[real[j]].args[0], requests[real[j]].args[1]), text)

        decoded = self.harness.decode(prompts, images, kwargs, desc="seer_lavida generate_until",
                                      disable_tqdm=self.rank != 0, on_answer=cache, identities=identities)
        answers = [""] * len(requests)
        for i, text in zip(real, decoded):
            answers[i] = text
        return answers

    def loglikelihood(self, requests):
        raise NotImplementedError("seer_lavida scores generate_until tasks only; for likelihoods of text, use "
                                  "lm-eval's 'seer' model")

    def generate_until_multi_round(self, requests):
        raise NotImplementedError("seer_lavida answers single-round requests only")


def register() -> None:
    """Register ``seer_lavida`` with lmms-eval's model registry (idempotent), as its entry point does."""
    from lmms_eval.models import MODEL_REGISTRY_V2

    from . import lmms_eval_models

    if MODEL_NAME not in MODEL_REGISTRY_V2.list_model_names():
        for manifest in lmms_eval_models():
            MODEL_REGISTRY_V2.register_manifest(manifest)


register()
