"""NativeLstm2, NativeLstm2Layer and LstmLowMem on the CPU's cell split (docs/lstm.md, "The cell split"): where the
batch gives fewer row parts (one per 6 rows) than threads, each frame's gate columns are split over the threads, which
meet once per frame.  Every output and gradient must be the same bits as on one thread (one part computing every row)
at 2, 3 and 6 threads (more threads than this machine's cores: the parts go on with part 0 alone), for B = 1 to 5,
ragged masks (sorted lengths; unsorted with a hole, a fractional value and an empty sequence), both directions with
strides, float32 and float64 (LstmLowMem also over two chunks of frames); the forward outputs match the numpy
reference and the gradients those of the recurrence unrolled in PyTensor."""

from __future__ import annotations

import functools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from ptnative.ops.lstm import LstmLowMem, NativeLstm2, NativeLstm2Layer

from .reference.lstm import lstm_lowmem_forward, native_lstm2_forward, visited_frames
from .test_lstm import lowmem_graph, native_lstm2_graph, with_reference_gradients

LAYER_NAMES = ["Y", "C", "H", "d", "Dx", "DW_in", "DW", "Db", "Dy0", "Dc0"]
OP_NAMES = ["Y", "C", "H", "d", "DX", "DW", "Dy0", "Dc0"]
LOWMEM_NAMES = ["Y", "C", "d", "DX", "DW", "Db", "Dy0", "Dc0"]


