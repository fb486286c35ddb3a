"""seer_kernels.snr_boundary: the reference against a brute-force transcription of the rule, the
Triton kernel (interpreter) against the reference, every edge, and property tests."""

from __future__ import annotations

import importlib
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seer_kernels import interpreting, kernel_backend
from seer_kernels.snr_boundary import _block_size, _snr_boundary_triton, snr_boundary, snr_boundary_reference

pytestmark = [pytest.mark.interpreter, pytest.mark.snr_boundary]

NAN, INF = float("nan"), float("inf")
BLOCK = _block_size(10_000)  # the interpreter's block: rows below straddle its edges


def brute_force(row, valid_len, *, tau_jump=0.03, gamma=0.6, window=3, baseline_window=1, min_position=1):
    """The rule as written, one position at a time, in numpy fp32 scalars."""
    f32 = np.float32
    s = [f32(v) for v in row]
    tau, gam = f32(tau_jump), f32(gamma)
    with np.errstate(all="ignore"):
        for i in range(max(1, min_position), valid_len - window + 1):
            w = s[i : i + window]
            prev = [s[i - k] for k in range(1, min(baseline_window, i) + 1)]  # s[i-1], s[i-2], ...
            if not all(np.isfinite(v) for v in w + prev):
                continue
            acc = prev[0]
            for v in prev[1:]:
                acc = f32(acc + v)
            baseline = f32(acc / f32(len(prev)))
            jump = f32(min(w) - baseline)
            noise = f32(max(w) - min(w))
            if jump >= tau and noise <= f32(gam * jump):
                return i + 1
    return valid_len


def _brute_force_rows(s: torch.Tensor, valid_len: torch.Tensor, **options) -> torch.Tensor:
    rows = s.float().tolist()
    return torch.tensor(
        [brute_force(r, int(n), **options) for r, n in zip(rows, valid_len.tolist())], dtype=torch.int32
    )


def _run(backend, s, valid_len, **options):
    with kernel_backend(backend):
        return snr_boundary(s, valid_len, **options)


def _planted(
    B, N, *, seed, tau=0.03, level=0.3, pre_noise=0.005, jump=0.1, plateau_noise=0.02, with_nonfinite=False
):
    """Dense rows with a jump to a noisy plateau at a random position, some rows without one."""
    g = torch.Generator().manual_seed(seed)
    s = level + pre_noise * torch.rand(B, N, generator=g)
    where = torch.randint(1, max(N, 2), (B,), generator=g)
    for b in range(B):
        if b % 4 != 3:  # every fourth row stays dense
            p = int(where[b])
            s[b, p:] = level + jump + plateau_noise * torch.rand(N - p, generator=g)
    if with_nonfinite and N > 0:
        hits = torch.randint(0, N, (B,), generator=g)
        vals = torch.tensor([NAN, INF, -INF])
        for b in range(0, B, 2):
            s[b, hits[b]] = vals[b % 3]
    return s


OPTIONS = [
    {},
    {"window": 1},
    {"window": 2, "gamma": 0.3},
    {"window": 5, "tau_jump": 0.05},
    {"baseline_window": 3},
    {"baseline_window": 4, "window": 2, "min_position": 3},
    {"min_position": 7, "gamma": 1.5},
]


def test_interpreter_is_on():
    assert interpreting()


def test_triton_path_does_not_call_the_reference(monkeypatch):
    module = importlib.import_module("seer_kernels.snr_boundary")

    def boom(*args, **kwargs):
        raise AssertionError("the reference ran on the triton backend")

    monkeypatch.setattr(module, "snr_boundary_reference", boom)
    s = _planted(2, 20, seed=0)
    with kernel_backend("triton"):
        module.snr_boundary(s, torch.tensor([20, 20]))
    with kernel_backend("reference"), pytest.raises(AssertionError, match="reference ran"):
        module.snr_boundary(s, torch.tensor([20, 20]))


# --------------------------------------------------------------------- reference vs formula


