"""Chunking / UnChunking against loop references: overlaps, gaps, ragged masks, gradients."""

import shutil

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import verify_grad

from ptnative import NativeOp
from ptnative.ops.chunking import Chunking, UnChunking, chunk, n_chunks, naive_chunk_start_frames, unchunk

from .conftest import build_with_nvcc, check_infer_shape, tol
from .reference import chunking as ref


def data(T, B, D, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(T, B, D))
    lens = rng.integers(0, T + 1, size=B)
    if B:
        lens[0] = T
    mask = (np.arange(T)[:, None] < lens[None, :]).astype(np.float64)
    return x, mask


def test_n_chunks_seed_examples():
    for T, expected in [(1, 1), (49, 1), (50, 1), (51, 2), (60, 2), (61, 3), (99, 6), (100, 6), (101, 7)]:
        assert n_chunks(T, 50, 10) == expected
        assert len(naive_chunk_start_frames(T, 50, 10)) == expected
    for T, size, step in [(0, 4, 2), (7, 4, 2), (10, 2, 5), (11, 2, 5), (3, 5, 1), (20, 3, 3)]:
        starts = naive_chunk_start_frames(T, size, step)
        assert starts == [c * step for c in range(ref.n_chunks(T, size, step))]
        assert n_chunks(T, size, step) == len(starts)
    assert Chunking.naive_chunk_start_frames(100, 50, 10) == [0, 10, 20, 30, 40, 50]
    with pytest.raises(ValueError, match=r"^naive_chunk_start_frames: chunk_size must be >= 1, got 0"):
        naive_chunk_start_frames(10, 0, 1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_forward_and_gradients_against_reference(mode, dtype):
    """Symbolic chunk size and step: one graph, checked with overlaps, tiling and gaps."""
    if dtype == "float32" and mode not in (None, "C"):
        pytest.skip("float32 is checked in the default and C modes")
    T, B, D = 7, 3, 2
    x, m = pt.tensor3("x", dtype=dtype), pt.matrix("m", dtype=dtype)
    size, step = pt.iscalar("size"), pt.iscalar("step")
    d_out, d_y = pt.tensor3("d_out", dtype=dtype), pt.tensor3("d_y", dtype=dtype)
    c_in = pt.tensor3("c", dtype=dtype)
    out, oindex = chunk(x, m, size, step)
    y, yindex, factors = unchunk(out * 2 + 1, oindex, size, step, x.shape[0], x.shape[1])
    g_chunk = pytensor.grad((out * d_out).sum(), x)
    y2, _, _ = unchunk(c_in, oindex, size, step, x.shape[0], x.shape[1])
    g_unchunk = pytensor.grad((y2 * d_y).sum(), c_in)
    f = pytensor.function([x, m, size, step, c_in, d_out, d_y],
                          [out, oindex, y, yindex, factors, g_chunk, g_unchunk], mode=mode)
    rtol, atol = tol(dtype)
    for sz, st in [(4, 2), (3, 3), (2, 3), (8, 1)]:  # overlaps, tiling, gaps, one chunk longer than T
        xv, mv = data(T, B, D, seed=sz * 10 + st)
        rng = np.random.default_rng(sz)
        nc = ref.n_chunks(T, sz, st)
        cv, dov, dyv = rng.normal(size=(sz, B * nc, D)), rng.normal(size=(sz, B * nc, D)), rng.normal(size=(T, B, D))
        got = f(*[a.astype(dtype) for a in (xv, mv)], sz, st, *[a.astype(dtype) for a in (cv, dov, dyv)])
        r_out, r_oindex = ref.chunk(xv, mv, sz, st)
        r_y, r_yindex, r_factors = ref.unchunk(r_out * 2 + 1, r_oindex, sz, st, T, B)
        r_g_chunk = ref.linear_map_transpose(lambda v: ref.chunk(v, mv, sz, st)[0], xv.shape, dov)
        r_g_unchunk = ref.linear_map_transpose(lambda v: ref.unchunk(v, r_oindex, sz, st, T, B)[0], cv.shape, dyv)
        names = ["out", "oindex", "y", "yindex", "factors", "g_chunk", "g_unchunk"]
        for name, g, r in zip(names, got, [r_out, r_oindex, r_y, r_yindex, r_factors, r_g_chunk, r_g_unchunk]):
            assert g.dtype == dtype, name
            np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, err_msg=f"{name} size={sz} step={st}")


