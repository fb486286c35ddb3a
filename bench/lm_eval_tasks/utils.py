"""Loaders of the local tasks (lm-eval's ``custom_dataset``): the JSONL files beside this one."""

import json
from pathlib import Path


def _load(name: str):
    from datasets import Dataset

    rows = [json.loads(line) for line in (Path(__file__).parent / name).read_text().splitlines() if line.strip()]
    return {"test": Dataset.from_list(rows)}


def load_text(**metadata):
    return _load("seer_embedded_text.jsonl")


def load_choice(**metadata):
    return _load("seer_embedded_choice.jsonl")
