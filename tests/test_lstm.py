"""LstmGenericBase (the foundation's proof op) against the numpy reference."""

import platform
import shutil

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import verify_grad

from ptnative import NativeOp
from ptnative.ops import LstmGenericBase

from .conftest import build_with_nvcc, check_infer_shape, compiled_once, tol
from .reference.lstm import lstm_generic_backward, lstm_generic_forward


def ragged_mask(T, B, rng):
    lens = rng.integers(0, T + 1, size=B)
    lens[0] = T
    return (np.arange(T)[:, None] < lens[None, :]).astype(np.float64)


def lstm_data(T, B, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(T, B, 4 * n))
    V_h = rng.normal(size=(n, 4 * n)) * 0.4
    c = rng.normal(size=(B, n))
    i = ragged_mask(T, B, rng)
    return [a.astype(dtype) for a in (Z, V_h, c, i)]


def symbolic(dtype):
    return (pt.tensor3("Z", dtype=dtype), pt.matrix("V_h", dtype=dtype), pt.matrix("c", dtype=dtype),
            pt.matrix("i", dtype=dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_forward_and_gradients_against_reference(mode, dtype):
    T, B, n = 7, 4, 5
    values = lstm_data(T, B, n, dtype)
    rng = np.random.default_rng(5)
    DY = rng.normal(size=(T, B, n)).astype(dtype)
    Dd = rng.normal(size=(B, n)).astype(dtype)
    Z, V_h, c, i = symbolic(dtype)
    Y, H, d = LstmGenericBase.make_op()(Z, V_h, c, i)
    cost = (Y * DY).sum() + (d * Dd).sum()
    grads = pytensor.grad(cost, [Z, V_h, c])
    f = pytensor.function([Z, V_h, c, i], [Y, H, d, *grads], mode=mode)
    got = f(*values)
    ref = lstm_generic_forward(*values) + lstm_generic_backward(*values, DY, Dd)
    rtol, atol = tol(dtype)
    for name, g, r in zip(["Y", "H", "d", "DZ", "DV_h", "Dc"], got, ref):
        assert g.dtype == dtype, name
        np.testing.assert_allclose(g, r, rtol=rtol * 10, atol=atol * 10, err_msg=name)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_multithreaded_cpu_path_against_reference(monkeypatch, dtype):
    """A size that takes the packed-GEMM, row-split CPU path (batch not a multiple of the register tile), on 1 and 3
    threads: one compiled function, the kernel reads PTNATIVE_NUM_THREADS at each call."""
    T, B, n = 16, 41, 64  # >= 4e6 multiply-adds in the recurrent products
    values = lstm_data(T, B, n, dtype, seed=3)
    values[1] = values[1] * np.asarray(0.5, dtype)
    rng = np.random.default_rng(6)
    DY, Dd = rng.normal(size=(T, B, n)).astype(dtype), rng.normal(size=(B, n)).astype(dtype)
    Z, V_h, c, i = symbolic(dtype)
    Y, H, d = LstmGenericBase.make_op()(Z, V_h, c, i)
    grads = pytensor.grad((Y * DY).sum() + (d * Dd).sum(), [Z, V_h, c])
    f = pytensor.function([Z, V_h, c, i], [Y, H, d, *grads])
    ref = lstm_generic_forward(*values) + lstm_generic_backward(*values, DY, Dd)
    rtol, atol = (2e-4, 2e-4) if dtype == "float32" else (1e-10, 1e-10)
    for threads in ("1", "3"):
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", threads)
        got = f(*values)
        for name, g, r in zip(["Y", "H", "d", "DZ", "DV_h", "Dc"], got, ref):
            np.testing.assert_allclose(g, r, rtol=rtol, atol=atol * max(1.0, np.abs(r).max()),
                                       err_msg=f"{name}, {threads} thread(s)")


def test_verify_grad_float64():
    rng = np.random.default_rng(11)
    Z, V_h, c, i = lstm_data(5, 3, 3, "float64", seed=3)
    op = LstmGenericBase.make_op()

    def cost(Z, V_h, c):
        Y, H, d = op(Z, V_h, c, pt.constant(i))
        return (Y ** 2).sum() + (d * np.arange(3)).sum()

    verify_grad(cost, [Z, V_h, c], rng=rng)


def test_modes_agree():
    values = lstm_data(6, 3, 4, "float32", seed=7)
    Z, V_h, c, i = symbolic("float32")
    Y, H, d = LstmGenericBase.make_op()(Z, V_h, c, i)
    g = pytensor.grad(Y.sum() + d.sum(), V_h)
    results = [pytensor.function([Z, V_h, c, i], [Y, d, g], mode=m)(*values) for m in [None, "C", "CVM",
                                                                                        "FAST_COMPILE"]]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_empty_time_and_batch(mode):
    Z, V_h, c, i = symbolic("float64")
    Y, H, d = LstmGenericBase.make_op()(Z, V_h, c, i)
    gz, gc = pytensor.grad(Y.sum() + (d * 2).sum(), [Z, c])
    f = pytensor.function([Z, V_h, c, i], [Y, d, gz, gc], mode=mode)
    n = 3
    cv = np.arange(6.0).reshape(2, n)
    y, dv, gzv, gcv = f(np.zeros((0, 2, 4 * n)), np.ones((n, 4 * n)), cv, np.zeros((0, 2)))
    assert y.shape == (0, 2, n) and gzv.shape == (0, 2, 4 * n)
    np.testing.assert_array_equal(dv, cv)  # T = 0: the final state is the initial one
    np.testing.assert_array_equal(gcv, 2 * np.ones((2, n)))
    y, dv, gzv, gcv = f(np.zeros((4, 0, 4 * n)), np.ones((n, 4 * n)), np.zeros((0, n)), np.zeros((4, 0)))
    assert y.shape == (4, 0, n) and dv.shape == (0, n) and gcv.shape == (0, n)


def test_shape_mismatch_raises(mode):
    Z, V_h, c, i = symbolic("float64")
    f = pytensor.function([Z, V_h, c, i], LstmGenericBase.make_op()(Z, V_h, c, i), mode=mode)
    values = lstm_data(3, 2, 4, "float64")
    with pytest.raises(ValueError, match=r"LstmGenericBase.*V_h.shape\[1\] = 16; expected 4 \* n "
                                         r"\(n = V_h.shape\[0\]\) = 12"):
        f(values[0], values[1][:3], values[2], values[3])  # V_h has 3 rows, n = 4
    with pytest.raises(ValueError, match=r"LstmGenericBase.*Z.shape\[2\] = 15; expected 4 \* n "
                                         r"\(n = V_h.shape\[0\]\) = 16"):
        f(values[0][..., :-1], values[1], values[2], values[3])  # 4n not divisible by 4


def test_infer_shape():
    Z, V_h, c, i = symbolic("float64")
    outs = LstmGenericBase.make_op()(Z, V_h, c, i)
    check_infer_shape([Z, V_h, c, i], outs, lstm_data(3, 2, 5, "float64"), NativeOp)


def test_inplace_on_projected_input(mode):
    """Z computed in the graph is destroyed (H takes its buffer); the numbers do not change."""
    x = pt.tensor3("x")
    _, V_h, c, i = symbolic("float64")
    Y, H, d = LstmGenericBase.make_op()(2 * x + 1, V_h, c, i)  # (pytensor's own dot has no C code without BLAS)
    f = pytensor.function([x, V_h, c, i], [Y, H, d], mode=mode)
    fwd = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, NativeOp)]
    assert len(fwd) == 1 and bool(fwd[0].op.destroy_map) == (mode != "FAST_COMPILE")
    xv, Vv, cv, iv = lstm_data(4, 3, 2, "float64")
    xv_before = xv.copy()
    for g, r in zip(f(xv, Vv, cv, iv), lstm_generic_forward(2 * xv + 1, Vv, cv, iv)):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(xv, xv_before)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lstm_kernels_compile_with_nvcc(monkeypatch, dtype):
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    op = LstmGenericBase.make_op()
    build_with_nvcc(op.variant(dtype, device="cuda"), op.grad_op().variant(dtype, device="cuda"))


# ====================================================================== NativeLstm2, LstmLowMem, TwoDLSTM,
# lstm_cell, lstm()
from ptnative.ops.lstm import (LstmCell, LstmCellGrad, LstmCellGradGrad, LstmLowMem, NativeLstm2,  # noqa: E402
                               NativeLstm2Layer, TwoDLSTM, lstm, lstm_cell, twod_lstm)

from .reference.lstm import (lstm_cell_forward, lstm_lowmem_forward, native_lstm2_forward, visited_frames,  # noqa: E402
                             numeric_grad, twod_lstm_forward)

