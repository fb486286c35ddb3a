"""Padding-Waste-Ratio routing of a batch after Seer's step-0 cut (the Seer
paper §3.4).

Where the router picks a path: :meth:`Router.route`. Each row ``b`` keeps ``L*_b`` response
positions; the batch is one group ``G`` (``|G|`` rows, total ``T = sum L*``, longest ``Lmax``),
and the rule is ``seer_kernels``' host implementation of the one the fused ``slice_repack``
kernel evaluates (``seer_kernels.slice_repack_control.slice_repack_decision``):

* ``B_G`` = the smallest micro-bucket ``>= Lmax``; ``PWR = 1 - T / (|G| * B_G)`` (float64);
* ``T == 0`` -> ``EMPTY``; no micro-bucket holds ``Lmax``, ``|G| == 1`` or
  ``B_G <= eager_max_bucket`` -> ``EAGER`` (packed, no padding, no graph);
* ``PWR <= tau_pad`` -> ``STATIC``: rows padded to ``B_G`` and to the smallest batch bucket
  ``>= |G|``; graph key ``GraphKey(PATH_STATIC, batch bucket, B_G)``;
* otherwise ``VARLEN``: rows packed back to back, the total padded to the smallest packed bucket
  ``P >= T``; graph key ``GraphKey(PATH_VARLEN, max batch bucket, P)``; no packed bucket -> ``EAGER``.

Why one group per step, ``N_max = 128`` (the power of two at or above the windows served),
``tau_pad = 0.2`` and packed buckets 8 per octave: ``bench/bench_router.py`` (packing mixes
lengths at a few percent rounding waste; splitting the batch by length bought no tokens).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from seer_kernels.slice_repack_control import (
    MAX_GROUP,
    PATH_EAGER,
    PATH_EMPTY,
    PATH_NAMES,
    PATH_STATIC,
    PATH_VARLEN,
    slice_repack_decision,
)

from ..config import StoredConfig
from .buckets import batch_buckets, check_buckets, micro_buckets, packed_buckets

#: how many distinct length tuples a Router remembers its route for (the oldest is forgotten first)
ROUTE_MEMO = 1024

__all__ = [
    "PATH_EAGER",
    "PATH_EMPTY",
    "PATH_STATIC",
    "PATH_VARLEN",
    "GraphKey",
    "Route",
    "RouteStats",
    "Router",
    "RouterConfig",
    "RouterStats",
]


class GraphKey(NamedTuple):
    """What a captured graph is specialised to. STATIC: ``batch`` rows of ``length`` positions;
    VARLEN: ``length`` packed tokens with ``batch + 1`` cu_seqlens entries."""

    path: int
    batch: int
    length: int

    @property
    def tokens(self) -> int:
        """Positions the graph computes: ``batch * length`` (STATIC), ``length`` (VARLEN)."""
        return self.batch * self.length if self.path == PATH_STATIC else self.length

    def __str__(self) -> str:
        return f"{PATH_NAMES[self.path]}[batch={self.batch},length={self.length}]"


class RouteStats(NamedTuple):
    """Tokens of one route: ``useful`` = ``T`` (real positions), ``computed`` = positions of the
    layout that runs (STATIC ``batch bucket * B_G``, VARLEN ``P``, EAGER ``T``, EMPTY 0)."""

    path: int
    rows: int
    useful_tokens: int
    computed_tokens: int

    @property
    def padded_tokens(self) -> int:
        """Padding positions computed for nothing: ``computed - useful``."""
        return self.computed_tokens - self.useful_tokens

    @property
    def waste(self) -> float:
        """``padded / computed`` (0.0 when nothing is computed)."""
        return self.padded_tokens / self.computed_tokens if self.computed_tokens else 0.0


class Route(NamedTuple):
    """One group of rows and how it runs: ``key`` is None for EAGER and EMPTY."""

    path: int
    key: GraphKey | None
    rows: tuple[int, ...]
    stats: RouteStats


@dataclass(frozen=True)
class RouterConfig(StoredConfig):
    """Bucket tables and the routing rule (validated on construction; sequences become tuples).

    micro_buckets: sorted padded lengths ``B_G`` of static graphs (``buckets.micro_buckets(N_max)``).
    packed_buckets: sorted padded totals ``P`` of varlen graphs.
    batch_buckets: sorted padded row counts of static graphs; its largest entry is the largest
        batch :meth:`Router.route` accepts.
    tau_pad: PWR threshold in ``[0, 1]``: ``PWR <= tau_pad`` runs STATIC (paper: flat 0.1-0.6).
    eager_max_bucket: groups with ``B_G <= eager_max_bucket`` run eager (paper: 4).
    """

    micro_buckets: tuple[int, ...] = field(default_factory=lambda: micro_buckets(128))
    packed_buckets: tuple[int, ...] = field(default_factory=lambda: packed_buckets(256 * 128))
    batch_buckets: tuple[int, ...] = field(default_factory=lambda: batch_buckets(256))
    tau_pad: float = 0.2
    eager_max_bucket: int = 4

    def __post_init__(self) -> None:
        for name in ("micro_buckets", "packed_buckets", "batch_buckets"):
            object.__setattr__(self, name, check_buckets(name, getattr(self, name)))
        tau = self.tau_pad
        if isinstance(tau, bool) or not isinstance(tau, (int, float)):
            raise TypeError(f"tau_pad must be a float, got {type(tau).__name__}")
        if not (math.isfinite(tau) and 0.0 <= tau <= 1.0):
            raise ValueError(f"tau_pad must lie in [0, 1], got {tau}")
        object.__setattr__(self, "tau_pad", float(tau))
        value = self.eager_max_bucket
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"eager_max_bucket must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"eager_max_bucket must be >= 0, got {value}")

    @classmethod
    def for_window(
        cls,
        n_max: int,
        *,
        max_batch: int = 256,
        packed_per_octave: int = 8,
        **options,
    ) -> RouterConfig:
        """Tables for windows up to ``n_max`` and batches up to ``max_batch``: micro-buckets
        ``{8, 16, ..., n_max}``, batch buckets ``{1, 2, 4, 8, 16, ..., max_batch}`` and packed
        buckets up to ``max_batch * n_max``; ``options`` are the other fields."""
        return cls(
            micro_buckets=micro_buckets(n_max),
            packed_buckets=packed_buckets(max_batch * n_max, per_octave=packed_per_octave),
            batch_buckets=batch_buckets(max_batch),
            **options,
        )

    @property
    def n_max(self) -> int:
        return self.micro_buckets[-1]

    @property
    def max_batch(self) -> int:
        return self.batch_buckets[-1]


class Router:
    """Routes a batch (see the module docstring).

    The single source of truth for graph keys: every key :meth:`route` returns is in
    :meth:`valid_keys`, which is what a graph cache captures.
    """

    def __init__(self, config: RouterConfig | None = None) -> None:
        if config is None:
            config = RouterConfig()
        if not isinstance(config, RouterConfig):
            raise TypeError(f"config must be a RouterConfig, got {type(config).__name__}")
        self.config = config
        self._varlen_batch = config.max_batch
        self._keys = self._enumerate_keys()
        self._routes: dict[tuple[int, ...], Route] = {}  # route's memo: a decode re-routes the same lengths

    def route(self, lengths: Sequence[int], *, check: bool = True) -> Route:
        """Route the batch's rows, one group, by the rule in the module docstring.

        Args:
            lengths: ``L*`` per row, ints ``>= 0`` (a list, tuple, or a 1-D int tensor - read on
                the host, which synchronises a CUDA tensor). ``1 <= len <= max batch bucket``
                and ``<= 1024`` (``slice_repack``'s largest group).
            check: validate ``lengths`` on every call (default). False: a tuple of host ints the
                caller built itself (the engine's window lengths, every decode step) is looked up
                in the memo of earlier routes first and validated only when it is new; anything
                else wrong is then undefined behaviour.

        Returns:
            The :class:`Route` of rows ``0..len-1``.
        """
        if not check and type(lengths) is tuple:
            route = self._routes.get(lengths)
            if route is not None:
                return route
        lens = self._check_lengths(lengths)
        if len(lens) > self.config.max_batch:
            raise ValueError(
                f"lengths: a batch of {len(lens)} rows exceeds the largest batch bucket {self.config.max_batch}"
            )
        if len(lens) > MAX_GROUP:
            raise ValueError(
                f"lengths: a batch of {len(lens)} rows exceeds slice_repack's group limit {MAX_GROUP}"
            )
        memo = tuple(lens)
        route = self._routes.get(memo)
        if route is None:
            if len(self._routes) >= ROUTE_MEMO:  # bounded: the oldest goes first
                del self._routes[next(iter(self._routes))]
            route = self._routes[memo] = self._route(lens)
        return route

    def _route(self, lens: list[int]) -> Route:
        cfg = self.config
        rows = tuple(range(len(lens)))
        d = slice_repack_decision(lens, micro_buckets=cfg.micro_buckets, packed_buckets=cfg.packed_buckets,
                                  batch_buckets=cfg.batch_buckets, tau_pad=cfg.tau_pad,
                                  eager_max_bucket=cfg.eager_max_bucket)
        if d.path == PATH_STATIC:
            key = GraphKey(PATH_STATIC, d.batch_rows, d.bucket)
            return Route(PATH_STATIC, key, rows, RouteStats(PATH_STATIC, len(rows), d.total, key.tokens))
        if d.path == PATH_VARLEN:
            key = GraphKey(PATH_VARLEN, self._varlen_batch, d.bucket)
            return Route(PATH_VARLEN, key, rows, RouteStats(PATH_VARLEN, len(rows), d.total, d.bucket))
        return Route(d.path, None, rows, RouteStats(d.path, len(rows), d.total, d.total))

    # -- keys -------------------------------------------------------------------------------
    def valid_keys(self, path: int | None = None) -> tuple[GraphKey, ...]:
        """Every key :meth:`route` can return (``path``: only STATIC or only VARLEN keys).

        STATIC: each micro-bucket ``> eager_max_bucket`` with each batch bucket reachable by a
        group of ``>= 2`` rows. VARLEN: each packed bucket whose range holds a total ``T`` that
        some group of at most ``max batch`` rows could send down the varlen path (``PWR >
        tau_pad``). Ordered largest first (``GraphKey.tokens`` descending), the capture order.
        """
        if path is None:
            return self._keys
        if path not in (PATH_STATIC, PATH_VARLEN):
            raise ValueError(f"path must be PATH_STATIC, PATH_VARLEN or None, got {path!r}")
        return tuple(k for k in self._keys if k.path == path)

    def _enumerate_keys(self) -> tuple[GraphKey, ...]:
        cfg = self.config
        sizes = [m for m in cfg.micro_buckets if m > cfg.eager_max_bucket]
        max_g = cfg.max_batch
        keys: list[GraphKey] = []
        if not sizes or max_g < 2:
            return ()
        prev = 0
        reachable_batches = []
        for bb in cfg.batch_buckets:
            if max(2, prev + 1) <= bb:
                reachable_batches.append(bb)
            prev = bb
        # a uniform group (PWR = 0 <= tau_pad) reaches every (batch bucket, micro-bucket)
        keys += [GraphKey(PATH_STATIC, bb, m) for bb in reachable_batches for m in sizes]
        # the largest total on the varlen path: max_g rows at the largest micro-bucket
        t_max = _largest_varlen_total(max_g, sizes[-1], cfg.tau_pad)
        prev = 0
        for p in cfg.packed_buckets:
            if prev + 1 <= t_max:
                keys.append(GraphKey(PATH_VARLEN, self._varlen_batch, p))
            prev = p
        keys.sort(key=lambda k: (k.tokens, k.length, k.batch, k.path), reverse=True)
        return tuple(keys)

    @staticmethod
    def _check_lengths(lengths: Sequence[int]) -> list[int]:
        if hasattr(lengths, "tolist") and not isinstance(lengths, (list, tuple)):
            if getattr(lengths, "ndim", 1) != 1:
                raise ValueError(f"lengths must be 1-D, got shape {tuple(lengths.shape)}")
            lengths = lengths.tolist()
        if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
            raise TypeError(f"lengths must be a sequence of ints, got {type(lengths).__name__}")
        lens = list(lengths)
        if not lens:
            raise ValueError("lengths is empty: route a batch of at least one row")
        for i, n in enumerate(lens):
            if type(n) is not int:
                if isinstance(n, bool) or not hasattr(n, "__index__"):
                    raise TypeError(f"lengths[{i}] must be an int, got {type(n).__name__} {n!r}")
                lens[i] = n = int(n)
            if n < 0:
                raise ValueError(f"lengths[{i}] must be >= 0, got {n}")
        return lens


def _largest_varlen_total(groups: int, bucket: int, tau: float) -> int:
    """The largest ``T <= groups * bucket`` with ``1 - T / (groups * bucket) > tau`` in float64, 0 if none."""
    cap = groups * bucket
    t = min(cap, int(math.floor((1.0 - tau) * cap)) + 2)
    while t > 0 and not (1.0 - t / cap > tau):
        t -= 1
    return t


@dataclass
class RouterStats:
    """Running totals per path over many :meth:`Router.route` calls (vLLM's CUDAGraphStat idea):
    groups, rows, useful tokens (``T``) and computed tokens (padding included)."""

    groups: dict[int, int] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)
    useful_tokens: dict[int, int] = field(default_factory=dict)
    computed_tokens: dict[int, int] = field(default_factory=dict)
    calls: int = 0

    def add(self, route: Route) -> None:
        """Count one ``route()`` result."""
        self.calls += 1
        s = route.stats
        p = s.path
        self.groups[p] = self.groups.get(p, 0) + 1
        self.rows[p] = self.rows.get(p, 0) + s.rows
        self.useful_tokens[p] = self.useful_tokens.get(p, 0) + s.useful_tokens
        self.computed_tokens[p] = self.computed_tokens.get(p, 0) + s.computed_tokens

    def padded_tokens(self, path: int | None = None) -> int:
        if path is None:
            return sum(self.computed_tokens.values()) - sum(self.useful_tokens.values())
        return self.computed_tokens.get(path, 0) - self.useful_tokens.get(path, 0)

    def waste(self, path: int | None = None) -> float:
        """Padded / computed tokens on ``path`` (all paths when None); 0.0 when nothing ran."""
        computed = sum(self.computed_tokens.values()) if path is None else self.computed_tokens.get(path, 0)
        return self.padded_tokens(path) / computed if computed else 0.0

    def as_dict(self) -> dict[str, dict[str, float]]:
        """``{path name: {groups, rows, useful_tokens, computed_tokens, padded_tokens, waste}}``."""
        out = {}
        for p in sorted(self.groups):
            out[PATH_NAMES[p]] = {
                "groups": self.groups[p],
                "rows": self.rows[p],
                "useful_tokens": self.useful_tokens[p],
                "computed_tokens": self.computed_tokens[p],
                "padded_tokens": self.padded_tokens(p),
                "waste": self.waste(p),
            }
        return out

    def table(self) -> str:
        """A fixed-width text table, one line per path and a total."""
        lines = [
            f"{'path':<8}{'groups':>8}{'rows':>8}{'useful':>10}{'computed':>10}{'padded':>10}{'waste':>8}"
        ]
        for name, d in self.as_dict().items():
            lines.append(
                f"{name:<8}{d['groups']:>8}{d['rows']:>8}{d['useful_tokens']:>10}{d['computed_tokens']:>10}"
                f"{d['padded_tokens']:>10}{d['waste']:>8.3f}"
            )
        useful, computed = sum(self.useful_tokens.values()), sum(self.computed_tokens.values())
        lines.append(
            f"{'total':<8}{sum(self.groups.values()):>8}{sum(self.rows.values()):>8}{useful:>10}{computed:>10}"
            f"{computed - useful:>10}{self.waste():>8.3f}"
        )
        return "\n".join(lines)
