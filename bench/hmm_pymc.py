"""The Gaussian HMM of examples/hmm_pymc.py in PyMC: ptnative against pymc-extras' marginalised DiscreteMarkovChain.

Run: ``python bench/hmm_pymc.py [--steps 500,3000] [--draws 500 --tune 500 --chains 2] [--no-sample] [--mode M]``.

Both models have the same priors (Dirichlet rows, ordered Normal means, HalfNormal sigma, uniform first state)
and the same marginal likelihood: ``ptnative.hmm_log_likelihood`` in a ``pm.CustomDist`` (the example's model),
and ``pymc_extras.marginalize(model, ["z"])`` of a model with an explicit ``DiscreteMarkovChain`` z, which sums
z out with a ``scan`` forward recursion.  First the two logps are checked to agree at a random point; then

1. logp + dlogp (``model.logp_dlogp_function``, raveled inputs), one call, timed in alternating turns
   (``timing.measure_interleaved``);
2. ``pm.sample`` (PyMC's NUTS, or nutpie with ``--sampler nutpie``, one core) wall time with compilation and the
   sampling time PyMC reports.

pymc-extras is optional: without it only ptnative's rows are printed.  PyMC 5.28 has a release for it (0.10.0);
no release declares PyMC 6.4 support yet (0.15.1 requires pymc < 6.4, and pip would move PyMC down to 6.3), but
``pip install --no-deps pymc-extras==0.15.1`` next to PyMC 6.4 imports and gives the same logp (checked here).
"""

import argparse
import importlib.util
import os
import sys
import time
import warnings

import numpy as np

_BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _BENCH)
from timing import measure_interleaved, record  # noqa: E402  (bench/timing.py)

# Run as a script, bench/ is first on sys.path, where its scripts would shadow modules that PyMC's stack tries
# to import (ArviZ/xarray try `import sparse`, which would run bench/sparse.py): take it off again.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _BENCH]

_spec = importlib.util.spec_from_file_location(
    "hmm_pymc_example", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                                     "hmm_pymc.py"))
hmm_pymc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hmm_pymc)

import pymc as pm  # noqa: E402
import pytensor  # noqa: E402

import ptnative  # noqa: E402

try:
    import pymc_extras as pmx
    from pymc_extras.distributions import DiscreteMarkovChain
except ImportError:
    pmx = None


def pymc_extras_model(y, n_states=3):
    """The example's model with the hidden chain explicit, then marginalised by pymc-extras."""
    with pm.Model() as model:
        P = pm.Dirichlet("P", a=np.ones((n_states, n_states)) + 4 * np.eye(n_states))
        mu = pm.Normal("mu", np.linspace(-1.0, 1.0, n_states), 5.0, shape=n_states,
                       transform=pm.distributions.transforms.ordered)
        sigma = pm.HalfNormal("sigma", 2.0, shape=n_states)
        z = DiscreteMarkovChain("z", P=P, init_dist=pm.Categorical.dist(p=np.full(n_states, 1.0 / n_states)),
                                steps=len(y) - 1)
        pm.Normal("y", mu[z], sigma[z], observed=y)
    return pmx.marginalize(model, ["z"])


def logp_dlogp(model, mode):
    """(f, ravel): ``f(x)`` returns (logp, dlogp) at the raveled point ``x = ravel(point dict)``."""
    kwargs = {"mode": mode} if mode else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fn = model.logp_dlogp_function(ravel_inputs=True, **kwargs)
    fn.set_extra_values({})
    names = [v.name for v in model.value_vars]
    return fn, lambda point: np.concatenate([np.ravel(point[n]) for n in names])


def check_same_model(fns, xs, models, point, n_steps):
    """Both models' logp and dlogp agree at ``point`` (dlogp where pymc-extras' is finite, which it is not
    everywhere in every version); exits with the difference otherwise."""
    la, ga = fns["ptnative"][0](xs["ptnative"])
    lb, gb = fns["pymc-extras"][0](xs["pymc-extras"])
    names, sizes = [v.name for v in models["pymc-extras"].value_vars], [np.size(point[v.name]) for v in
                                                                         models["pymc-extras"].value_vars]
    gb = fns["ptnative"][1](dict(zip(names, np.split(gb, np.cumsum(sizes)[:-1]))))  # into ptnative's order
    finite = np.isfinite(gb)
    diff = np.max(np.abs(ga - gb)[finite], initial=0.0)
    if not (np.isfinite(la) and np.isfinite(ga).all() and np.allclose(la, lb, rtol=1e-9)
            and np.allclose(ga[finite], gb[finite], rtol=1e-7, atol=1e-8)):
        raise SystemExit(f"T={n_steps}: the models disagree: logp {la} vs {lb}, dlogp max |diff| {diff}")
    print(f"T={n_steps}: logp {la:.6f} in both (|diff| {abs(la - lb):.1e}), dlogp max |diff| {diff:.1e}"
          + ("" if finite.all() else f"; pymc-extras' dlogp has {np.count_nonzero(~finite)} of {finite.size} "
             "entries not finite here (ptnative's are finite)"), flush=True)


