"""The dense HMM ops' fully_written outputs (docs/writing-ops.md): the posteriors' marginals and counts and the
emission gradients of hmm_log_likelihood (fused with the value or not, shared or batched transitions) and of
hmm_posteriors are not zeroed before their kernels run, so every element must be written by them.  Under
PTNATIVE_POISON_OUTPUTS=1 (tests/conftest.py) such outputs start as NaN: an element a kernel leaves shows here.  The
cases aim at what the kernels do not compute: padded frames, sequences without a frame, T = 1, T = 0, B = 0, a NaN or
no path on a valid frame, a zero upstream gradient (the CPU's likelihood passes skip that sequence), the log-space
fallback, and every CPU path (one sequence of K <= 4 states, vector lanes, time outer and batch inner, several
threads), against numpy references (log-space forward-backward, enumeration of every state path)."""

import itertools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from scipy.special import logsumexp

import ptnative
from ptnative.ops import hmm
from tests.conftest import MODES, compiled_once
from tests.reference import fsa as ref_fsa


def every_mode():
    try:
        import jax  # noqa: F401
    except ImportError:
        return list(MODES)
    return [*MODES, "JAX"]


def mask_of(lens, T):
    return (np.arange(T)[:, None] < np.asarray(lens)[None, :]).astype(np.float64)


@compiled_once
def functions(dtype, mode):
    """The compiled graphs whose native ops have fully_written outputs, on inputs of ``dtype`` in ``mode``:
    ``values`` (le, lA, lpi, lf, mask) -> marginals, counts (HmmPosteriorsValuesOp); ``defaults`` (le, lA, lpi) ->
    the same with the default final weights and mask (HmmPosteriorsDefaultsOp); ``posteriors_grad`` (..., G, H) ->
    marginals, counts and d/d le of sum(G * marginals) + sum(H * counts) (HmmPosteriorsOp and its gradient op);
    ``fused`` (..., w) -> the log-likelihood and d/d le of sum(w * ll) (HmmLikelihoodWithGradOp); ``grad_only`` the
    gradient alone (HmmForwardBackwardOp's gradient op); ``varying`` (le, lA (B, K, K), lpi, lf, mask, w) -> the same
    gradient with per-sequence transitions (HmmVaryingLikelihoodOp's gradient op)."""
    le, lA, lpi, lf, mask = (pt.tensor3(dtype=dtype), pt.matrix(dtype=dtype), pt.vector(dtype=dtype),
                             pt.vector(dtype=dtype), pt.matrix(dtype=dtype))
    G, H, w, lA3 = pt.tensor3(dtype=dtype), pt.tensor3(dtype=dtype), pt.vector(dtype=dtype), pt.tensor3(dtype=dtype)
    xs = [le, lA, lpi, lf, mask]
    gamma, xi = hmm.hmm_posteriors(le, lA, lpi, lf, mask=mask)
    cost = (gamma * G).sum() + (xi * H).sum()
    ll = ptnative.hmm_log_likelihood(le, lA, lpi, lf, mask=mask)
    d_ll = pytensor.grad((ll * w).sum(), le)
    ll_v = ptnative.hmm_log_likelihood(le, lA3, lpi, lf, mask=mask)
    return {
        "values": pytensor.function(xs, [gamma, xi], mode=mode),
        "defaults": pytensor.function([le, lA, lpi], list(hmm.hmm_posteriors(le, lA, lpi)), mode=mode),
        "posteriors_grad": pytensor.function([*xs, G, H], [gamma, xi, pytensor.grad(cost, le)], mode=mode),
        "fused": pytensor.function([*xs, w], [ll, d_ll], mode=mode),
        "grad_only": pytensor.function([*xs, w], d_ll, mode=mode),
        "varying": pytensor.function([le, lA3, lpi, lf, mask, w], pytensor.grad((ll_v * w).sum(), le), mode=mode),
    }


def enumerated_posteriors_gradient(le, lA, lpi, lf, G, H, b, L):
    """d/d le[:L, b] of E[sum_t G[t, b, z_t] + sum_t H[b, z_{t-1}, z_t]] by enumeration of the K**L paths (the
    posterior covariance of that sum with the indicators of z_t = k)."""
    K = le.shape[2]
    Z = np.array(list(itertools.product(range(K), repeat=L)))
    t = np.arange(L)
    logp = lpi[Z[:, 0]] + le[t, b, Z].sum(1) + lA[Z[:, :-1], Z[:, 1:]].sum(1) + lf[Z[:, -1]]
    p = np.exp(logp - logsumexp(logp))
    F = G[t, b, Z].sum(1) + H[b, Z[:, :-1], Z[:, 1:]].sum(1)
    centred = p * (F - p @ F)
    return np.stack([np.bincount(Z[:, s], weights=centred, minlength=K) for s in range(L)])


