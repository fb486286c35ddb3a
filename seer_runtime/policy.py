"""The decoding-policy interface: named hooks the engine calls at fixed points of a ``generate``.

A policy is a plain object; :class:`DecodePolicy` is its base class, with every hook a no-op,
so a policy implements only the hooks it needs. The engine (``engine.DecodeRun``) calls each
hook on every policy in the order they were composed (``generation.compose_policies``):
Seer (it changes the windows the others read), the router (it runs the forwards), DyLLM (it
chooses a layer's rows), then any policy the caller adds. A policy reads and changes the run
through the run's public state (``run.window``, ``run.plans``, ``run.x``, ...) and never through
another policy.

A device hook of a forward that has a graph key may run once (recorded into a CUDA graph) and
then be replayed at later steps without its Python running: it must only issue device work on
tensors that stay where they are, and keep host bookkeeping for ``after_forward``. Such a
forward's logits may also be consumed inside the graph (the engine fuses the token choice into
it), so ``on_logits`` is not called for it: a policy whose ``on_logits`` changes the logits
returns None from :meth:`graph_key` for those forwards. A policy that overrides a device hook
or ``on_logits`` must say under which key its forwards replay (:meth:`graph_key`); otherwise
its forwards run eagerly.

The hooks, in the order a ``generate`` call reaches them::

    on_request(run)                        the batch is embedded, windows and plans are set
    for each step:
        execute_and_choose(run, rows, step, choice)
                                           with graphs and a choice of tokens the graph can hold
                                           (engine.StepChoice), the first policy that runs
                                           forwards may run them and the choice as one unit
        execute(run, rows, step)           the first policy returning logits runs the step's
                                           forward(s) (the router); None: the engine's padded one
        per forward (fwd: engine.Forward, its rows, step and inputs):
            plan_forward(run, fwd)         before the inputs are built (what the forward feeds)
            graph_key(run, fwd)            may this forward be replayed from a graph, and under
                                           which key (``step_graphs``)
            --- device hooks: recorded once into a graph, replayed without running again ---
            before_layers(run, fwd)        inputs built (fwd.hidden, fwd.layout, ...)
            per layer i:
                layer_taps(run, fwd, i, taps)   ask the layer for something (adapter.Taps)
                after_layer(run, fwd, i, taps)  the layer ran ("after the probe layer of step 0")
            after_layers(run, fwd)         the layer loop is done, before the LM head
            --- host hooks again ---
            on_logits(run, fwd, logits)    the window's logits; may return narrower ones
            after_forward(run, fwd)        the forward ran or replayed: host bookkeeping
        step_reads(run, step)              device values the host needs after this step
                                           (read together, once: ``run.step_values``)
        after_step(run, step)              the step's tokens are committed; True: steps remain
    report(run)                            a dict for ``stats.extra[policy.name]``, or None
    release(run)                           the call is over (also after an error): let go of
                                           graphs and caches
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # annotations only (the engine itself never imports the policies)
    from .adapter import Taps
    from .engine import DecodeRun, Forward, StepChoice


class DecodePolicy:
    """Base class of the policies: every hook does nothing (see the module docstring).

    name: the key of this policy's report in ``stats.extra``.
    packed_layouts: whether the policy works on the router's packed (varlen) layouts; when a
        composed policy does not, the router runs every group padded.
    """

    name: str = "policy"
    packed_layouts: bool = True

    def on_request(self, run: DecodeRun) -> None:
        """The batch is set up (prompts embedded, prefix cached, windows full, plans made)."""

    def execute(self, run: DecodeRun, rows: list[int], step: int) -> torch.Tensor | None:
        """Run the forward(s) of ``rows`` at ``step`` and return their window logits ``[R, W', V]``,
        or None to leave it to the next policy (and finally to the engine's padded forward)."""
        return None

    def execute_and_choose(self, run: DecodeRun, rows: list[int], step: int, choice: StepChoice) -> bool:
        """For a policy that runs forwards: run the forward(s) of ``rows`` at ``step`` with the
        step's token choice inside the same graph unit (``choice.choose`` on the window logits
        :meth:`execute` would return, its result to ``choice.commit`` after the unit ran or
        replayed); True when it did, False to leave the step to :meth:`execute` and the engine's
        sampling (nothing ran yet). Default: False."""
        return False

    @property
    def runs_forwards(self) -> bool:
        """Whether this policy overrides :meth:`execute` (runs a step's forwards itself)."""
        return type(self).execute is not DecodePolicy.execute

    def plan_forward(self, run: DecodeRun, fwd: Forward) -> None:
        """A forward of ``fwd.rows`` is about to be laid out (``fwd.feed_prompt`` may be cleared)."""

    def graph_key(self, run: DecodeRun, fwd: Forward) -> tuple | None:
        """This policy's part of the forward's graph key: a hashable tuple holding everything its
        device hooks decide on the host for this forward, or None when they cannot be replayed or
        its ``on_logits`` would change this forward's logits (the forward then runs eagerly).
        Default: ``()`` for a policy without device hooks or ``on_logits``, None for one that
        overrides any of them without overriding this."""
        overridden = [h for h in _REPLAYED_HOOKS if getattr(type(self), h) is not getattr(DecodePolicy, h)]
        return None if overridden else ()

    def before_layers(self, run: DecodeRun, fwd: Forward) -> None:
        """The forward's inputs are built; it may re-lay them (``fwd.hidden``, ``fwd.layout``)."""

    def layer_taps(self, run: DecodeRun, fwd: Forward, layer: int, taps: Taps) -> None:
        """Set requests on ``taps`` for ``layer`` of this forward."""

    def after_layer(self, run: DecodeRun, fwd: Forward, layer: int, taps: Taps) -> None:
        """``layer`` ran: ``fwd.hidden`` is its output, ``taps`` holds what was asked for."""

    def after_layers(self, run: DecodeRun, fwd: Forward) -> None:
        """Every layer ran; ``fwd.hidden`` is the final hidden state of the forward."""

    def on_logits(self, run: DecodeRun, fwd: Forward, logits: torch.Tensor) -> torch.Tensor:
        """The forward's window logits; return them, or a narrower slice after a cut."""
        return logits

    def after_forward(self, run: DecodeRun, fwd: Forward) -> None:
        """The forward ran, or was replayed from its graph (then its device hooks did not run):
        host bookkeeping such as statistics."""

    def step_reads(self, run: DecodeRun, step: int) -> dict[str, torch.Tensor] | None:
        """Integer or bool device tensors this policy needs on the host after ``step``, by name
        (unique across policies). The engine reads every policy's together in one transfer and
        leaves them in ``run.step_values[name]`` (flattened int lists) for :meth:`after_step`.
        Ask only on the steps that need it: a step nobody asks anything of reads nothing."""
        return None

    def after_step(self, run: DecodeRun, step: int) -> bool:
        """``step`` is committed; return True when this policy needs further steps."""
        return False

    def report(self, run: DecodeRun) -> dict | None:
        """What this policy measured, for ``stats.extra[self.name]`` (None: nothing)."""
        return None

    def release(self, run: DecodeRun) -> None:
        """The ``generate`` call is over (returned or raised): release what it held (captured
        graphs, caches), so that nothing of it waits for Python's cyclic collector."""


_REPLAYED_HOOKS = ("before_layers", "layer_taps", "after_layer", "after_layers", "on_logits")
