"""Chunking / UnChunking: cut the time axis into overlapping chunks and put them
back together (kernels in ``c_code/chunking/chunking.cu``).

Layout: a sequence batch ``(n_time, n_batch, n_dim)`` becomes
``(chunk_size, n_batch * n_chunks, n_dim)``, chunk ``c`` of sequence ``b`` in
column ``b * n_chunks + c`` (batch-major), its frame ``x`` being time frame
``c * chunk_step + x``, with
``n_chunks = max(n_time - chunk_size + chunk_step - 1, 0) // chunk_step + 1``.
"""

from __future__ import annotations

import numbers

import pytensor.tensor as pt

from ..op import NativeOpGenBase
from ..source import kernel_unit
from ._args import dims_of, float_tensor, input_entry, int_size, output_entry, python_int, real_tensor

__all__ = ["Chunking", "UnChunking", "chunk", "unchunk", "naive_chunk_start_frames", "n_chunks"]

_SUPPORT = {"chunking": kernel_unit("chunking/chunking.cu")}


class Chunking(NativeOpGenBase):
    """Time ``(T, B, D)`` -> overlapping chunks ``(chunk_size, B * n_chunks, D)``.

    Inputs: ``input`` (T, B, D) float; ``index`` (T, B) mask (a frame counts where
    ``index > 0.1``); ``output_buffer`` (chunk_size, B * n_chunks, D) and
    ``oindex_buffer`` (chunk_size, B * n_chunks), which fix the output shapes and
    become the outputs (every element is overwritten); ``chunk_params`` (2,) =
    ``[chunk_size, chunk_step]`` (positive integers, as floats).

    Outputs: ``output[x, b * n_chunks + c] = input[c * chunk_step + x, b]`` where
    that frame exists and counts, else 0; ``oindex`` is 1 there, else 0.

    Gradient (``input`` only): the sum, over the chunks that copied a frame, of
    their output gradient.  Shape mismatches (including a buffer that does not
    match ``n_chunks``) and non-integer or non-positive chunk params raise
    ``ValueError``.
    """

    in_info = (
        input_entry("input", 3, differentiable=True, contiguous=False),
        input_entry("index", 2, contiguous=False),
        input_entry("output_buffer", 3, contiguous=False, want_inplace=0),
        input_entry("oindex_buffer", 2, contiguous=False, want_inplace=1),
        input_entry("chunk_params", 1, shape=(2,)),
    )
    out_info = (
        output_entry("output", dims_of(2, 3), contiguous=False),
        output_entry("oindex", dims_of(3, 2), contiguous=False),
    )

    @classmethod
    def grad_input_map(cls, input, index, output_buffer, oindex_buffer, chunk_params, output, oindex, D_output,
                       D_oindex):
        return input, chunk_params, oindex, D_output

    c_extra_support_code = _SUPPORT
    c_fw_code = "chunking_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "chunking_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (2,)

    @staticmethod
    def naive_chunk_start_frames(n_time, chunk_size, chunk_step):
        """See :func:`naive_chunk_start_frames`."""
        return naive_chunk_start_frames(n_time, chunk_size, chunk_step)


class UnChunking(NativeOpGenBase):
    """Overlapping chunks ``(chunk_size, B * n_chunks, D)`` -> time ``(T, B, D)``, the
    mean over the overlapping chunks that count (the inverse of :class:`Chunking`).

    Inputs: ``input`` (chunk_size, B * n_chunks, D); ``index`` (chunk_size,
    B * n_chunks) (a chunk frame counts where ``index > 0.1``); ``output_buffer``
    (T, B, D), ``oindex_buffer`` (T, B), ``ofactors_buffer`` (T, B), which fix the
    output shapes and become the outputs; ``chunk_params`` (2,).

    Outputs: ``output[t, b]`` = mean of ``input[t - c * chunk_step, b * n_chunks + c]``
    over the chunks c covering t whose frame counts (0 without any);
    ``oindex[t, b]`` = 1 if any counted, else 0; ``ofactors[t, b]`` = 1 / count, or 1.

    Gradient (``input`` only): ``D_input[x, y] = D_output[t, b] * ofactors[t, b]``
    where ``index[x, y] > 0.1`` and t < T, else 0.  Errors as for :class:`Chunking`.
    """

    in_info = Chunking.in_info[:4] + (
        input_entry("ofactors_buffer", 2, contiguous=False, want_inplace=2),
    ) + Chunking.in_info[4:]
    out_info = (
        output_entry("output", dims_of(2, 3), contiguous=False),
        output_entry("oindex", dims_of(3, 2), contiguous=False),
        output_entry("ofactors", dims_of(4, 2), contiguous=False),
    )

    @classmethod
    def grad_input_map(cls, input, index, output_buffer, oindex_buffer, ofactors_buffer, chunk_params, output,
                       oindex, ofactors, D_output, D_oindex, D_ofactors):
        return input, index, chunk_params, ofactors, D_output

    c_extra_support_code = _SUPPORT
    c_fw_code = "unchunking_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "unchunking_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (2,)


# ---------------------------------------------------------------- functional API
def n_chunks(n_time, chunk_size, chunk_step):
    """``max(n_time - chunk_size + chunk_step - 1, 0) // chunk_step + 1`` (ints or symbolic)."""
    if all(isinstance(v, numbers.Integral) for v in (n_time, chunk_size, chunk_step)):
        python_int("n_chunks", "chunk_step", chunk_step, 1)
        return max(n_time - chunk_size + chunk_step - 1, 0) // chunk_step + 1
    return pt.maximum(n_time - chunk_size + chunk_step - 1, 0) // chunk_step + 1


