"""The decoding engine, the Seer and DyLLM policies, and the batched-serving runtime.

``generate(model, input_ids, *, attention_mask=None, images=None, gen=GenerationConfig(...),
seer=None, dyllm=None)`` decodes a batch with any ``model_adapters`` model.
"""

from .config import GenerationConfig
from .dyllm import DyLLMConfig as DyLLMConfig
from .engine import GenerationOutput, GenerationStats, generate

__all__ = ["GenerationConfig", "GenerationOutput", "GenerationStats", "generate"]
