"""Explicit-duration HMMs (ptnative.ops.hsmm): hsmm_log_likelihood and its gradients, hsmm_posteriors,
hsmm_viterbi, hsmm_sample_states.

References: enumeration of every segmentation on tiny models (tests/reference/hsmm.py), and the equivalent HMM on
K * D expanded states run by ptnative's own HMM functions (likelihood, gradients through the expansion, posteriors
summed over durations, Viterbi mapped back); finite differences (verify_grad) for every float input; a numpy
backward-filtering, forward-sampling sampler driven by the same uniforms (equal paths), and the frequencies of
sampled paths against their enumerated posterior."""

import shutil

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
import scipy.stats
from pytensor.gradient import verify_grad

import ptnative
from ptnative import NativeOp
from ptnative.ops import hsmm

from .conftest import build_with_nvcc, check_infer_shape, compiled_once
from .reference import hsmm as ref

DTYPES = ["float32", "float64"]


def mask_of(lens, T):
    return (np.arange(T)[:, None] < np.asarray(lens)[None, :]).astype(np.float64)


def model(rng, T, B, K, D, batched=False, scale=1.0):
    """Random log_emissions (T, B, K), log_transitions (K, K), log_durations ((B,) K, D), log_initial ((B,) K)."""
    lead = (B,) if batched else ()
    le = rng.normal(size=(T, B, K)) * scale
    lA = np.log(rng.dirichlet(np.ones(K), size=K))
    ld = np.log(rng.dirichlet(np.ones(D), size=lead + (K,)))
    lpi = np.log(rng.dirichlet(np.ones(K), size=lead or None))
    return le, lA, ld, lpi


def symbols(dtype, batched=False):
    return [pt.tensor3(dtype=dtype), pt.matrix(dtype=dtype),
            pt.tensor3(dtype=dtype) if batched else pt.matrix(dtype=dtype),
            pt.matrix(dtype=dtype) if batched else pt.vector(dtype=dtype),
            pt.matrix(dtype=dtype), pt.iscalar()]


@compiled_once
def compiled(dtype, mode, batched=False):
    """(log-likelihood, path, score, gradients of sum(w * ll) for the four float inputs) on symbols of ``dtype``,
    ``right_censored`` a symbolic flag (the last input, after the weights w)."""
    xs = symbols(dtype, batched)
    w = pt.vector(dtype=dtype)
    ll = ptnative.hsmm_log_likelihood(*xs[:4], mask=xs[4], right_censored=xs[5])
    path, score = ptnative.hsmm_viterbi(*xs[:4], mask=xs[4], right_censored=xs[5])
    grads = pytensor.grad((ll * w).sum(), xs[:4])
    return pytensor.function([*xs, w], [ll, path, score, *grads], mode=mode)


def run(dtype, mode, le, lA, ld, lpi, lens, censored=True, w=None):
    T, B = le.shape[:2]
    w = np.ones(B) if w is None else w
    f = compiled(dtype, mode, np.ndim(ld) == 3)
    args = [np.asarray(a, dtype) for a in (le, lA, ld, lpi, mask_of(lens, T), )]
    return f(*args[:5], np.int32(censored), np.asarray(w, dtype))


def tol(dtype):
    return dict(rtol=3e-5, atol=3e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------ against enumeration
@pytest.mark.parametrize("dtype", DTYPES)
def test_against_enumeration(mode, dtype):
    """Tiny ragged batches (T <= 6, K <= 3, D <= 4, one sequence of T_b = 1 and one empty), both censorings."""
    rng = np.random.default_rng(1)
    for K, D, censored in [(3, 4, True), (3, 4, False), (2, 3, True), (1, 4, False)]:
        T, lens = 6, [6, 4, 1, 0, 5]
        le, lA, ld, lpi = model(rng, T, len(lens), K, D, scale=1.5)
        le, lA, ld, lpi = (np.asarray(a, dtype).astype(np.float64) for a in (le, lA, ld, lpi))
        ll, path, score, *_ = run(dtype, mode, le, lA, ld, lpi, lens, censored)
        want_ll, want_score, best = ref.brute_force(le, lA, ld, lpi, lens, censored)
        np.testing.assert_allclose(ll, want_ll, **tol(dtype))
        np.testing.assert_allclose(score, want_score, **tol(dtype))
        assert path.dtype == np.int32
        for b, L in enumerate(lens):
            assert (path[L:, b] == -1).all()
            if want_score[b] > -np.inf:
                assert tuple(path[:L, b]) in best[b], (K, D, censored, b, path[:L, b], best[b])
            else:
                assert (path[:, b] == -1).all()


def test_per_sequence_parameters_against_enumeration(mode):
    """(B, K, D) durations and (B, K) initial weights: each sequence uses its own; -inf durations (impossible
    lengths), and a sequence without a path."""
    rng = np.random.default_rng(2)
    T, K, D, lens = 5, 3, 3, [5, 3, 2, 0]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D, batched=True)
    ld[1, :, 0] = -np.inf  # sequence 1: no segment of length 1
    ld[2, :, :2] = -np.inf  # sequence 2 (T_b = 2): only length 3, impossible
    for censored in (True, False):
        ll, path, score, *_ = run("float64", mode, le, lA, ld, lpi, lens, censored)
        want_ll, want_score, best = ref.brute_force(le, lA, ld, lpi, lens, censored)
        if censored:  # a censored length-3 segment covers 2 frames
            assert np.isfinite(want_ll[2])
        else:
            assert want_ll[2] == -np.inf and score[2] == -np.inf and (path[:, 2] == -1).all()
        np.testing.assert_allclose(ll, want_ll, **tol("float64"))
        np.testing.assert_allclose(score, want_score, **tol("float64"))
        for b, L in enumerate(lens):
            if want_score[b] > -np.inf:
                assert tuple(path[:L, b]) in best[b]


