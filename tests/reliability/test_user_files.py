"""Where users meet files (issue 36): chat templates, images, request files and output paths.

Each list enumerates distinct bad inputs; every case must end in an error of the stated class
whose message names the file, line, field or option (``names``, a regex), before any decoding.
Inputs that were mishandled before and are now handled (16-bit and transparent images, the
forms ``generate(images=...)`` takes, a missing output directory) are tested below the lists
and counted apart (``HANDLED``). Nothing here loads a model from disk or decodes more than a
few steps of a tiny one.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import model_adapters as ma
from model_adapters.chat import ChatTokenizer
from model_adapters.images import open_image, request_images, to_rgb
from seer_runtime import GenerationConfig, generate
from seer_runtime.files import OutputPathError, atomic_write, check_output_path, check_plot_path, write_json
from seer_runtime.request_files import CALIBRATION_REQUEST, RUN_REQUEST, TEXT_CALIBRATION_REQUEST, read_jsonl

from ..cli.test_chat_templates import tokenizer_dir

pytestmark = pytest.mark.reliability


@dataclass(frozen=True)
class Bad:
    id: str
    call: Callable[[Path], object]  # given a scratch directory holding the fixtures below
    error: type[BaseException]
    names: str  # regex over the message; {d} is the scratch directory


def _check(case: Bad, d: Path) -> None:
    with pytest.raises(case.error) as info:
        case.call(d)
    pattern = case.names.replace("{d}", str(d))
    assert __import__("re").search(pattern, str(info.value)), f"{info.value!s} !~ {pattern}"


# ---------------------------------------------------------------------------------- templates
def _template(source: str, *, question: str = "what is it ?"):
    def call(d: Path):
        folder = tokenizer_dir(d / "tpl", template_file=source, config={"bos_token_id": 1})
        return ChatTokenizer.from_pretrained(folder).encode_prompt(question)
    return call


def _named(name, **config):
    def call(d: Path):
        folder = tokenizer_dir(d / "tpl", tokenizer_config=config or None)
        return ChatTokenizer.from_pretrained(folder, chat_template=name).encode_prompt("what is it ?")
    return call


TPL = r"{d}/tpl/chat_template\.jinja"
BAD_TEMPLATES = [
    Bad("raises-zero-division", _template("{{ 1 / 0 }}{{ messages[0]['content'] }}"), ValueError,
        TPL + " failed while rendering: ZeroDivisionError"),
    Bad("raises-type-error", _template("{{ messages + 1 }}"), ValueError, TPL + " failed while rendering: TypeError"),
    Bad("sandbox-refuses", _template("{{ messages.append(1) }}"), ValueError,
        TPL + " failed while rendering: SecurityError: access to attribute 'append'"),
    Bad("index-past-the-messages", _template("{{ messages[5]['content'] }}"), ValueError,
        TPL + " uses an undefined variable: list object has no element 5"),
    Bad("method-of-a-string", _template("{{ messages[0]['content'].nope() }}"), ValueError,
        TPL + " uses an undefined variable"),
    Bad("renders-nothing", _template("{% if false %}{{ messages[0]['content'] }}{% endif %}"), ValueError,
        TPL + r" rendered an empty prompt \(only whitespace\)"),
    Bad("renders-whitespace", _template("  \n {% if false %}x{% endif %}\t"), ValueError, TPL + " rendered an empty"),
    Bad("leaves-the-question-out", _template("user: what ?\nassistant:"), ValueError,
        TPL + " leaves the question out of the prompt"),
    Bad("template-raise_exception", _template("{{ raise_exception('only user turns') }}"), ValueError,
        r"chat template \({d}/tpl/chat_template\.jinja\): only user turns"),
    Bad("template-not-utf8", lambda d: (tokenizer_dir(d / "tpl"), (d / "tpl/chat_template.jinja").write_bytes(
        b"{{ messages[0]['content'] }} \xe9"), ChatTokenizer.from_pretrained(d / "tpl")), ValueError,
        TPL + r" is not UTF-8 text: byte 0xe9 at offset 29"),
    Bad("template-syntax", _template("{% for m in messages %}"), ValueError, TPL + " is not valid jinja2"),
    Bad("tokenizer-config-template-not-a-string", lambda d: ChatTokenizer.from_pretrained(tokenizer_dir(
        d / "tpl", tokenizer_config={"chat_template": 5})), ValueError,
        r"chat template from {d}/tpl/tokenizer_config\.json \(chat_template\) must be a non-empty string"),
    Bad("tokenizer-config-not-json", lambda d: (tokenizer_dir(d / "tpl"), (d / "tpl/tokenizer_config.json").write_text(
        "{chat"), ChatTokenizer.from_pretrained(d / "tpl")), ValueError,
        r"tokenizer config {d}/tpl/tokenizer_config\.json is not valid JSON"),
    Bad("tokenizer-config-repeated-key", lambda d: (tokenizer_dir(d / "tpl"), (d / "tpl/tokenizer_config.json")
        .write_text('{"chat_template": "a", "chat_template": "b"}'), ChatTokenizer.from_pretrained(d / "tpl")),
        ValueError, r"tokenizer_config\.json: the key 'chat_template' appears twice"),
    Bad("family-name-misspelt", _named("lavida"), ValueError,
        r"chat_template must be a jinja2 file or one of \['dream', 'lavida-dream', 'lavida-llada', 'llada'\], "
        r"got 'lavida' \(no such file\)"),
    Bad("named-file-raises", lambda d: ((d / "zero.jinja").write_text("{{ 1 / 0 }}"),
                                        _named(str(d / "zero.jinja"))(d)), ValueError,
        r"chat template from {d}/zero\.jinja failed while rendering: ZeroDivisionError"),
    Bad("empty-question", _template("{{ messages[0]['content'] }}", question=" \n"), ValueError,
        r"question must be a non-empty string, got ' \\n'"),
]


@pytest.mark.parametrize("case", BAD_TEMPLATES, ids=lambda c: c.id)
def test_bad_template_names_its_source(case: Bad, tmp_path):
    _check(case, tmp_path)


# ---------------------------------------------------------------------------------- images
def png_header(path: Path, width: int, height: int) -> Path:
    """A PNG whose header claims ``width`` x ``height`` (its data is a few bytes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
                     + chunk(b"IEND", b""))
    return path


