"""LSTM ops (kernels in ``c_code/lstm*.cu``, ``twod_lstm.cu``; shared parts in ``lstm_common.h``, ``lstm_packed.h``)."""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply
from pytensor.link.c.op import COp

from ..backends import lstm_shape_check as shape_check
from ..op import NativeOp, NativeOpGenBase
from ..source import kernel_unit
from . import _lstm_rewrites
from ._args import WRITTEN, dims_of, host_int32_scalar, input_entry, output_entry

__all__ = [
    "LstmGenericBase", "NativeLstm", "NativeLstm2", "NativeLstm2Layer", "LstmLowMem", "TwoDLSTM", "LstmCell",
    "LstmCellGrad", "LstmCellGradGrad", "lstm", "lstm_cell", "twod_lstm",
]


class LstmGenericBase(NativeOpGenBase):
    """LSTM over precomputed input projections, without peepholes or y0.

    Inputs:
      * ``Z`` (T, B, 4n): input projections, gates ``[cell-in | input | forget | output]``;
      * ``V_h`` (n, 4n): recurrent matrix;
      * ``c`` (B, n): initial cell state;
      * ``i`` (T, B): mask, 1 on valid frames and 0 on padding (no gradient).

    Outputs:
      * ``Y`` (T, B, n): ``o * tanh(s) * i``; 0 on masked frames (and that 0 is the
        recurrent input of the next frame);
      * ``H`` (T, B, 4n): per frame ``[s, input gate, forget gate, output gate]``
        (the state, then the activated gates); Z's buffer when inplace;
      * ``d`` (B, n): the cell state after the last frame (masked frames carry it).

    At frame t: ``H[t] = Z[t] + Y[t-1] . V_h`` (no recurrent term at t = 0),
    ``s = (ig * tanh(z) + fg * s_prev) * i + s_prev * (1 - i)``.  T = 0 gives
    ``d = c``.  Gradients flow to Z, V_h and c from Y and d; a gradient into H is
    ignored (as in the seed).  Float32 and float64.  Shape mismatches raise
    ``ValueError``.
    """

    in_info = (
        input_entry("Z", 3, differentiable=True, batch_axis=1, want_inplace=1,
                    bw_out_var={"shape": ((2, 0), (2, 1), (0, 1)), "batch_axis": 1}),
        input_entry("V_h", 2, differentiable=True, bw_out_var=WRITTEN),
        input_entry("c", 2, differentiable=True, batch_axis=0, bw_out_var=WRITTEN),
        input_entry("i", 2, batch_axis=1),
    )
    out_info = (  # H starts as Z's copy (want_inplace), the gradient op's DZ as H's
        output_entry("Y", ((0, 0), (0, 1), (1, 0)), batch_axis=1, bw_grad_var={"want_inplace": "dummy_out"}, **WRITTEN),
        output_entry("H", ((0, 0), (0, 1), (0, 2)), batch_axis=1, bw_in_var={"want_inplace": 0}),
        output_entry("d", ((2, 0), (2, 1)), batch_axis=0, **WRITTEN),
    )

    @classmethod
    def grad_input_map(cls, Z, V_h, c, i, Y, H, d, DY, DH, Dd):
        return V_h, c, i, Y, H, DY, Dd

    c_extra_support_code = kernel_unit("lstm/lstm_generic.cu")
    c_fw_code = "lstm_generic_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "lstm_generic_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


#: RETURNN's name for :class:`LstmGenericBase`.
NativeLstm = LstmGenericBase


# ====================================================================== NativeLstm2, LstmLowMem, TwoDLSTM,
# lstm_cell and the lstm() layer helper.  Kernels: c_code/lstm/lstm.cu (NativeLstm2), lstm_lowmem.cu, twod_lstm.cu,
# lstm_cell.cu.

#: NativeLstm2's and LstmLowMem's last inputs: the initial output and state, the mask, the frames to visit.
_STATE_MASK_FRAMES = (input_entry("y0", 2, differentiable=True, batch_axis=0, bw_out_var=WRITTEN),
                      input_entry("c0", 2, differentiable=True, batch_axis=0, bw_out_var=WRITTEN),
                      input_entry("i", 2, batch_axis=1),
                      host_int32_scalar("start"),
                      host_int32_scalar("step"))


