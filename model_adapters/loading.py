"""Build any supported architecture from its config, and load or save Hugging Face directories.

``load_model(path)`` reads ``config.json`` plus ``model.safetensors`` or a sharded
``model.safetensors.index.json`` from a local directory, picks the architecture from
``config.json`` (``model_type``, then ``architectures``; never from the folder name), checks
the fields that architecture reads before any weight is read (``configs.CONFIG_SCHEMAS``:
missing, of the wrong type, special token ids outside the vocabulary), and loads the weights
strictly: missing keys, unexpected keys and wrong shapes are errors that list the offending
names. A broken checkpoint is an error naming the file and, where it applies, the tensor or
field: unreadable JSON (not UTF-8, not JSON, a key written twice), a truncated or corrupt
safetensors file, a shard the index names but that is missing or does not hold what the index
says, a tensor stored twice, tensors of mixed, non-floating or unsupported dtypes (float8,
float64 without ``dtype=``), NaN or inf weights, a missing or corrupt ``tokenizer.json``
(:func:`read_tokenizer`). Nothing here touches the network.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from seer_runtime.config import read_json_object

from .configs import check_config_fields
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


def read_json(path: Path, what: str) -> dict:
    """A JSON object from ``path``; ``ValueError`` naming the file when it is not UTF-8, not JSON,
    repeats a key or is not an object (``seer_runtime.config.read_json_object``)."""
    return read_json_object(path, what)


def _config_and_source(config: dict | str | os.PathLike) -> tuple[dict, str]:
    """The config dict and what to call it in messages (the config.json path, or "config")."""
    if isinstance(config, dict):
        return config, "config"
    if not isinstance(config, (str, os.PathLike)):
        raise TypeError(f"config must be a dict or a path, got {type(config).__name__}")
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json at {path}")
    return read_json(path, "config"), str(path)


def read_config(config: dict | str | os.PathLike) -> dict:
    """A config dict as given, or read from a config.json path (or the directory holding one)."""
    return _config_and_source(config)[0]


def check_config(config: dict | str | os.PathLike) -> str:
    """Validate a config (a dict, or a config.json path or its directory) without building
    anything: its architecture (``model_type`` / ``architectures``) and the fields that
    architecture reads (:func:`model_adapters.configs.check_config_fields`). Returns the
    architecture key; errors name the file and the fields."""
    cfg, source = _config_and_source(config)
    return _checked_architecture(cfg, source)


def _checked_architecture(cfg: dict, source: str) -> str:
    try:
        arch = architecture_of(cfg)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    check_config_fields(cfg, arch, source=source)
    return arch


def read_tokenizer(path: str | os.PathLike):
    """The ``tokenizers.Tokenizer`` of a checkpoint directory's ``tokenizer.json``.

    Raises ``FileNotFoundError`` when the file is missing and ``ValueError`` naming it when it
    cannot be parsed (truncated, not JSON, not a tokenizer)."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist (a checkpoint directory was expected)")
    file = path / "tokenizer.json"
    if not file.is_file():
        raise FileNotFoundError(
            f"{path} has no tokenizer.json: this command needs the checkpoint's tokenizer (the fast "
            "tokenizer file Hugging Face saves beside the weights); nothing is downloaded"
        )
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # the tokenizers package raises plain Exception for every parse error
        raise ValueError(f"tokenizer file {file} cannot be read: {exc}") from None


def build_model(config: dict | str | os.PathLike, *, device: str | torch.device = "cpu",
                dtype: torch.dtype | None = None) -> nn.Module:
    """Build the architecture ``config`` names (a dict or a config.json path), randomly initialised.

    The config is validated first (:func:`check_config`), and the special token ids the model
    uses (mask, EOS, end-of-turn, pad: the config's, else the family's published ones) must lie
    inside its vocabulary; errors name the file and the field. device="meta" builds without
    memory (for key/shape checks of the 8B configs).
    """
    _check_dtype(dtype)
    cfg, source = _config_and_source(config)
    cls = ARCHITECTURES[_checked_architecture(cfg, source)]
    try:
        with torch.device(device):
            model = cls(cfg)
    except ValueError as exc:  # an option the definition does not implement, named by it
        raise ValueError(f"{source}: {exc}") from None
    _check_token_ids(model, cfg, source)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


#: the special ids the engine indexes the embedding or the logits with
_ENGINE_TOKEN_IDS = {"mask": "mask_token_id", "eos": "eos_token_id", "eot": "eot_token_id", "pad": "pad_token_id"}


def _check_token_ids(model: nn.Module, cfg: dict, source: str) -> None:
    """Every id the engine uses lies in ``[0, vocab_size)``: an id outside would fail mid-generation
    (an index error) or never match (an answer that never ends)."""
    rows = model.vocab_size
    bad = []
    for attr, key in _ENGINE_TOKEN_IDS.items():
        value = getattr(model.token_ids, attr)
        if not 0 <= value < rows:
            given = f"{key} is {value}" if cfg.get(key) is not None else \
                f"{key} is not set, and the family's published id {value} is used"
            bad.append(given)
    if bad:
        raise ValueError(f"{source}: {'; '.join(bad)}, outside the vocabulary of {rows} rows: set the special token "
                         "ids of this checkpoint in its config.json")


