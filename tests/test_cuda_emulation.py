"""Every catalogue op's CUDA code path, run on the CPU, against its CPU path.

An emulated op is the catalogue op with its kernel text compiled with ``CUDA = 1`` (the ``#if CUDA`` branches: the
kernels, their launches, the host code around them) behind ``tests/cuda_emulation.h``, which runs each launch's
blocks and threads as fibers with real barriers and shared memory, keeps device arrays in their own guarded,
C-contiguous buffers that host code cannot touch, and reports failed device checks as CUDA does.  Its body runs as
the CUDA entry point runs it (device copies in, outputs copied back).  The cases are the GPU test's
(tests/gpu/cases.py), on their small value set; a CUDA-only bug (a wrong index in a kernel, a missing barrier,
host code reading device memory, a device-side check where the user needs a message) fails here without a GPU.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytensor
import pytest

from ptnative import NativeOp
from ptnative.build import QUICK_BUILD_MARK
from ptnative.op import NativeOpGenBase
from ptnative.source import c_string_literal

from .gpu.cases import CASES, assert_outputs_close, compile_case, params

EMULATION_HEADER = (Path(__file__).parent / "cuda_emulation.h").read_text()
MARKER = "// ---- CUDA emulation (tests/cuda_emulation.h)\n"
MODE = "FAST_COMPILE"  # the kernels are the point; no Numba compilation of the graph


def _on_device_body(code: str, in_info, out_info) -> str:
    """``code`` (an op's %-formatted body) run on device copies of its arrays (``ptn_emu::run_body``)."""
    host_memory = ", ".join(str(int(bool(i.get("host_memory")))) for i in in_info) or "0"
    names = [i.get("name", f"input{k}") for k, i in enumerate(in_info)]
    names += [o.get("name", f"output{k}") for k, o in enumerate(out_info)]
    names_c = ", ".join(c_string_literal(n) for n in names).replace("%", "%%")
    return ("{\n"
            f"  static const int ptn_emu_host_memory[] = {{{host_memory}}};\n"
            f"  static const char* const ptn_emu_names[] = {{{names_c}}};\n"
            "  ptn_emu::run_body(n_inputs, inputs, n_outputs, outputs, ptn_emu_host_memory, ptn_emu_names,\n"
            "                    [&](int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {\n"
            "    (void)n_inputs; (void)n_outputs; (void)inputs; (void)outputs;\n"
            f"{code}\n"
            "  });\n"
            "}\n")


def emulated(op: NativeOp) -> NativeOp:
    """``op`` with its kernel text's CUDA branches, run by the emulation (its gradient op too)."""
    if op.c_extra_support_code.startswith(MARKER):
        return op
    changes = dict(
        c_extra_support_code=(MARKER + QUICK_BUILD_MARK + "\n" + EMULATION_HEADER + "#undef CUDA\n#define CUDA 1\n"
                              + op.c_extra_support_code),
        c_fw_code=_on_device_body(op.c_fw_code, op.in_info, op.out_info),
    )
    if op.c_bw_code:
        grad = op.grad_op()
        changes["c_bw_code"] = _on_device_body(op.c_bw_code, grad.in_info, grad.out_info)
    return op.clone_with(**changes)


def is_emulated(op: NativeOp) -> bool:
    return op.c_extra_support_code.startswith(MARKER)


@contextmanager
def emulated_catalogue(monkeypatch):
    """Every op made by a catalogue generator (also inside pullbacks) is emulated while this is active."""
    make_op = NativeOpGenBase.make_op.__func__
    with monkeypatch.context() as m:
        m.setattr(NativeOpGenBase, "make_op", classmethod(lambda cls, **kw: emulated(make_op(cls, **kw))))
        yield


def run_emulated(case, dtype, monkeypatch):
    """The case's outputs on its first value set, every native op emulated."""
    with emulated_catalogue(monkeypatch):
        inputs, outputs, value_sets = case.build(lambda cls, **kw: cls.make_op(**kw), dtype)
        f = pytensor.function(inputs, outputs, mode=MODE)
        native = [n.op for n in f.maker.fgraph.toposort() if isinstance(n.op, NativeOp)]
        assert native and all(is_emulated(op) for op in native), [op.name for op in native if not is_emulated(op)]
        return [[np.array(r, copy=True) for r in f(*value_sets[0])]]


def run_cpu(case, dtype):
    f, value_sets = compile_case(case, dtype, "cpu", mode=MODE)
    return [[np.array(r, copy=True) for r in f(*value_sets[0])]]


@pytest.mark.parametrize("case,dtype", [p for p in params() if p[1] != "float32"], ids=str)
def test_cuda_path_matches_cpu(case, dtype, monkeypatch):
    """Forward and gradients of every catalogue op (float64 / int; float32 below), CUDA form vs CPU form."""
    assert_outputs_close(case, dtype, run_emulated(case, dtype, monkeypatch), run_cpu(case, dtype),
                         "emulated cuda vs cpu")


FLOAT32_CASES = ["native_lstm2", "chunking", "ctc_loss", "hmm_inference", "hsmm", "rnnt", "sparse_coo"]


@pytest.mark.parametrize("case", [c for c in CASES if c.name in FLOAT32_CASES], ids=str)
def test_cuda_path_matches_cpu_float32(case, monkeypatch):
    assert_outputs_close(case, "float32", run_emulated(case, "float32", monkeypatch), run_cpu(case, "float32"),
                         "emulated cuda vs cpu")


def test_lstm_generic_gradient_of_one_frame(monkeypatch):
    from ptnative.ops.lstm import LstmGenericBase

    from .gpu import cases

    case = cases._case("lstm_generic_one_frame", "lstm", [LstmGenericBase], cases._lstm_generic, [(1, 3, 4)])
    want = run_cpu(case, "float64")
    assert_outputs_close(case, "float64", run_emulated(case, "float64", monkeypatch), want, "emulated cuda vs cpu")


def test_emulated_ops_are_built_quickly():
    """The emulation's libraries are compiled at -O0 (they check the CUDA path, not its speed; g++ takes a third of
    its -O3 time), under names of their own; the catalogue's kernels keep -O3."""
    from ptnative.build import compile_command, library_path
    from ptnative.ops.sparse import SparseToDense

    op = SparseToDense.make_op()
    real, emu = op.variant("float64"), emulated(op).variant("float64")
    real_cmd, emu_cmd = (compile_command(v, Path("SRC"), Path("OUT")) for v in (real, emu))
    assert "-O3" in real_cmd and "-O0" not in real_cmd
    assert "-O0" in emu_cmd and "-O3" not in emu_cmd
    assert [f for f in emu_cmd if f != "-O0"] == [f for f in real_cmd if f != "-O3"]
    assert library_path(real) != library_path(emu)


def test_every_family_is_emulated():
    assert {c.family for c in CASES} == {"lstm", "chunking", "edit_distance", "fsa", "hmm", "hsmm", "rnnt", "sparse"}


# ------------------------------------------------------------------ the emulation catches CUDA-only bugs
# One small op whose CUDA branch is the CPU's computation done the CUDA way, with one planted defect per variant:
# y[b] = sum(x[b, :]) by a block reduction in shared memory (one block per row).
_ROW_SUM = r"""
#if CUDA
#define ROWS_THREADS 8
DEF_KERNEL void row_sum_kernel(const Float* x, Float* y, int64_t B, int64_t D) {
  DEF_SHARED(Float, sh);
  for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
    Float acc = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += x[b * D + j];
    sh[threadIdx.x] = acc;
    SYNC_1;
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
      __syncthreads();
    }
    if (threadIdx.x == 0) y[Y_INDEX] = sh[0];
    SYNC_2;
  }
}
#endif
static void row_sum(Ndarray* x, Ndarray* y) {
  const int64_t B = Ndarray_DIMS(x)[0], D = Ndarray_DIMS(x)[1];
#if CUDA
  HOST_CHECK;
  if (B > 0) start_dev_kernel2(row_sum_kernel, GRID, ROWS_THREADS, ROWS_THREADS * sizeof(Float), (Ndarray_DEV_DATA(x),
                               Ndarray_DEV_DATA(y), B, D));
  HANDLE_LAST_ERROR();
#else
  for (int64_t b = 0; b < B; ++b) {
    Float acc = 0;
    for (int64_t j = 0; j < D; ++j) acc += Ndarray_DEV_DATA(x)[b * D + j];
    Ndarray_DEV_DATA(y)[b] = acc;
  }
#endif
}
"""
_ROW_SUM_DEFAULTS = {"SYNC_1": "__syncthreads()", "SYNC_2": "__syncthreads()", "Y_INDEX": "b", "GRID": "B",
                     "HOST_CHECK": "(void)0"}


def _row_sum_op(**planted):
    text = _ROW_SUM
    for key, value in {**_ROW_SUM_DEFAULTS, **planted}.items():
        text = text.replace(key, value)
    return NativeOp(
        in_info=({"name": "x", "ndim": 2, "shape": (None, None), "need_contiguous": True},),
        out_info=({"name": "y", "ndim": 1, "shape": ((0, 0),)},),
        c_fw_code="row_sum(inputs[0], *outputs[0]);", c_extra_support_code=text, name="RowSum")


def _row_sum(op, x):
    xv = pytensor.tensor.dmatrix("x")
    return pytensor.function([xv], op(xv), mode=MODE)(x)


ROWS = np.random.default_rng(0).normal(size=(5, 13))


def test_emulated_reduction_matches():
    op = _row_sum_op()
    np.testing.assert_allclose(_row_sum(emulated(op), ROWS), _row_sum(op, ROWS), rtol=1e-12)
    np.testing.assert_allclose(_row_sum(op, ROWS), ROWS.sum(1), rtol=1e-12)


def test_emulation_catches_a_missing_barrier():
    """Without the barrier after the shared-memory store, some thread reads a neighbour's slot before it is written
    (the threads of a block run in a shuffled order between barriers): wrong sums (NaN from the 0xff fill)."""
    got = _row_sum(emulated(_row_sum_op(SYNC_1="(void)0")), ROWS)
    assert not np.allclose(got, ROWS.sum(1), equal_nan=True)


def test_emulation_runs_grid_stride_loops_on_any_grid():
    np.testing.assert_allclose(_row_sum(emulated(_row_sum_op(GRID="2")), ROWS), ROWS.sum(1), rtol=1e-12)


@pytest.mark.parametrize("planted,message", [
    ({"HOST_CHECK": "if (Ndarray_DEV_DATA(x)[0] > 1e300) return"},
     r"cuda emulation: host code touched the device buffer of input 'x'"),
    ({"Y_INDEX": "b + 1"}, r"cuda emulation: kernel code ran past the end of the device buffer of output 'y'"),
    ({"HOST_CHECK": "assert_cmp(B, <, 0)"}, r"check failed: B < 0"),
    ({"SYNC_2": "__syncthreads(); assert_cmp(b, <, 3)"}, r"check failed in device code at line \d+"),
    ({"GRID": "B - 5"}, r"cuda emulation: an empty or too large grid \(invalid configuration on CUDA\)"),
])
def test_emulation_reports_cuda_only_faults(planted, message):
    op = _row_sum_op(**planted)
    with pytest.raises(Exception, match=message):
        _row_sum(emulated(op), ROWS)
    if "HOST_CHECK" not in planted or "assert" in planted["HOST_CHECK"]:
        return
    np.testing.assert_allclose(_row_sum(op, ROWS), ROWS.sum(1), rtol=1e-12)  # the CPU build does not see it


def test_planted_catalogue_kernel_bug_is_caught(monkeypatch):
    """A one-character bug in chunking's CUDA gather kernel (the CPU loop is untouched) fails the comparison."""
    from ptnative.ops.chunking import Chunking

    case = next(c for c in CASES if c.name == "chunking")
    text = Chunking.c_extra_support_code["chunking"]
    bad = text.replace("int64_t t = c * g.step + x;\n    bool valid",
                       "int64_t t = c * g.step + x + 1;\n    bool valid", 1)
    assert bad != text
    with monkeypatch.context() as m:
        m.setattr(Chunking, "c_extra_support_code", {"chunking": bad})
        got = run_emulated(case, "float64", monkeypatch)
    want = run_cpu(case, "float64")
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        assert_outputs_close(case, "float64", got, want)


# ------------------------------------------------------------------ errors on the CUDA path
def _chunking_op_call():
    from ptnative.ops.chunking import Chunking

    x, m, buf, ibuf, params = (pytensor.tensor.tensor3("x"), pytensor.tensor.matrix("m"),
                               pytensor.tensor.tensor3("buf"), pytensor.tensor.matrix("ibuf"),
                               pytensor.tensor.vector("params"))
    return [x, m, buf, ibuf, params], Chunking.make_op()(x, m, buf, ibuf, params)


def _unchunk_call():
    from ptnative.ops.chunking import unchunk

    c, m = pytensor.tensor.tensor3("c"), pytensor.tensor.matrix("m")
    return [c, m], unchunk(c, m, 3, 2, 5, 2)[0]


def _sparse_call(fn_name):
    import ptnative.ops.sparse as sp

    def build():
        s0, s1, w, m = (pytensor.tensor.matrix(n) for n in ("s0", "s1", "w", "m"))
        if fn_name == "sparse_to_dense":
            return [s0, s1, w, m], sp.sparse_to_dense(s0, s1, w, m, 3, 4, strict=True)
        if fn_name == "max_and_argmax_sparse":
            om, oa = pytensor.tensor.matrix("om"), pytensor.tensor.matrix("oa")
            return [s0, s1, w, m, om, oa], list(sp.max_and_argmax_sparse(s0, s1, w, m, om, oa, strict=True))
        z, zm = pytensor.tensor.tensor3("z"), pytensor.tensor.matrix("zm")
        return [z, zm, s0, s1, w, m], list(sp.crossentropy_softmax_and_gradient_z_sparse(z, zm, s0, s1, w, m,
                                                                                          strict=True))
    return build


def _sbi_call():
    from ptnative.ops.sparse import subtensor_batched_index

    x, idx = pytensor.tensor.tensor3("x"), pytensor.tensor.matrix("idx")
    return [x, idx], subtensor_batched_index(x.transpose(2, 1, 0), idx.T, strict=True)  # strided views


_E = np.zeros
_COO_BAD_S1 = [np.array([[0.0, 1], [2, 0]]), np.array([[1.0, 4], [3, 0]]), np.ones((2, 2)), np.ones((2, 2))]
ERROR_CASES = [
    ("chunk_params", _chunking_op_call,
     [_E((5, 2, 1)), np.ones((5, 2)), _E((3, 4, 1)), _E((3, 4)), np.array([3.0, 1.5])],
     r"chunk_step must be a positive integer, got 1.5"),
    ("chunk buffers", _chunking_op_call,
     [_E((5, 2, 1)), np.ones((5, 2)), _E((3, 6, 1)), _E((3, 6)), np.array([3.0, 2])],
     r"n_batch \* n_chunks.*is 6, expected 4"),
    ("unchunk shapes", _unchunk_call, [_E((3, 6, 1)), np.ones((3, 6))], r"UnChunking.*dim 1"),
    ("subtensor_batched_index strict", _sbi_call, [np.ones((4, 2, 3)), np.array([[0.0, 1, 2], [1, 4, 0]])],
     r"SubtensorBatchedIndex: idx\[1, 1\] = 4 is out of range \[0, 4\)"),
    ("sparse_to_dense strict", _sparse_call("sparse_to_dense"), _COO_BAD_S1,
     r"SparseToDense: s1\[0, 1\] = 4 is out of range \[0, 4\)"),
    ("max_and_argmax_sparse strict", _sparse_call("max_and_argmax_sparse"),
     [np.array([[0.0, 3], [2, 0]]), *_COO_BAD_S1[1:], _E((3, 2)), _E((3, 2))],
     r"MaxAndArgmaxSparse: s0\[0, 1\] = 3 is out of range \[0, 3\)"),
    ("crossentropy strict", _sparse_call("crossentropy"), [_E((3, 2, 4)), np.ones((3, 2)), *_COO_BAD_S1],
     r"CrossEntropySoftmaxAndGradientZSparse: y_target_i\[0, 1\] = 4 is out of range \[0, 4\)"),
    ("crossentropy strict, no frames", _sparse_call("crossentropy"), [_E((0, 2, 4)), _E((0, 2)), *_COO_BAD_S1],
     r"CrossEntropySoftmaxAndGradientZSparse: y_target_t\[0, 0\] = 0 is out of range \[0, 0\)"),
]


def _error_of(build, values, message):
    inputs, outputs = build()
    f = pytensor.function(inputs, outputs, mode=MODE)
    with pytest.raises(ValueError, match=message) as info:
        f(*values)
    return str(info.value).splitlines()[0]


@pytest.mark.parametrize("name,build,values,message", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_cuda_path_errors_are_the_cpu_ones(name, build, values, message, monkeypatch):
    """Bad input gives the same ValueError, in the user's terms, on both paths (chunking, sparse)."""
    cpu = _error_of(build, values, message)
    with emulated_catalogue(monkeypatch):
        cuda = _error_of(build, values, message)
    assert cuda == cpu


# ------------------------------------------------------------------ the fuzz suite's bad inputs on the CUDA path
# Every catalogue function's cases from tests/fuzz_cases.py (NaN and inf, empty batch, zero lengths, out-of-range
# labels and lengths, shape mismatches, strided and negative-stride views), with every op emulated: the same
# documented results and clear errors as on the CPU.  They run in a fuzz worker of their own (tests/fuzz_runner.py,
# one child process for the module, every op made in it emulated): a case that crashes the child is a failed case
# and the rest of the function's cases run in a fresh child.
FUZZ_SKIP_CATEGORIES = {"leak"}  # resident memory over thousands of calls: a property of the host path


@contextmanager
def fuzz_cases_on_the_emulated_cuda_path(function):  # pragma: no cover - runs in the fuzz worker
    """(in the fuzz worker) ``function``'s fuzz cases in FAST_COMPILE, built and run while every catalogue op is
    emulated, with "unchanged" outputs compared to rounding (atomic sums)."""
    from tests import fuzz_cases

    monkeypatch = pytest.MonkeyPatch()
    exact_equal = fuzz_cases.equal

    def equal(got, want, what="output", exact=True, rtol=1e-10, atol=1e-12):
        # Atomic sums (the CTC and Baum-Welch kernels') add up in another order when the work of other batch
        # entries changes, on a GPU as here: "unchanged" is to rounding, not bit for bit.
        if exact:
            single = np.asarray(got).dtype == np.float32
            rtol, atol = (1e-5, 1e-6) if single else (1e-11, 1e-13)
        exact_equal(got, want, what, exact=False, rtol=rtol, atol=atol)

    try:
        monkeypatch.setattr(fuzz_cases, "equal", equal)
        with emulated_catalogue(monkeypatch):
            yield [c for c in fuzz_cases.cases_for(function, MODE) if c[1] not in FUZZ_SKIP_CATEGORIES]
    finally:
        monkeypatch.undo()


def _fuzz_functions():
    from tests import fuzz_cases

    return [f for f in fuzz_cases.FUNCTIONS if f != "memory_leak"]


@pytest.fixture(scope="module")
def emulation_worker():
    from .fuzz_runner import Worker

    w = Worker()
    yield w
    w.close()


@pytest.mark.parametrize("function", _fuzz_functions())
def test_fuzz_cases_on_the_cuda_path(emulation_worker, function):
    from .fuzz_runner import run_isolated

    results = run_isolated(emulation_worker, {"kind": "catalogue_cuda_emulation", "function": function},
                           timeout=1500)
    failed = [f"[{r['status']}] {r['case']}: {r['message']}" for r in results if r["status"] != "ok"]
    assert results and not failed, f"{function}: {len(failed)} of {len(results)} cases failed:\n" + "\n".join(failed)
