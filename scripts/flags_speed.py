"""What a portable CPU target costs against -march=native (docs/install.md, "Compiler flags"): the HMM
log-likelihood and its gradient (default mode, T=1000, B=8, K=16, float64), compiled for each target in a kernel
cache of its own, timed in alternating turns (a fresh process per turn; each turn reports its best of N calls).

    python scripts/flags_speed.py [--rounds 5] [--calls 30] [--cache-base DIR] [TARGET ...]   # default: native x86-64-v2 x86-64-v3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = """
import json, sys, time
import numpy as np, pytensor, pytensor.tensor as pt
import ptnative
T, B, K, calls = 1000, 8, 16, int(sys.argv[1])
rng = np.random.default_rng(0)
le, lA, lpi = pt.tensor3("le", dtype="float64"), pt.matrix("lA", dtype="float64"), pt.vector("lpi", dtype="float64")
ll = ptnative.hmm_log_likelihood(le, lA, lpi).sum()
f = pytensor.function([le, lA, lpi], [ll, *pytensor.grad(ll, [le, lA, lpi])])
A = rng.dirichlet(np.ones(K), size=K)
values = [rng.normal(size=(T, B, K)), np.log(A), np.log(np.full(K, 1.0 / K))]
for _ in range(3):
    f(*values)
times = []
for _ in range(calls):
    t0 = time.perf_counter(); f(*values); times.append(time.perf_counter() - t0)
print(json.dumps(min(times)))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", default=["-march=native", "-march=x86-64-v2", "-march=x86-64-v3"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--cache-base", default=None, help="kernel caches here (kept), instead of a fresh folder")
    args = parser.parse_args()
    base = args.cache_base or tempfile.mkdtemp(prefix="ptn-flags-speed-")
    best = {t: [] for t in args.targets}
    for r in range(args.rounds + 1):  # round 0 compiles and is not counted
        for k, target in enumerate(args.targets):
            env = dict(os.environ, PTNATIVE_CXXFLAGS=target, PTNATIVE_PREBUILT="0",
                       PTNATIVE_CACHE_DIR=os.path.join(base, f"t{k}"))
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.calls)], env=env, capture_output=True,
                                 text=True, timeout=1800)
            if out.returncode != 0:
                print(f"{target}: failed\n{out.stderr[-3000:]}", file=sys.stderr)
                return 1
            if r:
                best[target].append(json.loads(out.stdout.strip().splitlines()[-1]))
    ref = statistics.median(best[args.targets[0]])
    print(f"load average {os.getloadavg()[0]:.1f}; per turn best of {args.calls} calls, median over {args.rounds} turns")
    for target, values in best.items():
        med = statistics.median(values)
        print(f"{target:>20}: {med * 1e3:8.2f} ms  (x{med / ref:.2f}; turns {', '.join(f'{v * 1e3:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
