"""hmm_posteriors and hmm_viterbi called without ``log_final`` and ``mask``: the rewrites put HmmPosteriorsDefaultsOp
(where no gradient is taken) and HmmViterbiDefaultsOp in (the kernel makes the default zeros and ones, or needs none;
the graph holds no nodes building them).  Their results against the numpy log-space references and enumeration of
every path, and against the same call with those defaults given as inputs (same bits), the posteriors' gradient when
a graph is differentiated after the rewrites, and the cases the rewrites must leave alone (other fills, a mask of
another shape)."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import get_mode
from pytensor.graph.fg import FunctionGraph

from ptnative.ops import hmm

from .conftest import tol
from .reference import fsa as ref_fsa
from .reference import hmm as ref
from .test_hmm import cast, model

DTYPES = ["float32", "float64"]


def names(f):
    return [getattr(n.op, "name", type(n.op).__name__) for n in f.maker.fgraph.toposort()]


def three(dtype):
    return pt.tensor3("le", dtype=dtype), pt.matrix("lA", dtype=dtype), pt.vector("lpi", dtype=dtype)


def without_and_with_defaults(fn, dtype, mode, ops):
    """``fn`` (hmm_posteriors or hmm_viterbi) compiled in ``mode`` on (le, lA, lpi), and on (le, lA, lpi, lf, mask).
    ``ops`` (defaults, five, given): the first graph is the defaults op alone (modes with the specialize rewrites;
    FAST_COMPILE keeps ``five``, the op of the five inputs, and the Allocs), the second holds ``given``."""
    xs = three(dtype)
    lf, mask = pt.vector("lf", dtype=dtype), pt.matrix("mask", dtype=dtype)
    f = pytensor.function(xs, list(fn(*xs)), mode=mode)
    given = pytensor.function([*xs, lf, mask], list(fn(*xs, lf, mask)), mode=mode)
    if mode == "FAST_COMPILE":
        assert ops[1] in names(f)
    else:
        assert names(f) == [ops[0]]
        assert ops[2] in names(given)
    return f, given


@pytest.mark.parametrize("dtype", DTYPES)
def test_posteriors_with_default_final_and_mask(mode, dtype):
    """One native op and nothing else in the compiled graph (modes with the specialize rewrites; FAST_COMPILE keeps
    HmmPosteriorsOp and the Allocs), the same bits as with log_final = 0 and mask = 1 given as inputs, and the
    reference's numbers: the one-sequence path (K = 1..4), lanes (B >= 3), the sequential pass (K = 6), T = 1, the
    empty series and the empty batch."""
    f, given = without_and_with_defaults(hmm.hmm_posteriors, dtype, mode,
                                         ("HmmPosteriorsDefaultsOp", "HmmPosteriorsOp", "HmmPosteriorsValuesOp"))
    rng = np.random.default_rng(410)
    for T, B, K in ((60, 1, 1), (60, 1, 2), (500, 1, 3), (60, 1, 4), (40, 5, 3), (30, 2, 6), (1, 1, 3), (0, 1, 3),
                    (5, 0, 2)):
        le, lA, lpi, _ = model(rng, T, B, K, 2.0)
        args = cast(dtype, le, lA, lpi)
        gamma, xi = f(*args)
        assert gamma.shape == (T, B, K) and xi.shape == (B, K, K) and gamma.dtype == dtype
        want = given(*args, np.zeros(K, dtype), np.ones((T, B), dtype))
        np.testing.assert_array_equal(gamma, want[0])
        np.testing.assert_array_equal(xi, want[1])
        if T and B:
            want_gamma, want_xi = ref_fsa.hmm_posteriors(*(np.asarray(a, np.float64) for a in args), np.zeros(K),
                                                         [T] * B)
            rtol, atol = tol(dtype)
            np.testing.assert_allclose(gamma, want_gamma, rtol=rtol, atol=atol)
            np.testing.assert_allclose(xi, want_xi, rtol=rtol, atol=atol)
            np.testing.assert_allclose(gamma.sum(-1), 1.0, rtol=rtol)
        else:
            assert not gamma.any() and not xi.any()


def test_posteriors_with_defaults_nan_and_errors():
    """NaN in gives NaN marginals and counts for that sequence; +inf and bad shapes raise naming hmm_posteriors and
    the argument, as with the defaults given."""
    xs = three("float64")
    f = pytensor.function(xs, list(hmm.hmm_posteriors(*xs)))
    assert names(f) == ["HmmPosteriorsDefaultsOp"]
    rng = np.random.default_rng(411)
    le, lA, lpi, _ = model(rng, 50, 4, 3, 2.0)
    le[20, 1, 2] = np.nan
    gamma, xi = f(le, lA, lpi)
    assert np.isnan(gamma[:, 1]).all() and np.isnan(xi[1]).all()
    assert np.isfinite(gamma[:, [0, 2, 3]]).all() and np.isfinite(xi[[0, 2, 3]]).all()
    one = le[:, 1:2].copy()
    gamma, xi = f(one, lA, lpi)
    assert np.isnan(gamma).all() and np.isnan(xi).all()
    one[20, 0, 2] = np.inf
    with pytest.raises(ValueError, match=r"hmm_posteriors: log_emissions\[20, 0, 2\] = inf"):
        f(one, lA, lpi)
    with pytest.raises(ValueError, match=r"hmm_posteriors: log_initial must have shape \(K,\)"):
        f(le, lA, lpi[:2])


# ------------------------------------------------------------------ Viterbi
@pytest.mark.usefixtures("poison_pattern")  # the int path: every element written (-1 where no state)
@pytest.mark.parametrize("dtype", DTYPES)
def test_viterbi_with_default_final_and_mask(mode, dtype):
    """One native op and nothing else in the compiled graph (modes with the specialize rewrites; FAST_COMPILE keeps
    HmmViterbiOp and the Allocs), the same bits as with log_final = 0 and mask = 1 given as inputs, and the
    references' paths and scores: the one-sequence register paths (K = 1..8), lanes (B = 5), the frame-by-frame
    path (B = 2, and B = 1 with K = 12), T = 1, the empty series, the empty batch and K = 0 (no path)."""
    f, given = without_and_with_defaults(hmm.hmm_viterbi, dtype, mode,
                                         ("HmmViterbiDefaultsOp", "HmmViterbiOp", "HmmViterbiOp"))
    rng = np.random.default_rng(420)
    rtol, atol = tol(dtype)
    shapes = [(5, 1, K) for K in range(1, 9)] + [(4, 3, 3)]  # enumeration
    shapes += [(300, 1, K) for K in range(1, 9)] + [(500, 1, 3), (40, 5, 3), (30, 2, 6), (25, 1, 12), (1, 1, 3),
                                                    (1, 1, 7), (0, 1, 3), (0, 1, 6), (5, 0, 2), (5, 1, 0)]
    for T, B, K in shapes:
        le, lA, lpi, _ = model(rng, T, B, K, 2.0) if K else (np.zeros((T, B, 0)), np.zeros((0, 0)), np.zeros(0), 0)
        if K > 1:
            lA[0, -1] = -np.inf  # an impossible transition
        args = cast(dtype, le, lA, lpi)
        path, score = f(*args)
        assert path.shape == (T, B) and score.shape == (B,) and path.dtype == np.int32 and score.dtype == dtype
        want = given(*args, np.zeros(K, dtype), np.ones((T, B), dtype))
        np.testing.assert_array_equal(path, want[0])
        assert score.tobytes() == want[1].tobytes(), (T, B, K)
        if T == 0 or K == 0:  # the empty series: score 0; no state: no path
            np.testing.assert_array_equal(score, 0.0 if T == 0 else -np.inf)
            np.testing.assert_array_equal(path, -1)
            continue
        wide = [np.asarray(a, np.float64) for a in args]
        reference = ref.brute_force if T <= 5 else ref.viterbi
        want_path, want_score = reference(*wide, np.zeros(K), [T] * B)[-2:]
        np.testing.assert_array_equal(path, want_path, err_msg=str((T, B, K)))
        np.testing.assert_allclose(score, want_score, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [2, 3, 4, 5, 8])
def test_viterbi_with_defaults_ties(dtype, K):
    """Integer log-weights: many equally likely paths; the lowest state wins at the end and at every step of the
    backtrace (enumeration of every path), on the one-sequence paths with the defaults made in the kernel; all-zero
    weights give state 0 everywhere."""
    xs = three(dtype)
    f = pytensor.function(xs, list(hmm.hmm_viterbi(*xs)))
    assert names(f) == ["HmmViterbiDefaultsOp"]
    rng = np.random.default_rng(430 + K)
    T = 6 if K <= 4 else 4
    for trial in range(4):
        le = rng.integers(-2, 1, size=(T, 1, K)).astype(np.float64)
        lA = rng.integers(-1, 1, size=(K, K)).astype(np.float64)
        lpi = rng.integers(-1, 1, size=K).astype(np.float64)
        if K > 2:
            lA[K - 1, 0] = lA[1, 2] = -np.inf
        if trial % 2:
            h = K // 2  # the last h states copy the first h: ties everywhere
            le[:, :, K - h:] = le[:, :, :h]
            lA[:, K - h:] = lA[:, :h]
        path, score = f(*cast(dtype, le, lA, lpi))
        _, _, _, want_path, want_score = ref.brute_force(le, lA, lpi, np.zeros(K), [T])
        np.testing.assert_array_equal(path, want_path, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(score, want_score.astype(dtype))
    path, score = f(*cast(dtype, np.zeros((T, 1, K)), np.zeros((K, K)), np.zeros(K)))
    np.testing.assert_array_equal(path, 0)
    np.testing.assert_array_equal(score, 0.0)


@pytest.mark.parametrize("K", [3, 6, 12])
def test_viterbi_with_defaults_nan_no_path_and_errors(K):
    """NaN in gives the score NaN and the path -1 for that sequence (on the one-sequence paths: by the general
    path's fallback); a frame no state can emit gives -inf and -1; +inf and bad shapes raise naming hmm_viterbi and
    the argument, as with the defaults given."""
    xs = three("float64")
    f = pytensor.function(xs, list(hmm.hmm_viterbi(*xs)))
    assert names(f) == ["HmmViterbiDefaultsOp"]
    rng = np.random.default_rng(440 + K)
    le, lA, lpi, _ = model(rng, 50, 4, K, 2.0)
    le[20, 1, K - 1] = np.nan
    path, score = f(le, lA, lpi)
    assert np.isnan(score[1]) and np.all(path[:, 1] == -1)
    want_path, want_score = ref.viterbi(le[:, [0, 2, 3]], lA, lpi, np.zeros(K), [50] * 3)
    np.testing.assert_array_equal(path[:, [0, 2, 3]], want_path)
    np.testing.assert_allclose(score[[0, 2, 3]], want_score, rtol=1e-12)
    one = le[:, 1:2].copy()
    path, score = f(one, lA, lpi)
    assert np.isnan(score[0]) and np.all(path == -1)
    lA_nan = lA.copy()
    lA_nan[1, 0] = np.nan
    path, score = f(le[:, :1], lA_nan, lpi)
    assert np.isnan(score[0]) and np.all(path == -1)
    stuck = le[:, :1].copy()
    stuck[30] = -np.inf
    path, score = f(stuck, lA, lpi)
    assert score[0] == -np.inf and np.all(path == -1)
    one[20, 0, K - 1] = np.inf
    with pytest.raises(ValueError, match=r"hmm_viterbi: log_emissions\[20, 0, %d\] = inf" % (K - 1)):
        f(one, lA, lpi)
    lA_inf = lA.copy()
    lA_inf[0, 1] = np.inf
    with pytest.raises(ValueError, match=r"hmm_viterbi: log_transitions.flat\[1\] = inf"):
        f(le[:, :1], lA_inf, lpi)
    with pytest.raises(ValueError, match=r"hmm_viterbi: log_initial must have shape \(K,\)"):
        f(le[:, :1], lA, lpi[:2])
    with pytest.raises(ValueError, match=r"hmm_viterbi: log_transitions must have shape \(K, K\)"):
        f(le[:, :1], lA[:, :2], lpi)


def test_rewrite_leaves_other_fills_and_shapes_alone():
    """The rewrite takes only the defaults: zeros for log_final, ones of the emissions' (T, B) for the mask.  Other
    fills stay inputs of HmmPosteriorsValuesOp (their numbers differ), and a ones mask of another shape still
    raises."""
    xs = three("float64")
    rng = np.random.default_rng(412)
    le, lA, lpi, _ = model(rng, 30, 2, 3, 2.0)
    half = pytensor.function(xs, list(hmm.hmm_posteriors(*xs, log_final=pt.fill(xs[2], -0.5))))
    assert "HmmPosteriorsDefaultsOp" not in names(half)
    lf = np.full(3, -0.5)
    lf[1] = 0.0  # not a constant shift of f: changes the posteriors
    weighted = pytensor.function(xs, list(hmm.hmm_posteriors(*xs, log_final=pt.as_tensor(lf))))
    assert "HmmPosteriorsDefaultsOp" not in names(weighted)
    want_gamma, _ = ref_fsa.hmm_posteriors(le, lA, lpi, lf, [30, 30])
    np.testing.assert_allclose(weighted(le, lA, lpi)[0], want_gamma, rtol=1e-10, atol=1e-12)
    wrong = pytensor.function(xs, list(hmm.hmm_posteriors(*xs, mask=pt.ones((xs[0].shape[0] - 1, 2)))))
    assert "HmmPosteriorsDefaultsOp" not in names(wrong)
    with pytest.raises(ValueError, match=r"hmm_posteriors: mask must have shape \(T, B\), got \(29, 2\)"):
        wrong(le, lA, lpi)
    viterbi = pytensor.function(xs, list(hmm.hmm_viterbi(*xs, log_final=pt.as_tensor(lf))))
    assert "HmmViterbiOp" in names(viterbi) and "HmmViterbiDefaultsOp" not in names(viterbi)
    np.testing.assert_array_equal(viterbi(le, lA, lpi)[0], ref.viterbi(le, lA, lpi, lf, [30, 30])[0])
    wrong = pytensor.function(xs, list(hmm.hmm_viterbi(*xs, mask=pt.ones((xs[0].shape[0] - 1, 2)))))
    assert "HmmViterbiDefaultsOp" not in names(wrong)
    with pytest.raises(ValueError, match=r"hmm_viterbi: mask must have shape \(T, B\), got \(29, 2\)"):
        wrong(le, lA, lpi)


def test_defaults_op_differentiates_like_hmm_posteriors():
    """A graph differentiated after the rewrites (as JAX differentiates a jaxified one) takes HmmPosteriorsOp's
    gradient: the same numbers as pytensor.grad of the original graph."""
    xs = three("float64")
    gamma, xi = hmm.hmm_posteriors(*xs)
    fgraph = FunctionGraph(inputs=list(xs), outputs=[gamma, xi], clone=True)
    get_mode("FAST_RUN").excluding("inplace").optimizer.rewrite(fgraph)
    assert [getattr(n.op, "name", None) for n in fgraph.toposort()] == ["HmmPosteriorsDefaultsOp"]

    def cost(g, x):
        return (g[:, :, 0] ** 2).sum() + (x * x).sum()

    after = pytensor.grad(cost(*fgraph.outputs), fgraph.inputs)
    before = pytensor.grad(cost(gamma, xi), xs)
    f_after = pytensor.function(fgraph.inputs, after, mode="FAST_COMPILE")
    f_before = pytensor.function(xs, before, mode="FAST_COMPILE")
    rng = np.random.default_rng(413)
    for B in (1, 4):
        le, lA, lpi, _ = model(rng, 25, B, 3, 2.0)
        for got, want in zip(f_after(le, lA, lpi), f_before(le, lA, lpi)):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
            assert np.abs(want).max() > 0


def test_defaults_op_in_jax_mode():
    """PyTensor's JAX mode runs HmmPosteriorsDefaultsOp too (ptnative's JAX backend): the same numbers as the
    default mode, and jax.grad of the jaxified graph equals pytensor.grad of the original one."""
    pytest.importorskip("jax")
    import jax
    from pytensor.link.jax.dispatch import jax_funcify

    from ptnative.backends.jax import register

    register()
    xs = three("float64")
    gamma, xi = hmm.hmm_posteriors(*xs)
    f_jax = pytensor.function(xs, [gamma, xi], mode="JAX")
    assert names(f_jax) == ["HmmPosteriorsDefaultsOp"]
    f = pytensor.function(xs, [gamma, xi])
    rng = np.random.default_rng(414)
    le, lA, lpi, _ = model(rng, 20, 3, 3, 2.0)
    for got, want in zip(f_jax(le, lA, lpi), f(le, lA, lpi)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-14)
    fgraph = FunctionGraph(inputs=list(xs), outputs=[gamma, xi], clone=True)
    get_mode("JAX").optimizer.rewrite(fgraph)
    assert [getattr(n.op, "name", None) for n in fgraph.toposort()] == ["HmmPosteriorsDefaultsOp"]
    jaxified = jax_funcify(fgraph)
    got = jax.grad(lambda *a: (jaxified(*a)[0][:, :, 0] ** 2).sum() + (jaxified(*a)[1] ** 2).sum(),
                   argnums=(0, 1, 2))(le, lA, lpi)
    want = pytensor.function(xs, pytensor.grad((gamma[:, :, 0] ** 2).sum() + (xi**2).sum(), xs),
                             mode="FAST_COMPILE")(le, lA, lpi)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-9, atol=1e-12)
        assert np.abs(w).max() > 0


def test_viterbi_defaults_op_in_jax_mode():
    """PyTensor's JAX mode runs HmmViterbiDefaultsOp too (ptnative's JAX backend): the same paths and score bits as
    the default mode, on the one-sequence path and on lanes."""
    pytest.importorskip("jax")
    from ptnative.backends.jax import register

    register()
    xs = three("float64")
    f_jax = pytensor.function(xs, list(hmm.hmm_viterbi(*xs)), mode="JAX")
    assert names(f_jax) == ["HmmViterbiDefaultsOp"]
    f = pytensor.function(xs, list(hmm.hmm_viterbi(*xs)))
    rng = np.random.default_rng(450)
    for B, K in ((1, 3), (1, 6), (9, 4)):
        le, lA, lpi, _ = model(rng, 40, B, K, 2.0)
        for got, want in zip(f_jax(le, lA, lpi), f(le, lA, lpi)):
            np.testing.assert_array_equal(np.asarray(got), want)
