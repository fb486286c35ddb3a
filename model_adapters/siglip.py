"""SigLIP vision tower as LaViDa uses it (``google/siglip-so400m-patch14-384``, last layer removed).

Keys below ``model.vision_tower.vision_tower.vision_model``::

    embeddings.patch_embedding.{weight,bias}      Conv2d(3, hidden, patch, stride=patch)
    embeddings.position_embedding.weight          [(image/patch)^2, hidden]
    encoder.layers.{i}.layer_norm1/2.{weight,bias}
    encoder.layers.{i}.self_attn.{q,k,v,out}_proj.{weight,bias}
    encoder.layers.{i}.mlp.fc1/fc2.{weight,bias}  GELU (tanh) between
    post_layernorm.{weight,bias}                  (kept in the checkpoint, not applied)

LaViDa deletes the last of the 27 encoder layers and replaces the pooling head with Identity,
then takes ``hidden_states[-1]`` of what remains: the output of layer 26 *before*
``post_layernorm``. So 26 layers are built and their output is returned as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SO400M = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "patch_size": 14,
    "image_size": 384,
    "layer_norm_eps": 1e-6,
    "num_channels": 3,
}


class SiglipVisionEmbeddings(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.patch_size = c["patch_size"]
        self.num_patches = (c["image_size"] // c["patch_size"]) ** 2
        self.patch_embedding = nn.Conv2d(c["num_channels"], c["hidden_size"], self.patch_size, self.patch_size)
        self.position_embedding = nn.Embedding(self.num_patches, c["hidden_size"])

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))
        x = x.flatten(2).transpose(1, 2)
        return x + self.position_embedding.weight[None]


class SiglipAttention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        d = c["hidden_size"]
        self.num_heads = c["num_attention_heads"]
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        split = lambda t: t.view(b, n, self.num_heads, d // self.num_heads).transpose(1, 2)  # noqa: E731
        out = F.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class SiglipMLP(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.fc1 = nn.Linear(c["hidden_size"], c["intermediate_size"])
        self.fc2 = nn.Linear(c["intermediate_size"], c["hidden_size"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SiglipEncoderLayer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.self_attn = SiglipAttention(c)
        self.layer_norm2 = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.mlp = SiglipMLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEncoder(nn.Module):
    def __init__(self, c: dict, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList([SiglipEncoderLayer(c) for _ in range(num_layers)])


class SiglipVisionTransformer(nn.Module):
    def __init__(self, c: dict, num_layers: int):
        super().__init__()
        self.embeddings = SiglipVisionEmbeddings(c)
        self.encoder = SiglipEncoder(c, num_layers)
        self.post_layernorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])


class SiglipVisionModel(nn.Module):
    def __init__(self, c: dict, num_layers: int):
        super().__init__()
        self.vision_model = SiglipVisionTransformer(c, num_layers)


class SigLipVisionTower(nn.Module):
    """``model.vision_tower``: wraps ``vision_tower.vision_model`` like LLaVA's SigLipVisionTower.

    config: SigLIP vision config (default so400m); ``drop_last_layers`` encoder layers are not
    built (LaViDa drops 1). ``forward(pixels [N, 3, S, S]) -> [N, (S/patch)^2, hidden]``, the
    last kept layer's output before ``post_layernorm``.
    """

    def __init__(self, config: dict | None = None, *, drop_last_layers: int = 1):
        super().__init__()
        c = {**SO400M, **(config or {})}
        kept = c["num_hidden_layers"] - drop_last_layers
        if kept < 1:
            raise ValueError(f"vision tower would keep {kept} layers (num_hidden_layers={c['num_hidden_layers']}, "
                             f"drop_last_layers={drop_last_layers})")
        self.config = c
        self.vision_tower = SiglipVisionModel(c, kept)

    @property
    def image_size(self) -> int:
        return self.config["image_size"]

    @property
    def num_patches_per_side(self) -> int:
        return self.config["image_size"] // self.config["patch_size"]

    @property
    def hidden_size(self) -> int:
        return self.config["hidden_size"]

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        vm = self.vision_tower.vision_model
        x = vm.embeddings(pixel_values)
        for layer in vm.encoder.layers:
            x = layer(x)
        return x
