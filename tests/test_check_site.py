"""One check site: every mode refuses wrong arguments with the entry point's own check and message.

The checks of a call (each array's rank and element type, the sizes the spec fixes, the outputs' shapes) live in
the entry point (``ptn::check_arguments``, c_code/dialect/native_op_entry.h), which every glue calls: the Python and Numba
driver, PyTensor's C module, the XLA FFI handler (on every call, before it copies a buffer) and JAX mode when it
traces a call.  Specs are generated (hypothesis): fixed sizes, ranks and dtypes; each is fed a wrong-sized,
wrong-rank and wrong-dtype input in every mode, ``jax.jit`` of the jaxified graph and the bare FFI call included,
and every path must raise the same exception with the same message, computed here independently of the C code.
"""

from __future__ import annotations

import re

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptnative import KernelValueError, NativeOp
from ptnative.build import argument_error

jax = pytest.importorskip("jax")
import pytensor.link.jax.dispatch  # noqa: E402,F401  (sets jax_enable_x64 from floatX, as test_jax.py explains)

from ptnative.backends.jax import ffi_target, jaxify_graph  # noqa: E402

PYTENSOR_MODES = [None, "C", "CVM", "FAST_COMPILE", "JAX"]
INPUT_DTYPES = ["float64", "int32"]  # "float64": the op's floating type (the spec says "float")

# A kernel that reads every element of every input and writes the sum of input 0 into each output element: an
# input smaller than the spec says would be read past its end.
FW = """
  Float total = 0;
  for (int i = 0; i < n_inputs; ++i) {
    const int64_t n = Ndarray_SIZE(inputs[i]);
    for (int64_t e = 0; e < n; ++e)
      total += inputs[i]->itemsize == 4 ? (Float)((const int32_t*)inputs[i]->data)[e]
                                        : ((const Float*)inputs[i]->data)[e];
  }
  const int64_t m = Ndarray_SIZE(*outputs[0]);
  for (int64_t e = 0; e < m; ++e) Ndarray_DEV_DATA(*outputs[0])[e] = total;
"""


@st.composite
def specs(draw):
    """(in_info, out_info, dtypes): 1 to 3 contiguous inputs of rank 1 to 3, each dimension free or fixed (1 to 4
    elements), at least one fixed; float or int32; one float output shaped by input 0's first dimension and a
    fixed size."""
    n_in = draw(st.integers(1, 3))
    in_info, dtypes = [], []
    for i in range(n_in):
        ndim = draw(st.integers(1, 3))
        shape = tuple(draw(st.one_of(st.none(), st.integers(1, 4))) for _ in range(ndim))
        dtype = draw(st.sampled_from(INPUT_DTYPES))
        info = {"name": f"in{i}", "ndim": ndim, "shape": shape, "need_contiguous": True}
        if dtype != "float64":  # without a dtype, the op's floating type
            info["dtype"] = dtype
        in_info.append(info)
        dtypes.append(dtype)
    if all(s is None for info in in_info for s in info["shape"]):
        in_info[0]["shape"] = (2,) + in_info[0]["shape"][1:]
    out_info = ({"name": "out", "ndim": 2, "shape": ((0, 0), 2)},)
    return tuple(in_info), out_info, dtypes


def right_values(in_info, dtypes, rng):
    values = []
    for info, dtype in zip(in_info, dtypes):
        shape = tuple(s if isinstance(s, int) else int(rng.integers(1, 4)) for s in info["shape"])
        values.append((rng.integers(-3, 4, size=shape)).astype(dtype))
    return values


def wrong_cases(in_info, dtypes, values):
    """(name, values, message) per way to get an argument wrong, the message as the entry point words it."""
    cases = []
    for i, (info, dtype) in enumerate(zip(in_info, dtypes)):
        name = info["name"]
        for d, s in enumerate(info["shape"]):
            if isinstance(s, int):
                bad = list(values)
                shape = list(values[i].shape)
                shape[d] = s + 1
                bad[i] = np.ones(shape, dtype)
                cases.append(("size", bad, f"input {name!r} must have size {s} in dim {d}"))
                break
        rank = len(info["shape"])
        bad = list(values)
        bad[i] = values[i].reshape(values[i].shape + (1,))
        cases.append(("rank", bad, f"input {name!r} has {rank + 1} dimensions where the op takes {rank}"))
        other = "complex128" if dtype == "float64" else "int64"  # not convertible without loss
        bad = list(values)
        bad[i] = values[i].astype(other)
        cases.append(("dtype", bad, f"input {name!r} has dtype {other} where the op takes {dtype}"))
    return cases


def expected(values):
    total = sum(float(v.astype(np.float64).sum()) for v in values)
    return np.full((values[0].shape[0], 2), total)


def make_op(in_info, out_info):
    return NativeOp(in_info=in_info, out_info=out_info, c_fw_code=FW, name="Generated")


