"""HMM inference: ptnative against dynamax (JAX, jitted, vmapped over the batch), hmmlearn (Cython, a loop over
the batch) and pytensor.scan, in one run, on the same data, timed in alternating turns.

    python bench/hmm.py [--reps 30] [--shapes 1000x8x16,500x1x3] [--overhead 500x1x3] [--hsmm 2000x8x4x50]
                        [--viterbi-sweep 100,200,500,1000,2000x2,3,4,5,6,8]

Prints, per shape and task, every implementation's median / best wall time and median CPU time, then
ptnative's time over each peer's with the issue's targets (issue 16: loglik+grad >= 50x faster than scan; issue
18: <= 0.1x, 0.3x, 0.5x of dynamax), also for ptnative's functions compiled with ``trust_input=True`` (no
per-call checks of the inputs, as PyMC's samplers call theirs), and the machine's load average before and after.
Where ptnative splits the batch over threads (T*B*K*K >= 1e7), it is also timed on one thread (``ptnative 1 thread``,
PTNATIVE_NUM_THREADS=1): on a loaded machine a thread of the split may wait for a core.

Tasks (float64): the log-likelihood with its gradient w.r.t. emissions, transitions and initial weights
(ptnative.hmm_log_likelihood; dynamax value_and_grad of hmm_filter; scan: a log-space forward in pytensor.scan
and pytensor.grad), the E-step (ptnative.hmm_posteriors: marginals and transition counts; dynamax hmm_smoother
with transition probabilities; hmmlearn forward/backward/xi sum, scaled and log-space) and Viterbi
(ptnative.hmm_viterbi; dynamax hmm_posterior_mode; hmmlearn viterbi).  ptnative's and dynamax's functions get
the emissions, transitions and initial weights in every call (the targets' rows); dynamax's "(A, pi fixed)" rows
have the parameters compiled in as constants (one argument per call), shown for comparison with earlier runs,
which timed dynamax that way against ptnative's three arguments.  Every competitor's result is checked
against ptnative's before timing.  Needs dynamax and hmmlearn (skipped where missing), e.g. a venv with
``pip install dynamax hmmlearn`` and ptnative's dependencies, run with PYTHONPATH at the checkout.

The small Viterbi (``--viterbi-sweep Ts x Ks``, issue 34): one sequence (B = 1, float64) at every T and K of the
grid, ptnative's hmm_viterbi (default mode, with ``trust_input``, and ``ptnative.eager.hmm_viterbi`` on the numpy
arrays) against hmmlearn's Viterbi in alternating turns, with each one's median and ptnative's time over hmmlearn's.
``ptnative eager`` rows everywhere: the task called through ptnative.eager (numpy in, numpy out, as hmmlearn is
called; the report compares hmmlearn's rows with them).

The explicit-duration HMM (``--hsmm TxBxKxD``, issue 31: float64, right-censored, the log-likelihood with its
gradients w.r.t. emissions, transitions, durations and initial weights): ptnative.hsmm_log_likelihood against the
same model as an HMM on K*D expanded states (state, time spent in it; see ``expanded_hsmm``) run by
ptnative.hmm_log_likelihood and by dynamax (value_and_grad of hmm_filter, jitted, vmapped over the batch), the
gradients reaching the HSMM's parameters through the expansion; targets: ptnative's HSMM <= 1/5 of dynamax's
time and <= 1/2 of ptnative's expanded HMM's.
"""

import argparse
import os
import sys
from unittest import mock

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import measure_interleaved, record  # noqa: E402

os.environ.setdefault("JAX_ENABLE_X64", "1")

import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

import ptnative  # noqa: E402

# ptnative's time / the peer's: issue 18 (dynamax, both shapes), issue 16 (scan, T=1000 B=8 K=16)
TARGETS = {("dynamax", "loglik+grad"): 0.1, ("dynamax", "posteriors"): 0.3, ("dynamax", "viterbi"): 0.5,
           ("scan", "loglik+grad", "T=1000 B=8 K=16"): 1 / 50}


def target_of(peer, task, shape):
    return TARGETS.get((peer, task), TARGETS.get((peer, task, shape)))


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


