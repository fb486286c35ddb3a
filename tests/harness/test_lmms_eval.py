"""The lmms-eval model ``seer_lavida``: registration (entry point payload), LaViDa-LLaDA and
LaViDa-Dream requests with images, and lmms-eval's own ``simple_evaluate`` on the embedded model
with the local image task of ``bench/lmms_eval_tasks`` (images redrawn by the task generator, no
download). lmms-eval is installed without its dependencies (Makefile), beside what its evaluator
imports (the ``eval`` extra)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lmms_eval.api.instance import Instance

from seer_runtime import GenerationConfig, generate
from seer_runtime.batch_inference import request_seed
from seer_runtime.harness import lmms_eval_models
from seer_runtime.harness.common import image_identity
from seer_runtime.harness.lmms_eval import SeerLavida
from tests.cli.test_cli import write_checkpoint

pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("reference_kernels")]

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED = ROOT / "model_adapters" / "embedded"


def test_seer_lavida_is_found_by_lmms_eval():
    from lmms_eval.models import get_model

    (manifest,) = lmms_eval_models()
    assert manifest.model_id == "seer_lavida"
    assert manifest.simple_class_path == "seer_runtime.harness.lmms_eval.SeerLavida"
    assert get_model("seer_lavida") is SeerLavida


def test_the_packages_entry_point_gives_lmms_eval_the_model(tmp_path, monkeypatch):
    """The ``lmms_eval.models`` entry point pyproject.toml declares, as an installed package
    carries it, is what lmms-eval's registry loads ``seer_lavida`` from."""
    from lmms_eval.models.registry_v2 import ModelRegistryV2

    # the section's lines as pyproject.toml writes them (tomllib is not in Python 3.10)
    text = (ROOT / "pyproject.toml").read_text().split('[project.entry-points."lmms_eval.models"]\n', 1)[1]
    declared = [line.replace('"', "") for line in text.split("\n\n", 1)[0].splitlines() if "=" in line]
    assert declared == ["seer = seer_runtime.harness:lmms_eval_models"]
    dist = tmp_path / "seer_entry-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: seer-entry\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[lmms_eval.models]\n" + "\n".join(declared) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = ModelRegistryV2()
    registry.load_entrypoint_manifests()
    assert registry.get_model_class("seer_lavida") is SeerLavida


@pytest.mark.parametrize("kind", ["lavida-llada", "lavida-dream"])
def test_requests_with_images_decode_as_generate_does(tmp_path, kind):
    from PIL import Image

    write_checkpoint(tmp_path, kind=kind)
    lm = SeerLavida(str(tmp_path), gen_length=4, batch_size=2, seed=0)
    pictures = {0: Image.new("RGB", (50, 40), (10, 200, 30)), 1: Image.new("RGB", (30, 60), (200, 10, 30))}
    lm.task_dict = {"t": {"test": pictures}}
    contexts = ["w5 w6", "w7"]
    requests = [Instance("generate_until", (c, {"until": ["w249"]}, lambda doc: [doc], i, "t", "test"), idx=0,
                         metadata={"task": "t", "doc_id": i, "repeats": 1}) for i, c in enumerate(contexts)]
    answers = lm.generate_until(requests)
    prompts = [lm.tokenizer.encode_prompt(c, with_image=True) for c in contexts]
    assert all(p.count(-200) == 1 for p in prompts)
    width = max(map(len, prompts))
    ids = torch.tensor([[251] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    images = [[lm.harness.services.prepare_image(lm.model, pictures[i])] for i in range(2)]
    # each request drawn from its own generator, seeded from its context, its picture and the seed
    seeds = [request_seed(0, c, images=[image_identity(pictures[i])]) for i, c in enumerate(contexts)]
    out = generate(lm.model, ids, attention_mask=mask, images=images, request_seeds=seeds,
                   gen=GenerationConfig(gen_length=4, seed=0, rng="per_request"))
    assert answers == [lm.harness.answer_text(out.answer_ids(r), ["w249"]) for r in range(2)]
    assert lm.speed.requests == 2 and lm.speed.nfe == out.stats.nfe
    with pytest.raises(NotImplementedError, match="generate_until tasks only"):
        lm.loglikelihood(requests)


def test_text_models_and_missing_templates_are_refused(tmp_path):
    write_checkpoint(tmp_path / "text")
    with pytest.raises(ValueError, match="text-only model .* use lm-eval's 'seer' model"):
        SeerLavida(str(tmp_path / "text"))
    write_checkpoint(tmp_path / "image", kind="lavida-llada")
    (tmp_path / "image" / "tokenizer_config.json").unlink()
    with pytest.raises(ValueError, match="has no chat template: pass chat_template=lavida-llada"):
        SeerLavida(str(tmp_path / "image"))
    assert SeerLavida(str(tmp_path / "image"), chat_template="lavida-llada").tokenizer.template is not None


@pytest.mark.slow
def test_simple_evaluate_on_the_embedded_model_equals_the_demo(tmp_path, monkeypatch):
    """lmms-eval's ``simple_evaluate`` on the local image task: exact match, answers and speed
    figures equal the demo's run of the same held-out image requests."""
    import json

    from lmms_eval.evaluator import simple_evaluate
    from lmms_eval.tasks import TaskManager

    from model_adapters.embedded import EmbeddedTokenizer, serving
    from seer_runtime.evaluate import run_requests

    monkeypatch.chdir(ROOT)  # the task's JSONL path is relative to the repository root
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    n = 8
    lm = SeerLavida(str(EMBEDDED), batch_size=8)
    out = simple_evaluate(model=lm, tasks=["seer_embedded_image"], limit=n, log_samples=True,
                          task_manager=TaskManager(include_path=str(ROOT / "bench" / "lmms_eval_tasks"),
                                                   include_defaults=False))
    emb = EmbeddedTokenizer()
    requests, _ = serving.demo_requests(192, emb)
    lines = (ROOT / "bench" / "lmms_eval_tasks" / "seer_embedded_image.jsonl").read_text().splitlines()
    chosen = [requests[json.loads(line)["id"]] for line in lines[:n]]
    model = lm.harness.model  # lmms-eval deletes the modules it finds on lm when it is done
    demo = run_requests(model, chosen, serving.demo_generation_config(), batch_size=8)
    samples = sorted(out["samples"]["seer_embedded_image"], key=lambda s: s["doc_id"])
    assert [s["filtered_resps"][0] for s in samples] == [emb.decode(a) for a in demo.answers]
    assert out["results"]["seer_embedded_image"]["exact_match,none"] == demo.exact_match(chosen)
    assert (lm.speed.tokens, lm.speed.nfe, lm.speed.requests) == (demo.answer_tokens, sum(demo.nfe), n)
