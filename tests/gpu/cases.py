"""One case per catalogue op: the same graph built with CPU ops and with CUDA ops, for comparing the builds.

A :class:`Case` has a name, the op classes it covers, the dtypes it runs in and a builder
``build(make_op, dtype, static=False) -> (inputs, outputs, value_sets)``:

* ``make_op(cls, **kwargs)`` returns ``cls``'s op for one device (``cls.make_op(device=...)``), so the graph is
  built once with CPU ops and once with CUDA ops; every op keeps its default props except ``device``, so the
  kernels are the catalogue's (``python -m ptnative build`` builds them ahead of time);
* ``outputs`` are the ops' outputs plus, where the op is differentiable, ``pytensor.grad`` of a weighted sum of its
  float outputs w.r.t. every differentiable float input (the weights are extra inputs with fixed random values);
* ``value_sets`` is a list of argument lists for ``inputs``: a small one with ragged lengths / masks, and for most
  cases a larger one (B >= 40, T >= 60 where the op has those) that spans many blocks and threads on the GPU;
  the graph is compiled once and run on each;
* ``static=True`` gives the inputs static shapes (those of the first value set, the only one then), for JAX mode.

Ops created inside pullbacks (LstmCell's gradient ops, ...) follow ``ptnative.config.device``; :func:`run_case`
sets it to the device under test, so the whole graph runs there (and checks that it does).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytensor
import pytensor.tensor as pt

import ptnative
from ptnative import NativeOp
from ptnative.catalogue import catalogue
from ptnative.device import resolve
from ptnative.ops.chunking import Chunking, UnChunking, n_chunks
from ptnative.ops.edit_distance import (EditDistanceOp, NextEditDistanceReduceOp, NextEditDistanceRowOp,
                                        OptimalCompletionEditDistanceOp, OptimalCompletionEditDistancePerSuccessorOp)
from ptnative.ops.fsa import (CtcFsaLossOp, CtcViterbiLossOp, FastBaumWelchOp, FastViterbiOp, GetCtcFsaFastBwOp,
                              MultiEndFastBaumWelchOp, SegmentFastBaumWelchOp)
from ptnative.ops.hmm import (HmmForwardBackwardOp, HmmLikelihoodWithGradOp, HmmPosteriorsDefaultsOp, HmmPosteriorsOp,
                              HmmPosteriorsValuesOp, HmmSampleStatesOp, HmmVaryingLikelihoodOp,
                              HmmVaryingPosteriorsOp, HmmVaryingSampleStatesOp, HmmVaryingViterbiOp,
                              HmmViterbiDefaultsOp, HmmViterbiOp)
from ptnative.ops.hsmm import (HsmmLikelihoodOp, HsmmLikelihoodWithGradOp, HsmmPosteriorsOp, HsmmSampleStatesOp,
                               HsmmViterbiOp)
from ptnative.ops.lstm import (LstmCell, LstmCellGrad, LstmCellGradGrad, LstmGenericBase, LstmLowMem, NativeLstm2,
                               NativeLstm2Layer, TwoDLSTM)
from ptnative.ops.rnnt import MultiBlankRnntLoss
from ptnative.ops.sparse import (CrossEntropySoftmaxAndGradientZSparse, MaxAndArgmaxSparse, SparseToDense,
                                 SparseToDenseZeros, SubtensorBatchedIndex)

from ..test_chunking import data as chunk_data
from ..test_edit_distance import batch as ed_batch
from ..test_edit_distance import next_data as ed_next_data
from ..test_fsa import hmm_data, mask_of, random_fsa, segment_columns
from ..test_lstm import lstm2_data, lstm_data, lowmem_data, ragged_mask
from ..test_rnnt import rnnt_data
from ..test_sparse import coo

FLOATS = ("float32", "float64")
INT_ONLY = ("int32",)  # cases without floating data: one run
I32 = np.int32


@dataclass(frozen=True)
class Case:
    """A graph covering ``classes``, run in each of ``dtypes`` (see the module docstring for ``build``)."""

    name: str
    family: str
    classes: tuple
    build: Callable
    dtypes: tuple = FLOATS
    #: float32 tolerance, relative to each output's magnitude (atomics and GEMMs reorder sums on the GPU)
    rtol32: float = 2e-4
    rtol64: float = 1e-9
    #: the family's representative, also compared in the "C" and "FAST_COMPILE" modes
    representative: bool = False

    def rtol(self, dtype: str) -> float:
        return self.rtol32 if dtype == "float32" else self.rtol64

    def __str__(self):
        return self.name


# ------------------------------------------------------------------------------------------ helpers
#: Shape graphs without running the ops (their infer_shape), for sizing the cost weights.
SHAPE_MODE = pytensor.compile.get_mode("FAST_COMPILE").including("canonicalize")


def sym(name, value, static=False):
    value = np.asarray(value)
    return pt.tensor(name=name, dtype=value.dtype, shape=value.shape if static else (None,) * value.ndim)


def i32(v):
    return pt.constant(np.int32(v))


def cast(values, dtype):
    return [np.asarray(v, dtype=dtype) for v in values]


class GraphBuilder:
    """What a case's graph function gets: ``op(cls)`` (the op on the device under test), ``syms`` (input
    variables) and ``grads`` (gradients of a weighted sum of outputs; the weights are extra inputs, so the graph
    stays small and quick to compile)."""

    def __init__(self, make_op, static):
        self.make_op, self.static = make_op, static
        self.stages = []  # [(weight variables, weighted outputs)], in order of creation

    def op(self, cls, **kwargs):
        return self.make_op(cls, **kwargs)

    def syms(self, names, values):
        return [sym(n, v, self.static) for n, v in zip(names.split(), values)]

    def grads(self, outputs, wrt):
        """``pytensor.grad(sum_k sum(outputs[k] * w_k), wrt)`` with fixed random weights ``w_k`` (new inputs)."""
        k = len(self.stages)
        ws = [pt.tensor(name=f"w{k}_{j}", dtype=o.dtype, shape=o.type.shape if self.static else (None,) * o.ndim)
              for j, o in enumerate(outputs)]
        self.stages.append((ws, outputs))
        return list(pytensor.grad(sum((o * w).sum() for o, w in zip(outputs, ws)), wrt))

    def weight_inputs(self):
        return [w for ws, _ in self.stages for w in ws]

    def weight_values(self, inputs, values):
        """Uniform(-1, 1) weights shaped like the weighted outputs for ``values`` (shapes inferred, no op run)."""
        known_vars, known_vals, result = list(inputs), list(values), []
        for s, (ws, outs) in enumerate(self.stages):
            shapes = pytensor.function(known_vars, [o.shape for o in outs], mode=SHAPE_MODE,
                                       on_unused_input="ignore")(*known_vals)
            rng = np.random.default_rng(1000 + s)
            wv = [rng.uniform(-1, 1, size=tuple(int(d) for d in sh)).astype(w.dtype) for w, sh in zip(ws, shapes)]
            known_vars += ws
            known_vals += wv
            result += wv
        return result


def _case_builder(fn, sizes):
    """``build(make_op, dtype, static=False) -> (inputs, outputs, value_sets)`` from ``fn(builder, dtype, size) ->
    (inputs, outputs, values)``: the graph of the first size, the values of every size (only the first with
    ``static``), each with its cost weights appended."""

    def build(make_op, dtype, static=False):
        builder = GraphBuilder(make_op, static)
        inputs, outputs, values = fn(builder, dtype, sizes[0])
        value_sets = [values] + ([] if static else [fn(GraphBuilder(make_op, False), dtype, s)[2] for s in sizes[1:]])
        value_sets = [list(v) + builder.weight_values(inputs, v) for v in value_sets]
        return list(inputs) + builder.weight_inputs(), list(outputs), value_sets

    return build


# ------------------------------------------------------------------------------------------ LSTM family
def _lstm_generic(g, dtype, size):
    T, B, n = size
    values = lstm_data(T, B, n, dtype, seed=1)
    Z, V_h, c, i = g.syms("Z V_h c i", values)
    Y, H, d = g.op(LstmGenericBase)(Z, V_h, c, i)
    return [Z, V_h, c, i], [Y, H, d, *g.grads([Y, d], [Z, V_h, c])], values


def _native_lstm2(g, dtype, size):
    T, B, n, start, step = size
    dat = lstm2_data(T, B, n, seed=T + B)
    values = cast([dat[k] for k in ("X", "W", "y0", "c0", "i")], dtype)
    values += [np.int32(start), np.int32(step)]
    X, W, y0, c0, i = g.syms("X W y0 c0 i", values[:5])
    start_s, step_s = pt.iscalar("start"), pt.iscalar("step")
    Y, C, H, d = g.op(NativeLstm2)(X, W, y0, c0, i, start_s, step_s)
    return [X, W, y0, c0, i, start_s, step_s], [Y, C, H, d, *g.grads([Y, C, d], [X, W, y0, c0])], values


def _native_lstm2_layer(g, dtype, size):
    T, B, n_in, n, start, step = size
    dat = lowmem_data(T, B, n_in, n, seed=T + B + 1)
    W_in, W = dat["W"][:n_in], dat["W"][n_in:]
    values = cast([dat["X"], W_in, W, dat["b"], dat["y0"], dat["c0"], dat["i"]], dtype)
    values += [np.int32(start), np.int32(step)]
    x, W_in_s, W_s, b, y0, c0, i = g.syms("x W_in W b y0 c0 i", values[:7])
    start_s, step_s = pt.iscalar("start"), pt.iscalar("step")
    Y, C, H, d = g.op(NativeLstm2Layer)(x, W_in_s, W_s, b, y0, c0, i, start_s, step_s)
    return ([x, W_in_s, W_s, b, y0, c0, i, start_s, step_s],
            [Y, C, H, d, *g.grads([Y, C, d], [x, W_in_s, W_s, b, y0, c0])], values)


def _lstm_lowmem(g, dtype, size):
    T, B, n_in, n, start, step = size
    dat = lowmem_data(T, B, n_in, n, seed=T + B)
    values = cast([dat[k] for k in ("X", "W", "b", "y0", "c0", "i")], dtype)
    values += [np.int32(start), np.int32(step)]
    X, W, b, y0, c0, i = g.syms("X W b y0 c0 i", values[:6])
    start_s, step_s = pt.iscalar("start"), pt.iscalar("step")
    Y, C, d = g.op(LstmLowMem)(X, W, b, y0, c0, i, start_s, step_s)
    return [X, W, b, y0, c0, i, start_s, step_s], [Y, C, d, *g.grads([Y, C, d], [X, W, b, y0, c0])], values


def _twod_lstm(g, dtype, size):
    h, w, B, n_in, n = size
    rng = np.random.default_rng(h * w + B)
    sizes = np.stack([rng.integers(1, h + 1, size=B), rng.integers(1, w + 1, size=B)], axis=1)
    sizes[0] = (h, w)
    values = cast([rng.normal(size=(h, w, B, n_in)), rng.normal(size=(n, 5 * n)) * 0.5,
                   rng.normal(size=(n, 5 * n)) * 0.5, rng.normal(size=(n_in, 5 * n)) * 0.5, rng.normal(size=5 * n),
                   sizes, rng.normal(size=(1, w, B, 5 * n))], dtype)
    X, V_h, V_v, W, b, sz, init = g.syms("X V_h V_v W b sizes init", values)
    e1, z5, z3, z4 = (pt.zeros((0,) * k, dtype=dtype) for k in (1, 5, 3, 4))
    init_out = pt.zeros((1, X.shape[1], X.shape[2], V_h.shape[0]), dtype=dtype)
    Y, H = g.op(TwoDLSTM)(X, V_h, V_v, W, b, e1, e1, e1, z5, z3, sz, z4, init, init_out,
                             pt.zeros((1,), dtype=dtype))
    return [X, V_h, V_v, W, b, sz, init], [Y, H, *g.grads([Y], [X, V_h, V_v, W, b])], values


def _lstm_cell(g, dtype, size):
    """LstmCell, its gradient (LstmCellGrad) and second gradient (LstmCellGradGrad), with a shrinking batch."""
    Bc, Bx, H, R = size
    rng = np.random.default_rng(Bc + H)
    values = cast([rng.uniform(-1.5, 1.5, (Bc, H, R)), rng.uniform(-1.5, 1.5, (Bx, 4 * H, R))], dtype)
    c_prev, x = g.syms("c_prev x", values)
    c, h = g.op(LstmCell)(c_prev, x)
    g1 = g.grads([c, h], [c_prev, x])
    g2 = g.grads([g1[0], g1[1], g1[1] ** 2], [c_prev, x])
    return [c_prev, x], [c, h, *g1, *g2], values


def _lstm_cell_grad_ops(g, dtype, size):
    """LstmCellGrad (with its pullback) and LstmCellGradGrad called directly on independent inputs."""
    Bc, Bx, H, R = size
    rng = np.random.default_rng(Bc * H)
    shapes = [(Bc, H, R), (Bx, 4 * H, R), (Bc, H, R), (Bc, H, R), (Bx, H, R), (Bc, H, R), (Bx, 4 * H, R)]
    values = cast([rng.uniform(-1.5, 1.5, s) for s in shapes], dtype)
    ins = g.syms("c_prev x c gc gh ggc_prev ggx", values)
    gc_prev, gx = g.op(LstmCellGrad)(*ins[:5])
    second = g.op(LstmCellGradGrad)(*ins)
    return ins, [gc_prev, gx, *second, *g.grads([gc_prev, gx], ins[:5])], values


# ------------------------------------------------------------------------------------------ chunking
def _chunking(g, dtype, size):
    T, B, D, chunk_size, chunk_step = size
    x, m = chunk_data(T, B, D, seed=T)
    nc = n_chunks(T, chunk_size, chunk_step)
    c = np.random.default_rng(T + 1).normal(size=(chunk_size, B * nc, D))
    # x is given as (D, B, T) and transposed in the graph: a strided input
    values = cast([np.ascontiguousarray(x.transpose(2, 1, 0)), m, c], dtype) + [I32(chunk_size), I32(chunk_step)]
    xt, mask, chunks = g.syms("xt mask chunks", values[:3])
    if g.static:  # JAX: the buffers' shapes must be known when the graph is traced
        size_s, step_s, values = i32(chunk_size), i32(chunk_step), values[:3]
        inputs = [xt, mask, chunks]
    else:
        size_s, step_s = pt.iscalar("chunk_size"), pt.iscalar("chunk_step")
        inputs = [xt, mask, chunks, size_s, step_s]
    x_sym = xt.transpose(2, 1, 0)
    params = pt.cast(pt.stack([size_s, step_s]), dtype)
    n_t, n_b, n_d = x_sym.shape
    n_c = n_chunks(n_t, size_s, step_s)
    out, oindex = g.op(Chunking)(x_sym, mask, pt.zeros((size_s, n_b * n_c, n_d), dtype=dtype),
                                    pt.zeros((size_s, n_b * n_c), dtype=dtype), params)

    def unchunk(v, index):
        return g.op(UnChunking)(v, index, pt.zeros((n_t, n_b, n_d), dtype=dtype), pt.zeros((n_t, n_b), dtype=dtype),
                                   pt.zeros((n_t, n_b), dtype=dtype), params)

    y, yindex, factors = unchunk(out * 2 + 1, oindex)
    y2, _, _ = unchunk(chunks, oindex)
    return (inputs,
            [out, oindex, y, yindex, factors, y2, *g.grads([out, y, y2], [xt, chunks])], values)


# ------------------------------------------------------------------------------------------ edit distance
def _edit_distance(g, dtype, size):
    B, Ta, Tb, V = size
    rng = np.random.default_rng(B + Ta)
    a, a_len, b, b_len = ed_batch(B, Ta, Tb, V, rng)
    last, cands, a_n, ended, b2, b2_len = ed_next_data(B, Tb, V, rng, L=V + 2)
    values = [a, a_len, b, b_len, np.arange(-1, V + 1, dtype=I32), last, cands, a_n, ended, b2, b2_len]
    a, al, b, bl, succ, last, cands, an, ended, b2, bl2 = g.syms("a al b bl succ last cands an ended b2 bl2", values)
    outs = [g.op(EditDistanceOp)(a, al, b, bl), g.op(OptimalCompletionEditDistanceOp)(a, al, b, bl),
            g.op(OptimalCompletionEditDistancePerSuccessorOp)(a, al, b, bl, succ),
            g.op(NextEditDistanceRowOp)(last, cands[:, 0], an, ended, b2, bl2)]
    reduce_op = g.op(NextEditDistanceReduceOp)
    outs += [reduce_op(last, cands, an, ended, b2, bl2, i32(1), i32(2)),
             reduce_op(last, cands[:1], an, ended, b2, bl2, i32(0), i32(-1))]
    return [a, al, b, bl, succ, last, cands, an, ended, b2, bl2], outs, values


# ------------------------------------------------------------------------------------------ automata
def _ctc_targets(rng, B, N, D, blank):
    labels = [k for k in range(D) if k != blank]
    targets = rng.choice(labels, size=(B, N)).astype(I32)
    tlens = rng.integers(0, N + 1, size=B).astype(I32)
    tlens[0] = N
    targets[1, :2] = targets[1, 0]  # a repeated label (needs a blank in between)
    return targets, tlens


def _ctc_loss(g, dtype, size):
    """GetCtcFsaFastBwOp (CTC and RNA topologies), and the fused CTC losses (CtcFsaLossOp, CtcViterbiLossOp, which
    build the same automaton themselves), with the gradient w.r.t. the logits."""
    T, B, D, N = size
    rng = np.random.default_rng(T + D)
    targets, tlens = _ctc_targets(rng, B, N, D, blank=0)
    lens = rng.integers(T // 2, T + 1, size=B).astype(I32)
    lens[0], lens[-1] = T, 1  # the last sequence has no path (unless its target is empty)
    tlens[-1] = 2
    values = [np.asarray(rng.normal(size=(T, B, D)) * 2, dtype), targets, tlens, lens]
    logits, tg, tl, ln = g.syms("logits targets tlens lens", values)
    weights = pt.zeros((tg.shape[0] * (5 * (tg.shape[1] - 1) + 10),), dtype="float32")
    outs, losses = [], []
    for loop in (1, 0):
        edges, se = g.op(GetCtcFsaFastBwOp)(tg, tl, i32(0), weights, i32(loop))
        outs += [edges, se]
        for loss_op in (CtcFsaLossOp, CtcViterbiLossOp):
            loss, grad = g.op(loss_op)(logits, ln, tg, tl, i32(0), i32(loop), i32(0))
            outs += [loss, grad]
            losses.append(loss)
    # the impossible sequence's loss is inf; its gradient (softmax) is finite
    return [logits, tg, tl, ln], outs + g.grads(losses, [logits]), values


def n_states_of(edges, *states):
    """The number of states an automaton uses: the largest state index + 1 (int32)."""
    return pt.cast(pt.max(pt.concatenate([edges[:2].flatten()] + [v.flatten() for v in states])) + 1, "int32")


def _fast_bw(g, dtype, size):
    T, B, D, n_states, n_edges = size
    rng = np.random.default_rng(T * B)
    edges, weights, se = random_fsa(rng, B, n_states, n_edges, D)
    weights[3] = np.inf  # an unusable edge
    lens = rng.integers(T // 2, T + 1, size=B)
    lens[0] = T
    values = [np.asarray(rng.random((T, B, D)) * 3, dtype), edges, weights.astype(dtype), se,
              mask_of(lens, T).astype(dtype)]
    am, e, w, s, m = g.syms("am edges weights se mask", values)
    out, sums = g.op(FastBaumWelchOp)(am, e, w, s, m, pt.zeros((2, n_states_of(e, s)), dtype=dtype))
    return [am, e, w, s, m], [out, sums], values


def _multi_end_fast_bw(g, dtype, size):
    T, B, D, n_states, n_edges = size
    rng = np.random.default_rng(T + B + 1)
    edges, weights, se = random_fsa(rng, B, n_states, n_edges, D)
    ends = np.array([(b, b * n_states + s) for b in range(B) for s in rng.choice(n_states, 2, replace=False)], I32)
    lens = rng.integers(T // 2, T + 1, size=B)
    lens[0] = T
    values = [np.asarray(rng.random((T, B, D)) * 2, dtype), edges, weights.astype(dtype), se[0].copy(), ends,
              np.asarray(rng.random(len(ends)) * 2, dtype), mask_of(lens, T).astype(dtype)]
    am, e, w, starts, en, ew, m = g.syms("am edges weights starts ends end_w mask", values)
    out, sums = g.op(MultiEndFastBaumWelchOp)(am, e, w, starts, en, ew, m,
                                                 pt.zeros((2, n_states_of(e, starts, en[:, 1])), dtype=dtype))
    return [am, e, w, starts, en, ew, m], [out, sums], values


def _segment_fast_bw(g, dtype, size):
    """B sequences of random lengths, two states each, segments of 1..L frames, one unused column."""
    F, B, L, D, M = size
    rng = np.random.default_rng(F * B)
    lens = rng.integers(max(1, F // 2), F + 1, size=B)
    lens[0] = F
    bidx, index = segment_columns(lens, F, L)
    Nb = index.shape[1]
    pattern = np.array([[0, 0, 1, 1], [1, 0, 1, 0]])  # from, to (per sequence: states 2b, 2b + 1)
    edges = np.concatenate([
        np.concatenate([pattern + 2 * b for b in range(B)], axis=1),
        rng.integers(0, D, size=(1, 4 * B)), rng.integers(0, M, size=(1, 4 * B)), np.repeat(np.arange(B), 4)[None],
    ]).astype(I32)
    se = np.array([2 * np.arange(B), 2 * np.arange(B) + 1], I32)
    values = [np.asarray(rng.random((L, Nb, D)) * 2, dtype), bidx, edges, np.asarray(rng.random(4 * B), dtype),
              np.asarray(rng.random((M, L)), dtype), se, index.astype(dtype), np.asarray([1.0, 0.7], dtype),
              np.asarray(3.0, dtype)]
    ins = g.syms("am bidx edges weights length_models se index scales epoch", values)
    outs = g.op(SegmentFastBaumWelchOp)(*ins)
    return ins, list(outs), values


def _fast_viterbi(g, dtype, size):
    T, B, D, n_states, n_edges = size
    rng = np.random.default_rng(T + 7 * B)
    edges, weights, se = random_fsa(rng, B, n_states, n_edges, D)
    lens = rng.integers(T // 2, T + 1, size=B).astype(I32)
    lens[0] = T
    values = [np.asarray(rng.normal(size=(T, B, D)) * 2, dtype), lens, edges, np.asarray(-weights, dtype), se]
    am, ln, e, w, s = g.syms("am lens edges weights se", values)
    alignment, scores = g.op(FastViterbiOp)(am, ln, e, w, s, n_states_of(e, s))
    return [am, ln, e, w, s], [alignment, scores], values


def _hmm(g, dtype, size):
    T, B, K = size
    rng = np.random.default_rng(T + K)
    le, lA, lpi, lf = hmm_data(rng, T, B, K, scale=3.0)
    lens = rng.integers(1, T + 1, size=B)
    lens[0], lens[-1] = T, 0
    values = cast([le, lA, lpi, lf, mask_of(lens, T)], dtype)
    ins = g.syms("log_emissions log_transitions log_initial log_final mask", values)
    ll = g.op(HmmForwardBackwardOp)(*ins)
    return ins, [ll, *g.grads([ll], ins[:4])], values


def _hmm_inference(g, dtype, size):
    """Viterbi (and HmmViterbiDefaultsOp with the default final weights and mask), posteriors (with their gradients,
    and without: HmmPosteriorsValuesOp, and HmmPosteriorsDefaultsOp with the default final weights and mask),
    posterior sampling, and with time-varying transitions and per-sequence initial weights the log-likelihood,
    posteriors (both with their gradients), Viterbi and sampling, on one ragged batch."""
    T, B, K = size
    rng = np.random.default_rng(T + K + 1)
    le, lA, lpi, lf = hmm_data(rng, T, B, K, scale=3.0)
    lens = rng.integers(1, T + 1, size=B)
    lens[0], lens[-1] = T, 0
    lA_t = np.log(rng.dirichlet(np.ones(K), size=(T - 1, B, K)))  # time-varying transitions
    lpi_b = np.log(rng.dirichlet(np.ones(K), size=B))  # per-sequence initial weights
    values = cast([le, lA, lpi, lf, mask_of(lens, T), rng.random((T, B)), lA_t, lpi_b], dtype)
    ins = g.syms("log_emissions log_transitions log_initial log_final mask uniforms log_A_t log_pi_b", values)
    path, score = g.op(HmmViterbiOp)(*ins[:5])
    default_path, default_score = g.op(HmmViterbiDefaultsOp)(*ins[:3])
    marginals, counts = g.op(HmmPosteriorsOp)(*ins[:5])
    values_only = g.op(HmmPosteriorsValuesOp)(*ins[:5])
    defaults = g.op(HmmPosteriorsDefaultsOp)(*ins[:3])
    draws = g.op(HmmSampleStatesOp)(*ins[:6])
    varying = [ins[0], ins[6], ins[7], ins[3], ins[4]]
    ll = g.op(HmmVaryingLikelihoodOp)(*varying)
    v_marginals, v_counts = g.op(HmmVaryingPosteriorsOp)(*varying)
    v_path, v_score = g.op(HmmVaryingViterbiOp)(*varying)
    v_draws = g.op(HmmVaryingSampleStatesOp)(*varying, ins[5])
    return ins, [path, score, default_path, default_score, marginals, counts, *values_only, *defaults, draws, ll,
                 v_marginals, v_counts, v_path, v_score, v_draws,
                 *g.grads([marginals, counts], ins[:4]),
                 *g.grads([ll], varying[:4]),
                 *g.grads([v_marginals, v_counts], varying[:4])], values


def _hsmm(g, dtype, size):
    """The explicit-duration HMM's log-likelihood with its gradients (shared durations, right-censored) and its
    Viterbi path (per-sequence durations and initial weights, not censored) on one ragged batch."""
    T, B, K, D = size
    rng = np.random.default_rng(T + K + D)
    le = rng.normal(size=(T, B, K)) * 2
    lA = np.log(rng.dirichlet(np.ones(K), size=K))
    ld = np.log(rng.dirichlet(np.ones(D), size=(1, K)))
    ld_b = np.log(rng.dirichlet(np.ones(D), size=(B, K)))
    ld_b[0, :, 0] = -np.inf  # impossible durations
    lpi = np.log(rng.dirichlet(np.ones(K), size=1))
    lpi_b = np.log(rng.dirichlet(np.ones(K), size=B))
    lens = rng.integers(1, T + 1, size=B)
    lens[0], lens[-1] = T, 0
    uniforms = rng.random((T, B))
    values = cast([le, lA, ld, lpi, mask_of(lens, T), ld_b, lpi_b, uniforms], dtype)
    ins = g.syms("log_emissions log_transitions log_durations log_initial mask log_durations_b log_initial_b uniforms",
                 values)
    ll = g.op(HsmmLikelihoodOp)(*ins[:5], i32(1))
    per_sequence = (ins[0], ins[1], ins[5], ins[6], ins[4], i32(0))
    path, score = g.op(HsmmViterbiOp)(*per_sequence)
    marginals = g.op(HsmmPosteriorsOp)(*ins[:5], i32(1))
    draws = g.op(HsmmSampleStatesOp)(*per_sequence, ins[7])
    return ins, [ll, path, score, marginals, draws, *g.grads([ll], ins[:4])], values


# ------------------------------------------------------------------------------------------ RNN-T
def _rnnt(durations, sigma, lam, clamp):
    def fn(g, dtype, size):
        B, T, U, V = size
        K = V + 1 + len(durations)
        blank = K - 1 if durations else 0
        acts, labels, act_lens, label_lens = rnnt_data(B, T, U, K, blank, len(durations), dtype, seed=B + T)
        values = [acts, labels, act_lens, label_lens]
        ins = g.syms("acts labels act_lens label_lens", values)
        outs = g.op(MultiBlankRnntLoss)(*ins, pt.constant(np.asarray(durations, I32)), i32(blank),
                                           pt.constant(np.asarray([sigma, lam, clamp], np.float64)))
        return ins, [*outs, *g.grads([outs[0]], [ins[0]])], values

    return fn


# ------------------------------------------------------------------------------------------ sparse
def _subtensor_batched_index(g, dtype, size):
    T, B, D = size
    rng = np.random.default_rng(T + D)
    x = rng.normal(size=(T, B, D))
    idx = rng.integers(0, D, size=(T, B)).astype(np.float64)
    idx[0, 0], idx[1, 1], idx[2, 2], idx[3, 0] = -3, D + 2, 2.7, np.nan  # clipped, clipped, truncated, NaN -> 0
    values = cast([np.ascontiguousarray(x.transpose(1, 0, 2)), idx], dtype)  # x as (B, T, D): strided in the graph
    xb, i = g.syms("x_btd idx", values)
    y = g.op(SubtensorBatchedIndex)(xb.transpose(1, 0, 2), i)
    return [xb, i], [y, *g.grads([y], [xb])], values


def _sparse_coo(g, dtype, size):
    """SparseToDense (from W0 and from zeros), MaxAndArgmaxSparse and the sparse cross entropy on one COO batch
    (duplicates, masked and out-of-range entries)."""
    N, B, T, D = size
    s0, s1, w, mask = coo(N, B, T, D, seed=N)
    rng = np.random.default_rng(N + 1)
    s0z, s1z, wz, maskz = coo(N, B, T, D, seed=N + 2)
    wz = np.abs(wz)
    z_mask = ragged_mask(T, B, rng)
    values = cast([rng.normal(size=(T, B, D)), s0, s1, w, mask, rng.normal(size=(T, B)) * 0.1, np.zeros((T, B)),
                   rng.normal(size=(T, B, D)) * 2, z_mask, s0z, s1z, wz, maskz], dtype)
    W0, s0, s1, w, m, mx0, arg0, z, zm, yt, yi, yw, ym = g.syms("W0 s0 s1 w m mx0 arg0 z zm yt yi yw ym", values)
    W = g.op(SparseToDense)(W0, s0, s1, w, m)
    W_zeros = g.op(SparseToDenseZeros)(pt.zeros((W0.shape[0], 0, W0.shape[2]), dtype=W0.dtype), s0, s1, w, m)
    out_max, out_arg = g.op(MaxAndArgmaxSparse)(s0, s1, w, m, mx0, arg0)
    ce, grad_z, max_z = g.op(CrossEntropySoftmaxAndGradientZSparse)(z, zm, yt, yi, yw, ym)
    grads = g.grads([W], [W0, w]) + g.grads([W_zeros], [w]) + g.grads([ce], [z, yw])
    return [W0, s0, s1, w, m, mx0, arg0, z, zm, yt, yi, yw, ym], \
        [W, W_zeros, out_max, out_arg, ce, grad_z, max_z, *grads], values


# ------------------------------------------------------------------------------------------ the cases
def _case(name, family, classes, fn, sizes, **kwargs):
    return Case(name, family, tuple(classes), _case_builder(fn, sizes), **kwargs)


CASES = [
    # LSTM family (large: B = 40, T = 64 / 60)
    _case("lstm_generic", "lstm", [LstmGenericBase], _lstm_generic, [(9, 5, 16)], rtol32=1e-3, representative=True),
    _case("native_lstm2", "lstm", [NativeLstm2], _native_lstm2, [(7, 4, 8, 0, -1), (64, 40, 64, 0, 1)],
          rtol32=1e-3),
    _case("native_lstm2_layer", "lstm", [NativeLstm2Layer], _native_lstm2_layer,
          [(7, 4, 5, 8, 0, -1), (64, 40, 48, 64, 0, 1)], rtol32=1e-3),
    _case("lstm_lowmem", "lstm", [LstmLowMem], _lstm_lowmem, [(6, 3, 5, 4, 0, 1), (60, 40, 32, 32, 0, -1)],
          rtol32=1e-3),
    _case("twod_lstm", "lstm", [TwoDLSTM], _twod_lstm, [(4, 5, 3, 3, 4), (9, 12, 8, 6, 8)], rtol32=1e-3),
    _case("lstm_cell", "lstm", [LstmCell, LstmCellGrad, LstmCellGradGrad], _lstm_cell,
          [(6, 4, 5, 3), (64, 48, 96, 2)]),
    _case("lstm_cell_grad_ops", "lstm", [LstmCellGrad, LstmCellGradGrad], _lstm_cell_grad_ops, [(5, 3, 4, 2)]),
    # chunking
    _case("chunking", "chunking", [Chunking, UnChunking], _chunking, [(23, 5, 7, 6, 4), (90, 48, 16, 12, 5)],
          representative=True),
    # edit distance (ints: exact; large: multi-word rows on the CPU, long diagonals on the GPU)
    _case("edit_distance", "edit_distance", [EditDistanceOp, OptimalCompletionEditDistanceOp,
                                             OptimalCompletionEditDistancePerSuccessorOp, NextEditDistanceRowOp,
                                             NextEditDistanceReduceOp], _edit_distance,
          [(6, 9, 11, 4), (48, 200, 150, 5)], dtypes=INT_ONLY, representative=True),
    # automata
    _case("ctc_loss", "fsa", [GetCtcFsaFastBwOp, CtcFsaLossOp, CtcViterbiLossOp], _ctc_loss, [(12, 6, 7, 4), (80, 48, 40, 25)],
          rtol32=1e-3, representative=True),
    _case("fast_bw", "fsa", [FastBaumWelchOp], _fast_bw, [(8, 4, 5, 5, 14), (64, 40, 20, 12, 40)], rtol32=1e-3),
    _case("multi_end_fast_bw", "fsa", [MultiEndFastBaumWelchOp], _multi_end_fast_bw,
          [(7, 3, 4, 5, 14), (60, 40, 12, 8, 30)], rtol32=1e-3),
    _case("segment_fast_bw", "fsa", [SegmentFastBaumWelchOp], _segment_fast_bw, [(6, 3, 3, 4, 2), (40, 16, 4, 6, 3)],
          rtol32=1e-3),
    _case("fast_viterbi", "fsa", [FastViterbiOp], _fast_viterbi, [(8, 4, 5, 5, 14), (64, 40, 20, 12, 40)],
          rtol32=1e-4),
    _case("hmm", "fsa", [HmmForwardBackwardOp, HmmLikelihoodWithGradOp], _hmm, [(9, 4, 5), (64, 40, 16)], rtol32=1e-3),
    # HMM inference
    _case("hmm_inference", "hmm",
          [HmmViterbiOp, HmmViterbiDefaultsOp, HmmPosteriorsOp, HmmPosteriorsValuesOp, HmmPosteriorsDefaultsOp,
           HmmSampleStatesOp, HmmVaryingLikelihoodOp, HmmVaryingPosteriorsOp, HmmVaryingViterbiOp,
           HmmVaryingSampleStatesOp],
          _hmm_inference, [(9, 4, 5), (64, 40, 16)], rtol32=1e-3, representative=True),
    # explicit-duration HMM
    _case("hsmm", "hsmm", [HsmmLikelihoodOp, HsmmLikelihoodWithGradOp, HsmmViterbiOp, HsmmPosteriorsOp,
                           HsmmSampleStatesOp], _hsmm, [(9, 4, 3, 4), (64, 40, 4, 12)], rtol32=1e-3,
          representative=True),
    # RNN-T
    _case("rnnt", "rnnt", [MultiBlankRnntLoss], _rnnt((), 0.0, 0.0, -1.0), [(4, 9, 4, 5), (40, 60, 12, 24)],
          rtol32=1e-3, representative=True),
    _case("rnnt_multiblank", "rnnt", [MultiBlankRnntLoss], _rnnt((2, 4), 0.05, 0.2, 0.05), [(5, 11, 5, 6)],
          rtol32=1e-3),
    # sparse
    _case("subtensor_batched_index", "sparse", [SubtensorBatchedIndex], _subtensor_batched_index,
          [(7, 4, 6), (64, 48, 50)]),
    _case("sparse_coo", "sparse", [SparseToDense, SparseToDenseZeros, MaxAndArgmaxSparse,
                                   CrossEntropySoftmaxAndGradientZSparse],
          _sparse_coo, [(12, 4, 6, 5), (300, 48, 60, 50)], rtol32=1e-3, representative=True),
]

CASES_BY_NAME = {c.name: c for c in CASES}


def params(cases=CASES):
    """(case, dtype) pairs, for ``pytest.mark.parametrize``."""
    return [(c, d) for c in cases for d in c.dtypes]


def assert_all_ops_covered():
    """Every op class of the catalogue appears in some case (a new op without a GPU case fails)."""
    covered = {cls for case in CASES for cls in case.classes}
    missing = [cls.__name__ for cls in catalogue() if cls not in covered]
    assert not missing, f"catalogue ops without a GPU case in tests/gpu/cases.py: {missing}"


# ------------------------------------------------------------------------------------------ running
@contextmanager
def device_setting(device):
    """``ptnative.config.device = device`` for ops made without a device (inside pullbacks)."""
    old = ptnative.config._device
    ptnative.config.device = device
    try:
        yield
    finally:
        ptnative.config.device = old


def compile_case(case, dtype, device, mode=None, static=False):
    """(function, value_sets) of ``case`` with ``device`` ops; asserts every native node runs on ``device``
    (except in JAX mode, where JAX's device decides)."""
    with device_setting(device):
        inputs, outputs, value_sets = case.build(lambda cls, **kw: cls.make_op(device=device, **kw), dtype,
                                                 static=static)
        f = pytensor.function(inputs, outputs, mode=mode)
        native = [n.op for n in f.maker.fgraph.toposort() if isinstance(n.op, NativeOp)]
        assert native, f"{case}: no native op in the compiled graph"
        if mode != "JAX":
            wrong = {op.name for op in native if resolve(op) != device}
            assert not wrong, f"{case}: ops not on {device}: {sorted(wrong)}"
    return f, value_sets


#: The mode of the CPU reference the GPU results are compared with.  FAST_COMPILE runs the same CPU kernels as the
#: default mode (tests/test_gpu_cases.py checks that they agree for every case) without compiling the graph with
#: Numba, which on a fresh machine would roughly double the GPU test's time.
REFERENCE_MODE = "FAST_COMPILE"
_references = {}


def reference_results(case, dtype, static=False):
    """The CPU build's results in :data:`REFERENCE_MODE` (computed once per case, dtype and ``static``)."""
    key = (case.name, dtype, static)
    if key not in _references:
        _references[key] = run_case(case, dtype, "cpu", mode=REFERENCE_MODE, static=static)
    return _references[key]


def run_case(case, dtype, device, mode=None, static=False):
    """Compile ``case`` for ``device`` in ``mode`` and run it on every value set: a list of lists of outputs."""
    f, value_sets = compile_case(case, dtype, device, mode, static)
    with device_setting(device):
        return [[np.array(r, copy=True) for r in f(*values)] for values in value_sets]


def assert_outputs_close(case, dtype, got, want, what=""):
    """Ints exactly; floats to ``case.rtol(dtype)`` relative to each output's largest finite magnitude (inf and
    nan where the reference has them)."""
    assert len(got) == len(want)
    for s, (g_set, w_set) in enumerate(zip(got, want)):
        assert len(g_set) == len(w_set)
        for k, (g, w) in enumerate(zip(g_set, w_set)):
            g, w = np.asarray(g), np.asarray(w)
            msg = f"{case} {dtype} {what} value set {s}, output {k}"
            assert g.shape == w.shape and g.dtype == w.dtype, f"{msg}: {g.shape} {g.dtype} vs {w.shape} {w.dtype}"
            if not np.issubdtype(w.dtype, np.floating):
                np.testing.assert_array_equal(g, w, err_msg=msg)
                continue
            rtol = case.rtol(dtype)
            finite = np.isfinite(w)
            scale = float(np.abs(w[finite]).max()) if finite.any() else 1.0
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(scale, 1e-30), err_msg=msg)
