"""Benchmarks of the automaton family (run: python bench/ctc.py [--quick] [--hmm-only | --ctc-only]).

1. ``ctc_loss`` forward + backward, float32, T=200 B=16 D=50 N=40 and T=500 B=64 D=1000 N=100, against
   ``torch.nn.functional.ctc_loss`` on the CPU (skipped if torch is missing), both at 1 and 2 threads (and all
   cores), timed in alternating turns, with the ratio ptnative / torch; at the small shape also a
   ``pytensor.scan`` CTC (log-space alpha recursion, gradient by autodiff).
2. ``hmm_log_likelihood`` with gradients, T=1000, B=8, K=16, against a
   ``pytensor.scan`` log-space forward algorithm (default mode).
3. ``hmm_log_likelihood`` with gradients at T=10000 and T=100000 (B=1, K=4): finite, linear in T.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.tensor.special import log_softmax

import ptnative
from ptnative.ops import fsa, hmm
from timing import measure, measure_interleaved, record  # noqa: E402  (bench/timing.py)


def best_time(fn, reps=10, warmup=2):
    """(median, min) seconds of ``fn()`` over ``reps`` runs."""
    t = measure(fn, reps, warmup)
    return t.median, t.best


def fmt(name, med, mn, ref=None):
    extra = f"   ratio vs ptnative: {med / ref:6.2f}x" if ref else ""
    print(f"  {name:<44s} median {med * 1e3:9.2f} ms   min {mn * 1e3:9.2f} ms{extra}")


# ------------------------------------------------------------------ CTC
def ctc_data(T=200, B=16, D=50, N=40, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(T, B, D)).astype(np.float32)
    lens = rng.integers(int(0.8 * T), T + 1, size=B).astype(np.int32)
    lens[0] = T
    tlens = rng.integers(int(0.7 * N), N + 1, size=B).astype(np.int32)
    tlens[0] = N
    targets = rng.integers(0, D - 1, size=(B, N)).astype(np.int32)  # blank = D - 1
    return logits, lens, targets, tlens


def scan_ctc(logits, lens, targets, tlens, blank):
    """CTC in pure PyTensor: log-space alpha over the extended label sequence, via scan."""
    T, B, D = logits.shape
    lp = log_softmax(logits, axis=-1)
    N = targets.shape[1]
    S = 2 * N + 1
    ext = pt.full((B, S), blank, dtype="int32")
    ext = pt.set_subtensor(ext[:, 1::2], targets)
    s_idx = pt.arange(S)
    ext_len = 2 * tlens + 1
    allow_skip = pt.concatenate([pt.zeros((B, 2), dtype="bool"),
                                 pt.and_(pt.neq(ext[:, 2:], blank), pt.neq(ext[:, 2:], ext[:, :-2]))], axis=1)
    valid_state = pt.lt(s_idx[None, :], ext_len[:, None])
    neg_inf = np.float32(-1e30)
    b_idx = pt.arange(B)[:, None]

    def emit(t):
        return lp[t][b_idx, ext]  # (B, S)

    alpha0 = pt.full((B, S), neg_inf, dtype=logits.dtype)
    e0 = emit(0)
    alpha0 = pt.set_subtensor(alpha0[:, :2], e0[:, :2])
    alpha0 = pt.switch(valid_state, alpha0, neg_inf)

    def step(t, alpha):
        a1 = pt.concatenate([pt.full((B, 1), neg_inf, dtype=alpha.dtype), alpha[:, :-1]], axis=1)
        a2 = pt.concatenate([pt.full((B, 2), neg_inf, dtype=alpha.dtype), alpha[:, :-2]], axis=1)
        a2 = pt.switch(allow_skip, a2, neg_inf)
        m = pt.maximum(pt.maximum(alpha, a1), a2)
        new = m + pt.log(pt.exp(alpha - m) + pt.exp(a1 - m) + pt.exp(a2 - m)) + emit(t)
        new = pt.switch(valid_state, new, neg_inf)
        return pt.switch(pt.lt(t, lens)[:, None], new, alpha)

    alphas = pytensor.scan(step, sequences=[pt.arange(1, T)], outputs_info=[alpha0], return_updates=False)
    final = alphas[-1]  # T > 1
    last = final[pt.arange(B), ext_len - 1]
    prev = final[pt.arange(B), pt.maximum(ext_len - 2, 0)]
    return -pt.logaddexp(last, pt.switch(pt.gt(ext_len, 1), prev, neg_inf))


def set_threads(n, torch=None):
    """``n`` CPU threads for ptnative's kernels ($PTNATIVE_NUM_THREADS, read at every call) and for torch."""
    os.environ["PTNATIVE_NUM_THREADS"] = str(n)
    if torch is not None:
        torch.set_num_threads(n)


