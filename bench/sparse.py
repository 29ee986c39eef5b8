"""Sparse-op benchmark: ptnative's batched index and COO ops vs the same work in numpy and in pytensor.

Workloads (float32):
  * subtensor_batched_index, forward + gradient, x (T=500, B=32, D=1000);
  * sparse_to_dense, N=2000 entries per batch entry (with duplicates) into (T=500, B=32, D=1000);
  * and (unless --no-sweep) both again at (T, B, D) = 100x32x1000, 500x8x1000, 500x32x250, 1000x32x2000 (N = 4 T);
  * max_and_argmax_sparse, same entries;
  * crossentropy_softmax_and_gradient_z_sparse (ce, grad_z) and pytensor.grad through ce,
    z (T=200, B=16, D=2000), 2 target entries per frame.
The numpy peers are the usual dense formulations (np.take_along_axis, np.add.at, np.maximum.at,
log-softmax); the pytensor peers build the same dense graph (advanced indexing / inc_subtensor,
pt.special.log_softmax), compiled in the default mode.  Prints median times and peer / ptnative ratios.

Usage:  python bench/sparse.py [--reps R] [--no-sweep]
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.tensor.special import log_softmax

import ptnative  # noqa: F401
from ptnative.ops.sparse import (crossentropy_softmax_and_gradient_z_sparse, max_and_argmax_sparse, sparse_to_dense,
                                 subtensor_batched_index)
from _common import peer_options  # (bench/_common.py)
from timing import measure_against  # (bench/timing.py)

opts = peer_options(__doc__, reps=20, sweep=True)
MODE = opts.mode
DTYPE = "float32"
rng = np.random.default_rng(0)
results = []


def compare(name, shape, ours, peers):
    """Time ptnative's ``ours`` and each of ``peers`` ({name: fn}) in alternating turns; keep and record the row."""
    T, B, D = shape
    t = measure_against("sparse", f"{name}, T={T} B={B} D={D}", ours, peers, opts.reps)
    results.append((f"{name} {T}x{B}x{D}", t["ptnative"].median, [(peer, t[peer].median) for peer in peers]))


def close(a, b, tol=1e-4):
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def sbi_case(T, B, D, with_pytensor):
    """subtensor_batched_index forward + gradient at (T, B, D) against numpy (and pytensor)."""
    xv = rng.normal(size=(T, B, D)).astype(DTYPE)
    idxv = rng.integers(0, D, size=(T, B))
    dyv = rng.normal(size=(T, B)).astype(DTYPE)
    x, dy = pt.tensor3("x", dtype=DTYPE), pt.matrix("dy", dtype=DTYPE)
    i_int = pt.lmatrix("i")
    y = subtensor_batched_index(x, i_int)
    f_ours = pytensor.function([x, i_int, dy], [y, pytensor.grad((y * dy).sum(), x)], mode=MODE)

    def np_sbi(x, idx, dy):
        y = np.take_along_axis(x, idx[..., None], axis=2)[..., 0]
        g = np.zeros_like(x)
        np.put_along_axis(g, idx[..., None], dy[..., None], axis=2)
        return y, g

    for a, b in zip(f_ours(xv, idxv, dyv), np_sbi(xv, idxv, dyv)):
        close(a, b)
    peers = {"numpy": lambda: np_sbi(xv, idxv, dyv)}
    if with_pytensor:
        y_pt = x[pt.arange(T)[:, None], pt.arange(B)[None, :], i_int]
        f_pt = pytensor.function([x, i_int, dy], [y_pt, pytensor.grad((y_pt * dy).sum(), x)], mode=MODE)
        peers["pytensor"] = lambda: f_pt(xv, idxv, dyv)
    compare("subtensor_batched_index fw+grad", (T, B, D), lambda: f_ours(xv, idxv, dyv), peers)


def s2d_case(T, B, D, N, with_pytensor):
    """sparse_to_dense of N entries per batch entry (half of them duplicates) into (T, B, D) against numpy (and
    pytensor)."""
    s0v = rng.integers(0, T, size=(N, B))
    s1v = rng.integers(0, D, size=(N, B))
    s0v[1::2] = s0v[::2]  # duplicates
    s1v[1::2] = s1v[::2]
    wv = rng.random((N, B)).astype(DTYPE)
    mv = (rng.random((N, B)) > 0.1).astype(DTYPE)
    s0, s1 = pt.lmatrix("s0"), pt.lmatrix("s1")
    w, m = pt.matrix("w", dtype=DTYPE), pt.matrix("m", dtype=DTYPE)
    bidx = np.broadcast_to(np.arange(B), (N, B))
    f_ours = pytensor.function([s0, s1, w, m], sparse_to_dense(s0, s1, w, m, T, D), mode=MODE)

    def np_s2d(s0, s1, w, m):
        W = np.zeros((T, B, D), DTYPE)
        np.add.at(W, (s0, bidx, s1), w * m)
        return W

    close(f_ours(s0v, s1v, wv, mv), np_s2d(s0v, s1v, wv, mv))
    peers = {"numpy": lambda: np_s2d(s0v, s1v, wv, mv)}
    if with_pytensor:
        dense = pt.zeros((T, B, D), DTYPE)[s0, pt.as_tensor(bidx), s1].inc(w * m)
        f_pt = pytensor.function([s0, s1, w, m], dense, mode=MODE)
        close(f_pt(s0v, s1v, wv, mv), np_s2d(s0v, s1v, wv, mv))
        peers["pytensor"] = lambda: f_pt(s0v, s1v, wv, mv)
    compare("sparse_to_dense", (T, B, D), lambda: f_ours(s0v, s1v, wv, mv), peers)
    return s0v, s1v, wv, mv


