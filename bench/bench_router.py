"""The PWR router: the cost of ``route()`` and the padding waste it leaves, per tau_pad and N_max.

    .venv/bin/pytest bench/bench_router.py -s                      # timings + the waste tables
    .venv/bin/pytest bench/bench_router.py --benchmark-disable -s  # smoke (CI): one call each

Answer lengths (SPEC.md §1.6: windows 16, 32, 100; L* = the cut Seer keeps) are drawn per row
from a mixture: 60% short answers (1 + geometric, mean 4 tokens: a VQA word or number), 35%
long answers (uniform in [W/4, W]: an explanation), 5% rows where no boundary fired (L* = W).
Batches of 256 rows, 20 batches per setting, fixed seeds. Per path: useful tokens (sum of L*),
computed tokens (the layout that runs: STATIC batch bucket x B_G, VARLEN packed bucket P,
EAGER T) and waste = padded / computed; "naive" = padding every row to the batch's longest L*
(the paper's pad-to-max truncation baseline). Token counts are exact; the figures and the
defaults they justify: bench/RESULTS.md ("Router").
"""

from __future__ import annotations

import random
import time

import pytest

from seer_runtime.serving.buckets import micro_buckets
from seer_runtime.serving.router import (
    PATH_EAGER,
    PATH_STATIC,
    PATH_VARLEN,
    Router,
    RouterConfig,
    RouterStats,
)

pytestmark = [pytest.mark.bench]

BATCH = 256
TRIALS = 20
WINDOWS = (16, 32, 100)
TAUS = (0.1, 0.2, 0.4, 0.6)
N_MAXES = (64, 128, 256)


