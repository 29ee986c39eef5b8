"""The generic machinery, on small ops defined from strings in this file."""

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import NullTypeGradError, verify_grad

import ptnative
from ptnative import NativeOp, NativeOpGenBase, blas, blas_threads, build

from .conftest import MODES, check_infer_shape

# y[r, j] = x[r, j] * w[j] + k (y is x's buffer), s[r] = sum_j y[r, j].
SCALE_SUPPORT = """
DEF_KERNEL void scale_rows(Float* y, const Float* w, int32_t k, int64_t rows, int64_t cols) {
  for (int64_t idx = threadIdx.x + blockDim.x * blockIdx.x; idx < rows * cols; idx += gridDim.x * blockDim.x)
    y[idx] = y[idx] * w[idx % cols] + k;
}
"""
SCALE_FW = """
  Ndarray* w = inputs[1];
  Ndarray* y = *outputs[0];
  Ndarray* s = *outputs[1];
  int32_t k = Ndarray_DEV_DATA_int32_scalar(inputs[2]);
  if (k < 0) { ptn_set_error("k must be >= 0, got " + std::to_string(k)); %(fail)s }
  int64_t rows = Ndarray_DIMS(y)[0], cols = Ndarray_DIMS(y)[1];
  assert_cmp(Ndarray_DIMS(w)[0], ==, cols);
  assert_cmp(rows %% 1, ==, 0);  // a literal percent sign
  start_dev_kernel(scale_rows, (Ndarray_DEV_DATA(y), Ndarray_DEV_DATA(w), k, rows, cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) Ndarray_DEV_DATA(s)[r] += Ndarray_DEV_DATA(y)[r * cols + j];
"""
# inputs: x, w, Dy, Ds; outputs: Dx, Dw
SCALE_BW = """
  Ndarray* x = inputs[0]; Ndarray* w = inputs[1]; Ndarray* Dy = inputs[2]; Ndarray* Ds = inputs[3];
  Ndarray* Dx = *outputs[0]; Ndarray* Dw = *outputs[1];
  int64_t rows = Ndarray_DIMS(x)[0], cols = Ndarray_DIMS(x)[1];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      Float g = Ndarray_DEV_DATA(Dy)[r * cols + j] + Ndarray_DEV_DATA(Ds)[r];
      Ndarray_DEV_DATA(Dx)[r * cols + j] = g * Ndarray_DEV_DATA(w)[j];
      Ndarray_DEV_DATA(Dw)[j] += g * Ndarray_DEV_DATA(x)[r * cols + j];
    }
"""
SCALE_IN = (
    {"name": "x", "ndim": 2, "shape": (None, None), "need_contiguous": True, "want_inplace": 0},
    {"name": "w", "ndim": 1, "shape": (None,), "need_contiguous": True},
    {"name": "k", "ndim": 0, "shape": (), "dtype": "int32", "host_memory": True, "gradient": "disconnected"},
)
SCALE_OUT = (
    {"name": "y", "ndim": 2, "shape": ((0, 0), (0, 1))},
    {"name": "s", "ndim": 1, "shape": ((0, 0),)},
)


def scale_op(**kw):
    spec = dict(in_info=SCALE_IN, out_info=SCALE_OUT, c_fw_code=SCALE_FW, c_bw_code=SCALE_BW,
                c_extra_support_code={"001_scale": SCALE_SUPPORT}, grad_input_map=(0, 1, 5, 6), name="ScaleRows")
    spec.update(kw)
    return NativeOp(**spec)


def scale_ref(x, w, k):
    y = x * w[None, :] + k
    return y, y.sum(axis=1)


# A strided (need_contiguous=False) input and an int32 output: argmax per column of x.
ARGMAX_FW = """
  Ndarray* x = inputs[0];
  Ndarray* out = *outputs[0];
  int64_t rows = Ndarray_DIMS(x)[0], cols = Ndarray_DIMS(x)[1];
  int64_t s0 = Ndarray_STRIDE(x, 0), s1 = Ndarray_STRIDE(x, 1);
  for (int64_t j = 0; j < cols; ++j) {
    int32_t best = 0;
    for (int64_t r = 1; r < rows; ++r)
      if (Ndarray_DEV_DATA(x)[r * s0 + j * s1] > Ndarray_DEV_DATA(x)[best * s0 + j * s1]) best = (int32_t)r;
    Ndarray_DEV_DATA_int32(out)[j] = best;
  }
"""


