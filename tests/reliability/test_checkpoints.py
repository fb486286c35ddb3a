"""Broken checkpoints: each a clear error naming the file and, where it applies, the tensor
(issue 20), or the config.json field, the stored dtype and the JSON file (issue 36:
``BROKEN_CONFIGS``). A tiny LLaDA is saved whole and sharded, then damaged one way per case."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import model_adapters as ma
from model_adapters.chat import ChatTokenizer
from model_adapters.loading import read_tokenizer
from seer_runtime.cli.options import checkpoint_generation_fields
from seer_runtime.dyllm import DyLLMConfig
from seer_runtime.seer import SeerConfig

pytestmark = pytest.mark.reliability

FIRST_SHARD = "model-00001-of-00004.safetensors"
SECOND_SHARD = "model-00002-of-00004.safetensors"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """A tiny LLaDA saved as one file and as four shards, with a word-level tokenizer."""
    from tokenizers import Tokenizer, models

    torch.manual_seed(0)
    model = ma.build_model(ma.tiny_config("llada-8b-instruct"))
    root = tmp_path_factory.mktemp("checkpoints")
    single, sharded = root / "single", root / "sharded"
    ma.save_model(model, single)
    total = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    ma.save_model(model, sharded, max_shard_bytes=total // 3 + 1)
    assert (sharded / FIRST_SHARD).is_file() and (sharded / SECOND_SHARD).is_file()
    Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")).save(str(single / "tokenizer.json"))
    return {"single": single, "sharded": sharded}


def copy(saved, which: str, tmp_path: Path) -> Path:
    out = tmp_path / which
    shutil.copytree(saved[which], out)
    return out


def truncate(file: Path, keep: float) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])


def edit_tensors(file: Path, change: Callable[[dict], None]) -> None:
    state = load_file(str(file))
    change(state)
    save_file(state, str(file), metadata={"format": "pt"})


def edit_json(file: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(file.read_text())
    change(data)
    file.write_text(json.dumps(data))


def first_key(file: Path) -> str:
    return sorted(load_file(str(file)))[0]


@dataclass(frozen=True)
class Broken:
    id: str
    which: str  # "single" or "sharded"
    damage: Callable[[Path], None]
    error: type[Exception]
    names: str  # regex over the message (the file, the tensor)
    load: Callable[[Path], object] = ma.load_model


def _poison(value: float, key: str = "model.transformer.blocks.1.ff_norm.weight"):
    def change(state):
        state[key] = state[key].clone()
        state[key][0] = value
    return change


def _in_first_shard(change_for_key: Callable[[str], Callable[[dict], None]]):
    def damage(d: Path):
        edit_tensors(d / FIRST_SHARD, change_for_key(first_key(d / FIRST_SHARD)))
    return damage


INDEX = "model.safetensors.index.json"
BROKEN = [
    Broken("truncated-single", "single", lambda d: truncate(d / "model.safetensors", 0.5), ValueError,
           r"single/model.safetensors is not a readable safetensors file .*truncated or corrupt"),
    Broken("truncated-header", "single", lambda d: truncate(d / "model.safetensors", 0.0005), ValueError,
           r"model.safetensors is not a readable safetensors file"),
    Broken("empty-file", "single", lambda d: (d / "model.safetensors").write_bytes(b""), ValueError,
           r"model.safetensors is not a readable safetensors file"),
    Broken("garbage-file", "single", lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 64 + b"junk" * 100),
           ValueError, r"model.safetensors is not a readable safetensors file"),
    Broken("truncated-shard", "sharded", lambda d: truncate(d / SECOND_SHARD, 0.7), ValueError,
           rf"{SECOND_SHARD} is not a readable safetensors file"),
    Broken("missing-shard", "sharded", lambda d: (d / SECOND_SHARD).unlink(), FileNotFoundError,
           rf"{INDEX} names shards that are not in .*\['{SECOND_SHARD}'\]"),
    Broken("index-not-json", "sharded", lambda d: (d / INDEX).write_text('{"weight_map": {'), ValueError,
           rf"index .*{INDEX} is not valid JSON"),
    Broken("index-no-weight_map", "sharded", lambda d: edit_json(d / INDEX, lambda j: j.pop("weight_map")),
           ValueError, rf"{INDEX} has no weight_map"),
    Broken("index-shard-not-a-name", "sharded",
           lambda d: edit_json(d / INDEX, lambda j: j["weight_map"].update({"model.transformer.ln_f.weight": 3})),
           ValueError, r"weight_map values must be shard file names, got model.transformer.ln_f.weight: 3"),
    Broken("index-wrong-shard", "sharded", lambda d: edit_json(d / INDEX, lambda j: j["weight_map"].update(
        {first_key(d / FIRST_SHARD): SECOND_SHARD})), ValueError,
        rf"does not match its shards: in another shard than the index says \(1\): .* \(index: {SECOND_SHARD}, "
        rf"found in {FIRST_SHARD}\)"),
    Broken("index-lists-absent-tensor", "sharded", lambda d: edit_json(d / INDEX, lambda j: j["weight_map"].update(
        {"model.transformer.extra.weight": FIRST_SHARD})), ValueError,
        rf"listed but not in their shard \(1\): model.transformer.extra.weight \(index: {FIRST_SHARD}\)"),
    Broken("shard-holds-unlisted-tensor", "sharded", lambda d: edit_json(d / INDEX, lambda j: j["weight_map"].pop(
        first_key(d / FIRST_SHARD))), ValueError, rf"stored but not in the index \(1\): .* \(in {FIRST_SHARD}\)"),
    Broken("tensor-stored-twice", "sharded", lambda d: edit_tensors(d / SECOND_SHARD, lambda s: s.update(
        {first_key(d / FIRST_SHARD): load_file(str(d / FIRST_SHARD))[first_key(d / FIRST_SHARD)]})), ValueError,
        rf"tensor '.*' is stored twice: in .*{FIRST_SHARD} and in .*{SECOND_SHARD}"),
    Broken("shard-of-wrong-dtype", "sharded",
           lambda d: edit_tensors(d / SECOND_SHARD, lambda s: s.update({k: v.half() for k, v in s.items()})),
           ValueError, rf"mixes floating dtypes: .* torch.float32, but \['{SECOND_SHARD}'\] hold {SECOND_SHARD}: "
                       r"model.transformer.*\['torch.float16'\]; pass dtype="),
    Broken("tensor-quantised", "single", lambda d: edit_tensors(d / "model.safetensors", lambda s: s.update(
        {"model.transformer.ln_f.weight": torch.ones(64, dtype=torch.int8)})), ValueError,
        r"non-floating dtype .*model.safetensors: model.transformer.ln_f.weight \(torch.int8\)"),
    Broken("config-weights-disagree", "single", lambda d: edit_json(d / "config.json", lambda c: c.update(
        d_model=32)), ValueError,
        r"does not match LLaDAModelLM as config.json describes it: wrong shapes \(30\): "
        r"model.transformer.blocks.0.attn_norm.weight \(64,\) != \(32,\) \(in model.safetensors\)"),
    Broken("config-not-json", "single", lambda d: (d / "config.json").write_text("{'d_model': 64}"), ValueError,
           r"config .*single/config.json is not valid JSON"),
    Broken("config-not-object", "single", lambda d: (d / "config.json").write_text("[64]"), ValueError,
           r"config .*config.json must hold a JSON object, got list"),
    Broken("config-missing", "single", lambda d: (d / "config.json").unlink(), FileNotFoundError,
           r"no config.json at .*single/config.json"),
    Broken("weights-missing", "single", lambda d: (d / "model.safetensors").unlink(), FileNotFoundError,
           r"no model.safetensors or model.safetensors.index.json in"),
    Broken("weight-nan", "single", lambda d: edit_tensors(d / "model.safetensors", _poison(float("nan"))),
           ValueError, r"tensors holding NaN or inf: model.safetensors: model.transformer.blocks.1.ff_norm.weight"),
    Broken("weight-inf-in-shard", "sharded", _in_first_shard(lambda key: _poison(float("-inf"), key)), ValueError,
           rf"tensors holding NaN or inf: {FIRST_SHARD}: model\."),
    Broken("tokenizer-missing", "single", lambda d: (d / "tokenizer.json").unlink(), FileNotFoundError,
           r"has no tokenizer.json", load=read_tokenizer),
    Broken("tokenizer-truncated", "single", lambda d: truncate(d / "tokenizer.json", 0.5), ValueError,
           r"tokenizer file .*single/tokenizer.json cannot be read", load=read_tokenizer),
    Broken("tokenizer-not-a-tokenizer", "single", lambda d: (d / "tokenizer.json").write_text('{"vocab": [1]}'),
           ValueError, r"tokenizer file .*tokenizer.json cannot be read", load=ChatTokenizer.from_pretrained),
]


def _config(change: Callable[[dict], None]):
    return lambda d: edit_json(d / "config.json", change)


def _write_config(config: dict):
    return lambda d: (d / "config.json").write_text(json.dumps(config))


def _all_tensors(dtype):
    return lambda d: edit_tensors(d / "model.safetensors", lambda s: s.update({k: v.to(dtype) for k, v in s.items()}))


def _lavida(**over):
    return ma.tiny_config("lavida-llada", **over)


CONFIG = r"single/config\.json"
INVALID = CONFIG + r" does not describe a valid llada model: "
#: config.json fields, special ids and stored dtypes (issue 36): refused before any weight is read
#: (the dtypes: before any value is), naming the file and the field or tensor
BROKEN_CONFIGS = [
    Broken("field-missing", "single", _config(lambda c: c.pop("d_model")), ValueError, INVALID + "d_model is missing"),
    Broken("field-null", "single", _config(lambda c: c.update(n_layers=None)), ValueError,
           INVALID + r"n_layers is missing \(null\)"),
    Broken("int-as-string", "single", _config(lambda c: c.update(d_model="64")), ValueError,
           INVALID + "d_model must be an int, got str '64'"),
    Broken("int-as-word", "single", _config(lambda c: c.update(d_model="sixty-four")), ValueError,
           INVALID + "d_model must be an int, got str 'sixty-four'"),
    Broken("int-as-bool", "single", _config(lambda c: c.update(n_heads=True)), ValueError,
           INVALID + "n_heads must be an int, got bool True"),
    Broken("int-as-float", "single", _config(lambda c: c.update(n_layers=3.0)), ValueError,
           INVALID + "n_layers must be an int, got float 3.0"),
    Broken("heads-zero", "single", _config(lambda c: c.update(n_heads=0)), ValueError,
           INVALID + "n_heads must be >= 1, got 0"),
    Broken("bool-as-string", "single", _config(lambda c: c.update(weight_tying="false")), ValueError,
           INVALID + "weight_tying must be true or false, got str 'false'"),
    Broken("number-nan", "single", lambda d: (d / "config.json").write_text(
        (d / "config.json").read_text().replace('"rope_theta": 10000.0', '"rope_theta": NaN')), ValueError,
        INVALID + "rope_theta must be a finite number, got float nan"),
    Broken("several-fields-at-once", "single", _config(lambda c: c.update(d_model=None, n_heads="4")), ValueError,
           INVALID + r"d_model is missing \(null\); n_heads must be an int, got str .4."),
    Broken("mask-id-absent", "single", _config(lambda c: c.pop("mask_token_id")), ValueError,
           CONFIG + r": mask_token_id is not set, and the family's published id 126336 is used, outside the "
                    r"vocabulary of 256 rows"),
    Broken("eos-id-outside-vocab", "single", _config(lambda c: c.update(eos_token_id=9999)), ValueError,
           CONFIG + r": eos_token_id is 9999, outside the vocabulary of 256 rows"),
    Broken("pad-id-negative", "single", _config(lambda c: c.update(pad_token_id=-1)), ValueError,
           INVALID + "pad_token_id must be >= 0, got -1"),
    Broken("eos-id-a-list", "single", _config(lambda c: c.update(eos_token_id=[251, 252])), ValueError,
           INVALID + r"eos_token_id must be an int, got list \[251, 252\]"),
    Broken("unknown-architecture", "single", _config(lambda c: c.update(model_type="gpt2", architectures=["GPT2"])),
           ValueError, CONFIG + r": unknown architecture: model_type='gpt2'"),
    Broken("unsupported-option", "single", _config(lambda c: c.update(block_type="sequential")), ValueError,
           CONFIG + r": unsupported LLaDA config options: block_type='sequential'"),
    Broken("dream-field-missing", "single", _write_config({**ma.tiny_config("dream-v0-instruct-7b"),
                                                           "hidden_size": None}), ValueError,
           CONFIG + r" does not describe a valid dream model: hidden_size is missing \(null\)"),
    Broken("vision-config-a-list", "single", _write_config(_lavida(vision_config=[1, 2])), ValueError,
           CONFIG + r" does not describe a valid llava_llada model: vision_config must be an object, got list"),
    Broken("vision-field-a-string", "single", _write_config(_lavida(vision_config={"patch_size": "8"})), ValueError,
           r"llava_llada model: vision_config.patch_size must be an int, got str '8'"),
    Broken("grid-pinpoints-flat", "single", _write_config(_lavida(image_grid_pinpoints=[32, 64])), ValueError,
           r"llava_llada model: image_grid_pinpoints must be a non-empty list of \[width, height\] pairs"),
    Broken("repeated-key", "single", lambda d: (d / "config.json").write_text(
        (d / "config.json").read_text()[:-1] + ', "d_model": 32}'), ValueError,
        r"config .*single/config\.json: the key 'd_model' appears twice in one object"),
    Broken("config-not-utf8", "single", lambda d: (d / "config.json").write_bytes(
        (d / "config.json").read_bytes()[:-1] + b', "note": "caf\xe9"}'), ValueError,
        r"config .*single/config\.json is not UTF-8 text: byte 0xe9"),
    Broken("config-utf16", "single", lambda d: (d / "config.json").write_bytes(
        (d / "config.json").read_text().encode("utf-16")), ValueError, r"config .*config\.json is UTF-16 text"),
    Broken("weights-float8", "single", _all_tensors(torch.float8_e4m3fn), ValueError,
           r"unsupported dtype \['torch.float8_e4m3fn'\]: model.safetensors: model.transformer.* "
           r"\(torch.float8_e4m3fn\).*quantised checkpoints are not supported"),
    Broken("shard-float8-e5m2", "sharded", lambda d: edit_tensors(d / SECOND_SHARD, lambda s: s.update(
        {k: v.to(torch.float8_e5m2) for k, v in s.items()})), ValueError,
        rf"unsupported dtype \['torch.float8_e5m2'\]: {SECOND_SHARD}: "),
    Broken("weights-float64", "single", _all_tensors(torch.float64), ValueError,
           r"unsupported dtype \['torch.float64'\]: .*pass dtype= to cast it"),
    Broken("tokenizer-config-not-json", "single", lambda d: (d / "tokenizer_config.json").write_text("{chat"),
           ValueError, r"tokenizer config .*single/tokenizer_config\.json is not valid JSON",
           load=ChatTokenizer.from_pretrained),
    Broken("generation-defaults-repeated-key", "single", lambda d: (d / "seer_generation_config.json").write_text(
        '{"gen_length": 8, "gen_length": 16}'), ValueError,
        r"seer_generation_config\.json: the key 'gen_length' appears twice", load=checkpoint_generation_fields),
    Broken("seer-config-utf16", "single", lambda d: (d / "seer.json").write_bytes('{"gamma": 0.5}'.encode("utf-16")),
           ValueError, r"SeerConfig .*single/seer\.json is UTF-16 text",
           load=lambda d: SeerConfig.from_json(d / "seer.json")),
    Broken("dyllm-config-missing", "single", lambda d: None, FileNotFoundError,
           r"DyLLMConfig .*single/dyllm\.json cannot be read: No such file or directory",
           load=lambda d: DyLLMConfig.from_json(d / "dyllm.json")),
]


@pytest.mark.parametrize("case", BROKEN + BROKEN_CONFIGS, ids=lambda c: c.id)
def test_broken_checkpoint_names_the_file_and_tensor(case: Broken, saved, tmp_path):
    d = copy(saved, case.which, tmp_path)
    case.damage(d)
    with pytest.raises(case.error, match=case.names):
        case.load(d)


def test_configs_are_checked_before_any_weight_is_read(saved, tmp_path, monkeypatch):
    import model_adapters.loading as loading

    d = copy(saved, "single", tmp_path)
    edit_json(d / "config.json", lambda c: c.pop("mask_token_id"))
    monkeypatch.setattr(loading, "_read_safetensors", lambda f: pytest.fail(f"{f} read before config.json was checked"))
    with pytest.raises(ValueError, match="mask_token_id is not set"):
        ma.load_model(d)


def test_float64_weights_load_when_cast(saved, tmp_path):
    d = copy(saved, "single", tmp_path)
    _all_tensors(torch.float64)(d)
    assert {p.dtype for p in ma.load_model(d, dtype=torch.float32).parameters()} == {torch.float32}


def test_intact_checkpoints_still_load(saved):
    single = ma.load_model(saved["single"])
    sharded = ma.load_model(saved["sharded"])
    for (k, a), (_, b) in zip(single.state_dict().items(), sharded.state_dict().items()):
        assert torch.equal(a, b), k
    assert read_tokenizer(saved["single"]).get_vocab_size() == 2


def test_mixed_dtypes_load_when_cast_and_non_finite_when_asked(saved, tmp_path):
    d = copy(saved, "sharded", tmp_path)
    edit_tensors(d / SECOND_SHARD, lambda s: s.update({k: v.half() for k, v in s.items()}))
    model = ma.load_model(d, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    edit_tensors(d / FIRST_SHARD, _poison(float("nan"), first_key(d / FIRST_SHARD)))
    with pytest.raises(ValueError, match="NaN or inf"):
        ma.load_model(d, dtype=torch.bfloat16)
    loaded = ma.load_model(d, dtype=torch.bfloat16, check_finite=False)
    assert not bool(torch.isfinite(loaded.state_dict()[first_key(d / FIRST_SHARD)]).all())


@pytest.mark.parametrize("call,error,names", [
    (lambda p: ma.load_model(p, dtype=torch.int8), TypeError, "dtype must be None or a floating torch.dtype"),
    (lambda p: ma.load_model(p, dtype="bfloat16"), TypeError, "dtype must be None or a floating torch.dtype"),
    (lambda p: ma.load_model(p, dtype=torch.float8_e4m3fn), TypeError, "dtype must be None or a floating torch.dtype"),
    (lambda p: ma.build_model(ma.tiny_config("llada-8b-instruct"), dtype=torch.float64), TypeError,
     "dtype must be None or a floating torch.dtype"),
    (lambda p: ma.load_model(p, device="gpu0"), TypeError, "device must be a torch.device or a device string"),
    (lambda p: ma.load_model(p, check_finite="yes"), TypeError, "check_finite must be a bool"),
    (lambda p: ma.load_model(p / "absent"), FileNotFoundError, "model directory .*absent does not exist"),
    (lambda p: ma.load_model(3), TypeError, "path must be a directory path"),
    (lambda p: ma.build_model(["llada"]), TypeError, "config must be a dict or a path"),
], ids=["dtype-int8", "dtype-str", "dtype-float8", "build-dtype-float64", "device-bogus", "check_finite-str",
        "path-missing", "path-int", "config-list"])
def test_bad_load_arguments(saved, call, error, names):
    with pytest.raises(error, match=names):
        call(saved["single"])


def test_save_model_refuses_what_load_model_would(tmp_path):
    torch.manual_seed(0)
    model = ma.build_model(ma.tiny_config("llada-8b-instruct"))
    with pytest.raises(TypeError, match="max_shard_bytes must be None or an int >= 1"):
        ma.save_model(model, tmp_path / "a", max_shard_bytes=0)
    with pytest.raises(TypeError, match="model must be a model_adapters model"):
        ma.save_model(torch.nn.Linear(2, 2), tmp_path / "b")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="is a file; save_model writes a directory"):
        ma.save_model(model, tmp_path / "file")
    with pytest.raises(ValueError, match="no weights to save .on the meta device"):
        ma.save_model(ma.build_model(ma.tiny_config("llada-8b-instruct"), device="meta"), tmp_path / "meta")
    with torch.no_grad():
        model.model.transformer.ln_f.weight[3] = float("nan")
    with pytest.raises(ValueError, match=re.escape("weights holding NaN or inf: model.transformer.ln_f.weight")):
        ma.save_model(model, tmp_path / "c")
    assert not (tmp_path / "c").exists(), "nothing is written for a refused model"
