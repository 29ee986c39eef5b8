"""PyMC end to end: the Gaussian HMM of examples/hmm_pymc.py, marginalised with ``hmm_log_likelihood``.

The likelihood and its gradient are checked against an independent numpy forward-backward pass (float64, log
space) in every PyTensor mode the installed version has; the whole model's logp against PyMC's own prior terms
plus that reference, and its gradient (through PyMC's transforms and ptnative's gradient op) against central
differences; jax.value_and_grad of the jaxified model (what numpyro differentiates) against that dlogp; then
short NUTS runs (one process, two spawned processes, numpyro with vectorised chains) must recover the
simulated means.  Skipped where PyMC is absent.
"""

import importlib.util
import os

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402
from scipy.special import logsumexp  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "hmm_pymc.py")
_spec = importlib.util.spec_from_file_location("hmm_pymc_example", EXAMPLE)
hmm_pymc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hmm_pymc)


def _modes():
    """Every mode of this PyTensor: the default, then the named ones that differ from it."""
    modes = [None]
    if pytensor.config.mode not in ("NUMBA", "Mode"):
        modes.append("NUMBA")  # PyTensor < 3 defaults to the C linker; Numba is a named mode there
    modes += ["C", "CVM", "FAST_COMPILE"]
    if importlib.util.find_spec("jax") is not None:
        modes.append("JAX")
    return modes


MODES = _modes()
MODE_IDS = ["default" if m is None else m for m in MODES]


def forward_backward(y, mu, sigma, P):
    """Log-likelihood of ``y`` (T,) under the Gaussian HMM with a uniform first state, and its gradients
    w.r.t. ``mu``, ``sigma`` (K,) and ``P`` (K, K), by the log-space forward-backward recursions."""
    n_steps, n_states = len(y), len(mu)
    log_e = -0.5 * np.log(2 * np.pi) - np.log(sigma) - 0.5 * ((y[:, None] - mu) / sigma) ** 2
    log_A = np.log(P)
    log_alpha = np.empty((n_steps, n_states))
    log_alpha[0] = log_e[0] - np.log(n_states)
    for t in range(1, n_steps):
        log_alpha[t] = logsumexp(log_alpha[t - 1][:, None] + log_A, axis=0) + log_e[t]
    ll = logsumexp(log_alpha[-1])
    log_beta = np.zeros((n_steps, n_states))
    for t in range(n_steps - 2, -1, -1):
        log_beta[t] = logsumexp(log_A + log_e[t + 1] + log_beta[t + 1], axis=1)
    gamma = np.exp(log_alpha + log_beta - ll)  # d ll / d log_e
    xi = np.exp(log_alpha[:-1, :, None] + log_A + (log_e[1:] + log_beta[1:])[:, None, :] - ll).sum(0)
    resid = y[:, None] - mu
    d_mu = (gamma * resid / sigma**2).sum(0)
    d_sigma = (gamma * (-1 / sigma + resid**2 / sigma**3)).sum(0)
    return ll, d_mu, d_sigma, xi / P


@pytest.fixture(scope="module")
def data():
    y, states, truth = hmm_pymc.simulate(n_steps=200, seed=3)
    return y, truth


def random_params(seed, n_states=3):
    rng = np.random.default_rng(seed)
    mu = np.sort(rng.normal(0, 2, n_states))
    sigma = rng.uniform(0.3, 1.5, n_states)
    P = rng.dirichlet(np.ones(n_states) + 3 * np.eye(n_states)[0], size=n_states)
    return mu, sigma, P