def _checkpoint_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The weight files, and the index's ``weight_map`` (tensor -> shard file name) when sharded."""
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if single.is_file():
        return [single], None
    if index.is_file():
        weight_map = read_json(index, "index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no weight_map (an object of tensor name -> shard file)")
        bad = [f"{k}: {v!r}" for k, v in weight_map.items() if not isinstance(v, str) or not v]
        if bad:
            raise ValueError(f"{index}: weight_map values must be shard file names, got {_describe(bad)}")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shards that are not in {path}: {missing}")
        return [path / s for s in shards], weight_map
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one safetensors file; ``ValueError`` naming the file (and the tensor) when
    it is truncated or corrupt."""
    from safetensors import SafetensorError, safe_open

    tensors = {}
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                try:
                    tensors[key] = f.get_tensor(key)
                except (SafetensorError, RuntimeError) as exc:
                    raise ValueError(f"{file}: tensor {key!r} cannot be read ({exc}); the file is corrupt") from None
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{file} is not a readable safetensors file ({exc}): truncated or corrupt, "
                         "re-download or re-save it") from None
    return tensors


def _check_weights(state: dict[str, torch.Tensor], source: dict[str, Path], expected: dict[str, torch.dtype],
                   *, cast: bool, check_finite: bool) -> None:
    """Dtypes the model can use and (``check_finite``) no NaN or inf; errors name file and tensor."""
    def where(keys):
        return _describe([f"{source[k].name}: {k}" for k in keys])

    not_float = sorted(k for k, v in state.items() if k in expected and expected[k].is_floating_point
                       and not v.is_floating_point())
    if not_float:
        raise ValueError(f"tensors stored in a non-floating dtype where the model holds floating weights "
                         f"(quantised checkpoints are not supported): {where(not_float)} "
                         f"({state[not_float[0]].dtype})")
    if not cast:  # the model keeps the stored dtypes: they must agree
        dtypes: dict[torch.dtype, list[str]] = {}
        for k, v in state.items():
            if v.is_floating_point():
                dtypes.setdefault(v.dtype, []).append(k)
        if len(dtypes) > 1:
            common = max(dtypes, key=lambda d: len(dtypes[d]))
            odd = sorted(k for d, keys in dtypes.items() if d != common for k in keys)
            files = sorted({source[k].name for k in odd})
            raise ValueError(f"the checkpoint mixes floating dtypes: {len(dtypes[common])} tensors are {common}, "
                             f"but {files} hold {where(odd)} in {sorted({str(state[k].dtype) for k in odd})}; "
                             "pass dtype= to cast every tensor to one")
    if check_finite:
        bad = sorted(k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all()))
        if bad:
            raise ValueError(f"tensors holding NaN or inf: {where(bad)}; the checkpoint is corrupt "
                             "(check_finite=False loads it anyway)")


def _describe(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


#: the floating dtypes a model may hold (those the kernels and the NaN watch handle)
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_dtype(dtype) -> None:
    if dtype is not None and (not isinstance(dtype, torch.dtype) or dtype not in SUPPORTED_DTYPES):
        raise TypeError(f"dtype must be None or a floating torch.dtype (torch.float32, torch.float16, "
                        f"torch.bfloat16), got {dtype!r}")


def _check_stored_dtypes(state: dict[str, torch.Tensor], source: dict[str, Path], *, cast: bool) -> None:
    """Refuse, before anything else reads the values, tensors stored in a floating dtype the
    loader cannot use: float8 (a quantised checkpoint: its scales are not applied here) always;
    float64 unless ``dtype=`` casts it. The error names the file, the tensor and the dtype."""
    allowed = SUPPORTED_DTYPES + ((torch.float64,) if cast else ())
    bad = sorted(k for k, v in state.items() if v.is_floating_point() and v.dtype not in allowed)
    if bad:
        dtypes = sorted({str(state[k].dtype) for k in bad})
        hint = ("quantised checkpoints are not supported: load the bfloat16 / float16 release"
                if any(state[k].dtype.itemsize == 1 for k in bad) else "pass dtype= to cast it")
        raise ValueError(f"tensors stored in an unsupported dtype {dtypes}: "
                         f"{_describe([f'{source[k].name}: {k} ({state[k].dtype})' for k in bad])}; "
                         f"{hint} (supported: {[str(d) for d in SUPPORTED_DTYPES]})")


def load_model(path: str | os.PathLike, *, dtype: torch.dtype | None = None,
               device: str | torch.device = "cpu", check_finite: bool = True) -> nn.Module:
    """Load a local Hugging Face directory (config.json + safetensors) into our definition.

    dtype: None keeps the dtype the tensors are stored in (they must all share one); otherwise
    every floating tensor is cast. check_finite: reject weights holding NaN or inf (one
    ``isfinite`` pass per tensor). Raises ``FileNotFoundError`` (no directory, config.json or
    weights; a shard the index names), ``TypeError`` (dtype, device) and ``ValueError`` (unknown
    architecture; config.json fields missing or of the wrong type, special ids outside the
    vocabulary; missing, unexpected, duplicated or misplaced keys; wrong shapes; unreadable
    files; mixed, non-floating or unsupported (float8; float64 without ``dtype``) dtypes;
    non-finite weights), each naming the files and fields or tensors.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a directory path, got {type(path).__name__}")
    _check_dtype(dtype)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise TypeError(f"device must be a torch.device or a device string like 'cpu' or 'cuda:0', got {device!r} "
                        f"({exc})") from None
    if not isinstance(check_finite, bool):
        raise TypeError(f"check_finite must be a bool, got {type(check_finite).__name__}")
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    model = build_model(path, device="meta")  # config.json validated before any weight is read
    reference = model.state_dict()
    expected = {k: tuple(v.shape) for k, v in reference.items()}

    files, weight_map = _checkpoint_files(path)
    state: dict[str, torch.Tensor] = {}
    source: dict[str, Path] = {}
    for file in files:
        for key, tensor in _read_safetensors(file).items():
            if key in state:
                raise ValueError(f"tensor {key!r} is stored twice: in {source[key]} and in {file}")
            state[key] = tensor
            source[key] = file
    if weight_map is not None:
        misplaced = sorted(f"{k} (index: {weight_map[k]}, found in {source[k].name})" for k in state
                           if k in weight_map and weight_map[k] != source[k].name)
        absent = sorted(f"{k} (index: {v})" for k, v in weight_map.items() if k not in state)
        unlisted = sorted(f"{k} (in {source[k].name})" for k in state if k not in weight_map)
        problems = [f"{label} ({len(v)}): {_describe(v)}" for label, v in
                    (("in another shard than the index says", misplaced), ("listed but not in their shard", absent),
                     ("stored but not in the index", unlisted)) if v]
        if problems:
            raise ValueError(f"{path / 'model.safetensors.index.json'} does not match its shards: "
                             + "; ".join(problems))
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(f"{k} (in {source[k].name})" for k in set(state) - set(expected))
    wrong = sorted(f"{k} {tuple(state[k].shape)} != {expected[k]} (in {source[k].name})"
                   for k in set(state) & set(expected) if tuple(state[k].shape) != expected[k])
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {_describe(missing)}")
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {_describe(unexpected)}")
    if wrong:
        problems.append(f"wrong shapes ({len(wrong)}): {_describe(wrong)}")
    if problems:
        raise ValueError(f"checkpoint {path} does not match {type(model).__name__} as config.json describes it: "
                         + "; ".join(problems))
    _check_stored_dtypes(state, source, cast=dtype is not None)
    _check_weights(state, source, {k: v.dtype for k, v in reference.items()}, cast=dtype is not None,
                   check_finite=check_finite)
    if dtype is not None:
        state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device).eval()


