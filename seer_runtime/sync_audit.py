"""Count where code makes the host wait for the device: reads and blocking copies, per range.

On a GPU every device->host read (``.item()``, ``int(t)``, ``bool(t)``, ``.tolist()``, an op
whose output shape depends on the data such as ``nonzero`` or boolean indexing) and every
blocking host->device copy (``torch.tensor(list, device=...)``, ``host.to(device)``) stalls the
stream. :class:`SyncAudit` counts them in any code it wraps, on any device; on a CPU-only
machine it tells device tensors from host tensors by provenance, so the same audit runs in CI:

* device tensors: those that existed before the audit (parameters, inputs), those created with
  a ``device=`` argument, and every op output with a device tensor among its inputs;
* host tensors: created without ``device=`` (or from a CPU generator, or pinned), and op outputs
  of host tensors only. Reading a host tensor costs nothing.

Counts are kept per range of ``seer_runtime.profiling.prange`` (the innermost open one, e.g.
``layers`` inside ``forward`` inside ``step``) and in total; ``events`` keeps what was counted
with the range stack (``record_stacks=True`` adds the Python stack, to find the culprit).
Non-blocking copies (``.to(..., non_blocking=True)``, from pinned memory) are counted apart
as ``async_reads`` / ``async_copies``: the host does not wait for them. Pair it with
``seer_kernels.emulate_device()`` so that the kernels' public functions run as on a GPU (no
host-side value checks) while their references compute; what a reference reads while it
stands in for a kernel (``seer_kernels.in_kernel()``) is the kernel's work and is not counted.
"""

from __future__ import annotations

import traceback
import weakref
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from seer_kernels import in_kernel

from . import profiling

# aten ops that read device memory on the host, or whose output shape depends on the data
_READ_OPS = {
    "aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique_dim", "aten._unique2",
    "aten.unique_consecutive", "aten.bincount", "aten.equal", "aten.is_nonzero", "aten.allclose",
}
# factory functions: their output lives where ``device=`` says (the host without it)
_FACTORIES = {
    "tensor", "as_tensor", "asarray", "full", "zeros", "ones", "empty", "arange", "linspace", "logspace",
    "rand", "randn", "randint", "randperm", "full_like", "zeros_like", "ones_like", "empty_like", "rand_like",
    "randn_like", "eye",
}
_FROM_DATA = {"tensor", "as_tensor", "asarray"}


@dataclass
class SyncEvent:
    """kind: "read", "copy", "async_read" or "async_copy"; what: the op or method; ranges: the open
    ranges, outermost first, each as (name, ordinal of its entry: 0 for the first ``step``, ...)."""

    kind: str
    what: str
    ranges: tuple[tuple[str, int], ...]
    stack: str | None = None

    def ordinal(self, name: str) -> int | None:
        """Which entry of range ``name`` this happened in (None: outside every one)."""
        return next((i for n, i in reversed(self.ranges) if n == name), None)

    def inside(self, name: str) -> bool:
        return self.ordinal(name) is not None


@dataclass
class SyncCounts:
    reads: int = 0
    copies: int = 0
    async_reads: int = 0
    async_copies: int = 0

    @property
    def total(self) -> int:
        """Blocking events: reads plus copies."""
        return self.reads + self.copies


@dataclass
class SyncAudit:
    """``with SyncAudit() as audit: ...``: then ``audit.total``, ``audit.counts[range]``,
    ``audit.events``, ``audit.ranges[name]`` (how often each range was entered)."""

    record_stacks: bool = False
    counts: dict[str, SyncCounts] = field(default_factory=dict)
    total: SyncCounts = field(default_factory=SyncCounts)
    events: list[SyncEvent] = field(default_factory=list)
    ranges: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._host: dict[int, weakref.ref] = {}  # id -> the host tensor (identity, not equality)
        self._stack: list[tuple[str, int]] = []
        self._function_mode = _FunctionMode(self)
        self._dispatch_mode = _DispatchMode(self)
        self._observe = None

    # -- ranges ---------------------------------------------------------------------------------
    def enter(self, name: str) -> None:
        self._stack.append((name, self.ranges[name]))
        self.ranges[name] += 1

    def exit(self, name: str) -> None:
        if self._stack and self._stack[-1][0] == name:
            self._stack.pop()

    def __enter__(self) -> SyncAudit:
        self._observe = profiling.observe(self)
        self._observe.__enter__()
        self._function_mode.__enter__()
        self._dispatch_mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._dispatch_mode.__exit__(*exc)
        self._function_mode.__exit__(*exc)
        self._observe.__exit__(*exc)

    def is_host(self, t: torch.Tensor) -> bool:
        ref = self._host.get(id(t))
        return ref is not None and ref() is t

    def _count(self, kind: str, what: str) -> None:
        if in_kernel():  # a kernel's stand-in (seer_kernels.emulate_device): on a GPU, the kernel's own work
            return
        where = self._stack[-1][0] if self._stack else ""
        attr = {"read": "reads", "copy": "copies", "async_read": "async_reads", "async_copy": "async_copies"}[kind]
        for c in (self.total, self.counts.setdefault(where, SyncCounts())):
            setattr(c, attr, getattr(c, attr) + 1)
        stack = "".join(traceback.format_stack(limit=14)[:-3]) if self.record_stacks else None
        self.events.append(SyncEvent(kind, what, tuple(self._stack), stack))

    def _tag(self, outputs, host: bool) -> None:
        for t in tree_flatten(outputs)[0]:
            if isinstance(t, torch.Tensor):
                if host:
                    self._host[id(t)] = weakref.ref(t)
                else:
                    self._host.pop(id(t), None)


