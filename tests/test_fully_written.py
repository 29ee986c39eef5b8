"""Outputs declared ``fully_written`` (the kernel writes every element): not zeroed before the kernel runs, and
filled with 0xFF bytes under ``PTNATIVE_POISON_OUTPUTS=1`` so that an element a kernel misses shows (NaN, -1), or with
0x5A bytes under ``PTNATIVE_POISON_OUTPUTS=2`` (an int32 of 1515870810: no value an int output holds, where -1 is)."""

import shutil

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from ptnative import NativeOp
from ptnative.plan import ArgumentPlan

from .conftest import MODES

# y = 2 x everywhere (fully_written); z[0] = 1 only (not flagged: the rest stays zero).
HONEST_FW = """
  const Ndarray* x = inputs[0];
  Ndarray* y = *outputs[0];
  Ndarray* z = *outputs[1];
  const int64_t n = Ndarray_DIMS(x)[0];
  for (int64_t i = 0; i < n; ++i) Ndarray_DEV_DATA(y)[i] = 2 * Ndarray_DEV_DATA(x)[i];
  if (n > 0) Ndarray_DEV_DATA(z)[0] = 1;
"""
# Dx = 2 Dy everywhere (the gradient output is fully_written through bw_out_var).
HONEST_BW = """
  const Ndarray* Dy = inputs[0];
  Ndarray* Dx = *outputs[0];
  const int64_t n = Ndarray_DIMS(Dy)[0];
  for (int64_t i = 0; i < n; ++i) Ndarray_DEV_DATA(Dx)[i] = 2 * Ndarray_DEV_DATA(Dy)[i];
"""
# Claims fully_written outputs but writes element 0 only: what the poison makes visible.
PARTIAL_FW = """
  Ndarray* y = *outputs[0];
  Ndarray* c = *outputs[1];
  if (Ndarray_DIMS(y)[0] > 0) { Ndarray_DEV_DATA(y)[0] = 5; Ndarray_DEV_DATA_int32(c)[0] = 7; }
"""

X_IN = {"name": "x", "ndim": 1, "shape": (None,), "need_contiguous": True,
        "bw_out_var": {"fully_written": True, "shape": ((0, 0),)}}  # sized like Dy, the gradient op's input 0


def honest_op():
    return NativeOp(
        name="FullyWrittenHonest",
        in_info=(X_IN,),
        out_info=({"name": "y", "ndim": 1, "shape": ((0, 0),), "fully_written": True},
                  {"name": "z", "ndim": 1, "shape": ((0, 0),)}),
        c_fw_code=HONEST_FW, c_bw_code=HONEST_BW,
        grad_input_map=(3,),  # Dy only
    )


def partial_op():
    return NativeOp(
        name="FullyWrittenPartial",
        in_info=({"name": "x", "ndim": 1, "shape": (None,), "gradient": "disconnected"},),
        out_info=({"name": "y", "ndim": 1, "shape": ((0, 0),), "fully_written": True},
                  {"name": "c", "ndim": 1, "shape": ((0, 0),), "dtype": "int32", "fully_written": True}),
        c_fw_code=PARTIAL_FW,
    )


def every_mode():
    modes = list(MODES)
    try:
        import jax  # noqa: F401
        modes.append("JAX")
    except ImportError:
        pass
    return modes


@pytest.mark.parametrize("poison", ["0", "1", "2"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", every_mode())
def test_fully_written_outputs_and_their_gradient(mode, dtype, poison, monkeypatch):
    monkeypatch.setenv("PTNATIVE_POISON_OUTPUTS", poison)
    x = pt.vector("x", dtype=dtype)
    y, z = honest_op()(x)
    dx = pytensor.grad((y * np.arange(1, 7, dtype=dtype)).sum(), x)
    f = pytensor.function([x], [y, z, dx], mode=mode)
    xv = np.linspace(-1, 1, 6).astype(dtype)
    yv, zv, dxv = f(xv)
    np.testing.assert_array_equal(yv, 2 * xv)
    np.testing.assert_array_equal(zv, [1, 0, 0, 0, 0, 0])  # not flagged: zeroed, poison or not
    np.testing.assert_array_equal(dxv, 2 * np.arange(1, 7, dtype=dtype))
    empty = pytensor.function([x], [y, z, pytensor.grad(y.sum(), x)], mode=mode)(np.zeros(0, dtype))
    assert [v.shape for v in empty] == [(0,)] * 3


@pytest.mark.parametrize("mode", every_mode())
def test_poison_shows_elements_a_kernel_does_not_write(mode, poison_pattern):
    x = pt.dvector("x")
    f = pytensor.function([x], list(partial_op()(x)), mode=mode)
    # the elements not written hold the pattern's bytes: NaN and -1 (0xFF), about 1e127 and 1515870810 (0x5A)
    want_c = np.frombuffer(poison_pattern * 4, np.int32)[0]
    assert want_c == {b"\xff": -1, b"\x5a": 0x5A5A5A5A}[poison_pattern]
    for _ in range(2):  # also when a mode reuses the previous call's output buffers
        y, c = f(np.ones(4))
        assert y[0] == 5 and c[0] == 7
        assert y[1:].tobytes() == poison_pattern * 24
        np.testing.assert_array_equal(c, [7, want_c, want_c, want_c])
        assert np.isnan(y[1:]).all() == (poison_pattern == b"\xff")


def test_plan_and_gradient_spec_carry_the_flag():
    op = honest_op()
    assert ArgumentPlan.of(op, "float64", "cpu").fully_written == (True, False)
    grad_kwargs = op.kwargs_for_grad_op()
    assert [o.get("fully_written") for o in grad_kwargs["out_info"]] == [True]
    assert not any("fully_written" in i for i in grad_kwargs["in_info"])  # y and z are inputs there
    grad_op = NativeOp(**grad_kwargs)
    assert ArgumentPlan.of(grad_op, "float32", "cuda").fully_written == (True,)
    assert "static const int fully_written[] = {1, 0, 0};" in op.variant("float32", "cpu").source


@pytest.mark.parametrize("info, message", [
    ({"name": "x", "ndim": 1, "fully_written": True}, r"in_info 'x' \(#0\), key 'fully_written': only outputs"),
    ({"name": "x", "ndim": 1, "bw_out_var": {"fully_written": "yes"}},
     r"key 'bw_out_var': override 'fully_written': must be True or False"),
])
def test_misplaced_or_malformed_flag_is_an_error(info, message):
    with pytest.raises(ValueError, match=message):
        NativeOp(name="Bad", in_info=(info,), out_info=({"ndim": 1, "shape": ((0, 0),)},), c_fw_code="")


def test_malformed_flag_on_an_output_is_an_error():
    with pytest.raises(ValueError, match=r"out_info 'y' \(#0\), key 'fully_written': must be True or False"):
        NativeOp(name="Bad", in_info=({"ndim": 1},),
                 out_info=({"name": "y", "ndim": 1, "shape": ((0, 0),), "fully_written": 1.5},), c_fw_code="")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_cuda_entry_point_compiles_with_the_flag():
    from .conftest import build_with_nvcc

    build_with_nvcc(honest_op().variant("float32", "cuda"))