class NativeLstm2(NativeOpGenBase):
    """LSTM over precomputed input projections, with y0, direction and stride (RETURNN's NativeLstm2).

    Inputs:
      * ``X`` (T, B, 4n): input projections, gate blocks ``[cell-in | input | forget | output]``;
      * ``W`` (n, 4n): recurrent matrix;
      * ``y0``, ``c0`` (B, n): initial output and cell state;
      * ``i`` (T, B): mask, 1 on valid frames, 0 on padding (no gradient);
      * ``start``, ``step``: int32 scalars (no gradient).  ``step > 0`` visits ``start, start+step, ...
        <= T-1``; ``step < 0`` visits ``T-1-start, T-1-start+step, ... >= 0``.  ``0 <= start < T`` and
        ``step != 0`` are required when T > 0 (``ValueError`` otherwise).

    Outputs:
      * ``Y`` (T, B, n): ``o * tanh(c) * i``; 0 on masked and on unvisited frames;
      * ``C`` (T, B, n): cell states; a masked frame carries the previous state;
      * ``H`` (T, B, 4n): a workspace for the gradient: the activated gates ``[tanh(cell-in), sigma(in),
        sigma(forget), sigma(out)]`` on the valid rows of visited frames, 0 on their masked rows (``i == 0``: their
        gates reach no output and no gradient, and the CPU kernel may skip their products), a copy of X on the
        frames not visited (X's buffer when PyTensor runs the op inplace);
      * ``d`` (B, n): the cell state after the last visited frame; ``c0`` when T = 0.

    The recurrent input of a visited frame is the carried output: ``y_prev <- y + y_prev * (1 - i)``, so
    the hidden state skips masked frames (unlike LstmGenericBase / LstmLowMem, which feed 0).

    Gradients reach X, W, y0 and c0 from Y, C and d (exact for any mask; the gradient w.r.t. H is
    ignored, as in RETURNN).  Float32 and float64.

    A graph feeding it ``X = dot(x, W_in) + b`` compiles to :class:`NativeLstm2Layer`'s nodes, its gradient graph
    included where it matches (the rewrite ``ptnative_lstm_projection_fusion``; docs/lstm.md, "The seed graph").
    """

    in_info = (
        input_entry("X", 3, differentiable=True, batch_axis=1, want_inplace=2,
                    bw_out_var={"shape": ((8, 0), (8, 1), (8, 2)), "batch_axis": 1}),
        input_entry("W", 2, differentiable=True, bw_out_var=WRITTEN),
        *_STATE_MASK_FRAMES,
    )
    out_info = (  # H starts as X's copy (want_inplace), and so does the gradient op's DX as H's
        output_entry("Y", ((0, 0), (0, 1), (1, 0)), batch_axis=1, **WRITTEN),
        output_entry("C", ((0, 0), (0, 1), (1, 0)), batch_axis=1, **WRITTEN),
        output_entry("H", ((0, 0), (0, 1), (1, 1)), batch_axis=1, bw_in_var={"want_inplace": 0}),
        output_entry("d", ((0, 1), (1, 0)), batch_axis=0, **WRITTEN),
    )

    @classmethod
    def grad_input_map(cls, X, W, y0, c0, i, start, step, Y, C, H, d, DY, DC, DH, Dd):
        return W, y0, c0, i, start, step, Y, C, H, DY, DC, Dd

    c_extra_support_code = kernel_unit("lstm/lstm.cu")
    c_fw_code = "native_lstm2_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "native_lstm2_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