def bench_ctc_shape(reps, T, B, D, N, with_scan):
    logits, lens, targets, tlens = ctc_data(T, B, D, N)
    print(f"ctc_loss forward+backward, T={T}, B={B}, D={D}, N={N}, float32, reduction=sum")
    x = pt.tensor3("logits", dtype="float32")
    loss = fsa.ctc_loss(x, lens, targets, tlens, blank_index=-1)
    f = pytensor.function([x], [loss.sum(), pytensor.grad(loss.sum(), x)])
    ours_loss, ours_grad = f(logits)
    case = f"ctc_loss fwd+bwd T={T} B={B} D={D} N={N} f32"
    try:
        import torch
    except ImportError:
        torch = None
        print("  torch: not installed, skipped")
        record("ctc", case, "torch.nn.functional.ctc_loss", None, note="not installed")
    peers = {}
    if torch is not None:
        xt = torch.tensor(logits, requires_grad=True)
        tt, lt, tlt = (torch.tensor(a.astype(np.int64)) for a in (targets, lens, tlens))

        def run_torch():
            xt.grad = None
            lo = torch.nn.functional.ctc_loss(torch.log_softmax(xt, -1), tt, lt, tlt, blank=D - 1, reduction="sum")
            lo.backward()
            return lo

        lo = run_torch()
        assert abs(lo.item() - float(ours_loss)) < 1e-3 * abs(lo.item()), (lo.item(), float(ours_loss))
        # torch's float32 gradient is off by up to 2.5e-3 at T=500 (ptnative's by 3e-8, both against float64)
        assert np.abs(xt.grad.numpy() - ours_grad).max() < 1e-2
        peers["torch.nn.functional.ctc_loss"] = run_torch
    threads_before = os.environ.get("PTNATIVE_NUM_THREADS")
    ref = None
    for threads in sorted({1, 2, os.cpu_count() or 1}):
        set_threads(threads, torch)
        timings = measure_interleaved({"ptnative.ctc_loss": lambda: f(logits), **peers}, reps)
        ours = timings["ptnative.ctc_loss"]
        ref = ref or ours.median
        fmt(f"ptnative.ctc_loss ({threads} thr)", ours.median, ours.best)
        print(f"  {'':<44s} CPU time per call (all threads) {ours.cpu * 1e3:9.2f} ms")
        record("ctc", case, f"ptnative.ctc_loss ({threads} thr)", ours.median, ours=True, best=ours.best, cpu=ours.cpu)
        for name, t in timings.items():
            if name == "ptnative.ctc_loss":
                continue
            fmt(f"{name} ({threads} thr)", t.median, t.best, ours.median)
            print(f"  {'':<44s} CPU time per call (all threads) {t.cpu * 1e3:9.2f} ms")
            print(f"  => ptnative / torch = {ours.median / t.median:.2f}x at {threads} thread(s) (target <= 0.7x)")
            record("ctc", case, f"{name} ({threads} thr)", t.median, best=t.best, cpu=t.cpu)
    if threads_before is None:
        del os.environ["PTNATIVE_NUM_THREADS"]
    else:
        os.environ["PTNATIVE_NUM_THREADS"] = threads_before
    if not with_scan:
        return
    sl = scan_ctc(x, pt.constant(lens), pt.constant(targets), pt.constant(tlens), D - 1)
    fs = pytensor.function([x], [sl.sum(), pytensor.grad(sl.sum(), x)])
    sv, sg = fs(logits)
    assert abs(float(sv) - float(ours_loss)) < 1e-3 * abs(float(sv)), (float(sv), float(ours_loss))
    med_s, mn_s = best_time(lambda: fs(logits), max(3, reps // 3), 1)
    fmt("pytensor.scan CTC (default mode)", med_s, mn_s, ref)
    record("ctc", case, "pytensor.scan CTC", med_s, best=mn_s)


def bench_ctc(reps):
    bench_ctc_shape(reps, T=200, B=16, D=50, N=40, with_scan=True)
    bench_ctc_shape(max(3, reps // 2), T=500, B=64, D=1000, N=100, with_scan=False)


# ------------------------------------------------------------------ HMM
def scan_hmm(le, lA, lpi):
    def step(e, la):
        return pt.logsumexp(la[:, :, None] + lA[None], axis=1) + e

    la0 = lpi[None, :] + le[0]
    las = pytensor.scan(step, sequences=[le[1:]], outputs_info=[la0], return_updates=False)
    return pt.logsumexp(las[-1], axis=-1)


def hmm_data(T, B, K, seed=0):
    rng = np.random.default_rng(seed)
    le = rng.normal(size=(T, B, K))
    lA = np.log(rng.dirichlet(np.ones(K), size=K))
    lpi = np.log(rng.dirichlet(np.ones(K)))
    return le, lA, lpi


def bench_hmm(reps, long_T):
    T, B, K = 1000, 8, 16
    print(f"hmm_log_likelihood + gradients (emissions, transitions, initial), T={T}, B={B}, K={K}, float64")
    le, lA, lpi = hmm_data(T, B, K)
    xs = [pt.tensor3("le"), pt.matrix("lA"), pt.vector("lpi")]
    ll = hmm.hmm_log_likelihood(*xs)
    f = pytensor.function(xs, [ll] + pytensor.grad(ll.sum(), xs))
    ours = f(le, lA, lpi)
    med, mn = best_time(lambda: f(le, lA, lpi), reps)
    fmt("ptnative.hmm_log_likelihood (default mode)", med, mn)
    sl = scan_hmm(*xs)
    fs = pytensor.function(xs, [sl] + pytensor.grad(sl.sum(), xs))
    theirs = fs(le, lA, lpi)
    assert np.allclose(ours[0], theirs[0]) and all(np.allclose(a, b, atol=1e-8) for a, b in zip(ours[1:], theirs[1:]))
    med_s, mn_s = best_time(lambda: fs(le, lA, lpi), max(3, reps // 3), 1)
    fmt("pytensor.scan log-space forward (default mode)", med_s, mn_s, med)
    case = f"hmm_log_likelihood+grads T={T} B={B} K={K} f64"
    record("ctc", case, "ptnative.hmm_log_likelihood", med, ours=True, best=mn)
    record("ctc", case, "pytensor.scan log-space forward", med_s, best=mn_s)
    print(f"  => ptnative.hmm_log_likelihood is {med_s / med:.1f}x faster than scan (median; "
          f"best-of-N: {mn_s / mn:.1f}x; target >= 50x, issue 16)")

    print("hmm_log_likelihood + gradients, B=1, K=4, emissions N(0, 30^2) (long sequences)")
    x = pt.tensor3("le")
    lA4, lpi4 = hmm_data(2, 1, 4)[1:]
    ll = hmm.hmm_log_likelihood(x, lA4, lpi4)
    g = pytensor.function([x], [ll, pytensor.grad(ll.sum(), x)])
    for T in (10000, long_T):
        le4 = hmm_data(T, 1, 4, seed=1)[0] * 30
        v, gr = g(le4)
        med, mn = best_time(lambda: g(le4), max(3, reps // 3), 1)
        ok = np.isfinite(v).all() and np.isfinite(gr).all() and np.allclose(gr.sum(-1), 1)
        fmt(f"T={T}: ll={float(v[0]):.6g}, finite={ok}", med, mn)
        record("ctc", f"hmm_log_likelihood+grads T={T} B=1 K=4 f64", "ptnative.hmm_log_likelihood", med, ours=True,
               best=mn, note=f"finite={ok}")


def main():
    quick = "--quick" in sys.argv
    reps = 3 if quick else 10
    print(f"ptnative {ptnative.__version__}, numpy {np.__version__}, pytensor {pytensor.__version__}")
    if "--hmm-only" not in sys.argv:
        bench_ctc(reps)
    if "--ctc-only" not in sys.argv:
        bench_hmm(reps, 20000 if quick else 100000)


if __name__ == "__main__":
    main()