def test_viterbi_ties(mode):
    """All weights equal (every segmentation scores 0): the last segment takes the lowest state, each segment the
    shortest duration and the one before it the lowest other state, so the path alternates 0, 1 from the end."""
    T, K, D = 5, 3, 4
    z = np.zeros
    _, path, score, *_ = run("float64", mode, z((T, 2, K)), z((K, K)), z((K, D)), z(K), [5, 4], censored=False)
    np.testing.assert_array_equal(path.T, [[0, 1, 0, 1, 0], [1, 0, 1, 0, -1]])
    np.testing.assert_array_equal(score, [0, 0])
    # censored, the last segment weighs L(d) = D - d + 1: the shortest is the best, the path the same
    _, path, score, *_ = run("float64", mode, z((T, 2, K)), z((K, K)), z((K, D)), z(K), [5, 4], censored=True)
    np.testing.assert_array_equal(path.T, [[0, 1, 0, 1, 0], [1, 0, 1, 0, -1]])
    np.testing.assert_allclose(score, [np.log(D)] * 2, rtol=1e-15)
    # ties between durations only: state 2 alone is possible, durations 1..4 equally likely -> shortest first
    le = np.full((T, 1, K), -np.inf)
    le[:, :, 2] = 0
    _, path, score, *_ = run("float64", mode, le, z((K, K)), z((K, D)), z(K), [5], censored=False)
    np.testing.assert_array_equal(path[:, 0], [-1] * 5)  # one segment only (a state cannot follow itself): D < 5
    assert score[0] == -np.inf
    _, path, score, *_ = run("float64", mode, le, z((K, K)), z((K, D)), z(K), [3], censored=False)
    np.testing.assert_array_equal(path[:, 0], [2, 2, 2, -1, -1])
    assert score[0] == 0


# ------------------------------------------------------------------ against the expanded-state HMM
@compiled_once
def expanded_pair(censored, K, D):
    """The HSMM's log-likelihood and gradients, and those of the equivalent HMM on K * D states built from the same
    symbols (tests/reference/hsmm.py, expanded_hmm) and run by ptnative.hmm_log_likelihood; both Viterbi paths (the
    HMM's mapped back to states)."""
    le, lA, ld, lpi, mask = pt.tensor3("le"), pt.matrix("lA"), pt.matrix("ld"), pt.vector("lpi"), pt.matrix("mask")
    w = pt.vector("w")
    ll = ptnative.hsmm_log_likelihood(le, lA, ld, lpi, mask, right_censored=censored)
    XA, Xpi, Xf = ref.expanded_hmm(lA, ld, lpi, censored, K, D, xp=pt)
    le_x = pt.repeat(le, D, axis=2)
    ll_x = ptnative.hmm_log_likelihood(le_x, XA, Xpi, Xf, mask)
    path, score = ptnative.hsmm_viterbi(le, lA, ld, lpi, mask, right_censored=censored)
    path_x, score_x = ptnative.hmm_viterbi(le_x, XA, Xpi, Xf, mask)
    path_x = pt.switch(pt.ge(path_x, 0), path_x // D, -1)
    outs = [ll, ll_x, *pytensor.grad((w * ll).sum(), [le, lA, ld, lpi]),
            *pytensor.grad((w * ll_x).sum(), [le, lA, ld, lpi]), path, path_x, score, score_x]
    return pytensor.function([le, lA, ld, lpi, mask, w], outs, mode="FAST_COMPILE")  # a large graph: no Numba


@pytest.mark.parametrize("censored", [True, False])
def test_against_expanded_state_hmm(censored):
    """Likelihood, every gradient and the Viterbi path equal those of the HMM over (state, time spent so far) that
    leaves a state with its duration's hazard p_k(d) / L_k(d); the diagonal of the transitions' gradient is 0."""
    rng = np.random.default_rng(3 + censored)
    T, K, D, lens = 40, 3, 6, [40, 33, 1, 0, 17]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D, scale=2.0)
    w = rng.uniform(0.5, 2.0, size=len(lens))
    ll, ll_x, *rest = expanded_pair(censored, K, D)(le, lA, ld, lpi, mask_of(lens, T), w)
    grads, grads_x, (path, path_x, score, score_x) = rest[:4], rest[4:8], rest[8:]
    np.testing.assert_allclose(ll, ll_x, rtol=1e-10, atol=1e-10)
    for name, g, gx in zip(["log_emissions", "log_transitions", "log_durations", "log_initial"], grads, grads_x):
        np.testing.assert_allclose(g, gx, rtol=1e-8, atol=1e-10, err_msg=name)
    assert (np.diag(grads[1]) == 0).all()
    np.testing.assert_allclose(score, score_x, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(path, path_x)
    # the emission gradient of a sequence is its state posterior: it sums to w_b on every valid frame
    np.testing.assert_allclose(grads[0].sum(axis=2), mask_of(lens, T) * w, atol=1e-10)


def test_long_series_is_stable():
    """T = 2000 with large log-densities: finite, and equal to the expanded-state HMM's."""
    rng = np.random.default_rng(4)
    T, K, D, lens = 2000, 3, 6, [2000, 1500]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D, scale=30.0)
    out = expanded_pair(True, K, D)(le, lA, ld, lpi, mask_of(lens, T), np.ones(2))
    assert np.isfinite(out[0]).all()
    np.testing.assert_allclose(out[0], out[1], rtol=1e-10)
    np.testing.assert_allclose(out[2], out[6], atol=1e-7)


