"""Request files (JSON Lines): a schema per kind of file, checked line by line before any work.

A request file holds one JSON object per line (blank lines are skipped). :func:`read_jsonl`
reads the whole file and checks every line against a :class:`LineSchema` before anything is
decoded, so that a mistake on line 4000 is found in a second, not after hours:

* the file must be UTF-8 (a UTF-8 byte-order mark is allowed): a Latin-1 byte is an error
  naming the line and the byte, a UTF-16 or UTF-32 file is named as such;
* each line must be a JSON object without repeated keys;
* every key must be one the schema knows: an unknown key (``"answr"``) is an error with the
  closest known key, because a key ignored would change what is measured without a word;
* required keys must be present, and every value of the kind the schema says (a non-empty
  string, an object, a file path that exists relative to the request file, ...);
* the schema's own checks (e.g. per-request options) run on each line.

Every error is a ``ValueError`` (``FileNotFoundError`` for a missing request file) that starts
with ``WHAT FILE:LINE:``. :func:`line_errors` names the line of errors raised later, while the
checked lines are turned into requests (tokenising, reading an image).

Schemas here: :data:`CALIBRATION_REQUEST` (``seer calibrate`` / ``calibrate-dyllm --data``:
``question``, optional ``image`` and ``answer``), :data:`TEXT_CALIBRATION_REQUEST` (a text-only
model: no ``image``) and :data:`RUN_REQUEST` (batch inference, ``seer run``: ``prompt``,
optional ``image``, optional ``options`` holding ``GenerationConfig`` fields).
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

from .config import GenerationConfig, parse_json_text

__all__ = ["CALIBRATION_REQUEST", "RUN_REQUEST", "TEXT_CALIBRATION_REQUEST", "Key", "LineSchema", "RequestLine",
           "line_errors", "read_jsonl"]

#: value kinds a :class:`Key` may require
KINDS = ("text", "string", "file", "object", "number", "int", "bool", "value")


@dataclass(frozen=True)
class Key:
    """One key of a line.

    kind: ``"text"`` (a string that is not empty or whitespace), ``"string"`` (any string),
    ``"file"`` (a non-empty path, relative to the request file's folder unless absolute, naming an
    existing file: the line's value becomes the resolved ``Path``), ``"object"``, ``"number"``,
    ``"int"``, ``"bool"`` or ``"value"`` (any JSON value). required: the key must be present and
    not null (an optional key may be null, which means absent). check: called with the value after
    the kind is checked; raises ``ValueError`` / ``TypeError`` (its message gets the file and line
    in front).
    """

    name: str
    kind: str
    required: bool = False
    help: str = ""
    check: Callable[[object], None] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Key {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class LineSchema:
    """What one line of a kind of request file holds: its keys, and the keys it must not hold
    (``refused``: key -> why, e.g. an image for a text-only model)."""

    name: str
    keys: tuple[Key, ...]
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def known(self) -> list[str]:
        return [k.name for k in self.keys]

    def describe(self) -> str:
        """One line for messages: the required and optional keys."""
        req = [k.name for k in self.keys if k.required]
        opt = [k.name for k in self.keys if not k.required]
        return f"required {req}" + (f", optional {opt}" if opt else "")


@dataclass(frozen=True)
class RequestLine:
    """A checked line: its number in the file (1-based), its values (files resolved to paths;
    absent or null optional keys left out), and its ``text`` and parsed ``item`` as written."""

    line: int
    values: dict
    text: str = ""
    item: dict = field(default_factory=dict)


def _kind_error(key: Key, value) -> str | None:
    kind = key.kind
    if kind in ("text", "string", "file"):
        if not isinstance(value, str):
            return f"must be a string, got {type(value).__name__} {value!r}"
        if kind != "string" and not value.strip():
            return f"must not be empty, got {value!r}"
    elif kind == "object" and not isinstance(value, dict):
        return f"must be an object, got {type(value).__name__} {value!r}"
    elif kind == "bool" and not isinstance(value, bool):
        return f"must be true or false, got {type(value).__name__} {value!r}"
    elif kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        return f"must be an int, got {type(value).__name__} {value!r}"
    elif kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"must be a number, got {type(value).__name__} {value!r}"
    return None


def check_line(item, schema: LineSchema, where: str, folder: Path) -> dict:
    """The values of one parsed line checked against ``schema`` (``where``: ``WHAT FILE:LINE``)."""
    if not isinstance(item, dict):
        raise ValueError(f"{where}: a line must be a JSON object ({schema.describe()}), got {type(item).__name__}")
    for name in item:
        if name in schema.refused:
            raise ValueError(f"{where}: key {name!r} is not accepted here: {schema.refused[name]}")
    unknown = [name for name in item if name not in schema.known]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, schema.known, n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; a {schema.name} "
                         f"line has {schema.describe()}")
    values = {}
    for key in schema.keys:
        value = item.get(key.name)
        if value is None:
            if key.required:
                raise ValueError(f"{where}: the key {key.name!r} is missing ({schema.describe()})")
            continue
        why = _kind_error(key, value)
        if why:
            raise ValueError(f"{where}: {key.name!r} {why}" + (f" ({key.help})" if key.help else ""))
        if key.kind == "file":
            path = Path(value)
            path = path if path.is_absolute() else folder / path
            if not path.is_file():
                state = "is a directory" if path.is_dir() else "does not exist"
                raise ValueError(f"{where}: {key.name!r} names {value!r}, which {state} (looked for {path})")
            value = path
        if key.check is not None:
            try:
                key.check(value)
            except (ValueError, TypeError) as exc:
                raise type(exc)(f"{where}: {key.name!r}: {exc}") from None
        values[key.name] = value
    return values


def _decode_line(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: not UTF-8: byte 0x{raw[exc.start]:02x} at column {exc.start + 1} (the file "
                         "must be UTF-8; Latin-1 or Windows-1252 text must be converted)") from None


def read_jsonl(path, schema: LineSchema, *, what: str = "--data") -> list[RequestLine]:
    """Every non-blank line of the JSONL file ``path``, checked against ``schema`` (module
    docstring). ``what`` names the file's origin in messages (an option such as ``--data``).
    Raises ``FileNotFoundError`` / ``OSError`` naming the file when it cannot be read, and
    ``ValueError`` naming ``FILE:LINE`` for the first bad line, or the file when it holds no line."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise type(exc)(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    for bom, name in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
                      (b"\xfe\xff", "UTF-16")):
        if raw.startswith(bom):
            raise ValueError(f"{what} {path} is {name} text, not UTF-8: save it as UTF-8 (one JSON object per line)")
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    lines = []
    for number, raw_line in enumerate(raw.split(b"\n"), 1):
        where = f"{what} {path}:{number}"
        text = _decode_line(raw_line, where)
        if not text.strip():
            continue
        item = parse_json_text(text, where)
        lines.append(RequestLine(number, check_line(item, schema, where, path.parent), text.rstrip("\r"), item))
    if not lines:
        raise ValueError(f"{what} {path} holds no requests (one JSON object per line: {schema.describe()})")
    return lines


