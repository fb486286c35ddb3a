"""What the ``seer`` command line needs from the model layer, registered as the entry point
``seer.models = model_adapters.services`` (pyproject.toml), so that ``seer_runtime`` never
imports model definitions directly and other adapter packages can plug in the same way."""

from __future__ import annotations

from pathlib import Path

from . import images
from .chat import ChatTokenizer
from .configs import tiny_config
from .loading import build_model, check_config, load_model


def load_tokenizer(path: str | Path, *, chat_template: str | Path | None = None,
                   require_template: bool = True) -> ChatTokenizer:
    """The checkpoint's tokenizer and chat template (``model_adapters.chat``): ``chat_template``
    overrides the directory's (a jinja2 file or a family template's name); without a template
    in the directory, ``require_template=False`` still gives the tokenizer (raw-text use)."""
    return ChatTokenizer.from_pretrained(path, chat_template=chat_template, require_template=require_template)


def prepare_image(model, image):
    """A PIL image prepared as the model's processor does (LaViDa: anyres per its config; any
    mode converted to RGB by ``model_adapters.images.to_rgb``)."""
    if not getattr(model, "is_multimodal", False):
        raise ValueError(f"an image was given, but {type(model).__name__} is a text-only model")
    return model.preprocess_image(image)


def open_image(path: str | Path, *, what: str = "image file"):
    """Read and decode an image file as 8-bit RGB, without a model (``model_adapters.images.open_image``:
    errors name the file; a decompression bomb is refused before decoding)."""
    return images.open_image(path, what=what)


def load_image(model, path: str | Path, *, what: str = "image file"):
    """Read an image file and prepare it as the model's processor does (:func:`prepare_image`)."""
    if not getattr(model, "is_multimodal", False):
        raise ValueError(f"an image ({what} {path}) was given, but {type(model).__name__} is a text-only model")
    return prepare_image(model, images.open_image(path, what=what))


def check_checkpoint(path: str | Path) -> dict:
    """What a command needs to know of a checkpoint directory before it reads any weight:
    ``{"architecture": key, "multimodal": bool}``, after validating its config.json
    (``loading.check_config``) and building the model on the meta device (no memory), which
    also checks its special token ids against the vocabulary; errors name the file and field."""
    path = Path(path)
    if path.is_file():
        raise ValueError(f"model directory {path} is a file: give the checkpoint's directory (config.json and the "
                         "weights)")
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    arch = check_config(path)
    model = build_model(path, device="meta")
    return {"architecture": arch, "multimodal": bool(getattr(model, "is_multimodal", False))}


def tiny_random_model(kind: str = "lavida-llada", *, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    return build_model(tiny_config(kind))


EMBEDDED_WORKLOADS = ("demo", "arith")


def embedded(workload: str = "demo"):
    """An embedded model's serving helpers: ``"demo"`` (the demo DMLLM,
    ``model_adapters.embedded.serving``) or ``"arith"`` (the word-problem model,
    ``model_adapters.embedded.arith.serving``). Each has ``load_embedded``, ``demo_requests``,
    ``calibration_requests``, ``demo_generation_config``, ``default_seer_config``,
    ``default_dyllm_config``, ``answer_figures`` and the demo's ``DEMO_REQUESTS``,
    ``DEMO_BATCH``, ``DESCRIPTION``, ``MODEL_DIR``."""
    if workload == "demo":
        from .embedded import serving
    elif workload == "arith":
        from .embedded.arith import serving
    else:
        raise ValueError(f"workload must be one of {EMBEDDED_WORKLOADS}, got {workload!r}")
    return serving


__all__ = ["EMBEDDED_WORKLOADS", "build_model", "check_checkpoint", "embedded", "load_image", "load_model",
           "load_tokenizer", "open_image", "prepare_image", "tiny_random_model"]
