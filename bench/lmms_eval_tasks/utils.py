"""The image task's pieces for lmms-eval: each document's image, redrawn from the embedded model's
deterministic task generator (the held-out split's request ``id``), and exact match."""

from functools import lru_cache


@lru_cache(maxsize=1)
def _heldout(n: int):
    from model_adapters.embedded.tasks import make_requests

    return make_requests(n, "heldout")


def doc_to_visual(doc):
    task = _heldout(doc["demo_requests"])[doc["id"]]
    if task.question != doc["question"]:
        raise ValueError(f"document {doc['id']} does not match the generator's request: {task.question!r}")
    return [task.image.convert("RGB")]


def doc_to_text(doc):
    return doc["question"]


def process_results(doc, results):
    return {"exact_match": float(results[0].strip() == doc["answer"])}
