"""Bucket tables for batched serving: micro-buckets, batch-size buckets, packed-length buckets.

After Seer's step-0 cut every request keeps its own number ``L*`` of response positions; a
CUDA graph is captured for a fixed shape, so shapes are rounded up to a small set of buckets
(the Seer paper §3.4):

* **micro-buckets** ``{8, 16, 32, ..., N_max}`` - the padded length ``B_G`` of a static group;
* **batch buckets** ``{1, 2, 4, 8, 16, 24, ...}`` - the padded row count of a static group
  (vLLM / SGLang style: powers of two up to the alignment, then multiples of it);
* **packed buckets** - the padded total length ``P`` of a packed (varlen) group, geometric with
  a fixed number of steps per octave so the rounding waste is bounded by a constant fraction.

Every table is a sorted tuple of distinct positive ints that fit int32 (the kernel's tables are
int32); the router rounds a size up to its bucket (``seer_kernels.slice_repack_decision``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

_INT32_MAX = 2**31 - 1


def _check_int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_buckets(name: str, values: Iterable[int]) -> tuple[int, ...]:
    """Validate a bucket table and return it as a tuple.

    Raises ``TypeError`` (not a sequence of ints) or ``ValueError`` (empty, an entry < 1 or above
    int32, not strictly ascending), naming ``name``. Nothing is sorted or de-duplicated silently.
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    table = tuple(values)
    bad = [v for v in table if isinstance(v, bool) or not isinstance(v, int)]
    if bad:
        raise TypeError(f"{name} must hold ints, got {bad[:4]!r}")
    if not table:
        raise ValueError(f"{name} must not be empty")
    if table[0] < 1:
        raise ValueError(f"{name} entries must be >= 1, got {table[0]}")
    if table[-1] > _INT32_MAX:
        raise ValueError(f"{name} entries must fit int32, got {table[-1]}")
    unsorted = [(a, b) for a, b in zip(table[:-1], table[1:]) if a >= b]
    if unsorted:
        raise ValueError(
            f"{name} must be sorted strictly ascending, got {unsorted[0][0]} before {unsorted[0][1]}"
        )
    return table


def micro_buckets(n_max: int = 128, *, smallest: int = 8) -> tuple[int, ...]:
    """``(smallest, 2*smallest, 4*smallest, ..., n_max)``: powers of two times ``smallest`` below
    ``n_max``, then ``n_max`` itself (which need not be a power of two: ``n_max=100`` gives
    ``(8, 16, 32, 64, 100)``). ``n_max < smallest`` gives ``(n_max,)``."""
    _check_int("n_max", n_max, minimum=1)
    _check_int("smallest", smallest, minimum=1)
    if n_max > _INT32_MAX:
        raise ValueError(f"n_max must fit int32, got {n_max}")
    out = []
    b = smallest
    while b < n_max:
        out.append(b)
        b *= 2
    out.append(n_max)
    return tuple(out)


def batch_buckets(max_batch: int = 256, *, align: int = 8) -> tuple[int, ...]:
    """Row-count buckets: powers of two below ``align``, then multiples of ``align``, then
    ``max_batch`` (e.g. ``(1, 2, 4, 8, 16, 24, ..., 256)``): at most ``align - 1`` padded rows."""
    _check_int("max_batch", max_batch, minimum=1)
    _check_int("align", align, minimum=1)
    if max_batch > _INT32_MAX:
        raise ValueError(f"max_batch must fit int32, got {max_batch}")
    out = []
    b = 1
    while b < align and b < max_batch:
        out.append(b)
        b *= 2
    b = align
    while b < max_batch:
        out.append(b)
        b += align
    out.append(max_batch)
    return tuple(sorted(set(out)))


def packed_buckets(
    max_tokens: int, *, smallest: int = 64, per_octave: int = 8, align: int = 16
) -> tuple[int, ...]:
    """Packed-length buckets: ``smallest * 2**(k / per_octave)`` rounded up to a multiple of
    ``align``, up to and including ``max_tokens``. The rounding waste of a packed group is below
    ``1 - 2**(-1/per_octave)`` of its padded length (8.3% for ``per_octave=8``) above
    ``smallest``, and below ``smallest`` tokens under it."""
    _check_int("max_tokens", max_tokens, minimum=1)
    _check_int("smallest", smallest, minimum=1)
    _check_int("per_octave", per_octave, minimum=1)
    _check_int("align", align, minimum=1)
    if max_tokens > _INT32_MAX:
        raise ValueError(f"max_tokens must fit int32, got {max_tokens}")
    out = set()
    k = 0
    while True:
        raw = smallest * 2.0 ** (k / per_octave)
        b = int(math.ceil(raw / align - 1e-9)) * align
        if b >= max_tokens:
            break
        out.add(b)
        k += 1
    out.add(max_tokens)
    return tuple(sorted(out))
