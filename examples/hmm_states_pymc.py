"""The hidden states of a Gaussian HMM fitted in PyMC, recovered per posterior draw with ``ptnative.pymc``.

Simulates two series from a 3-state HMM, fits them with NUTS (the states summed out by
``ptnative.hmm_log_likelihood`` through ``hmm_marginal``), then ``recover_states`` gives, per draw, the smoothed
state marginals, the Viterbi path and a posterior path; prints how often each recovers the true states and
plots the first series with its posterior state probabilities and sampled paths::

    python examples/hmm_states_pymc.py [--draws 300] [--tune 300] [--plot docs/img/hmm_states.png]

Needs ``pymc`` (and ``matplotlib`` for ``--plot``).  See docs/hmm.md ("With PyMC").
"""

import argparse

import numpy as np


def simulate(T=300, B=2, seed=0):
    rng = np.random.default_rng(seed)
    P = np.array([[0.95, 0.04, 0.01], [0.03, 0.94, 0.03], [0.02, 0.03, 0.95]])
    mu = np.array([-2.0, 0.0, 2.0])
    z = np.zeros((T, B), int)
    z[0] = rng.integers(3, size=B)
    for t in range(1, T):
        z[t] = [rng.choice(3, p=P[s]) for s in z[t - 1]]
    return mu[z] + 0.7 * rng.normal(size=(T, B)), z


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=300)
    ap.add_argument("--tune", type=int, default=300)
    ap.add_argument("--plot", default=None, help="write the figure to this path")
    args = ap.parse_args()

    import pymc as pm
    import pytensor.tensor as pt

    from ptnative.pymc import hmm_marginal, recover_states

    y, z = simulate()
    T, B = y.shape
    with pm.Model():
        mu = pm.Normal("mu", [-1.0, 0.0, 1.0], 3.0, transform=pm.distributions.transforms.ordered)
        sigma = pm.HalfNormal("sigma", 2.0)
        P = pm.Dirichlet("P", np.ones((3, 3)) + 10 * np.eye(3))
        log_e = pm.logp(pm.Normal.dist(mu, sigma), pt.as_tensor(y)[:, :, None])  # (T, B, K)
        hmm = (log_e, pt.log(P), np.log(np.full(3, 1 / 3)))
        hmm_marginal("hmm", *hmm)
        idata = pm.sample(draws=args.draws, tune=args.tune, chains=2, cores=1, random_seed=1, progressbar=False)
        states = recover_states(idata, *hmm, random_seed=2)

    probs = states["hmm_marginals"].mean(("chain", "draw")).values  # (T, B, K)
    samples = states["hmm_sample"].values.reshape(-1, T, B)
    viterbi = states["hmm_viterbi"].values.reshape(-1, T, B)
    print(f"posterior means of mu: {idata.posterior['mu'].mean(('chain', 'draw')).values.round(2)} (truth -2, 0, 2)")
    print(f"argmax of the posterior marginals = truth on {np.mean(probs.argmax(-1) == z):.3f} of the frames")
    print(f"Viterbi paths = truth on {np.mean(viterbi == z):.3f}, sampled paths on {np.mean(samples == z):.3f}")

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(3, 1, figsize=(10, 7), sharex=True)
        colors = ["tab:blue", "tab:green", "tab:red"]
        axes[0].plot(y[:, 0], color="0.3", lw=0.8)
        axes[0].scatter(np.arange(T), y[:, 0], c=[colors[k] for k in probs[:, 0].argmax(-1)], s=8)
        axes[0].set_ylabel("series 0")
        axes[0].set_title("data, coloured by the most probable state")
        axes[1].stackplot(np.arange(T), probs[:, 0].T, colors=colors, alpha=0.8)
        axes[1].plot(np.arange(T), z[:, 0] / 2, "k--", lw=0.8, label="true state / 2")
        axes[1].set_ylabel("p(state | data)")
        axes[1].legend(loc="upper right", fontsize=8)
        axes[2].imshow(samples[:100, :, 0], aspect="auto", interpolation="nearest",
                       cmap=matplotlib.colors.ListedColormap(colors))
        axes[2].set_ylabel("sampled paths")
        axes[2].set_xlabel("time")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=90)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
