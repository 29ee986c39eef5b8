"""What the kernel cache's checks cost (ptnative/cache.py): the full check of a library (open, fstat, record,
SHA-256, ELF segments), done once per process per library, and the memoised checks of every later call.

Libraries: the README's Double op (built here) and a large shared library (numpy's or scipy's OpenBLAS, copied
into the cache as ptnative installs its own) to show the cost per MiB.  Everything happens in a temporary cache.

Usage:  python bench/cache_trust.py [--reps R]
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import scipy

from timing import measure, record  # (bench/timing.py)

ARGS = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ARGS.add_argument("--reps", type=int, default=200)
opts = ARGS.parse_args()

os.environ["PTNATIVE_CACHE_DIR"] = tempfile.mkdtemp(prefix="ptnative-bench-cache-")
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, after any installed ptnative
import ptnative  # noqa: E402
from ptnative import build, cache  # noqa: E402
from tests._ops_for_tests import double_spec  # noqa: E402  (the README's Double)

double = ptnative.NativeOp(**double_spec())
variant = double.variant("float64")
small = build.build(variant)
big_sources = sorted(glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "*.libs", "*.so*")) +
                     glob.glob(os.path.join(os.path.dirname(scipy.__file__), "..", "*.libs", "*.so*")),
                     key=os.path.getsize)
rows = []


def check(directory, name, cold):
    if cold:
        cache._verified.clear()
    os.close(cache.open_verified(directory, name))


with cache.Directory(small.parent) as d:
    libs = [("Double (CPU)", small.name, small.stat().st_size)]
    if big_sources:
        data = Path(big_sources[-1]).read_bytes()
        d.install("big.so", data)
        libs.append((os.path.basename(big_sources[-1]), "big.so", len(data)))
    for label, name, size in libs:
        cold = measure(lambda: check(d, name, True), reps=max(5, opts.reps // 10))
        warm = measure(lambda: check(d, name, False), reps=opts.reps)
        rows.append((f"{label}, {size / 2**20:.2f} MiB: full check (first load in a process)", cold.median))
        rows.append((f"{label}: memoised check", warm.median))
rows.append(("build(variant), library present (path, directory and memoised checks)",
             measure(lambda: build.build(variant), reps=opts.reps).median))
build.load(variant)
rows.append(("open_library(variant), loaded (path and memo)", measure(lambda: build.open_library(variant),
                                                                      reps=opts.reps).median))
rows.append(("load(variant), loaded (the drivers' path: a dict lookup)", measure(lambda: build.load(variant),
                                                                                 reps=opts.reps).median))
width = max(len(r) for r, _ in rows)
print(f"kernel cache checks (median of the timed calls; cache {os.environ['PTNATIVE_CACHE_DIR']})")
for label, seconds in rows:
    print(f"  {label:<{width}}  {seconds * 1e6:10.1f} us")
    record("cache_trust", "kernel cache checks", label, seconds, ours=True)
shutil.rmtree(os.environ["PTNATIVE_CACHE_DIR"], ignore_errors=True)