# ------------------------------------------------------------------ finite differences
@pytest.mark.parametrize("batched", [False, True], ids=["shared", "per-sequence"])
@pytest.mark.parametrize("censored", [True, False])
def test_verify_grad(censored, batched):
    rng = np.random.default_rng(5)
    T, K, D, lens = 5, 3, 3, [5, 3, 1]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D, batched=batched)
    mask = mask_of(lens, T)
    upstream = np.array([1.0, -0.7, 2.0])

    def cost(le, lA, ld, lpi):
        return (hsmm.hsmm_log_likelihood(le, lA, ld, lpi, mask, right_censored=censored) * upstream).sum()

    verify_grad(cost, [le, lA, ld, lpi], rng=rng, mode="FAST_COMPILE")


# ------------------------------------------------------------------ dtypes, modes, special cases
def test_float32_matches_float64(mode):
    rng = np.random.default_rng(6)
    T, K, D, lens = 30, 4, 7, [30, 12, 1, 0]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D)
    le, lA, ld, lpi = (np.asarray(a, "float32") for a in (le, lA, ld, lpi))
    w = np.array([1.0, 2.0, -1.0, 3.0])
    got = run("float32", mode, le, lA, ld, lpi, lens, True, w)
    want = run("float64", mode, le, lA, ld, lpi, lens, True, w)
    assert all(g.dtype == (np.int32 if k == 1 else np.float32) for k, g in enumerate(got))
    np.testing.assert_array_equal(got[1], want[1])
    for g, wv in zip(got[:1] + got[2:], want[:1] + want[2:]):
        np.testing.assert_allclose(g, wv, rtol=1e-4, atol=1e-4)


def test_empty_batch_no_frames_and_one_frame(mode):
    z = np.zeros
    f = compiled("float64", mode)
    for T, B in [(0, 3), (4, 0), (0, 0)]:
        ll, path, score, gle, gA, gd, gpi = f(z((T, B, 2)), z((2, 2)), z((2, 3)), z(2), z((T, B)), 1, np.ones(B))
        assert ll.shape == score.shape == (B,) and path.shape == (T, B) and gle.shape == (T, B, 2)
        assert (ll == 0).all() and (score == 0).all() and (gA == 0).all() and (gd == 0).all() and (gpi == 0).all()
    # T = 1: one segment of duration 1
    rng = np.random.default_rng(7)
    le, lA, ld, lpi = model(rng, 1, 2, 3, 4)
    for censored in (True, False):
        ll, path, score, gle, gA, gd, gpi = run("float64", mode, le, lA, ld, lpi, [1, 1], censored)
        first = ref.survival(ld)[:, 0] if censored else ld[:, 0]
        want = np.logaddexp.reduce(lpi + first + le[0], axis=-1)
        np.testing.assert_allclose(ll, want, rtol=1e-12)
        np.testing.assert_array_equal(path[0], np.argmax(lpi + first + le[0], axis=-1))
        np.testing.assert_array_equal(gA, 0)


def test_nan_in_nan_out(mode):
    rng = np.random.default_rng(8)
    T, K, D, lens = 6, 3, 4, [6, 4, 2, 0]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D, batched=True)
    clean = run("float64", mode, le, lA, ld, lpi, lens)

    def with_nan(arr, idx):
        a = arr.copy()
        a[idx] = np.nan
        return a

    # a NaN log-emission on a valid frame of sequence 0: its log-likelihood, score, emission gradient (valid frames)
    # and the shared gradient NaN; the other sequences as before; a NaN on a padded frame changes nothing
    got = run("float64", mode, with_nan(le, (2, 0, 1)), lA, ld, lpi, lens)
    assert np.isnan(got[0][0]) and np.isnan(got[2][0]) and (got[1][:, 0] == -1).all()
    assert np.isnan(got[3][:6, 0]).all() and np.isnan(got[4]).all()
    np.testing.assert_array_equal(got[0][1:], clean[0][1:])
    np.testing.assert_array_equal(got[3][:, 1:], clean[3][:, 1:])
    np.testing.assert_array_equal(got[5][1:], clean[5][1:])  # per-sequence durations of the others
    got = run("float64", mode, with_nan(le, (5, 1, 0)), lA, ld, lpi, lens)
    for g, c in zip(got, clean):
        np.testing.assert_array_equal(g, c)
    # NaN in sequence 1's durations: only sequence 1; off the transitions' diagonal: every sequence with a frame;
    # on the diagonal: nothing
    got = run("float64", mode, le, lA, with_nan(ld, (1, 2, 3)), lpi, lens)
    assert np.isnan(got[0][1]) and not np.isnan(got[0][[0, 2, 3]]).any()
    got = run("float64", mode, le, with_nan(lA, (0, 2)), ld, lpi, lens)
    assert np.isnan(got[0][:3]).all() and got[0][3] == 0 and np.isnan(got[2][:3]).all() and got[2][3] == 0
    got = run("float64", mode, le, with_nan(lA, (1, 1)), ld, lpi, lens)
    for g, c in zip(got, clean):
        np.testing.assert_array_equal(g, c)
    got = run("float64", mode, le, lA, ld, with_nan(lpi, (2, 0)), lens)
    assert np.isnan(got[0][2]) and not np.isnan(got[0][[0, 1, 3]]).any()


