"""GPU benchmark: ptnative's CUDA kernels against torch / cuDNN / torchaudio on the same device, in one run.

    python bench/gpu.py [--quick] [--device cuda|cpu] [--reps N]

Every row is forward + backward in float32: median and min wall time of ``--reps`` calls after a warm-up, with
the device synchronised inside each timed call (``jax.block_until_ready``, ``torch.cuda.synchronize``; host-array
mode returns numpy arrays, so it is synchronous).  "x torch" is the row's median over the peer's median (< 1:
ptnative is faster).  Modes:

* JAX mode: ``pytensor.function(..., mode="JAX")`` with device-resident inputs (``jax.device_put``,
  ``f.trust_input = True``): the native ops run as XLA FFI calls on the GPU, no host round trip.
* host-array mode: the default mode (Numba) with ``ptnative.config.device = "cuda"``: numpy in, numpy out; each
  native op copies its inputs to the GPU and its outputs back, and the PyTensor ops around it run on the CPU.

Groups:

1. LSTM, T=500, B=64, n_in = n = 1024, loss = sum(Y), gradients w.r.t. all inputs and weights:
   * ``ptnative.lstm`` layer in JAX mode: input projection ``x . W_in + b`` (an XLA GEMM) + NativeLstm2;
   * NativeLstm2 alone (X = the input projections given directly, gradients w.r.t. X and W), JAX mode and
     host-array mode;
   * ``torch.nn.LSTM`` (cuDNN, the same layer with the same weights: the losses are compared), with TF32
     allowed (torch's default for cuDNN) and in strict float32.  ptnative's float32 GEMMs use TF32 as torch's
     cuDNN path does (``ptnative.config.allow_tf32``, default on; NativeLstm2 alone is also timed with it off);
     XLA's GEMM of the input projection uses its default precision (TF32 on the GPU).
2. ``ptnative.ctc_loss`` (log-softmax + CTC, reduction sum, blank = last class) against
   ``torch.nn.functional.ctc_loss(log_softmax(x))``: the shape of bench/ctc.py (T=200, B=16, D=50, N=40) and
   T=500, B=64, D=1000, N=100.
3. ``ptnative.rnnt_loss`` (blank 0, reduction sum, full lengths) against ``torchaudio.functional.rnnt_loss``: the
   shape of bench/rnnt.py (B=8, T=150, U=40, V=128) in both modes, and B=32, T=500, U=100, V=1024 (6.6 GB of
   logits) in JAX mode only, with data drawn on the device by each framework (no value comparison there).

A row that fails prints its error and the run goes on; the exit status is 1 if any row failed.  Without a GPU
(and ``--device cuda``) it prints a note and exits 0.  ``--quick`` shrinks every shape, to smoke-test the code
paths, e.g. on the CPU: ``python bench/gpu.py --quick --device cpu`` (JAX and torch on the CPU then).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

ARGS = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ARGS.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
ARGS.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test of the code paths")
ARGS.add_argument("--reps", type=int, default=None, help="timed calls per row (default 10, 3 with --quick)")
opts = ARGS.parse_args()

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch and ptnative
if opts.device == "cpu":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # bench/timing.py; the checkout's ptnative

import numpy as np  # noqa: E402

from timing import measure, record  # noqa: E402

REPS = opts.reps or (3 if opts.quick else 10)
WARMUP = 1 if opts.quick else 2
FAILED: list[str] = []
#: per group (title, work label): [(row name, median s or None)], for the summary table of docs/gpu.md
SUMMARY: list[tuple[str, str, list]] = []
COPIES = "numpy in/out: host-device copies included" if opts.device == "cuda" else ""

if opts.quick:
    LSTM_SHAPE = dict(T=12, B=3, n=16)
    CTC_SHAPES = [dict(T=30, B=3, D=12, N=6), dict(T=40, B=4, D=20, N=10)]
    RNNT_SHAPE, RNNT_BIG = dict(B=2, T=10, U=4, V=12), dict(B=2, T=16, U=6, V=20)
else:
    LSTM_SHAPE = dict(T=500, B=64, n=1024)
    CTC_SHAPES = [dict(T=200, B=16, D=50, N=40), dict(T=500, B=64, D=1000, N=100)]
    RNNT_SHAPE, RNNT_BIG = dict(B=8, T=150, U=40, V=128), dict(B=32, T=500, U=100, V=1024)


def shape_str(shape):
    return " ".join(f"{k}={v}" for k, v in shape.items())


# ------------------------------------------------------------------ reporting
class Group:
    """Prints one table; rows are printed as they complete, so a stage killed by a timeout still shows them."""

    def __init__(self, title, work=""):
        self.ref = None
        self.title = title
        self.rows = []
        SUMMARY.append((title, work or title, self.rows))
        print(f"\n{title}")
        print(f"  {'implementation':<58} {'median ms':>10} {'min ms':>9} {'x torch':>8}  note")

    def row(self, name, fn, *, reference=False, note=""):
        """Time ``fn`` (a synchronising call); print a row; return ``fn``'s last result, or None on failure."""
        try:
            t = measure(fn, REPS, WARMUP)
        except Exception as e:  # one failure must not stop the others
            FAILED.append(name)
            msg = " ".join(f"{type(e).__name__}: {e}".split())
            print(f"  {name:<58} {'FAILED':>10}  {msg[:400]}")
            if os.environ.get("PTNATIVE_BENCH_TRACEBACK"):
                traceback.print_exc()
            return None
        if reference:
            self.ref = t.median
        self.rows.append((name, t.median, reference))
        ratio = f"{t.median / self.ref:8.2f}" if self.ref and not reference else f"{'1.00' if reference else '-':>8}"
        print(f"  {name:<58} {t.median * 1e3:10.2f} {t.best * 1e3:9.2f} {ratio}  {note}", flush=True)
        record("gpu", self.title, name, t.median, ours=not name.startswith("torch"), best=t.best, note=note or None)
        return t.result

    def skip(self, name, why):
        self.rows.append((name, None, False))
        print(f"  {name:<58} {'skipped':>10}  {why}", flush=True)
        record("gpu", self.title, name, None, ours=not name.startswith("torch"), note=f"skipped: {why}")