def argmax_op():
    return NativeOp(in_info=({"name": "x", "ndim": 2, "shape": (None, None)},),
                    out_info=({"name": "arg", "ndim": 1, "dtype": "int32", "shape": ((0, 1),)},),
                    c_fw_code=ARGMAX_FW, name="ColumnArgmax")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_forward_every_mode(mode, dtype):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 3)).astype(dtype)
    w = rng.normal(size=3).astype(dtype)
    xv, wv, kv = pt.matrix(dtype=dtype), pt.vector(dtype=dtype), pt.iscalar()
    y, s = scale_op()(xv, wv, kv)
    assert y.dtype == dtype and s.dtype == dtype
    f = pytensor.function([xv, wv, kv], [y, s], mode=mode)
    x_before = x.copy()
    got_y, got_s = f(x, w, 2)
    ref_y, ref_s = scale_ref(x.astype(float), w.astype(float), 2)
    np.testing.assert_allclose(got_y, ref_y, rtol=1e-5)
    np.testing.assert_allclose(got_s, ref_s, rtol=1e-5)
    np.testing.assert_array_equal(x, x_before)  # a graph input is never destroyed


def test_strided_input_and_int_output(mode):
    x = np.random.default_rng(2).normal(size=(5, 7))
    xv = pt.matrix()
    f = pytensor.function([xv], argmax_op()(xv.T), mode=mode)
    got = f(x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, x.T.argmax(axis=0))


@pytest.mark.parametrize("mode", MODES[:3] + ["FAST_COMPILE"])
def test_gradient_verify_grad(mode):
    rng = np.random.default_rng(3)
    op = scale_op()

    def cost(x, w):
        y, s = op(x, w, pt.constant(np.int32(1)))
        return (y ** 2).sum() + (s * pt.arange(s.shape[0])).sum()

    verify_grad(cost, [rng.normal(size=(3, 4)), rng.normal(size=4)], rng=rng, mode=mode)


def test_gradient_one_output_disconnected():
    """The unused output's gradient is replaced by zeros."""
    x, w = pt.matrix(), pt.vector()
    y, s = scale_op()(x, w, np.int32(0))
    gx, gw = pytensor.grad(s.sum(), [x, w])
    xv = np.arange(6.0).reshape(2, 3)
    wv = np.array([1.0, 2.0, 3.0])
    gxv, gwv = pytensor.function([x, w], [gx, gw])(xv, wv)
    np.testing.assert_allclose(gxv, np.tile(wv, (2, 1)))
    np.testing.assert_allclose(gwv, xv.sum(axis=0))


def test_disconnected_input_gradient():
    x, w, k = pt.matrix(), pt.vector(), pt.iscalar()
    y, _ = scale_op()(x, w, k)
    with pytest.raises(pytensor.gradient.DisconnectedInputError, match="Backtrace when that variable is created"):
        pytensor.grad(y.sum(), k)  # PyTensor's message is the creation trace of the disconnected variable
    assert pytensor.grad(y.sum(), k, disconnected_inputs="ignore") is not None


def test_no_backward_code_errors_only_when_requested():
    op = scale_op(c_bw_code=None, grad_input_map=None)
    x, w = pt.matrix(), pt.vector()
    y, s = op(x, w, np.int32(0))
    pytensor.function([x, w], y.sum())  # building the forward graph is fine
    with pytest.raises(NullTypeGradError, match="no c_bw_code"):
        pytensor.grad(y.sum(), x)


