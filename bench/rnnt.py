"""Benchmark: RNN-T losses, forward + backward, on the CPU.

    /work/venv/bin/python bench/rnnt.py [--reps N] [--mode MODE]

Shape B=8, T=150, U=40, V=128, float32, full lengths.  Times
``ptnative.rnnt_loss`` (reduction "sum", value and gradient w.r.t. the logits)
and ``multiblank_rnnt_loss`` with durations (2, 4, 8) on the same shape,
against, in the same run:

* ``torchaudio.functional.rnnt_loss`` on the CPU (logits in, fused
  log-softmax, reduction "sum", ``backward()``), when torchaudio is installed;
* the float64 numpy reference of ``tests/reference/rnnt.py`` (one run).

Prints median / min wall times and the median process CPU time over ``--reps``
runs after a warm-up, the joint elements (B*T*(U+1)*K) per second (median
wall), and ratios (peer's median wall time / ptnative's).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

from ptnative.ops.rnnt import multiblank_rnnt_loss, rnnt_loss  # noqa: E402
from timing import measure, record  # noqa: E402  (bench/timing.py)

B, T, U, V = 8, 150, 40, 128


def timeit(fn, reps):
    """(median wall, min wall, median process CPU time) in seconds; the CPU
    time is steadier on a shared machine (all peers here run one thread)."""
    t = measure(fn, reps)
    return t.median, t.best, t.cpu


def make_data(K, blank_classes, seed=0):
    rng = np.random.default_rng(seed)
    acts = rng.normal(size=(B, T, U + 1, K)).astype(np.float32)
    non_blank = np.array([k for k in range(K) if k not in blank_classes])
    labels = rng.choice(non_blank, size=(B, U)).astype(np.int32)
    return acts, labels, np.full(B, T, np.int32), np.full(B, U, np.int32)


def report(name, timing, elements, base=None):
    med, best, cpu = timing
    ratio = f"  {med / base[0]:6.1f}x ptnative's time" if base else ""
    print(f"  {name:<40s} median {med * 1e3:8.1f} ms  min {best * 1e3:8.1f} ms  cpu {cpu * 1e3:8.1f} ms  "
          f"{elements / med / 1e6:7.1f} M elem/s{ratio}")


def bench_ptnative(loss_fn, acts, labels, act_lens, label_lens, mode, reps, **kw):
    x = pt.tensor4("acts", dtype="float32")
    loss = loss_fn(x, labels, act_lens, label_lens, reduction="sum", **kw)
    f = pytensor.function([x], [loss, pytensor.grad(loss, x)], mode=mode)
    f.trust_input = True
    return timeit(lambda: f(acts), reps), f(acts)


def bench_torchaudio(acts, labels, act_lens, label_lens, reps):
    try:
        import torch
        import torchaudio.functional as taf
    except Exception as e:  # not installed, or a torch/torchaudio mismatch
        print(f"  torchaudio.functional.rnnt_loss: skipped ({type(e).__name__}: {e})")
        print("    (recorded earlier on this kind of machine, not in this run: about 536-619 ms fwd+bwd)")
        return None
    logits = torch.from_numpy(acts)
    tl, al, ll = (torch.from_numpy(a).int() for a in (labels, act_lens, label_lens))

    def run():
        x = logits.detach().requires_grad_()
        cost = taf.rnnt_loss(x, tl, al, ll, blank=0, reduction="sum")
        cost.backward()
        return float(cost), x.grad.numpy()

    return timeit(run, reps), run()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--mode", default=None, help="PyTensor mode (default: the default mode, Numba)")
    parser.add_argument("--no-reference", action="store_true", help="skip the (slow) numpy reference")
    args = parser.parse_args()
    from tests.reference.rnnt import batch_lattice

    print(f"RNN-T loss, forward + backward, B={B} T={T} U={U} V={V}, float32, CPU, mode={args.mode or 'default'}")

    # ---- standard RNN-T
    K = V + 1
    data = make_data(K, {0})
    elements = B * T * (U + 1) * K
    print(f"\nrnnt_loss (blank 0, K={K}, {elements / 1e6:.2f} M joint elements)")
    ours, (cost, grad) = bench_ptnative(rnnt_loss, *data, args.mode, args.reps, blank=0)
    report("ptnative.rnnt_loss", ours, elements)
    case = f"rnnt_loss B={B} T={T} U={U} V={V}"
    record("rnnt", case, "ptnative.rnnt_loss", ours[0], ours=True, best=ours[1], cpu=ours[2])
    ta = bench_torchaudio(*data, args.reps)
    if ta is None:
        record("rnnt", case, "torchaudio.functional.rnnt_loss", None, note="not installed (or not loadable)")
    else:
        report("torchaudio.functional.rnnt_loss (CPU)", ta[0], elements, ours)
        record("rnnt", case, "torchaudio.functional.rnnt_loss", ta[0][0], best=ta[0][1], cpu=ta[0][2])
        print(f"    |cost diff| = {abs(ta[1][0] - float(cost)):.3g}, max |grad diff| = "
              f"{np.abs(ta[1][1] - grad).max():.3g}")
    if not args.no_reference:
        c0, t0 = time.process_time(), time.perf_counter()
        ref = batch_lattice(*data, blank=0)
        t_ref = time.perf_counter() - t0
        report("numpy float64 reference (1 run)", (t_ref, t_ref, time.process_time() - c0), elements, ours)
        record("rnnt", case, "numpy float64 reference (1 run)", t_ref)
        print(f"    |cost diff| / cost = {abs(ref[0].sum() - float(cost)) / abs(ref[0].sum()):.3g}, "
              f"max |grad diff| = {np.abs(ref[1] - grad).max():.3g}")

    # ---- multi-blank RNN-T
    durations = (2, 4, 8)
    K = V + 1 + len(durations)
    blank = K - 1
    data = make_data(K, set(range(blank - len(durations), blank + 1)), seed=1)
    elements = B * T * (U + 1) * K
    print(f"\nmultiblank_rnnt_loss (durations {durations}, blank {blank}, sigma 0.05, K={K}, "
          f"{elements / 1e6:.2f} M joint elements)")
    ours, (cost, grad) = bench_ptnative(multiblank_rnnt_loss, *data, args.mode, args.reps, blank=blank,
                                        big_blank_durations=durations, sigma=0.05)
    report("ptnative.multiblank_rnnt_loss", ours, elements)
    case = f"multiblank_rnnt_loss B={B} T={T} U={U} V={V} durations {durations}"
    record("rnnt", case, "ptnative.multiblank_rnnt_loss", ours[0], ours=True, best=ours[1], cpu=ours[2])
    print("  torchaudio: no multi-blank loss (espnet/NeMo's run only on CUDA)")
    if not args.no_reference:
        c0, t0 = time.process_time(), time.perf_counter()
        ref = batch_lattice(*data, blank=blank, durations=durations, sigma=0.05)
        t_ref = time.perf_counter() - t0
        report("numpy float64 reference (1 run)", (t_ref, t_ref, time.process_time() - c0), elements, ours)
        record("rnnt", case, "numpy float64 reference (1 run)", t_ref)
        print(f"    |cost diff| / cost = {abs(ref[0].sum() - float(cost)) / abs(ref[0].sum()):.3g}, "
              f"max |grad diff| = {np.abs(ref[1] - grad).max():.3g}")


if __name__ == "__main__":
    main()