def test_round_trip_identity(mode):
    T, B, D = 9, 3, 4
    xv, mv = data(T, B, D, seed=3)
    x, m = pt.tensor3("x"), pt.matrix("m")
    out, oindex = chunk(x, m, 5, 2)
    y, yindex, _ = unchunk(out, oindex, 5, 2, x.shape[0], x.shape[1])
    w = np.random.default_rng(0).normal(size=(T, B, D))
    g = pytensor.grad((y * w).sum(), x)
    f = pytensor.function([x, m], [y, yindex, g], mode=mode)
    yv, yiv, gv = f(xv, mv)
    np.testing.assert_allclose(yv, xv * mv[:, :, None], rtol=1e-14, atol=0)
    np.testing.assert_array_equal(yiv, mv)
    np.testing.assert_allclose(gv, w * mv[:, :, None], rtol=1e-14, atol=0)


def test_verify_grad_float64():
    rng = np.random.default_rng(4)
    xv, mv = data(6, 2, 3, seed=5)
    nc = ref.n_chunks(6, 3, 2)
    cmask = ref.chunk(np.ones_like(xv), mv, 3, 2)[1]
    cmask[0, 1] = 0  # a chunk frame that does not count although its time frame does

    def chunk_cost(x):
        out, _ = chunk(x, pt.constant(mv), 3, 2)
        return (out ** 2).sum()

    def unchunk_cost(c):
        y, _, _ = unchunk(c, pt.constant(cmask), 3, 2, 6, 2)
        return (y ** 2 * np.arange(3.0)).sum()

    verify_grad(chunk_cost, [xv], rng=rng)
    verify_grad(unchunk_cost, [rng.normal(size=(3, 2 * nc, 3))], rng=rng)


def test_strided_input(mode):
    xv, mv = data(8, 3, 4, seed=6)
    xt = pt.tensor3("xt")  # (D, B, T), transposed in the graph
    m = pt.matrix("m")
    out, oindex = chunk(xt.transpose(2, 1, 0), m.T, 3, 2)
    f = pytensor.function([xt, m], [out, oindex], mode=mode)
    got = f(np.ascontiguousarray(xv.transpose(2, 1, 0)), np.ascontiguousarray(mv.T))
    for g, r in zip(got, ref.chunk(xv, mv, 3, 2)):
        np.testing.assert_allclose(g, r, rtol=1e-14)


def test_empty_time_and_batch(mode):
    x, m = pt.tensor3("x"), pt.matrix("m")
    out, oindex = chunk(x, m, 4, 2)
    y, yindex, factors = unchunk(out, oindex, 4, 2, x.shape[0], x.shape[1])
    g = pytensor.grad(y.sum() + out.sum(), x)
    f = pytensor.function([x, m], [out, oindex, y, yindex, factors, g], mode=mode)
    o, oi, yv, yi, fa, gv = f(np.zeros((0, 2, 3)), np.zeros((0, 2)))
    assert o.shape == (4, 2, 3) and not o.any() and not oi.any()  # one empty chunk per sequence
    assert yv.shape == (0, 2, 3) and fa.shape == (0, 2) and gv.shape == (0, 2, 3)
    o, oi, yv, yi, fa, gv = f(np.zeros((5, 0, 3)), np.zeros((5, 0)))
    assert o.shape == (4, 0, 3) and yv.shape == (5, 0, 3) and gv.shape == (5, 0, 3)
    xv = np.ones((5, 2, 3))
    o, oi, yv, yi, fa, gv = f(xv, np.zeros((5, 2)))  # nothing counts
    assert not o.any() and not yv.any() and not yi.any()
    np.testing.assert_array_equal(fa, np.ones((5, 2)))
    np.testing.assert_array_equal(gv, np.zeros((5, 2, 3)))


