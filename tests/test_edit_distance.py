"""The edit-distance family against plain-Python DP references and brute force."""

import shutil
from functools import cache

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptnative import NativeOp
from ptnative.ops.edit_distance import (
    EditDistanceOp,
    NextEditDistanceReduceOp,
    NextEditDistanceRowOp,
    OptimalCompletionEditDistanceOp,
    OptimalCompletionEditDistancePerSuccessorOp,
    edit_distance,
    next_edit_distance_reduce,
    next_edit_distance_row,
    optimal_completion_edit_distance,
    optimal_completion_edit_distance_per_successor,
)

from .conftest import build_with_nvcc, check_infer_shape
from .reference import edit_distance as ref

I32 = np.int32


def batch(B, Ta, Tb, V, rng, lo=0):
    a = rng.integers(lo, lo + V, size=(B, Ta)).astype(I32)
    b = rng.integers(lo, lo + V, size=(B, Tb)).astype(I32)
    a_len = rng.integers(0, Ta + 1, size=B).astype(I32)
    b_len = rng.integers(0, Tb + 1, size=B).astype(I32)
    if B:
        a_len[0], b_len[0] = Ta, Tb
    return a, a_len, b, b_len


def pair_vars():
    return pt.imatrix("a"), pt.ivector("a_len"), pt.imatrix("b"), pt.ivector("b_len")


@cache
def full_fn(mode=None):
    """(a, a_len, b, b_len, successors) -> (ED, OCD, OCD per successor)."""
    a, al, b, bl = pair_vars()
    s = pt.ivector("s")
    outs = [edit_distance(a, al, b, bl), optimal_completion_edit_distance(a, al, b, bl),
            optimal_completion_edit_distance_per_successor(a, al, b, bl, s)]
    return pytensor.function([a, al, b, bl, s], outs, mode=mode)


@cache
def next_fns(mode=None):
    last, b = pt.imatrix("last_row"), pt.imatrix("b")
    a1, an, ended, bl = pt.ivector("a"), pt.ivector("a_n"), pt.ivector("a_ended"), pt.ivector("b_len")
    a2, oc, blank = pt.imatrix("cands"), pt.iscalar("oc"), pt.iscalar("blank")
    f_row = pytensor.function([last, a1, an, ended, b, bl], next_edit_distance_row(last, a1, an, ended, b, bl),
                              mode=mode)
    f_red = pytensor.function([last, a2, an, ended, b, bl, oc, blank],
                              next_edit_distance_reduce(last, a2, an, ended, b, bl, oc, blank), mode=mode)
    return f_row, f_red


def check_full(a, a_len, b, b_len, succ, mode=None):
    ed, ocd, per = full_fn(mode)(a, a_len, b, b_len, succ)
    for got in (ed, ocd, per):
        assert got.dtype == np.int32
    np.testing.assert_array_equal(ed, ref.edit_distance(a, a_len, b, b_len))
    np.testing.assert_array_equal(ocd, ref.optimal_completion_edit_distance(a, a_len, b, b_len))
    np.testing.assert_array_equal(per, ref.optimal_completion_edit_distance_per_successor(a, a_len, b, b_len, succ))


# ---------------------------------------------------------------- the reference itself
def test_reference_dp_equals_bfs():
    rng = np.random.default_rng(0)
    for _ in range(60):
        x = list(rng.integers(0, 3, size=rng.integers(0, 5)))
        y = list(rng.integers(0, 3, size=rng.integers(0, 5)))
        assert ref.levenshtein(x, y) == ref.bfs_distance(x, y)


# ---------------------------------------------------------------- full-sequence ops
def test_against_reference_all_modes(mode):
    rng = np.random.default_rng(1)
    a, a_len, b, b_len = batch(6, 9, 7, 4, rng)
    a_len[1], b_len[2], a_len[3], b_len[3] = 0, 0, 0, 0
    check_full(a, a_len, b, b_len, np.array([0, 3, 1, 7, 2], I32), mode)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_small_alphabet(data):
    V = data.draw(st.integers(1, 4), label="V")
    B = data.draw(st.integers(1, 4), label="B")
    seqs = st.lists(st.integers(0, V - 1), max_size=9)
    xs = [data.draw(seqs, label="a") for _ in range(B)]
    ys = [data.draw(seqs, label="b") for _ in range(B)]
    Ta, Tb = max(map(len, xs)) + data.draw(st.integers(0, 2)), max(map(len, ys)) + data.draw(st.integers(0, 2))
    a, b = np.full((B, Ta), 99, I32), np.full((B, Tb), 99, I32)  # padding must be ignored
    for i, (x, y) in enumerate(zip(xs, ys)):
        a[i, :len(x)], b[i, :len(y)] = x, y
    a_len, b_len = np.array([len(x) for x in xs], I32), np.array([len(y) for y in ys], I32)
    check_full(a, a_len, b, b_len, np.arange(-1, V + 1, dtype=I32))


