"""Prebuilt libraries shipped inside the package (ptnative/prebuilt.py, docs/install.md): used only under exactly
the cache's name (same source, compiler, flags, CPU), only if they pass their checks, copied into the kernel cache;
anything else compiles as before.

Each case has its own kernel cache and its own stand-in for the package's ``prebuilt`` folder, filled by building
the README's tiny ``Double`` op into a scratch cache (about a second).
"""

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import ptnative
from ptnative import blas_threads, build, cpu_levels, prebuilt
from ptnative.cache import RECORD_SUFFIX, UntrustedLibraryWarning
from ptnative.cpu_levels import Level

from ._ops_for_tests import double_spec

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534

DOUBLE = double_spec(kernel="twice_prebuilt", name="DoublePrebuilt")  # a library apart from test_cache_trust's


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """A folder holding Double's float64 library and its record, as the package would ship them."""
    base = tmp_path_factory.mktemp("shipped")
    source_cache = base / "source-cache"
    old = os.environ.get("PTNATIVE_CACHE_DIR")
    os.environ["PTNATIVE_CACHE_DIR"] = str(source_cache)
    try:
        path = build.build(ptnative.NativeOp(**DOUBLE).variant("float64"))
        # the OpenBLAS pool, which the first kernel load of a process installs, loaded before the tests count
        # what their loads compile
        blas_threads.install(build.open_library)
    finally:
        if old is None:
            del os.environ["PTNATIVE_CACHE_DIR"]
        else:
            os.environ["PTNATIVE_CACHE_DIR"] = old
    return path


@pytest.fixture
def setup(tmp_path, monkeypatch, shipped):
    """(variant, the stand-in prebuilt folder, the fresh cache, the list of compiled library names)."""
    folder = tmp_path / "prebuilt"
    folder.mkdir(mode=0o755)
    for name in (shipped.name, shipped.name + RECORD_SUFFIX):
        shutil.copyfile(shipped.parent / name, folder / name)
        os.chmod(folder / name, 0o644)
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: folder)
    monkeypatch.setenv("PTNATIVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PTNATIVE_PREBUILT", raising=False)
    compiled = []
    real_compile = build._compile

    def counting_compile(variant, directory, path, *toolchain):
        compiled.append(path.name)
        real_compile(variant, directory, path, *toolchain)

    monkeypatch.setattr(build, "_compile", counting_compile)
    return ptnative.NativeOp(**DOUBLE).variant("float64"), folder, tmp_path / "cache", compiled


def build_quietly(variant):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntrustedLibraryWarning)
        return build.build(variant)


def test_a_matching_prebuilt_library_is_copied_into_the_cache_not_compiled(setup, shipped):
    variant, folder, cache, compiled = setup
    path = build_quietly(variant)
    assert compiled == []
    assert path == cache / shipped.name
    assert path.read_bytes() == (folder / shipped.name).read_bytes()
    assert (cache / (shipped.name + RECORD_SUFFIX)).is_file()
    assert os.stat(path).st_mode & 0o077 == 0  # the cache's own private copy
    x = pt.vector("x", dtype="float64")
    f = pytensor.function([x], ptnative.NativeOp(**DOUBLE)(x), mode="FAST_COMPILE")
    np.testing.assert_array_equal(f(np.array([1.5, -2.0, 0.0])), [3.0, -4.0, 0.0])
    assert compiled == []


def test_other_flags_give_another_name_and_a_compile(setup, monkeypatch):
    variant, _, _, compiled = setup
    monkeypatch.setattr(build, "CXX_FLAGS", [*build.CXX_FLAGS, "-DPTN_PREBUILT_TEST_FLAG=1"])
    build_quietly(variant)
    assert compiled == [build.library_path(variant).name]


def test_other_compiler_version_gives_another_name_and_a_compile(setup, monkeypatch):
    variant, _, _, compiled = setup
    real_version = build.compiler_version
    monkeypatch.setattr(build, "compiler_version", lambda cmd: real_version(cmd) + " (patched)")
    build_quietly(variant)
    assert len(compiled) == 1


