"""Native ops across processes, as PyMC runs its chains (``pm.sample(cores=N, mp_ctx="spawn" | "fork")`` pickles
the compiled logp/dlogp functions to its workers): a compiled function holding native ops and their gradient ops
pickles, and its unpickled copy computes the same numbers in a spawned and in a forked process."""

import multiprocessing
import os
import pickle
import subprocess
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import ptnative

from .test_fsa import hmm_data


def hmm_logp_and_grad(mode):
    """logp and dlogp of a 3-state HMM (hmm_log_likelihood and its gradient op), compiled in ``mode``."""
    le = pt.tensor3("log_emissions")
    lA = pt.matrix("log_transitions")
    logp = ptnative.hmm_log_likelihood(le, lA, np.log(np.full(3, 1 / 3))).sum()
    return pytensor.function([le, lA], [logp, *pytensor.grad(logp, [le, lA])], mode=mode)


def data():
    le, lA, _, _ = hmm_data(np.random.default_rng(2), 20, 2, 3, scale=2.0)
    return le, lA


def pytensor_unpickles_c_functions() -> bool:
    """Whether this PyTensor unpickles a plain C-mode function holding ops with C params (Shape_i, DimShuffle):
    2.38.3, 3.0.7 and 3.3.8 do not ("Params is immutable")."""
    x = pt.matrix("x")
    f = pytensor.function([x], pt.zeros((x.shape[0], 2)) + (x.sum(axis=1)[:, None] * x).sum(), mode="C")
    try:
        pickle.loads(pickle.dumps(f))
    except NotImplementedError:
        return False
    return True


# JAX (when it ran earlier in this process) and Python >= 3.12 warn at every fork of a multi-threaded process, as
# PyMC's forked chains do; whether the kernels (and their CPU threads) work in the forked worker is what is tested.
@pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")
@pytest.mark.filterwarnings(r"ignore:This process .* is multi-threaded, use of fork\(\):DeprecationWarning")
@pytest.mark.parametrize("start_method", ["spawn", "fork"])
@pytest.mark.parametrize("mode", [None, "C", "FAST_COMPILE"], ids=["default", "C", "FAST_COMPILE"])
def test_compiled_function_pickles_and_runs_in_another_process(start_method, mode):
    if mode == "C" and not pytensor_unpickles_c_functions():
        pytest.skip(f"PyTensor {pytensor.__version__} cannot unpickle C-mode functions, native ops or not")
    f = hmm_logp_and_grad(mode)
    want = f(*data())
    pickle.dumps(f)  # fails here, with PyTensor's message, if the function does not pickle
    ctx = multiprocessing.get_context(start_method)
    with ctx.Pool(1) as pool:
        # The compiled function itself is the task: the worker unpickles it (nothing from this test module, which a
        # spawned worker may not be able to import) and calls it; a timeout instead of a hang if the worker dies.
        got = pool.apply_async(f, data()).get(timeout=300)
    assert len(got) == len(want) == 3
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_child_pythons_import_the_same_ptnative():
    """A Python the tests start in the checkout imports the ptnative this process imported (under ``make test`` the
    installed package and its prebuilt libraries, not the checkout's sources) and this checkout's ``tests`` package
    (tests/conftest.py)."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    code = "import ptnative, tests; print(ptnative.__file__); print(tests.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                         check=True)
    got_ptnative, got_tests = out.stdout.split()
    assert os.path.realpath(got_ptnative) == os.path.realpath(ptnative.__file__)
    assert os.path.realpath(got_tests) == os.path.join(root, "tests", "__init__.py")
