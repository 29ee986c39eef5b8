"""RNN-Transducer losses, standard and multi-blank (kernels in ``c_code/rnnt/rnnt.cu``).

:class:`MultiBlankRnntLoss` is one native op computing the whole lattice of a
batch (log-softmax denominators, alphas, betas, per-sequence log-likelihood,
costs and the gradient with respect to the logits).  Its gradient is the
kernel's gradient, scaled by the upstream gradient of the costs.  The
functions :func:`multiblank_rnnt_loss`, :func:`rnnt_loss` and
:func:`multiblank_rnnt_lattice` are the user API; ``docs/rnnt.md`` has the
details.
"""

from __future__ import annotations

from collections import namedtuple
from functools import cache

import numpy as np
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorConstant

from ..op import NativeOpGenBase
from ..source import kernel_unit
from ._args import (dims_of, float_tensor, host_int32_scalar, input_entry, int_tensor, output_entry, python_int,
                    real_number)
from ._loss import LossWithGradOp

__all__ = ["MultiBlankRnntLoss", "RnntLossOp", "RnntLattice", "multiblank_rnnt_lattice", "multiblank_rnnt_loss",
           "rnnt_loss"]

#: Most big blanks one op supports (the kernel's RNNT_MAX_BIG_BLANKS; tests/test_constants.py ties them).
MAX_BIG_BLANKS = 32
#: The functions, by the code they pass as ``params[3]``: the kernel's ``names[]`` table, in its order, names them
#: in its messages (tests/test_constants.py ties the two).
RNNT_FUNCTIONS = ("multiblank_rnnt_loss", "rnnt_loss", "multiblank_rnnt_lattice")
REDUCTIONS = ("none", "sum", "mean")


class RnntLossOp(LossWithGradOp):
    """The NativeOp of :class:`MultiBlankRnntLoss`, whose gradient with respect
    to ``acts`` is its ``grads`` output (B, T, U+1, K) times the upstream gradient
    of ``costs`` (per sequence).  No other output is differentiable."""

    grad_batch_axis = 0


class MultiBlankRnntLoss(NativeOpGenBase):
    """Multi-blank RNN-T lattice and loss (standard RNN-T: no big blanks, sigma 0).

    Inputs:
      * ``acts`` (B, T, U+1, K) logits, float32/float64; ``grads`` reuses its buffer when inplace;
      * ``labels`` (B, U') int32, U' >= max(label_lens), zero-padded;
      * ``act_lens`` (B,) int32, ``label_lens`` (B,) int32;
      * ``durations`` (n_big,) int32 (host), big blank i has class ``blank - 1 - i``;
      * ``blank`` () int32 (host);
      * ``params`` (3,) or (4,) float64 (host): ``[sigma, fastemit_lambda, clamp]`` and optionally the
        index of the calling function in :data:`RNNT_FUNCTIONS` (for the error messages).

    Outputs:
      * ``costs`` (B,) ``-(1 + lambda) * loglik``;
      * ``grads`` (B, T, U+1, K) the per-sequence gradient of the logits (seed formula, clamped; 0 on padding);
      * ``loglik`` (B,) log p(labels | acts) from the alphas (arcs weigh ``logp - sigma``);
      * ``alphas``, ``betas`` (B, T, U+1) (0 on padding); ``lognorm`` (B, T, U+1) the log-softmax
        denominator ``logsumexp_k acts`` (0 on padding).

    ``acts`` may be padded beyond the longest sequence (``T >= max(act_lens)``,
    ``U + 1 >= max(label_lens) + 1``, as batch sharding or bucketing produce): the result is
    that of the tight padding, with 0 in the extra cells.  Bad lengths, labels, blank indices,
    durations or parameters raise ``ValueError`` naming the function and the argument.
    """

    in_info = (
        input_entry("acts", 4, differentiable=True, batch_axis=0, want_inplace=1),
        input_entry("labels", 2, dtype="int32", batch_axis=0),
        input_entry("act_lens", 1, dtype="int32", batch_axis=0),
        input_entry("label_lens", 1, dtype="int32", batch_axis=0),
        input_entry("durations", 1, dtype="int32", host_memory=True),
        host_int32_scalar("blank"),
        input_entry("params", 1, dtype="float64", host_memory=True),
    )
    out_info = (
        output_entry("costs", dims_of(0, 1), batch_axis=0),
        output_entry("grads", dims_of(0, 4), batch_axis=0),
        output_entry("loglik", dims_of(0, 1), batch_axis=0),
        output_entry("alphas", dims_of(0, 3), batch_axis=0),
        output_entry("betas", dims_of(0, 3), batch_axis=0),
        output_entry("lognorm", dims_of(0, 3), batch_axis=0),
    )
    c_extra_support_code = kernel_unit("rnnt/rnnt.cu")
    c_fw_code = "rnnt_multiblank_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = None  # the gradient is the `grads` output (RnntLossOp.pullback)
    code_version = (2,)
    op_class = RnntLossOp


