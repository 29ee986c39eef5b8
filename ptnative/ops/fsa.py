"""Sequence models on automata (kernels in ``c_code/fsa/`` and ``c_code/ctc/``).

Automata are edge lists: ``edges`` (4, E) int32 with rows ``(from state, to state,
emission index, sequence index)``, ``weights`` (E,), ``start_end_states`` (2, B)
int32.  States are global indices shared by the batch; each state belongs to one
sequence (a state used by two sequences is an error).  Every edge consumes one
frame: a path of a sequence of length ``T_b`` takes exactly ``T_b`` edges from its
start state to its end state.

* :class:`FastBaumWelchOp`, :class:`MultiEndFastBaumWelchOp`: forward-backward in
  ``-log`` space (posteriors of the emissions per frame, and ``-log p``).
* :class:`SegmentFastBaumWelchOp`: segmental forward-backward with length models.
* :class:`FastViterbiOp`: the best path (``+log`` space) and its score.
* :class:`GetCtcFsaFastBwOp`: the CTC (or RNA) automaton of a batch of label sequences.
* :class:`CtcFsaLossOp`, :class:`CtcViterbiLossOp`: fused CTC losses and their gradients
  (used by :func:`ctc_loss` and :func:`ctc_loss_viterbi`).
The functional API: :func:`get_ctc_fsa_fast_bw`, :func:`fast_baum_welch`,
:func:`fast_viterbi`, :func:`ctc_loss`, :func:`ctc_loss_viterbi`.  See ``docs/fsa.md``.  The dense
HMM (:func:`ptnative.hmm_log_likelihood` and the rest) is :mod:`ptnative.ops.hmm`.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt

from ..op import NativeOpGenBase
from ..source import kernel_unit
from ._args import flag, float_tensor, host_int32_scalar, input_entry, int_tensor, output_entry, real_tensor
from ._loss import LossWithGradOp


class FastBaumWelchOp(NativeOpGenBase):
    """Forward-backward over an automaton, in ``-log`` space.

    Inputs (none has a gradient):
      * ``am_scores`` (T, B, D): emission scores, ``-log`` probabilities (float32/float64);
      * ``edges`` (4, E) int32: ``(from, to, emission_idx, sequence_idx)``;
      * ``weights`` (E,): edge weights, ``-log`` (``inf`` = edge unusable);
      * ``start_end_states`` (2, B) int32;
      * ``index`` (T, B): 0/1 prefix mask (sequence b has ``T_b = sum(index[:, b])`` frames);
      * ``state_buffer`` (2, S): only its shape is used, S = number of states (it is not written).

    Outputs:
      * ``output`` (T, B, D): ``-log`` posterior that frame t of sequence b emits d,
        ``-log sum_paths P(path | x) [path emits d at t]``; ``inf`` where that
        probability is 0, on padded frames, and for sequences without a path;
      * ``sums`` (T, B): ``-log p(x_b)`` on every valid frame of a sequence with a path,
        0 on padded frames and for sequences without a path.

    Errors (``ValueError``, naming :func:`fast_baum_welch` and the argument): states outside
    ``[0, S)``, emission indices outside ``[0, D)``, sequence indices outside ``[0, B)``, a
    state used by two sequences, a non-0/1 or non-prefix ``index``, shape mismatches,
    ``-inf`` scores or weights.  A NaN score on a valid frame of sequence b, or a NaN weight
    of one of its edges, makes b's outputs NaN on its valid frames (the other sequences are
    unaffected).  A sequence with ``T_b = 0`` has no valid frame (nothing is output for it).
    Computed in double with per-frame scaling (exact up to rounding; the per-frame dynamic
    range is ~700 nats).
    """

    in_info = (
        input_entry("am_scores", 3),
        input_entry("edges", 2, dtype="int32"),
        input_entry("weights", 1),
        input_entry("start_end_states", 2, shape=(2, None), dtype="int32"),
        input_entry("index", 2, shape=((0, 0), (0, 1))),
        input_entry("state_buffer", 2, shape=(2, None)),
    )
    out_info = (
        output_entry("output", ((0, 0), (0, 1), (0, 2))),
        output_entry("sums", ((0, 0), (0, 1))),
    )
    c_extra_support_code = kernel_unit("fsa/fsa_baum_welch.cu")
    c_fw_code = "fast_bw_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (2,)


class MultiEndFastBaumWelchOp(NativeOpGenBase):
    """:class:`FastBaumWelchOp` with several weighted end states per sequence.

    Inputs: ``am_scores`` (T, B, D), ``edges`` (4, E), ``weights`` (E,),
    ``start_states`` (B,) int32, ``end_states`` (N, 2) int32 rows ``(sequence, state)``,
    ``end_state_weights`` (N,) ``-log`` weights (``p(x_b)`` sums over the end states of b,
    each path's probability multiplied by ``exp(-end_state_weight)``), ``index`` (T, B),
    ``state_buffer`` (2, S).  Outputs and errors as in :class:`FastBaumWelchOp`.  Runs on
    the CPU and on CUDA.
    """

    in_info = (
        input_entry("am_scores", 3),
        input_entry("edges", 2, dtype="int32"),
        input_entry("weights", 1),
        input_entry("start_states", 1, dtype="int32"),
        input_entry("end_states", 2, shape=(None, 2), dtype="int32"),
        input_entry("end_state_weights", 1, shape=((4, 0),)),
        input_entry("index", 2, shape=((0, 0), (0, 1))),
        input_entry("state_buffer", 2, shape=(2, None)),
    )
    out_info = FastBaumWelchOp.out_info
    c_extra_support_code = kernel_unit("fsa/fsa_baum_welch.cu")
    c_fw_code = "multi_end_fast_bw_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (2,)


class SegmentFastBaumWelchOp(NativeOpGenBase):
    """Segmental forward-backward: each edge consumes a segment of 1..L frames.

    Inputs (none has a gradient; ``F`` frames in total, ``L`` = max segment length,
    ``Nb`` = number of segment columns):
      * ``am_scores`` (L, Nb, D): ``-log`` score of emitting d over the segment of
        length ``i + 1`` described by column n;
      * ``batch_idxs`` (F, B) int32: the column of the segments of sequence b that start
        at frame t, or -1 (no segment starts there);
      * ``edges`` (5, E) int32: ``(from, to, emission_idx, length_model_idx, sequence_idx)``;
      * ``weights`` (E,): ``-log`` edge weights;
      * ``length_models`` (M, L): ``-log`` score of a segment of length ``i + 1`` under
        length model m;
      * ``start_end_states`` (2, B) int32;
      * ``index`` (L, Nb): 1 where the segment of length ``i + 1`` of column n is allowed, else 0;
      * ``am_score_scales`` (K,), ``epoch`` (): the emission scores are multiplied by
        ``am_score_scales[min(int(epoch), K - 1)]``.

    A segment (t, i) of sequence b exists if ``n = batch_idxs[t, b] >= 0`` and
    ``index[i, n] != 0``; it covers frames ``t .. t + i``.  Sequence b ends at
    ``T_b`` = the largest ``t + i + 1`` over its segments (0 if none), where its path
    must reach the end state.  The score of a path is the sum of its edges'
    ``w + scale * am_scores[i, n, emission] + length_models[m, i]``.

    Outputs:
      * ``output`` (L, Nb, D): for every existing segment, ``-log`` posterior of its
        emission d given that the segment is used (normalised within the segment),
        ``inf`` elsewhere;
      * ``normalization_factors`` (L, Nb): ``-log P(segment used, x)``, 0 where the
        segment does not exist or is never used; with ``segmentwise_normalization``
        the factors of all lengths of a column are replaced by their ``-log`` sum
        (over the used ones);
      * ``posterior_weigths`` (L, Nb): ``P(segment used | x) = exp(-(factor - (-log p(x))))``
        (0 where unused or no path).

    ``make_op(segmentwise_normalization=False)``.  Computed in log space (double).
    Errors (``ValueError``) as in :class:`FastBaumWelchOp`, plus columns outside
    ``[0, Nb)`` and length-model indices outside ``[0, M)``.
    """

    in_info = (
        input_entry("am_scores", 3),
        input_entry("batch_idxs", 2, dtype="int32"),
        input_entry("edges", 2, dtype="int32"),
        input_entry("weights", 1, shape=((2, 1),)),
        input_entry("length_models", 2, shape=(None, (0, 0))),
        input_entry("start_end_states", 2, shape=(2, None), dtype="int32"),
        input_entry("index", 2, shape=((0, 0), (0, 1))),
        input_entry("am_score_scales", 1),
        input_entry("epoch", 0, shape=()),
    )
    out_info = (
        output_entry("output", ((0, 0), (0, 1), (0, 2))),
        output_entry("normalization_factors", ((0, 0), (0, 1))),
        output_entry("posterior_weigths", ((0, 0), (0, 1))),
    )
    c_extra_support_code = kernel_unit("fsa/fsa_segmental.cu")
    c_fw_code = "segment_fast_bw_fw(n_inputs, inputs, n_outputs, outputs, false);"
    code_version = (2,)

    @classmethod
    def make_op(cls, segmentwise_normalization: bool = False, **kwargs) -> NativeOp:
        if segmentwise_normalization:
            kwargs.setdefault("c_fw_code", "segment_fast_bw_fw(n_inputs, inputs, n_outputs, outputs, true);")
        return super().make_op(**kwargs)


class FastViterbiOp(NativeOpGenBase):
    """The best path through an automaton (max-plus, ``+log`` space).

    Inputs (no gradients): ``am_scores`` (T, B, D) ``+log`` scores, ``am_seq_len`` (B,)
    int32 in ``[0, T]``, ``edges`` (4, E) int32, ``weights`` (E,) ``+log`` (added to the
    path score), ``start_end_states`` (2, B) int32, ``n_states`` () int32 (host).

    Outputs: ``output`` (T, B) int32, the emission of the best path per frame
    (0 on frames ``t >= am_seq_len[b]`` and for sequences without a path);
    ``scores`` (B,), the best path's score (``-inf`` without a path).  Among equal
    scores the backtrace takes, at every frame, the lowest edge index.  A NaN score on a
    valid frame of sequence b (or a NaN weight of one of its edges) gives b the score NaN
    and the alignment 0.  Errors as in :class:`FastBaumWelchOp` (states must be
    ``< n_states``), naming :func:`fast_viterbi`.
    """

    in_info = (
        input_entry("am_scores", 3),
        input_entry("am_seq_len", 1, shape=((0, 0),), dtype="int32"),
        input_entry("edges", 2, shape=(4, None), dtype="int32"),
        input_entry("weights", 1, shape=((3, 1),)),
        input_entry("start_end_states", 2, shape=(2, (0, 0)), dtype="int32"),
        host_int32_scalar("n_states"),
    )
    out_info = (
        output_entry("output", ((0, 0), (0, 1)), dtype="int32"),
        output_entry("scores", ((0, 1),)),
    )
    c_extra_support_code = kernel_unit("fsa/fsa_viterbi.cu")
    c_fw_code = "fast_viterbi_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (2,)


class GetCtcFsaFastBwOp(NativeOpGenBase):
    """The CTC automaton of a batch of label sequences, as FastBaumWelch edges.

    Inputs: ``targets`` (B, N) int32, ``seq_lens`` (B,) int32 in ``[0, N]``,
    ``blank_idx`` () int32, ``weights`` (E,) with ``E = B * (5 * (N - 1) + 10)``
    (only its shape is used; it is not written: pass zeros), ``label_loop`` () int32.

    Outputs: ``edges`` (4, E) int32 and ``start_end_states`` (2, B) int32.  Sequence b
    uses states ``(2N + 3) b + [0, 2L + 2]``: ``2k`` blank, ``2k + 1`` label k, ``2L + 1``
    a dummy, ``2L + 2`` the end state, entered by consuming the last frame, so every
    alignment is one path.  ``label_loop=1`` gives CTC (labels repeat, a repeated
    label needs a blank in between); 0 gives the RNA topology (each label is emitted
    on exactly one frame).  Edge slots ``[b E / B, (b + 1) E / B)`` belong to b;
    unused ones are dummy self-loops (they never reach the end).  The edge list is the
    seed's, slot for slot: an edge that cannot be used (the skip between two equal labels,
    and with ``label_loop=0`` a label's repetition) leads into the dummy state, with the
    blank as emission for the skips.
    """

    in_info = (
        input_entry("targets", 2, dtype="int32"),
        input_entry("seq_lens", 1, dtype="int32"),
        host_int32_scalar("blank_idx"),
        input_entry("weights", 1),
        host_int32_scalar("label_loop"),
    )
    out_info = (
        output_entry("edges", (4, (3, 0)), dtype="int32"),
        output_entry("start_end_states", (2, (1, 0)), dtype="int32"),
    )
    c_extra_support_code = kernel_unit("ctc/ctc_fsa.cu")
    c_fw_code = "ctc_fsa_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (2,)


class _CtcLossOp(LossWithGradOp):
    """The CTC losses' op: the gradient output (T, B, D) has its batch on axis 1."""

    grad_batch_axis = 1


class CtcFsaLossOp(NativeOpGenBase):
    """Fused CTC loss: the CTC automaton of the targets (as :class:`GetCtcFsaFastBwOp`
    builds it) and forward-backward over it, in one kernel (used by :func:`ctc_loss`).

    Inputs: ``logits`` (T, B, D), ``logits_seq_lens`` (B,) int32 (frames of each
    sequence, in ``[0, T]``), ``targets`` (B, N) int32, ``targets_seq_lens`` (B,) int32 in
    ``[0, N]``, and host int32 scalars ``blank_index`` (in ``[-D, D)``; negative counts
    from the end), ``label_loop``, ``logits_normalized``.  Outputs: ``loss`` (B,)
    ``-log p(targets | x)`` (``inf`` without a path, 0 for an empty target over zero
    frames) and ``grad`` (T, B, D) its derivative w.r.t. ``logits``:
    ``softmax(logits) - posterior`` (``-posterior`` if ``logits_normalized``, the logits
    then being log-probabilities), 0 on padded frames.  A NaN logit on a valid frame of
    sequence b gives b the loss NaN and the gradient NaN on its valid frames.  The gradient
    of a cost w.r.t. ``logits`` is ``d cost / d loss[b] * grad[:, b]``.  Bad lengths,
    labels or blank raise ``ValueError`` naming :func:`ctc_loss` and the argument.
    """

    in_info = (
        input_entry("logits", 3, differentiable=True, batch_axis=1),
        input_entry("logits_seq_lens", 1, dtype="int32", batch_axis=0),
        input_entry("targets", 2, dtype="int32", batch_axis=0),
        input_entry("targets_seq_lens", 1, dtype="int32", batch_axis=0),
        host_int32_scalar("blank_index"),
        host_int32_scalar("label_loop"),
        host_int32_scalar("logits_normalized"),
    )
    out_info = (
        output_entry("loss", ((0, 1),), batch_axis=0),
        output_entry("grad", ((0, 0), (0, 1), (0, 2)), batch_axis=1, fully_written=True),  # padded frames included
    )
    c_extra_support_code = kernel_unit("ctc/ctc_loss.cu")
    c_fw_code = "ctc_loss_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (3,)
    op_class = _CtcLossOp


class CtcViterbiLossOp(NativeOpGenBase):
    """Fused CTC loss of the best alignment only (used by :func:`ctc_loss_viterbi`).

    Inputs as :class:`CtcFsaLossOp`.  Outputs: ``loss`` (B,), minus the log-probability
    of the best alignment (``inf`` without one, 0 for an empty target over zero frames),
    and ``grad`` (T, B, D): ``softmax(logits) - onehot(best alignment)`` on valid frames
    (``-onehot`` if ``logits_normalized``), 0 on padded frames and for sequences without an
    alignment.  Among equal alignments the one :func:`fast_viterbi` picks (lowest edge index
    per frame).  NaN and errors as in :class:`CtcFsaLossOp`, naming :func:`ctc_loss_viterbi`.
    """

    in_info = CtcFsaLossOp.in_info
    out_info = CtcFsaLossOp.out_info
    c_extra_support_code = kernel_unit("ctc/ctc_loss_viterbi.cu")
    c_fw_code = "ctc_loss_viterbi_fw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (3,)
    op_class = _CtcLossOp


# ---------------------------------------------------------------------------------------- functional API
def _n_states(edges, start_end_states):
    """The number of states an edge list uses: the largest state index + 1."""
    flat = pt.concatenate([edges[:2].flatten(), start_end_states.flatten(), pt.constant([-1], dtype="int32")])
    return pt.cast(pt.max(flat) + 1, "int32")


def get_ctc_fsa_fast_bw(targets, seq_lens, blank_idx, label_loop=True):
    """The CTC automaton of ``targets`` in FastBaumWelch format.

    Parameters
    ----------
    targets : (B, N) int tensor
        Label sequences, batch-major; entries past ``seq_lens[b]`` are ignored.
    seq_lens : (B,) int tensor
        Lengths, in ``[0, N]`` (else ``ValueError`` when evaluated).
    blank_idx : int or int scalar tensor
        The blank's class index.
    label_loop : bool
        True: CTC topology; False: RNA (no label repetition, each label on one frame).

    Returns
    -------
    edges : (4, E) int32, weights : (E,) float32 zeros, start_end_states : (2, B) int32
        with ``E = B * (5 * (N - 1) + 10)``.  See :class:`GetCtcFsaFastBwOp`.
    """
    fn = "get_ctc_fsa_fast_bw"
    targets = int_tensor(fn, "targets", targets, 2, allow_bool=True)
    seq_lens = int_tensor(fn, "seq_lens", seq_lens, 1, allow_bool=True)
    blank = int_tensor(fn, "blank_idx", blank_idx, 0, allow_bool=True)
    n_batch, n_labels = targets.shape[0], targets.shape[1]
    n_edges = n_batch * (5 * (n_labels - 1) + 10)
    weights = pt.zeros((n_edges,), dtype="float32")
    edges, start_end_states = GetCtcFsaFastBwOp.make_op()(targets, seq_lens, blank, weights,
                                                          flag(fn, "label_loop", label_loop))
    return edges, weights, start_end_states


def fast_baum_welch(am_scores, edges, weights, start_end_states, float_idx, state_buffer=None):
    """Forward-backward over an automaton; see :class:`FastBaumWelchOp`.

    Parameters
    ----------
    am_scores : (T, B, D) float tensor, ``-log`` emission scores.
    edges : (4, E) int tensor; weights : (E,) ``-log``; start_end_states : (2, B) int.
    float_idx : (T, B) 0/1 prefix mask (any numeric dtype).
    state_buffer : (2, S), optional
        Only its shape matters (S = number of states); by default S is the largest
        state index in ``edges`` / ``start_end_states`` plus one.

    Returns
    -------
    fwdbwd : (T, B, D) ``-log`` posteriors (``inf`` where 0 or padded);
    obs_scores : (T, B) ``-log p(x_b)`` on valid frames (0 on padded frames or without a path).
    Not differentiable (use :func:`ctc_loss` for a CTC gradient).
    """
    fn = "fast_baum_welch"
    am_scores = float_tensor(fn, "am_scores", am_scores, 3, cast_int=True)
    dtype = am_scores.dtype
    edges = int_tensor(fn, "edges", edges, 2, allow_bool=True)
    weights = real_tensor(fn, "weights", weights, 1, dtype)
    start_end_states = int_tensor(fn, "start_end_states", start_end_states, 2, allow_bool=True)
    float_idx = real_tensor(fn, "float_idx", float_idx, 2, dtype)
    if state_buffer is None:
        state_buffer = pt.zeros((2, _n_states(edges, start_end_states)), dtype=dtype)
    else:
        state_buffer = real_tensor(fn, "state_buffer", state_buffer, 2, dtype)
    fwdbwd, obs = FastBaumWelchOp.make_op()(am_scores, edges, weights, start_end_states, float_idx, state_buffer)
    return fwdbwd, obs


def fast_viterbi(am_scores, am_seq_len, edges, weights, start_end_states):
    """The best path per sequence; see :class:`FastViterbiOp`.

    Parameters
    ----------
    am_scores : (T, B, D) ``+log`` scores; am_seq_len : (B,) int lengths in ``[0, T]``;
    edges : (4, E) int; weights : (E,) ``+log``; start_end_states : (2, B) int.

    Returns
    -------
    alignment : (T, B) int32 emissions of the best path (0 past the length or without a path);
    scores : (B,) best path score (``-inf`` without a path).
    """
    fn = "fast_viterbi"
    am_scores = float_tensor(fn, "am_scores", am_scores, 3, cast_int=True)
    edges = int_tensor(fn, "edges", edges, 2, allow_bool=True)
    start_end_states = int_tensor(fn, "start_end_states", start_end_states, 2, allow_bool=True)
    weights = real_tensor(fn, "weights", weights, 1, am_scores.dtype)
    am_seq_len = int_tensor(fn, "am_seq_len", am_seq_len, 1, allow_bool=True)
    alignment, scores = FastViterbiOp.make_op()(am_scores, am_seq_len, edges, weights, start_end_states,
                                                _n_states(edges, start_end_states))
    return alignment, scores


def _ctc_op_call(op_class, fn, logits, logits_seq_lens, targets, targets_seq_lens, blank_index, label_loop,
                 logits_normalized, zero_infinity):
    """The fused CTC op ``op_class`` on checked arguments; ``zero_infinity`` maps an infinite loss to 0."""
    logits = float_tensor(fn, "logits", logits, 3, cast_int=True)
    logits_seq_lens = int_tensor(fn, "logits_seq_lens", logits_seq_lens, 1, allow_bool=True)
    targets = int_tensor(fn, "targets", targets, 2, allow_bool=True)
    targets_seq_lens = int_tensor(fn, "targets_seq_lens", targets_seq_lens, 1, allow_bool=True)
    if isinstance(blank_index, bool) or not isinstance(blank_index, int | np.integer):
        blank = int_tensor(fn, "blank_index", blank_index, 0, allow_bool=True)
    else:
        n_classes = logits.type.shape[2]
        if n_classes is not None and not -n_classes <= blank_index < n_classes:
            raise ValueError(f"{fn}: blank_index = {blank_index} is out of range [-D, D) for D = {n_classes} "
                             "classes (logits.shape[2])")
        blank = pt.constant(np.int32(blank_index))
    loss, _ = op_class.make_op()(logits, logits_seq_lens, targets, targets_seq_lens, blank,
                                 flag(fn, "label_loop", label_loop),
                                 flag(fn, "logits_normalized", logits_normalized))
    if zero_infinity:
        loss = pt.switch(pt.isinf(loss), pt.zeros_like(loss), loss)
    return loss


def ctc_loss(logits, logits_seq_lens, targets, targets_seq_lens, blank_index=-1, label_loop=True,
             logits_normalized=False, zero_infinity=False):
    """CTC negative log-likelihood per sequence, differentiable w.r.t. ``logits``.

    Parameters
    ----------
    logits : (T, B, D) float tensor, time-major.
    logits_seq_lens : (B,) int, frames per sequence in ``[0, T]``.
    targets : (B, N) int, batch-major labels; targets_seq_lens : (B,) int in ``[0, N]``.
    blank_index : int
        The blank class; negative values count from the end (-1: the last class).
    label_loop : bool
        True: CTC; False: RNA topology (see :func:`get_ctc_fsa_fast_bw`).
    logits_normalized : bool
        False: ``log_softmax`` is applied to ``logits``; True: ``logits`` are log-probabilities.
    zero_infinity : bool
        Sequences without a valid alignment (e.g. too few frames) get loss 0 and gradient 0
        instead of loss ``inf``.

    Returns
    -------
    (B,) tensor, ``-log p(targets_b | logits_b)``.  Its gradient w.r.t. ``logits`` is
    ``softmax - posterior`` (``-posterior`` when ``logits_normalized``) on valid frames,
    0 on padded frames, times the upstream gradient of each sequence.  Sequences without
    a path (loss ``inf``) get the gradient ``softmax`` unless ``zero_infinity``.  An empty
    target over zero frames has loss 0 (the empty alignment has probability 1).  A NaN in
    ``logits`` on a valid frame of sequence b gives b the loss NaN and the gradient NaN on
    its valid frames, also with ``zero_infinity`` (which only maps ``inf`` to 0); the other
    sequences are unaffected.

    Raises
    ------
    ValueError
        Naming ``ctc_loss`` and the argument, when evaluated: ``logits_seq_lens[b]`` outside
        ``[0, T]``, ``targets_seq_lens[b]`` outside ``[0, N]``, a label ``targets[b, k]``
        (``k < targets_seq_lens[b]``) outside ``[0, D)``, ``blank_index`` outside ``[-D, D)``
        (at graph build when D and the index are known), batch sizes that differ.
    """
    return _ctc_op_call(CtcFsaLossOp, "ctc_loss", logits, logits_seq_lens, targets, targets_seq_lens, blank_index,
                        label_loop, logits_normalized, zero_infinity)


def ctc_loss_viterbi(logits, logits_seq_lens, targets, targets_seq_lens, blank_index=-1, label_loop=True,
                     logits_normalized=False, zero_infinity=False):
    """CTC loss of the best alignment only: ``-max_alignment log p(alignment | logits)``.

    Same parameters as :func:`ctc_loss`.  The gradient w.r.t. ``logits`` is
    ``softmax - onehot(best alignment)`` (``-onehot`` when ``logits_normalized``) on valid
    frames, 0 on padded frames, times the upstream gradient of each sequence.  Without a
    path the loss is ``inf`` with gradient 0, or 0 with ``zero_infinity``; an empty target
    over zero frames has loss 0.  NaN and errors as in :func:`ctc_loss` (naming
    ``ctc_loss_viterbi``).  One fused kernel (:class:`CtcViterbiLossOp`).
    """
    return _ctc_op_call(CtcViterbiLossOp, "ctc_loss_viterbi", logits, logits_seq_lens, targets, targets_seq_lens,
                        blank_index, label_loop, logits_normalized, zero_infinity)


__all__ = [
    "FastBaumWelchOp", "MultiEndFastBaumWelchOp", "SegmentFastBaumWelchOp", "FastViterbiOp", "GetCtcFsaFastBwOp",
    "CtcFsaLossOp", "CtcViterbiLossOp", "get_ctc_fsa_fast_bw", "fast_baum_welch", "fast_viterbi", "ctc_loss",
    "ctc_loss_viterbi",
]
