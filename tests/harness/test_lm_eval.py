"""The lm-evaluation-harness model ``seer``: registration, arguments, generate_until, the
Monte-Carlo log-likelihood of LLaDA's evaluation, and lm-eval's own ``simple_evaluate`` on the
embedded model with the local tasks of ``bench/lm_eval_tasks`` (no download)."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance

from seer_runtime.harness.lm_eval import ADAPTER_ARGS, SeerLM, main, register
from tests.cli.test_cli import write_checkpoint

pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("reference_kernels")]

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "bench" / "lm_eval_tasks"
EMBEDDED = ROOT / "model_adapters" / "embedded"


def request(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """Tiny LLaDA and Dream checkpoints with a word-level tokenizer (w0..w249) and a template."""
    dirs = {}
    for kind in ("llada-8b-instruct", "dream-v0-instruct-7b"):
        path = tmp_path_factory.mktemp(kind)
        write_checkpoint(path, kind=kind)
        dirs[kind] = path
    return dirs


def test_importing_the_packages_imports_no_harness():
    code = ("import sys, seer_runtime, seer_runtime.cli, seer_runtime.harness, model_adapters, model_adapters.services;"
            "assert not {'lm_eval', 'lmms_eval'} & set(sys.modules), 'a harness was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_local_task_files_are_the_held_out_requests(tmp_path):
    """The committed JSONL files are what ``write_tasks`` writes from the task generator."""
    from bench.lm_eval_tasks import write_tasks

    (tmp_path / "lm").mkdir()
    (tmp_path / "lmms_eval_tasks").mkdir()
    for written in write_tasks.write(tmp_path / "lm"):
        committed = (TASKS if written.parent.name == "lm" else ROOT / "bench" / "lmms_eval_tasks") / written.name
        assert written.read_text() == committed.read_text(), written.name
    text = (TASKS / "seer_embedded_text.jsonl").read_text().splitlines()
    images = (ROOT / "bench" / "lmms_eval_tasks" / "seer_embedded_image.jsonl").read_text().splitlines()
    assert len(text) + len(images) == write_tasks.DEMO_REQUESTS  # every held-out request, once


def test_seer_is_registered_beside_lm_evals_own_models():
    from lm_eval.api.registry import get_model, model_registry

    register()  # idempotent
    assert get_model("seer") is SeerLM
    assert "hf" in model_registry and "dummy" in model_registry  # the built-in models stay findable


def test_model_args_are_checked_by_name(tiny_dirs):
    path = str(tiny_dirs["llada-8b-instruct"])
    lm = SeerLM.create_from_arg_string(f"pretrained={path},gen_length=8,steps=4,block_length=4", {"batch_size": "3"})
    assert (lm.gen.gen_length, lm.gen.steps, lm.gen.block_length, lm.batch_size) == (8, 4, 4, 3)
    with pytest.raises(ValueError, match=r"unknown GenerationConfig fields: \['treshold'\].*seer's own arguments"):
        SeerLM.create_from_arg_string(f"pretrained={path},treshold=0.9")
    fast = SeerLM.create_from_arg_string(f"pretrained={path},gen_length=8,threshold=0.9,block_cache=dual")
    assert (fast.gen.threshold, fast.gen.block_cache) == (0.9, "dual")  # Fast-dLLM's options, as its eval takes them
    # Fast-dLLM's own argument names get a pointer to ours (lm-eval parses "True" to a bool)
    for written, instead in (("use_cache=True,dual_cache=True", "write block_cache=dual"),
                             ("use_cache=True", "write block_cache=prefix"),
                             ("use_cache=False", "leave block_cache unset"), ("factor=1.0", "threshold=0.9")):
        with pytest.raises(ValueError, match=f"--model_args {written}.*{instead}"):
            SeerLM.create_from_arg_string(f"pretrained={path},gen_length=8,{written}")
    with pytest.raises(ValueError, match="steps .3. must be divisible by the number of blocks .2."):
        SeerLM(path, gen_length=8, block_length=4, steps=3)
    with pytest.raises(ValueError, match="batch_size 'auto' is not supported"):
        SeerLM(path, batch_size="auto")
    with pytest.raises(ValueError, match=r"mc_num \(100\) must be a multiple of mc_batch_size \(32\)"):
        SeerLM(path, mc_num=100)
    with pytest.raises(FileNotFoundError):
        SeerLM(path, seer=str(Path(path) / "absent.json"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available here: pass --device cpu"):
            SeerLM(path, device="cuda:0")
    assert set(ADAPTER_ARGS) >= {"pretrained", "seer", "dyllm", "mc_num"}


def test_generate_until_cuts_and_reports(tiny_dirs, capsys):
    lm = SeerLM(str(tiny_dirs["llada-8b-instruct"]), gen_length=8, steps=8, batch_size=2)
    contexts = ["w1 w2 w3", "w4", "w5 w6"]
    plain = lm.generate_until([request("generate_until", c, {}) for c in contexts])
    assert lm.speed.requests == 3 and lm.speed.nfe == 16  # two batches of 8 steps
    assert lm.speed.tokens == sum(len(a.split()) for a in plain)
    err = capsys.readouterr().err
    assert "[seer] Total NFE is 16" in err
    assert f"[seer] Positions computed (positions x layers): {lm.speed.positions_computed:,}" in err
    assert lm.speed.positions_computed > 0
    words = plain[0].split()
    assert len(words) >= 3, plain  # this random model answers with several words
    cut = lm.generate_until([request("generate_until", "w1 w2 w3", {"until": [words[2]], "max_gen_toks": 8}),
                             request("generate_until", "w1 w2 w3", {"max_gen_toks": 2, "do_sample": False})])
    assert cut[0] == plain[0][: plain[0].index(words[2])] and cut[1] == " ".join(words[:2])
    assert lm.speed.cut_to_max_gen_toks == 1
    with pytest.raises(ValueError, match="do_sample=True needs temperature > 0"):
        lm.generate_until([request("generate_until", "w1", {"do_sample": True})])
    with pytest.raises(ValueError, match=r"unknown GenerationConfig fields: \['top_q'\]"):
        lm.generate_until([request("generate_until", "w1", {"top_q": 0.9})])
    with pytest.raises(NotImplementedError, match="loglikelihood_rolling"):
        lm.loglikelihood_rolling([request("loglikelihood_rolling", "w1")])


def direct_log_probs(lm, prefix, target_len, *, masked):
    """log-softmax at every target position of ``prefix + target`` with ``masked`` of them masked."""
    return lm._logits(torch.tensor([prefix + masked]), len(prefix))[0, len(prefix):].log_softmax(-1)


@pytest.mark.parametrize("kind", ["llada-8b-instruct", "dream-v0-instruct-7b"])
def test_one_token_likelihood_is_exact(tiny_dirs, kind):
    """With one target token every sample masks it (ratio 1): the estimate is log p exactly, read at
    the family's position (Dream: the state before it)."""
    lm = SeerLM(str(tiny_dirs[kind]), mc_num=4, mc_batch_size=2)
    mask = lm.model.token_ids.mask
    prefix, target = [11, 12, 13], [40]
    logits = lm.model(torch.tensor([prefix + [mask]])).logits[0].float()
    row = logits[-1 if kind.startswith("llada") else -2]
    expected = row.log_softmax(-1)[40].item()
    assert lm.mc_loglikelihood(prefix, target) == pytest.approx(expected, rel=1e-6)
    assert lm.suffix_greedy(prefix, [int(row.argmax())]) and not lm.suffix_greedy(prefix, [int(row.argmin())])
    ll, greedy = lm.loglikelihood([request("loglikelihood", "w11 w12 w13", " w40")])[0]
    assert ll == pytest.approx(expected, rel=1e-6) and greedy is (int(row.argmax()) == 40)


