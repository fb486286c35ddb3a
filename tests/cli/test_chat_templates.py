"""Chat templates come from the checkpoint directory (one mechanism for every model), and
``seer generate`` answers the embedded model's held-out requests exactly as ``seer demo`` does."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from model_adapters.chat import FAMILY_TEMPLATES, ChatTokenizer
from model_adapters.embedded import EMBEDDED_DIR, EmbeddedTokenizer, serving
from model_adapters.embedded.tasks import make_requests
from model_adapters.lavida import LAVIDA_SYSTEM_PROMPT
from seer_runtime import GenerationConfig
from seer_runtime.cli import main
from seer_runtime.cli.options import GENERATION_FILE, checkpoint_generation_fields
from seer_runtime.evaluate import run_requests

pytestmark = pytest.mark.cli

USER = [{"role": "user", "content": "  what is it ? "}]


def tokenizer_dir(path, *, tokenizer_config=None, template_file=None, config=None):
    """A directory with a word-level tokenizer.json and the given template files."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<unk>", "<|startoftext|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
    vocab = {t: i for i, t in enumerate(specials + ["user", "assistant", "what", "is", "it", "?"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    if tokenizer_config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if template_file is not None:
        (path / "chat_template.jinja").write_text(template_file)
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    return path


def test_the_template_is_read_from_the_checkpoint_in_hugging_faces_order(tmp_path):
    plain = "{{ bos_token }}{% for m in messages %}{{ m['content'] | trim }}{% endfor %}"
    d = tokenizer_dir(tmp_path / "a", tokenizer_config={"bos_token": "<|startoftext|>", "chat_template": plain})
    tok = ChatTokenizer.from_pretrained(d)
    assert tok.apply_chat_template(USER) == "<|startoftext|>what is it ?"
    assert tok.encode_prompt(" what is it ? ") == [1, 7, 8, 9, 10]
    assert tok.encode_prompt("what", with_image=True) == [1, -200, 7]  # LLaVA's "<image>\n" before the question
    # chat_template.jinja beside the weights comes first, as in transformers
    (d / "chat_template.jinja").write_text("{{ bos_token }}user {{ messages[0]['content'] }}")
    assert ChatTokenizer.from_pretrained(d).apply_chat_template(USER) == "<|startoftext|>user   what is it ? "
    # named templates: the default one; special tokens as AddedToken dicts; BOS from config.json's id
    named = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": plain}]
    d = tokenizer_dir(tmp_path / "b", tokenizer_config={"chat_template": named}, config={"bos_token_id": 1})
    assert ChatTokenizer.from_pretrained(d).apply_chat_template(USER) == "<|startoftext|>what is it ?"
    d = tokenizer_dir(tmp_path / "c", tokenizer_config={"bos_token": {"content": "<|eot_id|>"}, "chat_template": plain})
    assert ChatTokenizer.from_pretrained(d).apply_chat_template(USER) == "<|eot_id|>what is it ?"


def test_a_missing_or_broken_template_is_an_error_never_a_silent_default(tmp_path):
    d = tokenizer_dir(tmp_path / "none", config={"model_type": "llada"})
    with pytest.raises(FileNotFoundError, match="has no chat template: neither chat_template.jinja nor"):
        ChatTokenizer.from_pretrained(d)
    assert ChatTokenizer.from_pretrained(d, require_template=False).encode("what is") == [7, 8]
    with pytest.raises(ValueError, match="chat_template must be a jinja2 file or one of"):
        ChatTokenizer.from_pretrained(d, chat_template="lavida")
    d = tokenizer_dir(tmp_path / "undef", tokenizer_config={"chat_template": "{{ bos_token }}{{ messages }}"})
    with pytest.raises(ValueError, match="uses an undefined variable: 'bos_token' is undefined"):
        ChatTokenizer.from_pretrained(d).encode_prompt("what")
    d = tokenizer_dir(tmp_path / "syntax", tokenizer_config={"chat_template": "{% for m in messages %}"})
    with pytest.raises(ValueError, match="is not valid jinja2"):
        ChatTokenizer.from_pretrained(d)
    d = tokenizer_dir(tmp_path / "raise", template_file="{{ raise_exception('only user turns') }}")
    with pytest.raises(ValueError, match="only user turns"):
        ChatTokenizer.from_pretrained(d).encode_prompt("what")
    named = [{"name": "tool_use", "template": "x"}]
    d = tokenizer_dir(tmp_path / "named", tokenizer_config={"chat_template": named})
    with pytest.raises(ValueError, match=r"named chat templates \['tool_use'\] but no 'default'"):
        ChatTokenizer.from_pretrained(d)


def test_family_templates_are_the_models_own_formats(tmp_path):
    """Asked for by name only; each renders the format MODELS.md §1.6, §2.5 and §4.3 give."""
    d = tokenizer_dir(tmp_path / "f", tokenizer_config={"bos_token": "<|startoftext|>"})
    render = {name: ChatTokenizer.from_pretrained(d, chat_template=name).apply_chat_template(USER)
              for name in FAMILY_TEMPLATES}
    header = "<|start_header_id|>{}<|end_header_id|>\n\n"
    assert render["llada"] == ("<|startoftext|>" + header.format("user") + "what is it ?<|eot_id|>"
                               + header.format("assistant"))
    assert render["lavida-llada"] == ("<|startoftext|>" + header.format("system") + LAVIDA_SYSTEM_PROMPT
                                      + "<|eot_id|>" + header.format("user") + "what is it ?<|eot_id|>"
                                      + header.format("assistant"))
    assert render["dream"] == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                               "  what is it ? <|im_end|>\n<|im_start|>assistant\n")
    assert render["lavida-dream"] == render["dream"].replace("You are a helpful assistant.", LAVIDA_SYSTEM_PROMPT)
    (tmp_path / "t.jinja").write_text("{{ messages[0]['content'] }}")
    tok = ChatTokenizer.from_pretrained(d, chat_template=tmp_path / "t.jinja")
    assert tok.apply_chat_template(USER) == USER[0]["content"] and tok.template.source == str(tmp_path / "t.jinja")


def test_the_embedded_template_encodes_as_the_embedded_tokenizer_does():
    """The shipped tokenizer_config.json reproduces ``EmbeddedTokenizer.chat_prompt`` token for
    token on the held-out requests (text and image questions)."""
    tok, emb = ChatTokenizer.from_pretrained(EMBEDDED_DIR), EmbeddedTokenizer()
    tasks = make_requests(192, "heldout")
    assert any(t.has_image for t in tasks) and not all(t.has_image for t in tasks)
    for t in tasks:
        assert tok.encode_prompt(t.question, with_image=t.has_image) == emb.chat_prompt(t.question, t.has_image)
        assert tok.encode(t.answer) == emb.encode(t.answer)


def test_both_embedded_models_ship_their_template_and_decoding_defaults():
    """The demo and arith models each carry ``tokenizer_config.json`` (the trainer writes it:
    ``tokenizer_config``) and ``seer_generation_config.json``; the template reproduces each one's
    ``EmbeddedTokenizer.chat_prompt`` token for token."""
    from model_adapters.embedded import tokenizer_config
    from model_adapters.embedded.arith import ARITH_DIR
    from model_adapters.embedded.arith import serving as arith_serving
    from model_adapters.embedded.arith.tasks import make_requests as arith_requests

    for folder in (EMBEDDED_DIR, ARITH_DIR):
        limit = json.loads((folder / "config.json").read_text())["max_sequence_length"]
        assert json.loads((folder / "tokenizer_config.json").read_text()) == tokenizer_config(limit)
        assert checkpoint_generation_fields(folder)
    tok, emb = ChatTokenizer.from_pretrained(ARITH_DIR), EmbeddedTokenizer(ARITH_DIR / "tokenizer.json")
    assert tok.template.source == f"{ARITH_DIR / 'tokenizer_config.json'} (chat_template)"
    for t in arith_requests(32, "heldout"):
        assert tok.encode_prompt(t.question) == emb.chat_prompt(t.question)
    stored = GenerationConfig.from_dict(checkpoint_generation_fields(ARITH_DIR))
    assert stored == arith_serving.demo_generation_config()


def test_words_outside_the_vocabulary_are_named_once_per_prompt():
    """"Count to fourteen." on the embedded model: 'Count' and '.' are not in its word-level
    vocabulary; one warning names them (and the lower-case word it has); a prompt in the vocabulary
    says nothing, and the embedded tokenizer's own prompts warn alike."""
    from model_adapters.chat import UnknownWordsWarning, unknown_words

    tok, emb = ChatTokenizer.from_pretrained(EMBEDDED_DIR), EmbeddedTokenizer()
    with pytest.warns(UnknownWordsWarning) as said:
        ids = tok.encode_prompt("Count to fourteen.")
    assert len(said) == 1
    message = str(said[0].message)
    assert "2 word(s)" in message and "'Count' (the vocabulary has 'count'), '.'" in message
    assert ids.count(emb.unk_id) == 2
    with pytest.warns(UnknownWordsWarning, match="'bluish'"):
        emb.chat_prompt("<image> is the circle bluish ?", with_image=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok.encode_prompt("count to fourteen", with_image=True)
        emb.chat_prompt("count to fourteen")
    assert unknown_words(tok.tokenizer, "Count Count to <image> Zebra") == ["Count", "Zebra"]


def test_the_embedded_generation_defaults_are_the_demos():
    """The stored defaults leave steps and block to follow the window (one step per position, one
    block: what the demo sets for its 32 positions), so that ``--gen-length`` alone is valid."""
    stored = GenerationConfig.from_dict(checkpoint_generation_fields(EMBEDDED_DIR))
    assert stored.steps is None and stored.block_length is None
    demo = serving.demo_generation_config()
    assert demo.steps == demo.block_length == demo.gen_length
    assert stored.replace(steps=stored.gen_length, block_length=stored.gen_length) == demo


def test_a_bad_generation_file_is_named(tmp_path):
    (tmp_path / GENERATION_FILE).write_text(json.dumps({"gen_length": 8, "window": 3}))
    with pytest.raises(ValueError, match=f"{GENERATION_FILE}: unknown GenerationConfig fields: \\['window'\\]"):
        checkpoint_generation_fields(tmp_path)


@pytest.mark.usefixtures("reference_kernels")
def test_generate_answers_held_out_requests_as_the_demo_does(tmp_path, capsys):
    """``seer generate --model model_adapters/embedded --prompt Q [--image F]`` prints the answer
    ``seer demo`` decodes for Q (same prompt ids, same decoding defaults), on four text and two
    image questions of the held-out split."""
    emb = EmbeddedTokenizer()
    requests, tasks = serving.demo_requests(24, emb)
    text = [i for i, t in enumerate(tasks) if not t.has_image][:4]
    image = [i for i, t in enumerate(tasks) if t.has_image][:2]
    chosen = text + image
    model, _ = serving.load_embedded()
    demo = run_requests(model, [requests[i] for i in chosen], serving.demo_generation_config())
    assert sum(a == requests[i].truth_ids for a, i in zip(demo.answers, chosen)) >= 5  # the model answers these
    for answer, i in zip(demo.answers, chosen):
        argv = ["generate", "--model", str(EMBEDDED_DIR), "--prompt", tasks[i].question]
        if tasks[i].has_image:
            tasks[i].image.save(tmp_path / f"{i}.png")
            argv += ["--image", str(tmp_path / f"{i}.png")]
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert out.strip() == emb.decode(answer), tasks[i].question
        assert "chat template " + str(EMBEDDED_DIR / "tokenizer_config.json") in err
        assert "(NFE; 32 denoising steps)" in err and "window 32, block 32" in err
    # the options given still win over the checkpoint's defaults
    assert main(["generate", "--model", str(EMBEDDED_DIR), "--prompt", "count to two", "--gen-length", "16"]) == 0
    err = capsys.readouterr().err
    assert "(NFE; 16 denoising steps)" in err and "window 16, block 16" in err
    # Fast-dLLM's options: the same answer in fewer forwards, without a warning about the
    # checkpoint's step count (a threshold decides the steps)
    for extra in (["--threshold", "0.9"], ["--threshold", "0.9", "--block-cache", "dual"]):
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            assert main(["generate", "--model", str(EMBEDDED_DIR), "--prompt", tasks[text[0]].question, *extra]) == 0
        out, err = capsys.readouterr()
        assert out.strip() == emb.decode(demo.answers[0]) and "forwards  33 (NFE" not in err, extra


def test_calibrate_names_a_template_only_with_a_checkpoint(capsys):
    assert main(["calibrate", "--chat-template", "llada"]) == 2
    assert "--chat-template needs --model" in capsys.readouterr().err


def test_generate_without_a_template_says_so(tmp_path, capsys):
    from tests.cli.test_cli import write_checkpoint

    write_checkpoint(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1", "--gen-length", "4"])
    assert rc == 2 and "has no chat template" in capsys.readouterr().err
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1", "--gen-length", "4", "--chat-template", "llada"])
    assert rc == 0


def test_images_are_encoded_where_the_template_puts_the_content(tmp_path):
    d = tokenizer_dir(tmp_path, template_file="{{ bos_token }}<|start_header_id|>{{ messages[0]['content'] }}",
                      config={"bos_token_id": 1})
    tok = ChatTokenizer.from_pretrained(d)
    assert tok.encode_prompt("what <image> is it", with_image=True) == [1, 3, 7, -200, 8, 9]
    assert tok.decode(torch.tensor([1, 7, -200, 8]).tolist()) == "what is"
