"""hmm_viterbi with the batch in vector lanes (c_code/hmm/hmm_viterbi_lanes.h: groups of 8 sequences on the CPU):
full, partly full and several groups, ragged masks, ties, float32, NaN / +inf / no path inside a group, threads,
against enumeration of all state paths (tests/reference/hmm.py brute_force), a numpy max-plus Viterbi
(reference viterbi), and the same sequence computed alone (B = 1: the sequence-at-a-time path), bit for bit."""

import os
from unittest import mock

import numpy as np
import pytest

from ptnative.ops import hmm

from .conftest import tol
from .reference import hmm as ref
from .test_hmm import cast, compiled, mask_of, model

DTYPES = ["float32", "float64"]

# Every test here runs with both poison patterns (tests/conftest.py): the path's padded frames must hold -1, which is
# what the 0xFF pattern leaves in an int32 that a kernel never writes.
pytestmark = pytest.mark.usefixtures("poison_pattern")


def viterbi_fn(dtype, mode=None):
    return compiled(hmm.hmm_viterbi, dtype, mode)


def ragged(rng, B, T):
    """B lengths in [0, T] with T, 1 and 0 among them (B >= 3)."""
    lens = rng.integers(0, T + 1, size=B)
    lens[:3] = [T, 1, 0]
    return rng.permutation(lens)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B", [2, 8, 9, 13, 16])
def test_lane_groups_against_enumeration(mode, dtype, B):
    """One full group (B = 8), partly full ones (2, 9, 13) and two full ones (16), ragged, K = 3 and T = 5."""
    rng = np.random.default_rng(100 + B)
    T, K = 5, 3
    le, lA, lpi, lf = cast(dtype, *model(rng, T, B, K, 2.0))
    lens = ragged(rng, B, T) if B >= 3 else [5, 2]
    path, score = viterbi_fn(dtype, mode)(le, lA, lpi, lf, mask_of(lens, T).astype(dtype))
    _, _, _, want_path, want_score = ref.brute_force(le, lA, lpi, lf, lens)
    assert path.dtype == np.int32 and score.dtype == dtype
    np.testing.assert_array_equal(path, want_path)
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(score, want_score, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [2, 5, 8, 12, 16, 17, 24])
def test_lanes_against_numpy(dtype, K):
    """Longer ragged series, K on both sides of the vector widths (8, 16); the reference computes in float64 from
    the same (rounded) inputs, so the paths agree exactly."""
    rng = np.random.default_rng(200 + K)
    T, B = 120, 11
    le, lA, lpi, lf = cast(dtype, *model(rng, T, B, K, 3.0))
    lens = ragged(rng, B, T)
    path, score = viterbi_fn(dtype)(le, lA, lpi, lf, mask_of(lens, T).astype(dtype))
    want_path, want_score = ref.viterbi(*cast("float64", le, lA, lpi, lf), lens)
    np.testing.assert_array_equal(path, want_path)
    np.testing.assert_array_equal(score, want_score.astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [3, 6, 16, 20])
