"""seer_kernels as registered torch ops (issue 16): every public op computes through
``torch.ops.seer.<op>``; each op's fake gives the real outputs' shapes; ``torch.compile(fullgraph=True)``
traces a model layer of each path (padded, packed varlen, DyLLM's row set) with the ops inside and
equals eager; and under ``emulate_device()`` the public functions read nothing on the host outside
an op (the CUDA path, run on CPU tensors with the references standing in for the kernels)."""

from __future__ import annotations

import contextlib
import importlib
import math

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

import seer_kernels as sk
from bench.kernel_calls import TABLES, device_count, kernel_calls
from seer_kernels import emulate_device, in_kernel, kernel_backend
from seer_kernels.slice_repack_control import BUFFER_FIELDS
from seer_runtime.adapter import PackedLayout, PaddedLayout, Taps
from tests.tiny_models import tiny
from tests.tolerances import assert_close

pytestmark = [pytest.mark.custom_ops]

OPS = [
    "mlp_sparsity", "swiglu_sparsity", "snr_boundary", "varlen_attention", "slice_repack", "cosine_saliency",
    "gather_rows", "scatter_rows", "partial_attention", "row_linear", "rms_norm", "rotary_embedding", "exchange_rows",
    "row_linear_pair",
]  # fmt: skip


def _count(n: int) -> torch.Tensor:
    return device_count(n)


def _calls() -> dict:
    """One call of every public op (bench/kernel_calls.py), ``op -> (function, args, kwargs)``."""
    return kernel_calls()


def _clone(tree):
    def clone(x):
        if isinstance(x, sk.SliceRepackOutput):
            return type(x)(*(getattr(x, f).clone() for f in BUFFER_FIELDS))
        return x.clone() if isinstance(x, torch.Tensor) else x

    return tree_map(clone, tree)


def _outputs(result) -> list[torch.Tensor]:
    """The tensors a public op returns (slice_repack: its buffers)."""
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, sk.SliceRepackOutput):
        return [getattr(result, f) for f in BUFFER_FIELDS]
    return list(result)


def _tensors(tree) -> list[torch.Tensor]:
    """Every tensor in an argument tree (slice_repack's buffers included), in order."""
    found: list[torch.Tensor] = []

    def visit(x):
        found.extend(_outputs(x) if isinstance(x, sk.SliceRepackOutput | torch.Tensor) else [])
        return x

    tree_map(visit, tree)
    return found


def _assert_same(a, b, msg=""):
    for x, y in zip(_outputs(a), _outputs(b), strict=True):
        assert torch.equal(x.nan_to_num(-7.0), y.nan_to_num(-7.0)), msg


