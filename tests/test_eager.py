"""ptnative.eager: catalogue functions on numpy arrays.  Results against the independent references and, bit for bit,
against the same function compiled as a PyTensor graph; one compile per signature; layouts, errors, threads."""

import threading

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import ptnative
from ptnative import eager

from .conftest import MODE_IDS, MODES
from .reference import fsa as ref_fsa
from .reference import hmm as ref_hmm


def hmm_data(T, B, K, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    log_e = rng.normal(size=(T, B, K)).astype(dtype)
    log_A = np.log(rng.dirichlet(np.ones(K), K)).astype(dtype)
    log_pi = np.log(rng.dirichlet(np.ones(K))).astype(dtype)
    return log_e, log_A, log_pi


def graph_viterbi(*arrays, mode=None, **kwargs):
    syms = [pt.tensor(dtype=str(a.dtype), shape=(None,) * a.ndim) for a in arrays]
    f = pytensor.function(syms, list(ptnative.hmm_viterbi(*syms, **kwargs)), mode=mode)
    return f(*arrays)


def same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g) is np.ndarray and g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("T,B,K", [(40, 1, 3), (30, 4, 5), (0, 2, 3), (6, 0, 2)])
def test_hmm_viterbi_against_the_reference_and_the_graph(T, B, K, dtype):
    log_e, log_A, log_pi = hmm_data(T, B, K, dtype)
    path, score = eager.hmm_viterbi(log_e, log_A, log_pi)
    assert isinstance(eager.hmm_viterbi(log_e, log_A, log_pi), tuple)
    want_path, want_score = ref_hmm.viterbi(log_e, log_A, log_pi)
    np.testing.assert_array_equal(path, want_path)
    np.testing.assert_allclose(score, want_score, rtol=1e-5 if dtype == np.float32 else 1e-12)
    same((path, score), graph_viterbi(log_e, log_A, log_pi))
    same(eager.hmm_viterbi(log_e, log_A, log_pi), (path, score))  # the second call (the compiled driver)


def test_ragged_mask_and_keywords():
    log_e, log_A, log_pi = hmm_data(12, 3, 4)
    lens = np.array([12, 5, 0])
    mask = (np.arange(12)[:, None] < lens).astype(np.float64)
    log_f = np.log(np.full(4, 0.25))
    got = eager.hmm_viterbi(log_e, log_A, log_pi, log_f, mask)
    want = ref_hmm.viterbi(log_e, log_A, log_pi, log_f, lens)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
    same(eager.hmm_viterbi(log_e, log_A, log_pi, mask=mask, log_final=log_f), got)
    marginals, counts = eager.hmm_posteriors(log_e, log_A, log_pi, mask=mask)
    want_m, want_c = ref_fsa.hmm_posteriors(log_e, log_A, log_pi, None, lens)
    np.testing.assert_allclose(marginals[:, :2], want_m[:, :2], atol=1e-10)
    np.testing.assert_allclose(counts[:2], want_c[:2], atol=1e-10)


HARNESSES = ["hmm_posteriors", "edit_distance", "ctc_loss", "chunk", "sparse_to_dense", "get_ctc_fsa_fast_bw",
             "next_edit_distance_reduce", "rnnt_loss", "hsmm_viterbi"]


@pytest.mark.parametrize("function", HARNESSES)
def test_any_graph_builder_gives_the_graphs_results(function):
    """:func:`ptnative.eager.wrap` of tests/fuzz_cases.py's graphs (gradients included), on their valid values: the
    compiled graph's results bit for bit."""
    from . import fuzz_cases

    harness = fuzz_cases.HARNESSES[function](None)
    values = harness.valid()
    fn = eager.wrap(harness.graph)
    got = fn(*values)
    same([np.asarray(g) for g in got], [np.asarray(w) for w in harness.clean()])
    same([np.asarray(g) for g in fn(*values)], [np.asarray(g) for g in got])