def test_inplace_only_where_allowed(mode):
    x, w = pt.matrix(), pt.vector()
    op = scale_op()
    xv = np.arange(6.0).reshape(2, 3)
    wv = np.array([1.0, 2.0, 3.0])
    ref_y, ref_s = scale_ref(xv + 1, wv, 0)

    def inplace_nodes(f):
        return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, NativeOp) and n.op.destroy_map]

    # The input is an intermediate result: the inplace variant is chosen (except in FAST_COMPILE).
    f = pytensor.function([x, w], op(x + 1, w, np.int32(0)), mode=mode)
    assert len(inplace_nodes(f)) == (0 if mode == "FAST_COMPILE" else 1)
    for got, ref in zip(f(xv, wv), (ref_y, ref_s)):
        np.testing.assert_allclose(got, ref)
    # The input is a graph input: never destroyed.
    f = pytensor.function([x, w], op(x, w, np.int32(0)), mode=mode)
    assert not inplace_nodes(f)
    # The intermediate is needed again afterwards: its value must survive.
    x1 = x + 1
    y, s = op(x1, w, np.int32(0))
    f = pytensor.function([x, w], [y, x1 * 2], mode=mode)
    got_y, got_x1 = f(xv, wv)
    np.testing.assert_allclose(got_y, ref_y)
    np.testing.assert_allclose(got_x1, (xv + 1) * 2)


def test_infer_shape():
    x, w, k = pt.matrix(), pt.vector(), pt.iscalar()
    outs = scale_op()(x, w, k)
    check_infer_shape([x, w, k], outs, [np.ones((3, 5)), np.ones(5), np.int32(1)], NativeOp)
    y, s = outs
    assert y.type.shape == (None, None)
    xs = pt.tensor(shape=(3, 5))
    ys, ss = scale_op()(xs, w, k)
    assert ys.type.shape == (3, 5) and ss.type.shape == (3,)


def test_runtime_check_failures_raise(mode):
    x, w, k = pt.matrix(), pt.vector(), pt.iscalar()
    f = pytensor.function([x, w, k], scale_op()(x, w, k), mode=mode)
    with pytest.raises(ValueError, match=r"ScaleRows.*Ndarray_DIMS\(w\)\[0\] == cols \(2 vs 3\)"):
        f(np.ones((2, 3)), np.ones(2), 0)
    with pytest.raises(RuntimeError, match="ScaleRows.*k must be >= 0, got -1"):
        f(np.ones((2, 3)), np.ones(3), -1)
    # The process is alive and the op still works.
    np.testing.assert_allclose(f(np.ones((2, 3)), np.ones(3), 1)[1], [6.0, 6.0])


def test_wrong_ndim_is_a_type_error():
    with pytest.raises(TypeError, match="ScaleRows.*'x'.*ndim 2, got 1"):
        scale_op()(pt.vector(), pt.vector(), np.int32(0))
    with pytest.raises(TypeError, match="expected 3 inputs"):
        scale_op()(pt.matrix(), pt.vector())
    with pytest.raises(TypeError, match="'k'.*must be int32"):
        scale_op()(pt.matrix(), pt.vector(), pt.scalar())