def naive_chunk_start_frames(n_time, chunk_size, chunk_step):
    """The start frames of the chunks, as a list: 0, then every ``chunk_step``
    frames until a chunk reaches the end (``start + chunk_size >= n_time``).
    ``len(result) == n_chunks(n_time, chunk_size, chunk_step)``; ``n_time = 0``
    gives ``[0]``.  Plain Python ints; ``ValueError`` for a non-positive size or step.

    >>> naive_chunk_start_frames(100, 50, 10)
    [0, 10, 20, 30, 40, 50]
    """
    n_time, chunk_size, chunk_step = int(n_time), int(chunk_size), int(chunk_step)
    for name, value, minimum in (("n_time", n_time, 0), ("chunk_size", chunk_size, 1), ("chunk_step", chunk_step, 1)):
        if value < minimum:
            raise ValueError(f"naive_chunk_start_frames: {name} must be >= {minimum}, got {value}")
    starts = [0]
    while starts[-1] + chunk_size < n_time:
        starts.append(starts[-1] + chunk_step)
    return starts


def _params(chunk_size, chunk_step, dtype):
    return pt.cast(pt.stack([pt.as_tensor_variable(chunk_size), pt.as_tensor_variable(chunk_step)]), dtype)


def _checked(fn, x, index, chunk_size, chunk_step):
    """The arguments :func:`chunk` and :func:`unchunk` share, checked (errors naming ``fn``)."""
    x = float_tensor(fn, "x", x, 3)
    return (x, real_tensor(fn, "index", index, 2, x.dtype), int_size(fn, "chunk_size", chunk_size, 1),
            int_size(fn, "chunk_step", chunk_step, 1))


def chunk(x, index, chunk_size, chunk_step):
    """Cut the time axis into overlapping chunks.

    Parameters
    ----------
    x : (n_time, n_batch, n_dim) float32 or float64
    index : (n_time, n_batch) mask (any real or bool dtype); a frame counts where ``index > 0.1``.
    chunk_size, chunk_step : positive int (or integer scalar tensors)

    Returns
    -------
    out : (chunk_size, n_batch * n_chunks, n_dim), x's dtype.
        ``out[i, b * n_chunks + c] = x[c * chunk_step + i, b]`` where that frame
        exists and counts, else 0.
    oindex : (chunk_size, n_batch * n_chunks), x's dtype: 1 where ``out`` holds a frame, else 0.

    Differentiable w.r.t. ``x``: a frame's gradient is the sum over the chunks
    that hold it.  ``unchunk(out, oindex, chunk_size, chunk_step, n_time, n_batch)[0]``
    gives back ``x`` on the frames that count (0 elsewhere), with an identity
    gradient there.  Raises ``ValueError``/``TypeError`` for wrong ndim, dtype or
    non-positive sizes (and ``ValueError`` at run time for mismatched shapes).

    Example::

        out, oindex = ptnative.chunk(x, mask, chunk_size=50, chunk_step=25)
    """
    x, index, chunk_size, chunk_step = _checked("chunk", x, index, chunk_size, chunk_step)
    n_time, n_batch, n_dim = x.shape
    nc = n_chunks(n_time, chunk_size, chunk_step)
    out_buf = pt.zeros((chunk_size, n_batch * nc, n_dim), dtype=x.dtype)
    oindex_buf = pt.zeros((chunk_size, n_batch * nc), dtype=x.dtype)
    out, oindex = Chunking.make_op()(x, index, out_buf, oindex_buf, _params(chunk_size, chunk_step, x.dtype))
    return out, oindex


def unchunk(x, index, chunk_size, chunk_step, n_time, n_batch):
    """Put chunks back on the time axis, averaging overlaps (the inverse of :func:`chunk`).

    Parameters
    ----------
    x : (chunk_size, n_batch * n_chunks, n_dim) float32 or float64
    index : (chunk_size, n_batch * n_chunks) mask; a chunk frame counts where ``index > 0.1``.
    chunk_size, chunk_step : positive int (or integer scalar tensors)
    n_time, n_batch : int or integer scalar tensors; ``x.shape[1]`` must equal
        ``n_batch * n_chunks(n_time, chunk_size, chunk_step)`` (else ``ValueError`` at run time).

    Returns
    -------
    out : (n_time, n_batch, n_dim): per frame, the mean over the chunks covering it whose frame counts (0 if none).
    oindex : (n_time, n_batch): 1 where at least one chunk counted, else 0.
    factors : (n_time, n_batch): 1 / (number of counted chunks), or 1 where none.

    Differentiable w.r.t. ``x``: the gradient is the chunk of ``D_out * factors``,
    zero where ``index <= 0.1``.

    Example::

        y, yindex, factors = ptnative.unchunk(chunks, cindex, 50, 25, n_time=x.shape[0], n_batch=x.shape[1])
    """
    x, index, chunk_size, chunk_step = _checked("unchunk", x, index, chunk_size, chunk_step)
    n_time, n_batch = int_size("unchunk", "n_time", n_time, 0), int_size("unchunk", "n_batch", n_batch, 0)
    n_dim = x.shape[2]
    out_buf = pt.zeros((n_time, n_batch, n_dim), dtype=x.dtype)
    oindex_buf = pt.zeros((n_time, n_batch), dtype=x.dtype)
    factors_buf = pt.zeros((n_time, n_batch), dtype=x.dtype)
    out, oindex, factors = UnChunking.make_op()(x, index, out_buf, oindex_buf, factors_buf,
                                                _params(chunk_size, chunk_step, x.dtype))
    return out, oindex, factors
