"""Timing shared by the benchmarks (run as scripts: ``python bench/<family>.py``)."""

import json
import os
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


WARM_SECONDS = 0.02
#: In alternating turns, a function whose calls take less than this is timed in batches of calls that take about
#: this long (timeit's way); a timing is the batch's time per call.
BATCH_SECONDS = 0.001


def measure_interleaved(fns: dict, reps=10, rounds=3, settle=0.3, warmup=1) -> dict:
    """Like ``measure`` for several functions, timed in turns: ``rounds`` rounds, in each of which every
    function gets a pause of ``settle`` seconds, ``warmup`` untimed calls (and more until ``WARM_SECONDS``
    have passed), then its share of the ``reps`` timings.  A machine whose speed drifts during the run
    slows all alike, and the pause lets the idle threads another runtime left spinning (OpenBLAS's, OpenMP's)
    go to sleep first.  The warm-up time is for the pause's own cost: on the 2-vCPU VM the first call after
    0.3 s idle took 3-6 ms and the next few 100-400 us spikes, whatever ran (a numpy loop too), which made
    the median of ten 20 us calls 150 us.

    With a pause (``settle`` > 0), a function whose warm-up calls took less than ``BATCH_SECONDS`` each is
    timed in batches of ``BATCH_SECONDS / call`` calls (fixed from the first round), each timing the batch's
    time per call: reading the process CPU clock (a system call) between single calls of ~10 us made them
    ~30 % slower than the same calls back to back (an HMM posteriors call: 14.4-15.2 us single, 11.2-11.4 us
    back to back), a cost of the timing, not of the function.  Returns {name: Timing}."""
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    batch = {}
    result = {}
    for r in range(rounds):
        for name, fn in fns.items():
            time.sleep(settle)
            start = time.perf_counter()
            warm_until = start + (WARM_SECONDS if settle else 0.0)
            calls = 0
            for _ in range(warmup):
                fn()
                calls += 1
            while time.perf_counter() < warm_until:
                fn()
                calls += 1
            if name not in batch:
                per_call = (time.perf_counter() - start) / max(calls, 1)
                batch[name] = max(1, int(BATCH_SECONDS / per_call)) if settle and calls else 1
            n = batch[name]
            for _ in range(reps // rounds + (r < reps % rounds)):
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(n):
                    result[name] = fn()
                wall[name].append((time.perf_counter() - t0) / n)
                cpu[name].append((time.process_time() - c0) / n)
    return {name: Timing(float(np.median(wall[name])), float(np.min(wall[name])), float(np.median(cpu[name])),
                         result.get(name)) for name in fns}


RECORDS_ENV = "PTNATIVE_BENCH_RECORDS"


def record(benchmark, case, impl, seconds, *, ours=False, best=None, cpu=None, note=None, versus=None):
    """Append one result row for ``bench/report.py`` to the JSON-lines file named by the environment variable
    ``PTNATIVE_BENCH_RECORDS``; nothing happens when it is unset (a benchmark run by hand only prints).

    ``benchmark``: the script's name (``"ctc"``); ``case``: the workload, e.g. ``"T=200 B=16 D=50 N=40 f32"``;
    ``impl``: what was timed; ``seconds``: its median wall time, or None when it did not run (say why in
    ``note``, e.g. ``"not installed"``); ``ours``: a ptnative row (the case's first one is the reference that
    the report's ratios divide by); ``best``: the fastest call, ``cpu``: the median process CPU time of a call (all
    threads), if measured; ``versus`` (a peer's row): the ptnative row (its ``impl``) that the peer is compared
    with when that is not the reference, a ptnative row called the same way as the peer (e.g. from numpy)."""
    path = os.environ.get(RECORDS_ENV)
    if not path:
        return
    row = {"benchmark": benchmark, "case": case, "impl": impl,
           "seconds": None if seconds is None else float(seconds), "ours": bool(ours),
           "best": None if best is None else float(best), "cpu": None if cpu is None else float(cpu), "note": note}
    if versus is not None:
        row["versus"] = versus
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def measure_against(benchmark, case, ours, peers: dict, reps=10, rounds=3) -> dict:
    """Time ptnative's ``ours`` (as ``"ptnative"``) and each of ``peers`` ({name: fn}) in alternating turns
    (``measure_interleaved``), record every row with ``record``, and return {name: Timing}."""
    timings = measure_interleaved({"ptnative": ours, **peers}, reps, rounds=rounds)
    for name, t in timings.items():
        record(benchmark, case, name, t.median, ours=name == "ptnative", best=t.best, cpu=t.cpu)
    return timings
