"""ptnative/ops/_args.py (one argument-check rule for every family) and ptnative/ops/_loss.py (the pullback of
ops whose forward returns a loss and its gradient), tested directly: no kernel is compiled here."""

import inspect
import re

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import DisconnectedType, NullType, disconnected_type

import ptnative
from ptnative.op import NativeOpGenBase
from ptnative.ops import _args as A
from ptnative.ops._loss import LossWithGradOp
from ptnative.spec import validate

FN = "some_function"

# (name, call, message after "some_function: "), by exception type: the same mistake gives the same type and message
# shape whatever the check.
TYPE_ERRORS = [
    ("float for int", lambda: A.int_tensor(FN, "labels", pt.matrix(), 2),
     r"labels must have an integer dtype, got float"),
    ("bool for int", lambda: A.int_tensor(FN, "labels", np.zeros((2, 2), bool), 2),
     r"labels must have an integer dtype, got bool"),
    ("float for int scalar", lambda: A.int32_scalar(FN, "blank", pt.dscalar()),
     r"blank must have an integer dtype, got float64"),
    ("float for size", lambda: A.int_size(FN, "n", pt.dscalar(), 1), r"n must have an integer dtype, got float64"),
    ("int for float", lambda: A.float_tensor(FN, "x", pt.imatrix(), 2),
     r"x must have a float dtype \(float32 or float64\), got int32"),
    ("complex for float", lambda: A.float_tensor(FN, "x", pt.zmatrix(), 2, cast_int=True),
     r"x must have a real or bool dtype, got complex128"),
    ("complex for real", lambda: A.real_tensor(FN, "w", pt.matrix(dtype="complex64"), 2, "float64"),
     r"w must have a real or bool dtype, got complex64"),
    ("not array-like", lambda: A.int_tensor(FN, "labels", "abc", 2),
     r"labels must be an integer tensor, got str 'abc'"),
    ("None", lambda: A.float_tensor(FN, "x", None, 2), r"x must be a float tensor, got NoneType"),
    ("ragged", lambda: A.real_tensor(FN, "w", [[1.0], [1.0, 2.0]], 2), r"w must be a real tensor, got list"),
    ("python bool for int", lambda: A.python_int(FN, "blank", True), r"blank must be an int, got bool True"),
    ("python float for int", lambda: A.python_int(FN, "blank", 1.0), r"blank must be an int, got float 1.0"),
    ("python float for size", lambda: A.int_size(FN, "n", 2.0, 1),
     r"n must be an int >= 1 or an integer scalar tensor, got float 2.0"),
    ("str for real", lambda: A.real_number(FN, "sigma", "0.1"), r"sigma must be a real number, got str '0.1'"),
]
VALUE_ERRORS = [
    ("int wrong ndim", lambda: A.int_tensor(FN, "lens", np.zeros((2, 2), "int32"), 1),
     r"lens must have ndim 1, got 2 \(Matrix\(int32"),
    ("float wrong ndim", lambda: A.float_tensor(FN, "x", pt.matrix(), 3, layout="(T, B, D)"),
     r"x must have ndim 3 \(T, B, D\), got 2 \("),
    ("real wrong ndim", lambda: A.real_tensor(FN, "mask", pt.vector(), 2, "float32"),
     r"mask must have ndim 2, got 1 \("),
    ("several ndims", lambda: A.float_tensor(FN, "x", pt.vector(), (2, 3)), r"x must have ndim 2 or 3, got 1 \("),
    ("flag not a scalar", lambda: A.flag(FN, "loop", pt.vector()), r"loop must have ndim 0, got 1 \("),
    ("size not a scalar", lambda: A.int_size(FN, "n", pt.lvector(), 0), r"n must have ndim 0, got 1 \("),
    ("int below minimum", lambda: A.python_int(FN, "n", -1, 0), r"n must be >= 0, got -1"),
    ("size below minimum", lambda: A.int_size(FN, "n", 0, 1), r"n must be >= 1, got 0"),
    ("int above maximum", lambda: A.python_int(FN, "n", 5, 0, 4), r"n must be <= 4, got 5"),
    ("int32 overflow", lambda: A.int32_scalar(FN, "blank", 2**31), r"blank must be <= 2147483647, got 2147483648"),
    ("int32 underflow", lambda: A.int32_scalar(FN, "blank", -2**31 - 1), r"blank must be >= -2147483648"),
    ("real below minimum", lambda: A.real_number(FN, "lam", -0.5, 0), r"lam must be >= 0, got -0.5"),
    ("nan", lambda: A.real_number(FN, "sigma", float("nan")), r"sigma must be finite, got nan"),
    ("inf", lambda: A.real_number(FN, "sigma", np.inf), r"sigma must be finite, got inf"),
]
CASES = [(name, call, TypeError, msg) for name, call, msg in TYPE_ERRORS] + \
        [(name, call, ValueError, msg) for name, call, msg in VALUE_ERRORS]


