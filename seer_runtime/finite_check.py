"""The run-time check for NaN and inf (``GenerationConfig.check_finite``, on by default).

A NaN or inf in a hidden state (an fp16 overflow, a bad weight) would otherwise decode into a
silently wrong answer: argmax over NaN logits picks token 0. The check keeps everything on the
device, so no step waits for the host:

* after every layer of every forward, the sum of the layer's output is written into that
  layer's slot of a float32 buffer ``[num_layers]`` (one reduction per layer), and after the
  layer loop the forward's sums are added into the running sums ``[num_layers + 1]`` (one add
  per forward; the last slot: the logits, added per forward); a NaN or inf anywhere makes the
  slot's running sum non-finite for good (inside captured graphs too: the buffers' addresses
  never change);
* after every step (outside any graph), the running sums are copied into that step's row of a
  history buffer (one copy: a non-finite sum stays non-finite, so the first bad row is the
  first bad step and its non-finite slots say where);
* :meth:`FiniteCheck.raise_if_found` reads which rows hold a non-finite value once, at the end of
  ``generate``, and raises :class:`NonFiniteError` naming the step and the first layer whose
  output held the fault.

A finite sum of finite float32 values can only overflow past 3.4e38, which hidden states do not
reach; a position the attention masks out entirely would give NaN there, but every query of our
layouts attends to at least its own (live) key.
"""

from __future__ import annotations

import torch


class NonFiniteError(FloatingPointError):
    """NaN or inf in a hidden state or the logits during ``generate``. ``step`` and ``layer``
    (None: the logits) say where it appeared first; ``output`` is the GenerationOutput decoded
    (its tokens after the fault are not to be trusted), so nothing is lost."""

    def __init__(self, message: str, *, step: int, layer: int | None, output=None) -> None:
        super().__init__(message)
        self.step, self.layer, self.output = step, layer, output


class FiniteCheck:
    """Device-side NaN/inf watch over ``num_layers`` layer outputs and the logits (module docstring)."""

    def __init__(self, num_layers: int, device: torch.device, *, capacity: int = 64) -> None:
        self.num_layers = num_layers
        self.sums = torch.zeros(num_layers + 1, dtype=torch.float32, device=device)
        self._slots = self.sums.unbind(0)  # one view per slot, made once (fixed addresses)
        self._layer_sums = torch.zeros(num_layers, dtype=torch.float32, device=device)  # this forward's
        self._layer_slots = self._layer_sums.unbind(0)
        self._running_layers = self.sums[:num_layers]
        self.history = torch.empty(capacity, num_layers + 1, dtype=torch.float32, device=device)
        self._history_rows = self.history.unbind(0)  # one view per row, made once per allocation
        self.steps: list[int] = []  # the step number of each history row

    def layer(self, layer: int, hidden: torch.Tensor) -> None:
        """Layer ``layer``'s output (any shape): its sum, into this forward's slot."""
        torch.sum(hidden, dim=None, dtype=torch.float32, out=self._layer_slots[layer])

    def end_layers(self) -> None:
        """After a forward's layer loop (every layer written): its sums join the running sums."""
        self._running_layers.add_(self._layer_sums)

    def logits(self, logits: torch.Tensor) -> None:
        self._slots[self.num_layers].add_(logits.sum(dtype=torch.float32))

    def end_step(self, step: int) -> None:
        """After step ``step``: its running sums join the history (the buffer doubles when full)."""
        row = len(self.steps)
        if row == self.history.shape[0]:
            grown = self.history.new_empty(2 * row, self.history.shape[1])
            grown[:row].copy_(self.history)
            self.history = grown
            self._history_rows = grown.unbind(0)
        self._history_rows[row].copy_(self.sums)
        self.steps.append(step)

    def raise_if_found(self, output=None) -> None:
        """The one read per generate call: raises :class:`NonFiniteError` if a fault was seen."""
        if not self.steps:
            return
        bad = ~torch.isfinite(self.history[: len(self.steps)])  # [rows, slots]
        bad_rows = bad.any(dim=1)
        first = bad_rows.to(torch.int8).argmax().reshape(1)  # the first bad row (0 when none)
        values = torch.cat([bad_rows.any().reshape(1), first, bad.index_select(0, first)[0]]).tolist()  # one read
        if not values[0]:
            return
        step = self.steps[int(values[1])]
        slot = next(i for i, is_bad in enumerate(values[2:]) if is_bad)
        layer = None if slot == self.num_layers else slot
        where = "the logits (LM head)" if layer is None else f"the output of layer {layer}"
        raise NonFiniteError(
            f"generate: NaN or inf first appeared at step {step} in {where} (of {self.num_layers} layers); the "
            "answers decoded after it are not to be trusted (the decoded output is attached as .output). Causes: "
            "a weight that is NaN/inf (load_model(..., check_finite=True) names it), or an fp16 overflow (fp16 "
            "ends at 65504: run in bfloat16 or float32). GenerationConfig(check_finite=False) turns this check "
            "off.", step=step, layer=layer, output=output)