def test_turned_off_by_environment(setup, monkeypatch):
    variant, _, _, compiled = setup
    monkeypatch.setenv("PTNATIVE_PREBUILT", "0")
    build_quietly(variant)
    assert len(compiled) == 1


def tamper_bytes(folder, name):
    data = bytearray((folder / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / name).write_bytes(bytes(data))


def tamper_record(folder, name):
    (folder / (name + RECORD_SUFFIX)).unlink()


def tamper_link(folder, name):
    os.rename(folder / name, folder / "elsewhere.so")
    os.symlink(folder / "elsewhere.so", folder / name)


def tamper_file_mode(folder, name):
    os.chmod(folder / name, 0o666)


def tamper_folder_mode(folder, name):
    os.chmod(folder, 0o777)


def tamper_owner(folder, name):
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(folder / name, NOBODY, NOBODY)


@pytest.mark.parametrize("tamper, reason", [
    (tamper_bytes, "does not match the SHA-256"),
    (tamper_record, "has no integrity record"),
    (tamper_link, "is a symbolic link"),
    (tamper_file_mode, "is writable by group or others"),
    (tamper_folder_mode, "is writable by group or others"),
    (tamper_owner, "is owned by uid 65534"),
])
def test_a_prebuilt_library_failing_a_check_is_not_used_but_compiled(setup, shipped, tamper, reason):
    variant, folder, _, compiled = setup
    tamper(folder, shipped.name)
    with pytest.warns(UntrustedLibraryWarning, match=rf"prebuilt library .*{reason}.*being compiled"):
        path = build.build(variant)
    assert compiled == [shipped.name] and path.is_file()


def test_a_missing_folder_compiles_without_warning(setup, monkeypatch, tmp_path):
    variant, _, _, compiled = setup
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: tmp_path / "no-such-folder")
    build_quietly(variant)
    assert len(compiled) == 1
    assert prebuilt.count() is None


def test_count(setup):
    assert prebuilt.count() == 1


