"""JAX differentiates PyTensor graphs of native ops: ``jax.grad`` of a jaxified graph (built as PyMC builds one:
the graph rewritten for JAX, then ``jax_funcify``) equals ``pytensor.grad`` of the same graph, for every catalogue op
(the graphs of tests/gpu/cases.py, on the CPU), under ``jax.jit``; second derivatives where the spec has them (the
LSTM cell); a clear error where an op has no gradient."""

from unittest.mock import patch

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import get_mode
from pytensor.gradient import NullTypeGradError
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.traversal import ancestors, graph_inputs

jax = pytest.importorskip("jax")

import ptnative  # noqa: E402
from ptnative.ops.sparse import MaxAndArgmaxSparse  # noqa: E402

from .gpu import cases  # noqa: E402
from .test_fsa import hmm_data, mask_of  # noqa: E402
from .test_rnnt import rnnt_data  # noqa: E402

#: The PyTensor reference (same CPU kernels as the default mode, without compiling the graph with Numba).
REFERENCE_MODE = "FAST_COMPILE"


def jaxify(inputs, outputs):
    """A JAX function of ``inputs`` returning the list of ``outputs``, as ``pymc.sampling.jax.get_jaxified_graph``
    builds it (nothing from ptnative is called: JAX mode's rewrite registers the NativeOp implementation)."""
    from pytensor.link.jax.dispatch import jax_funcify

    fgraph = FunctionGraph(inputs=inputs, outputs=outputs, clone=True)
    get_mode("JAX").optimizer.rewrite(fgraph)
    fn = jax_funcify(fgraph)
    return lambda *args: list(fn(*args))


def assert_close(got, want, dtype, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} {got.dtype} vs " \
                                                                f"{want.shape} {want.dtype}"
    if not np.issubdtype(want.dtype, np.floating):
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    rtol = 2e-4 if dtype == "float32" else 1e-9
    finite = np.isfinite(want)
    scale = float(np.abs(want[finite]).max()) if finite.any() else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(scale, 1e-30), err_msg=what)


class Recorder(cases.GraphBuilder):
    """The cases' graph builder that also keeps each weighted cost with its ``wrt`` and PyTensor's gradients of it;
    ``made`` lists the builders created (a case builds its graph with the first)."""

    made = []

    def __init__(self, make_op, static):
        super().__init__(make_op, static)
        self.costs = []
        Recorder.made.append(self)

    def grads(self, outputs, wrt):
        grads = super().grads(outputs, wrt)
        ws, outs = self.stages[-1]
        self.costs.append((sum((o * w).sum() for o, w in zip(outs, ws)), list(wrt), grads))
        return grads


def cpu_op(cls, **kwargs):
    return cls.make_op(device="cpu", **kwargs)


def build(name, dtype):
    """(inputs, values, outputs, costs) of a case's graph (its first size, static shapes, CPU ops): ``costs`` are
    (cost, wrt positions in inputs, PyTensor gradients) for the first-order costs (those computed from no earlier
    gradient).

    JAX needs every shape when it traces: the number of automaton states that some cases compute from the edges
    (``cases.n_states_of``, a buffer's size) is folded to its value for these inputs."""
    case = cases.CASES_BY_NAME[name]
    inputs, _, (values,) = case.build(cpu_op, dtype, static=True)
    by_name = {v.name: value for v, value in zip(inputs, values)}
    n_states_of = cases.n_states_of

    def n_states_constant(edges, *states):
        expr = n_states_of(edges, *states)
        return pt.constant(np.int32(expr.eval({v: by_name[v.name] for v in graph_inputs([expr])
                                               if v.name in by_name})))

    Recorder.made.clear()
    with patch.object(cases, "n_states_of", n_states_constant), patch.object(cases, "GraphBuilder", Recorder):
        inputs, outputs, (values,) = case.build(cpu_op, dtype, static=True)
    earlier, first_order = set(), []
    for cost, wrt, grads in Recorder.made[0].costs:
        if not earlier & set(ancestors([cost])):
            first_order.append((cost, [inputs.index(v) for v in wrt], grads))
        earlier |= set(grads)
    return list(inputs), list(values), list(outputs), first_order


def case_params(with_gradient):
    result = []
    for case in cases.CASES:
        has_gradient = any(cls.make_op().c_bw_code or type(cls.make_op()).pullback is not ptnative.NativeOp.pullback
                           for cls in case.classes)
        if has_gradient == with_gradient:
            result += [pytest.param(case.name, d, id=f"{case.name}-{d}") for d in case.dtypes]
    return result