def _png(d: Path, name="red.png", size=(40, 30), colour=(200, 10, 10)) -> Path:
    Image.new("RGB", size, colour).save(d / name)
    return d / name


def _truncated(d: Path) -> Path:
    data = _png(d).read_bytes()
    (d / "cut.png").write_bytes(data[: len(data) // 2])
    return d / "cut.png"


def _prepare(image):
    return ("prepared", image.size, image.mode)


def _normalise(images, batch=1):
    return request_images(images, batch, prepare=_prepare, prepared=tuple)


BAD_IMAGES = [
    Bad("bomb-header-20000x20000", lambda d: open_image(png_header(d / "bomb.png", 20000, 20000)), ValueError,
        r"image file {d}/bomb\.png claims 400,000,000 pixels, more than the 89,478,485"),
    Bad("bomb-just-above-the-limit", lambda d: open_image(png_header(d / "big.png", 10000, 9000)), ValueError,
        r"image file {d}/big\.png claims 90,000,000 pixels"),
    Bad("truncated-png", lambda d: open_image(_truncated(d)), ValueError,
        r"image file {d}/cut\.png cannot be decoded \(.*\): the file is truncated or corrupt"),
    Bad("not-an-image", lambda d: ((d / "a.png").write_text("not an image"), open_image(d / "a.png")), ValueError,
        r"image file {d}/a\.png is not an image file PIL can read"),
    Bad("empty-file", lambda d: ((d / "e.png").write_bytes(b""), open_image(d / "e.png")), ValueError,
        r"{d}/e\.png is not an image file"),
    Bad("missing-file", lambda d: open_image(d / "nope.png"), FileNotFoundError,
        r"image file {d}/nope\.png does not exist"),
    Bad("a-directory", lambda d: open_image(d), ValueError, r"image file {d} is a directory"),
    Bad("float-pixels", lambda d: (Image.fromarray(np.full((4, 4), 0.5, np.float32)).save(d / "f.tiff"),
                                   open_image(d / "f.tiff")), ValueError,
        r"{d}/f\.tiff: mode 'F' \(floating-point pixels\) has no defined range"),
    Bad("int32-pixels", lambda d: (Image.fromarray(np.full((4, 4), 70000, np.int32)).save(d / "i.tiff"),
                                   open_image(d / "i.tiff")), ValueError, r"{d}/i\.tiff: mode 'I' \(32-bit integer"),
    Bad("images-a-path-not-a-list", lambda d: _normalise(str(_png(d))), TypeError,
        r"images must be a list with one entry per request \(1\).* got str \(wrap it: images=\[path\]\)"),
    Bad("images-a-pil-image-not-a-list", lambda d: _normalise(Image.new("RGB", (4, 4))), TypeError,
        r"images must be a list .* got Image \(wrap it"),
    Bad("images-entry-an-int", lambda d: _normalise([3]), TypeError,
        r"images\[0\] must be None, a path, a PIL image, a prepared image \(ImageInput\) or a list of those, got int"),
    Bad("images-entry-bytes", lambda d: _normalise([b"red.png"]), TypeError, r"images\[0\] must be .* got bytes"),
    Bad("images-nested-bad-item", lambda d: _normalise([[Image.new("RGB", (4, 4)), 3.5]]), TypeError,
        r"images\[0\]\[1\] must be .* got float"),
    Bad("images-wrong-count", lambda d: _normalise([None, None], batch=1), ValueError,
        r"images must have one entry per request \(1\), got 2"),
    Bad("images-missing-path", lambda d: _normalise([str(d / "gone.png")]), FileNotFoundError,
        r"images\[0\]: image file {d}/gone\.png does not exist"),
    Bad("to-rgb-not-an-image", lambda d: to_rgb(np.zeros((4, 4, 3))), TypeError, r"expected a PIL image, got ndarray"),
]


@pytest.mark.parametrize("case", BAD_IMAGES, ids=lambda c: c.id)
def test_bad_image_is_named(case: Bad, tmp_path):
    _check(case, tmp_path)


# ---------------------------------------------------------------------------------- request files
def _lines(name: str, lines: list | bytes, schema=CALIBRATION_REQUEST):
    def call(d: Path):
        f = d / name
        if isinstance(lines, bytes):
            f.write_bytes(lines)
        else:
            f.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
        _png(d, "green.png")
        (d / "folder").mkdir(exist_ok=True)
        return read_jsonl(f, schema)
    return call


Q = {"question": "what colour is the circle ?", "answer": "red"}
BAD_DATA = [
    Bad("misspelled-key", _lines("a.jsonl", [Q, {"question": "count to two", "answr": "one two"}]), ValueError,
        r"--data {d}/a\.jsonl:2: unknown key 'answr' \(did you mean 'answer'\?\)"),
    Bad("integer-answer", _lines("a.jsonl", [Q, {"question": "count", "answer": 2}]), ValueError,
        r"a\.jsonl:2: 'answer' must be a string, got int 2"),
    Bad("object-answer", _lines("a.jsonl", [{"question": "count", "answer": {"text": "x"}}]), ValueError,
        r"a\.jsonl:1: 'answer' must be a string, got dict"),
    Bad("latin1-byte", _lines("a.jsonl", (json.dumps(Q) + "\n") .encode() * 3 + '{"question": "café"}\n'
                                         .encode("latin-1")), ValueError,
        r"a\.jsonl:4: not UTF-8: byte 0xe9 at column 18"),
    Bad("utf16-file", _lines("a.jsonl", (json.dumps(Q) + "\n").encode("utf-16")), ValueError,
        r"--data {d}/a\.jsonl is UTF-16 text, not UTF-8"),
    Bad("missing-image", _lines("a.jsonl", [{"question": "q", "image": "green.png"},
                                            {"question": "q", "image": "no.png"}]),
        ValueError, r"a\.jsonl:2: 'image' names 'no\.png', which does not exist \(looked for {d}/no\.png\)"),
    Bad("image-a-directory", _lines("a.jsonl", [{"question": "q", "image": "folder"}]), ValueError,
        r"a\.jsonl:1: 'image' names 'folder', which is a directory"),
    Bad("image-a-number", _lines("a.jsonl", [{"question": "q", "image": 5}]), ValueError,
        r"a\.jsonl:1: 'image' must be a string, got int 5"),
    Bad("empty-question", _lines("a.jsonl", [Q, {"question": "   "}]), ValueError,
        r"a\.jsonl:2: 'question' must not be empty"),
    Bad("question-missing", _lines("a.jsonl", [{"answer": "red"}]), ValueError,
        r"a\.jsonl:1: the key 'question' is missing"),
    Bad("question-null", _lines("a.jsonl", [{"question": None}]), ValueError,
        r"a\.jsonl:1: the key 'question' is missing"),
    Bad("repeated-key", _lines("a.jsonl", ['{"question": "a", "question": "b"}']), ValueError,
        r"a\.jsonl:1: the key 'question' appears twice"),
    Bad("image-for-a-text-model", _lines("a.jsonl", [{"question": "q", "image": "green.png"}],
                                         TEXT_CALIBRATION_REQUEST),
        ValueError, r"a\.jsonl:1: key 'image' is not accepted here: this model is text only"),
    Bad("not-json", _lines("a.jsonl", [Q, "{question: 1}"]), ValueError, r"a\.jsonl:2 is not valid JSON"),
    Bad("truncated-last-line", _lines("a.jsonl", [Q, json.dumps(Q)[:20]]), ValueError, r"a\.jsonl:2 is not valid JSON"),
    Bad("line-an-array", _lines("a.jsonl", ["[1, 2]"]), ValueError, r"a\.jsonl:1: a line must be a JSON object"),
    Bad("empty-file", _lines("a.jsonl", b""), ValueError, r"--data {d}/a\.jsonl holds no requests"),
    Bad("blank-lines-only", _lines("a.jsonl", b"\n  \n\n"), ValueError, r"a\.jsonl holds no requests"),
    Bad("missing-file", lambda d: read_jsonl(d / "none.jsonl", CALIBRATION_REQUEST), FileNotFoundError,
        r"--data {d}/none\.jsonl cannot be read: No such file or directory"),
    Bad("run-options-not-an-object", _lines("r.jsonl", [{"prompt": "p", "options": [1]}], RUN_REQUEST), ValueError,
        r"r\.jsonl:1: 'options' must be an object"),
    Bad("run-options-unknown-field", _lines("r.jsonl", [{"prompt": "p", "options": {"windw": 8}}], RUN_REQUEST),
        ValueError, r"r\.jsonl:1: 'options': unknown GenerationConfig fields \['windw'\]"),
    Bad("run-question-for-prompt", _lines("r.jsonl", [{"question": "p"}], RUN_REQUEST), ValueError,
        r"r\.jsonl:1: key 'question' is not accepted here: 'question' is 'prompt' in a run request"),
]


@pytest.mark.parametrize("case", BAD_DATA, ids=lambda c: c.id)
def test_bad_request_line_names_the_file_and_line(case: Bad, tmp_path):
    _check(case, tmp_path)


def test_request_files_accept_what_their_schema_says(tmp_path):
    _png(tmp_path, "green.png")
    (tmp_path / "ok.jsonl").write_bytes(b"\xef\xbb\xbf" + b"\n".join(json.dumps(x).encode() for x in [
        {"question": "q1"}, {"question": "q2", "image": "green.png", "answer": ""}, {"question": "q3", "answer": None},
    ]) + b"\n\n")
    lines = read_jsonl(tmp_path / "ok.jsonl", CALIBRATION_REQUEST)
    assert [x.line for x in lines] == [1, 2, 3]  # a UTF-8 byte-order mark and blank lines are fine
    assert lines[1].values == {"question": "q2", "image": tmp_path / "green.png", "answer": ""}
    assert lines[2].values == {"question": "q3"}  # null: absent


# ---------------------------------------------------------------------------------- output paths
def _out(path: str, **kw):
    return lambda d: check_output_path(path.format(d=d), **kw)


def _afile(d: Path) -> Path:
    (d / "afile").write_text("x")
    return d / "afile"


BAD_OUTPUTS = [
    Bad("parent-is-a-file", lambda d: (_afile(d), check_output_path(d / "afile/x.json", option="--out")),
        OutputPathError, r"--out {d}/afile/x\.json: {d}/afile is a file, not a directory"),
    Bad("ancestor-is-a-file", lambda d: (_afile(d), check_output_path(d / "afile/a/b/x.json", option="--json")),
        OutputPathError, r"--json {d}/afile/a/b/x\.json: {d}/afile is a file"),
    Bad("path-is-a-directory", _out("{d}", option="--out"), OutputPathError,
        r"--out {d} is a directory: give a file path inside it"),
    Bad("empty-path", _out("", option="--out"), OutputPathError, r"--out: expected a file path, got ''"),
    Bad("parent-missing-not-created", _out("{d}/new/x.json", option="--out", create_parent=False), OutputPathError,
        r"--out {d}/new/x\.json: the directory {d}/new does not exist"),
    Bad("plot-format-unknown", lambda d: check_plot_path(d / "p.notaformat", option="--plot"), OutputPathError,
        r"--plot {d}/p\.notaformat: the suffix '\.notaformat' is not a figure format matplotlib writes"),
    Bad("plot-without-suffix", lambda d: check_plot_path(d / "plot", option="--plot"), OutputPathError,
        r"--plot {d}/plot: the suffix '\(none\)' is not a figure format"),
    Bad("plot-parent-a-file", lambda d: (_afile(d), check_plot_path(d / "afile/p.png", option="--plot")),
        OutputPathError, r"--plot {d}/afile/p\.png: {d}/afile is a file"),
]


@pytest.mark.parametrize("case", BAD_OUTPUTS, ids=lambda c: c.id)
def test_bad_output_path_is_refused_by_name(case: Bad, tmp_path):
    _check(case, tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any directory: no permission to refuse (not counted)")
def test_a_directory_this_user_cannot_write_in_is_refused(tmp_path):
    (tmp_path / "ro").mkdir()
    os.chmod(tmp_path / "ro", 0o500)
    with pytest.raises(OutputPathError, match=f"--out {tmp_path}/ro/x.json: cannot write in {tmp_path}/ro"):
        check_output_path(tmp_path / "ro/x.json", option="--out")


def test_a_missing_output_directory_is_created_and_nothing_else_is_left(tmp_path):
    out = check_output_path(tmp_path / "a/b/result.json", option="--out")
    assert out.parent.is_dir() and not out.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == []  # the write probe is gone


def test_atomic_write_replaces_whole_or_leaves_the_old_file(tmp_path):
    target = tmp_path / "r.json"
    write_json(target, {"a": 1})
    os.chmod(target, 0o640)
    for error in (RuntimeError("disk full"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with atomic_write(target) as f:
                f.write('{"a": 2, "b": ')  # half a result, then the failure
                raise error
        assert json.loads(target.read_text()) == {"a": 1}
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no temporary file left
    with pytest.raises(TypeError):  # a value JSON cannot hold: refused before anything is written
        write_json(tmp_path / "new.json", {"x": object()})
    assert not (tmp_path / "new.json").exists()
    write_json(target, {"a": 3})
    assert json.loads(target.read_text()) == {"a": 3} and (os.stat(target).st_mode & 0o777) == 0o640


def test_stored_configs_are_written_atomically(tmp_path, monkeypatch):
    import seer_runtime.files as files
    from seer_runtime.seer import SeerConfig

    cfg = SeerConfig()
    cfg.to_json(tmp_path / "s.json")

    def interrupted(src, dst):  # Ctrl-C at the last moment: the whole new file is written, not yet renamed
        assert json.loads(Path(src).read_text())["gamma"] == 0.5
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cfg.replace(gamma=0.5).to_json(tmp_path / "s.json")
    monkeypatch.undo()
    assert SeerConfig.from_json(tmp_path / "s.json") == cfg and len(list(tmp_path.iterdir())) == 1


# ---------------------------------------------------------------------------------- handled now
def _value(image_input) -> float:
    """Mean of the first view's pixels in [0, 1] (the processor normalises to [-1, 1])."""
    return float(image_input.pixel_values[0].mean() * 0.5 + 0.5)


@pytest.fixture(scope="module")
def lavida():
    torch.manual_seed(0)
    return ma.build_model(ma.tiny_config("lavida-llada"))


def _palette_with_transparency(path):
    p = Image.new("P", (40, 30), 0)
    p.putpalette([0, 0, 0] + [255, 0, 0] * 255)
    p.save(path, transparency=0)


def _rotated_photo(path):
    img = Image.new("RGB", (40, 20), (0, 0, 0))
    img.paste((255, 255, 255), (0, 0, 20, 20))  # left half white
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to view"
    img.save(path, exif=exif)


HANDLED_IMAGES = [
    ("16-bit-grey-png", lambda p: Image.fromarray(np.full((30, 40), 30000, np.uint16)).save(p), 30000 / 65535, "png"),
    ("transparent-rgba", lambda p: Image.new("RGBA", (40, 30), (0, 0, 0, 0)).save(p), 1.0, "png"),
    ("half-transparent-rgba", lambda p: Image.new("RGBA", (40, 30), (0, 0, 0, 128)).save(p), 127 / 255, "png"),
    ("palette-transparent-index", _palette_with_transparency, 1.0, "png"),
    ("grey-with-alpha", lambda p: Image.new("LA", (40, 30), (0, 0)).save(p), 1.0, "png"),
    ("cmyk-jpeg", lambda p: Image.new("CMYK", (40, 30), (0, 0, 0, 0)).save(p), 1.0, "jpg"),
]


@pytest.mark.parametrize("name,make,expected,suffix", HANDLED_IMAGES, ids=[c[0] for c in HANDLED_IMAGES])
def test_images_of_every_mode_are_converted_as_transformers_does(name, make, expected, suffix, tmp_path, lavida):
    """16 bits scaled (not clipped to white), alpha and palette transparency over white."""
    path = tmp_path / f"img.{suffix}"
    make(path)
    rgb = open_image(path)
    assert rgb.mode == "RGB"
    assert abs(_value(lavida.preprocess_image(rgb)) - expected) < 0.02, name


def test_a_truncated_file_is_refused_even_when_pil_was_told_to_fill_it(tmp_path, monkeypatch):
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)  # what importing lmms-eval does
    with pytest.raises(ValueError, match="cut.png cannot be decoded"):
        open_image(_truncated(tmp_path))
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # the caller's setting is back


def test_exif_orientation_is_applied(tmp_path):
    _rotated_photo(tmp_path / "photo.jpg")
    img = open_image(tmp_path / "photo.jpg")
    assert img.size == (20, 40)  # turned upright: the white half is now on top
    top, bottom = np.asarray(img)[:20].mean(), np.asarray(img)[20:].mean()
    assert top > 200 and bottom < 50


def test_generate_takes_a_path_a_pil_image_or_a_list_per_request(tmp_path, lavida, reference_kernels):
    """Every form decodes to the same tokens as the prepared ImageInput."""
    from tests.cli.test_cli import write_checkpoint

    write_checkpoint(tmp_path, kind="lavida-llada")
    tok = ChatTokenizer.from_pretrained(tmp_path)
    _png(tmp_path)
    pil = Image.open(tmp_path / "red.png")
    ids = torch.tensor([tok.encode_prompt("w1 w2", with_image=True)] * 2)
    gen = GenerationConfig(gen_length=4, steps=4)
    prepared = lavida.preprocess_image(pil)
    reference = generate(lavida, ids, images=[prepared, [prepared]], gen=gen).sequences
    for images in ([pil, str(tmp_path / "red.png")], [[pil], [tmp_path / "red.png"]], (prepared, pil)):
        assert torch.equal(generate(lavida, ids, images=list(images), gen=gen).sequences, reference), images
    with pytest.raises(TypeError, match=r"images\[1\] must be None, a path, a PIL image"):
        generate(lavida, ids, images=[pil, 7], gen=gen)


#: inputs mishandled before issue 36 that are handled now, each tested above (counted apart from the errors)
HANDLED = {
    "image modes converted (16-bit, alpha, ...)": len(HANDLED_IMAGES) + 1,
    "generate(images=) forms (PIL, path, list)": 3,
    "missing output directory created": 1,
}
