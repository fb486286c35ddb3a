"""Architecture-faithful model definitions and checkpoint loading.

The only package that knows each model's module names (LLaDA's ``ff_proj``, Dream's
``gate_proj``...). Every model implements the adapter surface of
:class:`model_adapters.decoder.DiffusionDecoder`, through which ``seer_runtime`` drives it.
"""

from .configs import PUBLISHED, tiny_config
from .decoder import DiffusionDecoder, ModelOutput
from .dream import DreamModel
from .lavida import (
    IMAGE_TOKEN_INDEX,
    ImageInput,
    LlavaDreamForMaskedDiffusion,
    LlavaLladaForMaskedDiffusion,
    process_image,
)
from .llada import LLaDAModelLM, MMadaModelLM, mmada_mmu_input_ids
from .loading import ARCHITECTURES, architecture_of, build_model, load_model, save_model
from .shared_weights import from_module

__all__ = [
    "ARCHITECTURES",
    "IMAGE_TOKEN_INDEX",
    "PUBLISHED",
    "DiffusionDecoder",
    "DreamModel",
    "ImageInput",
    "LLaDAModelLM",
    "LlavaDreamForMaskedDiffusion",
    "LlavaLladaForMaskedDiffusion",
    "MMadaModelLM",
    "ModelOutput",
    "architecture_of",
    "build_model",
    "from_module",
    "load_model",
    "mmada_mmu_input_ids",
    "process_image",
    "save_model",
    "tiny_config",
]
