"""seer_kernels as a package: each op is a function attribute even though a module of the same
name exists, and importing the package queries no device (torch.cuda or Triton's driver)."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
import types

import pytest

import seer_kernels

# op -> the module that defines it (named after the op family)
OP_MODULES = {
    "mlp_sparsity": "mlp_sparsity",
    "swiglu_sparsity": "mlp_sparsity",
    "snr_boundary": "snr_boundary",
    "varlen_attention": "varlen_attention",
    "slice_repack": "slice_repack",
    "cosine_saliency": "cosine_saliency",
    "gather_rows": "row_gather_scatter",
    "scatter_rows": "row_gather_scatter",
    "exchange_rows": "row_gather_scatter",
    "partial_attention": "partial_attention",
    "row_linear": "row_linear",
    "row_linear_pair": "row_linear",
    "rms_norm": "rms_norm",
    "rotary_embedding": "rotary_embedding",
}
# modules that are not an op family: the dispatch helpers, slice_repack's host-side control types
SUPPORT_MODULES = {"_dispatch", "slice_repack_control"}


def test_every_module_is_an_op_family_or_support():
    modules = {m.name for m in pkgutil.iter_modules(seer_kernels.__path__)}
    assert modules == set(OP_MODULES.values()) | SUPPORT_MODULES


def _assert_op_bound(op: str, module: str) -> None:
    fn = getattr(seer_kernels, op)
    mod = sys.modules[f"seer_kernels.{module}"]
    assert isinstance(mod, types.ModuleType)
    assert not isinstance(fn, types.ModuleType), f"seer_kernels.{op} is the module, not the op"
    assert fn is getattr(mod, op) and fn.__module__ == f"seer_kernels.{module}"
    assert getattr(seer_kernels, f"{op}_reference") is getattr(mod, f"{op}_reference")


@pytest.mark.parametrize("op, module", OP_MODULES.items())
def test_importing_the_module_leaves_the_op_bound(op, module):
    # the statement form, as a user writes it; `as` resolves the package attribute first
    namespace: dict = {}
    exec(f"import seer_kernels\nimport seer_kernels.{module} as m\nimport seer_kernels.{module}", namespace)
    assert namespace["m"] is getattr(seer_kernels, module)
    assert importlib.import_module(f"seer_kernels.{module}") is sys.modules[f"seer_kernels.{module}"]
    _assert_op_bound(op, module)


# Run in a fresh interpreter: torch.cuda's queries and Triton's driver are replaced by traps
# before seer_kernels is imported (first through a submodule, then every module), and the
# ops must still be bound afterwards.
_PROBE = r"""
import importlib, json, pkgutil, sys
import torch
import triton

calls = []

def trap(name):
    def fail(*args, **kwargs):
        calls.append(name)
        raise RuntimeError(name + " was called while importing seer_kernels")
    return fail

for name in ("is_available", "device_count", "current_device", "init", "_lazy_init", "is_initialized",
             "get_device_name", "get_device_properties", "get_device_capability", "set_device", "synchronize"):
    setattr(torch.cuda, name, trap("torch.cuda." + name))
driver_module = sys.modules["triton.runtime.driver"]  # the attribute triton.runtime.driver is the instance
driver_module._create_driver = trap("triton.runtime.driver._create_driver")
type(driver_module.driver).default = property(trap("triton.runtime.driver.default"))
type(driver_module.driver).active = property(trap("triton.runtime.driver.active"))

import seer_kernels.partial_attention  # the package is first imported through a submodule
import seer_kernels
for m in pkgutil.iter_modules(seer_kernels.__path__):
    importlib.import_module("seer_kernels." + m.name)
ops = {op: type(getattr(seer_kernels, op)).__name__ for op in sys.argv[1:]}
print(json.dumps({"calls": calls, "ops": ops}))
"""


@pytest.mark.parametrize("interpret", ["0", "1"], ids=["compiled", "interpreter"])
def test_import_queries_no_device(interpret):
    env = dict(os.environ, TRITON_INTERPRET=interpret)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, *OP_MODULES],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["calls"] == [], f"importing seer_kernels queried the device: {report['calls']}"
    assert report["ops"] == {op: "function" for op in OP_MODULES}