def answer_lengths(rng: random.Random, window: int, batch: int) -> list[int]:
    """L* per row: short answers, long answers and uncut rows (module docstring)."""
    out = []
    for _ in range(batch):
        u = rng.random()
        if u < 0.60:
            n = 1
            while rng.random() < 0.75 and n < window:  # geometric, mean 4
                n += 1
        elif u < 0.95:
            n = rng.randint(max(1, window // 4), window)
        else:
            n = window
        out.append(n)
    return out


def measure(router: Router, batches: list[list[int]]) -> tuple[RouterStats, int]:
    """Routed statistics over ``batches`` and the naive pad-to-longest token count."""
    stats = RouterStats()
    naive = 0
    for lens in batches:
        stats.add(router.route(lens))
        naive += len(lens) * max(lens)
    return stats, naive


def _row(stats: RouterStats, naive: int) -> str:
    d = stats.as_dict()
    useful = sum(stats.useful_tokens.values())
    computed = sum(stats.computed_tokens.values())
    cells = []
    for name in ("STATIC", "VARLEN", "EAGER"):
        if name in d:
            cells.append(
                f"{d[name]['useful_tokens'] / stats.calls:>7.0f} "
                f"{d[name]['padded_tokens'] / stats.calls:>6.0f} "
                f"{d[name]['waste']:>5.2f}"
            )
        else:
            cells.append(f"{'-':>7} {'-':>6} {'-':>5}")
    groups = sum(stats.groups.values()) / stats.calls
    return " | ".join(cells) + f" | {groups:>5.2f} | {computed / useful:>5.3f} {naive / useful:>6.3f}"


HEADER = (
    f"{'W':>3} {'Nmax':>4} {'tau':>4} | "
    + " | ".join(f"{p + ' use':>7} {'pad':>6} {'waste':>5}" for p in ("STA", "VAR", "EAG"))
    + f" | {'grp':>5} | {'comp/use':>5} {'naive':>6}"
)


def waste_table() -> list[tuple]:
    """Every setting: (window, n_max, tau, stats, naive, keys)."""
    rng = random.Random(2026)
    batches = {w: [answer_lengths(rng, w, BATCH) for _ in range(TRIALS)] for w in WINDOWS}
    rows = []
    for w in WINDOWS:
        for n_max in N_MAXES:
            for tau in TAUS:
                router = Router(RouterConfig.for_window(n_max, max_batch=BATCH, tau_pad=tau))
                stats, naive = measure(router, batches[w])
                rows.append((w, n_max, tau, stats, naive, len(router.valid_keys())))
    return rows


def test_padding_waste_per_path():
    """Print the waste table; check the token accounting of every setting."""
    t0 = time.perf_counter()
    rows = waste_table()
    print(f"\nper step, mean over {TRIALS} batches of {BATCH} (use/pad = useful/padded tokens per path)")
    print(HEADER)
    last = None
    for w, n_max, tau, stats, naive, _ in rows:
        if last is not None and (w, n_max) != last:
            print()
        last = (w, n_max)
        print(f"{w:>3} {n_max:>4} {tau:>4} | " + _row(stats, naive))
        useful = sum(stats.useful_tokens.values())
        assert stats.calls == TRIALS and useful > 0
        assert sum(stats.rows.values()) == TRIALS * BATCH  # every row routed exactly once per batch
        assert all(stats.computed_tokens.get(p, 0) >= stats.useful_tokens.get(p, 0) for p in stats.groups)
        assert stats.padded_tokens(PATH_EAGER) == 0
        if n_max < w:
            assert stats.groups.get(PATH_EAGER, 0) > 0  # some batch has an L* above N_max
    keys = {}
    for _, n_max, tau, _, _, k in rows:
        keys[(n_max, tau)] = k
    print("\ngraph keys to capture (static + varlen, batch <= 256, packed 8 per octave):")
    print("  " + "  ".join(f"Nmax={n} tau={t}: {k}" for (n, t), k in sorted(keys.items())))
    print(f"(table computed in {time.perf_counter() - t0:.2f} s)")


def decode_table(trials: int = 2) -> list[tuple]:
    """Whole decodes at N_max 128 and N_max = W: row b runs L*_b steps (steps follow the cut
    window), and every step routes the rows still running. (window, n_max, tau, stats, naive)."""
    rng = random.Random(2027)
    batches = {w: [answer_lengths(rng, w, BATCH) for _ in range(trials)] for w in WINDOWS}
    rows = []
    for w in WINDOWS:
        steps = []
        for lens in batches[w]:
            for s in range(max(lens)):
                active = [n for n in lens if n > s]
                steps.append(active)
        for n_max in (128,) if w in micro_buckets(128) else (w, 128):  # N_max = W only where it differs
            for tau in TAUS:
                router = Router(RouterConfig.for_window(n_max, max_batch=BATCH, tau_pad=tau))
                stats, naive = measure(router, steps)
                stats.calls = trials  # report per decode, not per step
                rows.append((w, n_max, tau, stats, naive))
    return rows


def test_padding_waste_whole_decode():
    """Print per-decode tokens: late steps hold only the long answers, so groups are more uniform."""
    t0 = time.perf_counter()
    rows = decode_table()
    print("\nper decode, mean over 2 batches of 256; 'naive' = pad every step to its longest row")
    print(HEADER.replace("grp", "fwd"))
    last = None
    for w, n_max, tau, stats, naive in rows:
        if last is not None and (w, n_max) != last:
            print()
        last = (w, n_max)
        print(f"{w:>3} {n_max:>4} {tau:>4} | " + _row(stats, naive))
        assert stats.padded_tokens(PATH_EAGER) == 0
        assert stats.waste(PATH_VARLEN) < 1 - 2 ** (-1 / 8)  # one step of the packed ladder at most
    print(f"(table computed in {time.perf_counter() - t0:.2f} s)")


def test_packed_bucket_granularity():
    """Rounding waste of the varlen path against the number of varlen graphs (window 100)."""
    rng = random.Random(7)
    batches = [answer_lengths(rng, 100, BATCH) for _ in range(TRIALS)]
    print(f"\n{'per_octave':>10} {'varlen keys':>11} {'VARLEN waste':>12} {'total comp/use':>14}")
    prev_waste = None
    for per_octave in (2, 4, 8, 16):
        router = Router(RouterConfig.for_window(128, max_batch=BATCH, packed_per_octave=per_octave))
        stats, _ = measure(router, batches)
        useful, computed = sum(stats.useful_tokens.values()), sum(stats.computed_tokens.values())
        waste = stats.waste(PATH_VARLEN)
        print(
            f"{per_octave:>10} {len(router.valid_keys(PATH_VARLEN)):>11} {waste:>12.3f} "
            f"{computed / useful:>14.3f}"
        )
        assert waste < 1 - 2 ** (-1 / per_octave) + 0.01  # bounded by one step of the ladder
        if prev_waste is not None:
            assert waste <= prev_waste + 0.01
        prev_waste = waste


def test_route_cost_batch256(benchmark):
    """Host cost of one ``route()`` at batch 256 (window 100, N_max 128)."""
    router = Router(RouterConfig.for_window(128, max_batch=BATCH))
    lens = answer_lengths(random.Random(3), 100, BATCH)
    route = benchmark(router.route, lens)
    assert route.rows == tuple(range(BATCH)) and route.path in (PATH_STATIC, PATH_VARLEN)