def test_bad_input(mode):
    rng = np.random.default_rng(9)
    T, K, D, lens = 4, 2, 3, [4, 2]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D)
    f = compiled("float64", mode)
    args = [le, lA, ld, lpi, mask_of(lens, T), np.int32(1), np.ones(2)]

    def bad(k, value, match):
        a = list(args)
        a[k] = value
        with pytest.raises(ValueError, match=match):
            f(*a)

    def setting(arr, idx, v):
        a = np.array(arr, copy=True)
        a[idx] = v
        return a

    bad(0, setting(le, (1, 1, 0), np.inf), r"hsmm_log_likelihood: log_emissions\[1, 1, 0\] = inf")
    bad(1, setting(lA, (0, 1), np.inf), r"hsmm_log_likelihood: log_transitions.flat\[1\] = inf")
    bad(2, setting(ld, (1, 2), np.inf), r"hsmm_log_likelihood: log_durations.flat\[5\] = inf")
    bad(3, setting(lpi, 1, np.inf), r"hsmm_log_likelihood: log_initial.flat\[1\] = inf")
    bad(4, setting(args[4], (3, 1), 1.0), r"hsmm_log_likelihood: mask\[:, 1\] is not a prefix mask")
    bad(4, setting(args[4], (0, 0), 0.5), r"hsmm_log_likelihood: mask\[0, 0\] = 0.5 is not 0 or 1")
    bad(1, np.zeros((3, 3)), r"hsmm_log_likelihood: log_transitions must have shape \(K, K\), got \(3, 3\)")
    bad(2, np.zeros((3, D)), r"hsmm_log_likelihood: log_durations must have shape \(K, D\) or \(B, K, D\)")
    bad(3, np.zeros(3), r"hsmm_log_likelihood: log_initial must have shape \(K,\) or \(B, K\)")
    bad(4, np.ones((T, 3)), r"hsmm_log_likelihood: mask must have shape \(T, B\)")
    # +inf on the transitions' diagonal or on a padded frame is never read
    f(*[setting(lA, (1, 1), np.inf) if k == 1 else a for k, a in enumerate(args)])
    f(*[setting(le, (3, 1, 0), np.inf) if k == 0 else a for k, a in enumerate(args)])
    x = symbols("float64", batched=True)
    with pytest.raises(ValueError, match=r"hsmm_viterbi: log_durations must have shape \(K, D\) or \(B, K, D\), got B = 3"):
        pytensor.function(x[:5], hsmm.hsmm_viterbi(*x[:5]), mode=mode)(
            le, lA, np.zeros((3, K, D)), np.zeros((2, K)), args[4])


def test_argument_errors_at_build_time():
    x = pt.tensor3()
    with pytest.raises(ValueError, match=r"hsmm_log_likelihood: log_durations must have ndim 2 or 3"):
        hsmm.hsmm_log_likelihood(x, pt.matrix(), pt.vector(), pt.vector())
    with pytest.raises(ValueError, match=r"hsmm_viterbi: log_initial must have ndim 1 or 2"):
        hsmm.hsmm_viterbi(x, pt.matrix(), pt.matrix(), pt.tensor3())
    with pytest.raises(TypeError, match=r"hsmm_log_likelihood: log_emissions must have a real or bool dtype"):
        hsmm.hsmm_log_likelihood(pt.tensor3(dtype="complex128"), pt.matrix(), pt.matrix(), pt.vector())
    ll = hsmm.hsmm_log_likelihood(pt.tensor3(dtype="float32"), np.zeros((2, 2)), np.zeros((2, 3)), np.zeros(2))
    assert ll.dtype == "float32"
    path, score = hsmm.hsmm_viterbi(pt.tensor3(dtype="int16"), np.zeros((2, 2)), np.zeros((2, 3)), np.zeros(2))
    assert path.dtype == "int32" and score.dtype == "float64"


def test_jax_mode():
    pytest.importorskip("jax")
    rng = np.random.default_rng(10)
    T, K, D, lens = 6, 3, 4, [6, 3, 0]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D)
    got = run("float64", "JAX", le, lA, ld, lpi, lens, True, np.array([1.0, 2.0, 3.0]))
    want = run("float64", "FAST_COMPILE", le, lA, ld, lpi, lens, True, np.array([1.0, 2.0, 3.0]))
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-12, atol=1e-12)