@cache
def _op() -> RnntLossOp:
    return MultiBlankRnntLoss.make_op()


#: The outputs of :func:`multiblank_rnnt_lattice`.
RnntLattice = namedtuple("RnntLattice", ["costs", "grads", "loglik", "alphas", "betas", "lognorm"])


def _constant_value(v):
    """The value of a constant tensor, else None."""
    return np.asarray(v.data) if isinstance(v, TensorConstant) else None


def multiblank_rnnt_lattice(acts, labels, act_lens, label_lens, blank, big_blank_durations=(), sigma=0.0,
                            fastemit_lambda=0.0, clamp=-1.0):
    """All outputs of the multi-blank RNN-T op, as an :data:`RnntLattice`
    ``(costs, grads, loglik, alphas, betas, lognorm)``; arguments as in
    :func:`multiblank_rnnt_loss`.  Only ``costs`` is differentiable."""
    return _lattice("multiblank_rnnt_lattice", acts, labels, act_lens, label_lens, blank, big_blank_durations,
                    sigma, fastemit_lambda, clamp)


def _lattice(fn, acts, labels, act_lens, label_lens, blank, big_blank_durations, sigma, fastemit_lambda, clamp):
    """The lattice for the user function ``fn`` (one of :data:`RNNT_FUNCTIONS`), whose name the errors carry."""
    acts = float_tensor(fn, "acts", acts, 4, layout="(B, T, U+1, K)")
    labels = int_tensor(fn, "labels", labels, 2)
    act_lens = int_tensor(fn, "act_lens", act_lens, 1)
    label_lens = int_tensor(fn, "label_lens", label_lens, 1)

    blank = python_int(fn, "blank", blank, maximum=np.iinfo(np.int32).max)
    try:
        if isinstance(big_blank_durations, str | bytes):
            raise TypeError
        items = list(big_blank_durations)
    except TypeError:
        raise TypeError(f"{fn}: big_blank_durations must be a sequence of ints, got "
                        f"{type(big_blank_durations).__name__} {big_blank_durations!r:.60}") from None
    durations = []
    for i, d in enumerate(items):
        d = python_int(fn, f"big_blank_durations[{i}]", d)
        if d < 2:
            raise ValueError(f"{fn}: big_blank_durations[{i}] must be >= 2 (a duration of 1 is the standard blank), "
                             f"got {d}")
        durations.append(d)
    if len(durations) > MAX_BIG_BLANKS:
        raise ValueError(f"{fn}: at most {MAX_BIG_BLANKS} big blanks are supported, got {len(durations)}")
    K = acts.type.shape[3]
    if blank < len(durations) or (K is not None and blank >= K):
        raise ValueError(f"{fn}: blank = {blank} must satisfy {len(durations)} <= blank < K = {K} "
                         f"(big blank i has class blank - 1 - i)")
    sigma = real_number(fn, "sigma", sigma)
    fastemit_lambda = real_number(fn, "fastemit_lambda", fastemit_lambda, minimum=0)
    clamp = real_number(fn, "clamp", clamp)
    if clamp < 0 and clamp != -1.0:
        raise ValueError(f"{fn}: clamp must be >= 0 (0 or -1: no clamping), got {clamp}")

    # Checks on values known now (the kernel repeats them at run time).
    B, T, U1, _ = acts.type.shape
    al, ll, lab = _constant_value(act_lens), _constant_value(label_lens), _constant_value(labels)
    for name, v in (("act_lens", al), ("label_lens", ll)):
        if v is not None and v.size and v.min() < 0:
            raise ValueError(f"{fn}: {name} must be >= 0, got {v.min()}")
    if al is not None and al.size and T is not None and al.max() > T:
        raise ValueError(f"{fn}: max(act_lens) = {al.max()} exceeds acts.shape[1] = {T}")
    if ll is not None and ll.size and U1 is not None and ll.max() + 1 > U1:
        raise ValueError(f"{fn}: max(label_lens) + 1 = {ll.max() + 1} exceeds acts.shape[2] = {U1}")
    if lab is not None and ll is not None and lab.shape[0] == ll.shape[0]:
        if ll.size and ll.max() > lab.shape[1]:
            raise ValueError(f"{fn}: labels has {lab.shape[1]} columns, fewer than max(label_lens) = {ll.max()}")
        valid = np.arange(lab.shape[1])[None, :] < ll[:, None]
        bad = valid & ((lab < 0) | (lab >= (K if K is not None else np.iinfo(np.int32).max)))
        if bad.any():
            b, u = np.argwhere(bad)[0]
            raise ValueError(f"{fn}: labels[{b}, {u}] = {lab[b, u]} is out of range [0, {K})")
    for name, v in (("labels", labels), ("act_lens", act_lens), ("label_lens", label_lens)):
        nb = v.type.shape[0]
        if B is not None and nb is not None and nb != B:
            raise ValueError(f"{fn}: {name} has batch size {nb}, acts has {B}")

    params = [sigma, fastemit_lambda, clamp, RNNT_FUNCTIONS.index(fn)]
    outs = _op()(acts, labels, act_lens, label_lens, pt.constant(np.asarray(durations, dtype=np.int32)),
                 pt.constant(np.int32(blank)), pt.constant(np.asarray(params, dtype=np.float64)))
    return RnntLattice(*outs)