def _mask(kind, T, B, rng, dtype):
    """"sorted": lengths in [T/2, T] sorted as CTC recipes have them (the trailing rows of late frames masked);
    "holes": unsorted lengths, a masked frame inside the first sequence, a mask of 0.5 in the second (or the first)
    and, with B >= 3, an empty last sequence."""
    lens = rng.integers(T // 2, T + 1, size=B)
    lens[0] = T
    if kind == "sorted":
        lens = np.sort(lens)[::-1]
    mask = (np.arange(T)[:, None] < lens[None, :]).astype(np.float64)
    if kind == "holes":
        mask[T // 3, 0] = 0.0
        mask[T // 2, min(1, B - 1)] = 0.5
        if B >= 3:
            mask[:, -1] = 0.0
    return mask.astype(dtype)


def _values(T, B, n_in, n, kind, dtype, seed):
    rng = np.random.default_rng(seed)
    f = lambda *s, scale=1.0: (rng.normal(size=s) * scale).astype(dtype)  # noqa: E731
    return dict(x=f(T, B, n_in), W_in=f(n_in, 4 * n, scale=0.15), W=f(n, 4 * n, scale=0.1), b=f(4 * n),
                y0=f(B, n), c0=f(B, n), i=_mask(kind, T, B, rng, dtype), DY=f(T, B, n), DC=f(T, B, n), Dd=f(B, n))


@functools.lru_cache(maxsize=None)
def _functions(dtype):
    """NativeLstm2Layer and NativeLstm2 (on x . W_in + b), each with the gradients of sum(Y DY) + sum(C DC) +
    sum(d Dd) w.r.t. its differentiable inputs; any shapes, start and step."""
    f3, fm = (lambda name: pt.tensor3(name, dtype=dtype)), (lambda name: pt.matrix(name, dtype=dtype))
    x, W_in, W, b = f3("x"), fm("W_in"), fm("W"), pt.vector("b", dtype=dtype)
    y0, c0, i, DY, DC, Dd = fm("y0"), fm("c0"), fm("i"), f3("DY"), f3("DC"), fm("Dd")
    X = f3("X")
    start, step = pt.iscalar("start"), pt.iscalar("step")

    def with_grads(outs, wrt):
        cost = (outs[0] * DY).sum() + (outs[1] * DC).sum() + (outs[3] * Dd).sum()
        return [*outs, *pytensor.grad(cost, wrt)]

    layer = NativeLstm2Layer.make_op()(x, W_in, W, b, y0, c0, i, start, step)
    op = NativeLstm2.make_op()(X, W, y0, c0, i, start, step)
    inputs = [x, W_in, W, b, y0, c0, i, DY, DC, Dd, start, step]
    f_layer = pytensor.function(inputs, with_grads(layer, [x, W_in, W, b, y0, c0]))
    f_op = pytensor.function([X, W, y0, c0, i, DY, DC, Dd, start, step], with_grads(op, [X, W, y0, c0]))
    return f_layer, f_op


def _run(dtype, v, start, step):
    f_layer, f_op = _functions(dtype)
    X = (np.einsum("tbk,kg->tbg", v["x"].astype(np.float64), v["W_in"]) + v["b"]).astype(dtype)
    s = (np.int32(start), np.int32(step))
    layer = f_layer(*[v[k] for k in ("x", "W_in", "W", "b", "y0", "c0", "i", "DY", "DC", "Dd")], *s)
    op = f_op(X, *[v[k] for k in ("W", "y0", "c0", "i", "DY", "DC", "Dd")], *s)
    return [np.array(r, copy=True) for r in layer], [np.array(r, copy=True) for r in op], X


# (T, B, n_in, n): over the threaded paths' threshold (4e6 multiply-adds in the recurrent products) also with the
# stride 2; n = 200 is 7 float32 panels of 32 cells (the last one partial) and 13 float64 ones of 16 (AVX-512).
SIZES = [(60, 1, 20, 200), (18, 3, 33, 200), (14, 5, 33, 200)]


def same_bits_cases(test):
    """The dtypes, masks and visiting patterns of the same-bits tests."""
    for mark in (pytest.mark.parametrize("start,step", [(0, 1), (1, -2)]),
                 pytest.mark.parametrize("kind", ["sorted", "holes"]),
                 pytest.mark.parametrize("dtype", ["float32", "float64"])):
        test = mark(test)
    return test


@same_bits_cases
@pytest.mark.parametrize("size", SIZES, ids=[f"B{s[1]}" for s in SIZES])
def test_cell_split_same_bits_as_one_thread(monkeypatch, dtype, kind, start, step, size):
    T, B, n_in, n = size
    v = _values(T, B, n_in, n, kind, dtype, seed=T + B + start)
    monkeypatch.setenv("PTNATIVE_NUM_THREADS", "1")
    one_layer, one_op, X = _run(dtype, v, start, step)
    # the forward outputs against the numpy reference (the layer's H on unvisited frames: x . W_in without b)
    ref = native_lstm2_forward(*(np.asarray(a, np.float64) for a in (X, v["W"], v["y0"], v["c0"], v["i"])), start,
                               step)
    rtol = 2e-4 if dtype == "float32" else 1e-10
    for name, got, want in zip(["Y", "C", "H", "d"], one_op, ref):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=f"NativeLstm2 {name}")
    visited = visited_frames(T, start, step)
    for name, got, want in zip(["Y", "C", "d"], [one_layer[0], one_layer[1], one_layer[3]], [ref[0], ref[1], ref[3]]):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=f"NativeLstm2Layer {name}")
    np.testing.assert_allclose(one_layer[2][visited], ref[2][visited], rtol=rtol, atol=rtol, err_msg="layer H")
    for threads in ("2", "3", "6"):  # 6 on fewer cores: parts that sleep at the meetings, then part 0 alone
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", threads)
        layer, op, _ = _run(dtype, v, start, step)
        for name, got, want in zip(LAYER_NAMES, layer, one_layer):
            np.testing.assert_array_equal(got, want, err_msg=f"NativeLstm2Layer {name}, {threads} threads")
        for name, got, want in zip(OP_NAMES, op, one_op):
            np.testing.assert_array_equal(got, want, err_msg=f"NativeLstm2 {name}, {threads} threads")
        again, _, _ = _run(dtype, v, start, step)
        for name, got, want in zip(LAYER_NAMES, again, layer):
            np.testing.assert_array_equal(got, want, err_msg=f"NativeLstm2Layer {name}, {threads} threads, again")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("B", [1, 3])
def test_cell_split_against_unrolled_reference(monkeypatch, dtype, B):
    """NativeLstm2's outputs and gradients on the cell split (2 and 3 threads) against the recurrence unrolled in
    PyTensor and differentiated by it (ragged mask with a hole and a fractional value; 25 frames: FAST_COMPILE's
    sums of per-frame terms take at most 32)."""
    T, n = 25, 200 if B == 1 else 120
    rng = np.random.default_rng(B)
    vals = [rng.normal(size=(T, B, 4 * n)), rng.normal(size=(n, 4 * n)) * 0.1, rng.normal(size=(B, n)),
            rng.normal(size=(B, n)), _mask("holes", T, B, rng, np.float64)]
    syms = [pt.tensor(f"in{k}", dtype=dtype, shape=np.shape(v)) for k, v in enumerate(vals)]
    Y, C, _, d = NativeLstm2.make_op()(*syms, pt.constant(np.int32(0)), pt.constant(np.int32(1)))
    f, f_ref = with_reference_gradients((Y, C, d), native_lstm2_graph(*syms, 0, 1), syms, syms[:4], dtype)
    args = [np.asarray(v, dtype=dtype) for v in vals]
    want = f_ref(*args)
    rtol, atol = (2e-4, 2e-4) if dtype == "float32" else (1e-10, 1e-10)
    for threads in ("2", "3"):
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", threads)
        for name, got, ref in zip(["Y", "C", "d", "DX", "DW", "Dy0", "Dc0"], f(*args), want):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol * max(1.0, np.abs(ref).max()),
                                       err_msg=f"{name}, {threads} threads")


