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
    return measure_interleaved({None: fn}, reps, rounds=1, settle=0.0, warmup=warmup)[None]


def measure_interleaved(fns: dict, reps=10, rounds=3, settle=0.3, warmup=1) -> dict:
    """Like ``measure`` for several functions, timed in turns: ``rounds`` rounds, in each of which every
    function gets a pause of ``settle`` seconds, ``warmup`` untimed calls, then its share of the ``reps``
    timed calls.  A machine whose speed drifts during the run slows all alike, and the pause lets the idle
    threads another runtime left spinning (OpenBLAS's, OpenMP's) go to sleep first.  Returns {name: Timing}."""
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    result = {}
    for r in range(rounds):
        for name, fn in fns.items():
            time.sleep(settle)
            for _ in range(warmup):
                fn()
            for _ in range(reps // rounds + (r < reps % rounds)):
                c0, t0 = time.process_time(), time.perf_counter()
                result[name] = fn()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    return {name: Timing(float(np.median(wall[name])), float(np.min(wall[name])), float(np.median(cpu[name])),
                         result.get(name)) for name in fns}