def _reduce(costs, reduction):
    if reduction == "none":
        return costs
    if reduction == "sum":
        return costs.sum()
    return costs.mean()


def _check_reduction(fn, reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"{fn}: reduction must be one of {REDUCTIONS}, got {reduction!r}")


def multiblank_rnnt_loss(acts, labels, act_lens, label_lens, blank, big_blank_durations, sigma=0.0,
                         fastemit_lambda=0.0, clamp=-1.0, reduction="none"):
    """Multi-blank RNN-T loss (arXiv 2211.03541) on logits.

    Parameters
    ----------
    acts : tensor (B, T, U+1, K), float32 or float64
        Joint-network logits; ``K = V + 1 + len(big_blank_durations)``.  One
        log-softmax runs over all K classes.  ``T >= max(act_lens)`` and
        ``U >= max(label_lens)``: padding beyond the longest sequence (batch
        sharding, bucketing) gives the result of the tight padding.
    labels : int tensor (B, U') with U' >= max(label_lens), zero-padded
        Entries before ``label_lens[b]`` must lie in ``[0, K)``.
    act_lens, label_lens : int tensors (B,)
    blank : int
        The standard blank's class.  Big blank i (duration
        ``big_blank_durations[i]``) has class ``blank - 1 - i``.
    big_blank_durations : sequence of int, each >= 2 (at most 32)
    sigma : float
        Logit under-normalisation: every arc weighs ``logp - sigma``.
    fastemit_lambda : float >= 0
        FastEmit: the cost is ``-(1 + lambda) * loglik`` and only the label-arc
        term of the gradient is scaled by ``1 + lambda`` (so with lambda > 0 the
        gradient is FastEmit's regularised one, not the cost's derivative).
    clamp : float
        ``> 0``: each element of the per-sequence gradient is clamped to
        ``[-clamp, clamp]`` before the reduction and the upstream gradient are
        applied.  ``-1`` (default) or ``0``: off.  Other negatives: ValueError.
    reduction : "none" | "sum" | "mean"
        "none": costs (B,); "sum": a scalar; "mean": a scalar batch mean
        (costs and gradients divided by B, not by the label lengths).

    Returns
    -------
    The cost tensor, dtype of acts.  ``pytensor.grad(loss, acts)`` is the
    kernel's gradient (computed in the forward pass) times the upstream
    gradient; padded positions (t >= act_lens[b] or u > label_lens[b]) get 0.
    A sequence with ``act_lens[b] == 0`` has no frame: loglik 0 and cost 0
    if it has no label (the empty alignment), else loglik -inf and cost +inf;
    its gradient is 0.  A NaN logit in a valid cell of sequence b makes b's
    cost NaN and its gradient NaN on its valid cells; other sequences are
    unaffected.

    Raises
    ------
    ValueError
        acts not 4-D; lengths beyond acts' shape; labels out of range;
        durations < 2; a bad blank, clamp, lambda, sigma or reduction (at
        graph build when known, else when run).  Messages name the function
        (``rnnt_loss``, ``multiblank_rnnt_loss``) and the argument.
    TypeError
        Non-integer labels / lengths / blank / durations, non-float acts,
        non-numeric hyper-parameters.

    Example
    -------
    >>> loss = multiblank_rnnt_loss(acts, labels, act_lens, label_lens, blank=K - 1,
    ...                             big_blank_durations=(2, 4), sigma=0.05, reduction="mean")
    >>> g = pytensor.grad(loss, acts)
    """
    _check_reduction("multiblank_rnnt_loss", reduction)
    lat = _lattice("multiblank_rnnt_loss", acts, labels, act_lens, label_lens, blank, big_blank_durations, sigma,
                   fastemit_lambda, clamp)
    return _reduce(lat.costs, reduction)


def rnnt_loss(acts, labels, act_lens, label_lens, blank=0, fastemit_lambda=0.0, clamp=-1.0, reduction="none"):
    """Standard RNN-T loss on logits ``acts`` (B, T, U+1, V+1): the multi-blank
    loss with no big blanks and sigma = 0 (same kernels).  Arguments, result
    and errors as in :func:`multiblank_rnnt_loss`.

    Example
    -------
    >>> loss = rnnt_loss(acts, labels, act_lens, label_lens, blank=0, reduction="sum")
    >>> g = pytensor.grad(loss, acts)
    """
    _check_reduction("rnnt_loss", reduction)
    lat = _lattice("rnnt_loss", acts, labels, act_lens, label_lens, blank, (), 0.0, fastemit_lambda, clamp)
    return _reduce(lat.costs, reduction)
