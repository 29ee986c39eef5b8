"""Batched (B, K, K) and time-varying (T-1, B, K, K) transitions and batched (B, K) initial weights in hmm_posteriors
(with gradients), hmm_viterbi and hmm_sample_states (ptnative.ops.hmm's HmmVarying*Op): against enumeration of every
state path, numpy log-space forward-backward / Viterbi / sampling references, the (K, K) ops on repeated matrices and
per-sequence calls, verify_grad; ragged masks, T = 1, the empty batch, NaN; float32 and float64, in every mode."""

import shutil

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import verify_grad

from ptnative import NativeOp
from ptnative.ops import hmm

from .conftest import build_with_nvcc, check_infer_shape, compiled_once, tol
from .reference import hmm as ref

DTYPES = ["float32", "float64"]

KINDS = {  # name: (log_transitions shape, log_initial shape) for T, B, K
    "A_time_varying": lambda T, B, K: ((T - 1, B, K, K), (B, K)),
    "A_batched": lambda T, B, K: ((B, K, K), (K,)),
    "A_over_time_only": lambda T, B, K: ((T - 1, 1, K, K), (K,)),
    "A_one_sequence_row": lambda T, B, K: ((1, B, K, K), (K,)),
    "pi_batched": lambda T, B, K: ((K, K), (B, K)),
}


def mask_of(lens, T):
    return (np.arange(T)[:, None] < np.asarray(lens)[None, :]).astype(np.float64)


def varying_model(rng, T, B, K, kind, scale=2.0):
    a_shape, pi_shape = KINDS[kind](T, B, K)
    le = rng.normal(size=(T, B, K)) * scale
    lA = np.log(rng.dirichlet(np.ones(K), size=a_shape[:-1]))
    lpi = np.log(rng.dirichlet(np.ones(K), size=pi_shape[:-1]))
    return le, lA, lpi, rng.normal(size=K) * 0.3


def cast(dtype, *arrays):
    return [np.asarray(a).astype(dtype) for a in arrays]


def symbols(dtype, a_ndim, pi_ndim):
    return [pt.tensor3(dtype=dtype), pt.tensor(dtype=dtype, shape=(None,) * a_ndim),
            pt.tensor(dtype=dtype, shape=(None,) * pi_ndim), pt.vector(dtype=dtype), pt.matrix(dtype=dtype)]


@compiled_once
def inference(dtype, mode, a_ndim, pi_ndim):
    """(le, lA, lpi, lf, mask, uniforms) -> marginals, counts, path, score, sampled path."""
    xs = symbols(dtype, a_ndim, pi_ndim)
    u = pt.matrix(dtype=dtype)
    outs = [*hmm.hmm_posteriors(*xs[:4], mask=xs[4]), *hmm.hmm_viterbi(*xs[:4], mask=xs[4]),
            hmm.hmm_sample_states(*xs[:4], mask=xs[4], uniforms=u)]
    return pytensor.function(xs + [u], outs, mode=mode)


def run(dtype, mode, le, lA, lpi, lf, lens, uniforms):
    f = inference(dtype, mode, np.ndim(lA), np.ndim(lpi))
    return f(*cast(dtype, le, lA, lpi, lf, mask_of(lens, le.shape[0]), uniforms))


@compiled_once
def posteriors_gradient(dtype, mode, a_ndim, pi_ndim):
    """(le, lA, lpi, lf, mask, G, H) -> marginals, counts, d/d(le, lA, lpi, lf) of sum(G marginals) + sum(H counts)."""
    xs = symbols(dtype, a_ndim, pi_ndim)
    G, H = pt.tensor3(dtype=dtype), pt.tensor3(dtype=dtype)
    gamma, xi = hmm.hmm_posteriors(*xs[:4], mask=xs[4])
    cost = (gamma * G).sum() + (xi * H).sum()
    return pytensor.function(xs + [G, H], [gamma, xi, *pytensor.grad(cost, xs[:4])], mode=mode)


