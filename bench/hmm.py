"""HMM inference: ptnative against dynamax (JAX, jitted, vmapped over the batch), hmmlearn (Cython, a loop over
the batch) and pytensor.scan, in one run, on the same data, timed in alternating turns.

    python bench/hmm.py [--reps 30] [--shapes 1000x8x16,500x1x3]

Tasks (float64): the log-likelihood with its gradient w.r.t. emissions, transitions and initial weights
(ptnative.hmm_log_likelihood; dynamax value_and_grad of hmm_filter; scan: a log-space forward in pytensor.scan
and pytensor.grad), the E-step (ptnative.hmm_posteriors: marginals and transition counts; dynamax hmm_smoother
with transition probabilities; hmmlearn forward/backward/xi sum, scaled and log-space) and Viterbi
(ptnative.hmm_viterbi; dynamax hmm_posterior_mode; hmmlearn viterbi).  Every competitor's result is checked
against ptnative's before timing.  Needs dynamax and hmmlearn (skipped where missing), e.g. a venv with
``pip install dynamax hmmlearn`` and ptnative's dependencies, run with PYTHONPATH at the checkout.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import measure_interleaved, record  # noqa: E402

os.environ.setdefault("JAX_ENABLE_X64", "1")

import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

import ptnative  # noqa: E402

TARGETS = {"loglik+grad": 0.1, "posteriors": 0.3, "viterbi": 0.5}  # of dynamax's time (issue 18)


def data(T, B, K, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.dirichlet(np.ones(K) * 0.5, size=K) * 0.3 + np.eye(K) * 0.7
    pi = rng.dirichlet(np.ones(K))
    means = np.linspace(-3, 3, K)
    z = np.zeros((T, B), int)
    z[0] = rng.choice(K, size=B, p=pi)
    for t in range(1, T):
        z[t] = [rng.choice(K, p=A[s]) for s in z[t - 1]]
    x = means[z] + rng.normal(size=(T, B))
    log_e = -0.5 * (x[:, :, None] - means) ** 2 - 0.5 * np.log(2 * np.pi)
    return log_e, np.log(A), np.log(pi)


def ptnative_fns(log_e, log_A, log_pi):
    le, lA, lpi = pt.tensor3("le"), pt.matrix("lA"), pt.vector("lpi")
    ll = ptnative.hmm_log_likelihood(le, lA, lpi).sum()
    f_grad = pytensor.function([le, lA, lpi], [ll, *pytensor.grad(ll, [le, lA, lpi])])
    f_post = pytensor.function([le, lA, lpi], list(ptnative.hmm_posteriors(le, lA, lpi)))
    f_vit = pytensor.function([le, lA, lpi], list(ptnative.hmm_viterbi(le, lA, lpi)))
    args = (log_e, log_A, log_pi)
    return {"loglik+grad": lambda: f_grad(*args), "posteriors": lambda: f_post(*args),
            "viterbi": lambda: f_vit(*args)}


def scan_fns(log_e, log_A, log_pi):
    le, lA, lpi = pt.tensor3("le"), pt.matrix("lA"), pt.vector("lpi")

    def lse(x, axis):  # pt.logsumexp's gradient is NaN here at T = 1000 (PyTensor 3.0.7); the plain form is not
        m = pt.max(x, axis=axis, keepdims=True)
        return (m + pt.log(pt.exp(x - m).sum(axis=axis, keepdims=True))).squeeze(axis)

    def step(e_t, la_prev, lA):
        return lse(la_prev[:, :, None] + lA[None], 1) + e_t

    la = pytensor.scan(step, sequences=[le[1:]], outputs_info=[lpi[None, :] + le[0]], non_sequences=[lA],
                       return_updates=False)
    ll = lse(la[-1], -1).sum()
    f = pytensor.function([le, lA, lpi], [ll, *pytensor.grad(ll, [le, lA, lpi])])
    return {"loglik+grad": lambda: f(log_e, log_A, log_pi)}


def dynamax_fns(log_e, log_A, log_pi):
    try:
        import jax
        import jax.numpy as jnp
        from dynamax.hidden_markov_model import hmm_filter, hmm_posterior_mode, hmm_smoother
    except ImportError as e:
        print(f"dynamax: not installed ({e})")
        return {}
    jax.config.update("jax_enable_x64", True)
    lls = jnp.asarray(np.ascontiguousarray(log_e.transpose(1, 0, 2)))  # (B, T, K)
    A, pi = jnp.exp(jnp.asarray(log_A)), jnp.exp(jnp.asarray(log_pi))

    def loglik(lls, log_A, log_pi):
        one = lambda x: hmm_filter(jnp.exp(log_pi), jnp.exp(log_A), x).marginal_loglik  # noqa: E731
        return jax.vmap(one)(lls).sum()

    vg = jax.jit(jax.value_and_grad(loglik, argnums=(0, 1, 2)))
    smooth = jax.jit(jax.vmap(lambda x: (lambda p: (p.smoothed_probs, p.trans_probs))(hmm_smoother(pi, A, x))))
    mode = jax.jit(jax.vmap(lambda x: hmm_posterior_mode(pi, A, x)))
    la, lp = jnp.asarray(log_A), jnp.asarray(log_pi)
    block = jax.block_until_ready
    return {"loglik+grad": lambda: block(vg(lls, la, lp)), "posteriors": lambda: block(smooth(lls)),
            "viterbi": lambda: block(mode(lls))}


def hmmlearn_fns(log_e, log_A, log_pi):
    try:
        from hmmlearn import _hmmc
    except ImportError as e:
        print(f"hmmlearn: not installed ({e})")
        return {}
    B = log_e.shape[1]
    A, pi = np.exp(log_A), np.exp(log_pi)
    frames = [np.ascontiguousarray(log_e[:, b]) for b in range(B)]

    def post_log():
        out = []
        for lf in frames:
            lp, fwd = _hmmc.forward_log(pi, A, lf)
            bwd = _hmmc.backward_log(pi, A, lf)
            gamma = np.exp(fwd + bwd - lp)
            out.append((gamma, np.exp(_hmmc.compute_log_xi_sum(fwd, A, bwd, lf))))
        return out

    def post_scaling():
        out = []
        for lf in frames:
            fp = np.exp(lf - lf.max(1, keepdims=True))  # hmmlearn's scaled pass wants densities; shift per frame
            lp, fwd, scale = _hmmc.forward_scaling(pi, A, fp)
            bwd = _hmmc.backward_scaling(pi, A, fp, scale)
            gamma = fwd * bwd
            gamma /= gamma.sum(1, keepdims=True)
            out.append((gamma, _hmmc.compute_scaling_xi_sum(fwd, A, bwd, fp)))
        return out

    def viterbi():
        return [_hmmc.viterbi(pi, A, lf) for lf in frames]

    return {"posteriors": post_log, "posteriors (scaled)": post_scaling, "viterbi": viterbi}


def check(task, name, got, want):
    """Competitor ``name``'s result of ``task`` against ptnative's (same numbers, else the timing means nothing)."""
    if task == "loglik+grad":
        ll, g_e = (float(got[0]), np.asarray(got[1])) if name != "dynamax" else (float(got[0]), np.asarray(got[1][0]))
        if name == "dynamax":
            g_e = g_e.transpose(1, 0, 2)
        np.testing.assert_allclose(ll, want[0], rtol=1e-9)
        np.testing.assert_allclose(g_e, want[1], atol=1e-8)
    elif task.startswith("posteriors"):
        if name == "dynamax":
            gamma, xi = np.asarray(got[0]).transpose(1, 0, 2), np.asarray(got[1])
        else:
            gamma = np.stack([g for g, _ in got], 1)
            xi = np.stack([x for _, x in got], 0)
        np.testing.assert_allclose(gamma, want[0], atol=1e-7)
        np.testing.assert_allclose(xi, want[1], rtol=1e-6, atol=1e-6)
    else:
        path = np.asarray(got).T if name == "dynamax" else np.stack([p for _, p in got], 1)
        agree = (path == want[0]).mean()
        assert agree > 0.999, f"{name} Viterbi agrees on {agree:.4f} of the frames"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--shapes", default="1000x8x16,500x1x3", help="TxBxK,...")
    args = ap.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        T, B, K = (int(v) for v in shape.split("x"))
        log_e, log_A, log_pi = data(T, B, K)
        ours = ptnative_fns(log_e, log_A, log_pi)
        others = {"dynamax": dynamax_fns(log_e, log_A, log_pi), "hmmlearn": hmmlearn_fns(log_e, log_A, log_pi),
                  "scan": scan_fns(log_e, log_A, log_pi)}
        tasks = {task: {"ptnative": fn} for task, fn in ours.items()}
        for name, fns in others.items():
            for task, fn in fns.items():
                base = task.split(" ")[0]
                label = name + task[len(base):]
                tasks[base][label] = fn
        for task, fns in tasks.items():
            want = fns["ptnative"]()
            for name, fn in fns.items():
                if name != "ptnative":
                    check(task, name.split(" ")[0], fn(), want)
            times = measure_interleaved(fns, reps=args.reps, rounds=3, warmup=2)
            for name, timing in times.items():
                rows.append((f"T={T} B={B} K={K}", task, name, timing.median * 1e3, timing.cpu * 1e3,
                             timing.median / times["ptnative"].median))
                record("hmm", f"{task} T={T} B={B} K={K} f64", name, timing.median, ours=name == "ptnative",
                       best=timing.best, cpu=timing.cpu)
            for name in (n for n, fns in others.items() if not fns):  # bench/report.py: "not installed" rows
                record("hmm", f"{task} T={T} B={B} K={K} f64", name, None, note="not installed")
            dyn = times.get("dynamax")
            if dyn is not None:
                ratio = times["ptnative"].median / dyn.median
                rows.append((f"T={T} B={B} K={K}", task, "=> ptnative / dynamax", ratio, TARGETS[task],
                             None))
    print(f"\n{'shape':<18} {'task':<12} {'implementation':<22} {'median ms':>10} {'cpu ms':>9} {'x ptnative':>11}")
    for shape, task, name, a, b, c in rows:
        if c is None:
            verdict = "meets" if a <= b else "MISSES"
            print(f"{shape:<18} {task:<12} {name:<22} {a:>10.3f} (target <= {b}: {verdict})")
        else:
            print(f"{shape:<18} {task:<12} {name:<22} {a:>10.3f} {b:>9.3f} {c:>11.2f}")


if __name__ == "__main__":
    main()