def summary_table():
    """The table of docs/gpu.md ("Measured on ..."): per work, the peers' medians, then ptnative's in JAX mode and
    in host-array mode, in ms, each with its ratio to the first peer's (below 1: faster than the peer)."""
    lines = ["| work | peer | ptnative, JAX mode | ptnative, host arrays |", "|---|---|---|---|"]
    for _, work, rows in SUMMARY:
        ref = next((m for _, m, is_ref in rows if is_ref and m), None)
        def cell(kind):
            out = []
            for name, m, is_ref in rows:
                is_jax, is_host = "JAX mode" in name, "host-array" in name
                if (kind == "peer") != (not is_jax and not is_host) or (kind == "jax" and not is_jax) or \
                        (kind == "host" and not is_host):
                    continue
                label = name.split(",")[0] if kind != "peer" else name
                if m is None:
                    out.append(f"{label} not run")
                elif kind == "peer" or is_ref or not ref:
                    out.append(f"{label} {m * 1e3:.3g}")
                else:
                    out.append(f"{label} {m * 1e3:.3g} ({m / ref:.2f})")
            return "; ".join(out) or "-"
        lines.append(f"| {work} | {cell('peer')} | {cell('jax')} | {cell('host')} |")
    return "\n".join(lines)


def guarded(name, make):
    """``make()`` (data and function set-up), or None with the error printed and recorded."""
    try:
        return make()
    except Exception as e:
        FAILED.append(name)
        msg = " ".join(f"{type(e).__name__}: {e}".split())
        print(f"  {name:<58} {'FAILED':>10}  (set-up) {msg[:400]}", flush=True)
        if os.environ.get("PTNATIVE_BENCH_TRACEBACK"):
            traceback.print_exc()
        return None


