"""``python -m ptnative info | demo`` and the catalogue listing behind ``build``."""

import subprocess
import sys

import ptnative
from ptnative import catalogue
from ptnative.op import NativeOpGenBase


def run(*args):
    return subprocess.run([sys.executable, "-m", "ptnative", *args], capture_output=True, text=True, timeout=600)


def test_info():
    out = run("info")
    assert out.returncode == 0, out.stderr
    for field in ("ptnative", "pytensor", "numba", "C++ compiler", "nvcc", "GPU", "BLAS", "kernel cache"):
        assert field in out.stdout


def test_demo():
    out = run("demo")
    assert out.returncode == 0, out.stderr
    assert "loss = sum(Y**2)" in out.stdout and "mode:" in out.stdout and "compiled by" in out.stdout


def test_catalogue_lists_every_op():
    listed = set(catalogue.catalogue())
    exported = {getattr(ptnative.ops, name) for name in ptnative.ops.__all__}
    gen_bases = {c for c in exported if isinstance(c, type) and issubclass(c, NativeOpGenBase)}
    assert gen_bases <= listed
    names = {name for name, _, _ in catalogue.variants("cpu")}
    assert {"LstmGenericBase", "GradOfLstmGenericBase", "EditDistanceOp", "MultiBlankRnntLoss"} <= names