def test_the_varying_ops_are_used():
    xs = symbols("float64", 4, 2)
    for fn, op in [(hmm.hmm_posteriors, hmm.HmmVaryingPosteriorsOp), (hmm.hmm_viterbi, hmm.HmmVaryingViterbiOp)]:
        assert fn(*xs[:4])[0].owner.op.name == op.__name__
    path = hmm.hmm_sample_states(*xs[:4], uniforms=xs[4])
    assert path.owner.op.name == hmm.HmmVaryingSampleStatesOp.__name__
    shared = symbols("float64", 2, 1)
    assert hmm.hmm_posteriors(*shared[:4])[0].owner.op.name == hmm.HmmPosteriorsOp.__name__


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_against_enumeration(mode, dtype, kind):
    """Marginals, counts, Viterbi path and score against every path of a tiny ragged batch; sampled paths against
    the numpy sampler driven by the same uniforms (the same path)."""
    rng = np.random.default_rng(1)
    T, B, K = 5, 4, 3
    le, lA, lpi, lf = varying_model(rng, T, B, K, kind)
    lens = [5, 3, 1, 0]
    u = rng.random((T, B))
    gamma, xi, path, score, drawn = run(dtype, mode, le, lA, lpi, lf, lens, u)
    args = [a.astype(dtype).astype(np.float64) for a in (le, lA, lpi, lf)]
    _, want_gamma, want_xi, want_path, want_score = ref.brute_force(*args, lens)
    rtol, atol = tol(dtype)
    assert gamma.dtype == xi.dtype == score.dtype == dtype and path.dtype == drawn.dtype == np.int32
    np.testing.assert_allclose(gamma, want_gamma, rtol=rtol, atol=atol)
    np.testing.assert_allclose(xi, want_xi, rtol=rtol, atol=atol)
    np.testing.assert_array_equal(path, want_path)
    np.testing.assert_allclose(score, want_score, rtol=rtol, atol=atol)
    np.testing.assert_array_equal(drawn, ref.sample(*args, lens, u.astype(dtype)))
    assert (drawn[:, 3] == -1).all() and score[3] == 0 and (gamma[:, 3] == 0).all() and (xi[3] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_long_series_against_numpy(mode, dtype):
    """T = 300, log-densities of +-50: numpy log-space forward-backward, Viterbi and sampler."""
    rng = np.random.default_rng(2)
    T, B, K = 300, 3, 5
    le, lA, lpi, lf = varying_model(rng, T, B, K, "A_time_varying", scale=25.0)
    lA[rng.random(lA.shape) < 0.2] = -np.inf  # impossible transitions
    lA[..., 0] = np.log(0.5)  # state 0 stays reachable
    lens = [300, 170, 1]
    u = rng.random((T, B))
    gamma, xi, path, score, drawn = run(dtype, mode, le, lA, lpi, lf, lens, u)
    args = [a.astype(dtype).astype(np.float64) for a in (le, lA, lpi, lf)]
    want_gamma, want_xi = ref.forward_backward(*args, lens)
    want_path, want_score = ref.viterbi(*args, lens)
    rtol, atol = (2e-3, 2e-4) if dtype == "float32" else (1e-8, 1e-10)
    np.testing.assert_allclose(gamma, want_gamma, rtol=rtol, atol=atol)
    np.testing.assert_allclose(xi, want_xi, rtol=rtol, atol=10 * atol)
    np.testing.assert_array_equal(path, want_path)
    np.testing.assert_allclose(score, want_score, rtol=1e-6 if dtype == "float32" else 1e-12)
    np.testing.assert_array_equal(drawn, ref.sample(*args, lens, u.astype(dtype)))


def test_repeated_matrix_gives_the_shared_ops_results(mode):
    """(T-1, B, K, K) copies of one matrix and (B, K) copies of one initial row give the (K, K) ops' paths, scores
    and samples exactly, their marginals and counts to rounding, and gradients that sum to theirs; T = 2000 with
    log-densities of +-1000."""
    rng = np.random.default_rng(3)
    T, B, K = 2000, 3, 4
    le = rng.normal(size=(T, B, K)) * 3
    le[:, 0] = le[:, 0] * 300 + 100
    lA = np.log(rng.dirichlet(np.ones(K), size=K))
    lpi, lf = np.log(rng.dirichlet(np.ones(K))), rng.normal(size=K) * 0.3
    lens = [2000, 777, 0]
    u = rng.random((T, B))
    tiled, rows = np.broadcast_to(lA, (T - 1, B, K, K)).copy(), np.stack([lpi] * B)
    got = run("float64", mode, le, tiled, rows, lf, lens, u)
    want = run("float64", mode, le, lA, lpi, lf, lens, u)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-10, atol=1e-10)
    for k in (2, 3, 4):
        np.testing.assert_array_equal(got[k], want[k])
    G, H = rng.normal(size=(T, B, K)), rng.normal(size=(B, K, K))
    mask = mask_of(lens, T)
    d = posteriors_gradient("float64", mode, 4, 2)(le, tiled, rows, lf, mask, G, H)[2:]
    w = posteriors_gradient("float64", mode, 2, 1)(le, lA, lpi, lf, mask, G, H)[2:]
    np.testing.assert_allclose(d[0], w[0], rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(d[1].sum((0, 1)), w[1], rtol=1e-8, atol=1e-8)
    assert np.all(d[1][lens[1] - 1:, 1] == 0) and np.all(d[1][:, 2] == 0)  # no transitions there
    np.testing.assert_allclose(d[2].sum(0), w[2], rtol=1e-8, atol=1e-9)
    assert np.all(d[2][2] == 0)
    np.testing.assert_allclose(d[3], w[3], rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_equals_per_sequence_calls(mode, dtype):
    """(B, K, K) transitions and (B, K) initial weights: each sequence's results are those of a (K, K) call on it
    alone (marginals, counts, path, score, sampled path, and the gradients of its own matrix and row)."""
    rng = np.random.default_rng(4)
    T, B, K = 40, 4, 3
    le, lA, lpi, lf = varying_model(rng, T, B, K, "A_batched")
    lpi = np.log(rng.dirichlet(np.ones(K), size=B))
    lens = [40, 13, 1, 0]
    u = rng.random((T, B))
    got = run(dtype, mode, le, lA, lpi, lf, lens, u)
    G, H = rng.normal(size=(T, B, K)), rng.normal(size=(B, K, K))
    grads = posteriors_gradient(dtype, mode, 3, 2)(*cast(dtype, le, lA, lpi, lf, mask_of(lens, T), G, H))[2:]
    rtol, atol = (1e-4, 1e-5) if dtype == "float32" else (1e-12, 1e-13)
    for b in range(B):
        one = run(dtype, mode, le[:, b:b + 1], lA[b], lpi[b], lf, lens[b:b + 1], u[:, b:b + 1])
        for k, name in enumerate(["marginals", "counts", "path", "score", "samples"]):
            mine = got[k][:, b:b + 1] if got[k].ndim >= 2 and got[k].shape[0] == T else got[k][b:b + 1]
            np.testing.assert_allclose(mine, one[k], rtol=rtol, atol=atol, err_msg=f"{name} of sequence {b}")
        w = posteriors_gradient(dtype, mode, 2, 1)(*cast(dtype, le[:, b:b + 1], lA[b], lpi[b], lf,
                                                        mask_of(lens[b:b + 1], T), G[:, b:b + 1], H[b:b + 1]))[2:]
        np.testing.assert_allclose(grads[0][:, b:b + 1], w[0], rtol=10 * rtol, atol=10 * atol)
        np.testing.assert_allclose(grads[1][b], w[1], rtol=10 * rtol, atol=10 * atol)
        np.testing.assert_allclose(grads[2][b], w[2], rtol=10 * rtol, atol=10 * atol)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_posteriors_gradient_verify_grad(kind):
    """float64 verify_grad of a random projection of marginals and counts w.r.t. every float input."""
    rng = np.random.default_rng(5)
    T, B, K = 4, 3, 3
    le, lA, lpi, lf = varying_model(rng, T, B, K, kind, scale=1.0)
    mask = mask_of([4, 2, 0], T)
    G, H = rng.normal(size=(T, B, K)), rng.normal(size=(B, K, K))

    def cost(le, lA, lpi, lf):
        gamma, xi = hmm.hmm_posteriors(le, lA, lpi, lf, mask=mask)
        return (gamma * G).sum() + (xi * H).sum()

    verify_grad(cost, [le, lA, lpi, lf], rng=rng, abs_tol=1e-6, rel_tol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_posteriors_gradient_against_finite_differences(mode, dtype):
    """The gradients in every mode against central differences of the numpy forward-backward reference."""
    rng = np.random.default_rng(6)
    T, B, K = 4, 3, 2
    le, lA, lpi, lf = varying_model(rng, T, B, K, "A_time_varying", scale=1.0)
    lens = [4, 3, 0]
    G, H = rng.normal(size=(T, B, K)), rng.normal(size=(B, K, K))
    got = posteriors_gradient(dtype, mode, 4, 2)(*cast(dtype, le, lA, lpi, lf, mask_of(lens, T), G, H))[2:]
    args = [le, lA, lpi, lf]
    atol = 2e-4 if dtype == "float32" else 1e-7
    for k, name in enumerate(["log_emissions", "log_transitions", "log_initial", "log_final"]):
        def fun(v, k=k):
            a = list(args)
            a[k] = v
            gamma, xi = ref.forward_backward(*a, lens)
            return (gamma * G).sum() + (xi * H).sum()
        assert got[k].dtype == dtype and got[k].shape == np.shape(args[k])
        np.testing.assert_allclose(got[k], ref.finite_difference(fun, args[k]), rtol=10 * atol, atol=atol,
                                   err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_no_path_t1_and_empty(mode, dtype):
    """A NaN in one frame's matrix of one sequence makes only that sequence NaN (marginals, counts, score; path and
    sample -1; NaN in the gradient entries it touches); an impossible sequence gets zeros, -inf and -1; T = 1 takes
    (0, B, K, K) transitions; an empty batch and an empty series give empty / zero results."""
    rng = np.random.default_rng(7)
    T, B, K = 4, 4, 2
    le, lA, lpi, lf = varying_model(rng, T, B, K, "A_time_varying")
    lens = [4, 4, 2, 0]
    lA[2, 0, 1, 1] = np.nan  # frame 3 of sequence 0
    lA[3 - 1, 2, 0, 0] = np.nan  # frame 3 of sequence 2: padded, unused
    lA[:, 1] = -np.inf  # sequence 1: no path
    u = np.full((T, B), 0.5)
    gamma, xi, path, score, drawn = run(dtype, mode, le, lA, lpi, lf, lens, u)
    assert np.isnan(gamma[:4, 0]).all() and np.isnan(xi[0]).all() and np.isnan(score[0])
    assert (path[:, 0] == -1).all() and (drawn[:, 0] == -1).all()
    assert (gamma[:, 1] == 0).all() and (xi[1] == 0).all() and score[1] == -np.inf
    assert (path[:, 1] == -1).all() and (drawn[:, 1] == -1).all()
    args = [a.astype(dtype).astype(np.float64) for a in (le, lA, lpi, lf)]
    _, want_gamma, want_xi, want_path, want_score = ref.brute_force(*args, [0, 0, 2, 0])
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(gamma[:, 2:], want_gamma[:, 2:], rtol=rtol, atol=atol)
    np.testing.assert_allclose(xi[2:], want_xi[2:], rtol=rtol, atol=atol)
    np.testing.assert_array_equal(path[:, 2:], want_path[:, 2:])
    np.testing.assert_allclose(score[2:], want_score[2:], rtol=rtol, atol=atol)
    G, H = np.ones((T, B, K)), np.ones((B, K, K))
    d_le, d_A, d_pi, d_f = posteriors_gradient(dtype, mode, 4, 2)(*cast(dtype, le, lA, lpi, lf, mask_of(lens, T),
                                                                        G, H))[2:]
    assert np.isnan(d_le[:, 0]).all() and np.isfinite(d_le[:, 1:]).all() and (d_le[:, 1] == 0).all()
    assert np.isnan(d_A[:, 0]).all() and np.isfinite(d_A[:, 1:]).all()
    assert np.isnan(d_pi[0]).all() and np.isfinite(d_pi[1:]).all() and np.isnan(d_f).all()
    # T = 1: no transitions
    one = run(dtype, mode, le[:1], np.zeros((0, B, K, K)), lpi, lf, [1, 1, 1, 0], u[:1])
    _, want_gamma, _, want_path, want_score = ref.brute_force(args[0][:1], np.zeros((0, B, K, K)), args[2], args[3],
                                                              [1, 1, 1, 0])
    np.testing.assert_allclose(one[0], want_gamma, rtol=rtol, atol=atol)
    assert (one[1] == 0).all()
    np.testing.assert_array_equal(one[2], want_path)
    np.testing.assert_allclose(one[3], want_score, rtol=rtol, atol=atol)
    np.testing.assert_array_equal(one[4], ref.sample(args[0][:1], np.zeros((0, B, K, K)), args[2], args[3],
                                                     [1, 1, 1, 0], u[:1]))
    g1 = posteriors_gradient(dtype, mode, 4, 2)(*cast(dtype, le[:1], np.zeros((0, B, K, K)), lpi, lf,
                                                      mask_of([1, 1, 1, 0], 1), G[:1], H))
    assert g1[3].shape == (0, B, K, K) and np.isfinite(g1[2]).all()
    # the empty batch and the empty series
    empty = run(dtype, mode, np.zeros((3, 0, K)), np.zeros((2, 0, K, K)), np.zeros((0, K)), lf, [], np.zeros((3, 0)))
    assert [e.shape for e in empty] == [(3, 0, K), (0, K, K), (3, 0), (0,), (3, 0)]
    none = run(dtype, mode, np.zeros((0, 2, K)), np.zeros((0, 2, K, K)), lpi[:2], lf, [0, 0], np.zeros((0, 2)))
    assert [e.shape for e in none] == [(0, 2, K), (2, K, K), (0, 2), (2,), (0, 2)]
    assert (none[1] == 0).all() and (none[3] == 0).all()


def test_errors(mode):
    """Shapes that do not fit, +inf, and bad uniforms raise ValueError naming the function and the argument."""
    x, lA, lpi, m, u = pt.tensor3(), pt.tensor4(), pt.matrix(), pt.matrix(), pt.matrix()
    le = np.zeros((4, 3, 2))
    A = np.zeros((3, 3, 2, 2))
    pi = np.zeros((3, 2))
    calls = {"hmm_viterbi": lambda a, p, mask=None: hmm.hmm_viterbi(x, a, p, mask=mask)[1],
             "hmm_posteriors": lambda a, p, mask=None: hmm.hmm_posteriors(x, a, p, mask=mask)[0],
             "hmm_sample_states": lambda a, p, mask=None: hmm.hmm_sample_states(x, a, p, mask=mask, uniforms=u)}
    for fn, call in calls.items():
        f = pytensor.function([x, lA, lpi, m, u], call(lA, lpi, m), mode=mode, on_unused_input="ignore")
        ok = (le, A, pi, np.ones((4, 3)), np.zeros((4, 3)))
        f(*ok)
        msg = f"{fn}: "
        with pytest.raises(ValueError, match=msg + r"log_transitions must have shape \(K, K\), \(B, K, K\) or "
                                                   r"\(T-1, B, K, K\), as \(T-1, B, K, K\) got \(2, 3, 2, 2\)"):
            f(le, A[:2], pi, *ok[3:])
        with pytest.raises(ValueError, match=msg + r"log_transitions must have shape .* got \(3, 2, 2, 2\)"):
            f(le, A[:, :2], pi, *ok[3:])
        with pytest.raises(ValueError, match=msg + r"log_initial must have shape \(K,\) or \(B, K\), as \(B, K\) "
                                                   r"got \(2, 2\)"):
            f(le, A, pi[:2], *ok[3:])
        with pytest.raises(ValueError, match=msg + r"mask must have shape \(T, B\), got \(3, 3\)"):
            f(le, A, pi, np.ones((3, 3)), ok[4])
        bad = A.copy()
        bad[1, 2, 0, 1] = np.inf
        with pytest.raises(ValueError, match=msg + r"log_transitions.flat\[21\] = inf"):
            f(le, bad, pi, *ok[3:])
        with pytest.raises(ValueError, match=msg + r"log_transitions must have ndim 2 or 3 or 4 \(K, K\), "
                                                   r"\(B, K, K\) or \(T-1, B, K, K\), got 5"):
            call(pt.tensor(shape=(None,) * 5), lpi)
        with pytest.raises(ValueError, match=msg + r"log_initial must have ndim 1 or 2 \(K,\) or \(B, K\), got 3"):
            call(lA, pt.tensor3())
    f = pytensor.function([x, lA, lpi, m, u], hmm.hmm_sample_states(x, lA, lpi, mask=m, uniforms=u), mode=mode)
    with pytest.raises(ValueError, match=r"hmm_sample_states: uniforms\[2, 1\] = 1 is not in \[0, 1\)"):
        uu = np.zeros((4, 3))
        uu[2, 1] = 1.0
        f(le, A, pi, np.ones((4, 3)), uu)
    with pytest.raises(ValueError, match=r"hmm_sample_states: uniforms must have shape \(T, B\), got \(4, 2\)"):
        f(le, A, pi, np.ones((4, 3)), np.zeros((4, 2)))


def test_infer_shape():
    rng = np.random.default_rng(8)
    a, lA, lpi = pt.tensor3(), pt.tensor4(), pt.matrix()
    v = [rng.random((4, 2, 3)), np.zeros((3, 2, 3, 3)), np.zeros((2, 3))]
    check_infer_shape([a, lA, lpi], list(hmm.hmm_viterbi(a, lA, lpi)), v, NativeOp)
    check_infer_shape([a, lA, lpi], list(hmm.hmm_posteriors(a, lA, lpi)), v, NativeOp)
    check_infer_shape([a, lA, lpi], [hmm.hmm_sample_states(a, lA, lpi, uniforms=pt.zeros((4, 2)))], v, NativeOp)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_varying_kernels_compile_with_nvcc(monkeypatch):
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    ops = [cls.make_op() for cls in (hmm.HmmVaryingPosteriorsOp, hmm.HmmVaryingViterbiOp,
                                     hmm.HmmVaryingSampleStatesOp)]
    ops += [op.grad_op() for op in ops if op.c_bw_code]
    build_with_nvcc(*(o.variant(dtype, device="cuda") for o in ops for dtype in DTYPES))