def test_prebuild_without_a_compiler_installs_nothing_and_succeeds(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               PTNATIVE_CXX=str(tmp_path / "no-such-compiler"))
    out = subprocess.run([sys.executable, "-m", "ptnative.prebuilt", str(tmp_path / "dest")], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "no C++ compiler" in out.stderr and "compile on first use" in out.stderr
    assert not (tmp_path / "dest").exists()


def test_prune_keeps_only_recorded_libraries(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir(mode=0o700)
    for name in ("a.so", "a.so" + RECORD_SUFFIX, "a.cpp", "a.so.lock", "b.so", "c.so" + RECORD_SUFFIX):
        (dest / name).write_text(name)
        os.chmod(dest / name, 0o600)
    (dest / ".x.build").mkdir()
    assert prebuilt._prune(dest) == 1
    assert sorted(os.listdir(dest)) == ["a.so", "a.so" + RECORD_SUFFIX]
    assert os.stat(dest / "a.so").st_mode & 0o777 == 0o644 and os.stat(dest).st_mode & 0o777 == 0o755


# ---- Compiler flags (PTNATIVE_CXXFLAGS) and a portable package (toolchain.json, `make wheel`)

PORTABLE = "-march=x86-64-v2" if build.platform.machine() == "x86_64" else "-march=armv8-a"


def test_user_flags_never_load_a_prebuilt_library_built_with_others(setup):
    variant, _, _, compiled = setup
    shipped_name = build.library_path(variant).name
    os.environ["PTNATIVE_CXXFLAGS"] = PORTABLE
    try:
        path = build_quietly(variant)
    finally:
        del os.environ["PTNATIVE_CXXFLAGS"]
    assert compiled == [path.name] and path.name != shipped_name


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    """A folder as `make wheel` ships it: Double's float64 library built for a portable target, its record, and
    toolchain.json."""
    base = tmp_path_factory.mktemp("portable")
    folder = base / "prebuilt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               PTNATIVE_CXXFLAGS=PORTABLE, PTNATIVE_CACHE_DIR=str(folder), PTNATIVE_PREBUILT="0")
    for name in ("PTNATIVE_CXX", "CXX"):  # the package is built by the default compiler, the user's (below) too
        env.pop(name, None)
    code = ("import ptnative, sys; from ptnative import build, prebuilt; from ptnative.cpu_levels import Level\n"
            "sys.path.insert(0, sys.argv[1]); from _ops_for_tests import double_spec\n"
            "v = ptnative.NativeOp(**double_spec(kernel='twice_prebuilt', name='DoublePrebuilt')).variant('float64')\n"
            "p = build.build(v)\n"
            "t = build.local_toolchain()\n"
            "(p.parent / prebuilt.MANIFEST).write_bytes(prebuilt.manifest_data(t.compiler, t.version, [Level(t.target, frozenset())]))\n"
            "print(p.name)\n")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests")], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert prebuilt._prune(folder) == 1
    return folder, out.stdout.split()[-1]


@pytest.fixture
def portable_setup(setup, portable, monkeypatch):
    """``setup`` with the package's folder replaced by the portable one, on a machine whose compiler's version
    differs from the one that built the package (as a user's would)."""
    variant, _, cache, compiled = setup
    folder, name = portable
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: folder)
    real_version = build.compiler_version
    monkeypatch.setattr(build, "compiler_version", lambda cmd: real_version(cmd) + " (another machine)")
    monkeypatch.delenv("PTNATIVE_CXXFLAGS", raising=False)
    monkeypatch.delenv("PTNATIVE_CXX", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    return variant, folder, name, cache, compiled


def test_a_portable_package_is_used_where_the_user_set_no_flags(portable_setup):
    variant, folder, name, cache, compiled = portable_setup
    path = build_quietly(variant)
    assert compiled == [] and path == cache / name
    assert path.read_bytes() == (folder / name).read_bytes()
    assert build.resolve(variant)[1].target == (PORTABLE,)


def test_a_portable_package_is_not_used_with_other_user_flags(portable_setup, monkeypatch):
    variant, _, name, _, compiled = portable_setup
    for target in ("-march=native", PORTABLE):  # even the same flags: the user's compiler is another version
        monkeypatch.setenv("PTNATIVE_CXXFLAGS", target)
        path = build_quietly(variant)
        assert path.name != name and compiled[-1] == path.name
    assert len(compiled) == 2


def test_a_portable_package_is_not_used_with_another_compiler_command(portable_setup, monkeypatch):
    variant, _, name, _, compiled = portable_setup
    monkeypatch.setenv("PTNATIVE_CXX", shutil.which(build.cxx()))  # the same compiler, named otherwise
    path = build_quietly(variant)
    assert path.name != name and compiled == [path.name]


def test_a_portable_package_is_not_used_when_turned_off(portable_setup, monkeypatch):
    variant, _, name, _, compiled = portable_setup
    monkeypatch.setenv("PTNATIVE_PREBUILT", "0")
    assert build_quietly(variant).name != name and len(compiled) == 1


@pytest.mark.parametrize("manifest", [
    b"not json", b'{"format": 1}', b'{"format": 2, "compiler": "g++", "version": "x", "target": ["-O2"]}',
    b'{"format": 1, "compiler": "g++", "version": "x", "target": ["-march=native"]}',
    b'{"format": 1, "compiler": "g++", "version": "x", "target": ["-o", "x"]}', b"\xff" * 20000,
])
def test_a_malformed_or_native_manifest_is_ignored(portable_setup, tmp_path, monkeypatch, manifest):
    variant, folder, name, _, compiled = portable_setup
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    os.chmod(copy / prebuilt.MANIFEST, 0o644)
    (copy / prebuilt.MANIFEST).write_bytes(manifest)
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: copy)
    assert prebuilt.portable_toolchains(build.cxx()) == []
    assert build_quietly(variant).name != name and len(compiled) == 1


def test_an_ignored_manifest_is_reported_once_per_process(portable_setup, tmp_path, monkeypatch, caplog):
    """The manifest is read at every library load: a package built for a native target (make's own builds) would
    otherwise log the same warning once per library."""
    _, folder, _, _, _ = portable_setup
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    os.chmod(copy / prebuilt.MANIFEST, 0o644)
    (copy / prebuilt.MANIFEST).write_bytes(b'{"format": 1, "compiler": "g++", "version": "x", "target": ["-march=native"]}')
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: copy)
    monkeypatch.setattr(prebuilt, "_warned", set())
    with caplog.at_level("WARNING", logger=prebuilt.log.name):
        for _ in range(3):
            assert prebuilt.portable_toolchains(build.cxx()) == []
    ignored = [r for r in caplog.records if "names a native CPU target" in r.getMessage()]
    assert len(ignored) == 1 and str(copy / prebuilt.MANIFEST) in ignored[0].getMessage()


