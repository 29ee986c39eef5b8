"""LSTM benchmark: forward+backward of one LSTM layer, T=100, B=32, n_in=n=256, float32, on the CPU.

Compares, in one run and with the same number of threads (timed in turns of a few calls each, so that
drift in the machine's speed affects every row alike):
  * ptnative.lstm(impl="native2")  (GEMM input projection + NativeLstm2)
  * ptnative.lstm(impl="lowmem")   (LstmLowMem)
  * the same LSTM written with pytensor.scan (default mode)
  * torch.nn.LSTM (skipped with a note when torch is not installed)
and the foundation benchmark: LstmGenericBase vs the same LSTM in pytensor.scan.  Finally the peak
memory (resident set growth) of NativeLstm2 vs LstmLowMem training for T=1000.

Usage:  python bench/lstm.py [--threads N] [--reps R] [--no-memory]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

ARGS = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ARGS.add_argument("--threads", type=int, default=os.cpu_count() or 1)
ARGS.add_argument("--reps", type=int, default=15)
ARGS.add_argument("--no-memory", action="store_true")
ARGS.add_argument("--memory-child", choices=["native2", "lowmem"], help=argparse.SUPPRESS)
opts = ARGS.parse_args()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(opts.threads)

import numpy as np  # noqa: E402
import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

import ptnative  # noqa: E402,F401
from ptnative.ops.lstm import LstmGenericBase, lstm  # noqa: E402
from timing import measure_interleaved, record  # noqa: E402  (bench/timing.py)

T, B, N_IN, N = 100, 32, 256, 256
DTYPE = "float32"
CASE = f"LSTM fwd+bwd T={T} B={B} n_in=n={N} {DTYPE}, {opts.threads} thr"  # bench/report.py's row label


def data(seed=0, T=T):
    rng = np.random.default_rng(seed)
    f = lambda *s, scale=1.0: (rng.normal(size=s) * scale).astype(DTYPE)  # noqa: E731
    return dict(x=f(T, B, N_IN), W_in=f(N_IN, 4 * N, scale=0.05), W_rec=f(N, 4 * N, scale=0.05), b=f(4 * N),
                y0=np.zeros((B, N), DTYPE), c0=np.zeros((B, N), DTYPE), mask=np.ones((T, B), DTYPE))


def symbols():
    return (pt.tensor3("x", dtype=DTYPE), pt.matrix("W_in", dtype=DTYPE), pt.matrix("W_rec", dtype=DTYPE),
            pt.vector("b", dtype=DTYPE))


def ptnative_fn(impl):
    x, W_in, W_rec, b = symbols()
    Y, c, y = lstm(x, W_in, W_rec, b, impl=impl)
    grads = pytensor.grad(Y.sum(), [x, W_in, W_rec, b])
    return pytensor.function([x, W_in, W_rec, b], [Y, *grads])


def scan_step(z_t, y_prev, c_prev, W_rec):
    a = z_t + pt.dot(y_prev, W_rec)
    n = W_rec.shape[0]
    cell_in, ig = pt.tanh(a[:, :n]), pt.sigmoid(a[:, n:2 * n])
    fg, og = pt.sigmoid(a[:, 2 * n:3 * n]), pt.sigmoid(a[:, 3 * n:])
    c = fg * c_prev + ig * cell_in
    return og * pt.tanh(c), c


def scan_fn():
    x, W_in, W_rec, b = symbols()
    Z = pt.dot(x, W_in) + b
    zeros = pt.zeros((x.shape[1], W_rec.shape[0]), dtype=DTYPE)
    (Y, C), _ = pytensor.scan(scan_step, sequences=[Z], outputs_info=[zeros, zeros], non_sequences=[W_rec],
                              strict=True, return_updates=True) if _scan_has_return_updates() else \
        pytensor.scan(scan_step, sequences=[Z], outputs_info=[zeros, zeros], non_sequences=[W_rec], strict=True)
    grads = pytensor.grad(Y.sum(), [x, W_in, W_rec, b])
    return pytensor.function([x, W_in, W_rec, b], [Y, *grads])


def _scan_has_return_updates():
    import inspect
    return "return_updates" in inspect.signature(pytensor.scan).parameters


def generic_fns():
    """LstmGenericBase vs the same recurrence (no y0; Y[t-1] = 0 feeds t = 0) in scan; input Z given."""
    Z, V_h, c = pt.tensor3("Z", dtype=DTYPE), pt.matrix("V_h", dtype=DTYPE), pt.matrix("c", dtype=DTYPE)
    i = pt.matrix("i", dtype=DTYPE)
    Y, H, d = LstmGenericBase.make_op()(Z, V_h, c, i)
    native = pytensor.function([Z, V_h, c, i], [Y, *pytensor.grad(Y.sum(), [Z, V_h, c])])

    def step(z_t, m_t, y_prev, c_prev, V_h):
        y, s = scan_step(z_t, y_prev, c_prev, V_h)
        m = m_t[:, None]
        s = s * m + c_prev * (1 - m)
        return y * m, s

    zeros = pt.zeros((Z.shape[1], V_h.shape[0]), dtype=DTYPE)
    kw = dict(sequences=[Z, i], outputs_info=[zeros, c], non_sequences=[V_h], strict=True)
    out = pytensor.scan(step, return_updates=True, **kw) if _scan_has_return_updates() else pytensor.scan(step, **kw)
    (Ys, Cs), _ = out
    scan = pytensor.function([Z, V_h, c, i], [Ys, *pytensor.grad(Ys.sum(), [Z, V_h, c])])
    return native, scan


def torch_fn():
    try:
        import torch
    except ImportError:
        return None, "torch not installed"
    torch.set_num_threads(opts.threads)
    d = data()
    model = torch.nn.LSTM(N_IN, N)
    x = torch.from_numpy(d["x"]).requires_grad_(True)

    def run():
        model.zero_grad()
        x.grad = None
        y, _ = model(x)
        y.sum().backward()

    return run, f"torch {torch.__version__}"


def _rss_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def memory_child(impl):
    """Run in a subprocess: peak resident-set growth of one forward+backward with T=1000.  The peak
    (VmHWM) is reset after compiling and warming up, so the compilers' memory does not count."""
    f = ptnative_fn(impl)
    small = data(T=10)
    f(*[small[k] for k in ("x", "W_in", "W_rec", "b")])
    big = data(T=1000)
    args = [big[k] for k in ("x", "W_in", "W_rec", "b")]
    with open("/proc/self/clear_refs", "w") as fh:  # resets VmHWM to the current RSS
        fh.write("5")
    before = _rss_mib("VmRSS")
    f(*args)
    print(_rss_mib("VmHWM") - before)


