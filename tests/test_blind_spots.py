"""What the family tests never varied (issue 14, "Test blind spots"), each against an independent reference:

* every catalogue function called with its default arguments (a changed default fails a test);
* mask values on both sides of (and at) every documented cut-off: sparse masks ``>= 0.1``, chunking
  ``> 0.1``, the sparse cross-entropy's frame mask ``> 0.5``;
* multi-word bit-parallel edit distances: lengths 63/64/65/127/128/129 and longer, carries across words,
  all-equal and all-different strings, both sequences on the bit axis;
* NativeLstm2, LstmLowMem, TwoDLSTM, LstmCell, MultiEnd/Segment Baum-Welch and ``ctc_loss_viterbi`` against
  their references in every mode, float64 values at 1e-12 relative (the references compute the same
  numbers in another order), integer and copied results exactly.
"""

import itertools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import ptnative
from ptnative.ops import chunking, edit_distance as ed, fsa, lstm, rnnt, sparse

from .reference import chunking as ref_chunking
from .reference import edit_distance as ref_ed
from .reference import fsa as ref_fsa
from .reference import lstm as ref_lstm
from .reference import rnnt as ref_rnnt
from .reference import sparse as ref_sparse
from .test_fsa import segment_columns

RTOL, ATOL = 1e-12, 1e-13  # float64 values vs a float64 reference computing them in another order
FD_RTOL, FD_ATOL = 1e-6, 1e-7  # gradients vs central finite differences


def close(got, want, what, rtol=RTOL, atol=ATOL):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def mask_of(lens, T):
    return (np.arange(T)[:, None] < np.asarray(lens)[None, :]).astype(np.float64)


# =============================================================================================== defaults
def test_rnnt_loss_defaults():
    """blank=0, fastemit_lambda=0, clamp=-1 (off), reduction="none": labels avoid class 0 and class K-1, so a
    different default blank changes the lattice."""
    rng = np.random.default_rng(0)
    B, T, U, K = 3, 5, 3, 5
    acts = rng.normal(size=(B, T, U + 1, K)) * 2
    labels = rng.integers(1, K - 1, size=(B, U)).astype(np.int32)
    act_lens, label_lens = np.array([5, 3, 4], np.int32), np.array([3, 1, 0], np.int32)
    x = pt.tensor4("acts")
    cost = ptnative.rnnt_loss(x, labels, act_lens, label_lens)
    assert cost.ndim == 1
    got_c, got_g = pytensor.function([x], [cost, pytensor.grad((cost * [1.0, 2.0, 3.0]).sum(), x)])(acts)
    costs, grads = ref_rnnt.batch_lattice(acts, labels, act_lens, label_lens, blank=0)[:2]
    close(got_c, costs, "costs")
    close(got_g, grads * np.array([1.0, 2.0, 3.0])[:, None, None, None], "gradient")
    for b in range(B):  # the lattice reference against path enumeration
        close(ref_rnnt.brute_force_loglik(acts[b], labels[b], act_lens[b], label_lens[b], 0), -costs[b], "brute")
    # large logits: an unclamped gradient has entries beyond 0.5 in magnitude (clamp default off)
    assert np.abs(got_g).max() > 0.5


def test_multiblank_rnnt_loss_and_lattice_defaults():
    """sigma=0, fastemit_lambda=0, clamp=-1, reduction="none"; the lattice's big_blank_durations=()."""
    rng = np.random.default_rng(1)
    B, T, U, K = 2, 6, 2, 6
    acts = rng.normal(size=(B, T, U + 1, K)) * 2
    labels = rng.integers(0, K - 2, size=(B, U)).astype(np.int32)
    act_lens, label_lens = np.array([6, 4], np.int32), np.array([2, 1], np.int32)
    x = pt.tensor4("acts")
    cost = ptnative.multiblank_rnnt_loss(x, labels, act_lens, label_lens, K - 1, (2,))
    lat = ptnative.multiblank_rnnt_lattice(x, labels, act_lens, label_lens, K - 1)
    got = pytensor.function([x], [cost, pytensor.grad(cost.sum(), x), *lat])(acts)
    want = ref_rnnt.batch_lattice(acts, labels, act_lens, label_lens, K - 1, (2,))
    close(got[0], want[0], "multiblank costs")
    close(got[1], want[1], "multiblank gradient")
    want0 = ref_rnnt.batch_lattice(acts, labels, act_lens, label_lens, K - 1, ())
    for name, g, w in zip(["costs", "grads", "loglik", "alphas", "betas", "lognorm"], got[2:], want0):
        close(g, w, f"lattice {name}")