class NativeLstm2Layer(NativeOpGenBase):
    """A whole LSTM layer: the input projection, then :class:`NativeLstm2` with the bias (what :func:`lstm` runs
    for ``impl="native2"``).

    Inputs: ``x`` (T, B, n_in), ``W_in`` (n_in, 4n), ``W`` (n, 4n), ``b`` (4n), then ``y0, c0, i, start, step`` as
    NativeLstm2.  Outputs ``Y, C, H, d`` as NativeLstm2 run on ``X = x . W_in + b``; ``H`` holds ``x . W_in`` on the
    frames not visited and, as NativeLstm2's, 0 on the masked rows of visited frames.  A padded frame's ``x`` (NaN
    included) reaches no output and no gradient.

    One op rather than a GEMM node, an add and NativeLstm2: the bias is added in the recurrent product's pass over
    each frame, and backward the bias gradient is summed while each frame is in the cache (in double, in a fixed
    order for a given thread count), both weight gradients are one GEMM (``[x, y_prev]^T . DX``) and ``x``'s is
    ``DX . W_in^T``, with no transposed copies and no intermediate arrays in the graph.  Gradients reach x, W_in,
    W, b, y0 and c0 (the gradient w.r.t. H is ignored).  Float32 and float64.
    """

    in_info = (
        input_entry("x", 3, differentiable=True, batch_axis=1, bw_out_var=WRITTEN),
        input_entry("W_in", 2, differentiable=True, bw_out_var=WRITTEN),
        input_entry("W", 2, differentiable=True, bw_out_var=WRITTEN),
        input_entry("b", 1, differentiable=True, bw_out_var={"shape": ((1, 1),), **WRITTEN}),
        *_STATE_MASK_FRAMES,
    )
    out_info = (
        output_entry("Y", ((0, 0), (0, 1), (2, 0)), batch_axis=1, **WRITTEN),
        output_entry("C", ((0, 0), (0, 1), (2, 0)), batch_axis=1, **WRITTEN),
        output_entry("H", ((0, 0), (0, 1), (2, 1)), batch_axis=1, bw_in_var={"want_inplace": "dummy_out"}, **WRITTEN),
        output_entry("d", ((0, 1), (2, 0)), batch_axis=0, **WRITTEN),
    )

    @classmethod
    def grad_input_map(cls, x, W_in, W, b, y0, c0, i, start, step, Y, C, H, d, DY, DC, DH, Dd):
        return x, W_in, W, y0, c0, i, start, step, Y, C, H, DY, DC, Dd

    c_extra_support_code = NativeLstm2.c_extra_support_code
    c_fw_code = "native_lstm2_layer_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "native_lstm2_layer_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


# ``X = dot(x, W_in) + b`` feeding NativeLstm2 (the seed's graph), and its gradients, become NativeLstm2Layer's nodes.
_lstm_rewrites.register(NativeLstm2, NativeLstm2Layer)


class LstmLowMem(NativeOpGenBase):
    """LSTM with the input projection fused in, storing only Y and C (RETURNN's LstmLowMem); the
    backward pass recomputes the gates.

    Inputs:
      * ``X`` (T, B, n_in); ``W`` (n_in + n, 4n): the input rows, then the recurrent rows; ``b`` (4n);
      * ``y0``, ``c0`` (B, n); ``i`` (T, B) mask (no gradient); ``start``, ``step``: int32 scalars.

    At a visited frame t: ``a = [X[t], Y[t_prev]] . W + b`` (``y0`` at the first visited frame), gates
    as in NativeLstm2, ``c = (c_prev*f + tanh(a_c)*in) * i + c_prev * (1 - i)``, ``y = tanh(c) * o * i``.
    A masked frame's Y is 0 and is the next frame's recurrent input (it is not carried).

    Visited frames: ``step > 0``: ``start, start+step, ... <= T-1``; ``step < 0``: ``T-1-start,
    T-1-start+step, ... >= start`` (RETURNN's rule; no frame when ``start > (T-1)/2``).  ``0 <= start < T``
    and ``step != 0`` are required when T > 0.

    Outputs: ``Y``, ``C`` (T, B, n) (0 on unvisited frames), ``d`` (B, n): the last visited frame's cell
    state, ``c0`` if there is none (T = 0 included).  Gradients reach X, W, b, y0, c0 from Y, C and d,
    exact on masked frames too.  Float32 and float64.
    """

    in_info = (input_entry("X", 3, differentiable=True, batch_axis=1, bw_out_var=WRITTEN),
               input_entry("W", 2, differentiable=True, bw_out_var=WRITTEN),
               input_entry("b", 1, differentiable=True, bw_out_var=WRITTEN), *_STATE_MASK_FRAMES)
    out_info = (
        output_entry("Y", ((0, 0), (0, 1), (4, 1)), batch_axis=1, **WRITTEN),
        output_entry("C", ((0, 0), (0, 1), (4, 1)), batch_axis=1, **WRITTEN),
        output_entry("d", ((0, 1), (4, 1)), batch_axis=0, **WRITTEN),
    )

    @classmethod
    def grad_input_map(cls, X, W, b, y0, c0, i, start, step, Y, C, d, DY, DC, Dd):
        return X, W, b, y0, c0, i, start, step, Y, C, DY, DC, Dd

    c_extra_support_code = kernel_unit("lstm/lstm_lowmem.cu")
    c_fw_code = "lstm_lowmem_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "lstm_lowmem_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


