"""The supported matrix (README, "Supported versions"): in every mode this PyTensor has, before and after
``import pymc`` (which appends ``-fno-exceptions ...`` to ``pytensor.config.gcc__cxxflags``; where PyMC is not
installed the same flags are set by hand), a NativeOp and a catalogue op give the reference values and gradients;
and ptnative itself warns about nothing, on any supported PyTensor."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import ptnative

from .reference.fsa import hmm_forward, hmm_posteriors
from .test_native_op import scale_op, scale_ref

#: What ``pymc/__init__.py`` (PyMC 5.x and 6.x) appends to PyTensor's C++ flags.
PYMC_FLAGS = "-fno-exceptions -fno-unwind-tables -fno-asynchronous-unwind-tables"
HAVE_PYMC = importlib.util.find_spec("pymc") is not None
HAVE_JAX = importlib.util.find_spec("jax") is not None


def available_modes():
    """The default mode and every named mode a NativeOp supports in this environment."""
    modes = [None, "C", "CVM", "FAST_COMPILE", "NUMBA"]
    return modes + ["JAX"] if HAVE_JAX else modes


MODES = available_modes()
MODE_IDS = ["default" if m is None else m for m in MODES]


@pytest.fixture(scope="module")
def pymc_imported():
    """PyMC imported (its flags in place), or the flags set by hand; PyTensor's flags restored afterwards."""
    old = pytensor.config.gcc__cxxflags
    if HAVE_PYMC:
        import pymc  # noqa: F401

        assert "-fno-exceptions" in pytensor.config.gcc__cxxflags, "PyMC no longer sets -fno-exceptions"
    else:
        pytensor.config.gcc__cxxflags = f"{old} {PYMC_FLAGS}"
    yield
    pytensor.config.gcc__cxxflags = old


@pytest.fixture
def without_pymc_flags():
    """PyTensor's flags without PyMC's, whatever was imported before (restored afterwards)."""
    old = pytensor.config.gcc__cxxflags
    pytensor.config.gcc__cxxflags = " ".join(f for f in old.split() if f not in PYMC_FLAGS.split())
    yield
    pytensor.config.gcc__cxxflags = old


def check_native_op(mode):
    """ScaleRows (an inplace-capable op with a disconnected int input) forward and gradient against closed forms."""
    rng = np.random.default_rng(0)
    xv, wv, R, Q = rng.normal(size=(3, 4)), rng.normal(size=4), rng.normal(size=(3, 4)), rng.normal(size=3)
    x, w, k = pt.matrix("x"), pt.vector("w"), pt.iscalar("k")
    y, s = scale_op()(x, w, k)
    cost = (y * R).sum() + (s * Q).sum()
    f = pytensor.function([x, w, k], [y, s, *pytensor.grad(cost, [x, w])], mode=mode)
    yv, sv, gx, gw = f(xv, wv, 2)
    y_ref, s_ref = scale_ref(xv, wv, 2)
    g = R + Q[:, None]
    np.testing.assert_allclose(yv, y_ref, rtol=1e-12)
    np.testing.assert_allclose(sv, s_ref, rtol=1e-12)
    np.testing.assert_allclose(gx, g * wv[None, :], rtol=1e-12)
    np.testing.assert_allclose(gw, (g * xv).sum(axis=0), rtol=1e-12)
    # Under JAX the kernel's status reaches Python through XLA, which picks the exception class.
    with pytest.raises((ValueError, RuntimeError) if mode == "JAX" else RuntimeError,
                       match="ScaleRows.*k must be >= 0, got -1"):
        f(xv, wv, -1)


