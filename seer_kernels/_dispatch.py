"""Backend selection, the ``seer`` op library and the device-path rules shared by every op.

Every public op validates its inputs (the hot-loop ops can skip that with ``check=False`` when
their caller built the arguments itself) and then computes through one registered torch op,
``torch.ops.seer.<op>`` (defined with :func:`define_op` at import, touching no device), called
through a :class:`SeerOp`. The op's implementation asks :func:`use_triton` whether to launch
the Triton kernel or to run the torch reference:

* CUDA tensor                       -> Triton kernel;
* CPU tensor                        -> torch reference (also the router's eager fallback);
* CPU tensor and ``TRITON_INTERPRET=1`` -> Triton kernel in the interpreter (how CI tests kernels).

``SEER_KERNEL_BACKEND=reference|triton|auto`` (default ``auto``) or the :func:`kernel_backend`
context manager override the choice, e.g. to keep whole-model CPU tests on the fast reference
path while the interpreter is enabled for the kernel tests in the same process.

The registered ops are what ``torch.compile(fullgraph=True)`` and other frameworks' CUDA graphs
see: each has a fake implementation that gives its outputs' shapes from its inputs' shapes, and
each declares the buffers it writes (``Tensor(a!)``). They are plain ``torch.library`` ops
(opaque to Inductor), not ``triton_op``: a ``triton_op``'s body doubles as its fake and is traced
by ``torch.compile`` on every device, but on the CPU our body is the reference, which reads values
on the host; and three kernels launch with their own ``enable_fp_fusion``, which Inductor's
launch of a user kernel does not take (it applies its global setting), so their bits would change.
A ``torch.library.Library`` op also dispatches with less Python around it than a ``custom_op``.
In plain eager inference (grad off, no dispatch or function mode, not tracing) a public op calls
the registered op's implementation directly (:class:`SeerOp`): the dispatcher's round trip is most of
an op's host cost, and nothing is there to see it; anything that watches ops still gets
``torch.ops.seer.<op>``.

Host reads: a public op reads tensor values on the host (to check them) only on its *host
path* (:func:`host_path`): a tensor not on a GPU, in eager mode, outside :func:`emulate_device`.
On the device path (a CUDA tensor, ``emulate_device()``, or while ``torch.compile`` traces) it
checks shapes, dtypes and devices only, and counts stay on the device. ``emulate_device()``
lets CPU tests run the CUDA path with the kernels' stand-ins (the reference, or the kernel in
the interpreter) computing; every op implementation runs inside :func:`in_kernel`, so an audit
of host reads can tell a stand-in's reads (a kernel's on a GPU) from the caller's.

Nothing here touches ``triton.runtime.driver`` or queries a device at import time.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator

import torch

_VALID_BACKENDS = ("auto", "triton", "reference")
_override = threading.local()
_scope = threading.local()  # per thread: emulating (bool), kernel_depth (int)

#: the namespace of every op: ``torch.ops.seer.<op>``
OP_NAMESPACE = "seer"
_LIBRARY = torch.library.Library(OP_NAMESPACE, "DEF")
_REGISTERED: dict[str, SeerOp] = {}  # op name -> the callable its public function computes through
#: None, or a callable ``name -> context manager``: while set (a profile is being taken, see
#: :func:`set_op_ranges`), every op call goes through the dispatcher inside one such range
_op_ranges: Callable | None = None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def current_backend() -> str:
    """The backend in force: the innermost :func:`kernel_backend` or ``SEER_KERNEL_BACKEND``."""
    forced = getattr(_override, "backend", None)
    if forced is not None:
        return forced
    backend = os.environ.get("SEER_KERNEL_BACKEND", "auto").lower()
    if backend not in _VALID_BACKENDS:
        raise ValueError(f"SEER_KERNEL_BACKEND must be one of {_VALID_BACKENDS}, got {backend!r}")
    return backend


@contextlib.contextmanager
def _thread_setting(store: threading.local, name: str, value: object) -> Iterator[None]:
    previous = getattr(store, name, None)
    setattr(store, name, value)
    try:
        yield
    finally:
        setattr(store, name, previous)


@contextlib.contextmanager
def kernel_backend(backend: str) -> Iterator[None]:
    """Force ``"triton"``, ``"reference"`` or ``"auto"`` dispatch inside a ``with`` block (per thread)."""
    if backend not in _VALID_BACKENDS:
        raise ValueError(f"backend must be one of {_VALID_BACKENDS}, got {backend!r}")
    with _thread_setting(_override, "backend", backend):
        yield


def use_triton(tensor: torch.Tensor) -> bool:
    """Whether an op on ``tensor`` should launch its Triton kernel rather than the torch reference."""
    backend = current_backend()
    if backend == "reference":
        return False
    if tensor.is_cuda:
        return True
    if tensor.device.type == "cpu" and (backend == "triton" or interpreting()):
        if not interpreting():
            raise RuntimeError(
                "the triton backend was forced for a CPU tensor, but TRITON_INTERPRET=1 is not set "
                "(Triton runs on CPU only in its interpreter)"
            )
        return True
    return False


@contextlib.contextmanager
def emulate_device() -> Iterator[None]:
    """Inside the block (per thread) the public ops take their CUDA code path on CPU tensors.

    No host-side value checks and no host reads in the public functions, as for CUDA tensors;
    the op still computes on the CPU with its stand-in (the torch reference, or the kernel in
    the interpreter when :func:`use_triton` says so). With ``seer_runtime.sync_audit.SyncAudit``
    this counts on a CPU what a GPU step would read.
    """
    with _thread_setting(_scope, "emulating", True):
        yield


def emulating() -> bool:
    """Whether :func:`emulate_device` is in force in this thread."""
    return bool(getattr(_scope, "emulating", False))


def host_path(tensor: torch.Tensor) -> bool:
    """Whether a public op may read ``tensor``'s values on the host (to validate them).

    True for a tensor not on a GPU, in eager mode, outside :func:`emulate_device`. False on the
    device path: a CUDA tensor (a read would wait for the device), ``emulate_device()``, or while
    ``torch.compile`` or ``torch.jit.trace`` traces (a read would break the graph, or be frozen
    into it as a constant).
    """
    if torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None:
        return False
    return not tensor.is_cuda and not emulating()


def in_kernel() -> bool:
    """True while an op implementation runs (a Triton launch, or the reference standing in for
    the kernel): host reads made there are the kernel's, not the caller's."""
    return getattr(_scope, "kernel_depth", 0) > 0


def _dispatcher_needed(first: object) -> bool:
    """Whether an op call must go through the torch dispatcher rather than straight to its
    implementation: something may watch or transform it (a ``TorchDispatchMode`` such as
    FakeTensor, a recording graph backend or the sync audit; a ``TorchFunctionMode``;
    ``torch.compile`` or ``torch.jit.trace`` tracing; functorch transforms), autograd is on, or
    the first argument is not a plain tensor (a subclass dispatches through
    ``__torch_dispatch__``).

    Only the first argument's type is looked at (checking every argument would cost about a
    microsecond per call, ~30 us per DyLLM layer-step): a tensor subclass passed further on
    (quantized or distributed weights) reaches the implementation as it is, which runs the
    reference through the subclass's own ops on the CPU and, on a GPU, fails in the Triton launch
    (a wrapper subclass has no data pointer); call ``torch.ops.seer.<name>`` (the op's
    ``overload``) to send such arguments through their ``__torch_dispatch__``.
    ``torch.set_default_device`` is a function mode, so it turns the direct call off."""
    return (type(first) is not torch.Tensor or torch.is_grad_enabled() or torch.compiler.is_compiling()
            or torch._C._len_torch_dispatch_stack() > 0 or torch._C._is_torch_function_mode_enabled()
            or torch._C._are_functorch_transforms_active() or torch._C._get_tracing_state() is not None)


class SeerOp:
    """The callable a public op computes through: ``torch.ops.seer.<name>`` (:attr:`overload`),
    or, in plain eager inference (grad off, nothing watching the dispatcher:
    :func:`_dispatcher_needed`), the same implementation called directly. The dispatcher's
    round trip (boxing the arguments against the schema and calling back into Python) costs the
    host more than the rest of a call (bench/RESULTS.md); skipping it changes nothing a caller
    can see: the implementation and its :func:`in_kernel` scope are the same, and whatever
    traces, records or audits ops (``torch.compile``, ``make_fx``, a CUDA-graph recorder, a
    ``TorchDispatchMode``) still sees ``torch.ops.seer.<name>``."""

    __slots__ = ("overload", "_implementation", "name")

    def __init__(self, overload: torch._ops.OpOverload, implementation: Callable):
        self.overload = overload
        self._implementation = implementation
        self.name = overload.name()  # "seer::<op>"

    def __call__(self, *args, **kwargs):
        if _op_ranges is not None:  # a profile: the dispatcher records the op (torch.profiler), in a named range
            with _op_ranges(self.name):
                return self.overload(*args, **kwargs)
        if _dispatcher_needed(args[0] if args else None):
            return self.overload(*args, **kwargs)
        return self._implementation(*args, **kwargs)

    def __repr__(self) -> str:
        return f"SeerOp({self.overload})"


def define_op(schema: str, implementation: Callable, fake: Callable) -> SeerOp:
    """Register ``torch.ops.seer.<name>`` from ``schema`` (``"name(Tensor x, ...) -> ..."``).

    ``implementation`` serves every device (it launches the kernel or runs the reference, as
    :func:`use_triton` decides) with :func:`in_kernel` True; ``fake`` gives the outputs' shapes
    and dtypes from the inputs' alone. It is the op's ``Meta`` kernel, which FakeTensor (and so
    ``torch.compile``) runs for an op without a ``register_fake`` entry; ``register_fake`` would
    serve too, but it inspects its caller's source at each registration (import time, see
    bench/RESULTS.md). Ops that write a buffer declare it ``Tensor(a!)`` and return nothing for
    it: an op output may not alias an input. Returns the :class:`SeerOp` the public function
    calls (its ``overload``: the registered default overload).
    """
    name = schema.split("(", 1)[0]

    @functools.wraps(implementation)
    def in_scope(*args, **kwargs):
        # a counter rather than a context manager: this runs on every call of every op
        _scope.kernel_depth = getattr(_scope, "kernel_depth", 0) + 1
        try:
            return implementation(*args, **kwargs)
        finally:
            _scope.kernel_depth -= 1

    _LIBRARY.define(schema)
    _LIBRARY.impl(name, in_scope, "CompositeExplicitAutograd")
    _LIBRARY.impl(name, fake, "Meta")
    op = _REGISTERED[name] = SeerOp(getattr(getattr(torch.ops, OP_NAMESPACE), name).default, in_scope)
    return op


def set_op_ranges(factory: Callable | None) -> Callable | None:
    """While ``factory`` (``name -> context manager``) is set, every op call goes through the
    dispatcher (so ``torch.profiler`` records it as ``seer::<op>``) inside ``factory("seer::<op>")``
    (an NVTX range, or a null context when the profiler's own op record is enough); None restores
    the direct call of plain eager inference. Returns the previous factory. Set by
    ``seer_runtime.profiling`` while its ranges are on; costs nothing while unset but one global
    read per op call."""
    global _op_ranges
    previous, _op_ranges = _op_ranges, factory
    return previous


def registered_op(name: str) -> SeerOp:
    """The :class:`SeerOp` of ``torch.ops.seer.<name>`` (KeyError naming the known ops otherwise)."""
    if name not in _REGISTERED:
        raise KeyError(f"no seer op named {name!r}; registered: {sorted(_REGISTERED)}")
    return _REGISTERED[name]


def split_count(count: int | torch.Tensor) -> tuple[torch.Tensor | None, int]:
    """An int-or-tensor count as the ops take it: ``(tensor or None, int)``.

    A device count stays a tensor (never read on the host); a host int travels as an int, so a
    CUDA call with an int count uploads nothing.
    """
    if isinstance(count, torch.Tensor):
        return count, 0
    return None, int(count)


def check_tensor(
    name: str,
    tensor: object,
    *,
    dtypes: tuple[torch.dtype, ...] | None = None,
    min_dim: int | None = None,
    dim: int | None = None,
) -> torch.Tensor:
    """Validate a tensor argument, raising ``TypeError``/``ValueError`` that names ``name``."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if dtypes is not None and tensor.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({allowed}), got {str(tensor.dtype).replace('torch.', '')}")
    if dim is not None and tensor.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(tensor.shape)}")
    if min_dim is not None and tensor.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dims, got shape {tuple(tensor.shape)}")
    return tensor


