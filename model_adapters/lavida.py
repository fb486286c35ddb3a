"""LaViDa-LLaDA and LaViDa-Dream: LLaVA-style diffusion MLLMs (``reference/MODELS.md`` §4).

Structure (keys beside the language model's own)::

    model.vision_tower.vision_tower.vision_model.*   SigLIP so400m minus its last layer (siglip.py)
    model.mm_projector.0.{weight,bias}               Linear(vision_hidden -> hidden)
    model.mm_projector.2.{weight,bias}               Linear(hidden -> hidden)   (GELU at index 1)
    model.image_newline                              [hidden]

Image path, as LaViDa's code orders it: SigLIP features (before post_layernorm) -> projector ->
2x2 bilinear pooling of every view (27x27 -> 14x14) -> merge. With ``anyres``, view 0 is the
whole image resized to 384x384 and views 1.. are crops of the image resized-and-padded to the
best grid; the crops are stitched, the letterbox padding removed (``unpad``), one
``image_newline`` appended per row, and the base view prepended. A single view gets one
``image_newline`` at its end. The features replace the ``<image>`` placeholder id (-200) in the
prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from seer_runtime.adapter import IMAGE_TOKEN_INDEX

from .dream import DreamBaseModel, DreamModel
from .images import request_images, to_rgb
from .llada import LLaDAModel, LLaDAModelLM
from .siglip import SigLipVisionTower

DEFAULT_GRID_PINPOINTS = [(384, 768), (768, 384), (768, 768), (1152, 384), (384, 1152)]
LAVIDA_SYSTEM_PROMPT = (
    "You are a helpful language and vision assistant. You are able to understand the visual content that the "
    "user provides, and assist the user with a variety of tasks using natural language."
)


@dataclass
class ImageInput:
    """One processed image: ``pixel_values [views, 3, S, S]`` (normalised), the original
    ``image_size`` as (width, height), and the crop ``grid`` (columns, rows) for anyres, or None
    for a single view."""

    pixel_values: torch.Tensor
    image_size: tuple[int, int]
    grid: tuple[int, int] | None = None


# ---------------------------------------------------------------------------- image processing
def select_best_resolution(original_size: tuple[int, int], possible: list[tuple[int, int]]) -> tuple[int, int]:
    """LLaVA's rule: the (width, height) keeping the most resolution, then wasting the least."""
    ow, oh = original_size
    best, best_eff, best_waste = None, -1, float("inf")
    for w, h in possible:
        scale = min(w / ow, h / oh)
        dw, dh = int(ow * scale), int(oh * scale)
        eff = min(dw * dh, ow * oh)
        waste = w * h - eff
        if eff > best_eff or (eff == best_eff and waste < best_waste):
            best, best_eff, best_waste = (w, h), eff, waste
    return best


def _normalise(img, size: int) -> torch.Tensor:
    import numpy as np
    from PIL import Image

    img = img.convert("RGB").resize((size, size), Image.BICUBIC)
    x = torch.from_numpy(np.asarray(img, dtype=np.float32).copy()).permute(2, 0, 1) / 255.0
    return (x - 0.5) / 0.5


