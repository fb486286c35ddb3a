"""Shared pytest set-up: the Triton interpreter, seeds, markers, options.

``TRITON_INTERPRET=1`` must be set before triton decorates any kernel, so it is set here,
before the packages under test are imported. Kernel tests run the Triton kernels in the
interpreter on CPU tensors; whole-model tests pin the torch reference backend where they do
not test a kernel (``reference_kernels`` fixture), because the interpreter is slow.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import random  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true", help="shrink the adversarial shape lists")


# One torch thread: the models under test are tiny, and with two threads torch's pool
# spin-waits against any other process on a 2-core machine (20-60x slower, measured).
torch.set_num_threads(int(os.environ.get("SEER_TEST_THREADS", "1")))


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture
def reference_kernels():
    """Run seer_kernels ops on their torch references inside the test (fast CPU path)."""
    from seer_kernels import kernel_backend

    with kernel_backend("reference"):
        yield


@pytest.fixture
def quick(request) -> bool:
    return bool(request.config.getoption("--quick"))