def main():
    import warnings
    warnings.simplefilter("ignore")  # scan API deprecation notes, Numba performance hints
    if opts.memory_child:
        memory_child(opts.memory_child)
        return
    print(f"LSTM forward+backward, T={T}, B={B}, n_in=n={N}, {DTYPE}, {opts.threads} thread(s), "
          f"median (min) of {opts.reps} runs\n")
    d = data()
    args = [d[k] for k in ("x", "W_in", "W_rec", "b")]
    calls = {}
    for name, make in [("ptnative native2", lambda: ptnative_fn("native2")),
                       ("ptnative lowmem", lambda: ptnative_fn("lowmem")),
                       ("pytensor.scan", scan_fn)]:
        calls[name] = (lambda f: lambda: f(*args))(make())
    run, note = torch_fn()
    if run is not None:
        calls["torch.nn.LSTM"] = run
    # Turns of a few calls each: this machine's speed drifts, and every row should see the same drift.
    results = {name: (t.median, t.best) for name, t in measure_interleaved(calls, opts.reps, rounds=5).items()}
    base, base_min = results["ptnative native2"]
    print(f"{'implementation':<20} {'median ms':>10} {'min ms':>8} {'median/native2':>15} {'min/native2':>12}")
    for name, (med, mn) in results.items():
        print(f"{name:<20} {med * 1e3:10.1f} {mn * 1e3:8.1f} {med / base:15.2f} {mn / base_min:12.2f}")
        record("lstm", CASE, name, med, ours=name.startswith("ptnative"), best=mn)
    if run is None:
        print(f"torch.nn.LSTM        skipped: {note}")
        record("lstm", CASE, "torch.nn.LSTM", None, note=note)
    else:
        tq = results["torch.nn.LSTM"]
        print(f"\nnative2 vs torch: {base / tq[0]:.2f}x torch's time by median, {base_min / tq[1]:.2f}x by min "
              f"(target <= 1.5x)")
    sc = results["pytensor.scan"]
    print(f"scan vs native2: native2 is {sc[0] / base:.1f}x faster by median, {sc[1] / base_min:.1f}x by min "
          f"(target >= 5x)")

    print("\nFoundation benchmark: LstmGenericBase vs pytensor.scan (same LSTM, input projections given)")
    rng = np.random.default_rng(1)
    gargs = [rng.normal(size=(T, B, 4 * N)).astype(DTYPE), (rng.normal(size=(N, 4 * N)) * 0.05).astype(DTYPE),
             np.zeros((B, N), DTYPE), np.ones((T, B), DTYPE)]
    native, scan = generic_fns()
    both = measure_interleaved({"native": lambda: native(*gargs), "scan": lambda: scan(*gargs)}, opts.reps)
    tn, ts = (both[k][:2] for k in ("native", "scan"))
    print(f"LstmGenericBase {tn[0] * 1e3:8.1f} ms (min {tn[1] * 1e3:.1f})   scan {ts[0] * 1e3:8.1f} ms "
          f"(min {ts[1] * 1e3:.1f})   scan/native {ts[0] / tn[0]:.1f}x by median, {ts[1] / tn[1]:.1f}x by min")
    record("lstm", "LstmGenericBase, input projections given", "ptnative LstmGenericBase", tn[0], ours=True, best=tn[1])
    record("lstm", "LstmGenericBase, input projections given", "pytensor.scan", ts[0], best=ts[1])

    if not opts.no_memory:
        print("\nPeak memory growth of one forward+backward, T=1000 (ru_maxrss, separate processes)")
        for impl in ("native2", "lowmem"):
            out = subprocess.run([sys.executable, __file__, "--threads", str(opts.threads), "--memory-child", impl],
                                 capture_output=True, text=True)
            val = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else \
                f"failed: {out.stderr.strip()[-300:]}"
            print(f"  {impl:<8} {val} MiB")


if __name__ == "__main__":
    main()