@pytest.mark.parametrize("name,dtype", case_params(with_gradient=True))
def test_jax_grad_equals_pytensor_grad(name, dtype):
    inputs, values, outputs, costs = build(name, dtype)
    assert costs, f"{name}: no gradient in the case"
    ref_outputs = [o for _, _, grads in costs for o in grads]
    want = pytensor.function(inputs, ref_outputs, mode=REFERENCE_MODE, on_unused_input="ignore")(*values)
    k = 0
    for cost, positions, grads in costs:
        f = jaxify(inputs, [cost])
        got = jax.jit(jax.grad(lambda *xs: f(*xs)[0], argnums=positions))(*values)
        for j, (gj, pos) in enumerate(zip(got, positions)):
            assert_close(gj, want[k + j], dtype, f"{name} {dtype}: d cost / d {inputs[pos]}")
        k += len(grads)


@pytest.mark.parametrize("name", [p.values[0] for p in case_params(with_gradient=True) if p.values[1] == "float64"])
def test_jax_grad_traced_again_after_a_first_trace(name):
    """The same gradient function traced twice (``jit``, then ``jit(vmap)`` on a stack of two value sets), as a
    vectorised sampler re-traces a model's gradient: the pullback graph built in the first trace and kept for the
    next holds no value of the first (before: ``UnexpectedTracerError`` for TwoDLSTM)."""
    inputs, values, outputs, costs = build(name, "float64")
    cost, positions, _ = costs[0]
    f = jaxify(inputs, [cost])
    grad = jax.grad(lambda *xs: f(*xs)[0], argnums=positions)
    want = jax.jit(grad)(*values)
    got = jax.jit(jax.vmap(grad))(*(np.stack([v, v]) for v in values))
    for gj, wj, pos in zip(got, want, positions):
        for k in range(2):
            assert_close(gj[k], wj, "float64", f"{name}: d cost / d {inputs[pos]} of stacked set {k}")


@pytest.mark.parametrize("name,dtype", case_params(with_gradient=False))
def test_jax_grad_of_ops_without_gradient_inputs_is_zero(name, dtype):
    """Ops whose inputs are all disconnected (ints, automata, masks): JAX runs them under ``jit`` and gives zero
    gradients w.r.t. their float inputs, as ``pytensor.grad(..., disconnected_inputs="ignore")`` does."""
    inputs, values, outputs, _ = build(name, dtype)
    want = pytensor.function(inputs, outputs, mode=REFERENCE_MODE, on_unused_input="ignore")(*values)
    f = jaxify(inputs, outputs)
    got = jax.jit(f)(*values)
    for k, (a, b) in enumerate(zip(got, want)):
        assert_close(a, b, dtype, f"{name} {dtype}: output {k}")
    floats = [i for i, v in enumerate(inputs) if v.dtype.startswith("float")]
    if not floats:
        return
    cost = sum((o.astype(dtype) * 0.5).sum() for o in outputs if o.dtype.startswith("float"))
    fc = jaxify(inputs, [cost])
    grads = jax.jit(jax.grad(lambda *xs: fc(*xs)[0], argnums=floats))(*values)
    for i, gi in zip(floats, grads):
        np.testing.assert_array_equal(np.asarray(gi), np.zeros_like(values[i]))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lstm_cell_second_derivative(dtype):
    """LstmCell -> LstmCellGrad -> LstmCellGradGrad: jax.grad of a cost of jax.grad equals PyTensor's."""
    rng = np.random.default_rng(3)
    values = [rng.uniform(-1.5, 1.5, (4, 3, 2)).astype(dtype), rng.uniform(-1.5, 1.5, (3, 12, 2)).astype(dtype)]
    c_prev, x = (pt.tensor(n, dtype=dtype, shape=v.shape) for n, v in zip(("c_prev", "x"), values))
    c, h = ptnative.lstm_cell(c_prev, x)
    w_c, w_h = rng.normal(size=(4, 3, 2)).astype(dtype), rng.normal(size=(3, 3, 2)).astype(dtype)
    cost1 = (c * w_c).sum() + (h * w_h).sum()
    g_c, g_x = pytensor.grad(cost1, [c_prev, x])
    cost2 = (g_c ** 2).sum() + (g_x * 0.7).sum() + (g_x ** 2).sum()
    want = pytensor.function([c_prev, x], [g_c, g_x, *pytensor.grad(cost2, [c_prev, x])], mode=REFERENCE_MODE)(
        *values)

    f1 = jaxify([c_prev, x], [cost1])
    first = jax.grad(lambda *xs: f1(*xs)[0], argnums=(0, 1))

    def second_cost(*xs):
        gc, gx = first(*xs)
        return (gc ** 2).sum() + (gx * 0.7).sum() + (gx ** 2).sum()

    got = [*first(*values), *jax.jit(jax.grad(second_cost, argnums=(0, 1)))(*values)]
    for k, (a, b) in enumerate(zip(got, want)):
        assert_close(a, b, dtype, f"lstm cell {dtype}: result {k}")


