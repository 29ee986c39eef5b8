"""Batched indexing and the sparse ops against numpy references: duplicates, masks, out-of-range entries."""

import shutil

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import NullTypeGradError, verify_grad

from ptnative import NativeOp
from ptnative.ops.sparse import (CrossEntropySoftmaxAndGradientZSparse, MaxAndArgmaxSparse, SparseToDense,
                                 SparseToDenseZeros, SubtensorBatchedIndex, crossentropy_softmax_and_gradient_z_sparse,
                                 max_and_argmax_sparse, onehot_to_sparse, sparse_to_dense, subtensor_batched_index)

from .conftest import build_with_nvcc, check_infer_shape, tol
from .reference import sparse as ref


def coo(N, B, T, D, seed=0, out_of_range=True):
    """Random COO entries with duplicates, masked entries and (optionally) out-of-range indices."""
    rng = np.random.default_rng(seed)
    s0 = rng.integers(0, T, size=(N, B)).astype(np.float64)
    s1 = rng.integers(0, D, size=(N, B)).astype(np.float64)
    s0[1], s1[1] = s0[0], s1[0]  # duplicates
    w = rng.normal(size=(N, B))
    mask = (rng.random((N, B)) > 0.2).astype(np.float64)
    if out_of_range:
        s0[2, 0], s1[3, -1], s0[4, 0] = T, -1, np.nan
        mask[2, 0] = mask[3, -1] = mask[4, 0] = 1
        s1[5, 0], mask[5, 0] = D + 3, 0  # out of range but masked: never looked at
    return s0, s1, w, mask


def matrices(n, dtype="float64"):
    return [pt.matrix(f"m{k}", dtype=dtype) for k in range(n)]


# ---------------------------------------------------------------- SubtensorBatchedIndex
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_subtensor_batched_index(mode, dtype):
    if dtype == "float32" and mode not in (None, "C"):
        pytest.skip("float32 is checked in the default and C modes")
    rng = np.random.default_rng(0)
    T, B, D = 5, 3, 4
    xv = rng.normal(size=(T, B, D))
    idx = rng.integers(0, D, size=(T, B)).astype(np.float64)
    idx[0, 0], idx[1, 1], idx[2, 2], idx[3, 0] = -3, D + 2, 2.7, np.nan  # clipped, clipped, truncated, NaN -> 0
    dy = rng.normal(size=(T, B))
    x, i = pt.tensor3("x", dtype=dtype), pt.matrix("i", dtype=dtype)
    y = subtensor_batched_index(x, i)
    gx = pytensor.grad((y * dy.astype(dtype)).sum(), x)
    x2, i2 = pt.matrix("x2", dtype=dtype), pt.lvector("i2")
    f = pytensor.function([x, i], [y, gx], mode=mode)
    f2 = pytensor.function([x2, i2], subtensor_batched_index(x2, i2), mode=mode)  # 2-D x, int indices
    yv, gv = f(xv.astype(dtype), idx.astype(dtype))
    r = ref.subtensor_batched_index(xv, idx)
    rg = np.zeros_like(xv)  # the gradient of the linear map y(x), column by column
    for k in range(xv.size):
        e = np.zeros(xv.size)
        e[k] = 1
        rg.flat[k] = (ref.subtensor_batched_index(e.reshape(xv.shape), idx) * dy).sum()
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(yv, r, rtol=rtol, atol=atol)
    np.testing.assert_allclose(gv, rg, rtol=rtol, atol=atol)
    assert yv.dtype == gv.dtype == dtype
    np.testing.assert_allclose(f2(xv[:, 0].astype(dtype), np.array([0, 3, 1, 9, -1])),
                               xv[[0, 1, 2, 3, 4], 0, [0, 3, 1, 3, 0]], rtol=rtol)


def test_subtensor_batched_index_strided_strict_empty(mode):
    rng = np.random.default_rng(1)
    xv = rng.normal(size=(4, 3, 5))
    idx = rng.integers(0, 5, size=(4, 3)).astype(np.float64)
    xt, it = pt.tensor3("xt"), pt.matrix("it")
    f = pytensor.function([xt, it], subtensor_batched_index(xt.transpose(2, 1, 0), it.T, strict=True), mode=mode)
    np.testing.assert_allclose(f(np.ascontiguousarray(xv.transpose(2, 1, 0)), np.ascontiguousarray(idx.T)),
                               ref.subtensor_batched_index(xv, idx))
    bad = idx.copy()
    bad[2, 1] = 5
    with pytest.raises(ValueError, match=r"SubtensorBatchedIndex.*idx\[2, 1\] = 5 is out of range \[0, 5\)"):
        f(np.ascontiguousarray(xv.transpose(2, 1, 0)), np.ascontiguousarray(bad.T))
    assert f(np.zeros((5, 3, 0)), np.zeros((3, 0))).shape == (0, 3)
    with pytest.raises(ValueError, match="size 0 in its last dim"):
        f(np.zeros((0, 3, 4)), np.zeros((3, 4)))