class TwoDLSTM(NativeOpGenBase):
    """2-D LSTM over (target time y) x (source time x) (RETURNN's TwoDLSTM), on the CPU and on CUDA.

    Inputs (RETURNN's list; the scratch inputs are accepted with any shape and unused):
      * ``X`` (h, w, B, n_in); ``V_h``, ``V_v`` (n, 5n): recurrent matrices from the left and from above;
        ``W`` (n_in, 5n); ``b`` (5n);
      * ``ptr_storage_fwd``, ``ptr_storage_bwd``, ``valid`` (1-D), ``workmem`` (5-D), ``workmem2`` (3-D),
        ``DYDummy`` (4-D): scratch, unused;
      * ``sizes`` (B, 2): (height, width) of each sequence pair; cell (y, x) is valid iff
        ``y < sizes[b, 0] and x < sizes[b, 1]``;
      * ``initialState`` (>=1, w, B, 5n): ``initialState[0, x, :, 4n:]`` is the state above row 0;
      * ``initialOutput`` (>=1, w, B, n): the output above row 0 when ``iteration[0] >= 1`` (then h must
        be 1); ``iteration`` (1-D, may be empty = 0).

    Gate blocks along 5n: ``[input, forget, lambda, output, cell-in]``.  Cell (y, x):
    ``a = b + X W + Y[y, x-1] V_h + Y[y-1, x] V_v``,
    ``s = v * (i*tanh(a_c) + f*lambda*s_up + f*(1-lambda)*s_left)``, ``Y = v * o * tanh(s)``.

    Outputs: ``CompleteY`` (h, w, B, n); ``H`` (h, w, B, 5n) = ``[i, f, lambda, o, s]`` per cell.
    Gradients reach X, V_h, V_v, W and b (RETURNN leaves b untrained) from CompleteY; the gradient
    w.r.t. H is ignored.  Float32 and float64.
    """

    in_info = (
        input_entry("X", 4, differentiable=True, bw_out_var={"shape": ((0, 0), (0, 1), (0, 2), (0, 3))}),
        *(input_entry(name, ndim, differentiable=True) for name, ndim in (("V_h", 2), ("V_v", 2), ("W", 2), ("b", 1))),
        *(input_entry(name, ndim) for name, ndim in (
            ("ptr_storage_fwd", 1), ("ptr_storage_bwd", 1), ("valid", 1), ("workmem", 5), ("workmem2", 3),
            ("sizes", 2), ("DYDummy", 4), ("initialState", 4), ("initialOutput", 4), ("iteration", 1))),
    )
    out_info = (
        output_entry("CompleteY", ((0, 0), (0, 1), (0, 2), (1, 0))),
        output_entry("H", ((0, 0), (0, 1), (0, 2), (3, 1))),
    )
    c_extra_support_code = kernel_unit("lstm/twod_lstm.cu")
    c_fw_code = "twod_lstm_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "twod_lstm_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


# ---------------------------------------------------------------------- chainer's LSTM activation
_CELL_SUPPORT = kernel_unit("lstm/lstm_cell.cu")


def _zeros_where_disconnected(cotangents, outputs):
    """The cotangents, with zeros shaped like the output for a disconnected one."""
    return [pt.zeros_like(o) if isinstance(g.type, DisconnectedType) else g for g, o in zip(cotangents, outputs)]


class LstmCellGradGrad(NativeOpGenBase):
    """Second derivative of :class:`LstmCell`: the cotangents ``(ggc_prev, ggx)`` of LstmCellGrad's
    outputs pulled back to its inputs ``(c_prev, x, c, gc, gh)``.  No further gradient."""

    in_info = tuple(input_entry(nm, 3, differentiable=True) for nm in ("c_prev", "x", "c", "gc", "gh", "ggc_prev",
                                                                        "ggx"))
    out_info = tuple(output_entry(nm, dims_of(k, 3), contiguous=False)
                     for k, nm in enumerate(("g_c_prev", "g_x", "g_c", "g_gc", "g_gh")))
    c_extra_support_code = _CELL_SUPPORT
    c_fw_code = "lstm_cell_bw2(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


