"""Dense K-state HMMs: the likelihood, and inference beyond it (kernels in ``c_code/hmm/``).

* :class:`HmmForwardBackwardOp`: the log-likelihood and its gradients (:func:`hmm_log_likelihood`), with
  :class:`HmmLikelihoodWithGradOp` (both in one pass, put in by a rewrite) and :class:`HmmVaryingLikelihoodOp`
  (batched or time-varying parameters).
* :class:`HmmViterbiOp`: the most likely state path and its log score (:func:`hmm_viterbi`), with
  :class:`HmmViterbiDefaultsOp` (no ``log_final`` and ``mask`` given, put in by a rewrite).
* :class:`HmmPosteriorsOp`: smoothed state marginals and expected transition counts, with
  gradients (:func:`hmm_posteriors`).
* :class:`HmmSampleStatesOp`: state paths drawn from the posterior by forward filtering,
  backward sampling, driven by the caller's uniforms (:func:`hmm_sample_states`).

The model:
``p(x_b, z) = pi(z_0) e_0(z_0) prod_{t=1}^{T_b-1} A(z_{t-1}, z_t) e_t(z_t) * f(z_{T_b-1})``,
all arguments in log space.  See ``docs/hmm.md`` (and ``docs/fsa.md`` for :func:`hmm_log_likelihood`).
"""

from __future__ import annotations

import pytensor.tensor as pt

from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.tensor.rewriting.basic import register_specialize

from ..op import NativeOp, NativeOpGenBase
from ..source import kernel_unit
from ._args import WRITTEN, float_tensor, hidden_output, input_entry, output_entry, real_tensor
from ._borrowed_grad import BorrowedGradientOp, value_and_gradient_fusion


def _hmm_inputs(disc, transitions_ndim=2, initial_ndim=1):
    """The inputs of the dense HMM ops: ``log_emissions`` (T, B, K), ``log_transitions``
    (``transitions_ndim``), ``log_initial`` (``initial_ndim``), ``log_final`` (K,), ``mask`` (T, B); ``disc``: no
    gradient for any (the mask never has one).  The gradient ops write every element of ``log_emissions``'s gradient
    (padded frames and sequences without a path: zeros), so it is ``fully_written``."""
    gradient = {} if disc else {"bw_out_var": WRITTEN}
    return (
        input_entry("log_emissions", 3, differentiable=not disc, batch_axis=1, **gradient),
        input_entry("log_transitions", transitions_ndim, differentiable=not disc),
        input_entry("log_initial", initial_ndim, differentiable=not disc),
        input_entry("log_final", 1, differentiable=not disc),
        input_entry("mask", 2, batch_axis=1),
    )


def _support(name):
    """The support code of the op in ``c_code/hmm_<name>.cu`` (which includes what it needs)."""
    return kernel_unit(f"hmm/hmm_{name}.cu")


class HmmForwardBackwardOp(NativeOpGenBase):
    """Log-likelihood of a dense K-state HMM, with gradients (see :func:`hmm_log_likelihood`).

    Inputs: ``log_emissions`` (T, B, K), ``log_transitions`` (K, K), ``log_initial`` (K,),
    ``log_final`` (K,), ``mask`` (T, B) 0/1 prefix mask (no gradient).
    Output: ``log_likelihood`` (B,).  The gradient op runs the forward pass again (keeping its
    forward vectors in memory of its own): cheaper than handing them over in (T, B, K) outputs.
    """

    in_info = _hmm_inputs(False)
    out_info = (output_entry("log_likelihood", ((0, 1),), batch_axis=0),)
    # gradient op inputs: the five inputs and the log-likelihood's gradient
    grad_input_map = (0, 1, 2, 3, 4, 6)
    c_extra_support_code = kernel_unit("hmm/hmm.cu")
    c_fw_code = "hmm_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "hmm_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (5,)