# name: (T, B, K, lens, NaN sequence, no-path sequence, zero-upstream sequence, log-space gap in sequence 0)
CASES = {
    "ragged_lanes": (5, 6, 3, [5, 0, 3, 5, 1, 4], 2, 3, 5, False),
    "ragged_gap": (6, 4, 3, [6, 0, 2, 5], 3, None, 2, True),
    "one_sequence_padded": (5, 1, 3, [3], None, None, None, False),
    "one_sequence_no_frame": (4, 1, 3, [0], None, None, None, False),
    "one_sequence_gap": (6, 1, 3, [6], None, None, None, True),
    "one_sequence_nan": (4, 1, 2, [2], 0, None, None, False),
    "one_sequence_no_path": (4, 1, 4, [3], None, 0, None, False),
    "one_sequence_zero_upstream": (4, 1, 3, [3], None, None, 0, False),
    "t1": (1, 5, 3, [1, 0, 1, 1, 0], 2, None, 3, False),
    "two_sequences": (5, 2, 5, [4, 0], None, None, None, False),
    "two_sequences_special": (5, 2, 5, [2, 5], 1, 0, None, False),
    "time_outer_gap": (6, 2, 5, [6, 3], None, None, 1, True),
    "large_k_lanes": (3, 8, 20, [3, 0, 2, 1, 3, 0, 2, 3], 4, 6, 7, False),
    "large_k_time_outer": (3, 9, 20, [3, 0, 2, 1, 3, 3, 2, 3, 1], 4, 5, 8, False),
    "threads": (60, 3, 240, [60, 0, 37], None, 2, None, False),  # T B K^2 >= 1e7: a part per thread
    "no_frames": (0, 3, 3, [0, 0, 0], None, None, None, False),
    "no_sequences": (4, 0, 3, [], None, None, None, False),
}


