"""Fixtures shared by the CPU benchmarks in bench/."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture
def cpu_threads():
    """Run the CPU timing on SEER_BENCH_THREADS torch threads, restoring the count afterwards."""
    previous = torch.get_num_threads()
    threads = int(os.environ.get("SEER_BENCH_THREADS", "1"))
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(previous)