class _LikelihoodWithGradOp(BorrowedGradientOp):
    """HmmLikelihoodWithGradOp's Op: the log-likelihood's gradient is HmmForwardBackwardOp's; the fused gradients
    have none (second derivatives raise)."""

    gradient_spec = HmmForwardBackwardOp
    shared_outputs = 1


class HmmLikelihoodWithGradOp(NativeOpGenBase):
    """:class:`HmmForwardBackwardOp`'s value and gradient in one call (one forward pass instead of two).

    Inputs: those of the gradient op, ``log_emissions`` (T, B, K), ``log_transitions`` (K, K), ``log_initial``
    (K,), ``log_final`` (K,), ``mask`` (T, B), ``D_log_likelihood`` (B,) the upstream gradient.  Outputs: the
    log-likelihood (B,), then its gradients for the first four inputs (weighted by ``D_log_likelihood``).  Not built
    by users: the rewrite ``_fuse_hmm_value_and_gradient`` puts it where a graph computes both and the upstream
    gradient does not depend on the value (as for ``ll.sum()``).  The log-likelihood's gradient is
    :class:`HmmForwardBackwardOp`'s (a graph differentiated after the rewrites, as JAX differentiates a jaxified
    one); the gradient outputs have none (second derivatives raise ``NullTypeGradError``).
    """

    in_info = (*_hmm_inputs(False),
               input_entry("D_log_likelihood", 1, shape=((0, 1),), differentiable=True, batch_axis=0))
    out_info = (
        output_entry("log_likelihood", ((0, 1),), batch_axis=0),
        # padded frames included
        output_entry("D_log_emissions", ((0, 0), (0, 1), (0, 2)), batch_axis=1, fully_written=True),
        output_entry("D_log_transitions", ((1, 0), (1, 1))),
        output_entry("D_log_initial", ((2, 0),)),
        output_entry("D_log_final", ((3, 0),)),
    )
    c_extra_support_code = kernel_unit("hmm/hmm.cu")
    c_fw_code = "hmm_fw_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)
    op_class = _LikelihoodWithGradOp


# HmmForwardBackwardOp's node and its gradient op's node on the same inputs become one HmmLikelihoodWithGradOp node,
# when the upstream gradient does not depend on the log-likelihood.
_fuse_hmm_value_and_gradient = value_and_gradient_fusion(HmmForwardBackwardOp, HmmLikelihoodWithGradOp)
register_specialize(_fuse_hmm_value_and_gradient, name="ptnative_hmm_value_and_gradient")


_PATH = output_entry("path", ((0, 0), (0, 1)), dtype="int32", batch_axis=1, fully_written=True)  # padded frames: -1


class HmmViterbiOp(NativeOpGenBase):
    """The most likely state path of a dense K-state HMM (see :func:`hmm_viterbi`).

    Inputs (no gradients): ``log_emissions`` (T, B, K), ``log_transitions`` (K, K),
    ``log_initial`` (K,), ``log_final`` (K,), ``mask`` (T, B) 0/1 prefix mask.
    Outputs: ``path`` (T, B) int32, ``score`` (B,).
    """

    in_info = _hmm_inputs(True)
    out_info = (_PATH, output_entry("score", ((0, 1),), batch_axis=0, fully_written=True))
    c_extra_support_code = _support("viterbi")
    c_fw_code = "hmm_viterbi_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


class HmmViterbiDefaultsOp(NativeOpGenBase):
    """:class:`HmmViterbiOp` with ``log_final`` and ``mask`` at their defaults (no final weighting, every frame
    valid), made in the kernel: the compiled graph then holds no nodes building those two arrays per call.

    Inputs ``log_emissions`` (T, B, K), ``log_transitions`` (K, K), ``log_initial`` (K,); outputs as
    :class:`HmmViterbiOp`'s.  Not built by users: the rewrite ``_viterbi_defaults`` puts it where
    :func:`hmm_viterbi` was called without ``log_final`` and ``mask``.
    """

    in_info = _hmm_inputs(True)[:3]
    out_info = HmmViterbiOp.out_info
    c_extra_support_code = _support("viterbi")
    c_fw_code = "hmm_viterbi_defaults_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


