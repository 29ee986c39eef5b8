"""The rewrite of the seed's graph, ``X = dot(x, W_in) + b`` feeding NativeLstm2, into NativeLstm2Layer
(``ptnative/ops/_lstm_rewrites.py``): the rewritten function's values and gradients equal those of the same graph
compiled without the rewrite, and it fires exactly where the graph matches."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import get_mode

from ptnative import NativeOp
from ptnative.ops import NativeLstm2
from ptnative.ops._lstm_rewrites import REWRITE_NAME

from .conftest import tol

N_IN, N = 3, 2
#: (T, B) of the values each function is called with: ragged, then empty time, then empty batch.
SHAPES = [(6, 5), (0, 3), (4, 0)]
#: (start, step) pairs: forward, backward, and strides that leave frames unvisited.
FRAMES = [(0, 1), (0, -1), (1, 2), (1, -3)]
LAYER, LAYER_GRAD = "NativeLstm2Layer", "GradOfNativeLstm2Layer"
VALUE, VALUE_GRAD = "NativeLstm2", "GradOfNativeLstm2"


def symbols(dtype):
    x, W_in, W, b = (pt.tensor3("x", dtype=dtype), pt.matrix("W_in", dtype=dtype), pt.matrix("W", dtype=dtype),
                     pt.vector("b", dtype=dtype))
    y0, c0, i = pt.matrix("y0", dtype=dtype), pt.matrix("c0", dtype=dtype), pt.matrix("i", dtype=dtype)
    start, step = pt.scalar("start", dtype="int32"), pt.scalar("step", dtype="int32")
    return x, W_in, W, b, y0, c0, i, start, step


def projection(form, x, W_in, b):
    """X in one of the forms the rewrite recognises."""
    return {"dot+b": lambda: pt.dot(x, W_in) + b, "b+dot": lambda: b + pt.dot(x, W_in), "dot": lambda: pt.dot(x, W_in),
            "matmul+b": lambda: pt.matmul(x, W_in) + b, "x.dot+b": lambda: x.dot(W_in) + b}[form]()


def cost(Y, C, d):
    """Reaches every cotangent of NativeLstm2, one of them through Y itself."""
    return (Y ** 2).sum() + 0.3 * C.sum() + (d * d).sum()


def seed_graph(dtype, form="dot+b", wrt=("x", "W_in", "W", "b", "y0", "c0")):
    """(inputs, outputs): Y, C, d of NativeLstm2 on ``projection(form)``, then ``cost``'s gradients w.r.t. ``wrt``."""
    inputs = symbols(dtype)
    x, W_in, W, b, y0, c0, i, start, step = inputs
    Y, C, H, d = NativeLstm2.make_op()(projection(form, x, W_in, b), W, y0, c0, i, start, step)
    named = dict(zip(("x", "W_in", "W", "b", "y0", "c0"), inputs))
    grads = pytensor.grad(cost(Y, C, d), [named[k] for k in wrt], disconnected_inputs="ignore") if wrt else []
    return list(inputs), [Y, C, d, *grads]


def values(T, B, dtype, start, step, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, T + 1, size=B)
    if B:
        lengths[0] = T
    mask = (np.arange(T)[:, None] < lengths[None, :]).astype(dtype)
    if T > 2 and B > 1:
        mask[1, 1] = 0  # a hole inside a sequence
    arrays = [rng.normal(size=(T, B, N_IN)), rng.normal(size=(N_IN, 4 * N)) * 0.5, rng.normal(size=(N, 4 * N)) * 0.4,
              rng.normal(size=4 * N), rng.normal(size=(B, N)), rng.normal(size=(B, N))]
    return [a.astype(dtype) for a in arrays] + [mask, np.int32(start), np.int32(step)]


def compile_both(inputs, outputs, mode):
    """The function rewritten (as PyTensor compiles it) and with the rewrite excluded.  Without a BLAS library for
    PyTensor's C code the pure C linker cannot run the unrewritten graph's ``Dot22`` (NotImplementedError): there the
    reference is compiled in CVM mode, the same kernels with C code where PyTensor has it."""
    on = pytensor.function(inputs, outputs, mode=get_mode(mode), on_unused_input="ignore")
    reference = "CVM" if mode == "C" and not pytensor.config.blas__ldflags else mode
    off = pytensor.function(inputs, outputs, mode=get_mode(reference).excluding(REWRITE_NAME), on_unused_input="ignore")
    return on, off


