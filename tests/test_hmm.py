"""HMM inference ops (ptnative.ops.hmm): Viterbi, posteriors (and their gradients), posterior sampling, against
enumeration of all state paths, numpy log-space references and finite differences, in every mode."""

import shutil

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import verify_grad

import ptnative
from ptnative import NativeOp
from ptnative.ops import hmm

from .conftest import build_with_nvcc, check_infer_shape, compiled_once, tol
from .reference import fsa as ref_fsa
from .reference import hmm as ref

DTYPES = ["float32", "float64"]


def mask_of(lens, T):
    return (np.arange(T)[:, None] < np.asarray(lens)[None, :]).astype(np.float64)


def model(rng, T, B, K, scale=1.0):
    le = rng.normal(size=(T, B, K)) * scale
    lA = np.log(rng.dirichlet(np.ones(K), size=K))
    lpi = np.log(rng.dirichlet(np.ones(K)))
    lf = rng.normal(size=K) * 0.3
    return le, lA, lpi, lf


def symbols(dtype):
    return [pt.tensor3(dtype=dtype), pt.matrix(dtype=dtype), pt.vector(dtype=dtype), pt.vector(dtype=dtype),
            pt.matrix(dtype=dtype)]


def cast(dtype, *arrays):
    return [np.asarray(a).astype(dtype) for a in arrays]


@compiled_once
def compiled(fn, dtype, mode, **kw):
    """``fn(log_emissions, log_transitions, log_initial, log_final, mask=mask, **kw)`` on symbols of ``dtype``,
    compiled in ``mode`` (once per process: conftest.compiled_once)."""
    xs = symbols(dtype)
    outs = fn(*xs[:4], mask=xs[4], **kw)
    return pytensor.function(xs, list(outs) if isinstance(outs, (list, tuple)) else outs, mode=mode)


@compiled_once
def sampler(dtype, mode):
    """hmm_sample_states on symbols of ``dtype`` and uniforms of ``dtype`` (the last input), compiled in ``mode``."""
    xs = symbols(dtype)
    u = pt.matrix(dtype=dtype)
    return pytensor.function(xs + [u], hmm.hmm_sample_states(*xs[:4], mask=xs[4], uniforms=u), mode=mode)


def on_tiny_batch(fn, dtype, mode, seed):
    """``fn``'s outputs on a random T=5 B=4 K=3 model with lengths 5, 3, 1, 0, the enumeration reference's
    (log-likelihood, marginals, counts, path, score), and the lengths."""
    rng = np.random.default_rng(seed)
    T, B, K = 5, 4, 3
    le, lA, lpi, lf = cast(dtype, *model(rng, T, B, K, 2.0))
    lens = [5, 3, 1, 0]
    got = compiled(fn, dtype, mode)(le, lA, lpi, lf, mask_of(lens, T).astype(dtype))
    return got, ref.brute_force(le, lA, lpi, lf, lens), lens


# ------------------------------------------------------------------ Viterbi
@pytest.mark.usefixtures("poison_pattern")  # int path: -1 on padded frames, never the 0x5A poison
@pytest.mark.parametrize("dtype", DTYPES)
def test_viterbi_against_enumeration(mode, dtype):
    (path, score), (_, _, _, want_path, want_score), _ = on_tiny_batch(hmm.hmm_viterbi, dtype, mode, seed=1)
    assert path.dtype == np.int32 and score.dtype == dtype
    np.testing.assert_array_equal(path, want_path)
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(score, want_score, rtol=rtol, atol=atol)


@pytest.mark.usefixtures("poison_pattern")  # int path: -1 on padded frames, never the 0x5A poison
@pytest.mark.parametrize("dtype", DTYPES)
def test_viterbi_ties_go_to_the_lowest_state(mode, dtype):
    """Integer log-weights (exact sums) with many equally good paths; -inf transitions."""
    rng = np.random.default_rng(2)
    T, B, K = 5, 6, 3
    le = rng.integers(-2, 1, size=(T, B, K)).astype(np.float64)
    lA = rng.integers(-1, 1, size=(K, K)).astype(np.float64)
    lA[2, 0] = -np.inf
    lpi, lf = np.zeros(K), np.array([0.0, 0.0, -1.0])
    le[:, 0] = 0.0  # everything ties but the transitions
    lens = [5, 5, 4, 3, 2, 1]
    f = compiled(hmm.hmm_viterbi, dtype, mode)
    path, score = f(*cast(dtype, le, lA, lpi, lf, mask_of(lens, T)))
    _, _, _, want_path, want_score = ref.brute_force(le, lA, lpi, lf, lens)
    np.testing.assert_array_equal(path, want_path)
    np.testing.assert_array_equal(score, want_score.astype(dtype))
    uniform = f(*cast(dtype, np.zeros((T, B, K)), np.zeros((K, K)), np.zeros(K), np.zeros(K), mask_of(lens, T)))
    np.testing.assert_array_equal(uniform[0], np.where(mask_of(lens, T) > 0, 0, -1))


@pytest.mark.usefixtures("poison_pattern")  # int path: -1 on padded frames, never the 0x5A poison
def test_viterbi_long_sequences_against_numpy(mode):
    rng = np.random.default_rng(3)
    T, B, K = 300, 3, 6
    le, lA, lpi, lf = model(rng, T, B, K, 5.0)
    le[:, 1] = le[:, 1] * 200 - 500  # huge log-densities
    lens = [300, 123, 7]
    path, score = compiled(hmm.hmm_viterbi, "float64", mode)(le, lA, lpi, lf, mask_of(lens, T))
    want_path, want_score = ref.viterbi(le, lA, lpi, lf, lens)
    np.testing.assert_array_equal(path, want_path)
    np.testing.assert_allclose(score, want_score, rtol=1e-12)


@pytest.mark.usefixtures("poison_pattern")  # int path: -1 on padded frames, never the 0x5A poison
@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_viterbi_one_sequence_few_states(K):
    """B = 1, K <= 4 (the CPU's register path): ties, -inf transitions, NaN, the empty series, against the
    references, and the same path and score as the same sequence computed among others."""
    rng = np.random.default_rng(40 + K)
    T = 400
    f = compiled(hmm.hmm_viterbi, "float64", None)
    le = rng.integers(-2, 1, size=(T, 1, K)).astype(np.float64)  # integer weights: many exact ties
    lA = rng.integers(-1, 1, size=(K, K)).astype(np.float64)
    lA[K - 1, 0] = -np.inf if K > 1 else 0.0
    lpi, lf = np.zeros(K), -np.arange(K, dtype=np.float64)
    for lens in ([400], [1], [0]):
        path, score = f(le, lA, lpi, lf, mask_of(lens, T))
        want_path, want_score = ref.viterbi(le, lA, lpi, lf, lens)
        np.testing.assert_array_equal(path, want_path)
        np.testing.assert_allclose(score, want_score, rtol=1e-12)
        both = f(np.concatenate([le, le], 1), lA, lpi, lf, mask_of(lens * 2, T))
        np.testing.assert_array_equal(both[0][:, 1], path[:, 0])
        np.testing.assert_array_equal(both[1][1], score[0])
    le_nan = le.copy()
    le_nan[7, 0, 0] = np.nan
    path, score = f(le_nan, lA, lpi, lf, mask_of([400], T))
    assert np.all(path == -1) and np.isnan(score[0])


# ------------------------------------------------------------------ posteriors
@pytest.mark.parametrize("dtype", DTYPES)
def test_posteriors_against_enumeration(mode, dtype):
    (gamma, xi), (_, want_gamma, want_xi, _, _), lens = on_tiny_batch(hmm.hmm_posteriors, dtype, mode, seed=4)
    T, B, K = gamma.shape
    assert gamma.dtype == dtype and xi.dtype == dtype and xi.shape == (B, K, K)
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(gamma, want_gamma, rtol=rtol, atol=atol)
    np.testing.assert_allclose(xi, want_xi, rtol=rtol, atol=atol)
    valid = mask_of(lens, T) > 0
    np.testing.assert_allclose(gamma.sum(-1)[valid], 1.0, rtol=0, atol=10 * np.finfo(dtype).eps)
    assert np.all(gamma[~valid] == 0)
    np.testing.assert_allclose(xi.sum((1, 2)), np.maximum(np.array(lens) - 1, 0), rtol=rtol)