def test_one_compile_per_signature(monkeypatch):
    compiles = []
    real = pytensor.function
    monkeypatch.setattr(pytensor, "function", lambda *a, **k: compiles.append(1) or real(*a, **k))
    fn = eager.wrap(ptnative.hmm_viterbi)
    fn(*hmm_data(5, 1, 3))
    fn(*hmm_data(9, 2, 4))  # other shapes: the same compiled function
    assert len(compiles) == 1
    fn(*hmm_data(5, 1, 3, np.float32))
    fn(*hmm_data(7, 1, 3, np.float32))
    assert len(compiles) == 2
    log_e, log_A, log_pi = hmm_data(5, 1, 3)
    fn(log_e, log_A, log_pi, None, np.ones((5, 1)))  # a constant (None) and another array: another signature
    fn(log_e, log_A, log_pi, mask=np.ones((5, 1)))
    assert len(compiles) == 4


def test_alternating_signatures():
    """Calls alternating between float32 and float64 (the per-thread first try misses, then is skipped): right
    results every time."""
    fn = eager.wrap(ptnative.hmm_viterbi)
    cases = [hmm_data(20, 2, 3, dtype, seed) for seed, dtype in enumerate([np.float64, np.float32] * 4)]
    for args in cases:
        same(fn(*args), graph_viterbi(*args))
    assert fn._local.misses <= 2


def test_a_new_signature_becomes_the_first_try():
    fn = eager.wrap(ptnative.hmm_viterbi)
    a64, a32 = hmm_data(20, 2, 3), hmm_data(20, 2, 3, np.float32)
    fn(*a64)
    first = fn._local.last
    assert first is not None
    for _ in range(3):
        same(fn(*a32), graph_viterbi(*a32))
    assert fn._local.misses == 1 and fn._local.last is not None and fn._local.last is not first
    same(fn(*a32), graph_viterbi(*a32))


def test_layouts_and_inputs_left_alone():
    log_e, log_A, log_pi = hmm_data(15, 3, 4)
    keep = [a.copy() for a in (log_e, log_A, log_pi)]
    want = eager.hmm_viterbi(log_e, log_A, log_pi)
    unaligned = np.ndarray(log_e.shape, np.float64, np.zeros(log_e.nbytes + 1, np.uint8)[1:].data)
    unaligned[...] = log_e
    assert not unaligned.flags.aligned
    readonly = log_e.copy()
    readonly.flags.writeable = False
    views = [np.repeat(log_e, 2, axis=2)[:, :, ::2], log_e[::-1].copy()[::-1], np.asfortranarray(log_e),
             log_e.astype(">f8"), unaligned, readonly]
    for view in views:
        same(eager.hmm_viterbi(view, log_A, log_pi), want)
        same(eager.hmm_viterbi(log_e, np.asfortranarray(log_A), log_pi), want)
    same(eager.hmm_viterbi(log_e, log_A, log_pi), want)
    for a, k in zip((log_e, log_A, log_pi), keep):
        np.testing.assert_array_equal(a, k)


def test_each_call_returns_new_arrays():
    args = hmm_data(10, 1, 3)
    first = eager.hmm_viterbi(*args)
    kept = [a.copy() for a in first]
    second = eager.hmm_viterbi(args[0] * 2, args[1], args[2])
    assert all(a is not b and not np.shares_memory(a, b) for a, b in zip(first, second))
    same(first, kept)


def test_errors_name_the_function_and_argument():
    log_e, log_A, log_pi = hmm_data(10, 2, 3)
    with pytest.raises(ValueError, match="hmm_viterbi: log_emissions must have ndim 3"):
        eager.hmm_viterbi(log_e[0], log_A, log_pi)
    eager.hmm_viterbi(log_e, log_A, log_pi)  # the compiled driver now comes first
    with pytest.raises(ptnative.KernelValueError, match="hmm_viterbi: log_transitions must have shape"):
        eager.hmm_viterbi(log_e, log_A[:2], log_pi)
    with pytest.raises(TypeError, match="hmm_viterbi: got the symbolic"):
        eager.hmm_viterbi(pt.tensor3(), log_A, log_pi)
    with pytest.raises(TypeError, match="hmm_viterbi: argument 'log_emissions' has dtype object"):
        eager.hmm_viterbi(log_e.astype(object), log_A, log_pi)
    with pytest.raises(TypeError, match="hmm_viterbi: an argument of type set"):
        eager.hmm_viterbi(log_e, log_A, log_pi, {1})
    with pytest.raises(AttributeError, match="no attribute 'no_such_function'"):
        eager.no_such_function
    same(eager.hmm_viterbi(log_e, log_A, log_pi), graph_viterbi(log_e, log_A, log_pi))
    nan = log_e.copy()
    nan[3, 1, 0] = np.nan
    path, score = eager.hmm_viterbi(nan, log_A, log_pi)
    assert np.isnan(score[1]) and (path[:, 1] == -1).all() and not np.isnan(score[0])