def native_ops(f):
    """The names of the native ops in the compiled function's graph."""
    return sorted(n.op.name for n in f.maker.fgraph.apply_nodes if isinstance(n.op, NativeOp))


def assert_same(on, off, dtype, shapes=SHAPES, frames=FRAMES):
    rtol, atol = tol(dtype)
    for T, B in shapes:
        for start, step in frames:
            if T == 0 and start:
                continue  # start must lie in [0, T) when T > 0; T = 0 takes start 0
            args = values(T, B, dtype, min(start, max(T - 1, 0)), step)
            for k, (a, b) in enumerate(zip(on(*args), off(*args))):
                assert a.shape == b.shape and a.dtype == b.dtype
                np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}, T={T} B={B} {start, step}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rewritten_values_and_gradients_equal_the_graphs(mode, dtype):
    on, off = compile_both(*seed_graph(dtype), mode)
    assert native_ops(on) == sorted([LAYER, LAYER_GRAD])
    assert native_ops(off) == sorted([VALUE, VALUE_GRAD])
    assert_same(on, off, dtype)


@pytest.mark.parametrize("form", ["b+dot", "dot", "matmul+b", "x.dot+b"])
def test_every_form_of_the_projection(form):
    on, off = compile_both(*seed_graph("float64", form), None)
    assert native_ops(on) == sorted([LAYER, LAYER_GRAD])
    assert_same(on, off, "float64", shapes=SHAPES[:1])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_forward_alone(mode, dtype):
    on, off = compile_both(*seed_graph(dtype, wrt=()), mode)
    assert native_ops(on) == sorted([LAYER])
    assert_same(on, off, dtype)


@pytest.mark.parametrize("wrt, backward", [(("W_in", "W", "b"), True), (("W_in",), True), (("x", "W"), False),
                                           (("b", "W"), False), (("W", "y0"), False)])
def test_some_of_the_gradients(wrt, backward):
    """The layer's gradient computes x's and W_in's gradients whatever is asked: it replaces the gradient graph only
    where W_in's gradient is asked for (x's alone or b's alone cost less as PyTensor computes them from NativeLstm2's
    DX).  The forward is the layer in every case; NativeLstm2's gradient reads the layer's gates."""
    on, off = compile_both(*seed_graph("float64", wrt=wrt), None)
    assert native_ops(on) == sorted([LAYER, LAYER_GRAD if backward else VALUE_GRAD])
    assert_same(on, off, "float64", shapes=SHAPES[:2])


def test_x_used_elsewhere_too():
    """x also feeds the cost directly: its gradient is a sum, one term of which the layer computes."""
    inputs, _ = seed_graph("float64", wrt=())
    x, W_in, W, b, y0, c0, i, start, step = inputs
    Y, C, H, d = NativeLstm2.make_op()(pt.dot(x, W_in) + b, W, y0, c0, i, start, step)
    grads = pytensor.grad(cost(Y, C, d) + (x ** 3).sum(), [x, W_in, b])
    on, off = compile_both(inputs, [Y, *grads], None)
    assert native_ops(on) == sorted([LAYER, LAYER_GRAD])
    assert_same(on, off, "float64", shapes=SHAPES[:1])


def test_static_shapes():
    """Shapes known when the graph is built (PyTensor's products and gradients take other forms then)."""
    T, B = 6, 5
    x, W_in, W, b = (pt.tensor3("x", shape=(T, B, N_IN)), pt.matrix("W_in", shape=(N_IN, 4 * N)),
                     pt.matrix("W", shape=(N, 4 * N)), pt.vector("b", shape=(4 * N,)))
    y0, c0, i = pt.matrix("y0", shape=(B, N)), pt.matrix("c0", shape=(B, N)), pt.matrix("i", shape=(T, B))
    start, step = pt.scalar("start", dtype="int32"), pt.scalar("step", dtype="int32")
    Y, C, H, d = NativeLstm2.make_op()(pt.dot(x, W_in) + b, W, y0, c0, i, start, step)
    outputs = [Y, C, d, *pytensor.grad(cost(Y, C, d), [x, W_in, W, b, y0, c0])]
    on, off = compile_both([x, W_in, W, b, y0, c0, i, start, step], outputs, None)
    assert native_ops(on) == sorted([LAYER, LAYER_GRAD])
    assert_same(on, off, "float64", shapes=[(T, B)])