def test_subtensor_batched_index_verify_grad():
    rng = np.random.default_rng(2)
    idx = pt.constant(rng.integers(0, 4, size=(3, 2)).astype(np.float64))
    verify_grad(lambda x: subtensor_batched_index(x, idx) ** 2, [rng.normal(size=(3, 2, 4))], rng=rng)


# ---------------------------------------------------------------- SparseToDense
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sparse_to_dense(mode, dtype):
    if dtype == "float32" and mode not in (None, "C"):
        pytest.skip("float32 is checked in the default and C modes")
    T, B, D, N = 4, 3, 5, 9
    s0v, s1v, wv, mv = coo(N, B, T, D, seed=3)
    s0, s1, w, m = matrices(4, dtype)
    W = sparse_to_dense(s0, s1, w, m, T, D)
    dW = np.random.default_rng(4).normal(size=(T, B, D))
    gw = pytensor.grad((W * dW.astype(dtype)).sum(), w)
    f = pytensor.function([s0, s1, w, m], [W, gw], mode=mode)
    Wv, gwv = f(*[a.astype(dtype) for a in (s0v, s1v, wv, mv)])
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(Wv, ref.dense_targets(s0v, s1v, wv, mv, T, D), rtol=rtol, atol=atol)
    np.testing.assert_allclose(gwv, ref.sparse_to_dense_weight_grad(s0v, s1v, mv, dW), rtol=rtol, atol=atol)
    assert Wv.dtype == gwv.dtype == dtype


def test_sparse_to_dense_initial_strict_and_grad(mode):
    T, B, D, N = 3, 2, 4, 6
    s0v, s1v, wv, mv = coo(N, B, T, D, seed=5)
    W0, s0, s1, w, m = pt.tensor3("W0"), *matrices(4)
    W = SparseToDense.make_op()(W0, s0, s1, w, m)
    gW0 = pytensor.grad((W ** 2).sum(), W0)
    f = pytensor.function([W0, s0, s1, w, m], [W, gW0], mode=mode)
    W0v = np.random.default_rng(6).normal(size=(T, B, D))
    Wv, gv = f(W0v, s0v, s1v, wv, mv)
    expected = W0v + ref.dense_targets(s0v, s1v, wv, mv, T, D)
    np.testing.assert_allclose(Wv, expected, rtol=1e-12)
    np.testing.assert_allclose(gv, 2 * expected, rtol=1e-12)
    fs = pytensor.function([s0, s1, w, m], sparse_to_dense(s0, s1, w, m, T, D, strict=True), mode=mode)
    with pytest.raises(ValueError, match=r"SparseToDense.*s0\[2, 0\] = 3 is out of range \[0, 3\)"):
        fs(s0v, s1v, wv, mv)
    ok = coo(N, B, T, D, seed=5, out_of_range=False)
    np.testing.assert_allclose(fs(*ok), ref.dense_targets(*ok, T, D))
    with pytest.raises(ValueError, match="SparseToDense.*mask dim 0"):
        fs(s0v, s1v, wv, mv[:2])
    # empty: no entries, no time, no batch
    assert not fs(np.zeros((0, B)), np.zeros((0, B)), np.zeros((0, B)), np.zeros((0, B))).any()
    assert fs(*[np.zeros((N, 0))] * 4).shape == (T, 0, D)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sparse_to_dense_writes_every_block(mode, dtype, poison_pattern):
    """sparse_to_dense's W is fully_written (SparseToDenseZeros): the CPU kernel zeroes it block by block (256 KiB)
    and adds each block's entries, bucketed; under the poison every element must still be written, and the
    duplicates must add up in entry order, bit for bit as np.add.at adds them."""
    if dtype == "float32" and mode not in (None, "C"):
        pytest.skip("float32 is checked in the default and C modes")
    T, B, D, N = 70, 3, 401, 500  # W spans several blocks, the last one partial
    s0v, s1v, wv, mv = coo(N, B, T, D, seed=21)
    s0v[10:20], s1v[10:20] = s0v[0], s1v[0]  # many duplicates of one slot
    s0v[-1], s1v[-1], mv[-1] = T - 1, D - 1, 1  # the last element of W
    s0, s1, w, m = matrices(4, dtype)
    f = pytensor.function([s0, s1, w, m], sparse_to_dense(s0, s1, w, m, T, D), mode=mode)
    args = [a.astype(dtype) for a in (s0v, s1v, wv, mv)]
    got = f(*args)
    want = np.zeros((T, B, D), dtype)
    ok = (mv >= 0.1) & (s0v > -1) & (s0v < T) & (s1v > -1) & (s1v < D)
    i, b = np.nonzero(ok)
    np.add.at(want, (s0v[i, b].astype(int), b, s1v[i, b].astype(int)), args[2][i, b])
    np.testing.assert_array_equal(got, want)
    assert f(*[a[:0] for a in args]).shape == (T, B, D) and not f(*[a[:0] for a in args]).any()  # no entries