def test_ctc_loss_defaults():
    """blank_index=-1 (the last class), label_loop=True, logits_normalized=False, zero_infinity=False."""
    rng = np.random.default_rng(2)
    T, B, D = 6, 4, 4
    logits = rng.normal(size=(T, B, D)) * 2
    targets = np.array([[1, 1, 2], [0, 2, 0], [2, 2, 2], [1, 0, 0]], np.int32)  # label 0 is not the blank
    tlens, lens = np.array([3, 2, 3, 1], np.int32), np.array([6, 5, 4, 3], np.int32)  # sequence 2 has no path
    x = pt.tensor3("logits")
    loss = ptnative.ctc_loss(x, lens, targets, tlens)
    got_l, got_g = pytensor.function([x], [loss, pytensor.grad(loss.sum(), x)])(logits)
    nll, grad = ref_fsa.ctc_graves(logits, lens, targets, tlens, blank=D - 1)
    assert got_l[2] == np.inf  # zero_infinity=False by default
    close(got_l, nll, "loss")
    close(got_g, grad, "gradient")


def best_ctc_path(lp, T, target, blank, D):
    best, path = np.inf, None
    for seq in itertools.product(range(D), repeat=T):
        if ref_fsa.ctc_collapse(list(seq), blank) == list(target):
            v = -sum(lp[t, s] for t, s in enumerate(seq))
            if v < best:
                best, path = v, seq
    return best, path


def ctc_viterbi_reference(logits, lens, targets, tlens, blank, normalized=False):
    """(loss, gradient of loss.sum()) by enumerating every frame labelling (tiny cases); 0 gradient and an
    infinite loss without a path."""
    lp = logits if normalized else ref_fsa.log_softmax(logits)
    T, B, D = logits.shape
    loss, grad = np.full(B, np.inf), np.zeros_like(logits)
    for b in range(B):
        best, path = best_ctc_path(lp[:, b], int(lens[b]), targets[b, :tlens[b]], blank, D)
        if path is None:
            continue
        loss[b] = best
        for t, s in enumerate(path):
            grad[t, b] = 0 if normalized else np.exp(lp[t, b])
            grad[t, b, s] -= 1
    return loss, grad


def test_ctc_loss_viterbi_defaults():
    rng = np.random.default_rng(3)
    T, B, D = 5, 3, 3
    logits = rng.normal(size=(T, B, D)) * 2
    targets, tlens, lens = np.array([[0, 1], [1, 1], [0, 0]], np.int32), np.array([2, 2, 1], np.int32), \
        np.array([5, 2, 4], np.int32)
    x = pt.tensor3("logits")
    loss = ptnative.ctc_loss_viterbi(x, lens, targets, tlens)
    got_l, got_g = pytensor.function([x], [loss, pytensor.grad(loss.sum(), x)])(logits)
    want_l, want_g = ctc_viterbi_reference(logits, lens, targets, tlens, blank=D - 1)
    assert got_l[1] == np.inf  # "1 1" needs 3 frames; zero_infinity=False by default
    close(got_l, want_l, "loss")
    close(got_g, want_g, "gradient")


def test_get_ctc_fsa_and_fast_baum_welch_defaults():
    """get_ctc_fsa_fast_bw's label_loop=True (CTC, not RNA) and fast_baum_welch's state_buffer=None: the
    automaton's Baum-Welch -log p equals Graves' CTC recursion, and the posteriors its gamma."""
    rng = np.random.default_rng(4)
    T, B, D, blank = 6, 3, 4, 0
    targets, tlens = np.array([[1, 1, 3], [2, 3, 0], [3, 0, 0]], np.int32), np.array([3, 2, 1], np.int32)
    lens = np.array([6, 4, 2], np.int32)
    logits = rng.normal(size=(T, B, D))
    edges, weights, se = (np.asarray(v) for v in pytensor.function(  # input data: no Numba compilation
        [], list(ptnative.get_ctc_fsa_fast_bw(targets, tlens, blank)), mode="FAST_COMPILE")())
    a = pt.tensor3("am")
    out, obs = ptnative.fast_baum_welch(a, edges, weights, se, mask_of(lens, T))
    got_out, got_obs = pytensor.function([a], [out, obs])(-ref_fsa.log_softmax(logits))
    nll, grad = ref_fsa.ctc_graves(logits, lens, targets, tlens, blank)
    close(got_obs, mask_of(lens, T) * nll[None], "obs_scores = Graves' -log p on valid frames")
    posterior = np.exp(ref_fsa.log_softmax(logits)) - grad  # softmax - gradient
    valid = mask_of(lens, T)[:, :, None] > 0
    close(np.where(valid, np.exp(-got_out), 0), np.where(valid, posterior, 0), "posteriors")


def test_fast_viterbi_against_brute_force_all_defaults_given():
    """fast_viterbi has no defaults; the one call of the catalogue left, against path enumeration."""
    rng = np.random.default_rng(5)
    edges, weights, se = (np.asarray(v) for v in pytensor.function(  # input data: no Numba compilation
        [], list(ptnative.get_ctc_fsa_fast_bw(np.array([[1, 2], [2, 2]], np.int32), np.array([2, 2], np.int32),
                                              0)), mode="FAST_COMPILE")())
    am = ref_fsa.log_softmax(rng.normal(size=(5, 2, 3)))
    lens = np.array([5, 4], np.int32)
    al, sc = pytensor.function([], list(ptnative.fast_viterbi(am, lens, edges, weights, se)))()
    want_al, want_sc = ref_fsa.viterbi_brute(am, edges, weights, se, lens)
    np.testing.assert_array_equal(al, want_al)
    close(sc, want_sc, "scores")