def test_second_derivative_without_spec_raises():
    """HmmForwardBackwardOp's gradient op has no gradient of its own: differentiating twice names it."""
    rng = np.random.default_rng(0)
    le, lA, lpi, lf = hmm_data(rng, 5, 2, 3, scale=2.0)
    le_s = pt.tensor3("le", shape=le.shape)
    ll = ptnative.hmm_log_likelihood(le_s, lA, lpi, lf).sum()
    f = jaxify([le_s], [ll])
    first = jax.grad(lambda x: f(x)[0])
    with pytest.raises(NullTypeGradError, match="GradOfHmmForwardBackwardOp"):
        jax.grad(lambda x: (first(x) ** 2).sum())(le)


def test_op_without_c_bw_code_raises_when_differentiated():
    s0, s1, w, mask = cases.coo(6, 2, 4, 3, seed=1)
    w_s = pt.matrix("w", shape=w.shape)
    out_max, _ = MaxAndArgmaxSparse.make_op()(s0, s1, w_s, mask, np.zeros((4, 2)), np.zeros((4, 2)))
    f = jaxify([w_s], [out_max.sum()])
    assert np.isfinite(float(f(w)[0]))  # the forward pass works
    with pytest.raises(NullTypeGradError, match=r"NativeOp 'MaxAndArgmaxSparse' has no gradient with respect to "
                                                r"input 'weight' \(#2\)"):
        jax.grad(lambda v: f(v)[0])(w)


def test_value_and_grad_of_catalogue_functions():
    """ctc_loss, rnnt_loss and hmm_log_likelihood through their public functions, one cost: jax.value_and_grad
    equals PyTensor's value and gradient."""
    rng = np.random.default_rng(5)
    T, B, D = 8, 3, 5
    logits = pt.tensor3("logits", shape=(T, B, D))
    ctc = ptnative.ctc_loss(logits, np.array([8, 6, 3], "int32"), np.array([[1, 2, 2], [3, 1, 0], [4, 0, 0]], "int32"),
                            np.array([3, 2, 1], "int32"), blank_index=0)
    acts_v, labels, act_lens, label_lens = rnnt_data(B, 6, 3, 4, 0, 0, "float64", seed=2)
    acts = pt.tensor4("acts", shape=acts_v.shape)
    rnnt = ptnative.rnnt_loss(acts, labels, act_lens, label_lens, blank=0, reduction="sum")
    le, lA, lpi, lf = hmm_data(rng, T, B, 4, scale=2.0)
    le_s = pt.tensor3("le", shape=le.shape)
    lA_s = pt.matrix("lA", shape=lA.shape)
    hmm = ptnative.hmm_log_likelihood(le_s, lA_s, lpi, lf, mask=mask_of(np.array([8, 5, 1]), T))
    cost = (ctc * np.array([1.0, 0.5, 2.0])).sum() + 0.3 * rnnt - hmm.sum()
    inputs = [logits, acts, le_s, lA_s]
    values = [rng.normal(size=(T, B, D)), acts_v, le, lA]
    want = pytensor.function(inputs, [cost, *pytensor.grad(cost, inputs)], mode=REFERENCE_MODE)(*values)
    f = jaxify(inputs, [cost])
    value, grads = jax.jit(jax.value_and_grad(lambda *xs: f(*xs)[0], argnums=(0, 1, 2, 3)))(*values)
    for k, (a, b) in enumerate(zip([value, *grads], want)):
        assert_close(a, b, "float64", f"result {k}")


def test_pytensor_jax_mode_gradient_graph_still_matches():
    """pytensor.function(mode="JAX") of pytensor.grad (the gradient ops as FFI calls, no custom_vjp involved)."""
    rng = np.random.default_rng(1)
    x = pt.tensor3("x", shape=(6, 2, 4))
    le, lA, lpi, lf = hmm_data(rng, 6, 2, 4, scale=2.0)
    ll = ptnative.hmm_log_likelihood(x, lA, lpi, lf).sum()
    outs = [ll, pytensor.grad(ll, x)]
    want = pytensor.function([x], outs, mode=REFERENCE_MODE)(le)
    got = pytensor.function([x], outs, mode="JAX")(le)
    for a, b in zip(got, want):
        assert_close(a, b, "float64", "hmm")


