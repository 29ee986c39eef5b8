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


def measure_interleaved(fns: dict, reps=10, warmup=1) -> dict:
    """Like ``measure`` for several functions, called in turn (one call of each per round), so that a
    machine whose speed drifts during the run slows them alike.  Returns {name: Timing}."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    result = {}
    for _ in range(reps):
        for name, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            result[name] = fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return {name: Timing(float(np.median(wall[name])), float(np.min(wall[name])), float(np.median(cpu[name])),
                         result[name]) for name in fns}
