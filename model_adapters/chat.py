"""Tokenizers and chat templates, read from a checkpoint directory, as Hugging Face reads them.

A checkpoint directory carries its tokenizer (``tokenizer.json``, read with the ``tokenizers``
package) and its chat template, found in this order (the first that exists is used):

1. ``chat_template.jinja`` beside the weights (the file recent ``transformers`` versions save);
2. the ``chat_template`` field of ``tokenizer_config.json`` (a string, or a list of named
   templates of which ``default`` is used, as ``transformers`` does).

The template is rendered with jinja2 as ``apply_chat_template(messages,
add_generation_prompt=True)`` renders it: a sandboxed environment with ``trim_blocks`` and
``lstrip_blocks``, the variables ``messages``, ``add_generation_prompt``, ``bos_token``,
``eos_token``, ``pad_token``, ``unk_token`` (from ``tokenizer_config.json``, else the ids
``config.json`` names), ``tools`` / ``documents`` (None), and ``raise_exception`` /
``strftime_now``. A variable the template uses but nobody defined is an error, not an empty
string. A directory with no template is an error that says where it looked: the family
templates below (:data:`FAMILY_TEMPLATES`) are used only when asked for by name
(``--chat-template lavida-llada``, ``chat_template=llada``), never silently.

An image goes where the content says ``<image>`` (LLaVA's convention; a question without one
gets ``<image>\\n`` in front of it); it encodes to ``IMAGE_TOKEN_INDEX`` (-200).

A prompt with words the tokenizer reads as its unknown token (a word-level vocabulary such as the
embedded models': "Count to fourteen." has "Count" and "." outside it) warns once per prompt,
naming the words (:class:`UnknownWordsWarning`, :func:`unknown_words`); a byte-level tokenizer
never has such words.
"""

from __future__ import annotations

import json
import warnings
from datetime import datetime
from pathlib import Path

from seer_runtime.config import read_json_object, read_text_file

from .lavida import IMAGE_TOKEN_INDEX, LAVIDA_SYSTEM_PROMPT

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
IMAGE_MARKER = "<image>"
#: HF's special-token variables, and the config.json id each falls back to
SPECIAL_VARIABLES = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "pad_token": "pad_token_id",
                     "unk_token": "unk_token_id"}

_LLADA_FORMAT = (
    "{%- for message in messages -%}"
    "{%- if loop.first %}{{ bos_token }}{% endif -%}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif -%}"
)
_CHATML_FORMAT = (
    "{%- if messages[0]['role'] != 'system' -%}"
    "{{ '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif -%}"
)


def _with_system(template: str, system: str) -> str:
    """A template that puts ``system`` first when the messages bring no system turn."""
    head = ("{%- if messages[0]['role'] != 'system' -%}{%- set messages = [{'role': 'system', 'content': "
            + json.dumps(system) + "}] + messages -%}{%- endif -%}")
    return head + template


#: The families' own templates (``reference/MODELS.md`` §1.6, §2.5, §4.3), for a checkpoint that
#: ships none: used only when named explicitly. LaViDa's are its conversation templates (its
#: system prompt), which its published tokenizer files do not carry.
FAMILY_TEMPLATES = {
    "llada": _LLADA_FORMAT,
    "dream": "{%- set default_system = 'You are a helpful assistant.' -%}" + _CHATML_FORMAT,
    "lavida-llada": _with_system(_LLADA_FORMAT, LAVIDA_SYSTEM_PROMPT),
    "lavida-dream": "{%- set default_system = " + json.dumps(LAVIDA_SYSTEM_PROMPT) + " -%}" + _CHATML_FORMAT,
}


class UnknownWordsWarning(UserWarning):
    """A prompt has words its tokenizer reads as the unknown token (the model sees no word there)."""


def unknown_words(tokenizer, text: str) -> list[str]:
    """The distinct pieces of ``text`` (in order) that the ``tokenizers.Tokenizer`` encodes to its
    unknown token ([] for a tokenizer without one, or ``text`` without such pieces)."""
    model = getattr(tokenizer, "model", None)
    unk = getattr(model, "unk_token", None)
    unk_id = tokenizer.token_to_id(unk) if isinstance(unk, str) else None
    if unk_id is None or not text:
        return []
    found: list[str] = []
    for piece in text.split(IMAGE_MARKER):
        encoding = tokenizer.encode(piece, add_special_tokens=False)
        for token_id, (start, end) in zip(encoding.ids, encoding.offsets):
            word = piece[start:end]
            if token_id == unk_id and word not in found:
                found.append(word)
    return found