def test_threads():
    """Four threads at once, each with its own signature and data (compiled functions are per thread)."""
    results, errors = {}, []

    def work(k):
        try:
            args = hmm_data(30, 2, 2 + k, np.float32 if k % 2 else np.float64, seed=k)
            results[k] = [(eager.hmm_viterbi(*args), args) for _ in range(20)]
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for runs in results.values():
        want = graph_viterbi(*runs[0][1])
        for got, _ in runs:
            same(got, want)


def test_plain_python_functions_and_the_namespace():
    assert eager.n_chunks(10, 3, 2) == ptnative.n_chunks(10, 3, 2) == 5
    assert eager.naive_chunk_start_frames(100, 50, 10) == [0, 10, 20, 30, 40, 50]
    assert set(ptnative.ops.FUNCTIONS) <= set(dir(eager))
    assert eager.hmm_viterbi is eager.hmm_viterbi and "hmm_viterbi" in repr(eager.hmm_viterbi)
    assert "most likely state path" in eager.hmm_viterbi.__doc__


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_every_mode(mode):
    args = hmm_data(25, 3, 4)
    fn = eager.wrap(ptnative.hmm_viterbi, mode=mode)
    want = graph_viterbi(*args, mode=mode)
    same(fn(*args), want)
    same(fn(*args), want)
    same(eager.hmm_viterbi(*args), want)
    wrapped = eager.wrap(lambda e, a, p: ptnative.hmm_viterbi(2 * e, a, p)[1], mode=mode)  # two nodes, one output
    np.testing.assert_array_equal(wrapped(*args), graph_viterbi(2 * args[0], *args[1:], mode=mode)[1])


def test_jax_mode_gives_numpy_arrays():
    """A JAX-mode graph returns JAX arrays; ptnative.eager returns numpy arrays in every mode."""
    pytest.importorskip("jax")
    args = hmm_data(25, 3, 4, np.float32)
    want = graph_viterbi(*args)
    got = eager.wrap(ptnative.hmm_viterbi, mode="JAX")(*args)
    assert isinstance(got, tuple)
    same(got, want)
    with pytensor.config.change_flags(mode="JAX"):
        total = eager.wrap(lambda e, a, p: ptnative.hmm_posteriors(e, a, p)[1].sum())(*args)
    assert type(total) is np.ndarray and total.shape == ()
    np.testing.assert_allclose(total, 3 * 24, rtol=1e-5)  # each sequence's expected counts sum to T - 1


def test_failing_calls_pin_no_memory():
    """Calls that the kernel rejects (the op's driver called directly: its raise is in the frame called from Python)
    alternating with good ones: resident memory stays flat, where keeping each failing call's 1 MB input would grow
    it by 300 MB."""
    from .fuzz_cases import rss_bytes

    log_e, log_A, log_pi = hmm_data(40000, 1, 3)  # 0.96 MB of emissions
    bad_A = np.log(np.full((2, 3), 1 / 3))
    eager.hmm_viterbi(log_e, log_A, log_pi)
    with pytest.raises(ptnative.KernelValueError):
        eager.hmm_viterbi(log_e, bad_A, log_pi)
    before = rss_bytes()
    for _ in range(300):
        with pytest.raises(ptnative.KernelValueError):
            eager.hmm_viterbi(log_e + 0.0, bad_A, log_pi)
        eager.hmm_viterbi(log_e, log_A, log_pi)
    assert rss_bytes() - before < 60 * 2**20, f"resident memory grew by {(rss_bytes() - before) / 2**20:.0f} MB"
