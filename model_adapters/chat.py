"""Tokenizers and chat templates, read from a checkpoint directory with the ``tokenizers`` package.

A Hugging Face checkpoint ships ``tokenizer.json``; the chat template is the family's
(``reference/MODELS.md`` §1.6, §2.5, §4.3), unless ``config.json`` carries our key
``seer_chat_template`` (a format string with ``{question}``, and ``<image>`` where the image
goes), as the embedded demo model does.
"""

from __future__ import annotations

from pathlib import Path

from .lavida import IMAGE_TOKEN_INDEX, LAVIDA_SYSTEM_PROMPT

LLADA_TEMPLATE = ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n{question}<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n")
DREAM_TEMPLATE = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{question}"
                  "<|im_end|>\n<|im_start|>assistant\n")
LAVIDA_LLADA_TEMPLATE = ("<|startoftext|><|start_header_id|>system<|end_header_id|>\n\n" + LAVIDA_SYSTEM_PROMPT
                         + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n{image}{question}<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n")
LAVIDA_DREAM_TEMPLATE = ("<|im_start|>system\n" + LAVIDA_SYSTEM_PROMPT + "<|im_end|>\n<|im_start|>user\n"
                         "{image}{question}<|im_end|>\n<|im_start|>assistant\n")
_TEMPLATES = {"llada": LLADA_TEMPLATE, "mmada": LLADA_TEMPLATE, "dream": DREAM_TEMPLATE,
              "llava_llada": LAVIDA_LLADA_TEMPLATE, "llava_dream": LAVIDA_DREAM_TEMPLATE}


class ChatTokenizer:
    """Encode a question into prompt ids (``<image>`` -> -200) and decode answers."""

    def __init__(self, tokenizer, template: str, special_ids: set[int]):
        self.tokenizer = tokenizer
        self.template = template
        self.special_ids = special_ids

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ChatTokenizer:
        from .loading import architecture_of, read_config, read_tokenizer

        path = Path(path)
        tok = read_tokenizer(path)
        config = read_config(path)
        template = config.get("seer_chat_template") or _TEMPLATES[architecture_of(config)]
        special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        return cls(tok, template, special)

    def encode_prompt(self, question: str, *, with_image: bool = False) -> list[int]:
        """The chat-templated prompt; with an image, -200 marks where its features go."""
        text = self.template.format(question=question, image="<image>\n" if with_image else "")
        if with_image and "<image>" not in text:
            text = "<image>\n" + text
        ids: list[int] = []
        pieces = text.split("<image>")
        for i, piece in enumerate(pieces):
            if piece:
                ids.extend(self.tokenizer.encode(piece, add_special_tokens=False).ids)
            if i < len(pieces) - 1:
                ids.append(IMAGE_TOKEN_INDEX)
        return ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        ids = [i for i in ids if i >= 0]
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
