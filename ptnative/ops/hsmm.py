"""Explicit-duration HMMs (hidden semi-Markov models): the likelihood with gradients, the state marginals, the most
likely state path and paths drawn from the posterior (kernels in ``c_code/hsmm/``).

* :class:`HsmmLikelihoodOp`: the log-likelihood and its gradients with respect to every float input
  (:func:`hsmm_log_likelihood`), with :class:`HsmmLikelihoodWithGradOp` (both in one pass, put in by a rewrite).
* :class:`HsmmPosteriorsOp`: the state marginals ``p(z_t = k | x_b)`` (:func:`hsmm_posteriors`).
* :class:`HsmmViterbiOp`: the most likely state path and its log score (:func:`hsmm_viterbi`).
* :class:`HsmmSampleStatesOp`: state paths drawn from ``p(z | x_b)`` by backward filtering, forward sampling,
  driven by the caller's uniforms (:func:`hsmm_sample_states`).

The model: a state path is a sequence of segments ``(s_1, d_1), ..., (s_m, d_m)`` with ``d_1 + ... + d_m = T_b``
and ``s_j != s_{j+1}``, of weight ``pi(s_1) prod_{j<m} p_{s_j}(d_j) A(s_j, s_{j+1}) * L_{s_m}(d_m) * prod_t e_t(z_t)``
where ``L_k(d) = sum_{d' >= d} p_k(d')`` when ``right_censored`` (the last segment may go on after the series ends)
and ``p_k(d)`` otherwise; all arguments in log space.  See ``docs/hsmm.md``.
"""

from __future__ import annotations

import pytensor.tensor as pt
from pytensor.tensor.rewriting.basic import register_specialize

from ..op import NativeOpGenBase
from ..source import kernel_unit
from ._args import WRITTEN, flag, float_tensor, host_int32_scalar, input_entry, output_entry, real_tensor
from ._borrowed_grad import BorrowedGradientOp, value_and_gradient_fusion


def _hsmm_inputs(disc):
    """The inputs of the HSMM ops: ``log_emissions`` (T, B, K), ``log_transitions`` (K, K), ``log_durations``
    (Bd, K, D), ``log_initial`` (Bp, K) with Bd, Bp in {1, B}, ``mask`` (T, B), ``right_censored`` (host int32);
    ``disc``: no gradient for any (connected float inputs of an op without a gradient op make ``pytensor.grad``
    raise).  The gradient op writes every element of its outputs (``fully_written``).  No
    batch axes: per-sequence durations and initial weights are (B, ...) arrays that a fold under ``jax.vmap`` would
    not resize."""
    gradient = {} if disc else {"bw_out_var": WRITTEN}
    return (
        input_entry("log_emissions", 3, differentiable=not disc, **gradient),
        input_entry("log_transitions", 2, differentiable=not disc, **gradient),
        input_entry("log_durations", 3, differentiable=not disc, **gradient),
        input_entry("log_initial", 2, differentiable=not disc, **gradient),
        input_entry("mask", 2),
        host_int32_scalar("right_censored"),
    )


class HsmmLikelihoodOp(NativeOpGenBase):
    """Log-likelihood of an explicit-duration HMM, with gradients (see :func:`hsmm_log_likelihood`).

    Inputs: ``log_emissions`` (T, B, K), ``log_transitions`` (K, K) (diagonal not read), ``log_durations``
    (Bd, K, D), ``log_initial`` (Bp, K) with Bd, Bp in {1, B}, ``mask`` (T, B) 0/1 prefix mask and
    ``right_censored`` (int32 scalar) without gradients.  Output: ``log_likelihood`` (B,).  The gradient op runs the
    forward recursion again, then the backward one (``c_code/hsmm/hsmm_grad.h``); where a graph needs both,
    :class:`HsmmLikelihoodWithGradOp` takes the two ops' place.
    """

    in_info = _hsmm_inputs(False)
    out_info = (output_entry("log_likelihood", ((0, 1),)),)
    # gradient op inputs: the six inputs and the log-likelihood's gradient
    grad_input_map = (0, 1, 2, 3, 4, 5, 7)
    c_extra_support_code = kernel_unit("hsmm/hsmm.cu")
    c_fw_code = "hsmm_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "hsmm_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


