"""Automaton ops (Baum-Welch, Viterbi, CTC automaton, CTC loss, segmental BW, HMM)
against independent numpy references (brute-force path enumeration, log-space
forward-backward, Graves' CTC recursion)."""

import functools
import shutil

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import verify_grad

from ptnative import NativeOp
from ptnative.ops import fsa, hmm

from .conftest import build_with_nvcc, check_infer_shape, compiled_once, tol
from .reference import fsa as ref
from .test_hmm import model as hmm_data  # (log emissions, log A, log initial, log final)

INF = np.inf


@functools.cache
def ctc_graph_function(blank, label_loop):
    """The default-mode function of ``get_ctc_fsa_fast_bw`` for one (blank, label_loop), compiled once per
    process: a default-mode graph is compiled anew by every ``pytensor.function`` (docs/install.md)."""
    tg, tl = pt.imatrix("targets"), pt.ivector("tlens")
    return pytensor.function([tg, tl], list(fsa.get_ctc_fsa_fast_bw(tg, tl, blank, label_loop)))


def ctc_graph(targets, tlens, blank=0, label_loop=True):
    f = ctc_graph_function(int(blank), bool(label_loop))
    return [np.array(o) for o in f(np.asarray(targets, dtype=np.int32), np.asarray(tlens, dtype=np.int32))]


def mask_of(lens, T):
    return (np.arange(T)[:, None] < np.asarray(lens)[None, :]).astype(np.float64)


def random_fsa(rng, B, n_states_per_seq, n_edges_per_seq, D):
    """A random automaton per sequence (own state range), -log weights."""
    rows = []
    for b in range(B):
        off = b * n_states_per_seq
        for _ in range(n_edges_per_seq):
            rows.append((off + rng.integers(n_states_per_seq), off + rng.integers(n_states_per_seq),
                         rng.integers(D), b))
    edges = np.array(rows, dtype=np.int32).T.copy()
    weights = rng.random(edges.shape[1]) * 2
    start_end = np.array([[b * n_states_per_seq for b in range(B)],
                          [b * n_states_per_seq + n_states_per_seq - 1 for b in range(B)]], dtype=np.int32)
    return edges, weights, start_end


@compiled_once
def fbw_function(dtype, mode=None):
    a, m = pt.tensor3("am", dtype=dtype), pt.matrix("idx", dtype=dtype)
    e, s = pt.imatrix("edges"), pt.imatrix("se")
    w = pt.vector("w", dtype=dtype)
    out, sums = fsa.fast_baum_welch(a, e, w, s, m)
    return pytensor.function([a, e, w, s, m], [out, sums], mode=mode)


# ------------------------------------------------------------------ CTC automaton
@pytest.mark.parametrize("label_loop", [True, False])
def test_ctc_fsa_accepts_exactly_the_alignments(label_loop):
    """Each frame labelling has exactly one path iff it collapses to the target, else none."""
    D, T, blank = 3, 4, 2
    targets = [[0, 1], [1, 1], [0, 0], [1, 0]]
    tlens = [2, 2, 1, 0]
    edges, weights, se = ctc_graph(targets, tlens, blank, label_loop)
    B, N = 4, 2
    assert edges.shape == (4, B * (5 * (N - 1) + 10)) and weights.shape == (edges.shape[1],)
    np.testing.assert_array_equal(weights, 0)
    np.testing.assert_array_equal(se[0], np.arange(B) * (2 * N + 3))
    np.testing.assert_array_equal(se[1] - se[0], 2 * np.array(tlens) + 2)
    collapse = ref.ctc_collapse if label_loop else ref.rna_collapse
    n_states = int(edges[:2].max()) + 1
    for b in range(B):
        own = edges[:, edges[3] == b]
        for seq in ref.all_sequences(T, D):
            count = np.zeros(n_states)
            count[se[0, b]] = 1
            for t in range(T):
                nxt = np.zeros(n_states)
                for fr, to, em, _ in own.T:
                    if em == seq[t]:
                        nxt[to] += count[fr]
                count = nxt
            expected = int(collapse(seq, blank) == targets[b][:tlens[b]])
            assert count[se[1, b]] == expected, (b, seq)


def test_ctc_fsa_does_not_write_weights_and_checks_input():
    op = fsa.GetCtcFsaFastBwOp.make_op()
    tg, tl, w = pt.imatrix(), pt.ivector(), pt.vector("w", dtype="float32")
    f = pytensor.function([tg, tl, w], op(tg, tl, np.int32(0), w, np.int32(1)))
    weights = np.full(2 * 15, 7.0, dtype=np.float32)
    f(np.ones((2, 2), np.int32), np.array([2, 1], np.int32), weights)
    np.testing.assert_array_equal(weights, 7.0)
    with pytest.raises(ValueError, match=r"get_ctc_fsa_fast_bw: seq_lens\[0\] = 3 exceeds the number of labels "
                                         r"N = 2 \(targets.shape\[1\]\)"):
        f(np.ones((2, 2), np.int32), np.array([3, 1], np.int32), weights)  # length > N
    with pytest.raises(ValueError, match=r"get_ctc_fsa_fast_bw: seq_lens\[1\] = -1 is negative"):
        f(np.ones((2, 2), np.int32), np.array([2, -1], np.int32), weights)
    with pytest.raises(ValueError, match=r"GetCtcFsaFastBwOp.*get_ctc_fsa_fast_bw: weights must have shape "
                                         r"\(B \* \(5 \* \(N - 1\) \+ 10\) = 30,\), got \(29,\)"):
        f(np.ones((2, 2), np.int32), np.array([2, 1], np.int32), weights[:-1])  # E mismatch


# Targets with repeated labels, for the exact edge lists (the seed's slot layout).
SEED_CASES = [
    ([[0, 0]], [2], 1),
    ([[1, 1, 1], [2, 1, 1], [0, 2, 2], [1, 0, 2]], [3, 3, 2, 0], 3),
    ([[4, 4, 2, 2, 4], [3, 3, 3, 3, 3]], [5, 4], 0),
    ([[2], [0], [1]], [1, 0, 1], 3),
    (np.zeros((2, 0), np.int32), [0, 0], 2),
]


@pytest.mark.parametrize("label_loop", [True, False])
@pytest.mark.parametrize("case", range(len(SEED_CASES)))
def test_ctc_fsa_edge_list_is_the_seeds(case, label_loop):
    """The edge list, slot for slot, as the seed lays it out (repeated labels: every edge that cannot be used,
    among them both edges of a label state into the dummy state, has the blank as emission)."""
    targets, tlens, blank = SEED_CASES[case]
    targets = np.asarray(targets, np.int32).reshape(len(tlens), -1)
    edges, weights, se = ctc_graph(targets, tlens, blank, label_loop)
    want_edges, want_se = ref.ctc_fsa_seed_slots(targets, tlens, blank, label_loop)
    np.testing.assert_array_equal(edges, want_edges)
    np.testing.assert_array_equal(se, want_se)
    np.testing.assert_array_equal(weights, 0)


