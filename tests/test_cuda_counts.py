"""What one call of an op's CUDA path costs, counted by the CUDA emulation (tests/cuda_emulation.h): kernel launches,
device allocations, host <-> device bytes; and the one-pass kernels that keep those counts low, against the CPU path
on inputs that exercise their corners (RNA and CTC topologies, log-probabilities, repeated labels, ties, sequences
without a path, zero lengths).  docs/gpu.md lists the counts."""

from __future__ import annotations

import os
import re

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from ptnative.ops.fsa import CtcFsaLossOp, CtcViterbiLossOp

from .test_cuda_emulation import MODE, emulated

I32 = np.int32


def read_counts(path) -> list[dict]:
    """The per-call lines that the emulation appended to ``path``: one dict per call (op signature and counts)."""
    calls = []
    for line in path.read_text().splitlines():
        sig, _, rest = line.rpartition(": ")
        calls.append({"op": sig, **{k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", rest)}})
    return calls


@pytest.fixture
def counts_file(tmp_path, monkeypatch):
    path = tmp_path / "counts.txt"
    path.write_text("")
    monkeypatch.setenv("PTNATIVE_EMU_COUNTS", str(path))
    return path


# ------------------------------------------------------------------ CTC: one pass per batch
def _ctc_function(op_cls, emulate, dtype, blank, loop, normalized):
    logits = pt.tensor3("logits", dtype=dtype)
    lens, targets, tlens = pt.ivector("lens"), pt.imatrix("targets"), pt.ivector("tlens")
    op = op_cls.make_op()
    op = emulated(op) if emulate else op
    outs = op(logits, lens, targets, tlens, pt.constant(I32(blank)), pt.constant(I32(loop)),
              pt.constant(I32(normalized)))
    return pytensor.function([logits, lens, targets, tlens], list(outs), mode=MODE)


def _ctc_values(T, B, D, N, dtype, normalized, ties, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-1, 2, size=(T, B, D)).astype(float) if ties else rng.normal(size=(T, B, D)) * 2
    if normalized:
        x = x - np.log(np.exp(x).sum(-1, keepdims=True))
    targets = rng.integers(1, D, size=(B, N)).astype(I32)
    targets[0, :2] = targets[0, 0]  # a repeated label
    tlens = rng.integers(0, N + 1, size=B).astype(I32)
    tlens[0] = N
    lens = rng.integers(max(T // 2, 1), T + 1, size=B).astype(I32)
    lens[0] = T
    if B > 2:
        lens[1], tlens[1] = 0, 0  # the empty alignment: loss 0
        lens[2], tlens[2] = min(T, 1), min(N, 2)  # no path
    return [x.astype(dtype), lens, targets, tlens]


CTC_CONFIGS = [(loop, normalized) for loop in (1, 0) for normalized in (0, 1)]


@pytest.mark.parametrize("op_cls", [CtcFsaLossOp, CtcViterbiLossOp], ids=lambda c: c.__name__)
@pytest.mark.parametrize("T", [1, 6, 31])
def test_ctc_is_one_pass_and_matches_cpu(op_cls, T, counts_file):
    """Two launches per call (the input check and the pass), whatever T; loss and gradient equal the CPU's for CTC
    and RNA, logits and log-probabilities, with ties (integer logits: the Viterbi alignment's tie-breaking)."""
    B, D, N = 5, 6, 4
    for loop, normalized in CTC_CONFIGS:
        for ties in (False, True):
            values = _ctc_values(T, B, D, N, "float64", normalized, ties, seed=T + 10 * loop + normalized)
            want = _ctc_function(op_cls, False, "float64", 0, loop, normalized)(*values)
            counts_file.write_text("")
            got = _ctc_function(op_cls, True, "float64", 0, loop, normalized)(*values)
            for g, w, name in zip(got, want, ("loss", "grad")):
                np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9,
                                           err_msg=f"{name} T={T} loop={loop} normalized={normalized} ties={ties}")
            assert np.isinf(want[0][2]) and want[0][1] == 0  # the corner sequences are there
            (call,) = read_counts(counts_file)
            assert call["launches"] == 2, call


@pytest.mark.parametrize("op_cls", [CtcFsaLossOp, CtcViterbiLossOp], ids=lambda c: c.__name__)
def test_ctc_float32_and_blank_last(op_cls):
    values = _ctc_values(17, 4, 7, 3, "float32", 0, False, seed=3)
    values[2] = np.where(values[2] == 6, 5, values[2]).astype(I32) - 1  # labels in [0, 5): blank = 6 (last)
    want = _ctc_function(op_cls, False, "float32", -1, 1, 0)(*values)
    got = _ctc_function(op_cls, True, "float32", -1, 1, 0)(*values)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


def test_ctc_warm_call_allocates_nothing_new(counts_file):
    """The second call of the same shapes: no device allocation (entry buffers and the scratch block are kept);
    the first (larger than any before in this process) allocates."""
    values = _ctc_values(45, 9, 11, 5, "float64", 0, False, seed=1)
    f = _ctc_function(CtcFsaLossOp, True, "float64", 0, 1, 0)
    f(*values)
    f(*values)
    first, second = read_counts(counts_file)
    assert first["allocs"] > 0 and second["allocs"] == 0, (first, second)
    logits_bytes = values[0].nbytes
    assert second["h2d"] >= logits_bytes and second["d2h"] >= logits_bytes  # logits in, grad out


# ------------------------------------------------------------------ FastBaumWelch: fused frame steps
def _launches_of(case_name, builder, size, monkeypatch, counts_file, op_prefix):
    from .gpu import cases
    from .test_cuda_emulation import run_emulated

    counts_file.write_text("")
    case = cases._case(case_name, "fsa", [], builder, [size])
    run_emulated(case, "float64", monkeypatch)
    calls = [c for c in read_counts(counts_file) if c["op"].startswith(op_prefix)]
    assert len(calls) == 1, calls
    return calls[0]["launches"]


def _one_state_fsa(no_path):
    """A FastBaumWelch graph builder: sequence b has one state b with a self-loop per class (a path for every
    sequence), or (no_path) the same with every weight inf (no path: the log-space pass)."""
    from ptnative.ops.fsa import FastBaumWelchOp

    from .gpu.cases import n_states_of

    def build(g, dtype, size):
        T, B, D = size
        edges = np.array([np.repeat(np.arange(B), D), np.repeat(np.arange(B), D), np.tile(np.arange(D), B),
                          np.repeat(np.arange(B), D)], I32)
        weights = np.random.default_rng(B).random(B * D) if not no_path else np.full(B * D, np.inf)
        se = np.array([np.arange(B), np.arange(B)], I32)
        mask = (np.arange(T)[:, None] < np.maximum(T - np.arange(B), 0)[None, :]).astype(dtype)  # ragged
        values = [np.random.default_rng(T).random((T, B, D)).astype(dtype) * 3, edges, weights.astype(dtype), se,
                  mask]
        am, e, w, s_, m = g.syms("am edges weights se mask", values)
        out, sums = g.op(FastBaumWelchOp)(am, e, w, s_, m, pt.zeros((2, n_states_of(e, s_)), dtype=dtype))
        return [am, e, w, s_, m], [out, sums], values

    return build


@pytest.mark.parametrize("no_path", [False, True], ids=["paths", "log-space pass"])
def test_fast_baum_welch_launches_per_frame(no_path, monkeypatch, counts_file):
    """One launch per frame forward and one backward (the vectors normalised as the next launch reads them; the
    outputs of each frame written by the next backward launch); sequences without a path in the scaled pass (here:
    every edge weight inf) are redone in log space, with as many launches again."""
    per = {T: _launches_of("fast_bw_counts", _one_state_fsa(no_path), (T, 3, 4), monkeypatch, counts_file,
                           "am_scores,") for T in (6, 16)}
    assert (per[16] - per[6]) / 10 == (4 if no_path else 2), per


@pytest.mark.parametrize("no_path", [False, True], ids=["paths", "log-space pass"])
def test_fast_baum_welch_emission_rows_by_chunks(no_path, monkeypatch):
    """With room for the emission rows of only two frames (FBW_MAX_ROW_ELEMENTS made small), both passes compute
    them chunk by chunk: the results are the CPU's."""
    from ptnative.op import NativeOpGenBase

    from .gpu import cases
    from .test_cuda_emulation import run_cpu

    make_op = NativeOpGenBase.make_op.__func__

    def small_rows(cls, **kw):
        op = emulated(make_op(cls, **kw))
        code = op.c_extra_support_code.replace("#define CUDA 1\n", "#define CUDA 1\n#define FBW_MAX_ROW_ELEMENTS 30\n",
                                               1)
        return op.clone_with(c_extra_support_code=code)

    case = cases._case("fast_bw_chunks", "fsa", [], _one_state_fsa(no_path), [(9, 3, 5)])
    want = run_cpu(case, "float64")
    with monkeypatch.context() as m:
        m.setattr(NativeOpGenBase, "make_op", classmethod(small_rows))
        inputs, outputs, value_sets = case.build(lambda cls, **kw: cls.make_op(**kw), "float64")
        f = pytensor.function(inputs, outputs, mode=MODE)
        got = [[np.array(r, copy=True) for r in f(*value_sets[0])]]
    cases.assert_outputs_close(case, "float64", got, want, "chunked emulated cuda vs cpu")


# ------------------------------------------------------------------ RNN-T: alpha, beta and gradient fused
@pytest.mark.parametrize("durations", [(), (2, 4)], ids=["rnnt", "multiblank"])
def test_rnnt_takes_three_launches_whatever_the_lattice(durations, monkeypatch, counts_file):
    from .gpu import cases

    fn = cases._rnnt(durations, 0.05, 0.1, -1.0)
    launches = {size: _launches_of("rnnt_counts", fn, size, monkeypatch, counts_file, "acts,")
                for size in [(2, 3, 2, 4), (3, 12, 6, 5)]}
    assert set(launches.values()) == {3}, launches


# ------------------------------------------------------------------ LSTM: two launches per frame each way
@pytest.mark.parametrize("layer", [False, True], ids=["NativeLstm2", "NativeLstm2Layer"])
def test_lstm_two_launches_per_frame(layer, monkeypatch, counts_file):
    """Forward: the recurrent product and the gates per frame (the bias of every frame in one launch); backward:
    the gates' gradient and the product per frame (the matrix of every frame's inputs in one launch)."""
    from .gpu import cases
    from .test_cuda_emulation import run_emulated

    builder, size = (cases._native_lstm2_layer, (None, 3, 5, 4, 0, 1)) if layer else (cases._native_lstm2,
                                                                                      (None, 3, 4, 0, 1))
    per = {}
    for T in (5, 13):
        counts_file.write_text("")
        run_emulated(cases._case("lstm_counts", "lstm", [], builder, [(T, *size[1:])]), "float64", monkeypatch)
        per[T] = {c["op"]: c["launches"] for c in read_counts(counts_file)}
    assert len(per[5]) == 2 and per[5].keys() == per[13].keys(), per  # the op and its gradient op
    slopes = {op: (per[13][op] - per[5][op]) / 8 for op in per[5]}
    assert set(slopes.values()) == {2}, (slopes, per)


def test_allow_tf32_setting(monkeypatch):
    """ptnative.config.allow_tf32 lives in PTNATIVE_ALLOW_TF32, which the CUDA kernels read at every product."""
    import ptnative

    monkeypatch.delenv("PTNATIVE_ALLOW_TF32", raising=False)
    assert ptnative.config.allow_tf32 is True  # torch's cuDNN default
    ptnative.config.allow_tf32 = False
    assert ptnative.config.allow_tf32 is False and os.environ["PTNATIVE_ALLOW_TF32"] == "0"
    ptnative.config.allow_tf32 = True
    assert os.environ["PTNATIVE_ALLOW_TF32"] == "1"
    ptnative.config.allow_tf32 = None
    assert "PTNATIVE_ALLOW_TF32" not in os.environ and ptnative.config.allow_tf32 is True


def test_device_counts_wants_a_cuda_variant():
    from ptnative.build import device_counts

    with pytest.raises(ValueError, match="not a CUDA one"):
        device_counts(CtcFsaLossOp.make_op().variant("float32"))