def make_case(name, dtype):
    T, B, K, lens, nan_b, nopath_b, zero_b, gap = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name))
    le = rng.normal(size=(T, B, K)) * 2.0
    lA = np.log(rng.dirichlet(np.ones(K), size=K))
    lpi = np.log(rng.dirichlet(np.ones(K)))
    lf = rng.normal(size=K) * 0.3
    le[np.arange(T)[:, None] >= np.asarray(lens, dtype=int)[None, :]] = np.nan  # padded frames: ignored
    if gap:  # the best path crosses a 2000-nat gap in one step: the scaled likelihood pass underflows
        lA = np.where(np.eye(K) > 0, 0.0, -800.0)
        le[:3, 0] = np.where(np.arange(K) == 0, 0.0, -2000.0)[None, :]
        le[3:lens[0], 0] = np.where(np.arange(K) == 1, 0.0, np.where(np.arange(K) == 0, -1000.0, -2000.0))[None, :]
    if nan_b is not None:
        le[lens[nan_b] - 1, nan_b, K - 1] = np.nan
    if nopath_b is not None:
        le[lens[nopath_b] // 2, nopath_b] = -np.inf
    w = rng.normal(size=B) + 2.0
    if zero_b is not None:
        w[zero_b] = 0.0
    G, H = rng.normal(size=(T, B, K)), rng.normal(size=(B, K, K))
    args = [a.astype(dtype) for a in (le, lA, lpi, lf, mask_of(lens, T))]
    return args, G.astype(dtype), H.astype(dtype), w.astype(dtype), (lens, nan_b, nopath_b)


def expected(args, G, H, w, special):
    """The numpy references (float64, on the inputs as cast): marginals, counts, the log-likelihood and its emission
    gradient with shared transitions (exact: the log-space fallback) and with per-sequence ones, and the posteriors'
    emission gradient (None where the enumeration is too large).  The posteriors and the batched likelihood count
    a transition below e^-708 times the largest as impossible (docs/hmm.md)."""
    lens, nan_b, nopath_b = special
    le, lA, lpi, lf, _ = (np.nan_to_num(np.asarray(a, np.float64), nan=0.0) for a in args)
    G, H, w = (np.asarray(a, np.float64) for a in (G, H, w))
    T, B, K = le.shape
    lA_cut = np.where(lA < lA.max() - 708, -np.inf, lA)
    lens = np.array(lens, dtype=int)
    gamma, xi = ref_fsa.hmm_posteriors(le, lA_cut, lpi, lf, lens)
    d_ll = ref_fsa.hmm_posteriors(le, lA, lpi, lf, lens)[0] * w[None, :, None]
    d_var = gamma * w[None, :, None]
    ll = ref_fsa.hmm_forward(le, lA, lpi, lf, lens)
    small = all(K ** int(L) <= 20000 for L in lens)
    d_post = np.zeros((T, B, K)) if small else None
    for b, L in enumerate(lens):
        if b == nopath_b:
            gamma[:, b], xi[b], d_ll[:, b], d_var[:, b], ll[b] = 0.0, 0.0, 0.0, 0.0, -np.inf
        elif b == nan_b:
            gamma[:L, b], xi[b], d_ll[:L, b], d_var[:L, b], ll[b] = np.nan, np.nan, np.nan, np.nan, np.nan
            if small:
                d_post[:L, b] = np.nan
        elif small and L > 0:
            d_post[:L, b] = enumerated_posteriors_gradient(le, lA_cut, lpi, lf, G, H, b, L)
    return gamma, xi, ll, d_ll, d_var, d_post


def assert_close(got, want, dtype, scale=1.0):
    rtol, atol = (3e-4, 3e-5 * scale) if dtype == "float32" else (1e-8, 1e-10 * scale)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", every_mode())
def test_every_element_written(mode, dtype, case):
    """Marginals, counts and the three emission gradients against the references in every case: padded frames and
    sequences without a frame or a path 0, NaN sequences NaN on their valid frames only."""
    fn = functions(dtype, mode)
    args, G, H, w, special = make_case(case, dtype)
    lens, nan_b, nopath_b = special
    gamma, xi, want_ll, d_ll, d_var, d_post = expected(args, G, H, w, special)
    T, B, K = args[0].shape
    padded = np.arange(T)[:, None] >= np.asarray(lens, dtype=int)[None, :]
    got_gamma, got_xi = fn["values"](*args)
    assert_close(got_gamma, gamma, dtype)
    assert_close(got_xi, xi, dtype, scale=T)
    p_gamma, p_xi, p_d = fn["posteriors_grad"](*args, G, H)
    assert_close(p_gamma, gamma, dtype)
    assert_close(p_xi, xi, dtype, scale=T)
    assert np.all(p_d[padded] == 0)
    if nopath_b is not None:
        assert np.all(p_d[:, nopath_b] == 0)
    if d_post is not None:
        assert_close(p_d, d_post, dtype, scale=10 * T)
    else:
        valid = ~padded
        if nan_b is not None:
            valid[:, nan_b] = False
        assert np.isfinite(p_d[valid]).all()
    ll, got_d_ll = fn["fused"](*args, w)
    assert_close(ll, want_ll, dtype, scale=100)
    got_d_var = fn["varying"](args[0], np.broadcast_to(args[1], (B, K, K)).copy(), *args[2:], w)
    for got, want in ((got_d_ll, d_ll), (fn["grad_only"](*args, w), d_ll), (got_d_var, d_var)):
        assert_close(got, want, dtype)
        assert np.all(got[padded] == 0)
    full = np.nan_to_num(np.asarray(args[0], np.float64), nan=0.0, neginf=-np.inf).astype(dtype)
    d_gamma, d_xi = fn["defaults"](full, args[1], args[2])
    lA = args[1].astype(np.float64)
    lA_cut = np.where(lA < lA.max() - 708, -np.inf, lA)
    want_gamma, want_xi = ref_fsa.hmm_posteriors(np.asarray(full, np.float64), lA_cut, args[2].astype(np.float64),
                                                 None, np.full(B, T))
    for b in range(B):
        if not np.isfinite(np.asarray(full[:, b], np.float64)).any(axis=-1).all() or T == 0:
            want_gamma[:, b], want_xi[b] = 0.0, 0.0  # a frame without a possible state: no path
    assert_close(d_gamma, want_gamma, dtype)
    assert_close(d_xi, want_xi, dtype, scale=T)


@compiled_once
def posteriors_with_filter(dtype, mode):
    """HmmPosteriorsOp's six outputs (marginals, counts and the hidden alpha, scales, shifts, status) on inputs of
    ``dtype``, compiled in ``mode``."""
    xs = [pt.tensor3(dtype=dtype), pt.matrix(dtype=dtype), pt.vector(dtype=dtype), pt.vector(dtype=dtype),
          pt.matrix(dtype=dtype)]
    return pytensor.function(xs, hmm.HmmPosteriorsOp.make_op().make_node(*xs).outputs, mode=mode)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", every_mode())
def test_hidden_filter_written(mode, dtype, case):
    """HmmPosteriorsOp's hidden outputs: the status of every sequence (0 computed, 2 no path, 3 NaN), the filter on
    the valid frames of computed sequences finite, every other element 0."""
    args, _, _, _, (lens, nan_b, nopath_b) = make_case(case, dtype)
    T, B, K = args[0].shape
    gamma, xi, alpha, scales, shifts, status = posteriors_with_filter(dtype, mode)(*args)
    want_status = np.zeros(B)
    if nan_b is not None:
        want_status[nan_b] = 3
    if nopath_b is not None:
        want_status[nopath_b] = 2
    np.testing.assert_array_equal(status, want_status)
    read = (np.arange(T)[:, None] < np.asarray(lens, dtype=int)[None, :]) & (want_status == 0)[None, :]
    for x in (alpha, scales[..., None], shifts[..., None]):
        assert np.isfinite(x[read]).all()
        assert np.all(x[~read] == 0)