def sample_time(model, draws, tune, chains, mode, sampler):
    t0 = time.perf_counter()
    kwargs = {"compile_kwargs": {"mode": mode} if mode else None} if sampler == "pymc" else {}
    idata = pm.sample(draws=draws, tune=tune, chains=chains, cores=1, nuts_sampler=sampler, random_seed=1,
                      progressbar=False, model=model, **kwargs)
    wall = time.perf_counter() - t0
    sampling = float(idata.posterior.attrs.get("sampling_time", np.nan))
    divergences = int(np.asarray(idata.sample_stats["diverging"].values).sum())
    return wall, sampling, divergences


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default="500,3000", help="comma-separated series lengths T")
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument("--tune", type=int, default=500)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--reps", type=int, default=300, help="timed logp+dlogp calls per model")
    parser.add_argument("--no-sample", action="store_true", help="time logp+dlogp only")
    parser.add_argument("--mode", default=None, help="PyTensor mode (default: PyTensor's default)")
    parser.add_argument("--sampler", default="pymc", choices=("pymc", "nutpie"),
                        help="NUTS implementation for the sampling rows (one core either way)")
    args = parser.parse_args(argv)

    print(f"ptnative {ptnative.__version__}, pymc {pm.__version__}, pytensor {pytensor.__version__} "
          f"(mode {args.mode or 'default: ' + type(pytensor.compile.get_default_mode().linker).__name__}), pymc-extras "
          f"{getattr(pmx, '__version__', 'not installed')}, Python {sys.version.split()[0]}")
    rows = []
    for n_steps in [int(s) for s in args.steps.split(",")]:
        y, _, _ = hmm_pymc.simulate(n_steps, seed=1)
        models = {"ptnative": hmm_pymc.build_model(y)}
        if pmx is not None:
            models["pymc-extras"] = pymc_extras_model(y)
        rng = np.random.default_rng(0)
        point = {k: v + rng.normal(0, 0.2, np.shape(v)) for k, v in models["ptnative"].initial_point().items()}
        fns = {name: logp_dlogp(m, args.mode) for name, m in models.items()}
        xs = {name: ravel(point) for name, (_, ravel) in fns.items()}
        if pmx is not None:
            check_same_model(fns, xs, models, point, n_steps)
        timings = measure_interleaved({name: (lambda f=f, x=xs[name]: f(x)) for name, (f, _) in fns.items()},
                                      reps=args.reps, rounds=3, warmup=3)
        for name, t in timings.items():
            rows.append((n_steps, "logp+dlogp", name, t.median * 1e3, "ms"))
            record("hmm_pymc", f"model logp+dlogp T={n_steps}", name, t.median, ours=name == "ptnative", best=t.best,
                   cpu=t.cpu)
        if pmx is None:
            record("hmm_pymc", f"model logp+dlogp T={n_steps}", "pymc-extras", None, note="not installed")
        if not args.no_sample:
            for name, model in models.items():
                wall, sampling, div = sample_time(model, args.draws, args.tune, args.chains, args.mode, args.sampler)
                rows.append((n_steps, f"{args.sampler} {args.chains}x({args.tune}+{args.draws}), wall", name, wall,
                             "s"))
                rows.append((n_steps, "  sampling only (PyMC's sampling_time)", name, sampling, "s"))
                record("hmm_pymc", f"{args.sampler} {args.chains}x({args.tune}+{args.draws}) T={n_steps}, wall",
                       name, wall, ours=name == "ptnative")
                print(f"T={n_steps} {name}: sampled in {wall:.1f} s wall ({sampling:.1f} s sampling), "
                      f"{div} divergences", flush=True)

    print(f"\n{'T':>5s}  {'what':42s} {'ptnative':>12s} {'pymc-extras':>12s} {'ratio':>7s}")
    keys = list(dict.fromkeys((r[0], r[1]) for r in rows))
    for n_steps, what in keys:
        vals = {r[2]: (r[3], r[4]) for r in rows if (r[0], r[1]) == (n_steps, what)}
        ours, unit = vals["ptnative"]
        theirs = vals.get("pymc-extras", (np.nan, unit))[0]
        ratio = f"{theirs / ours:6.1f}x" if np.isfinite(theirs) else "      -"
        print(f"{n_steps:5d}  {what:42s} {ours:9.3f} {unit:2s} {theirs:9.3f} {unit:2s} {ratio}")
    print("(logp+dlogp: median over calls timed in alternating turns; ratio = pymc-extras / ptnative)")


if __name__ == "__main__":
    main()
