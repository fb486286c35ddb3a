"""slice_repack compiled on CUDA: bit for bit the torch reference on every path, token ids and
bf16 hidden states, unforced and with the route decided on the host, and the device-side check
of a route decided for other lengths (which the host cannot see without a sync)."""

from __future__ import annotations

import pytest
import torch

from seer_kernels import kernel_backend, slice_repack
from seer_kernels.slice_repack_control import (
    CONTROL_SIZE,
    ERR_ROUTE,
    PATH_ERROR,
    slice_repack_buffers,
    slice_repack_decision,
)
from tests.kernels.cuda import requires_cuda
from tests.kernels.test_slice_repack import SCENARIOS, _assert_same, _scenario, _sentinel, run_both

pytestmark = [pytest.mark.gpu, pytest.mark.slice_repack, requires_cuda]

TABLES = dict(
    micro_buckets=[8, 16, 32, 64, 128, 256],
    packed_buckets=[1024, 2048, 4096, 8192, 16384],
    batch_buckets=[1, 2, 4, 8, 16, 32, 64],
)


@pytest.mark.parametrize("kind", ["ids64", "bf16"])
def test_cuda_matches_reference(kind):
    for name in SCENARIOS:
        values, keep_len, extra, tables, expected = _scenario(name, kind)
        values, keep_len = values.cuda(), keep_len.cuda()
        extra = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in extra.items()}
        host = torch.zeros(CONTROL_SIZE, dtype=torch.int32, pin_memory=True)
        got = run_both(values, keep_len, tables=tables, control_host=host, **extra)
        assert got.read().path == expected


def _model_scale(kind: str, quick: bool):
    """A batch of 64 windows of 256: token ids or bf16 hidden states of width 4096 (512 quick)."""
    g = torch.Generator().manual_seed(0)
    batch, seq_len, dim = 64, 256, 512 if quick else 4096
    if kind == "ids":
        values = torch.randint(0, 126_000, (batch, seq_len), generator=g)
    else:
        values = torch.randn(batch, seq_len, dim, generator=g).to(torch.bfloat16)
    caps = dict(batch_cap=64, bucket_cap=256, packed_cap=batch * seq_len, cu_len=batch + 1)
    return values.cuda(), caps


# name -> (keep_len of the 64 rows, extra keyword arguments)
_PATHS = {
    "static": (lambda g: torch.randint(120, 129, (64,), generator=g), {}),
    "varlen": (lambda g: torch.randint(1, 257, (64,), generator=g), {}),
    "eager": (lambda g: torch.randint(1, 5, (64,), generator=g), {"eager_max_bucket": 8}),
    "empty": (lambda g: torch.zeros(64, dtype=torch.int64), {}),
}


@pytest.mark.parametrize("path", list(_PATHS))
@pytest.mark.parametrize("kind", ["ids", "bf16"])
def test_model_scale_bitwise_and_forced_route(kind, path, quick):
    values, caps = _model_scale(kind, quick)
    make_keep, extra = _PATHS[path]
    keep = make_keep(torch.Generator().manual_seed(1))
    route = slice_repack_decision(keep.tolist(), **TABLES, **extra)
    assert route.path != PATH_ERROR
    outs = []
    for backend, forced in (("triton", None), ("reference", None), ("triton", route)):
        out = _sentinel(values, **caps)
        host = torch.zeros(CONTROL_SIZE, dtype=torch.int32, pin_memory=True)
        with kernel_backend(backend):
            outs.append(
                slice_repack(values, keep.cuda(), **TABLES, out=out, control_host=host, route=forced, **extra)
            )
    _assert_same(outs[0], outs[1])
    _assert_same(outs[2], outs[0])
    assert outs[0].read() == route == outs[2].read()


def test_route_decided_for_other_lengths_is_flagged_on_the_device():
    """Device tables and device lengths: the host checks nothing it would have to read back."""
    values, caps = _model_scale("ids", quick=True)
    keep = torch.randint(1, 257, (64,), generator=torch.Generator().manual_seed(2))
    stale = slice_repack_decision((keep + 1).clamp(max=256).tolist(), **TABLES)
    device_tables = {k: torch.tensor(v, dtype=torch.int32, device="cuda") for k, v in TABLES.items()}
    out = slice_repack_buffers(**caps, dtype=values.dtype, device="cuda")
    c = slice_repack(values, keep.cuda(), **device_tables, out=out, route=stale, check=False).read(raise_on_error=False)
    assert (c.path, c.error) == (PATH_ERROR, ERR_ROUTE)
