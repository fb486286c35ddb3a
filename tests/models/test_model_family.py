"""Issue: the model family. Published key names/shapes on meta, save/load round trips, padded
batches, bidirectionality, broken checkpoints, and the Hugging Face calling convention."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import model_adapters as ma
from model_adapters.lavida import ImageInput
from seer_runtime.adapter import PaddedLayout

pytestmark = pytest.mark.models

KINDS = sorted(ma.PUBLISHED)


# ------------------------------------------------------------------ expected published layouts
def llada_keys(n_layers=32, d=4096, mlp=12288, vocab=126464):
    keys = {"model.transformer.wte.weight": (vocab, d), "model.transformer.ln_f.weight": (d,),
            "model.transformer.ff_out.weight": (vocab, d)}
    for i in range(n_layers):
        p = f"model.transformer.blocks.{i}."
        keys.update({p + "attn_norm.weight": (d,), p + "q_proj.weight": (d, d), p + "k_proj.weight": (d, d),
                     p + "v_proj.weight": (d, d), p + "attn_out.weight": (d, d), p + "ff_norm.weight": (d,),
                     p + "ff_proj.weight": (mlp, d), p + "up_proj.weight": (mlp, d), p + "ff_out.weight": (d, mlp)})
    return keys


def dream_keys(n_layers=28, d=3584, kv=512, mlp=18944, vocab=152064):
    keys = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,), "lm_head.weight": (vocab, d)}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        keys.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                     p + "self_attn.q_proj.weight": (d, d), p + "self_attn.q_proj.bias": (d,),
                     p + "self_attn.k_proj.weight": (kv, d), p + "self_attn.k_proj.bias": (kv,),
                     p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.v_proj.bias": (kv,),
                     p + "self_attn.o_proj.weight": (d, d), p + "mlp.gate_proj.weight": (mlp, d),
                     p + "mlp.up_proj.weight": (mlp, d), p + "mlp.down_proj.weight": (d, mlp)})
    return keys


def lavida_vision_keys(hidden):
    v = "model.vision_tower.vision_tower.vision_model."
    keys = {v + "embeddings.patch_embedding.weight": (1152, 3, 14, 14), v + "embeddings.patch_embedding.bias": (1152,),
            v + "embeddings.position_embedding.weight": (729, 1152), v + "post_layernorm.weight": (1152,),
            v + "post_layernorm.bias": (1152,), "model.mm_projector.0.weight": (hidden, 1152),
            "model.mm_projector.0.bias": (hidden,), "model.mm_projector.2.weight": (hidden, hidden),
            "model.mm_projector.2.bias": (hidden,), "model.image_newline": (hidden,)}
    for i in range(26):  # so400m has 27 layers; LaViDa deletes the last
        p = f"{v}encoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            keys[p + f"self_attn.{proj}.weight"] = (1152, 1152)
            keys[p + f"self_attn.{proj}.bias"] = (1152,)
        for ln in ("layer_norm1", "layer_norm2"):
            keys[p + f"{ln}.weight"] = (1152,)
            keys[p + f"{ln}.bias"] = (1152,)
        keys.update({p + "mlp.fc1.weight": (4304, 1152), p + "mlp.fc1.bias": (4304,),
                     p + "mlp.fc2.weight": (1152, 4304), p + "mlp.fc2.bias": (1152,)})
    return keys


EXPECTED = {
    "llada-8b-instruct": (llada_keys(), 8_015_581_184),
    "mmada-8b": (llada_keys(vocab=134656), 8_082_690_048),
    "dream-v0-instruct-7b": (dream_keys(), 7_615_616_512),
    "lavida-llada": ({**llada_keys(), **lavida_vision_keys(4096)}, None),
    "lavida-dream": ({**dream_keys(), **lavida_vision_keys(3584)}, None),
}


@pytest.mark.parametrize("kind", KINDS)
def test_published_config_keys_and_shapes_on_meta(kind):
    model = ma.build_model(ma.PUBLISHED[kind], device="meta")
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected, params = EXPECTED[kind]
    assert sorted(set(got) - set(expected)) == [], "keys the checkpoint does not have"
    assert sorted(set(expected) - set(got)) == [], "checkpoint keys we do not build"
    assert {k: v for k, v in got.items() if expected[k] != v} == {}
    assert all(v.device.type == "meta" for v in model.state_dict().values())
    if params is not None:
        assert sum(v.numel() for v in model.state_dict().values()) == params
    if kind == "llada-8b-instruct":
        assert len(got) == 291
    if kind.startswith("lavida"):
        # the language-model part plus SigLIP-so400m minus one layer, projector and newline
        lm = sum(v.numel() for k, v in model.state_dict().items() if not k.startswith(
            ("model.vision_tower", "model.mm_projector", "model.image_newline")))
        assert lm == (8_015_581_184 if kind == "lavida-llada" else 7_615_616_512)


def _tiny(kind, dtype=torch.float32):
    torch.manual_seed(1)
    model = ma.build_model(ma.tiny_config(kind), dtype=dtype)
    for p in model.parameters():  # norms start at 1; perturb so that every weight matters
        p.data.add_(0.02 * torch.randn_like(p))
    return model


def _logits(model, ids, mask=None):
    if model.family == "llada":
        return model(ids, attention_mask=mask).logits
    pos = model.position_ids(mask, ids.shape[1], ids.shape[0], ids.device)
    return model(ids, mask, pos).logits


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sharded", [False, True])
def test_save_load_round_trip_identical_logits(kind, sharded, tmp_path):
    model = _tiny(kind)
    ma.save_model(model, tmp_path, max_shard_bytes=40_000 if sharded else None)
    assert (tmp_path / ("model.safetensors.index.json" if sharded else "model.safetensors")).is_file()
    if sharded:
        assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    loaded = ma.load_model(tmp_path)
    assert type(loaded) is type(model)
    ids = torch.randint(0, 240, (2, 11))
    assert torch.equal(_logits(model, ids), _logits(loaded, ids))
    half = ma.load_model(tmp_path, dtype=torch.float16)
    assert half.dtype == torch.float16


def test_architecture_comes_from_config_not_folder_name(tmp_path):
    model = _tiny("dream-v0-instruct-7b")
    ma.save_model(model, tmp_path / "llada-8b-looking-folder")
    assert type(ma.load_model(tmp_path / "llada-8b-looking-folder")) is ma.DreamModel
    cfg = ma.tiny_config("llada-8b-instruct")
    cfg.pop("model_type")
    assert ma.architecture_of(cfg) == "llada"  # falls back to "architectures"


@pytest.mark.parametrize("kind", KINDS)
def test_padded_batch_equals_each_request_alone(kind):
    model = _tiny(kind)
    lengths = [9, 4, 7]
    prompts = [torch.randint(0, 240, (n,)) for n in lengths]
    width = max(lengths)
    batch = torch.full((3, width), model.token_ids.pad)
    mask = torch.zeros(3, width, dtype=torch.long)
    for r, p in enumerate(prompts):
        batch[r, width - len(p):] = p
        mask[r, width - len(p):] = 1
    out = _logits(model, batch, mask)
    for r, p in enumerate(prompts):
        alone = _logits(model, p[None])[0]
        torch.testing.assert_close(out[r, width - len(p):], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_bidirectional_a_later_token_changes_earlier_logits(kind):
    model = _tiny(kind)
    ids = torch.randint(0, 240, (1, 10))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 240
    a, b = _logits(model, ids), _logits(model, changed)
    assert (a[0, 0] - b[0, 0]).abs().max() > 1e-4, "position 0 must see the last token"


def test_llada_rotates_in_fp32_and_dream_in_activation_dtype():
    from model_adapters.common import apply_rope, rope_cos_sin

    x = torch.randn(1, 5, 2, 16).to(torch.bfloat16)
    cos, sin = rope_cos_sin(torch.arange(5)[None] + 1000, 16, 500000.0)
    half = 8
    rot = torch.cat((-x.float()[..., half:], x.float()[..., :half]), -1)
    fp32 = (x.float() * cos[..., None, :] + rot * sin[..., None, :]).to(torch.bfloat16)
    assert torch.equal(apply_rope(x, cos, sin, full_precision=True), fp32)
    c, s = cos.to(torch.bfloat16)[..., None, :], sin.to(torch.bfloat16)[..., None, :]
    low = x * c + torch.cat((-x[..., half:], x[..., :half]), -1) * s
    assert torch.equal(apply_rope(x, cos, sin, full_precision=False), low)
    assert _tiny("llada-8b-instruct").rope_full_precision and not _tiny("dream-v0-instruct-7b").rope_full_precision


def test_dream_accepts_its_own_4d_mask_and_positions():
    model = _tiny("dream-v0-instruct-7b")
    ids = torch.randint(0, 240, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    tok_idx = mask.cumsum(-1) - 1
    tok_idx.masked_fill_(mask == 0, 1)
    four_d = torch.logical_and(mask[:, None, None, :].bool(), mask[:, None, :, None].bool())
    a = model(ids, four_d, tok_idx).logits
    b = model(ids, mask, tok_idx).logits
    torch.testing.assert_close(a[1, 3:], b[1, 3:])
    assert torch.isfinite(a).all()
    assert torch.equal(model(ids, "full", None).logits, model(ids, None, None).logits)


@pytest.mark.parametrize("kind", KINDS)
def test_hugging_face_calling_convention(kind):
    model = _tiny(kind)
    assert model.device.type == "cpu"
    ids = torch.randint(0, 240, (1, 6))
    out = model(ids) if model.family == "llada" else model(ids, None, None)
    assert out.logits.shape == (1, 6, model.vocab_size)
    assert model.logits_shift == (0 if model.family == "llada" else 1)


def _write_broken(tmp_path, mutate_state=None, mutate_config=None):
    model = _tiny("llada-8b-instruct")
    ma.save_model(model, tmp_path)
    if mutate_state is not None:
        from safetensors.torch import load_file, save_file

        state = load_file(str(tmp_path / "model.safetensors"))
        mutate_state(state)
        save_file(state, str(tmp_path / "model.safetensors"))
    if mutate_config is not None:
        cfg = json.loads((tmp_path / "config.json").read_text())
        mutate_config(cfg)
        (tmp_path / "config.json").write_text(json.dumps(cfg))


def test_broken_checkpoints_name_the_problem(tmp_path):
    _write_broken(tmp_path / "missing", lambda s: s.pop("model.transformer.blocks.1.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing keys \(1\): model.transformer.blocks.1.up_proj.weight"):
        ma.load_model(tmp_path / "missing")
    _write_broken(tmp_path / "extra", lambda s: s.__setitem__("model.transformer.bogus.weight", torch.zeros(2)))
    with pytest.raises(ValueError, match=r"unexpected keys \(1\): model.transformer.bogus.weight"):
        ma.load_model(tmp_path / "extra")
    _write_broken(tmp_path / "shape", lambda s: s.__setitem__("model.transformer.ln_f.weight", torch.zeros(3)))
    with pytest.raises(ValueError, match=r"wrong shapes \(1\): model.transformer.ln_f.weight \(3,\) != \(64,\)"):
        ma.load_model(tmp_path / "shape")
    _write_broken(tmp_path / "arch", mutate_config=lambda c: (c.update(model_type="gpt2", architectures=["GPT2LM"])))
    with pytest.raises(ValueError, match="unknown architecture: model_type='gpt2'"):
        ma.load_model(tmp_path / "arch")
    (tmp_path / "noconfig").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        ma.load_model(tmp_path / "noconfig")
    _write_broken(tmp_path / "noweights")
    (tmp_path / "noweights" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        ma.load_model(tmp_path / "noweights")
    with pytest.raises(ValueError, match="unsupported LLaDA config options: block_type='sequential'"):
        ma.build_model(ma.tiny_config("llada-8b-instruct", block_type="sequential"), device="meta")


def _prefix_lm_reference(model, embeds, n_prompt):
    """Full forward where prompt rows see only the prompt and response rows see everything,
    composed independently from the block sub-steps with an explicit [L, L] mask."""
    from model_adapters.common import apply_rope

    length = embeds.shape[1]
    allowed = torch.ones(length, length, dtype=torch.bool)
    allowed[:n_prompt, n_prompt:] = False
    cos, sin = model.rope(torch.arange(length)[None])
    h = embeds
    for i in range(model.num_layers):
        blk = model.block(i)
        q, k, v = blk.project_qkv(blk.attn_norm(h))
        q = apply_rope(q, cos, sin, full_precision=model.rope_full_precision)
        k = apply_rope(k, cos, sin, full_precision=model.rope_full_precision)
        rep = q.shape[2] // k.shape[2]
        ctx = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(rep, 1),
                                             v.transpose(1, 2).repeat_interleave(rep, 1), attn_mask=allowed)
        h = h + blk.project_out(ctx.transpose(1, 2).reshape(*h.shape[:2], -1))
        gate, up = blk.mlp_gate_up(blk.ffn_norm(h))
        h = h + blk.mlp_down(F.silu(gate) * up)
    return model.head(h)


@pytest.mark.parametrize("kind", ["lavida-llada", "lavida-dream", "llada-8b-instruct"])
def test_prefix_kv_cache_equals_prefix_lm_attention(kind):
    model = _tiny(kind)
    prompt = model.embed(torch.randint(0, 240, (1, 7)))
    response = model.embed(torch.full((1, 5), model.token_ids.mask))
    cache, _ = model.prefill(prompt, None, torch.arange(7)[None])
    assert len(cache.keys) == model.num_layers and cache.keys[0].shape == (1, model.num_kv_heads, 7, model.head_dim)
    layout = PaddedLayout(positions=torch.arange(7, 12)[None], key_mask=None)
    cached = model.forward_embeds(response, layout, prefix=cache)
    reference = _prefix_lm_reference(model, torch.cat([prompt, response], 1), 7)[:, 7:]
    torch.testing.assert_close(cached, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["lavida-llada", "lavida-dream"])
def test_lavida_image_embedding_layout(kind):
    model = _tiny(kind)
    # tiny tower: 32px / patch 8 = 4x4 patches, pooled 2x2 -> 2x2 = 4 tokens per view
    single = ImageInput(torch.randn(1, 3, 32, 32), (32, 32))
    assert model.image_embeddings(single).shape == (4 + 1, 64)  # + one image_newline
    assert torch.equal(model.image_embeddings(single)[-1], model.model.image_newline)
    square = ImageInput(torch.randn(5, 3, 32, 32), (64, 64), (2, 2))
    # base 4 + 4x4 stitched grid with one newline per row = 4 + 4 * 5
    assert model.image_embeddings(square).shape == (24, 64)
    # a 64x30 image letterboxed on the 64x64 grid: of the 4 stitched rows, int(30 * 4 / 64) = 1
    # survives the unpad rule's centred crop of (4 - 1) // 2 rows each side: rows 1..2 remain
    wide = ImageInput(torch.randn(5, 3, 32, 32), (64, 30), (2, 2))
    assert model.image_embeddings(wide).shape == (4 + 2 * 5, 64)
    ids = torch.tensor([[5, ma.IMAGE_TOKEN_INDEX, 6], [251, 7, 8]])
    embeds, mask = model.embed_prompt(ids, torch.tensor([[1, 1, 1], [0, 1, 1]]), [single, None])
    assert embeds.shape == (2, 7, 64) and mask.tolist()[1] == [0] * 5 + [1, 1]
    torch.testing.assert_close(embeds[0, 1:6], model.image_embeddings(single))
    with pytest.raises(ValueError, match="1 <image> placeholders but 0 images"):
        model.embed_prompt(ids, None, [None, None])
    with pytest.raises(ValueError, match="images were given"):
        _tiny("llada-8b-instruct").embed_prompt(ids.clamp(min=0), None, [single, None])


def test_anyres_processing_picks_the_best_grid():
    from PIL import Image

    from model_adapters.lavida import process_image, select_best_resolution

    assert select_best_resolution((800, 400), [(384, 768), (768, 384), (768, 768)]) == (768, 384)
    assert select_best_resolution((500, 500), [(384, 768), (768, 384), (768, 768)]) == (768, 768)
    img = Image.new("RGB", (90, 40), (255, 0, 0))
    out = process_image(img, image_size=32, grid_pinpoints=[(32, 64), (64, 32), (64, 64)])
    assert out.grid == (2, 1) and out.pixel_values.shape == (3, 3, 32, 32)
    torch.testing.assert_close(out.pixel_values[0, 0], torch.ones(32, 32))  # red, normalised to 1
    assert out.pixel_values[1, 0, 0, 0] == -1.0  # top letterbox row is black padding


def test_mmada_image_token_ids_follow_the_text_vocabulary():
    model = _tiny("mmada-8b")
    ids = ma.mmada_mmu_input_ids(model, torch.tensor([[0, 31]]), torch.tensor([[7, 8]]))
    assert ids.tolist() == [[126089, 126084, 256, 287, 126085, 7, 8]]
    with pytest.raises(ValueError, match=r"image_codes must lie in \[0, 32\)"):
        ma.mmada_mmu_input_ids(model, torch.tensor([[32]]), torch.tensor([[7]]))