class _LikelihoodWithGradOp(BorrowedGradientOp):
    """HsmmLikelihoodWithGradOp's Op: the log-likelihood's gradient is HsmmLikelihoodOp's; the fused gradients have
    none (second derivatives raise)."""

    gradient_spec = HsmmLikelihoodOp
    shared_outputs = 1


class HsmmLikelihoodWithGradOp(NativeOpGenBase):
    """:class:`HsmmLikelihoodOp`'s value and gradients in one call (one forward recursion instead of two).

    Inputs: those of the gradient op, :class:`HsmmLikelihoodOp`'s six and ``D_log_likelihood`` (B,) the upstream
    gradient.  Outputs: the log-likelihood (B,), then its gradients for ``log_emissions``, ``log_transitions``,
    ``log_durations`` and ``log_initial`` (weighted by ``D_log_likelihood``).  Not built by users: the rewrite
    ``ptnative_hsmm_value_and_gradient`` puts it where a graph computes both and the upstream gradient does not
    depend on the value (as for ``ll.sum()``).  The log-likelihood's gradient is :class:`HsmmLikelihoodOp`'s (a
    graph differentiated after the rewrites, as JAX differentiates a jaxified one); the gradient outputs have none
    (second derivatives raise ``NullTypeGradError``).
    """

    in_info = (*_hsmm_inputs(False), input_entry("D_log_likelihood", 1, shape=((0, 1),), differentiable=True))
    out_info = (
        output_entry("log_likelihood", ((0, 1),)),
        output_entry("D_log_emissions", ((0, 0), (0, 1), (0, 2)), fully_written=True),  # padded frames included
        output_entry("D_log_transitions", ((1, 0), (1, 1)), fully_written=True),
        output_entry("D_log_durations", ((2, 0), (2, 1), (2, 2)), fully_written=True),
        output_entry("D_log_initial", ((3, 0), (3, 1)), fully_written=True),
    )
    c_extra_support_code = kernel_unit("hsmm/hsmm.cu")
    c_fw_code = "hsmm_fw_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)
    op_class = _LikelihoodWithGradOp


register_specialize(value_and_gradient_fusion(HsmmLikelihoodOp, HsmmLikelihoodWithGradOp),
                    name="ptnative_hsmm_value_and_gradient")


class HsmmViterbiOp(NativeOpGenBase):
    """The most likely state path of an explicit-duration HMM (see :func:`hsmm_viterbi`).

    Inputs (no gradients) as :class:`HsmmLikelihoodOp`'s.  Outputs: ``path`` (T, B) int32, ``score`` (B,).
    """

    in_info = _hsmm_inputs(True)
    out_info = (output_entry("path", ((0, 0), (0, 1)), dtype="int32", fully_written=True),  # padded frames: -1
                output_entry("score", ((0, 1),), fully_written=True))
    c_extra_support_code = kernel_unit("hsmm/hsmm_viterbi.cu")
    c_fw_code = "hsmm_viterbi_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


class HsmmPosteriorsOp(NativeOpGenBase):
    """The state marginals of an explicit-duration HMM (see :func:`hsmm_posteriors`).

    Inputs as :class:`HsmmLikelihoodOp`'s.  Output: ``marginals`` (T, B, K), every element written (padded frames:
    0).  No gradient op: its float inputs are connected, so ``pytensor.grad`` through the marginals raises
    (``NullTypeGradError``) instead of returning zeros.
    """

    in_info = _hsmm_inputs(False)
    out_info = (output_entry("marginals", ((0, 0), (0, 1), (0, 2)), fully_written=True),)
    c_extra_support_code = kernel_unit("hsmm/hsmm_posteriors.cu")
    c_fw_code = "hsmm_posteriors_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


class HsmmSampleStatesOp(NativeOpGenBase):
    """State paths of an explicit-duration HMM drawn from the posterior with the given uniforms (see
    :func:`hsmm_sample_states`).

    Inputs (no gradients): :class:`HsmmLikelihoodOp`'s and ``uniforms`` (T, B).  Output: ``path`` (T, B) int32.
    """

    in_info = (*_hsmm_inputs(True), input_entry("uniforms", 2))
    out_info = (output_entry("path", ((0, 0), (0, 1)), dtype="int32", fully_written=True),)  # padded frames: -1
    c_extra_support_code = kernel_unit("hsmm/hsmm_sample.cu")
    c_fw_code = "hsmm_sample_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