class HmmPosteriorsOp(NativeOpGenBase):
    """Smoothed state marginals and expected transition counts of a dense K-state HMM, with
    gradients (see :func:`hmm_posteriors`).

    Inputs: ``log_emissions`` (T, B, K), ``log_transitions`` (K, K), ``log_initial`` (K,),
    ``log_final`` (K,), ``mask`` (T, B) (no gradient).  Outputs: ``marginals`` (T, B, K),
    ``counts`` (B, K, K).  Hidden outputs (float64, feeding the gradient op): the scaled
    filter ``alpha`` (T, B, K), its normalisers ``scales`` (T, B) and emission shifts
    ``shifts`` (T, B), and ``status`` (B,): 0 computed, 2 no path, 3 NaN.
    """

    in_info = _hmm_inputs(False)
    out_info = (
        output_entry("marginals", ((0, 0), (0, 1), (0, 2)), batch_axis=1, fully_written=True),  # padded frames included
        output_entry("counts", ((0, 1), (0, 2), (0, 2)), batch_axis=0, fully_written=True),
        hidden_output("alpha", ((0, 0), (0, 1), (0, 2)), 1, fully_written=True),  # rows not read: 0
        hidden_output("scales", ((0, 0), (0, 1)), 1, fully_written=True),
        hidden_output("shifts", ((0, 0), (0, 1)), 1, fully_written=True),
        hidden_output("status", ((0, 1),), 0, fully_written=True),
    )
    # gradient op inputs: the five inputs, the hidden outputs, and the gradients of marginals and counts
    grad_input_map = (0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 12)
    c_extra_support_code = _support("posteriors")
    c_fw_code = "hmm_posteriors_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "hmm_posteriors_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


class _PosteriorsValuesOp(BorrowedGradientOp):
    """HmmPosteriorsValuesOp's Op: its gradient is HmmPosteriorsOp's (which recomputes the hidden outputs)."""

    gradient_spec = HmmPosteriorsOp
    shared_outputs = 2


class HmmPosteriorsValuesOp(NativeOpGenBase):
    """:class:`HmmPosteriorsOp`'s marginals and counts where the graph uses none of its hidden outputs: the same
    kernel, whose hidden arrays then stay in the library's memory (no four arrays allocated, zeroed and returned
    per call).

    Inputs and the outputs ``marginals`` (T, B, K), ``counts`` (B, K, K) as :class:`HmmPosteriorsOp`'s.  Not built
    by users: the rewrite ``_posteriors_without_hidden_outputs`` puts it where a graph uses none of
    :class:`HmmPosteriorsOp`'s hidden outputs.  Its gradient is :class:`HmmPosteriorsOp`'s (a graph differentiated
    after the rewrites, as JAX differentiates a jaxified graph, recomputes the forward pass with the hidden outputs).
    """

    in_info = _hmm_inputs(False)
    out_info = HmmPosteriorsOp.out_info[:2]
    c_extra_support_code = _support("posteriors")
    c_fw_code = "hmm_posteriors_values_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)
    op_class = _PosteriorsValuesOp


class _PosteriorsDefaultsOp(NativeOp):
    """HmmPosteriorsDefaultsOp's Op: its gradient is HmmPosteriorsValuesOp's on the same inputs with the default
    ``log_final`` (zeros) and ``mask`` (ones)."""

    def pullback(self, inputs, outputs, cotangents):
        log_emissions, log_transitions, log_initial = inputs
        full = _model("hmm_posteriors", log_emissions, log_transitions, log_initial, None, None)[1]
        values = HmmPosteriorsValuesOp.make_op(device=self.device, float_dtypes=self.float_dtypes)
        node = values.make_node(*full)
        return values.pullback(list(full), node.outputs, cotangents)[:3]