def symbolic_inputs(in_info, dtypes):
    return [pt.tensor(dtype=dt, shape=(None,) * info["ndim"], name=info["name"]) for info, dt in zip(in_info, dtypes)]


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(specs())
def test_every_mode_refuses_wrong_arguments_with_the_entry_points_message(spec):
    in_info, out_info, dtypes = spec
    op = make_op(in_info, out_info)
    rng = np.random.default_rng(len(str(spec)))
    values = right_values(in_info, dtypes, rng)
    inputs = symbolic_inputs(in_info, dtypes)
    functions = {mode: pytensor.function(inputs, op(*inputs), mode=mode) for mode in PYTENSOR_MODES}
    jitted = jax.jit(jaxify_graph(inputs, [op(*inputs)]))
    for mode, f in functions.items():
        np.testing.assert_array_equal(np.asarray(f(*values)), expected(values), err_msg=str(mode))
    np.testing.assert_array_equal(np.asarray(jitted(*values)[0]), expected(values))

    variant = op.variant("float64", "cpu")
    for kind, bad, message in wrong_cases(in_info, dtypes, values):
        full = f"NativeOp 'Generated': {message}"
        # The entry point's check itself, asked directly.
        out_shape = [(bad[0].shape[0] if bad[0].ndim else 0, 2)]
        assert argument_error(variant, [v.shape for v in bad] + out_shape,
                              [v.dtype for v in bad] + [np.dtype("float64")]) == message
        # JAX without PyTensor's input checks: the traced call is refused with the same message.
        with pytest.raises(KernelValueError, match=re.escape(full) + r"(\n|$)"):
            jitted(*bad)
        if kind == "size":  # PyTensor's input check refuses another rank or a lossy dtype first, in every mode alike
            for mode, f in functions.items():
                with pytest.raises(KernelValueError, match=re.escape(full)):
                    f(*bad)
        else:
            messages = set()
            for mode, f in functions.items():
                with pytest.raises(TypeError) as info:
                    f(*bad)
                messages.add(str(info.value).split("\n")[0])
            assert len(messages) == 1, messages


def test_the_ffi_handler_checks_every_call_before_it_touches_a_buffer():
    """A call made by hand through the FFI target (no trace-time check) with an input of the wrong size, rank or
    type, or an output of the wrong shape, is refused by the handler with the entry point's message, before it
    copies an input into its output (here the output starts as the input's copy, so a short input would be read
    past its end)."""
    op = NativeOp(in_info=({"name": "x", "ndim": 2, "shape": (None, 4), "need_contiguous": True, "want_inplace": 0},),
                  out_info=({"name": "y", "ndim": 2, "shape": ((0, 0), (0, 1))},), c_fw_code="", name="Copy4")
    variant = op.variant("float64", "cpu")
    target = ffi_target(variant)
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        good = np.arange(12.0).reshape(3, 4)
        got = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((3, 4), np.float64))(good, symbol=variant.symbol)
        np.testing.assert_array_equal(np.asarray(got), good)
        cases = [
            (np.ones((3, 3)), (3, 3), np.float64, "input 'x' must have size 4 in dim 1"),
            (np.ones(12), (12,), np.float64, "input 'x' has 1 dimension where the op takes 2"),
            (np.ones((3, 4), np.int64), (3, 4), np.float64, "input 'x' has dtype int64 where the op takes float64"),
            (np.ones((3, 4)), (4, 4), np.float64, "output 'y' must have size 3 in dim 0"),
            (np.ones((3, 4)), (3, 4), np.float32, "output 'y' has dtype float32 where the op takes float64"),
            (np.ones((1,) * 9), (3, 4), np.float64, "input 'x' has 9 dimensions where the op takes 2"),
        ]
        for x, out_shape, out_dtype, message in cases:
            call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(out_shape, out_dtype))
            with pytest.raises(jax.errors.JaxRuntimeError,
                               match=re.escape(f"INVALID_ARGUMENT: NativeOp 'Copy4': {message}")):
                jax.block_until_ready(call(x, symbol=variant.symbol))
    finally:
        jax.config.update("jax_enable_x64", x64)


def test_hostile_names_are_quoted_by_the_check():
    """Input names are user strings: the check's message quotes them as Python's repr does, whatever they hold."""
    for name in ["x%s%n", 'q"uote', "new\nline", "é€😀", "@NAME@", "nul\0byte"]:
        op = NativeOp(in_info=({"name": name, "ndim": 1, "shape": (3,), "need_contiguous": True},),
                      out_info=({"name": "y", "ndim": 1, "shape": ((0, 0),)},), c_fw_code="", name="Hostile")
        assert argument_error(op.variant("float64"), [(4,), (4,)], ["float64", "float64"]) == \
            f"input {name!r} must have size 3 in dim 0"


ROWSUM4 = dict(
    in_info=({"name": "x", "ndim": 2, "shape": (None, 4), "need_contiguous": True},),
    out_info=({"name": "y", "ndim": 1, "shape": ((0, 0),)},),
    c_extra_support_code="""
        DEF_KERNEL void rowsum4(const Float* x, Float* y, int64_t n) {
          for (int64_t i = threadIdx.x + blockDim.x * blockIdx.x; i < n; i += blockDim.x * gridDim.x)
            y[i] = x[4 * i] + x[4 * i + 1] + x[4 * i + 2] + x[4 * i + 3];
        }""",
    c_fw_code="start_dev_kernel(rowsum4, (Ndarray_DEV_DATA(inputs[0]), Ndarray_DEV_DATA(*outputs[0]), "
              "Ndarray_DIMS(inputs[0])[0]));",
    name="RowSum4")


@pytest.mark.parametrize("path", ["cpu", "emulated_cuda"])
def test_the_issue_example_is_refused_on_both_targets(path):
    """The op of the report (a kernel reading 4 elements per row) fed 3 columns: refused before the kernel runs,
    on the CPU path and on the CUDA path run by the emulation, whose device buffers have guard pages (a read past
    the input would crash the process there)."""
    from .test_cuda_emulation import emulated

    op = NativeOp(**ROWSUM4)
    if path == "emulated_cuda":
        op = emulated(op)
    x = pt.matrix("x")
    f = pytensor.function([x], op(x), mode="FAST_COMPILE")
    np.testing.assert_array_equal(f(np.arange(12.0).reshape(3, 4)), [6.0, 22.0, 38.0])
    with pytest.raises(KernelValueError, match=re.escape("NativeOp 'RowSum4': input 'x' must have size 4 in dim 1")):
        f(np.ones((3, 3)))