def numpy_last_row(x, y):
    """D[len(x)][0..len(y)] by a numpy row-wise DP (prefix-min scan over each row)."""
    x, y = np.asarray(x), np.asarray(y)
    ar = np.arange(len(y) + 1)
    row = ar.copy()
    for i in range(1, len(x) + 1):
        new = np.empty_like(row)
        new[0] = i
        new[1:] = np.minimum(row[:-1] + (y != x[i - 1]), row[1:] + 1)
        row = np.minimum.accumulate(new - ar) + ar
    return row


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_random_long_sequences(data):
    """Lengths up to 300 on 2-3 labels: the multi-word path, both orientations."""
    V = data.draw(st.integers(2, 3))
    seqs = st.lists(st.integers(0, V - 1), max_size=300)
    x, y = data.draw(seqs), data.draw(seqs)
    a, b = np.array([x + [0]], I32), np.array([y + [0]], I32)
    ed, ocd, per = full_fn()(a, np.array([len(x)], I32), b, np.array([len(y)], I32), np.arange(V, dtype=I32))
    row = numpy_last_row(x, y)
    assert ed[0] == row[-1] and ocd[0] == row.min()
    for s in range(V):
        assert per[0, s] == numpy_last_row(x + [s], y).min()


@pytest.mark.parametrize("V", [2, 5])
def test_long_sequences_multiword(V):
    """Lengths around and above 64, 128 and 192: the multi-word bit-parallel path."""
    rng = np.random.default_rng(V)
    a, a_len, b, b_len = batch(5, 200, 150, V, rng)
    a_len[1:] = [63, 64, 65, 129]
    b_len[1:] = [140, 1, 64, 130]
    check_full(a, a_len, b, b_len, np.arange(V, dtype=I32))


@pytest.mark.parametrize("B", [2, 3, 4, 5, 6, 9])
def test_pairs_in_vector_lanes(B):
    """Batches of multi-word pairs go 2 or 4 at a time through the vector lanes (bit_parallel.h,
    lanes_last_score): lanes of other word counts and text lengths than their group's longest, idle lanes, a group
    of one left to the scalar solver, and pairs of one word or an empty side among them."""
    rng = np.random.default_rng(40 + B)
    a, a_len, b, b_len = batch(B, 330, 300, 4, rng)
    a_len[:] = rng.integers(65, 331, size=B)
    b_len[:] = rng.integers(1, 301, size=B)
    a_len[-1], b_len[0] = 40 if B > 4 else a_len[-1], 0 if B > 5 else b_len[0]
    check_full(a, a_len, b, b_len, np.arange(4, dtype=I32))


def test_wide_and_negative_labels_hash_path():
    """Labels spanning more than 2**16 values use the hashed label map."""
    rng = np.random.default_rng(3)
    pool = np.array([-2**31, -7, 0, 5, 2**31 - 1, 123456789], I32)
    a = pool[rng.integers(0, len(pool), size=(4, 70))]
    b = pool[rng.integers(0, len(pool), size=(4, 80))]
    a_len, b_len = np.array([70, 3, 0, 66], I32), np.array([80, 70, 5, 0], I32)
    check_full(a, a_len, b, b_len, np.array([2**31 - 1, 1, -7, -2**31], I32))
    # and a small range with negative labels (dense map with an offset)
    a, a_len, b, b_len = batch(4, 70, 70, 6, rng, lo=-3)
    check_full(a, a_len, b, b_len, np.arange(-4, 4, dtype=I32))


