"""JAX mode on a GPU: native ops as XLA FFI calls on the device (no host round trip), against the CPU build
(cases.REFERENCE_MODE; skipped without a GPU, without jax, or when JAX does not run on the GPU)."""

import numpy as np
import pytest
from pytensor.graph.traversal import applys_between

from ptnative import NativeOp
from ptnative.device import cuda_device_count

from .cases import CASES_BY_NAME, assert_outputs_close, compile_case, device_setting, reference_results
from .conftest import build_all

pytestmark = pytest.mark.skipif(cuda_device_count() == 0, reason="no CUDA device")
jax = pytest.importorskip("jax")
if cuda_device_count() and jax.default_backend() != "gpu":
    pytest.skip(f"JAX runs on {jax.default_backend()!r}, not on the GPU", allow_module_level=True)

JAX_CASES = ["native_lstm2", "ctc_loss", "rnnt", "edit_distance", "chunking"]
DTYPE = "float32"  # (float64 in JAX mode is checked on the CPU by tests/test_jax.py)


def case_dtype(name):
    case = CASES_BY_NAME[name]
    return case, DTYPE if DTYPE in case.dtypes else case.dtypes[0]


@pytest.fixture(scope="module", autouse=True)
def ffi_handlers_built():
    """The CUDA libraries of every native op in these graphs and JAX mode's CUDA handler, built in parallel up
    front."""
    from ptnative.backends.ffi_source import handler_variant

    variants = {}
    for name in JAX_CASES:
        case, dtype = case_dtype(name)
        with device_setting("cuda"):
            inputs, outputs, _ = case.build(lambda cls, **kw: cls.make_op(device="cuda", **kw), dtype, static=True)
        for node in applys_between(inputs, outputs):
            if isinstance(node.op, NativeOp):
                op = node.op.clone_with(inplace=(), device=None)
                variants[(op, op.float_dtype_of(node))] = None
    build_all([handler_variant("cuda", jax.ffi.include_dir())] + [op.variant(dtype, "cuda") for op, dtype in variants])
    yield


@pytest.mark.parametrize("name", JAX_CASES)
def test_jax_mode_on_gpu_matches_cpu(name):
    case, dtype = case_dtype(name)
    want = reference_results(case, dtype, static=True)
    f, value_sets = compile_case(case, dtype, "cuda", mode="JAX", static=True)
    results = f(*value_sets[0])
    arrays = [r for r in results if isinstance(r, jax.Array)]
    assert arrays, f"{name}: JAX mode returned no jax Array"
    for r in arrays:
        assert all(d.platform == "gpu" for d in r.devices()), f"{name}: a result lives on {r.devices()}"
    assert_outputs_close(case, dtype, [[np.asarray(r) for r in results]], want, "JAX on the GPU vs cpu")


JAX_GRAD_CASES = ["lstm_generic", "native_lstm2", "lstm_cell", "ctc_loss", "hmm", "rnnt", "sparse_coo"]


@pytest.mark.parametrize("name", JAX_GRAD_CASES)
def test_jax_grad_on_gpu_matches_pytensor_on_cpu(name):
    """JAX differentiates the jaxified graph on the GPU (each op a custom_vjp whose backward pass runs the gradient
    op's CUDA handler): equal to pytensor.grad on the CPU."""
    import pytensor

    from ..test_jax_grad import build, jaxify
    from .cases import REFERENCE_MODE

    case, dtype = case_dtype(name)
    with device_setting("cpu"):
        inputs, values, _, costs = build(name, dtype)
        want = pytensor.function(inputs, [g for _, _, grads in costs for g in grads], mode=REFERENCE_MODE,
                                 on_unused_input="ignore")(*values)
    k, rtol = 0, case.rtol(dtype)
    for cost, positions, grads in costs:
        f = jaxify(inputs, [cost])
        got = jax.jit(jax.grad(lambda *xs: f(*xs)[0], argnums=positions))(*values)
        for j, g in enumerate(got):
            assert all(d.platform == "gpu" for d in g.devices()), f"{name}: a gradient lives on {g.devices()}"
            w = want[k + j]
            scale = float(np.abs(w[np.isfinite(w)]).max()) if np.isfinite(w).any() else 1.0
            np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=rtol * max(scale, 1e-30),
                                       err_msg=f"{name}: gradient {k + j}")
        k += len(grads)
