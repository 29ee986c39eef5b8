"""NativeLstm2 and NativeLstm2Layer on the CPU's cell split (docs/lstm.md, "The cell split"): where the batch gives
fewer row parts (one per 6 rows) than threads, each frame's gate columns are split over the threads, which meet once
per frame.  Every output and gradient must be the same bits as on one thread (one part computing every row) at 2,
3 and 6 threads (more threads than this machine's cores: the parts go on with part 0 alone), for B = 1 to 5, ragged masks (sorted lengths; unsorted with a hole, a fractional value and an empty
sequence), both directions with strides, float32 and float64; the forward outputs match the numpy reference and the
gradients those of the recurrence unrolled in PyTensor."""

from __future__ import annotations

import functools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from ptnative.ops.lstm import NativeLstm2, NativeLstm2Layer

from .reference.lstm import native_lstm2_forward, visited_frames
from .test_lstm import native_lstm2_graph, with_reference_gradients

LAYER_NAMES = ["Y", "C", "H", "d", "Dx", "DW_in", "DW", "Db", "Dy0", "Dc0"]
OP_NAMES = ["Y", "C", "H", "d", "DX", "DW", "Dy0", "Dc0"]


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


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["sorted", "holes"])
@pytest.mark.parametrize("start,step", [(0, 1), (1, -2)])
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
