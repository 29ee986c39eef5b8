"""ptnative.pymc: the HMM marginal in a PyMC model, and the states recovered per posterior draw (skipped without
PyMC)."""

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
az = pytest.importorskip("arviz")

import pytensor.tensor as pt  # noqa: E402
from scipy.stats import norm  # noqa: E402

from ptnative.pymc import hmm_marginal, recover_states  # noqa: E402

from .reference import fsa as ref_fsa  # noqa: E402
from .reference import hmm as ref  # noqa: E402

T, B, K = 40, 2, 2
LENS = np.array([40, 25])


def series(seed=0):
    rng = np.random.default_rng(seed)
    P = np.array([[0.9, 0.1], [0.2, 0.8]])
    z = np.zeros((T, B), int)
    for t in range(1, T):
        z[t] = [rng.choice(K, p=P[s]) for s in z[t - 1]]
    y = np.array([-1.0, 1.5])[z] + 0.7 * rng.normal(size=(T, B))
    y[LENS[1]:, 1] = 0.0  # padding
    return y


def gaussian_hmm(y):
    """mu (K,), P (K, K) free; sigma 0.7; uniform initial state; the two series ragged through the mask."""
    mask = (np.arange(T)[:, None] < LENS).astype(np.float64)
    with pm.Model() as model:
        mu = pm.Normal("mu", [-1.0, 1.0], 1.0)
        P = pm.Dirichlet("P", np.ones((K, K)) + 4 * np.eye(K))
        log_e = pm.logp(pm.Normal.dist(mu, 0.7), pt.as_tensor(y)[:, :, None])
        graphs = (log_e, pt.log(P), pt.fill(mu, -np.log(K)), None, mask)
        hmm_marginal("hmm", *graphs)
    return model, graphs


def posterior(**draws):
    """InferenceData (ArviZ < 1) or DataTree (ArviZ >= 1) with these (chain, draw, ...) posterior draws."""
    if int(az.__version__.split(".")[0]) >= 1:
        return az.from_dict({"posterior": draws})
    return az.from_dict(posterior=draws)  # ArviZ < 1 takes a dict as the posterior itself


def numpy_log_e(y, mu):
    return norm.logpdf(y[:, :, None], mu, 0.7)


def test_marginal_is_the_models_likelihood():
    y = series()
    model, _ = gaussian_hmm(y)
    point = {"mu": np.array([-0.8, 1.2]), "P_simplex__": np.array([[0.3], [-0.5]])}
    logp = model.compile_logp(sum=False)(point)
    names = [v.name for v in model.value_vars] + [p.name for p in model.potentials]
    # the simplex from the unconstrained value, computed by the model (independent of the transform's details)
    P_graph = model.replace_rvs_by_values([model["P"]])[0]
    P = model.compile_fn(P_graph, inputs=model.value_vars, on_unused_input="ignore")(point)
    want = ref_fsa.hmm_forward(numpy_log_e(y, point["mu"]), np.log(P), np.log(np.full(K, 1 / K)), None, LENS).sum()
    np.testing.assert_allclose(logp[names.index("hmm")], want, rtol=1e-10)


def test_recover_states_per_draw_against_references():
    y = series()
    model, graphs = gaussian_hmm(y)
    rng = np.random.default_rng(3)
    n_chain, n_draw = 2, 3
    mus = rng.normal([-1.0, 1.5], 0.2, size=(n_chain, n_draw, K))
    Ps = rng.dirichlet([8.0, 2.0], size=(n_chain, n_draw, K))
    Ps[..., 1, :] = Ps[..., 1, ::-1]
    idata = posterior(mu=mus, P=Ps)
    with model:
        out = recover_states(idata, *graphs, random_seed=1)
    assert out["hmm_marginals"].dims == ("chain", "draw", "time", "series", "state")
    assert out["hmm_viterbi"].dtype == np.int32 and out["hmm_sample"].shape == (n_chain, n_draw, T, B)
    for c in range(n_chain):
        for d in range(n_draw):
            le = numpy_log_e(y, mus[c, d])
            args = (le, np.log(Ps[c, d]), np.log(np.full(K, 1 / K)), None, LENS)
            gamma, _ = ref_fsa.hmm_posteriors(*args)
            np.testing.assert_allclose(out["hmm_marginals"].values[c, d], gamma, atol=1e-10)
            path, score = ref.viterbi(*args)
            np.testing.assert_array_equal(out["hmm_viterbi"].values[c, d], path)
            np.testing.assert_allclose(out["hmm_viterbi_logp"].values[c, d], score, rtol=1e-10)
    s = out["hmm_sample"].values
    assert np.all(s[:, :, LENS[1]:, 1] == -1) and s[:, :, :, 0].min() >= 0 and s.max() < K
    with model:
        again = recover_states(idata, *graphs, random_seed=1, marginals=False, viterbi=False)
    np.testing.assert_array_equal(again["hmm_sample"].values, s)
    assert set(again.data_vars) == {"hmm_sample"}