@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_large_fresh_outputs_zeroed_by_the_system(mode, dtype, poison_pattern, threads, monkeypatch):
    """From 32 MiB up, sparse_to_dense's W and subtensor_batched_index's gradient are zeroed by handing their pages
    back (sparse.cu, ptn_sp_zero_fresh_pages) and memsetting the partial pages at both ends, and W's blocks are
    then filled by one thread or every thread (where the first blocks' page faults were slow): under the poison,
    every element must still be zero or the sum of its entries."""
    if mode not in (None, "C"):
        pytest.skip("checked in the default and C modes")
    monkeypatch.setenv("PTNATIVE_NUM_THREADS", threads)
    T, B, D, N = 257, 4, 8200 if dtype == "float32" else 4100, 300  # W: 33.7 MB, not a whole number of pages
    s0v, s1v, wv, mv = coo(N, B, T, D, seed=22)
    s0v[-1, -1], s1v[-1, -1], mv[-1, -1] = T - 1, D - 1, 1  # the last element, on the tail's partial page
    s0v[-2, 0], s1v[-2, 0], mv[-2, 0] = 0, 0, 1  # the first one, on the head's
    s0, s1, w, m = matrices(4, dtype)
    f = pytensor.function([s0, s1, w, m], sparse_to_dense(s0, s1, w, m, T, D), mode=mode)
    args = [a.astype(dtype) for a in (s0v, s1v, wv, mv)]
    np.testing.assert_allclose(f(*args), ref.dense_targets(s0v, s1v, args[2], mv, T, D), rtol=1e-6, atol=0)
    x, i = pt.tensor3("x", dtype=dtype), pt.matrix("i", dtype=dtype)
    y = subtensor_batched_index(x, i)
    g = pytensor.function([x, i], pytensor.grad(y.sum(), x), mode=mode)
    idx = np.random.default_rng(23).integers(0, D, size=(T, B)).astype(dtype)
    idx[0, 0], idx[-1, -1] = 0, D - 1
    want = np.zeros((T, B, D), dtype)
    np.put_along_axis(want, idx.astype(int)[..., None], 1, axis=2)
    np.testing.assert_array_equal(g(np.zeros((T, B, D), dtype), idx), want)


def test_sparse_to_dense_of_128_mib_filled_by_every_thread(poison_pattern, monkeypatch):
    """From 128 MiB up, W's fresh pages are faulted in by every thread (sparse.cu, ptn_s2d_zeros_cpu): under the
    poison, every element must still be zero or the sum of its entries, in the order of the entries."""
    monkeypatch.setenv("PTNATIVE_NUM_THREADS", "2")
    T, B, D, N = 257, 4, 32800, 600  # W: 134.9 MB, not a whole number of pages
    s0v, s1v, wv, mv = coo(N, B, T, D, seed=24)
    s0v[-1, -1], s1v[-1, -1], mv[-1, -1] = T - 1, D - 1, 1
    s0v[-2, 0], s1v[-2, 0], mv[-2, 0] = 0, 0, 1
    s0, s1, w, m = matrices(4, "float32")
    f = pytensor.function([s0, s1, w, m], sparse_to_dense(s0, s1, w, m, T, D))
    args = [a.astype("float32") for a in (s0v, s1v, wv, mv)]
    got = f(*args)
    np.testing.assert_allclose(got, ref.dense_targets(s0v, s1v, args[2], mv, T, D), rtol=1e-6, atol=0)
    del got


