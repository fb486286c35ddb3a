"""Published configurations (``reference/MODELS.md``) and tiny random configs for tests.

The dicts hold the ``config.json`` fields our definitions read; building one on the ``meta``
device checks every key name and shape of the real checkpoint without allocating memory.
:data:`CONFIG_SCHEMAS` lists those fields per architecture (required or not, their JSON types):
:func:`check_config_fields` checks a config.json against it before anything is built.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from .siglip import SO400M

LLADA_8B_INSTRUCT = {
    "model_type": "llada",
    "architectures": ["LLaDAModelLM"],
    "d_model": 4096,
    "n_heads": 32,
    "n_kv_heads": 32,
    "n_layers": 32,
    "mlp_ratio": 4,
    "mlp_hidden_size": 12288,
    "max_sequence_length": 4096,
    "rope": True,
    "rope_theta": 500000.0,
    "rope_full_precision": True,
    "vocab_size": 126464,
    "embedding_size": 126464,
    "layer_norm_type": "rms",
    "layer_norm_with_affine": True,
    "bias_for_layer_norm": False,
    "rms_norm_eps": 1e-05,
    "activation_type": "silu",
    "block_type": "llama",
    "block_group_size": 1,
    "include_bias": False,
    "include_qkv_bias": False,
    "weight_tying": False,
    "attention_layer_norm": False,
    "alibi": False,
    "input_emb_norm": False,
    "scale_logits": False,
    "flash_attention": False,
    "attention_dropout": 0.0,
    "residual_dropout": 0.0,
    "embedding_dropout": 0.0,
    "mask_token_id": 126336,
    "eos_token_id": 126081,
    "pad_token_id": 126081,
    "use_cache": False,
    "precision": "amp_bf16",
}

MMADA_8B = {
    **LLADA_8B_INSTRUCT,
    "model_type": "mmada",
    "architectures": ["MMadaModelLM"],
    "vocab_size": 134656,
    "embedding_size": 134656,
    "llm_vocab_size": 126464,
    "new_vocab_size": 134656,
    "codebook_size": 8192,
    "num_vq_tokens": 1024,
    "num_new_special_tokens": 0,
    "tie_word_embeddings": False,
}

DREAM_7B_INSTRUCT = {
    "model_type": "Dream",
    "architectures": ["DreamModel"],
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "vocab_size": 152064,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "use_sliding_window": False,
    "sliding_window": None,
    "attention_dropout": 0.0,
    "mask_token_id": 151666,
    "pad_token_id": 151643,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "use_cache": False,
}

_LLAVA_FIELDS = {
    "mm_vision_tower": "google/siglip-so400m-patch14-384",
    "mm_projector_type": "mlp2x_gelu",
    "mm_hidden_size": SO400M["hidden_size"],
    "mm_vision_select_layer": -2,
    "mm_spatial_pool_mode": "bilinear",
    "mm_spatial_pool_stride": 2,
    "mm_patch_merge_type": "spatial_unpad",
    "image_aspect_ratio": "anyres",
    "image_grid_pinpoints": [[384, 768], [768, 384], [768, 768], [1152, 384], [384, 1152]],
    "mm_newline_position": "one_token",
}

LAVIDA_LLADA = {**LLADA_8B_INSTRUCT, **_LLAVA_FIELDS, "model_type": "llava_llada",
                "architectures": ["LlavaLladaForMaskedDiffusion"]}
LAVIDA_DREAM = {**DREAM_7B_INSTRUCT, **_LLAVA_FIELDS, "model_type": "llava_dream",
                "architectures": ["LlavaDreamForMaskedDiffusion"]}

PUBLISHED = {
    "llada-8b-instruct": LLADA_8B_INSTRUCT,
    "dream-v0-instruct-7b": DREAM_7B_INSTRUCT,
    "mmada-8b": MMADA_8B,
    "lavida-llada": LAVIDA_LLADA,
    "lavida-dream": LAVIDA_DREAM,
}

TINY_VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "patch_size": 8,
    "image_size": 32,
    "layer_norm_eps": 1e-6,
    "num_channels": 3,
}


def tiny_config(kind: str, **overrides) -> dict:
    """A small random-initialisable config of ``kind`` (a key of :data:`PUBLISHED`) for tests.

    Vocabulary 256 with the special ids moved into it (mask 250, EOS 251, end-of-turn 252).
    """
    if kind not in PUBLISHED:
        raise ValueError(f"kind must be one of {sorted(PUBLISHED)}, got {kind!r}")
    c = copy.deepcopy(PUBLISHED[kind])
    ids = {"mask_token_id": 250, "eos_token_id": 251, "eot_token_id": 252, "pad_token_id": 251,
           "bos_token_id": 253}
    if c["model_type"] in ("llada", "mmada", "llava_llada"):
        c.update(d_model=64, n_heads=4, n_kv_heads=4, n_layers=3, mlp_hidden_size=96, vocab_size=256,
                 embedding_size=256, rope_theta=10000.0, **ids)
        if c["model_type"] == "mmada":
            c.update(vocab_size=288, embedding_size=288, new_vocab_size=288, llm_vocab_size=256,
                     codebook_size=32, text_vocab_size=256)
    else:
        c.update(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, rope_theta=10000.0, **ids)
    if c["model_type"].startswith("llava"):
        c.update(vision_config=dict(TINY_VISION), mm_hidden_size=TINY_VISION["hidden_size"],
                 image_grid_pinpoints=[[32, 64], [64, 32], [64, 64]])
    c.update(overrides)
    return c


# ---------------------------------------------------------------------------- config.json schemas
@dataclass(frozen=True)
class ConfigField:
    """One ``config.json`` field an architecture reads: its JSON kind ("int", "number", "bool",
    "str", "object", "pinpoints"), whether it must be present, and the smallest value a number
    may take. An optional field may be absent or null (Hugging Face writes null for "default")."""

    name: str
    kind: str
    required: bool = False
    minimum: float | None = None


def _fields(kind: str, names: str, *, required: bool = False, minimum: float | None = None) -> list[ConfigField]:
    return [ConfigField(n, kind, required, minimum) for n in names.split()]


_TOKEN_IDS = _fields("int", "mask_token_id eos_token_id eot_token_id pad_token_id bos_token_id", minimum=0)
_LLADA_FIELDS = [
    *_fields("int", "d_model n_heads n_layers vocab_size", required=True, minimum=1),
    *_fields("int", "n_kv_heads mlp_hidden_size embedding_size new_vocab_size max_sequence_length", minimum=1),
    *_fields("int", "text_vocab_size llm_vocab_size codebook_size", minimum=1),
    *_fields("number", "mlp_ratio rope_theta rms_norm_eps", minimum=0),
    *_fields("bool", "rope rope_full_precision weight_tying include_bias include_qkv_bias alibi "
                     "attention_layer_norm scale_logits input_emb_norm"),
    *_fields("str", "block_type activation_type layer_norm_type"),
    *_TOKEN_IDS,
]
_DREAM_FIELDS = [
    *_fields("int", "hidden_size intermediate_size num_hidden_layers num_attention_heads vocab_size", required=True,
             minimum=1),
    *_fields("int", "num_key_value_heads max_position_embeddings", minimum=1),
    *_fields("number", "rope_theta rms_norm_eps", minimum=0),
    *_fields("bool", "tie_word_embeddings use_sliding_window"),
    *_fields("str", "hidden_act"),
    *_fields("object", "rope_scaling"),
    *_TOKEN_IDS,
]
_LLAVA_FIELDS_READ = [
    *_fields("object", "vision_config"),
    *_fields("str", "mm_vision_tower mm_projector_type mm_spatial_pool_mode mm_patch_merge_type image_aspect_ratio"),
    *_fields("int", "mm_spatial_pool_stride", minimum=1),
    *_fields("int", "vision_drop_last_layers", minimum=0),
    *_fields("pinpoints", "image_grid_pinpoints"),
]
#: the SigLIP fields a ``vision_config`` may set (each defaults to so400m's)
VISION_FIELDS = [*_fields("int", "hidden_size intermediate_size num_hidden_layers num_attention_heads patch_size "
                                 "image_size num_channels", minimum=1),
                 *_fields("number", "layer_norm_eps", minimum=0)]
#: architecture key (``loading.ARCHITECTURES``) -> the config.json fields its definition reads
CONFIG_SCHEMAS: dict[str, list[ConfigField]] = {
    "llada": _LLADA_FIELDS,
    "mmada": _LLADA_FIELDS,
    "dream": _DREAM_FIELDS,
    "llava_llada": [*_LLADA_FIELDS, *_LLAVA_FIELDS_READ],
    "llava_dream": [*_DREAM_FIELDS, *_LLAVA_FIELDS_READ],
}


def _kind_error(field: ConfigField, value) -> str | None:
    """Why ``value`` is not of ``field``'s kind (None when it is)."""
    if field.kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
        expected = "an int"
    elif field.kind == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        expected = "a finite number"
    elif field.kind == "bool":
        ok, expected = isinstance(value, bool), "true or false"
    elif field.kind == "str":
        ok, expected = isinstance(value, str), "a string"
    elif field.kind == "object":
        ok, expected = isinstance(value, dict), "an object"
    else:  # pinpoints: [[width, height], ...]
        ok = isinstance(value, list) and bool(value) and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                        for x in p) for p in value)
        expected = "a non-empty list of [width, height] pairs of positive ints"
    if not ok:
        return f"must be {expected}, got {type(value).__name__} {value!r}"
    if field.minimum is not None and value < field.minimum:
        return f"must be >= {field.minimum:g}, got {value!r}"
    return None


