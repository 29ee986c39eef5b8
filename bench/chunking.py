"""Chunking benchmark: ptnative.chunk / unchunk vs the same work in numpy and in pytensor (gather formulation).

Workloads (float32, T=1000, B=16, D=256, chunk_size=100, chunk_step=50, ragged mask):
  * chunk forward;
  * unchunk forward (mean over overlaps);
  * chunk -> unchunk -> weighted sum, forward + gradient w.r.t. x (pytensor peers only; numpy has no gradient).
Prints the median time of each and the ratio peer / ptnative (> 1: ptnative is faster).

Usage:  python bench/chunking.py [--reps R]
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt

import ptnative  # noqa: F401
from ptnative.ops.chunking import chunk, n_chunks, unchunk
from _common import peer_options  # (bench/_common.py)
from timing import measure_against  # (bench/timing.py)

opts = peer_options(__doc__, reps=20)
MODE = opts.mode

T, B, D, SIZE, STEP = 1000, 16, 256, 100, 50
DTYPE = "float32"
NC = n_chunks(T, SIZE, STEP)


def compare(name, ours, peers):
    """Time ptnative's ``ours`` and each of ``peers`` ({name: fn}) in alternating turns; keep and record the row."""
    t = measure_against("chunking", f"{name}, T={T} B={B} D={D}", ours, peers, opts.reps)
    results.append((name, t["ptnative"].median, [(peer, t[peer].median) for peer in peers]))


rng = np.random.default_rng(0)
xv = rng.normal(size=(T, B, D)).astype(DTYPE)
lens = rng.integers(T // 2, T + 1, size=B)
lens[0] = T
mv = (np.arange(T)[:, None] < lens[None, :]).astype(DTYPE)
wv = rng.normal(size=(T, B, D)).astype(DTYPE)

# chunk-frame -> time-frame map, shared by the peers
T_OF = np.arange(NC)[:, None] * STEP + np.arange(SIZE)[None, :]  # (nc, size)
VALID = T_OF < T
T_CLIP = np.minimum(T_OF, T - 1)


def np_chunk(x, m):
    g = x[T_CLIP]  # (nc, size, B, D)
    keep = (m[T_CLIP] > 0.1) & VALID[:, :, None]
    g = g * keep[..., None]
    return g.transpose(1, 2, 0, 3).reshape(SIZE, B * NC, D), keep.transpose(1, 2, 0).reshape(SIZE, B * NC)


def np_unchunk(c, ci):
    cr, ir = c.reshape(SIZE, B, NC, D), ci.reshape(SIZE, B, NC)
    out = np.zeros((T, B, D), c.dtype)
    cnt = np.zeros((T, B), c.dtype)
    for k in range(NC):
        s = k * STEP
        n = min(s + SIZE, T) - s
        keep = ir[:n, :, k] > 0.1
        out[s:s + n] += cr[:n, :, k] * keep[..., None]
        cnt[s:s + n] += keep
    return out / np.maximum(cnt, 1)[..., None]


def pt_chunk(x, m):
    g = x[T_CLIP]
    keep = pt.and_(pt.gt(m[T_CLIP], 0.1), VALID[:, :, None])
    g = g * pt.cast(keep, DTYPE)[..., None]
    return g.transpose(1, 2, 0, 3).reshape((SIZE, B * NC, D)), pt.cast(keep, DTYPE).transpose(1, 2, 0).reshape(
        (SIZE, B * NC))


def pt_unchunk(c, ci):
    cr, ir = c.reshape((SIZE, B, NC, D)), ci.reshape((SIZE, B, NC))
    t_of = pt.as_tensor(T_CLIP.T)  # (size, nc)
    contrib = (cr * pt.cast(pt.gt(ir, 0.1), DTYPE)[..., None] * VALID.T[:, None, :, None]).transpose(0, 2, 1, 3)
    total = pt.zeros((T, B, D), DTYPE)[t_of].inc(contrib)
    cnt = pt.zeros((T, B), DTYPE)[t_of].inc((pt.cast(pt.gt(ir, 0.1), DTYPE) * VALID.T[:, None, :]).transpose(0, 2, 1))
    return total / pt.maximum(cnt, 1)[..., None]


x, m = pt.tensor3("x", dtype=DTYPE), pt.matrix("m", dtype=DTYPE)
c, ci = pt.tensor3("c", dtype=DTYPE), pt.matrix("ci", dtype=DTYPE)
results = []

co, coi = chunk(x, m, SIZE, STEP)
f_chunk = pytensor.function([x, m], [co, coi], mode=MODE)
p_out, p_oi = pt_chunk(x, m)
f_pt_chunk = pytensor.function([x, m], [p_out, p_oi], mode=MODE)
cv, civ = f_chunk(xv, mv)
np.testing.assert_allclose(cv, np_chunk(xv, mv)[0])
np.testing.assert_allclose(f_pt_chunk(xv, mv)[0], cv)
compare("chunk forward", lambda: f_chunk(xv, mv),
        {"numpy": lambda: np_chunk(xv, mv), "pytensor": lambda: f_pt_chunk(xv, mv)})

uo = unchunk(c, ci, SIZE, STEP, T, B)[0]
f_unchunk = pytensor.function([c, ci], uo, mode=MODE)
f_pt_unchunk = pytensor.function([c, ci], pt_unchunk(c, ci), mode=MODE)
np.testing.assert_allclose(f_unchunk(cv, civ), np_unchunk(cv, civ), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(f_pt_unchunk(cv, civ), np_unchunk(cv, civ), rtol=1e-5, atol=1e-6)
compare("unchunk forward", lambda: f_unchunk(cv, civ),
        {"numpy": lambda: np_unchunk(cv, civ), "pytensor": lambda: f_pt_unchunk(cv, civ)})

w = pt.constant(wv)
y = unchunk(*chunk(x, m, SIZE, STEP), SIZE, STEP, T, B)[0]
f_rt = pytensor.function([x, m], [y, pytensor.grad((y * w).sum(), x)], mode=MODE)
y_pt = pt_unchunk(*pt_chunk(x, m))
f_pt_rt = pytensor.function([x, m], [y_pt, pytensor.grad((y_pt * w).sum(), x)], mode=MODE)
for a, b in zip(f_rt(xv, mv), f_pt_rt(xv, mv)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
compare("chunk+unchunk fw+grad", lambda: f_rt(xv, mv), {"pytensor": lambda: f_pt_rt(xv, mv)})

print(f"T={T} B={B} D={D} chunk_size={SIZE} chunk_step={STEP} n_chunks={NC} {DTYPE}, mode {MODE or 'default'}, "
      f"median of {opts.reps}, alternating turns; ratio = peer / ptnative (> 1: ptnative is faster)")
for name, ours, peers in results:
    line = f"{name:24s} ptnative {ours * 1e3:8.2f} ms"
    for peer, t in peers:
        line += f" | {peer} {t * 1e3:8.2f} ms ({t / ours:5.2f}x)"
    print(line)