def test_sparse_to_dense_verify_grad():
    rng = np.random.default_rng(7)
    s0v, s1v, _, mv = coo(6, 2, 3, 4, seed=8)
    verify_grad(lambda w: sparse_to_dense(pt.constant(s0v), pt.constant(s1v), w, pt.constant(mv), 3, 4) ** 2,
                [rng.normal(size=(6, 2))], rng=rng)


def test_onehot_to_sparse():
    y, m = pt.lmatrix("y"), pt.matrix("m")
    s0, s1, w, mm = onehot_to_sparse(y, m)
    f = pytensor.function([y, m], sparse_to_dense(s0, s1, w, mm, y.shape[0], 4))
    yv = np.array([[0, 3], [2, 1], [1, 1]])
    mv = np.array([[1.0, 1], [1, 0], [1, 0]])
    np.testing.assert_array_equal(f(yv, mv), np.eye(4)[yv] * mv[:, :, None])


def test_argument_errors_name_the_function():
    m = pt.matrix()
    with pytest.raises(ValueError, match=r"^subtensor_batched_index: x must have ndim 2 or 3, got 1"):
        subtensor_batched_index(pt.vector(), pt.vector())
    with pytest.raises(TypeError, match=r"^subtensor_batched_index: x must have a float dtype .*got int64"):
        subtensor_batched_index(pt.ltensor3(), m)
    with pytest.raises(ValueError, match=r"^subtensor_batched_index: idx must have ndim 2, got 1"):
        subtensor_batched_index(pt.tensor3(), pt.vector())
    with pytest.raises(ValueError, match=r"^sparse_to_dense: mask must have ndim 2, got 3"):
        sparse_to_dense(m, m, m, pt.tensor3(), 3, 4)
    with pytest.raises(TypeError, match=r"^sparse_to_dense: weight must have a real or bool dtype, got complex128"):
        sparse_to_dense(m, m, pt.matrix(dtype="complex128"), m, 3, 4)
    with pytest.raises(ValueError, match=r"^sparse_to_dense: n_dim must be >= 0, got -4"):
        sparse_to_dense(m, m, m, m, 3, -4)
    with pytest.raises(ValueError, match=r"^max_and_argmax_sparse: out_arg must have ndim 2, got 1"):
        max_and_argmax_sparse(m, m, m, m, m, pt.vector())
    with pytest.raises(ValueError, match=r"^crossentropy_softmax_and_gradient_z_sparse: z must have ndim 3, got 2"):
        crossentropy_softmax_and_gradient_z_sparse(m, m, m, m, m, m)
    with pytest.raises(ValueError, match=r"^crossentropy_softmax_and_gradient_z_sparse: z_mask must have ndim 2"):
        crossentropy_softmax_and_gradient_z_sparse(pt.tensor3(), pt.vector(), m, m, m, m)
    with pytest.raises(ValueError, match=r"^onehot_to_sparse: mask must have ndim 2, got 1"):
        onehot_to_sparse(pt.lmatrix(), pt.vector())


# ---------------------------------------------------------------- MaxAndArgmaxSparse
def test_max_and_argmax_sparse(mode):
    T, B, D, N = 4, 3, 5, 12
    s0v, s1v, wv, mv = coo(N, B, T, D, seed=9)
    wv[6, 1] = wv[7, 1] = 9.0  # a tie: the first entry wins
    s0v[6, 1], s0v[7, 1], s1v[6, 1], s1v[7, 1], mv[6, 1], mv[7, 1] = 1, 1, 2, 4, 1, 1
    s1v[0, 2] = 3.9  # truncated
    init_max = np.where(np.arange(T)[:, None] == 2, -10.0, 0.0) * np.ones((1, B))
    init_arg = -np.ones((T, B))
    s0, s1, w, m, om, oa = matrices(6)
    f = pytensor.function([s0, s1, w, m, om, oa], list(max_and_argmax_sparse(s0, s1, w, m, om, oa)), mode=mode)
    got = f(s0v, s1v, wv, mv, init_max, init_arg)
    for g, r in zip(got, ref.max_and_argmax_sparse(s0v, s1v, wv, mv, init_max, init_arg)):
        np.testing.assert_array_equal(g, r)
    assert got[1][1, 1] == 2
    fs = pytensor.function([s0, s1, w, m, om, oa], list(max_and_argmax_sparse(s0, s1, w, m, om, oa, strict=True)),
                           mode=mode)
    with pytest.raises(ValueError, match=r"MaxAndArgmaxSparse.*s0\[2, 0\]"):
        fs(s0v, s1v, wv, mv, init_max, init_arg)
    assert fs(*[np.zeros((0, B))] * 4, init_max, init_arg)[0].shape == (T, B)


