"""ctc_loss cost + gradient on the CPU, one graph compiled several ways, timed in alternating turns: PyTensor's default
mode (Numba), ``mode="JAX"``, ``jax.jit`` of the same graph made a JAX function (``jax_funcify``, no PyTensor at call
time), and ``jax.jit(jax.value_and_grad(...))`` of the cost alone (the op's ``custom_vjp``).  Then where JAX mode's
time goes: the bare kernel (ctypes call of the op's entry point is what the default mode runs), PyTensor's JAX
function on a graph without native ops (its per-call cost), and ``jax.vmap`` over problems: folded into the op's
batch axis (one FFI call) against one call per element.

``python bench/jax_modes.py [--quick]``; milliseconds, median of the timed calls, and the median process CPU time
per call (all threads).  The CPU kernels split their work over threads; on a machine whose cores are busy with other
jobs, run with ``PTNATIVE_NUM_THREADS=1`` to compare the modes rather than the scheduler (see docs/scaling.md)."""

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
from ptnative.backends import jax as jax_backend  # noqa: E402


def jaxify(inputs, outputs):
    fgraph = FunctionGraph(inputs, outputs, clone=True)
    get_mode("JAX").optimizer.rewrite(fgraph)
    return jax_funcify(fgraph)


def ctc_case(T, B, D, N, dtype, rng):
    logits = pt.tensor3("logits", shape=(T, B, D), dtype=dtype)
    lens = rng.integers(T // 2, T + 1, size=B).astype("int32")
    targets = rng.integers(1, D, size=(B, N)).astype("int32")
    tlens = np.minimum(rng.integers(1, N + 1, size=B), lens // 2).astype("int32")
    cost = ptnative.ctc_loss(logits, lens, targets, tlens, blank_index=0).sum()
    return logits, cost, rng.normal(size=(T, B, D)).astype(dtype)


def graph_rows(logits, cost, x, reps):
    (grad,) = pytensor.grad(cost, [logits])
    default = pytensor.function([logits], [cost, grad])
    jax_mode = pytensor.function([logits], [cost, grad], mode="JAX")
    graph = jax.jit(jaxify([logits], [cost, grad]))
    f_cost = jaxify([logits], [cost])
    vg = jax.jit(jax.value_and_grad(lambda v: f_cost(v)[0]))
    on_device = jax.device_put(x)
    want = default(x)
    for name, got in (("JAX mode", jax_mode(x)), ("jit", graph(x)), ("value_and_grad", vg(x))):
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4 if x.dtype == np.float32 else 1e-10,
                                       atol=1e-5, err_msg=name)
    fns = {
        "default mode (Numba), pytensor.grad": lambda: default(x),
        'mode="JAX", pytensor.grad': lambda: jax.block_until_ready(jax_mode(x)),
        "jax.jit(jax_funcify(graph))": lambda: jax.block_until_ready(graph(x)),
        "the same, input already a JAX array": lambda: jax.block_until_ready(graph(on_device)),
        "jax.jit(jax.value_and_grad(cost))": lambda: jax.block_until_ready(vg(x)),
    }
    return measure_interleaved(fns, reps=reps)


def overhead_rows(T, B, D, dtype, reps):
    """PyTensor's JAX function on a graph of one cheap elementwise op of the same size, against the default mode
    and ``jax.jit``: what each mode costs per call apart from the kernel."""
    x = pt.tensor3("x", shape=(T, B, D), dtype=dtype)
    y = (x * 2).sum()
    v = np.ones((T, B, D), dtype)
    default = pytensor.function([x], [y, x * 2])
    jax_mode = pytensor.function([x], [y, x * 2], mode="JAX")
    jitted = jax.jit(lambda a: (jax.numpy.sum(a * 2), a * 2))
    return measure_interleaved({"default mode": lambda: default(v),
                                'mode="JAX"': lambda: jax.block_until_ready(jax_mode(v)),
                                "jax.jit": lambda: jax.block_until_ready(jitted(v))}, reps=reps)


def vmap_rows(T, B, D, N, M, dtype, rng, reps):
    """M ctc problems of B sequences each: ``jax.vmap`` folded into the op's batch axis (one call over M*B
    sequences) against one FFI call per element (the fallback, forced)."""
    logits = pt.tensor3("logits", shape=(T, B, D), dtype=dtype)
    lens, tg, tl = pt.ivector("lens"), pt.imatrix("targets"), pt.ivector("tlens")
    loss = ptnative.ctc_loss(logits, lens, tg, tl, blank_index=0)
    f = jaxify([logits, lens, tg, tl], [loss.sum()])
    g = jax.value_and_grad(lambda *a: f(*a)[0])
    args = (rng.normal(size=(M, T, B, D)).astype(dtype), np.full((M, B), T, "int32"),
            rng.integers(1, D, size=(M, B, N)).astype("int32"), np.full((M, B), N, "int32"))
    folded = jax.jit(jax.vmap(g))
    real = jax_backend.fold_vmap
    jax_backend.fold_vmap = lambda call, *_: call  # the sequential fallback, for comparison (new functions only)
    try:
        f_seq = jaxify([logits, lens, tg, tl], [loss.sum()])
        sequential = jax.jit(jax.vmap(jax.value_and_grad(lambda *a: f_seq(*a)[0])))
        sequential(*args)
    finally:
        jax_backend.fold_vmap = real
    a, b = folded(*args), sequential(*args)
    np.testing.assert_allclose(np.asarray(a[1]), np.asarray(b[1]), rtol=1e-5, atol=1e-6)
    return measure_interleaved({f"vmap folded (one call, {M}*{B} sequences)": lambda: jax.block_until_ready(
                                    folded(*args)),
                                f"vmap sequential ({M} calls)": lambda: jax.block_until_ready(sequential(*args))},
                               reps=reps)


def show(title, timings, base_name):
    base = timings[base_name].median
    print(f"\n{title}")
    for name, t in timings.items():
        print(f"  {name:42s} {t.median * 1e3:9.3f} ms  ({t.median / base:5.2f}x)  cpu {t.cpu * 1e3:8.3f} ms")
        record("jax_modes", title, name, t.median, ours=True, best=t.best, cpu=t.cpu)


def main():
    opts = quick_options(__doc__)
    rng = np.random.default_rng(0)
    reps = 9 if opts.quick else 60
    sizes = [(20, 2, 5, 3)] if opts.quick else [(50, 4, 20, 10), (100, 16, 30, 20), (200, 32, 50, 40)]
    for dtype in ("float32", "float64"):
        for T, B, D, N in sizes:
            logits, cost, x = ctc_case(T, B, D, N, dtype, rng)
            show(f"ctc_loss cost + gradient T={T} B={B} D={D} N={N} {dtype}", graph_rows(logits, cost, x, reps),
                 "default mode (Numba), pytensor.grad")
    T, B, D = sizes[-1][:3]
    show(f"per-call cost of the mode: (2x).sum() and 2x, ({T}, {B}, {D}) float32",
         overhead_rows(T, B, D, "float32", reps), "default mode")
    T, B, D, N = (20, 2, 5, 3) if opts.quick else (100, 4, 30, 20)
    M = 4 if opts.quick else 16
    show(f"jax.vmap of ctc_loss value_and_grad over {M} problems, T={T} B={B} D={D} N={N} float32",
         vmap_rows(T, B, D, N, M, "float32", rng, reps), f"vmap folded (one call, {M}*{B} sequences)")


if __name__ == "__main__":
    main()