def hmm_log_density():
    """A 2-state Gaussian HMM's log posterior density of (mu, log_sigma), jaxified (as PyMC hands it to numpyro or
    blackjax), with the truth it was simulated from."""
    rng = np.random.default_rng(4)
    T, mu_true, sigma_true = 300, np.array([-1.0, 2.0]), 0.7
    A = np.array([[0.95, 0.05], [0.1, 0.9]])
    z = [0]
    for _ in range(T - 1):
        z.append(rng.choice(2, p=A[z[-1]]))
    y = rng.normal(mu_true[np.array(z)], sigma_true)
    mu, log_sigma = pt.vector("mu", shape=(2,)), pt.scalar("log_sigma")
    sigma = pt.exp(log_sigma)
    log_em = -0.5 * ((y[:, None] - mu[None, :]) / sigma) ** 2 - log_sigma - 0.5 * np.log(2 * np.pi)
    ll = ptnative.hmm_log_likelihood(log_em[:, None, :], np.log(A), np.log([0.5, 0.5])).sum()
    log_prior = -0.5 * (mu ** 2).sum() / 25 - 0.5 * log_sigma ** 2
    f = jaxify([mu, log_sigma], [ll + log_prior])
    return (lambda params: f(params["mu"], params["log_sigma"])[0]), mu_true, np.log(sigma_true)


def test_numpyro_nuts_on_a_jaxified_graph():
    """numpyro's NUTS differentiates the jaxified graph (through the native ops' custom_vjp) and recovers the truth."""
    pytest.importorskip("numpyro")
    from numpyro.infer import MCMC, NUTS

    log_density, mu_true, log_sigma_true = hmm_log_density()
    mcmc = MCMC(NUTS(potential_fn=lambda p: -log_density(p)), num_warmup=200, num_samples=200, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), init_params={"mu": np.array([-0.5, 0.5]), "log_sigma": np.array(0.0)},
             extra_fields=("diverging",))
    samples = mcmc.get_samples()
    assert int(mcmc.get_extra_fields()["diverging"].sum()) == 0
    np.testing.assert_allclose(np.asarray(samples["mu"]).mean(axis=0), mu_true, atol=0.25)
    assert abs(float(np.asarray(samples["log_sigma"]).mean()) - log_sigma_true) < 0.15


def test_blackjax_nuts_on_a_jaxified_graph():
    blackjax = pytest.importorskip("blackjax")

    log_density, mu_true, log_sigma_true = hmm_log_density()
    position = {"mu": jax.numpy.array([-0.5, 0.5]), "log_sigma": jax.numpy.array(0.0)}
    warmup = blackjax.window_adaptation(blackjax.nuts, log_density)
    (state, parameters), _ = warmup.run(jax.random.PRNGKey(1), position, num_steps=200)
    kernel = blackjax.nuts(log_density, **parameters).step

    def step(state, key):
        state, info = kernel(key, state)
        return state, (state.position, info.is_divergent)

    _, (positions, divergent) = jax.lax.scan(step, state, jax.random.split(jax.random.PRNGKey(2), 200))
    assert int(divergent.sum()) == 0
    np.testing.assert_allclose(np.asarray(positions["mu"]).mean(axis=0), mu_true, atol=0.25)
    assert abs(float(np.asarray(positions["log_sigma"]).mean()) - log_sigma_true) < 0.15


# ------------------------------------------------------------------- gradients of inputs other than the first
# The catalogue cases differentiate ctc, rnnt and the HMM w.r.t. their first input only: a backward pass that hands
# a gradient to the wrong input (the first, or its neighbour of the same shape) would pass them.  Here the
# differentiated inputs sit in other positions of the op and of the graph, alone and several at once, and JAX's
# gradients are compared with PyTensor's own (FAST_COMPILE).
HMM_NAMES = ["log_emissions", "log_transitions", "log_initial", "log_final"]
HMM_SUBSETS = [(1,), (2,), (3,), (2, 3), (1, 3), (0, 2), (1, 2, 3), (0, 1, 2, 3)]


def jax_grads_against_pytensor(inputs, values, cost, positions, what):
    want = pytensor.function(inputs, pytensor.grad(cost, [inputs[p] for p in positions]), mode=REFERENCE_MODE)(
        *values)
    f = jaxify(inputs, [cost])
    got = jax.jit(jax.grad(lambda *xs: f(*xs)[0], argnums=tuple(positions)))(*values)
    assert len(got) == len(positions)
    for g, w, p in zip(got, want, positions):
        assert np.abs(w).max() > 1e-3, f"{what}: d cost / d {inputs[p]} is too small to tell inputs apart"
        assert_close(g, w, "float64", f"{what}: d cost / d {inputs[p]}")