# ---------------------------------------------------------------- CrossEntropySoftmaxAndGradientZSparse
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_crossentropy_softmax_sparse(mode, dtype):
    if dtype == "float32" and mode not in (None, "C"):
        pytest.skip("float32 is checked in the default and C modes")
    T, B, D, N = 4, 3, 6, 10
    rng = np.random.default_rng(10)
    zv = rng.normal(size=(T, B, D)) * 3
    zmv = (rng.random((T, B)) > 0.25).astype(np.float64)
    s0v, s1v, wv, mv = coo(N, B, T, D, seed=11)
    wv = np.abs(wv)
    z, zm = pt.tensor3("z", dtype=dtype), pt.matrix("zm", dtype=dtype)
    s0, s1, w, m = matrices(4, dtype)
    ce, grad_z = crossentropy_softmax_and_gradient_z_sparse(z, zm, s0, s1, w, m)
    d_ce = rng.normal(size=(T, B))
    gz, gw = pytensor.grad((ce * d_ce.astype(dtype)).sum(), [z, w])
    f = pytensor.function([z, zm, s0, s1, w, m], [ce, grad_z, gz, gw], mode=mode)
    got = f(*[a.astype(dtype) for a in (zv, zmv, s0v, s1v, wv, mv)])
    r_ce, r_grad, r_dz, r_dw = ref.crossentropy_softmax_sparse(zv, zmv, s0v, s1v, wv, mv)
    rtol, atol = tol(dtype)
    expected = [r_ce, r_grad, r_dz * d_ce[:, :, None], None]
    # D_w = -D_ce[t, b] * log_softmax: weight the reference per entry
    dw = np.zeros_like(r_dw)
    for i in range(N):
        for b in range(B):
            t = ref.index_of(s0v[i, b], T)
            if t is not None:
                dw[i, b] = r_dw[i, b] * d_ce[t, b]
    expected[3] = dw
    for name, g, r in zip(["ce", "grad_z", "D_z", "D_w"], got, expected):
        assert g.dtype == dtype, name
        np.testing.assert_allclose(g, r, rtol=rtol * 5, atol=atol * 5, err_msg=name)
    assert (got[0] >= 0).all()


@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_crossentropy_softmax_sparse_long_frames(dtype, threads, monkeypatch):
    """Frames long enough for the vectorised rows (D = 16 k + 5) and, from 2^19 elements, the split of the frames
    over threads: against the reference. A NaN of either sign bit in a counted frame gives NaN ce, grad_z and D_z
    on that frame only; a frame of equal values, and one whose other values are over 87 below its maximum."""
    monkeypatch.setenv("PTNATIVE_NUM_THREADS", threads)
    T, B, D, N = 37, 15, 965, 60
    rng = np.random.default_rng(14)
    zv = rng.normal(size=(T, B, D)) * 4
    zv[3, 2, 100] = np.nan
    zv[5, 1, 964] = np.copysign(np.nan, -1.0)
    zv[6, 0] = 2.5
    zv[7, 0, 7] = 95.0  # other values of the frame are over 87 below its maximum
    zmv = (rng.random((T, B)) > 0.1).astype(np.float64)
    zmv[3, 2] = zmv[5, 1] = zmv[6, 0] = zmv[7, 0] = 1
    s0v, s1v, wv, mv = coo(N, B, T, D, seed=15, out_of_range=False)
    s0v[:4, 0] = [3, 5, 6, 7]
    s0v[:4, 2] = 3
    s0v[4:8, 1] = 5
    mv[:8] = 1
    wv = np.abs(wv)
    z, zm = pt.tensor3("z", dtype=dtype), pt.matrix("zm", dtype=dtype)
    s0, s1, w, m = matrices(4, dtype)
    ce, grad_z = crossentropy_softmax_and_gradient_z_sparse(z, zm, s0, s1, w, m)
    gz = pytensor.grad(ce.sum(), z)
    f = pytensor.function([z, zm, s0, s1, w, m], [ce, grad_z, gz])
    got = f(*[a.astype(dtype) for a in (zv, zmv, s0v, s1v, wv, mv)])
    expected = ref.crossentropy_softmax_sparse(zv, zmv, s0v, s1v, wv, mv)[:3]
    rtol, atol = tol(dtype)
    nan_frames = np.zeros((T, B), bool)
    nan_frames[3, 2] = nan_frames[5, 1] = True
    for name, g, r in zip(["ce", "grad_z", "D_z"], got, expected):
        assert np.isnan(g[nan_frames]).all(), name
        np.testing.assert_allclose(g[~nan_frames], r[~nan_frames], rtol=rtol * 5, atol=atol * 5, err_msg=name)