@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "paper"
)
def test_reference_matches_brute_force(options):
    for seed, N in enumerate([1, 2, 3, 4, 7, 16, 40]):
        s = _planted(8, N, seed=seed, with_nonfinite=seed % 2 == 1)
        valid_len = torch.randint(0, N + 1, (8,), generator=torch.Generator().manual_seed(seed))
        valid_len[0] = N
        expected = _brute_force_rows(s, valid_len, **options)
        assert torch.equal(snr_boundary_reference(s, valid_len, **options), expected), (N, options)


def test_reference_matches_brute_force_on_noise():
    # pure noise with jumps of every size: many near-threshold decisions
    g = torch.Generator().manual_seed(1)
    s = torch.rand(32, 30, generator=g) * 0.1
    valid_len = torch.full((32,), 30)
    for options in ({}, {"tau_jump": 0.01}, {"baseline_window": 2, "tau_jump": 0.02}):
        expected = _brute_force_rows(s, valid_len, **options)
        assert torch.equal(snr_boundary_reference(s, valid_len, **options), expected)
        assert torch.equal(_run("triton", s, valid_len, **options), expected)


# ---------------------------------------------------------------------- triton vs reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "paper"
)
def test_triton_matches_reference(options, dtype):
    for seed, N in enumerate([1, 3, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 3]):
        s = _planted(6, N, seed=seed, with_nonfinite=seed % 2 == 0).to(dtype)
        valid_len = torch.randint(
            0, N + 1, (6,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32
        )
        valid_len[0] = N
        tri = _run("triton", s, valid_len, **options)
        ref = _run("reference", s, valid_len, **options)
        assert tri.dtype == torch.int32 and tri.shape == (6,)
        assert torch.equal(tri, ref), (N, options, tri, ref)
        assert torch.equal(ref, _brute_force_rows(s, valid_len, **options))


@pytest.mark.parametrize("p", [1, BLOCK - 2, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 3 * BLOCK - 4])
def test_triton_finds_jump_across_block_edges(p):
    N = 3 * BLOCK + 1
    s = torch.full((3, N), 0.2)
    s[:, p:] = 0.4
    valid_len = torch.tensor([N, p + 3, p + 2])  # the last row's window would run past valid_len
    tri = _run("triton", s, valid_len)
    assert tri.tolist() == [p + 1, p + 1, p + 2]
    assert torch.equal(tri, _run("reference", s, valid_len))


def test_triton_block_size_does_not_change_the_result():
    s = _planted(5, 300, seed=3, with_nonfinite=True)
    valid_len = torch.tensor([300, 299, 250, 100, 0])
    ref = snr_boundary_reference(s, valid_len)
    for block in (16, 64, 512):
        out = torch.empty(5, dtype=torch.int32)
        _snr_boundary_triton(
            s,
            valid_len,
            out,
            tau_jump=0.03,
            gamma=0.6,
            window=3,
            baseline_window=1,
            min_position=1,
            block_size=block,
        )
        assert torch.equal(out, ref), block


def test_triton_strided_input():
    base = _planted(4, 2 * BLOCK + 8, seed=4)
    s = base[:, 5:]  # row stride != row length
    valid_len = torch.tensor([s.shape[1]] * 4, dtype=torch.int64)
    assert torch.equal(_run("triton", s, valid_len), _run("reference", s, valid_len))
    t = base.t().contiguous().t()[:, 3:]  # column-major: stride along the row != 1
    assert torch.equal(_run("triton", t, valid_len), _run("reference", t, valid_len))


def test_bitwise_repeatable():
    s = _planted(16, 2 * BLOCK + 5, seed=9, with_nonfinite=True)
    valid_len = torch.randint(0, 2 * BLOCK + 6, (16,), generator=torch.Generator().manual_seed(9))
    first = _run("triton", s, valid_len)
    second = _run("triton", s, valid_len)
    assert torch.equal(first, second)


# --------------------------------------------------------------------------------- edges

BACKENDS = ["triton", "reference"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_valid_len_zero_gives_zero(backend):
    s = torch.tensor([[0.0, 0.5, 0.5, 0.5, 0.5]] * 2)
    assert _run(backend, s, torch.tensor([0, 5])).tolist() == [0, 2]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", [1, 3])
def test_rows_not_longer_than_window_never_fire(backend, window):
    s = torch.tensor([[0.0] + [0.5] * 6])  # a clean jump at 1
    for n in range(0, window + 1):
        assert _run(backend, s, torch.tensor([n]), window=window).tolist() == [n]
    assert _run(backend, s, torch.tensor([window + 1]), window=window).tolist() == [2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_never_runs_past_valid_len(backend):
    # jump at 4; the plateau continues past valid_len, but the window may not look there
    s = torch.tensor([[0.1] * 4 + [0.5] * 6])
    assert _run(backend, s, torch.tensor([6])).tolist() == [6]  # W_4 = s[4..6] needs valid_len 7
    assert _run(backend, s, torch.tensor([7])).tolist() == [5]
    # a spike past valid_len must not disturb the window's noise either
    s2 = torch.tensor([[0.1] * 4 + [0.5] * 3 + [9.0, NAN, INF]])
    assert _run(backend, s2, torch.tensor([7])).tolist() == [5]


@pytest.mark.parametrize("backend", BACKENDS)
def test_position_zero_is_never_a_candidate(backend):
    flat_high = torch.tensor([[0.9] * 8])  # a "plateau from the start" has no baseline
    assert _run(backend, flat_high, torch.tensor([8])).tolist() == [8]
    # with window 1 and a huge s[0], position 1 sees a drop, position 0 is never tested
    s = torch.tensor([[0.9, 0.1, 0.1, 0.1]])
    assert _run(backend, s, torch.tensor([4]), window=1).tolist() == [4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_min_position(backend):
    s = torch.tensor([[0.1, 0.1, 0.5, 0.5, 0.5, 0.1, 0.1, 0.1, 0.1, 0.6, 0.6, 0.6, 0.6]])
    n = torch.tensor([13])
    assert _run(backend, s, n).tolist() == [3]
    assert _run(backend, s, n, min_position=2).tolist() == [3]
    assert _run(backend, s, n, min_position=3).tolist() == [10]
    assert _run(backend, s, n, min_position=10).tolist() == [13]
    assert _run(backend, s, n, min_position=np.int64(3), window=np.int32(3)).tolist() == [10]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
@pytest.mark.parametrize("offset", [-1, 0, 1, 2])  # -1: the baseline, 0..2: the window
def test_nonfinite_in_window_or_baseline_blocks_that_position(backend, bad, offset):
    p = 4
    s = torch.tensor([[0.1] * p + [0.5] * 12])
    s[0, p + offset] = bad
    n = torch.tensor([s.shape[1]])
    result = _run(backend, s, n).item()
    assert result != p + 1
    assert result == brute_force(s[0].tolist(), s.shape[1])
    # the scan goes on: a clean second jump further right is still found
    s2 = torch.tensor([[0.1] * p + [0.5] * 6 + [0.1] * 3 + [0.7] * 4])
    s2[0, p + offset] = bad
    r2 = _run(backend, s2, torch.tensor([s2.shape[1]])).item()
    assert r2 == brute_force(s2[0].tolist(), s2.shape[1]) and r2 <= 14


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [NAN, INF])
def test_nonfinite_in_a_longer_baseline_blocks_that_position(backend, bad):
    s = torch.tensor([[0.1] * 6 + [0.5] * 4])
    n = torch.tensor([10])
    assert _run(backend, s, n, baseline_window=3).tolist() == [7]
    s[0, 3] = bad  # inside the 3-value baseline of position 6 (and of 4, 5), not of 7
    # position 7 still sees a jump over the mean of s[4..6] = (0.1 + 0.1 + 0.5) / 3
    assert (
        _run(backend, s, n, baseline_window=3).tolist()
        == [8]
        == [brute_force(s[0].tolist(), 10, baseline_window=3)]
    )
    assert _run(backend, s, n, baseline_window=2).tolist() == [7]


@pytest.mark.parametrize("backend", BACKENDS)
def test_baseline_window_is_a_mean(backend):
    # s[i-1] alone shows a jump of 0.2; the mean of 3 (0.1, 0.1, 0.4 -> 0.2) only 0.1
    s = torch.tensor([[0.1, 0.1, 0.1, 0.4, 0.5, 0.5, 0.5]])
    n = torch.tensor([7])
    assert _run(backend, s, n, tau_jump=0.15).tolist() == [4]  # jump at 3: 0.4 - 0.1 = 0.3
    assert _run(backend, s, n, tau_jump=0.15, baseline_window=3).tolist() == [4]
    # at i = 4 the one-value baseline (0.4) sees 0.1, the 3-mean (0.2) sees 0.3
    s2 = torch.tensor([[0.1, 0.1, 0.1, 0.4, 0.7, 0.7, 0.7]])
    assert _run(backend, s2, n, tau_jump=0.35, gamma=0.0).tolist() == [7]
    assert _run(backend, s2, n, tau_jump=0.35, gamma=0.0, baseline_window=3).tolist() == [5]
    # near the start the mean is over the i values that exist (dividing by baseline_window
    # instead would see a jump of 0.25 at position 1)
    s3 = torch.tensor([[0.2, 0.3, 0.3, 0.3, 0.3]])
    assert _run(backend, s3, torch.tensor([5]), baseline_window=4, tau_jump=0.15).tolist() == [5]
    s4 = torch.tensor([[0.2, 0.2, 0.6, 0.6, 0.6, 0.6]])
    assert _run(backend, s4, torch.tensor([6]), baseline_window=4, tau_jump=0.3).tolist() == [3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_thresholds_are_inclusive(backend):
    # exactly representable: jump = 0.5, noise = 0.25
    s = torch.tensor([[0.0, 0.5, 0.75, 0.5, 0.5]])
    n = torch.tensor([5])
    assert _run(backend, s, n, tau_jump=0.5, gamma=0.5).tolist() == [2]  # jump == tau, noise == gamma*jump
    above = float(np.nextafter(np.float32(0.5), np.float32(1)))
    assert _run(backend, s, n, tau_jump=above, gamma=0.5).tolist() == [5]
    below = float(np.nextafter(np.float32(0.5), np.float32(0)))
    assert _run(backend, s, n, tau_jump=0.5, gamma=below).tolist() == [5]
    # the same with an exact two-value mean baseline: (0.75 + 0.25) / 2 = 0.5, jump = 1.0
    s2 = torch.tensor([[0.25, 0.75, 1.5, 1.5, 1.5]])
    assert _run(backend, s2, n, tau_jump=1.0, baseline_window=2).tolist() == [3]
    above_one = float(np.nextafter(np.float32(1.0), np.float32(2)))
    assert _run(backend, s2, n, tau_jump=above_one, baseline_window=2).tolist() == [5]


def _gamma_jump_rounding_case():
    """``(jump, top)`` with ``top - jump == fp32(fp32(0.6) * jump) > fp32(0.6) * jump`` exactly,
    every value and difference exact in fp32."""
    g32 = np.float32(0.6)
    for k in range(1, 256):
        j = np.float32(k / 256)
        noise = np.float32(g32 * j)
        top = np.float32(j + noise)
        exact = Fraction(float(top)) - Fraction(float(j)) == Fraction(float(noise))
        if exact and Fraction(float(noise)) > Fraction(float(g32)) * Fraction(float(j)):
            return j, top
    raise AssertionError("no rounding-up case found")


@pytest.mark.parametrize("backend", BACKENDS)
def test_noise_test_is_made_in_fp32(backend):
    j, top = _gamma_jump_rounding_case()
    s = torch.tensor([[0.0, float(j), float(top), float(j)]])  # baseline 0: jump j, noise top - j
    # in fp32, noise <= fp32(gamma * jump) holds; in exact (or fp64) arithmetic it would not
    assert _run(backend, s, torch.tensor([4]), gamma=0.6, tau_jump=0.001).tolist() == [2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch_and_empty_rows(backend):
    out = _run(backend, torch.empty(0, 5), torch.empty(0, dtype=torch.int64))
    assert out.shape == (0,) and out.dtype == torch.int32
    out = _run(backend, torch.empty(3, 0), torch.zeros(3, dtype=torch.int32))
    assert out.tolist() == [0, 0, 0] and out.dtype == torch.int32


def test_out_of_range_valid_len_in_kernel_gives_minus_one():
    # on CUDA valid_len is not range-checked (no host sync): the kernel flags it, never reads past N
    s = _planted(3, 10, seed=1)
    out = torch.empty(3, dtype=torch.int32)
    options = dict(tau_jump=0.03, gamma=0.6, window=3, baseline_window=1, min_position=1)
    _snr_boundary_triton(s, torch.tensor([-1, 11, 10]), out, **options)
    assert out[:2].tolist() == [-1, -1]
    assert out[2].item() == snr_boundary_reference(s[2:], torch.tensor([10]))[0].item()


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("backend", BACKENDS)
def test_rejects_bad_input(backend):
    s = torch.rand(2, 6)
    n = torch.tensor([6, 6])
    with kernel_backend(backend):
        for name, value, error in [
            ("tau_jump", 0.0, ValueError),
            ("tau_jump", -0.1, ValueError),
            ("tau_jump", NAN, ValueError),
            ("tau_jump", "0.1", TypeError),
            ("gamma", -0.01, ValueError),
            ("gamma", NAN, ValueError),
            ("window", 0, ValueError),
            ("window", 2.0, TypeError),
            ("baseline_window", 0, ValueError),
            ("min_position", 0, ValueError),
            ("min_position", True, TypeError),
        ]:
            with pytest.raises(error, match=name):
                snr_boundary(s, n, **{name: value})
        with pytest.raises(ValueError, match="valid_len"):
            snr_boundary(s, torch.tensor([6, 6, 6]))
        with pytest.raises(ValueError, match="valid_len"):
            snr_boundary(s, torch.tensor([[6, 6]]))
        with pytest.raises(TypeError, match="valid_len"):
            snr_boundary(s, torch.tensor([6.0, 6.0]))
        with pytest.raises(ValueError, match="valid_len"):
            snr_boundary(s, torch.tensor([7, 6]))
        with pytest.raises(ValueError, match="valid_len"):
            snr_boundary(s, torch.tensor([-1, 6]))
        with pytest.raises(ValueError, match="valid_len"):
            snr_boundary(s, torch.tensor([6, 6], device="meta"))
        with pytest.raises(ValueError, match="sparsity"):
            snr_boundary(torch.rand(6), torch.tensor([6]))
        with pytest.raises(TypeError, match="sparsity"):
            snr_boundary(s.to(torch.int32), n)
        with pytest.raises(TypeError, match="sparsity"):
            snr_boundary(s.tolist(), n)


# ---------------------------------------------------------------------------------- properties

_PROPERTY = settings(max_examples=25, deadline=None, derandomize=True, database=None)


@_PROPERTY
@given(data=st.data())
def test_property_planted_jump_is_found_exactly(data):
    window = data.draw(st.integers(1, 4), label="window")
    baseline_window = data.draw(st.integers(1, 3), label="baseline_window")
    tau = data.draw(st.floats(0.01, 0.2), label="tau_jump")
    gamma = data.draw(st.floats(0.1, 1.0), label="gamma")
    N = data.draw(st.integers(window + 2, 3 * BLOCK), label="N")
    p = data.draw(st.integers(1, N - window), label="p")
    min_position = data.draw(st.integers(1, p), label="min_position")
    valid_len = data.draw(st.integers(p + window, N), label="valid_len")
    level = data.draw(st.floats(0.0, 0.5), label="level")
    pre_amp = data.draw(st.floats(0.0, 0.8), label="pre_amp") * tau  # < tau: the dense part never fires
    jump = (tau + pre_amp) * data.draw(st.floats(1.1, 3.0), label="jump_factor") + 1e-4
    plat_amp = 0.9 * gamma * (jump - pre_amp) * data.draw(st.floats(0.0, 1.0), label="plateau_factor")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    g = torch.Generator().manual_seed(seed)
    s = level + pre_amp * torch.rand(1, N, generator=g, dtype=torch.float64)
    s[0, p:] = level + jump + plat_amp * torch.rand(N - p, generator=g, dtype=torch.float64)
    s = s.float()
    options = dict(
        tau_jump=tau, gamma=gamma, window=window, baseline_window=baseline_window, min_position=min_position
    )
    n = torch.tensor([valid_len])
    assert _run("triton", s, n, **options).tolist() == [p + 1]
    assert _run("reference", s, n, **options).tolist() == [p + 1]


@_PROPERTY
@given(data=st.data())
def test_property_drift_below_tau_never_fires(data):
    window = data.draw(st.integers(1, 4), label="window")
    baseline_window = data.draw(st.integers(1, 3), label="baseline_window")
    tau = data.draw(st.floats(0.01, 0.2), label="tau_jump")
    gamma = data.draw(st.floats(0.0, 5.0), label="gamma")
    N = data.draw(st.integers(0, 3 * BLOCK), label="N")
    valid_len = data.draw(st.integers(0, N), label="valid_len")
    kind = data.draw(st.sampled_from(["flat", "up", "down", "walk"]), label="kind")
    # every step below tau / (baseline_window + 1): no min(W) - baseline can reach tau
    step = tau / (baseline_window + 1) * 0.9
    seed = data.draw(st.integers(0, 2**16), label="seed")
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(N, generator=g, dtype=torch.float64)
    steps = {"flat": 0 * u, "up": step * u, "down": -step * u, "walk": step * (2 * u - 1)}[kind]
    s = (0.5 + torch.cumsum(steps, 0)).float().reshape(1, N)
    options = dict(tau_jump=tau, gamma=gamma, window=window, baseline_window=baseline_window)
    n = torch.tensor([valid_len])
    assert _run("triton", s, n, **options).tolist() == [valid_len]
    assert _run("reference", s, n, **options).tolist() == [valid_len]


_ANY_FLOAT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.floats(0.0, 1.0, width=32),
    st.sampled_from([0.0, 0.5, 1.0, NAN, INF, -INF]),
)


@_PROPERTY
@given(
    rows=st.lists(st.lists(_ANY_FLOAT, min_size=0, max_size=2 * BLOCK + 2), min_size=1, max_size=3),
    data=st.data(),
)
def test_property_result_in_range_for_any_input(rows, data):
    N = max(len(r) for r in rows)
    s = torch.tensor([r + [0.5] * (N - len(r)) for r in rows], dtype=torch.float32).reshape(len(rows), N)
    valid_len = torch.tensor([data.draw(st.integers(0, N), label="valid_len") for _ in rows])
    options = dict(
        tau_jump=data.draw(st.floats(1e-3, 0.5), label="tau_jump"),
        gamma=data.draw(st.floats(0.0, 2.0), label="gamma"),
        window=data.draw(st.integers(1, 4), label="window"),
        baseline_window=data.draw(st.integers(1, 3), label="baseline_window"),
    )
    tri = _run("triton", s, valid_len, **options)
    ref = _run("reference", s, valid_len, **options)
    assert torch.equal(tri, ref)
    assert ((tri >= 0) & (tri <= valid_len)).all()
    assert torch.equal(ref, _brute_force_rows(s, valid_len, **options))
