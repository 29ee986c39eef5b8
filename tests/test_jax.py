"""JAX mode: native ops as XLA FFI calls (CPU here), same numbers and gradients as the default mode."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

jax = pytest.importorskip("jax")

# PyTensor sets jax_enable_x64 from floatX when its JAX backend is first imported: here, before any test saves the
# flag to restore it (a test that saved it first would turn it off again for the tests after it in the process).
import pytensor.link.jax.dispatch  # noqa: E402,F401

import ptnative  # noqa: E402
from ptnative import blas_threads  # noqa: E402
from ptnative.ops import LstmGenericBase  # noqa: E402

from .conftest import build_with_nvcc, exported_functions  # noqa: E402
from .test_lstm import lstm_data, symbolic  # noqa: E402
from .test_native_op import scale_op  # noqa: E402

#: The PyTensor reference (the same CPU kernels as the default mode, without a Numba compilation of the graph).
REFERENCE_MODE = "FAST_COMPILE"


def test_lstm_forward_and_gradients_match_pytensor():
    Z, V_h, c, i = symbolic("float64")
    Y, H, d = LstmGenericBase.make_op()(Z, V_h, c, i)
    grads = pytensor.grad((Y ** 2).sum() + (d * 3).sum(), [Z, V_h, c])
    values = lstm_data(6, 3, 4, "float64", seed=4)
    ref = pytensor.function([Z, V_h, c, i], [Y, H, d, *grads], mode=REFERENCE_MODE)(*values)
    f = pytensor.function([Z, V_h, c, i], [Y, H, d, *grads], mode="JAX")
    results = f(*values)
    assert all(isinstance(r, jax.Array) for r in results)  # computed by XLA
    for got, want in zip(results, ref):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_inplace_input_and_int_scalar(dtype):
    x, w, k = pt.matrix(dtype=dtype), pt.vector(dtype=dtype), pt.iscalar()
    y, s = scale_op()(x * 2, w, k)
    f = pytensor.function([x, w, k], [y, s, x * 2], mode="JAX")
    xv = np.arange(6, dtype=dtype).reshape(2, 3)
    got_y, got_s, got_x2 = (np.asarray(a) for a in f(xv, np.ones(3, dtype=dtype), 1))
    np.testing.assert_allclose(got_y, xv * 2 + 1)
    np.testing.assert_allclose(got_s, (xv * 2 + 1).sum(axis=1))
    np.testing.assert_allclose(got_x2, xv * 2)  # the aliased input's other use still sees its value


def test_kernel_error_is_raised():
    """A kernel's value error (PTN_STATUS_VALUE) comes back from the handler as XLA's INVALID_ARGUMENT, a Python
    exception naming the op and the failed check, also under jit of the jaxified graph; the process lives on."""
    from ptnative.backends.jax import jaxify_graph

    x, w, k = pt.matrix(), pt.vector(), pt.iscalar()
    outputs = scale_op()(x, w, k)
    f = pytensor.function([x, w, k], outputs, mode="JAX")
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"INVALID_ARGUMENT: NativeOp 'ScaleRows': check failed"):
        f(np.ones((2, 3)), np.ones(2), 0)
    g = jax.jit(jaxify_graph([x, w, k], outputs))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"INVALID_ARGUMENT: NativeOp 'ScaleRows': check failed"):
        jax.block_until_ready(g(np.ones((2, 3)), np.ones(2), np.int32(0)))
    got_y, got_s = (np.asarray(a) for a in f(np.ones((2, 3)), np.full(3, 2.0), 1))
    np.testing.assert_array_equal(got_y, np.full((2, 3), 3.0))
    np.testing.assert_array_equal(got_s, [9.0, 9.0])


def test_unregistered_symbol_wrong_arity_and_element_size_are_errors():
    """A call naming a variant that this process never registered (as an executable compiled elsewhere could),
    one with another number of arguments than the variant's, or one whose buffers have other element sizes, is an
    error from the handler, not a crash; the right call then works."""
    from ptnative.backends.jax import ffi_target

    variant = scale_op().variant("float64", "cpu")
    target = ffi_target(variant)
    x = np.ones((2, 3))
    out = jax.ShapeDtypeStruct((2,), np.float64)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"NOT_FOUND: ptnative: no NativeOp variant "
                                                         r"'ptn_not_registered_0' is registered"):
        jax.block_until_ready(jax.ffi.ffi_call(target, out)(x, symbol="ptn_not_registered_0"))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"INVALID_ARGUMENT: NativeOp 'ScaleRows': the FFI call has "
                                                         r"1 inputs and 1 outputs, the op 3 and 2"):
        jax.block_until_ready(jax.ffi.ffi_call(target, out)(x, symbol=variant.symbol))
    with pytest.raises(jax.errors.JaxRuntimeError, match="Wrong number of attributes"):  # it needs "symbol"
        jax.block_until_ready(jax.ffi.ffi_call(target, out)(x))
    # float32 buffers for the float64 variant: what a float64 op gets when jax_enable_x64 is off (PyTensor turns
    # it off with floatX float32)
    outs = [jax.ShapeDtypeStruct((2, 3), np.float32), jax.ShapeDtypeStruct((2,), np.float32)]
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"INVALID_ARGUMENT: NativeOp 'ScaleRows': input 'x' has "
                                                         r"dtype float32 where the op takes float64"):
        jax.block_until_ready(jax.ffi.ffi_call(target, outs)(x.astype(np.float32), np.ones(3, np.float32),
                                                             np.int32(1), symbol=variant.symbol))
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        outs = [jax.ShapeDtypeStruct((2, 3), np.float64), jax.ShapeDtypeStruct((2,), np.float64)]
        got = jax.ffi.ffi_call(target, outs)(x, np.full(3, 2.0), np.int32(1), symbol=variant.symbol)
        np.testing.assert_array_equal(np.asarray(got[0]), np.full((2, 3), 3.0))
        np.testing.assert_array_equal(np.asarray(got[1]), [9.0, 9.0])
    finally:
        jax.config.update("jax_enable_x64", x64)


def test_threads_register_and_call_variants_at_once():
    """Four threads trace and run four op variants at the same time, then call them together, 32 calls: the
    handler's registry is read from several threads at once (as XLA does with several devices) and every result
    is right."""
    from concurrent.futures import ThreadPoolExecutor

    from ptnative.backends.jax import jaxify_graph

    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        functions = {}
        for dt in ("float32", "float64"):
            x, w, k = pt.matrix(dtype=dt), pt.vector(dtype=dt), pt.iscalar()
            functions["scale", dt] = jaxify_graph([x, w, k], list(scale_op()(x, w, k)))
            m = pt.matrix(dtype=dt)
            functions["pick", dt] = jaxify_graph([m], [ptnative.subtensor_batched_index(m, np.array([2, 0], dt))])

        def run(key):
            name, dt = key
            f = jax.jit(functions[key])
            if name == "scale":
                got = f(np.ones((2, 3), dt), np.arange(3, dtype=dt), np.int32(1))[1]
                return np.asarray(got).tolist() == [6, 6]
            return np.asarray(f(np.arange(6, dtype=dt).reshape(2, 3))[0]).tolist() == [2, 3]

        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(run, list(functions)))
            assert all(pool.map(run, list(functions) * 8))
    finally:
        jax.config.update("jax_enable_x64", x64)


def test_one_handler_library_serves_every_variant(tmp_path):
    """A fresh process with a kernel cache holding only the variants' own libraries: JAX mode runs five variants
    (two ops, float32 and float64, and a gradient op) and compiles exactly one library, the CPU handler."""
    from ptnative.build import build
    from ptnative.ops.sparse import SubtensorBatchedIndex

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    op = scale_op()
    variants = [op.variant(dt, "cpu") for dt in ("float32", "float64")] + [op.grad_op().variant("float64", "cpu")]
    variants += [SubtensorBatchedIndex.make_op().variant(dt, "cpu") for dt in ("float32", "float64")]
    variants.append(blas_threads.pool_variant())  # not JAX mode's: what every first kernel load installs
    for v in variants:
        path = build(v)  # in the tests' cache
        for name in (path.name, path.name + ".integrity"):
            shutil.copy2(path.parent / name, cache / name)
    before = {p.name for p in cache.glob("*.so")}
    code = """
