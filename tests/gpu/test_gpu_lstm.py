"""On a GPU: the CUDA build against the CPU build (skipped without a CUDA device)."""

import numpy as np
import pytensor
import pytest

import ptnative
from ptnative.device import cuda_device_count
from ptnative.ops import LstmGenericBase

from ..test_lstm import lstm_data, symbolic

pytestmark = pytest.mark.skipif(cuda_device_count() == 0, reason="no CUDA device")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", [None, "C", "FAST_COMPILE"])
def test_lstm_generic_gpu_matches_cpu(dtype, mode):
    Z, V_h, c, i = symbolic(dtype)
    values = lstm_data(9, 5, 16, dtype, seed=1)
    results = {}
    for device in ("cpu", "cuda"):
        op = LstmGenericBase.make_op(device=device)
        Y, H, d = op(Z, V_h, c, i)
        grads = pytensor.grad((Y ** 2).sum() + d.sum(), [Z, V_h, c])
        results[device] = pytensor.function([Z, V_h, c, i], [Y, H, d, *grads], mode=mode)(*values)
    rtol = 1e-4 if dtype == "float32" else 1e-10
    for cpu, gpu in zip(results["cpu"], results["cuda"]):
        np.testing.assert_allclose(gpu, cpu, rtol=rtol, atol=rtol)


def test_auto_picks_the_gpu():
    assert ptnative.device.resolve(LstmGenericBase.make_op()) == "cuda"