class SeerOps(TorchDispatchMode):
    """Records the ``seer`` ops dispatched (the implementations themselves run unobserved)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "seer":
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_every_public_op_is_registered_and_dispatched():
    calls = _calls()
    assert sorted(calls) == sorted(OPS)
    for name, (fn, args, kwargs) in calls.items():
        assert isinstance(getattr(torch.ops.seer, name), torch._ops.OpOverloadPacket)
        with kernel_backend("reference"), SeerOps() as seen:
            fn(*args, **kwargs)
        assert seen.ops == [name], (name, seen.ops)


def _refuse_dispatch(monkeypatch, name: str) -> None:
    def through_dispatcher(*args, **kwargs):
        raise AssertionError(f"{name} went through the dispatcher")

    monkeypatch.setattr(sk._dispatch.registered_op(name), "overload", through_dispatcher)


@pytest.mark.parametrize("name", OPS)
def test_plain_eager_inference_skips_the_dispatcher_with_the_same_result(name, monkeypatch):
    """Grad off and nothing watching: the public op calls the implementation itself (the
    dispatcher's round trip is most of its host cost), and gets what the dispatcher's call gets."""
    fn, args, kwargs = _calls()[name]
    dispatched_args, dispatched_kwargs = _clone(args), _clone(kwargs)
    with kernel_backend("reference"):
        dispatched = fn(*dispatched_args, **dispatched_kwargs)  # grad on: through torch.ops.seer
    _refuse_dispatch(monkeypatch, name)
    direct_args, direct_kwargs = _clone(args), _clone(kwargs)
    with kernel_backend("reference"), torch.no_grad():
        direct = fn(*direct_args, **direct_kwargs)
    _assert_same(dispatched, direct, name)
    # and the buffers it writes (out=, exchanged rows, repack buffers)
    _assert_same(_tensors((dispatched_args, dispatched_kwargs)), _tensors((direct_args, direct_kwargs)),
                 f"{name}'s arguments")


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated", "ignore::torch.jit.TracerWarning")
def test_jit_trace_records_the_registered_op():
    """``torch.jit.trace`` (deprecated, still used by exporters) under ``no_grad`` sees
    ``seer::<op>`` in its graph, not the reference's aten ops: tracing turns the direct call and
    the host-side value checks off, as torch.compile does."""
    fn, args, kwargs = _calls()["gather_rows"]
    src, index, count = args

    def gather(src_, index_):
        return fn(src_, index_, count, **kwargs)

    with kernel_backend("reference"), torch.no_grad():
        traced = torch.jit.trace(gather, (src, index), check_trace=False)
        assert "seer::gather_rows" in str(traced.graph), traced.graph
        torch.testing.assert_close(traced(src, index), gather(src, index), rtol=0, atol=0)


@pytest.mark.parametrize("watcher", ["autograd", "dispatch mode", "function mode", "fake tensors",
                                     "inference mode + dispatch mode"])
def test_anything_watching_gets_the_registered_op(watcher, monkeypatch):
    """Autograd on, a TorchDispatchMode (FakeTensor, a graph recorder, the sync audit), a
    TorchFunctionMode: the call goes through ``torch.ops.seer.<op>``, as torch.compile's does."""
    fn, args, kwargs = _calls()["gather_rows"]
    op = sk._dispatch.registered_op("gather_rows")
    overload, calls = op.overload, []

    def counted(*a, **k):
        calls.append(1)
        return overload(*a, **k)

    monkeypatch.setattr(op, "overload", counted)
    grad = {"autograd": torch.enable_grad(), "inference mode + dispatch mode": torch.inference_mode()}.get(
        watcher, torch.no_grad())
    class PassThrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    mode = {"dispatch mode": SeerOps(), "inference mode + dispatch mode": SeerOps(), "function mode":
            PassThrough(), "fake tensors": FakeTensorMode()}.get(watcher, contextlib.nullcontext())
    with kernel_backend("reference"), emulate_device(), grad, mode:  # the device path: fakes have no values
        if watcher == "fake tensors":
            args = tree_map(lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, args)
        fn(*args, **kwargs)
    assert calls == [1], watcher


def test_the_direct_call_runs_inside_the_kernel_scope(monkeypatch):
    """``in_kernel()`` is True while the implementation runs, whichever way it was called."""
    module = importlib.import_module("seer_kernels.row_gather_scatter")
    reference, inside = module.gather_rows_reference, []

    def recording(*args, **kwargs):
        inside.append(in_kernel())
        return reference(*args, **kwargs)

    monkeypatch.setattr(module, "gather_rows_reference", recording)
    fn, args, kwargs = _calls()["gather_rows"]
    _refuse_dispatch(monkeypatch, "gather_rows")
    with kernel_backend("reference"), torch.no_grad():
        fn(*args, **kwargs)
    assert inside == [True] and not in_kernel()


# --------------------------------------------------------------------- (a) the ops themselves


def _op_args(name: str, args: tuple, kwargs: dict) -> tuple[tuple, list[torch.Tensor]]:
    """The registered op's arguments for a public call, and the buffers it writes."""
    if name == "gather_rows":
        src, index, count = args
        out = torch.zeros(index.shape[0], *src.shape[1:])
        return (src, index, count, 0, True, out), [out]
    if name == "scatter_rows":
        dst, index, count, src = args
        return (dst, index, count, 0, src), [dst]
    if name == "row_linear":
        return (*args[:3], args[3], 0), []
    if name == "row_linear_pair":
        return (*args, 0), []
    if name == "exchange_rows":
        table, index, count, rows = args
        return (table, index, count, 0, rows, False), []  # the public function returns the previous rows only
    if name == "rms_norm":
        return (*args, kwargs["index"], kwargs["count"], 0), []
    if name == "rotary_embedding":
        return (*args, kwargs["full_precision"], kwargs["index"], kwargs["count"], 0), []
    if name == "cosine_saliency":
        ctx, cache, tau = args
        bufs = [torch.empty(ctx.shape[0], dtype=torch.int32), torch.empty(1, dtype=torch.int32),
                torch.empty(ctx.shape[0])]  # fmt: skip
        return (ctx, cache, tau, kwargs["n_rows"], 0, -1, *bufs, None), bufs
    if name == "partial_attention":
        q = args[0]
        out = torch.zeros_like(q)
        return (*args[:11], args[11], 0, 1 / math.sqrt(q.shape[-1]), kwargs["k_old"], out), [out]
    if name == "varlen_attention":
        out = torch.zeros_like(args[0])
        return (*args, args[0].shape[-1] ** -0.5, False, out), [out]
    if name == "mlp_sparsity":
        return (*args, kwargs["lengths"]), []
    if name == "swiglu_sparsity":
        product = torch.empty_like(args[0])
        return (*args, kwargs["lengths"], product), [product]
    if name == "snr_boundary":
        return (*args, 0.03, 0.6, 3, 1, 1), []
    if name == "slice_repack":
        buffers = [getattr(kwargs["out"], f) for f in BUFFER_FIELDS]
        tables = [torch.tensor(t, dtype=torch.int32) for t in TABLES.values()]
        return (*args, None, None, *tables, 0.2, 4, 0, None, *buffers), buffers
    raise AssertionError(name)


@pytest.mark.parametrize("name", OPS)
def test_the_registered_op_is_the_public_function(name):
    """The op called directly (interpreter kernels, as every kernel test) gives the public function's result."""
    fn, args, kwargs = _calls()[name]
    want = fn(*_clone(args), **_clone(kwargs))
    op_args, written = _op_args(name, *_clone((args, kwargs)))
    returned = getattr(torch.ops.seer, name)(*op_args)
    returned = list(returned) if isinstance(returned, tuple) else [returned]
    _assert_same(want, [t for t in (*written, *returned) if t is not None], name)


# ------------------------------------------------------------------------- (b) fake kernels


@pytest.mark.parametrize("name", OPS)
def test_fake_outputs_have_the_real_shapes(name):
    """The public function on fake tensors (its device path: a fake tensor has no values to check)."""
    fn, args, kwargs = _calls()[name]
    if name == "slice_repack":  # tables as tensors: a sequence would be uploaded and cached as a fake
        kwargs = dict(kwargs, **{k: torch.tensor(v, dtype=torch.int32) for k, v in TABLES.items()})
    with kernel_backend("reference"):
        real = fn(*_clone(args), **_clone(kwargs))
    with FakeTensorMode() as mode, emulate_device():
        fake_args, fake_kwargs = tree_map(
            lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, (args, kwargs)
        )
        if name == "slice_repack":  # a dataclass of buffers: rebuild it from fake tensors
            buffers = (getattr(kwargs["out"], f) for f in BUFFER_FIELDS)
            fake_kwargs["out"] = type(kwargs["out"])(*(mode.from_tensor(t) for t in buffers))
        fake = fn(*fake_args, **fake_kwargs)
    for r, f in zip(_outputs(real), _outputs(fake), strict=True):
        assert (f.shape, f.dtype, f.device) == (r.shape, r.dtype, r.device), name


@pytest.mark.parametrize("name", OPS)
def test_opcheck(name):
    """torch.library.opcheck: schema (declared mutations), fake tensors, AOT dispatch."""
    fn, args, kwargs = _calls()[name]
    if "lengths" in kwargs:  # full lengths: opcheck compares outputs without equal_nan
        kwargs = dict(kwargs, lengths=torch.full_like(kwargs["lengths"], args[0].shape[-2]))
    op_args, _ = _op_args(name, *_clone((args, kwargs)))
    with kernel_backend("reference"):
        torch.library.opcheck(getattr(torch.ops.seer, name).default, op_args)


def test_opcheck_cosine_saliency_writing_its_salient_flags():
    """The optional written buffer (``Tensor(d!)? salient``) passes opcheck too."""
    _, args, kwargs = _calls()["cosine_saliency"]
    op_args, _ = _op_args("cosine_saliency", *_clone((args, kwargs)))
    salient = torch.zeros(args[0].shape[0], dtype=torch.bool)
    with kernel_backend("reference"):
        torch.library.opcheck(torch.ops.seer.cosine_saliency.default, (*op_args[:-1], salient))


# --------------------------------------------------------- (c) torch.compile of a model layer

def _layer_inputs(seed: int):
    model = tiny("dream-v0-instruct-7b", seed=seed)  # GQA and biased K/V projections
    g = torch.Generator().manual_seed(seed)
    return model, g


def _compiled_equals_eager(step, make_state, ops: set[str], backend: str = "aot_eager"):
    """``step(*state)`` eagerly and compiled in one graph (fullgraph) holding ``ops``, from equal
    fresh states: the outputs and the states it wrote agree (tests/tolerances.py).

    ``aot_eager`` runs Dynamo, the fakes and AOT functionalisation of the declared mutations (what
    the ops must support) without Inductor's C++ build, which costs tens of seconds on 2 cores."""
    counter = CompileCounterWithBackend(backend)
    eager_state, compiled_state = make_state(), make_state()
    with kernel_backend("reference"), torch.no_grad():
        want = step(*eager_state)
        got = torch.compile(step, fullgraph=True, backend=counter)(*compiled_state)
    traced = {str(n.target) for g in counter.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert counter.frame_count == 1 and {f"seer.{op}.default" for op in ops} <= traced, traced
    for w, c in zip(_tensors((want, eager_state)), _tensors((got, compiled_state)), strict=True):
        if w.is_floating_point():
            assert_close(c, w)
        else:
            assert torch.equal(c, w)


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def test_compiled_padded_layer_equals_eager():
    """The padded path with the Seer probe tap (swiglu_sparsity inside the layer)."""
    model, g = _layer_inputs(1)
    B, L = 2, 7
    positions = torch.arange(L).expand(B, L)
    key_mask = torch.ones(B, L, dtype=torch.bool)
    key_mask[1, :2] = False
    cos, sin = model.rope(positions)

    def step(hidden):
        taps = Taps(mlp_sparsity_eps=0.05)
        out = model.layer(0, hidden, PaddedLayout(positions, key_mask), rope=(cos, sin), taps=taps)
        return out, taps.mlp_sparsity

    state = lambda: (torch.randn(B, L, model.hidden_size, generator=g.manual_seed(2)),)  # noqa: E731
    _compiled_equals_eager(step, state, {"swiglu_sparsity"})


def test_compiled_packed_layer_equals_eager():
    """The packed varlen path (varlen_attention inside the layer)."""
    model, g = _layer_inputs(2)
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    positions = torch.cat([torch.arange(3), torch.arange(7)])
    layout = PackedLayout(positions, cu, cu, 7, 7)
    cos, sin = model.rope(positions)

    def step(hidden):
        return model.layer(1, hidden, layout, rope=(cos, sin))

    _compiled_equals_eager(step, lambda: (torch.randn(10, model.hidden_size, generator=g.manual_seed(3)),),
                           {"varlen_attention"})  # fmt: skip


class CachedRows:
    """A small ``LayerRows`` over cached K/V, contexts and FFN outputs, called as DyLLM's sparse
    layer calls the ops (unchecked, into its own buffers): K/V of the row set exchanged into the
    caches (the previous keys and the values' change out), partial attention with the key
    correction into a kept output, the salient set and flags from cosine_saliency into kept
    buffers (index padded with row 0), the FFN outputs scattered into their cache. Row sets are
    fixed-capacity index buffers with int32 device counts."""

    def __init__(self, keys, values, contexts, ffn_cache, kv_index, kv_count, cu, max_len, tau=0.999):
        self.keys, self.values, self.contexts, self.ffn_cache = keys, values, contexts, ffn_cache
        self.kv_index, self.kv_count = kv_index, kv_count
        self.cu, self.max_len, self.tau = cu, max_len, tau
        rows = contexts.shape[0]
        head_dim = keys.shape[-1]
        self.attention_out = torch.zeros(rows, contexts.shape[1] // head_dim, head_dim)  # [T, H, d]
        self.saliency = (torch.empty(rows, dtype=torch.int32), torch.empty(1, dtype=torch.int32),
                         torch.empty(rows), torch.empty(rows, dtype=torch.bool))

    def attend(self, q, k, v):
        index, count = self.kv_index, self.kv_count
        delta_v = sk.exchange_rows(self.values, index, count, v, delta=True, check=False)
        k_old = sk.exchange_rows(self.keys, index, count, k, check=False)
        slots = torch.arange(index.shape[0])
        exact = torch.zeros(q.shape[0] + 1, dtype=torch.bool).index_fill_(
            0, torch.where(slots < count, index, q.shape[0]), True
        )[:-1]
        cached = self.contexts.view(q.shape)
        return sk.partial_attention(q, self.keys, self.values, cached, delta_v, self.cu, self.cu, self.max_len,
                                    self.max_len, exact, index.to(torch.int32), count, k_old=k_old,
                                    out=self.attention_out, check=False)  # fmt: skip

    def ffn_index(self, ctx):
        index, count, similarity, salient = self.saliency
        sk.cosine_saliency(ctx, self.contexts, self.tau, out_index=index, out_count=count, out_similarity=similarity,
                           out_salient=salient, index_pad=0, check=False)
        self.contexts.copy_(ctx)
        self.salient = (index, count)
        return self.salient

    def ffn_output(self, out):
        index, count = self.salient
        sk.scatter_rows(self.ffn_cache, index, count, out, check=False)
        return self.ffn_cache.clone()


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_row_set_layer_equals_eager(backend):
    """DyLLM's row-set path: rms_norm, rotary_embedding, exchange_rows, row_linear_pair (biased K/V,
    gate/up), row_linear (down), scatter_rows, partial_attention and cosine_saliency inside one compiled
    layer, counts on the device; once through Inductor too (its handling of ops that write their
    arguments)."""
    model, g = _layer_inputs(3)
    T, Hk, d = 10, model.num_kv_heads, model.head_dim
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    positions = torch.cat([torch.arange(4), torch.arange(6)])
    layout = PackedLayout(positions, cu, cu, 6, 6)
    cos, sin = model.rope(positions)

    def make_state():
        g.manual_seed(4)
        caches = [torch.randn(T, Hk, d, generator=g), torch.randn(T, Hk, d, generator=g),
                  torch.randn(T, model.num_heads * d, generator=g), torch.randn(T, model.hidden_size, generator=g)]
        index = torch.tensor([1, 2, 6, 9] + [0] * (T - 4))
        return (torch.randn(T, model.hidden_size, generator=g), *caches, index, _count(4))

    def step(hidden, keys, values, contexts, ffn_cache, index, count):
        rows = CachedRows(keys, values, contexts, ffn_cache, index, count, cu, 6)
        return model.layer(2, hidden, layout, rope=(cos, sin), taps=Taps(rows=rows))

    ops = {"exchange_rows", "row_linear", "row_linear_pair", "scatter_rows", "partial_attention", "cosine_saliency",
           "rms_norm", "rotary_embedding"}
    _compiled_equals_eager(step, make_state, ops, backend)


# ----------------------------------------------- (d) the device path reads nothing on the host


class HostReads(TorchFunctionMode):
    """Tensor reads on the host outside an op implementation (``in_kernel()``): ``item``,
    ``tolist``, ``int()``/``bool()``/``float()`` and ops whose output shape depends on the data."""

    METHODS = {"item", "tolist", "numpy", "__int__", "__bool__", "__float__", "__index__"}
    OPS = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten._unique2", "aten.unique_dim",
           "aten.unique_consecutive", "aten.equal", "aten.is_nonzero", "aten.bincount"}  # fmt: skip

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []
        recorder = self

        class Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = str(func.overloadpacket)
                bool_index = name.startswith("aten.index") and any(
                    isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else [])
                    or [])  # fmt: skip
                if (name in HostReads.OPS or bool_index) and not in_kernel():
                    recorder.reads.append(name)
                return func(*args, **(kwargs or {}))

        self._dispatch = Dispatch()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.METHODS and not in_kernel():
            self.reads.append(f"Tensor.{func.__name__}")
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        super().__enter__()
        self._dispatch.__enter__()
        return self

    def __exit__(self, *exc):
        self._dispatch.__exit__(*exc)
        return super().__exit__(*exc)


@pytest.mark.parametrize("name", OPS)
def test_device_path_reads_nothing_on_the_host(name):
    fn, args, kwargs = _calls()[name]
    with kernel_backend("reference"):
        host = fn(*_clone(args), **_clone(kwargs))
        with emulate_device(), HostReads() as recorder:
            emulated = fn(*_clone(args), **_clone(kwargs))
    assert recorder.reads == [], f"{name} read on the host outside a kernel: {recorder.reads}"
    _assert_same(host, emulated, name)


def test_the_recorder_sees_host_checks_outside_emulation():
    # the host path checks values (lengths, cu_seqlens, index ranges): the same calls must be seen reading
    read = []
    for name, (fn, args, kwargs) in _calls().items():
        with kernel_backend("reference"), HostReads() as recorder:
            fn(*_clone(args), **_clone(kwargs))
        read += [name] if recorder.reads else []
    assert set(read) >= {"mlp_sparsity", "snr_boundary", "varlen_attention", "slice_repack", "gather_rows",
                         "scatter_rows", "partial_attention", "rms_norm", "rotary_embedding",
                         "exchange_rows"}  # fmt: skip


def test_slice_repack_tensor_tables_need_out_on_the_device_path():
    values, keep_len = torch.randn(2, 6, 4), torch.tensor([3, 5])
    tables = {k: torch.tensor(v, dtype=torch.int32) for k, v in TABLES.items()}
    sk.slice_repack(values, keep_len, **tables)  # host path: the tables are read to size the buffers
    with emulate_device(), pytest.raises(ValueError, match="out="):
        sk.slice_repack(values, keep_len, **tables)


def test_op_implementations_run_in_kernel(monkeypatch):
    module = importlib.import_module("seer_kernels.row_linear")
    seen = []
    reference = module.row_linear_reference

    def spy(*args, **kwargs):
        seen.append(in_kernel())
        return reference(*args, **kwargs)

    monkeypatch.setattr(module, "row_linear_reference", spy)
    assert not in_kernel()
    with kernel_backend("reference"):
        sk.row_linear(torch.randn(3, 2), torch.randn(4, 2), None, _count(2))
    assert seen == [True] and not in_kernel()