def test_threads_split_the_batch(monkeypatch):
    """Above T B K (D + K) = 2e6 the CPU kernels split the batch over PTNATIVE_NUM_THREADS threads: the same bits
    for 1, 2 and 3 threads (the sums over the batch run in sequence order)."""
    rng = np.random.default_rng(11)
    T, K, D, lens = 1200, 4, 40, [1200, 900, 0, 1, 1200, 77]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D, scale=2.0)
    results = {}
    for n in ["1", "2", "3"]:
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", n)
        results[n] = run("float64", "FAST_COMPILE", le, lA, ld, lpi, lens, True, np.arange(1.0, 7.0))
    for n in ["2", "3"]:
        for got, want in zip(results[n], results["1"]):
            np.testing.assert_array_equal(got, want)


def test_infer_shape():
    a = pt.tensor3()
    lA, ld, lpi = np.zeros((3, 3)), np.zeros((3, 2)), np.zeros(3)
    v = [np.random.default_rng(12).random((4, 2, 3))]
    check_infer_shape([a], list(hsmm.hsmm_viterbi(a, lA, ld, lpi)), v, NativeOp)
    check_infer_shape([a], [hsmm.hsmm_log_likelihood(a, lA, ld, lpi)], v, NativeOp)
    check_infer_shape([a], [hsmm.hsmm_posteriors(a, lA, ld, lpi)], v, NativeOp)
    check_infer_shape([a], [hsmm.hsmm_sample_states(a, lA, ld, lpi, uniforms=np.zeros((4, 2)))], v, NativeOp)


def test_exported():
    for name in hsmm.__all__:
        assert getattr(ptnative.ops, name) is getattr(hsmm, name)
    for name in ["hsmm_log_likelihood", "hsmm_posteriors", "hsmm_viterbi", "hsmm_sample_states"]:
        assert getattr(ptnative, name) is getattr(hsmm, name)


# ------------------------------------------------------------------ value and gradients in one op
def _hsmm_op_names(fn):
    found = (getattr(n.op, "name", None) or "" for n in fn.maker.fgraph.toposort())
    return sorted(name for name in found if "Hsmm" in name)


def test_value_and_gradients_in_one_op(mode):
    """Where a graph needs the log-likelihood and its gradients with an upstream gradient that does not depend on
    it, one op computes both (HsmmLikelihoodWithGradOp, by a rewrite of every mode but FAST_COMPILE): the same bits
    as the two ops (per-sequence parameters, ragged, both censorings); with an upstream gradient that depends on the
    value the two ops stay."""
    rng = np.random.default_rng(31)
    T, K, D, lens = 20, 3, 5, [20, 13, 0, 1, 20]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D, batched=True, scale=2.0)
    xs = symbols("float64", batched=True)
    w = pt.vector()
    ll = hsmm.hsmm_log_likelihood(*xs[:4], mask=xs[4], right_censored=xs[5])
    outs = [ll, *pytensor.grad((ll * w).sum(), xs[:4])]
    base = pytensor.compile.mode.get_mode(mode)
    fused = pytensor.function([*xs, w], outs, mode=base)
    apart = pytensor.function([*xs, w], outs, mode=base.excluding("ptnative_hsmm_value_and_gradient"))
    dep = pytensor.function([*xs, w], [ll, *pytensor.grad((ll * w * pt.exp(ll / 100)).sum(), xs[:4])], mode=base)
    two = ["GradOfHsmmLikelihoodOp", "HsmmLikelihoodOp"]
    assert _hsmm_op_names(apart) == two and _hsmm_op_names(dep) == two
    assert _hsmm_op_names(fused) == (two if mode == "FAST_COMPILE" else ["HsmmLikelihoodWithGradOp"])
    for censored in (1, 0):
        args = [le, lA, ld, lpi, mask_of(lens, T), np.int32(censored), rng.uniform(0.5, 2.0, size=len(lens))]
        got = fused(*args)
        for a, b in zip(got, apart(*args)):
            np.testing.assert_array_equal(a, b)
        assert np.isfinite(got[0]).all() and got[0][2] == 0 and np.abs(got[3]).max() > 0


def test_fused_op_differentiates_like_the_ops_it_replaces():
    """A graph differentiated after the rewrites (as JAX differentiates a jaxified graph, e.g. PyMC's numpyro
    sampler): the fused op's log-likelihood takes HsmmLikelihoodOp's gradient (the numbers of pytensor.grad of the
    original graph), and a gradient through its gradient outputs raises, never zeros."""
    pytest.importorskip("jax")
    import jax
    from pytensor.compile.mode import get_mode
    from pytensor.graph.fg import FunctionGraph
    from pytensor.link.jax.dispatch import jax_funcify

    from ptnative.backends.jax import register

    rng = np.random.default_rng(32)
    T, K, D, lens = 10, 3, 4, [10, 6, 0, 1]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D)
    xs = symbols("float64")[:4]
    mask = mask_of(lens, T)
    cost = (hsmm.hsmm_log_likelihood(*xs, mask=mask) * np.linspace(0.5, 1.5, len(lens))).sum()
    grads = pytensor.grad(cost, xs)
    register()
    fgraph = FunctionGraph(inputs=xs, outputs=[cost, *grads], clone=True)
    get_mode("JAX").optimizer.rewrite(fgraph)
    assert "HsmmLikelihoodWithGradOp" in {getattr(n.op, "name", None) for n in fgraph.toposort()}
    jaxed = jax_funcify(fgraph)
    args = [le, lA, ld, lpi]
    got = jax.grad(lambda *a: jaxed(*a)[0], argnums=(0, 1, 2, 3))(*args)
    want = pytensor.function(xs, grads, mode="FAST_COMPILE")(*args)
    for g, wv in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), wv, rtol=1e-10, atol=1e-12)
        assert np.abs(wv).max() > 0
    with pytest.raises(pytensor.gradient.NullTypeGradError, match="HsmmLikelihoodWithGradOp.*only its outputs"):
        jax.grad(lambda *a: jaxed(*a)[1].sum())(*args)