def test_an_untrusted_manifest_is_ignored(portable_setup, tmp_path, monkeypatch):
    variant, folder, name, _, compiled = portable_setup
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    os.chmod(copy / prebuilt.MANIFEST, 0o666)
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: copy)
    assert prebuilt.portable_toolchains(build.cxx()) == []
    assert build_quietly(variant).name != name


def test_a_tampered_portable_library_is_compiled_with_the_package_flags(portable_setup, tmp_path, monkeypatch):
    variant, folder, name, _, compiled = portable_setup
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    os.chmod(copy / name, 0o644)
    tamper_bytes(copy, name)
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: copy)
    with pytest.warns(UntrustedLibraryWarning, match="does not match the SHA-256"):
        path = build.build(variant)
    assert compiled == [name] and path.is_file()


BETTER = "-march=x86-64-v3" if build.platform.machine() == "x86_64" else "-march=armv8.2-a"


@pytest.fixture(scope="module")
def leveled(tmp_path_factory):
    """A folder as `make wheel` ships it with two CPU levels: Double's float64 library built for BETTER (requiring
    a feature named ``ptn-test-feature``) and for PORTABLE (requiring nothing), and toolchain.json listing both."""
    folder = tmp_path_factory.mktemp("leveled") / "prebuilt"
    names = []
    for target in (BETTER, PORTABLE):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   PTNATIVE_CXXFLAGS=target, PTNATIVE_CACHE_DIR=str(folder), PTNATIVE_PREBUILT="0")
        for name in ("PTNATIVE_CXX", "CXX"):
            env.pop(name, None)
        code = ("import ptnative, sys; from ptnative import build\n"
                "sys.path.insert(0, sys.argv[1]); from _ops_for_tests import double_spec\n"
                "v = ptnative.NativeOp(**double_spec(kernel='twice_prebuilt', name='DoublePrebuilt')).variant('float64')\n"
                "t = build.local_toolchain(); print(build.build(v).name); print(repr(t.version))\n")
        out = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests")], capture_output=True, text=True,
                             env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        name, version = out.stdout.splitlines()[-2:]
        names.append(name)
    levels = [Level((BETTER,), frozenset({"ptn-test-feature"})), Level((PORTABLE,), frozenset())]
    (folder / prebuilt.MANIFEST).write_bytes(prebuilt.manifest_data(build.cxx(), eval(version), levels))
    assert prebuilt._prune(folder) == 2
    return folder, names