def test_bad_input(mode):
    with pytest.raises(ValueError, match=r"^chunk: x must have ndim 3, got 2"):
        chunk(pt.matrix(), pt.matrix(), 2, 1)
    with pytest.raises(TypeError, match=r"^chunk: x must have a float dtype \(float32 or float64\), got int32"):
        chunk(pt.tensor3(dtype="int32"), pt.matrix(), 2, 1)
    with pytest.raises(ValueError, match=r"^chunk: index must have ndim 2, got 3"):
        chunk(pt.tensor3(), pt.tensor3(), 2, 1)
    with pytest.raises(TypeError, match=r"^chunk: index must have a real or bool dtype, got complex128"):
        chunk(pt.tensor3(), pt.matrix(dtype="complex128"), 2, 1)
    with pytest.raises(ValueError, match=r"^chunk: chunk_size must be >= 1, got 0"):
        chunk(pt.tensor3(), pt.matrix(), 0, 1)
    with pytest.raises(TypeError, match=r"^chunk: chunk_step must be an int >= 1 or an integer scalar tensor, got"):
        chunk(pt.tensor3(), pt.matrix(), 2, 1.5)
    with pytest.raises(ValueError, match=r"^unchunk: n_batch must be >= 0, got -1"):
        unchunk(pt.tensor3(), pt.matrix(), 2, 1, 5, -1)
    with pytest.raises(TypeError, match=r"^unchunk: n_time must have an integer dtype, got float64"):
        unchunk(pt.tensor3(), pt.matrix(), 2, 1, pt.dscalar(), 2)
    with pytest.raises(ValueError, match=r"^n_chunks: chunk_step must be >= 1, got 0"):
        n_chunks(5, 2, 0)
    with pytest.raises(ValueError, match=r"^naive_chunk_start_frames: chunk_size must be >= 1, got 0"):
        naive_chunk_start_frames(5, 0, 1)
    x, m = pt.tensor3("x"), pt.matrix("m")
    f = pytensor.function([x, m], chunk(x, m, 3, 2), mode=mode)
    with pytest.raises(ValueError, match="Chunking.*index dim 0 is 4, expected 5"):
        f(np.zeros((5, 2, 1)), np.zeros((4, 2)))
    # the op with hand-made buffers: the chunk count must match n_time
    buf, ibuf, params = pt.tensor3("buf"), pt.matrix("ibuf"), pt.vector("params")
    g = pytensor.function([x, m, buf, ibuf, params], Chunking.make_op()(x, m, buf, ibuf, params), mode=mode)
    xv, mv = np.zeros((5, 2, 1)), np.ones((5, 2))
    with pytest.raises(ValueError, match="n_batch \\* n_chunks.*is 6, expected 4"):
        g(xv, mv, np.zeros((3, 6, 1)), np.zeros((3, 6)), np.array([3.0, 2.0]))
    with pytest.raises(ValueError, match="chunk_step must be a positive integer, got 1.5"):
        g(xv, mv, np.zeros((3, 4, 1)), np.zeros((3, 4)), np.array([3.0, 1.5]))
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        g(xv, mv, np.zeros((3, 4, 1)), np.zeros((3, 4)), np.array([np.nan, 2.0]))
    with pytest.raises(ValueError, match="must have size 2"):
        g(xv, mv, np.zeros((3, 4, 1)), np.zeros((3, 4)), np.array([3.0, 2.0, 1.0]))
    c = pt.tensor3("c")
    h = pytensor.function([c, m], unchunk(c, m, 3, 2, 5, 2)[0], mode=mode)
    with pytest.raises(ValueError, match="UnChunking.*dim 1"):
        h(np.zeros((3, 6, 1)), np.ones((3, 6)))


def test_infer_shape():
    x, m = pt.tensor3("x"), pt.matrix("m")
    out, oindex = chunk(x, m, 4, 2)
    y, yindex, factors = unchunk(out, oindex, 4, 2, x.shape[0], x.shape[1])
    check_infer_shape([x, m], [out, oindex, y, yindex, factors], list(data(7, 2, 3)), NativeOp)


def test_inplace_buffers(mode):
    """The zero buffers made by chunk/unchunk are destroyed where the mode allows; same numbers."""
    x, m = pt.tensor3("x"), pt.matrix("m")
    out, oindex = chunk(x, m, 3, 2)
    y, _, _ = unchunk(out, oindex, 3, 2, x.shape[0], x.shape[1])
    f = pytensor.function([x, m], [out, y], mode=mode)
    nodes = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, NativeOp)]
    assert len(nodes) == 2 and all(bool(n.op.destroy_map) == (mode != "FAST_COMPILE") for n in nodes)
    xv, mv = data(6, 2, 2, seed=9)
    o, yv = f(xv, mv)
    np.testing.assert_allclose(o, ref.chunk(xv, mv, 3, 2)[0])
    np.testing.assert_allclose(yv, xv * mv[:, :, None])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_kernels_compile_with_nvcc(monkeypatch):
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    ops = [o for gen in (Chunking, UnChunking) for o in (gen.make_op(), gen.make_op().grad_op())]
    build_with_nvcc(*(o.variant("float32", device="cuda") for o in ops))