import numpy as np, pytensor, pytensor.tensor as pt, ptnative
from tests.test_native_op import scale_op
for dt in ("float32", "float64"):
    x, w, k = pt.matrix(dtype=dt), pt.vector(dtype=dt), pt.iscalar()
    y, s = scale_op()(x, w, k)
    outs = [y, s] + (pytensor.grad(s.sum(), [x, w]) if dt == "float64" else [])
    got = pytensor.function([x, w, k], outs, mode="JAX")(np.ones((2, 3), dt), np.arange(3, dtype=dt), 1)
    np.testing.assert_array_equal(np.asarray(got[1]), [6, 6])
    if dt == "float64":
        np.testing.assert_array_equal(np.asarray(got[2]), np.ones((2, 1)) * np.arange(3))
        np.testing.assert_array_equal(np.asarray(got[3]), [2, 2, 2])
    m = pt.matrix(dtype=dt)
    picked = ptnative.subtensor_batched_index(m, np.array([2, 0], dt))
    got = pytensor.function([m], picked, mode="JAX")(np.arange(6, dtype=dt).reshape(2, 3))
    np.testing.assert_array_equal(np.asarray(got), [2, 3])
print("ok")
"""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PTNATIVE_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr[-4000:]
    built = sorted({p.name for p in cache.glob("*.so")} - before)
    assert len(built) == 1 and built[0].startswith("ptn_xla_ffi_") and "-cpu-" in built[0], built


def test_first_jax_call_with_prebuilt_libraries_compiles_nothing(tmp_path):
    """A fresh process and an empty kernel cache, with the package's prebuilt libraries holding the catalogue
    op's and the CPU handler's (as a prebuild where jax is importable ships them): the first JAX-mode call of a
    catalogue function installs them from there and runs no compiler."""
    from ptnative.backends.ffi_source import handler_variant
    from ptnative.build import build
    from ptnative.cache import RECORD_SUFFIX
    from ptnative.ops.sparse import SubtensorBatchedIndex

    shipped = tmp_path / "prebuilt"
    shipped.mkdir(mode=0o755)
    for v in (SubtensorBatchedIndex.make_op().variant("float64", "cpu"), handler_variant("cpu", jax.ffi.include_dir())):
        path = build(v)  # in the tests' cache
        for name in (path.name, path.name + RECORD_SUFFIX):
            shutil.copyfile(path.parent / name, shipped / name)
            os.chmod(shipped / name, 0o644)
    code = f"""
