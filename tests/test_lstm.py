"""LstmGenericBase (the foundation's proof op) against the numpy reference."""

import shutil

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import verify_grad

import ptnative
from ptnative import NativeOp
from ptnative.ops import LstmGenericBase

from .conftest import check_infer_shape, tol
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
    with pytest.raises(ValueError, match="LstmGenericBase.*check failed"):
        f(values[0], values[1][:3], values[2], values[3])  # V_h has 3 rows, n = 4
    with pytest.raises(ValueError, match="LstmGenericBase.*check failed"):
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
    for o in (op, op.grad_op()):
        path = ptnative.build.build(o.variant(dtype, device="cuda"))
        assert path.exists() and path.stat().st_size > 0
