"""hmm_posteriors called without ``log_final`` and ``mask``: where no gradient is taken, the rewrite puts
HmmPosteriorsDefaultsOp in (the kernel makes the default zeros and ones; the graph holds no nodes building them).
Its results against the numpy log-space reference and against the same call with those defaults given as inputs
(same bits), its gradient when a graph is differentiated after the rewrites, and the cases the rewrite must leave
alone (other fills, a mask of another shape)."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import get_mode
from pytensor.graph.fg import FunctionGraph

from ptnative.ops import hmm

from .conftest import tol
from .reference import fsa as ref_fsa
from .test_hmm import cast, model

DTYPES = ["float32", "float64"]


def names(f):
    return [getattr(n.op, "name", type(n.op).__name__) for n in f.maker.fgraph.toposort()]


def three(dtype):
    return pt.tensor3("le", dtype=dtype), pt.matrix("lA", dtype=dtype), pt.vector("lpi", dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_posteriors_with_default_final_and_mask(mode, dtype):
    """One native op and nothing else in the compiled graph (modes with the specialize rewrites; FAST_COMPILE keeps
    HmmPosteriorsOp and the Allocs), the same bits as with log_final = 0 and mask = 1 given as inputs, and the
    reference's numbers: the one-sequence path (K = 1..4), lanes (B >= 3), the sequential pass (K = 6), T = 1, the
    empty series and the empty batch."""
    xs = three(dtype)
    lf, mask = pt.vector("lf", dtype=dtype), pt.matrix("mask", dtype=dtype)
    f = pytensor.function(xs, list(hmm.hmm_posteriors(*xs)), mode=mode)
    given = pytensor.function([*xs, lf, mask], list(hmm.hmm_posteriors(*xs, lf, mask)), mode=mode)
    if mode == "FAST_COMPILE":
        assert "HmmPosteriorsOp" in names(f)
    else:
        assert names(f) == ["HmmPosteriorsDefaultsOp"]
        assert "HmmPosteriorsValuesOp" in names(given)
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
