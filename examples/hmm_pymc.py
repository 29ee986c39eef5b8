"""A K-state Gaussian hidden Markov model in PyMC, marginalised with ``ptnative.hmm_log_likelihood``.

Simulates a series from a known HMM, fits it with every sampler PyMC offers and prints the posterior
means next to the simulated truth, with r_hat, the smallest bulk ESS, divergences and wall time::

    python examples/hmm_pymc.py                                    # all samplers, 4 chains x (1000 + 1000)
    python examples/hmm_pymc.py --draws 200 --tune 200 --samplers pymc,nutpie,numpyro
    python examples/hmm_pymc.py --samplers pymc-spawn --plot docs/img

Samplers (``--samplers``, comma separated): ``pymc`` (PyMC's NUTS, all chains in this process),
``pymc-fork`` / ``pymc-spawn`` (one process per chain, ``mp_ctx="fork"`` / ``"spawn"``: the compiled
model, ptnative's ops included, is pickled to the workers), ``nutpie``, ``numpyro-vectorized``
(chains through ``jax.vmap``), ``numpyro-parallel`` (chains through ``jax.pmap`` over CPU devices).
``pymc-all`` and ``numpyro`` name the groups.  Needs ``pymc``; ``nutpie``, ``numpyro`` (with ``jax``)
and ``matplotlib`` only for the samplers and plots that use them.

The model (see docs/pymc.md): transition rows ``P[i] ~ Dirichlet(1 + 4 e_i)``, ordered means
``mu ~ Normal((-1, 0, 1), 5)``, ``sigma ~ HalfNormal(2)``, a uniform initial state, and the observed series as a
``pm.CustomDist`` whose log-density is the marginal likelihood of the series (the hidden states summed
out by the forward algorithm) and whose generative graph draws the hidden chain, so prior and posterior
predictive sampling and ``pm.compute_log_likelihood`` work as for any PyMC distribution.
"""

import argparse
import os
import sys
import time

import numpy as np

SAMPLERS = ("pymc", "pymc-fork", "pymc-spawn", "nutpie", "numpyro-vectorized", "numpyro-parallel")
GROUPS = {"pymc-all": ("pymc", "pymc-fork", "pymc-spawn"), "numpyro": ("numpyro-vectorized", "numpyro-parallel")}


def simulate(n_steps=500, seed=1):
    """A 3-state Gaussian HMM series of ``n_steps`` points: returns (y (T,), states (T,), truth dict)."""
    truth = {
        "P": np.array([[0.92, 0.05, 0.03], [0.04, 0.90, 0.06], [0.05, 0.05, 0.90]]),
        "mu": np.array([-2.0, 0.0, 2.5]),
        "sigma": np.array([0.6, 0.5, 0.8]),
    }
    rng = np.random.default_rng(seed)
    n_states = len(truth["mu"])
    states = np.empty(n_steps, dtype=np.int64)
    states[0] = rng.integers(n_states)
    for t in range(1, n_steps):
        states[t] = rng.choice(n_states, p=truth["P"][states[t - 1]])
    y = rng.normal(truth["mu"][states], truth["sigma"][states])
    return y, states, truth


def gaussian_hmm_logp(value, mu, sigma, P, n_steps):
    """Log marginal likelihood of the series ``value`` (T,) under the HMM (the CustomDist's logp)."""
    import pymc as pm
    import pytensor.tensor as pt

    import ptnative

    n_states = mu.shape[-1]
    log_emissions = pm.logp(pm.Normal.dist(mu, sigma), value[:, None])  # (T, K)
    log_initial = pt.zeros((n_states,), dtype=log_emissions.dtype) - pt.log(n_states)
    return ptnative.hmm_log_likelihood(log_emissions[:, None, :], pt.log(P), log_initial)[0]


def gaussian_hmm_dist(mu, sigma, P, n_steps, size):
    """The generative graph: a uniform first state, the hidden chain drawn by a scan, then the emissions."""
    import pymc as pm
    import pytensor
    import pytensor.tensor as pt

    if getattr(getattr(size, "type", None), "shape", (0,)) != (0,):
        raise ValueError("gaussian_hmm_dist: one series per variable; a size or shape beyond the time axis "
                         "(a batch of series) is not supported")
    n_states = mu.shape[-1]
    rng = pytensor.shared(np.random.default_rng())
    z0 = pm.Categorical.dist(p=pt.ones((n_states,)) / n_states, rng=rng)

    def step(z_prev, rng, P):
        z = pm.Categorical.dist(p=P[z_prev], rng=rng)
        return z, z.owner.outputs[0]

    zs, _ = pytensor.scan(step, outputs_info=[z0, z0.owner.outputs[0]], non_sequences=[P], n_steps=n_steps - 1,
                          strict=True, return_updates=False)
    states = pt.concatenate([z0[None], zs])
    return pm.Normal.dist(mu[states], sigma[states])