def ptnative_fns(log_e, log_A, log_pi, trust_input=False):
    """ptnative's three tasks as compiled PyTensor functions; ``trust_input``: without PyTensor's per-call checks
    of the inputs (about 4 us a call here), as PyMC's samplers call their logp+dlogp function."""
    le, lA, lpi = pt.tensor3("le"), pt.matrix("lA"), pt.vector("lpi")
    ll = ptnative.hmm_log_likelihood(le, lA, lpi).sum()
    f_grad = pytensor.function([le, lA, lpi], [ll, *pytensor.grad(ll, [le, lA, lpi])], trust_input=trust_input)
    f_post = pytensor.function([le, lA, lpi], list(ptnative.hmm_posteriors(le, lA, lpi)), trust_input=trust_input)
    f_vit = pytensor.function([le, lA, lpi], list(ptnative.hmm_viterbi(le, lA, lpi)), trust_input=trust_input)
    args = (log_e, log_A, log_pi)
    return {"loglik+grad": lambda: f_grad(*args), "posteriors": lambda: f_post(*args),
            "viterbi": lambda: f_vit(*args)}


def eager_fns(log_e, log_A, log_pi):
    """ptnative's three tasks called on the numpy arrays through ptnative.eager (compiled once, no PyTensor input
    check per call; the like-for-like form of hmmlearn's calls)."""
    def loglik_grad(le, lA, lpi):
        ll = ptnative.hmm_log_likelihood(le, lA, lpi).sum()
        return [ll, *pytensor.grad(ll, [le, lA, lpi])]

    f_grad = ptnative.eager.wrap(loglik_grad)
    args = (log_e, log_A, log_pi)
    return {"loglik+grad": lambda: f_grad(*args), "posteriors": lambda: ptnative.eager.hmm_posteriors(*args),
            "viterbi": lambda: ptnative.eager.hmm_viterbi(*args)}


def one_thread(fn):
    """``fn`` run with PTNATIVE_NUM_THREADS=1 (read by the kernels at every call)."""
    def run():
        with mock.patch.dict(os.environ, {"PTNATIVE_NUM_THREADS": "1"}):
            return fn()
    return run


def overhead_fns(log_e, log_A, log_pi):
    """Where the time of one small call goes: a compiled PyTensor function that does (almost) nothing, the same
    graph as hmm_viterbi's with a native op whose kernel does nothing (PyTensor + ptnative's driver, output
    allocation and entry point), and the real ops."""
    from ptnative.op import NativeOpGenBase
    from ptnative.ops import hmm

    class EmptyOp(NativeOpGenBase):  # the inputs and outputs hmm_viterbi compiles to (HmmViterbiDefaultsOp), no work
        in_info = hmm.HmmViterbiDefaultsOp.in_info
        out_info = hmm.HmmViterbiDefaultsOp.out_info
        c_fw_code = "(void)inputs; (void)outputs;"
        code_version = (1,)

    le, lA, lpi = pt.tensor3("le"), pt.matrix("lA"), pt.vector("lpi")
    f_pt = pytensor.function([le, lA, lpi], le[0, 0, 0] + lA[0, 0] + lpi[0])
    f_empty = pytensor.function([le, lA, lpi], list(EmptyOp.make_op()(le, lA, lpi)))
    f_empty_trusted = pytensor.function([le, lA, lpi], list(EmptyOp.make_op()(le, lA, lpi)), trust_input=True)
    f_vit = pytensor.function([le, lA, lpi], list(ptnative.hmm_viterbi(le, lA, lpi)))
    f_post = pytensor.function([le, lA, lpi], list(ptnative.hmm_posteriors(le, lA, lpi)))
    f_pt_trusted = pytensor.function([le, lA, lpi], le[0, 0, 0] + lA[0, 0] + lpi[0], trust_input=True)
    f_vit_trusted = pytensor.function([le, lA, lpi], list(ptnative.hmm_viterbi(le, lA, lpi)), trust_input=True)
    args = (log_e, log_A, log_pi)
    return {"PyTensor call, no op": lambda: f_pt(*args), "empty native op": lambda: f_empty(*args),
            "hmm_viterbi": lambda: f_vit(*args), "hmm_posteriors": lambda: f_post(*args),
            "no op, trust_input": lambda: f_pt_trusted(*args),
            "empty native op, trust_input": lambda: f_empty_trusted(*args),
            "hmm_viterbi, trust_input": lambda: f_vit_trusted(*args),
            "ptnative.eager.hmm_viterbi": lambda: ptnative.eager.hmm_viterbi(*args)}


