"""GPU tests: JAX must not grab most of the device memory (the host-array tests allocate there too), float32
products are strict (``PTNATIVE_ALLOW_TF32=0``: the tests compare with the CPU), and the catalogue's CPU and CUDA
kernels are built once, in parallel, before the first test (a no-op when ``python -m ptnative build`` already
filled the cache)."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("PTNATIVE_ALLOW_TF32", "0")

from ptnative.device import cuda_device_count  # noqa: E402


def build_all(variants, workers=None):
    """Build ``variants`` (``source.Variant`` objects) in parallel threads (each build is an nvcc process)."""
    from ptnative.build import build

    variants = list(variants)
    workers = workers or min(len(variants), os.cpu_count() or 1) or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(build, variants):
            pass


@pytest.fixture(scope="session", autouse=True)
def cuda_catalogue_built():
    if cuda_device_count() > 0:
        from ptnative.catalogue import variants

        build_all([op.variant(dtype, device=device) for device in ("cpu", "cuda")
                   for _, op, dtype in variants(device=device)])
    yield