def test_x_as_a_transposed_view():
    """x given batch-major and transposed in the graph: the layer gets the strided view."""
    inputs = list(symbols("float64"))
    x_bt = pt.tensor3("x_bt")
    x, W_in, W, b, y0, c0, i, start, step = inputs
    Y, C, H, d = NativeLstm2.make_op()(pt.dot(x_bt.dimshuffle(1, 0, 2), W_in) + b, W, y0, c0, i, start, step)
    graph_inputs = [x_bt, *inputs[1:]]
    on, off = compile_both(graph_inputs, [Y, *pytensor.grad(cost(Y, C, d), [x_bt, W_in, W, b])], None)
    assert native_ops(on) == sorted([LAYER, LAYER_GRAD])
    args = values(6, 5, "float64", 0, 1)
    args[0] = np.ascontiguousarray(args[0].transpose(1, 0, 2))
    for a, b_ in zip(on(*args), off(*args)):
        np.testing.assert_allclose(a, b_, rtol=1e-10, atol=1e-12)


def test_jax_mode_runs_the_rewritten_graph():
    """In JAX mode the unrewritten seed graph does not trace (PyTensor's reshapes of DX to shapes known at run time
    only); the rewritten one runs, and gives the default mode's unrewritten values."""
    pytest.importorskip("jax")
    import pytensor.link.jax.dispatch  # noqa: F401  (registers the JAX backend)

    graph = seed_graph("float64")
    on = pytensor.function(*graph, mode="JAX")
    off = pytensor.function(*graph, mode=get_mode(None).excluding(REWRITE_NAME))
    assert native_ops(on) == sorted([LAYER, LAYER_GRAD])
    for start, step in FRAMES:
        args = values(6, 5, "float64", start, step)
        for a, b_ in zip(on(*args), off(*args)):
            np.testing.assert_allclose(np.asarray(a), b_, rtol=1e-10, atol=1e-12)


def test_stacked_and_bidirectional_layers():
    """Two directions over the same x (their reshapes of x merged), then a second layer over their outputs: every
    NativeLstm2 becomes a layer, every gradient a layer gradient."""
    inputs = list(symbols("float64"))
    x, W_in, W, b, y0, c0, i, start, step = inputs
    W_in2, W2, b2 = pt.matrix("W_in2"), pt.matrix("W2"), pt.vector("b2")
    op = NativeLstm2.make_op()
    fwd = op(pt.dot(x, W_in) + b, W, y0, c0, i, np.int32(0), np.int32(1))
    bwd = op(pt.dot(x, W_in2) + b2, W2, y0, c0, i, np.int32(0), np.int32(-1))
    h = pt.concatenate([fwd[0], bwd[0]], axis=2)  # (T, B, 2n)
    W_in3, W3, b3 = pt.matrix("W_in3"), pt.matrix("W3"), pt.vector("b3")
    top = op(b3 + pt.dot(h, W_in3), W3, y0, c0, i, start, step)
    wrt = [x, W_in, W, b, W_in2, W2, b2, W_in3, W3, b3, y0, c0]
    outputs = [top[0], *pytensor.grad(cost(top[0], top[1], top[3]) + (fwd[3] ** 2).sum(), wrt)]
    on, off = compile_both([*inputs, W_in2, W2, b2, W_in3, W3, b3], outputs, None)
    assert native_ops(on) == sorted([LAYER, LAYER_GRAD] * 3)
    rng = np.random.default_rng(3)
    more = [rng.normal(size=(N_IN, 4 * N)) * 0.5, rng.normal(size=(N, 4 * N)) * 0.4, rng.normal(size=4 * N),
            rng.normal(size=(2 * N, 4 * N)) * 0.5, rng.normal(size=(N, 4 * N)) * 0.4, rng.normal(size=4 * N)]
    for T, B in SHAPES:
        args = values(T, B, "float64", 0, 1) + more
        for k, (a, b_) in enumerate(zip(on(*args), off(*args))):
            np.testing.assert_allclose(a, b_, rtol=1e-10, atol=1e-12, err_msg=f"output {k}, T={T} B={B}")