def torch_peer(g, torch, why_not, name, make):
    """The torch row's timed call, ``make(device)``, set up under ``guarded``; None where that failed, or where
    ``torch`` is None (the row ``name`` is then skipped for ``why_not``)."""
    if torch is None:
        g.skip(name, why_not)
        return None
    return guarded(name, lambda: make(torch.device(opts.device)))


def jax_fn(jax, graph, make_inputs):
    """A JAX-mode function of ``graph = (inputs, outputs)`` on the device arrays ``make_inputs()``, waiting for
    its results."""
    import pytensor

    f = pytensor.function(*graph, mode="JAX")
    f.trust_input = True
    args = make_inputs()
    return lambda: jax.block_until_ready(f(*args))


def print_agreement(out, ref, peer, suffix=""):
    """One line with the relative difference of a loss from the peer's, when both are there."""
    if out is not None and ref is not None:
        print(f"  {'':<58} |loss - {peer}| / |loss| = {abs(float(out[0]) - ref) / abs(ref):.2e}{suffix}")


def rel_diff(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


# ------------------------------------------------------------------ frameworks
def load_torch():
    try:
        import torch
    except ImportError as e:
        return None, f"torch not installed ({e})"
    if opts.device == "cuda" and not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    return torch, f"torch {torch.__version__}"


def load_jax():
    try:
        import jax
    except ImportError as e:
        return None, f"jax not installed ({e})"
    backend = jax.default_backend()
    if (backend == "gpu") != (opts.device == "cuda"):
        return None, f"JAX's default backend is {backend!r}, not the benchmark's device {opts.device!r}"
    return jax, f"jax {jax.__version__} on {jax.devices()[0]}"


def torch_sync(torch):
    if opts.device == "cuda":
        torch.cuda.synchronize()


def torch_backward_call(torch, x, loss_fn, model=None):
    """A timed torch call: ``loss_fn(x)`` and its backward pass (gradients cleared first), synchronised."""
    def run():
        if model is not None:
            model.zero_grad(set_to_none=True)
        x.grad = None
        loss = loss_fn(x)
        loss.backward()
        torch_sync(torch)
        return loss
    return run


def native_ops(outputs):
    """(op, float dtype) of every NativeOp in the graph of ``outputs`` (forward and gradient ops)."""
    from ptnative.op import NativeOp

    seen, found, stack = set(), {}, list(outputs)
    while stack:
        node = stack.pop().owner
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node.op, NativeOp):
            found[(node.op.name, node.op.float_dtype_of(node))] = (node.op, node.op.float_dtype_of(node))
        stack.extend(node.inputs)
    return list(found.values())


def device_work(graph, run):
    """With ``PTNATIVE_COUNT_DEVICE_WORK=1`` (scripts/gpu_check.sh sets it) on a GPU: prints what one call of ``run``
    did on the device, summed over the libraries of the native ops of ``graph = (inputs, outputs)``
    (``ptnative.build.device_counts``): launches, allocations, bytes copied in and out."""
    if opts.device != "cuda" or os.environ.get("PTNATIVE_COUNT_DEVICE_WORK") != "1":
        return
    try:
        from ptnative.build import device_counts

        variants = [op.variant(d, device="cuda") for op, d in native_ops(graph[1])]
        for v in variants:
            device_counts(v, reset=True)
        run()
        total = {k: sum(device_counts(v)[k] for v in variants) for k in ("launches", "allocs", "h2d", "d2h")}
        print(f"  {'':<58} device work per call: {total['launches']} launches, {total['allocs']} allocations, "
              f"{total['h2d'] / 1e6:.3g} MB in, {total['d2h'] / 1e6:.3g} MB out", flush=True)
    except Exception as e:
        print(f"  {'':<58} device work not counted: {type(e).__name__}: {str(e)[:200]}", flush=True)