def viterbi_sweep(spec, reps):
    """``spec`` "T1,T2,...xK1,K2,...": hmm_viterbi on one sequence (default mode and trust_input) against hmmlearn's
    Viterbi at every (T, K), timed in alternating turns; rows (T, K, ptnative, trust_input, eager, hmmlearn) in
    seconds."""
    Ts, Ks = ([int(v) for v in part.split(",")] for part in spec.split("x"))
    le, lA, lpi = pt.tensor3("le"), pt.matrix("lA"), pt.vector("lpi")
    path, score = ptnative.hmm_viterbi(le, lA, lpi)
    f = pytensor.function([le, lA, lpi], [path, score])
    f_trusted = pytensor.function([le, lA, lpi], [path, score], trust_input=True)
    rows = []
    for K in Ks:
        for T in Ts:
            args = data(T, 1, K)
            peer = hmmlearn_fns(*args).get("viterbi")
            if peer is None:
                return rows
            check("viterbi", "hmmlearn", peer(), f(*args))
            for got, want in zip(ptnative.eager.hmm_viterbi(*args), f(*args)):
                np.testing.assert_array_equal(got, want)
            times = measure_interleaved({"ptnative": lambda: f(*args), "trust_input": lambda: f_trusted(*args),
                                         "eager": lambda: ptnative.eager.hmm_viterbi(*args), "hmmlearn": peer},
                                        reps=reps, rounds=3, warmup=20)
            rows.append((T, K, times["ptnative"].median, times["trust_input"].median, times["eager"].median,
                         times["hmmlearn"].median))
            record("hmm", f"viterbi sweep T={T} B=1 K={K} f64", "ptnative", times["ptnative"].median, ours=True)
            record("hmm", f"viterbi sweep T={T} B=1 K={K} f64", "ptnative trust_input", times["trust_input"].median,
                   ours=True)
            record("hmm", f"viterbi sweep T={T} B=1 K={K} f64", "ptnative eager", times["eager"].median, ours=True)
            record("hmm", f"viterbi sweep T={T} B=1 K={K} f64", "hmmlearn", times["hmmlearn"].median,
                   versus="ptnative eager")
    return rows


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
    # Posteriors and Viterbi take the model's parameters as arguments of every call, as ptnative's functions do
    # (and as a model whose parameters are sampled needs); "(A, pi fixed)" has them as constants of the
    # compiled function instead (one argument per call: fewer per-call costs, and nothing for ptnative to match).
    smooth_one = lambda x, pi, A: (lambda p: (p.smoothed_probs, p.trans_probs))(hmm_smoother(pi, A, x))  # noqa: E731
    smooth = jax.jit(jax.vmap(smooth_one, in_axes=(0, None, None)))
    mode = jax.jit(jax.vmap(lambda x, pi, A: hmm_posterior_mode(pi, A, x), in_axes=(0, None, None)))
    smooth_fixed = jax.jit(jax.vmap(lambda x: smooth_one(x, pi, A)))
    mode_fixed = jax.jit(jax.vmap(lambda x: hmm_posterior_mode(pi, A, x)))
    la, lp = jnp.asarray(log_A), jnp.asarray(log_pi)
    block = jax.block_until_ready
    return {"loglik+grad": lambda: block(vg(lls, la, lp)), "posteriors": lambda: block(smooth(lls, pi, A)),
            "viterbi": lambda: block(mode(lls, pi, A)),
            "posteriors (A, pi fixed)": lambda: block(smooth_fixed(lls)),
            "viterbi (A, pi fixed)": lambda: block(mode_fixed(lls))}


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


# ---------------------------------------------------------------------------- explicit-duration HMM (issue 31)
HSMM_TARGETS = {"dynamax expanded HMM": 1 / 5, "ptnative expanded HMM": 1 / 2}