@functools.lru_cache(maxsize=None)
def _lowmem_function(dtype):
    """LstmLowMem with the gradients of sum(Y DY) + sum(C DC) + sum(d Dd) w.r.t. X, W, b, y0, c0; any shapes, start
    and step."""
    f3, fm = (lambda name: pt.tensor3(name, dtype=dtype)), (lambda name: pt.matrix(name, dtype=dtype))
    X, W, b = f3("X"), fm("W"), pt.vector("b", dtype=dtype)
    y0, c0, i, DY, DC, Dd = fm("y0"), fm("c0"), fm("i"), f3("DY"), f3("DC"), fm("Dd")
    start, step = pt.iscalar("start"), pt.iscalar("step")
    Y, C, d = LstmLowMem.make_op()(X, W, b, y0, c0, i, start, step)
    cost = (Y * DY).sum() + (C * DC).sum() + (d * Dd).sum()
    return pytensor.function([X, W, b, y0, c0, i, DY, DC, Dd, start, step],
                             [Y, C, d, *pytensor.grad(cost, [X, W, b, y0, c0])])


def _run_lowmem(dtype, v, start, step):
    W = np.concatenate([v["W_in"], v["W"]])
    out = _lowmem_function(dtype)(v["x"], W, *[v[k] for k in ("b", "y0", "c0", "i", "DY", "DC", "Dd")],
                                  np.int32(start), np.int32(step))
    return [np.array(r, copy=True) for r in out], W


# LstmLowMem: the cell split's sizes above, and T=200 B=4 (two chunks of 100 frames: at most 768 // 4 = 192 rows' frames
# per chunk; the parts meet before the second chunk's buffers are written); n = 64 is two float32 panels, four float64.
LOWMEM_SIZES = SIZES + [(200, 4, 20, 64)]


