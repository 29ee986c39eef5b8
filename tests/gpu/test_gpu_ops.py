"""On a GPU: every catalogue op's CUDA build against its CPU build, forward and gradients, float32 and float64
(the cases are in cases.py; the CPU reference runs in cases.REFERENCE_MODE; skipped without a CUDA device)."""

import pytest

from ptnative.catalogue import catalogue
from ptnative.device import cuda_device_count, resolve

from .cases import CASES, assert_outputs_close, device_setting, params, reference_results, run_case

pytestmark = pytest.mark.skipif(cuda_device_count() == 0, reason="no CUDA device")

REPRESENTATIVES = [c for c in CASES if c.representative]


def _ids(v):
    return str(v)


@pytest.mark.parametrize("case,dtype", params(), ids=_ids)
def test_gpu_matches_cpu(case, dtype):
    """Default (Numba) mode: host arrays, copied to the device and back by the CUDA build."""
    got = run_case(case, dtype, "cuda")
    want = reference_results(case, dtype)
    assert_outputs_close(case, dtype, got, want, "cuda vs cpu")


@pytest.mark.parametrize("mode", ["C", "FAST_COMPILE"])
@pytest.mark.parametrize("case,dtype", params(REPRESENTATIVES), ids=_ids)
def test_gpu_matches_cpu_other_modes(case, dtype, mode):
    """One case per family in the C and Python (FAST_COMPILE) modes."""
    got = run_case(case, dtype, "cuda", mode=mode)
    want = reference_results(case, dtype)
    assert_outputs_close(case, dtype, got, want, f"cuda ({mode}) vs cpu")


def test_auto_picks_the_gpu():
    with device_setting("auto"):
        for gen in catalogue():
            assert resolve(gen.make_op()) == "cuda", gen.__name__
        assert resolve(catalogue()[0].make_op(device="cpu")) == "cpu"  # a per-op choice still wins