DIRECTIONS = [(0, 1), (0, -1), (1, 1), (1, -1), (0, 2), (0, -2)]


def holey_mask(T, B, rng):
    """Ragged lengths, plus a hole inside one sequence (a masked frame between valid ones)."""
    i = ragged_mask(T, B, rng)
    if T >= 3 and B >= 2:
        i[:, 1] = 1.0
        i[T // 2, 1] = 0.0
    return i


def lstm2_data(T, B, n, seed=0):
    rng = np.random.default_rng(seed)
    return dict(X=rng.normal(size=(T, B, 4 * n)), W=rng.normal(size=(n, 4 * n)) * 0.5,
                y0=rng.normal(size=(B, n)), c0=rng.normal(size=(B, n)), i=holey_mask(T, B, rng))


def lowmem_data(T, B, n_in, n, seed=0):
    rng = np.random.default_rng(seed)
    return dict(X=rng.normal(size=(T, B, n_in)), W=rng.normal(size=(n_in + n, 4 * n)) * 0.5,
                b=rng.normal(size=(4 * n,)), y0=rng.normal(size=(B, n)), c0=rng.normal(size=(B, n)),
                i=holey_mask(T, B, rng))


def cotangents(shapes, seed=9):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s) for s in shapes]


def with_reference_gradients(native, reference, syms, wrt, dtype):
    """Two FAST_COMPILE functions (the unrolled reference graph compiles fast there) of ``syms``, one for the op's
    ``(Y, C, d)`` and one for the reference's, each returning those outputs and the gradients of one weighted cost
    of them with respect to ``wrt`` (the same cost for both).  The reference's holds no native op: its values do
    not depend on the thread count (and its sums of per-frame terms run element by element in Python, seconds)."""
    T, B, n = native[0].type.shape
    DY, DC, Dd = cotangents([(T, B, n), (T, B, n), (B, n)])
    functions = []
    for y, c, dd in (native, reference):
        cost = (y * DY.astype(dtype)).sum() + (c * DC.astype(dtype)).sum() + (dd * Dd.astype(dtype)).sum()
        functions.append(pytensor.function(syms, [y, c, dd, *pytensor.grad(cost, wrt)], mode="FAST_COMPILE"))
    return functions


def sym_like(name, value, dtype):
    return pt.tensor(name, dtype=dtype, shape=(None,) * np.ndim(value))


def run_op_with_grads(op, values, n_diff, out_weights, dtype, mode=None, scalar_args=()):
    """Outputs of ``op`` and the gradients of sum(out_k * weight_k) w.r.t. the first ``n_diff`` inputs."""
    syms = [sym_like(f"in{k}", v, dtype) for k, v in enumerate(values)]
    outs = op(*syms, *[pt.constant(np.int32(s)) for s in scalar_args])
    cost = sum((o * w.astype(dtype)).sum() for o, w in zip(outs, out_weights) if w is not None)
    grads = pytensor.grad(cost, syms[:n_diff])
    f = pytensor.function(syms, [*outs, *grads], mode=mode)
    res = f(*[np.asarray(v, dtype=dtype) for v in values])
    return res[:len(outs)], res[len(outs):]


def assert_close(got, ref, dtype, what, scale=10):
    rtol, atol = tol(dtype)
    if np.dtype(dtype) == np.float64:
        rtol, atol = max(rtol, 1e-6), max(atol, 1e-7)  # finite-difference references
    assert got.dtype == np.dtype(dtype), what
    np.testing.assert_allclose(got, ref, rtol=rtol * scale, atol=atol * scale, err_msg=what)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="MXCSR's DAZ is x86's")
@pytest.mark.parametrize("threads", ["1", "2"])
def test_native_lstm2_denormal_inputs_count_as_zero(monkeypatch, threads):
    """The CPU recurrence reads denormal operands as zero (docs/lstm.md, Performance): a float32 X of 1e-39 where
    another X holds 0 gives bit-identical outputs.  Afterwards the caller's floating-point mode is back, on its
    own thread (numpy keeps a denormal) and on BLAS's workers (sgemm sums denormals; the row parts run on threads of
    their own now, on the workers in the kernels that call BLAS between parts)."""
    from scipy.linalg import blas as scipy_blas

    monkeypatch.setenv("PTNATIVE_NUM_THREADS", threads)
    T, B, n = 16, 41, 64  # the threaded, packed-GEMM path
    d = lstm2_data(T, B, n, seed=3)
    vals = [np.asarray(d[k], dtype="float32") for k in ("X", "W", "y0", "c0", "i")]
    vals[2][:], vals[3][:] = 0.0, 0.0  # zero y0 and c0: X[0] alone makes the first frame's gates
    vals[0][::2, ::3, ::5] = 0.0
    tiny = vals[0].copy()
    tiny[::2, ::3, ::5] = np.float32(1e-39)
    syms = [pt.tensor(f"in{k}", dtype="float32", shape=v.shape) for k, v in enumerate(vals)]
    f = pytensor.function(syms, NativeLstm2.make_op()(*syms, pt.constant(np.int32(0)), pt.constant(np.int32(1))))
    want, got = f(*vals), f(tiny, *vals[1:])
    for name, g, w in zip(["Y", "C", "H", "d"], got, want):
        assert np.array_equal(g, w), name
    assert np.float32(1e-39) * np.float32(1.0) != 0.0
    ones, denormal = np.ones((512, 512), np.float32, order="F"), np.full((512, 512), 1e-39, np.float32, order="F")
    np.testing.assert_allclose(scipy_blas.sgemm(1.0, ones, denormal), 512e-39, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("start,step", DIRECTIONS)
def test_native_lstm2_against_reference(dtype, start, step):
    T, B, n = 6, 3, 2
    dat = lstm2_data(T, B, n, seed=start + 3 * abs(step) + (step < 0))
    vals = [dat[k] for k in ("X", "W", "y0", "c0", "i")]
    DY, DC, Dd = cotangents([(T, B, n), (T, B, n), (B, n)])
    outs, grads = run_op_with_grads(NativeLstm2.make_op(), vals, 4, [DY, DC, None, Dd], dtype,
                                    scalar_args=(start, step))
    ref = native_lstm2_forward(*vals, start, step)
    for name, g, r in zip("YCHd", outs, ref):
        assert_close(g, r, dtype, name)

    def cost(X, W, y0, c0):
        Y, C, H, d = native_lstm2_forward(X, W, y0, c0, dat["i"], start, step)
        return (Y * DY).sum() + (C * DC).sum() + (d * Dd).sum()

    for name, g, r in zip(["DX", "DW", "Dy0", "Dc0"], grads, numeric_grad(cost, vals[:4], range(4))):
        assert_close(g, r, dtype, name)


def native_lstm2_graph(X, W, y0, c0, i, start, step):
    """NativeLstm2's recurrence unrolled in plain PyTensor (an autodiff reference): Y, C, d."""
    T, n = int(X.type.shape[0]), int(W.type.shape[0])
    Y, C = [pt.zeros_like(y0)] * T, [pt.zeros_like(c0)] * T
    y_prev, c_prev = y0, c0
    for t in visited_frames(T, start, step):
        z = X[t] + pt.dot(y_prev, W)
        a, ig, fg, og = pt.tanh(z[:, :n]), *(pt.sigmoid(z[:, k * n:(k + 1) * n]) for k in (1, 2, 3))
        m = i[t][:, None]
        c = (c_prev * fg + a * ig) * m + c_prev * (1 - m)
        y = pt.tanh(c) * og * m
        Y[t], C[t] = y, c
        y_prev, c_prev = y + y_prev * (1 - m), c
    return pt.stack(Y), pt.stack(C), c_prev


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("start,step", [(0, 1), (1, -2)])
def test_native_lstm2_multithreaded_cpu_path(monkeypatch, dtype, start, step):
    """A size that takes the packed-GEMM, row-split CPU path (batch not a multiple of the register tile,
    1, 2 and 3 threads, ragged mask) against the recurrence unrolled in PyTensor and differentiated by it: one
    compiled function, the kernel reads PTNATIVE_NUM_THREADS at each call."""
    T, B, n = 16, 41, 64  # >= 4e6 multiply-adds over the visited frames: the threaded path
    rng = np.random.default_rng(5)
    vals = [rng.normal(size=(T, B, 4 * n)), rng.normal(size=(n, 4 * n)) * 0.2, rng.normal(size=(B, n)),
            rng.normal(size=(B, n)), holey_mask(T, B, rng)]
    syms = [pt.tensor(f"in{k}", dtype=dtype, shape=np.shape(v)) for k, v in enumerate(vals)]
    Y, C, _, d = NativeLstm2.make_op()(*syms, pt.constant(np.int32(start)), pt.constant(np.int32(step)))
    f, f_ref = with_reference_gradients((Y, C, d), native_lstm2_graph(*syms, start, step), syms, syms[:4], dtype)
    args = [np.asarray(v, dtype=dtype) for v in vals]
    want = f_ref(*args)
    rtol, atol = (2e-4, 2e-4) if dtype == "float32" else (1e-10, 1e-10)
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", threads)
        res = f(*args)
        for name, got, ref in zip(["Y", "C", "d", "DX", "DW", "Dy0", "Dc0"], res, want):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol * max(1.0, np.abs(ref).max()),
                                       err_msg=f"{name}, {threads} thread(s)")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("order", ["sorted", "unsorted"])