def test_many_distinct_labels_fallback():
    """A very long pattern of distinct labels falls back to the plain row-wise DP."""
    rng = np.random.default_rng(4)
    n = 16500
    a = rng.permutation(n).astype(I32)[None]
    b = np.concatenate([a[0, 5:12], [n + 1, n + 2, 0]]).astype(I32)[None]
    a_len, b_len = np.array([n], I32), np.array([b.shape[1]], I32)
    ed, ocd, per = full_fn()(a, a_len, b, b_len, np.array([0, n + 1], I32))
    D_last = ref.dp_table(b[0], a[0])  # transposed table: D_last[j][n] = D[n][j]
    col = [D_last[j][n] for j in range(b.shape[1] + 1)]
    assert ed[0] == col[-1] and ocd[0] == min(col)
    assert list(per[0]) == [min(n + 1, col[-1] + 1, min(c + (s != y) for c, y in zip(col, b[0])))
                            for s in (0, n + 1)]


def test_long_pair_against_numpy_dp():
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 30, size=900).astype(I32), rng.integers(0, 30, size=700).astype(I32)
    row = np.arange(len(y) + 1)
    for i in range(1, len(x) + 1):  # numpy row-wise DP
        sub = row[:-1] + (y != x[i - 1])
        new = np.empty_like(row)
        new[0] = i
        new[1:] = np.minimum(sub, row[1:] + 1)
        new = np.minimum.accumulate(new - np.arange(len(new))) + np.arange(len(new))
        row = new
    ed, ocd, _ = full_fn()(x[None], np.array([900], I32), y[None], np.array([700], I32), np.zeros(0, I32))
    assert ed[0] == row[-1] and ocd[0] == row.min()
    ed2, _, _ = full_fn()(y[None], np.array([700], I32), x[None], np.array([900], I32), np.zeros(0, I32))
    assert ed2[0] == row[-1]


# ---------------------------------------------------------------- long pairs: the wavefront over the lanes, the band
def edited(x, rng, n_edits, V):
    """x with n_edits random substitutions, insertions and deletions."""
    x = list(x)
    for _ in range(n_edits):
        pos, op = int(rng.integers(0, len(x) + 1)), int(rng.integers(0, 3))
        if op == 1 or not x:
            x.insert(pos, int(rng.integers(0, V)))
        elif op == 0:
            x[min(pos, len(x) - 1)] = int(rng.integers(0, V))
        else:
            del x[min(pos, len(x) - 1)]
    return x