def prebuild(graphs, jax):
    """Compile, all at once in threads, the libraries the functions below will load one after the other: the
    op variants (``python -m ptnative build`` may have built them) and JAX mode's FFI handler."""
    from concurrent.futures import ThreadPoolExecutor

    from ptnative.build import build
    from ptnative.backends.ffi_source import handler_variant

    variants = []
    for op, dtype in {(op.name, d): (op, d) for outs in graphs for op, d in native_ops(outs)}.values():
        variants.append(op.variant(dtype, device=opts.device))
    if jax is not None:
        variants.append(handler_variant(opts.device, jax.ffi.include_dir()))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        errors = [f for f in [pool.submit(build, v) for v in variants] if f.exception() is not None]
    for f in errors:
        print(f"  prebuild: {type(f.exception()).__name__}: {str(f.exception())[:300]}")
    print(f"{len(variants) - len(errors)} of {len(variants)} kernel libraries ready ({time.perf_counter() - t0:.1f} s)")


# ------------------------------------------------------------------ LSTM
def lstm_graphs(T, B, n):
    """Inputs have static shapes: under JAX, ``lstm``'s reshape of x needs T * B as a constant."""
    import pytensor
    import pytensor.tensor as pt

    from ptnative.ops.lstm import NativeLstm2, lstm

    f32 = "float32"
    x, W_in = pt.tensor3("x", dtype=f32, shape=(T, B, n)), pt.matrix("W_in", dtype=f32, shape=(n, 4 * n))
    W_rec, b = pt.matrix("W_rec", dtype=f32, shape=(n, 4 * n)), pt.vector("b", dtype=f32, shape=(4 * n,))
    Y = lstm(x, W_in, W_rec, b)[0]
    layer = ([x, W_in, W_rec, b], [Y.sum(), *pytensor.grad(Y.sum(), [x, W_in, W_rec, b])])
    X, W = pt.tensor3("X", dtype=f32, shape=(T, B, 4 * n)), W_rec
    zeros = pt.zeros((B, n), dtype=f32)
    Y2 = NativeLstm2.make_op()(X, W, zeros, zeros, pt.ones((T, B), dtype=f32),
                               pt.constant(np.int32(0)), pt.constant(np.int32(1)))[0]
    core = ([X, W], [Y2.sum(), *pytensor.grad(Y2.sum(), [X, W])])
    return layer, core


def lstm_data(T, B, n):
    rng = np.random.default_rng(0)
    f = lambda *s, scale=1.0: (rng.standard_normal(size=s, dtype=np.float32) * np.float32(scale))  # noqa: E731
    return dict(x=f(T, B, n), W_in=f(n, 4 * n, scale=n ** -0.5), W_rec=f(n, 4 * n, scale=n ** -0.5),
                b=f(4 * n, scale=0.1), X=f(T, B, 4 * n))