def test_hmm_log_likelihood_defaults():
    """log_final=None means 0 (no final weighting), mask=None means every frame."""
    rng = np.random.default_rng(6)
    T, B, K = 6, 3, 3
    le = rng.normal(size=(T, B, K)) * 2
    lA, lpi = np.log(rng.dirichlet(np.ones(K), size=K)), np.log(rng.dirichlet(np.ones(K)))
    x = pt.tensor3("le")
    ll = ptnative.hmm_log_likelihood(x, lA, lpi)
    got, g = pytensor.function([x], [ll, pytensor.grad(ll.sum(), x)])(le)
    close(got, ref_fsa.hmm_forward(le, lA, lpi), "log_likelihood")
    gamma = ref_fsa.hmm_posteriors(le, lA, lpi)[0]
    close(g, gamma, "emission gradient = state posteriors", rtol=1e-9, atol=1e-11)


def test_hmm_inference_defaults():
    """hmm_viterbi, hmm_posteriors and hmm_sample_states: log_final=None means 0, mask=None every frame."""
    from ptnative.ops import hmm

    from .fuzz_cases import HmmSampleH
    from .reference import hmm as ref_hmm

    rng = np.random.default_rng(23)
    T, B, K = 5, 3, 3
    le = rng.normal(size=(T, B, K)) * 2
    lA, lpi = np.log(rng.dirichlet(np.ones(K), size=K)), np.log(rng.dirichlet(np.ones(K)))
    u = rng.random((T, B))
    path, score = pytensor.function([], list(hmm.hmm_viterbi(le, lA, lpi)))()
    want_path, want_score = ref_hmm.viterbi(le, lA, lpi)
    np.testing.assert_array_equal(path, want_path)
    close(score, want_score, "viterbi score")
    marg, counts = pytensor.function([], list(hmm.hmm_posteriors(le, lA, lpi)))()
    want_marg, want_counts = ref_fsa.hmm_posteriors(le, lA, lpi)
    close(marg, want_marg, "marginals")
    close(counts, want_counts, "counts")
    sample = pytensor.function([], hmm.hmm_sample_states(le, lA, lpi, uniforms=u))()
    np.testing.assert_array_equal(sample, HmmSampleH(None).reference([le, lA, lpi, np.zeros(K), np.ones((T, B)), u])[0])


def test_lstm_defaults():
    """y0=c0=0, mask=ones, direction=1, impl="native2"."""
    rng = np.random.default_rng(7)
    T, B, n_in, n = 5, 3, 2, 3
    x, W_in, W_rec, b = (rng.normal(size=(T, B, n_in)), rng.normal(size=(n_in, 4 * n)),
                         rng.normal(size=(n, 4 * n)) * 0.5, rng.normal(size=4 * n))
    Y, c, y = pytensor.function([], list(ptnative.lstm(x, W_in, W_rec, b)))()
    Yr, Cr, Hr, dr = ref_lstm.native_lstm2_forward(x @ W_in + b, W_rec, np.zeros((B, n)), np.zeros((B, n)),
                                                   np.ones((T, B)), 0, 1)
    close(Y, Yr, "Y")
    close(c, dr, "final_c")
    close(y, Yr[-1], "final_y")


def test_twod_lstm_defaults():
    """initial_state=None (zeros), initial_output=None, iteration=0 (no row above row 0)."""
    rng = np.random.default_rng(8)
    h, w, B, n_in, n = 3, 2, 2, 2, 2
    X, V_h, V_v = rng.normal(size=(h, w, B, n_in)), rng.normal(size=(n, 5 * n)) * .5, rng.normal(size=(n, 5 * n)) * .5
    W, b = rng.normal(size=(n_in, 5 * n)), rng.normal(size=5 * n)
    sizes = np.array([[3.0, 2.0], [2.0, 1.0]])
    Y, H = pytensor.function([], list(ptnative.twod_lstm(X, V_h, V_v, W, b, sizes)))()
    Yr, Hr = ref_lstm.twod_lstm_forward(X, V_h, V_v, W, b, sizes, np.zeros((1, w, B, 5 * n)))
    close(Y, Yr, "CompleteY")
    close(H, Hr, "H")


def test_next_edit_distance_reduce_defaults():
    """optimal_completion=False, a_blank_idx=-1 (no blank): candidate 0 (a plausible blank) extends the row."""
    rng = np.random.default_rng(9)
    B, Tb = 3, 6
    b = rng.integers(0, 3, size=(B, Tb)).astype(np.int32)
    b_len = np.array([6, 3, 0], np.int32)
    row = np.tile(np.arange(Tb + 1, dtype=np.int32), (B, 1)) + np.array([[2], [1], [0]], np.int32)
    a = np.array([[0, 1, 2, -1]], np.int32)
    a_n, ended = np.array([2, 1, 0], np.int32), np.array([0, 0, 1], np.int32)
    got = pytensor.function([], ptnative.next_edit_distance_reduce(row, a, a_n, ended, b, b_len))()
    np.testing.assert_array_equal(got, ref_ed.next_edit_distance_reduce(row, a, a_n, ended, b, b_len, False, -1))
    assert not np.array_equal(got, ref_ed.next_edit_distance_reduce(row, a, a_n, ended, b, b_len, True, -1))
    assert not np.array_equal(got, ref_ed.next_edit_distance_reduce(row, a, a_n, ended, b, b_len, False, 0))


