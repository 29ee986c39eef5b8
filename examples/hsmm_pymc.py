"""An explicit-duration HMM in PyMC: negative-binomial state durations, marginalised with
``ptnative.hsmm_log_likelihood`` and sampled with NUTS.

Simulates Gaussian series whose hidden regimes last a discretised negative-binomial number of frames, fits the
means, the noise and each state's duration distribution (mean and dispersion) with PyMC's NUTS and with nutpie,
prints the posterior means next to the simulated truth (with r_hat, the smallest bulk ESS and the wall time), and
recovers the states per posterior draw (``ptnative.pymc.recover_hsmm_states``)::

    python examples/hsmm_pymc.py                                   # PyMC's NUTS and nutpie, 2 chains x (250 + 250)
    python examples/hsmm_pymc.py --draws 1000 --tune 1000 --chains 4 --samplers pymc
    python examples/hsmm_pymc.py --plot docs/img                   # the data with the inferred states

The default run took 244 s on a shared 2-core VM under a load average of 12 (PyMC's NUTS 122 s, nutpie 90 s, the
rest compiling and recovering the states); see docs/hsmm.md ("With PyMC") for its results.

The model: K = 3 states with means ``mu ~ Normal((-2, 0, 2), 1)`` (ordered by the prior's centres, far enough apart
not to swap), one noise ``sigma ~ HalfNormal(1)``, and for state k a duration d = 1..D of probability
``p_k(d) = NB(d - 1; m_k, a_k) / sum_{d'=1..D} NB(d' - 1; m_k, a_k)`` (a negative binomial on d - 1 >= 0 with mean
``m_k ~ LogNormal(log 10, 1)`` and dispersion ``a_k ~ Gamma(2, 0.2)``, truncated at D = 40 frames); a state is
left for each other state with probability 1/2; a uniform first state; the last segment of each series is
right-censored.  The hidden segmentation is summed out exactly by ``hsmm_log_likelihood`` (O(T K (D + K))), whose
gradients with respect to the log-emissions and the log-durations reach ``mu``, ``sigma``, ``m`` and ``a``
through PyTensor.  Needs ``pymc``; ``nutpie`` and ``matplotlib`` only for the sampler and the plot that use them.
"""

import argparse
import os
import sys
import time

import numpy as np

SAMPLERS = ("pymc", "nutpie")
K, D = 3, 40


def nb_log_durations(mean, alpha, n_dur=D, xp=np):
    """log p_k(d), d = 1..n_dur (K, n_dur): a negative binomial of mean ``mean`` and dispersion ``alpha`` (K,) on
    d - 1, truncated at n_dur and normalised (``xp``: numpy, or pytensor.tensor for symbols)."""
    if xp is np:
        from scipy.special import gammaln, logsumexp
    else:
        gammaln, logsumexp = xp.gammaln, xp.logsumexp
    n = xp.arange(n_dur)[None, :]  # d - 1
    m, a = mean[:, None], alpha[:, None]
    logp = (gammaln(n + a) - gammaln(a) - gammaln(n + 1) + a * xp.log(a / (a + m)) + n * xp.log(m / (a + m)))
    return logp - logsumexp(logp, axis=1, keepdims=True)


def simulate(n_steps=300, n_series=3, seed=1):
    """``n_series`` series of ``n_steps`` frames: returns y (T, B), states (T, B), truth dict."""
    truth = {"mu": np.array([-2.0, 0.0, 2.0]), "sigma": 0.8,
             "dur_mean": np.array([5.0, 10.0, 20.0]), "dur_alpha": np.array([4.0, 8.0, 10.0])}
    rng = np.random.default_rng(seed)
    p_dur = np.exp(nb_log_durations(truth["dur_mean"], truth["dur_alpha"]))
    states = np.empty((n_steps, n_series), dtype=np.int64)
    for b in range(n_series):
        t, k = 0, rng.integers(K)
        while t < n_steps:
            d = rng.choice(D, p=p_dur[k]) + 1
            states[t:t + d, b] = k
            t += d
            k = rng.choice([j for j in range(K) if j != k])
    y = rng.normal(truth["mu"][states], truth["sigma"])
    return y, states, truth


def build_model(y):
    """The PyMC model and the graphs given to ``hsmm_marginal`` (for ``recover_hsmm_states``)."""
    import pymc as pm
    import pytensor.tensor as pt

    from ptnative.pymc import hsmm_marginal

    with pm.Model(coords={"state": np.arange(K)}) as model:
        mu = pm.Normal("mu", np.array([-2.0, 0.0, 2.0]), 1.0, dims="state")
        sigma = pm.HalfNormal("sigma", 1.0)
        dur_mean = pm.LogNormal("dur_mean", np.log(10.0), 1.0, dims="state")
        dur_alpha = pm.Gamma("dur_alpha", 2.0, 0.2, dims="state")
        log_emissions = pm.logp(pm.Normal.dist(mu, sigma), pt.as_tensor(y)[:, :, None])  # (T, B, K)
        log_transitions = np.log(np.full((K, K), 1.0 / (K - 1)))  # the diagonal is never read
        log_durations = nb_log_durations(dur_mean, dur_alpha, xp=pt)
        log_initial = np.full(K, -np.log(K))
        graphs = (log_emissions, log_transitions, log_durations, log_initial)
        hsmm_marginal("hsmm", *graphs)
    return model, graphs