import numpy as np, pytensor, pytensor.tensor as pt, ptnative
from pathlib import Path
from ptnative import build, prebuilt
prebuilt.prebuilt_dir = lambda: Path({str(shipped)!r})
def refuse(variant, directory, path):
    raise AssertionError("compiled " + path.name)
build._compile = refuse
m = pt.matrix()
picked = ptnative.subtensor_batched_index(m, np.array([2, 0], "float64"))
got = pytensor.function([m], picked, mode="JAX")(np.arange(6.0).reshape(2, 3))
np.testing.assert_array_equal(np.asarray(got), [2, 3])
print("ok")
"""
    cache = tmp_path / "cache"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PTNATIVE_CACHE_DIR": str(cache)}
    env.pop("PTNATIVE_PREBUILT", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr[-4000:]
    assert sorted(p.name for p in cache.glob("*.so")) == sorted(p.name for p in shipped.glob("*.so"))


def test_persistent_compilation_cache_serves_another_process(tmp_path):
    """The lowered program names its op variants by symbol, not by address: a second process gets the jitted
    function from JAX's persistent compilation cache (no XLA compilation) and the same, right results."""
    code = """
import sys
import jax
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
from jax._src import monitoring
hits = []
monitoring.register_event_listener(lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None)
import numpy as np, pytensor.tensor as pt, ptnative
from ptnative.backends.jax import jaxify_graph
x = pt.matrix("x", shape=(3, 4))
y = ptnative.subtensor_batched_index(x, np.array([1, 3, 0], "float64"))
got = jax.jit(jaxify_graph([x], [y]))(np.arange(12.0).reshape(3, 4))[0]
np.testing.assert_array_equal(np.asarray(got), [1, 7, 8])
print("hits", len(hits))
"""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    hits = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "jax-cache")], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
        hits.append(int(proc.stdout.split()[-1]))
    assert hits[0] == 0 and hits[1] >= 1, hits