# ------------------------------------------------------------------ posteriors and sampled paths
@compiled_once
def inference(dtype, mode, batched=False):
    """(marginals, sampled path) on symbols of ``dtype``; ``right_censored`` then the uniforms the last inputs."""
    xs = symbols(dtype, batched)
    u = pt.matrix(dtype=dtype)
    marginals = ptnative.hsmm_posteriors(*xs[:4], mask=xs[4], right_censored=xs[5])
    path = ptnative.hsmm_sample_states(*xs[:4], mask=xs[4], right_censored=xs[5], uniforms=u)
    return pytensor.function([*xs, u], [marginals, path], mode=mode)


def infer(dtype, mode, le, lA, ld, lpi, lens, censored=True, u=None):
    T, B = np.shape(le)[:2]
    u = np.random.default_rng(0).random((T, B)) if u is None else u
    args = [np.asarray(a, dtype) for a in (le, lA, ld, lpi, mask_of(lens, T))]
    return inference(dtype, mode, np.ndim(ld) == 3)(*args, np.int32(censored), np.asarray(u, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_posteriors_and_samples_against_enumeration(mode, dtype):
    """Tiny ragged batches (T <= 6, a sequence of T_b = 1 and an empty one), both censorings, shared and
    per-sequence parameters with impossible durations: the marginals equal those of the enumeration; the sampled
    paths those of the numpy sampler driven by the same uniforms (computed from the same rounded inputs)."""
    rng = np.random.default_rng(21)
    for K, D, censored, batched in [(3, 4, True, False), (3, 4, False, True), (2, 3, True, True), (1, 4, False, False)]:
        T, lens = 6, [6, 4, 1, 0, 5]
        le, lA, ld, lpi = model(rng, T, len(lens), K, D, batched=batched, scale=1.5)
        if batched:
            ld[0, :, 0] = -np.inf
        u = rng.random((T, len(lens)))
        le, lA, ld, lpi, u = (np.asarray(a, dtype).astype(np.float64) for a in (le, lA, ld, lpi, u))
        marginals, path = infer(dtype, mode, le, lA, ld, lpi, lens, censored, u)
        assert marginals.dtype == dtype and path.dtype == np.int32
        np.testing.assert_allclose(marginals, ref.marginals_brute_force(le, lA, ld, lpi, lens, censored), **tol(dtype))
        np.testing.assert_array_equal(path, ref.sample_states(le, lA, ld, lpi, lens, u, censored))
        possible = ref.brute_force(le, lA, ld, lpi, lens, censored)[0] > -np.inf
        for b, L in enumerate(lens):  # a sampled path is a possible one; without a path: -1
            if L and possible[b]:
                assert tuple(path[:L, b]) in ref.segment_path_posterior(
                    le[:, b], lA, ld[b] if batched else ld, lpi[b] if batched else lpi, L, censored)
            else:
                assert (path[:, b] == -1).all()
        if K == 1:  # one segment of at most D = 4 frames: the series of 6 and 5 frames have no path
            np.testing.assert_array_equal(possible, [False, True, True, True, False])


@compiled_once
def expanded_posteriors(censored, K, D):
    """The HSMM's marginals, and the marginals of the expanded-state HMM (numbers from tests/reference/hsmm.py's
    expanded_hmm) run by ptnative.hmm_posteriors, summed over the time spent in each state."""
    le, lA, ld, lpi, mask = pt.tensor3("le"), pt.matrix("lA"), pt.matrix("ld"), pt.vector("lpi"), pt.matrix("mask")
    XA, Xpi, Xf = pt.matrix("XA"), pt.vector("Xpi"), pt.vector("Xf")
    marginals = ptnative.hsmm_posteriors(le, lA, ld, lpi, mask, right_censored=censored)
    mx, _ = ptnative.hmm_posteriors(pt.repeat(le, D, axis=2), XA, Xpi, Xf, mask)
    summed = mx.reshape((le.shape[0], le.shape[1], K, D)).sum(axis=3)
    return pytensor.function([le, lA, ld, lpi, mask, XA, Xpi, Xf], [marginals, summed], mode="FAST_COMPILE")


@pytest.mark.parametrize("censored", [True, False])
def test_posteriors_against_expanded_state_hmm(censored):
    """Marginals equal the expanded-state HMM's summed over durations (T = 300 with large log-densities, ragged),
    and the emission gradient of hsmm_log_likelihood (upstream 1)."""
    rng = np.random.default_rng(22 + censored)
    T, K, D, lens = 300, 3, 7, [300, 211, 1, 0, 57]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D, scale=8.0)
    ld[1, 2] = -np.inf  # state 1 never lasts 3 frames
    XA, Xpi, Xf = ref.expanded_hmm(lA, ld, lpi, censored)
    got, want = expanded_posteriors(censored, K, D)(le, lA, ld, lpi, mask_of(lens, T), XA, Xpi, Xf)
    np.testing.assert_allclose(got, want, atol=1e-9)
    np.testing.assert_allclose(got.sum(axis=2), mask_of(lens, T), atol=1e-10)
    gle = run("float64", "FAST_COMPILE", le, lA, ld, lpi, lens, censored)[3]
    np.testing.assert_allclose(got, gle, atol=1e-12)


def test_sampled_path_frequencies():
    """20000 draws of a tiny series (T = 5, K = 2, D = 3, both censorings): no impossible path is drawn, and the
    counts of the paths fit their enumerated posterior probabilities (Pearson's chi-square over the paths expected
    at least 5 times, the rarer ones pooled, below its 1 - 1e-6 quantile), each frequency within 5 standard errors."""
    rng = np.random.default_rng(23)
    N, T, K, D = 20000, 5, 2, 3
    le1, lA, ld, lpi = model(rng, T, 1, K, D, scale=0.8)
    le = np.broadcast_to(le1, (T, N, K)).copy()
    for censored in (True, False):
        want = ref.segment_path_posterior(le1[:, 0], lA, ld, lpi, T, censored)
        _, path = infer("float64", "FAST_COMPILE", le, lA, ld, lpi, [T] * N, censored, rng.random((T, N)))
        paths, counts = np.unique(path.T, axis=0, return_counts=True)
        freq = dict(zip(map(tuple, paths), counts / N))
        assert set(freq) <= set(want)
        q = np.array(list(want.values()))
        f = np.array([freq.get(p, 0.0) for p in want])
        common = q * N >= 5
        observed = np.append(f[common], f[~common].sum()) * N
        expected = np.append(q[common], q[~common].sum()) * N
        chi2 = (((observed - expected) ** 2) / expected).sum()
        assert chi2 < scipy.stats.chi2.ppf(1 - 1e-6, len(expected) - 1), (censored, chi2, len(expected))
        assert (np.abs(f - q)[common] <= 5 * np.sqrt(q * (1 - q) / N)[common]).all()


def test_posteriors_and_samples_special_cases(mode):
    """NaN in: NaN marginals / -1 paths for that sequence only; no path: zeros / -1; the empty series and B = 0,
    T = 0; T = 1 (one segment of duration 1)."""
    rng = np.random.default_rng(24)
    T, K, D, lens = 6, 3, 4, [6, 4, 2, 0]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D, batched=True)
    clean = infer("float64", mode, le, lA, ld, lpi, lens)
    nan_le = le.copy()
    nan_le[2, 1, 0] = np.nan
    nan_le[5, 2, 1] = np.nan  # a padded frame of sequence 2: ignored
    got = infer("float64", mode, nan_le, lA, ld, lpi, lens)
    assert np.isnan(got[0][:4, 1]).all() and (got[0][4:, 1] == 0).all() and (got[1][:, 1] == -1).all()
    for g, c in zip(got, clean):
        np.testing.assert_array_equal(g[:, [0, 2, 3]], c[:, [0, 2, 3]])
    nan_ld = ld.copy()
    nan_ld[0, 1, 1] = np.nan
    got = infer("float64", mode, le, lA, nan_ld, lpi, lens)
    assert np.isnan(got[0][:, 0]).all() and (got[1][:, 0] == -1).all()
    np.testing.assert_array_equal(got[0][:, 1:], clean[0][:, 1:])
    no_path = ld.copy()
    no_path[2, :, :2] = -np.inf  # sequence 2 (T_b = 2) needs a segment of 1 or 2 frames
    got = infer("float64", mode, le, lA, no_path, lpi, lens, censored=False)
    assert (got[0][:, 2] == 0).all() and (got[1][:, 2] == -1).all() and (got[1][:6, 0] >= 0).all()
    z = np.zeros
    for T0, B0 in [(0, 3), (4, 0), (0, 0)]:
        marginals, path = infer("float64", mode, z((T0, B0, 2)), z((2, 2)), z((2, 3)), z(2), [0] * B0)
        assert marginals.shape == (T0, B0, 2) and path.shape == (T0, B0)
        assert (marginals == 0).all() and (path == -1).all()
    le, lA, ld, lpi = model(rng, 1, 2, 3, 4)
    for censored in (True, False):
        first = lpi + (ref.survival(ld)[:, 0] if censored else ld[:, 0]) + le[0]
        marginals, path = infer("float64", mode, le, lA, ld, lpi, [1, 1], censored, np.array([[0.0, 0.999]]))
        np.testing.assert_allclose(marginals[0], np.exp(first - np.logaddexp.reduce(first, axis=-1)[:, None]),
                                   rtol=1e-12)
        np.testing.assert_array_equal(path[0], [np.flatnonzero(np.exp(first[0]) > 0)[0],
                                                np.flatnonzero(np.exp(first[1]) > 0)[-1]])