def bench_lstm(jax, torch, torch_note, graphs):
    import pytensor

    T, B, n = LSTM_SHAPE["T"], LSTM_SHAPE["B"], LSTM_SHAPE["n"]
    g = Group(f"LSTM forward+backward, {shape_str(LSTM_SHAPE)}, float32 (loss = sum(Y))",
              f"LSTM {shape_str(LSTM_SHAPE)}")
    d = guarded("LSTM data", lambda: lstm_data(T, B, n))
    if d is None:
        return
    (layer_in, layer_out), (core_in, core_out) = graphs
    def make_torch(dev):
        model = torch.nn.LSTM(n, n).to(dev)
        # ptnative's gate blocks [cell-in | input | forget | output] -> torch's [input | forget | cell | output]
        perm = lambda w: np.concatenate([w[n:2 * n], w[2 * n:3 * n], w[:n], w[3 * n:]])  # noqa: E731
        with torch.no_grad():
            model.weight_ih_l0.copy_(torch.from_numpy(perm(d["W_in"].T)))
            model.weight_hh_l0.copy_(torch.from_numpy(perm(d["W_rec"].T)))
            model.bias_ih_l0.copy_(torch.from_numpy(perm(d["b"])))
            model.bias_hh_l0.zero_()
        x = torch.from_numpy(d["x"]).to(dev).requires_grad_(True)
        return torch_backward_call(torch, x, lambda x: model(x)[0].sum(), model)

    ref_loss = None
    run = torch_peer(g, torch, torch_note, "torch.nn.LSTM (cuDNN)", make_torch)
    if run is not None:
        tf32 = torch.backends.cudnn.allow_tf32
        try:
            torch.backends.cudnn.allow_tf32 = True
            loss = g.row("torch.nn.LSTM (cuDNN, TF32 allowed: torch's default)" if opts.device == "cuda"
                         else "torch.nn.LSTM (CPU)", run, reference=True)
            ref_loss = None if loss is None else float(loss)
            if opts.device == "cuda":
                torch.backends.cudnn.allow_tf32 = False
                loss = g.row("torch.nn.LSTM (cuDNN, strict float32)", run)
                ref_loss = ref_loss if loss is None else float(loss)
        finally:
            torch.backends.cudnn.allow_tf32 = tf32

    if jax is None:
        g.skip("ptnative JAX mode", jax_note)
    else:
        def make_jax(inputs, outputs, names):
            return jax_fn(jax, (inputs, outputs), lambda: [jax.device_put(d[k]) for k in names])

        run = guarded("lstm() JAX", lambda: make_jax(layer_in, layer_out, ["x", "W_in", "W_rec", "b"]))
        if run is not None:
            out = g.row("ptnative.lstm layer, JAX mode (XLA GEMM + NativeLstm2)", run)
            print_agreement(out, ref_loss, "torch's", " (same weights)")
        run = guarded("NativeLstm2 JAX", lambda: make_jax(core_in, core_out, ["X", "W_rec"]))
        if run is not None:
            g.row("NativeLstm2 alone (X given), JAX mode", run)
            if opts.device == "cuda":  # ptnative.config.allow_tf32 is read at every product
                import ptnative
                try:
                    ptnative.config.allow_tf32 = False
                    g.row("NativeLstm2 alone (X given), JAX mode, strict float32", run)
                finally:
                    ptnative.config.allow_tf32 = None

    def make_host():
        f = pytensor.function(core_in, core_out)
        return lambda: f(d["X"], d["W_rec"])

    run = guarded("NativeLstm2 host-array", make_host)
    if run is not None:
        g.row("NativeLstm2 alone (X given), host-array mode", run, note=COPIES)


# ------------------------------------------------------------------ CTC
def ctc_data(T, B, D, N, seed=0):
    from ctc import ctc_data as data  # bench/ctc.py: the same inputs as the CPU benchmark

    return data(T, B, D, N, seed)


def ctc_graph(data):
    import pytensor
    import pytensor.tensor as pt

    from ptnative.ops import fsa

    logits, lens, targets, tlens = data
    x = pt.tensor3("logits", dtype="float32", shape=logits.shape)
    loss = fsa.ctc_loss(x, lens, targets, tlens, blank_index=-1).sum()
    return [x], [loss, pytensor.grad(loss, x)]


def bench_ctc(jax, torch, torch_note, shape, data, graph):
    import pytensor

    logits, lens, targets, tlens = data
    D = shape["D"]
    g = Group(f"ctc_loss forward+backward, {shape_str(shape)}, float32, reduction sum",
              f"ctc_loss {shape_str(shape)}")
    def make_torch(dev):
        x = torch.from_numpy(logits).to(dev).requires_grad_(True)
        tt, lt, tlt = (torch.from_numpy(a.astype(np.int64)).to(dev) for a in (targets, lens, tlens))
        return torch_backward_call(torch, x, lambda x: torch.nn.functional.ctc_loss(
            torch.log_softmax(x, -1), tt, lt, tlt, blank=D - 1, reduction="sum"))

    ref = None
    run = torch_peer(g, torch, torch_note, "torch.nn.functional.ctc_loss", make_torch)
    if run is not None:
        out = g.row("torch.nn.functional.ctc_loss", run, reference=True)
        ref = None if out is None else float(out)

    def check(out):
        print_agreement(out, ref, "torch's")

    if jax is None:
        g.skip("ptnative.ctc_loss, JAX mode", jax_note)
    else:
        run = guarded("ctc_loss JAX", lambda: jax_fn(jax, graph, lambda: [jax.device_put(logits)]))
        if run is not None:
            check(g.row("ptnative.ctc_loss, JAX mode", run))
            device_work(graph, run)

    def make_host():
        f = pytensor.function(*graph)
        return lambda: f(logits)

    run = guarded("ctc_loss host-array", make_host)
    if run is not None:
        note = "upstream-gradient scaling on the CPU" + (", " + COPIES if COPIES else "")
        check(g.row("ptnative.ctc_loss, host-array mode", run, note=note))
        device_work(graph, run)


