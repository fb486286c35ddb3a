"""GPU check, profile stage: where one steady step's device time goes, per mode, at LLaDA-8B
full-depth shapes (issue 33).

For a baseline step, a Seer-cut step, a DyLLM sparse step and a threshold step (the decode rows of
``bench/gpu_end_to_end.py``: batch 16, prompt 256, window 256, block 32, bf16, ``graphs="cuda"``),
one ``generate`` call runs up to the chosen step (:data:`MODES`: a step that replays its graph
where the mode's keys repeat) and ``torch.profiler`` (CPU and CUDA activities) records exactly that
step, between two synchronisations; the call ends right after it. Per mode one row: the step's
wall time, the device's busy time (the union of its kernels' intervals) and idle share (the
host-bound fraction: time the device waited for the host), kernel launches, whether the step
replayed a graph, and the top kernels by device time. ``$OUT/gpu_profile.json`` holds every
figure, ``$OUT/gpu_profile.txt`` each step's ``key_averages`` table, ``$OUT/trace_dyllm.json`` the
DyLLM step's Chrome trace.

``dry_run``: the same calls at tiny shapes on the CPU (CPU activity only: ops stand in for kernels).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from bench.gpu_end_to_end import Row, _Stop, build, generate_kwargs, keep_lengths, setting
from seer_runtime.policy import Policy

#: mode -> (how its row differs from the baseline, the step profiled): LLaDA's forward keys repeat
#: inside a block (step 0 eager, 1 captured, 2 replayed); DyLLM's sparse steps start at 4 (4
#: eager, 5 captured, 6 replayed); every threshold step is a new block (a new key)
MODES = {
    "baseline": ({}, 2),
    "seer cut (pad to longest)": ({"cut": True}, 3),
    "dyllm sparse": ({"dyllm": "key"}, 6),
    "threshold": ({"threshold": True}, 2),
}
TOP_KERNELS = 6


class ProfileStep(Policy):
    """A policy that profiles exactly step ``step`` of a call and then ends the call."""

    name = "profile_step"

    def __init__(self, step: int, cuda: bool) -> None:
        self.step, self.cuda = step, cuda
        self.profiler = None
        self.counters_before = self.counters_after = None

    def _counters(self, state) -> dict:
        return dict(state.graph_counters.as_dict())

    def after_step(self, state, step: int, values) -> list:
        if step == self.step - 1:
            from torch.profiler import ProfilerActivity, profile

            if self.cuda:
                torch.cuda.synchronize()
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self.counters_before = self._counters(state)
            self.profiler = profile(activities=activities)
            self.profiler.start()
            self.started = time.perf_counter()
        elif step == self.step:
            if self.cuda:
                torch.cuda.synchronize()
            self.wall_s = time.perf_counter() - self.started
            self.profiler.stop()
            self.counters_after = self._counters(state)
            raise _Stop()
        return []


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(prof, *, wall_s: float, cuda: bool) -> dict:
    """Busy and idle time, launches and top kernels of one profiled step (times in ms)."""
    from torch.autograd import DeviceType

    events = list(prof.events())
    if cuda:
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    else:  # the CPU dry run: aten ops stand in for kernels
        kernels = [e for e in events if e.name.startswith("aten::") and not e.cpu_parent]
    intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
    busy_ms = _union(intervals) / 1e3
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append((e.time_range.end - e.time_range.start) / 1e3)
    total = sum(sum(v) for v in by_name.values()) or 1.0
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:TOP_KERNELS]
    wall_ms = 1e3 * wall_s
    return {
        "wall_ms": round(wall_ms, 3),
        "busy_ms": round(busy_ms, 3),
        "idle_fraction": round(max(0.0, 1 - busy_ms / wall_ms), 4) if wall_ms else None,
        "launches": len(kernels),
        "top": [{"kernel": name[:80], "ms": round(sum(t), 3), "share": round(sum(t) / total, 3), "calls": len(t)}
                for name, t in top],
    }


def run(*, dry_run: bool = False, deadline_s: float = 60.0, emit=None, out_dir: str | None = None) -> list[dict]:
    """One row per mode (module docstring), each printed as it comes; files under ``out_dir``."""
    from bench.common import row as make_row
    from seer_runtime import generate

    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError("the profile stage needs a CUDA device (or dry_run=True)")
    start = time.perf_counter()
    s = setting(dry_run)
    cuda = s.device == "cuda"
    emit = emit or (lambda r: None)
    model = build(s)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 200, (s.batch, s.prompt), generator=g).to(s.device)
    rows, summaries, tables = [], {}, []
    for mode, (changes, step) in MODES.items():
        left = deadline_s - (time.perf_counter() - start)
        check = f"profile: {mode} step {step} (LLaDA {model.num_layers} layers, batch {s.batch}, window {s.window})"
        if left < 5:
            r = make_row(check, None, f"not run: {left:.0f} s left before the stage deadline")
            rows.append(r)
            emit(r)
            continue
        row = Row(mode, "decode", s.batch, s.prompt, s.window, s.steps, s.block, prefix_cache=False,
                  **{k: v for k, v in changes.items()})
        keep = keep_lengths(row) if row.cut else None
        gen, kwargs = generate_kwargs(row, model, keep)
        probe = ProfileStep(step, cuda)
        kwargs["policies"] = [*kwargs["policies"], probe]
        try:
            with torch.no_grad():
                generate(model, ids, gen=gen, graphs="cuda" if cuda else None, **kwargs)
            r = make_row(check, None, f"the call ended before step {step}", ok=False)
        except _Stop:
            summary = summarize(probe.profiler, wall_s=probe.wall_s, cuda=cuda)
            before, after = probe.counters_before or {}, probe.counters_after or {}
            replayed = after.get("replays", 0) - before.get("replays", 0)
            summary["replayed_graphs"] = replayed
            summary["captures"] = after.get("captures", 0) - before.get("captures", 0)
            summaries[mode] = summary
            top = ", ".join(f"{t['kernel'][:40]} {t['share']:.0%}" for t in summary["top"][:3])
            note = (f"step {summary['wall_ms']:.2f} ms, device busy {summary['busy_ms']:.2f} ms, idle "
                    f"{summary['idle_fraction']:.0%} (host-bound), {summary['launches']} launches, "
                    f"{replayed} graph replays, {summary['captures']} captures; top: {top}")
            r = make_row(check, summary["wall_ms"], note)
            r["profile"] = summary
            sort = "device_time_total" if cuda else "cpu_time_total"
            try:
                tables.append(f"## {mode} (step {step})\n" + probe.profiler.key_averages().table(sort_by=sort,
                                                                                                  row_limit=25))
            except Exception as exc:  # noqa: BLE001 - the table is a convenience; the summary is the row
                tables.append(f"## {mode}: no table ({exc!r})")
            if out_dir and mode == "dyllm sparse" and cuda:
                probe.profiler.export_chrome_trace(os.path.join(out_dir, "trace_dyllm.json"))
        except Exception as exc:  # one mode failing must not hide the others'
            import traceback

            traceback.print_exc()
            r = make_row(check, None, f"crashed: {exc!r}"[:300], ok=False)
        rows.append(r)
        emit(r)
        if cuda:
            torch.cuda.empty_cache()
    if out_dir:
        Path(out_dir, "gpu_profile.json").write_text(json.dumps(summaries, indent=1))
        Path(out_dir, "gpu_profile.txt").write_text("\n\n".join(tables))
    return rows


def plan(s=None) -> list[dict]:
    """The profile stage's rows as the dry run plans them (the forwards up to the profiled step)."""
    from bench.gpu_end_to_end import LLADA_8B_DIMS, estimate

    s = s or setting(False)
    out = []
    for mode, (changes, step) in MODES.items():
        row = Row(mode, "decode", s.batch, s.prompt, s.window, s.steps, s.block, prefix_cache=False, **changes)
        est = estimate(row)
        per_forward = est["call_s"] / max(1, est["forwards"])
        out.append({"stage": "profile", "row": f"{mode} step {step}", "default": True,
                    "shape": f"LLaDA-8B {LLADA_8B_DIMS.layers} layers, batch {s.batch}, prompt {s.prompt}, "
                             f"window {s.window}",
                    "device_s": round(per_forward * (step + 1) + 1.0, 1),
                    "peak_gib": round(est["peak_bytes"] / 2**30, 2), "forwards": step + 1})
    return out