# ---------------------------------------------------------------- subtensor_batched_index, sparse_to_dense
T, B, D, N = 500, 32, 1000, 2000
sbi_case(T, B, D, with_pytensor=True)
s0v, s1v, wv, mv = s2d_case(T, B, D, N, with_pytensor=True)
if opts.sweep:  # around the main shape: W from 4 to 256 MB
    for shape in [(100, 32, 1000), (500, 8, 1000), (500, 32, 250), (1000, 32, 2000)]:
        sbi_case(*shape, with_pytensor=False)
    for shape in [(100, 32, 1000), (500, 8, 1000), (500, 32, 250), (1000, 32, 2000)]:
        s2d_case(*shape, N=4 * shape[0], with_pytensor=False)

s0, s1 = pt.lmatrix("s0"), pt.lmatrix("s1")
w, m = pt.matrix("w", dtype=DTYPE), pt.matrix("m", dtype=DTYPE)
bidx = np.broadcast_to(np.arange(B), (N, B))
zeros_tb = np.zeros((T, B), DTYPE)
om, oa = pt.matrix("om", dtype=DTYPE), pt.matrix("oa", dtype=DTYPE)
f_ours = pytensor.function([s0, s1, w, m, om, oa], list(max_and_argmax_sparse(s0, s1, w, m, om, oa)), mode=MODE)

def np_maxarg(s0, s1, w, m):
    W = np.zeros((T, B, D), DTYPE)
    np.maximum.at(W, (s0, bidx, s1), np.where(m > 0.1, w, 0))
    return W.max(axis=2), W.argmax(axis=2)


got, want = f_ours(s0v, s1v, wv, mv, zeros_tb, zeros_tb), np_maxarg(s0v, s1v, wv, mv)
close(got[0], want[0])
assert (got[1] == want[1])[want[0] > 0].all()
compare("max_and_argmax_sparse", (T, B, D), lambda: f_ours(s0v, s1v, wv, mv, zeros_tb, zeros_tb),
        {"numpy (dense)": lambda: np_maxarg(s0v, s1v, wv, mv)})

# ---------------------------------------------------------------- crossentropy_softmax_and_gradient_z_sparse
T, B, D = 200, 16, 2000
zv = rng.normal(size=(T, B, D)).astype(DTYPE)
zmv = np.ones((T, B), DTYPE)
tv = np.repeat(np.arange(T), 2)[:, None] * np.ones((1, B), np.int64)  # 2 entries per frame
iv = rng.integers(0, D, size=(2 * T, B))
ywv = np.full((2 * T, B), 0.5, DTYPE)
ymv = np.ones((2 * T, B), DTYPE)
z, zm = pt.tensor3("z", dtype=DTYPE), pt.matrix("zm", dtype=DTYPE)
yt, yi = pt.lmatrix("yt"), pt.lmatrix("yi")
yw, ym = pt.matrix("yw", dtype=DTYPE), pt.matrix("ym", dtype=DTYPE)
ce, grad_z = crossentropy_softmax_and_gradient_z_sparse(z, zm, yt, yi, yw, ym)
f_ours = pytensor.function([z, zm, yt, yi, yw, ym], [ce, grad_z], mode=MODE)
f_ours_g = pytensor.function([z, zm, yt, yi, yw, ym], [ce, pytensor.grad(ce.sum(), z)], mode=MODE)
bidx2 = np.broadcast_to(np.arange(B), (2 * T, B))
y_dense = pt.zeros((T, B, D), DTYPE)[yt, pt.as_tensor(bidx2), yi].inc(yw * ym)
logp = log_softmax(z, axis=-1)
ce_pt = -(y_dense * logp).sum(axis=-1) * zm
f_pt = pytensor.function([z, zm, yt, yi, yw, ym], [ce_pt, (pt.exp(logp) - y_dense) * zm[..., None]], mode=MODE)
f_pt_g = pytensor.function([z, zm, yt, yi, yw, ym], [ce_pt, pytensor.grad(ce_pt.sum(), z)], mode=MODE)

def np_ce(z, zm, yt, yi, yw, ym):
    y = np.zeros(z.shape, DTYPE)
    np.add.at(y, (yt, bidx2, yi), yw * ym)
    zs = z - z.max(axis=-1, keepdims=True)
    lp = zs - np.log(np.exp(zs).sum(axis=-1, keepdims=True))
    return -(y * lp).sum(axis=-1) * zm, (np.exp(lp) - y) * zm[..., None]


args = (zv, zmv, tv, iv, ywv, ymv)
for a, b in zip(f_ours(*args), np_ce(*args)):
    close(a, b)
for a, b in zip(f_ours_g(*args), f_pt_g(*args)):
    close(a, b)
compare("crossentropy sparse (ce, grad_z)", (T, B, D), lambda: f_ours(*args),
        {"numpy": lambda: np_ce(*args), "pytensor": lambda: f_pt(*args)})
compare("crossentropy sparse ce + grad", (T, B, D), lambda: f_ours_g(*args),
        {"pytensor": lambda: f_pt_g(*args)})

print(f"{DTYPE}, mode {MODE or 'default'}, median of {opts.reps} runs in alternating turns; "
      "ratio = peer time / ptnative time (> 1: ptnative is faster)")
for name, ours, peers in results:
    line = f"{name:48s} ptnative {ours * 1e3:8.2f} ms"
    for peer, t in peers:
        line += f" | {peer} {t * 1e3:8.2f} ms ({t / ours:6.2f}x)"
    print(line)
