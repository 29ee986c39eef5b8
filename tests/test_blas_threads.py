"""The worker pool of OpenBLAS and the kernels' threads (c_code/runtime/blas_threads.cc,
ptnative/blas_threads.py).

The pool's promise to OpenBLAS: every job of a call runs at the same time as the others (a call's jobs may wait for
each other), job 0 on the calling thread, each job once, and the call returns when all are done; also when the
workers are busy (a call from another thread, or from inside a job), and in a forked child.  Checked with jobs that
wait at a barrier of all the call's jobs: jobs run one after another would break it (time out) instead of passing.
Then the installation: numpy's and scipy's OpenBLAS compute the same products with the pool as with their own
workers, and run their parallel work on it.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from ptnative import blas_threads, build

DOJOB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_int)


@pytest.fixture(scope="module")
def pool():
    lib = build.open_library(blas_threads.pool_variant())
    lib.ptn_blas_threads_run.argtypes = [ctypes.c_int, DOJOB, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p,
                                         ctypes.c_int]
    lib.ptn_blas_threads_run.restype = None
    return lib


def run_barrier_jobs(pool, numjobs, inner=None):
    """Runs `numjobs` jobs through the pool, each waiting at a barrier of all of them (10 s at most), and returns
    (job index, dojob_data, thread id, passed the barrier) per job, in the order they ran."""
    barrier = threading.Barrier(numjobs, timeout=10)
    seen = []
    data = (ctypes.c_int64 * numjobs)(*range(100, 100 + numjobs))  # one 8-byte element per job

    def job(thread_num, jobdata, dojob_data):
        value = ctypes.c_int64.from_address(jobdata).value
        try:
            barrier.wait()
            ok = True
        except threading.BrokenBarrierError:
            ok = False
        if inner is not None:
            inner()
        seen.append((thread_num, value, dojob_data, threading.get_ident(), ok))

    callback = DOJOB(job)
    pool.ptn_blas_threads_run(1, callback, numjobs, 8, ctypes.addressof(data), 7)
    return seen


@pytest.mark.parametrize("numjobs", [1, 2, 3, 6])
def test_every_job_runs_once_all_at_once(pool, numjobs):
    caller = threading.get_ident()
    seen = run_barrier_jobs(pool, numjobs)
    assert sorted(s[0] for s in seen) == list(range(numjobs))
    assert all(value == 100 + i and dojob_data == 7 for i, value, dojob_data, _, _ in seen)
    assert all(ok for *_, ok in seen), "the jobs did not all run at the same time"
    assert [s[3] for s in seen if s[0] == 0] == [caller]
    assert len({s[3] for s in seen}) == numjobs
    assert pool.ptn_blas_threads_workers() >= numjobs - 1


def test_zero_jobs_is_a_no_op(pool):
    pool.ptn_blas_threads_run(1, DOJOB(lambda *a: pytest.fail("ran a job")), 0, 8, None, 0)


def test_a_call_from_inside_a_job_gets_threads_of_its_own(pool):
    results = []
    seen = run_barrier_jobs(pool, 2, inner=lambda: results.append(run_barrier_jobs(pool, 3)))
    assert all(ok for *_, ok in seen)
    assert len(results) == 2
    for inner in results:
        assert sorted(s[0] for s in inner) == [0, 1, 2] and all(ok for *_, ok in inner)


def test_calls_from_several_threads_at_once(pool):
    results, errors = [], []

    def caller():
        try:
            for _ in range(5):
                results.append(run_barrier_jobs(pool, 2))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 20
    assert all(sorted(s[0] for s in r) == [0, 1] and all(ok for *_, ok in r) for r in results)


def test_calls_with_one_dojob_never_overlap(pool):
    """Calls naming the same dojob (one OpenBLAS library) run one at a time, their jobs still all at once."""
    lock, active, most = threading.Lock(), [0], [0]
    barrier_of = {}

    def job(thread_num, jobdata, dojob_data):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        barrier_of[dojob_data].wait()
        threading.Event().wait(0.005)
        with lock:
            active[0] -= 1

    callback = DOJOB(job)
    data = (ctypes.c_int64 * 2)()

    def caller(k):
        for r in range(5):
            barrier_of[10 * k + r] = threading.Barrier(2, timeout=10)
            pool.ptn_blas_threads_run(1, callback, 2, 8, ctypes.addressof(data), 10 * k + r)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert most[0] == 2


# The installed pool, in a process of its own (the callback stays set in every OpenBLAS of the process it is in):
# numpy's products with the pool equal those with OpenBLAS's own workers, also from several threads at once, the
# pool runs them, and a forked child computes with it too.
INSTALLED = r"""
import os, sys, numpy as np
from ptnative import blas_threads, build
rng = np.random.default_rng(0)
cases = []
for dtype in (np.float32, np.float64):
    a, b = rng.normal(size=(700, 600)).astype(dtype), rng.normal(size=(600, 500)).astype(dtype)
    cases.append((a, b, a @ b))