def test_lane_ties_go_to_the_lowest_state(dtype, K):
    """Integer log-weights (exact sums): many equally good paths, -inf transitions; the lowest state wins at the
    end and at every step of the backtrace (enumeration for K = 3, the numpy reference otherwise)."""
    rng = np.random.default_rng(300 + K)
    T, B = (5, 10) if K == 3 else (60, 10)
    le = rng.integers(-2, 1, size=(T, B, K)).astype(np.float64)
    lA = rng.integers(-1, 1, size=(K, K)).astype(np.float64)
    lA[K - 1, 0] = lA[1, 2] = -np.inf
    lpi, lf = np.zeros(K), -(np.arange(K) % 2).astype(np.float64)
    le[:, 0] = 0.0
    lens = ragged(rng, B, T)
    path, score = viterbi_fn(dtype)(*cast(dtype, le, lA, lpi, lf, mask_of(lens, T)))
    if K == 3:
        _, _, _, want_path, want_score = ref.brute_force(le, lA, lpi, lf, lens)
    else:
        want_path, want_score = ref.viterbi(le, lA, lpi, lf, lens)
    np.testing.assert_array_equal(path, want_path)
    np.testing.assert_array_equal(score, want_score.astype(dtype))
    flat = viterbi_fn(dtype)(*cast(dtype, np.zeros((T, B, K)), np.zeros((K, K)), np.zeros(K), np.zeros(K),
                                   mask_of(lens, T)))
    np.testing.assert_array_equal(flat[0], np.where(mask_of(lens, T) > 0, 0, -1))
    np.testing.assert_array_equal(flat[1], 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, K", [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 7), (1, 8), (1, 9), (2, 3), (2, 6)])
def test_ties_on_the_one_sequence_paths(dtype, B, K):
    """The paths that do not use lanes (c_code/hmm_viterbi.cu): B = 1 with K <= 8 (one sequence in registers, 2-bit
    backpointers in a word for K <= 4, bytes for K <= 8), B = 1 with K > 8 and B = 2 (too few sequences to fill a
    group of lanes: hmm_viterbi_kernel's frame-by-frame path).  Integer log-weights make many paths tie exactly; the
    documented rule (the lowest state at the end and at every step of the backtrace, i.e. the tied path smallest read
    from the last frame backwards) is checked against enumeration of every path, with padded frames -1; all-zero
    weights give state 0 everywhere."""
    rng = np.random.default_rng(900 + 10 * B + K)
    T = 6 if K <= 4 else 5 if K <= 7 else 4
    f = viterbi_fn(dtype)
    for trial in range(4):
        le = rng.integers(-2, 1, size=(T, B, K)).astype(np.float64)
        lA = rng.integers(-1, 1, size=(K, K)).astype(np.float64)
        lpi = rng.integers(-1, 1, size=K).astype(np.float64)
        lf = rng.integers(-1, 1, size=K).astype(np.float64)
        if K > 2:
            lA[K - 1, 0] = lA[1, 2] = -np.inf
        if trial % 2:
            h = K // 2  # the last h states copy the first h (emissions, transitions into them): ties everywhere
            le[:, :, K - h:] = le[:, :, :h]
            lA[:, K - h:] = lA[:, :h]
        for lens in ([T] * B, [T - 2, 1][:B] if B == 2 else [T - 2], [1] * B):
            path, score = f(*cast(dtype, le, lA, lpi, lf, mask_of(lens, T)))
            _, _, _, want_path, want_score = ref.brute_force(le, lA, lpi, lf, lens)
            np.testing.assert_array_equal(path, want_path, err_msg=f"trial {trial}, lengths {lens}")
            np.testing.assert_array_equal(score, want_score.astype(dtype))
    lens = [T - 1] * B
    flat = f(*cast(dtype, np.zeros((T, B, K)), np.zeros((K, K)), np.zeros(K), np.zeros(K), mask_of(lens, T)))
    np.testing.assert_array_equal(flat[0], np.where(mask_of(lens, T) > 0, 0, -1))
    np.testing.assert_array_equal(flat[1], 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [5, 16, 21])
def test_lanes_bit_identical_to_one_sequence_alone(dtype, K):
    """Each sequence of a batch (lanes) has the path and the score bits it has alone (B = 1: one sequence at a
    time), whatever its group and lane."""
    rng = np.random.default_rng(400 + K)
    T, B = 150, 13
    le, lA, lpi, lf = cast(dtype, *model(rng, T, B, K, 4.0))
    le[:, 3] = le[:, 3] * 300 - 700  # huge log-densities
    lens = ragged(rng, B, T)
    f = viterbi_fn(dtype)
    mask = mask_of(lens, T).astype(dtype)
    path, score = f(le, lA, lpi, lf, mask)
    for b in range(B):
        p1, s1 = f(le[:, b:b + 1], lA, lpi, lf, mask[:, b:b + 1])
        np.testing.assert_array_equal(path[:, b], p1[:, 0])
        assert score[b].tobytes() == s1[0].tobytes(), b


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_inf_and_no_path_inside_a_group(mode, dtype):
    """In a group of 8 with one more sequence: a NaN on a valid frame makes that sequence's score NaN and its path
    -1 (the others unchanged); NaN and +inf on padded frames are ignored; a sequence without a path scores -inf;
    +inf on a valid frame is a ValueError naming hmm_viterbi."""
    rng = np.random.default_rng(500)
    T, B, K = 30, 9, 4
    le, lA, lpi, lf = model(rng, T, B, K, 2.0)
    lens = np.array([30, 25, 30, 10, 0, 30, 1, 17, 30])
    le[12:, 3] = np.nan  # padding of sequence 3
    le[20:, 7, 1] = np.inf  # padding of sequence 7
    le[4, 5] = -np.inf  # sequence 5: no path
    clean = le.copy()
    le[9, 2, 3] = np.nan
    f = viterbi_fn(dtype, mode)
    path, score = f(*cast(dtype, le, lA, lpi, lf, mask_of(lens, T)))
    want_path, want_score = ref.viterbi(np.nan_to_num(clean, nan=0.0, posinf=0.0, neginf=-np.inf), lA, lpi, lf, lens)
    assert np.isnan(score[2]) and np.all(path[:, 2] == -1)
    assert score[5] == -np.inf and np.all(path[:, 5] == -1)
    keep = [b for b in range(B) if b != 2]
    np.testing.assert_array_equal(path[:, keep], want_path[:, keep])
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(score[keep], want_score[keep], rtol=rtol, atol=atol)
    le[9, 2, 3] = np.inf
    with pytest.raises(ValueError, match=r"hmm_viterbi: .*log_emissions\[9, 2, 3\]"):
        f(*cast(dtype, le, lA, lpi, lf, mask_of(lens, T)))


@pytest.mark.parametrize("shape", [(0, 9, 3), (4, 0, 3), (5, 9, 0)])
def test_empty_batches(shape):
    T, B, K = shape
    f = viterbi_fn("float64")
    path, score = f(np.zeros(shape), np.zeros((K, K)), np.zeros(K), np.zeros(K), np.ones((T, B)))
    assert path.shape == (T, B) and score.shape == (B,)
    np.testing.assert_array_equal(score, 0.0 if T == 0 else -np.inf)
    np.testing.assert_array_equal(path, -1)


def test_threads_give_the_same_result():
    """T B K^2 >= 1e7: the groups split over threads; the result is that of one thread, bit for bit."""
    rng = np.random.default_rng(600)
    T, B, K = 1400, 30, 16  # T B K^2 = 1.08e7: 3 parts of the 4 groups at 3 threads
    le, lA, lpi, lf = model(rng, T, B, K, 2.0)
    lens = ragged(rng, B, T)
    f = viterbi_fn("float64")
    args = (le, lA, lpi, lf, mask_of(lens, T))
    with mock.patch.dict(os.environ, {"PTNATIVE_NUM_THREADS": "1"}):
        one = f(*args)
    with mock.patch.dict(os.environ, {"PTNATIVE_NUM_THREADS": "3"}):
        three = f(*args)
    np.testing.assert_array_equal(one[0], three[0])
    assert one[1].tobytes() == three[1].tobytes()
    want_path, want_score = ref.viterbi(le, lA, lpi, lf, lens)
    np.testing.assert_array_equal(one[0], want_path)
    np.testing.assert_array_equal(one[1], want_score)


@pytest.mark.parametrize("B", [1, 9])
def test_parameter_checks_on_the_register_and_lane_paths(B):
    """B = 1 with K = 3 (one sequence in registers) and B = 9 (lanes): +inf in a parameter is a ValueError naming
    hmm_viterbi and the argument; a NaN one makes every non-empty sequence's score NaN and its path -1."""
    rng = np.random.default_rng(700 + B)
    T, K = 6, 3
    le, lA, lpi, lf = model(rng, T, B, K)
    lens = [6] if B == 1 else [6, 0, 3, 6, 1, 6, 2, 6, 5]
    f = viterbi_fn("float64")
    for name, arr, at in [("log_transitions", lA, (2, 1)), ("log_initial", lpi, (1,)), ("log_final", lf, (2,))]:
        bad = arr.copy()
        bad[at] = np.inf
        args = [le, lA, lpi, lf, mask_of(lens, T)]
        args[{"log_transitions": 1, "log_initial": 2, "log_final": 3}[name]] = bad
        flat = np.ravel_multi_index(at, arr.shape)
        with pytest.raises(ValueError, match=rf"hmm_viterbi: {name}\.flat\[{flat}\] = inf"):
            f(*args)
        bad[at] = np.nan
        path, score = f(*args)
        np.testing.assert_array_equal(np.isnan(score), np.asarray(lens) > 0)
        np.testing.assert_array_equal(score[np.asarray(lens) == 0], 0.0)
        np.testing.assert_array_equal(path, -1)


def test_jax_mode_lanes():
    """A batch in lanes through PyTensor's JAX mode, against the numpy reference."""
    pytest.importorskip("jax")
    rng = np.random.default_rng(800)
    T, B, K = 40, 11, 6
    le, lA, lpi, lf = model(rng, T, B, K, 2.0)
    lens = ragged(rng, B, T)
    want_path, want_score = ref.viterbi(le, lA, lpi, lf, lens)
    path, score = viterbi_fn("float64", "JAX")(le, lA, lpi, lf, mask_of(lens, T))
    np.testing.assert_array_equal(path, want_path)
    np.testing.assert_allclose(score, want_score, rtol=1e-12)
