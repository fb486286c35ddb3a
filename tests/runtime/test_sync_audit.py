"""GPU execution without host waits. The CUDA path of every mode and family, run on CPU
tensors with the kernels' references standing in for the kernels (``seer_kernels.emulate_device``)
under ``seer_runtime.sync_audit.SyncAudit``: no device->host read or blocking host->device copy
inside the layer loop after step 0; outside it at most one read per steady step (a step whose
active requests, window lengths and blocks are the previous step's) and no blocking copy."""

from __future__ import annotations

import warnings

import pytest

from seer_kernels import emulate_device, kernel_backend
from seer_runtime import Policy, generate
from seer_runtime.graphs import FakeGraphBackend
from seer_runtime.sync_audit import SyncAudit

from ..tiny_models import tiny
from .workloads import KINDS, batch, modes

pytestmark = [pytest.mark.engine]


class StepStates(Policy):
    """Per step that ran a forward: (the requests it decoded, their window lengths, each request's
    block) as they were during the step; None for a step without a forward."""

    def __init__(self):
        self.states, self._done = [], None

    def step_reads(self, state, step):
        done = self._done or [0] * state.batch_size
        ran = tuple(b for b, (now, before) in enumerate(zip(state.steps_done, done)) if now > before)
        self._done = list(state.steps_done)
        blocks = tuple(p.block_starts[step] if step < p.steps else None for p in state.plans)
        self.states.append((ran, tuple(state.window.lengths), blocks) if ran else None)
        return None


def audit(model, gen, kw):
    ids, mask, images = batch(model)
    states = StepStates()
    kw = dict(kw)
    if kw.get("graphs") == "fake":
        kw["graphs"] = FakeGraphBackend()
    kw["policies"] = [*kw.get("policies", []), states]
    with kernel_backend("reference"), emulate_device(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with SyncAudit(record_stacks=True) as a:
            generate(model, ids, attention_mask=mask, images=images, gen=gen, **kw)
    return a, states.states


def blocking(events):
    return [e for e in events if e.kind in ("read", "copy")]


def describe(events):
    lines = []
    for e in events[:6]:
        where = [line for line in (e.stack or "").splitlines() if "/seer_" in line or "/model_adapters/" in line]
        lines.append(f"{e.kind} {e.what} in {[n for n, _ in e.ranges]} at {where[-1].strip() if where else '?'}")
    return "\n".join(lines)


@pytest.mark.parametrize("kind", KINDS)
def test_no_host_waits_inside_steps(kind):
    model = tiny(kind)
    for name, (gen, kw) in modes(model).items():
        a, states = audit(model, gen, kw)
        events = blocking(a.events)
        in_layers = [e for e in events if e.inside("layers") and e.ordinal("step") != 0]
        assert not in_layers, f"{kind} {name}: host waits inside the layer loop\n{describe(in_layers)}"
        step0_layers = [e for e in events if e.inside("layers") and e.ordinal("step") == 0]
        assert len(step0_layers) <= 1, f"{kind} {name}: step 0 reads L* once\n{describe(step0_layers)}"
        for s in range(1, len(states)):
            if states[s] is not None and states[s] == states[s - 1]:  # a steady step
                mine = [e for e in events if e.ordinal("step") == s]
                reads = [e for e in mine if e.kind == "read"]
                copies = [e for e in mine if e.kind == "copy"]
                assert len(reads) <= 1 and not copies, (
                    f"{kind} {name}: step {s} waits {len(reads)} reads, {len(copies)} copies\n"
                    f"{describe(reads + copies)}")
