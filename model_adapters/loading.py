"""Build any supported architecture from its config, and load or save Hugging Face directories.

``load_model(path)`` reads ``config.json`` plus ``model.safetensors`` or a sharded
``model.safetensors.index.json`` from a local directory, picks the architecture from
``config.json`` (``model_type``, then ``architectures``; never from the folder name) and loads
the weights strictly: missing keys, unexpected keys and wrong shapes are errors that list the
offending names. Nothing here touches the network.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from .dream import DreamModel
from .lavida import LlavaDreamForMaskedDiffusion, LlavaLladaForMaskedDiffusion
from .llada import LLaDAModelLM, MMadaModelLM

ARCHITECTURES: dict[str, type[nn.Module]] = {
    "llada": LLaDAModelLM,
    "mmada": MMadaModelLM,
    "dream": DreamModel,
    "llava_llada": LlavaLladaForMaskedDiffusion,
    "llava_dream": LlavaDreamForMaskedDiffusion,
}
_BY_CLASS_NAME = {
    "LLaDAModelLM": "llada",
    "MMadaModelLM": "mmada",
    "DreamModel": "dream",
    "LlavaLladaForMaskedDiffusion": "llava_llada",
    "LlavaDreamForMaskedDiffusion": "llava_dream",
}

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def architecture_of(config: dict) -> str:
    """The architecture key of a config dict (``model_type`` first, then ``architectures``)."""
    model_type = str(config.get("model_type", "")).lower()
    if model_type in ARCHITECTURES:
        return model_type
    for name in config.get("architectures") or []:
        if name in _BY_CLASS_NAME:
            return _BY_CLASS_NAME[name]
    raise ValueError(
        f"unknown architecture: model_type={config.get('model_type')!r}, architectures="
        f"{config.get('architectures')!r}; supported model_type values: {sorted(ARCHITECTURES)}"
    )


def _read_config(config: dict | str | os.PathLike) -> dict:
    if isinstance(config, dict):
        return config
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json at {path}")
    with open(path) as f:
        return json.load(f)


def build_model(config: dict | str | os.PathLike, *, device: str | torch.device = "cpu",
                dtype: torch.dtype | None = None) -> nn.Module:
    """Build the architecture ``config`` names (a dict or a config.json path), randomly initialised.

    device="meta" builds without memory (for key/shape checks of the 8B configs).
    """
    cfg = _read_config(config)
    cls = ARCHITECTURES[architecture_of(cfg)]
    with torch.device(device):
        model = cls(cfg)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def _checkpoint_files(path: Path) -> list[Path]:
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no weight_map")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shards that are not in {path}: {missing}")
        return [path / s for s in shards]
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")


def _describe(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def load_model(path: str | os.PathLike, *, dtype: torch.dtype | None = None,
               device: str | torch.device = "cpu") -> nn.Module:
    """Load a local Hugging Face directory (config.json + safetensors) into our definition.

    dtype: None keeps the dtype the tensors are stored in; otherwise every floating tensor is
    cast. Raises ``FileNotFoundError`` (no config.json / weights), ``ValueError`` (unknown
    architecture, missing/unexpected keys, wrong shapes; each lists the names).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    cfg = _read_config(path)
    model = build_model(cfg, device="meta")
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}

    state: dict[str, torch.Tensor] = {}
    for file in _checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                state[key] = f.get_tensor(key)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(f"{k} {tuple(state[k].shape)} != {expected[k]}" for k in set(state) & set(expected)
                   if tuple(state[k].shape) != expected[k])
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {_describe(missing)}")
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {_describe(unexpected)}")
    if wrong:
        problems.append(f"wrong shapes ({len(wrong)}): {_describe(wrong)}")
    if problems:
        raise ValueError(f"checkpoint {path} does not match {type(model).__name__}: " + "; ".join(problems))
    if dtype is not None:
        state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device).eval()


def save_model(model: nn.Module, path: str | os.PathLike, *, max_shard_bytes: int | None = None) -> Path:
    """Write ``config.json`` and the weights as Hugging Face does (sharded above ``max_shard_bytes``)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = dict(model.config)
    config.setdefault("torch_dtype", str(model.dtype).replace("torch.", ""))
    with open(path / "config.json", "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if max_shard_bytes is None:
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
        return path
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    with open(path / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    return path