def test_int_shape_entries_are_checked(mode):
    op = NativeOp(in_info=({"name": "v", "ndim": 1, "shape": (3,)},), out_info=({"ndim": 1, "shape": ((0, 0),)},),
                  c_fw_code="Ndarray_memcpy(Ndarray_DEV_DATA(*outputs[0]), Ndarray_DEV_DATA(inputs[0]), "
                            "3 * sizeof(Float));", name="Fixed3")
    v = pt.vector()
    f = pytensor.function([v], op(v), mode=mode)
    np.testing.assert_allclose(f(np.array([1.0, 2.0, 3.0])), [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="Fixed3.*'v' must have size 3 in dim 0"):
        f(np.ones(4))


@pytest.mark.parametrize("in_info, out_info, match", [
    (({"shape": (None,)},), ({"ndim": 1, "shape": ((0, 0),)},), r"in_info '#0' \(#0\), key 'ndim'"),
    (({"ndim": 1},), ({"name": "o", "ndim": 1, "shape": ((1, 0),)},), r"out_info 'o'.*key 'shape'.*input 1"),
    (({"ndim": 1},), ({"name": "o", "ndim": 1, "shape": ((0, 3),)},), r"out_info 'o'.*key 'shape'.*dim 3 of input 0"),
    (({"ndim": 1},), ({"name": "o", "ndim": 2, "shape": ((0, 0),)},), r"out_info 'o'.*key 'shape'.*length ndim=2"),
    (({"ndim": 1},), ({"name": "o", "ndim": 1},), r"out_info 'o'.*key 'shape'"),
    (({"name": "a", "ndim": 1, "dtype": "complex64"},), ({"ndim": 1, "shape": ((0, 0),)},),
     r"in_info 'a'.*key 'dtype'.*complex64"),
    (({"name": "a", "ndim": 1, "want_inplace": 0}, {"name": "b", "ndim": 1, "want_inplace": 0}),
     ({"ndim": 1, "shape": ((0, 0),)},), r"in_info 'b'.*key 'want_inplace'.*already claimed by input 0"),
    (({"name": "a", "ndim": 1, "want_inplace": 3},), ({"ndim": 1, "shape": ((0, 0),)},),
     r"in_info 'a'.*key 'want_inplace'"),
    (({"name": "a", "ndim": 1, "gradient": "maybe"},), ({"ndim": 1, "shape": ((0, 0),)},),
     r"in_info 'a'.*key 'gradient'"),
])
def test_malformed_spec(in_info, out_info, match):
    with pytest.raises(ValueError, match="NativeOp 'Bad': " + match):
        NativeOp(in_info, out_info, "", name="Bad")


def test_dummy_out_and_grad_spec():
    """The seed's derived spec of LstmGenericBase's gradient op."""
    op = ptnative.ops.LstmGenericBase.make_op()
    assert op.grad_input_map == (1, 2, 3, 4, 5, 7, 9)
    kw = op.kwargs_for_grad_op()
    assert kw["name"] == "GradOfLstmGenericBase"
    assert [i.get("name") for i in kw["in_info"]] == ["V_h", "c", "i", "Y", "H", "D_Y", "D_d"]
    assert kw["in_info"][4]["want_inplace"] == 0 and kw["in_info"][5]["want_inplace"] == "dummy_out"
    grad_op = op.grad_op()
    assert grad_op.num_dummy_outs == 1
    assert [o.get("name") for o in grad_op.out_info] == ["Z", "V_h", "c", "dummy_out_1"]
    assert grad_op.out_info[0]["shape"] == ((2, 0), (2, 1), (0, 1))
    assert grad_op.out_info[3]["shape"] == ((5, 0), (5, 1), (5, 2))
    assert op.make_results_of_gradient(["gz", "gv", "gc"]) == ["gz", "gv", "gc", None]


def test_equal_specs_give_equal_ops():
    assert scale_op() == scale_op() and hash(scale_op()) == hash(scale_op())
    assert scale_op() != scale_op(name="Other")
    assert ptnative.ops.LstmGenericBase.make_op() == ptnative.ops.NativeLstm.make_op()


def test_gen_base_and_hardcoded_float_code(mode):
    """Seed-style code that hard-codes float runs its op in float32 (float_dtypes=("float32",))."""

    class Double(NativeOpGenBase):
        in_info = ({"name": "x", "ndim": 1, "shape": (None,), "need_contiguous": True},)
        out_info = ({"name": "y", "ndim": 1, "shape": ((0, 0),)},)
        c_extra_support_code = {"k": """
            DEF_KERNEL void double_it(const float* x, float* y, long n) {
              int idx = threadIdx.x + blockDim.x * blockIdx.x;
              while (idx < n) { y[idx] = 2.f * x[idx]; idx += gridDim.x * blockDim.x; }
            }"""}
        c_fw_code = """
            assert(n_inputs == 1);
            float* x = (float*)Ndarray_DEV_DATA(inputs[0]);
            start_dev_kernel(double_it, (x, (float*)Ndarray_DEV_DATA(*outputs[0]), Ndarray_DIMS(inputs[0])[0]));
        """
        float_dtypes = ("float32",)

    assert Double.map_layer_inputs_to_op(1, 2) == (1, 2)
    assert Double.map_layer_output_from_op(3, 4) == 3
    x = pt.dvector()
    y = Double.make_op()(x)
    assert y.dtype == "float32"
    np.testing.assert_allclose(pytensor.function([x], y, mode=mode)(np.arange(3.0)), [0.0, 2.0, 4.0])


def test_default_mode_uses_numba_without_object_mode():
    x, w, k = pt.matrix(), pt.vector(), pt.iscalar()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = pytensor.function([x, w, k], scale_op()(x, w, k))
        f(np.ones((2, 3)), np.ones(3), 0)
    from pytensor.link.numba.dispatch.basic import numba_funcify_and_cache_key
    node = f.maker.fgraph.toposort()[-1]
    _, key = numba_funcify_and_cache_key(node.op, node=node)
    assert key is None  # inlined into the graph function (ptnative.config.numba_graph_cache: see test_leaks.py)


def test_compile_error_names_source(tmp_path):
    op = NativeOp(({"ndim": 1},), ({"ndim": 1, "shape": ((0, 0),)},), "this is not C++;", name="Broken")
    x = pt.vector()
    with pytest.raises(ptnative.CompileError, match=r"(?s)Broken.*source: .*\.cpp.*error"):
        pytensor.function([x], op(x), mode="FAST_COMPILE")(np.ones(2))


def test_parallel_builds_share_one_library(tmp_path):
    script = textwrap.dedent(f"""
        import numpy as np, pytensor, pytensor.tensor as pt, ptnative
        op = ptnative.NativeOp(({{"ndim": 1, "need_contiguous": True}},), ({{"ndim": 1, "shape": ((0, 0),)}},),
            "/* {os.getpid()} {tmp_path.name} */ for (int64_t j = 0; j < Ndarray_DIMS(inputs[0])[0]; ++j) "
            "Ndarray_DEV_DATA(*outputs[0])[j] = 3 * Ndarray_DEV_DATA(inputs[0])[j];", name="Parallel")
        x = pt.vector()
        print(pytensor.function([x], op(x), mode="FAST_COMPILE")(np.ones(2)))
    """)
    env = dict(os.environ, PTNATIVE_CACHE_DIR=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "[3. 3.]" in out
    libs = [lib for lib in (tmp_path / "cache").glob("*.so")  # the op's (the OpenBLAS pool's beside it)
            if not lib.name.startswith("ptn_blas_threads_")]
    assert len(libs) == 1
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700


def test_kernel_files_are_found():
    """c_code/ ships as package data: an installed (non-editable) ptnative finds its kernels."""
    kernels = ptnative.source.kernel_dir()
    assert kernels.joinpath("dialect", "native_op.h").is_file() and kernels.joinpath("lstm", "lstm.cu").is_file()
    assert kernels.joinpath("glue", "variant_unit.cc").is_file() and kernels.joinpath("hmm", "hmm_rows.h").is_file()
    if "site-packages" in ptnative.__file__:
        assert "site-packages" in str(kernels)


def test_kernel_sources_stay_on_the_ops_stream():
    """CUDA work in c_code/ goes through the dialect, which queues it on the op's stream (XLA's under JAX).
    Synchronous copies and sets run on the legacy default stream instead, which that stream does not wait
    for: a length read that way can be read before its upload finished (seen on an H200)."""
    import re

    from ptnative.source import kernel_dir

    legacy = re.compile(r"\b(cudaMemcpy|cudaMemset|cudaMemcpyFromSymbol|cudaMemcpyToSymbol|cudaDeviceSynchronize)"
                        r"\s*\(")
    files = [f for folder in kernel_dir().iterdir() if folder.is_dir() for f in folder.iterdir()
             if f.name.endswith((".cu", ".h"))]
    assert len(files) > 5, f"kernel sources not found in {kernel_dir()}"
    found = [f"{f.name}:{n}: {line.strip()}" for f in files
             for n, line in enumerate(f.read_text().splitlines(), 1)
             if legacy.search(line) and not line.lstrip().startswith("//")]
    assert not found, "legacy-stream CUDA calls:\n" + "\n".join(found)


# y[p] = x[p] + 1, one part per element, run by ptn::parallel_parts on threads of their own, or with what >= 10
# on OpenBLAS's worker pool when the parts fit in it (PartsOn::blas_workers).  what % 10 = 1: each part calls BLAS
# (refused); 2: part 1 fails; 3: y[p] = the id of the thread that ran part p; 4: y[p] = the core part p ran on (Linux).
PARTS_FW = """
  Ndarray* x = inputs[0];
  Ndarray* y = *outputs[0];
  int32_t what = Ndarray_DEV_DATA_int32_scalar(inputs[1]);
  int parts = (int)Ndarray_DIMS(x)[0];
#if CUDA
  ptn_set_error("CPU only"); %(fail)s
#else
  const ptn::PartsOn on = what >= 10 ? ptn::PartsOn::blas_workers : ptn::PartsOn::own_threads;
  what %%= 10;
  ptn::parallel_parts(parts, [&](int p) {
    if (what == 1) affine_raw(Ndarray_DEV_DATA(x), 1, 1, Ndarray_DEV_DATA(x), 1, 1, Ndarray_DEV_DATA(y), 1, 1);
    if (what == 2) assert_cmp(p, !=, 1);
    Ndarray_DEV_DATA(y)[p] = what == 3 ? (Float)syscall(SYS_gettid) : what == 4 ? (Float)ptn_probe_core()
                                                                                  : Ndarray_DEV_DATA(x)[p] + 1;
  }, on);
#endif
"""


def parts_op():
    return NativeOp(in_info=({"name": "x", "ndim": 1, "shape": (None,), "need_contiguous": True},
                             {"name": "what", "ndim": 0, "shape": (), "dtype": "int32", "host_memory": True,
                              "gradient": "disconnected"}),
                    out_info=({"name": "y", "ndim": 1, "shape": ((0, 0),)},), c_fw_code=PARTS_FW, name="PartsProbe",
                    c_extra_support_code={"000_gettid": "#include <unistd.h>\n#include <sys/syscall.h>\n",
                                          "001_core": "#include <sched.h>\nstatic int ptn_probe_core() {\n"
                                                      "#ifdef __linux__\n  return sched_getcpu();\n#else\n"
                                                      "  return -1;\n#endif\n}\n"})


@pytest.mark.parametrize("on", [0, 10], ids=["own_threads", "blas_workers"])
def test_parallel_parts(mode, on):
    """Every part runs once, on threads of its own, or with PartsOn::blas_workers on the BLAS pool (2 parts on a
    2-thread OpenBLAS; 9 parts still on threads of their own); an exception in a part is raised to the caller; BLAS
    called from a part is refused instead of deadlocking OpenBLAS's pool."""
    x, what = pt.vector(), pt.iscalar()
    f = pytensor.function([x, what], parts_op()(x, what), mode=mode)
    for n in (0, 1, 2, 9):
        v = np.arange(n, dtype=float)
        np.testing.assert_array_equal(f(v, on), v + 1)
    with pytest.raises(ValueError, match=r"PartsProbe.*p != 1 \(1 vs 1\)"):
        f(np.zeros(3), on + 2)
    for n in (1, 2, 9):
        with pytest.raises(RuntimeError, match="PartsProbe.*BLAS dgemm called from a parallel_parts body"):
            f(np.zeros(n), on + 1)
    np.testing.assert_array_equal(f(np.zeros(2), on), [1, 1])
    # Where the parts ran: a pool's worker stays the same from call to call, a thread started for the call does not.
    # Without PartsOn::blas_workers the parts run on ptnative's pool (blas_threads.parts_runner), where it was built.
    first, second = f(np.zeros(2), on + 3), f(np.zeros(2), on + 3)
    assert first[0] == second[0] != first[1]
    on_pool = first[1] == second[1]
    if on == 10:
        assert on_pool == (blas.thread_pool() is not None)
    else:
        assert on_pool == (blas_threads.parts_runner(build.open_library) is not None)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and 2 cores")
def test_parallel_parts_run_on_different_cores():
    """The two parts of a call run on two cores: a pool's worker that wakes on the caller's core moves to another
    for its part (runtime/blas_threads.cc, SpreadPart).  The caller's core is read at its part's start, so a
    migration of the caller during the call can put them together: most calls, not all, are checked."""
    import time
    x, what = pt.vector(), pt.iscalar()
    f = pytensor.function([x, what], parts_op()(x, what), mode="FAST_COMPILE")
    if blas_threads.parts_runner(build.open_library) is None:
        pytest.skip("no worker pool here")
    apart = 0
    for _ in range(40):
        time.sleep(0.002)  # the worker goes to sleep (after 50 us) and is woken for the call
        cores = f(np.zeros(2), 4)
        assert cores.min() >= 0
        apart += cores[0] != cores[1]
    assert apart >= 36


def test_parallel_parts_from_several_threads_at_once(mode):
    """Calls whose parts run at the same time from several Python threads (the pool serves one; the others start
    threads of their own) each compute their own parts, and a part's failure stays in its own call."""
    import concurrent.futures
    x, what = pt.vector(), pt.iscalar()
    op = parts_op()
    fs = [pytensor.function([x, what], op(x, what), mode=mode) for _ in range(4)]  # a Function serves one thread

    def call(i):
        v = np.arange(2 + i % 3, dtype=float) + 10 * i
        for _ in range(20):
            np.testing.assert_array_equal(fs[i](v, 0), v + 1)
            with pytest.raises(ValueError, match=r"p != 1"):
                fs[i](v, 2)
        return i

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        assert sorted(ex.map(call, range(4))) == list(range(4))


@pytest.mark.parametrize("mode", [None, "C", "CVM", "FAST_COMPILE", "JAX"],
                         ids=["default", "C", "CVM", "FAST_COMPILE", "JAX"])
def test_compile_of_one_node_computes_its_variant_once(mode, monkeypatch):
    """Compiling and running a graph computes each node's variant (translation unit and argument plan) once, builds
    no copy of the op for it, and hands every glue that one object; an op and its inplace form share it."""
    if mode == "JAX":
        pytest.importorskip("jax")
    from ptnative import source

    x, w, k = pt.matrix("x", dtype="float32"), pt.vector("w", dtype="float32"), pt.iscalar("k")
    ops = [argmax_op(), scale_op()]
    y = ops[0](x.T)
    z, s = ops[1](x * 2, w, k)  # x * 2 may be destroyed: the inplace rewrite swaps in ScaleRows' inplace form
    monkeypatch.setattr(source, "_variants", {})  # a cold cache for this test
    computed, given, built = [], [], []
    real_generate, real_variant, real_init = source.generate, NativeOp.variant, NativeOp.__init__
    monkeypatch.setattr(source, "generate",
                        lambda spec, *a: computed.append((spec.name, *a)) or real_generate(spec, *a))
    monkeypatch.setattr(NativeOp, "variant", lambda self, *a: given.append(real_variant(self, *a)) or given[-1])
    monkeypatch.setattr(NativeOp, "__init__", lambda self, *a, **kw: built.append(kw.get("inplace"))
                        or real_init(self, *a, **kw))

    f = pytensor.function([x, w, k], [y, z, s], mode=mode)
    xv = np.arange(6, dtype="float32").reshape(2, 3)
    got = f(xv, np.ones(3, "float32"), 1)
    np.testing.assert_array_equal(got[0], xv.T.argmax(axis=0))
    np.testing.assert_allclose(got[1], xv * 2 + 1)
    assert sorted(computed) == [("ColumnArgmax", "float32", "cpu"), ("ScaleRows", "float32", "cpu")]
    assert {v.symbol for v in given} == {source._variants[key].symbol for key in source._variants}
    assert len({id(v) for v in given}) == 2  # the same two objects every time a glue asked
    assert set(built) <= {(0,)}  # no op was copied to compute a variant; only the inplace rewrite makes one
    inplace = mode not in ("FAST_COMPILE", "JAX")
    assert any(isinstance(n.op, NativeOp) and n.op.inplace for n in f.maker.fgraph.toposort()) == inplace


def test_dependencies_run_from_backends_to_the_spec():
    """The spec, the plan, the variant and the op import no backend (the backends register themselves with the op
    and with PyTensor's dispatch), and the spec side imports nothing of the op: imports at any level, lazy ones
    included."""
    import ast
    import importlib

    def imported(module_name):
        module = importlib.import_module(module_name)
        tree = ast.parse(open(module.__file__).read())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative to the ptnative package
                    base = "ptnative" + ("." + base if base else "")
                names |= {f"{base}.{a.name}" for a in node.names} | {base}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
        return {n for n in names if n.startswith("ptnative")}

    for name in ("ptnative.spec", "ptnative.plan", "ptnative.source", "ptnative.op"):
        assert not {n for n in imported(name) if n.startswith("ptnative.backends")}, name
    for name in ("ptnative.spec", "ptnative.plan", "ptnative.source"):
        assert not {n for n in imported(name) if n == "ptnative.op" or n.startswith("ptnative.op.")}, name
    assert imported("ptnative.spec") == set()
    assert set(ptnative.op.GLUES) == {"c", "python"}


def test_op_without_inputs(mode):
    """An op may have no inputs (fixed output shapes): its input tables are empty, which C spells ``{0}``."""
    op = NativeOp((), ({"name": "ramp", "ndim": 1, "shape": (4,)},),
                  "for (int64_t j = 0; j < 4; ++j) Ndarray_DEV_DATA(*outputs[0])[j] = (Float)j / 2;",
                  name="RampOfFour")
    y = op()
    assert y.type.shape == (4,) and y.dtype == pytensor.config.floatX
    np.testing.assert_array_equal(pytensor.function([], y, mode=mode)(), [0, 0.5, 1, 1.5])


def test_c_module_versions_are_the_same_in_every_process():
    """PyTensor keys its C modules by the ops' cache versions: a version that changed between processes (a str
    hash) would compile every module again in each new process.  Two processes with different hash seeds agree."""
    script = textwrap.dedent("""
        import pytensor.tensor as pt
        from ptnative import NativeOp
        from ptnative.ops.lstm import LstmShapeCheck
        op = NativeOp(({"name": "x", "ndim": 1},), ({"name": "y", "ndim": 1, "shape": ((0, 0),)},), "/* v */", name="V")
        node = op(pt.vector()).owner
        print(LstmShapeCheck().c_code_cache_version(), op.c_code_cache_version_apply(node), op.get_params(node))
    """)
    outs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONHASHSEED=seed)) for seed in ("1", "2")]
    assert all(o.returncode == 0 for o in outs), outs[0].stderr[-3000:] + outs[1].stderr[-3000:]
    assert outs[0].stdout == outs[1].stdout and outs[0].stdout.strip()


def test_library_name_keys_an_include_folder_by_its_headers(tmp_path):
    """A library built with an include folder (the JAX handlers' jaxlib headers, one copy per virtual environment)
    is named by the headers' contents: the same headers elsewhere give the same name, other headers another."""
    from dataclasses import replace

    from ptnative.build import include_dir_digest, library_path

    op = NativeOp(({"name": "x", "ndim": 1},), ({"name": "y", "ndim": 1, "shape": ((0, 0),)},), "/* inc */", name="Inc")
    names = []
    for folder, text in (("a", "int v = 1;"), ("b", "int v = 1;"), ("c", "int v = 2;")):
        (tmp_path / folder / "sub").mkdir(parents=True)
        (tmp_path / folder / "sub" / "h.h").write_text(text)
        include_dir_digest.cache_clear()
        names.append(library_path(replace(op.variant("float64"), include_dirs=(str(tmp_path / folder),))).name)
    assert names[0] == names[1] != names[2]
    assert library_path(op.variant("float64")).name not in names
