"""Host side of :func:`~seer_kernels.slice_repack`: the routing rule, the control word, the buffers.

Nothing here launches a kernel or imports Triton. The router (``seer_runtime/router.py``) calls
:func:`slice_repack_decision`, the one host implementation of the padding-waste routing rule,
and may hand its result to ``slice_repack(..., route=...)`` so that the kernel writes that
layout instead of deciding again. The kernel evaluates the same rule on the device when no
route is given.

The rule, for a group of ``G`` rows with lengths ``L*``:

* ``T = sum L*``, ``Lmax = max L*``. ``T == 0`` -> ``EMPTY``.
* ``B_G`` = the smallest micro-bucket ``>= Lmax``; none -> ``EAGER``.
* ``G == 1`` or ``B_G <= eager_max_bucket`` -> ``EAGER``.
* ``PWR = 1 - T / (G * B_G)``, evaluated in IEEE float64 exactly as written; ``PWR <= tau_pad``
  and some batch bucket ``>= G`` -> ``STATIC`` with key (smallest batch bucket ``>= G``, ``B_G``).
* otherwise ``VARLEN`` with ``P`` = the smallest packed bucket ``>= T``; none -> ``EAGER``.

``EAGER`` uses the packed layout with no padding beyond ``T``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

# path codes (the control word's first entry)
PATH_ERROR = -1  # an input was out of range or a buffer too small: nothing but the control word was written
PATH_EMPTY = 0
PATH_STATIC = 1
PATH_VARLEN = 2
PATH_EAGER = 3
PATH_NAMES = {
    PATH_ERROR: "ERROR",
    PATH_EMPTY: "EMPTY",
    PATH_STATIC: "STATIC",
    PATH_VARLEN: "VARLEN",
    PATH_EAGER: "EAGER",
}

# control word layout: int32 [CONTROL_SIZE]
CTRL_PATH = 0  # one of the PATH_* codes
CTRL_BUCKET = 1  # B_G for STATIC, P for VARLEN, T for EAGER, 0 for EMPTY and ERROR
CTRL_TOTAL = 2  # T = sum of the group's L*
CTRL_MAX_LEN = 3  # Lmax
CTRL_ERROR = 4  # bit flags, ERR_*; 0 when all is well
CTRL_BATCH = 5  # rows of the chosen layout: the batch bucket for STATIC, G otherwise (0 for ERROR)
CONTROL_SIZE = 6

ERR_KEEP_LEN = 1  # some keep_len of the group outside [0, N]
ERR_ROW_IDS = 2  # some row_ids outside [0, B)
ERR_CAPACITY = 4  # the chosen layout does not fit the output buffers
ERR_ROUTE = 8  # a forced route (slice_repack(route=...)) does not hold the group (see route_problem)

MAX_GROUP = 1024  # rows of one slice_repack group (the kernel holds the group in one tile)


class ControlValues(NamedTuple):
    """The control word as host ints (see the ``CTRL_*`` indices).

    ``path`` a ``PATH_*`` code; ``bucket`` ``B_G`` (STATIC), ``P`` (VARLEN), ``T`` (EAGER), 0
    (EMPTY, ERROR); ``total`` ``T``; ``max_len`` ``Lmax``; ``error`` ``ERR_*`` bits; ``batch_rows``
    the batch bucket (STATIC), 0 (ERROR), else ``G``.
    """

    path: int
    bucket: int
    total: int
    max_len: int
    error: int
    batch_rows: int


def decode_control(word: torch.Tensor | Sequence[int]) -> ControlValues:
    """Turn a control word (a CPU tensor or a sequence of ``CONTROL_SIZE`` ints) into :class:`ControlValues`.

    Reading a CUDA tensor here synchronises; poll through :class:`ControlWord` instead.
    """
    values = word.tolist() if isinstance(word, torch.Tensor) else list(word)
    if len(values) != CONTROL_SIZE:
        raise ValueError(f"a control word holds {CONTROL_SIZE} ints, got {len(values)}")
    return ControlValues(*(int(x) for x in values))


def describe_control_error(error: int) -> str:
    """Human-readable text for the ``error`` bit flags of a control word."""
    parts = []
    if error & ERR_KEEP_LEN:
        parts.append("some keep_len of the group is outside [0, N]")
    if error & ERR_ROW_IDS:
        parts.append("some row_ids entry is outside [0, B)")
    if error & ERR_CAPACITY:
        parts.append(
            "the chosen layout does not fit the output buffers (out= too small for the bucket tables)"
        )
    if error & ERR_ROUTE:
        parts.append(
            "the forced route does not hold the group (its T or Lmax differ from the group's, "
            "or its bucket or batch rows are not a layout that holds them)"
        )
    return "; ".join(parts) or "no error"


def _host_ints(name: str, values: object) -> list[int]:
    if isinstance(values, (str, bytes, torch.Tensor)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of host ints, got {type(values).__name__}")
    out = []
    for x in values:
        if isinstance(x, bool):
            raise TypeError(f"{name} must hold ints, got {values!r}")
        try:
            out.append(operator.index(x))
        except TypeError:
            raise TypeError(f"{name} must hold ints, got {values!r}") from None
    return out


def _bucket_table(name: str, table: object) -> list[int]:
    entries = _host_ints(name, table)
    if any(x <= 0 for x in entries):
        raise ValueError(f"{name} entries must be positive, got {entries}")
    if any(a >= b for a, b in zip(entries[:-1], entries[1:])):
        raise ValueError(f"{name} must be sorted strictly ascending, got {entries}")
    return entries


def _smallest_at_least(table: Sequence[int], threshold: int) -> int | None:
    return min((x for x in table if x >= threshold), default=None)


def slice_repack_decision(
    keep_len: Sequence[int],
    *,
    micro_buckets: Sequence[int],
    packed_buckets: Sequence[int],
    batch_buckets: Sequence[int],
    tau_pad: float = 0.2,
    eager_max_bucket: int = 4,
) -> ControlValues:
    """The padding-waste routing rule (module docstring) for one group, on the host.

    Args:
        keep_len: the group's lengths ``L*``, host ints ``>= 0`` (any number of rows; the
            kernel takes at most :data:`MAX_GROUP`).
        micro_buckets, packed_buckets, batch_buckets: the router's tables, host ints ``> 0``
            sorted strictly ascending (possibly empty).
        tau_pad: the PWR threshold (finite); eager_max_bucket: int ``>= 0``.

    Returns:
        The :class:`ControlValues` that ``slice_repack`` writes for this group when its buffers
        hold the layout (``error = 0``); buffer capacity is not part of the rule.

    Raises ``TypeError``/``ValueError`` naming the argument for anything else.
    """
    lengths = _host_ints("keep_len", keep_len)
    if any(n < 0 for n in lengths):
        raise ValueError(f"keep_len must be >= 0, got {lengths}")
    tables = [_bucket_table(name, t) for name, t in (
        ("micro_buckets", micro_buckets), ("packed_buckets", packed_buckets), ("batch_buckets", batch_buckets)
    )]
    if isinstance(tau_pad, bool) or not isinstance(tau_pad, (int, float)) or not math.isfinite(tau_pad):
        raise TypeError(f"tau_pad must be a finite float, got {tau_pad!r}")
    if not 0 <= tau_pad <= 1:  # a padding-waste ratio lies in [0, 1]
        raise ValueError(f"tau_pad must lie in [0, 1], got {tau_pad!r}")
    if isinstance(eager_max_bucket, bool) or not isinstance(eager_max_bucket, int) or eager_max_bucket < 0:
        raise ValueError(f"eager_max_bucket must be an int >= 0, got {eager_max_bucket!r}")
    return _decide(lengths, *tables, tau_pad, eager_max_bucket)


def _decide(
    lengths: list[int], micro: Sequence[int], packed: Sequence[int], batch: Sequence[int], tau_pad, eager_max_bucket
) -> ControlValues:
    """The rule on checked host values (shared with the torch reference, which reads device tables)."""
    group = len(lengths)
    total = sum(lengths)
    max_len = max(lengths, default=0)
    eager = ControlValues(PATH_EAGER, total, total, max_len, 0, group)
    if total == 0:
        return ControlValues(PATH_EMPTY, 0, 0, max_len, 0, group)
    b_g = _smallest_at_least(micro, max_len)
    if b_g is None or group == 1 or b_g <= eager_max_bucket:
        return eager
    pwr = 1.0 - total / (group * b_g)
    batch_rows = _smallest_at_least(batch, group)
    if pwr <= tau_pad and batch_rows is not None:
        return ControlValues(PATH_STATIC, b_g, total, max_len, 0, batch_rows)
    p = _smallest_at_least(packed, total)
    if p is not None:
        return ControlValues(PATH_VARLEN, p, total, max_len, 0, group)
    return eager


def route_problem(
    path: int,
    bucket: int,
    batch_rows: int,
    *,
    group: int,
    total: int,
    max_len: int,
    micro_buckets: Sequence[int] | None,
    packed_buckets: Sequence[int] | None,
    batch_buckets: Sequence[int] | None,
) -> str | None:
    """Why the layout ``(path, bucket, batch_rows)`` cannot hold a group of ``group`` rows with
    ``T = total`` and ``Lmax = max_len``, or None when it can. A table given as None is not checked.

    Valid layouts: ``EMPTY`` ``(0, G)`` when ``T == 0``; ``STATIC`` ``(B_G, batch)`` with ``B_G`` a
    micro-bucket ``>= Lmax`` and ``batch`` a batch bucket ``>= G``; ``VARLEN`` ``(P, G)`` with
    ``P`` a packed bucket ``>= T``; ``EAGER`` ``(T, G)``. The kernel checks the same on the device.
    """
    if path == PATH_EMPTY:
        if total != 0 or bucket != 0 or batch_rows != group:
            return f"EMPTY needs T = 0, bucket 0 and batch_rows = G = {group}"
    elif path == PATH_STATIC:
        if bucket < max_len:
            return f"the STATIC bucket B_G = {bucket} is below Lmax = {max_len}"
        if micro_buckets is not None and bucket not in micro_buckets:
            return f"the STATIC bucket B_G = {bucket} is not in micro_buckets {list(micro_buckets)}"
        if batch_rows < group:
            return f"the STATIC batch_rows = {batch_rows} are fewer than the group's G = {group} rows"
        if batch_buckets is not None and batch_rows not in batch_buckets:
            return f"the STATIC batch_rows = {batch_rows} is not in batch_buckets {list(batch_buckets)}"
    elif path == PATH_VARLEN:
        if bucket < total:
            return f"the VARLEN bucket P = {bucket} is below T = {total}"
        if packed_buckets is not None and bucket not in packed_buckets:
            return f"the VARLEN bucket P = {bucket} is not in packed_buckets {list(packed_buckets)}"
        if batch_rows != group:
            return f"VARLEN needs batch_rows = G = {group}, got {batch_rows}"
    elif path == PATH_EAGER:
        if bucket != total:
            return f"the EAGER bucket must be T = {total}, got {bucket}"
        if batch_rows != group:
            return f"EAGER needs batch_rows = G = {group}, got {batch_rows}"
    else:
        return f"path must be one of PATH_EMPTY/STATIC/VARLEN/EAGER (0..3), got {path}"
    return None


class ControlWord:
    """Host handle on the control word of one :func:`slice_repack` call.

    ``ready()`` never blocks (``torch.cuda.Event.query``). ``read()`` waits on this call's event
    only (not the whole device) and returns :class:`ControlValues`; it raises ``ValueError`` when
    the kernel flagged an error, unless ``raise_on_error=False``. With a pinned ``control_host``
    the copy was enqueued right after the kernel, so ``read()`` costs no extra transfer; without
    one, ``read()`` does a blocking device-to-host copy. On CPU the handle is ready at once.
    """

    def __init__(self, device_word: torch.Tensor, host_word: torch.Tensor | None, event) -> None:
        self.device_word = device_word
        self.host_word = host_word
        self._event = event

    def ready(self) -> bool:
        return True if self._event is None else bool(self._event.query())

    def read(self, *, raise_on_error: bool = True) -> ControlValues:
        if self._event is not None:
            self._event.synchronize()
        source = self.host_word if self.host_word is not None else self.device_word
        values = decode_control(source.cpu() if source.device.type != "cpu" else source)
        if raise_on_error and values.error:
            raise ValueError(
                f"slice_repack flagged an error (code {values.error}): {describe_control_error(values.error)}"
            )
        return values


@dataclass(frozen=True)
class SliceRepackOutput:
    """Fixed-capacity buffers written by :func:`slice_repack` (also its ``out=`` argument).

    Padded layout (written for ``STATIC`` only, region ``[:batch_rows, :B_G]``):
        padded_values ``[batch_cap, bucket_cap]`` (token ids) or ``[batch_cap, bucket_cap, D]``,
        padded_positions int64, padded_mask bool (True = real token), padded_src_index int64
        (``b * N + n`` of the source slot, -1 for padding), all ``[batch_cap, bucket_cap]``.
    Packed layout (written for ``VARLEN`` over ``[:P]`` and ``EAGER`` over ``[:T]``):
        packed_values ``[packed_cap]`` or ``[packed_cap, D]``, packed_positions int64,
        packed_seq_index int32 (group row of each token, -1 in padding), packed_src_index int64.
    cu_seqlens: int32 ``[cu_len]``, ``cu_len >= G + 1``: exclusive prefix sum of the group's
        lengths, the last value repeated over the extra entries (zero-length padding rows).
    control: int32 ``[CONTROL_SIZE]`` on the device (see ``CTRL_*``).
    handle: the :class:`ControlWord` of the call that produced this output (None for bare buffers).
    """

    control: torch.Tensor
    padded_values: torch.Tensor
    padded_positions: torch.Tensor
    padded_mask: torch.Tensor
    padded_src_index: torch.Tensor
    packed_values: torch.Tensor
    packed_positions: torch.Tensor
    packed_seq_index: torch.Tensor
    packed_src_index: torch.Tensor
    cu_seqlens: torch.Tensor
    handle: ControlWord | None = field(default=None, compare=False)

    def ready(self) -> bool:
        """Whether the control word can be read without blocking."""
        return self._handle().ready()

    def read(self, *, raise_on_error: bool = True) -> ControlValues:
        """The control word on the host (waits on this call's event only)."""
        return self._handle().read(raise_on_error=raise_on_error)

    def _handle(self) -> ControlWord:
        if self.handle is None:
            raise ValueError("these buffers were not produced by slice_repack (no control handle)")
        return self.handle

    @property
    def batch_cap(self) -> int:
        return self.padded_positions.shape[0]

    @property
    def bucket_cap(self) -> int:
        return self.padded_positions.shape[1]

    @property
    def packed_cap(self) -> int:
        return self.packed_positions.shape[0]


BUFFER_FIELDS = (
    "control",
    "padded_values",
    "padded_positions",
    "padded_mask",
    "padded_src_index",
    "packed_values",
    "packed_positions",
    "packed_seq_index",
    "packed_src_index",
    "cu_seqlens",
)


def slice_repack_buffers(
    *,
    batch_cap: int,
    bucket_cap: int,
    packed_cap: int,
    cu_len: int,
    dtype: torch.dtype,
    device: torch.device | str,
    hidden_dim: int | None = None,
) -> SliceRepackOutput:
    """Allocate (uninitialised) persistent buffers for ``slice_repack(..., out=...)``.

    Size them from the router's tables: ``batch_cap >= max(batch_buckets)``,
    ``bucket_cap >= max(micro_buckets)``, ``packed_cap >= max(max(packed_buckets), G * N)``
    (``EAGER`` packs up to ``G * N`` tokens) and ``cu_len >= G + 1`` for the largest group.
    ``hidden_dim=None`` for token ids ``[B, N]``, ``D`` for hidden states ``[B, N, D]``.
    """
    for name, value in (
        ("batch_cap", batch_cap),
        ("bucket_cap", bucket_cap),
        ("packed_cap", packed_cap),
        ("cu_len", cu_len),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if cu_len < 1:
        raise ValueError(f"cu_len must be >= 1 (G + 1), got {cu_len}")
    tail = () if hidden_dim is None else (hidden_dim,)
    return SliceRepackOutput(
        control=torch.zeros(CONTROL_SIZE, dtype=torch.int32, device=device),
        padded_values=torch.empty((batch_cap, bucket_cap, *tail), dtype=dtype, device=device),
        padded_positions=torch.empty((batch_cap, bucket_cap), dtype=torch.int64, device=device),
        padded_mask=torch.empty((batch_cap, bucket_cap), dtype=torch.bool, device=device),
        padded_src_index=torch.empty((batch_cap, bucket_cap), dtype=torch.int64, device=device),
        packed_values=torch.empty((packed_cap, *tail), dtype=dtype, device=device),
        packed_positions=torch.empty(packed_cap, dtype=torch.int64, device=device),
        packed_seq_index=torch.empty(packed_cap, dtype=torch.int32, device=device),
        packed_src_index=torch.empty(packed_cap, dtype=torch.int64, device=device),
        cu_seqlens=torch.empty(cu_len, dtype=torch.int32, device=device),
    )
