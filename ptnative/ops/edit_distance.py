"""Edit-distance ops (kernels in ``c_code/edit_distance/edit_distance.cu``).

All inputs and outputs are int32; sequences are batch-major ``(B, T)`` arrays
with a length per batch entry (entries past the length are ignored).  ``D[i, j]``
below is the Levenshtein distance between ``a[:i]`` and ``b[:j]`` (unit costs
for insertion, deletion and substitution).  None of these ops has a gradient.

On the CPU a bit-parallel algorithm (Myers / Hyyro, 64 DP cells per word
operation) computes whole DP rows; the CUDA build sweeps the DP table along
anti-diagonals.  Both give the same integers.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt

from ..op import NativeOpGenBase
from ..source import kernel_unit
from ._args import flag, host_int32_scalar, input_entry, int32_scalar, int_tensor, output_entry, python_int

_SUPPORT = {"edit_distance": kernel_unit("edit_distance/edit_distance.cu")}


__all__ = [
    "EditDistanceOp", "OptimalCompletionEditDistanceOp", "OptimalCompletionEditDistancePerSuccessorOp",
    "NextEditDistanceRowOp", "NextEditDistanceReduceOp", "edit_distance", "optimal_completion_edit_distance",
    "optimal_completion_edit_distance_per_successor", "next_edit_distance_row", "next_edit_distance_reduce",
]

def _seq(name, batch=True):
    """A (B, T) int32 input (``batch``: its axis 0 is the batch axis)."""
    return input_entry(name, 2, dtype="int32", batch_axis=0 if batch else None)


def _vec(name, batch=True):
    """A (B,) int32 input (``batch``: one per sequence), or (L,) shared by all (``batch=False``)."""
    return input_entry(name, 1, dtype="int32", batch_axis=0 if batch else None)


#: The (B,) int32 output of the distances, one per pair.
_DISTANCES = output_entry("output", ((0, 0),), dtype="int32", batch_axis=0)


class _EditDistanceBase(NativeOpGenBase):
    c_extra_support_code = _SUPPORT
    code_version = (1,)
    float_dtypes = ("float32",)  # no floating data: compile once


class EditDistanceOp(_EditDistanceBase):
    """Levenshtein distance of each pair of sequences.

    Inputs: ``a`` (B, Ta), ``a_len`` (B), ``b`` (B, Tb), ``b_len`` (B), all int32.
    Output: ``output`` (B,) int32, ``D[a_len, b_len]``.
    A length outside ``[0, T]`` raises ``ValueError``.
    """

    in_info = (_seq("a"), _vec("a_len"), _seq("b"), _vec("b_len"))
    out_info = (_DISTANCES,)
    c_fw_code = "edit_distance_fw(n_inputs, inputs, n_outputs, outputs);"


class OptimalCompletionEditDistanceOp(_EditDistanceBase):
    """Optimal-completion edit distance: ``min_{n <= b_len} D[a_len, n]``.

    The distance of ``a`` to the best prefix of ``b`` (how far a partial
    hypothesis ``a`` is from any completion into ``b``).  Same inputs and
    output as :class:`EditDistanceOp`.
    """

    in_info = EditDistanceOp.in_info
    out_info = EditDistanceOp.out_info
    c_fw_code = "optimal_completion_edit_distance_fw(n_inputs, inputs, n_outputs, outputs);"


class OptimalCompletionEditDistancePerSuccessorOp(_EditDistanceBase):
    """``OCD(a + [s], b)`` for every successor label ``s``.

    Inputs: ``a``, ``a_len``, ``b``, ``b_len`` as in :class:`EditDistanceOp`,
    ``successors`` (L,) int32.  Output: ``output`` (B, L) int32.
    """

    in_info = EditDistanceOp.in_info + (_vec("successors", batch=False),)
    out_info = (output_entry("output", ((0, 0), (4, 0)), dtype="int32", batch_axis=0),)
    c_fw_code = "optimal_completion_edit_distance_per_successor_fw(n_inputs, inputs, n_outputs, outputs);"


class NextEditDistanceRowOp(_EditDistanceBase):
    """One DP row step: the row of ``a + [label]`` from the row of ``a``.

    Inputs: ``last_row`` (B, Tb+1), ``a`` (B,) the new labels, ``a_n`` (B,) the
    length of ``a`` before this step, ``a_ended`` (B,) nonzero where the
    hypothesis has ended, ``b`` (B, Tb), ``b_len`` (B,).  Output (B, Tb+1):
    where not ended, ``next[0] = a_n + 1`` and for ``1 <= t <= b_len``
    ``next[t] = min(last[t] + 1, next[t-1] + 1, last[t-1] + [label != b[t-1]])``;
    where ended, ``next[t] = last[t]``.  Entries ``t > b_len`` repeat
    ``next[b_len]``, so ``row[:, -1]`` is the edit distance and ``row.min(1)``
    the optimal-completion distance.  Start from ``last_row = range(Tb+1)``.
    """

    in_info = (
        _seq("last_row"), _vec("a"), _vec("a_n"), _vec("a_ended"), _seq("b"), _vec("b_len"),
    )
    out_info = (output_entry("output", ((0, 0), (0, 1)), dtype="int32", batch_axis=0),)
    c_fw_code = "next_edit_distance_row_fw(n_inputs, inputs, n_outputs, outputs);"


class NextEditDistanceReduceOp(_EditDistanceBase):
    """The next DP row for each candidate label, reduced to one number.

    Inputs: ``last_row`` (B, Tb+1), ``a`` (B, L) or (1, L) candidate labels
    (one row is shared by all batch entries), ``a_n``, ``a_ended``, ``b``,
    ``b_len`` as in :class:`NextEditDistanceRowOp`, and two host int32 scalars
    ``optimal_completion`` and ``a_blank_idx``.  Output (B, L): for each
    candidate, its next row's ``min(next[0..b_len])`` (optimal completion) or
    ``next[b_len]``; a candidate equal to ``a_blank_idx``, and every candidate
    of an ended entry, keeps ``last_row`` (its min or ``last_row[b_len]``).
    """

    # ``a`` (1, L) is shared by the batch, so ``a`` has no batch axis, and the output none: jax.vmap maps this op
    # one call per element (folding would need to know which form ``a`` has).
    in_info = NextEditDistanceRowOp.in_info[:1] + (_seq("a", batch=False),) + NextEditDistanceRowOp.in_info[2:] + (
        host_int32_scalar("optimal_completion"), host_int32_scalar("a_blank_idx"))
    out_info = (output_entry("output", ((0, 0), (1, 1)), dtype="int32"),)
    c_fw_code = "next_edit_distance_reduce_fw(n_inputs, inputs, n_outputs, outputs);"


# ---------------------------------------------------------------- functional API
def _pairs(a, a_len, b, b_len, fn):
    return (int_tensor(fn, "a", a, 2), int_tensor(fn, "a_len", a_len, 1), int_tensor(fn, "b", b, 2),
            int_tensor(fn, "b_len", b_len, 1))


def edit_distance(a, a_len, b, b_len):
    """Levenshtein distance between ``a[i, :a_len[i]]`` and ``b[i, :b_len[i]]``.

    Parameters
    ----------
    a : (B, Ta) int tensor;  a_len : (B,) int tensor
    b : (B, Tb) int tensor;  b_len : (B,) int tensor
        Label sequences (any int32 values) and their lengths, ``0 <= len <= T``.

    Returns
    -------
    (B,) int32 tensor of unnormalised distances (insertion, deletion and
    substitution cost 1 each).

    Raises ``ValueError`` for a wrong ndim and ``TypeError`` for a dtype that
    is not an integer one (bool included; other int dtypes are cast to int32)
    when the graph is built, both naming the function and the argument, and
    ``ValueError`` at run time for mismatched batch sizes or a length outside
    ``[0, T]``.

    >>> d = edit_distance(a, a_len, b, b_len)   # doctest: +SKIP
    """
    return EditDistanceOp.make_op()(*_pairs(a, a_len, b, b_len, "edit_distance"))


def optimal_completion_edit_distance(a, a_len, b, b_len):
    """``min_{n <= b_len[i]} ED(a[i, :a_len[i]], b[i, :n])``, shape (B,), int32.

    The distance of the (partial) sequence ``a`` to the closest prefix of
    ``b``.  Arguments and errors as in :func:`edit_distance`.
    """
    return OptimalCompletionEditDistanceOp.make_op()(*_pairs(a, a_len, b, b_len, "optimal_completion_edit_distance"))


def optimal_completion_edit_distance_per_successor(a, a_len, b, b_len, successors):
    """``out[i, k] = OCD(a[i, :a_len[i]] + [successors[k]], b[i, :b_len[i]])``, shape (B, L), int32.

    ``successors`` is an (L,) int tensor of labels, or a Python int ``L``
    meaning ``range(L)``.  Arguments and errors as in :func:`edit_distance`.
    """
    fn = "optimal_completion_edit_distance_per_successor"
    if isinstance(successors, int | np.integer) and not isinstance(successors, bool):
        successors = np.arange(python_int(fn, "successors", successors, 0), dtype="int32")
    succ = int_tensor(fn, "successors", successors, 1)
    return OptimalCompletionEditDistancePerSuccessorOp.make_op()(*_pairs(a, a_len, b, b_len, fn), succ)


def _next_inputs(last_row, a_n, a_ended, b, b_len, fn):
    last_row = int_tensor(fn, "last_row", last_row, 2)
    a_n = int_tensor(fn, "a_n", a_n, (0, 1))
    if a_n.ndim == 0:
        a_n = pt.alloc(a_n, last_row.shape[0])
    return (last_row, a_n, int_tensor(fn, "a_ended", a_ended, 1, allow_bool=True), int_tensor(fn, "b", b, 2),
            int_tensor(fn, "b_len", b_len, 1))


def next_edit_distance_row(last_row, a, a_n, a_ended, b, b_len):
    """One step of the edit-distance DP, for incremental (beam-search) use.

    Parameters
    ----------
    last_row : (B, Tb+1) int tensor
        The current row ``D[a_n, 0..Tb]``; initially ``range(Tb+1)`` per entry.
    a : (B,) int tensor
        The label appended in this step.
    a_n : (B,) int tensor or int scalar (tiled)
        The length of the hypothesis before this step.
    a_ended : (B,) int/bool tensor
        Nonzero where the hypothesis has ended (the row is kept).
    b : (B, Tb) int tensor;  b_len : (B,) int tensor, ``0 <= b_len <= Tb``.

    Returns
    -------
    (B, Tb+1) int32: the next row, with entries past ``b_len`` equal to the one
    at ``b_len``; so after the last step ``row[:, -1]`` is the edit distance
    and ``row.min(axis=1)`` the optimal-completion distance.

    Raises ``ValueError`` for a wrong ndim, ``TypeError`` for a non-integer
    dtype (bool is accepted for ``a_ended`` only) and ``ValueError`` at run time
    for mismatched shapes (``last_row.shape[1] != Tb + 1``) or bad lengths.
    """
    fn = "next_edit_distance_row"
    last_row, a_n, a_ended, b, b_len = _next_inputs(last_row, a_n, a_ended, b, b_len, fn)
    return NextEditDistanceRowOp.make_op()(last_row, int_tensor(fn, "a", a, 1), a_n, a_ended, b, b_len)


def next_edit_distance_reduce(last_row, a, a_n, a_ended, b, b_len, optimal_completion=False, a_blank_idx=-1):
    """For each candidate label, the next DP row reduced to one number.

    Parameters
    ----------
    last_row, a_n, a_ended, b, b_len
        As in :func:`next_edit_distance_row`.
    a : (B, L) or (1, L) int tensor
        Candidate labels (one shared row with a leading dim of 1).
    optimal_completion : bool
        Reduce each next row by its minimum over ``0..b_len`` (the
        optimal-completion distance) instead of taking ``next[b_len]``.
    a_blank_idx : int
        A candidate equal to this label does not extend the hypothesis (its
        value comes from ``last_row``); -1 (default) for none.

    Returns
    -------
    (B, L) int32; ended entries give the ``last_row`` value for every candidate.
    Errors as in :func:`next_edit_distance_row`; ``a.shape[0]`` must be 1 or B.
    """
    fn = "next_edit_distance_reduce"
    last_row, a_n, a_ended, b, b_len = _next_inputs(last_row, a_n, a_ended, b, b_len, fn)
    oc = flag(fn, "optimal_completion", optimal_completion)
    blank = int32_scalar(fn, "a_blank_idx", a_blank_idx)
    return NextEditDistanceReduceOp.make_op()(last_row, int_tensor(fn, "a", a, 2), a_n, a_ended, b, b_len, oc, blank)