class HmmPosteriorsDefaultsOp(NativeOpGenBase):
    """:class:`HmmPosteriorsValuesOp` with ``log_final`` and ``mask`` at their defaults (no final weighting, every
    frame valid), made in the kernel: the compiled graph then holds no node building those two arrays per call.

    Inputs ``log_emissions`` (T, B, K), ``log_transitions`` (K, K), ``log_initial`` (K,); outputs as
    :class:`HmmPosteriorsValuesOp`'s.  Not built by users: the rewrite ``_posteriors_without_hidden_outputs`` puts
    it where :func:`hmm_posteriors` was called without ``log_final`` and ``mask`` and no gradient is taken.  Its
    gradient is :class:`HmmPosteriorsOp`'s on the five inputs.
    """

    in_info = _hmm_inputs(False)[:3]
    out_info = HmmPosteriorsOp.out_info[:2]
    c_extra_support_code = _support("posteriors")
    c_fw_code = "hmm_posteriors_defaults_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)
    op_class = _PosteriorsDefaultsOp


def _is_filled(fgraph, x, value, like):
    """Whether ``x`` is ``Alloc(value, ...)`` whose shape the graph's shape feature knows to be that of ``like``
    (``like``: [(variable, dim), ...], one per dimension of ``x``)."""
    if x.owner is None or not isinstance(x.owner.op, pt.basic.Alloc) or x.ndim != len(like):
        return False
    try:
        filled = pt.get_underlying_scalar_constant_value(x.owner.inputs[0])
    except pt.exceptions.NotScalarConstantError:
        return False
    feature = getattr(fgraph, "shape_feature", None)
    if filled != value or feature is None:
        return False
    return all(feature.same_shape(x, y, d, dy) for d, (y, dy) in enumerate(like))


def _has_defaults(fgraph, node):
    """Whether the node's ``log_final`` and ``mask`` (inputs 3 and 4) are :func:`_model`'s defaults: zeros of
    ``log_initial``'s shape and ones of the emissions' (T, B)."""
    le, _, lpi, lf, mask = node.inputs[:5]
    return _is_filled(fgraph, lf, 0, [(lpi, 0)]) and _is_filled(fgraph, mask, 1, [(le, 0), (le, 1)])


@node_rewriter([NativeOp])
def _posteriors_without_hidden_outputs(fgraph, node):
    """An :class:`HmmPosteriorsOp` node none of whose hidden outputs is used (no gradient is taken) becomes an
    :class:`HmmPosteriorsValuesOp` node on the same inputs, or an :class:`HmmPosteriorsDefaultsOp` node where
    ``log_final`` and ``mask`` are the defaults (:func:`_has_defaults`)."""
    if node.op.name != HmmPosteriorsOp.__name__ or any(fgraph.clients.get(out) for out in node.outputs[2:]):
        return None
    spec = HmmPosteriorsDefaultsOp if _has_defaults(fgraph, node) else HmmPosteriorsValuesOp
    op = spec.make_op(device=node.op.device, float_dtypes=node.op.float_dtypes)
    values = op(*node.inputs[:len(spec.in_info)])
    return dict(zip(node.outputs[:2], values))


register_specialize(_posteriors_without_hidden_outputs, name="ptnative_hmm_posteriors_values")


@node_rewriter([NativeOp])
def _viterbi_defaults(fgraph, node):
    """An :class:`HmmViterbiOp` node whose ``log_final`` and ``mask`` are the defaults (:func:`_has_defaults`)
    becomes an :class:`HmmViterbiDefaultsOp` node on its first three inputs."""
    if node.op.name != HmmViterbiOp.__name__ or not _has_defaults(fgraph, node):
        return None
    op = HmmViterbiDefaultsOp.make_op(device=node.op.device, float_dtypes=node.op.float_dtypes)
    return op(*node.inputs[:3])


register_specialize(_viterbi_defaults, name="ptnative_hmm_viterbi_defaults")


