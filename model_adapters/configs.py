"""Published configurations (``reference/MODELS.md``) and tiny random configs for tests.

The dicts hold the ``config.json`` fields our definitions read; building one on the ``meta``
device checks every key name and shape of the real checkpoint without allocating memory.
"""

from __future__ import annotations

import copy

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