def test_reference_agrees_with_brute_force():
    """The numpy reference itself, against summing over every state path of a short series."""
    import itertools

    y = np.array([0.3, -1.2, 2.0, 0.7])
    mu, sigma, P = random_params(0)
    total = 0.0
    for path in itertools.product(range(3), repeat=len(y)):
        p = np.prod([np.exp(-0.5 * ((y[t] - mu[k]) / sigma[k]) ** 2) / (np.sqrt(2 * np.pi) * sigma[k])
                     for t, k in enumerate(path)]) / 3
        total += p * np.prod([P[a, b] for a, b in zip(path, path[1:])])
    np.testing.assert_allclose(forward_backward(y, mu, sigma, P)[0], np.log(total), rtol=1e-13)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_likelihood_and_gradient_match_numpy(mode, data):
    y, _ = data
    mu, sigma, P = pt.dvector("mu"), pt.dvector("sigma"), pt.dmatrix("P")
    obs = pm.CustomDist.dist(mu, sigma, P, len(y), dist=hmm_pymc.gaussian_hmm_dist, logp=hmm_pymc.gaussian_hmm_logp,
                             signature="(k),(k),(k,k),()->(t)")
    ll = pm.logp(obs, y)
    f = pytensor.function([mu, sigma, P], [ll, *pytensor.grad(ll, [mu, sigma, P])], mode=mode)
    for seed in range(3):
        params = random_params(seed)
        got, want = f(*params), forward_backward(y, *params)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_model_logp_and_dlogp(mode, data):
    """Model logp = PyMC's prior terms (with Jacobians) + the reference likelihood; model dlogp (through the
    transforms and ptnative's gradient op) = central differences of that sum."""
    y, _ = data
    # mode="C" (one C module for the whole graph) aborts the process in PyTensor 2.38-3.3 on the gradient of
    # concatenate(y[:1], y[0] + cumsum(exp(y[1:]))) -- the ordered transform -- with or without ptnative
    # ("Assertion `py_V.. == (PyObject*)V..' failed"), so that mode gets the model with plain (unordered) means.
    model = hmm_pymc.build_model(y, ordered=mode != "C")
    rng = np.random.default_rng(7)
    point = {k: v + rng.normal(0, 0.3, np.shape(v)) for k, v in model.initial_point().items()}
    # one compiled function for both (each compilation costs seconds in Numba)
    logp_dlogp = model.compile_fn([model.logp(), model.dlogp()], inputs=model.value_vars, mode=mode)
    logp, dlogp = (lambda p: logp_dlogp(p)[0]), (lambda p: logp_dlogp(p)[1])
    prior = model.compile_logp(vars=model.free_RVs, mode="FAST_COMPILE")
    constrained = model.compile_fn(model.replace_rvs_by_values([model["mu"], model["sigma"], model["P"]]),
                                   inputs=model.value_vars, mode="FAST_COMPILE", on_unused_input="ignore")

    def reference(pt_):
        return prior(pt_) + forward_backward(y, *constrained(pt_))[0]

    np.testing.assert_allclose(logp(point), reference(point), rtol=1e-10)
    # central differences over the raveled value variables, in dlogp's order
    names = [v.name for v in model.value_vars]
    sizes = [np.size(point[n]) for n in names]
    flat = np.concatenate([np.ravel(point[n]) for n in names])

    def unravel(x):
        out, i = {}, 0
        for n, s in zip(names, sizes):
            out[n] = x[i:i + s].reshape(np.shape(point[n]))
            i += s
        return out

    h = 1e-5
    numeric = np.array([(reference(unravel(flat + h * e)) - reference(unravel(flat - h * e))) / (2 * h)
                        for e in np.eye(len(flat))])
    np.testing.assert_allclose(dlogp(point), numeric, rtol=1e-6, atol=1e-5)


def _posterior_mean(idata, name):
    values = np.asarray(idata.posterior[name].values)
    return values.reshape(-1, values.shape[-1]).mean(0)


@pytest.mark.parametrize("sampler,chains", [("pymc", 1), ("pymc-spawn", 2)])
def test_nuts_recovers_the_means(sampler, chains):
    y, states, truth = hmm_pymc.simulate(n_steps=500, seed=1)
    model = hmm_pymc.build_model(y)
    idata, _ = hmm_pymc.sample(model, sampler, draws=100, tune=100, chains=chains, seed=2)
    np.testing.assert_allclose(_posterior_mean(idata, "mu"), truth["mu"], atol=0.3)
    np.testing.assert_allclose(_posterior_mean(idata, "sigma"), truth["sigma"], atol=0.3)
    assert idata.posterior["mu"].shape[:2] == (chains, 100)
    if sampler == "pymc":
        # the observed series has a proper log-likelihood (one value per draw): the reference's
        ll = pm.compute_log_likelihood(idata.sel(draw=slice(0, 3)), model=model, progressbar=False)
        ll = ll["log_likelihood"] if not hasattr(ll, "log_likelihood") else ll.log_likelihood
        post = idata.posterior
        for d in range(3):
            params = [np.asarray(post[n].values)[0, d] for n in ("mu", "sigma", "P")]
            np.testing.assert_allclose(np.asarray(ll["y"].values)[0, d].sum(), forward_backward(y, *params)[0],
                                       rtol=1e-10)