class HmmSampleStatesOp(NativeOpGenBase):
    """State paths of a dense K-state HMM drawn from the posterior with the given uniforms
    (see :func:`hmm_sample_states`).

    Inputs (no gradients): ``log_emissions`` (T, B, K), ``log_transitions`` (K, K),
    ``log_initial`` (K,), ``log_final`` (K,), ``mask`` (T, B), ``uniforms`` (T, B).
    Output: ``path`` (T, B) int32.
    """

    in_info = (*_hmm_inputs(True), input_entry("uniforms", 2, batch_axis=1))
    out_info = (_PATH,)
    c_extra_support_code = _support("sample")
    c_fw_code = "hmm_sample_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


#: The hidden outputs of the ops with batched or time-varying parameters (float64, feeding their gradient ops): the
#: scaled filter ``alpha`` (T, B, K), its normalisers ``scales`` and emission shifts ``shifts`` (T, B), ``status`` (B,).
_VARYING_FILTER = (
    hidden_output("alpha", ((0, 0), (0, 1), (0, 2))),
    hidden_output("scales", ((0, 0), (0, 1))),
    hidden_output("shifts", ((0, 0), (0, 1))),
    hidden_output("status", ((0, 1),)),
)


class HmmVaryingLikelihoodOp(NativeOpGenBase):
    """Log-likelihood of a dense K-state HMM with batched or time-varying transitions and batched
    initial weights, with gradients (used by :func:`ptnative.hmm_log_likelihood` for those shapes).

    Inputs: ``log_emissions`` (T, B, K), ``log_transitions`` (Ta, Ba, K, K) with Ta in {1, T-1}
    and Ba in {1, B} (broadcast), ``log_initial`` (Bp, K) with Bp in {1, B}, ``log_final`` (K,),
    ``mask`` (T, B) (no gradient).  Output: ``log_likelihood`` (B,).  Hidden outputs (float64):
    the scaled filter ``alpha`` (T, B, K), ``scales`` and ``shifts`` (T, B), ``status`` (B,).
    The gradients have the inputs' (broadcast) shapes.
    """

    in_info = _hmm_inputs(False, transitions_ndim=4, initial_ndim=2)
    out_info = (output_entry("log_likelihood", ((0, 1),)), *_VARYING_FILTER)
    # gradient op inputs: the five inputs, the hidden outputs and the log-likelihood's gradient
    grad_input_map = (0, 1, 2, 3, 4, 6, 7, 8, 9, 10)
    c_extra_support_code = _support("varying")
    c_fw_code = "hmm_varying_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "hmm_varying_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


class HmmVaryingPosteriorsOp(NativeOpGenBase):
    """:class:`HmmPosteriorsOp` with batched or time-varying transitions and batched initial weights, with gradients
    (used by :func:`hmm_posteriors` for those shapes).

    Inputs as :class:`HmmVaryingLikelihoodOp`'s: ``log_emissions`` (T, B, K), ``log_transitions`` (Ta, Ba, K, K)
    with Ta in {1, T-1} and Ba in {1, B} (broadcast), ``log_initial`` (Bp, K) with Bp in {1, B}, ``log_final``
    (K,), ``mask`` (T, B) (no gradient).  Outputs: ``marginals`` (T, B, K), ``counts`` (B, K, K) (summed over the
    frames).  Hidden outputs (float64, feeding the gradient op): ``alpha`` (T, B, K), ``scales`` and ``shifts``
    (T, B), ``status`` (B,).  The gradients have the inputs' (broadcast) shapes.
    """

    in_info = _hmm_inputs(False, transitions_ndim=4, initial_ndim=2)
    out_info = (output_entry("marginals", ((0, 0), (0, 1), (0, 2))), output_entry("counts", ((0, 1), (0, 2), (0, 2))),
                *_VARYING_FILTER)
    # gradient op inputs: the five inputs, the hidden outputs, and the gradients of marginals and counts
    grad_input_map = (0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 12)
    c_extra_support_code = _support("varying_posteriors")
    c_fw_code = "hmm_varying_posteriors_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "hmm_varying_posteriors_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


