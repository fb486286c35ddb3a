"""The requests of one ``generate`` call (:class:`BatchState`), and what the call returns.

:class:`BatchState` is the only holder of per-request state: the prompts (ids, embeddings, mask,
positions, the prompt's KV cache), the token windows, their lengths and masks left
(:class:`~seer_runtime.window.WindowState`), each request's step plan, its random source, its
counters and the call's statistics (:class:`GenerationStats`). The scheduler, the model runner,
the commit rules and the policies are handed it; none keeps a copy of what it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .adapter import PrefixKV
from .config import GenerationConfig
from .plans import DecodingRules, StepPlan
from .sampling import RandomSource
from .window import WindowState


@dataclass
class GenerationStats:
    """Counts and timings of one ``generate`` call.

    nfe: forward passes of the model (a CFG pair counts once; the prefill counts once).
    positions_computed: positions a layer computed, summed over the layers and the forward passes
        (positions x layers), padding included: what the hardware paid for. A DyLLM sparse layer
        counts the rows it recomputes, not the rows it reuses.
    positions_computed_dense: the same forwards with every layer computing every position it was
        given (what they would cost without DyLLM's row selection; equal without DyLLM).
    positions_computed_per_request: ``positions_computed`` per request, its own real positions only.
    steps: denoising steps each request went through.
    steps_saved: per request, the steps of its plan left when ``GenerationConfig.early_stop``
        ended it (0: not ended early). Threshold decoding plans one step at a time: there it is
        the blocks still holding masks (a lower bound, each needs at least one step).
    time_s: wall time per phase (embed, prefill, forward, sample, total); on CUDA these are
        host times (no synchronisation is added for them).
    extra: the policies' and layouts' reports (``seer``, ``dyllm``, ``router``, ``block_cache``,
        ``graphs``).
    """

    nfe: int = 0
    positions_computed: int = 0
    positions_computed_dense: int = 0
    positions_computed_per_request: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    steps_saved: list[int] = field(default_factory=list)
    time_s: dict[str, float] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def add_time(self, phase: str, seconds: float) -> None:
        self.time_s[phase] = self.time_s.get(phase, 0.0) + seconds

    @property
    def engine_overhead_s(self) -> float:
        """Time of the call outside model forwards and prefill (sampling, bookkeeping)."""
        model = self.time_s.get("forward", 0.0) + self.time_s.get("prefill", 0.0) + self.time_s.get("embed", 0.0)
        return self.time_s.get("total", 0.0) - model


@dataclass
class GenerationOutput:
    """sequences: ``[B, L + gen_length]`` = the prompt ids as given (left padding, image
    placeholders) followed by the response window, the layout LLaDA's generate.py returns.
    responses: ``[B, gen_length]`` the window. end_positions: ``[B]`` index in the window of the
    first EOS or end-of-turn token, -1 when there is none.
    """

    sequences: torch.Tensor
    responses: torch.Tensor
    end_positions: torch.Tensor
    stats: GenerationStats
    end_ids: tuple[int, ...] = ()

    def answer_ids(self, i: int) -> list[int]:
        """Request ``i``'s answer: the window up to (not including) its first EOS / end-of-turn."""
        end = int(self.end_positions[i])
        row = self.responses[i].tolist()
        return row if end < 0 else row[:end]


def is_end_token(window: torch.Tensor, end_ids: tuple[int, ...]) -> torch.Tensor:
    """bool, ``window``'s shape: the entry is one of ``end_ids`` (EOS, end-of-turn)."""
    is_end = torch.zeros_like(window, dtype=torch.bool)
    for t in end_ids:
        is_end |= window == t
    return is_end


def first_true(hits: torch.Tensor) -> torch.Tensor:
    """Per row of bool ``hits [R, W]``, the first True position, or ``W`` when there is none:
    int64 ``[R]`` on the device (no read)."""
    positions = torch.arange(hits.shape[1], device=hits.device)
    return torch.where(hits, positions, hits.shape[1]).amin(dim=1)


def first_end_positions(window: torch.Tensor, end_ids: tuple[int, ...]) -> torch.Tensor:
    """Index of the first token in ``end_ids`` per row of ``window [B, W]``, -1 when absent."""
    first = first_true(is_end_token(window, end_ids))
    return torch.where(first == window.shape[1], torch.full_like(first, -1), first)


def read_to_host(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Integer (or bool) device tensors as host int lists, in one read: flattened, concatenated
    and copied once (on CUDA through pinned memory, the only wait being the stream reaching it)."""
    parts = [t if t.dim() == 1 and t.dtype == torch.int64 else t.reshape(-1).to(torch.int64) for t in tensors]
    flat = parts[0] if len(parts) == 1 else torch.cat(parts)
    if flat.is_cuda:
        host = torch.empty(flat.shape, dtype=torch.int64, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        torch.cuda.current_stream(flat.device).synchronize()
        values = host.tolist()
    else:
        values = flat.tolist()
    out, start = [], 0
    for t in tensors:
        out.append(values[start: start + t.numel()])
        start += t.numel()
    return out


class BatchState:
    """The requests of one ``generate`` call (module docstring).

    Set here: ``gen``, ``rules``, ``token_ids``, ``batch_size``, ``width`` (``gen_length``),
    ``prefix_cache``, ``input_ids``, ``prompt_embeds`` ``[B, Lp, D]``, ``prompt_mask`` (bool
    ``[B, Lp]`` or None), ``prompt_len`` (padded prompt positions, image features included),
    ``prompt_lengths`` (each request's real ones), ``positions`` ``[B, Lp + width]``, ``tokens``
    (the windows' ids ``[B, width]``), ``steps_done``, ``steps_saved`` (early stop's, per request),
    ``ended`` (the requests early stop ended), ``positions_per_request``, ``rand``, ``stats``. Set
    by the model runner's prefill: ``prefix`` (the prompt's KV cache) and ``first_masked`` (1 when
    the prefill commits window position 0: LaViDa-Dream); then :meth:`open_windows` makes
    ``window``; the scheduler makes ``plans``. ``graph_counters``: the call's graph counters
    (``graphs.GraphCounters``, live; what a measuring policy reads).
    """

    def __init__(self, model, input_ids: torch.Tensor, gen: GenerationConfig, *,
                 request_seeds: Sequence[int] | None = None) -> None:
        self.gen = gen
        self.rules = DecodingRules.of(model)
        self.token_ids = model.token_ids
        self.device = input_ids.device
        self.input_ids = input_ids
        self.batch_size = input_ids.shape[0]
        self.width = gen.gen_length
        self.prefix_cache = gen.prefix_cache if gen.prefix_cache is not None else bool(model.is_multimodal)
        self.stats = GenerationStats()
        self.rand = self._random_source(gen, request_seeds)
        self.tokens = torch.full((self.batch_size, self.width), self.token_ids.mask, dtype=torch.long,
                                 device=self.device)
        self.positions_per_request = [0] * self.batch_size
        self.steps_done = [0] * self.batch_size
        self.steps_saved = [0] * self.batch_size
        self.ended: set[int] = set()
        self.prefix: PrefixKV | None = None
        self.first_masked = 0
        self.window: WindowState | None = None
        self.plans: list[StepPlan] = []
        self._device_tensors: dict[tuple, torch.Tensor] = {}
        self._prefix_rows: tuple[tuple, PrefixKV] | None = None
        self.graph_counters = None

    def _random_source(self, gen: GenerationConfig, request_seeds: Sequence[int] | None) -> RandomSource:
        if gen.rng == "per_request":  # one generator per request, on the batch's device (no host round trip)
            base = 0 if gen.seed is None else gen.seed
            seeds = request_seeds if request_seeds is not None else [base + b for b in range(self.batch_size)]
            return RandomSource("per_request", [torch.Generator(device=self.device).manual_seed(int(s))
                                                for s in seeds])
        if gen.seed is not None:
            torch.manual_seed(gen.seed)
        return RandomSource("global")

    def set_prompt(self, embeds: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor) -> None:
        """The embedded prompt ``[B, Lp, D]``, its mask and the positions of prompt and window."""
        self.prompt_embeds = embeds
        self.prompt_len = embeds.shape[1]
        self.prompt_mask = None if mask is None else mask.bool()
        self.positions = positions
        self.prompt_lengths = (self.prompt_mask.sum(1) if self.prompt_mask is not None
                               else torch.full((self.batch_size,), self.prompt_len, device=self.device)).tolist()

    def full_mask(self) -> torch.Tensor | None:
        """int64 ``[B, Lp + width]``: the prompt's mask then the window (None: nothing padded)."""
        if self.prompt_mask is None:
            return None
        return torch.cat([self.prompt_mask.long(), torch.ones(self.batch_size, self.width, dtype=torch.long,
                                                              device=self.device)], dim=1)

    def open_windows(self) -> None:
        """Every request's window at full width (after the prefill set ``first_masked``)."""
        self.window = WindowState(self.batch_size, self.width, self.device, block=self.gen.block,
                                  first_masked=self.first_masked)

    # -- device tensors made once ----------------------------------------------------------------
    def upload(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """Host values as a device tensor through pinned memory: a copy the host does not wait for."""
        host = torch.tensor(values, dtype=dtype, pin_memory=self.device.type == "cuda")
        return host.to(self.device, non_blocking=True)

    def device_tensor(self, values: list[int], dtype: torch.dtype = torch.long) -> torch.Tensor:
        """Host ints as a device tensor, uploaded once per distinct value list (index lists, block
        ends) and reused by every step that needs the same one."""
        key = (dtype, *values)
        t = self._device_tensors.get(key)
        if t is None:
            if len(self._device_tensors) >= 256:  # the lists change rarely; keep the table small
                self._device_tensors.clear()
            t = self._device_tensors[key] = self.upload(values, dtype)
        return t

    def row_index(self, rows: list[int]) -> torch.Tensor:
        """``rows`` as an int64 device tensor, built once per distinct set of rows."""
        return self.device_tensor(rows)

    # -- views of the state ------------------------------------------------------------------------
    def masked(self, rows: list[int], width: int) -> torch.Tensor:
        """bool ``[R, width]``: still masked and inside the request's window."""
        index = self.row_index(rows)
        return (self.tokens[index, :width] == self.token_ids.mask) & self.window.live_mask(index, width)

    def prompt_keys(self, mask: torch.Tensor | None, rows: int) -> torch.Tensor:
        """bool ``[rows, Lp]``: ``mask``, or every prompt position a real key when it is None."""
        return mask if mask is not None else torch.ones(rows, self.prompt_len, dtype=torch.bool, device=self.device)

    def reference_layout(self, rows: list[int], width: int) -> tuple[int, int | None]:
        """(pad, full_len) of the reference's per-row vectors, valid while every row is decoded."""
        pad = 0 if self.prefix_cache else self.prompt_len
        if len(rows) != self.batch_size or width != self.width:
            return pad, None
        return pad, pad + self.width

    def prefix_rows(self, rows: list[int]) -> PrefixKV:
        """The prompt cache of ``rows``: the whole cache for every request, else a copy of their
        rows, made once per distinct set of rows (the previous copy is let go first: one at a time)."""
        if len(rows) == self.batch_size:
            return self.prefix
        key = tuple(rows)
        if self._prefix_rows is None or self._prefix_rows[0] != key:
            self._prefix_rows = None
            real = sum(self.prompt_lengths[r] for r in rows)
            self._prefix_rows = (key, self.prefix.select(self.row_index(rows), real_tokens=real))
        return self._prefix_rows[1]

    def release(self) -> None:
        """Let go of the prompt cache copies and device tables (the call is over)."""
        self._prefix_rows = None
        self._device_tensors.clear()