def check_config_fields(config: dict, architecture: str, *, source: str = "config") -> None:
    """Check ``config`` against the fields :data:`CONFIG_SCHEMAS` lists for ``architecture``, before
    anything is built or any weight read: a required field that is missing (or null), a field of
    the wrong JSON type (a number written as a string, a bool for an int) or below its minimum,
    and a ``vision_config`` field of the wrong type. Every problem is listed in one ``ValueError``
    that names ``source`` (the config.json path) and the fields."""
    if architecture not in CONFIG_SCHEMAS:
        raise ValueError(f"{source}: unknown architecture {architecture!r}; known: {sorted(CONFIG_SCHEMAS)}")
    problems = []
    for field in CONFIG_SCHEMAS[architecture]:
        value = config.get(field.name)
        if value is None:
            if field.required:
                problems.append(f"{field.name} is missing" + (" (null)" if field.name in config else ""))
            continue
        why = _kind_error(field, value)
        if why:
            problems.append(f"{field.name} {why}")
    vision = config.get("vision_config")
    if isinstance(vision, dict):
        for field in VISION_FIELDS:
            value = vision.get(field.name)
            why = None if value is None else _kind_error(field, value)
            if why:
                problems.append(f"vision_config.{field.name} {why}")
    if problems:
        raise ValueError(f"{source} does not describe a valid {architecture} model: " + "; ".join(problems))
