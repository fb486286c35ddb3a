"""The embedded demo model: a small LaViDa-LLaDA (``llava_llada``) trained by ``train.py`` here.

It ships with the package (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``train_log.json`` in :data:`EMBEDDED_DIR`), so the demo and the tests run offline on a fresh
machine. The tokenizer is word-level with LLaDA's special-token roles:

================================  ====================================================
``<|startoftext|>``               BOS, before the first turn only
``<|endoftext|>``                 EOS = PAD (fills the response window after the answer)
``<|mdm_mask|>``                  the mask token of the diffusion process
``<|start_header_id|>`` / ``<|end_header_id|>``  around a role name (``user`` / ``assistant``)
``<|eot_id|>``                    end of turn (ends the answer, before the EOS run)
``<image>``                       not a vocabulary entry: encodes to ``IMAGE_TOKEN_INDEX`` (-200)
================================  ====================================================

Prompt (LLaDA's chat template without its newlines, which a word-level tokenizer drops)::

    <|startoftext|> <|start_header_id|> user <|end_header_id|> [<image>] question <|eot_id|>
    <|start_header_id|> assistant <|end_header_id|>

followed by a response window of ``RESPONSE_WINDOW`` (32) positions: answer, ``<|eot_id|>``,
then ``<|endoftext|>`` to the end of the window, as LLaDA's SFT data pads it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from seer_runtime.adapter import IMAGE_TOKEN_INDEX, TokenIds

EMBEDDED_DIR = Path(__file__).resolve().parent
RESPONSE_WINDOW = 32
#: a held-out picture of the image tasks (48 x 48: two blue triangles and a green square), the
#: README's image example: "how many shapes are there ?" -> "three"
EXAMPLE_IMAGE = EMBEDDED_DIR / "example.png"

UNK, BOS, EOS, MASK = "<unk>", "<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>"
START_HEADER, END_HEADER, EOT = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
SPECIAL_TOKENS = [UNK, BOS, EOS, MASK, START_HEADER, END_HEADER, EOT]
IMAGE_MARKER = "<image>"


#: the file beside the weights that carries the tokenizer's roles and the chat template (as Hugging Face's)
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def tokenizer_config(max_length: int) -> dict:
    """What an embedded model's ``tokenizer_config.json`` holds: the special tokens' roles and LLaDA's
    chat template (``model_adapters.chat.FAMILY_TEMPLATES["llada"]``, which renders the prompt
    :meth:`EmbeddedTokenizer.chat_prompt` builds: the word-level tokenizer drops its newlines), so
    that ``seer generate`` and ``model_adapters.services.load_tokenizer`` read the model's own
    template. max_length: the model's ``max_sequence_length`` (prompt and window)."""
    from model_adapters.chat import FAMILY_TEMPLATES

    return {"add_bos_token": False, "add_eos_token": False, "bos_token": BOS, "eos_token": EOS, "pad_token": EOS,
            "unk_token": UNK, "mask_token": MASK, "model_max_length": int(max_length),
            "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": FAMILY_TEMPLATES["llada"]}


def write_tokenizer_config(folder: str | Path, max_length: int) -> Path:
    """Write :func:`tokenizer_config` into ``folder`` (what the trainer ships beside the weights)."""
    import json

    path = Path(folder) / TOKENIZER_CONFIG_FILE
    path.write_text(json.dumps(tokenizer_config(max_length), indent=2) + "\n")
    return path