def test_ctc_fsa_repeated_label_edges_into_the_dummy():
    """targets [0, 0], blank 1: states 0 b, 1 label, 2 b, 3 label, 4 b, 5 dummy, 6 end; both edges from the
    first label state into the dummy state emit the blank."""
    edges, _, se = ctc_graph([[0, 0]], [2], blank=1)
    into_dummy = [tuple(e) for e in edges.T if e[1] == 5 and e[0] != 5]
    assert into_dummy == [(1, 5, 1, 0), (1, 5, 1, 0)]
    np.testing.assert_array_equal(se, [[0], [6]])


# ------------------------------------------------------------------ FastBaumWelch
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fast_bw_against_references(mode, dtype):
    rng = np.random.default_rng(1)
    T, D = 5, 4
    targets, tlens = [[1, 2], [1, 1], [2, 0], [0, 0]], [2, 2, 1, 0]
    lens = np.array([5, 4, 3, 2])
    edges, weights, se = ctc_graph(targets, tlens, blank=0)
    am = -ref.log_softmax(rng.normal(size=(T, 4, D)) * 2)
    f = fbw_function(dtype, mode)
    out, sums = f(am.astype(dtype), edges, weights.astype(dtype), se, mask_of(lens, T).astype(dtype))
    nll, post = ref.brute_force_bw(am, edges, weights, se, lens)
    rtol, atol = tol(dtype)
    valid = mask_of(lens, T).astype(bool)
    np.testing.assert_allclose(np.exp(-out.astype(np.float64)), post, rtol=rtol * 10, atol=atol * 10)
    np.testing.assert_allclose(sums, np.where(valid, nll[None, :], 0.0), rtol=rtol, atol=atol)
    assert out.dtype == dtype and sums.dtype == dtype
    assert np.all(np.isinf(out[~valid]))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fast_bw_random_automaton_with_weights(dtype):
    rng = np.random.default_rng(2)
    T, B, D = 6, 3, 3
    edges, weights, se = random_fsa(rng, B, 4, 9, D)
    weights[3] = np.inf  # an unusable edge
    lens = np.array([6, 4, 5])
    am = rng.random((T, B, D)) * 3
    out, sums = fbw_function(dtype)(am.astype(dtype), edges, weights.astype(dtype), se,
                                    mask_of(lens, T).astype(dtype))
    nll, post = ref.forward_backward_edges(am, edges, weights, se, lens)
    rtol, atol = tol(dtype)
    valid = mask_of(lens, T).astype(bool)
    has_path = np.isfinite(nll)
    assert has_path.any()
    np.testing.assert_allclose(np.exp(-out.astype(np.float64)), post, rtol=rtol * 10, atol=atol * 10)
    np.testing.assert_allclose(sums, np.where(valid & has_path[None], np.where(has_path, nll, 0)[None], 0),
                               rtol=rtol, atol=atol)
    nll_b, post_b = ref.brute_force_bw(am, edges, weights, se, lens)
    np.testing.assert_allclose(post_b, post, atol=1e-12)


def test_fast_bw_no_path_padding_and_empty():
    f = fbw_function("float64")
    edges, weights, se = ctc_graph([[1, 1]], [2], blank=0)
    am = -ref.log_softmax(np.random.default_rng(3).normal(size=(4, 1, 3)))
    out, sums = f(am, edges, weights, se, mask_of([2], 4))  # "1 1" needs >= 3 frames
    assert np.all(np.isinf(out)) and np.all(sums == 0)
    out, sums = f(np.zeros((0, 1, 3)), edges, weights, se, np.zeros((0, 1)))
    assert out.shape == (0, 1, 3) and sums.shape == (0, 1)
    out, sums = f(np.zeros((3, 0, 3)), np.zeros((4, 0), np.int32), np.zeros(0), np.zeros((2, 0), np.int32),
                  np.zeros((3, 0)))
    assert out.shape == (3, 0, 3)
    # huge scores: still finite (per-frame scaling)
    out, sums = f(am * 1e4, edges, weights, se, mask_of([4], 4))
    nll, _ = ref.forward_backward_edges(am * 1e4, edges, weights, se, [4])
    np.testing.assert_allclose(sums[0, 0], nll[0], rtol=1e-12)