def check_catalogue_op(mode):
    """hmm_log_likelihood on ragged sequences (lengths 5 and 3), and its gradient w.r.t. every input."""
    rng = np.random.default_rng(1)
    T, B, K = 5, 2, 3
    le, lA, lpi = rng.normal(size=(T, B, K)), rng.normal(size=(K, K)), rng.normal(size=K)
    lens = np.array([5, 3])
    mask = (np.arange(T)[:, None] < lens[None, :]).astype(np.float64)
    upstream = np.array([0.7, -1.3])
    e, A, pi, m = pt.tensor3("e"), pt.matrix("A"), pt.vector("pi"), pt.matrix("m")
    ll = ptnative.hmm_log_likelihood(e, A, pi, mask=m)
    f = pytensor.function([e, A, pi, m], [ll, *pytensor.grad((ll * upstream).sum(), [e, A, pi])], mode=mode)
    llv, ge, gA, gpi = f(le, lA, lpi, mask)
    gamma, xi = hmm_posteriors(le, lA, lpi, lens=lens)
    np.testing.assert_allclose(llv, hmm_forward(le, lA, lpi, lens=lens), rtol=1e-10)
    np.testing.assert_allclose(ge, gamma * upstream[None, :, None], rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(gA, np.einsum("b,bij->ij", upstream, xi), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(gpi, (gamma[0] * upstream[:, None]).sum(axis=0), rtol=1e-8, atol=1e-12)


CHECKS = {"native_op": check_native_op, "catalogue_op": check_catalogue_op}
every_op_and_mode = pytest.mark.parametrize("check, mode", [(c, m) for c in CHECKS.values() for m in MODES],
                                            ids=[f"{name}-{m}" for name in CHECKS for m in MODE_IDS])


@every_op_and_mode
def test_every_mode(without_pymc_flags, check, mode):
    check(mode)


@every_op_and_mode
def test_every_mode_after_pymc(pymc_imported, check, mode):
    check(mode)


def test_ptnative_warns_about_nothing(tmp_path):
    """In a fresh process (PyMC imported first where installed): importing ptnative, defining ops and running them
    in every mode raises no warning that comes from ptnative or names it (e.g. PyTensor 3.3.7's deprecation of
    ``infer_shape``'s ``fgraph`` parameter)."""
    script = textwrap.dedent(f"""
        import os, warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                import pymc
            except ImportError:
                pass
            import sys
            import numpy as np, pytensor, pytensor.tensor as pt
            import ptnative  # the one under test (installed, or on PYTHONPATH), before the checkout is on sys.path
            sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
            from tests.test_compat import MODES, check_native_op, check_catalogue_op
            for mode in MODES:
                check_native_op(mode)
                check_catalogue_op(mode)
        package = os.path.dirname(ptnative.__file__)
        ours = [w for w in caught if str(w.filename).startswith(package) or "ptnative" in str(w.message)
                or "NativeOp" in str(w.message)]
        for w in ours:
            print("WARNING", w.category.__name__, w.filename, w.lineno, w.message)
        print("checked", len(caught), "warnings")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-5000:]
    assert "checked" in out.stdout
    assert "WARNING" not in out.stdout, out.stdout


def test_no_downgrade_check_flags_every_change():
    """scripts/check_no_downgrade.py's comparison: a host package removed, moved down or replaced by a newer
    version (PyTensor 2.38 -> 3.0 breaks PyMC 5 as surely as a downgrade) fails; ptnative itself may change."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                        "check_no_downgrade.py")
    if not os.path.exists(path):
        pytest.skip("scripts/ is not next to the tests")
    spec = importlib.util.spec_from_file_location("check_no_downgrade", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    before = {"numba": "0.68.0", "pytensor": "2.38.3", "filelock": "4.3.1", "scipy": "1.18.1", "ptnative": "0.0.9"}
    after = {"numba": "0.65.1", "pytensor": "3.0.7", "scipy": "1.18.1", "ptnative": "0.1.0", "tqdm": "4.67.1"}
    assert module.changes(before, after, ignore={"ptnative"}) == [
        "filelock 4.3.1 was removed", "numba 0.68.0 -> 0.65.1", "pytensor 2.38.3 -> 3.0.7"]
    assert module.changes(before, dict(before, tqdm="4.67.1"), ignore=set()) == []