class HmmVaryingViterbiOp(NativeOpGenBase):
    """:class:`HmmViterbiOp` with batched or time-varying transitions and batched initial weights (used by
    :func:`hmm_viterbi` for those shapes).  Inputs as :class:`HmmVaryingPosteriorsOp`'s (no gradients); outputs
    ``path`` (T, B) int32, ``score`` (B,).
    """

    in_info = _hmm_inputs(True, transitions_ndim=4, initial_ndim=2)
    out_info = HmmViterbiOp.out_info
    c_extra_support_code = _support("varying_viterbi")
    c_fw_code = "hmm_varying_viterbi_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


class HmmVaryingSampleStatesOp(NativeOpGenBase):
    """:class:`HmmSampleStatesOp` with batched or time-varying transitions and batched initial weights (used by
    :func:`hmm_sample_states` for those shapes).  Inputs as :class:`HmmVaryingPosteriorsOp`'s (no gradients), then
    ``uniforms`` (T, B); output ``path`` (T, B) int32.
    """

    in_info = (*_hmm_inputs(True, transitions_ndim=4, initial_ndim=2), input_entry("uniforms", 2, batch_axis=1))
    out_info = (_PATH,)
    c_extra_support_code = _support("varying_sample")
    c_fw_code = "hmm_varying_sample_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


# ---------------------------------------------------------------------------------------- functional API
_TRANSITIONS = "(K, K), (B, K, K) or (T-1, B, K, K)"


def _model(fn, log_emissions, log_transitions, log_initial, log_final, mask):
    """``(varying, inputs)``: the five op inputs in the dtype of ``log_emissions`` (integer and bool emissions:
    float64); errors (ops/_args.py's rule) name ``fn``.  ``varying``: whether ``log_transitions`` is (B, K, K) or
    (T-1, B, K, K) or ``log_initial`` (B, K); the inputs are then those of the ``HmmVarying*`` ops (transitions
    padded on the left to 4 dimensions, initial weights to 2), else those of the shared-parameter ops."""
    log_emissions = float_tensor(fn, "log_emissions", log_emissions, 3, "(T, B, K)", cast_int=True)
    dtype = log_emissions.dtype
    log_transitions = real_tensor(fn, "log_transitions", log_transitions, (2, 3, 4), dtype, _TRANSITIONS)
    log_initial = real_tensor(fn, "log_initial", log_initial, (1, 2), dtype, "(K,) or (B, K)")
    log_final = (pt.zeros_like(log_initial if log_initial.ndim == 1 else log_initial[0]) if log_final is None
                 else real_tensor(fn, "log_final", log_final, 1, dtype, "(K,)"))
    mask = (pt.ones(log_emissions.shape[:2], dtype=dtype) if mask is None
            else real_tensor(fn, "mask", mask, 2, dtype, "(T, B)"))
    varying = log_transitions.ndim > 2 or log_initial.ndim > 1
    if varying:
        log_transitions = pt.shape_padleft(log_transitions, 4 - log_transitions.ndim)
        log_initial = pt.shape_padleft(log_initial, 2 - log_initial.ndim)
    return varying, (log_emissions, log_transitions, log_initial, log_final, mask)