# ------------------------------------------------------------------ RNN-T
def rnnt_data(B, T, U, V, seed=0):
    rng = np.random.default_rng(seed)
    K = V + 1
    acts = rng.standard_normal(size=(B, T, U + 1, K), dtype=np.float32)
    labels = rng.integers(1, K, size=(B, U)).astype(np.int32)  # blank 0
    return acts, labels, np.full(B, T, np.int32), np.full(B, U, np.int32)


def rnnt_graph(V, labels, act_lens, label_lens):
    import pytensor
    import pytensor.tensor as pt

    from ptnative.ops.rnnt import rnnt_loss

    shape = (len(act_lens), int(act_lens.max()), int(label_lens.max()) + 1, V + 1)
    x = pt.tensor4("acts", dtype="float32", shape=shape)
    loss = rnnt_loss(x, labels, act_lens, label_lens, blank=0, reduction="sum")
    return [x], [loss, pytensor.grad(loss, x)]


def bench_rnnt(jax, torch, torch_note, shape, data, graph, big=False):
    import pytensor

    acts, labels, act_lens, label_lens = data
    B, T, U, V = (shape[k] for k in "BTUV")
    elements = B * T * (U + 1) * (V + 1)
    g = Group(f"rnnt_loss forward+backward, {shape_str(shape)} ({elements / 1e6:.3g} M logits), float32, blank 0, "
              f"reduction sum" + (", data drawn on the device by each framework" if big else ""),
              f"rnnt_loss {shape_str(shape)}")
    ref = None
    try:
        import torchaudio.functional as taf
        taf.rnnt_loss  # noqa: B018  (removed from some torchaudio versions)
    except Exception as e:
        taf, ta_note = None, f"torchaudio unavailable ({type(e).__name__}: {e})"

    def make_torch(dev):
        if big:
            gen = torch.Generator(device=dev).manual_seed(0)
            x = torch.randn((B, T, U + 1, V + 1), device=dev, generator=gen).requires_grad_(True)
        else:
            x = torch.from_numpy(acts).to(dev).requires_grad_(True)
        tl, al, ll = (torch.from_numpy(a).to(dev) for a in (labels, act_lens, label_lens))
        return torch_backward_call(torch, x, lambda x: taf.rnnt_loss(x, tl, al, ll, blank=0, reduction="sum"))

    run = torch_peer(g, torch if taf is not None else None, torch_note if torch is None else ta_note,
                     "torchaudio.functional.rnnt_loss", make_torch)
    if run is not None:
        out = g.row("torchaudio.functional.rnnt_loss", run, reference=True)
        ref = None if out is None or big else float(out)
        del run
        if opts.device == "cuda":
            torch.cuda.empty_cache()

    def check(out):
        print_agreement(out, ref, "torchaudio's")

    if jax is None:
        g.skip("ptnative.rnnt_loss, JAX mode", jax_note)
    else:
        def make_inputs():
            if big:
                return [jax.random.normal(jax.random.key(0), (B, T, U + 1, V + 1), dtype="float32")]
            return [jax.device_put(acts)]

        run = guarded("rnnt_loss JAX", lambda: jax_fn(jax, graph, make_inputs))
        if run is not None:
            check(g.row("ptnative.rnnt_loss, JAX mode", run))
            device_work(graph, run)
            del run

    if big:
        g.skip("ptnative.rnnt_loss, host-array mode", f"not run at this size (2 x {elements * 4 / 1e9:.2g} GB of "
               "copies per call)")
        return

    def make_host():
        f = pytensor.function(*graph)
        return lambda: f(acts)

    run = guarded("rnnt_loss host-array", make_host)
    if run is not None:
        check(g.row("ptnative.rnnt_loss, host-array mode", run, note=COPIES))
        device_work(graph, run)