class _NativePullbackOp(NativeOp):
    """A NativeOp whose pullback is the native op ``pullback_spec``, applied to the inputs, then (when
    ``pullback_takes_output``) the first output, then the cotangents (zeros for a disconnected one)."""

    pullback_spec: type[NativeOpGenBase]
    pullback_takes_output = False

    def pullback(self, inputs, outputs, cotangents):
        forward = [*inputs, outputs[0]] if self.pullback_takes_output else list(inputs)
        return self.pullback_spec.make_op()(*forward, *_zeros_where_disconnected(cotangents, outputs))


class _LstmCellGradOp(_NativePullbackOp):
    """LstmCellGrad's Op: ``(c_prev, x, c, gc, gh, ggc_prev, ggx)`` -> the native LstmCellGradGrad."""

    pullback_spec = LstmCellGradGrad


class LstmCellGrad(NativeOpGenBase):
    """Gradient of :class:`LstmCell`: ``(c_prev, x, c, gc, gh) -> (gc_prev, gx)``.  ``c`` is an input of
    its own (the forward's c, not recomputed).  Differentiable once more (:class:`LstmCellGradGrad`)."""

    in_info = tuple(input_entry(nm, 3, differentiable=True) for nm in ("c_prev", "x", "c", "gc", "gh"))
    out_info = (output_entry("gc_prev", dims_of(0, 3), contiguous=False),
                output_entry("gx", dims_of(1, 3), contiguous=False))
    c_extra_support_code = _CELL_SUPPORT
    c_fw_code = "lstm_cell_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)
    op_class = _LstmCellGradOp


class _LstmCellOp(_NativePullbackOp):
    """LstmCell's Op: ``(c_prev, x, c, gc, gh)`` -> the (twice differentiable) native LstmCellGrad."""

    pullback_spec = LstmCellGrad
    pullback_takes_output = True


class LstmCell(NativeOpGenBase):
    """chainer's LSTM activation on 3-D arrays: ``c_prev`` (Bc, H, R), ``x`` (Bx, 4H, R), Bx <= Bc, the
    gates of unit j interleaved as ``x[:, 4*j + g]`` for g in (a, i, f, o).  Outputs ``c`` (Bc, H, R):
    ``tanh(a)*sigma(i) + sigma(f)*c_prev`` on the first Bx rows, ``c_prev`` on the others; ``h`` (Bx, H, R):
    ``sigma(o) * tanh(c)``.  Use :func:`lstm_cell` for any number of trailing dimensions."""

    in_info = (input_entry("c_prev", 3, differentiable=True), input_entry("x", 3, differentiable=True))
    out_info = (output_entry("c", dims_of(0, 3), contiguous=False),
                output_entry("h", ((1, 0), (0, 1), (0, 2)), contiguous=False))
    c_extra_support_code = _CELL_SUPPORT
    c_fw_code = "lstm_cell_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)
    op_class = _LstmCellOp


def lstm_cell(c_prev, x):
    """chainer's LSTM activation: ``lstm_cell(c_prev, x) -> (c, h)``.

    Parameters
    ----------
    c_prev : tensor (Bc, H, *rest), float32 or float64
        The previous cell state.
    x : tensor (Bx, 4H, *rest), same dtype and ndim, ``Bx <= Bc``
        Pre-activations with the gates of unit j **interleaved**: ``x[:, 4*j + g]`` for
        g = 0 (cell input a, tanh), 1 (input gate i), 2 (forget gate f), 3 (output gate o).

    Returns
    -------
    c : tensor (Bc, H, *rest)
        ``tanh(a) * sigmoid(i) + sigmoid(f) * c_prev[:Bx]`` on the first Bx rows; rows ``Bx:`` are
        ``c_prev[Bx:]`` unchanged (a shrinking batch, as in chainer).
    h : tensor (Bx, H, *rest)
        ``sigmoid(o) * tanh(c[:Bx])``.

    Both are differentiable twice (native kernels for the first and second derivative).  Zero-size
    dimensions are allowed.  Raises ``ValueError`` for ndim < 2, mismatched ndim, a second dimension of
    x that is not 4 * H, different trailing dimensions or (at run time) ``Bx > Bc``; ``TypeError`` for
    non-floating inputs.
    """
    c_prev = pt.as_tensor_variable(c_prev)
    x = pt.as_tensor_variable(x)
    for name, v in (("c_prev", c_prev), ("x", x)):
        if not v.dtype.startswith("float"):
            raise TypeError(f"lstm_cell: {name} must be float32 or float64, got {v.dtype}")
    if c_prev.ndim < 2 or x.ndim != c_prev.ndim:
        raise ValueError(f"lstm_cell: c_prev and x need the same ndim >= 2, got {c_prev.ndim} and {x.ndim}")
    sc, sx = c_prev.type.shape, x.type.shape
    if sc[1] is not None and sx[1] is not None and sx[1] != 4 * sc[1]:
        raise ValueError(f"lstm_cell: x.shape[1] must be 4 * c_prev.shape[1], got {sx[1]} and {sc[1]}")
    if sc[0] is not None and sx[0] is not None and sx[0] > sc[0]:
        raise ValueError(f"lstm_cell: len(x) = {sx[0]} must not exceed len(c_prev) = {sc[0]}")
    for k in range(2, c_prev.ndim):
        if sc[k] is not None and sx[k] is not None and sc[k] != sx[k]:
            raise ValueError(f"lstm_cell: trailing dimension {k} differs: {sc[k]} vs {sx[k]}")
    from pytensor.scalar import upcast
    dtype = upcast(c_prev.dtype, x.dtype)
    c_prev, x = pt.cast(c_prev, dtype), pt.cast(x, dtype)
    rest = [c_prev.shape[k] for k in range(2, c_prev.ndim)]
    r = pt.prod(pt.stack(rest)) if rest else 1
    c3 = c_prev.reshape((c_prev.shape[0], c_prev.shape[1], r))
    x3 = x.reshape((x.shape[0], x.shape[1], r))
    c, h = LstmCell.make_op()(c3, x3)
    c = c.reshape(c_prev.shape)
    h = h.reshape((x.shape[0], c_prev.shape[1], *rest))
    return c, h