def test_posteriors_stable_at_any_length_and_magnitude(mode):
    """T = 3000 with log-densities of +-2000 and emission gaps far beyond double's range within one step."""
    rng = np.random.default_rng(5)
    T, B, K = 3000, 2, 4
    le, lA, lpi, lf = model(rng, T, B, K)
    le[:, 0] = le[:, 0] * 800 + 300
    le[10, 1] = [0.0, -1500.0, -3000.0, -np.inf]
    lens = [3000, 1700]
    gamma, xi = compiled(hmm.hmm_posteriors, "float64", mode)(le, lA, lpi, lf, mask_of(lens, T))
    want_gamma, want_xi = ref_fsa.hmm_posteriors(le, lA, lpi, lf, np.array(lens))
    # the reference's log p carries a relative error ~1e-16 of log-densities summing to ~1e6: normalise it away
    sums = want_gamma.sum(-1, keepdims=True)
    want_gamma = want_gamma / np.where(sums > 0, sums, 1.0)
    want_xi = want_xi * (np.array(lens) - 1.0)[:, None, None] / want_xi.sum((1, 2), keepdims=True)
    np.testing.assert_allclose(gamma, want_gamma, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(xi, want_xi, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_posteriors_one_sequence_few_states(K, hard):
    """B = 1, K <= 4 (the CPU's register paths: both chains at once while every state stays reachable, else the
    sequential backward): ragged lengths, and (hard) huge emission gaps within a step, an impossible transition, a
    frame whose largest emission is at an unreachable state, against the numpy reference and the same sequence
    computed among others (the general path); NaN, no path and the empty series."""
    rng = np.random.default_rng(60 + K)
    T = 700
    f = compiled(hmm.hmm_posteriors, "float64", None)
    le, lA, lpi, lf = model(rng, T, 1, K, 3.0)
    if hard:
        le[::50] *= 400
    if hard and K > 1:
        lA[:, 0] = -np.inf  # state 0 is reachable at t = 0 only
        lpi[0] = 0.0
        le[5, 0, 0] = 100.0
    for lens in ([700], [300], [1]):
        gamma, xi = f(le, lA, lpi, lf, mask_of(lens, T))
        want_gamma, want_xi = ref_fsa.hmm_posteriors(le, lA, lpi, lf, np.array(lens))
        sums = want_gamma.sum(-1, keepdims=True)
        np.testing.assert_allclose(gamma, want_gamma / np.where(sums > 0, sums, 1.0), rtol=1e-9, atol=1e-12)
        if lens[0] > 1:
            want_xi = want_xi * (lens[0] - 1.0) / want_xi.sum()
        np.testing.assert_allclose(xi, want_xi, rtol=1e-9, atol=1e-9)
        both = f(np.concatenate([le, le], 1), lA, lpi, lf, mask_of(lens * 2, T))
        np.testing.assert_allclose(both[0][:, 1], gamma[:, 0], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(both[1][1], xi[0], rtol=1e-12, atol=1e-12)
    gamma, xi = f(le, lA, lpi, lf, mask_of([0], T))
    assert np.all(gamma == 0) and np.all(xi == 0)
    # the gradient op reads the filter the register path stored
    xs, G, H = symbols("float64"), pt.tensor3(), pt.tensor3()
    gamma_s, xi_s = hmm.hmm_posteriors(*xs[:4], mask=xs[4])
    g = pytensor.function([*xs, G, H], pytensor.grad((gamma_s * G).sum() + (xi_s * H).sum(), xs[:4]))
    Gv, Hv = rng.normal(size=(T, 1, K)), rng.normal(size=(1, K, K))
    one = g(le, lA, lpi, lf, mask_of([700], T), Gv, Hv)
    two = g(np.concatenate([le, le], 1), lA, lpi, lf, mask_of([700, 0], T), np.concatenate([Gv, Gv], 1),
            np.concatenate([Hv, Hv]))
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b[:, :1] if a.ndim == 3 else b, rtol=1e-9, atol=1e-9)
    le_nan = le.copy()
    le_nan[7, 0, K - 1] = np.nan
    gamma, xi = f(le_nan, lA, lpi, lf, mask_of([700], T))
    assert np.all(np.isnan(gamma)) and np.all(np.isnan(xi))
    gamma, xi = f(np.full_like(le, -np.inf), lA, lpi, lf, mask_of([700], T))
    assert np.all(gamma == 0) and np.all(xi == 0)


@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_log_likelihood_one_sequence_few_states(K):
    """hmm_log_likelihood with B = 1, K <= 4 (the CPU's register path, c_code/hmm/hmm_loglik_small.h): value and
    gradients against the numpy reference and the same sequence computed among others, huge log-densities, a gap
    beyond double's range within one step (the log-space fallback), NaN, +inf, zero upstream gradient."""
    rng = np.random.default_rng(80 + K)
    T = 600
    le, lA, lpi, lf = model(rng, T, 1, K, 2.0)
    le[::40] = le[::40] * 300 - 1000
    xs, up = symbols("float64"), pt.vector()
    ll = ptnative.hmm_log_likelihood(*xs[:4], mask=xs[4])
    f = pytensor.function([*xs, up], [ll, *pytensor.grad((ll * up).sum(), xs[:4])])
    for lens in ([600], [1], [0]):
        one = f(le, lA, lpi, lf, mask_of(lens, T), [0.7])
        two = f(np.concatenate([le, le], 1), lA, lpi, lf, mask_of(lens * 2, T), [0.7, 0.0])
        np.testing.assert_allclose(one[0], ref_fsa.hmm_forward(le, lA, lpi, lf, np.array(lens)), rtol=1e-12)
        np.testing.assert_allclose(one[0], two[0][:1], rtol=1e-13)
        for a, b in zip(one[1:], two[1:]):
            np.testing.assert_allclose(a, b[:, :1] if a.ndim == 3 else b, rtol=1e-10, atol=1e-12)
        if lens[0] > 0:
            gamma, xi = ref_fsa.hmm_posteriors(le, lA, lpi, lf, np.array(lens))
            np.testing.assert_allclose(one[1], 0.7 * gamma, atol=1e-9)
            np.testing.assert_allclose(one[2], 0.7 * xi[0], rtol=1e-8, atol=1e-9)
    zero = f(le, lA, lpi, lf, mask_of([600], T), [0.0])
    assert all(np.all(g == 0) for g in zero[1:])
    if K > 1:  # the best path crosses a 2000-nat gap in one step: the scaled pass underflows
        gap = le.copy()
        gap[100, 0] = -2000.0
        gap[100, 0, 1] = 0.0
        gap[99, 0] = -2000.0
        gap[99, 0, 0] = 0.0
        lA_gap = np.where(np.eye(K) > 0, 0.0, -800.0)
        v, d_e, *_ = f(gap, lA_gap, lpi, lf, mask_of([600], T), [1.0])
        np.testing.assert_allclose(v, ref_fsa.hmm_forward(gap, lA_gap, lpi, lf, np.array([600])), rtol=1e-12)
        np.testing.assert_allclose(d_e.sum(-1), 1.0, atol=1e-9)
    bad = le.copy()
    bad[50, 0, K - 1] = np.nan
    v, d_e, d_A, _, _ = f(bad, lA, lpi, lf, mask_of([600], T), [1.0])
    assert np.isnan(v[0]) and np.isnan(d_e).all() and np.isnan(d_A).all()
    bad[50, 0, K - 1] = np.inf
    with pytest.raises(ValueError, match=r"log_emissions\[50, 0, %d\] = inf is infinitely likely" % (K - 1)):
        f(bad, lA, lpi, lf, mask_of([600], T), [1.0])


def _posterior_functional(G, H, lens):
    def f(le, lA, lpi, lf):
        _, gamma, xi, _, _ = ref.brute_force(le, lA, lpi, lf, lens)
        return (G * gamma).sum() + (H * xi).sum()
    return f


@pytest.mark.parametrize("dtype", DTYPES)
def test_posteriors_gradient_against_finite_differences(mode, dtype):
    rng = np.random.default_rng(6)
    T, B, K = 4, 3, 3
    le, lA, lpi, lf = model(rng, T, B, K, 1.5)
    lA[0, 2] = -np.inf  # an impossible transition: its gradient is 0
    lens = [4, 2, 0]
    G, H = rng.normal(size=(T, B, K)), rng.normal(size=(B, K, K))
    xs = symbols(dtype)
    gamma, xi = hmm.hmm_posteriors(*xs[:4], mask=xs[4])
    cost = (gamma * G.astype(dtype)).sum() + (xi * H.astype(dtype)).sum()
    f = pytensor.function(xs, pytensor.grad(cost, xs[:4]), mode=mode)
    got = f(*cast(dtype, le, lA, lpi, lf, mask_of(lens, T)))
    fun = _posterior_functional(G, H, lens)
    lA_fin = np.where(np.isfinite(lA), lA, -1e300)  # finite differences around -inf: keep it impossible
    want = [ref.finite_difference(lambda v: fun(v, lA, lpi, lf), le),
            ref.finite_difference(lambda v: fun(le, np.where(np.isfinite(lA), v, -np.inf), lpi, lf), lA_fin),
            ref.finite_difference(lambda v: fun(le, lA, v, lf), lpi),
            ref.finite_difference(lambda v: fun(le, lA, lpi, v), lf)]
    atol = 2e-4 if dtype == "float32" else 1e-7
    for name, g, w in zip(["log_emissions", "log_transitions", "log_initial", "log_final"], got, want):
        assert g.dtype == dtype
        np.testing.assert_allclose(g, w, rtol=10 * atol, atol=atol, err_msg=name)
    assert got[1][0, 2] == 0 and np.all(got[0][:, 2] == 0) and np.all(got[0][2:, 1] == 0)


def test_posteriors_verify_grad():
    rng = np.random.default_rng(7)
    le, lA, lpi, lf = model(rng, 6, 2, 3)
    mask = mask_of([6, 4], 6)
    G, H = rng.normal(size=(6, 2, 3)), rng.normal(size=(2, 3, 3))

    def cost(le, lA, lpi, lf):
        gamma, xi = hmm.hmm_posteriors(le, lA, lpi, lf, mask=mask)
        return (gamma * G).sum() + (xi * H).sum()

    verify_grad(cost, [le, lA, lpi, lf], rng=rng)


@pytest.mark.usefixtures("poison_pattern")  # int path: -1 on padded frames, never the 0x5A poison
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_no_path_and_empty(mode, dtype):
    """NaN on a valid frame: NaN out for that sequence only (Viterbi: score NaN, path -1); no path: Viterbi -inf
    and -1, posteriors 0, sampling -1; the empty series and T = 0 / B = 0."""
    rng = np.random.default_rng(8)
    T, B, K = 4, 4, 3
    le, lA, lpi, lf = model(rng, T, B, K)
    le[1, 1] = np.nan
    le[3, 0] = np.nan  # padded frame of sequence 0: ignored
    le[2, 2] = -np.inf  # sequence 2 has no path
    lens = [3, 4, 4, 0]
    args = cast(dtype, le, lA, lpi, lf, mask_of(lens, T))
    ok = ref.brute_force(np.where(np.isnan(le), 0.0, le), lA, lpi, lf, [3, 0, 0, 0])
    path, score = compiled(hmm.hmm_viterbi, dtype, mode)(*args)
    assert np.isnan(score[1]) and score[2] == -np.inf and score[3] == 0
    np.testing.assert_array_equal(path[:, 1:], -1)
    np.testing.assert_array_equal(path[:, 0], ok[3][:, 0])
    G = np.zeros((T, B, K), dtype)
    G[:, :, 0] = 1  # the cost: sum(gamma[:, :, 0]) + sum(xi)
    g, x, d = posteriors_gradient_function(dtype, mode)(*args, G, np.ones((B, K, K), dtype))[:3]
    assert np.isnan(g[:, 1]).all() and np.isnan(x[1]).all() and np.isnan(d[:, 1]).all()
    assert np.all(g[:, 2:] == 0) and np.all(x[2:] == 0) and np.all(d[:, 2:] == 0)
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(g[:, 0], ok[1][:, 0], rtol=rtol, atol=atol)
    assert np.isfinite(d[:, 0]).all()
    sp = sampler(dtype, mode)(*args, np.full((T, B), 0.5, dtype))
    np.testing.assert_array_equal(sp[:, 1:], -1)
    assert np.all(sp[:3, 0] >= 0) and sp[3, 0] == -1
    for shape in [(0, 2, K), (3, 0, K)]:
        empty = cast(dtype, np.zeros(shape), lA, lpi, lf, np.ones(shape[:2]))
        p0, s0 = compiled(hmm.hmm_viterbi, dtype, mode)(*empty)
        g0, x0 = compiled(hmm.hmm_posteriors, dtype, mode)(*empty)
        assert p0.shape == shape[:2] and g0.shape == shape and x0.shape == (shape[1], K, K)
        np.testing.assert_array_equal(s0, 0.0)
        np.testing.assert_array_equal(x0, 0.0)


@pytest.mark.usefixtures("poison_pattern")  # int path: -1 on padded frames, never the 0x5A poison
def test_nan_in_shared_parameters(mode):
    rng = np.random.default_rng(9)
    le, lA, lpi, lf = model(rng, 3, 2, 2)
    lA[0, 1] = np.nan
    lens = [3, 0]
    path, score = compiled(hmm.hmm_viterbi, "float64", mode)(le, lA, lpi, lf, mask_of(lens, 3))
    assert np.isnan(score[0]) and score[1] == 0 and np.all(path == -1)
    xs = symbols("float64")
    gamma, _ = hmm.hmm_posteriors(*xs[:4], mask=xs[4])
    f = pytensor.function(xs, [gamma] + pytensor.grad(gamma[:, :, 0].sum(), xs[:2]), mode=mode)
    g, d_e, d_A = f(le, lA, lpi, lf, mask_of(lens, 3))
    assert np.isnan(g[:, 0]).all() and np.all(g[:, 1] == 0) and np.isnan(d_A).all()


# ------------------------------------------------------------------ sampling
def test_sample_frequencies_match_the_posterior(mode):
    """Forward filtering, backward sampling: the frequencies of whole paths over 6000 draws (one batch of copies)
    against their exact probabilities (chi-square, 80 degrees of freedom, generous bound), and the marginals."""
    rng = np.random.default_rng(10)
    T, K, N = 4, 3, 6000
    le1, lA, lpi, lf = model(rng, T, 1, K, 1.0)
    le = np.repeat(le1, N, axis=1)
    lp = ref.path_log_probs(le1[:, 0], lA, lpi, lf, T)
    ll = np.logaddexp.reduce(list(lp.values()))
    paths = sampler("float64", mode)(le, lA, lpi, lf, np.ones((T, N)), rng.random((T, N)))
    assert paths.dtype == np.int32 and paths.min() >= 0 and paths.max() < K
    codes = (paths * K ** np.arange(T)[:, None]).sum(0)
    counts = np.bincount(codes, minlength=K ** T)
    expected = np.zeros(K ** T)
    for z, v in lp.items():
        expected[sum(s * K ** t for t, s in enumerate(z))] = N * np.exp(v - ll)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 80 + 8 * np.sqrt(2 * 80), chi2
    _, gamma, _, _, _ = ref.brute_force(le1, lA, lpi, lf)
    freq = np.stack([(paths == k).mean(1) for k in range(K)], -1)
    np.testing.assert_allclose(freq, gamma[:, 0], atol=0.03)


@pytest.mark.usefixtures("poison_pattern")  # int path: -1 on padded frames, never the 0x5A poison
@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_is_a_function_of_the_uniforms(mode, dtype):
    """u -> 0 picks the lowest state of positive weight, u -> 1 the highest; padded frames -1."""
    rng = np.random.default_rng(11)
    T, B, K = 3, 2, 3
    le, lA, lpi, lf = model(rng, T, B, K)
    lA[:, 1] = -np.inf  # state 1 is reachable only at t = 0
    f = sampler(dtype, mode)
    args = cast(dtype, le, lA, lpi, lf, mask_of([3, 2], T))
    low = f(*args, np.zeros((T, B), dtype))
    high = f(*args, np.full((T, B), np.nextafter(np.float32(1), np.float32(0)), dtype))
    np.testing.assert_array_equal(low, [[0, 0], [0, 0], [0, -1]])
    np.testing.assert_array_equal(high[:2], [[2, 2], [2, 2]])
    assert high[2, 1] == -1


# ------------------------------------------------------------------ batched / time-varying hmm_log_likelihood
VARYING = {  # name: (log_transitions shape, log_initial shape) for T, B, K
    "A_batched": lambda T, B, K: ((B, K, K), (K,)),
    "A_time_varying": lambda T, B, K: ((T - 1, B, K, K), (B, K)),
    "A_over_time_only": lambda T, B, K: ((T - 1, 1, K, K), (K,)),
    "pi_batched": lambda T, B, K: ((K, K), (B, K)),
}


def varying_model(rng, T, B, K, kind):
    a_shape, pi_shape = VARYING[kind](T, B, K)
    le = rng.normal(size=(T, B, K)) * 2
    lA = np.log(rng.dirichlet(np.ones(K), size=a_shape[:-1]))
    lpi = np.log(rng.dirichlet(np.ones(K), size=pi_shape[:-1]))
    return le, lA, lpi, rng.normal(size=K) * 0.3


@pytest.mark.parametrize("kind", sorted(VARYING))
@pytest.mark.parametrize("dtype", DTYPES)
def test_varying_parameters_against_reference(mode, dtype, kind):
    """Log-likelihood and every gradient against a log-space forward and finite differences."""
    rng = np.random.default_rng(13)
    T, B, K = 5, 3, 3
    le, lA, lpi, lf = varying_model(rng, T, B, K, kind)
    lens = [5, 2, 0]
    up = rng.random(B)
    xs = [pt.tensor(dtype=dtype, shape=(None,) * np.ndim(v)) for v in (le, lA, lpi, lf)]
    ll = ptnative.hmm_log_likelihood(*xs, mask=mask_of(lens, T).astype(dtype))
    f = pytensor.function(xs, [ll] + pytensor.grad((ll * up).sum(), xs), mode=mode)
    got = f(*cast(dtype, le, lA, lpi, lf))
    args = [le, lA, lpi, lf]
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(got[0], ref.forward_varying(*args, lens), rtol=rtol, atol=atol)
    assert got[0][2] == 0
    atol_g = 2e-4 if dtype == "float32" else 1e-7
    for k, name in enumerate(["log_emissions", "log_transitions", "log_initial", "log_final"]):
        def fun(v, k=k):
            a = list(args)
            a[k] = v
            return (ref.forward_varying(*a, lens) * up).sum()
        assert got[k + 1].dtype == dtype and got[k + 1].shape == np.shape(args[k])
        np.testing.assert_allclose(got[k + 1], ref.finite_difference(fun, args[k]), rtol=10 * atol_g, atol=atol_g,
                                   err_msg=name)


def test_varying_constant_transitions_equal_the_shared_op(mode):
    """(T-1, B, K, K) copies of one matrix give the shared op's log-likelihood and summed gradients, also for
    T = 3000 and log-densities of +-2000."""
    rng = np.random.default_rng(14)
    T, B, K = 3000, 2, 3
    le, lA, lpi, lf = model(rng, T, B, K)
    le[:, 0] = le[:, 0] * 800 + 300
    lens = [3000, 1234]
    tiled = np.broadcast_to(lA, (T - 1, B, K, K)).copy()
    xs = [pt.tensor3(), pt.tensor4(), pt.matrix(), pt.vector()]
    ll = ptnative.hmm_log_likelihood(*xs, mask=mask_of(lens, T))
    f = pytensor.function(xs, [ll] + pytensor.grad(ll.sum(), xs), mode=mode)
    v, d_e, d_A, d_pi, d_f = f(le, tiled, np.stack([lpi, lpi]), lf)
    s = [pt.tensor3(), pt.matrix(), pt.vector(), pt.vector()]
    ll_s = ptnative.hmm_log_likelihood(*s, mask=mask_of(lens, T))
    g = pytensor.function(s, [ll_s] + pytensor.grad(ll_s.sum(), s), mode=mode)
    w, w_e, w_A, w_pi, w_f = g(le, lA, lpi, lf)
    np.testing.assert_allclose(v, w, rtol=1e-11)
    np.testing.assert_allclose(d_e, w_e, atol=1e-9)
    np.testing.assert_allclose(d_A.sum((0, 1)), w_A, rtol=1e-8)
    assert np.all(d_A[lens[1] - 1:, 1] == 0)  # frames beyond sequence 1 have no transitions
    np.testing.assert_allclose(d_pi.sum(0), w_pi, rtol=1e-9)
    np.testing.assert_allclose(d_f, w_f, rtol=1e-9)


def test_varying_nan_short_series_and_errors(mode):
    rng = np.random.default_rng(15)
    T, B, K = 4, 3, 2
    le, lA, lpi, lf = varying_model(rng, T, B, K, "A_time_varying")
    lens = [4, 2, 0]
    lA_nan = lA.copy()
    lA_nan[2, 1, 0, 0] = np.nan  # frame 3 of sequence 1: padded, unused
    lA_nan[1, 0, 1, 1] = np.nan  # frame 2 of sequence 0
    xs, m = [pt.tensor3(), pt.tensor4(), pt.matrix(), pt.vector()], pt.matrix()
    ll = ptnative.hmm_log_likelihood(*xs, mask=m)
    g = pytensor.function(xs + [m], [ll] + pytensor.grad(ll.sum(), xs), mode=mode)

    def f(*args):
        return g(*args, mask_of(lens, args[0].shape[0]))

    v, d_e, d_A, d_pi, d_f = f(le, lA_nan, lpi, lf)
    want = ref.forward_varying(le, lA, lpi, lf, lens)
    assert np.isnan(v[0]) and v[2] == 0
    np.testing.assert_allclose(v[1], want[1], rtol=1e-12)
    assert np.isnan(d_e[:, 0]).all() and np.isfinite(d_e[:, 1:]).all() and np.isnan(d_pi[0]).all()
    assert np.isnan(d_A[:, 0]).all() and np.isfinite(d_A[:, 1:]).all() and np.isnan(d_f).all()
    # T = 1: no transitions at all, log_transitions (0, B, K, K)
    v1 = f(le[:1], np.zeros((0, B, K, K)), lpi, lf)
    np.testing.assert_allclose(v1[0], ref.forward_varying(le[:1], np.zeros((0, B, K, K)), lpi, lf, [1, 1, 0]),
                               rtol=1e-12)
    assert v1[2].shape == (0, B, K, K)
    fn = "HmmVaryingLikelihoodOp.*hmm_log_likelihood: "
    with pytest.raises(ValueError, match=fn + r"log_transitions must have shape \(K, K\), \(B, K, K\) or "
                                              r"\(T-1, B, K, K\), as \(T-1, B, K, K\) got \(2, 3, 2, 2\)"):
        f(le, lA[:2], lpi, lf)
    with pytest.raises(ValueError, match=fn + r"log_initial must have shape \(K,\) or \(B, K\), as \(B, K\) got "
                                              r"\(2, 2\)"):
        f(le, lA, lpi[:2], lf)
    bad = lA.copy()
    bad[0, 1, 1, 0] = np.inf
    with pytest.raises(ValueError, match=fn + r"log_transitions.flat\[6\] = inf"):
        f(le, bad, lpi, lf)
    with pytest.raises(ValueError, match=r"hmm_log_likelihood: log_transitions must have ndim 2 or 3 or 4 \(K, K\), "
                                         r"\(B, K, K\) or \(T-1, B, K, K\), got 5"):
        ptnative.hmm_log_likelihood(xs[0], pt.tensor(shape=(None,) * 5), xs[2])


# ------------------------------------------------------------------ errors, shapes, nvcc
def test_bad_input(mode):
    x, m, lA, u = pt.tensor3(), pt.matrix(), pt.matrix(), pt.matrix()
    A = np.zeros((2, 2))
    for fn, call in [("hmm_viterbi", lambda: hmm.hmm_viterbi(x, lA, np.zeros(2), mask=m)[1]),
                     ("hmm_posteriors", lambda: hmm.hmm_posteriors(x, lA, np.zeros(2), mask=m)[0]),
                     ("hmm_sample_states", lambda: hmm.hmm_sample_states(x, lA, np.zeros(2), mask=m, uniforms=u))]:
        f = pytensor.function([x, m, lA, u], call(), mode=mode, on_unused_input="ignore")
        msg = f"{fn}: "
        with pytest.raises(ValueError, match=msg + r"log_transitions must have shape \(K, K\), got \(2, 2\) "
                                                  r"\(log_emissions has shape \(3, 1, 3\)\)"):
            f(np.zeros((3, 1, 3)), np.ones((3, 1)), A, np.zeros((3, 1)))
        with pytest.raises(ValueError, match=msg + r"mask must have shape \(T, B\), got \(2, 1\)"):
            f(np.zeros((3, 1, 2)), np.ones((2, 1)), A, np.zeros((3, 1)))
        with pytest.raises(ValueError, match=msg + r"mask\[:, 0\] is not a prefix mask"):
            f(np.zeros((3, 1, 2)), np.array([[1.0], [0.0], [1.0]]), A, np.zeros((3, 1)))
        le = np.zeros((3, 1, 2))
        le[2, 0, 1] = np.inf
        with pytest.raises(ValueError, match=msg + r"log_emissions\[2, 0, 1\] = inf is infinitely likely"):
            f(le, np.ones((3, 1)), A, np.zeros((3, 1)))
        with pytest.raises(ValueError, match=msg + r"log_transitions.flat\[1\] = inf"):
            f(np.zeros((3, 1, 2)), np.ones((3, 1)), np.array([[0.0, np.inf], [0.0, 0.0]]), np.zeros((3, 1)))
    f = pytensor.function([x, m, lA, u], hmm.hmm_sample_states(x, lA, np.zeros(2), mask=m, uniforms=u), mode=mode)
    with pytest.raises(ValueError, match=r"hmm_sample_states: uniforms\[1, 0\] = 1 is not in \[0, 1\)"):
        f(np.zeros((3, 1, 2)), np.ones((3, 1)), A, np.array([[0.5], [1.0], [0.2]]))
    with pytest.raises(ValueError, match=r"hmm_sample_states: uniforms\[0, 0\] = nan is not in \[0, 1\)"):
        f(np.zeros((3, 1, 2)), np.ones((3, 1)), A, np.array([[np.nan], [0.0], [0.2]]))
    with pytest.raises(ValueError, match=r"hmm_sample_states: uniforms must have shape \(T, B\), got \(2, 1\)"):
        f(np.zeros((3, 1, 2)), np.ones((3, 1)), A, np.zeros((2, 1)))
    # a uniform on a padded frame is not used
    f(np.zeros((3, 1, 2)), np.array([[1.0], [0.0], [0.0]]), A, np.array([[0.5], [7.0], [np.nan]]))
    with pytest.raises(ValueError, match=r"hmm_viterbi: log_transitions must have ndim 2 or 3 or 4 \(K, K\), "
                                         r"\(B, K, K\) or \(T-1, B, K, K\), got 1"):
        hmm.hmm_viterbi(x, np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match=r"hmm_sample_states: uniforms must have ndim 2 \(T, B\), got 3"):
        hmm.hmm_sample_states(x, lA, np.zeros(2), uniforms=x)
    with pytest.raises(ValueError, match=r"hmm_posteriors: log_emissions must have ndim 3 \(T, B, K\), got 2"):
        hmm.hmm_posteriors(m, lA, np.zeros(2))
    with pytest.raises(TypeError, match=r"hmm_viterbi: log_initial must have a real or bool dtype, got complex128"):
        hmm.hmm_viterbi(x, lA, np.zeros(2, dtype=complex))
    with pytest.raises(TypeError, match=r"hmm_posteriors: log_emissions must have a real or bool dtype, got complex"):
        hmm.hmm_posteriors(pt.tensor3(dtype="complex128"), lA, np.zeros(2))
    with pytest.raises(TypeError, match=r"hmm_sample_states: log_final must be a real tensor, got str"):
        hmm.hmm_sample_states(x, lA, np.zeros(2), log_final="x", uniforms=u)


def test_argument_dtypes():
    """Integer and bool emissions compute in float64; the other arguments take the emissions' dtype."""
    x32 = pt.tensor3(dtype="float32")
    marginals, counts = hmm.hmm_posteriors(x32, np.zeros((2, 2)), np.zeros(2, dtype="int64"),
                                           mask=np.ones((3, 1), dtype=bool))
    assert marginals.dtype == counts.dtype == "float32"
    path, score = hmm.hmm_viterbi(pt.tensor3(dtype="int16"), np.zeros((2, 2), dtype="float32"), np.zeros(2))
    assert path.dtype == "int32" and score.dtype == "float64"


def test_infer_shape():
    rng = np.random.default_rng(12)
    a = pt.tensor3()
    lA, lpi = np.zeros((3, 3)), np.zeros(3)
    v = [rng.random((4, 2, 3))]
    check_infer_shape([a], list(hmm.hmm_viterbi(a, lA, lpi)), v, NativeOp)
    check_infer_shape([a], list(hmm.hmm_posteriors(a, lA, lpi)), v, NativeOp)
    check_infer_shape([a], [hmm.hmm_sample_states(a, lA, lpi, uniforms=pt.zeros((4, 2)))], v, NativeOp)


def test_exported():
    for name in hmm.__all__:
        assert getattr(ptnative.ops, name) is getattr(hmm, name)
    for name in ["hmm_viterbi", "hmm_posteriors", "hmm_sample_states"]:
        assert getattr(ptnative, name) is getattr(hmm, name)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_log_likelihood_kernels_compile_with_nvcc(monkeypatch):
    """c_code/hmm/hmm.cu's CUDA text (the lanes are CPU-only): the forward op, its gradient op and the op computing both."""
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    op = hmm.HmmForwardBackwardOp.make_op()
    ops = [op, op.grad_op(), hmm.HmmLikelihoodWithGradOp.make_op()]
    build_with_nvcc(*(o.variant(dtype, device="cuda") for o in ops for dtype in DTYPES))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_hmm_kernels_compile_with_nvcc(monkeypatch):
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    ops = [cls.make_op() for cls in (hmm.HmmViterbiOp, hmm.HmmPosteriorsOp, hmm.HmmSampleStatesOp,
                                     hmm.HmmVaryingLikelihoodOp)]
    ops += [op.grad_op() for op in ops if op.c_bw_code]
    build_with_nvcc(*(o.variant(dtype, device="cuda") for o in ops for dtype in DTYPES))


# ------------------------------------------------------------------ CPU threads
def test_threads_split_the_batch(monkeypatch):
    """Above T B K^2 = 1e7 the CPU kernels split the batch over PTNATIVE_NUM_THREADS threads: the same numbers
    as one thread (bit for bit where no sum runs over the batch), the same bits on every call with a fixed
    count, against the numpy references; ragged and empty sequences in several parts."""
    rng = np.random.default_rng(41)
    T, B, K = 1000, 7, 40
    le, lA, lpi, lf = model(rng, T, B, K, 3.0)
    lens = [1000, 999, 1, 0, 250, 1000, 37]
    mask = mask_of(lens, T)
    x = symbols("float64")
    ll = ptnative.hmm_log_likelihood(*x)
    grads = pytensor.grad((ll * np.arange(1.0, B + 1)).sum(), x[:4])
    f = pytensor.function(x, [ll, *grads, *hmm.hmm_posteriors(*x), *hmm.hmm_viterbi(*x)])
    f_ll = pytensor.function(x, grads)
    results = {}
    le_inf = le.copy()
    le_inf[500, 5, 3] = le_inf[600, 1, 2] = np.inf
    for n in ["1", "2", "3"]:
        monkeypatch.setenv("PTNATIVE_NUM_THREADS", n)
        results[n] = f(le, lA, lpi, lf, mask)
        for got, again in zip(results[n], f(le, lA, lpi, lf, mask)):
            np.testing.assert_array_equal(got, again)
        # the failure one thread meets first (frame 500 of sequence 5), whatever the split
        with pytest.raises(ValueError, match=r"hmm_log_likelihood: log_emissions\[500, 5, 3\] = inf"):
            f_ll(le_inf, lA, lpi, lf, mask)
    one = results["1"]
    np.testing.assert_allclose(one[0], ref_fsa.hmm_forward(le, lA, lpi, lf, np.array(lens)), rtol=1e-11)
    gamma, xi = ref_fsa.hmm_posteriors(le, lA, lpi, lf, np.array(lens))
    np.testing.assert_allclose(one[5], gamma, atol=1e-9)
    np.testing.assert_allclose(one[6], xi, rtol=1e-8, atol=1e-9)
    np.testing.assert_array_equal(one[7], ref.viterbi(le, lA, lpi, lf, lens)[0])
    np.testing.assert_allclose(one[1], gamma * np.arange(1.0, B + 1)[:, None], atol=1e-9)  # d ll / d log e
    for n in ["2", "3"]:
        for k, (got, want) in enumerate(zip(results[n], one)):
            if k in (2, 3, 4):  # d log A, d log pi, d log f: sums over the batch, in part order
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-10)
            else:
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_likelihood_memory_across_calls(dtype):
    """hmm_log_likelihood keeps its forward pass in memory of its own that only grows (up to 32 MB per thread; a
    larger problem takes memory for the call): calls of growing, shrinking and larger-than-kept sizes, K not a
    multiple of the vector width, ragged lengths, all against the numpy log-space references; the same call twice
    gives the same bits."""
    x = symbols(dtype)
    ll = ptnative.hmm_log_likelihood(*x[:4], mask=x[4])
    f = pytensor.function([*x], [ll, *pytensor.grad(ll.sum(), x[:4])])
    rng = np.random.default_rng(90)
    rtol, atol = (1e-4, 1e-4) if dtype == "float32" else (1e-11, 1e-9)
    # (T, B, K): a big one (2 * T B K doubles > 4M: not kept), small ones before and after, odd K
    for T, B, K in [(40, 3, 5), (2100, 64, 16), (40, 3, 5), (300, 9, 17), (3, 1, 8)]:
        le, lA, lpi, lf = model(rng, T, B, K, 2.0)
        lens = rng.integers(0, T + 1, size=B)
        lens[0] = T
        args = cast(dtype, le, lA, lpi, lf, mask_of(lens, T))
        got = f(*args)
        for a, b in zip(got, f(*args)):
            np.testing.assert_array_equal(a, b)
        le64, lA64, lpi64, lf64 = (np.asarray(a, np.float64) for a in args[:4])
        np.testing.assert_allclose(got[0], ref_fsa.hmm_forward(le64, lA64, lpi64, lf64, lens), rtol=rtol, atol=atol)
        if T * B <= 3000:  # the reference's posteriors loop in Python
            gamma, xi = ref_fsa.hmm_posteriors(le64, lA64, lpi64, lf64, lens)
            np.testing.assert_allclose(got[1], gamma, atol=10 * atol)
            np.testing.assert_allclose(got[2], xi.sum(0), rtol=rtol, atol=10 * atol)
        else:  # emission gradients: posteriors summing to 1 on valid frames, 0 on padded ones
            valid = mask_of(lens, T) > 0
            np.testing.assert_allclose(got[1].sum(-1)[valid], 1.0, atol=10 * atol)
            assert np.all(got[1][~valid] == 0)


# ------------------------------------------------------------------ hmm_log_likelihood: sequences in vector lanes
@compiled_once
def lanes_function(dtype, mode, weights_depend_on_value=False):
    """hmm_log_likelihood with its gradients; the upstream gradient ``w`` (an input), or ``w * ll`` (then it depends
    on the value and the forward and gradient ops stay apart)."""
    x = symbols(dtype)
    w = pt.vector(dtype=dtype)
    ll = ptnative.hmm_log_likelihood(*x[:4], mask=x[4])
    cost = (ll * w).sum() if not weights_depend_on_value else (0.5 * w * ll**2).sum()
    return pytensor.function([*x, w], [ll, *pytensor.grad(cost, x[:4])], mode=mode)


def check_against_references(got, args, lens, upstream, rtol, atol):
    le, lA, lpi, lf = (np.asarray(a, np.float64) for a in args[:4])
    want = ref_fsa.hmm_forward(le, lA, lpi, lf, lens)
    np.testing.assert_allclose(got[0], want, rtol=rtol, atol=atol)
    gamma, xi = ref_fsa.hmm_posteriors(le, lA, lpi, lf, lens)
    u = np.asarray(upstream, np.float64)
    on = np.asarray(lens) > 0
    np.testing.assert_allclose(got[1], gamma * u[None, :, None], rtol=rtol, atol=atol)
    np.testing.assert_allclose(got[2], np.einsum("b,bij->ij", u, xi), rtol=rtol, atol=atol)
    np.testing.assert_allclose(got[3], np.einsum("b,bk->k", u[on], gamma[0, on]), rtol=rtol, atol=atol)
    want_f = sum((u[b] * gamma[lens[b] - 1, b] for b in range(len(lens)) if lens[b] > 0), np.zeros(le.shape[2]))
    np.testing.assert_allclose(got[4], want_f, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_likelihood_lanes_any_batch(mode, dtype):
    """B = 1..24 and K = 1..33 on both CPU paths (c_code/hmm/hmm_lanes.h's hmm_use_lanes: groups of eight sequences in
    vector lanes, full, partial and several, with K = 16, 17, 33 transposed eight states at a time and the rest; or
    time outer and batch inner, e.g. B = 1, 3 x 8, 5 x 17, 17 x 16), ragged lengths with empty sequences, against
    the numpy log-space references; an upstream gradient that depends on the value (separate forward and gradient
    ops) gives the same numbers."""
    f = lanes_function(dtype, mode)
    f_dep = lanes_function(dtype, mode, weights_depend_on_value=True)
    rng = np.random.default_rng(70)
    rtol, atol = (2e-4, 2e-4) if dtype == "float32" else (1e-10, 1e-10)
    for B, K in [(1, 16), (3, 8), (4, 3), (5, 17), (7, 16), (8, 16), (9, 1), (12, 8), (14, 16), (16, 5), (17, 16),
                 (24, 17), (8, 33)]:
        T = int(rng.integers(6, 14))
        le, lA, lpi, lf = model(rng, T, B, K, 3.0)
        lens = rng.integers(0, T + 1, size=B)
        lens[0] = T
        up = rng.uniform(0.5, 2.0, size=B)
        args = cast(dtype, le, lA, lpi, lf, mask_of(lens, T), up)
        got = f(*args)
        check_against_references(got, args, lens, args[5], rtol, atol)
        for a, b in zip(got, f(*args)):
            np.testing.assert_array_equal(a, b)
        # cost 0.5 w ll^2: upstream gradient w * ll
        dep = f_dep(*args)
        np.testing.assert_array_equal(dep[0], got[0])
        check_against_references(dep, args, lens, args[5].astype(np.float64) * got[0], 10 * rtol, 10 * atol)


def test_log_likelihood_value_and_gradient_in_one_op(mode):
    """Where a graph needs the log-likelihood and its gradient with an upstream gradient that does not depend on it,
    one op computes both (HmmLikelihoodWithGradOp, by a rewrite of the default and C modes): the same bits as the
    two ops; with an upstream gradient that depends on the value the two ops stay."""
    rng = np.random.default_rng(71)
    T, B, K = 30, 10, 4  # two groups of lanes
    le, lA, lpi, lf = model(rng, T, B, K, 2.0)
    lens = [30, 29, 0, 1, 17, 30, 30, 5, 2, 30]
    args = [le, lA, lpi, lf, mask_of(lens, T), rng.uniform(0.5, 2.0, size=B)]
    base = pytensor.compile.mode.get_mode(mode)
    fused = lanes_function("float64", base)
    apart = lanes_function("float64", base.excluding("ptnative_hmm_value_and_gradient"))
    dep = lanes_function("float64", base, weights_depend_on_value=True)

    def names(fn):
        found = (getattr(n.op, "name", None) or "" for n in fn.maker.fgraph.toposort())
        return sorted(name for name in found if "Hmm" in name)

    two = ["GradOfHmmForwardBackwardOp", "HmmForwardBackwardOp"]
    assert names(apart) == two and names(dep) == two
    assert names(fused) == (two if mode == "FAST_COMPILE" else ["HmmLikelihoodWithGradOp"])
    for a, b in zip(fused(*args), apart(*args)):
        np.testing.assert_array_equal(a, b)
    check_against_references(fused(*args), args, lens, args[5], 1e-10, 1e-10)


def test_fused_ops_differentiate_like_the_ops_they_replace():
    """The ops that rewrites put in place of others (HmmLikelihoodWithGradOp, HmmPosteriorsValuesOp) take those
    ops' gradients when a graph is differentiated after the rewrites (as JAX differentiates a jaxified graph): the
    same numbers as pytensor.grad of the original graph, and a clear error for second derivatives through a fused
    gradient, never zeros."""
    pytest.importorskip("jax")
    import jax

    from pytensor.compile.mode import get_mode
    from pytensor.graph.fg import FunctionGraph
    from pytensor.link.jax.dispatch import jax_funcify

    from ptnative.backends.jax import register

    def jaxify_graph(inputs, outputs, op_name):
        """As ptnative.backends.jax.jaxify_graph (and PyMC), checking that the rewrites put ``op_name`` in."""
        register()
        fgraph = FunctionGraph(inputs=inputs, outputs=outputs, clone=True)
        get_mode("JAX").optimizer.rewrite(fgraph)
        assert op_name in {getattr(n.op, "name", None) for n in fgraph.toposort()}
        return jax_funcify(fgraph)

    rng = np.random.default_rng(73)
    T, B, K = 12, 9, 3
    le, lA, lpi, lf = model(rng, T, B, K, 2.0)
    mask = mask_of([12, 3, 0, 12, 7, 12, 1, 12, 9], T)
    xs = symbols("float64")
    ll = hmm.hmm_log_likelihood(*xs[:4], mask=xs[4])
    cost = (ll * np.linspace(0.5, 1.5, B)).sum()
    grads = pytensor.grad(cost, xs[:4])
    gamma, xi = hmm.hmm_posteriors(*xs[:4], mask=xs[4])
    post_cost = (gamma[:, :, 0] ** 2).sum() + (xi * xi).sum()
    args = [le, lA, lpi, lf, mask]
    want = pytensor.function(xs, pytensor.grad(cost, xs[:4]) + pytensor.grad(post_cost, xs[:4]), mode="FAST_COMPILE")
    jax_value_and_grads = jaxify_graph(xs, [cost, *grads], "HmmLikelihoodWithGradOp")
    jax_posteriors = jaxify_graph(xs, [gamma, xi], "HmmPosteriorsValuesOp")
    fused = jax.grad(lambda *a: jax_value_and_grads(*a)[0], argnums=(0, 1, 2, 3))(*args)
    posteriors = jax.grad(lambda *a: sum(f(o) for f, o in zip(
        (lambda g: (g[:, :, 0] ** 2).sum(), lambda x: (x * x).sum()), jax_posteriors(*a))), argnums=(0, 1, 2, 3))(*args)
    for got, expected in zip([*fused, *posteriors], want(*args)):
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-9, atol=1e-12)
        assert np.abs(expected).max() > 0
    with pytest.raises(pytensor.gradient.NullTypeGradError, match="HmmLikelihoodWithGradOp.*only its outputs"):
        jax.grad(lambda *a: jax_value_and_grads(*a)[1].sum())(*args)


def test_log_likelihood_lanes_special_cases(mode):
    """The lane path's fallbacks and special values, sequence by sequence within one group: a step that underflows
    (log-space recomputation, exact), no path (-inf, zero gradient), a NaN on a valid frame (NaN for that sequence
    only, and for the shared parameters' gradients), NaN on padded frames (ignored), an empty sequence; +inf raises
    naming the first bad (frame, sequence) of the batch."""
    K, T, B = 2, 4, 6
    lA = np.array([[0.0, -800.0], [-800.0, 0.0]])
    lpi = np.array([0.0, -5.0])
    lf = np.array([0.0, -2.0])
    rng = np.random.default_rng(72)
    le = rng.normal(size=(T, B, K))
    le[:3, 0] = [[0.0, -1000.0], [-1000.0, 0.0], [-3.0, -1.0]]  # jumps 0 -> 1 across 800 nats: log space
    le[1, 2] = -np.inf                                           # no path
    le[3, 4] = np.nan                                            # padded frame of sequence 4
    lens = np.array([3, 4, 2, 4, 3, 0])
    up = np.array([1.0, 0.5, 2.0, 1.5, 0.7, 1.0])
    f = lanes_function("float64", mode)
    v, d_e, d_A, d_pi, d_f = f(le, lA, lpi, lf, mask_of(lens, T), up)
    ok = [0, 1, 3, 4, 5]
    want = ref_fsa.hmm_forward(le[:, ok], lA, lpi, lf, lens[ok])
    np.testing.assert_allclose(v[ok], want, rtol=1e-12)
    assert v[2] == -np.inf and v[5] == 0 and want[0] < -790
    assert np.all(d_e[:, 2] == 0) and np.all(d_e[:, 5] == 0) and np.all(d_e[3, 4] == 0)
    gamma, xi = ref_fsa.hmm_posteriors(le[:, ok], lA, lpi, lf, lens[ok])
    np.testing.assert_allclose(d_e[:, ok], gamma * up[ok][None, :, None], atol=1e-10)
    np.testing.assert_allclose(d_A, np.einsum("b,bij->ij", up[ok], xi), atol=1e-10)
    nan = le.copy()
    nan[1, 3, 1] = np.nan
    v2, d_e2, d_A2, *_ = f(nan, lA, lpi, lf, mask_of(lens, T), up)
    assert np.isnan(v2[3]) and np.isnan(d_e2[:4, 3]).all() and np.isnan(d_A2).all()
    keep = [0, 1, 2, 4, 5]
    np.testing.assert_array_equal(v2[keep], v[keep])
    np.testing.assert_array_equal(d_e2[:, keep], d_e[:, keep])
    inf = le.copy()
    inf[2, 4, 0] = inf[1, 3, 1] = inf[3, 1, 0] = np.inf
    with pytest.raises(ValueError, match=r"hmm_log_likelihood: log_emissions\[1, 3, 1\] = inf"):
        f(inf, lA, lpi, lf, mask_of(lens, T), up)


def test_log_likelihood_lanes_long_and_extreme():
    """The lane path at T = 3000 with log-densities of +-2000 (power-of-two scalings per lane): finite and exact;
    the emission gradients are posteriors (sum 1 per valid frame)."""
    rng = np.random.default_rng(73)
    T, B, K = 3000, 8, 4
    le, lA, lpi, lf = model(rng, T, B, K)
    le = le * 800 + 300
    lens = np.array([3000, 2999, 1500, 1, 0, 3000, 17, 2048])
    f = lanes_function("float64", None)
    v, d_e, *_ = f(le, lA, lpi, lf, mask_of(lens, T), np.ones(B))
    np.testing.assert_allclose(v, ref_fsa.hmm_forward(le, lA, lpi, lf, lens), rtol=1e-12)
    assert np.isfinite(d_e).all()
    valid = mask_of(lens, T) > 0
    np.testing.assert_allclose(d_e.sum(-1)[valid], 1.0, atol=1e-9)
    assert np.all(d_e[~valid] == 0)


# ------------------------------------------------------------------ hmm_posteriors: sequences in vector lanes
def posteriors_with_gradient(dtype, mode):
    """hmm_posteriors' marginals and counts (HmmPosteriorsValuesOp after the rewrite, every mode but FAST_COMPILE),
    and a function of the same graph with the gradient of sum(G * marginals) + sum(H * counts) w.r.t. the four
    inputs (HmmPosteriorsOp, reading the filter its forward pass wrote): each compiled once per process."""
    return posteriors_function(dtype, mode), posteriors_gradient_function(dtype, mode)


@compiled_once
def posteriors_function(dtype, mode):
    """(log_emissions, log_transitions, log_initial, log_final, mask) -> gamma, xi."""
    xs = symbols(dtype)
    return pytensor.function(xs, list(hmm.hmm_posteriors(*xs[:4], mask=xs[4])), mode=mode)


@compiled_once
def posteriors_gradient_function(dtype, mode):
    """(log_emissions, log_transitions, log_initial, log_final, mask, G, H) -> gamma, xi and the gradients of
    sum(G * gamma) + sum(H * xi) w.r.t. the first four."""
    xs, G, H = symbols(dtype), pt.tensor3(dtype=dtype), pt.tensor3(dtype=dtype)
    gamma, xi = hmm.hmm_posteriors(*xs[:4], mask=xs[4])
    cost = (gamma * G).sum() + (xi * H).sum()
    return pytensor.function([*xs, G, H], [gamma, xi, *pytensor.grad(cost, xs[:4])], mode=mode)


@pytest.mark.parametrize("dtype", DTYPES)
def test_posteriors_lanes_any_batch(mode, dtype):
    """B = 2..24 and K = 1..33 (c_code/hmm/hmm_posteriors.cu: B >= 3 in groups of eight sequences in vector lanes, full,
    partial and several, K = 16, 17, 33 transposed eight states at a time and the rest; B = 2 time outer and batch
    inner), ragged lengths with empty sequences and T_b = 1, against the numpy log-space forward-backward; marginals
    summing to 1 on valid frames and 0 on padded ones; both ops give the same marginals and counts, the same bits on
    every call, and the same sequence gets the same numbers in any group and lane."""
    values, grads = posteriors_with_gradient(dtype, mode)
    rng = np.random.default_rng(74)
    rtol, atol = (1e-4, 2e-5) if dtype == "float32" else (1e-10, 1e-11)
    for B, K in [(2, 16), (3, 4), (4, 3), (5, 17), (7, 16), (8, 16), (9, 1), (12, 8), (16, 5), (17, 16), (24, 17),
                 (8, 33)]:
        T = int(rng.integers(6, 14))
        le, lA, lpi, lf = model(rng, T, B, K, 3.0)
        lens = rng.integers(0, T + 1, size=B)
        lens[0], lens[-1] = T, 1
        args = cast(dtype, le, lA, lpi, lf, mask_of(lens, T))
        gamma, xi = values(*args)
        le64, lA64, lpi64, lf64 = (np.asarray(a, np.float64) for a in args[:4])
        want_gamma, want_xi = ref_fsa.hmm_posteriors(le64, lA64, lpi64, lf64, lens)
        np.testing.assert_allclose(gamma, want_gamma, rtol=rtol, atol=atol, err_msg=f"B={B} K={K}")
        np.testing.assert_allclose(xi, want_xi, rtol=rtol, atol=atol, err_msg=f"B={B} K={K}")
        valid = mask_of(lens, T) > 0
        np.testing.assert_allclose(gamma.sum(-1)[valid], 1.0, atol=10 * np.finfo(dtype).eps)
        assert np.all(gamma[~valid] == 0)
        for a, b in zip((gamma, xi), values(*args)):
            np.testing.assert_array_equal(a, b)
        G, H = cast(dtype, rng.normal(size=(T, B, K)), rng.normal(size=(B, K, K)))
        both = grads(*args, G, H)
        np.testing.assert_array_equal(both[0], gamma)
        np.testing.assert_array_equal(both[1], xi)
        # the first sequence again, last in a batch of copies of another sequence (another group and lane)
        if B >= 3:
            order = [1] * (B - 1) + [0]
            moved = values(args[0][:, order], *args[1:4], args[4][:, order])
            np.testing.assert_array_equal(moved[0][:, -1], gamma[:, 0])
            np.testing.assert_array_equal(moved[1][-1], xi[0])


def test_posteriors_lanes_gradient(mode):
    """The gradient op reads the filter the lane path wrote: the gradients of a batch of 10 (two groups, ragged, an
    empty sequence) equal the sum of those of its sequences computed one at a time (B = 1, K = 5: the sequential
    pass), and match central finite differences of the enumeration reference on a tiny batch (B = 3, lanes)."""
    values, grads = posteriors_with_gradient("float64", mode)
    rng = np.random.default_rng(75)
    T, B, K = 9, 10, 5
    le, lA, lpi, lf = model(rng, T, B, K, 2.0)
    lens = rng.integers(1, T + 1, size=B)
    lens[3], lens[7] = 0, T
    G, H = rng.normal(size=(T, B, K)), rng.normal(size=(B, K, K))
    got = grads(le, lA, lpi, lf, mask_of(lens, T), G, H)
    want = [np.zeros_like(g) for g in got[2:]]
    for b in range(B):
        one = grads(le[:, b:b + 1], lA, lpi, lf, mask_of(lens[b:b + 1], T), G[:, b:b + 1], H[b:b + 1])
        np.testing.assert_allclose(got[0][:, b], one[0][:, 0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got[1][b], one[1][0], rtol=1e-12, atol=1e-13)
        want[0][:, b] = one[2][:, 0]
        for w, g in zip(want[1:], one[3:]):
            w += g
    for name, g, w in zip(["log_emissions", "log_transitions", "log_initial", "log_final"], got[2:], want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=name)
    T, B, K = 4, 3, 3
    le, lA, lpi, lf = model(rng, T, B, K, 1.5)
    lens = [4, 2, 3]
    G, H = rng.normal(size=(T, B, K)), rng.normal(size=(B, K, K))
    got = grads(le, lA, lpi, lf, mask_of(lens, T), G, H)[2:]
    fun = _posterior_functional(G, H, lens)
    want = [ref.finite_difference(lambda v: fun(v, lA, lpi, lf), le),
            ref.finite_difference(lambda v: fun(le, v, lpi, lf), lA),
            ref.finite_difference(lambda v: fun(le, lA, v, lf), lpi),
            ref.finite_difference(lambda v: fun(le, lA, lpi, v), lf)]
    for name, g, w in zip(["log_emissions", "log_transitions", "log_initial", "log_final"], got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7, err_msg=name)


def test_posteriors_lanes_special_cases(mode):
    """The lane path's fallbacks and special values within one group: the frame's largest log-density at an
    unreachable state (E underflows for every reachable one: recomputed by the sequential pass, exact), final
    weights on a state the emissions make e^-600 times less likely (z_t underflows: recomputed), log-densities of
    +-2000 at T = 300, no path (zeros), a NaN on a valid frame (NaN for that sequence only), NaN on a padded frame
    (ignored), an empty sequence, T = 0 and a batch of empty sequences; +inf raises, also after a NaN of the same
    sequence."""
    rng = np.random.default_rng(76)
    T, B, K = 300, 8, 3
    le, lA, lpi, lf = model(rng, T, B, K, 2.0)
    lA[:, 2] = -np.inf                       # state 2 is reachable at t = 0 only
    le[40, 0] = [0.0, -5.0, 1000.0]          # ... and holds frame 40's largest log-density
    le[:, 1] = le[:, 1] * 1000               # +-2000 and more
    lf2 = np.array([0.0, -np.inf, -np.inf])  # sequence 2 must end in state 0 ...
    le[149, 2] = [-600.0, 0.0, 0.0]          # ... whose last emission is e^-600 times the others'
    le[7, 3] = -np.inf                       # no path
    le[200:, 5] = np.nan                     # padded frames of sequence 5
    lens = np.array([300, 300, 150, 300, 0, 200, 300, 1])
    values, _ = posteriors_with_gradient("float64", mode)

    def reference(le, lf):
        g, x = ref_fsa.hmm_posteriors(le, lA, lpi, lf, lens)
        sums = g.sum(-1, keepdims=True)
        counts = np.maximum(lens - 1.0, 0)[:, None, None]
        total = x.sum((1, 2), keepdims=True)
        return g / np.where(sums > 0, sums, 1.0), x * counts / np.where(total > 0, total, 1.0)

    gamma, xi = values(le, lA, lpi, lf, mask_of(lens, T))
    with np.errstate(invalid="ignore"):  # log p = -inf for the sequence without a path
        want_gamma, want_xi = reference(le, lf)
    ok = [0, 1, 5, 6, 7]
    np.testing.assert_allclose(gamma[:, ok], want_gamma[:, ok], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(xi[ok], want_xi[ok], rtol=1e-9, atol=1e-9)
    assert np.all(gamma[:, 3] == 0) and np.all(xi[3] == 0) and np.all(gamma[:, 4] == 0) and np.all(xi[4] == 0)
    assert gamma[40, 0, 2] == 0 and np.isfinite(want_gamma[:, ok]).all()
    gamma2, xi2 = values(le[:, 2:3].repeat(4, 1), lA, lpi, lf2, mask_of([150] * 4, T))
    want_gamma2, want_xi2 = ref_fsa.hmm_posteriors(le[:, 2:3], lA, lpi, lf2, np.array([150]))
    sums = want_gamma2.sum(-1, keepdims=True)
    np.testing.assert_allclose(gamma2[:, 3], (want_gamma2 / np.where(sums > 0, sums, 1.0))[:, 0], rtol=1e-9,
                               atol=1e-12)
    np.testing.assert_allclose(xi2[3], want_xi2[0] * 149.0 / want_xi2.sum(), rtol=1e-9, atol=1e-9)
    assert gamma2[149, 3, 0] == 1.0
    nan = le.copy()
    nan[100, 6, 1] = np.nan
    gamma3, xi3 = values(nan, lA, lpi, lf, mask_of(lens, T))
    assert np.isnan(gamma3[:, 6]).all() and np.isnan(xi3[6]).all()
    keep = [0, 1, 2, 3, 4, 5, 7]
    np.testing.assert_array_equal(gamma3[:, keep], gamma[:, keep])
    np.testing.assert_array_equal(xi3[keep], xi[keep])
    inf = nan.copy()
    inf[250, 6, 0] = np.inf  # after the NaN of the same sequence
    with pytest.raises(ValueError, match=r"hmm_posteriors: log_emissions\[250, 6, 0\] = inf is infinitely likely"):
        values(inf, lA, lpi, lf, mask_of(lens, T))
    inf = le.copy()
    inf[20, 1, 2] = np.inf
    with pytest.raises(ValueError, match=r"hmm_posteriors: log_emissions\[20, 1, 2\] = inf is infinitely likely"):
        values(inf, lA, lpi, lf, mask_of(lens, T))
    for shape in [(0, 5, K), (4, 9, K)]:  # T = 0, and every sequence empty
        empty = values(np.zeros(shape), lA, lpi, lf, np.zeros(shape[:2]))
        assert empty[0].shape == shape and empty[1].shape == (shape[1], K, K)
        assert np.all(empty[0] == 0) and np.all(empty[1] == 0)