def test_recover_states_with_time_varying_transitions():
    """Transitions driven by a covariate, (T-1, B, K, K), and per-series initial weights (B, K): every draw's
    marginals, Viterbi path and score and sampled path (the same uniforms: numpy.random.default_rng(seed), one
    (T, B) array per draw in chain, draw order) against the numpy references."""
    y = series(4)
    x = np.random.default_rng(5).normal(size=(T - 1, B))
    mask = (np.arange(T)[:, None] < LENS).astype(np.float64)
    lpi = np.log([[0.8, 0.2], [0.3, 0.7]])
    with pm.Model() as model:
        mu = pm.Normal("mu", [-1.0, 1.0], 1.0)
        beta = pm.Normal("beta", [2.0, 0.0], 1.0)
        stay = pm.math.sigmoid(beta[0] + beta[1] * x)  # (T-1, B)
        log_A = pt.log(pt.stack([pt.stack([stay, 1 - stay], -1), pt.stack([1 - stay, stay], -1)], -2))
        log_e = pm.logp(pm.Normal.dist(mu, 0.7), pt.as_tensor(y)[:, :, None])
        graphs = (log_e, log_A, lpi, None, mask)
        hmm_marginal("hmm", *graphs)
    rng = np.random.default_rng(6)
    n_chain, n_draw = 2, 2
    mus = rng.normal([-1.0, 1.5], 0.2, size=(n_chain, n_draw, K))
    betas = rng.normal([2.0, 1.0], 0.5, size=(n_chain, n_draw, 2))
    with model:
        out = recover_states(posterior(mu=mus, beta=betas), *graphs, random_seed=7)
    uniforms = np.random.default_rng(7)
    for c in range(n_chain):
        for d in range(n_draw):
            s = 1 / (1 + np.exp(-(betas[c, d, 0] + betas[c, d, 1] * x)))
            lA = np.log(np.stack([np.stack([s, 1 - s], -1), np.stack([1 - s, s], -1)], -2))
            args = (numpy_log_e(y, mus[c, d]), lA, lpi, None, LENS)
            gamma, _ = ref.forward_backward(*args)
            np.testing.assert_allclose(out["hmm_marginals"].values[c, d], gamma, atol=1e-10)
            path, score = ref.viterbi(*args)
            np.testing.assert_array_equal(out["hmm_viterbi"].values[c, d], path)
            np.testing.assert_allclose(out["hmm_viterbi_logp"].values[c, d], score, rtol=1e-10)
            np.testing.assert_array_equal(out["hmm_sample"].values[c, d], ref.sample(*args, uniforms.random((T, B))))


def test_sampled_states_follow_the_marginals():
    """400 draws at one parameter value: the sampled states' frequencies are its marginals."""
    y = series(1)
    model, graphs = gaussian_hmm(y)
    n = 400
    idata = posterior(mu=np.tile([-1.0, 1.5], (1, n, 1)), P=np.tile([[0.9, 0.1], [0.2, 0.8]], (1, n, 1, 1)))
    with model:
        out = recover_states(idata, *graphs, random_seed=2, viterbi=False)
    freq = (out["hmm_sample"].values[0] == 1).mean(0)
    gamma = out["hmm_marginals"].values[0, 0, :, :, 1]
    np.testing.assert_allclose(freq[: LENS[1]], gamma[: LENS[1]], atol=0.1)
    np.testing.assert_allclose(freq[:, 0], gamma[:, 0], atol=0.1)


def test_recover_states_errors():
    y = series()
    model, graphs = gaussian_hmm(y)
    idata = posterior(mu=np.zeros((1, 2, K)))
    with model, pytest.raises(ValueError, match=r"recover_states: idata.posterior has no draws of \['P'\]"):
        recover_states(idata, *graphs)
    with model, pytest.raises(ValueError, match="recover_states: nothing to compute"):
        recover_states(idata, *graphs, marginals=False, viterbi=False, samples=False)


def test_nuts_then_recover_states():
    """End to end: a short NUTS run on the marginal, then the states; the decoded path matches the data's
    regimes."""
    y = series(2)
    model, graphs = gaussian_hmm(y)
    with model:
        idata = pm.sample(draws=40, tune=60, chains=1, cores=1, random_seed=4, progressbar=False,
                          compute_convergence_checks=False)
        out = recover_states(idata, *graphs, random_seed=5, samples=False)
    post = out["hmm_marginals"].mean(("chain", "draw")).values
    np.testing.assert_allclose(post.sum(-1)[: LENS[1]], 1.0, atol=1e-9)
    mu = idata.posterior["mu"].mean(("chain", "draw")).values
    assert mu[0] < 0 < mu[1]
    decoded = out["hmm_viterbi"].values[0, -1, :, 0]
    assert np.mean(decoded == (y[:, 0] > 0.25)) > 0.8