@pytest.mark.parametrize("varying", [False, True], ids=["shared", "varying"])
@pytest.mark.parametrize("positions", HMM_SUBSETS, ids=["-".join(HMM_NAMES[p] for p in s) for s in HMM_SUBSETS])
def test_hmm_gradients_of_inputs_after_the_first(positions, varying):
    """hmm_log_likelihood w.r.t. log_transitions, log_initial and log_final (op inputs 1-3), alone and together,
    with shared parameters (HmmLikelihoodWithGradOp) and with time-varying transitions and batched initial weights
    (HmmVaryingLikelihoodOp); log_initial and log_final have the same shape and different gradients."""
    rng = np.random.default_rng(20 + len(positions))
    T, B, K = 6, 3, 4
    le, lA, lpi, lf = hmm_data(rng, T, B, K, 2.0)
    lf = lf + rng.normal(size=K)
    if varying:
        lA = np.log(rng.dirichlet(np.ones(K), size=(T - 1, B, K)))
        lpi = np.log(rng.dirichlet(np.ones(K), size=B))
    values = [le, lA, lpi, lf]
    inputs = [pt.tensor(n, dtype="float64", shape=v.shape) for n, v in zip(HMM_NAMES, values)]
    mask = mask_of(np.array([6, 4, 1]), T)
    ll = ptnative.hmm_log_likelihood(*inputs, mask=mask)
    cost = (ll * np.array([1.0, -0.7, 2.5])).sum()
    jax_grads_against_pytensor(inputs, values, cost, positions, f"hmm ({'varying' if varying else 'shared'})")


@pytest.mark.parametrize("positions", [(1,), (2,), (1, 2), (0, 2)],
                         ids=lambda s: "-".join(HMM_NAMES[p] for p in s))
def test_hmm_posteriors_gradients_of_inputs_after_the_first(positions):
    """hmm_posteriors (marginals and counts, weighted) w.r.t. log_transitions and log_initial."""
    rng = np.random.default_rng(30)
    T, B, K = 5, 2, 3
    le, lA, lpi, lf = hmm_data(rng, T, B, K, 2.0)
    values = [le, lA, lpi]
    inputs = [pt.tensor(n, dtype="float64", shape=v.shape) for n, v in zip(HMM_NAMES, values)]
    gamma, xi = ptnative.hmm_posteriors(*inputs, lf, mask=mask_of(np.array([5, 3]), T))
    cost = (gamma * rng.normal(size=gamma.type.shape)).sum() + (xi * rng.normal(size=(B, K, K))).sum()
    jax_grads_against_pytensor(inputs, values, cost, positions, "hmm_posteriors")


def test_rnnt_and_ctc_gradients_in_other_graph_positions():
    """rnnt_loss and ctc_loss in one cost whose differentiated inputs are not the graph's first: rnnt's acts built
    from a per-class bias and logits (both differentiated), ctc's logits last, the HMM's log_initial between."""
    rng = np.random.default_rng(40)
    acts_v, labels, act_lens, label_lens = rnnt_data(3, 5, 3, 4, 0, 0, "float64", seed=3)
    T, B, D = 7, 3, 5
    le, lA, lpi, lf = hmm_data(rng, T, B, 3, 2.0)
    bias = pt.vector("bias", shape=(4,))
    acts = pt.tensor4("acts", shape=acts_v.shape)
    lpi_s = pt.vector("log_initial", shape=lpi.shape)
    logits = pt.tensor3("logits", shape=(T, B, D))
    inputs = [bias, acts, lpi_s, logits]
    values = [rng.normal(size=4), acts_v, lpi, rng.normal(size=(T, B, D))]
    rnnt = ptnative.rnnt_loss(acts * 0.5 + bias, labels, act_lens, label_lens, blank=0)
    ctc = ptnative.ctc_loss(logits, np.array([7, 5, 2], "int32"), np.array([[1, 2, 2], [3, 1, 0], [4, 0, 0]], "int32"),
                            np.array([3, 2, 1], "int32"), blank_index=0)
    hmm = ptnative.hmm_log_likelihood(le, lA, lpi_s, lf)
    cost = (rnnt * np.array([1.0, 2.0, -0.5])).sum() + (ctc * np.array([0.3, -1.0, 2.0])).sum() - 0.8 * hmm.sum()
    for positions in [(0, 1, 2, 3), (1, 3), (3,), (2,)]:
        jax_grads_against_pytensor(inputs, values, cost, positions, f"rnnt/ctc/hmm, argnums {positions}")