def hsmm_data(T, B, K, D, seed=0):
    """Gaussian series of a simulated HSMM: log-emissions (T, B, K), log-transitions (K, K) (uniform over the
    other states, -inf on the diagonal), log-durations (K, D) (negative binomials of means 8..30 truncated at D),
    log-initial (K,)."""
    from scipy.special import gammaln, logsumexp

    rng = np.random.default_rng(seed)
    n = np.arange(D)[None, :]
    m, a = np.linspace(8, 30, K)[:, None], 5.0
    ld = gammaln(n + a) - gammaln(a) - gammaln(n + 1) + a * np.log(a / (a + m)) + n * np.log(m / (a + m))
    ld -= logsumexp(ld, axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        lA = np.log((1 - np.eye(K)) / (K - 1))
    lpi = np.full(K, -np.log(K))
    means = np.linspace(-3, 3, K)
    z = np.zeros((T, B), int)
    for b in range(B):
        t, k = 0, rng.integers(K)
        while t < T:
            d = rng.choice(D, p=np.exp(ld[k])) + 1
            z[t:t + d, b] = k
            t, k = t + d, rng.choice([j for j in range(K) if j != k])
    x = means[z] + rng.normal(size=(T, B))
    log_e = -0.5 * (x[:, :, None] - means) ** 2 - 0.5 * np.log(2 * np.pi)
    return log_e, lA, ld, lpi


def expanded_hsmm(lA, ld, lpi, K, D, xp):
    """The right-censored HSMM as an HMM on K*D states (k, r = time spent so far, 1..D; index k*D + r-1), in
    ``xp`` (numpy, pytensor.tensor or jax.numpy; differentiable): it starts in (k, 1) with pi(k) L_k(1), goes on to
    (k, r+1) with L_k(r+1) / L_k(r) and leaves for (j, 1), j != k, with p_k(r) / L_k(r) A(k, j) L_j(1), where
    L_k(r) = sum_{r' >= r} p_k(r').  Returns (log_transitions (K*D, K*D), log_initial (K*D,))."""
    lL = xp.log(xp.cumsum(xp.exp(ld)[:, ::-1], axis=1))[:, ::-1]
    stay = xp.concatenate([lL[:, 1:] - lL[:, :-1], np.full((K, 1), -np.inf)], axis=1)  # (k, r) -> (k, r+1)
    leave = (ld - lL)[:, :, None, None] + lA[:, None, :, None] + lL[:, 0][None, None, :, None]  # (k, r) -> (j, 1)
    same = (np.eye(K) > 0)[:, None, :, None]
    first = (np.arange(D) == 0)[None, None, None, :]
    step = (np.arange(D)[None, :] == np.arange(D)[:, None] + 1)[None, :, None, :]
    big = xp.where(first & ~same, leave, xp.where(same & step, stay[:, :, None, None], -np.inf))
    init = xp.where((np.arange(D) == 0)[None, :], (lpi + lL[:, 0])[:, None], -np.inf)
    return big.reshape((K * D, K * D)), init.reshape((K * D,))


def hsmm_fns(log_e, lA, ld, lpi):
    """{name: fn}: loglik+grad of the HSMM by ptnative (with and without trust_input, and without the rewrite that
    fuses the value and gradient ops), of its expanded HMM by ptnative and by dynamax; each returns (sum of
    log-likelihoods, and the gradients w.r.t. log_e, log_A, log_durations, log_initial)."""
    K, D = ld.shape
    le_s, lA_s, ld_s, lpi_s = pt.tensor3("le"), pt.matrix("lA"), pt.matrix("ld"), pt.vector("lpi")
    inputs = [le_s, lA_s, ld_s, lpi_s]
    ll = ptnative.hsmm_log_likelihood(*inputs).sum()
    XA, Xpi = expanded_hsmm(lA_s, ld_s, lpi_s, K, D, pt)
    ll_x = ptnative.hmm_log_likelihood(pt.repeat(le_s, D, axis=2), XA, Xpi).sum()
    args = (log_e, lA, ld, lpi)
    fns = {}
    apart = pytensor.compile.mode.get_default_mode().excluding("ptnative_hsmm_value_and_gradient")
    for name, value, trust, mode in [("ptnative HSMM", ll, False, None), ("ptnative HSMM trust_input", ll, True, None),
                                     ("ptnative HSMM, two ops (not fused)", ll, False, apart),
                                     ("ptnative expanded HMM", ll_x, False, None)]:
        f = pytensor.function(inputs, [value, *pytensor.grad(value, inputs)], trust_input=trust, mode=mode)
        fns[name] = (lambda f: lambda: f(*args))(f)
    try:
        import jax
        import jax.numpy as jnp
        from dynamax.hidden_markov_model import hmm_filter
    except ImportError as e:
        print(f"dynamax: not installed ({e})")
        return fns
    jax.config.update("jax_enable_x64", True)

    def loglik(lls, lA, ld, lpi):
        XA, Xpi = expanded_hsmm(lA, ld, lpi, K, D, jnp)
        A, pi = jnp.exp(XA), jnp.exp(Xpi)
        one = lambda x: hmm_filter(pi, A, jnp.repeat(x, D, axis=-1)).marginal_loglik  # noqa: E731
        return jax.vmap(one)(lls).sum()

    vg = jax.jit(jax.value_and_grad(loglik, argnums=(0, 1, 2, 3)))
    jargs = (jnp.asarray(np.ascontiguousarray(log_e.transpose(1, 0, 2))), *(jnp.asarray(a) for a in args[1:]))

    def dynamax():
        value, grads = jax.block_until_ready(vg(*jargs))
        return value, np.asarray(grads[0]).transpose(1, 0, 2), grads[1], grads[2], grads[3]

    fns["dynamax expanded HMM"] = dynamax
    return fns


def hsmm_bench(shape, reps):
    """Times and ratios of the HSMM benchmark (rows as main's)."""
    T, B, K, D = (int(v) for v in shape.split("x"))
    label = f"T={T} B={B} K={K} D={D}"
    fns = hsmm_fns(*hsmm_data(T, B, K, D))
    want = fns["ptnative HSMM"]()
    for name, fn in fns.items():  # the same numbers before timing
        got = fn()
        np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-9, err_msg=name)
        for i in (1, 2, 3, 4):
            np.testing.assert_allclose(np.asarray(got[i]), want[i], rtol=1e-6, atol=1e-7, err_msg=f"{name} {i}")
    times = measure_interleaved(fns, reps=reps, rounds=3, warmup=2)
    mine = times["ptnative HSMM"].median
    rows = []
    for name, timing in times.items():
        rows.append((label, "hsmm ll+grad", name, timing.median * 1e3, timing.best * 1e3, timing.cpu * 1e3,
                     timing.median / mine))
        record("hmm", f"hsmm loglik+grad {label} f64", name, timing.median, ours=name.startswith("ptnative HSMM"),
               best=timing.best, cpu=timing.cpu)
    if "dynamax expanded HMM" not in times:  # bench/report.py: a "not installed" row
        record("hmm", f"hsmm loglik+grad {label} f64", "dynamax expanded HMM", None, note="not installed")
    for name, target in HSMM_TARGETS.items():
        if name in times:
            rows.append((label, "hsmm ll+grad", f"=> ptnative HSMM / {name}", mine / times[name].median, target,
                         None, None))
    return rows


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
    ap.add_argument("--overhead", default="500x1x3", help="TxBxK of the per-call overhead breakdown ('' to skip)")
    ap.add_argument("--hsmm", default="2000x8x4x50", help="TxBxKxD of the explicit-duration HMM ('' to skip)")
    ap.add_argument("--viterbi-sweep", default="", help="T,...xK,... of the one-sequence Viterbi against hmmlearn")
    args = ap.parse_args()
    load_before = os.getloadavg()
    if args.viterbi_sweep:
        sweep = viterbi_sweep(args.viterbi_sweep, max(args.reps, 30))
        print("\nViterbi, B=1 f64, median microseconds (alternating turns):")
        print(f"{'T':>6} {'K':>3} {'ptnative':>9} {'trust_input':>12} {'eager':>9} {'hmmlearn':>9} {'ratio':>6} "
              f"{'ratio trusted':>14} {'ratio eager':>12}")
        for T, K, a, b, e, c in sweep:
            print(f"{T:>6} {K:>3} {a * 1e6:>9.2f} {b * 1e6:>12.2f} {e * 1e6:>9.2f} {c * 1e6:>9.2f} {a / c:>6.2f} "
                  f"{b / c:>14.2f} {e / c:>12.2f}")
    if args.overhead:
        T, B, K = (int(v) for v in args.overhead.split("x"))
        times = measure_interleaved(overhead_fns(*data(T, B, K)), reps=max(args.reps, 300), rounds=3, warmup=20)
        print(f"\nper-call overhead, T={T} B={B} K={K} f64 (median / best wall microseconds):")
        for name, timing in times.items():
            print(f"  {name:<30} {timing.median * 1e6:8.1f} {timing.best * 1e6:8.1f}")
    rows = hsmm_bench(args.hsmm, args.reps) if args.hsmm else []
    for shape in filter(None, args.shapes.split(",")):
        T, B, K = (int(v) for v in shape.split("x"))
        label = f"T={T} B={B} K={K}"
        log_e, log_A, log_pi = data(T, B, K)
        ours = ptnative_fns(log_e, log_A, log_pi)
        trusted = ptnative_fns(log_e, log_A, log_pi, trust_input=True)
        eager = eager_fns(log_e, log_A, log_pi)
        others = {"dynamax": dynamax_fns(log_e, log_A, log_pi), "hmmlearn": hmmlearn_fns(log_e, log_A, log_pi),
                  "scan": scan_fns(log_e, log_A, log_pi)}
        threaded = T * B * K * K >= 1e7 and B > 1 and (os.cpu_count() or 1) > 1
        tasks = {task: {"ptnative": fn, "ptnative trust_input": trusted[task], "ptnative eager": eager[task],
                        **({"ptnative 1 thread": one_thread(fn)} if threaded else {})}
                 for task, fn in ours.items()}
        for name, fns in others.items():
            for task, fn in fns.items():
                base = task.split(" ")[0]
                tasks[base][name + task[len(base):]] = fn
        for task, fns in tasks.items():
            want = fns["ptnative"]()
            for got, same in zip(fns["ptnative eager"](), want):
                np.testing.assert_array_equal(got, same)
            for name, fn in fns.items():
                if not name.startswith("ptnative"):
                    check(task, name.split(" ")[0], fn(), want)
            times = measure_interleaved(fns, reps=args.reps, rounds=3, warmup=2)
            mine = times["ptnative"].median
            for name, timing in times.items():
                rows.append((label, task, name, timing.median * 1e3, timing.best * 1e3, timing.cpu * 1e3,
                             timing.median / mine))
                record("hmm", f"{task} {label} f64", name, timing.median, ours=name.startswith("ptnative"),
                       best=timing.best, versus="ptnative eager" if name.startswith("hmmlearn") else None)
            for name in (n for n, fns in others.items() if not fns):  # bench/report.py: "not installed" rows
                record("hmm", f"{task} {label} f64", name, None, note="not installed")
            for name, timing in times.items():
                if name.startswith("ptnative"):
                    continue
                target = target_of(name, task, label)
                rows.append((label, task, f"=> ptnative / {name}", mine / timing.median, target, None, None))
                for ours in ("ptnative trust_input", "ptnative eager"):
                    rows.append((label, task, f"=> {ours} / {name}", times[ours].median / timing.median, target,
                                 None, None))
    print(f"\nload average (1 min) before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs; times in ms")
    print(f"{'shape':<18} {'task':<12} {'implementation':<40} {'median':>9} {'best':>9} {'cpu':>9} {'x ptnative':>11}")
    for shape, task, name, a, b, c, d in rows:
        if d is None:
            verdict = "" if b is None else f"  (target <= {b:.3g}: {'meets' if a <= b else 'MISSES'})"
            print(f"{shape:<18} {task:<12} {name:<40} {a:>9.3f}{verdict}")
        else:
            print(f"{shape:<18} {task:<12} {name:<40} {a:>9.3f} {b:>9.3f} {c:>9.3f} {d:>11.2f}")


if __name__ == "__main__":
    main()
