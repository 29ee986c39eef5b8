"""ptnative.pymc's explicit-duration HMM helpers: the marginal in a PyMC model, and the states recovered per
posterior draw, against enumeration of every segmentation (tests/reference/hsmm.py); skipped without PyMC."""

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
az = pytest.importorskip("arviz")

import pytensor.tensor as pt  # noqa: E402
from scipy.stats import norm  # noqa: E402

from ptnative.pymc import hsmm_marginal, recover_hsmm_states  # noqa: E402

from .reference import hsmm as ref  # noqa: E402

T, B, K, D = 6, 2, 2, 4
LENS = np.array([6, 4])
SIGMA = 0.8


def series(seed=0):
    rng = np.random.default_rng(seed)
    z = np.array([[0, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0]]).T
    y = np.array([-1.0, 1.0])[z] + SIGMA * rng.normal(size=(T, B))
    y[LENS[1]:, 1] = 0.0  # padding
    return y


def gaussian_hsmm(y, censored=True):
    """mu (K,) and the duration probabilities (K, D) free; A fixed (two states: always the other one); uniform
    initial state; the two series ragged through the mask."""
    mask = (np.arange(T)[:, None] < LENS).astype(np.float64)
    with pm.Model() as model:
        mu = pm.Normal("mu", [-1.0, 1.0], 1.0)
        dur = pm.Dirichlet("dur", np.ones((K, D)) * 2.0)
        log_e = pm.logp(pm.Normal.dist(mu, SIGMA), pt.as_tensor(y)[:, :, None])
        graphs = (log_e, np.zeros((K, K)), pt.log(dur), np.full(K, -np.log(K)), mask, censored)
        hsmm_marginal("hsmm", *graphs)
    return model, graphs


def posterior(**draws):
    if int(az.__version__.split(".")[0]) >= 1:
        return az.from_dict({"posterior": draws})
    return az.from_dict(posterior=draws)


def numpy_log_e(y, mu):
    return norm.logpdf(y[:, :, None], mu, SIGMA)


@pytest.mark.parametrize("censored", [True, False])
def test_marginal_is_the_models_likelihood(censored):
    y = series()
    model, _ = gaussian_hsmm(y, censored)
    point = model.initial_point()
    point["mu"] = np.array([-0.7, 1.3])
    logp = model.compile_logp(sum=False)(point)
    names = [v.name for v in model.value_vars] + [p.name for p in model.potentials]
    dur = model.compile_fn(model.replace_rvs_by_values([model["dur"]])[0], inputs=model.value_vars,
                           on_unused_input="ignore")(point)
    want = ref.brute_force(numpy_log_e(y, point["mu"]), np.zeros((K, K)), np.log(dur), np.full(K, -np.log(K)), LENS,
                           censored)[0].sum()
    np.testing.assert_allclose(logp[names.index("hsmm")], want, rtol=1e-10)
    # the model's gradient (through the Dirichlet's transform and the op) against central differences
    dlogp = model.compile_dlogp()(point)
    f = model.compile_logp()
    flat = np.concatenate([np.ravel(point[v.name]) for v in model.value_vars])

    def at(x):
        out, i = {}, 0
        for v in model.value_vars:
            n = np.size(point[v.name])
            out[v.name] = x[i:i + n].reshape(np.shape(point[v.name]))
            i += n
        return f(out)

    h = 1e-6
    num = np.array([(at(flat + h * e) - at(flat - h * e)) / (2 * h) for e in np.eye(len(flat))])
    np.testing.assert_allclose(dlogp, num, rtol=1e-5, atol=1e-6)


def test_recover_hsmm_states_per_draw_against_enumeration():
    y = series()
    model, graphs = gaussian_hsmm(y)
    rng = np.random.default_rng(3)
    n_chain, n_draw = 2, 2
    mus = rng.normal([-1.0, 1.0], 0.2, size=(n_chain, n_draw, K))
    durs = rng.dirichlet(np.ones(D), size=(n_chain, n_draw, K))
    idata = posterior(mu=mus, dur=durs)
    with model:
        out = recover_hsmm_states(idata, *graphs, random_seed=1)
    assert out["hsmm_marginals"].dims == ("chain", "draw", "time", "series", "state")
    assert out["hsmm_viterbi"].dtype == np.int32 and out["hsmm_sample"].shape == (n_chain, n_draw, T, B)
    uniforms = np.random.default_rng(1)
    for c in range(n_chain):
        for d in range(n_draw):
            args = (numpy_log_e(y, mus[c, d]), np.zeros((K, K)), np.log(durs[c, d]), np.full(K, -np.log(K)))
            np.testing.assert_allclose(out["hsmm_marginals"].values[c, d], ref.marginals_brute_force(*args, LENS),
                                       atol=1e-10)
            _, score, best = ref.brute_force(*args, LENS)
            np.testing.assert_allclose(out["hsmm_viterbi_logp"].values[c, d], score, rtol=1e-10)
            for b, L in enumerate(LENS):
                assert tuple(out["hsmm_viterbi"].values[c, d, :L, b]) in best[b]
            np.testing.assert_array_equal(out["hsmm_sample"].values[c, d],
                                          ref.sample_states(*args, LENS, uniforms.random((T, B))))
    with model:
        again = recover_hsmm_states(idata, *graphs, random_seed=1, marginals=False, viterbi=False)
    assert set(again.data_vars) == {"hsmm_sample"}
    np.testing.assert_array_equal(again["hsmm_sample"].values, out["hsmm_sample"].values)


def test_recover_hsmm_states_errors():
    y = series()
    model, graphs = gaussian_hsmm(y)
    idata = posterior(mu=np.zeros((1, 2, K)))
    with model, pytest.raises(ValueError, match=r"recover_hsmm_states: idata.posterior has no draws of \['dur'\]"):
        recover_hsmm_states(idata, *graphs)
    with model, pytest.raises(ValueError, match="recover_hsmm_states: nothing to compute"):
        recover_hsmm_states(idata, *graphs, marginals=False, viterbi=False, samples=False)


def _example():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "hsmm_pymc.py")
    spec = importlib.util.spec_from_file_location("hsmm_pymc_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_durations_and_short_run(capsys):
    """examples/hsmm_pymc.py: its truncated negative-binomial durations (numpy and PyTensor) against scipy's, and a
    short NUTS run end to end (the states recovered on most frames)."""
    from scipy.stats import nbinom

    ex = _example()
    mean, alpha = np.array([5.0, 12.0]), np.array([3.0, 9.0])
    pmf = nbinom.pmf(np.arange(ex.D)[None, :], alpha[:, None], (alpha / (alpha + mean))[:, None])
    want = np.log(pmf / pmf.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(ex.nb_log_durations(mean, alpha), want, rtol=1e-10)
    np.testing.assert_allclose(ex.nb_log_durations(pt.as_tensor(mean), pt.as_tensor(alpha), xp=pt).eval(), want,
                               rtol=1e-10)
    assert ex.main(["--steps", "150", "--series", "2", "--draws", "40", "--tune", "60", "--chains", "1",
                    "--samplers", "pymc"]) == 0
    out = capsys.readouterr().out
    share = float(out.split("simulated one on ")[1].split("%")[0])
    assert share > 80, out