# ---------------------------------------------------------------------------------------- functional API
def _model(fn, log_emissions, log_transitions, log_durations, log_initial, mask, right_censored):
    """The six op inputs, in the dtype of ``log_emissions`` (integer and bool emissions: float64); (K, D) durations
    and (K,) initial weights get a leading dim of 1.  Errors (ops/_args.py's rule) name ``fn``."""
    log_emissions = float_tensor(fn, "log_emissions", log_emissions, 3, "(T, B, K)", cast_int=True)
    dtype = log_emissions.dtype
    log_transitions = real_tensor(fn, "log_transitions", log_transitions, 2, dtype, "(K, K)")
    log_durations = real_tensor(fn, "log_durations", log_durations, (2, 3), dtype, "(K, D) or (B, K, D)")
    log_initial = real_tensor(fn, "log_initial", log_initial, (1, 2), dtype, "(K,) or (B, K)")
    if log_durations.ndim == 2:
        log_durations = pt.shape_padleft(log_durations)
    if log_initial.ndim == 1:
        log_initial = pt.shape_padleft(log_initial)
    mask = (pt.ones(log_emissions.shape[:2], dtype=dtype) if mask is None
            else real_tensor(fn, "mask", mask, 2, dtype, "(T, B)"))
    return log_emissions, log_transitions, log_durations, log_initial, mask, flag(fn, "right_censored", right_censored)


_PARAMS_DOC = """
    Parameters
    ----------
    log_emissions : (T, B, K) float, ``log e_t(k)`` (log-densities of any magnitude).
    log_transitions : (K, K) float, ``log A(j, k)`` from state j to a *different* state k (rows need not be
        normalised); the diagonal is never read (a NaN or inf there changes nothing).
    log_durations : (K, D) or (B, K, D) float, ``log_durations[..., k, d-1] = log p_k(d)`` for d = 1..D (need not be
        normalised; ``-inf`` for an impossible duration).
    log_initial : (K,) or (B, K) float, ``log pi``.
    mask : (T, B), optional, 0/1 prefix mask (default: all frames valid).
    right_censored : bool or scalar, default True: the last segment weighs ``L_k(d) = sum_{d' >= d} p_k(d')`` (it
        may go on after the series ends) instead of ``p_k(d)``."""


def hsmm_log_likelihood(log_emissions, log_transitions, log_durations, log_initial, mask=None, right_censored=True):
    """Log-likelihood of observation sequences under an explicit-duration HMM (a hidden semi-Markov model).

    ``p(x_b) = sum over segmentations (s_1, d_1), ..., (s_m, d_m)`` of the series (``d_1 + ... + d_m = T_b``,
    ``s_j != s_{j+1}``) of ``pi(s_1) prod_{j<m} p_{s_j}(d_j) A(s_j, s_{j+1}) * L_{s_m}(d_m) * prod_t e_t(z_t)``.
    {params}

    Returns
    -------
    (B,) log-likelihoods (``-inf`` if impossible; 0 for the empty series, ``T_b = 0``).  Differentiable with
    respect to ``log_emissions``, ``log_transitions``, ``log_durations`` and ``log_initial`` (exact: the gradients
    are posteriors of states, transitions, durations and first states, summed over the batch for shared
    parameters and weighted by the upstream gradient); the diagonal of the transitions' gradient is 0.  Computed
    in log space in double, O(T K (D + K)) per sequence, stable at any T.  A NaN log-emission on a valid frame of
    sequence b, or a NaN in the parameters b uses (off the diagonal of ``log_transitions``), gives b the
    log-likelihood NaN and the emission gradient NaN on its valid frames, and makes the gradients of those
    parameters NaN.  ``+inf`` log-probabilities, a non-0/1 or non-prefix mask and shape mismatches raise
    ``ValueError`` naming ``hsmm_log_likelihood`` and the argument when evaluated.
    """
    return HsmmLikelihoodOp.make_op()(*_model("hsmm_log_likelihood", log_emissions, log_transitions, log_durations,
                                              log_initial, mask, right_censored))