# ---------------------------------------------------------------------- layer helper
def _int32(v):
    return pt.constant(np.int32(v)) if isinstance(v, int | np.integer) else pt.cast(v, "int32")


#: lstm()'s argument order, and its shape rules: ``arg.shape[k]`` must equal ``factor * ref.shape[kr]``.
_LAYER_ARGS = ("x", "W_in", "W_rec", "b", "y0", "c0", "mask")
_FOUR_N = ("W_rec", 0, 4, "4 * n (n = W_rec.shape[0])")
_LAYER_SHAPE_RULES = (
    ("W_rec", 1, *_FOUR_N), ("W_in", 0, "x", 2, 1, "n_in (x.shape[2])"), ("W_in", 1, *_FOUR_N), ("b", 0, *_FOUR_N),
    ("y0", 0, "x", 1, 1, "B (x.shape[1])"), ("y0", 1, "W_rec", 0, 1, "n (W_rec.shape[0])"),
    ("c0", 0, "x", 1, 1, "B (x.shape[1])"), ("c0", 1, "W_rec", 0, 1, "n (W_rec.shape[0])"),
    ("mask", 0, "x", 0, 1, "T (x.shape[0])"), ("mask", 1, "x", 1, 1, "B (x.shape[1])"),
)


def _check_layer_shapes(shapes):
    """``ValueError`` naming lstm()'s argument for the first rule that ``shapes`` (one tuple per argument, in
    ``_LAYER_ARGS`` order; None for an unknown size) break."""
    dims = dict(zip(_LAYER_ARGS, shapes))
    for name, k, ref, kr, factor, what in _LAYER_SHAPE_RULES:
        got, want = dims[name][k], dims[ref][kr]
        if got is not None and want is not None and got != factor * want:
            raise ValueError(f"lstm: {name}.shape[{k}] = {got}; expected {what} = {factor * want}")


