#!/usr/bin/env python3
"""Time from a fresh process with every cache empty to the first result of ``ctc_loss``, ``rnnt_loss`` (each with
its gradient) and ``edit_distance`` in the default mode (docs/install.md).

    python scripts/first_call_latency.py [--repeat 3] [--no-prebuilt] [ctc rnnt edit_distance]

Each run is a new interpreter with its own empty kernel cache (``PTNATIVE_CACHE_DIR``), Numba cache
(``NUMBA_CACHE_DIR``) and PyTensor compile directory, all in a temporary folder; it prints its phases (imports,
graph, ``pytensor.function``, first call) and the compiler's share of them.  ``--no-prebuilt`` sets
``PTNATIVE_PREBUILT=0`` (every kernel compiles, as without the package's prebuilt libraries).  The best run of
each function is printed last.  Run it with the interpreter of the installation to measure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import pytensor, pytensor.tensor as pt
t_pytensor = time.perf_counter()
import ptnative
from ptnative import build
t_ptnative = time.perf_counter()
compiled = []
real_compile = build._compile

def timed_compile(variant, directory, path):
    start = time.perf_counter()
    real_compile(variant, directory, path)
    compiled.append(time.perf_counter() - start)

build._compile = timed_compile
rng = np.random.default_rng(0)
which = sys.argv[1]
if which == "ctc":
    x, xl, y, yl = pt.tensor3("x"), pt.ivector("xl"), pt.imatrix("y"), pt.ivector("yl")
    loss = ptnative.ctc_loss(x, xl, y, yl).sum()
    inputs, outputs = [x, xl, y, yl], [loss, pytensor.grad(loss, x)]
    values = [rng.normal(size=(20, 3, 6)), np.array([20, 15, 9], "int32"),
              rng.integers(0, 5, size=(3, 4)).astype("int32"), np.array([4, 3, 2], "int32")]
elif which == "rnnt":
    acts, labels, al, ll = pt.tensor4("acts"), pt.imatrix("labels"), pt.ivector("al"), pt.ivector("ll")
    loss = ptnative.rnnt_loss(acts, labels, al, ll, blank=0, reduction="sum")
    inputs, outputs = [acts, labels, al, ll], [loss, pytensor.grad(loss, acts)]
    values = [rng.normal(size=(2, 5, 4, 5)), rng.integers(1, 5, size=(2, 3)).astype("int32"),
              np.array([5, 4], "int32"), np.array([3, 2], "int32")]
else:
    a, al, b, bl = pt.imatrix("a"), pt.ivector("al"), pt.imatrix("b"), pt.ivector("bl")
    inputs, outputs = [a, al, b, bl], [ptnative.edit_distance(a, al, b, bl)]
    values = [rng.integers(0, 5, size=(3, 6)).astype("int32"), np.array([6, 3, 0], "int32"),
              rng.integers(0, 5, size=(3, 5)).astype("int32"), np.array([5, 5, 2], "int32")]
values = [v.astype(i.dtype) for v, i in zip(values, inputs)]
t_graph = time.perf_counter()
f = pytensor.function(inputs, outputs)
t_function = time.perf_counter()
f(*values)
t_call = time.perf_counter()
print(json.dumps({"total": t_call - t0, "import pytensor": t_pytensor - t0, "import ptnative": t_ptnative - t_pytensor,
                  "graph": t_graph - t_ptnative, "pytensor.function": t_function - t_graph,
                  "first call": t_call - t_function, "compiler": sum(compiled), "libraries compiled": len(compiled)}))
'''

FUNCTIONS = {"ctc": "ctc_loss + grad", "rnnt": "rnnt_loss + grad", "edit_distance": "edit_distance"}


def run_once(which: str, prebuilt: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="ptnative-latency-") as tmp:
        env = dict(os.environ, PTNATIVE_CACHE_DIR=os.path.join(tmp, "kernels"), NUMBA_CACHE_DIR=os.path.join(tmp, "numba"),
                   PYTENSORFLAGS=f"base_compiledir={os.path.join(tmp, 'pytensor')}")
        env.pop("PTNATIVE_PREBUILT", None)
        if not prebuilt:
            env["PTNATIVE_PREBUILT"] = "0"
        out = subprocess.run([sys.executable, "-c", CHILD, which], capture_output=True, text=True, env=env, cwd=tmp,
                             timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{which}: the child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(which: str, r: dict) -> str:
    phases = ", ".join(f"{k} {v:.2f}" for k, v in r.items() if k not in ("total", "libraries compiled"))
    return f"{FUNCTIONS[which]:<17} {r['total']:6.2f} s  ({phases}; {r['libraries compiled']} libraries compiled)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("functions", nargs="*", metavar="FUNCTION", help=f"of {', '.join(FUNCTIONS)} (default: all)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-prebuilt", action="store_true")
    args = parser.parse_args()
    unknown = set(args.functions) - set(FUNCTIONS)
    if unknown:
        parser.error(f"unknown function(s) {sorted(unknown)}; choose from {list(FUNCTIONS)}")
    args.functions = args.functions or list(FUNCTIONS)
    best = {}
    for _ in range(args.repeat):
        for which in args.functions:
            r = run_once(which, not args.no_prebuilt)
            print(show(which, r), flush=True)
            if which not in best or r["total"] < best[which]["total"]:
                best[which] = r
    print(f"best of {args.repeat} ({'compiled on first use' if args.no_prebuilt else 'prebuilt where shipped'}):")
    for which, r in best.items():
        print(show(which, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
