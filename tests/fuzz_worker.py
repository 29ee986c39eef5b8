"""A child process that runs fuzz cases for tests/test_fuzz.py, so that a crash (SIGSEGV, SIGBUS, abort)
kills this process, not the test run.

Protocol: one JSON request per line on stdin; for each case the worker writes ``{"begin": case_id}`` before
running it and ``{"case": case_id, "category": ..., "status": "ok" | "fail", "message": ...}`` after it, then
``{"done": true}`` at the end of the request, as JSON lines on the file descriptor given as argv[1] (stdout and
stderr stay free for whatever the kernels or PyTensor print).  Requests:

* ``{"kind": "catalogue", "function": name, "mode": mode}``: the bad-input cases of one catalogue function (with
  ``"eager": true``: called through ``ptnative.eager``);
* ``{"kind": "catalogue_cuda_emulation", "function": name}``: the same cases in FAST_COMPILE with every op's CUDA
  path emulated (tests/test_cuda_emulation.py; a worker that takes such a request should take no other kind);
* ``{"kind": "spec", "spec": {...}}``: one generated NativeOp spec (see ``fuzz_specs.cases_for``);

either with ``"skip": [case ids]`` (cases that crashed an earlier worker).

The kernel cache must be a test cache given in ``$PTNATIVE_CACHE_DIR``; the worker refuses to start otherwise.
"""

import contextlib
import importlib.util
import json
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _check_cache_dir():
    cache = os.environ.get("PTNATIVE_CACHE_DIR", "")
    real_default = os.path.realpath(os.path.expanduser("~/.cache/ptnative"))
    if not cache or os.path.realpath(cache).startswith(real_default):
        raise SystemExit(f"fuzz_worker: PTNATIVE_CACHE_DIR must name a test cache, got {cache!r}")


def main():
    _check_cache_dir()
    out = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    if importlib.util.find_spec("tests") is None:  # started by hand: tests/conftest.py sets PYTHONPATH for the tests
        sys.path.append(ROOT)
    from tests import fuzz_cases, fuzz_specs

    def emit(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["kind"] == "catalogue":
                cases = contextlib.nullcontext(fuzz_cases.cases_for(request["function"], request["mode"],
                                                                    eager=request.get("eager", False)))
            elif request["kind"] == "catalogue_cuda_emulation":
                from tests import test_cuda_emulation

                cases = test_cuda_emulation.fuzz_cases_on_the_emulated_cuda_path(request["function"])
            else:
                cases = contextlib.nullcontext(fuzz_specs.cases_for(request["spec"]))
            skip = set(request.get("skip", ()))
            with cases as case_list:
                for case_id, category, thunk in case_list:
                    if case_id in skip:
                        continue
                    emit({"begin": case_id})
                    try:
                        thunk()
                        emit({"case": case_id, "category": category, "status": "ok"})
                    except Exception as e:  # noqa: BLE001 - every failure is reported to the parent
                        emit({"case": case_id, "category": category, "status": "fail",
                              "message": f"{type(e).__name__}: {e}"[:2000],
                              "traceback": traceback.format_exc()[-3000:]})
        except Exception:  # noqa: BLE001 - a broken request is reported, the worker goes on
            emit({"error": traceback.format_exc()[-4000:]})
        emit({"done": True})


if __name__ == "__main__":
    main()