@pytest.mark.parametrize("features, best", [({"ptn-test-feature"}, 0), (set(), 1)])
def test_each_cpu_gets_the_best_level_it_runs(setup, leveled, monkeypatch, features, best):
    """The CPU's features choose the level: the better one where the CPU has its features, else the baseline;
    nothing is compiled either way."""
    variant, _, cache, compiled = setup
    folder, names = leveled
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: folder)
    monkeypatch.setattr(cpu_levels, "cpu_features", lambda: frozenset(features))
    for name in ("PTNATIVE_CXXFLAGS", "PTNATIVE_CXX", "CXX"):
        monkeypatch.delenv(name, raising=False)
    path = build_quietly(variant)
    assert compiled == [] and path == cache / names[best]
    assert build.resolve(variant)[1].target == ((BETTER,), (PORTABLE,))[best]


def test_a_level_the_cpu_lacks_is_never_taken(setup, leveled, tmp_path, monkeypatch):
    """A package holding only the better level, on a CPU without its features: compiled here, never copied."""
    variant, _, cache, compiled = setup
    folder, names = leveled
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    for name in (names[1], names[1] + RECORD_SUFFIX):
        os.chmod(copy / name, 0o644)
        (copy / name).unlink()
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: copy)
    monkeypatch.setattr(cpu_levels, "cpu_features", lambda: frozenset())
    for name in ("PTNATIVE_CXXFLAGS", "PTNATIVE_CXX", "CXX"):
        monkeypatch.delenv(name, raising=False)
    path = build_quietly(variant)
    assert path.name not in names and compiled == [path.name]


def test_cpu_features_from_linux_and_macos():
    """/proc/cpuinfo's flags (x86) and Features (arm) lines, and macOS's sysctl names, in Linux's spelling."""
    x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse4_2 avx2 avx512f\nbugs\t\t: none\n"
    assert cpu_levels.parse_cpuinfo(x86) == {"fpu", "sse4_2", "avx2", "avx512f"}
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd atomics asimdrdm dcpop\n"
    assert cpu_levels.parse_cpuinfo(arm) == {"fp", "asimd", "atomics", "asimdrdm", "dcpop"}
    assert cpu_levels.runs(cpu_levels.LEVELS["aarch64"][0], cpu_levels.parse_cpuinfo(arm))
    assert not cpu_levels.runs(cpu_levels.LEVELS["aarch64"][0], frozenset({"fp", "asimd"}))
    mac = "FPU SSE4.1 SSE4.2 AVX1.0 FMA POPCNT\nAVX2 BMI1 BMI2 AVX512F\nLAHF LZCNT\n"
    assert {"sse4_1", "sse4_2", "avx", "fma", "avx2", "bmi1", "avx512f", "lahf_lm", "abm"} <= \
        cpu_levels.parse_sysctl_features(mac)
    assert cpu_levels.levels_for("x86_64")[-1].target == ("-march=x86-64-v2",)
    assert cpu_levels.levels_for("arm64") == cpu_levels.LEVELS["aarch64"] and cpu_levels.levels_for("riscv64") == ()
    for levels in cpu_levels.LEVELS.values():  # each level runs wherever a better one runs
        for better, worse in zip(levels, levels[1:]):
            assert worse.requires <= better.requires
    assert cpu_levels.runs(cpu_levels.LEVELS["aarch64"][-1], frozenset())  # x86-64-v2 needs SSE4.2 (since 2009)