def test_guided_likelihood_follows_llada_get_logits(tiny_dirs):
    lm = SeerLM(str(tiny_dirs["llada-8b-instruct"]), cfg_scale=1.5, mc_num=2, mc_batch_size=2)
    mask = lm.model.token_ids.mask
    cond = lm.model(torch.tensor([[11, 12, mask]])).logits[0, -1].float()
    uncond = lm.model(torch.tensor([[mask, mask, mask]])).logits[0, -1].float()
    expected = (uncond + 2.5 * (cond - uncond)).log_softmax(-1)[7].item()
    assert lm.mc_loglikelihood([11, 12], [7]) == pytest.approx(expected, rel=1e-5)


def test_monte_carlo_estimate_converges_to_the_exact_bound(tiny_dirs):
    """LLaDA's estimator is unbiased for -E_x E_S [sum_{i in S} CE_i / (x / T)] (x masked of T,
    S uniform of size x): enumerate every mask of a 3-token target and compare."""
    lm = SeerLM(str(tiny_dirs["llada-8b-instruct"]), mc_num=1536, mc_batch_size=96)
    mask = lm.model.token_ids.mask
    prefix, target = [21, 22], [30, 31, 32]
    t = len(target)
    exact = 0.0
    for x in range(1, t + 1):
        subsets = list(itertools.combinations(range(t), x))
        total = 0.0
        for s in subsets:
            noisy = [mask if i in s else tok for i, tok in enumerate(target)]
            lp = direct_log_probs(lm, prefix, t, masked=noisy)
            total += sum(lp[i, target[i]].item() for i in s) / (x / t)
        exact += total / len(subsets) / t
    estimate = lm.mc_loglikelihood(prefix, target)
    assert estimate == pytest.approx(exact, rel=0.02)
    assert lm.mc_loglikelihood(prefix, target) == estimate  # seeded by the request: repeatable
    assert not math.isclose(estimate, lm.mc_loglikelihood(prefix, [30, 31, 33]))


