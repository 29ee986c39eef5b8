"""Kernel failures in every mode: KernelValueError / KernelRuntimeError with the kernel's message, ordinary
one-message exceptions that PyTensor re-raises with its "Apply node" context (and no warning that it
could not)."""

import copy
import pickle
import threading
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import ptnative
from ptnative.errors import FROM_KERNEL, KernelRuntimeError, KernelValueError

from .test_native_op import scale_op

CHECK = r"NativeOp 'ScaleRows': check failed: Ndarray_DIMS\(w\)\[0\] == cols \(2 vs 3\)"
FAIL = "NativeOp 'ScaleRows': k must be >= 0, got -1"


def scale_function(mode):
    x, w, k = pt.matrix(), pt.vector(), pt.iscalar()
    return pytensor.function([x, w, k], scale_op()(x, w, k), mode=mode)


def test_one_message_exceptions():
    for cls, base in ((KernelValueError, ValueError), (KernelRuntimeError, RuntimeError)):
        e = cls("NativeOp 'x': it broke")
        assert isinstance(e, base) and e.args == ("NativeOp 'x': it broke",) and str(e) == "NativeOp 'x': it broke"
        for clone in (pickle.loads(pickle.dumps(e)), copy.copy(e)):
            assert type(clone) is cls and clone.args == e.args
        assert cls().args == () and cls("a", 1).args == ("a", 1)  # like any exception
    # The drivers' constant-argument form reads the library's last error; without a library, a generic message.
    e = KernelValueError(FROM_KERNEL, "Op", "ptn_no_such_symbol")
    assert e.args == ("NativeOp 'Op': the kernel reported a failure",)


@pytest.mark.parametrize("verbosity", ["low", "medium", "high"])
def test_kernel_errors_in_every_mode(mode, verbosity):
    f = scale_function(mode)
    with warnings.catch_warnings(), pytensor.config.change_flags(exception_verbosity=verbosity):
        warnings.simplefilter("error")  # "... error does not allow us to add an extra error message" must not come
        with pytest.raises(KernelValueError, match=CHECK) as value_error:
            f(np.ones((2, 3)), np.ones(2), 0)
        with pytest.raises(KernelRuntimeError, match=FAIL) as runtime_error:
            f(np.ones((2, 3)), np.ones(3), -1)
    for info in (value_error, runtime_error):
        msg = str(info.value)
        assert msg.startswith("NativeOp 'ScaleRows': ") and len(info.value.args) == 1
        if verbosity == "low":  # PyTensor adds a hint as a note and keeps the message
            assert "Apply node" not in msg and "exception_verbosity" in "".join(info.value.__notes__)
        else:
            assert "\nApply node that caused the error: NativeOp{ScaleRows" in msg
    assert isinstance(value_error.value, ValueError) and isinstance(runtime_error.value, RuntimeError)
    np.testing.assert_allclose(f(np.ones((2, 3)), np.ones(3), 1)[1], [6.0, 6.0])


def test_catalogue_errors_are_kernel_value_errors(mode):
    """A catalogue function's failed check, in every mode: KernelValueError with PyTensor's context."""
    logits, lens, targets, target_lens = pt.tensor3(), pt.ivector(), pt.imatrix(), pt.ivector()
    f = pytensor.function([logits, lens, targets, target_lens],
                          ptnative.ctc_loss(logits, lens, targets, target_lens), mode=mode)
    args = (np.zeros((4, 2, 3), pytensor.config.floatX), np.array([4, 6], "int32"), np.zeros((2, 1), "int32"),
            np.array([1, 1], "int32"))
    with warnings.catch_warnings(), pytensor.config.change_flags(exception_verbosity="medium"):
        warnings.simplefilter("error")
        with pytest.raises(KernelValueError, match=r"(?s)NativeOp '\w+': ctc_loss: logits_seq_lens\[1\] = 6 exceeds "
                                                   r"the number of frames T = 4.*Apply node that caused the error"):
            f(*args)


def test_message_is_read_on_the_thread_that_ran_the_kernel():
    """Threads failing at once each get their own kernel's message (the library's last error is per thread)."""
    f = scale_function(None)
    f(np.ones((2, 3)), np.ones(3), 1)  # compiled before the threads start
    # One copy of the function per thread: a PyTensor function's input and output storage is not thread-safe (the
    # same function called on four threads at once raises "Multiple values for input"); the library is shared.
    functions = {n: f.copy() for n in (1, 2, 4, 5)}
    results, barrier = {}, threading.Barrier(4)

    def run(n):
        barrier.wait()
        for _ in range(200):
            try:
                functions[n](np.ones((2, 3)), np.ones(n), 0)
            except KernelValueError as e:
                results.setdefault(n, set()).add(str(e).split("\n")[0])
            else:
                results.setdefault(n, set()).add("no error")

    threads = [threading.Thread(target=run, args=(n,)) for n in (1, 2, 4, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in (1, 2, 4, 5):
        (msg,) = results[n]
        assert msg.startswith(f"NativeOp 'ScaleRows': check failed: Ndarray_DIMS(w)[0] == cols ({n} vs 3)"), msg