def test_crossentropy_softmax_sparse_verify_grad_strict_and_errors():
    rng = np.random.default_rng(12)
    T, B, D, N = 3, 2, 4, 5
    s0v, s1v, wv, mv = coo(N, B, T, D, seed=13, out_of_range=False)
    zmv = np.array([[1.0, 1], [1, 0], [1, 1]])
    consts = [pt.constant(a) for a in (zmv, s0v, s1v)]

    def cost(z, w):
        ce, _ = crossentropy_softmax_and_gradient_z_sparse(z, consts[0], consts[1], consts[2], w, pt.constant(mv))
        return ce * np.arange(1.0, T * B + 1).reshape(T, B)

    verify_grad(cost, [rng.normal(size=(T, B, D)), np.abs(wv)], rng=rng)

    z, zm = pt.tensor3("z"), pt.matrix("zm")
    s0, s1, w, m = matrices(4)
    ce, grad_z = crossentropy_softmax_and_gradient_z_sparse(z, zm, s0, s1, w, m, strict=True)
    with pytest.raises(NullTypeGradError, match=r"input 0 \(z\).*only the gradient from out_ce is implemented"):
        pytensor.grad(grad_z.sum(), z)
    f = pytensor.function([z, zm, s0, s1, w, m], [ce, grad_z])
    zv = rng.normal(size=(T, B, D))
    bad = s1v.copy()
    bad[1, 1] = D
    with pytest.raises(ValueError, match=r"y_target_i\[1, 1\] = 4 is out of range \[0, 4\)"):
        f(zv, zmv, s0v, bad, wv, mv)
    c, g = f(np.zeros((0, B, D)), np.zeros((0, B)), *[np.zeros((0, B))] * 4)
    assert c.shape == (0, B) and g.shape == (0, B, D)
    c, g = f(zv, zmv, *[np.zeros((0, B))] * 4)  # no targets: ce 0, grad = softmax on counted frames
    assert not c.any()
    np.testing.assert_allclose(g.sum(axis=2), zmv > 0.5)
    with pytest.raises(ValueError, match="z_mask dim 0"):
        f(zv, zmv[:2], s0v, s1v, wv, mv)


# ---------------------------------------------------------------- shapes, build
def test_infer_shape():
    T, B, D, N = 3, 2, 4, 6
    s0v, s1v, wv, mv = coo(N, B, T, D, seed=14)
    x, idx, z, zm = pt.tensor3("x"), pt.matrix("idx"), pt.tensor3("z"), pt.matrix("zm")
    s0, s1, w, m, om, oa = matrices(6)
    outs = [subtensor_batched_index(x, idx), sparse_to_dense(s0, s1, w, m, T, D),
            *max_and_argmax_sparse(s0, s1, w, m, om, oa),
            *crossentropy_softmax_and_gradient_z_sparse(z, zm, s0, s1, w, m)]
    values = [np.zeros((T, B, D)), np.zeros((T, B)), s0v, s1v, wv, mv, np.zeros((T, B)), np.zeros((T, B)),
              np.zeros((T, B, D)), np.ones((T, B))]
    check_infer_shape([x, idx, s0, s1, w, m, om, oa, z, zm], outs, values, NativeOp)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_kernels_compile_with_nvcc(monkeypatch):
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    ops = []
    for gen in (SubtensorBatchedIndex, SparseToDense, SparseToDenseZeros, MaxAndArgmaxSparse,
                CrossEntropySoftmaxAndGradientZSparse):
        op = gen.make_op()
        ops += [op, gen.make_strict_op()] + ([op.grad_op()] if gen.c_bw_code else [])
    build_with_nvcc(*(o.variant("float32", device="cuda") for o in ops))