import scipy.linalg.cython_blas  # scipy's OpenBLAS, loaded as the kernels load it
paths = blas_threads.install(build.open_library)
print("libraries", len(paths))
before = blas_threads.status()["calls"]
for a, b, want in cases:
    got = a @ b
    assert np.array_equal(got, want), np.abs(got - want).max()
after = blas_threads.status()
print("calls", after["calls"] - before)
import threading
wrong = []
def products():
    for _ in range(10):
        wrong.extend(1 for a, b, want in cases if not np.array_equal(a @ b, want))
threads = [threading.Thread(target=products) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("wrong", len(wrong))
pid = os.fork()
if pid == 0:
    ok = all(np.array_equal(a @ b, want) for a, b, want in cases)
    os._exit(0 if ok and blas_threads.status()["calls"] > after["calls"] else 3)
print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
blas_threads.uninstall()
assert all(np.array_equal(a @ b, want) for a, b, want in cases)
print("uninstalled", blas_threads.status()["libraries"])
"""


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "2", **env})


def test_numpy_products_run_on_the_pool_and_equal_openblas_own():
    if not any("openblas" in os.path.basename(p).lower() for p in blas_threads._loaded_library_paths()):
        pytest.skip("numpy's BLAS is not OpenBLAS here")
    proc = _run(INSTALLED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    if lines["libraries"] == "0":
        pytest.skip("no loaded OpenBLAS has a threads callback (OpenBLAS < 0.3.27)")
    assert int(lines["calls"]) >= 2  # numpy's float32 and float64 products, both threaded
    assert lines["wrong"] == "0"  # numpy's products from 4 threads at once, each as computed alone
    assert lines["child"] == "0"
    assert lines["uninstalled"] == "[]"


# The kernels' parallel parts in a process of its own: they run on the pool (a part's worker the same from call to
# call), also in a forked child, which starts workers of its own.
PARTS_AND_FORK = r"""
import os, numpy as np, pytensor, pytensor.tensor as pt
from tests.test_native_op import parts_op
from ptnative import blas_threads
x, what = pt.vector(), pt.iscalar()
f = pytensor.function([x, what], parts_op()(x, what), mode="FAST_COMPILE")
assert np.array_equal(f(np.arange(3.0), 0), [1, 2, 3])
first, second = f(np.zeros(2), 3), f(np.zeros(2), 3)
print("same worker", int(first[1] == second[1] != first[0]))
calls = blas_threads.status()["calls"]
pid = os.fork()
if pid == 0:
    ok = np.array_equal(f(np.arange(4.0), 0), [1, 2, 3, 4])
    first, second = f(np.zeros(2), 3), f(np.zeros(2), 3)
    os._exit(0 if ok and first[1] == second[1] != first[0] and blas_threads.status()["calls"] > calls else 3)
print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_kernel_parts_run_on_the_pool_also_in_a_forked_child():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", PARTS_AND_FORK], capture_output=True, text=True, timeout=300,
                          cwd=root, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [root, *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["same", "worker", "1", "child", "0"]


def test_setting_openblas_leaves_openblas_alone():
    proc = _run("from ptnative import blas_threads, build\nprint(blas_threads.install(build.open_library))",
                PTNATIVE_BLAS_THREADS="openblas")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_an_invalid_setting_is_named(monkeypatch):
    monkeypatch.setenv("PTNATIVE_BLAS_THREADS", "mkl")
    with pytest.raises(ValueError, match="PTNATIVE_BLAS_THREADS must be one of"):
        blas_threads.choice()


def test_a_pool_that_cannot_be_built_leaves_openblas_alone_and_is_tried_once(monkeypatch, caplog):
    monkeypatch.setattr(blas_threads, "_pool", None)
    monkeypatch.setattr(blas_threads, "_pool_failed", False)
    monkeypatch.setattr(blas_threads, "_installed", {})
    monkeypatch.setattr(blas_threads, "openblas_libraries", lambda: ["/some/libopenblas.so"])
    tries = []

    def failing_open(variant):
        tries.append(variant)
        raise build.CompileError("no compiler")

    assert blas_threads.install(failing_open) == []
    assert blas_threads.install(failing_open) == []
    assert blas_threads.parts_runner(failing_open) is None  # the kernels' parts then start threads of their own
    assert len(tries) == 1
    assert "OpenBLAS keeps its own workers and the kernels start threads for each call" in caplog.text