@contextlib.contextmanager
def line_errors(what: str, path, line: int) -> Iterator[None]:
    """Re-raise a ``ValueError`` / ``TypeError`` / ``OSError`` from the block with ``WHAT FILE:LINE:``
    in front (tokenising a line, reading its image), of the same class."""
    try:
        yield
    except (ValueError, TypeError, OSError) as exc:
        raise type(exc)(f"{what} {path}:{line}: {exc}") from None


def _check_options(options) -> None:
    known = {f.name for f in fields(GenerationConfig)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown GenerationConfig fields {unknown} (known: {sorted(known)})")


_QUESTION = Key("question", "text", required=True, help="the user's turn, rendered with the chat template")
_ANSWER = Key("answer", "string", help="the reference answer; without it the baseline's own answer is the reference")
CALIBRATION_REQUEST = LineSchema("calibration request", (
    _QUESTION,
    Key("image", "file", help="an image file, relative to the request file"),
    _ANSWER,
))
TEXT_CALIBRATION_REQUEST = LineSchema("calibration request", (_QUESTION, _ANSWER),
                                      refused={"image": "this model is text only"})
RUN_REQUEST = LineSchema("run request", (
    Key("prompt", "text", required=True, help="the user's turn, rendered with the chat template"),
    Key("image", "file", help="an image file, relative to the request file"),
    Key("options", "object", help="GenerationConfig fields for this request", check=_check_options),
    Key("id", "value", help="any JSON value, copied to the answer"),
), refused={"question": "'question' is 'prompt' in a run request"})