# ------------------------------------------------------------------ main
def main():
    global jax_note
    import warnings
    warnings.simplefilter("ignore")

    import pytensor

    import ptnative
    from ptnative.device import cuda_device_count

    if opts.device == "cuda" and cuda_device_count() == 0:
        print("bench/gpu.py: no CUDA GPU found (no driver or no device): nothing to measure. "
              "Smoke-test the code paths on the CPU with: python bench/gpu.py --quick --device cpu")
        return 0
    ptnative.config.device = opts.device  # host-array mode: the native ops run on this device
    t_start = time.perf_counter()
    torch, torch_note = load_torch()
    jax, jax_note = load_jax()
    print(f"ptnative {ptnative.__version__}, pytensor {pytensor.__version__}, numpy {np.__version__}; {torch_note}; "
          f"{jax_note}")
    if opts.device == "cuda" and torch is not None:
        print(f"device: {torch.cuda.get_device_name(0)}")
    print(f"device {opts.device}{', --quick shapes' if opts.quick else ''}; median/min of {REPS} timed calls after "
          f"{WARMUP} warm-up call(s)")

    # Graphs first, so that every kernel library they need is compiled at once, in parallel.
    graphs = guarded("LSTM graphs", lambda: lstm_graphs(**LSTM_SHAPE))
    ctc = []
    for shape in CTC_SHAPES:
        data = guarded("CTC data", lambda: ctc_data(**shape))
        ctc.append((shape, data, None if data is None else guarded("CTC graph", lambda: ctc_graph(data))))
    small = guarded("RNN-T data", lambda: rnnt_data(**RNNT_SHAPE))
    small_graph = None if small is None else guarded("RNN-T graph", lambda: rnnt_graph(RNNT_SHAPE["V"], *small[1:]))
    big_lens = (np.ones((RNNT_BIG["B"], RNNT_BIG["U"]), np.int32), np.full(RNNT_BIG["B"], RNNT_BIG["T"], np.int32),
                np.full(RNNT_BIG["B"], RNNT_BIG["U"], np.int32))
    big_graph = guarded("RNN-T big graph", lambda: rnnt_graph(RNNT_BIG["V"], *big_lens))
    all_outputs = [outs for outs in [*(graphs or ()), *(gr for _, _, gr in ctc if gr), small_graph, big_graph] if outs]
    guarded("prebuild", lambda: prebuild([outs for _, outs in all_outputs], jax))

    if graphs is not None:
        bench_lstm(jax, torch, torch_note, graphs)
    for shape, data, graph in ctc:
        if graph is not None:
            bench_ctc(jax, torch, torch_note, shape, data, graph)
    if small_graph is not None:
        bench_rnnt(jax, torch, torch_note, RNNT_SHAPE, small, small_graph)
    if big_graph is not None:
        bench_rnnt(jax, torch, torch_note, RNNT_BIG, (None, *big_lens), big_graph, big=True)

    print("\nSummary (docs/gpu.md's table; medians in ms, ratio to the first peer in parentheses):")
    print(summary_table())
    print(f"\n{'all rows ran' if not FAILED else f'{len(FAILED)} row(s) FAILED: ' + ', '.join(FAILED)} "
          f"({time.perf_counter() - t_start:.0f} s)")
    return 1 if FAILED else 0


jax_note = ""

if __name__ == "__main__":
    sys.exit(main())
