"""Timing shared by the benchmarks (run as scripts: ``python bench/<family>.py``)."""

import time
from typing import NamedTuple

import numpy as np


class Timing(NamedTuple):
    median: float  # wall seconds
    best: float  # wall seconds
    cpu: float  # median process CPU seconds (steadier on a shared machine for one-thread code)
    result: object  # what the last call returned


def measure(fn, reps=10, warmup=1) -> Timing:
    """Call ``fn()`` ``warmup`` times (compilation, caches), then time ``reps`` calls."""
    for _ in range(warmup):
        fn()
    wall, cpu, result = [], [], None
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        result = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return Timing(float(np.median(wall)), float(np.min(wall)), float(np.median(cpu)), result)