def test_sample_bad_uniforms_and_shapes(mode):
    rng = np.random.default_rng(25)
    T, K, D, lens = 4, 2, 3, [4, 2]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D)
    u = rng.random((T, 2))
    for bad, text in [(1.0, "1"), (-0.25, "-0.25"), (np.nan, "nan")]:
        v = u.copy()
        v[1, 1] = bad
        with pytest.raises(ValueError, match=rf"hsmm_sample_states: uniforms\[1, 1\] = {text} is not in \[0, 1\)"):
            infer("float64", mode, le, lA, ld, lpi, lens, True, v)
    v = u.copy()
    v[3, 1] = 7.0  # a padded frame: not read
    infer("float64", mode, le, lA, ld, lpi, lens, True, v)
    x = symbols("float64")
    uu = pt.matrix()
    f = pytensor.function([*x[:5], uu], hsmm.hsmm_sample_states(*x[:5], uniforms=uu), mode=mode)
    with pytest.raises(ValueError, match=r"hsmm_sample_states: uniforms must have shape \(T, B\), got \(3, 2\)"):
        f(le, lA, ld, lpi, mask_of(lens, T), u[:3])
    with pytest.raises(ValueError, match=r"hsmm_posteriors: log_initial.flat\[1\] = inf"):
        hsmm.hsmm_posteriors(le, lA, ld, np.array([0.0, np.inf]), mask_of(lens, T)).eval()
    with pytest.raises(ValueError, match=r"hsmm_sample_states: uniforms must have ndim 2"):
        hsmm.hsmm_sample_states(le, lA, ld, lpi, uniforms=pt.vector())