def test_two_gradient_nodes_keep_theirs():
    """Two gradients of different costs (two gradient nodes on one NativeLstm2): the forward becomes the layer, and
    both gradient nodes stay, reading its gates."""
    inputs, _ = seed_graph("float64", wrt=())
    x, W_in, W, b, y0, c0, i, start, step = inputs
    Y, C, H, d = NativeLstm2.make_op()(pt.dot(x, W_in) + b, W, y0, c0, i, start, step)
    outputs = [*pytensor.grad(cost(Y, C, d), [x, W_in, b]), *pytensor.grad((Y * Y * Y).sum(), [W_in, W])]
    on, off = compile_both(inputs, outputs, None)
    assert native_ops(on) == sorted([LAYER, VALUE_GRAD, VALUE_GRAD])
    assert_same(on, off, "float64", shapes=SHAPES[:1])


# ---------------------------------------------------------------------- where it must not fire
def graph_with(X_of, dtype="float64", extra_outputs=lambda X, outs: []):
    inputs = list(symbols(dtype))
    x, W_in, W, b, y0, c0, i, start, step = inputs
    X, more = X_of(x, W_in, b, inputs)
    outs = NativeLstm2.make_op()(X, W, y0, c0, i, start, step)
    grads = pytensor.grad(cost(outs[0], outs[1], outs[3]), [x, W_in, W, b], disconnected_inputs="ignore")
    return inputs + more, [outs[0], *grads, *extra_outputs(X, outs)]


def test_no_rewrite_when_X_has_another_client():
    on, _ = compile_both(*graph_with(lambda x, W_in, b, _: (pt.dot(x, W_in) + b, []),
                                     extra_outputs=lambda X, outs: [X]), None)
    assert native_ops(on) == sorted([VALUE, VALUE_GRAD])


def test_no_rewrite_when_H_is_used():
    on, _ = compile_both(*graph_with(lambda x, W_in, b, _: (pt.dot(x, W_in) + b, []),
                                     extra_outputs=lambda X, outs: [outs[2]]), None)
    assert native_ops(on) == sorted([VALUE, VALUE_GRAD])


def test_no_rewrite_when_the_bias_varies_over_batch():
    b2 = pt.matrix("b2")  # (B, 4n): broadcast over time only
    on, off = compile_both(*graph_with(lambda x, W_in, b, _: (pt.dot(x, W_in) + b2, [b2])), None)
    assert native_ops(on) == sorted([VALUE, VALUE_GRAD])


def test_no_rewrite_when_the_bias_varies_over_time():
    b3 = pt.tensor3("b3", shape=(None, 1, None))  # (T, 1, 4n)
    on, _ = compile_both(*graph_with(lambda x, W_in, b, _: (pt.dot(x, W_in) + b3, [b3])), None)
    assert native_ops(on) == sorted([VALUE, VALUE_GRAD])


def test_no_rewrite_when_W_in_is_not_one_matrix():
    Wt = pt.tensor3("Wt")  # (T, n_in, 4n): a matrix per frame
    on, _ = compile_both(*graph_with(lambda x, W_in, b, _: (pt.matmul(x, Wt) + b, [Wt])), None)
    assert native_ops(on) == sorted([VALUE, VALUE_GRAD])


def test_no_rewrite_when_the_projection_is_scaled():
    on, _ = compile_both(*graph_with(lambda x, W_in, b, _: (2 * pt.dot(x, W_in) + b, [])), None)
    assert native_ops(on) == sorted([VALUE, VALUE_GRAD])


def test_nan_on_padded_frames_reaches_nothing(mode):
    """As NativeLstm2Layer: a padded frame's x (NaN included) reaches no output and no gradient, where the
    unrewritten graph's ``x^T . DX`` makes W_in's gradient NaN (NaN * 0)."""
    on = pytensor.function(*seed_graph("float64"), mode=get_mode(mode))
    args = values(6, 5, "float64", 0, 1)
    mask = args[6]
    assert (mask == 0).any()
    poisoned = [a.copy() for a in args]
    poisoned[0][mask == 0] = np.nan
    clean = [a.copy() for a in args]
    clean[0][mask == 0] = 0
    for a, b in zip(on(*poisoned), on(*clean)):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)