def process_image(image, *, image_size: int = 384, anyres: bool = True,
                  grid_pinpoints: list[tuple[int, int]] | None = None) -> ImageInput:
    """A PIL image (any mode, converted by :func:`model_adapters.images.to_rgb`: 16-bit scaled,
    alpha over white) -> :class:`ImageInput` the way LaViDa's processor prepares it.

    anyres: base view (plain resize to ``image_size``) + crops of the image resized and
    zero-padded to the best pinpoint resolution. Otherwise one resized view.
    """
    from PIL import Image

    image = to_rgb(image)
    ow, oh = image.size
    base = _normalise(image, image_size)
    if not anyres:
        return ImageInput(base[None], (ow, oh), None)
    tw, th = select_best_resolution((ow, oh), grid_pinpoints or DEFAULT_GRID_PINPOINTS)
    sw, sh = tw / ow, th / oh
    if sw < sh:
        nw, nh = tw, min(math.ceil(oh * sw), th)
    else:
        nh, nw = th, min(math.ceil(ow * sh), tw)
    canvas = Image.new("RGB", (tw, th), (0, 0, 0))
    canvas.paste(image.convert("RGB").resize((nw, nh)), ((tw - nw) // 2, (th - nh) // 2))
    crops = [
        _normalise(canvas.crop((x, y, x + image_size, y + image_size)), image_size)
        for y in range(0, th, image_size)
        for x in range(0, tw, image_size)
    ]
    return ImageInput(torch.stack([base, *crops]), (ow, oh), (tw // image_size, th // image_size))


def unpad_image(tensor: torch.Tensor, original_size: tuple[int, int]) -> torch.Tensor:
    """Remove the letterbox padding of a stitched ``[C, H, W]`` feature map (LLaVA's rule)."""
    ow, oh = original_size
    ch, cw = tensor.shape[1:]
    if ow / oh > cw / ch:
        new_h = int(oh * (cw / ow))
        pad = (ch - new_h) // 2
        return tensor[:, pad: ch - pad, :]
    new_w = int(ow * (ch / oh))
    pad = (cw - new_w) // 2
    return tensor[:, :, pad: cw - pad]


# ---------------------------------------------------------------------------- the LLaVA pieces
def _vision_settings(config: dict) -> tuple[dict | None, int]:
    vision = config.get("vision_config")
    tower = str(config.get("mm_vision_tower", "siglip-so400m"))
    if vision is None and "so400m" not in tower:
        raise ValueError(f"mm_vision_tower={tower!r}: only SigLIP so400m is known; give a 'vision_config' dict")
    return vision, int(config.get("vision_drop_last_layers", 1))


class _LlavaParts:
    """Mixed into the inner ``model``: adds vision_tower, mm_projector and image_newline."""

    def _add_vision(self, config: dict, hidden: int) -> None:
        vision, drop = _vision_settings(config)
        self.vision_tower = SigLipVisionTower(vision, drop_last_layers=drop)
        if config.get("mm_projector_type", "mlp2x_gelu") != "mlp2x_gelu":
            raise ValueError(f"mm_projector_type={config.get('mm_projector_type')!r}: only 'mlp2x_gelu'")
        vis = self.vision_tower.hidden_size
        self.mm_projector = nn.Sequential(nn.Linear(vis, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.image_newline = nn.Parameter(torch.zeros(hidden))


class LlavaLladaModel(LLaDAModel, _LlavaParts):
    def __init__(self, a, config: dict):
        super().__init__(a)
        self._add_vision(config, a.d_model)


class LlavaDreamModel(DreamBaseModel, _LlavaParts):
    def __init__(self, a, config: dict):
        super().__init__(a)
        self._add_vision(config, a.hidden)


class LlavaMixin:
    """Image embedding and prompt assembly shared by both LaViDa variants."""

    is_multimodal = True

    def _llava_settings(self) -> None:
        c = self.config
        self.pool_mode = c.get("mm_spatial_pool_mode", "bilinear")
        self.pool_stride = int(c.get("mm_spatial_pool_stride", 2))
        self.merge_type = c.get("mm_patch_merge_type", "spatial_unpad")
        if self.pool_mode not in ("bilinear", "average", "max"):
            raise ValueError(f"mm_spatial_pool_mode={self.pool_mode!r}: expected bilinear, average or max")
        if self.merge_type not in ("spatial_unpad", "flat"):
            raise ValueError(f"mm_patch_merge_type={self.merge_type!r}: expected spatial_unpad or flat")

    def preprocess_image(self, image) -> ImageInput:
        """A PIL image (any mode: :func:`model_adapters.images.to_rgb` converts it) prepared as this
        model's processor does: ``anyres`` (base view + crops) unless ``image_aspect_ratio`` says
        otherwise, at the vision tower's size, with the config's grid pinpoints."""
        cfg = self.config
        anyres = str(cfg.get("image_aspect_ratio", "anyres")).startswith("anyres")
        grid = [tuple(p) for p in cfg.get("image_grid_pinpoints", [])] or None
        return process_image(to_rgb(image), image_size=self.model.vision_tower.image_size, anyres=anyres,
                             grid_pinpoints=grid)

    def prepare_images(self, images, *, batch: int) -> list | None:
        """``generate(images=...)`` normalised (``model_adapters.images.request_images``): one entry
        per request, each None, a path, a PIL image, an :class:`ImageInput` or a list of those;
        returns one list of :class:`ImageInput` (or None) per request. Errors name ``images[i]``."""
        return request_images(images, batch, prepare=self.preprocess_image, prepared=ImageInput)

    def _pool(self, feats: torch.Tensor) -> torch.Tensor:
        """[views, side*side, D] -> [views, side', side', D] (2x2 pooling of every view)."""
        n, p, d = feats.shape
        side = int(math.isqrt(p))
        x = feats.view(n, side, side, d).permute(0, 3, 1, 2)
        s = self.pool_stride
        if self.pool_mode == "bilinear":
            x = F.interpolate(x, size=[math.ceil(side / s), math.ceil(side / s)], mode="bilinear")
        elif self.pool_mode == "average":
            x = F.avg_pool2d(x, s)
        else:
            x = F.max_pool2d(x, s)
        return x.permute(0, 2, 3, 1)

    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[views, 3, S, S] -> pooled projected features [views, side', side', D]."""
        inner = self.model
        feats = inner.vision_tower(pixel_values)
        return self._pool(inner.mm_projector(feats.to(inner.mm_projector[0].weight.dtype)))

    def image_embeddings(self, image: ImageInput) -> torch.Tensor:
        """All LLM positions of one image, ``[n_image_tokens, D]``, in LaViDa's merge order."""
        if not isinstance(image, ImageInput):
            raise TypeError(f"images must hold ImageInput objects (see process_image), got {type(image).__name__}")
        px = image.pixel_values
        if px.dim() != 4 or px.shape[1] != 3:
            raise ValueError(f"ImageInput.pixel_values must be [views, 3, S, S], got {tuple(px.shape)}")
        size = self.model.vision_tower.image_size
        if px.shape[-1] != size or px.shape[-2] != size:
            raise ValueError(f"ImageInput.pixel_values must be {size}x{size}, got {tuple(px.shape[-2:])}")
        feats = self.encode_images(px.to(self.device))
        newline = self.model.image_newline
        d = feats.shape[-1]
        if self.merge_type == "flat":
            return feats.reshape(-1, d)
        base = feats[0].reshape(-1, d)
        if feats.shape[0] == 1:
            return torch.cat([base, newline[None].to(base.dtype)], dim=0)
        if image.grid is None:
            raise ValueError("an ImageInput with several views needs its anyres grid (columns, rows)")
        cols, rows = image.grid
        if cols * rows != feats.shape[0] - 1:
            raise ValueError(f"ImageInput.grid {image.grid} does not match {feats.shape[0] - 1} crops")
        h, w = feats.shape[1:3]
        grid = feats[1:].view(rows, cols, h, w, d).permute(4, 0, 2, 1, 3).reshape(d, rows * h, cols * w)
        grid = unpad_image(grid, image.image_size)
        nl = newline.to(grid.dtype)[:, None, None].expand(d, grid.shape[1], 1)
        grid = torch.cat([grid, nl], dim=-1).flatten(1, 2).transpose(0, 1)
        return torch.cat([base, grid], dim=0)

    def embed_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, images=None):
        """Left-padded prompt ids with ``<image>`` placeholders (-200) -> (embeds, mask).

        input_ids [B, L] int64; attention_mask [B, L] 0/1 or None; images: a list of B entries,
        each None or a list of :class:`ImageInput` (one per placeholder of that row, in order)
        or a single ImageInput. Returns left-padded ``[B, L', D]`` embeddings and ``[B, L']`` mask.
        """
        b, length = input_ids.shape
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if images is None:
            images = [None] * b
        if len(images) != b:
            raise ValueError(f"images must have one entry per request ({b}), got {len(images)}")
        rows = []
        for r in range(b):
            ids = input_ids[r][mask[r]]
            imgs = images[r]
            imgs = [] if imgs is None else ([imgs] if isinstance(imgs, ImageInput) else list(imgs))
            slots = (ids == IMAGE_TOKEN_INDEX).nonzero().flatten().tolist()
            if len(slots) != len(imgs):
                raise ValueError(f"request {r}: {len(slots)} <image> placeholders but {len(imgs)} images")
            pieces, start = [], 0
            for slot, img in zip(slots, imgs):
                pieces.append(self.embed(ids[start:slot]))
                pieces.append(self.image_embeddings(img).to(self.dtype))
                start = slot + 1
            pieces.append(self.embed(ids[start:]))
            rows.append(torch.cat(pieces, dim=0))
        longest = max(r.shape[0] for r in rows)
        pad = self.embed(torch.tensor([self.token_ids.pad], device=input_ids.device))[0]
        embeds = pad.expand(b, longest, -1).clone()
        out_mask = torch.zeros(b, longest, dtype=torch.long, device=input_ids.device)
        for r, row in enumerate(rows):
            embeds[r, longest - row.shape[0]:] = row
            out_mask[r, longest - row.shape[0]:] = 1
        return embeds, (None if bool(out_mask.all()) else out_mask)


class LlavaLladaForMaskedDiffusion(LlavaMixin, LLaDAModelLM):
    """LaViDa-LLaDA (model_type ``llava_llada``)."""

    def __init__(self, config: dict):
        super().__init__(config)
        self._llava_settings()

    def _make_inner(self, a) -> nn.Module:
        return LlavaLladaModel(a, self.config)


class LlavaDreamForMaskedDiffusion(LlavaMixin, DreamModel):
    """LaViDa-Dream (model_type ``llava_dream``)."""

    def __init__(self, config: dict):
        super().__init__(config)
        self._llava_settings()

    def _make_inner(self, a) -> nn.Module:
        return LlavaDreamModel(a, self.config)
