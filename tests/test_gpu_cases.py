"""The GPU test harness (tests/gpu/cases.py) on the CPU: every catalogue op has a case, and every case builds,
compiles and gives the same numbers in the default mode and in FAST_COMPILE (same CPU kernels), so the harness
cannot rot on machines without a GPU."""

import pytest

from .gpu.cases import CASES, assert_all_ops_covered, assert_outputs_close, params, run_case


def test_every_catalogue_op_has_a_gpu_case():
    assert_all_ops_covered()


def test_case_names_are_unique_and_each_family_has_a_representative():
    assert len({c.name for c in CASES}) == len(CASES)
    families = {c.family for c in CASES}
    assert families == {c.family for c in CASES if c.representative}


@pytest.mark.parametrize("case,dtype", params(), ids=lambda v: str(v))
def test_case_default_mode_matches_fast_compile(case, dtype):
    want = run_case(case, dtype, "cpu", mode=None)
    got = run_case(case, dtype, "cpu", mode="FAST_COMPILE")
    assert len(want) >= 1
    assert_outputs_close(case, dtype, got, want, "FAST_COMPILE vs default")