def test_fast_bw_bad_input(mode):
    f = fbw_function("float64", mode)
    edges, weights, se = ctc_graph([[1, 2]], [2], blank=0)
    am = np.zeros((5, 1, 3))
    m = mask_of([5], 5)
    a, e, w, s, i = pt.tensor3(), pt.imatrix(), pt.vector(), pt.imatrix(), pt.matrix()
    small = pytensor.function([a, e, w, s, i], list(fsa.fast_baum_welch(a, e, w, s, i, pt.zeros((2, 3)))),
                              mode=mode)
    fn = "FastBaumWelchOp.*fast_baum_welch: "
    with pytest.raises(ValueError, match=fn + r"edges\[1, (\d+)\] = 3 \(the to state of edge \1\) is out of range "
                                              r"\[0, 3\) \(S = state_buffer.shape\[1\]\)"):
        small(am, edges, weights, se, m)  # state buffer of 3 states
    with pytest.raises(ValueError, match=fn + r"edges\[2, (\d+)\] = 2 \(the emission of edge \1\) is out of range "
                                              r"\[0, D = 2\) \(D = am_scores.shape\[2\]\)"):
        f(np.zeros((5, 1, 2)), edges, weights, se, m)  # label 2 >= D
    bad = edges.copy()
    bad[3, 4] = 1
    with pytest.raises(ValueError, match=fn + r"edges\[3, 4\] = 1 \(the sequence of edge 4\) is out of range "
                                              r"\[0, B = 1\)"):
        f(am, bad, weights, se, m)
    with pytest.raises(ValueError, match=fn + r"float_idx\[:, 0\] is not a prefix mask \(1 at frame 2 after a 0\)"):
        f(am, edges, weights, se, np.array([[1], [0], [1], [1], [1]], float))
    with pytest.raises(ValueError, match=fn + r"float_idx\[0, 0\] = 0.5 is not 0 or 1"):
        f(am, edges, weights, se, m * 0.5)
    with pytest.raises(ValueError, match=fn + r"start_end_states must have shape \(2, B = 2\), got \(2, 1\)"):
        f(np.zeros((5, 2, 3)), edges, weights, se, mask_of([5, 5], 5))  # B mismatch
    with pytest.raises(ValueError, match=fn + r"weights has shape \(14,\); it needs one entry per edge"):
        f(am, edges, weights[:-1], se, m)
    with pytest.raises(ValueError, match=fn + r"start_end_states\[1, 0\] = -3 \(an end state\) is out of range"):
        f(am, edges, weights, np.array([[0], [-3]], np.int32), m)
    with pytest.raises(ValueError, match=fn + r"start_end_states\[0, 0\] = -1 \(a start state\) is out of range"):
        f(am, edges, weights, np.array([[-1], [6]], np.int32), m)
    w_inf = weights.copy()
    w_inf[2] = -np.inf
    with pytest.raises(ValueError, match=fn + r"weights\[2\] = -inf"):
        f(am, edges, w_inf, se, m)
    am_inf = am.copy()
    am_inf[3, 0, 1] = -np.inf
    with pytest.raises(ValueError, match=fn + r"am_scores\[3, 0, 1\] = -inf is infinitely likely"):
        f(am_inf, edges, weights, se, m)
    e2, w2, se2 = ctc_graph([[1, 2], [1, 2]], [2, 2], blank=0)
    e2[1, -1] = se2[0, 0]  # an edge of sequence 1 into a state of sequence 0
    with pytest.raises(ValueError, match=fn + r"state 0 is used by sequences 0 and 1"):
        f(np.zeros((5, 2, 3)), e2, w2, se2, mask_of([5, 5], 5))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_multi_end_fast_bw(dtype):
    rng = np.random.default_rng(4)
    T, B, D = 5, 2, 3
    edges, weights, se = random_fsa(rng, B, 4, 10, D)
    ends = np.array([[0, 3], [0, 2], [1, 7], [1, 5], [1, 4]], dtype=np.int32)
    end_w = np.array([0.5, 1.0, 0.0, 2.0, 0.3])
    lens = np.array([5, 3])
    am = rng.random((T, B, D)) * 2
    op = fsa.MultiEndFastBaumWelchOp.make_op()
    out, sums = pytensor.function([], op(am.astype(dtype), edges, weights.astype(dtype), se[0], ends,
                                         end_w.astype(dtype), mask_of(lens, T).astype(dtype),
                                         np.zeros((2, 8), dtype)))()
    nll, post = ref.brute_force_bw(am, edges, weights, se, lens, end_list=[tuple(x) + (w,) for x, w in
                                                                            zip(ends.tolist(), end_w)])
    rtol, atol = tol(dtype)
    has_path = np.isfinite(nll)
    assert has_path.any()
    np.testing.assert_allclose(np.exp(-out.astype(np.float64)), post, rtol=rtol * 10, atol=atol * 10)
    np.testing.assert_allclose(sums, np.where((mask_of(lens, T) > 0) & has_path[None], np.where(has_path, nll, 0)[None],
                                              0), rtol=rtol, atol=atol)


def segment_columns(lens, F, L):
    """The segmental ops' columns for sequences of ``lens`` frames (``F >= max(lens)``, segments up to ``L``
    frames): one column per (frame, sequence), sequence by sequence, and one unused column last.  Returns
    ``batch_idxs`` ((F, B) int32: frame t of sequence b's column, -1 past its end) and ``index`` ((L, columns)
    float64: 1 where a segment of l + 1 frames starting at that column ends within its sequence)."""
    B = len(lens)
    cols = [(t, b) for b in range(B) for t in range(lens[b])]
    bidx = -np.ones((F, B), np.int32)
    index = np.zeros((L, len(cols) + 1))
    for n, (t, b) in enumerate(cols):
        bidx[t, b] = n
        index[: lens[b] - t, n] = 1
    return bidx, index


