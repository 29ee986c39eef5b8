"""Cost and gradient on the CPU: PyTensor's default mode and JAX mode (``pytensor.grad`` in the graph), against
JAX differentiating the jaxified graph (``jax.jit(jax.value_and_grad(...))``, each native op a ``custom_vjp``), as
numpyro / blackjax / PyMC's JAX samplers do; then ``jax.vmap`` over many problems against one call with the op's
batch axis.  ``python bench/jax_grad.py [--quick]``; milliseconds, median of the timed calls (interleaved), and
each row's ratio to the first of its table."""

import os
import sys

import jax
import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.mode import get_mode
from pytensor.graph.fg import FunctionGraph
from pytensor.link.jax.dispatch import jax_funcify

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import quick_options  # noqa: E402
from timing import measure_interleaved, record  # noqa: E402

import ptnative  # noqa: E402


def hmm_graph(T, K, rng):
    """A K-state HMM log-likelihood of one sequence (Gaussian emissions) as a function of the means and
    log-transitions."""
    y = rng.normal(size=T)
    mu, logits = pt.vector("mu", shape=(K,)), pt.matrix("logits", shape=(K, K))
    log_em = -0.5 * (y[:, None] - mu[None, :]) ** 2
    lA = logits - pt.logsumexp(logits, axis=1, keepdims=True)
    cost = ptnative.hmm_log_likelihood(log_em[:, None, :], lA, np.log(np.full(K, 1.0 / K))).sum()
    return [mu, logits], cost, [np.linspace(-1, 1, K), rng.normal(size=(K, K))]


def ctc_graph(T, B, D, N, rng):
    logits = pt.tensor3("logits", shape=(T, B, D))
    targets = rng.integers(1, D, size=(B, N)).astype("int32")
    cost = ptnative.ctc_loss(logits, np.full(B, T, "int32"), targets, np.full(B, N, "int32"), blank_index=0).sum()
    return [logits], cost, [rng.normal(size=(T, B, D))]


def rows(inputs, cost, values, reps):
    grads = pytensor.grad(cost, inputs)
    default = pytensor.function(inputs, [cost, *grads])
    jax_mode = pytensor.function(inputs, [cost, *grads], mode="JAX")
    fgraph = FunctionGraph(inputs, [cost], clone=True)
    get_mode("JAX").optimizer.rewrite(fgraph)
    f = jax_funcify(fgraph)
    vg = jax.jit(jax.value_and_grad(lambda *xs: f(*xs)[0], argnums=tuple(range(len(inputs)))))
    want = default(*values)
    got = vg(*values)
    err = max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip([got[0], *got[1]], want))
    fns = {"default mode, pytensor.grad": lambda: default(*values),
           "JAX mode, pytensor.grad": lambda: jax.block_until_ready(jax_mode(*values)),
           "jax.value_and_grad (custom_vjp)": lambda: jax.block_until_ready(vg(*values))}
    return measure_interleaved(fns, reps=reps), err


def vmap_rows(T, K, N, rng, reps):
    """N HMM problems: ``jax.vmap`` over N calls (one FFI call per element) against one call with the op's batch
    axis B=N; value and gradient w.r.t. the emissions."""
    lA, lpi = np.log(rng.dirichlet(np.ones(K), size=K)), np.log(np.full(K, 1.0 / K))
    emissions = rng.normal(size=(T, N, K))
    fns = {}
    for B in (1, N):
        x = pt.tensor3("x", shape=(T, B, K))
        fgraph = FunctionGraph([x], [ptnative.hmm_log_likelihood(x, lA, lpi).sum()], clone=True)
        get_mode("JAX").optimizer.rewrite(fgraph)
        f = jax_funcify(fgraph)
        fns[B] = jax.value_and_grad(lambda v, f=f: f(v)[0])
    per_element = jax.jit(jax.vmap(fns[1], in_axes=1, out_axes=(0, 1)))
    batched = jax.jit(fns[N])
    stacked = emissions[:, :, None, :]
    got, want = per_element(stacked), batched(emissions)
    err = float(np.max(np.abs(np.asarray(got[1])[:, :, 0] - want[1])))
    return measure_interleaved({f"one call with B={N}": lambda: jax.block_until_ready(batched(emissions)),
                                f"jax.vmap over {N} calls (B=1)": lambda: jax.block_until_ready(per_element(stacked))},
                               reps=reps), err


def main():
    opts = quick_options(__doc__)
    rng = np.random.default_rng(0)
    reps = 6 if opts.quick else 30
    hmm_sizes = [(60, 3), (100, 8)] if opts.quick else [(500, 3), (3000, 8)]
    T, B, D, N = (20, 2, 5, 3) if opts.quick else (100, 16, 30, 20)
    cases = {f"hmm_log_likelihood T={t} K={k}": hmm_graph(t, k, rng) for t, k in hmm_sizes}
    cases[f"ctc_loss T={T} B={B} D={D} N={N}"] = ctc_graph(T, B, D, N, rng)
    for title, (inputs, cost, values) in cases.items():
        timings, err = rows(inputs, cost, values, reps)
        base = timings["default mode, pytensor.grad"].median
        print(f"\n{title} (cost + gradient; max |JAX - default| = {err:.1e})")
        for name, t in timings.items():
            print(f"  {name:34s} {t.median * 1e3:8.3f} ms  ({t.median / base:.2f}x)")
            record("jax_grad", f"{title}, cost + gradient", name, t.median, ours=True, best=t.best, cpu=t.cpu)
    T, K, N = (60, 3, 4) if opts.quick else (500, 3, 16)
    timings, err = vmap_rows(T, K, N, rng, reps)
    print(f"\nhmm_log_likelihood T={T} K={K}, {N} problems (value + gradient; max |difference| = {err:.1e})")
    base = timings[f"one call with B={N}"].median
    for name, t in timings.items():
        print(f"  {name:34s} {t.median * 1e3:8.3f} ms  ({t.median / base:.2f}x)")
        record("jax_grad", f"hmm_log_likelihood T={T} K={K}, {N} problems, value + gradient", name, t.median,
               ours=True, best=t.best, cpu=t.cpu)


if __name__ == "__main__":
    main()