def test_ptnative_build_builds_the_handler(monkeypatch, capsys):
    """``python -m ptnative build`` (and so the install-time prebuild, where jax is importable) builds JAX mode's
    handler library along with the catalogue: the one JAX mode loads."""
    from ptnative import build, catalogue, cli
    from ptnative.backends.ffi_source import handler_variant

    built = []
    monkeypatch.setattr(catalogue, "variants", lambda device: iter([]))
    monkeypatch.setattr(build, "build", lambda variant: built.append(variant))
    assert cli.main(["build", "-j", "1"]) == 0
    assert built == [blas_threads.pool_variant(), handler_variant("cpu", jax.ffi.include_dir())]
    assert "2 of 2 libraries ready" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("nm") is None, reason="nvcc or nm not found")
def test_cuda_ffi_handler_compiles(monkeypatch):
    """nvcc compiles the CUDA handler library, which exports the handler and the registration function and no op's
    code, and a CUDA variant's library exports the entry point that the handler calls on XLA's stream."""
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    from ptnative.backends.ffi_source import HANDLER_SYMBOL, REGISTER_SYMBOL, handler_variant
    from ptnative.ops.edit_distance import EditDistanceOp

    handler = handler_variant("cuda", jax.ffi.include_dir())
    symbols = exported_functions(build_with_nvcc(handler))
    assert {HANDLER_SYMBOL, REGISTER_SYMBOL} <= symbols
    assert not any(s.startswith("ptn_") for s in symbols - {HANDLER_SYMBOL, REGISTER_SYMBOL}), symbols
    variant = EditDistanceOp.make_op().variant("float32", device="cuda")  # as tests/test_edit_distance.py builds it
    assert f"ptn_{variant.symbol}_run_on_device" in exported_functions(build_with_nvcc(variant))


def test_catalogue_functions_in_jax_mode():
    """ctc_loss (custom pullback), edit_distance (int ops) and chunk/unchunk (gradient op) under XLA.

    chunk's buffers are sized from the input's shape, so under JAX that shape must be static."""
    rng = np.random.default_rng(0)
    logits = pt.tensor3("logits")
    x = pt.tensor3("x", shape=(7, 2, 3))
    loss = ptnative.ctc_loss(logits, np.array([6, 4], "int32"), np.array([[1, 2, 2], [3, 1, 0]], "int32"),
                             np.array([3, 2], "int32"), blank_index=0)
    g = pytensor.grad(loss.sum(), logits)
    mask = np.ones((7, 2))
    chunks, cmask = ptnative.chunk(x, mask, 3, 2)
    back, _, _ = ptnative.unchunk(chunks, cmask, 3, 2, 7, 2)
    gx = pytensor.grad((back * 2).sum(), x)
    a = np.array([[1, 2, 3, 4], [1, 1, 0, 0]], "int32")
    b = np.array([[1, 3, 4, 0], [2, 0, 0, 0]], "int32")
    ed = ptnative.edit_distance(a, np.array([4, 2], "int32"), b, np.array([3, 1], "int32"))
    values = [rng.normal(size=(6, 2, 5)), rng.normal(size=(7, 2, 3))]
    outs = [loss, g, back, gx, ed]
    ref = pytensor.function([logits, x], outs, mode=REFERENCE_MODE)(*values)
    got = pytensor.function([logits, x], outs, mode="JAX")(*values)
    for r, o in zip(ref, got):
        np.testing.assert_allclose(np.asarray(o), r, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("start,step", [(0, 1), (1, -2)])
def test_native_lstm2_aliased_buffers_match_pytensor(start, step):
    """NativeLstm2 writes its gates into X's buffer and its DX into H's: under XLA the aliases are
    input_output_aliases, and frames the direction skips must still come out as in PyTensor's own run."""
    from ptnative.ops import NativeLstm2

    T, B, n = 7, 3, 4
    rng = np.random.default_rng(0)
    X, W = pt.tensor3(shape=(T, B, 4 * n)), pt.matrix(shape=(n, 4 * n))
    y0, c0, m = pt.matrix(shape=(B, n)), pt.matrix(shape=(B, n)), pt.matrix(shape=(T, B))
    vals = [rng.normal(size=(T, B, 4 * n)), rng.normal(size=(n, 4 * n)) * 0.3, rng.normal(size=(B, n)),
            rng.normal(size=(B, n)), (rng.random((T, B)) > 0.3) * 1.0]
    direction = pt.constant(np.int32(start)), pt.constant(np.int32(step))
    Y, C, H, d = NativeLstm2.make_op()(X * 1.5, W, y0, c0, m, *direction)
    outs = [Y, C, d, *pytensor.grad((Y ** 2).sum() + (C * 0.3).sum() + d.sum(), [X, W, y0, c0])]
    ref = pytensor.function([X, W, y0, c0, m], outs, mode=REFERENCE_MODE)(*vals)
    got = pytensor.function([X, W, y0, c0, m], outs, mode="JAX")(*vals)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-10, atol=1e-12)


