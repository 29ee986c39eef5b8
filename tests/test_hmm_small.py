"""The CPU's one-sequence paths of hmm_viterbi (B = 1, K <= 8) and hmm_posteriors (B = 1, K <= 4): register-only
recursions without the general path's setup, falling back to the general path where their checks fail, against
enumeration of all state paths, the numpy log-space references, and the same sequence computed in a batch of two
(the general path), including the cases that must take the fallback."""

import numpy as np
import pytensor
import pytest

import ptnative
from ptnative.ops import hmm

from .conftest import compiled_once, tol
from .reference import fsa as ref_fsa
from .reference import hmm as ref
from .test_hmm import cast, compiled, mask_of, model, symbols

DTYPES = ["float32", "float64"]


def twice(*arrays):
    """log_emissions (T, 1, K) and mask (T, 1) as a batch of two copies (the general path)."""
    return [np.concatenate([a, a], 1) for a in arrays]


@compiled_once
def posteriors_with_gradient(dtype):
    """(marginals, counts, d/d log_emissions of a weighted sum of both) as one compiled function (once per process:
    conftest.compiled_once)."""
    xs = symbols(dtype)
    gamma, xi = hmm.hmm_posteriors(*xs[:4], mask=xs[4])
    cost = 2.0 * gamma[:, :, 0].sum() - gamma[:, :, -1].sum() + (xi * xi).sum()  # separable per sequence
    return pytensor.function(xs, [gamma, xi, pytensor.grad(cost, xs[0])])


# ------------------------------------------------------------------ Viterbi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [1, 2, 3, 4, 5, 6, 7, 8])
def test_viterbi_one_sequence_against_enumeration(K, dtype):
    rng = np.random.default_rng(100 + K)
    T = 6 if K <= 4 else 4
    f = compiled(hmm.hmm_viterbi, dtype, None)
    for lens in ([T], [T - 2], [1], [0]):
        le, lA, lpi, lf = model(rng, T, 1, K, 2.0)
        args = cast(dtype, le, lA, lpi, lf, mask_of(lens, T))
        path, score = f(*args)
        _, _, _, want_path, want_score = ref.brute_force(*(np.asarray(a, np.float64) for a in args[:4]), lens)
        np.testing.assert_array_equal(path, want_path)
        rtol, atol = tol(dtype)
        np.testing.assert_allclose(score, want_score, rtol=rtol, atol=atol)


@pytest.mark.parametrize("K", [2, 3, 4, 5, 8])
def test_viterbi_one_sequence_long_and_special(K):
    """T = 2000 with log-densities of +-2000 and -inf transitions against numpy; no path; NaN falls back to the
    general path (score NaN, path -1); +inf raises naming the entry."""
    rng = np.random.default_rng(110 + K)
    T = 2000
    f = compiled(hmm.hmm_viterbi, "float64", None)
    le, lA, lpi, lf = model(rng, T, 1, K, 3.0)
    le[::7] *= 700.0
    lA[0, K - 1] = -np.inf
    for lens in ([T], [1234]):
        path, score = f(le, lA, lpi, lf, mask_of(lens, T))
        want_path, want_score = ref.viterbi(le, lA, lpi, lf, lens)
        np.testing.assert_array_equal(path, want_path)
        np.testing.assert_allclose(score, want_score, rtol=1e-12)
        le2, mask2 = twice(le, mask_of(lens, T))
        both = f(le2, lA, lpi, lf, mask2)
        np.testing.assert_array_equal(both[0][:, 0], path[:, 0])
        np.testing.assert_array_equal(both[1][0], score[0])
    stuck = le.copy()
    stuck[300] = -np.inf  # no state can emit frame 300
    path, score = f(stuck, lA, lpi, lf, mask_of([T], T))
    assert score[0] == -np.inf and np.all(path == -1)
    nan = le.copy()
    nan[1500, 0, K - 1] = np.nan
    path, score = f(nan, lA, lpi, lf, mask_of([T], T))
    assert np.isnan(score[0]) and np.all(path == -1)
    path, score = f(nan, lA, lpi, lf, mask_of([1500], T))  # on a padded frame: ignored
    np.testing.assert_array_equal(path[:1500], ref.viterbi(le, lA, lpi, lf, [1500])[0][:1500])
    bad = le.copy()
    bad[50, 0, 1] = np.inf
    with pytest.raises(ValueError, match=r"hmm_viterbi: log_emissions\[50, 0, 1\] = inf is infinitely likely"):
        f(bad, lA, lpi, lf, mask_of([T], T))
    lA_nan = lA.copy()
    lA_nan[1, 1] = np.nan
    path, score = f(le, lA_nan, lpi, lf, mask_of([T], T))
    assert np.isnan(score[0]) and np.all(path == -1)