class LstmShapeCheck(COp):
    """``LstmShapeCheck()(x, W_in, W_rec, b, y0, c0, mask)`` returns its inputs (views), behind lstm()'s shape
    rules checked when the graph runs (``ValueError`` naming lstm()'s argument), so that nothing computed from
    them runs before the check.

    One node holding the arrays themselves, not a ``CheckAndRaise`` on shape arithmetic: PyTensor fuses such
    conditions with the shape arithmetic of the layer (``T * B`` of a reshape), which JAX then traces, so that
    the shapes are no longer static under ``jit`` / ``shard_map``.  In JAX mode the rules are checked once, when
    the function is traced (the shapes are static there).  No ``infer_shape``: shapes computed from its outputs
    wait for the check (with the inputs' shapes, FAST_COMPILE's broadcasting asserts on them ran first).

    Its C, Numba and JAX code is :mod:`ptnative.backends.lstm_shape_check`, rendered from the rules held here."""

    __props__ = ()
    view_map = {k: [k] for k in range(len(_LAYER_ARGS))}

    def make_node(self, *inputs):
        inputs = [pt.as_tensor_variable(v) for v in inputs]
        if len(inputs) != len(_LAYER_ARGS):
            raise TypeError(f"LstmShapeCheck: expected {len(_LAYER_ARGS)} inputs, got {len(inputs)}")
        return Apply(self, inputs, [v.type() for v in inputs])

    def perform(self, node, inputs, outputs):
        _check_layer_shapes([v.shape for v in inputs])
        for out, v in zip(outputs, inputs):
            out[0] = v

    def connection_pattern(self, node):
        return [[k == j for j in range(len(node.outputs))] for k in range(len(node.inputs))]

    def pullback(self, inputs, outputs, cotangents):
        return list(cotangents)

    L_op = pullback  # PyTensor 2.38 calls L_op, 3 calls pullback

    def do_constant_folding(self, fgraph, node):
        return False

    def c_code(self, node, name, inputs, outputs, sub):
        return shape_check.c_code("lstm", _LAYER_ARGS, _LAYER_SHAPE_RULES, inputs, outputs, sub["fail"])

    def c_code_cache_version(self):
        return shape_check.c_code_cache_version(_LAYER_SHAPE_RULES)


# The Numba and JAX implementations (JAX's registered lazily: importing ptnative imports no JAX).
shape_check.register(LstmShapeCheck, _LAYER_ARGS, _LAYER_SHAPE_RULES, _check_layer_shapes)


def lstm(x, W_in, W_rec, b, y0=None, c0=None, mask=None, direction=1, impl="native2"):
    """A whole LSTM layer: ``(Y, final_c, final_y) = lstm(x, W_in, W_rec, b, ...)``.

    Parameters
    ----------
    x : tensor (T, B, n_in), float32 or float64
    W_in : (n_in, 4n) input weights; ``W_rec`` : (n, 4n) recurrent weights; ``b`` : (4n,) bias.
        Gate blocks along 4n: ``[cell-in | input | forget | output]``.
    y0, c0 : (B, n), optional
        Initial output and cell state (zeros by default).
    mask : (T, B), optional
        1 on valid frames, 0 on padding (all ones by default).
    direction : 1 or -1
        1 runs t = 0..T-1, -1 runs t = T-1..0.
    impl : "native2" or "lowmem"
        ``"native2"``: :class:`NativeLstm2Layer` (``X = x . W_in + b`` as one GEMM, then NativeLstm2; fastest;
        stores the gates).  ``"lowmem"``: :class:`LstmLowMem` with ``W = [W_in; W_rec]`` (stores only Y and C and
        recomputes the gates in the backward pass).  They agree whenever no masked frame precedes a
        valid one in the direction of travel or ``y0`` is 0: NativeLstm2 carries the last output across
        masked frames, LstmLowMem feeds 0 after one.

    Returns
    -------
    Y : (T, B, n)
        Outputs, 0 on masked frames.
    final_c : (B, n)
        The cell state after the last frame (masked frames carry it; ``c0`` when T = 0).
    final_y : (B, n)
        The output at each sequence's last unmasked frame in the direction of travel; ``y0`` for a
        sequence without one.

    Raises ``ValueError`` for a bad ``direction`` / ``impl``, mismatched ndims, or shapes that contradict each
    other (when the graph is built, for the static shapes; else when it runs, in the op's terms: ``W`` is
    ``W_rec`` for ``"native2"`` and ``[W_in; W_rec]`` for ``"lowmem"``, ``i`` is ``mask``), ``TypeError`` for
    non-floating ``x``.  Differentiable w.r.t. x, W_in, W_rec, b, y0 and c0.
    """
    if impl not in ("native2", "lowmem"):
        raise ValueError(f"lstm: impl must be 'native2' or 'lowmem', got {impl!r}")
    if direction not in (1, -1):
        raise ValueError(f"lstm: direction must be 1 or -1, got {direction!r}")
    x = pt.as_tensor_variable(x)
    if not x.dtype.startswith("float"):
        raise TypeError(f"lstm: x must be float32 or float64, got {x.dtype}")
    W_in, W_rec, b = (pt.as_tensor_variable(v) for v in (W_in, W_rec, b))
    for name, v, nd in (("x", x, 3), ("W_in", W_in, 2), ("W_rec", W_rec, 2), ("b", b, 1)):
        if v.ndim != nd:
            raise ValueError(f"lstm: {name} must have ndim {nd}, got {v.ndim}")
    from pytensor.scalar import upcast
    dtype = upcast(x.dtype, W_in.dtype, W_rec.dtype, b.dtype)
    x, W_in, W_rec, b = (pt.cast(v, dtype) for v in (x, W_in, W_rec, b))
    T, B = x.shape[0], x.shape[1]
    n = W_rec.shape[0]
    y0 = pt.zeros((B, n), dtype=dtype) if y0 is None else pt.cast(pt.as_tensor_variable(y0), dtype)
    c0 = pt.zeros((B, n), dtype=dtype) if c0 is None else pt.cast(pt.as_tensor_variable(c0), dtype)
    mask = pt.ones((T, B), dtype=dtype) if mask is None else pt.cast(pt.as_tensor_variable(mask), dtype)
    for name, v, nd in (("y0", y0, 2), ("c0", c0, 2), ("mask", mask, 2)):
        if v.ndim != nd:
            raise ValueError(f"lstm: {name} must have ndim {nd}, got {v.ndim}")
    _check_layer_shapes([v.type.shape for v in (x, W_in, W_rec, b, y0, c0, mask)])
    if any(None in v.type.shape for v in (x, W_in, W_rec, b, y0, c0, mask)):
        x, W_in, W_rec, b, y0, c0, mask = LstmShapeCheck()(x, W_in, W_rec, b, y0, c0, mask)
    start, step = _int32(0), _int32(direction)
    if impl == "native2":
        Y, _, _, final_c = NativeLstm2Layer.make_op()(x, W_in, W_rec, b, y0, c0, mask, start, step)
    else:
        W = pt.concatenate([W_in, W_rec], axis=0)
        Y, _, final_c = LstmLowMem.make_op()(x, W, b, y0, c0, mask, start, step)
    # weight of frame t: 1 at each sequence's last valid frame in the direction of travel
    valid = pt.gt(mask, 0).astype(dtype)
    # (the count of valid frames after t in the direction of travel, by forward cumsums: PyTensor's pure C linker
    # aborts on a cumsum of a reversed view)
    later = valid.sum(axis=0) - valid.cumsum(axis=0) if direction == 1 else valid.cumsum(axis=0) - valid
    last = valid * pt.eq(later, 0).astype(dtype)
    final_y = (Y * last[:, :, None]).sum(axis=0) + y0 * (1 - last.sum(axis=0))[:, None]
    return Y, final_c, final_y