def build_tokenizer(words: list[str] | None = None):
    """The word-level ``tokenizers.Tokenizer``: special tokens (ids 0..6) then the task words.

    words: the ordinary words in id order (default: the demo model's, ``tasks.vocabulary_words``;
    the ``arith`` workload passes its own)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    if words is None:
        from .tasks import vocabulary_words

        words = vocabulary_words()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


class EmbeddedTokenizer:
    """Wraps the ``tokenizers`` word-level tokenizer with the chat template and special ids.

    ``encode(text)`` -> ids, with every ``<image>`` turned into -200; ``decode(ids)`` drops -200
    and, by default, the special tokens; ``chat_prompt(question, with_image)`` builds a prompt.
    """

    def __init__(self, tokenizer=None):
        if tokenizer is None:
            tokenizer = EMBEDDED_DIR / "tokenizer.json"
        if isinstance(tokenizer, (str, Path)):
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(tokenizer))
        self.tokenizer = tokenizer
        ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            raise ValueError(f"tokenizer lacks the special tokens {missing}")
        self.unk_id, self.bos_id, self.eos_id, self.mask_id = ids[UNK], ids[BOS], ids[EOS], ids[MASK]
        self.start_header_id, self.end_header_id, self.eot_id = ids[START_HEADER], ids[END_HEADER], ids[EOT]
        self.pad_id = self.eos_id
        self.special_ids = frozenset(ids.values())

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def token_ids(self):
        """The special ids as :class:`seer_runtime.adapter.TokenIds`."""
        return TokenIds(mask=self.mask_id, eos=self.eos_id, eot=self.eot_id, pad=self.pad_id, bos=self.bos_id)

    def config_ids(self) -> dict:
        """The ``config.json`` keys the LLaDA definition reads."""
        return {"mask_token_id": self.mask_id, "eos_token_id": self.eos_id, "eot_token_id": self.eot_id,
                "pad_token_id": self.pad_id, "bos_token_id": self.bos_id}

    def encode(self, text: str) -> list[int]:
        """Text -> ids; ``<image>`` -> -200; unknown words -> ``<unk>`` (id 0). No BOS is added."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids: list[int] = []
        for k, piece in enumerate(text.split(IMAGE_MARKER)):
            if k:
                ids.append(IMAGE_TOKEN_INDEX)
            if piece.strip():
                ids.extend(self.tokenizer.encode(piece, add_special_tokens=False).ids)
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Ids (list or 1-D tensor) -> space-joined words; -200 and out-of-vocabulary ids are dropped."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        n = self.vocab_size
        keep = [int(i) for i in ids if 0 <= int(i) < n]
        return self.tokenizer.decode(keep, skip_special_tokens=skip_special_tokens)

    def chat_prompt(self, question: str, with_image: bool = False) -> list[int]:
        """Prompt ids: BOS, user header, [-200], question, end of turn, assistant header.

        with_image: put the image placeholder before the question (unless the question already
        holds ``<image>``). Warns once (``model_adapters.chat.UnknownWordsWarning``) naming the
        question's words outside the vocabulary (they encode to ``<unk>``).
        """
        from model_adapters.chat import warn_unknown_words

        warn_unknown_words(self.tokenizer, question)
        content = self.encode(question)
        if with_image and IMAGE_TOKEN_INDEX not in content:
            content = [IMAGE_TOKEN_INDEX] + content
        user = self.tokenizer.token_to_id("user")
        assistant = self.tokenizer.token_to_id("assistant")
        return ([self.bos_id, self.start_header_id, user, self.end_header_id] + content
                + [self.eot_id, self.start_header_id, assistant, self.end_header_id])

    def pad_batch(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pad prompt id lists with PAD: ``(input_ids [B, L] int64, attention_mask [B, L] int64)``."""
        if not prompts:
            raise ValueError("prompts must not be empty")
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for r, p in enumerate(prompts):
            if p:
                ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
                mask[r, width - len(p):] = 1
        return ids, mask

    def response_window(self, answer: str, window: int = RESPONSE_WINDOW) -> list[int]:
        """The training target of a response window: answer, end of turn, EOS padding to ``window``."""
        ids = self.encode(answer) + [self.eot_id]
        if len(ids) > window:
            raise ValueError(f"answer of {len(ids) - 1} tokens does not fit a window of {window}")
        return ids + [self.eos_id] * (window - len(ids))


def load_embedded(dtype: torch.dtype | None = None, device: str | torch.device = "cpu", path=None):
    """Load the shipped model and tokenizer offline: ``(model, EmbeddedTokenizer)``.

    dtype: None -> float32 (the weights are stored in fp16 to keep the package small and are
    upcast for CPU use); otherwise that dtype. path: another directory written by ``train.py``.
    """
    from model_adapters.loading import load_model

    folder = Path(path) if path is not None else EMBEDDED_DIR
    model = load_model(folder, dtype=torch.float32 if dtype is None else dtype, device=device)
    return model, EmbeddedTokenizer(folder / "tokenizer.json")


__all__ = ["EMBEDDED_DIR", "EXAMPLE_IMAGE", "RESPONSE_WINDOW", "TOKENIZER_CONFIG_FILE", "EmbeddedTokenizer",
           "build_tokenizer", "load_embedded", "tokenizer_config", "write_tokenizer_config"]
