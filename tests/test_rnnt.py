"""RNN-T losses (standard and multi-blank) against the float64 numpy reference."""

import shutil
from functools import cache

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import verify_grad

from ptnative.ops.rnnt import MultiBlankRnntLoss, RnntLattice, RnntLossOp, multiblank_rnnt_lattice, multiblank_rnnt_loss, rnnt_loss

from .conftest import build_with_nvcc, check_infer_shape, tol
from .reference.rnnt import batch_lattice, brute_force_loglik, sequence_lattice


def rnnt_data(B, T, U, K, blank, n_big, dtype="float64", seed=0, zero_label_len=True):
    """Random logits with ragged lengths (sequence 0 has the full T and U, the
    last has label_len 0 when ``zero_label_len``); labels avoid the blank classes."""
    rng = np.random.default_rng(seed)
    act_lens = rng.integers(max(1, T - 3), T + 1, size=B).astype(np.int32)
    label_lens = rng.integers(0, U + 1, size=B).astype(np.int32)
    act_lens[0], label_lens[0] = T, U
    if zero_label_len and B > 1:
        label_lens[-1] = 0
    non_blank = [k for k in range(K) if not (blank - n_big <= k <= blank)]
    labels = np.zeros((B, U), dtype=np.int32)
    for b in range(B):
        labels[b, :label_lens[b]] = rng.choice(non_blank, size=label_lens[b])
    acts = rng.normal(size=(B, T, U + 1, K)) * 1.5
    return acts.astype(dtype), labels, act_lens, label_lens


LAYOUTS = {
    # blank last, big blanks directly below it (NeMo's test layout)
    "blank_last": lambda K, n_big: K - 1,
    # big blanks at the start, then the blank (espnet's vocabulary layout)
    "blank_after_bigs": lambda K, n_big: n_big,
}

CONFIGS = [
    # (durations, sigma, fastemit_lambda, clamp, layout)
    ((), 0.0, 0.0, -1.0, "blank_after_bigs"),
    ((), 0.0, 0.5, -1.0, "blank_last"),
    ((2,), 0.0, 0.0, -1.0, "blank_last"),
    ((2, 4), 0.05, 0.0, -1.0, "blank_after_bigs"),
    ((3, 2), 0.3, 0.2, -1.0, "blank_last"),
    ((2, 4, 8), 0.05, 0.0, 0.02, "blank_last"),
    ((4, 2, 3), 0.1, 0.3, 0.05, "blank_after_bigs"),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"d{c[0]}-s{c[1]}-l{c[2]}-c{c[3]}-{c[4]}")
def test_lattice_against_reference(config, dtype):
    durations, sigma, lam, clamp, layout = config
    B, T, U, V = 4, 9, 4, 5
    K = V + 1 + len(durations)
    blank = LAYOUTS[layout](K, len(durations))
    acts, labels, act_lens, label_lens = rnnt_data(B, T, U, K, blank, len(durations), dtype, seed=len(durations))
    x = pt.tensor4("acts", dtype=dtype)
    lat = multiblank_rnnt_lattice(x, labels, act_lens, label_lens, blank, durations, sigma=sigma,
                                  fastemit_lambda=lam, clamp=clamp)
    got = pytensor.function([x], list(lat))(acts)
    ref = batch_lattice(acts, labels, act_lens, label_lens, blank, durations, sigma, lam, clamp)
    rtol, atol = tol(dtype)
    for name, g, r in zip(lat._fields, got, ref):
        assert g.dtype == dtype, name
        np.testing.assert_allclose(g, r, rtol=rtol * 5, atol=atol * 5, err_msg=name)
    if clamp > 0:
        assert np.abs(got[1]).max() <= clamp * (1 + 1e-6)
        assert np.isclose(np.abs(ref[1]).max(), clamp)  # the clamp is active
    # padded positions are 0
    for b in range(B):
        assert not got[1][b, act_lens[b]:].any() and not got[1][b, :, label_lens[b] + 1:].any()


