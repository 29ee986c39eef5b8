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
    for field in ("ptnative", "pytensor", "numba", "C++ compiler", "nvcc", "GPU", "BLAS", "kernel cache",
                  "prebuilt libraries"):
        assert field in out.stdout


def test_cache_size_skips_links_and_files_that_vanish(tmp_path, monkeypatch):
    """``info`` sums the cache while other processes compile into it: a file (or a temporary build folder) removed
    meanwhile is skipped instead of failing, and a link is not followed."""
    import os

    from ptnative.cli import _dir_size

    (tmp_path / "a.so").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.so").write_bytes(b"y" * 24)
    (tmp_path / "gone.build").write_bytes(b"z" * 5000)
    big = tmp_path.parent / f"{tmp_path.name}-outside"
    big.write_bytes(b"w" * 7000)
    (tmp_path / "link.so").symlink_to(big)
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):
        if str(path).endswith("gone.build"):
            raise FileNotFoundError(path)
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)
    assert _dir_size(tmp_path) == 1024


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


def test_build_jobs_run_concurrently_and_count_failures(monkeypatch, capsys):
    import threading

    from ptnative import build, cli
    from ptnative.backends import ffi_source

    class FakeOp:
        def __init__(self, name):
            self.name = name

        def variant(self, dtype, device):
            return (self.name, dtype, device)

    items = [(f"op{k}", FakeOp(f"op{k}"), dtype) for k in range(3) for dtype in ("float32", "float64")]
    monkeypatch.setattr(catalogue, "variants", lambda device: iter(items))
    monkeypatch.setattr(ffi_source, "installed_handler_variant", lambda device: None)  # as without jax
    barrier = threading.Barrier(3, timeout=20)  # breaks (and the build raises) unless 3 builds run at once
    built = []

    def fake_build(variant):
        barrier.wait()
        built.append(variant)
        if variant[:2] == ("op1", "float64"):
            raise build.CompileError("nvcc said no")
        return variant

    monkeypatch.setattr(build, "build", fake_build)
    assert cli.main(["build", "--device", "cuda", "-j", "3"]) == 1
    out, err = capsys.readouterr()
    assert sorted(built) == sorted((name, dtype, "cuda") for name, _, dtype in items)
    assert "5 of 6 libraries ready" in out and "3 job(s)" in out
    assert "op1 (float64): nvcc said no" in err


def test_build_jobs_default_to_cpu_count(monkeypatch):
    import os

    from ptnative import cli

    calls = []
    monkeypatch.setattr(cli, "build_all", lambda device, jobs, **kw: calls.append((device, jobs)) or 0)
    assert cli.main(["build"]) == 0
    assert cli.main(["build", "--device", "cuda", "--jobs", "16"]) == 0
    assert calls == [("cpu", os.cpu_count() or 1), ("cuda", 16)]


def test_build_progress_lines(monkeypatch, capsys):
    """``--progress lines`` (what the install step uses): one line per library on stderr, with its time."""
    from ptnative import build, catalogue, cli
    from ptnative.backends import ffi_source

    class FakeOp:
        def variant(self, dtype, device):
            return dtype

    monkeypatch.setattr(catalogue, "variants", lambda device: iter([("opA", FakeOp(), "float32"),
                                                                     ("opA", FakeOp(), "float64")]))
    monkeypatch.setattr(ffi_source, "installed_handler_variant", lambda device: None)

    def fake_build(variant):
        if variant == "float64":
            raise build.CompileError("no")

    monkeypatch.setattr(build, "build", fake_build)
    assert cli.main(["build", "-j", "1", "--progress", "lines"]) == 1
    err = capsys.readouterr().err
    assert "[1/3] opA (float32): " in err and " s\n" in err and "[2/3] opA (float64) FAILED: " in err
    assert "[3/3] the worker pool (OpenBLAS and the kernels' threads): " in err  # ptnative/blas_threads.py


def test_build_announces_its_toolchain_and_records_it(monkeypatch, capsys, tmp_path):
    """What a CPU build compiles with, said first; ``--toolchain-record`` (the prebuilt step's) writes it as
    toolchain.json; bad flags stop the build before anything is compiled."""
    from ptnative import build, catalogue, cli, prebuilt
    from ptnative.backends import ffi_source

    monkeypatch.setattr(catalogue, "variants", lambda device: iter([]))
    monkeypatch.setattr(ffi_source, "installed_handler_variant", lambda device: None)
    monkeypatch.setenv("PTNATIVE_CXXFLAGS", "-march=x86-64 -mtune=generic")
    record = tmp_path / "toolchain.json"
    assert cli.main(["build", "--progress", "lines", "--toolchain-record", str(record)]) == 0
    err = capsys.readouterr().err
    assert f"with {build.cxx()} (" in err and "CPU target -march=x86-64 -mtune=generic" in err
    (toolchain, requires), = prebuilt.parse_manifest(record.read_bytes())
    assert toolchain.target == ("-march=x86-64", "-mtune=generic") and requires == frozenset()
    monkeypatch.setenv("PTNATIVE_CXXFLAGS", "foo")
    assert cli.main(["build", "--progress", "lines"]) == 1
    assert "nothing built" in capsys.readouterr().err
