"""Batched indexing and sparse (COO) ops (kernels in ``c_code/sparse/sparse.cu``).

Conventions shared by the sparse ops:

* Sparse entries are ``(n_sparse, n_batch)`` arrays: entry ``(i, b)`` belongs to
  batch entry ``b``.  An entry counts where its mask is ``>= 0.1``.
* Indices are floating values (the seed's API; integer tensors are cast).  A value
  ``v`` names slot ``trunc(v)`` and is in range for a size ``n`` when
  ``-1 < v < n``; NaN never is.
* An out-of-range entry that counts is skipped (``SubtensorBatchedIndex`` clips
  instead).  With ``strict=True`` the functions use the strict variant of the op,
  which raises ``ValueError`` naming the entry instead.
"""

from __future__ import annotations

import pytensor.tensor as pt
from pytensor.configdefaults import config
from pytensor.gradient import DisconnectedType, disconnected_type, grad_not_implemented

from ..op import NativeOp, NativeOpGenBase
from ..source import kernel_unit
from ._args import dims_of, float_tensor, input_entry, int_size, output_entry, real_tensor, tensor

__all__ = [
    "SubtensorBatchedIndex", "SparseToDense", "SparseToDenseZeros", "MaxAndArgmaxSparse",
    "CrossEntropySoftmaxAndGradientZSparse",
    "subtensor_batched_index", "sparse_to_dense", "max_and_argmax_sparse",
    "crossentropy_softmax_and_gradient_z_sparse", "onehot_to_sparse",
]

_SUPPORT = {"sparse": kernel_unit("sparse/sparse.cu")}


def _call(function: str, strict: str = "") -> str:
    return f"{function}(n_inputs, inputs, n_outputs, outputs{strict});"


def _coo(name: str, **keys) -> dict:
    """The in_info entry of an (N, B) COO array (indices and masks: no gradient); the batch is axis 1."""
    return input_entry(name, 2, batch_axis=1, **keys)