# ------------------------------------------------------------------ posteriors
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_posteriors_one_sequence_against_enumeration(K, dtype):
    rng = np.random.default_rng(120 + K)
    T = 6
    f = compiled(hmm.hmm_posteriors, dtype, None)
    rtol, atol = tol(dtype)
    for lens in ([6], [3], [1], [0]):
        le, lA, lpi, lf = model(rng, T, 1, K, 2.0)
        args = cast(dtype, le, lA, lpi, lf, mask_of(lens, T))
        gamma, xi = f(*args)
        _, want_gamma, want_xi, _, _ = ref.brute_force(*(np.asarray(a, np.float64) for a in args[:4]), lens)
        np.testing.assert_allclose(gamma, want_gamma, rtol=rtol, atol=atol)
        np.testing.assert_allclose(xi, want_xi, rtol=rtol, atol=atol)
        assert np.all(gamma[lens[0]:] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [2, 3, 4])
def test_posteriors_one_sequence_long(K, dtype):
    """T = 3000 against the log-space reference and the general path (values and the emission gradient, which
    reads the forward op's hidden filter), ragged; marginals sum to 1 on every valid frame."""
    rng = np.random.default_rng(130 + K)
    T = 3000
    le, lA, lpi, lf = model(rng, T, 1, K, 3.0)
    f = posteriors_with_gradient(dtype)
    rtol, atol = tol(dtype) if dtype == "float32" else (1e-9, 1e-12)  # rounding over 3000 steps (test_hmm's too)
    for lens in ([T], [2001]):
        args = cast(dtype, le, lA, lpi, lf, mask_of(lens, T))
        gamma, xi, d = f(*args)
        want_gamma, want_xi = ref_fsa.hmm_posteriors(*(np.asarray(a, np.float64) for a in args[:4]), lens)
        np.testing.assert_allclose(gamma, want_gamma, rtol=rtol, atol=atol)
        np.testing.assert_allclose(xi, want_xi, rtol=rtol, atol=1e3 * atol)
        valid = np.arange(T) < lens[0]
        np.testing.assert_allclose(gamma[valid, 0].sum(-1), 1.0, rtol=0, atol=10 * np.finfo(dtype).eps)
        assert np.all(gamma[~valid] == 0)
        g2, x2, d2 = f(*cast(dtype, *twice(le), lA, lpi, lf, *twice(mask_of(lens, T))))
        close = dict(rtol=rtol, atol=atol) if dtype == "float32" else dict(rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(gamma[:, 0], g2[:, 0], **close)
        np.testing.assert_allclose(xi[0], x2[0], **close)
        # the batch's gradient is the sum of its two copies' costs: the same for each copy
        scale = np.abs(d2).max()  # a covariance: entries far below its largest ones lose digits to cancellation
        np.testing.assert_allclose(d[:, 0], d2[:, 0], rtol=1e-6 if dtype == "float64" else 2e-3,
                                   atol=(1e-9 if dtype == "float64" else 1e-4) * scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_posteriors_without_gradient_run_without_hidden_outputs(mode, dtype):
    """Where no gradient is taken, the rewrite swaps HmmPosteriorsOp for HmmPosteriorsValuesOp (modes with the
    specialize rewrites; FAST_COMPILE keeps HmmPosteriorsOp), with the same bits as HmmPosteriorsOp beside a
    gradient: the one-sequence path, the general one, ragged masks, the empty series and batch."""
    xs = symbols(dtype)
    gamma, xi = hmm.hmm_posteriors(*xs[:4], mask=xs[4])
    plain = pytensor.function(xs, [gamma, xi], mode=mode)
    graded = pytensor.function(xs, [gamma, xi, pytensor.grad((gamma * gamma).sum() + xi.sum(), xs[0])], mode=mode)

    def names(f):
        return {getattr(n.op, "name", None) for n in f.maker.fgraph.toposort()}

    swapped = mode != "FAST_COMPILE"
    assert ("HmmPosteriorsValuesOp" in names(plain)) == swapped
    assert ("HmmPosteriorsOp" in names(plain)) != swapped
    assert "HmmPosteriorsValuesOp" not in names(graded) and "HmmPosteriorsOp" in names(graded)
    rng = np.random.default_rng(150)
    for T, K, lens in ((40, 3, [40]), (40, 3, [17]), (30, 5, [30, 12, 0]), (0, 3, [0]), (5, 2, [])):
        le, lA, lpi, lf = model(rng, T, len(lens), K, 2.0)
        args = cast(dtype, le, lA, lpi, lf, mask_of(lens, T))
        got, want = plain(*args), graded(*args)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        if T and lens:
            want_gamma, want_xi = ref_fsa.hmm_posteriors(*(np.asarray(a, np.float64) for a in args[:4]), lens)
            rtol, atol = tol(dtype)
            np.testing.assert_allclose(got[0], want_gamma, rtol=rtol, atol=atol)
            np.testing.assert_allclose(got[1], want_xi, rtol=rtol, atol=atol)


@pytest.mark.parametrize("K", [2, 3, 4])
def test_posteriors_one_sequence_fallbacks(K):
    """Inputs the register path hands to the sequential pass: the frame's largest log-density at a state no path
    reaches, gaps of thousands between log-densities (emissions underflowing to 0), no path at all, NaN
    (emission or transition), and a +inf log-density (an error naming it)."""
    rng = np.random.default_rng(140 + K)
    T = 400
    le, lA, lpi, lf = model(rng, T, 1, K, 2.0)
    lA[:, K - 1] = -np.inf  # state K-1 is reachable only at frame 0 ...
    le[5:, 0, K - 1] += 50.0  # ... and has the largest log-density from frame 5 on
    f = posteriors_with_gradient("float64")
    gapped = le.copy()
    gapped[::9, 0, 0] -= 3000.0  # state 0 impossible on every 9th frame (its emission underflows)
    for le, lens in [(le, [T]), (gapped, [T]), (gapped, [123]), (gapped, [1])]:
        gamma, xi, d = f(le, lA, lpi, lf, mask_of(lens, T))
        g2, x2, d2 = f(*twice(le), lA, lpi, lf, *twice(mask_of(lens, T)))
        np.testing.assert_allclose(gamma[:, 0], g2[:, 0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(xi[0], x2[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(d[:, 0], d2[:, 0], rtol=1e-9, atol=1e-9 * np.abs(d2).max())
        # the log-space reference itself rounds at the log-likelihood's magnitude here (~1e5): ~1e-9
        want_gamma, want_xi = ref_fsa.hmm_posteriors(le, lA, lpi, lf, lens)
        np.testing.assert_allclose(gamma, want_gamma, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(xi, want_xi, rtol=1e-7, atol=1e-7)
    stuck = le.copy()
    stuck[200] = -np.inf
    gamma, xi, d = f(stuck, lA, lpi, lf, mask_of([T], T))
    assert np.all(gamma == 0) and np.all(xi == 0) and np.all(d == 0)
    nan = le.copy()
    nan[399, 0, 1] = np.nan
    gamma, xi, d = f(nan, lA, lpi, lf, mask_of([T], T))
    assert np.isnan(gamma).all() and np.isnan(xi).all() and np.isnan(d).all()
    gamma, xi, _ = f(nan, lA, lpi, lf, mask_of([399], T))  # on a padded frame: ignored
    np.testing.assert_allclose(gamma, f(le, lA, lpi, lf, mask_of([399], T))[0], rtol=1e-12, atol=1e-14)
    lpi_nan = lpi.copy()
    lpi_nan[0] = np.nan
    gamma, xi, _ = f(le, lA, lpi_nan, lf, mask_of([T], T))
    assert np.isnan(gamma).all() and np.isnan(xi).all()
    bad = le.copy()
    bad[77, 0, K - 2] = np.inf
    with pytest.raises(ValueError, match=r"hmm_posteriors: log_emissions\[77, 0, %d\] = inf is infinitely likely"
                       % (K - 2)):
        f(bad, lA, lpi, lf, mask_of([T], T))


def test_posteriors_one_sequence_extreme_scales():
    """Frames whose normalisers are tiny (a sticky chain against the data, log-densities far apart) and very
    long series: the scalings stay exact (or the sequential pass takes over); against the log-space reference."""
    rng = np.random.default_rng(150)
    T, K = 20000, 3
    lA = np.log(np.full((K, K), 1e-120) + np.eye(K))  # switching costs ~276 nats
    lpi = np.log(np.full(K, 1.0 / K))
    z = np.repeat(rng.integers(0, K, size=T // 500), 500)
    le = -0.5 * ((np.arange(K)[None, :] * 40.0 - z[:, None] * 40.0 + rng.normal(size=(T, 1))) ** 2)
    le = le[:, None, :]
    gamma, xi = compiled(hmm.hmm_posteriors, "float64", None)(le, lA, lpi, np.zeros(K), np.ones((T, 1)))
    want_gamma, want_xi = ref_fsa.hmm_posteriors(le, lA, lpi, np.zeros(K), [T])
    np.testing.assert_allclose(gamma, want_gamma, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(xi, want_xi, rtol=1e-8, atol=1e-9)


# ------------------------------------------------------------------ the one-sequence mask length
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", [hmm.hmm_viterbi, hmm.hmm_posteriors, ptnative.hmm_log_likelihood])
def test_one_sequence_mask_length(fn, dtype):
    """B = 1 takes its mask's length from one branch-free pass (K = 3 and K = 6): every prefix length equals the
    same sequence cut to that length, and a mask that is not 0/1 or not a prefix raises naming its first bad frame,
    as the general scan does."""
    rng = np.random.default_rng(7)
    T = 37
    f = compiled(fn, dtype, None)
    name = fn.__name__
    for K in (3, 6):
        le, lA, lpi, lf = model(rng, T, 1, K)
        for n in (0, 1, 2, 17, 36, 37):
            got = f(*cast(dtype, le, lA, lpi, lf, mask_of([n], T)))
            want = f(*cast(dtype, le[:n], lA, lpi, lf, np.ones((n, 1))))
            for g, w in zip(got if isinstance(got, list) else [got], want if isinstance(want, list) else [want]):
                g = np.asarray(g)
                if g.ndim and g.shape[0] == T:  # per-frame output: the cut frames, the rest as for no frame
                    np.testing.assert_array_equal(g[:n], w)
                else:
                    np.testing.assert_array_equal(g, w)
        for t, value in ((0, 0.5), (20, 2.0), (36, np.nan), (3, -1.0)):
            m = mask_of([30], T)
            m[t, 0] = value
            shown = "nan" if np.isnan(value) else f"{value:g}"
            with pytest.raises(ValueError, match=rf"{name}: mask\[{t}, 0\] = {shown} is not 0 or 1"):
                f(*cast(dtype, le, lA, lpi, lf, m))
        for t in (1, 31, 36):
            m = mask_of([30], T)
            m[t, 0] = 1.0
            if t == 1:
                m[0, 0] = 0.0
            with pytest.raises(ValueError, match=rf"{name}: mask\[:, 0\] is not a prefix mask \(1 at frame {t} "):
                f(*cast(dtype, le, lA, lpi, lf, m))
        m = mask_of([30], T)  # a value error after a prefix error: the first frame's error, as the scan reports
        m[31, 0], m[33, 0] = 1.0, 0.5
        with pytest.raises(ValueError, match=rf"{name}: mask\[:, 0\] is not a prefix mask \(1 at frame 31 "):
            f(*cast(dtype, le, lA, lpi, lf, m))