@pytest.mark.slow
def test_simple_evaluate_on_the_embedded_model_equals_the_demo():
    """lm-eval's ``simple_evaluate`` with the local text task (chat template applied by lm-eval
    through the adapter): accuracy, answers and speed figures equal the demo's run of the same
    requests; the multiple-choice task's scores are the adapter's own Monte-Carlo estimates."""
    import json

    import lm_eval
    from lm_eval.tasks import TaskManager

    from model_adapters.embedded import EmbeddedTokenizer, serving
    from seer_runtime.evaluate import run_requests

    n = 8
    lm = SeerLM(str(EMBEDDED), batch_size=8, mc_num=8, mc_batch_size=8, check_greedy=False)
    out = lm_eval.simple_evaluate(model=lm, tasks=["seer_embedded_text", "seer_embedded_choice"], limit=n,
                                  task_manager=TaskManager(include_path=str(TASKS)), apply_chat_template=True,
                                  log_samples=True)
    emb = EmbeddedTokenizer()
    requests, tasks = serving.demo_requests(192, emb)
    docs = [json.loads(line) for line in (TASKS / "seer_embedded_text.jsonl").read_text().splitlines()][:n]
    chosen = [requests[d["id"]] for d in docs]
    assert [tasks[d["id"]].question for d in docs] == [d["question"] for d in docs]
    demo = run_requests(lm.model, chosen, serving.demo_generation_config(), batch_size=8)
    samples = sorted(out["samples"]["seer_embedded_text"], key=lambda s: s["doc_id"])
    assert [s["filtered_resps"][0] for s in samples] == [emb.decode(a) for a in demo.answers]
    assert out["results"]["seer_embedded_text"]["exact_match,none"] == demo.exact_match(chosen)
    assert (lm.speed.tokens, lm.speed.nfe, lm.speed.requests) == (demo.answer_tokens, sum(demo.nfe), n)
    # multiple choice: each choice's score is the estimate of its own (context, continuation)
    choice = out["samples"]["seer_embedded_choice"]
    for s in choice[:2]:
        for (context, continuation), resp in zip((a for a in s["arguments"]), s["resps"]):
            assert resp[0][0] == lm.mc_loglikelihood(*lm._encode_pair(context, continuation))
    right = [max(range(3), key=lambda c: s["resps"][c][0][0]) == s["target"] for s in choice]
    assert out["results"]["seer_embedded_choice"]["acc,none"] == sum(right) / len(right)


def test_the_command_registers_seer_and_runs_lm_evals_cli(capsys, monkeypatch):
    """``python -m seer_runtime.harness.lm_eval ARGS`` = ``lm_eval ARGS`` with ``seer`` known."""
    monkeypatch.setattr(sys, "argv", ["x"])
    main(["--model", "seer", "--model_args", f"pretrained={EMBEDDED}", "--tasks", "seer_embedded_text",
          "--include_path", str(TASKS), "--device", "cpu", "--batch_size", "4", "--limit", "4",
          "--apply_chat_template"])
    printed = capsys.readouterr()
    assert "|seer_embedded_text|" in printed.out and "exact_match" in printed.out
    assert "[seer] Total NFE is 33" in printed.err  # one batch: prefill + 32 steps