def test_posteriors_have_no_gradient():
    """The marginals are not differentiable: pytensor.grad raises instead of returning zeros."""
    le = pt.tensor3()
    marginals = hsmm.hsmm_posteriors(le, np.zeros((2, 2)), np.zeros((2, 3)), np.zeros(2))
    with pytest.raises(pytensor.gradient.NullTypeGradError):
        pytensor.grad(marginals.sum(), le)


def test_posteriors_and_samples_float32_jax_and_threads(monkeypatch):
    """float32 against float64 (marginals to 1e-4; paths equal), JAX mode against FAST_COMPILE, and the same bits
    for 1 and 3 CPU threads above the threshold."""
    pytest.importorskip("jax")
    rng = np.random.default_rng(26)
    T, K, D, lens = 30, 4, 7, [30, 12, 1, 0]
    le, lA, ld, lpi = (np.asarray(a, "float32").astype(np.float64) for a in model(rng, T, len(lens), K, D))
    u = np.asarray(rng.random((T, len(lens))), "float32").astype(np.float64)
    got = infer("float32", "FAST_COMPILE", le, lA, ld, lpi, lens, True, u)
    want = infer("float64", "FAST_COMPILE", le, lA, ld, lpi, lens, True, u)
    np.testing.assert_allclose(got[0], want[0], atol=1e-4)
    np.testing.assert_array_equal(got[1], want[1])
    for g, w in zip(infer("float64", "JAX", le, lA, ld, lpi, lens, True, u), want):
        np.testing.assert_array_equal(np.asarray(g), w)
    T, K, D, lens = 1200, 4, 40, [1200, 900, 0, 1, 1200, 77]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D, scale=2.0)
    u = rng.random((T, len(lens)))
    results = {}
    for n in ["1", "3"]:
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", n)
        results[n] = infer("float64", "FAST_COMPILE", le, lA, ld, lpi, lens, True, u)
    for got, want in zip(results["3"], results["1"]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["C", "FAST_COMPILE"], ids=["fused", "apart"])
def test_outputs_are_fully_written(mode, poison_pattern, monkeypatch):
    """Every output declared fully_written (the likelihood's gradients, fused or apart, the marginals, both paths,
    the score) is the same with its memory poisoned before the kernel runs (PTNATIVE_POISON_OUTPUTS): padded
    frames, the empty series, a sequence with a NaN input and one without a path included."""
    rng = np.random.default_rng(33)
    T, K, D, lens = 7, 3, 3, [7, 0, 5, 2, 7]
    le, lA, ld, lpi = model(rng, T, len(lens), K, D, batched=True)
    le[1, 2, 0] = np.nan  # sequence 2: NaN
    ld[3, :, :2] = -np.inf  # sequence 3 (T_b = 2), not censored: no path
    w = np.linspace(0.5, 2.0, len(lens))
    poisoned = [*run("float64", mode, le, lA, ld, lpi, lens, False, w), *infer("float64", mode, le, lA, ld, lpi, lens,
                                                                                 False)]
    monkeypatch.delenv("PTNATIVE_POISON_OUTPUTS")
    clean = [*run("float64", mode, le, lA, ld, lpi, lens, False, w), *infer("float64", mode, le, lA, ld, lpi, lens,
                                                                              False)]
    assert clean[2][3] == -np.inf and np.isnan(clean[0][2]) and (clean[1][:, 1] == -1).all()
    for got, want in zip(poisoned, clean):
        np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_kernels_compile_with_nvcc(monkeypatch):
    """The CUDA text of both units: the gradient op's (hsmm.cu holds the forward op's kernels too) in float64,
    the Viterbi op's in float32.  One build per unit: the units share hsmm_model.h, whose include guard would drop
    it from the second unit of a joint build."""
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    build_with_nvcc(hsmm.HsmmLikelihoodOp.make_op().grad_op().variant("float64", device="cuda"))
    build_with_nvcc(hsmm.HsmmLikelihoodWithGradOp.make_op().variant("float32", device="cuda"))
    build_with_nvcc(hsmm.HsmmViterbiOp.make_op().variant("float32", device="cuda"))
    build_with_nvcc(hsmm.HsmmPosteriorsOp.make_op().variant("float64", device="cuda"))
    build_with_nvcc(hsmm.HsmmSampleStatesOp.make_op().variant("float32", device="cuda"))