def long_pair(m, kind, rng, V=30):
    """(x, y), x of length m: y = x ("identical"), x with m // 50 + 1 edits ("similar"), x's labels with ~20%
    replaced and a length changed by up to 20% ("noisy"), independent of x ("different"), or a block of 70 labels
    inserted at the front ("shifted": far off the diagonal alignment, near in edits)."""
    x = [int(v) for v in rng.integers(0, V, size=m)]
    if kind == "identical":
        return x, list(x)
    if kind == "similar":
        return x, edited(x, rng, m // 50 + 1, V)
    if kind == "noisy":
        n = max(0, m + int(rng.integers(-m // 5, m // 5 + 1)))
        y = (x + [int(v) for v in rng.integers(0, V, size=max(0, n - m))])[:n]
        return x, [int(rng.integers(0, V)) if rng.random() < 0.2 else v for v in y]
    if kind == "shifted":
        return x, [int(v) for v in rng.integers(0, V, size=70)] + x
    return x, [int(v) for v in rng.integers(0, V, size=max(0, m + int(rng.integers(-m // 5, m // 5 + 1))))]


def padded(seqs, fill=7):
    out = np.full((len(seqs), max([len(x) for x in seqs] + [0]) + 1), fill, I32)
    for i, x in enumerate(seqs):
        out[i, :len(x)] = x
    return out, np.array([len(x) for x in seqs], I32)


def check_long(xs, ys, succ=(0, 3), mode=None):
    """ED, OCD and OCD per successor of the pairs, as one batch, against the numpy row DP."""
    (a, a_len), (b, b_len) = padded(xs), padded(ys)
    ed, ocd, per = full_fn(mode)(a, a_len, b, b_len, np.array(succ, I32))
    for i, (x, y) in enumerate(zip(xs, ys)):
        row = numpy_last_row(x, y)
        assert ed[i] == row[-1], (i, len(x), len(y))
        assert ocd[i] == row.min(), (i, len(x), len(y))
        for k, s_ in enumerate(succ):
            assert per[i, k] == numpy_last_row(list(x) + [s_], y).min(), (i, s_)


WORD_EDGES = [63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025]


@pytest.mark.parametrize("kind", ["identical", "similar", "noisy", "different", "shifted"])
def test_long_pairs_one_per_call(kind):
    """A multi-word pair alone in its call (the wavefront over the vector lanes, edit_distance in its band), at
    pattern lengths around the word and lane-group boundaries, both ways round."""
    rng = np.random.default_rng(["identical", "similar", "noisy", "different", "shifted"].index(kind))
    for m in WORD_EDGES + [2049]:
        x, y = long_pair(m, kind, rng)
        check_long([x], [y], succ=(0,) if m > 1100 else (0, 3))
        check_long([y], [x], succ=())


@pytest.mark.parametrize("B", [2, 3, 5, 9])
def test_long_pairs_mixed_batches(B):
    """Batches where some pairs go alone (a band of at most half of the words, or found by the band's first try),
    the others in groups of the vector lanes, groups of 2 left at the end alone (edit_distance) or in lanes (OCD);
    with an empty side and short pairs among them."""
    rng = np.random.default_rng(60 + B)
    kinds = ["similar", "different", "noisy", "shifted", "identical"]
    pairs = [long_pair(int(rng.integers(65, 1300)), kinds[(i + B) % len(kinds)], rng) for i in range(B)]
    if B > 4:
        pairs[1] = (pairs[1][0], [])
        pairs[3] = ([1, 2, 3], pairs[3][1])
    check_long([x for x, _ in pairs], [y for _, y in pairs])


def test_long_pairs_far_apart_lengths():
    """|m - n| large: the band is wide at once (its bound starts at |m - n|)."""
    rng = np.random.default_rng(70)
    x = [int(v) for v in rng.integers(0, 5, size=1500)]
    for y in (x[200:500], x[::3], [int(v) for v in rng.integers(0, 5, size=90)], x[:1400] + [9] * 30,
              x[700:701], x[5:12], [9] * 9):  # texts shorter than a vector's lanes too
        check_long([x], [y], succ=(0,))
        check_long([y], [x], succ=())


def test_long_pairs_hash_path_and_int64():
    """Long pairs whose labels span more than 2**16 values (hashed label map) or are negative, as int64 inputs."""
    rng = np.random.default_rng(71)
    pool = np.array([-2**31, -7, 0, 5, 2**31 - 1, 123456789, 99999], np.int64)
    xs, ys = [], []
    for m, kind in ((700, "similar"), (1030, "noisy"), (600, "different"), (513, "identical")):
        x, y = long_pair(m, kind, rng, V=len(pool))
        xs.append([int(pool[v]) for v in x])
        ys.append([int(pool[v]) for v in y])
    check_long(xs, ys, succ=(2**31 - 1, -7))
    a, al, b, bl = pt.lmatrix("a"), pt.lvector("al"), pt.lmatrix("b"), pt.lvector("bl")
    f = pytensor.function([a, al, b, bl], [edit_distance(a, al, b, bl), optimal_completion_edit_distance(a, al, b, bl)])
    (av, alv), (bv, blv) = padded(xs), padded(ys)
    ed, ocd = f(av.astype(np.int64), alv.astype(np.int64), bv.astype(np.int64), blv.astype(np.int64))
    rows = [numpy_last_row(x, y) for x, y in zip(xs, ys)]
    np.testing.assert_array_equal(ed, [r[-1] for r in rows])
    np.testing.assert_array_equal(ocd, [r.min() for r in rows])


def test_long_pairs_all_modes(mode):
    rng = np.random.default_rng(72)
    pairs = [long_pair(m, kind, rng) for m, kind in ((700, "similar"), (1030, "noisy"), (300, "different"))]
    check_long([x for x, _ in pairs], [y for _, y in pairs], mode=mode)
    check_long([pairs[0][0]], [pairs[0][1]], mode=mode)


def test_empty_shapes(mode):
    f = full_fn(mode)
    z = np.zeros(0, I32)
    ed, ocd, per = f(np.zeros((0, 3), I32), z, np.zeros((0, 4), I32), z, np.arange(3, dtype=I32))
    assert ed.shape == (0,) and ocd.shape == (0,) and per.shape == (0, 3)
    lens = np.array([0, 0], I32)
    ed, ocd, per = f(np.zeros((2, 0), I32), lens, np.zeros((2, 0), I32), lens, np.zeros(0, I32))
    np.testing.assert_array_equal(ed, [0, 0])
    np.testing.assert_array_equal(ocd, [0, 0])
    assert per.shape == (2, 0)
    ed, ocd, per = f(np.zeros((2, 0), I32), lens, np.array([[1, 2, 3]] * 2, I32), np.array([3, 1], I32),
                     np.array([1, 2], I32))
    np.testing.assert_array_equal(ed, [3, 1])
    np.testing.assert_array_equal(ocd, [0, 0])
    np.testing.assert_array_equal(per, [[0, 1], [0, 1]])


def test_successors_as_count_and_other_int_dtypes():
    a, al, b, bl = pt.lmatrix("a"), pt.lvector("al"), pt.lmatrix("b"), pt.lvector("bl")
    f = pytensor.function([a, al, b, bl], optimal_completion_edit_distance_per_successor(a, al, b, bl, 4))
    rng = np.random.default_rng(6)
    av, alv, bv, blv = batch(3, 5, 6, 4, rng)
    got = f(av.astype(np.int64), alv.astype(np.int64), bv.astype(np.int64), blv.astype(np.int64))
    np.testing.assert_array_equal(got, ref.optimal_completion_edit_distance_per_successor(av, alv, bv, blv,
                                                                                          range(4)))


# ---------------------------------------------------------------- incremental ops
def test_rows_chained_over_time_give_ed_and_ocd(mode):
    rng = np.random.default_rng(7)
    a, a_len, b, b_len = batch(5, 8, 6, 3, rng)
    a_len[1], b_len[2] = 0, 0
    f_row, f_red = next_fns(mode)
    B, Ta, Tb = a.shape[0], a.shape[1], b.shape[1]
    row = np.tile(np.arange(Tb + 1, dtype=I32), (B, 1))
    succ = np.arange(4, dtype=I32)[None]
    for t in range(Ta):
        ended = (t >= a_len).astype(I32)
        # the reduce op over all labels equals the row op per label
        for oc in (0, 1):
            red = f_red(row, succ, np.full(B, t, I32), ended, b, b_len, oc, -1)
            for k in range(4):
                r = f_row(row, np.full(B, k, I32), np.full(B, t, I32), ended, b, b_len)
                np.testing.assert_array_equal(red[:, k], r.min(1) if oc else r[:, -1])
        row = f_row(row, a[:, t], np.full(B, t, I32), ended, b, b_len)
    np.testing.assert_array_equal(row[:, -1], ref.edit_distance(a, a_len, b, b_len))
    np.testing.assert_array_equal(row.min(1), ref.optimal_completion_edit_distance(a, a_len, b, b_len))


def next_data(B, Tb, V, rng, a_batch=None, L=5):
    last = rng.integers(0, 12, size=(B, Tb + 1)).astype(I32)  # any row, not only true DP rows
    b = rng.integers(0, V, size=(B, Tb)).astype(I32)
    b_len = rng.integers(0, Tb + 1, size=B).astype(I32)
    a_n = rng.integers(0, 6, size=B).astype(I32)
    ended = (rng.random(B) < 0.3).astype(I32)
    cands = rng.integers(-1, V, size=(a_batch or B, L)).astype(I32)
    return last, cands, a_n, ended, b, b_len


def test_next_row_against_reference(mode):
    rng = np.random.default_rng(8)
    last, cands, a_n, ended, b, b_len = next_data(7, 6, 3, rng)
    b_len[0] = 0
    f_row, _ = next_fns(mode)
    got = f_row(last, cands[:, 0], a_n, ended, b, b_len)
    np.testing.assert_array_equal(got, ref.next_edit_distance_row(last, cands[:, 0], a_n, ended, b, b_len))


@pytest.mark.parametrize("a_batch", [None, 1])
def test_next_reduce_against_reference(mode, a_batch):
    rng = np.random.default_rng(9)
    last, cands, a_n, ended, b, b_len = next_data(6, 7, 3, rng, a_batch)
    b_len[0] = 0
    _, f_red = next_fns(mode)
    for oc in (0, 1):
        for blank in (-1, 2):
            got = f_red(last, cands, a_n, ended, b, b_len, oc, blank)
            np.testing.assert_array_equal(got, ref.next_edit_distance_reduce(last, cands, a_n, ended, b, b_len,
                                                                             oc, blank))


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_next_reduce_random(data):
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    B, Tb, V = data.draw(st.integers(1, 4)), data.draw(st.integers(0, 8)), data.draw(st.integers(1, 3))
    last, cands, a_n, ended, b, b_len = next_data(B, Tb, V, rng, data.draw(st.sampled_from([None, 1])))
    oc, blank = data.draw(st.integers(0, 1)), data.draw(st.integers(-1, V))
    _, f_red = next_fns()
    np.testing.assert_array_equal(f_red(last, cands, a_n, ended, b, b_len, oc, blank),
                                  ref.next_edit_distance_reduce(last, cands, a_n, ended, b, b_len, oc, blank))


def test_next_functional_api_scalar_a_n_and_defaults():
    last, b, bl = pt.imatrix(), pt.imatrix(), pt.ivector()
    a1, a2, ended = pt.ivector(), pt.imatrix(), pt.vector(dtype="bool")
    f = pytensor.function([last, a1, a2, ended, b, bl], [next_edit_distance_row(last, a1, 3, ended, b, bl),
                                                         next_edit_distance_reduce(last, a2, 3, ended, b, bl)])
    rng = np.random.default_rng(10)
    lv, cands, _, ev, bv, blv = next_data(3, 4, 3, rng)
    a_n = np.full(3, 3, I32)
    row, red = f(lv, cands[:, 0], cands, ev.astype(bool), bv, blv)
    np.testing.assert_array_equal(row, ref.next_edit_distance_row(lv, cands[:, 0], a_n, ev, bv, blv))
    np.testing.assert_array_equal(red, ref.next_edit_distance_reduce(lv, cands, a_n, ev, bv, blv, False, -1))


def test_next_empty(mode):
    f_row, f_red = next_fns(mode)
    z = np.zeros(0, I32)
    assert f_row(np.zeros((0, 4), I32), z, z, z, np.zeros((0, 3), I32), z).shape == (0, 4)
    assert f_red(np.zeros((0, 4), I32), np.zeros((1, 5), I32), z, z, np.zeros((0, 3), I32), z, 1, -1).shape == (0, 5)
    one = np.zeros(1, I32)
    row = f_row(np.zeros((1, 1), I32), one, one, one, np.zeros((1, 0), I32), one)
    np.testing.assert_array_equal(row, [[1]])  # b empty: next[0] = a_n + 1
    red = f_red(np.zeros((1, 1), I32), np.zeros((1, 0), I32), one, one, np.zeros((1, 0), I32), one, 0, -1)
    assert red.shape == (1, 0)


# ---------------------------------------------------------------- errors, shapes, build
def test_bad_input_raises(mode):
    f = full_fn(mode)
    a, a_len, b, b_len = batch(3, 4, 5, 3, np.random.default_rng(11))
    s = np.arange(2, dtype=I32)
    # the messages name the function (the first of the three in the graph that runs) and the argument
    fns = "(edit_distance|optimal_completion_edit_distance|optimal_completion_edit_distance_per_successor)"
    for bad, value in (([5, 1, 1], 5), ([-1, 1, 1], -1)):
        with pytest.raises(ValueError, match=rf"EditDistance.*{fns}: a_len\[0\] = {value} is out of range "
                                             rf"\[0, 4\] \(a.shape\[1\]\)"):
            f(a, np.array(bad, I32), b, b_len, s)
    with pytest.raises(ValueError, match=fns + r": b_len\[0\] = 6 is out of range \[0, 5\] \(b.shape\[1\]\)"):
        f(a, a_len, b, np.array([6, 0, 0], I32), s)
    with pytest.raises(ValueError, match=fns + r": a_len has batch size 2, a has 3"):
        f(a, a_len[:2], b, b_len, s)
    with pytest.raises(ValueError, match=fns + r": b has batch size 2, a has 3"):
        f(a, a_len, b[:2], b_len, s)
    a_, al_, b_, bl_ = pair_vars()
    for fn in (optimal_completion_edit_distance, optimal_completion_edit_distance_per_successor):
        args = (a_, al_, b_, bl_) + ((pt.ivector("s"),) if fn is optimal_completion_edit_distance_per_successor else ())
        g = pytensor.function(list(args), fn(*args), mode=mode)
        vals = (a, a_len, b, np.array([6, 0, 0], I32)) + ((s,) if len(args) == 5 else ())
        with pytest.raises(ValueError, match=rf"{fn.__name__}: b_len\[0\] = 6 is out of range \[0, 5\]"):
            g(*vals)
    f_row, f_red = next_fns(mode)
    last, cands, a_n, ended, b, b_len = next_data(3, 4, 3, np.random.default_rng(12))
    with pytest.raises(ValueError, match=r"NextEditDistanceRowOp.*next_edit_distance_row: last_row has 4 columns; "
                                         r"it needs b.shape\[1\] \+ 1 = 5"):
        f_row(last[:, :-1], cands[:, 0], a_n, ended, b, b_len)  # width != Tb + 1
    with pytest.raises(ValueError, match=r"NextEditDistanceReduceOp.*next_edit_distance_reduce: a has batch size 2; "
                                         r"it must be 1 \(the same candidates for all\) or B = 3"):
        f_red(last, cands[:2], a_n, ended, b, b_len, 0, -1)  # a batch neither 1 nor B
    with pytest.raises(ValueError, match=r"next_edit_distance_reduce: b_len\[1\] = 5 is out of range \[0, 4\]"):
        f_red(last, cands, a_n, ended, b, np.array([0, 5, 1], I32), 0, -1)
    with pytest.raises(ValueError, match=r"next_edit_distance_row: b_len\[2\] = -3 is out of range \[0, 4\]"):
        f_row(last, cands[:, 0], a_n, ended, b, np.array([0, 1, -3], I32))
    with pytest.raises(ValueError, match=r"next_edit_distance_row: a_n has batch size 2, last_row has 3"):
        f_row(last, cands[:, 0], a_n[:2], ended, b, b_len)


def test_bad_types_raise():
    a, al, b, bl = pair_vars()
    with pytest.raises(TypeError, match=r"^edit_distance: a must have an integer dtype, got float"):
        edit_distance(pt.matrix(), al, b, bl)
    with pytest.raises(TypeError, match=r"^edit_distance: b_len must have an integer dtype, got bool"):
        edit_distance(a, al, b, pt.vector(dtype="bool"))
    with pytest.raises(TypeError, match=r"^edit_distance: a must be an integer tensor, got str"):
        edit_distance("abc", al, b, bl)
    with pytest.raises(ValueError, match=r"^edit_distance: a_len must have ndim 1, got 2"):
        edit_distance(a, a, b, bl)
    with pytest.raises(ValueError, match=r"^next_edit_distance_row: a_n must have ndim 0 or 1, got 2"):
        next_edit_distance_row(a, al, pt.imatrix(), al, b, bl)
    with pytest.raises(ValueError, match=r"^next_edit_distance_reduce: a must have ndim 2, got 1"):
        next_edit_distance_reduce(a, al, al, al, b, bl)
    with pytest.raises(ValueError, match=r"^next_edit_distance_reduce: optimal_completion must have ndim 0, got 1"):
        next_edit_distance_reduce(a, a, al, al, b, bl, optimal_completion=al)
    with pytest.raises(ValueError, match=r"^next_edit_distance_reduce: a_blank_idx must be <= 2147483647"):
        next_edit_distance_reduce(a, a, al, al, b, bl, a_blank_idx=2**31)
    with pytest.raises(TypeError, match=r"^next_edit_distance_reduce: a_blank_idx must have an integer dtype"):
        next_edit_distance_reduce(a, a, al, al, b, bl, a_blank_idx=pt.dscalar())
    with pytest.raises(ValueError, match=r"^optimal_completion_edit_distance_per_successor: successors must be >= 0"):
        optimal_completion_edit_distance_per_successor(a, al, b, bl, -1)
    with pytest.raises(TypeError, match=r"NativeOp 'EditDistanceOp': input 'a' \(#0\) must be int32, got float"):
        EditDistanceOp.make_op()(pt.matrix(), al, b, bl)


def test_infer_shape():
    a, al, b, bl = pair_vars()
    s = pt.ivector("s")
    outs = [edit_distance(a, al, b, bl), optimal_completion_edit_distance(a, al, b, bl),
            optimal_completion_edit_distance_per_successor(a, al, b, bl, s)]
    av, alv, bv, blv = batch(3, 4, 5, 3, np.random.default_rng(13))
    check_infer_shape([a, al, b, bl, s], outs, [av, alv, bv, blv, np.arange(6, dtype=I32)], NativeOp)
    last, a2, an, en = pt.imatrix(), pt.imatrix(), pt.ivector(), pt.ivector()
    outs = [next_edit_distance_row(last, al, an, en, b, bl), next_edit_distance_reduce(last, a2, an, en, b, bl, True)]
    lv, cv, anv, ev, bv, blv = next_data(3, 5, 3, np.random.default_rng(14), a_batch=1, L=7)
    check_infer_shape([last, al, a2, an, en, b, bl], outs, [lv, cv[0, :3], cv, anv, ev, bv, blv], NativeOp)


def test_no_gradient():
    a, al, b, bl = pair_vars()
    d = edit_distance(a, al, b, bl)
    assert all(not any(row) for row in d.owner.op.connection_pattern(d.owner))


def emulated_cuda_op(cls):
    """The op with its CUDA branch (diagonal sweep, thread per candidate), run by tests/cuda_emulation.h."""
    from .test_cuda_emulation import emulated

    return emulated(cls.make_op())


def test_cuda_algorithm_emulated_on_cpu():
    a, al, b, bl = pair_vars()
    s, last, cands = pt.ivector("s"), pt.imatrix("last"), pt.imatrix("cands")
    a1, an, en, oc, blank = pt.ivector("a1"), pt.ivector("an"), pt.ivector("en"), pt.iscalar("oc"), pt.iscalar("bk")
    graphs = [
        ([a, al, b, bl], lambda op: op(a, al, b, bl), EditDistanceOp),
        ([a, al, b, bl], lambda op: op(a, al, b, bl), OptimalCompletionEditDistanceOp),
        ([a, al, b, bl, s], lambda op: op(a, al, b, bl, s), OptimalCompletionEditDistancePerSuccessorOp),
        ([last, a1, an, en, b, bl], lambda op: op(last, a1, an, en, b, bl), NextEditDistanceRowOp),
        ([last, cands, an, en, b, bl, oc, blank], lambda op: op(last, cands, an, en, b, bl, oc, blank),
         NextEditDistanceReduceOp),
    ]
    rng = np.random.default_rng(15)
    for inputs, build, cls in graphs:
        f_cpu = pytensor.function(inputs, build(cls.make_op()))
        f_gpu = pytensor.function(inputs, build(emulated_cuda_op(cls)))
        for trial in range(4):
            B, Ta, Tb = [(5, 7, 9), (3, 0, 4), (0, 3, 3), (4, 70, 66)][trial]
            if len(inputs) == 4 or len(inputs) == 5:
                values = list(batch(B, Ta, Tb, 3, rng))
                if len(inputs) == 5:
                    values.append(np.arange(-1, 4, dtype=I32))
            else:
                one = trial % 2 and len(inputs) == 8
                last_v, cands_v, an_v, en_v, b_v, bl_v = next_data(B, Tb, 3, rng, a_batch=1 if one else None)
                values = ([last_v, cands_v[:, 0] if B else np.zeros(0, I32), an_v, en_v, b_v, bl_v]
                          if len(inputs) == 6 else [last_v, cands_v, an_v, en_v, b_v, bl_v, trial % 2, 1])
            np.testing.assert_array_equal(f_gpu(*values), f_cpu(*values), err_msg=f"{cls.__name__} {trial}")
        bad = list(values)
        bad[3 if len(inputs) < 6 else 5] = np.full(B, 999, I32)  # b_len out of range
        with pytest.raises(ValueError, match=r"b_len\[0\] = 999 is out of range"):
            f_gpu(*bad)


ALL_OPS = [EditDistanceOp, OptimalCompletionEditDistanceOp, OptimalCompletionEditDistancePerSuccessorOp,
           NextEditDistanceRowOp, NextEditDistanceReduceOp]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_kernels_compile_with_nvcc(monkeypatch):
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    build_with_nvcc(*(cls.make_op().variant("float32", device="cuda") for cls in ALL_OPS))  # no gradient ops