def test_the_prebuild_step_records_its_toolchain_and_keeps_it(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir(mode=0o700)
    (dest / prebuilt.MANIFEST).write_bytes(prebuilt.manifest_data(
        "g++", "g++ 12", [Level((PORTABLE,), frozenset({"sse4_2"})), Level(("-march=x86-64",), frozenset())]))
    assert prebuilt._prune(dest) == 0
    assert os.stat(dest / prebuilt.MANIFEST).st_mode & 0o777 == 0o644
    parsed = prebuilt.parse_manifest((dest / prebuilt.MANIFEST).read_bytes())
    assert parsed == [(build.Toolchain("g++", "g++ 12", (PORTABLE,), ""), frozenset({"sse4_2"})),
                      (build.Toolchain("g++", "g++ 12", ("-march=x86-64",), ""), frozenset())]


def _fake_build(dest, seen):
    """A stand-in for the prebuild step's ``python -m ptnative build`` runs: one library per run, named for its
    flags, and the run's toolchain record."""
    def run(cmd, env, **kw):
        seen.append((cmd, env["PTNATIVE_CXXFLAGS"], env["PTNATIVE_PREBUILT"], kw.get("stdout")))
        name = f"x{len(seen)}.so"
        for entry in (name, name + RECORD_SUFFIX):
            (dest / entry).write_bytes(b"x")
        Path(cmd[-1]).write_bytes(prebuilt.manifest_data("g++", "g++ 12", [Level((env["PTNATIVE_CXXFLAGS"],),
                                                                                   frozenset())]))
        return subprocess.CompletedProcess(cmd, 0)
    return run


def test_the_prebuild_step_says_what_it_compiles(tmp_path, monkeypatch, capsys):
    """``python -m ptnative.prebuilt`` (setup.py's step): a first line with the CPU target, the build with one
    progress line per library and its toolchain record, then toolchain.json and a summary with the time."""
    dest = tmp_path / "dest"
    seen = []
    monkeypatch.setattr(prebuilt.subprocess, "run", _fake_build(dest, seen))
    monkeypatch.setenv("PTNATIVE_CXXFLAGS", PORTABLE)
    monkeypatch.delenv(prebuilt.LEVELS_ENV, raising=False)
    assert prebuilt.main([str(dest), "-j", "2"]) == 0
    err = capsys.readouterr().err
    assert f"CPU target {PORTABLE}" in err
    assert "ptnative: 1 prebuilt libraries in" in err and "built in 0 min" in err
    (cmd, flags_env, prebuilt_env, stdout), = seen
    assert cmd[-6:-1] == ["-j", "2", "--progress", "lines", "--toolchain-record"]
    assert flags_env == PORTABLE and prebuilt_env == "0" and stdout is sys.stderr
    assert sorted(os.listdir(dest)) == sorted(["x1.so", "x1.so" + RECORD_SUFFIX, prebuilt.MANIFEST])  # kept
    assert prebuilt.parse_manifest((dest / prebuilt.MANIFEST).read_bytes()) == [
        (build.Toolchain("g++", "g++ 12", (PORTABLE,), ""), frozenset())]


def test_the_prebuild_step_builds_every_portable_level(tmp_path, monkeypatch, capsys):
    """``PTNATIVE_PREBUILT_LEVELS=portable`` (``make wheel``): one build per CPU level of the architecture, best
    first, and toolchain.json lists them with the features each requires."""
    dest = tmp_path / "dest"
    seen = []
    monkeypatch.setattr(prebuilt.subprocess, "run", _fake_build(dest, seen))
    monkeypatch.setenv(prebuilt.LEVELS_ENV, "portable")
    monkeypatch.setenv("PTNATIVE_CXXFLAGS", "-march=native")  # not used for portable levels
    levels = cpu_levels.levels_for()
    if not levels:
        pytest.skip("no portable CPU levels known for this architecture")
    assert prebuilt.main([str(dest)]) == 0
    assert [flags_env for _, flags_env, _, _ in seen] == [" ".join(level.target) for level in levels]
    assert "CPU targets " + ", ".join(" ".join(level.target) for level in levels) in capsys.readouterr().err
    assert prebuilt.parse_manifest((dest / prebuilt.MANIFEST).read_bytes()) == [
        (build.Toolchain("g++", "g++ 12", level.target, ""), level.requires) for level in levels]


def test_the_prebuild_step_with_bad_flags_installs_nothing_and_succeeds(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PTNATIVE_CXXFLAGS", "-march='oops")
    assert prebuilt.main([str(tmp_path / "dest")]) == 0
    assert "no prebuilt libraries" in capsys.readouterr().err and not (tmp_path / "dest").exists()