def check_count(
    name: str,
    count: object,
    capacity: int,
    capacity_name: str,
    dtypes: tuple[torch.dtype, ...] = (torch.int32, torch.int64),
) -> None:
    """Validate an int-or-tensor row count without reading a tensor's value.

    A host int must lie in ``[0, capacity]``; a tensor must have one element of one of ``dtypes``
    (its value stays on the device: out-of-range values act as the nearest end in the kernels).
    """
    if isinstance(count, torch.Tensor):
        if count.dtype not in dtypes or count.numel() != 1:
            allowed = "/".join(str(d).replace("torch.", "") for d in dtypes)
            raise ValueError(
                f"{name} must be an int or an {allowed} tensor of one element, got {count.dtype} "
                f"shape {tuple(count.shape)}"
            )
    elif isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"{name} must be an int or an int32 [1] tensor, got {type(count).__name__}")
    elif not 0 <= count <= capacity:
        raise ValueError(f"{name} must be in [0, {capacity}] ({capacity_name}), got {count}")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """Raise ``ValueError`` naming the arguments when the given tensors live on different devices."""
    present = {k: v for k, v in tensors.items() if v is not None}
    devices = {v.device for v in present.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{k} on {v.device}" for k, v in present.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def single_config_when_interpreting(configs: list) -> list:
    """Autotune with more than one config fails in the interpreter: keep the first there."""
    return configs[:1] if interpreting() else configs