class _FunctionMode(TorchFunctionMode):
    def __init__(self, audit: SyncAudit) -> None:
        super().__init__()
        self.audit = audit

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        audit = self.audit
        name = getattr(func, "__name__", "")
        if name in ("tolist", "numpy") and args and isinstance(args[0], torch.Tensor) and not audit.is_host(args[0]):
            audit._count("read", f"Tensor.{name}")
        elif name in ("to", "cuda", "cpu") and args and isinstance(args[0], torch.Tensor):
            src = args[0]
            target = _target_device(name, args[1:], kwargs)
            if target is not None:
                if target == "host" and not audit.is_host(src):
                    audit._count("async_read" if kwargs.get("non_blocking") else "read", f"Tensor.{name}")
                elif target == "device" and audit.is_host(src):
                    audit._count("async_copy" if kwargs.get("non_blocking") else "copy", f"Tensor.{name}")
            out = func(*args, **kwargs)
            if target is not None and isinstance(out, torch.Tensor):
                audit._tag(out, host=target == "host")
            return out
        elif name == "copy_" and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            dst, src = args[0], args[1]
            if audit.is_host(src) and not audit.is_host(dst):
                audit._count("async_copy" if kwargs.get("non_blocking") else "copy", "Tensor.copy_")
            elif audit.is_host(dst) and not audit.is_host(src):
                audit._count("async_read" if kwargs.get("non_blocking") else "read", "Tensor.copy_")
            return func(*args, **kwargs)
        if name in _FACTORIES and func.__module__ in ("torch", "torch._C._VariableFunctions", None):
            on_device = kwargs.get("device") is not None and not kwargs.get("pin_memory", False)
            gen = kwargs.get("generator")
            if gen is not None and gen.device.type == "cpu" and str(kwargs.get("device", "cpu")) == "cpu":
                on_device = False
            if name.endswith("_like") and "device" not in kwargs and args and isinstance(args[0], torch.Tensor):
                on_device = not audit.is_host(args[0])
            if on_device and name in _FROM_DATA and args and not isinstance(args[0], torch.Tensor):
                audit._count("copy", f"torch.{name}")
            out = func(*args, **kwargs)
            audit._tag(out, host=not on_device)
            return out
        return func(*args, **kwargs)


class _DispatchMode(TorchDispatchMode):
    def __init__(self, audit: SyncAudit) -> None:
        super().__init__()
        self.audit = audit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        audit = self.audit
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        host_only = bool(tensors) and all(audit.is_host(t) for t in tensors)
        op = str(func.overloadpacket)
        if not host_only:
            if op in _READ_OPS or (op == "aten.repeat_interleave" and kwargs.get("output_size") is None
                                   and len(args) == 1):
                audit._count("read", op)
            elif op in ("aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"):
                indices = args[1] if len(args) > 1 else []
                if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or []):
                    audit._count("read", f"{op} (boolean mask)")
        out = func(*args, **kwargs)
        if tensors:
            audit._tag(out, host=host_only)
        return out


def _target_device(name: str, args, kwargs) -> str | None:
    """"host", "device" or None (a dtype-only ``to``) for ``Tensor.to/cuda/cpu`` arguments."""
    if name == "cpu":
        return "host"
    if name == "cuda":
        return "device"
    dev = kwargs.get("device")
    if dev is None:
        for a in args:
            if isinstance(a, (str, torch.device)):
                dev = a
                break
            if isinstance(a, torch.Tensor):
                return None  # to(other): follows the other tensor; not a placement we can judge
    if dev is None:
        return None
    # a device named "cpu" is the host only when the caller says so explicitly by a string "cpu" literal
    return "host" if str(dev) == "cpu" and isinstance(dev, str) else "device"