@pytest.mark.parametrize("call, exc, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_rule_for_every_check(call, exc, message):
    with pytest.raises(exc, match=f"^{FN}: " + message):
        call()


def test_accepted_values_and_their_types():
    v = A.int_tensor(FN, "a", np.zeros((2, 3), np.int64), 2)
    assert v.dtype == "int32" and v.ndim == 2
    assert A.int_tensor(FN, "a", pt.imatrix(), 2).dtype == "int32"
    assert A.int_tensor(FN, "ended", np.zeros(3, bool), 1, allow_bool=True).dtype == "int32"
    assert A.int_tensor(FN, "a", pt.lvector(), (0, 1)).ndim == 1
    x = pt.tensor3(dtype="float32")
    assert A.float_tensor(FN, "x", x, 3) is x
    assert A.float_tensor(FN, "x", x, 3, cast_int=True) is x
    assert A.float_tensor(FN, "x", pt.itensor3(), 3, cast_int=True).dtype == "float64"
    assert A.real_tensor(FN, "m", np.ones((2, 2), bool), 2, "float64").dtype == "float64"
    m = pt.matrix(dtype="int16")
    assert A.real_tensor(FN, "m", m, 2) is m  # dtype None: kept
    assert A.python_int(FN, "n", np.int64(7), 0) == 7 and type(A.python_int(FN, "n", np.int64(7))) is int
    assert A.real_number(FN, "s", np.float32(0.5)) == 0.5
    assert A.int_size(FN, "n", np.int16(3), 1) == 3
    assert A.int32_scalar(FN, "b", -1).data == -1 and A.int32_scalar(FN, "b", -1).dtype == "int32"


def test_flag_is_zero_or_one():
    assert A.flag(FN, "f", True).data == 1 and A.flag(FN, "f", 0).data == 0 and A.flag(FN, "f", np.int64(5)).data == 1
    s = pt.dscalar()
    f = pytensor.function([s], A.flag(FN, "f", s))
    assert f(2.5) == 1 and f(0.0) == 0 and f(-1.0) == 1
    assert f.maker.fgraph.outputs[0].dtype == "int32"


def test_symbolic_size_is_checked_when_the_graph_runs():
    n = pt.lscalar("n")
    f = pytensor.function([n], A.int_size(FN, "chunk_size", n, 1) * 2)
    assert f(3) == 6
    with pytest.raises(ValueError, match=r"some_function: chunk_size must be >= 1"):
        f(0)


def test_host_int32_scalar_is_a_valid_spec_entry():
    entry = A.host_int32_scalar("blank")
    assert entry["ndim"] == 0 and entry["dtype"] == "int32" and entry["host_memory"]
    assert entry["gradient"] == "disconnected"
    validate("Probe", [{"name": "x", "ndim": 1, "shape": (None,)}, entry],
             [{"name": "y", "ndim": 1, "shape": ((0, 0),)}])
    assert A.host_int32_scalar("blank") is not entry  # each entry its own dict


# ------------------------------------------------------------------------------------------ _loss.py
def _loss_op(batch_axis):
    class Probe(LossWithGradOp):
        grad_batch_axis = batch_axis

    class ProbeGen(NativeOpGenBase):
        in_info = ({"name": "x", "ndim": 3, "shape": (None, None, None)}, A.host_int32_scalar("k"))
        out_info = ({"name": "loss", "ndim": 1, "shape": ((0, batch_axis),)},
                    {"name": "grad", "ndim": 3, "shape": ((0, 0), (0, 1), (0, 2))},
                    {"name": "extra", "ndim": 1, "shape": ((0, batch_axis),)})
        c_fw_code = "/* not compiled in this test */"
        op_class = Probe

    return ProbeGen.make_op()


@pytest.mark.parametrize("batch_axis", [0, 1])
def test_loss_pullback_scales_the_gradient_output_per_sequence(batch_axis):
    op = _loss_op(batch_axis)
    x, k = pt.tensor3("x"), pt.iscalar("k")
    loss, grad, extra = pt.vector("loss"), pt.tensor3("grad"), pt.vector("extra")
    g = pt.vector("g")
    none = disconnected_type()
    result = op.pullback([x, k], [loss, grad, extra], [g, none, none])
    assert isinstance(result[1].type, DisconnectedType)
    gv = np.array([2.0, -3.0])
    shape = [4, 4, 5]
    shape[batch_axis] = 2
    grad_v = np.random.default_rng(0).normal(size=shape)
    out = pytensor.function([g, grad], result[0])(gv, grad_v)
    want = grad_v * np.expand_dims(gv, [a for a in range(3) if a != batch_axis])
    np.testing.assert_allclose(out, want, rtol=0, atol=0)

    zeros = op.pullback([x, k], [loss, grad, extra], [none, none, none])[0]
    np.testing.assert_array_equal(pytensor.function([x], zeros)(np.ones((2, 3, 4))), np.zeros((2, 3, 4)))


def test_loss_pullback_casts_to_the_input_dtype():
    op = _loss_op(0)
    x = pt.tensor3("x", dtype="float32")
    none = disconnected_type()
    r = op.pullback([x, pt.iscalar()], [pt.dvector(), pt.dtensor3(), pt.dvector()], [pt.dvector(), none, none])[0]
    assert r.dtype == "float32"


def test_loss_pullback_through_another_output_is_not_implemented():
    op = _loss_op(0)
    none = disconnected_type()
    result = op.pullback([pt.tensor3(), pt.iscalar()], [pt.vector(), pt.tensor3(), pt.vector()],
                         [pt.vector(), none, pt.vector()])
    assert isinstance(result[0].type, NullType)
    assert "only the 'loss' output has a gradient" in result[0].type.why_null
    assert isinstance(result[1].type, DisconnectedType)


# ------------------------------------------------------------------------- every wrapper names its own arguments
# The rule above, applied by each catalogue function to each of its arguments: a message naming the function but
# another argument (``ctc_loss`` calling ``logits_seq_lens`` "targets_seq_lens") fails here.  The arguments are the
# fuzz harnesses' symbols (tests/fuzz_cases.py, named like the functions' arguments); only graphs are built.
EXTRA_ARGUMENTS = {"multiblank_rnnt_loss": {"blank": 4, "big_blank_durations": (2,)},
                   "multiblank_rnnt_lattice": {"blank": 4, "big_blank_durations": (2,)},
                   "unchunk": {"chunk_size": 2, "chunk_step": 1}}
#: Wrappers that leave a check to the op (its message names the input, "NativeOp 'TwoDLSTM': input 'W' ...").
CHECKED_BY_THE_OP = {"twod_lstm": "TwoDLSTM"}
#: Open findings: a complex array given as these reaches pytensor's own cast, whose message names no argument.
COMPLEX_NOT_NAMED = {("lstm", a) for a in ("W_in", "W_rec", "b", "y0", "c0", "mask")} | \
    {("twod_lstm", a) for a in ("V_h", "V_v", "W", "b", "sizes")}


def _wrapper_arguments():
    from . import fuzz_cases

    out = []
    for name in fuzz_cases.FUNCTIONS:
        harness = fuzz_cases.HARNESSES[name](None)
        if not hasattr(harness, "symbols"):
            continue
        params = inspect.signature(getattr(ptnative, name)).parameters
        out += [(name, s.name) for s in harness.symbols() if s.name in params]
    return out


WRAPPER_ARGUMENTS = [
    pytest.param(function, argument, probe, id=f"{function}-{argument}-{probe}",
                 marks=[pytest.mark.xfail(strict=True, reason=f"{function}: a complex array reaches pytensor's cast, "
                                                              "whose message names no argument")]
                 if probe == "complex" and (function, argument) in COMPLEX_NOT_NAMED else [])
    for function, argument in _wrapper_arguments() for probe in ("ndim", "complex")]


def _symbols(name):
    from . import fuzz_cases

    params = inspect.signature(getattr(ptnative, name)).parameters
    return {s.name: s for s in fuzz_cases.HARNESSES[name](None).symbols() if s.name in params}


@pytest.mark.parametrize("function, argument, probe", WRAPPER_ARGUMENTS)
def test_every_wrapper_names_the_argument_it_rejects(function, argument, probe):
    """Each argument of each catalogue function, the others valid, given the wrong ndim (3 more) or a complex dtype:
    the error starts with the function's name and names that argument (the op's own message, naming the input,
    where the wrapper leaves the check to it)."""
    kwargs = {**_symbols(function), **EXTRA_ARGUMENTS.get(function, {})}
    good = kwargs[argument]
    kwargs[argument] = pt.tensor(dtype="complex128" if probe == "complex" else good.dtype,
                                 shape=(None,) * (good.ndim + (3 if probe == "ndim" else 0)))
    with pytest.raises((TypeError, ValueError)) as info:
        getattr(ptnative, function)(**kwargs)
    msg = str(info.value).split("\n")[0]
    if function in CHECKED_BY_THE_OP and msg.startswith("NativeOp "):
        assert msg.startswith(f"NativeOp '{CHECKED_BY_THE_OP[function]}': input '{argument}' "), msg
    else:
        assert msg.startswith(f"{function}: "), msg
        assert re.search(rf"(?<!\w){re.escape(argument)}(?!\w)", msg), msg