def test_jax_value_and_grad_of_the_model(data):
    """What PyMC's JAX samplers differentiate: the jaxified model logp under jax.value_and_grad (ptnative's
    ops as jax.custom_vjp), also under jax.vmap over points, equals the model's dlogp (checked above)."""
    jax = pytest.importorskip("jax")
    from pymc.sampling.jax import get_jaxified_logp

    y, _ = data
    model = hmm_pymc.build_model(y)
    names = [v.name for v in model.value_vars]
    rng = np.random.default_rng(11)
    points = [{k: v + rng.normal(0, 0.3, np.shape(v)) for k, v in model.initial_point().items()} for _ in range(3)]
    logp = model.compile_logp(mode="FAST_COMPILE")
    dlogp = model.compile_dlogp(mode="FAST_COMPILE")
    with jax.enable_x64(True):
        value_and_grad = jax.jit(jax.value_and_grad(get_jaxified_logp(model)))
        batched = jax.jit(jax.vmap(jax.value_and_grad(get_jaxified_logp(model))))
        stacked = batched([np.stack([p[n] for p in points]) for n in names])
        for i, point in enumerate(points):
            value, grads = value_and_grad([point[n] for n in names])
            flat = np.concatenate([np.ravel(g) for g in grads])
            np.testing.assert_allclose(value, logp(point), rtol=1e-10)
            np.testing.assert_allclose(flat, dlogp(point), rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(stacked[0][i], value, rtol=1e-12)
            np.testing.assert_allclose(np.concatenate([np.ravel(g[i]) for g in stacked[1]]), flat, rtol=1e-12,
                                       atol=1e-12)


def test_numpyro_recovers_the_means():
    """pm.sample(nuts_sampler="numpyro"), chains vectorised with jax.vmap."""
    pytest.importorskip("numpyro")
    y, states, truth = hmm_pymc.simulate(n_steps=500, seed=1)
    model = hmm_pymc.build_model(y)
    idata, _ = hmm_pymc.sample(model, "numpyro-vectorized", draws=100, tune=300, chains=2, seed=2)
    # A short run of this multimodal posterior can leave a chain in a poorer local mode (docs/pymc.md; with this
    # seed one of the two, depending on the last bits of the gradients): one chain must find the simulated truth.
    mu, sigma = (np.asarray(idata.posterior[name].values).mean(1) for name in ("mu", "sigma"))
    found = [c for c in range(len(mu)) if np.all(np.abs(mu[c] - truth["mu"]) <= 0.3)]
    assert found, f"no chain found the simulated means {truth['mu']}: chain means {mu}"
    np.testing.assert_allclose(sigma[found[0]], truth["sigma"], atol=0.3)


def test_dist_rejects_a_batch_size():
    with pytest.raises(ValueError, match="gaussian_hmm_dist: one series per variable"):
        pm.CustomDist.dist(np.zeros(3), np.ones(3), np.full((3, 3), 1 / 3), 10, dist=hmm_pymc.gaussian_hmm_dist,
                           logp=hmm_pymc.gaussian_hmm_logp, signature="(k),(k),(k,k),()->(t)", size=(2,))


def test_prior_predictive_draws_hmm_series():
    """The CustomDist's generative graph: long runs in a state (sticky P) at its level."""
    P = np.full((3, 3), 0.005) + 0.985 * np.eye(3)
    obs = pm.CustomDist.dist(np.array([-10.0, 0.0, 10.0]), np.full(3, 0.01), P, 400,
                             dist=hmm_pymc.gaussian_hmm_dist, logp=hmm_pymc.gaussian_hmm_logp,
                             signature="(k),(k),(k,k),()->(t)")
    draw = pm.draw(obs, random_seed=5)
    assert draw.shape == (400,)
    states = np.round(draw / 10).astype(int) + 1
    np.testing.assert_allclose(draw, 10.0 * (states - 1), atol=0.1)
    switches = np.count_nonzero(np.diff(states))
    assert 0 < switches < 40  # expected 400 * 0.01 = 4
