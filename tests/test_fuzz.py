"""Fuzz suite (issue 14): generated NativeOp specs, and bad inputs for every catalogue function in every mode.

Every case runs in a child process (tests/fuzz_worker.py), so a crash or a hang is a failed case, not a dead
test run.  The cases and their expected results are in tests/fuzz_specs.py and tests/fuzz_cases.py.  The
kernel cache is the tests' own (tests/conftest.py), never the user's.  Hypothesis runs derandomized with a
fixed number of examples and without shrinking, so a run is reproducible and bounded; the per-category
counts of the cases tried are written to ``$TMPDIR/ptnative-fuzz-counts.json`` at the end of the module.
"""

import collections
import json
import os
import tempfile

import pytensor
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from . import fuzz_cases, fuzz_specs
from .conftest import MODE_IDS, MODES
from .fuzz_runner import Worker, run_isolated

COUNTS = collections.Counter()
FAILURES = collections.Counter()
VALID_SPECS, INVALID_SPECS = fuzz_specs.strategies()
FUZZ = settings(derandomize=True, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def worker():
    cache = os.environ.get("PTNATIVE_CACHE_DIR", "")
    assert cache and not os.path.realpath(cache).startswith(os.path.realpath(os.path.expanduser("~/.cache"))), cache
    w = Worker()
    yield w
    w.close()
    path = os.path.join(tempfile.gettempdir(), "ptnative-fuzz-counts.json")
    with open(path, "w") as f:
        json.dump({"cases": dict(sorted(COUNTS.items())), "failed": dict(sorted(FAILURES.items()))}, f, indent=1)
    print(f"\nfuzz cases per category: {dict(sorted(COUNTS.items()))}\nfailed: {dict(sorted(FAILURES.items()))}")


#: Open defects (issue 14, the fuzz suite's findings not fixed yet), as (function, case).  Such a case must still
#: fail (else it is fixed: remove it here); every other case must pass.
KNOWN_DEFECTS = set()


def check(results, context, function=None):
    bad = []
    for r in results:
        COUNTS[r["category"]] += 1
        known = (function, r["case"]) in KNOWN_DEFECTS
        if r["status"] != "ok" and not known:
            FAILURES[r["category"]] += 1
            bad.append(f"[{r['status']}] {r['case']}: {r['message']}")
        elif r["status"] == "ok" and known:
            bad.append(f"[fixed] {r['case']} passes now: remove it from KNOWN_DEFECTS")
    assert not bad, f"{context}: {len(bad)} of {len(results)} cases failed:\n" + "\n".join(bad)


# ------------------------------------------------------------------------------------------- specs
def run_examples(worker, strategy, n):
    """Every one of ``n`` derandomized examples runs (no stop at the first failure, no shrinking); the
    failures of all of them are reported together."""
    failures, count = [], [0]

    @settings(FUZZ, max_examples=n)
    @given(spec=strategy)
    def each(spec):
        count[0] += 1
        try:
            check(run_isolated(worker, {"kind": "spec", "spec": spec}), f"spec {spec!r}")
        except AssertionError as e:
            failures.append(str(e))

    each()
    assert count[0] >= min(n, 3), f"only {count[0]} examples ran"
    assert not failures, f"{len(failures)} of {count[0]} specs failed:\n\n" + "\n\n".join(failures)


def test_generated_valid_spec_builds_and_runs_in_every_mode(worker):
    """A valid spec with hostile names builds in every mode, computes ``2 x + 1`` (also from a negative-stride
    view), fills the other outputs, and a wrong size of an int-shaped input is a ValueError naming the op."""
    run_examples(worker, VALID_SPECS, 20)


@pytest.mark.parametrize("mutation", fuzz_specs.MUTATIONS)
def test_generated_invalid_spec_is_a_value_error_naming_the_op(worker, mutation):
    """One defect from fuzz_specs.MUTATIONS on generated specs: a ValueError naming the op (by its name or
    its repr) when the op is created."""
    run_examples(worker, INVALID_SPECS(mutation), 5)


# ----------------------------------------------------------------------------------- catalogue inputs
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("function", fuzz_cases.FUNCTIONS)
def test_bad_inputs(worker, function, mode):
    """NaN/inf, empty batch, zero lengths, out-of-range labels and lengths, wrong dtypes and ndims,
    non-contiguous and negative-stride views: a clear exception or the documented result, never a crash."""
    results = run_isolated(worker, {"kind": "catalogue", "function": function, "mode": mode}, timeout=900)
    assert results, "no case ran"
    check(results, f"{function} in mode {mode or 'default'}", function)


@pytest.mark.parametrize("function", [f for f in fuzz_cases.FUNCTIONS if f != "memory_leak"])
def test_bad_inputs_through_eager(worker, function):
    """The same cases with every graph called through ``ptnative.eager.wrap`` on the numpy arrays (compiled once per
    signature, one-op graphs calling the op's driver directly): the same verdicts, never a crash."""
    results = run_isolated(worker, {"kind": "catalogue", "function": function, "mode": None, "eager": True},
                           timeout=900)
    assert results, "no case ran"
    check(results, f"{function} through ptnative.eager", function)


def test_every_catalogue_function_has_a_harness():
    import ptnative

    functions = set(ptnative.ops.FUNCTIONS)
    pure_python = {"n_chunks", "naive_chunk_start_frames", "onehot_to_sparse"}  # exercised in build cases
    assert functions - pure_python <= set(fuzz_cases.FUNCTIONS), functions - set(fuzz_cases.FUNCTIONS)
