"""Native ops under JAX on several devices: every catalogue graph under ``jit``, ``vmap``, ``shard_map`` and
``NamedSharding`` inputs, and the catalogue functions sharded over their own batch axis, all equal to the unsharded
calls (tests/jax_multidevice.py, run on 4 forced host devices in a fresh process)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

ROOT = Path(__file__).resolve().parents[1]


def run_multidevice(*args):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    env["JAX_PLATFORMS"] = "cpu"  # the forced devices are host devices, also on a machine with a GPU
    proc = subprocess.run([sys.executable, "-m", "tests.jax_multidevice", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    return proc.stdout


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_case_under_jit_vmap_and_sharding(dtype):
    out = run_multidevice("cases", dtype)
    assert "ok ctc_loss" in out and "ok lstm_cell" in out


def test_catalogue_functions_sharded_over_their_batch_axis():
    out = run_multidevice("batch_axis")
    for name in ("ctc_loss", "hmm_log_likelihood", "rnnt_loss", "lstm"):
        assert f"ok {name}" in out