def test_native_lstm2_layer_rows_skipped_and_balanced(monkeypatch, dtype, order):
    """The CPU path skips the products of a row part's rows after a frame's last valid one and balances the parts by
    the rows' valid frames (docs/lstm.md): on the threaded path (1, 2 and 3 threads; lengths sorted as CTC recipes
    have them, or unsorted with a hole), each sequence's results (Y, C, H, d and its gradients x, y0, c0) are the
    same bits as those of the sequence run alone, and H is 0 on its masked frames; every result matches the
    reference recurrence."""
    T, B, n_in, n = 40, 21, 24, 48  # >= 4e6 multiply-adds: the threaded path
    rng = np.random.default_rng(17)
    lens = rng.integers(T // 2, T + 1, size=B)
    lens[0] = T
    lens = np.sort(lens)[::-1] if order == "sorted" else rng.permutation(lens)
    mask = (np.arange(T)[:, None] < lens[None, :]).astype(dtype)
    if order == "unsorted":
        mask[T // 3, 1] = 0.0
    f_ = lambda *s, scale=1.0: (rng.normal(size=s) * scale).astype(dtype)  # noqa: E731
    x, W_in, W, b = f_(T, B, n_in), f_(n_in, 4 * n, scale=0.3), f_(n, 4 * n, scale=0.3), f_(4 * n)
    y0, c0, DY, DC, Dd = f_(B, n), f_(B, n), f_(T, B, n), f_(T, B, n), f_(B, n)

    def compiled(batch):
        syms = [pt.tensor(name, dtype=dtype, shape=shape) for name, shape in
                [("x", (T, batch, n_in)), ("W_in", W_in.shape), ("W", W.shape), ("b", b.shape), ("y0", (batch, n)),
                 ("c0", (batch, n)), ("i", (T, batch)), ("DY", (T, batch, n)), ("DC", (T, batch, n)),
                 ("Dd", (batch, n))]]
        Y, C, H, d = NativeLstm2Layer.make_op()(*syms[:7], pt.constant(np.int32(0)), pt.constant(np.int32(1)))
        cost = (Y * syms[7]).sum() + (C * syms[8]).sum() + (d * syms[9]).sum()
        return pytensor.function(syms, [Y, C, H, d, *pytensor.grad(cost, syms[:6])])

    f_all, f_one = compiled(B), compiled(1)
    names = ["Y", "C", "H", "d", "Dx", "DW_in", "DW", "Db", "Dy0", "Dc0"]
    ref_Y, ref_C, ref_H, ref_d = native_lstm2_forward(x @ W_in + b, W, y0, c0, mask, 0, 1)
    rtol = 2e-4 if dtype == "float32" else 1e-10
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", threads)
        got = dict(zip(names, f_all(x, W_in, W, b, y0, c0, mask, DY, DC, Dd)))
        for name, ref in [("Y", ref_Y), ("C", ref_C), ("H", ref_H), ("d", ref_d)]:
            np.testing.assert_allclose(got[name], ref, rtol=rtol, atol=rtol, err_msg=f"{name}, {threads} thread(s)")
        assert (got["H"][mask == 0] == 0).all()
        sums = {name: 0.0 for name in ("DW_in", "DW", "Db")}
        for r in range(B):
            one = dict(zip(names, f_one(x[:, r:r + 1], W_in, W, b, y0[r:r + 1], c0[r:r + 1], mask[:, r:r + 1],
                                        DY[:, r:r + 1], DC[:, r:r + 1], Dd[r:r + 1])))
            for name in ("Y", "C", "H", "Dx"):
                np.testing.assert_array_equal(got[name][:, r], one[name][:, 0], err_msg=f"{name}, row {r}, {threads}")
            for name in ("d", "Dy0", "Dc0"):
                np.testing.assert_array_equal(got[name][r], one[name][0], err_msg=f"{name}, row {r}, {threads}")
            for name in sums:
                sums[name] = sums[name] + one[name].astype(np.float64)
        for name, total in sums.items():  # the weight gradients sum over the sequences
            np.testing.assert_allclose(got[name], total, rtol=rtol, atol=rtol * np.abs(total).max(), err_msg=name)


@pytest.mark.parametrize("T,B,n", [(16, 41, 64), (24, 3, 128)], ids=["rows", "cells"])
def test_native_lstm2_concurrent_calls(monkeypatch, T, B, n):
    """Two Python threads training through the threaded CPU path (the row parts, or the cell split whose threads
    meet at every frame) at once while a third multiplies with scipy's BLAS: no deadlock, every result equal to a
    lone call's."""
    import threading
    import time

    from scipy.linalg import blas as scipy_blas

    monkeypatch.setenv("PTNATIVE_NUM_THREADS", "2")
    rng = np.random.default_rng(8)
    vals = [rng.normal(size=(T, B, 4 * n)), rng.normal(size=(n, 4 * n)) * 0.2, rng.normal(size=(B, n)),
            rng.normal(size=(B, n)), holey_mask(T, B, rng)]
    vals = [np.asarray(v, dtype="float32") for v in vals]
    syms = [pt.tensor(f"in{k}", dtype="float32", shape=v.shape) for k, v in enumerate(vals)]
    Y, C, _, d = NativeLstm2.make_op()(*syms, pt.constant(np.int32(0)), pt.constant(np.int32(1)))
    outs = [Y, d, *pytensor.grad((Y ** 2).sum() + d.sum(), syms[:4])]
    fns = [pytensor.function(syms, outs) for _ in range(2)]  # a compiled function is not re-entrant
    want = fns[0](*vals)
    bad, done = [], []
    a = rng.normal(size=(300, 300)).astype("float32")
    a2 = scipy_blas.sgemm(1.0, a, a)

    def train(f):
        end = time.time() + 1.5
        while time.time() < end:
            got = f(*vals)
            for name, g, w in zip(["Y", "d", "DX", "DW", "Dy0", "Dc0"], got, want):
                if not np.allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max()):
                    bad.append(f"{name}: max |diff| {np.abs(g - w).max()}")
        done.append(1)

    def multiply():
        end = time.time() + 1.5
        while time.time() < end:
            if not np.allclose(scipy_blas.sgemm(1.0, a, a), a2, rtol=1e-5, atol=1e-4):
                bad.append("sgemm")
        done.append(1)

    threads = [threading.Thread(target=train, args=(f,), daemon=True) for f in fns]
    threads.append(threading.Thread(target=multiply, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(done) == 3, "a thread did not finish within 120 s"
    assert not bad, bad[:5]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("start,step", DIRECTIONS)
def test_lstm_lowmem_against_reference(dtype, start, step):
    T, B, n_in, n = 6, 3, 3, 2
    dat = lowmem_data(T, B, n_in, n, seed=start + 3 * abs(step) + (step < 0))
    vals = [dat[k] for k in ("X", "W", "b", "y0", "c0", "i")]
    DY, DC, Dd = cotangents([(T, B, n), (T, B, n), (B, n)])
    outs, grads = run_op_with_grads(LstmLowMem.make_op(), vals, 5, [DY, DC, Dd], dtype, scalar_args=(start, step))
    ref = lstm_lowmem_forward(*vals, start, step)
    for name, g, r in zip("YCd", outs, ref):
        assert_close(g, r, dtype, name)

    def cost(X, W, b, y0, c0):
        Y, C, d = lstm_lowmem_forward(X, W, b, y0, c0, dat["i"], start, step)
        return (Y * DY).sum() + (C * DC).sum() + (d * Dd).sum()

    # masked frames (the hole in sequence 1) included: the gradient must match finite differences
    for name, g, r in zip(["DX", "DW", "Db", "Dy0", "Dc0"], grads, numeric_grad(cost, vals[:5], range(5))):
        assert_close(g, r, dtype, name)


def lowmem_graph(X, W, b, y0, c0, i, start, step):
    """LstmLowMem's recurrence unrolled in plain PyTensor (an autodiff reference): Y, C, d."""
    T, n = int(X.type.shape[0]), int(y0.type.shape[1])
    Y, C = [pt.zeros_like(y0)] * T, [pt.zeros_like(c0)] * T
    y_prev, c_prev = y0, c0
    for t in visited_frames(T, start, step, lowmem=True):
        z = pt.dot(pt.concatenate([X[t], y_prev], axis=1), W) + b
        a, ig, fg, og = pt.tanh(z[:, :n]), *(pt.sigmoid(z[:, k * n:(k + 1) * n]) for k in (1, 2, 3))
        m = i[t][:, None]
        c = (c_prev * fg + a * ig) * m + c_prev * (1 - m)
        y = pt.tanh(c) * og * m
        Y[t], C[t] = y, c
        y_prev, c_prev = y, c
    return pt.stack(Y), pt.stack(C), c_prev


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("start,step", [(0, 1), (1, -2)])
@pytest.mark.parametrize("size", [(24, 100, 20, 36), (3, 12, 40, 200)], ids=["chunks", "wide"])
def test_lowmem_multithreaded_cpu_path(monkeypatch, dtype, start, step, size):
    """Sizes that take LstmLowMem's row-split CPU path (>= 4e6 multiply-adds): "chunks" with several chunks of frames
    (2 or 3 here; 768 // 100 = 7 frames per chunk at most; each thread sums its own weight gradient over all chunks),
    "wide" with weights larger than the chunk buffers (the weight gradient after each chunk, split by columns); batch
    not a multiple of the register tile, n_in and 4n not multiples of the packed panels, ragged mask with a hole;
    against the recurrence unrolled in PyTensor and differentiated by it; the same bits on a second call.  (More
    than ~30 frames would break FAST_COMPILE's sums of the per-frame gradient terms: numpy ufuncs take 32 operands.)
    1, 2 and 3 threads with one compiled function: the kernel reads PTNATIVE_NUM_THREADS at each call."""
    T, B, n_in, n = size
    dat = lowmem_data(T, B, n_in, n, seed=11)
    dat["W"] *= 0.4
    vals = [dat[k] for k in ("X", "W", "b", "y0", "c0", "i")]
    syms = [pt.tensor(f"in{k}", dtype=dtype, shape=np.shape(v)) for k, v in enumerate(vals)]
    Y, C, d = LstmLowMem.make_op()(*syms, pt.constant(np.int32(start)), pt.constant(np.int32(step)))
    f, f_ref = with_reference_gradients((Y, C, d), lowmem_graph(*syms, start, step), syms, syms[:5], dtype)
    args = [np.asarray(v, dtype=dtype) for v in vals]
    want = f_ref(*args)
    rtol, atol = (5e-4, 5e-4) if dtype == "float32" else (1e-10, 1e-10)
    names = ["Y", "C", "d", "DX", "DW", "Db", "Dy0", "Dc0"]
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", threads)
        res = f(*args)
        for name, got, ref in zip(names, res, want):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol * max(1.0, np.abs(ref).max()),
                                       err_msg=f"{name}, {threads} thread(s)")
        for name, got, again in zip(names, res, f(*args)):
            np.testing.assert_array_equal(got, again, err_msg=f"{name}, {threads} thread(s)")


def test_lowmem_step_back_rule_and_no_frames():
    """step < 0 runs from T-1-start down to start; with start > (T-1)/2 nothing runs and d = c0."""
    T, B, n_in, n = 5, 2, 2, 2
    dat = lowmem_data(T, B, n_in, n)
    vals = [dat[k] for k in ("X", "W", "b", "y0", "c0", "i")]
    op = LstmLowMem.make_op()
    syms = [sym_like(f"in{k}", v, "float64") for k, v in enumerate(vals)]
    st = pt.iscalar("start")
    f = pytensor.function([*syms, st], op(*syms, st, pt.constant(np.int32(-1))))
    Y, C, d = f(*vals, 1)
    assert np.all(Y[0] == 0) and np.all(Y[4] == 0) and np.any(Y[1:4] != 0)
    Y, C, d = f(*vals, 3)
    np.testing.assert_array_equal(d, dat["c0"])
    assert not Y.any()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_twod_lstm_against_reference(dtype):
    h, w, B, n_in, n = 3, 4, 3, 2, 2
    rng = np.random.default_rng(4)
    X = rng.normal(size=(h, w, B, n_in))
    V_h, V_v = rng.normal(size=(n, 5 * n)) * 0.5, rng.normal(size=(n, 5 * n)) * 0.5
    W, b = rng.normal(size=(n_in, 5 * n)), rng.normal(size=(5 * n,))
    sizes = np.array([[3, 4], [2, 3], [1, 2]], dtype=np.float64)
    init = rng.normal(size=(1, w, B, 5 * n))
    DY = cotangents([(h, w, B, n)])[0]
    syms = [sym_like(k, v, dtype) for k, v in zip(["X", "V_h", "V_v", "W", "b"], [X, V_h, V_v, W, b])]
    s_sizes, s_init = pt.matrix("sizes", dtype=dtype), pt.tensor4("init", dtype=dtype)
    Y, H = twod_lstm(*syms, s_sizes, initial_state=s_init)
    grads = pytensor.grad((Y * DY.astype(dtype)).sum(), syms)
    f = pytensor.function([*syms, s_sizes, s_init], [Y, H, *grads])
    got = f(*[a.astype(dtype) for a in (X, V_h, V_v, W, b, sizes, init)])
    ref = twod_lstm_forward(X, V_h, V_v, W, b, sizes, init)
    assert_close(got[0], ref[0], dtype, "CompleteY")
    assert_close(got[1], ref[1], dtype, "H")
    assert not got[0][2, :, 1].any() and not got[0][:, 3, 1].any()  # invalid cells output 0

    def cost(X, V_h, V_v, W, b):
        return (twod_lstm_forward(X, V_h, V_v, W, b, sizes, init)[0] * DY).sum()

    ref_grads = numeric_grad(cost, [X, V_h, V_v, W, b], range(5))
    for name, g, r in zip(["DX", "DV_h", "DV_v", "DW", "Db"], got[2:], ref_grads):
        assert_close(g, r, dtype, name)


def test_twod_lstm_initial_output_iteration():
    """iteration >= 1: the row above row 0 is initialOutput (h = 1); gradients include its V_v term."""
    h, w, B, n_in, n = 1, 3, 2, 2, 2
    rng = np.random.default_rng(8)
    X = rng.normal(size=(h, w, B, n_in))
    V_h, V_v = rng.normal(size=(n, 5 * n)) * 0.5, rng.normal(size=(n, 5 * n)) * 0.5
    W, b = rng.normal(size=(n_in, 5 * n)), rng.normal(size=(5 * n,))
    sizes = np.array([[1, 3], [1, 2]], dtype=np.float64)
    init, init_out = rng.normal(size=(1, w, B, 5 * n)), rng.normal(size=(1, w, B, n))
    syms = [sym_like(k, v, "float64") for k, v in zip(["X", "V_h", "V_v", "W", "b"], [X, V_h, V_v, W, b])]
    Y, H = twod_lstm(*syms, pt.constant(sizes), pt.constant(init), pt.constant(init_out), iteration=1)
    gv = pytensor.grad(Y.sum(), syms[2])
    got_y, got_gv = pytensor.function(syms, [Y, gv])(X, V_h, V_v, W, b)
    np.testing.assert_allclose(got_y, twod_lstm_forward(X, V_h, V_v, W, b, sizes, init, init_out, 1.0)[0],
                               rtol=1e-10, atol=1e-12)
    ref_gv = numeric_grad(lambda V: twod_lstm_forward(X, V_h, V, W, b, sizes, init, init_out, 1.0)[0].sum(),
                          [V_v], [0])[0]
    np.testing.assert_allclose(got_gv, ref_gv, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match=r"TwoDLSTM.*an initial_output \(iteration >= 1\) needs a single target "
                                         r"row, X.shape\[0\] = 2"):
        X2 = np.concatenate([X, X])
        Y2, _ = twod_lstm(pt.constant(X2), *syms[1:], pt.constant(sizes), pt.constant(init), pt.constant(init_out),
                          iteration=1)
        pytensor.function(syms[1:], Y2)(V_h, V_v, W, b)


def test_verify_grad_float64_all_ops():
    rng = np.random.default_rng(21)
    T, B, n, n_in = 4, 3, 2, 3
    d2 = lstm2_data(T, B, n, seed=1)
    for start, step in [(0, 1), (0, -1)]:
        def cost2(X, W, y0, c0, start=start, step=step):
            Y, C, H, d = NativeLstm2.make_op()(X, W, y0, c0, pt.constant(d2["i"]), pt.constant(np.int32(start)),
                                               pt.constant(np.int32(step)))
            return (Y ** 2).sum() + (C * 0.3).sum() + (d * np.arange(n)).sum()

        verify_grad(cost2, [d2[k] for k in ("X", "W", "y0", "c0")], rng=rng)
    dl = lowmem_data(T, B, n_in, n, seed=2)

    def costl(X, W, b, y0, c0):
        Y, C, d = LstmLowMem.make_op()(X, W, b, y0, c0, pt.constant(dl["i"]), pt.constant(np.int32(0)),
                                       pt.constant(np.int32(-1)))
        return (Y ** 2).sum() + (C * 0.3).sum() + (d * np.arange(n)).sum()

    verify_grad(costl, [dl[k] for k in ("X", "W", "b", "y0", "c0")], rng=rng)
    sizes = np.array([[2, 3], [1, 2]], dtype=np.float64)

    def costt(X, V_h, V_v, W, b):
        return (twod_lstm(X, V_h, V_v, W, b, pt.constant(sizes))[0] ** 2).sum()

    verify_grad(costt, [rng.normal(size=(2, 3, 2, 2)), rng.normal(size=(2, 10)) * 0.5, rng.normal(size=(2, 10)) * 0.5,
                        rng.normal(size=(2, 10)), rng.normal(size=(10,))], rng=rng)


# ---------------------------------------------------------------------- lstm_cell (chainer's shapes)
CELL_SHAPES = [((10, 3), (10, 12)), ((20, 32, 4), (16, 128, 4)), ((32, 100, 3, 5), (32, 400, 3, 5)),
               ((16, 20), (2, 80)), ((16, 20), (0, 80)), ((0, 0), (0, 0)), ((8, 0), (2, 0))]


@compiled_once
def cell_function(dtype, ndim):
    """lstm_cell's (c, h) and the gradients of sum(c * gc) + sum(h * gh) w.r.t. c_prev and x, of
    (c_prev, x, gc, gh) of ``dtype``, ``ndim`` dimensions and unknown shapes (compiled once per process:
    conftest.compiled_once)."""
    c_prev, x, gc, gh = (pt.tensor(name, dtype=dtype, shape=(None,) * ndim) for name in ("c", "x", "gc", "gh"))
    c, h = lstm_cell(c_prev, x)
    return pytensor.function([c_prev, x, gc, gh], [c, h, *pytensor.grad((c * gc).sum() + (h * gh).sum(), [c_prev, x])])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("c_shape,x_shape", CELL_SHAPES)
def test_lstm_cell_forward_and_backward(dtype, c_shape, x_shape):
    rng = np.random.default_rng(len(c_shape) + c_shape[0])
    cv, xv = rng.uniform(-1, 1, c_shape), rng.uniform(-1, 1, x_shape)
    gcv, ghv = rng.uniform(-1, 1, c_shape), rng.uniform(-1, 1, (x_shape[0],) + c_shape[1:])
    got = cell_function(dtype, len(c_shape))(cv.astype(dtype), xv.astype(dtype), gcv.astype(dtype), ghv.astype(dtype))
    rc, rh = lstm_cell_forward(cv, xv)
    assert got[0].shape == c_shape and got[1].shape == rh.shape
    assert_close(got[0], rc, dtype, "c", scale=1)
    assert_close(got[1], rh, dtype, "h", scale=1)
    if cv.size + xv.size <= 400:  # finite differences on the small cases
        num = numeric_grad(lambda a, b: (lstm_cell_forward(a, b)[0] * gcv).sum() + (lstm_cell_forward(a, b)[1]
                                                                                      * ghv).sum(), [cv, xv], [0, 1])
        assert_close(got[2], num[0], dtype, "gc_prev")
        assert_close(got[3], num[1], dtype, "gx")


def test_lstm_cell_double_backward():
    """pytensor.grad of an expression of the first gradients, against finite differences of the
    analytic first gradients; every input of the gradient op (c, gc, gh included) covered."""
    rng = np.random.default_rng(3)
    for c_shape, x_shape in [((4, 3), (3, 12)), ((3, 2, 2), (3, 8, 2))]:
        cv, xv = rng.uniform(-1, 1, c_shape), rng.uniform(-1, 1, x_shape)
        wc, wh = rng.uniform(-1, 1, c_shape), rng.uniform(-1, 1, (x_shape[0],) + c_shape[1:])
        u1, u2 = rng.uniform(-1, 1, c_shape), rng.uniform(-1, 1, x_shape)
        c_prev, x = pt.tensor("c", shape=(None,) * len(c_shape)), pt.tensor("x", shape=(None,) * len(x_shape))
        c, h = lstm_cell(c_prev, x)
        g_c, g_x = pytensor.grad((c * wc).sum() + (h * wh).sum(), [c_prev, x])
        second = (g_c * u1).sum() + (g_x * u2).sum() + (g_x ** 2).sum()
        gg = pytensor.grad(second, [c_prev, x])
        f = pytensor.function([c_prev, x], gg)
        assert not any(isinstance(nd.op, pytensor.tensor.elemwise.Elemwise) and nd.op.scalar_op.__class__.__name__
                       in ("Tanh", "Sigmoid") for nd in f.maker.fgraph.toposort())
        assert any(isinstance(nd.op, NativeOp) and nd.op.name == "LstmCellGradGrad" for nd in f.maker.fgraph.toposort())
        got = f(cv, xv)
        fg = pytensor.function([c_prev, x], second, mode="FAST_COMPILE")  # the reference: same kernels, no Numba
        num = numeric_grad(lambda a, b: float(fg(a, b)), [cv, xv], [0, 1], eps=1e-5)
        np.testing.assert_allclose(got[0], num[0], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got[1], num[1], rtol=1e-5, atol=1e-7)


def test_lstm_cell_grad_op_second_order_all_inputs():
    """LstmCellGrad alone (c independent of c_prev and x, as in chainer's TestLSTMGrad), verify_grad of
    its outputs w.r.t. all five inputs, with a shrinking batch."""
    rng = np.random.default_rng(12)
    for bx in (3, 2):  # (batch 0: see test_lstm_cell_forward_and_backward)
        vals = [rng.uniform(-1, 1, (3, 2, 4)), rng.uniform(-1, 1, (bx, 8, 4)), rng.uniform(-1, 1, (3, 2, 4)),
                rng.uniform(-1, 1, (3, 2, 4)), rng.uniform(-1, 1, (bx, 2, 4))]
        w1, w2 = rng.uniform(-1, 1, (3, 2, 4)), rng.uniform(-1, 1, (bx, 8, 4))

        def cost(*args):
            g1, g2 = LstmCellGrad.make_op()(*args)
            return (g1 * w1).sum() + (g2 * w2).sum()

        verify_grad(cost, vals, rng=rng)


def test_lstm_cell_bad_input():
    with pytest.raises(ValueError, match="4 \\* c_prev"):
        lstm_cell(pt.matrix(shape=(2, 3)), pt.matrix(shape=(2, 10)))
    with pytest.raises(ValueError, match="ndim"):
        lstm_cell(pt.matrix(), pt.tensor3())
    with pytest.raises(TypeError, match=r"^lstm_cell: c_prev must be float32 or float64, got int32"):
        lstm_cell(pt.imatrix(), pt.imatrix())
    c_prev, x = pt.matrix("c"), pt.matrix("x")
    f = pytensor.function([c_prev, x], lstm_cell(c_prev, x))
    with pytest.raises(ValueError, match=r"LstmCell.*lstm_cell: len\(x\) = 3 must not exceed len\(c_prev\) = 2"):
        f(np.zeros((2, 3)), np.zeros((3, 12)))  # len(x) > len(c_prev)
    with pytest.raises(ValueError, match=r"LstmCell.*lstm_cell: x.shape\[1\] = 10; expected 4 \* c_prev.shape\[1\] "
                                         r"= 12"):
        f(np.zeros((2, 3)), np.zeros((2, 10)))


# ---------------------------------------------------------------------- lstm() layer helper
def ref_layer(xv, W_in, W_rec, b, y0, c0, mask, direction, impl):
    T = xv.shape[0]
    if impl == "native2":
        Y, C, H, d = native_lstm2_forward(xv @ W_in + b, W_rec, y0, c0, mask, 0, direction)
    else:
        Y, C, d = lstm_lowmem_forward(xv, np.concatenate([W_in, W_rec]), b, y0, c0, mask, 0, direction)
    final_y = y0.copy()
    order = range(T) if direction == 1 else range(T - 1, -1, -1)
    for t in order:
        final_y = np.where(mask[t][:, None] > 0, Y[t], final_y)
    return Y, d, final_y


@pytest.mark.parametrize("impl", ["native2", "lowmem"])
@pytest.mark.parametrize("direction", [1, -1])
def test_lstm_layer_helper(impl, direction):
    T, B, n_in, n = 5, 4, 3, 2
    rng = np.random.default_rng(direction + 7)
    xv, W_in, W_rec = rng.normal(size=(T, B, n_in)), rng.normal(size=(n_in, 4 * n)), rng.normal(size=(n, 4 * n))
    b, y0, c0 = rng.normal(size=(4 * n,)), rng.normal(size=(B, n)), rng.normal(size=(B, n))
    mask = ragged_mask(T, B, rng)
    mask[:, 3] = 0.0  # a sequence without frames: final_y = y0, final_c = c0
    weights = [np.full((T, B, n), 1.0), np.full((B, n), 2.0), np.full((B, n), 3.0)]  # cost: sum_k (k + 1) out_k
    got = layer_function(impl, None, direction)(xv, W_in, W_rec, b, y0, c0, mask, *weights)
    vals = [xv, W_in, W_rec, b, y0, c0]
    for name, g, r in zip(["Y", "final_c", "final_y"], got, ref_layer(*vals, mask, direction, impl)):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12, err_msg=name)
    np.testing.assert_array_equal(got[1][3], c0[3])
    np.testing.assert_array_equal(got[2][3], y0[3])

    def cost(*a):
        return sum((o * (k + 1)).sum() for k, o in enumerate(ref_layer(*a, mask, direction, impl)))

    for g, r in zip(got[3:], numeric_grad(cost, vals, range(6))):
        np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("impl", ["native2", "lowmem"])
def test_lstm_layer_reused_buffers_across_sizes(monkeypatch, impl):
    """The CPU kernels keep their weight-sized buffers (packed weights, packing space) for the calling thread's next
    call (docs/lstm.md, "Memory kept between calls"): layers of two sizes called in turn, larger and smaller ones
    taking each other's buffers, give bit for bit what a fresh thread (whose pool is empty) gives."""
    import threading

    monkeypatch.setenv("PTNATIVE_NUM_THREADS", "2")
    fns, args = [], []
    for T, B, n_in, n, seed in [(16, 41, 40, 64, 1), (12, 30, 20, 36, 2)]:  # both take the row-split path
        rng = np.random.default_rng(seed)
        vals = [rng.normal(size=(T, B, n_in)), rng.normal(size=(n_in, 4 * n)) * 0.2, rng.normal(size=(n, 4 * n)) * 0.2,
                rng.normal(size=(4 * n,)), holey_mask(T, B, rng)]
        vals = [np.asarray(v, dtype="float32") for v in vals]
        syms = [sym_like(f"in{k}", v, "float32") for k, v in enumerate(vals)]
        outs = lstm(*syms[:4], mask=syms[4], impl=impl)
        grads = pytensor.grad(sum((o * (k + 1)).sum() for k, o in enumerate(outs)), syms[:4])
        fns.append(pytensor.function(syms, [*outs, *grads]))
        args.append(vals)
    fresh = [None, None]

    def in_fresh_thread(k):
        fresh[k] = fns[k](*args[k])

    for k in (0, 1):
        t = threading.Thread(target=in_fresh_thread, args=(k,))
        t.start()
        t.join()
    for k in (0, 1, 0, 1, 1, 0):
        for name, got, want in zip(["Y", "final_c", "final_y", "dx", "dW_in", "dW_rec", "db"], fns[k](*args[k]),
                                   fresh[k]):
            np.testing.assert_array_equal(got, want, err_msg=f"{name}, size {k}")


def test_lstm_layer_helper_defaults_and_errors():
    x = pt.tensor3("x", dtype="float32")
    W_in, W_rec, b = pt.matrix(dtype="float32"), pt.matrix(dtype="float32"), pt.vector(dtype="float32")
    Y, c, y = lstm(x, W_in, W_rec, b)
    f = pytensor.function([x, W_in, W_rec, b], [Y, c, y])
    rng = np.random.default_rng(0)
    vals = [rng.normal(size=s).astype("float32") for s in [(3, 2, 4), (4, 8), (2, 8), (8,)]]
    Yv, cv, yv = f(*vals)
    ref = ref_layer(*vals, np.zeros((2, 2)), np.zeros((2, 2)), np.ones((3, 2)), 1, "native2")
    assert Yv.dtype == np.float32
    np.testing.assert_allclose(Yv, ref[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(yv, Yv[-1], rtol=1e-6)
    with pytest.raises(ValueError, match="impl"):
        lstm(x, W_in, W_rec, b, impl="cudnn")
    with pytest.raises(ValueError, match="direction"):
        lstm(x, W_in, W_rec, b, direction=2)
    with pytest.raises(ValueError, match="ndim"):
        lstm(x, W_in, W_rec, W_in)


# ---------------------------------------------------------------------- modes, shapes, edge cases
def _all_ops_graph():
    """One graph using every new op (forward and gradient), float64."""
    T, B, n, n_in = 4, 3, 2, 3
    d2, dl = lstm2_data(T, B, n, seed=5), lowmem_data(T, B, n_in, n, seed=6)
    rng = np.random.default_rng(2)
    X, W, y0, c0 = pt.tensor3("X"), pt.matrix("W"), pt.matrix("y0"), pt.matrix("c0")
    i = pt.matrix("i")
    Xl, Wl, bl = pt.tensor3("Xl"), pt.matrix("Wl"), pt.vector("bl")
    Y2, C2, H2, d2o = NativeLstm2.make_op()(X, W, y0, c0, i, pt.constant(np.int32(0)), pt.constant(np.int32(-1)))
    Yl, Cl, dl_o = LstmLowMem.make_op()(Xl, Wl, bl, y0, c0, i, pt.constant(np.int32(0)), pt.constant(np.int32(1)))
    X4, Vh, Vv, W4, b4 = pt.tensor4("X4"), pt.matrix("Vh"), pt.matrix("Vv"), pt.matrix("W4"), pt.vector("b4")
    Yt, Ht = twod_lstm(X4, Vh, Vv, W4, b4, pt.constant(np.array([[2.0, 3.0], [1.0, 2.0]])))
    cp, xc = pt.matrix("cp"), pt.matrix("xc")
    cc, hc = lstm_cell(cp, xc)
    g_cell = pytensor.grad((cc ** 2).sum() + hc.sum(), [cp, xc])
    gg_cell = pytensor.grad((g_cell[1] ** 2).sum(), cp)
    cost = (Y2 ** 2).sum() + d2o.sum() + (Yl ** 2).sum() + dl_o.sum() + (Yt ** 2).sum()
    grads = pytensor.grad(cost, [X, W, y0, c0, Xl, Wl, bl, X4, Vh, Vv, W4, b4])
    inputs = [X, W, y0, c0, i, Xl, Wl, bl, X4, Vh, Vv, W4, b4, cp, xc]
    values = [d2["X"], d2["W"], d2["y0"], d2["c0"], d2["i"], dl["X"], dl["W"], dl["b"],
              rng.normal(size=(2, 3, 2, 2)), rng.normal(size=(2, 10)), rng.normal(size=(2, 10)),
              rng.normal(size=(2, 10)), rng.normal(size=(10,)), rng.normal(size=(4, 2)), rng.normal(size=(3, 8))]
    return inputs, [Y2, C2, H2, d2o, Yl, Cl, dl_o, Yt, Ht, cc, hc, *g_cell, gg_cell, *grads], values


def test_new_ops_modes_agree():
    inputs, outputs, values = _all_ops_graph()
    results = [pytensor.function(inputs, outputs, mode=m)(*values) for m in [None, "C", "CVM", "FAST_COMPILE"]]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_new_ops_infer_shape():
    inputs, outputs, values = _all_ops_graph()
    check_infer_shape(inputs, outputs[:11], values, NativeOp)


def test_new_ops_empty_time_and_batch(mode):
    n, n_in = 2, 3
    X, W, y0, c0, i = pt.tensor3("X"), pt.matrix("W"), pt.matrix("y0"), pt.matrix("c0"), pt.matrix("i")
    Xl, Wl, bl = pt.tensor3("Xl"), pt.matrix("Wl"), pt.vector("bl")
    zero, minus = pt.constant(np.int32(0)), pt.constant(np.int32(-1))
    Y2, C2, H2, d2 = NativeLstm2.make_op()(X, W, y0, c0, i, zero, minus)
    Yl, Cl, dl = LstmLowMem.make_op()(Xl, Wl, bl, y0, c0, i, zero, minus)
    g = pytensor.grad(Y2.sum() + 2 * d2.sum() + Yl.sum() + 3 * dl.sum(), [X, W, y0, c0, Xl, Wl, bl])
    f = pytensor.function([X, W, y0, c0, i, Xl, Wl, bl], [Y2, d2, dl, *g], mode=mode)
    for T, B in [(0, 2), (3, 0)]:
        c0v = np.arange(B * n, dtype=np.float64).reshape(B, n)
        res = f(np.zeros((T, B, 4 * n)), np.ones((n, 4 * n)), np.ones((B, n)), c0v, np.ones((T, B)),
                np.zeros((T, B, n_in)), np.ones((n_in + n, 4 * n)), np.ones(4 * n))
        Yv, d2v, dlv, gX, gW, gy0, gc0, gXl, gWl, gbl = res
        assert Yv.shape == (T, B, n) and gX.shape == (T, B, 4 * n) and gXl.shape == (T, B, n_in)
        np.testing.assert_array_equal(d2v, c0v)
        np.testing.assert_array_equal(dlv, c0v)
        np.testing.assert_array_equal(gc0, 5 * np.ones((B, n)))
        assert not gW.any() and not gy0.any() and not gWl.any() and not gbl.any()
    # TwoDLSTM with an empty grid
    X4 = pt.tensor4("X4")
    Yt, Ht = twod_lstm(X4, np.ones((n, 5 * n)), np.ones((n, 5 * n)), np.ones((n_in, 5 * n)), np.ones(5 * n),
                       pt.matrix("sizes"))
    gt = pytensor.grad(Yt.sum(), X4)
    ft = pytensor.function([X4, Yt.owner.inputs[10]], [Yt, gt], mode=mode)
    for shape in [(0, 3, 2, n_in), (2, 3, 0, n_in)]:
        yv, gv = ft(np.zeros(shape), np.zeros((shape[2], 2)))
        assert yv.shape == shape[:3] + (n,) and gv.shape == shape


def test_lstm_layer_shape_errors_name_the_argument():
    """Static shapes that contradict each other: ValueError naming lstm()'s argument, when the graph is built."""
    x = pt.tensor3("x", shape=(5, 2, 3))
    W_in, W_rec, b = pt.matrix(shape=(3, 8)), pt.matrix(shape=(2, 8)), pt.vector(shape=(8,))
    lstm(x, W_in, W_rec, b)  # consistent
    cases = [
        (dict(W_rec=pt.matrix(shape=(2, 6))),
         r"lstm: W_rec.shape\[1\] = 6; expected 4 \* n \(n = W_rec.shape\[0\]\) = 8"),
        (dict(W_in=pt.matrix(shape=(4, 8))), r"lstm: W_in.shape\[0\] = 4; expected n_in \(x.shape\[2\]\) = 3"),
        (dict(b=pt.vector(shape=(9,))), r"lstm: b.shape\[0\] = 9; expected 4 \* n"),
        (dict(y0=pt.matrix(shape=(3, 2))), r"lstm: y0.shape\[0\] = 3; expected B \(x.shape\[1\]\) = 2"),
        (dict(c0=pt.matrix(shape=(2, 5))), r"lstm: c0.shape\[1\] = 5; expected n \(W_rec.shape\[0\]\) = 2"),
        (dict(mask=pt.matrix(shape=(4, 2))), r"lstm: mask.shape\[0\] = 4; expected T \(x.shape\[0\]\) = 5"),
    ]
    for kwargs, msg in cases:
        args = dict(x=x, W_in=W_in, W_rec=W_rec, b=b)
        args.update(kwargs)
        with pytest.raises(ValueError, match=msg):
            lstm(**args)


def test_new_ops_bad_input(mode):
    X, W, y0, c0, i = pt.tensor3("X"), pt.matrix("W"), pt.matrix("y0"), pt.matrix("c0"), pt.matrix("i")
    start, step = pt.iscalar("start"), pt.iscalar("step")
    outs = NativeLstm2.make_op()(X, W, y0, c0, i, start, step)
    f = pytensor.function([X, W, y0, c0, i, start, step], outs, mode=mode)
    d = lstm2_data(3, 2, 2)
    args = [d[k] for k in ("X", "W", "y0", "c0", "i")]
    for bad_start, bad_step, msg in [(3, 1, r"start = 3 is out of range \[0, T = 3\)"),
                                     (-1, 1, r"start = -1 is out of range"), (0, 0, "step must not be 0")]:
        with pytest.raises(ValueError, match="NativeLstm2.*" + msg):
            f(*args, bad_start, bad_step)
    with pytest.raises(ValueError, match=r"NativeLstm2.*W.shape\[0\] = 1; expected n \(y0.shape\[1\]\) = 2"):
        f(args[0], args[1][:1], *args[2:], 0, 1)
    Xl, Wl, bl = pt.tensor3("Xl"), pt.matrix("Wl"), pt.vector("bl")
    fl = pytensor.function([Xl, Wl, bl, y0, c0, i, start, step],
                           LstmLowMem.make_op()(Xl, Wl, bl, y0, c0, i, start, step), mode=mode)
    dl = lowmem_data(3, 2, 3, 2)
    argl = [dl[k] for k in ("X", "W", "b", "y0", "c0", "i")]
    with pytest.raises(ValueError, match=r"LstmLowMem.*start = 5 is out of range \[0, T = 3\)"):
        fl(*argl, 5, 1)
    with pytest.raises(ValueError, match=r"LstmLowMem.*W.shape\[0\] = 4; expected n_in \+ n "
                                         r"\(X.shape\[2\] \+ y0.shape\[1\]\) = 5"):
        fl(argl[0], argl[1][1:], *argl[2:], 0, 1)
    with pytest.raises(TypeError, match=r"NativeLstm2.*input 'step' \(#6\) must be int32, got float32"):
        NativeLstm2.make_op()(X, W, y0, c0, i, start, pt.fscalar())  # float step


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_new_lstm_kernels_compile_with_nvcc(monkeypatch):
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    ops = [cls.make_op() for cls in (NativeLstm2, NativeLstm2Layer, LstmLowMem, TwoDLSTM, LstmCell, LstmCellGrad,
                                     LstmCellGradGrad)]
    ops += [op.grad_op() for op in ops if op.c_bw_code]
    build_with_nvcc(*(o.variant("float32", device="cuda") for o in ops))


# ---------------------------------------------------------------------- NaN and inf on padding (issue 14)
LAYER_ARGS = ["x", "W_in", "W_rec", "b", "y0", "c0", "mask"]


def layer_values(T=6, B=4, n_in=3, n=2, seed=21):
    """lstm()'s arguments (float64) with trailing padding, a hole inside sequence 1 and an empty sequence 3."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(T)[:, None] < np.array([T, T, 3, 0])[None, :]).astype(np.float64)
    mask[2, 1] = 0.0
    return [rng.normal(size=(T, B, n_in)), rng.normal(size=(n_in, 4 * n)), rng.normal(size=(n, 4 * n)) * 0.5,
            rng.normal(size=4 * n), rng.normal(size=(B, n)), rng.normal(size=(B, n)), mask]


@compiled_once
def layer_function(impl, mode, direction=1):
    """lstm()'s outputs (Y, final_c, final_y) and the gradients of sum(Y * wY) + sum(final_c * wc) +
    sum(final_y * wy) w.r.t. x, W_in, W_rec, b, y0 and c0, a function of (x, W_in, W_rec, b, y0, c0, mask, wY, wc,
    wy), float64 of unknown shapes (compiled once per process: conftest.compiled_once)."""
    syms = [pt.tensor(k, dtype="float64", shape=(None,) * nd)
            for k, nd in zip([*LAYER_ARGS, "wY", "wc", "wy"], [3, 2, 2, 1, 2, 2, 2, 3, 2, 2])]
    outs = lstm(*syms[:4], y0=syms[4], c0=syms[5], mask=syms[6], direction=direction, impl=impl)
    grads = pytensor.grad(sum((o * w).sum() for o, w in zip(outs, syms[7:])), syms[:6])
    return pytensor.function(syms, [*outs, *grads], mode=mode)


#: layer_values()'s cotangents (wY, wc, wy) for layer_function.
LAYER_WEIGHTS = cotangents([(6, 4, 2), (4, 2), (4, 2)], seed=4)


LAYER_RESULTS = ["Y", "final_c", "final_y", "dx", "dW_in", "dW_rec", "db", "dy0", "dc0"]


@pytest.mark.parametrize("direction", [1, -1])
@pytest.mark.parametrize("impl", ["native2", "lowmem"])
def test_lstm_layer_nan_and_inf_on_padding_change_nothing(mode, impl, direction):
    """NaN / inf in x on masked frames (trailing padding, a hole, an empty sequence): every output and every
    gradient equals the run without them, exactly (masks select, they do not multiply)."""
    f = layer_function(impl, mode, direction)
    vals = layer_values()
    clean = f(*vals, *LAYER_WEIGHTS)
    dirty = [v.copy() for v in vals]
    dirty[0][5, 2] = np.nan        # trailing padding of sequence 2
    dirty[0][2, 1, 0] = np.inf     # the hole inside sequence 1
    dirty[0][:, 3, 1] = -np.inf    # sequence 3 has no frame
    dirty[0][4, 3, 0] = np.nan
    got = f(*dirty, *LAYER_WEIGHTS)
    for name, g, c in zip(LAYER_RESULTS, got, clean):
        assert np.isfinite(c).all(), name
        np.testing.assert_array_equal(g, c, err_msg=f"{name} with NaN / inf on padding")


@pytest.mark.parametrize("impl", ["native2", "lowmem"])
def test_lstm_layer_nan_on_a_valid_frame_reaches_its_sequence(impl):
    """NaN in x on a valid frame: NaN in that sequence's outputs from that frame on (Y on its later valid
    frames, final_c, final_y) and in its dx; the other sequences' outputs and dx are unchanged."""
    f = layer_function(impl, None)
    vals = layer_values()
    clean = f(*vals, *LAYER_WEIGHTS)
    dirty = [v.copy() for v in vals]
    dirty[0][1, 2, 0] = np.nan  # frame 1 of sequence 2 (3 frames)
    got = dict(zip(LAYER_RESULTS, f(*dirty, *LAYER_WEIGHTS)))
    assert np.isnan(got["Y"][1:3, 2]).all() and not np.isnan(got["Y"][3:, 2]).any()  # Y is 0 on padding
    assert np.isnan(got["final_c"][2]).all() and np.isnan(got["final_y"][2]).all()
    assert np.isnan(got["dx"][:2, 2]).any()
    others = [0, 1, 3]
    for name, axis in [("Y", 1), ("final_c", 0), ("final_y", 0), ("dx", 1)]:
        np.testing.assert_array_equal(np.take(got[name], others, axis), np.take(clean[LAYER_RESULTS.index(name)],
                                                                                others, axis), err_msg=name)
    assert np.isnan(got["dW_rec"]).any(), "the weight gradients sum over the sequences"


def _nan_on_padding_op_check(op, values, n_diff, out_weights, padded_input, skip_outputs=(), scalar_args=()):
    """``op`` run with grads on ``values`` and with NaN in ``padded_input``'s masked entries (values[0] with the
    entries given by ``padded_input`` replaced): the outputs (but ``skip_outputs``) and gradients are equal."""
    clean_out, clean_grads = run_op_with_grads(op, values, n_diff, out_weights, "float64", scalar_args=scalar_args)
    dirty = [v.copy() for v in values]
    dirty[0][padded_input] = np.nan
    got_out, got_grads = run_op_with_grads(op, dirty, n_diff, out_weights, "float64", scalar_args=scalar_args)
    for k, (g, c) in enumerate(zip(got_out, clean_out)):
        if k not in skip_outputs:
            np.testing.assert_array_equal(g, c, err_msg=f"output {k}")
    for k, (g, c) in enumerate(zip(got_grads, clean_grads)):
        assert np.isfinite(c).all()
        np.testing.assert_array_equal(g, c, err_msg=f"gradient {k}")


@pytest.mark.parametrize("start,step", [(0, 1), (0, -1)])
def test_native_lstm2_and_lowmem_nan_on_padding(start, step):
    T, B, n, n_in = 6, 3, 2, 3
    d2, dl = lstm2_data(T, B, n, seed=8), lowmem_data(T, B, n_in, n, seed=8)
    pad = d2["i"] == 0
    assert pad.any()
    DY, DC, Dd = cotangents([(T, B, n), (T, B, n), (B, n)])
    # every frame is visited, so H (output 2) too is the same: 0 on the masked rows, whatever X holds there
    _nan_on_padding_op_check(NativeLstm2.make_op(), [d2[k] for k in ("X", "W", "y0", "c0", "i")], 4,
                             [DY, DC, None, Dd], pad, scalar_args=(start, step))
    _nan_on_padding_op_check(LstmLowMem.make_op(), [dl[k] for k in ("X", "W", "b", "y0", "c0", "i")], 5,
                             [DY, DC, Dd], dl["i"] == 0, scalar_args=(start, step))


def test_lstm_generic_nan_on_padding():
    T, B, n = 6, 4, 3
    Z, V_h, c, i = lstm_data(T, B, n, "float64", seed=2)
    assert (i == 0).any()
    DY, Dd = cotangents([(T, B, n), (B, n)])
    _nan_on_padding_op_check(LstmGenericBase.make_op(), [Z, V_h, c, i], 3, [DY, None, Dd], i == 0, skip_outputs=(1,))


def test_twod_lstm_nan_outside_the_grid():
    """NaN in X on cells outside a pair's grid: CompleteY and every gradient equal the run without it; NaN on a
    valid cell reaches that pair's cells to the right and below, not the other pair."""
    rng = np.random.default_rng(12)
    h, w, B, n_in, n = 3, 4, 2, 2, 2
    X = rng.normal(size=(h, w, B, n_in))
    params = [rng.normal(size=(n, 5 * n)) * 0.5, rng.normal(size=(n, 5 * n)) * 0.5, rng.normal(size=(n_in, 5 * n)),
              rng.normal(size=5 * n)]
    sizes = np.array([[3.0, 4.0], [2.0, 3.0]])
    syms = [pt.tensor4("X"), pt.matrix("V_h"), pt.matrix("V_v"), pt.matrix("W"), pt.vector("b")]
    Y, H = twod_lstm(*syms, pt.constant(sizes))
    DY = cotangents([(h, w, B, n)], seed=3)[0]
    f = pytensor.function(syms, [Y, *pytensor.grad((Y * DY).sum(), syms)])
    clean = f(X, *params)
    dirty = X.copy()
    dirty[2, :, 1] = np.nan  # row 2 of pair 1 (height 2)
    dirty[:, 3, 1] = np.inf  # column 3 of pair 1 (width 3)
    for name, g, c in zip(["CompleteY", "dX", "dV_h", "dV_v", "dW", "db"], f(dirty, *params), clean):
        assert np.isfinite(c).all(), name
        np.testing.assert_array_equal(g, c, err_msg=f"{name} with NaN outside the grid")
    dirty = X.copy()
    dirty[1, 1, 0, 0] = np.nan
    got = f(dirty, *params)
    assert np.isnan(got[0][1:, 1:, 0]).all() and not np.isnan(got[0][:1, :, 0]).any()
    np.testing.assert_array_equal(got[0][:, :, 1], clean[0][:, :, 1])
    np.testing.assert_array_equal(got[1][:, :, 1], clean[1][:, :, 1])


# ---------------------------------------------------------------------- lstm() shape errors at run time
@pytest.mark.parametrize("impl", ["native2", "lowmem"])
def test_lstm_layer_run_time_shape_errors_name_the_argument(mode, impl):
    """Shapes unknown when the graph is built: the ValueError when it runs (forward and gradient graph) names lstm()'s
    argument and both sizes."""
    f = layer_function(impl, mode)
    vals = layer_values()
    f(*vals, *LAYER_WEIGHTS)
    cases = [("W_rec", np.ones((2, 6)), r"lstm: W_rec.shape\[1\] = 6; expected 4 \* n \(n = W_rec.shape\[0\]\) = 8"),
             ("W_in", np.ones((4, 8)), r"lstm: W_in.shape\[0\] = 4; expected n_in \(x.shape\[2\]\) = 3"),
             ("b", np.ones(6), r"lstm: b.shape\[0\] = 6; expected 4 \* n \(n = W_rec.shape\[0\]\) = 8"),
             ("y0", np.ones((3, 2)), r"lstm: y0.shape\[0\] = 3; expected B \(x.shape\[1\]\) = 4"),
             ("c0", np.ones((4, 3)), r"lstm: c0.shape\[1\] = 3; expected n \(W_rec.shape\[0\]\) = 2"),
             ("mask", np.ones((5, 4)), r"lstm: mask.shape\[0\] = 5; expected T \(x.shape\[0\]\) = 6"),
             ("mask", np.ones((6, 5)), r"lstm: mask.shape\[1\] = 5; expected B \(x.shape\[1\]\) = 4")]
    for name, bad, msg in cases:
        args = list(vals)
        args[LAYER_ARGS.index(name)] = bad
        with pytest.raises(ValueError, match=msg):
            f(*args, *LAYER_WEIGHTS)
