"""Shared test helpers: the modes every op must agree in, and the infer_shape check."""

import atexit
import dataclasses
import functools
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

# Tests use their own kernel cache unless one is given, so a stale user cache cannot hide a build problem.
os.environ.setdefault("PTNATIVE_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"ptnative-test-cache-{os.getuid()}"))
# Outputs a spec declares fully_written start as 0xFF bytes (NaN, -1) instead of as allocated, in every test and
# the processes it starts: an element such a kernel does not write shows in the results (docs/writing-ops.md).
os.environ.setdefault("PTNATIVE_POISON_OUTPUTS", "1")
# PyTensor's own C modules (the graphs of the "C" and "CVM" modes, several hundred in a run) are compiled without
# its -O3 and -g here and in the processes the tests start: the same code, in about half the g++ time
# (docs/install.md, "What the tests share to save time"); ptnative's kernels keep their own flags.  The -g0 puts
# these modules under keys of their own in PyTensor's compiledir, so a user's -O3 modules are never replaced; where
# PYTENSOR_FLAGS sets gcc__cxxflags (and so would drop that -g0) PyTensor's flags stay, as they do with
# PTNATIVE_TEST_PYTENSOR_DEFAULTS=1 (each `make matrix` row: the "C" mode also tested as users build it).
_PYTENSOR_FLAGS = os.environ.get("PYTENSOR_FLAGS", "")
if os.environ.get("PTNATIVE_TEST_PYTENSOR_DEFAULTS") != "1" and "gcc__cxxflags" not in _PYTENSOR_FLAGS:
    os.environ["PYTENSOR_FLAGS"] = ",".join(filter(None, ["cmodule__remove_gxx_opt=True", "gcc__cxxflags=-g0",
                                                          _PYTENSOR_FLAGS]))


def _children_import_what_this_process_imports():
    """Python processes the tests start import the same ptnative as this process and this checkout's ``tests``
    package: under ``make test`` the installed package (with its prebuilt libraries), not the checkout's sources,
    which a child would otherwise find first (``python -c`` or ``-m`` in the checkout puts it at the head of
    ``sys.path``, and so did the checkout on ``PYTHONPATH``, the way to import ``tests``).  ``PYTHONSAFEPATH``
    (Python >= 3.11) keeps the directory and the script's folder off a child's path; ``PYTHONPATH`` gains a folder
    holding only a link to ``tests`` (or the checkout, where this process imports ptnative from it)."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    tests = os.path.join(root, "tests")
    spec = importlib.util.find_spec("ptnative")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if not any(os.path.realpath(os.path.join(p, "tests")) == tests for p in paths):  # else: a child of a test
        if spec is None or os.path.dirname(os.path.dirname(os.path.realpath(spec.origin))) == root:
            entry = root
        else:
            entry = tempfile.mkdtemp(prefix="ptnative-tests-path-")
            os.symlink(tests, os.path.join(entry, "tests"))
            atexit.register(shutil.rmtree, entry, True)
        os.environ["PYTHONPATH"] = os.pathsep.join([entry, *paths])
    os.environ["PYTHONSAFEPATH"] = "1"


_children_import_what_this_process_imports()

import pytensor  # noqa: E402

#: Every mode a NativeOp must run in: default (Numba), C, CVM, and Python-only FAST_COMPILE.
MODES = [None, "C", "CVM", "FAST_COMPILE"]
MODE_IDS = ["default", "C", "CVM", "FAST_COMPILE"]


@pytest.fixture(params=MODES, ids=MODE_IDS)
def mode(request):
    return request.param


#: PTNATIVE_POISON_OUTPUTS's patterns (c_code/native_op_entry.h, poison_fully_written): 0xFF bytes are NaN in a float
#: but -1 in an int, the very value an int output holds on padded frames (a Viterbi or sampled path); 0x5A bytes
#: (1515870810 in an int32) are no value an int output holds.  Tests of int outputs run with both.
POISON_PATTERNS = {"1": b"\xff", "2": b"\x5a"}


@pytest.fixture(params=sorted(POISON_PATTERNS), ids=["poison-ff", "poison-5a"])
def poison_pattern(request, monkeypatch):
    """Sets PTNATIVE_POISON_OUTPUTS to each pattern in turn (read by the kernels at every call); the fill byte."""
    monkeypatch.setenv("PTNATIVE_POISON_OUTPUTS", request.param)
    return POISON_PATTERNS[request.param]


#: The test files that take the most CPU time, longest first (docs/install.md, "The test suite": a cold run's CPU time
#: per file, b740bde's; test_jax_scaling's three long tests first of all): they run first, so that pytest-xdist's
#: processes end together instead of one of them finishing a long file or a long compile check alone.  Only the order
#: changes; every other file follows in collection order.
LONGEST_FIRST = ["test_jax_scaling.py", "test_lstm.py", "test_hmm.py", "test_fuzz.py", "test_fsa.py",
                 "test_cuda_emulation.py", "test_sparse.py", "test_gpu_cases.py", "test_blind_spots.py",
                 "test_chunking.py", "test_rnnt.py", "test_cache_trust.py", "test_native_op.py", "test_compat.py",
                 "test_hmm_small.py", "test_docs.py", "test_generated_code.py", "test_leaks.py",
                 "test_edit_distance.py", "test_jax_vmap.py", "test_lstm_fully_written.py", "test_jax_grad.py",
                 "test_fully_written.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


def compiled_once(build):
    """Decorator of a test helper that builds and compiles a graph: the compiled function is made once per process
    for each set of arguments and shared by the tests that ask for the same one (in the default mode every
    ``pytensor.function`` is a Numba compilation of the graph; a graph holding a native op has no cache key, so
    PyTensor compiles it anew each time).  Every call of a PyTensor function returns new output arrays, so the
    results of earlier calls stay as they were.  A call with a ``Mode`` object (not a mode's name) is not shared."""
    made = {}
    signature = inspect.signature(build)

    @functools.wraps(build)
    def shared(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        if any(isinstance(a, pytensor.compile.mode.Mode) for a in bound.arguments.values()):
            return build(*args, **kwargs)
        key = tuple((k, tuple(sorted(v.items())) if isinstance(v, dict) else v) for k, v in bound.arguments.items())
        if key not in made:
            made[key] = build(*args, **kwargs)
        return made[key]

    return shared


def check_infer_shape(inputs, outputs, values, op_class, mode=None):
    """The op vanishes from the shape graph, and the inferred shapes equal the computed ones."""
    mode = pytensor.compile.get_mode(mode).including("canonicalize")
    fo = pytensor.function(inputs, outputs, mode=mode)
    fs = pytensor.function(inputs, [o.shape for o in outputs], mode=mode, on_unused_input="ignore")
    assert not any(isinstance(n.op, op_class) for n in fs.maker.fgraph.toposort())
    assert any(isinstance(n.op, op_class) for n in fo.maker.fgraph.toposort())
    for o, s in zip(fo(*values), fs(*values)):
        assert tuple(np.shape(o)) == tuple(s)


def tol(dtype):
    """(rtol, atol) for comparing against a float64 reference."""
    return (2e-4, 2e-5) if np.dtype(dtype) == np.float32 else (1e-10, 1e-12)


def _kernel_guards(source: str) -> list[str]:
    """The include guards of the kernel headers (``c_code/<family>/``, ``c_code/common/``) that ``source`` defines:
    those of its op's namespace, not the dialect's (``dialect/``, global, kept once)."""
    from ptnative.source import _dialect_files, read_kernel_file

    dialect = {m for f in _dialect_files() for m in re.findall(r"^#define (PTNATIVE_\w+_H)\b", read_kernel_file(f), re.M)}
    return sorted(set(re.findall(r"^#define (PTNATIVE_\w+_H)\b", source, re.M)) - dialect)


def build_with_nvcc(*variants):
    """Compile CUDA ``variants`` with nvcc through :func:`ptnative.build.build` (the cache, its lock and checks) for
    the nvcc compile checks, as one library, and return its path (checked to be a non-empty file exporting every
    op variant's entry point).

    The translation unit is the variants' own units one after the other: the dialect's header guards keep its first
    copy; the guards of the kernel headers inlined into each unit's namespace are undefined before the next unit
    (:func:`_kernel_guards`), so that each namespace gets its own copy; each unit's op code, tables and kernels
    are in a namespace of its own, so nvcc compiles every
    variant's code as in a build of its own unit, but reads the dialect, the system and CUDA headers once (a check
    of 4 variants in one unit took half the CPU time of 4 builds).  The source carries ``QUICK_BUILD_MARK``, so
    nvcc compiles the host code at ``-O0`` instead of ``-O3`` (under a library name of its own): cudafe++, cicc,
    ptxas and the host compiler still see and accept every unit, the device code is optimised as in a user's
    build, and the host pass takes about a third of its ``-O3`` time (docs/install.md, "What the tests share to
    save time")."""
    from ptnative.build import QUICK_BUILD_MARK, build

    assert variants and all(v.device == "cuda" for v in variants), [v.device for v in variants]
    parts = [QUICK_BUILD_MARK]
    for v in variants:
        parts += [f"#undef {g}" for g in _kernel_guards(v.source)] + [v.source]
    unit = dataclasses.replace(variants[0], source="\n".join(parts),
                               include_dirs=tuple(dict.fromkeys(d for v in variants for d in v.include_dirs)))
    path = build(unit)
    assert path.exists() and path.stat().st_size > 0, path
    exported = exported_functions(path)
    missing = [v.symbol for v in variants if v.plan is not None and v.symbol not in exported]
    assert not missing, f"{path.name} lacks the entry points {missing}"
    return path


def exported_functions(path):
    """The names of the functions the shared library ``path`` exports (``nm -D``)."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.split()[1:2] == ["T"]}