def test_sparse_defaults_skip_and_clip():
    """strict=False by default: out-of-range entries are skipped (sparse ops) or clipped (batched index)."""
    rng = np.random.default_rng(10)
    T, B, D, N = 4, 2, 3, 6
    s0 = rng.integers(0, T, size=(N, B)).astype(np.float64)
    s1 = rng.integers(0, D, size=(N, B)).astype(np.float64)
    s0[2, 0], s1[3, 1] = T, -1.0
    w, m = rng.normal(size=(N, B)), np.ones((N, B))
    W = pytensor.function([], ptnative.sparse_to_dense(s0, s1, w, m, T, D))()
    np.testing.assert_allclose(W, ref_sparse.dense_targets(s0, s1, w, m, T, D), rtol=0, atol=1e-15)
    z = rng.normal(size=(T, B, D))
    mx, arg = pytensor.function([], list(ptnative.max_and_argmax_sparse(s0, s1, w, m, np.zeros((T, B)),
                                                                        np.zeros((T, B)))))()
    want = ref_sparse.max_and_argmax_sparse(s0, s1, w, m, np.zeros((T, B)), np.zeros((T, B)))
    np.testing.assert_array_equal(mx, want[0])
    np.testing.assert_array_equal(arg, want[1])
    ce, gz = pytensor.function([], list(ptnative.crossentropy_softmax_and_gradient_z_sparse(
        z, np.ones((T, B)), s0, s1, w, m)))()
    rce, rgz = ref_sparse.crossentropy_softmax_sparse(z, np.ones((T, B)), s0, s1, w, m)[:2]
    close(ce, rce, "ce")
    close(gz, rgz, "grad_z")
    idx = rng.integers(0, D, size=(T, B)).astype(np.float64)
    idx[0, 0], idx[1, 1] = D + 4, -7
    y = pytensor.function([], ptnative.subtensor_batched_index(z, idx))()
    np.testing.assert_array_equal(y, ref_sparse.subtensor_batched_index(z, idx))