def twod_lstm(X, V_h, V_v, W, b, sizes, initial_state=None, initial_output=None, iteration=0):
    """:class:`TwoDLSTM` without the scratch inputs: returns ``(CompleteY, H)``.

    ``X`` (h, w, B, n_in); ``V_h``, ``V_v`` (n, 5n); ``W`` (n_in, 5n); ``b`` (5n); ``sizes`` (B, 2) with the
    (height, width) of each pair; ``initial_state`` (1, w, B, 5n) (zeros by default; only its last n
    columns are used); ``initial_output`` (1, w, B, n), used above row 0 when ``iteration >= 1`` (then
    h must be 1).  See :class:`TwoDLSTM` for the recurrence.
    """
    X = pt.as_tensor_variable(X)
    if not X.dtype.startswith("float"):
        raise TypeError(f"twod_lstm: X must be float32 or float64, got {X.dtype}")
    if X.ndim != 4:
        raise ValueError(f"twod_lstm: X must have ndim 4, got {X.ndim}")
    V_h = pt.as_tensor_variable(V_h)
    w, B, n = X.shape[1], X.shape[2], V_h.shape[0]
    dt = X.dtype
    if initial_state is None:
        initial_state = pt.zeros((1, w, B, 5 * n), dtype=dt)
    if initial_output is None:
        initial_output = pt.zeros((1, w, B, n), dtype=dt)
    e1 = pt.zeros((0,), dtype=dt)
    it = pt.cast(pt.as_tensor_variable(iteration), dt).reshape((1,))
    return TwoDLSTM.make_op()(X, V_h, V_v, W, b, e1, e1, e1, pt.zeros((0,) * 5, dtype=dt),
                              pt.zeros((0,) * 3, dtype=dt), sizes, pt.zeros((0,) * 4, dtype=dt), initial_state,
                              initial_output, it)
