"""Device selection, and the CUDA build's host-array entry point without a GPU."""

import dataclasses
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import ptnative
from ptnative.backends.driver import python_driver
from ptnative.device import cuda_device_count

from .test_native_op import scale_op

no_gpu = pytest.mark.skipif(cuda_device_count() > 0, reason="a GPU is present")


@pytest.fixture
def device_setting():
    yield ptnative.config
    ptnative.config.device = None


def test_config_device_values(device_setting, monkeypatch):
    assert device_setting.device == "auto"
    monkeypatch.setenv("PTNATIVE_DEVICE", "cpu")
    assert device_setting.device == "cpu"
    device_setting.device = "cuda"
    assert device_setting.device == "cuda"
    with pytest.raises(ValueError, match="device must be one of"):
        device_setting.device = "tpu"
    monkeypatch.setenv("PTNATIVE_DEVICE", "gpu")
    device_setting.device = None
    with pytest.raises(ValueError, match="device must be one of"):
        device_setting.device
    with pytest.raises(ValueError, match="device must be one of"):
        scale_op(device="gpu")


def run_scale(op, mode):
    x, w, k = pt.matrix(), pt.vector(), pt.iscalar()
    f = pytensor.function([x, w, k], op(x, w, k), mode=mode)
    return f(np.ones((2, 3)), np.arange(3.0), 1)


@no_gpu
def test_auto_falls_back_to_cpu(mode, device_setting):
    device_setting.device = "auto"
    np.testing.assert_allclose(run_scale(scale_op(), mode)[1], [6.0, 6.0])


@no_gpu
def test_cuda_without_gpu_is_a_clear_error(mode, device_setting):
    device_setting.device = "cuda"
    with pytest.raises(RuntimeError, match="ScaleRows.*device 'cuda' was requested, but no CUDA driver"):
        run_scale(scale_op(), mode)
    # A per-op override beats the global setting, both ways.
    np.testing.assert_allclose(run_scale(scale_op(device="cpu"), mode)[1], [6.0, 6.0])
    device_setting.device = "cpu"
    with pytest.raises(RuntimeError, match="device 'cuda' was requested"):
        run_scale(scale_op(device="cuda"), mode)


@no_gpu
def test_gpu_only_op_without_gpu(mode, device_setting):
    with pytest.raises(RuntimeError, match="ScaleRows has no CPU implementation|'ScaleRows' has no CPU implementation"):
        run_scale(scale_op(cpu_support=False), mode)


@no_gpu
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_cuda_library_reports_missing_gpu(monkeypatch):
    """The CUDA build's host-array entry point returns an error, it does not crash the process."""
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    op = scale_op()
    driver = python_driver(op, "float64", "cuda")
    with pytest.raises(RuntimeError, match="ScaleRows.*CUDA error"):
        driver(np.ones((2, 3)), np.ones(3), np.array(1, dtype=np.int32))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_nvcc_checks_build_the_host_code_quickly(monkeypatch):
    """The nvcc compile checks (conftest.build_with_nvcc) compile the host code at -O0, under a library name of
    their own; every other flag is the user's build's, so the device code is compiled as users compile it."""
    from ptnative.build import NVCC_FLAGS, QUICK_BUILD_MARK, compile_command, library_path
    from ptnative.ops.sparse import SparseToDense

    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    real = SparseToDense.make_op().variant("float32", device="cuda")
    quick = dataclasses.replace(real, source=QUICK_BUILD_MARK + "\n" + real.source)
    real_cmd, quick_cmd = (compile_command(v, Path("SRC"), Path("OUT")) for v in (real, quick))
    assert real_cmd[1:1 + len(NVCC_FLAGS)] == NVCC_FLAGS and "-O3" in real_cmd and "-O0" not in real_cmd
    assert "-O0" in quick_cmd and "-O3" not in quick_cmd
    assert [f for f in quick_cmd if f != "-O0"] == [f for f in real_cmd if f != "-O3"]
    assert "-gencode" in quick_cmd and "arch=compute_90,code=sm_90" in quick_cmd
    assert library_path(real) != library_path(quick)


def test_cublas_candidates_follow_the_toolkit_and_the_override(monkeypatch, tmp_path):
    from ptnative.device import cublas_candidates, load_cublas

    (tmp_path / "lib64").mkdir()
    (tmp_path / "lib64" / "libcublas.so.13.1.0").write_bytes(b"")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setenv("PTNATIVE_CUBLAS", "/opt/my/libcublas.so.13")
    found = cublas_candidates()
    assert found[0] == "/opt/my/libcublas.so.13"
    assert str(tmp_path / "lib64" / "libcublas.so.13.1.0") in found
    assert found[-1] == "libcublas.so"  # the loader's own search comes last
    path = load_cublas()  # an empty file is not a library: skipped, never an exception
    assert path is None or "cublas" in path


@no_gpu
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("mode_name", ["C", "FAST_RUN"])
def test_cuda_variant_compiles_into_every_mode(mode_name, monkeypatch, device_setting):
    """With a GPU pretended, the CUDA variant is compiled into the function (C module with the dlopen
    trampoline, or the Numba glue); running it then reports the missing GPU as an exception naming the op."""
    import ptnative.device as device

    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    monkeypatch.setattr(device, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(device, "load_cublas", lambda: None)
    device_setting.device = "cuda"
    # A kernel text of its own, so that PyTensor compiles the C module here instead of loading a cached one.
    from .test_native_op import SCALE_SUPPORT
    # Its nvcc build compiles the host code at -O0 (conftest.build_with_nvcc): a new library on every run.
    from ptnative.build import QUICK_BUILD_MARK
    op = scale_op(c_extra_support_code={"000_quick": QUICK_BUILD_MARK + "\n", "001_scale": SCALE_SUPPORT,
                                        "002_fresh": f"// {uuid.uuid4()}"})
    with pytest.raises(RuntimeError, match="ScaleRows.*CUDA error"):
        run_scale(op, mode_name)
