"""Write the local lm-eval tasks of the embedded model (``python -m bench.lm_eval_tasks.write_tasks``).

``seer_embedded_text.jsonl``: the text questions among the demo's held-out requests
(``serving.demo_requests(192)``, the requests ``seer demo`` reports on), with their answers as
the word-level tokenizer decodes them. ``seer_embedded_choice.jsonl``: the first
:data:`CHOICE_QUESTIONS` of them as three-way multiple choice (the answer, the answer without
its last word, the answer with its last word repeated; each ending with the end-of-turn token,
which is where a chat answer ends), the right one at index ``i % 3``. The YAML files beside them
load these files (``utils.py``), so lm-eval runs them offline with ``--include_path``.
``../lmms_eval_tasks/seer_embedded_image.jsonl``: the image questions of the same requests, for
lmms-eval (their images are redrawn from the task generator by ``id``).
"""

from __future__ import annotations

import json
from pathlib import Path

TASK_DIR = Path(__file__).resolve().parent
DEMO_REQUESTS = 192
CHOICE_QUESTIONS = 24
END_OF_TURN = "<|eot_id|>"


def items(*, images: bool) -> list[dict]:
    """The held-out text (or image) questions of the demo's requests, answers as decoded."""
    from model_adapters.embedded import EmbeddedTokenizer
    from model_adapters.embedded.serving import demo_requests

    tok = EmbeddedTokenizer()
    _, tasks = demo_requests(DEMO_REQUESTS, tok)
    extra = {"demo_requests": DEMO_REQUESTS} if images else {}
    return [{"id": i, **extra, "question": t.question, "answer": tok.decode(tok.encode(t.answer))}
            for i, t in enumerate(tasks) if t.has_image == images]


def choice_items(items: list[dict]) -> list[dict]:
    out = []
    for k, item in enumerate(items[:CHOICE_QUESTIONS]):
        words = item["answer"].split()
        shorter = words[:-1] if len(words) > 1 else ["nothing"]
        wrong = [" ".join(shorter), " ".join([*words, words[-1]])]
        label = k % 3
        choices = wrong[:label] + [item["answer"]] + wrong[label:]
        out.append({**item, "choices": [f"{c} {END_OF_TURN}" for c in choices], "label": label})
    return out


def write(folder: Path = TASK_DIR) -> list[Path]:
    text = items(images=False)
    files = {folder / "seer_embedded_text.jsonl": text, folder / "seer_embedded_choice.jsonl": choice_items(text),
             folder.parent / "lmms_eval_tasks" / "seer_embedded_image.jsonl": items(images=True)}
    for path, rows in files.items():
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return list(files)


if __name__ == "__main__":
    for path in write():
        print(path)