def hsmm_viterbi(log_emissions, log_transitions, log_durations, log_initial, mask=None, right_censored=True):
    """The most likely state path of each sequence under an explicit-duration HMM, and its log score.
    {params}

    Returns
    -------
    path : (T, B) int32, the state per frame, ``-1`` on padded frames (``t >= T_b``).
    score : (B,) float, the largest log weight of a segmentation (0 for the empty series).

    Ties: the lowest state for the last segment; then, going backwards, the shortest duration for each segment
    and the lowest state for the segment before it.  Computed in log space (double).  A NaN input on a valid frame
    of sequence b (or in the parameters it uses) gives b the score NaN and the path -1 on every frame; a sequence
    without a possible path gets ``-inf`` and -1 everywhere.  No gradient.  Errors as in
    :func:`hsmm_log_likelihood`, naming ``hsmm_viterbi``.
    """
    path, score = HsmmViterbiOp.make_op()(*_model("hsmm_viterbi", log_emissions, log_transitions, log_durations,
                                                  log_initial, mask, right_censored))
    return path, score


def hsmm_posteriors(log_emissions, log_transitions, log_durations, log_initial, mask=None, right_censored=True):
    """The state marginals of each sequence under an explicit-duration HMM.
    {params}

    Returns
    -------
    (T, B, K) marginals ``p(z_t = k | x_b)``, the posterior probability that frame t lies in a segment of state k:
    they sum to 1 (to rounding) on every valid frame and are 0 on padded frames.  Computed by the forward and
    backward recursions over segments in log space (double), O(T K (D + K)) per sequence; they are the gradient of
    :func:`hsmm_log_likelihood` with respect to ``log_emissions``.  A sequence without a possible path gets zeros;
    a NaN input on a valid frame of sequence b (or in the parameters b uses) gives b NaN on its valid frames; the
    empty series: zeros.  **Not differentiable** (a gradient would need second derivatives of the likelihood):
    ``pytensor.grad`` through the marginals raises ``NullTypeGradError``.  Errors as in
    :func:`hsmm_log_likelihood`, naming ``hsmm_posteriors``.
    """
    return HsmmPosteriorsOp.make_op()(*_model("hsmm_posteriors", log_emissions, log_transitions, log_durations,
                                              log_initial, mask, right_censored))


def hsmm_sample_states(log_emissions, log_transitions, log_durations, log_initial, mask=None, right_censored=True, *,
                       uniforms):
    """State paths drawn from ``p(z | x_b)`` under an explicit-duration HMM, by backward filtering, forward sampling.
    {params}
    uniforms : (T, B) float in ``[0, 1)``, the caller's random numbers (e.g. ``pt.random.uniform(size=(T, B))``),
        one per frame: the op is deterministic, so the randomness (and its seeding) stays with PyTensor / PyMC.

    Returns
    -------
    (T, B) int32 paths, ``-1`` on padded frames.  The segments are drawn in time order: the segment starting at
    frame s, a pair (state k, duration d), is drawn with ``uniforms[s, b]`` from its posterior given the segment
    before it (over k = 0..K-1, then d = 1..D, in that order: the first pair whose cumulative weight exceeds ``u``
    times the total); the uniforms of the frames a segment covers after its first are not used.  Each path is a draw
    from the exact posterior over segmentations when the uniforms are independent and uniform.  A sequence with a
    NaN input or without a possible path gets -1 on every frame.  No gradient.  A uniform outside ``[0, 1)`` (or
    NaN) on a valid frame raises ``ValueError``; other errors as in :func:`hsmm_log_likelihood`, naming
    ``hsmm_sample_states``.
    """
    model = _model("hsmm_sample_states", log_emissions, log_transitions, log_durations, log_initial, mask,
                   right_censored)
    uniforms = real_tensor("hsmm_sample_states", "uniforms", uniforms, 2, model[0].dtype, "(T, B)")
    return HsmmSampleStatesOp.make_op()(*model, uniforms)


for _f in (hsmm_log_likelihood, hsmm_posteriors, hsmm_viterbi, hsmm_sample_states):
    _f.__doc__ = _f.__doc__.replace("{params}", _PARAMS_DOC)

__all__ = ["HsmmLikelihoodOp", "HsmmLikelihoodWithGradOp", "HsmmPosteriorsOp", "HsmmViterbiOp", "HsmmSampleStatesOp",
           "hsmm_log_likelihood", "hsmm_posteriors", "hsmm_viterbi", "hsmm_sample_states"]
