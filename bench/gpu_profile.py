"""Where the GPU time of ptnative's ops goes: one call of each graph under torch.profiler (CUPTI records every
kernel of the process, ours included), printed as a table of kernels by total device time.

    python bench/gpu_profile.py [ctc] [ctc_small] [rnnt_small]      (default: all)

Needs a CUDA GPU, torch with CUDA, and the same packages as bench/gpu.py.  Host-array mode (numpy in and out),
so the copies show up as memcpy rows.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("PTNATIVE_DEVICE", "cuda")


def ctc_graph(T, B, D, N):
    import pytensor
    import pytensor.tensor as pt

    from ctc import ctc_data  # bench/ctc.py
    from ptnative.ops import fsa

    logits, lens, targets, tlens = ctc_data(T, B, D, N)
    x = pt.tensor3("logits", dtype="float32", shape=logits.shape)
    loss = fsa.ctc_loss(x, lens, targets, tlens, blank_index=-1).sum()
    f = pytensor.function([x], [loss, pytensor.grad(loss, x)])
    return lambda: f(logits)


def rnnt_graph(B, T, U, V):
    import pytensor
    import pytensor.tensor as pt

    from ptnative.ops.rnnt import rnnt_loss

    rng = np.random.default_rng(0)
    acts = rng.normal(size=(B, T, U + 1, V)).astype(np.float32)
    labels = rng.integers(1, V, size=(B, U)).astype(np.int32)
    act_lens = np.full(B, T, np.int32)
    label_lens = np.full(B, U, np.int32)
    x = pt.tensor4("acts", dtype="float32", shape=acts.shape)
    loss = rnnt_loss(x, labels, act_lens, label_lens, blank=0, reduction="sum")
    f = pytensor.function([x], [loss, pytensor.grad(loss, x)])
    return lambda: f(acts)


GRAPHS = {
    "ctc": lambda: ctc_graph(500, 64, 1000, 100),
    "ctc_small": lambda: ctc_graph(200, 16, 50, 40),
    "rnnt_small": lambda: rnnt_graph(8, 150, 40, 128),
}


def main(names):
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        print("gpu_profile.py: no CUDA GPU visible to torch: nothing to profile")
        return 0
    torch.zeros(1, device="cuda")
    for name in names:
        run = GRAPHS[name]()
        run()
        run()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        print(f"\n== {name}: one call, {wall * 1e3:.1f} ms wall (profiled) ==")
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    wanted = sys.argv[1:] or list(GRAPHS)
    unknown = [n for n in wanted if n not in GRAPHS]
    if unknown:
        sys.exit(f"unknown graph(s) {unknown}; choose from {list(GRAPHS)}")
    sys.exit(main(wanted))