def fit(model, sampler, draws, tune, chains, seed):
    """InferenceData of one sampler, and its wall time in seconds."""
    import pymc as pm

    kwargs = dict(draws=draws, tune=tune, chains=chains, random_seed=seed, progressbar=False,
                  compute_convergence_checks=False)
    if sampler == "pymc":
        kwargs.update(cores=1)
    else:
        kwargs.update(nuts_sampler="nutpie", cores=chains)
    start = time.perf_counter()
    with model:
        idata = pm.sample(**kwargs)
    return idata, time.perf_counter() - start


def summarize(idata, truth):
    """Rows (name, truth, posterior mean, sd, r_hat) and the smallest bulk ESS."""
    import arviz as az

    names = ["mu", "sigma", "dur_mean", "dur_alpha"]
    summary = az.summary(idata, var_names=names, kind="all")
    rows = []
    for name in names:
        want = np.atleast_1d(truth[name])
        for k, w in enumerate(want):
            label = f"{name}[{k}]" if len(want) > 1 else name
            r = summary.loc[label]
            rows.append((label, w, r["mean"], r["sd"], r["r_hat"]))
    return rows, float(summary["ess_bulk"].min())


def save_plot(y, states, recovered, out_dir, b=0):
    """``hsmm_pymc_states.png``: series b with the simulated states and the posterior state probabilities."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    post = recovered["hsmm_marginals"].mean(("chain", "draw")).values[:, b]  # (T, K)
    t = np.arange(len(y))
    colors = ["tab:blue", "tab:orange", "tab:green"]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 4.5), sharex=True, height_ratios=[2, 1])
    ax.plot(t, y[:, b], lw=0.7, color="0.4", label="data")
    for k in range(K):
        ax.fill_between(t, -4.5, 4.5, where=states[:, b] == k, color=colors[k], alpha=0.15, step="mid", lw=0)
    ax.set_ylim(-4.5, 4.5)
    ax.set_ylabel("y (shading: simulated state)")
    ax2.stackplot(t, post.T, colors=colors, labels=[f"state {k}" for k in range(K)], step="mid")
    ax2.set_ylabel("p(z_t = k | y)")
    ax2.set_xlabel("frame")
    ax2.legend(loc="upper right", fontsize=7, ncol=3)
    fig.tight_layout()
    path = os.path.join(out_dir, "hsmm_pymc_states.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="length T of each simulated series")
    parser.add_argument("--series", type=int, default=3, help="number B of simulated series")
    parser.add_argument("--draws", type=int, default=250)
    parser.add_argument("--tune", type=int, default=250)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--samplers", default="pymc,nutpie", help=f"comma separated, of {', '.join(SAMPLERS)}")
    parser.add_argument("--plot", metavar="DIR", help="save the series with its inferred states")
    args = parser.parse_args(argv)
    samplers = [s for s in args.samplers.split(",") if s]
    unknown = set(samplers) - set(SAMPLERS)
    if unknown:
        parser.error(f"unknown samplers {sorted(unknown)}")

    import importlib.util

    from ptnative.pymc import recover_hsmm_states

    y, states, truth = simulate(args.steps, args.series, args.seed)
    model, graphs = build_model(y)
    first = None
    for sampler in samplers:
        if sampler == "nutpie" and importlib.util.find_spec("nutpie") is None:
            print("nutpie: not installed, skipped")
            continue
        idata, seconds = fit(model, sampler, args.draws, args.tune, args.chains, args.seed)
        rows, ess = summarize(idata, truth)
        print(f"\n{sampler}: {args.chains} chains x ({args.tune} + {args.draws}) in {seconds:.1f} s, "
              f"smallest bulk ESS {ess:.0f}, divergences {int(idata.sample_stats['diverging'].sum())}")
        print(f"  {'parameter':<14}{'truth':>8}{'mean':>9}{'sd':>8}{'r_hat':>7}")
        for name, want, mean, sd, rhat in rows:
            print(f"  {name:<14}{want:8.2f}{mean:9.2f}{sd:8.2f}{rhat:7.2f}")
        first = first or idata
    if first is None:
        return 1
    with model:
        recovered = recover_hsmm_states(first.sel(draw=slice(None, None, 10)), *graphs, random_seed=args.seed,
                                        samples=False)
    post = recovered["hsmm_marginals"].mean(("chain", "draw")).values
    accuracy = np.mean(post.argmax(-1) == states)
    print(f"\nstates: the most probable state per frame (posterior marginals averaged over draws) matches the "
          f"simulated one on {100 * accuracy:.1f}% of the frames")
    if args.plot:
        print("plot:", save_plot(y, states, recovered, args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
