"""Policies: what Seer, DyLLM or a caller's own object changes in a ``generate`` call, and where.

A policy hooks only where it needs to, and says what it composes with as class attributes,
checked once when the call is composed (``generation.compose``):

``packed_layouts``  works on the router's packed (varlen) layouts (else every group runs padded)
``block_caches``    composes with a block cache (``GenerationConfig.block_cache``)
``guidance``        composes with classifier-free guidance (``cfg_scale > 0``)
``cuts_at_step0``   may cut the windows during step 0 (the router lays step 0 out padded)
``replayable``      its forwards may replay from graphs without its Python running (the default
                    :meth:`Policy.plan`); a policy that reads every forward's logits is not

The hooks, in the order a ``generate`` call reaches them::

    start(state, model)              the prompts are embedded, windows and plans set; may cut them
    for each step, per forward (fwd: runner.Forward, its rows, step and what it feeds):
        plan(state, fwd)             before the forward is laid out: what it feeds
                                     (fwd.feed_prompt), and this policy's part of its graph key
                                     (None: the forward runs eagerly)
        layers(state, fwd)           a LayerHook for the forward's layer loop, or None:
            hook.before(fwd)             inputs laid out (fwd.hidden, fwd.layout, ...)
            hook.taps(i, taps)           ask layer i for something (adapter.Taps)
            hook.after(i, fwd, taps)     layer i ran; may return a window Cut (Seer's probe)
            hook.end(fwd)                the layer loop is done, before the LM head
        on_logits(state, fwd, logits) an eager forward's window logits; may return a Cut
        after_forward(state, fwd)    the forward ran or replayed: host bookkeeping
    step_reads(state, step)          device values the host needs after the step (one read)
    after_step(state, step, values)  the step is committed: window changes (Extend, Redecode)
    report(state)                    a dict for ``stats.extra``, or None
    saved_positions(state)           positions charged but not computed (DyLLM's reused rows)
    release()                        the call is over (also after an error)

The layer hooks are device work: a forward with a graph key runs them once (recorded into a
graph) and later replays without them; host bookkeeping belongs in ``after_forward``. A policy
sees the batch state and the forward it is handed, never the scheduler or the runner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # annotations only
    from .adapter import Taps
    from .batch import BatchState
    from .runner import Cut, Forward
    from .window import Extend, Redecode


class LayerHook:
    """What a policy does inside one forward's layer loop (see the module docstring); every
    method does nothing here."""

    def before(self, fwd: Forward) -> None:
        """The forward's inputs are laid out; it may re-lay them (``fwd.hidden``, ``fwd.layout``)."""

    def taps(self, layer: int, taps: Taps) -> None:
        """Set requests on ``taps`` for ``layer``."""

    def after(self, layer: int, fwd: Forward, taps: Taps) -> Cut | None:
        """``layer`` ran: ``fwd.hidden`` is its output, ``taps`` holds what was asked for."""
        return None

    def end(self, fwd: Forward) -> None:
        """Every layer ran; ``fwd.hidden`` is the forward's final hidden state."""


class Policy:
    """Base class of the policies: every hook does nothing (see the module docstring).

    name: the key of this policy's report in ``stats.extra``.
    """

    name: str = "policy"
    packed_layouts: bool = True
    block_caches: bool = True
    guidance: bool = True
    cuts_at_step0: bool = False
    replayable: bool = True

    def start(self, state: BatchState, model) -> Cut | None:
        """The batch is set up (prompts embedded, prefix cached, windows full, plans made); a Cut
        returned here cuts the windows before step 0."""
        return None

    def plan(self, state: BatchState, fwd: Forward) -> tuple | None:
        """This policy's part of ``fwd``'s graph key: a hashable tuple holding everything its layer
        hooks decide on the host for this forward, or None when it cannot be replayed (its hooks or
        its ``on_logits`` must run). Default: ``()`` when :attr:`replayable`, else None."""
        return () if self.replayable else None

    def layers(self, state: BatchState, fwd: Forward) -> LayerHook | None:
        """The hook of ``fwd``'s layer loop, or None (nothing to do in it)."""
        return None

    def on_logits(self, state: BatchState, fwd: Forward, logits: torch.Tensor) -> Cut | None:
        """An eagerly run forward's window logits ``[R, W, V]``: a Cut of the windows, or None."""
        return None

    def after_forward(self, state: BatchState, fwd: Forward) -> None:
        """The forward ran, or was replayed from its graph: host bookkeeping such as statistics."""

    def step_reads(self, state: BatchState, step: int) -> dict[str, torch.Tensor] | None:
        """Integer or bool device tensors this policy needs on the host after ``step``, by name
        (unique across policies), read with everything else the step reads in one transfer and
        handed to :meth:`after_step` (flattened int lists). Ask only on the steps that need it."""
        return None

    def after_step(self, state: BatchState, step: int, values: dict[str, list[int]]) -> list[Extend | Redecode]:
        """``step`` is committed; the window changes this policy asks for (the scheduler applies them)."""
        return []

    def report(self, state: BatchState) -> dict | None:
        """What this policy measured, for ``stats.extra`` (None: nothing)."""
        return None

    def saved_positions(self, state: BatchState) -> tuple[int, list[int]] | None:
        """Positions (x layers) the runner charged that this policy's layer hooks did not compute
        (DyLLM's reused rows): the total and per request; None: none."""
        return None

    def release(self) -> None:
        """The ``generate`` call is over (returned or raised): let go of what it held."""