def hmm_log_likelihood(log_emissions, log_transitions, log_initial, log_final=None, mask=None):
    """Log-likelihood of observation sequences under a dense K-state HMM.

    ``p(x_b) = sum_z pi(z_0) e_0(z_0) prod_{t=1}^{T_b-1} A(z_{t-1}, z_t) e_t(z_t) * f(z_{T_b-1})``.

    Parameters
    ----------
    log_emissions : (T, B, K) float, ``log e_t(k)`` (log-densities of any magnitude).
    log_transitions : (K, K) float, ``log A(i, j)`` (from i to j; rows need not be normalised);
        or (B, K, K) per sequence, or (T-1, B, K, K) per sequence and frame (entry t-1 is the
        transition into frame t; leading dims of size 1 broadcast).
    log_initial : (K,) float, ``log pi``; or (B, K) per sequence.
    log_final : (K,) float, optional, ``log f`` (default 0: no final weighting).
    mask : (T, B), optional, 0/1 prefix mask (default: all frames valid); a sequence with
        ``T_b = 0`` (the empty series) has log-likelihood 0 and gradient 0.

    Returns
    -------
    (B,) log-likelihoods (``-inf`` if impossible).  Differentiable w.r.t. every
    log-probability input: emission gradients are the state posteriors, transition
    gradients the expected transition counts (summed over the batch, weighted by the
    upstream gradient), initial/final gradients the posteriors of the first/last state.
    Computed with per-step scaling in double (stable at any T).  A NaN log-emission on a
    valid frame of sequence b gives b the log-likelihood NaN and the emission gradient NaN
    on its valid frames; a NaN in ``log_transitions``, ``log_initial`` or ``log_final``
    does so for every sequence with a frame; the gradients of those three are NaN when any
    sequence is.  ``-inf`` entries are impossible events.  ``+inf`` entries, a non-0/1 or
    non-prefix mask and shape mismatches raise ``ValueError`` (naming ``hmm_log_likelihood``
    and the argument) when evaluated.  Batched or time-varying parameters use
    :class:`HmmVaryingLikelihoodOp` (gradients in the parameters' shapes; NaN
    in a matrix or initial row makes the sequences using it NaN; a weight below ``e^-708``
    times the largest of its matrix counts as impossible there).
    """
    varying, model = _model("hmm_log_likelihood", log_emissions, log_transitions, log_initial, log_final, mask)
    spec = HmmVaryingLikelihoodOp if varying else HmmForwardBackwardOp
    return spec.make_op()(*model)


_PARAMS_DOC = """
    Parameters
    ----------
    log_emissions : (T, B, K) float, ``log e_t(k)`` (log-densities of any magnitude).
    log_transitions : (K, K) float, ``log A(i, j)`` (from i to j; rows need not be normalised); or (B, K, K) per
        sequence, or (T-1, B, K, K) per sequence and frame (entry t-1 is the transition into frame t; leading dims
        of size 1 broadcast).
    log_initial : (K,) float, ``log pi``; or (B, K) per sequence.
    log_final : (K,) float, optional, ``log f`` (default 0: no final weighting).
    mask : (T, B), optional, 0/1 prefix mask (default: all frames valid)."""


def hmm_viterbi(log_emissions, log_transitions, log_initial, log_final=None, mask=None):
    """The most likely state path of each sequence and its log score.
    {params}

    Returns
    -------
    path : (T, B) int32, the state per frame, ``-1`` on padded frames (``t >= T_b``).
    score : (B,) float, ``max_z log p(x_b, z)`` (0 for the empty series).

    Ties go to the lowest state: among equally likely paths the one that is smallest when
    compared from the last frame backwards (the backtrace takes the lowest state at every
    frame).  Computed in log space (double).  A NaN input on a valid frame of sequence b (or
    in the shared parameters) gives b the score NaN and the path -1 on every frame; a
    sequence without a possible path gets ``-inf`` and -1 everywhere.  No gradient.  ``+inf``
    log-probabilities, a non-0/1 or non-prefix mask and shape mismatches raise ``ValueError``
    naming ``hmm_viterbi`` and the argument.  Batched or time-varying parameters run
    :class:`HmmVaryingViterbiOp` (a NaN in a matrix or initial row: only the sequences using it).
    """
    varying, model = _model("hmm_viterbi", log_emissions, log_transitions, log_initial, log_final, mask)
    path, score = (HmmVaryingViterbiOp if varying else HmmViterbiOp).make_op()(*model)
    return path, score