def warn_unknown_words(tokenizer, text: str, *, stacklevel: int = 3) -> list[str]:
    """One :class:`UnknownWordsWarning` naming the words of ``text`` outside the vocabulary (with the
    lower-case form where the vocabulary has that instead); returns them ([]: nothing said)."""
    words = unknown_words(tokenizer, text)
    if words:
        vocab = tokenizer.get_vocab()
        named = ", ".join(repr(w) + (f" (the vocabulary has {w.lower()!r})" if w.lower() in vocab and w.lower() != w
                                     else "") for w in words)
        warnings.warn(f"the prompt {text!r} has {len(words)} word(s) outside the tokenizer's vocabulary, read as the "
                      f"unknown token: {named}; the answer may not be about them", UnknownWordsWarning,
                      stacklevel=stacklevel)
    return words


class TemplateRaised(ValueError):
    """A template's own ``raise_exception(message)`` (the message names the template)."""


def _token_text(value) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    """A jinja2 chat template and the variables Hugging Face renders it with.

    template: the jinja source; source: where it came from (for messages); special: the
    special-token variables (``bos_token``...), each a string.
    """

    def __init__(self, template: str, *, source: str, special: dict[str, str] | None = None):
        if not isinstance(template, str) or not template.strip():
            raise ValueError(f"chat template from {source} must be a non-empty string")
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateRaised(f"chat template ({source}): {message}")

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._compiled = env.from_string(template)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template from {source} is not valid jinja2: {exc}") from None
        self.template = template
        self.source = source
        self.special = dict(special or {})

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` (``[{"role": str, "content": str}, ...]``).

        Raises ``ValueError`` naming the template's source when rendering fails (an undefined
        variable, the template's ``raise_exception``, any error inside an expression) or renders
        nothing but whitespace."""
        import jinja2

        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError(f"messages[{i}] must be a dict with string 'role' and 'content', got {m!r}")
        try:
            text = self._compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, tools=None,
                                         documents=None, **self.special)
        except jinja2.UndefinedError as exc:
            raise ValueError(f"chat template from {self.source} uses an undefined variable: {exc.message}; "
                             f"defined special tokens: {sorted(self.special)}") from None
        except TemplateRaised:  # the template's own raise_exception(...): its message, already named
            raise
        except Exception as exc:  # anything jinja or the template's expressions raise (1 / 0, list + int...)
            raise ValueError(f"chat template from {self.source} failed while rendering: "
                             f"{type(exc).__name__}: {exc}") from None
        if not text.strip():
            raise ValueError(f"chat template from {self.source} rendered an empty prompt (only whitespace) for "
                             f"{len(messages)} message(s)")
        return text


def _special_tokens(path: Path, tokenizer, tokenizer_config: dict) -> dict[str, str]:
    """``bos_token``... from tokenizer_config.json, else the token strings of config.json's ids."""
    config_file = path / "config.json"
    config = read_json_object(config_file, "config") if config_file.is_file() else {}
    special = {}
    for name, id_key in SPECIAL_VARIABLES.items():
        text = _token_text(tokenizer_config.get(name))
        if text is None and isinstance(config.get(id_key), int):
            text = tokenizer.id_to_token(config[id_key])
        if text is not None:
            special[name] = text
    return special


def read_chat_template(path: str | Path, tokenizer, *, chat_template: str | Path | None = None) -> ChatTemplate:
    """The chat template of the checkpoint directory ``path`` (module docstring for the order).

    chat_template: overrides the directory's: a file holding a jinja2 template, or the name of a
    family template (:data:`FAMILY_TEMPLATES`). Raises ``FileNotFoundError`` when the directory
    has none and none is named.
    """
    path = Path(path)
    config_file = path / TOKENIZER_CONFIG
    tokenizer_config = read_json_object(config_file, "tokenizer config") if config_file.is_file() else {}
    special = _special_tokens(path, tokenizer, tokenizer_config)
    if chat_template is not None:
        name = str(chat_template)
        if name in FAMILY_TEMPLATES:
            return ChatTemplate(FAMILY_TEMPLATES[name], source=f"the {name!r} family template", special=special)
        file = Path(chat_template)
        if not file.is_file():
            raise ValueError(f"chat_template must be a jinja2 file or one of {sorted(FAMILY_TEMPLATES)}, "
                             f"got {name!r} (no such file)")
        return ChatTemplate(read_text_file(file, "chat template file"), source=str(file), special=special)
    beside = path / TEMPLATE_FILE
    if beside.is_file():
        return ChatTemplate(read_text_file(beside, "chat template file"), source=str(beside), special=special)
    found = tokenizer_config.get("chat_template")
    if isinstance(found, list):  # named templates, as transformers stores several
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        if "default" not in named:
            raise ValueError(f"{config_file} has named chat templates {sorted(named)} but no 'default'; "
                             "pass the one to use as a file (chat_template=FILE)")
        found = named["default"]
    if found is not None:
        return ChatTemplate(found, source=f"{config_file} (chat_template)", special=special)
    raise FileNotFoundError(
        f"{path} has no chat template: neither {TEMPLATE_FILE} nor a 'chat_template' in {TOKENIZER_CONFIG}. "
        f"Add one of them beside the weights, or name a template explicitly (a jinja2 file, or one of the family "
        f"templates {sorted(FAMILY_TEMPLATES)})"
    )


class ChatTokenizer:
    """A checkpoint's tokenizer with its chat template.

    ``encode_prompt(question, with_image)`` -> chat-templated prompt ids (``<image>`` -> -200);
    ``apply_chat_template(messages)`` -> the prompt text; ``encode(text)`` -> ids of any text
    (``<image>`` -> -200, no special tokens added); ``decode(ids)`` -> text.
    """

    def __init__(self, tokenizer, template: ChatTemplate | None, special_ids: set[int]):
        self.tokenizer = tokenizer
        self.template = template
        self.special_ids = special_ids

    @classmethod
    def from_pretrained(cls, path: str | Path, *, chat_template: str | Path | None = None,
                        require_template: bool = True) -> ChatTokenizer:
        """Read ``tokenizer.json`` and the chat template of the directory ``path``.

        chat_template: see :func:`read_chat_template`. require_template=False: a directory
        without a template gives a tokenizer whose chat methods raise (raw-text evaluation).
        """
        from .loading import read_tokenizer

        path = Path(path)
        tok = read_tokenizer(path)
        special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        try:
            template = read_chat_template(path, tok, chat_template=chat_template)
        except FileNotFoundError:
            if require_template:
                raise
            template = None
        return cls(tok, template, special)

    @property
    def special_tokens(self) -> list[str]:
        """The text of every special token (what ``decode(skip_special_tokens=True)`` drops)."""
        return [self.tokenizer.id_to_token(i) for i in sorted(self.special_ids)]

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        """The checkpoint's template rendered for ``messages``, as text."""
        if self.template is None:
            raise ValueError("this tokenizer was read without a chat template (the checkpoint has none)")
        return self.template.render(messages, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` as written (no special tokens added); every ``<image>`` becomes -200."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids: list[int] = []
        pieces = text.split(IMAGE_MARKER)
        for i, piece in enumerate(pieces):
            if piece:
                ids.extend(self.tokenizer.encode(piece, add_special_tokens=False).ids)
            if i < len(pieces) - 1:
                ids.append(IMAGE_TOKEN_INDEX)
        return ids

    def encode_prompt(self, question: str, *, with_image: bool = False) -> list[int]:
        """The chat-templated prompt of one user turn; with an image, -200 marks where its features go.

        Raises ``ValueError`` for an empty (or whitespace) question, and naming the template's
        source when its rendering leaves the question out or encodes to no tokens. Warns once
        (:class:`UnknownWordsWarning`) naming the question's words outside the vocabulary."""
        if not isinstance(question, str):
            raise TypeError(f"question must be a str, got {type(question).__name__}")
        if not question.strip():
            raise ValueError(f"question must be a non-empty string, got {question!r}")
        warn_unknown_words(self.tokenizer, question)
        content = IMAGE_MARKER + "\n" + question if with_image and IMAGE_MARKER not in question else question
        text = self.apply_chat_template([{"role": "user", "content": content}])
        if question.strip() not in text:  # a template that never reads messages answers nothing asked
            raise ValueError(f"chat template from {self.template.source} leaves the question out of the prompt it "
                             f"renders ({text[:80]!r}...): it must render messages[...]['content']")
        ids = self.encode(text)
        if not ids:
            raise ValueError(f"chat template from {self.template.source} renders a prompt that encodes to no tokens "
                             f"({text[:80]!r})")
        return ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; image placeholders (negative ids) are dropped."""
        ids = [int(i) for i in ids if int(i) >= 0]
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