def save_model(model: nn.Module, path: str | os.PathLike, *, max_shard_bytes: int | None = None) -> Path:
    """Write ``config.json`` and the weights as Hugging Face does (sharded above ``max_shard_bytes``).

    Raises ``TypeError`` (not one of our models, a bad ``max_shard_bytes``), ``ValueError`` (weights
    holding NaN or inf, named: :func:`load_model` would refuse them; a model on the meta device)
    and ``FileExistsError`` (``path`` is a file)."""
    from safetensors.torch import save_file

    if not isinstance(model, nn.Module) or not isinstance(getattr(model, "config", None), dict):
        raise TypeError(f"model must be a model_adapters model (an nn.Module with a config dict), "
                        f"got {type(model).__name__}")
    if max_shard_bytes is not None and (isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int)
                                        or max_shard_bytes < 1):
        raise TypeError(f"max_shard_bytes must be None or an int >= 1, got {max_shard_bytes!r}")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} is a file; save_model writes a directory")
    state = {k: v.detach() for k, v in model.state_dict().items()}
    meta = sorted(k for k, v in state.items() if v.is_meta)
    if meta:
        raise ValueError(f"the model has no weights to save (on the meta device): {_describe(meta)}")
    bad = sorted(k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all()))
    if bad:
        raise ValueError(f"weights holding NaN or inf: {_describe(bad)}; not saved")
    path.mkdir(parents=True, exist_ok=True)
    config = dict(model.config)
    config.setdefault("torch_dtype", str(model.dtype).replace("torch.", ""))
    with open(path / "config.json", "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    state = {k: v.contiguous().cpu() for k, v in state.items()}
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