def test_reference_against_brute_force():
    rng = np.random.default_rng(3)
    for durations, blank, K in [((), 0, 4), ((2,), 3, 5), ((2, 3), 2, 6), ((3, 2, 4), 5, 7)]:
        for T, U in [(1, 0), (1, 2), (4, 0), (5, 2), (6, 3)]:
            acts = rng.normal(size=(T, U + 1, K))
            labels = rng.choice([k for k in range(K) if not blank - len(durations) <= k <= blank], size=U)
            r = sequence_lattice(acts, labels, T, U, blank, durations, sigma=0.2)
            bf = brute_force_loglik(acts, labels, T, U, blank, durations, sigma=0.2)
            np.testing.assert_allclose(r["loglik"], bf, rtol=1e-12)
            np.testing.assert_allclose(r["betas"][0, 0], bf, rtol=1e-12)
            np.testing.assert_allclose(r["alphas"] + r["betas"] - r["loglik"] <= 1e-12, True)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_gradient_is_kernel_gradient_times_upstream(reduction):
    """Clamp on, FastEmit on: the gradient is the clamped per-sequence kernel
    gradient, then scaled by the reduction and the upstream gradient."""
    durations, blank, sigma, lam, clamp = (2, 3), 6, 0.1, 0.25, 0.03
    acts, labels, act_lens, label_lens = rnnt_data(3, 6, 3, 7, blank, 2, "float64", seed=5)
    x = pt.tensor4("acts")
    loss = multiblank_rnnt_loss(x, labels, act_lens, label_lens, blank, durations, sigma=sigma, fastemit_lambda=lam,
                                clamp=clamp, reduction=reduction)
    w = np.array([0.5, -2.0, 3.0])
    total = (loss * w).sum() if reduction == "none" else 1.7 * loss
    f = pytensor.function([x], [loss, pytensor.grad(total, x)])
    cost, grad = f(acts)
    costs, grads = batch_lattice(acts, labels, act_lens, label_lens, blank, durations, sigma, lam, clamp)[:2]
    upstream = {"none": w, "sum": np.full(3, 1.7), "mean": np.full(3, 1.7 / 3)}[reduction]
    want_cost = {"none": costs, "sum": costs.sum(), "mean": costs.mean()}[reduction]
    assert np.shape(cost) == np.shape(want_cost)
    np.testing.assert_allclose(cost, want_cost, rtol=1e-10)
    np.testing.assert_allclose(grad, grads * upstream[:, None, None, None], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("durations,sigma,blank_of", [((), 0.0, lambda K: 0), ((2, 3), 0.0, lambda K: K - 1),
                                                      ((2, 4), 0.2, lambda K: 2)])
def test_verify_grad_float64(durations, sigma, blank_of):
    K = 5 + len(durations)
    blank = blank_of(K)
    acts, labels, act_lens, label_lens = rnnt_data(3, 5, 2, K, blank, len(durations), "float64", seed=11)
    rng = np.random.default_rng(1)
    w = rng.uniform(0.5, 1.5, size=3)

    def cost(a):
        return (multiblank_rnnt_loss(a, labels, act_lens, label_lens, blank, durations, sigma=sigma) * w).sum()

    verify_grad(cost, [acts], rng=rng, eps=1e-6, abs_tol=1e-6, rel_tol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_grad_sums_to_zero_on_valid_cells(dtype):
    durations, blank = (2, 4, 3), 7
    acts, labels, act_lens, label_lens = rnnt_data(4, 10, 4, 8, blank, 3, dtype, seed=2)
    x = pt.tensor4("acts", dtype=dtype)
    for lam in (0.0, 0.4):
        lat = multiblank_rnnt_lattice(x, labels, act_lens, label_lens, blank, durations, sigma=0.1,
                                      fastemit_lambda=lam)
        grads = pytensor.function([x], lat.grads)(acts)
        s = grads.astype(np.float64).sum(-1)
        assert np.abs(s).max() < (1e-5 if dtype == "float32" else 1e-13)
        assert np.abs(grads).max() > 0.1


def test_standard_equals_multiblank_without_big_blanks():
    acts, labels, act_lens, label_lens = rnnt_data(3, 7, 3, 6, 0, 0, "float32", seed=4)
    x = pt.tensor4("acts", dtype="float32")
    std = rnnt_loss(x, labels, act_lens, label_lens, blank=0, fastemit_lambda=0.1, reduction="sum")
    mb = multiblank_rnnt_loss(x, labels, act_lens, label_lens, 0, (), fastemit_lambda=0.1, reduction="sum")
    f = pytensor.function([x], [std, mb, pytensor.grad(std, x), pytensor.grad(mb, x)])
    a, b, ga, gb = f(acts)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ga, gb)
    costs, grads = batch_lattice(acts, labels, act_lens, label_lens, 0, (), 0.0, 0.1)[:2]
    np.testing.assert_allclose(a, costs.sum(), rtol=1e-5)
    np.testing.assert_allclose(ga, grads, rtol=2e-4, atol=2e-6)


# One graph per mode, shared by the tests that run in every mode (C and CVM compile it once each).
SHARED = dict(blank=3, durations=(2, 3), sigma=0.05, fastemit_lambda=0.1, clamp=0.2)


@cache
def shared_function(mode):
    x, lab, al, ll = pt.tensor4("acts"), pt.imatrix("labels"), pt.ivector("act_lens"), pt.ivector("label_lens")
    lat = multiblank_rnnt_lattice(x, lab, al, ll, SHARED["blank"], SHARED["durations"], sigma=SHARED["sigma"],
                                  fastemit_lambda=SHARED["fastemit_lambda"], clamp=SHARED["clamp"])
    g = pytensor.grad(lat.costs.mean(), x)
    return pytensor.function([x, lab, al, ll], [*lat, g], mode=mode)


def shared_reference(acts, labels, act_lens, label_lens):
    return batch_lattice(acts, labels, act_lens, label_lens, SHARED["blank"], SHARED["durations"], SHARED["sigma"],
                         SHARED["fastemit_lambda"], SHARED["clamp"])


def test_modes_agree(mode):
    """Every output and the gradient of the mean cost, with symbolic lengths and labels."""
    data = rnnt_data(3, 6, 3, 8, SHARED["blank"], 2, "float64", seed=9)
    got = shared_function(mode)(*data)
    ref = shared_reference(*data)
    for name, a, b in zip(RnntLattice._fields, got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(got[-1], ref[1] / 3, rtol=1e-10, atol=1e-12)
    assert np.abs(ref[1]).max() == pytest.approx(SHARED["clamp"])
    if mode is not None:
        for a, b in zip(got, shared_function(None)(*data)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_runtime_errors(mode):
    """Lengths and labels known only at run time: the kernel's checks raise ValueError."""
    f = shared_function(mode)
    acts, labels, act_lens, label_lens = rnnt_data(2, 5, 2, 6, SHARED["blank"], 2, "float64", seed=6)
    f(acts, labels, act_lens, label_lens)
    bad_labels = labels.copy()
    bad_labels[0, 0] = 6
    fn = "multiblank_rnnt_lattice: "
    with pytest.raises(ValueError, match=r"MultiBlankRnntLoss.*" + fn + r"labels\[0, 0\] = 6 is out of range"):
        f(acts, bad_labels, act_lens, label_lens)
    with pytest.raises(ValueError, match=fn + r"act_lens\[1\] = 7 is out of range \[0, 5\] \(acts.shape\[1\]\)"):
        f(acts, labels, np.array([5, 7], np.int32), label_lens)
    with pytest.raises(ValueError, match=fn + r"label_lens\[0\] = -1 is out of range"):
        f(acts, labels, act_lens, np.array([-1, 2], np.int32))
    with pytest.raises(ValueError, match=fn + "batch sizes differ"):
        f(acts, labels[:1], act_lens, label_lens)
    with pytest.raises(ValueError, match=fn + r"blank = 3 is out of range for K = 3"):
        f(np.ascontiguousarray(acts[..., :3]), labels, act_lens, label_lens)
    # lengths below the padded shape are fine (see test_padding_beyond_the_longest_sequence)
    f(acts, labels, np.array([4, 4], np.int32), np.array([1, 0], np.int32))


def test_empty_batch_time_and_zero_labels(mode):
    f = shared_function(mode)
    # empty batch
    out = f(np.zeros((0, 4, 3, 5)), np.zeros((0, 2), np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32))
    assert [o.shape for o in out] == [(0,), (0, 4, 3, 5), (0,), (0, 4, 3), (0, 4, 3), (0, 4, 3), (0, 4, 3, 5)]
    # empty time, no labels: the empty alignment, loglik 0, cost 0, gradient 0
    out = f(np.zeros((2, 0, 1, 5)), np.zeros((2, 0), np.int32), np.zeros(2, np.int32), np.zeros(2, np.int32))
    np.testing.assert_array_equal(out[0], [0.0, 0.0])
    np.testing.assert_array_equal(out[2], [0.0, 0.0])
    assert out[1].shape == (2, 0, 1, 5) and out[-1].shape == (2, 0, 1, 5)
    # empty time with a label: impossible (loglik -inf, cost inf); gradient 0
    out = f(np.zeros((2, 0, 2, 5)), np.zeros((2, 1), np.int32), np.zeros(2, np.int32), np.array([1, 0], np.int32))
    np.testing.assert_array_equal(out[0], [np.inf, 0.0])
    np.testing.assert_array_equal(out[2], [-np.inf, 0.0])
    # all label lengths 0 (U + 1 = 1), one sequence without frames (cost 0, gradient 0)
    rng = np.random.default_rng(0)
    acts = rng.normal(size=(3, 5, 1, 5))
    labels, act_lens, label_lens = np.zeros((3, 0), np.int32), np.array([5, 0, 3], np.int32), np.zeros(3, np.int32)
    out = f(acts, labels, act_lens, label_lens)
    ref = shared_reference(acts, labels, act_lens, label_lens)
    for name, o, r in zip(RnntLattice._fields, out, ref):
        np.testing.assert_allclose(o, r, rtol=1e-10, atol=1e-12, err_msg=name)
    assert out[0][1] == 0 and out[2][1] == 0 and np.isfinite(out[0][[0, 2]]).all()
    assert np.all(out[-1][1] == 0)
    np.testing.assert_allclose(out[-1], ref[1] / 3, atol=1e-12)


def pad_acts(acts, extra_t, extra_u, rng):
    """acts (B, T, U+1, K) padded with random logits to (B, T + extra_t, U+1 + extra_u, K)."""
    B, T, U1, K = acts.shape
    padded = rng.normal(size=(B, T + extra_t, U1 + extra_u, K)) * 3
    padded[:, :T, :U1] = acts
    return padded.astype(acts.dtype)


def check_nan_sequence(got, ref, nan_b, act_lens, label_lens, shape):
    """The lattice outputs `got` (padded to `shape`) equal the tight reference `ref`, except that sequence
    nan_b has cost / loglik NaN and gradient NaN on its valid cells (0 elsewhere)."""
    B, T, U1, K = shape
    valid = ((np.arange(T)[None, :, None] < np.asarray(act_lens)[:, None, None])
             & (np.arange(U1)[None, None, :] <= np.asarray(label_lens)[:, None, None]))
    others = np.arange(B) != nan_b
    assert np.isnan(got[0][nan_b]) and np.isnan(got[2][nan_b])
    np.testing.assert_allclose(got[0][others], ref[0][others], rtol=1e-10)
    grads = got[1]
    assert np.isnan(grads[nan_b][valid[nan_b]]).all()
    assert np.all(grads[nan_b][~valid[nan_b]] == 0)
    T0, U0 = ref[1].shape[1:3]
    np.testing.assert_allclose(grads[others][:, :T0, :U0], ref[1][others], rtol=1e-9, atol=1e-12)
    assert np.all(grads[others][:, T0:] == 0) and np.all(grads[others][:, :, U0:] == 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_padding_beyond_the_longest_sequence(mode, dtype):
    """acts padded beyond max(act_lens) and max(label_lens) (batch shards, buckets) give the results of the
    tight padding; the extra cells get 0.  Standard and multi-blank, symbolic and constant lengths."""
    rng = np.random.default_rng(21)
    for blank, durations, sigma in ((0, (), 0.0), (5, (2, 3), 0.05)):
        K = 8
        acts, labels, act_lens, label_lens = rnnt_data(3, 6, 3, K, blank, len(durations), dtype, seed=5)
        padded = pad_acts(acts, 3, 2, rng)
        x = pt.tensor4("acts", dtype=dtype)
        al, ll = pt.ivector("act_lens"), pt.ivector("label_lens")
        for lens in ((al, ll), (act_lens, label_lens)):
            if durations:
                loss = multiblank_rnnt_loss(x, labels, *lens, blank, durations, sigma=sigma)
            else:
                loss = rnnt_loss(x, labels, *lens, blank=blank)
            ins = [x] + [v for v in lens if isinstance(v, pt.TensorVariable)]
            f = pytensor.function(ins, [loss, pytensor.grad(loss.sum(), x)], mode=mode)
            vals = [padded] + ([act_lens, label_lens] if lens[0] is al else [])
            cost, grad = f(*vals)
            ref_cost, ref_grad = batch_lattice(acts, labels, act_lens, label_lens, blank, durations, sigma)[:2]
            rtol, atol = tol(dtype)
            np.testing.assert_allclose(cost, ref_cost, rtol=rtol, atol=atol)
            np.testing.assert_allclose(grad[:, :6, :4], ref_grad, rtol=rtol * 10, atol=atol * 10)
            assert np.all(grad[:, 6:] == 0) and np.all(grad[:, :, 4:] == 0)
            assert cost.dtype == dtype


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nan_logit_gives_nan_for_its_sequence(mode, dtype, sign):
    """A NaN logit in a valid cell (sign bit clear or set, the latter what x86 makes of inf - inf): that
    sequence's cost and its gradient on its valid cells are NaN; the other sequences are unaffected; a NaN in a
    padded cell changes nothing."""
    acts, labels, act_lens, label_lens = rnnt_data(3, 5, 2, 7, 6, 1, dtype, seed=12)
    act_lens[2] = 3
    x = pt.tensor4("acts", dtype=dtype)
    for fn in ("rnnt_loss", "multiblank_rnnt_loss"):
        durations = () if fn == "rnnt_loss" else (2,)
        lat = _lattice_for(fn, x, labels, act_lens, label_lens, durations)
        f = pytensor.function([x], list(lat), mode=mode)
        bad = acts.copy()
        bad[1, 1, 0, 3] = np.copysign(np.nan, sign)
        bad[2, 4, 0, 0] = np.nan  # padded frame of sequence 2
        got = f(bad)
        ref = batch_lattice(acts, labels, act_lens, label_lens, 6, durations)
        rtol, atol = tol(dtype)
        assert np.isnan(got[0][1]) and np.isnan(got[2][1])
        np.testing.assert_allclose(got[0][[0, 2]], ref[0][[0, 2]], rtol=rtol, atol=atol)
        valid = (np.arange(5)[:, None] < act_lens[1]) & (np.arange(3)[None, :] <= label_lens[1])
        assert np.isnan(got[1][1][valid]).all() and np.all(got[1][1][~valid] == 0)
        np.testing.assert_allclose(got[1][[0, 2]], ref[1][[0, 2]], rtol=rtol * 10, atol=atol * 10)


def _lattice_for(fn, x, labels, act_lens, label_lens, durations):
    from ptnative.ops.rnnt import _lattice
    return _lattice(fn, x, labels, act_lens, label_lens, 6, durations, 0.0, 0.0, -1.0)


@pytest.mark.parametrize("fn", ["rnnt_loss", "multiblank_rnnt_loss"])
def test_runtime_errors_name_the_function(mode, fn):
    acts, labels, act_lens, label_lens = rnnt_data(2, 5, 2, 6, 5, 1, "float64", seed=6)
    x, al, ll, lab = pt.tensor4("acts"), pt.ivector("al"), pt.ivector("ll"), pt.imatrix("lab")
    if fn == "rnnt_loss":
        loss = rnnt_loss(x, lab, al, ll, blank=5)
    else:
        loss = multiblank_rnnt_loss(x, lab, al, ll, 5, (2,))
    f = pytensor.function([x, lab, al, ll], loss, mode=mode)
    with pytest.raises(ValueError, match=rf"{fn}: act_lens\[1\] = 6 is out of range \[0, 5\] \(acts.shape\[1\]\)"):
        f(acts, labels, np.array([5, 6], np.int32), label_lens)
    with pytest.raises(ValueError, match=rf"{fn}: label_lens\[1\] = 3 is out of range \[0, 2\]"):
        f(acts, labels, act_lens, np.array([2, 3], np.int32))
    bad = labels.copy()
    bad[0, 1] = -1
    with pytest.raises(ValueError, match=rf"{fn}: labels\[0, 1\] = -1 is out of range \[0, 6\)"):
        f(acts, bad, act_lens, label_lens)


def test_graph_time_validation_errors():
    acts, labels, act_lens, label_lens = rnnt_data(2, 5, 2, 6, 5, 1, "float64", seed=6)
    x = pt.tensor4("acts")

    def call(**kw):
        args = dict(acts=x, labels=labels, act_lens=act_lens, label_lens=label_lens, blank=5,
                    big_blank_durations=(2,))
        args.update(kw)
        return multiblank_rnnt_loss(**args)

    with pytest.raises(ValueError, match=r"^multiblank_rnnt_loss: acts must have ndim 4 \(B, T, U\+1, K\), got 3"):
        call(acts=pt.tensor3())
    with pytest.raises(TypeError, match=r"^multiblank_rnnt_loss: acts must have a float dtype .*got int32"):
        call(acts=pt.itensor4())
    with pytest.raises(ValueError, match=r"big_blank_durations\[1\] must be >= 2 \(a duration of 1 is the standard"):
        call(big_blank_durations=(2, 1))
    with pytest.raises(TypeError, match=r"^multiblank_rnnt_loss: big_blank_durations must be a sequence of ints"):
        call(big_blank_durations=2)
    with pytest.raises(TypeError, match=r"^multiblank_rnnt_loss: big_blank_durations must be a sequence of ints"):
        call(big_blank_durations=None)
    with pytest.raises(TypeError, match=r"^multiblank_rnnt_loss: big_blank_durations\[0\] must be an int, got float"):
        call(big_blank_durations=(2.0,))
    with pytest.raises(ValueError, match="clamp must be >= 0"):
        call(clamp=-0.5)
    with pytest.raises(ValueError, match="fastemit_lambda must be >= 0"):
        call(fastemit_lambda=-0.1)
    with pytest.raises(ValueError, match="sigma must be finite"):
        call(sigma=float("nan"))
    with pytest.raises(ValueError, match="reduction must be one of"):
        call(reduction="batchmean")
    with pytest.raises(ValueError, match="blank = 0 must satisfy 1 <= blank"):
        call(blank=0)
    with pytest.raises(ValueError, match="blank = 6 must satisfy"):
        call(acts=pt.tensor4(shape=(2, 5, 3, 6)), blank=6)
    with pytest.raises(ValueError, match=r"multiblank_rnnt_loss: max\(act_lens\) = 5 exceeds acts.shape\[1\] = 4"):
        call(acts=pt.tensor4(shape=(2, 4, 3, 6)))
    with pytest.raises(ValueError, match=r"max\(label_lens\) \+ 1 = 3 exceeds acts.shape\[2\] = 2"):
        call(acts=pt.tensor4(shape=(2, 5, 2, 6)))
    call(acts=pt.tensor4(shape=(2, 6, 4, 6)))  # padding beyond the longest sequence is fine
    bad = labels.copy()
    bad[0, 1] = 9
    with pytest.raises(ValueError, match=r"labels\[0, 1\] = 9 is out of range \[0, 6\)"):
        call(acts=pt.tensor4(shape=(2, 5, 3, 6)), labels=bad)
    with pytest.raises(TypeError, match="labels must have an integer dtype"):
        call(labels=labels.astype(np.float32))
    with pytest.raises(ValueError, match=r"^multiblank_rnnt_loss: act_lens must have ndim 1, got 2"):
        call(act_lens=act_lens[None])
    with pytest.raises(TypeError, match=r"^multiblank_rnnt_loss: label_lens must have an integer dtype, got bool"):
        call(label_lens=label_lens > 0)
    with pytest.raises(TypeError, match=r"^multiblank_rnnt_loss: sigma must be a real number, got str"):
        call(sigma="0.1")
    with pytest.raises(TypeError, match="rnnt_loss: blank must be an int"):
        rnnt_loss(x, labels, act_lens, label_lens, blank=0.0)
    with pytest.raises(ValueError, match=r"^rnnt_loss: acts must have ndim 4"):
        rnnt_loss(pt.tensor3(), labels, act_lens, label_lens)
    # the op itself rejects bad hyper-parameters at run time too
    op = MultiBlankRnntLoss.make_op()
    outs = op(x, labels, act_lens, label_lens, np.array([1], np.int32), np.int32(5), np.zeros(3))
    with pytest.raises(ValueError, match="durations must be >= 2"):
        pytensor.function([x], outs[0])(acts)
    outs = op(x, labels, act_lens, label_lens, np.array([2], np.int32), np.int32(0), np.zeros(3))
    with pytest.raises(ValueError, match="leaves no room for 1 big blanks"):
        pytensor.function([x], outs[0])(acts)
    outs = op(x, labels, act_lens, label_lens, np.array([2], np.int32), np.int32(5), np.array([0, 0, -2.0]))
    with pytest.raises(ValueError, match="clamp must be"):
        pytensor.function([x], outs[0])(acts)


def test_only_costs_are_differentiable():
    acts, labels, act_lens, label_lens = rnnt_data(2, 4, 2, 5, 0, 0, "float64")
    x = pt.tensor4("acts")
    lat = multiblank_rnnt_lattice(x, labels, act_lens, label_lens, 0)
    with pytest.raises(Exception, match="only the 'costs' output has a gradient"):
        pytensor.grad(lat.loglik.sum(), x)


def test_infer_shape():
    acts, labels, act_lens, label_lens = rnnt_data(3, 5, 2, 6, 0, 0, "float64")
    x, lab, al, ll = pt.tensor4("acts"), pt.imatrix("labels"), pt.ivector("act_lens"), pt.ivector("label_lens")
    lat = multiblank_rnnt_lattice(x, lab, al, ll, 0)
    check_infer_shape([x, lab, al, ll], list(lat), [acts, labels, act_lens, label_lens], RnntLossOp)


@pytest.mark.parametrize("mode", [None, "C", "FAST_COMPILE"], ids=["default", "C", "FAST_COMPILE"])
def test_inplace_on_computed_logits(mode):
    """Logits computed in the graph are overwritten by the gradient buffer; the
    numbers do not change and the user's input survives."""
    acts, labels, act_lens, label_lens = rnnt_data(2, 5, 3, 6, 5, 1, "float64", seed=8)
    x = pt.tensor4("x")
    loss = multiblank_rnnt_loss(2 * x - 1, labels, act_lens, label_lens, 5, (3,), sigma=0.1, reduction="sum")
    f = pytensor.function([x], [loss, pytensor.grad(loss, x)], mode=mode)
    nodes = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, RnntLossOp)]
    assert len(nodes) == 1 and bool(nodes[0].op.destroy_map) == (mode != "FAST_COMPILE")
    before = acts.copy()
    cost, grad = f(acts)
    costs, grads = batch_lattice(2 * acts - 1, labels, act_lens, label_lens, 5, (3,), 0.1)[:2]
    np.testing.assert_allclose(cost, costs.sum(), rtol=1e-10)
    np.testing.assert_allclose(grad, 2 * grads, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(acts, before)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_rnnt_kernels_compile_with_nvcc(monkeypatch):
    monkeypatch.setenv("PTNATIVE_CUDA_ARCHS", "90")
    op = MultiBlankRnntLoss.make_op()
    build_with_nvcc(op.variant("float32", device="cuda"))


def test_wavefront_kernels_emulated_on_cpu():
    """The CUDA form (row blocks of 128 threads, anti-diagonal wavefront), run through the CUDA emulation of
    tests/cuda_emulation.h, against the reference."""
    from .test_cuda_emulation import emulated

    op = emulated(MultiBlankRnntLoss.make_op())
    x, lab, al, ll = pt.tensor4("acts"), pt.imatrix("labels"), pt.ivector("act_lens"), pt.ivector("label_lens")
    dur, blank, params = pt.ivector("durations"), pt.iscalar("blank"), pt.dvector("params")
    f = pytensor.function([x, lab, al, ll, dur, blank, params], op(x, lab, al, ll, dur, blank, params))
    for durations, sigma, lam, clamp, layout in CONFIGS[2:5] + CONFIGS[6:]:
        K = 6 + len(durations)
        b = LAYOUTS[layout](K, len(durations))
        data = rnnt_data(3, 7, 3, K, b, len(durations), "float64", seed=K)
        got = f(*data, np.array(durations, np.int32), np.int32(b), np.array([sigma, lam, clamp]))
        ref = batch_lattice(*data, b, durations, sigma, lam, clamp)
        for name, g, r in zip(RnntLattice._fields, got, ref):
            np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12, err_msg=name)
    # empty time and label_len = 0: the empty alignment
    got = f(np.zeros((2, 0, 1, 4)), np.zeros((2, 0), np.int32), np.zeros(2, np.int32), np.zeros(2, np.int32),
            np.array([2], np.int32), np.int32(3), np.zeros(3))
    np.testing.assert_array_equal(got[0], [0.0, 0.0])
    # padding beyond the longest sequence, and a NaN logit, through the wavefront form
    acts, labels, act_lens, label_lens = rnnt_data(3, 5, 2, 6, 5, 1, "float64", seed=3)
    padded = pad_acts(acts, 2, 3, np.random.default_rng(4))
    padded[1, 0, 0, 2] = np.nan
    args = (np.array([2], np.int32), np.int32(5), np.array([0.05, 0.1, -1.0]))
    got = f(padded, labels, act_lens, label_lens, *args)
    ref = batch_lattice(acts, labels, act_lens, label_lens, 5, (2,), 0.05, 0.1)
    check_nan_sequence(got, ref, 1, act_lens, label_lens, padded.shape)