@same_bits_cases
@pytest.mark.parametrize("size", LOWMEM_SIZES, ids=[f"B{s[1]}T{s[0]}" for s in LOWMEM_SIZES])
def test_lowmem_cell_split_same_bits_as_one_thread(monkeypatch, dtype, kind, start, step, size):
    T, B, n_in, n = size
    v = _values(T, B, n_in, n, kind, dtype, seed=T + B + start + 1)
    monkeypatch.setenv("PTNATIVE_NUM_THREADS", "1")
    one, W = _run_lowmem(dtype, v, start, step)
    ref = lstm_lowmem_forward(*(np.asarray(a, np.float64) for a in (v["x"], W, v["b"], v["y0"], v["c0"], v["i"])),
                              start, step)
    rtol = 2e-4 if dtype == "float32" else 1e-10
    for name, got, want in zip(["Y", "C", "d"], one, ref):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=f"LstmLowMem {name}")
    for threads in ("2", "3", "6"):
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", threads)
        res, _ = _run_lowmem(dtype, v, start, step)
        for name, got, want in zip(LOWMEM_NAMES, res, one):
            np.testing.assert_array_equal(got, want, err_msg=f"LstmLowMem {name}, {threads} threads")
        again, _ = _run_lowmem(dtype, v, start, step)
        for name, got, want in zip(LOWMEM_NAMES, again, res):
            np.testing.assert_array_equal(got, want, err_msg=f"LstmLowMem {name}, {threads} threads, again")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("B", [1, 3])
def test_lowmem_cell_split_against_unrolled_reference(monkeypatch, dtype, B):
    """LstmLowMem's outputs and gradients on the cell split (2 and 3 threads) against its recurrence unrolled in
    PyTensor and differentiated by it (ragged mask with a hole and a fractional value; 25 frames, step -1)."""
    T, n_in, n = 25, 16, 200 if B == 1 else 120
    rng = np.random.default_rng(10 + B)
    vals = [rng.normal(size=(T, B, n_in)), rng.normal(size=(n_in + n, 4 * n)) * 0.1, rng.normal(size=(4 * n,)),
            rng.normal(size=(B, n)), rng.normal(size=(B, n)), _mask("holes", T, B, rng, np.float64)]
    syms = [pt.tensor(f"in{k}", dtype=dtype, shape=np.shape(v)) for k, v in enumerate(vals)]
    Y, C, d = LstmLowMem.make_op()(*syms, pt.constant(np.int32(0)), pt.constant(np.int32(-1)))
    f, f_ref = with_reference_gradients((Y, C, d), lowmem_graph(*syms, 0, -1), syms, syms[:5], dtype)
    args = [np.asarray(v, dtype=dtype) for v in vals]
    want = f_ref(*args)
    rtol, atol = (5e-4, 5e-4) if dtype == "float32" else (1e-10, 1e-10)
    for threads in ("2", "3"):
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", threads)
        for name, got, ref in zip(LOWMEM_NAMES, f(*args), want):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol * max(1.0, np.abs(ref).max()),
                                       err_msg=f"{name}, {threads} threads")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lowmem_empty_time_batch_and_no_frame_on_two_threads(monkeypatch, dtype):
    """T = 0, B = 0 and a call that visits no frame (step -1 with start > (T-1)/2) at the cell split's sizes otherwise
    (n = 200, 2 threads): the final state is c0, Dc0 = Dd, and W, b, y0 get zero gradients."""
    monkeypatch.setenv("PTNATIVE_NUM_THREADS", "2")
    n_in, n = 20, 200
    for T, B, start, step in [(0, 3, 0, 1), (40, 0, 0, 1), (40, 3, 30, -1)]:
        v = _values(max(T, 1), max(B, 1), n_in, n, "sorted", dtype, seed=3)
        v = {k: (a[:T, :B] if k in ("x", "i", "DY", "DC") else a[:B] if k in ("y0", "c0", "Dd") else a)
             for k, a in v.items()}
        Y, C, d, DX, DW, Db, Dy0, Dc0 = _run_lowmem(dtype, v, start, step)[0]
        assert Y.shape == C.shape == (T, B, n) and DX.shape == (T, B, n_in) and d.shape == (B, n)
        assert not Y.any() and not C.any() and not DX.any()
        np.testing.assert_array_equal(d, v["c0"])
        np.testing.assert_array_equal(Dc0, v["Dd"])
        assert not DW.any() and not Db.any() and not Dy0.any()
