"""NativeLstm2, NativeLstm2Layer, LstmLowMem and LstmGenericBase mark their outputs ``fully_written`` (ptnative/ops/lstm.py): the
entry point does not zero them before the kernel runs, so the kernels must write every element (unvisited and padded
frames, empty time or batch, every thread's rows, the weight gradients' first block).  Under
``PTNATIVE_POISON_OUTPUTS=1`` those outputs start as 0xFF bytes (NaN): an element a kernel misses shows as NaN.
Every mode, float32 and float64, strides and start offsets that leave frames unvisited, the threaded CPU paths
(1, 2 and 3 threads) and the CUDA code path (emulated on the CPU).  The results under poison must equal the
references and, bit for bit, the results without it."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from ptnative.ops.lstm import LstmGenericBase, LstmLowMem, NativeLstm2, NativeLstm2Layer

from .conftest import MODE_IDS, MODES, compiled_once
from .reference.lstm import (lstm_generic_backward, lstm_generic_forward, lstm_lowmem_forward, native_lstm2_forward,
                             numeric_grad, visited_frames)
from .test_lstm import holey_mask

POISON = "PTNATIVE_POISON_OUTPUTS"

# (T, B, start, step): every frame visited, start offsets and strides that leave frames unvisited (in both
# directions), LstmLowMem's backward rule visiting nothing (start > (T-1)/2; NativeLstm2 visits frame 2 there), empty
# time, empty batch.
SMALL_CASES = [(6, 3, 0, 1), (6, 3, 0, -1), (6, 3, 1, 1), (6, 3, 1, -1), (6, 3, 0, 2), (6, 3, 1, -2), (6, 3, 3, -1),
               (0, 3, 0, 1), (5, 0, 0, -1)]


def _graph(dtype, make=lambda cls: cls.make_op()):
    """Inputs, and outputs: the four ops' forward outputs, then each op's gradients of sum(Y DY) + sum(C DC) +
    sum(d Dd) w.r.t. its differentiable inputs.  NativeLstm2 runs on X; the layer and LstmLowMem on x with
    W = [W_in; W_rec]; LstmGenericBase (no start, step or C) on X, W and c0."""
    f3 = lambda name: pt.tensor3(name, dtype=dtype)  # noqa: E731
    fm = lambda name: pt.matrix(name, dtype=dtype)  # noqa: E731
    X, x, DY, DC = f3("X"), f3("x"), f3("DY"), f3("DC")
    W_in, W, y0, c0, i, Dd = fm("W_in"), fm("W"), fm("y0"), fm("c0"), fm("i"), fm("Dd")
    b = pt.vector("b", dtype=dtype)
    start, step = pt.iscalar("start"), pt.iscalar("step")
    W_low = pt.concatenate([W_in, W], axis=0)
    native2 = make(NativeLstm2)(X, W, y0, c0, i, start, step)
    layer = make(NativeLstm2Layer)(x, W_in, W, b, y0, c0, i, start, step)
    lowmem = make(LstmLowMem)(x, W_low, b, y0, c0, i, start, step)
    generic = make(LstmGenericBase)(X, W, c0, i)
    outputs = [*native2, *layer, *lowmem, *generic]
    for (Y, C, d), wrt in [((native2[0], native2[1], native2[3]), [X, W, y0, c0]),
                           ((layer[0], layer[1], layer[3]), [x, W_in, W, b, y0, c0]),
                           (lowmem, [x, W_low, b, y0, c0]),
                           ((generic[0], None, generic[2]), [X, W, c0])]:
        cost = (Y * DY).sum() + (d * Dd).sum() + (0 if C is None else (C * DC).sum())
        outputs += pytensor.grad(cost, wrt)
    return [X, x, W_in, W, b, y0, c0, i, DY, DC, Dd, start, step], outputs


NAMES = ["Y", "C", "H", "d", "Y", "C", "H", "d", "Y", "C", "d", "Y", "H", "d",
         "DX", "DW", "Dy0", "Dc0", "Dx", "DW_in", "DW", "Db", "Dy0", "Dc0", "DX", "DW", "Db", "Dy0", "Dc0", "DZ", "DV_h",
         "Dc"]
OWNER = ["NativeLstm2"] * 4 + ["NativeLstm2Layer"] * 4 + ["LstmLowMem"] * 3 + ["LstmGenericBase"] * 3 + \
    ["NativeLstm2"] * 4 + ["NativeLstm2Layer"] * 6 + ["LstmLowMem"] * 5 + ["LstmGenericBase"] * 3
N_FORWARD = 14  # outputs before the gradients


@compiled_once
def _function(mode, dtype):
    inputs, outputs = _graph(dtype)
    return pytensor.function(inputs, outputs, mode=mode)


def _values(T, B, n_in, n, dtype, seed):
    rng = np.random.default_rng(seed)
    f = lambda *s, scale=1.0: (rng.normal(size=s) * scale).astype(dtype)  # noqa: E731
    return [f(T, B, 4 * n), f(T, B, n_in), f(n_in, 4 * n, scale=0.4), f(n, 4 * n, scale=0.4), f(4 * n), f(B, n),
            f(B, n), (holey_mask(T, B, rng) if T and B else np.ones((T, B))).astype(dtype), f(T, B, n), f(T, B, n),
            f(B, n)]


def _run(fn, values, start, step, poison, monkeypatch):
    monkeypatch.setenv(POISON, poison)
    return [np.array(r, copy=True) for r in fn(*values, np.int32(start), np.int32(step))]


def _assert_written(poisoned, plain, what):
    """Every output finite under poison (the inputs are), and bit for bit what the run without poison gave."""
    for k, (got, want) in enumerate(zip(poisoned, plain)):
        label = f"{OWNER[k]} {NAMES[k]} (output {k}), {what}"
        assert np.isfinite(got).all(), f"{label}: {np.count_nonzero(~np.isfinite(got))} elements not written"
        np.testing.assert_array_equal(got, want, err_msg=label)


def _references(values, start, step):
    """Forward references of the four ops (float64)."""
    X, x, W_in, W, b, y0, c0, i = (np.asarray(v, np.float64) for v in values[:8])
    Y2, C2, H2, d2 = native_lstm2_forward(X, W, y0, c0, i, start, step)
    proj = np.einsum("tbk,kg->tbg", x, W_in)
    Yl, Cl, Hl, dl = native_lstm2_forward(proj + b, W, y0, c0, i, start, step)
    unvisited = sorted(set(range(len(x))) - set(visited_frames(len(x), start, step)))
    Hl[unvisited] = proj[unvisited]  # the layer's H on a frame not visited: x . W_in (without b)
    Ym, Cm, dm = lstm_lowmem_forward(x, np.concatenate([W_in, W]), b, y0, c0, i, start, step)
    return [Y2, C2, H2, d2, Yl, Cl, Hl, dl, Ym, Cm, dm, *lstm_generic_forward(X, W, c0, i)]


def _gradient_references(values, start, step):
    """Gradients (float64) of each op's weighted cost, in _graph's order: finite differences, and LstmGenericBase's
    backpropagation through time."""
    X, x, W_in, W, b, y0, c0, i, DY, DC, Dd = (np.asarray(v, np.float64) for v in values)

    def cost(Y, C, d):
        return (Y * DY).sum() + (C * DC).sum() + (d * Dd).sum()

    def native2(X, W, y0, c0):
        Y, C, _, d = native_lstm2_forward(X, W, y0, c0, i, start, step)
        return cost(Y, C, d)

    def layer(x, W_in, W, b, y0, c0):
        Y, C, _, d = native_lstm2_forward(np.einsum("tbk,kg->tbg", x, W_in) + b, W, y0, c0, i, start, step)
        return cost(Y, C, d)

    def lowmem(x, W_low, b, y0, c0):
        return cost(*lstm_lowmem_forward(x, W_low, b, y0, c0, i, start, step))

    return [*numeric_grad(native2, [X, W, y0, c0], range(4)),
            *numeric_grad(layer, [x, W_in, W, b, y0, c0], range(6)),
            *numeric_grad(lowmem, [x, np.concatenate([W_in, W]), b, y0, c0], range(5)),
            *lstm_generic_backward(X, W, c0, i, DY, Dd)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_outputs_written_in_full_in_every_mode(mode, dtype, monkeypatch):
    """Small sizes (the kernels' one-part path), every case of SMALL_CASES: under poison every output is finite, equal
    to the run without poison bit for bit and to the references (forward: numpy; gradients, float64 in the default
    mode: finite differences)."""
    fn = _function(mode, dtype)
    n_in, n = 3, 2
    for T, B, start, step in SMALL_CASES:
        what = f"T={T} B={B} start={start} step={step}, {mode} {dtype}"
        values = _values(T, B, n_in, n, dtype, seed=T + 10 * B + start + 3 * step)
        poisoned = _run(fn, values, start, step, "1", monkeypatch)
        _assert_written(poisoned, _run(fn, values, start, step, "0", monkeypatch), what)
        rtol, atol = (1e-4, 1e-5) if dtype == "float32" else (1e-10, 1e-12)
        for k, (got, ref) in enumerate(zip(poisoned, _references(values, start, step))):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=f"{OWNER[k]} {NAMES[k]}, {what}")
        if mode is None and dtype == "float64":
            refs = _gradient_references(values, start, step)
            for k, (got, ref) in enumerate(zip(poisoned[N_FORWARD:], refs), N_FORWARD):
                np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7, err_msg=f"{OWNER[k]} {NAMES[k]}, {what}")


# (T, B, n_in, n): sizes over the threaded paths' threshold; "chunks" runs LstmLowMem's backward in several chunks
# of frames (768 // 100 = 7 frames each), "wide" takes its weight gradient per chunk split by columns, "cells" runs
# NativeLstm2's recurrence split by cells (fewer row parts than threads: docs/lstm.md).
THREADED_SIZES = {"rows": (16, 41, 40, 64), "chunks": (24, 100, 20, 36), "wide": (3, 12, 40, 200),
                  "cells": (44, 3, 30, 128)}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("size", list(THREADED_SIZES), ids=list(THREADED_SIZES))
def test_threaded_paths_write_in_full(size, dtype, monkeypatch):
    """The threaded CPU paths at 1, 2 and 3 threads, with frames left unvisited: under poison every output is
    finite and equal bit for bit to the run without poison (and the same for a repeated call)."""
    fn = _function(None, dtype)
    T, B, n_in, n = THREADED_SIZES[size]
    values = _values(T, B, n_in, n, dtype, seed=T + B)
    values[2] *= 0.3
    values[3] *= 0.3
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", threads)
        for start, step in [(0, 1), (1, -2)]:
            what = f"{size} T={T} B={B} start={start} step={step}, {threads} thread(s), {dtype}"
            poisoned = _run(fn, values, start, step, "1", monkeypatch)
            _assert_written(poisoned, _run(fn, values, start, step, "0", monkeypatch), what)
            _assert_written(_run(fn, values, start, step, "1", monkeypatch), poisoned, what + ", again")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_path_writes_in_full(dtype, monkeypatch):
    """The kernels' CUDA code (tests/cuda_emulation.h runs it on the CPU, the entry point poisoning the outputs as
    on a device) against the CPU path, both under poison: every output finite and equal to the CPU's."""
    from .test_cuda_emulation import emulated

    inputs, outputs = _graph(dtype, make=lambda cls: emulated(cls.make_op()))
    fn = pytensor.function(inputs, outputs, mode="FAST_COMPILE")
    cpu = _function("FAST_COMPILE", dtype)
    rtol = 1e-4 if dtype == "float32" else 1e-10
    for T, B, start, step in SMALL_CASES + [(9, 7, 1, 2), (9, 7, 2, -3)]:
        what = f"T={T} B={B} start={start} step={step}, CUDA path, {dtype}"
        values = _values(T, B, 4, 3, dtype, seed=T + B + start)
        poisoned = _run(fn, values, start, step, "1", monkeypatch)
        want = _run(cpu, values, start, step, "1", monkeypatch)
        for k, (got, ref) in enumerate(zip(poisoned, want)):
            label = f"{OWNER[k]} {NAMES[k]} (output {k}), {what}"
            assert np.isfinite(got).all(), f"{label}: {np.count_nonzero(~np.isfinite(got))} elements not written"
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * max(1.0, np.abs(ref).max(initial=0)),
                                       err_msg=label)