def test_import_installs_no_import_hook_and_jax_mode_registers_lazily():
    """A fresh process: importing ptnative imports no JAX and leaves sys.meta_path alone; JAX mode and a
    hand-jaxified graph (rewritten for JAX, as PyMC does) find the NativeOp implementation."""
    code = """
import sys
meta_path = list(sys.meta_path)
import numpy as np
import pytensor
import pytensor.tensor as pt
import ptnative
assert "jax" not in sys.modules, "importing ptnative imported jax"
assert sys.meta_path == meta_path, sys.meta_path
assert not any("ptnative" in type(f).__module__ for f in sys.meta_path)
x = pt.matrix("x", shape=(3, 4))
idx = np.array([1, 3, 0], dtype="float64")
y = ptnative.subtensor_batched_index(x, idx)
xv = np.arange(12.0).reshape(3, 4)
want = xv[np.arange(3), idx.astype(int)]
np.testing.assert_array_equal(np.asarray(pytensor.function([x], y, mode="JAX")(xv)), want)
from pytensor.compile.mode import get_mode
from pytensor.graph.fg import FunctionGraph
from pytensor.link.jax.dispatch import jax_funcify
import jax
fgraph = FunctionGraph([x], [(y ** 2).sum()], clone=True)
get_mode("JAX").optimizer.rewrite(fgraph)
f = jax_funcify(fgraph)
g = jax.grad(lambda v: f(v)[0])(xv)
want_g = np.zeros_like(xv)
want_g[np.arange(3), idx.astype(int)] = 2 * want
np.testing.assert_allclose(np.asarray(g), want_g)
print("ok")
"""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr[-4000:]


def test_odd_op_name_travels_as_data():
    """The op name never enters generated code (the handler takes it at registration): quotes, backslashes,
    newlines, trigraphs, non-ASCII characters and placeholder-like text come back in the error message as they are."""
    from ptnative.backends.ffi_source import HANDLER_FILE
    from ptnative.source import glue_sections

    assert "@NAME@" not in glue_sections(HANDLER_FILE)["handler"]
    name = 'Odd "name" \\ with\nnewline ??= é @SYM@ @NAME@'
    op = scale_op(name=name)
    x, w, k = pt.matrix(), pt.vector(), pt.iscalar()
    f = pytensor.function([x, w, k], op(x, w, k), mode="JAX")
    with pytest.raises(Exception, match="check failed") as info:
        f(np.ones((2, 3)), np.ones(2), 0)
    assert f"NativeOp '{name}'" in str(info.value)


def test_64_bit_op_with_jax_x64_off_is_a_type_error_when_traced():
    """A float64 op under JAX with jax_enable_x64 off (as PyTensor sets it for floatX float32) would get float32
    buffers: tracing it raises a TypeError naming the op and the way out; with x64 on the same graph runs."""
    from ptnative.backends.jax import jaxify_graph

    x, w, k = pt.dmatrix(), pt.dvector(), pt.iscalar()
    f = jaxify_graph([x, w, k], list(scale_op()(x, w, k)))
    x64 = jax.config.jax_enable_x64
    try:
        jax.config.update("jax_enable_x64", False)
        with pytest.raises(TypeError, match=r"NativeOp 'ScaleRows' computes with float64 arrays, but JAX runs with "
                                            r"jax_enable_x64 off"):
            jax.jit(f)(np.ones((2, 3)), np.ones(3), np.int32(1))
        jax.config.update("jax_enable_x64", True)
        got = jax.jit(f)(np.ones((2, 3)), np.full(3, 2.0), np.int32(1))
        np.testing.assert_array_equal(np.asarray(got[1]), [9.0, 9.0])
    finally:
        jax.config.update("jax_enable_x64", x64)