def build_model(y, n_states=3, ordered=True):
    """The PyMC model of the series ``y`` (T,) with ``n_states`` hidden states (means ordered unless
    ``ordered=False``, which leaves the states' labels free to switch)."""
    import pymc as pm

    with pm.Model() as model:
        P = pm.Dirichlet("P", a=np.ones((n_states, n_states)) + 4 * np.eye(n_states))
        # Distinct prior locations give the ordered transform a valid initial point without `initval`
        # (a model with initvals cannot be converted by pm.compute_log_likelihood or pymc-extras).
        transform = {"transform": pm.distributions.transforms.ordered} if ordered else {}
        mu = pm.Normal("mu", np.linspace(-1.0, 1.0, n_states), 5.0, shape=n_states, **transform)
        sigma = pm.HalfNormal("sigma", 2.0, shape=n_states)
        pm.CustomDist("y", mu, sigma, P, len(y), dist=gaussian_hmm_dist, logp=gaussian_hmm_logp,
                      signature="(k),(k),(k,k),()->(t)", observed=y)
    return model


def sample(model, sampler, draws, tune, chains, seed=0, mode=None, progressbar=False):
    """Run one of ``SAMPLERS``; returns (InferenceData / DataTree, wall seconds)."""
    import pymc as pm

    kwargs = dict(draws=draws, tune=tune, chains=chains, random_seed=seed, progressbar=progressbar, model=model)
    compile_kwargs = {"mode": mode} if mode else None
    if sampler == "pymc":
        kwargs.update(nuts_sampler="pymc", cores=1, compile_kwargs=compile_kwargs)
    elif sampler in ("pymc-fork", "pymc-spawn"):
        kwargs.update(nuts_sampler="pymc", cores=chains, mp_ctx=sampler.split("-")[1], compile_kwargs=compile_kwargs)
    elif sampler == "nutpie":
        kwargs.update(nuts_sampler="nutpie", cores=chains)
    elif sampler.startswith("numpyro-"):
        options = {"chain_method": sampler.split("-")[1]}
        # PyMC >= 6 takes the JAX samplers' options as nuts={...}; PyMC 5 as nuts_sampler_kwargs={...}
        kwargs.update({"nuts" if int(pm.__version__.split(".")[0]) >= 6 else "nuts_sampler_kwargs": options},
                      nuts_sampler="numpyro")
    else:
        raise ValueError(f"sample: unknown sampler {sampler!r}; expected one of {', '.join(SAMPLERS)}")
    t0 = time.perf_counter()
    idata = pm.sample(**kwargs)
    return idata, time.perf_counter() - t0


def posterior_report(idata, truth):
    """Rows (name, truth, posterior mean, posterior sd) for every scalar parameter, plus
    (max r_hat, min bulk ESS, divergences)."""
    post, stats = idata.posterior, idata.sample_stats
    rows = []
    for name, value in truth.items():
        draws = np.asarray(post[name].values)
        draws = draws.reshape(draws.shape[0] * draws.shape[1], -1)
        for idx, t, m, s in zip(np.ndindex(np.shape(value)), np.ravel(value), draws.mean(0), draws.std(0)):
            rows.append((f"{name}[{','.join(map(str, idx))}]", float(t), float(m), float(s)))
    rhat, ess = split_rhat_and_ess(post, list(truth))
    return rows, rhat, ess, int(np.asarray(stats["diverging"].values).sum())


def split_rhat_and_ess(posterior, names):
    """Largest split-r_hat (rank-normalised, as ArviZ) and smallest bulk ESS over ``names``."""
    import arviz as az

    summary = az.summary(posterior, var_names=names, kind="diagnostics")
    rhat_col = "r_hat" if "r_hat" in summary.columns else "rhat"
    return float(np.max(summary[rhat_col].astype(float))), float(np.min(summary["ess_bulk"].astype(float)))