def hmm_posteriors(log_emissions, log_transitions, log_initial, log_final=None, mask=None):
    """Smoothed state marginals and expected transition counts (the E-step of Baum-Welch).
    {params}

    Returns
    -------
    marginals : (T, B, K), ``p(z_t = k | x_b)``: sums to 1 (to rounding) on every valid frame,
        0 on padded frames.
    counts : (B, K, K), ``sum_{{t=1}}^{{T_b-1}} p(z_{{t-1}} = i, z_t = j | x_b)`` (sums to ``T_b - 1``).

    Differentiable with respect to ``log_emissions``, ``log_transitions``, ``log_initial``
    and ``log_final`` (exact: the vector-Jacobian product is a posterior covariance, computed
    by one more forward-backward pass).  Computed with per-step scaling in double, stable at
    any T and for log-densities of any magnitude; a transition, initial or final weight
    below ``e^-708`` times the largest entry of its array counts as impossible.  A sequence
    without a possible path gets all-zero marginals, counts and gradients; a NaN input on a
    valid frame of sequence b (or in the shared parameters) gives b NaN marginals, counts and
    emission gradients, and the shared parameters NaN gradients.  The empty series: zeros.
    Errors as in :func:`hmm_viterbi`, naming ``hmm_posteriors``.  Batched or time-varying parameters
    run :class:`HmmVaryingPosteriorsOp`: ``counts`` summed over the frames as above, gradients in the
    parameters' (broadcast) shapes, and a NaN in a matrix or initial row makes only the sequences using
    it NaN (and the gradient entries they touch).
    """
    varying, model = _model("hmm_posteriors", log_emissions, log_transitions, log_initial, log_final, mask)
    marginals, counts = (HmmVaryingPosteriorsOp if varying else HmmPosteriorsOp).make_op()(*model)
    return marginals, counts


def hmm_sample_states(log_emissions, log_transitions, log_initial, log_final=None, mask=None, *, uniforms):
    """State paths drawn from ``p(z | x_b)`` by forward filtering, backward sampling.
    {params}
    uniforms : (T, B) float in ``[0, 1)``, the caller's random numbers (e.g.
        ``pt.random.uniform(size=(T, B))``), one per frame: the op is deterministic, so the
        randomness (and its seeding) stays with PyTensor / PyMC.

    Returns
    -------
    (T, B) int32 paths, ``-1`` on padded frames.  Frame ``T_b - 1`` is drawn first (with
    ``uniforms[T_b-1, b]``), then each earlier frame given the next: with uniform ``u`` the
    state is the first whose cumulative weight exceeds ``u`` times the total.  A sequence
    with a NaN input or without a possible path gets -1 on every frame.  No gradient.  A
    uniform outside ``[0, 1)`` (or NaN) on a valid frame raises ``ValueError``; other errors
    as in :func:`hmm_viterbi`, naming ``hmm_sample_states``.  Batched or time-varying parameters run
    :class:`HmmVaryingSampleStatesOp` (frame t given frame t+1 weighted by the matrix into frame t+1).
    """
    varying, model = _model("hmm_sample_states", log_emissions, log_transitions, log_initial, log_final, mask)
    uniforms = real_tensor("hmm_sample_states", "uniforms", uniforms, 2, model[0].dtype, "(T, B)")
    return (HmmVaryingSampleStatesOp if varying else HmmSampleStatesOp).make_op()(*model, uniforms)


for _f in (hmm_viterbi, hmm_posteriors, hmm_sample_states):
    _f.__doc__ = _f.__doc__.replace("{params}", _PARAMS_DOC).replace("{{", "{").replace("}}", "}")

__all__ = ["HmmForwardBackwardOp", "HmmViterbiOp", "HmmViterbiDefaultsOp", "HmmPosteriorsOp",
           "HmmPosteriorsValuesOp", "HmmPosteriorsDefaultsOp", "HmmSampleStatesOp", "HmmVaryingLikelihoodOp",
           "HmmVaryingPosteriorsOp", "HmmVaryingViterbiOp", "HmmVaryingSampleStatesOp", "hmm_log_likelihood",
           "hmm_viterbi", "hmm_posteriors", "hmm_sample_states"]
