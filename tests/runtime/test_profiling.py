"""Profiling ranges (``seer_runtime.profiling``): NVTX without CUDA degrades to no-ops, a fake
``nvtx`` package sees every stage and ``seer::`` op, and ``seer generate --profile`` writes a Chrome
trace whose ranges name each stage (Seer's probe and cut, DyLLM's saliency, partial attention and
FFN rows, the router's path, the commit rule) and the ``seer::`` ops."""

from __future__ import annotations

import contextlib
import json
import sys
import types
import warnings

import pytest
import torch

import model_adapters as ma
import seer_kernels
from seer_kernels import _dispatch
from seer_runtime import profiling
from seer_runtime.cli import main

from ..cli.test_cli import write_checkpoint

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("reference_kernels")]

#: the stages a Seer + DyLLM + router run passes through, and ops its sparse layers call
STAGES = ("generate", "step", "layers", "seer/probe", "seer/cut", "dyllm/attention",
          "dyllm/partial_attention", "dyllm/saliency", "dyllm/ffn_rows", "router/route", "commit/llada")
OPS = ("seer::cosine_saliency", "seer::partial_attention", "seer::rms_norm", "seer::scatter_rows")


@pytest.fixture
def fresh_profiling(monkeypatch):
    """SEER_PROFILE read again by the next range, and nothing left switched on after the test."""
    profiling.reset()
    yield monkeypatch
    monkeypatch.delenv("SEER_PROFILE", raising=False)
    profiling.reset()
    assert _dispatch._op_ranges is None


def tiny_run(tmp_path):
    """A tiny LLaDA decoded with Seer's sparsity probe, DyLLM and the router (every stage once at least)."""
    from seer_runtime import DyLLMConfig, GenerationConfig, SeerConfig, generate

    torch.manual_seed(0)
    model = ma.build_model(ma.tiny_config("llada-8b-instruct"))
    ids = torch.randint(5, 60, (2, 5), generator=torch.Generator().manual_seed(1))
    return generate(model, ids, gen=GenerationConfig(gen_length=8, block_length=8),
                    seer=SeerConfig(probe_layer=1, eps=0.01, probe="sparsity"),
                    dyllm=DyLLMConfig(tau=0.99, full_steps=2), router=True, graphs=None)


def test_nvtx_without_cuda_is_a_no_op_said_once(fresh_profiling, tmp_path):
    """SEER_PROFILE=nvtx on a torch without NVTX (the CPU build) and no ``nvtx`` package: one
    RuntimeWarning, then every range a no-op and generate runs (it used to crash mid-call)."""
    fresh_profiling.setenv("SEER_PROFILE", "nvtx")
    fresh_profiling.setitem(sys.modules, "nvtx", None)  # import nvtx -> ImportError
    if torch.cuda.is_available():
        pytest.skip("a CUDA build has NVTX")
    with pytest.warns(RuntimeWarning, match="SEER_PROFILE=nvtx: no NVTX in this torch build"):
        with profiling.prange("first"):
            pass
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="SEER_PROFILE")  # said once: no second warning
        out = tiny_run(tmp_path)
    assert out.sequences.shape == (2, 13) and _dispatch._op_ranges is None


def test_nvtx_ranges_name_every_stage_and_op(fresh_profiling, tmp_path):
    """With the ``nvtx`` package (a recording stand-in here), every stage and every ``seer::`` op
    call is an NVTX range of its name, nested as the calls are."""
    opened: list[str] = []

    @contextlib.contextmanager
    def annotate(name):
        opened.append(name)
        yield

    fresh_profiling.setenv("SEER_PROFILE", "nvtx")
    fresh_profiling.setitem(sys.modules, "nvtx", types.SimpleNamespace(annotate=annotate))
    tiny_run(tmp_path)
    missing = [name for name in (*STAGES, *OPS) if name not in opened]
    assert not missing, f"no NVTX range for {missing}; saw {sorted(set(opened))}"
    assert {"router/static", "router/varlen", "router/eager"} & set(opened)  # the path each group took


def test_torch_profiler_sees_the_ops_while_ranges_are_on(fresh_profiling):
    """Plain eager inference calls an op's implementation directly (no dispatcher round trip):
    inside ``enabled("torch")`` the op goes through the dispatcher, so the torch profiler records
    ``seer::<op>``; after the block the direct call is back."""
    x, w = torch.randn(4, 8), torch.ones(8)

    def recorded_ops(ranges_on: bool) -> set[str]:
        with torch.no_grad(), torch.profiler.profile() as prof:
            with profiling.enabled("torch") if ranges_on else contextlib.nullcontext():
                seer_kernels.rms_norm(x, w, eps=1e-5)
        return {e.name for e in prof.events()}

    assert "seer::rms_norm" in recorded_ops(True)
    assert "seer::rms_norm" not in recorded_ops(False) and _dispatch._op_ranges is None
    with pytest.raises(ValueError, match="mode must be one of"):
        with profiling.enabled("perf"):
            pass


def test_generate_profile_writes_a_chrome_trace_of_the_stages(fresh_profiling, tmp_path, capsys):
    """``seer generate --profile PATH``: a Chrome trace (JSON, traceEvents) with a range per stage
    and per ``seer::`` op; the path is checked before the model loads."""
    write_checkpoint(tmp_path)
    seer = tmp_path / "seer.json"
    seer.write_text(json.dumps({"probe_layer": 1, "eps": 0.01, "probe": "sparsity"}))
    trace = tmp_path / "out" / "trace.json"
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1 w2 w3", "--gen-length", "8", "--seer", str(seer),
               "--dyllm", "default", "--router", "--profile", str(trace)])
    err = capsys.readouterr().err
    assert rc == 0, err
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    missing = [name for name in (*STAGES, *OPS) if name not in names]
    assert not missing, f"the trace has no range {missing}"
    assert {"router/static", "router/varlen", "router/eager"} & names
    assert "profiler_start" not in err and f"profile   {trace}" in err
    assert _dispatch._op_ranges is None  # ranges off again after the call
    (tmp_path / "dir.json").mkdir()
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "w1", "--profile", str(tmp_path / "dir.json")])
    assert rc == 2 and "--profile" in capsys.readouterr().err