def save_plots(idata, y, states, out_dir, var_names=("mu", "sigma", "P")):
    """Write ``hmm_pymc_trace.png`` (ArviZ trace plot) and ``hmm_pymc_data.png`` (the series with the
    posterior mean levels and the simulated states) into ``out_dir``; returns their paths."""
    import arviz as az
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    trace_path = os.path.join(out_dir, "hmm_pymc_trace.png")
    if hasattr(az, "plot_trace_dist"):  # ArviZ >= 1
        pc = az.plot_trace_dist(idata, var_names=list(var_names), backend="matplotlib")
        pc.savefig(trace_path, dpi=80) if hasattr(pc, "savefig") else pc.viz["chart"].item().savefig(trace_path, dpi=80)
    else:
        axes = az.plot_trace(idata, var_names=list(var_names), compact=True)
        axes.ravel()[0].figure.tight_layout()
        axes.ravel()[0].figure.savefig(trace_path, dpi=80)
    plt.close("all")

    post = idata.posterior
    mu = np.asarray(post["mu"].values).reshape(-1, post["mu"].shape[-1]).mean(0)
    sigma = np.asarray(post["sigma"].values).reshape(-1, post["sigma"].shape[-1]).mean(0)
    fig, ax = plt.subplots(figsize=(10, 3.2))
    t = np.arange(len(y))
    ax.plot(t, y, lw=0.6, color="0.45", label="data")
    ax.scatter(t, y, s=4, c=np.asarray(states), cmap="viridis", zorder=3, label="simulated state")
    for k, (m, s) in enumerate(zip(mu, sigma)):
        ax.axhline(m, color=plt.cm.viridis(k / max(len(mu) - 1, 1)), lw=1.5,
                   label="posterior mean levels" if k == 0 else None)
        ax.axhspan(m - s, m + s, color=plt.cm.viridis(k / max(len(mu) - 1, 1)), alpha=0.12)
    ax.set_xlabel("t")
    ax.set_ylabel("y")
    ax.set_title("Gaussian HMM: data, simulated states, posterior mean levels (band: posterior mean sigma)")
    ax.legend(loc="upper right", fontsize=8, ncol=3)
    fig.tight_layout()
    data_path = os.path.join(out_dir, "hmm_pymc_data.png")
    fig.savefig(data_path, dpi=80)
    plt.close(fig)
    return trace_path, data_path


def print_table(results):
    """One row per parameter: the truth, then each sampler's posterior mean (sd); '*' marks a mean more
    than 3 posterior sd from the truth."""
    names = list(results)
    print("\nposterior mean (sd) per sampler; * = more than 3 sd from the truth")
    print(f"{'parameter':10s} {'truth':>6s} " + " ".join(f"{n:>18s}" for n in names))
    for i, (label, t, _, _) in enumerate(next(iter(results.values()))):
        cells = []
        for n in names:
            _, _, m, s = results[n][i]
            cells.append(f"{m:.3f} ({s:.3f}){'*' if abs(m - t) > 3 * s else ' '}")
        print(f"{label:10s} {t:6.2f} " + " ".join(f"{c:>18s}" for c in cells))


def parse_samplers(text):
    names = []
    for name in text.split(","):
        name = name.strip()
        for n in GROUPS.get(name, (name,)):
            if n not in SAMPLERS:
                raise SystemExit(f"--samplers: unknown sampler {n!r}; choose from "
                                 f"{', '.join(SAMPLERS + tuple(GROUPS))}")
            if n not in names:
                names.append(n)
    return names


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500, help="length T of the simulated series")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--samplers", default="pymc-all,nutpie,numpyro",
                        help=f"comma-separated, from {', '.join(SAMPLERS + tuple(GROUPS))}")
    parser.add_argument("--mode", default=None, help='PyTensor mode for the pymc samplers (e.g. "NUMBA", "C")')
    parser.add_argument("--plot", metavar="DIR", help="save the trace plot and the data plot of the first sampler")
    parser.add_argument("--progressbar", action="store_true")
    args = parser.parse_args(argv)
    samplers = parse_samplers(args.samplers)

    if "numpyro-parallel" in samplers and "jax" not in sys.modules:
        # jax.pmap runs one chain per device; make the CPU look like `chains` devices (before jax starts).
        os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.chains}")

    y, states, truth = simulate(args.steps, args.seed)
    model = build_model(y, n_states=len(truth["mu"]))
    print(f"Gaussian HMM, K={len(truth['mu'])}, T={args.steps}; {args.chains} chains x ({args.tune} tune + "
          f"{args.draws} draws)")
    results, failed, first_idata = {}, [], None
    for sampler in samplers:
        print(f"\n== {sampler}", flush=True)
        try:
            idata, wall = sample(model, sampler, args.draws, args.tune, args.chains, args.seed, args.mode,
                                 args.progressbar)
        except Exception as exc:  # report and go on with the other samplers
            print(f"   FAILED: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            failed.append(sampler)
            continue
        rows, rhat, ess, divergences = posterior_report(idata, truth)
        results[sampler] = rows
        print(f"   wall {wall:.1f} s (compilation included), max r_hat {rhat:.3f}, min bulk ESS {ess:.0f}, "
              f"divergences {divergences}", flush=True)
        if args.plot and first_idata is None:
            first_idata = (sampler, idata)
    if results:
        print_table(results)
    if first_idata is not None:
        for path in save_plots(first_idata[1], y, states, args.plot):
            print(f"wrote {path} (from {first_idata[0]})")
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