class _SparseOpGen(NativeOpGenBase):
    """A sparse-family op whose kernels are ``<kernel>_fw(..., strict)`` and, with ``backward``,
    ``<kernel>_bw``: ``class X(_SparseOpGen, kernel="name", backward=False)``."""

    c_extra_support_code = _SUPPORT
    code_version = (2,)
    #: c_fw_code of the variant that raises on out-of-range indices.
    c_fw_code_strict: str = None

    def __init_subclass__(cls, kernel: str, backward: bool = True, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.c_fw_code = _call(f"{kernel}_fw", ", false")
        cls.c_fw_code_strict = _call(f"{kernel}_fw", ", true")
        cls.c_bw_code = _call(f"{kernel}_bw") if backward else None

    @classmethod
    def make_strict_op(cls, **kwargs) -> NativeOp:
        """The op that raises ``ValueError`` on out-of-range indices instead of skipping / clipping them."""
        return cls.make_op(c_fw_code=cls.c_fw_code_strict, **kwargs)


class SubtensorBatchedIndex(_SparseOpGen, kernel="subtensor_batched_index"):
    """``y[t, b] = x[t, b, clip(trunc(idx[t, b]), 0, D - 1)]``.

    Inputs: ``x`` (T, B, D) float (any strides); ``idx`` (T, B) indices as floats
    (no gradient).  Output: ``y`` (T, B).  Gradient w.r.t. ``x``: zeros, with
    ``D_y[t, b]`` at the selected entry.  ``D = 0`` with ``T * B > 0`` raises
    ``ValueError``; the strict variant raises for indices outside ``[0, D)``.
    """

    in_info = (
        input_entry("x", 3, differentiable=True, contiguous=False, batch_axis=1,
                    bw_out_var={"fully_written": True}),
        input_entry("idx", 2, contiguous=False, batch_axis=1),
    )
    out_info = (output_entry("y", dims_of(0, 2), contiguous=False, batch_axis=1),)

    @classmethod
    def grad_input_map(cls, x, idx, y, DY):
        return x, idx, DY


#: The COO entries of SparseToDense and SparseToDenseZeros (their inputs 1 to 4; the gradient op gets s0, s1, mask
#: and D_W, so D_weight is shaped like its input 0).
_S2D_ENTRIES = (
    _coo("s0"),
    _coo("s1"),
    input_entry("weight", 2, differentiable=True, batch_axis=1,
                bw_out_var={"shape": dims_of(0, 2), "batch_axis": 1}),
    _coo("mask"),
)


class SparseToDense(_SparseOpGen, kernel="sparse_to_dense"):
    """COO -> dense: ``W = _initial_W``, then ``W[s0[i,b], b, s1[i,b]] += weight[i,b]``
    for every entry that counts (``mask >= 0.1``); duplicates add up (atomics on the GPU).

    Inputs: ``_initial_W`` (T, B, D) (becomes ``W``), ``s0`` (time indices),
    ``s1`` (dim indices), ``weight``, ``mask``: (N, B).  Output ``W`` (T, B, D).
    Out-of-range entries are skipped (strict variant: ``ValueError``).
    Gradients: ``D_initial_W = D_W``; ``D_weight[i, b] = D_W[s0, b, s1]`` for the
    entries that were added, else 0; ``s0``, ``s1``, ``mask`` have none.
    """

    in_info = (
        input_entry("_initial_W", 3, differentiable=True, batch_axis=1, want_inplace=0,
                    bw_out_var={"shape": dims_of(3, 3), "batch_axis": 1}),
        *_S2D_ENTRIES,
    )
    out_info = (
        output_entry("W", dims_of(0, 3), contiguous=False, batch_axis=1,
                     bw_grad_var={"want_inplace": 0, "need_contiguous": True}),
    )

    @classmethod
    def grad_input_map(cls, _initial_W, s0, s1, weight, mask, W, DW):
        return s0, s1, mask, DW


class SparseToDenseZeros(_SparseOpGen, kernel="sparse_to_dense_zeros"):
    """:class:`SparseToDense` starting from zeros (what :func:`sparse_to_dense` uses): ``W`` is a fresh output
    that the kernel writes whole, zeroing it block by block just before adding that block's entries (no
    ``(T, B, D)`` input to allocate and fill, and each block is in the cache when its entries arrive; from 32 MiB
    up the system zeroes it, see docs/sparse.md).

    Inputs: ``_shape_of_W`` (T, 0, D), of which only the shape is read (its dims 0 and 2 size ``W``), then
    ``s0``, ``s1``, ``weight``, ``mask`` (N, B) as for :class:`SparseToDense`.  Output ``W`` (T, B, D).
    Gradient: ``D_weight`` as for :class:`SparseToDense`; the other inputs have none.
    """

    in_info = (input_entry("_shape_of_W", 3, contiguous=False), *_S2D_ENTRIES)
    out_info = (
        output_entry("W", ((0, 0), (1, 1), (0, 2)), batch_axis=1, fully_written=True,
                     bw_grad_var={"need_contiguous": True}),
    )

    @classmethod
    def grad_input_map(cls, _shape_of_W, s0, s1, weight, mask, W, DW):
        return s0, s1, mask, DW


class MaxAndArgmaxSparse(_SparseOpGen, kernel="max_and_argmax_sparse", backward=False):
    """Max and argmax over the dim axis of a COO matrix ``W[s0, b, s1] = weight``.

    Inputs: ``s0``, ``s1``, ``weight``, ``mask`` (N, B); ``_out_max``, ``_out_arg``
    (T, B): the initial values, which become the outputs.  Per batch entry, in
    order of i, an entry that counts with ``t = s0`` in range replaces
    ``out_max[t, b]`` and sets ``out_arg[t, b] = trunc(s1)`` when its weight is
    strictly greater (so the first of equal maxima wins, and with zero-initialised
    buffers negative weights never win).  ``s1`` is not range-checked (there is no
    dim size).  No gradient.  Out-of-range ``s0``: skipped (strict: ``ValueError``).
    """

    in_info = (
        _coo("s0"),
        _coo("s1"),
        input_entry("weight", 2, differentiable=True, batch_axis=1),
        _coo("mask"),
        _coo("_out_max", want_inplace=0),
        _coo("_out_arg", want_inplace=1),
    )
    out_info = (
        output_entry("out_max", dims_of(4, 2), contiguous=False, batch_axis=1),
        output_entry("out_arg", dims_of(5, 2), contiguous=False, batch_axis=1),
    )


class CrossEntropySoftmaxSparseOp(NativeOp):
    """The NativeOp of :class:`CrossEntropySoftmaxAndGradientZSparse`: its gradient
    flows from ``out_ce`` only (a gradient into ``out_grad_z`` is not implemented)."""

    def pullback(self, inputs, outputs, cotangents):
        if any(not isinstance(g.type, DisconnectedType) for g in cotangents[1:]):
            return [
                disconnected_type() if info.get("gradient") == "disconnected"
                else grad_not_implemented(self, i, inputs[i], "only the gradient from out_ce is implemented")
                for i, info in enumerate(self.in_info)
            ]
        return super().pullback(inputs, outputs, cotangents)


class CrossEntropySoftmaxAndGradientZSparse(_SparseOpGen, kernel="crossentropy_softmax_sparse"):
    """Cross entropy of ``softmax(z)`` against sparse soft targets, and its gradient.

    Inputs: ``z`` (T, B, D) logits; ``z_mask`` (T, B) (a frame counts where
    ``z_mask > 0.5``); ``y_target_t`` (time), ``y_target_i`` (class),
    ``y_target_w`` (weight), ``y_target_mask`` (N, B).

    Outputs, on counted frames (0 elsewhere):
      * ``out_ce`` (T, B) ``= -sum_j y[t,b,j] * log_softmax(z[t,b])_j`` (positive),
        where ``y`` is the dense target (duplicate entries add up);
      * ``out_grad_z`` (T, B, D) ``= softmax(z[t,b]) - y[t,b]``;
      * ``_out_max_z`` (T, B): ``max_j z[t,b,j]`` (a by-product).
    Entries out of range or on uncounted frames are skipped (strict variant:
    out-of-range raises ``ValueError``).  ``log_softmax`` is computed as
    ``z - logsumexp(z)`` (no clamping).

    Gradient from ``out_ce``: ``D_z = D_ce * (sum_j y_j * softmax(z) - y)`` (equal to
    ``D_ce * out_grad_z`` when the targets sum to 1) and ``D_y_target_w =
    -D_ce * log_softmax(z)_j``; the indices and masks have none.
    """

    in_info = (
        input_entry("z", 3, differentiable=True, batch_axis=1),
        _coo("z_mask"),
        _coo("y_target_t"),
        _coo("y_target_i"),
        input_entry("y_target_w", 2, differentiable=True, batch_axis=1),
        _coo("y_target_mask"),
    )
    out_info = (
        output_entry("out_ce", dims_of(0, 2), contiguous=False, batch_axis=1),
        output_entry("out_grad_z", dims_of(0, 3), contiguous=False, batch_axis=1),
        output_entry("_out_max_z", dims_of(0, 2), contiguous=False, batch_axis=1),
    )

    @classmethod
    def grad_input_map(cls, z, z_mask, y_t, y_i, y_w, y_mask, ce, grad_z, max_z, D_ce, D_grad_z, D_max_z):
        return z, z_mask, y_t, y_i, y_w, y_mask, D_ce

    op_class = CrossEntropySoftmaxSparseOp


# ---------------------------------------------------------------- functional API
def _float_dtype(*xs):
    dtypes = {x.dtype for x in xs if x.dtype.startswith("float")}
    return "float64" if "float64" in dtypes else "float32" if dtypes else config.floatX


def _entries(fn, dtype, **arrays):
    """The (N, B) COO arrays, cast to ``dtype``."""
    return [real_tensor(fn, name, a, 2, dtype) for name, a in arrays.items()]


def _op(cls, strict):
    return cls.make_strict_op() if strict else cls.make_op()


def subtensor_batched_index(x, idx, strict=False):
    """``y[t, b] = x[t, b, idx[t, b]]`` (batched gather along the last axis).

    Parameters
    ----------
    x : (T, B, D) float32/float64, or (T, D), treated as one batch entry.
    idx : (T, B) (or (T,) for 2-D x) indices, any real dtype (cast to x's float
        dtype, so float32 holds them exactly up to 2**24).
    strict : bool
        False (default): an index is truncated toward zero and clipped to
        ``[0, D - 1]`` (NaN -> 0).  True: an index outside ``(-1, D)`` raises ``ValueError``.

    Returns ``y`` (T, B) (or (T,)), x's dtype.  Differentiable w.r.t. ``x``: the
    gradient scatters ``D_y`` into zeros at the selected entries.  Raises
    ``ValueError`` for wrong ndim, mismatched shapes, or ``D = 0`` with ``T * B > 0``.

    Example::

        y = ptnative.subtensor_batched_index(log_probs, labels)   # (T, B)
    """
    fn = "subtensor_batched_index"
    x = float_tensor(fn, "x", x, (2, 3))
    idx = real_tensor(fn, "idx", idx, x.ndim - 1, x.dtype)
    op = _op(SubtensorBatchedIndex, strict)
    if x.ndim == 2:
        return op(x[:, None, :], idx[:, None])[:, 0]
    return op(x, idx)


def sparse_to_dense(s0, s1, weight, mask, n_time, n_dim, strict=False):
    """Dense ``W`` (n_time, n_batch, n_dim) from COO entries: ``W[s0[i,b], b, s1[i,b]] += weight[i,b]``.

    Parameters
    ----------
    s0, s1 : (N, B) time and dim indices (any real dtype).
    weight : (N, B) values; W gets weight's float dtype (floatX if weight is not floating).
    mask : (N, B): an entry counts where ``mask >= 0.1``.
    n_time, n_dim : int or integer scalar tensors.
    strict : bool
        False (default): out-of-range entries are skipped.  True: they raise ``ValueError``.

    Duplicates add up (also on the GPU).  Differentiable w.r.t. ``weight``
    (``D_weight[i, b] = D_W[s0, b, s1]`` for added entries, else 0).

    Example::

        W = ptnative.sparse_to_dense(t_idx, labels, ones, mask, n_time=T, n_dim=n_classes)
    """
    fn = "sparse_to_dense"
    weight = real_tensor(fn, "weight", weight, 2)
    dtype = _float_dtype(weight)
    s0, s1, weight, mask = _entries(fn, dtype, s0=s0, s1=s1, weight=weight, mask=mask)
    n_time, n_dim = int_size(fn, "n_time", n_time, 0), int_size(fn, "n_dim", n_dim, 0)
    shape_of_W = pt.zeros((n_time, 0, n_dim), dtype=dtype)  # no elements: W is a fresh output (SparseToDenseZeros)
    return _op(SparseToDenseZeros, strict)(shape_of_W, s0, s1, weight, mask)


def max_and_argmax_sparse(s0, s1, weight, mask, out_max, out_arg, strict=False):
    """Max and argmax over the dim axis of the COO matrix ``W[s0[i,b], b, s1[i,b]] = weight[i,b]``.

    Parameters
    ----------
    s0, s1, weight, mask : (N, B); entries count where ``mask >= 0.1``.
    out_max, out_arg : (T, B) initial values (typically zeros); the result starts from them.
    strict : bool
        False (default): entries with ``s0`` out of ``[0, T)`` are skipped.  True: ``ValueError``.

    Returns ``(out_max, out_arg)`` (T, B), floats: per frame the largest weight
    strictly above the initial value (the first of equal ones) and its ``trunc(s1)``.
    No gradient.

    Example::

        m, a = ptnative.max_and_argmax_sparse(s0, s1, w, mask, pt.zeros((T, B)), pt.zeros((T, B)))
    """
    fn = "max_and_argmax_sparse"
    out_max, weight = real_tensor(fn, "out_max", out_max, 2), real_tensor(fn, "weight", weight, 2)
    dtype = _float_dtype(weight, out_max)
    s0, s1, weight, mask = _entries(fn, dtype, s0=s0, s1=s1, weight=weight, mask=mask)
    out_max, out_arg = _entries(fn, dtype, out_max=out_max, out_arg=out_arg)
    return tuple(_op(MaxAndArgmaxSparse, strict)(s0, s1, weight, mask, out_max, out_arg))


def crossentropy_softmax_and_gradient_z_sparse(z, z_mask, y_target_t, y_target_i, y_target_w, y_target_mask,
                                               strict=False):
    """Cross entropy of ``softmax(z)`` against sparse (COO) soft targets, with its gradient.

    Parameters
    ----------
    z : (T, B, D) float32/float64 logits.
    z_mask : (T, B): a frame counts where ``z_mask > 0.5``.
    y_target_t, y_target_i, y_target_w, y_target_mask : (N, B): target entry
        ``y[t, b, i] += w`` (time, class, weight), counted where ``y_target_mask >= 0.1``.
    strict : bool
        False (default): entries out of range are skipped.  True: they raise ``ValueError``.

    Returns
    -------
    ce : (T, B) ``-sum_i y[t,b,i] * log_softmax(z[t,b])_i`` (>= 0 for non-negative y), 0 on uncounted frames.
    grad_z : (T, B, D) ``softmax(z[t,b]) - y[t,b]``, 0 on uncounted frames.

    ``pytensor.grad`` through ``ce`` is exact (w.r.t. ``z`` and ``y_target_w``);
    a gradient into ``grad_z`` is not implemented.

    Example::

        ce, grad_z = ptnative.crossentropy_softmax_and_gradient_z_sparse(z, mask, t_idx, labels, ones, lab_mask)
    """
    fn = "crossentropy_softmax_and_gradient_z_sparse"
    z = float_tensor(fn, "z", z, 3)
    z_mask, y_t, y_i, y_w, y_m = _entries(fn, z.dtype, z_mask=z_mask, y_target_t=y_target_t, y_target_i=y_target_i,
                                          y_target_w=y_target_w, y_target_mask=y_target_mask)
    ce, grad_z, _ = _op(CrossEntropySoftmaxAndGradientZSparse, strict)(z, z_mask, y_t, y_i, y_w, y_m)
    return ce, grad_z


def onehot_to_sparse(y, mask):
    """Dense labels -> the sparse format of these ops: ``(t_index, y, ones, mask)``.

    ``y`` (T, B) integer labels and ``mask`` (T, B); returns four (T, B) arrays
    (N = T entries per batch entry): ``t_index[t, b] = t``, ``y``, ones (floatX),
    and the mask, ready for :func:`sparse_to_dense` or
    :func:`crossentropy_softmax_and_gradient_z_sparse`.
    """
    y, mask = tensor("onehot_to_sparse", "y", y, 2), tensor("onehot_to_sparse", "mask", mask, 2)
    t_index = pt.cast(pt.arange(y.shape[0])[:, None] + pt.zeros_like(y), y.dtype)
    return t_index, y, pt.ones_like(y, dtype=config.floatX), mask