@pytest.mark.parametrize("segmentwise", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_segment_fast_bw(dtype, segmentwise):
    rng = np.random.default_rng(5)
    L, D = 3, 2
    # two sequences of 4 and 3 frames; a column per (frame, sequence)
    bidx, index = segment_columns([4, 3], 4, L)
    Nb = index.shape[1]  # one unused column
    edges = np.array([[0, 0, 1, 1, 2, 2, 3, 3],  # from
                      [1, 0, 1, 0, 3, 2, 3, 2],  # to
                      [0, 1, 1, 0, 0, 1, 1, 0],  # emission
                      [0, 1, 1, 0, 0, 1, 1, 0],  # length model
                      [0, 0, 0, 0, 1, 1, 1, 1]], dtype=np.int32)
    se = np.array([[0, 2], [1, 3]], dtype=np.int32)
    am = rng.random((L, Nb, D)) * 2
    w = rng.random(8)
    lm = rng.random((2, L))
    scales, epoch = np.array([1.0, 0.7]), np.array(3.0)
    op = fsa.SegmentFastBaumWelchOp.make_op(segmentwise_normalization=segmentwise)
    got = pytensor.function([], op(am.astype(dtype), bidx, edges, w.astype(dtype), lm.astype(dtype), se,
                                   index.astype(dtype), scales.astype(dtype), epoch.astype(dtype)))()
    want = ref.segment_brute_force(am, bidx, edges, w, lm, se, index, 0.7, segmentwise)
    rtol, atol = tol(dtype)
    for name, g, r in zip(["output", "normalization_factors", "posterior_weigths"], got, want):
        assert g.dtype == dtype
        np.testing.assert_array_equal(np.isinf(g), np.isinf(r), err_msg=name)
        fin = np.isfinite(r)
        np.testing.assert_allclose(g[fin], r[fin], rtol=rtol * 10, atol=atol * 10, err_msg=name)
    assert np.any(got[2] > 0)


# ------------------------------------------------------------------ Viterbi
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fast_viterbi_against_brute_force(mode, dtype):
    rng = np.random.default_rng(6)
    T, D = 5, 4
    edges, weights, se = ctc_graph([[1, 2], [3, 3], [1, 0]], [2, 2, 1], blank=0)
    lens = np.array([5, 2, 4])  # sequence 1 has no path ("3 3" needs 3 frames)
    am = ref.log_softmax(rng.normal(size=(T, 3, D)) * 2)
    a, s = pt.tensor3(dtype=dtype), pt.ivector()
    al, sc = fsa.fast_viterbi(a, s, edges, weights, se)
    got_a, got_s = pytensor.function([a, s], [al, sc], mode=mode)(am.astype(dtype), lens.astype(np.int32))
    want_a, want_s = ref.viterbi_brute(am.astype(dtype).astype(np.float64), edges, weights, se, lens)
    rtol, atol = tol(dtype)
    assert got_a.dtype == np.int32 and got_s.dtype == dtype
    np.testing.assert_allclose(got_s, want_s, rtol=rtol, atol=atol)
    np.testing.assert_array_equal(got_a, want_a)
    assert got_s[1] == -np.inf and np.all(got_a[:, 1] == 0)


def test_fast_viterbi_ties_and_errors():
    # integer scores make many exact ties; the backtrace takes the lowest edge index per frame
    rng = np.random.default_rng(7)
    T, B, D = 4, 2, 2
    edges, weights, se = random_fsa(rng, B, 3, 8, D)
    weights = np.floor(weights)
    am = rng.integers(-1, 1, size=(T, B, D)).astype(np.float64)
    lens = np.array([4, 3], np.int32)
    a, s = pt.tensor3(), pt.ivector()
    f = pytensor.function([a, s], list(fsa.fast_viterbi(a, s, edges, weights, se)))
    got_a, got_s = f(am, lens)
    want_a, want_s = ref.viterbi_brute(am, edges, weights, se, lens)
    np.testing.assert_array_equal(got_s, want_s)
    np.testing.assert_array_equal(got_a, want_a)
    with pytest.raises(ValueError, match=r"fast_viterbi: am_seq_len\[0\] = 5 exceeds the number of frames T = 4"):
        f(am, np.array([5, 3], np.int32))
    with pytest.raises(ValueError, match=r"fast_viterbi: am_seq_len\[1\] = -2 is negative"):
        f(am, np.array([4, -2], np.int32))
    e, w = pt.imatrix(), pt.vector()
    g = pytensor.function([a, s, e, w], list(fsa.fast_viterbi(a, s, e, w, se)))
    bad = edges.copy()
    bad[2, 0] = D
    with pytest.raises(ValueError, match=r"fast_viterbi: edges\[2, 0\] = 2 \(the emission of edge 0\)"):
        g(am, lens, bad, weights)


# ------------------------------------------------------------------ CTC loss
CTC_CASES = dict(
    targets=np.array([[1, 2, 2], [3, 3, 0], [1, 0, 0], [0, 0, 0], [2, 2, 2]], np.int32),
    tlens=np.array([3, 2, 1, 0, 3], np.int32),
    lens=np.array([7, 5, 6, 3, 4], np.int32),  # the last one has no path (needs 5 frames)
)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("blank_index", [0, -1])
def test_ctc_loss_against_graves(mode, dtype, blank_index):
    rng = np.random.default_rng(8)
    T, B, D = 7, 5, 5
    targets = CTC_CASES["targets"] + (1 if blank_index == 0 else 0)
    targets = np.where(targets >= D, D - 2, targets).astype(np.int32)
    blank = blank_index % D
    logits = (rng.normal(size=(T, B, D)) * 2).astype(dtype)
    up = rng.random(B)
    x = pt.tensor3("logits", dtype=dtype)
    losses = [fsa.ctc_loss(x, CTC_CASES["lens"], targets, CTC_CASES["tlens"], blank_index=blank_index,
                           zero_infinity=z) for z in (False, True)]
    grads = [pytensor.grad(pt.sum(pt.switch(pt.isinf(lo), 0, lo) * up), x) for lo in losses]
    f = pytensor.function([x], losses + grads, mode=mode)
    l0, l1, g0, g1 = f(logits)
    nll, grad = ref.ctc_graves(logits.astype(np.float64), CTC_CASES["lens"], targets, CTC_CASES["tlens"], blank)
    rtol, atol = tol(dtype)
    assert np.isinf(nll[-1]) and np.isinf(l0[-1]) and l1[-1] == 0
    np.testing.assert_allclose(l0[:-1], nll[:-1], rtol=rtol, atol=atol)
    np.testing.assert_allclose(l1[:-1], nll[:-1], rtol=rtol, atol=atol)
    want = grad * up[None, :, None]
    want[:, -1] = 0  # switch(isinf) cuts the impossible sequence
    np.testing.assert_allclose(g0, want, rtol=rtol * 10, atol=atol * 10)
    np.testing.assert_allclose(g1, want, rtol=rtol * 10, atol=atol * 10)
    assert l0.dtype == dtype and g0.dtype == dtype


def test_ctc_loss_gradient_without_zero_infinity_and_normalized():
    rng = np.random.default_rng(9)
    T, B, D = 6, 3, 4
    logits = rng.normal(size=(T, B, D))
    targets, tlens, lens = np.array([[1, 1], [2, 3], [1, 2]]), np.array([2, 2, 2]), np.array([6, 4, 1])
    x = pt.tensor3("x")
    for normalized in (False, True):
        inp = ref.log_softmax(logits) if normalized else logits
        loss = fsa.ctc_loss(x, lens, targets, tlens, blank_index=0, logits_normalized=normalized)
        f = pytensor.function([x], [loss, pytensor.grad(loss[:2].sum(), x), pytensor.grad(loss.sum(), x)])
        lo, g, gall = f(inp)
        nll, grad = ref.ctc_graves(inp, lens, targets, tlens, 0, normalized=normalized)
        np.testing.assert_allclose(lo, nll, rtol=1e-10)
        grad_two = grad.copy()
        grad_two[:, 2] = 0
        np.testing.assert_allclose(g, grad_two, atol=1e-10)
        # the impossible sequence (1 frame for 2 labels): loss inf, gradient softmax (or 0 if normalized)
        np.testing.assert_allclose(gall[:, 2], grad[:, 2], atol=1e-12)


@pytest.mark.parametrize("normalized", [False, True])
def test_ctc_loss_verify_grad(normalized):
    rng = np.random.default_rng(10)
    T, B, D = 5, 3, 4
    targets, tlens, lens = np.array([[1, 1], [2, 3], [3, 0]]), np.array([2, 2, 1]), np.array([5, 4, 2])
    logits = rng.normal(size=(T, B, D))
    if normalized:
        logits = ref.log_softmax(logits)
    weights = rng.random(B)

    def cost(x):
        return (fsa.ctc_loss(x, lens, targets, tlens, blank_index=0, logits_normalized=normalized) * weights).sum()

    verify_grad(cost, [logits], rng=rng)


def test_ctc_loss_rna_against_edge_forward_backward():
    rng = np.random.default_rng(11)
    T, B, D = 6, 3, 4
    targets, tlens, lens = np.array([[1, 1], [2, 3], [3, 0]]), np.array([2, 2, 1]), np.array([6, 2, 4])
    logits = rng.normal(size=(T, B, D))
    x = pt.tensor3("x")
    loss = fsa.ctc_loss(x, lens, targets, tlens, blank_index=0, label_loop=False)
    lo, g = pytensor.function([x], [loss, pytensor.grad(loss.sum(), x)])(logits)
    edges, weights, se = ctc_graph(targets, tlens, 0, label_loop=False)
    lp = ref.log_softmax(logits)
    nll, post = ref.forward_backward_edges(-lp, edges, weights, se, lens)
    np.testing.assert_allclose(lo, nll, rtol=1e-10)
    valid = mask_of(lens, T)[:, :, None]
    np.testing.assert_allclose(g, (np.exp(lp) - post) * valid, atol=1e-10)


def test_ctc_loss_viterbi():
    rng = np.random.default_rng(12)
    T, B, D = 5, 3, 4
    targets, tlens, lens = np.array([[1, 2], [3, 3], [1, 0]]), np.array([2, 2, 1]), np.array([5, 2, 4])
    logits = rng.normal(size=(T, B, D)) * 2
    x = pt.tensor3("x")
    loss = fsa.ctc_loss_viterbi(x, lens, targets, tlens, blank_index=0)
    loss_z = fsa.ctc_loss_viterbi(x, lens, targets, tlens, blank_index=0, zero_infinity=True)
    lo, lz, g = pytensor.function([x], [loss, loss_z, pytensor.grad(loss_z.sum(), x)])(logits)
    lp = ref.log_softmax(logits)
    for b in range(B):
        best, best_path = np.inf, None
        for seq in ref.all_sequences(lens[b], D):
            if ref.ctc_collapse(seq, 0) == list(targets[b, : tlens[b]]):
                v = -sum(lp[t, b, s] for t, s in enumerate(seq))
                if v < best:
                    best, best_path = v, seq
        if best_path is None:
            assert np.isinf(lo[b]) and lz[b] == 0 and np.all(g[:, b] == 0)
            continue
        np.testing.assert_allclose(lo[b], best, rtol=1e-10)
        want = np.zeros((T, D))
        for t, s in enumerate(best_path):
            want[t] = np.exp(lp[t, b])
            want[t, s] -= 1
        np.testing.assert_allclose(g[:, b], want, atol=1e-10)


@pytest.mark.parametrize("fn", ["ctc_loss", "ctc_loss_viterbi"])
def test_ctc_loss_bad_input(mode, fn):
    """Errors name the function and the argument as the user passed it."""
    x = pt.tensor3("x")
    t, tl, l_, bl = pt.imatrix("t"), pt.ivector("tl"), pt.ivector("l"), pt.iscalar("blank")
    loss_fn = getattr(fsa, fn)
    f = pytensor.function([x, t, tl, l_, bl], loss_fn(x, l_, t, tl, blank_index=bl), mode=mode)
    logits = np.zeros((4, 2, 3))
    ok = (np.array([[0, 1], [1, 1]], np.int32), np.array([2, 1], np.int32), np.array([4, 3], np.int32), np.int32(2))
    assert np.isfinite(f(logits, *ok)).all()
    with pytest.raises(ValueError, match=rf"{fn}: targets\[0, 1\] = 3 is out of range \[0, D = 3\) "
                                         rf"\(D = logits.shape\[2\]\)"):
        f(logits, np.array([[0, 3], [1, 1]], np.int32), *ok[1:])  # label 3 >= D
    with pytest.raises(ValueError, match=rf"{fn}: logits_seq_lens\[0\] = 5 exceeds the number of frames T = 4 "
                                         rf"\(logits.shape\[0\]\)"):
        f(logits, ok[0], ok[1], np.array([5, 3], np.int32), ok[3])
    with pytest.raises(ValueError, match=rf"{fn}: logits_seq_lens\[1\] = -1 is negative"):
        f(logits, ok[0], ok[1], np.array([4, -1], np.int32), ok[3])
    with pytest.raises(ValueError, match=rf"{fn}: targets_seq_lens\[0\] = 3 exceeds the number of labels N = 2 "
                                         rf"\(targets.shape\[1\]\)"):
        f(logits, ok[0], np.array([3, 1], np.int32), *ok[2:])
    with pytest.raises(ValueError, match=rf"{fn}: blank_index = 3 is out of range \[-D, D\) for D = 3"):
        f(logits, *ok[:3], np.int32(3))
    with pytest.raises(ValueError, match=rf"{fn}: blank_index = -4 is out of range"):
        f(logits, *ok[:3], np.int32(-4))
    with pytest.raises(ValueError, match=rf"{fn}: logits_seq_lens must have shape \(B = 3,\)"):
        f(np.zeros((4, 3, 3)), *ok)  # B mismatch
    with pytest.raises(ValueError, match=rf"{fn}: blank_index = 5 is out of range \[-D, D\) for D = 3"):
        loss_fn(pt.tensor3(shape=(None, None, 3)), l_, t, tl, blank_index=5)
    with pytest.raises(TypeError, match=r"^ctc_loss\w*: targets must have an integer or bool dtype, got float64"):
        loss_fn(x, l_, pt.matrix(), tl)
    with pytest.raises(ValueError, match=rf"^{fn}: logits must have ndim 3"):
        loss_fn(pt.matrix(), l_, t, tl)
    for name, args in [("logits_seq_lens", (x, pt.vector(), t, tl)), ("targets_seq_lens", (x, l_, t, pt.vector()))]:
        with pytest.raises(TypeError, match=rf"^{fn}: {name} must have an integer or bool dtype, got float"):
            loss_fn(*args)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("normalized", [False, True])
def test_ctc_loss_nan_gives_nan_for_its_sequence(mode, dtype, normalized):
    """A NaN logit on a valid frame: that sequence's loss and its gradient on its valid frames are NaN (also with
    zero_infinity, which only maps inf to 0); a NaN on a padded frame changes nothing; the other sequences
    equal Graves' recursion."""
    rng = np.random.default_rng(17)
    T, B, D = 6, 4, 4
    targets, tlens = np.array([[1, 2], [3, 3], [1, 0], [2, 1]]), np.array([2, 2, 1, 2])
    lens = np.array([6, 5, 4, 6])
    logits = rng.normal(size=(T, B, D)) * 2
    if normalized:
        logits = ref.log_softmax(logits)
    bad = logits.copy()
    bad[2, 1, 3] = np.nan  # valid frame of sequence 1
    bad[5, 2, 0] = np.nan  # padded frame of sequence 2
    x = pt.tensor3("x", dtype=dtype)
    outs = []
    for z in (False, True):
        loss = fsa.ctc_loss(x, lens, targets, tlens, blank_index=0, logits_normalized=normalized, zero_infinity=z)
        outs += [loss, pytensor.grad(loss.sum(), x)]
    l0, g0, l1, g1 = pytensor.function([x], outs, mode=mode)(bad.astype(dtype))
    nll, grad = ref.ctc_graves(logits.astype(dtype).astype(np.float64), lens, targets, tlens, 0,
                               normalized=normalized)
    rtol, atol = tol(dtype)
    others = [0, 2, 3]
    valid = mask_of(lens, T).astype(bool)
    for lo, g in ((l0, g0), (l1, g1)):
        assert np.isnan(lo[1])
        np.testing.assert_allclose(lo[others], nll[others], rtol=rtol, atol=atol)
        assert np.isnan(g[valid[:, 1], 1]).all() and np.all(g[~valid[:, 1], 1] == 0)
        np.testing.assert_allclose(g[:, others], grad[:, others], rtol=rtol * 10, atol=atol * 10)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ctc_loss_viterbi_nan_gives_nan_for_its_sequence(mode, dtype):
    rng = np.random.default_rng(18)
    T, B, D = 5, 3, 4
    targets, tlens, lens = np.array([[1, 2], [3, 3], [1, 0]]), np.array([2, 2, 1]), np.array([5, 5, 4])
    logits = (rng.normal(size=(T, B, D)) * 2).astype(dtype)
    bad = logits.copy()
    bad[3, 0, 2] = np.nan
    x = pt.tensor3("x", dtype=dtype)
    loss = fsa.ctc_loss_viterbi(x, lens, targets, tlens, blank_index=0, zero_infinity=True)
    f = pytensor.function([x], [loss, pytensor.grad(loss.sum(), x)], mode=mode)
    lo, g = f(bad)
    lo_ok, g_ok = f(logits)
    assert np.isnan(lo[0]) and np.isnan(g[:, 0]).all()
    np.testing.assert_array_equal(lo[1:], lo_ok[1:])
    np.testing.assert_array_equal(g[:, 1:], g_ok[:, 1:])
    assert np.isfinite(lo_ok).all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ctc_empty_target_over_zero_frames(mode, dtype):
    """T_b = 0 with an empty target: the empty alignment, loss 0, gradient 0; T_b = 0 with a label: inf (0 with
    zero_infinity); a whole batch with T = 0 likewise.  Both losses, logits or log-probabilities."""
    rng = np.random.default_rng(19)
    T, D = 4, 3
    targets, tlens, lens = np.array([[1, 2], [0, 0], [1, 0], [2, 0]]), np.array([2, 0, 1, 0]), np.array([4, 0, 0, 3])
    logits = (rng.normal(size=(T, 4, D))).astype(dtype)
    x = pt.tensor3("x", dtype=dtype)
    for loss_fn in (fsa.ctc_loss, fsa.ctc_loss_viterbi):
        for normalized in (False, True):
            loss = loss_fn(x, lens, targets, tlens, blank_index=0, logits_normalized=normalized)
            lz = loss_fn(x, lens, targets, tlens, blank_index=0, logits_normalized=normalized, zero_infinity=True)
            f = pytensor.function([x], [loss, lz, pytensor.grad(lz.sum(), x)], mode=mode)
            lo, lo_z, g = f(logits)
            assert lo[1] == 0 and lo[2] == np.inf and lo_z[2] == 0 and np.isfinite(lo[[0, 3]]).all()
            assert np.all(g[:, 1] == 0) and np.all(g[:, 2] == 0)
            if loss_fn is fsa.ctc_loss:
                nll, _ = ref.ctc_graves(logits.astype(np.float64), lens, targets, tlens, 0)
                if not normalized:
                    np.testing.assert_allclose(lo, nll, rtol=tol(dtype)[0])
            lens0 = np.zeros(4, np.int32)
            l_empty = loss_fn(x, lens0, targets, np.array([0, 0, 1, 0]), blank_index=0)
            out = pytensor.function([x], [l_empty, pytensor.grad(pt.switch(pt.isinf(l_empty), 0, l_empty).sum(), x)],
                                    mode=mode)(np.zeros((0, 4, D), dtype))
            np.testing.assert_array_equal(out[0], [0, 0, np.inf, 0])
            assert out[1].shape == (0, 4, D)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fast_bw_and_viterbi_nan(mode, dtype):
    """FastBaumWelch: a NaN score on a valid frame or a NaN weight of one of its edges makes that sequence's
    outputs NaN on its valid frames; others unaffected.  Viterbi: score NaN, alignment 0."""
    rng = np.random.default_rng(20)
    T, D = 5, 4
    edges, weights, se = ctc_graph([[1, 2], [3, 3], [1, 0]], [2, 2, 1], blank=0)
    lens = np.array([5, 5, 4])
    am = -ref.log_softmax(rng.normal(size=(T, 3, D)) * 2)
    f = fbw_function(dtype, mode)
    bad = am.copy()
    bad[1, 0, 3] = np.nan
    bad[4, 2, 1] = np.nan  # padded frame of sequence 2
    out, sums = f(bad.astype(dtype), edges, weights.astype(dtype), se, mask_of(lens, T).astype(dtype))
    out_ok, sums_ok = f(am.astype(dtype), edges, weights.astype(dtype), se, mask_of(lens, T).astype(dtype))
    assert np.isnan(out[:, 0]).all() and np.isnan(sums[:, 0]).all()
    np.testing.assert_array_equal(out[:, 1:], out_ok[:, 1:])
    np.testing.assert_array_equal(sums[:, 1:], sums_ok[:, 1:])
    w_nan = weights.astype(dtype)
    w_nan[np.flatnonzero(edges[3] == 1)[3]] = np.nan
    out, sums = f(am.astype(dtype), edges, w_nan, se, mask_of(lens, T).astype(dtype))
    assert np.isnan(out[:, 1]).all() and np.isnan(sums[:, 1]).all()
    np.testing.assert_array_equal(out[:, [0, 2]], out_ok[:, [0, 2]])
    # Viterbi (+log scores)
    a, s = pt.tensor3(dtype=dtype), pt.ivector()
    g = pytensor.function([a, s], list(fsa.fast_viterbi(a, s, edges, weights.astype(dtype), se)), mode=mode)
    al, sc = g((-bad).astype(dtype), lens.astype(np.int32))
    al_ok, sc_ok = g((-am).astype(dtype), lens.astype(np.int32))
    assert np.isnan(sc[0]) and np.all(al[:, 0] == 0)
    np.testing.assert_array_equal(sc[1:], sc_ok[1:])
    np.testing.assert_array_equal(al[:, 1:], al_ok[:, 1:])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_hmm_nan_and_empty_series(mode, dtype):
    """A NaN log-emission on a valid frame: that sequence's log-likelihood and its emission gradient on its valid
    frames are NaN, the shared gradients too; other sequences unaffected.  A NaN transition: every sequence with
    a frame is NaN.  The empty series has log-likelihood 0 and gradient 0."""
    rng = np.random.default_rng(22)
    T, B, K = 5, 4, 3
    le, lA, lpi, lf = hmm_data(rng, T, B, K)
    lens = np.array([5, 3, 0, 4])
    xs = [pt.tensor3(dtype=dtype), pt.matrix(dtype=dtype), pt.vector(dtype=dtype), pt.vector(dtype=dtype)]
    ll = hmm.hmm_log_likelihood(*xs, mask=mask_of(lens, T).astype(dtype))
    f = pytensor.function(xs, [ll] + pytensor.grad(ll.sum(), xs), mode=mode)
    cast = [v.astype(dtype) for v in (le, lA, lpi, lf)]
    bad = cast[0].copy()
    bad[2, 1, 0] = np.nan
    bad[4, 1, 2] = np.nan  # padded frame of sequence 1
    v, d_e, d_A, d_pi, d_f = f(bad, *cast[1:])
    want = ref.hmm_forward(cast[0].astype(np.float64), lA, lpi, lf, lens)
    rtol, atol = tol(dtype)
    assert np.isnan(v[1]) and v[2] == 0
    np.testing.assert_allclose(v[[0, 3]], want[[0, 3]], rtol=rtol * 10, atol=atol * 10)
    assert np.isnan(d_e[:3, 1]).all() and np.all(d_e[3:, 1] == 0) and np.all(d_e[:, 2] == 0)
    assert np.isfinite(d_e[:, [0, 3]]).all()
    assert np.isnan(d_A).all() and np.isnan(d_pi).all() and np.isnan(d_f).all()
    A_nan = cast[1].copy()
    A_nan[0, 1] = np.nan
    v, d_e, *_ = f(cast[0], A_nan, *cast[2:])
    assert np.isnan(v[[0, 1, 3]]).all() and v[2] == 0 and np.all(d_e[:, 2] == 0)
    # the empty series alone and a whole batch with T = 0
    x = pt.tensor3(dtype=dtype)
    ll0 = hmm.hmm_log_likelihood(x, *cast[1:])
    g0 = pytensor.function([x], [ll0] + pytensor.grad(ll0.sum(), [x]), mode=mode)
    v0, d0 = g0(np.zeros((0, 2, K), dtype))
    np.testing.assert_array_equal(v0, [0.0, 0.0])
    assert d0.shape == (0, 2, K)


# ------------------------------------------------------------------ HMM
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_hmm_against_reference(mode, dtype):
    rng = np.random.default_rng(13)
    T, B, K = 7, 4, 3
    le, lA, lpi, lf = hmm_data(rng, T, B, K, 3.0)
    lens = np.array([7, 4, 1, 0])
    xs = [pt.tensor3(dtype=dtype), pt.matrix(dtype=dtype), pt.vector(dtype=dtype), pt.vector(dtype=dtype)]
    m = pt.matrix(dtype=dtype)
    ll = hmm.hmm_log_likelihood(*xs, mask=m)
    up = rng.random(B)
    f = pytensor.function(xs + [m], [ll] + pytensor.grad((ll * up).sum(), xs), mode=mode)
    got = f(*(v.astype(dtype) for v in (le, lA, lpi, lf, mask_of(lens, T))))
    gamma, xi = ref.hmm_posteriors(le, lA, lpi, lf, lens)
    want_pi = np.einsum("b,bk->k", up[lens > 0], gamma[0, lens > 0])
    want_f = sum(up[b] * gamma[lens[b] - 1, b] for b in range(B) if lens[b] > 0)
    want = [ref.hmm_forward(le, lA, lpi, lf, lens), gamma * up[None, :, None], np.einsum("b,bij->ij", up, xi),
            want_pi, want_f]  # the empty sequence: log-likelihood 0, no gradient
    rtol, atol = tol(dtype)
    for name, g, w in zip(["ll", "d_e", "d_A", "d_pi", "d_f"], got, want):
        assert g.dtype == dtype
        np.testing.assert_allclose(g, w, rtol=rtol * 10, atol=atol * 10, err_msg=name)


def test_hmm_verify_grad_and_extremes():
    rng = np.random.default_rng(14)
    le, lA, lpi, lf = hmm_data(rng, 5, 2, 3)
    mask = mask_of([5, 3], 5)

    def cost(le, lA, lpi, lf):
        return (hmm.hmm_log_likelihood(le, lA, lpi, lf, mask=mask) * np.array([1.0, 0.7])).sum()

    verify_grad(cost, [le, lA, lpi, lf], rng=rng)
    # long sequences with huge positive and negative log-densities: finite, exact
    T = 3000
    le, lA, lpi, _ = hmm_data(rng, T, 1, 3, 1.0)
    le = le * 800 + 300
    x = pt.tensor3()
    ll = hmm.hmm_log_likelihood(x, lA, lpi)
    f = pytensor.function([x], [ll, pytensor.grad(ll.sum(), x)])
    v, g = f(le)
    np.testing.assert_allclose(v, ref.hmm_forward(le, lA, lpi), rtol=1e-12)
    assert np.isfinite(g).all()
    np.testing.assert_allclose(g.sum(-1), 1.0, atol=1e-9)


def test_hmm_log_space_fallback(mode):
    """Gaps beyond double's range within one step (the scaled pass underflows to 0): exact
    values and gradients from the log-space recomputation; no path at all: -inf, zero gradient."""
    K, T = 2, 3
    lA = np.array([[0.0, -800.0], [-800.0, 0.0]])
    lpi = np.array([0.0, -5.0])
    lf = np.array([0.0, -2.0])
    le = np.zeros((T, 3, K))
    le[:, 0] = [[0.0, -1000.0], [-1000.0, 0.0], [-3.0, -1.0]]  # best path jumps 0 -> 1 across 800 nats
    le[:, 1] = np.random.default_rng(16).normal(size=(T, K))      # an ordinary sequence
    le[1, 2] = -np.inf                                           # no path
    lens = np.array([3, 3, 2])
    xs = [pt.tensor3(), pt.matrix(), pt.vector(), pt.vector()]
    ll = hmm.hmm_log_likelihood(*xs, mask=mask_of(lens, T))
    up = np.array([1.0, 0.5, 2.0])
    f = pytensor.function(xs, [ll] + pytensor.grad((ll * up).sum(), xs), mode=mode)
    v, d_e, d_A, d_pi, d_f = f(le, lA, lpi, lf)
    want = ref.hmm_forward(le, lA, lpi, lf, lens)
    assert np.isfinite(want[0]) and want[0] < -790 and want[2] == -np.inf
    np.testing.assert_allclose(v[:2], want[:2], rtol=1e-12)
    assert v[2] == -np.inf
    gamma, xi = ref.hmm_posteriors(le[:, :2], lA, lpi, lf, lens[:2])
    np.testing.assert_allclose(d_e[:, :2], gamma * up[None, :2, None], atol=1e-10)
    np.testing.assert_allclose(d_A, np.einsum("b,bij->ij", up[:2], xi), atol=1e-10)
    np.testing.assert_allclose(d_pi, (gamma[0] * up[:2, None]).sum(0), atol=1e-10)
    np.testing.assert_allclose(d_f, gamma[2, 0] * up[0] + gamma[2, 1] * up[1], atol=1e-10)
    assert np.all(d_e[:, 2] == 0)  # the impossible sequence contributes nothing


def test_hmm_bad_input(mode):
    x, m, lA = pt.tensor3(), pt.matrix(), pt.matrix()
    f = pytensor.function([x, m, lA], hmm.hmm_log_likelihood(x, lA, np.zeros(2), mask=m), mode=mode)
    A = np.zeros((2, 2))
    fn = "HmmForwardBackwardOp.*hmm_log_likelihood: "
    with pytest.raises(ValueError, match=fn + r"mask\[:, 0\] is not a prefix mask \(1 at frame 2 after a 0\)"):
        f(np.zeros((3, 1, 2)), np.array([[1.0], [0.0], [1.0]]), A)
    with pytest.raises(ValueError, match=fn + r"mask\[1, 0\] = 0.5 is not 0 or 1"):
        f(np.zeros((3, 1, 2)), np.array([[1.0], [0.5], [0.0]]), A)
    with pytest.raises(ValueError, match=fn + r"log_transitions must have shape \(K, K\), got \(2, 2\) "
                                              r"\(log_emissions has shape \(3, 1, 3\)\)"):
        f(np.zeros((3, 1, 3)), np.ones((3, 1)), A)  # K mismatch
    with pytest.raises(ValueError, match=fn + r"mask must have shape \(T, B\), got \(2, 1\)"):
        f(np.zeros((3, 1, 2)), np.ones((2, 1)), A)
    le = np.zeros((3, 1, 2))
    le[2, 0, 1] = np.inf
    with pytest.raises(ValueError, match=fn + r"log_emissions\[2, 0, 1\] = inf is infinitely likely"):
        f(le, np.ones((3, 1)), A)
    A_inf = A.copy()
    A_inf[1, 0] = np.inf
    with pytest.raises(ValueError, match=fn + r"log_transitions.flat\[2\] = inf"):
        f(np.zeros((3, 1, 2)), np.ones((3, 1)), A_inf)
    np.testing.assert_array_equal(f(np.zeros((0, 2, 2)), np.zeros((0, 2)), A), [0.0, 0.0])


# ------------------------------------------------------------------ threads
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_results_do_not_depend_on_the_thread_count(monkeypatch, dtype):
    """The CPU kernels split the batch over $PTNATIVE_NUM_THREADS threads, a sequence per task: the results are
    the same, bit for bit, with 1, 2 and 3 threads (a problem big enough to be split), ragged lengths, one
    sequence recomputed in log space and one NaN sequence included."""
    rng = np.random.default_rng(21)
    T, B, D, N = 200, 10, 12, 10
    logits = rng.normal(size=(T, B, D)).astype(dtype)
    logits[:, 2] *= 3000  # beyond the scaled pass's range: log space
    logits[5, 4, 3] = np.nan
    lens = rng.integers(0, T + 1, size=B).astype(np.int32)
    lens[[2, 4]] = T
    tlens = rng.integers(0, N + 1, size=B).astype(np.int32)
    targets = rng.integers(0, D - 1, size=(B, N)).astype(np.int32)
    x = pt.tensor3(dtype=dtype)
    outs = []
    for fn in (fsa.ctc_loss, fsa.ctc_loss_viterbi):
        loss = fn(x, lens, targets, tlens)
        outs += [loss, pytensor.grad(loss.sum(), x)]
    edges, weights, se = fsa.get_ctc_fsa_fast_bw(targets, tlens, D - 1)
    outs += list(fsa.fast_baum_welch(-x, edges, weights, se, pt.constant(mask_of(lens, T).astype(dtype))))
    outs += list(fsa.fast_viterbi(x, lens, edges, weights, se))
    f = pytensor.function([x], outs, mode="FAST_COMPILE")
    results = {}
    for n in (1, 2, 3):
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", str(n))
        results[n] = f(logits)
    assert np.isnan(results[1][0][4]) and np.isfinite(results[1][0][2])
    for n in (2, 3):
        for a, b in zip(results[1], results[n]):
            np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ shapes, nvcc
def test_infer_shape():
    rng = np.random.default_rng(15)
    edges, weights, se = ctc_graph([[1, 2]], [2], blank=0)
    a, m = pt.tensor3(), pt.matrix()
    outs = fsa.fast_baum_welch(a, edges, weights, se, m)
    check_infer_shape([a, m], list(outs), [rng.random((4, 1, 3)), np.ones((4, 1))], NativeOp)
    s = pt.ivector()
    outs = fsa.fast_viterbi(a, s, edges, weights, se)
    check_infer_shape([a, s], list(outs), [rng.random((4, 1, 3)), np.array([4], np.int32)], NativeOp)
    tg, tl = pt.imatrix(), pt.ivector()
    outs = fsa.get_ctc_fsa_fast_bw(tg, tl, 0)
    check_infer_shape([tg, tl], [outs[0], outs[2]], [np.ones((2, 3), np.int32), np.array([3, 1], np.int32)],
                      NativeOp)
    ll = hmm.hmm_log_likelihood(a, np.zeros((3, 3)), np.zeros(3))
    check_infer_shape([a], [ll], [rng.random((4, 2, 3))], NativeOp)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_fsa_kernels_compile_with_nvcc(monkeypatch):
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    ops = [cls.make_op() for cls in (fsa.FastBaumWelchOp, fsa.MultiEndFastBaumWelchOp, fsa.SegmentFastBaumWelchOp,
                                     fsa.FastViterbiOp, fsa.GetCtcFsaFastBwOp, fsa.CtcFsaLossOp, fsa.CtcViterbiLossOp,
                                     hmm.HmmForwardBackwardOp)]
    ops += [op.grad_op() for op in ops if op.c_bw_code]
    build_with_nvcc(*(o.variant("float32", device="cuda") for o in ops))