# =============================================================================================== cut-offs
SPARSE_MASKS = [0.0, 0.09, 0.0999999, 0.1, 0.1000001, 0.11, 0.49, 0.5, 0.51, 1.0, -0.2, 2.0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sparse_mask_cutoff(mode, dtype):
    """An entry counts where mask >= 0.1: masks on both sides of and at the cut-off, in every sparse op."""
    rng = np.random.default_rng(11)
    T, B, D = 3, 2, 4
    N = len(SPARSE_MASKS)
    s0 = rng.integers(0, T, size=(N, B)).astype(dtype)
    s1 = rng.integers(0, D, size=(N, B)).astype(dtype)
    w = (rng.random((N, B)) + 0.5).astype(dtype)
    m = np.stack([np.array(SPARSE_MASKS), np.array(SPARSE_MASKS[::-1])], axis=1).astype(dtype)
    z = rng.normal(size=(T, B, D)).astype(dtype)
    syms = [pt.matrix(n, dtype=dtype) for n in ("s0", "s1", "w", "m")]
    zs = pt.tensor3("z", dtype=dtype)
    W = ptnative.sparse_to_dense(*syms, T, D)
    mx, arg = ptnative.max_and_argmax_sparse(*syms, pt.zeros((T, B), dtype=dtype), pt.zeros((T, B), dtype=dtype))
    ce, gz = ptnative.crossentropy_softmax_and_gradient_z_sparse(zs, pt.ones((T, B), dtype=dtype), *syms)
    dw = pytensor.grad(ce.sum(), syms[2])
    got = pytensor.function([*syms, zs], [W, mx, arg, ce, gz, dw], mode=mode)(s0, s1, w, m, z)
    # the reference compares the values as given (float32 values widened exactly)
    s0d, s1d, wd, md, zd = (a.astype(np.float64) for a in (s0, s1, w, m, z))
    counted = md >= 0.1
    assert counted.any() and not counted.all()
    rtol, atol = (1e-5, 1e-6) if dtype == "float32" else (RTOL, ATOL)
    close(got[0], ref_sparse.dense_targets(s0d, s1d, wd, md, T, D), "sparse_to_dense", rtol, atol)
    rmx, rarg = ref_sparse.max_and_argmax_sparse(s0d, s1d, wd, md, np.zeros((T, B)), np.zeros((T, B)))
    close(got[1], rmx, "max", 0, 0)
    close(got[2], rarg, "argmax", 0, 0)
    rce, rgz, _, rdw = ref_sparse.crossentropy_softmax_sparse(zd, np.ones((T, B)), s0d, s1d, wd, md)
    close(got[3], rce, "ce", rtol, atol)
    close(got[4], rgz, "grad_z", rtol, atol)
    close(got[5], rdw, "d ce / d y_target_w", rtol, atol)


FRAME_MASKS = [0.0, 0.49, 0.4999999, 0.5, 0.5000001, 0.51, 0.09, 0.11, 1.0, -1.0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_crossentropy_frame_mask_cutoff(mode, dtype):
    """A frame counts where z_mask > 0.5 (forward and the gradient through ce)."""
    rng = np.random.default_rng(12)
    T, B, D = len(FRAME_MASKS), 2, 3
    z = rng.normal(size=(T, B, D)).astype(dtype)
    zm = np.stack([FRAME_MASKS, FRAME_MASKS[::-1]], axis=1).astype(dtype)
    N = 2 * T
    s0 = np.tile(np.arange(T), 2)[:, None].repeat(B, 1).astype(dtype)
    s1 = rng.integers(0, D, size=(N, B)).astype(dtype)
    w, m = (rng.random((N, B)) + 0.1).astype(dtype), np.ones((N, B), dtype)
    zs, zms = pt.tensor3("z", dtype=dtype), pt.matrix("zm", dtype=dtype)
    ce, gz = ptnative.crossentropy_softmax_and_gradient_z_sparse(zs, zms, s0, s1, w, m)
    got = pytensor.function([zs, zms], [ce, gz, pytensor.grad(ce.sum(), zs)], mode=mode)(z, zm)
    rce, rgz, rdz, _ = ref_sparse.crossentropy_softmax_sparse(z.astype(np.float64), zm.astype(np.float64),
                                                              s0.astype(np.float64), s1.astype(np.float64),
                                                              w.astype(np.float64), m.astype(np.float64))
    rtol, atol = (1e-5, 1e-6) if dtype == "float32" else (RTOL, ATOL)
    for name, g, r in zip(["ce", "grad_z", "d ce / d z"], got, [rce, rgz, rdz]):
        close(g, r, name, rtol, atol)
    assert (got[0] == 0).any() and (got[0] != 0).any()


CHUNK_MASKS = [1.0, 0.09, 0.1, 0.1000001, 0.11, 0.49, 0.51, 0.0999999, -1.0, 0.0, 2.0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_chunking_index_cutoff(mode, dtype):
    """chunk and unchunk count a frame where index > 0.1 (exact copies and means: compared exactly)."""
    rng = np.random.default_rng(13)
    T, B, D, size, step = len(CHUNK_MASKS), 2, 2, 4, 3
    # float32(0.1) lies above 0.1 and compares equal to the kernel's Float(0.1): the exact cut-off is
    # checked in float64 only
    masks = [m if dtype == "float64" or m != 0.1 else 0.2 for m in CHUNK_MASKS]
    x = rng.normal(size=(T, B, D)).astype(dtype)
    idx = np.stack([masks, masks[::-1]], axis=1).astype(dtype)
    xs, ms = pt.tensor3("x", dtype=dtype), pt.matrix("m", dtype=dtype)
    out, oidx = ptnative.chunk(xs, ms, size, step)
    nc = ref_chunking.n_chunks(T, size, step)
    cx, cm = pt.tensor3("cx", dtype=dtype), pt.matrix("cm", dtype=dtype)
    uout, uidx, fac = ptnative.unchunk(cx, cm, size, step, T, B)
    f = pytensor.function([xs, ms], [out, oidx], mode=mode)
    g = pytensor.function([cx, cm], [uout, uidx, fac], mode=mode)
    got_out, got_oidx = f(x, idx)
    want_out, want_oidx = ref_chunking.chunk(x.astype(np.float64), idx.astype(np.float64), size, step)
    np.testing.assert_array_equal(got_out, want_out)
    np.testing.assert_array_equal(got_oidx, want_oidx)
    cxv = rng.normal(size=(size, B * nc, D)).astype(dtype)
    cmv = np.resize(np.array(masks), (size, B * nc)).astype(dtype)
    got = g(cxv, cmv)
    want = ref_chunking.unchunk(cxv.astype(np.float64), cmv.astype(np.float64), size, step, T, B)
    rtol = 1e-6 if dtype == "float32" else 1e-15
    for name, a, r in zip(["out", "oindex", "factors"], got, want):
        np.testing.assert_allclose(a, r, rtol=rtol, atol=0, err_msg=name)


# ========================================================================================= edit distance
LENGTHS = [0, 1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 300]


def _pack(seqs):
    T = max([len(s) for s in seqs] + [1])
    arr = np.zeros((len(seqs), T), np.int32)
    for i, s in enumerate(seqs):
        arr[i, :len(s)] = s
    return arr, np.array([len(s) for s in seqs], np.int32)


def edit_pairs():
    """Pairs that make the bit-parallel DP carry across 64-bit words."""
    rng = np.random.default_rng(14)
    pairs = []
    for n in LENGTHS:
        pairs.append(([5] * n, [5] * n))                        # all equal
        pairs.append(([1] * n, [2] * n))                        # all different
        pairs.append((list(range(n)), list(range(1, n + 1))))   # shifted by one: a carry through every word
        pairs.append(([7] + [3] * n, [3] * n + [7]))            # insertion at the front, deletion at the end
        pairs.append(([1, 2] * (n // 2), [2, 1] * (n // 2)))     # alternating
        for m in (n - 1, n + 1, 64, 65, 129):
            if m >= 0:
                a = rng.integers(0, 4, size=n).tolist()
                pairs.append((a, rng.integers(0, 4, size=m).tolist()))
                b = list(a[:m]) + [9] * max(0, m - n)           # a near-copy of a
                if b:
                    b[len(b) // 2] = 8
                pairs.append((a, b))
    pairs.append(([0] * 64 + [1], [1] + [0] * 64))
    pairs.append((list(range(200)), list(range(200))[::-1]))
    return pairs


EDIT_PAIRS = edit_pairs()
EDIT_REF = [ref_ed.dp_table(a, b) for a, b in EDIT_PAIRS]


def test_multi_word_edit_distance(mode):
    """edit_distance and optimal_completion_edit_distance on lengths around word boundaries, both ways round
    (the cheaper sequence goes on the bit axis), against the plain DP table: exact integers."""
    pairs = EDIT_PAIRS + [(b, a) for a, b in EDIT_PAIRS]
    tables = EDIT_REF + [[list(r) for r in zip(*t)] for t in EDIT_REF]
    a, al = _pack([p[0] for p in pairs])
    b, bl = _pack([p[1] for p in pairs])
    syms = [pt.imatrix("a"), pt.ivector("al"), pt.imatrix("b"), pt.ivector("bl")]
    f = pytensor.function(syms, [ed.edit_distance(*syms), ed.optimal_completion_edit_distance(*syms)], mode=mode)
    d, oc = f(a, al, b, bl)
    want_d = np.array([t[len(p[0])][len(p[1])] for p, t in zip(pairs, tables)])
    want_oc = np.array([min(t[len(p[0])]) for p, t in zip(pairs, tables)])
    np.testing.assert_array_equal(d, want_d)
    np.testing.assert_array_equal(oc, want_oc)


def test_multi_word_incremental_edit_distance(mode):
    """The per-successor and reduce ops (closed forms over a whole DP row) and next_edit_distance_row on long
    reference sequences, against the DP table."""
    rng = np.random.default_rng(15)
    refs = [rng.integers(0, 3, size=n).tolist() for n in (63, 64, 65, 128, 129, 200)]
    hyps = [r[: len(r) // 2] for r in refs[:3]] + [r[:100] + [2] * 5 for r in refs[3:]]
    a, al = _pack(hyps)
    b, bl = _pack(refs)
    succ = np.array([0, 1, 2, 5], np.int32)
    syms = [pt.imatrix("a"), pt.ivector("al"), pt.imatrix("b"), pt.ivector("bl")]
    per = pytensor.function(syms, ed.optimal_completion_edit_distance_per_successor(*syms, succ), mode=mode)
    np.testing.assert_array_equal(per(a, al, b, bl), ref_ed.optimal_completion_edit_distance_per_successor(
        a, al, b, bl, succ))
    # rows D[len(hyp), 0..Tb] from the DP table, then one reduce step and one row step
    Tb = b.shape[1]
    rows = np.array([ref_ed.dp_table(h, r)[len(h)] + [ref_ed.dp_table(h, r)[len(h)][-1]] * (Tb - len(r))
                     for h, r in zip(hyps, refs)], np.int32)
    cand = np.array([[0, 1, 2, 7]], np.int32)
    a_n, ended = al, np.zeros(len(refs), np.int32)
    for oc in (False, True):
        red = pytensor.function([], ed.next_edit_distance_reduce(rows, cand, a_n, ended, b, bl, oc, 7), mode=mode)
        np.testing.assert_array_equal(red(), ref_ed.next_edit_distance_reduce(rows, cand, a_n, ended, b, bl, oc, 7))
    step = pytensor.function([], ed.next_edit_distance_row(rows, np.array([1] * len(refs), np.int32), a_n, ended,
                                                           b, bl), mode=mode)
    np.testing.assert_array_equal(step(), ref_ed.next_edit_distance_row(rows, np.ones(len(refs), np.int32), a_n,
                                                                        ended, b, bl))


# ================================================================================= LSTM ops in every mode
def holey_mask(T, B):
    i = mask_of(np.linspace(T, 0, B).astype(int), T)
    if T >= 3 and B >= 2:
        i[:, 1] = 1.0
        i[T // 2, 1] = 0.0
    return i


def op_with_grads(op, values, n_diff, weights, mode, scalar_args=()):
    syms = [pt.tensor(f"in{k}", dtype="float64", shape=(None,) * np.ndim(v)) for k, v in enumerate(values)]
    outs = op(*syms, *[pt.constant(np.int32(s)) for s in scalar_args])
    cost = sum((o * w).sum() for o, w in zip(outs, weights) if w is not None)
    f = pytensor.function(syms, [*outs, *pytensor.grad(cost, syms[:n_diff])], mode=mode)
    res = f(*values)
    return res[:len(outs)], res[len(outs):]


_FD_CACHE = {}


def finite_differences(key, cost, values, wrt):
    if key not in _FD_CACHE:
        _FD_CACHE[key] = ref_lstm.numeric_grad(cost, values, wrt)
    return _FD_CACHE[key]


@pytest.mark.parametrize("start,step", [(0, 1), (1, -2)])
def test_native_lstm2_every_mode(mode, start, step):
    rng = np.random.default_rng(16)
    T, B, n = 5, 3, 2
    vals = [rng.normal(size=(T, B, 4 * n)), rng.normal(size=(n, 4 * n)) * .5, rng.normal(size=(B, n)),
            rng.normal(size=(B, n)), holey_mask(T, B)]
    DY, DC, Dd = rng.normal(size=(T, B, n)), rng.normal(size=(T, B, n)), rng.normal(size=(B, n))
    outs, grads = op_with_grads(lstm.NativeLstm2.make_op(), vals, 4, [DY, DC, None, Dd], mode, (start, step))
    for name, g, r in zip("YCHd", outs, ref_lstm.native_lstm2_forward(*vals, start, step)):
        close(g, r, name)

    def cost(X, W, y0, c0):
        Y, C, H, d = ref_lstm.native_lstm2_forward(X, W, y0, c0, vals[4], start, step)
        return (Y * DY).sum() + (C * DC).sum() + (d * Dd).sum()

    for name, g, r in zip(["DX", "DW", "Dy0", "Dc0"], grads,
                          finite_differences(("n2", start, step), cost, vals[:4], range(4))):
        close(g, r, name, FD_RTOL, FD_ATOL)


@pytest.mark.parametrize("start,step", [(0, 1), (0, -1)])
def test_lstm_lowmem_every_mode(mode, start, step):
    rng = np.random.default_rng(17)
    T, B, n_in, n = 5, 3, 2, 2
    vals = [rng.normal(size=(T, B, n_in)), rng.normal(size=(n_in + n, 4 * n)) * .5, rng.normal(size=4 * n),
            rng.normal(size=(B, n)), rng.normal(size=(B, n)), holey_mask(T, B)]
    DY, DC, Dd = rng.normal(size=(T, B, n)), rng.normal(size=(T, B, n)), rng.normal(size=(B, n))
    outs, grads = op_with_grads(lstm.LstmLowMem.make_op(), vals, 5, [DY, DC, Dd], mode, (start, step))
    for name, g, r in zip("YCd", outs, ref_lstm.lstm_lowmem_forward(*vals, start, step)):
        close(g, r, name)

    def cost(X, W, b, y0, c0):
        Y, C, d = ref_lstm.lstm_lowmem_forward(X, W, b, y0, c0, vals[5], start, step)
        return (Y * DY).sum() + (C * DC).sum() + (d * Dd).sum()

    for name, g, r in zip(["DX", "DW", "Db", "Dy0", "Dc0"], grads,
                          finite_differences(("lm", start, step), cost, vals[:5], range(5))):
        close(g, r, name, FD_RTOL, FD_ATOL)


def test_twod_lstm_every_mode(mode):
    rng = np.random.default_rng(18)
    h, w, B, n_in, n = 3, 3, 3, 2, 2
    vals = [rng.normal(size=(h, w, B, n_in)), rng.normal(size=(n, 5 * n)) * .5, rng.normal(size=(n, 5 * n)) * .5,
            rng.normal(size=(n_in, 5 * n)), rng.normal(size=5 * n)]
    sizes, init = np.array([[3.0, 3.0], [2.0, 3.0], [1.0, 2.0]]), rng.normal(size=(1, w, B, 5 * n))
    DY = rng.normal(size=(h, w, B, n))
    syms = [pt.tensor(k, dtype="float64", shape=(None,) * v.ndim) for k, v in zip(["X", "Vh", "Vv", "W", "b"], vals)]
    Y, H = ptnative.twod_lstm(*syms, sizes, initial_state=init)
    f = pytensor.function(syms, [Y, H, *pytensor.grad((Y * DY).sum(), syms)], mode=mode)
    got = f(*vals)
    Yr, Hr = ref_lstm.twod_lstm_forward(*vals, sizes, init)
    close(got[0], Yr, "CompleteY")
    close(got[1], Hr, "H")

    def cost(*args):
        return (ref_lstm.twod_lstm_forward(*args, sizes, init)[0] * DY).sum()

    for name, g, r in zip(["DX", "DV_h", "DV_v", "DW", "Db"], got[2:],
                          finite_differences("twod", cost, vals, range(5))):
        close(g, r, name, FD_RTOL, FD_ATOL)


def test_lstm_cell_every_mode(mode):
    rng = np.random.default_rng(19)
    c_prev, x = rng.uniform(-1, 1, (4, 3, 2)), rng.uniform(-1, 1, (3, 12, 2))
    gc, gh = rng.normal(size=(4, 3, 2)), rng.normal(size=(3, 3, 2))
    cs, xs = pt.tensor3("c"), pt.tensor3("x")
    c, h = ptnative.lstm_cell(cs, xs)
    f = pytensor.function([cs, xs], [c, h, *pytensor.grad((c * gc).sum() + (h * gh).sum(), [cs, xs])], mode=mode)
    got = f(c_prev, x)
    cr, hr = ref_lstm.lstm_cell_forward(c_prev, x)
    close(got[0], cr, "c")
    close(got[1], hr, "h")

    def cost(cp, xx):
        c2, h2 = ref_lstm.lstm_cell_forward(cp, xx)
        return (c2 * gc).sum() + (h2 * gh).sum()

    for name, g, r in zip(["Dc_prev", "Dx"], got[2:], finite_differences("cell", cost, [c_prev, x], [0, 1])):
        close(g, r, name, FD_RTOL, FD_ATOL)


# ================================================================================= FSA ops in every mode
def random_fsa(rng, B, n_states, n_edges, D):
    rows = []
    for b in range(B):
        off = b * n_states
        for _ in range(n_edges):
            rows.append((off + rng.integers(n_states), off + rng.integers(n_states), rng.integers(D), b))
    edges = np.array(rows, dtype=np.int32).T.copy()
    se = np.array([[b * n_states for b in range(B)], [b * n_states + n_states - 1 for b in range(B)]], np.int32)
    return edges, rng.random(edges.shape[1]) * 2, se


def test_multi_end_fast_baum_welch_every_mode(mode):
    rng = np.random.default_rng(20)
    T, B, D = 5, 2, 3
    edges, weights, se = random_fsa(rng, B, 4, 10, D)
    ends = np.array([[0, 3], [0, 2], [1, 7], [1, 5], [1, 4]], np.int32)
    end_w = np.array([0.5, 1.0, 0.0, 2.0, 0.3])
    lens = np.array([5, 3])
    am = rng.random((T, B, D)) * 2
    a = pt.tensor3("am")
    outs = fsa.MultiEndFastBaumWelchOp.make_op()(a, edges, weights, se[0], ends, end_w, mask_of(lens, T),
                                                 np.zeros((2, 8)))
    out, sums = pytensor.function([a], outs, mode=mode)(am)
    nll, post = ref_fsa.brute_force_bw(am, edges, weights, se, lens,
                                       end_list=[tuple(x) + (w,) for x, w in zip(ends.tolist(), end_w)])
    assert np.isfinite(nll).all()
    close(np.exp(-out), post, "posteriors")
    close(sums, mask_of(lens, T) * nll[None], "sums")


@pytest.mark.parametrize("segmentwise", [False, True])
def test_segment_fast_baum_welch_every_mode(mode, segmentwise):
    rng = np.random.default_rng(21)
    L, D, F, B = 3, 2, 4, 2
    bidx, index = segment_columns([4, 3], F, L)
    Nb = index.shape[1]
    edges = np.array([[0, 0, 1, 1, 2, 2, 3, 3], [1, 0, 1, 0, 3, 2, 3, 2], [0, 1, 1, 0, 0, 1, 1, 0],
                      [0, 1, 1, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1, 1]], np.int32)
    se = np.array([[0, 2], [1, 3]], np.int32)
    am, w, lm = rng.random((L, Nb, D)) * 2, rng.random(8), rng.random((2, L))
    scales = np.array([1.0, 0.7])
    a, ep = pt.tensor3("am"), pt.dscalar("epoch")
    op = fsa.SegmentFastBaumWelchOp.make_op(segmentwise_normalization=segmentwise)
    got = pytensor.function([a, ep], op(a, bidx, edges, w, lm, se, index, scales, ep), mode=mode)(am, 3.0)
    want = ref_fsa.segment_brute_force(am, bidx, edges, w, lm, se, index, 0.7, segmentwise)
    for name, g, r in zip(["output", "normalization_factors", "posterior_weigths"], got, want):
        np.testing.assert_array_equal(np.isinf(g), np.isinf(r), err_msg=name)
        fin = np.isfinite(r)
        close(g[fin], r[fin], name)
    assert np.any(got[2] > 0)


@pytest.mark.parametrize("normalized", [False, True])
def test_ctc_loss_viterbi_every_mode(mode, normalized):
    rng = np.random.default_rng(22)
    T, B, D = 5, 3, 4
    targets, tlens, lens = np.array([[1, 2], [3, 3], [1, 0]]), np.array([2, 2, 1]), np.array([5, 2, 4])
    logits = rng.normal(size=(T, B, D)) * 2
    if normalized:
        logits = ref_fsa.log_softmax(logits)
    x = pt.tensor3("x")
    loss = fsa.ctc_loss_viterbi(x, lens, targets, tlens, blank_index=0, logits_normalized=normalized)
    loss_z = fsa.ctc_loss_viterbi(x, lens, targets, tlens, blank_index=0, logits_normalized=normalized,
                                  zero_infinity=True)
    lo, lz, g = pytensor.function([x], [loss, loss_z, pytensor.grad(loss_z.sum(), x)], mode=mode)(logits)
    want_l, want_g = ctc_viterbi_reference(logits, lens, targets, tlens, 0, normalized)
    close(lo, want_l, "loss")
    close(lz, np.where(np.isinf(want_l), 0, want_l), "loss with zero_infinity")
    close(g, want_g, "gradient")
