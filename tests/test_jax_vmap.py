"""``jax.vmap`` of native ops whose spec declares batch axes (``batch_axis``): the mapped axis is folded into the op's
batch axis, so one FFI call runs for the whole map (backends/jax.py ``fold_vmap``).  For each declared catalogue
function: the vmapped results equal a Python loop over the elements (ragged lengths differing per element), and so do
``jax.vmap(jax.grad(...))`` and ``jax.grad`` of a vmapped cost, float32 and float64; the lowered program of a folded
map has one FFI call and no loop, while an op without batch axes (or a map of an input without one) keeps one call per
element; ``batch_axis`` is validated and carried into the gradient op's spec."""

import re

import numpy as np
import pytensor.tensor as pt
import pytest

jax = pytest.importorskip("jax")

import ptnative  # noqa: E402
from ptnative import NativeOp  # noqa: E402
from ptnative.ops.fsa import CtcFsaLossOp  # noqa: E402
from ptnative.ops.hmm import HmmForwardBackwardOp  # noqa: E402
from ptnative.ops.sparse import SparseToDense  # noqa: E402

from .test_fsa import hmm_data, mask_of  # noqa: E402
from .test_jax_grad import assert_close, jaxify  # noqa: E402

M = 3  # elements of the mapped axis


def ragged(rng, n, high, low=0):
    """``n`` lengths in ``[low, high]``, one of them ``high`` and (where ``low = 0``) one 0."""
    lens = rng.integers(low, high + 1, size=n)
    lens[0] = high
    return lens.astype("int32")


def case_ctc(dtype, rng, viterbi=False):
    T, B, D, N = 7, 3, 5, 3
    logits = pt.tensor3("logits", shape=(T, None, D), dtype=dtype)
    ins = [logits, pt.ivector("lens"), pt.imatrix("targets", shape=(None, N)), pt.ivector("tlens")]
    loss = (ptnative.ctc_loss_viterbi if viterbi else ptnative.ctc_loss)(*ins, blank_index=0)
    elems = []
    for _ in range(M):
        lens = ragged(rng, B, T, 1)
        elems.append([rng.normal(size=(T, B, D)).astype(dtype), lens,
                      rng.integers(1, D, size=(B, N)).astype("int32"),
                      np.minimum(ragged(rng, B, N), (lens + 1) // 2).astype("int32")])
    return ins, [loss], elems, [0]


def case_hmm(dtype, rng):
    T, B, K = 6, 3, 3
    le = pt.tensor3("le", shape=(T, None, K), dtype=dtype)
    mask = pt.matrix("mask", shape=(T, None), dtype=dtype)
    _, lA, lpi, lf = hmm_data(rng, T, B, K)
    ll = ptnative.hmm_log_likelihood(le, lA.astype(dtype), lpi.astype(dtype), lf.astype(dtype), mask=mask)
    elems = [[(rng.normal(size=(T, B, K)) * 2).astype(dtype), mask_of(ragged(rng, B, T), T).astype(dtype)]
             for _ in range(M)]
    return [le, mask], [ll], elems, [0]


def case_hmm_inference(dtype, rng, fn):
    """hmm_viterbi / hmm_posteriors / hmm_sample_states on ragged series; the model is shared by the map."""
    T, B, K = 6, 3, 3
    le = pt.tensor3("le", shape=(T, None, K), dtype=dtype)
    mask = pt.matrix("mask", shape=(T, None), dtype=dtype)
    _, lA, lpi, lf = hmm_data(rng, T, B, K)
    model = (le, lA.astype(dtype), lpi.astype(dtype), lf.astype(dtype))
    elems = [[(rng.normal(size=(T, B, K)) * 2).astype(dtype), mask_of(ragged(rng, B, T), T).astype(dtype)]
             for _ in range(M)]
    if fn == "hmm_sample_states":
        u = pt.matrix("u", shape=(T, None), dtype=dtype)
        for e in elems:
            e.append(rng.uniform(size=(T, B)).astype(dtype))
        return [le, mask, u], [ptnative.hmm_sample_states(*model, mask=mask, uniforms=u)], elems, []
    outs = getattr(ptnative, fn)(*model, mask=mask)
    return [le, mask], list(outs), elems, [0] if fn == "hmm_posteriors" else []


def case_lstm(dtype, rng, impl):
    """A whole LSTM layer (NativeLstm2 or LstmLowMem) on ragged sequences; the weights are shared by the map."""
    T, B, n_in, n = 5, 3, 4, 3
    x = pt.tensor3("x", shape=(T, None, n_in), dtype=dtype)
    mask = pt.matrix("mask", shape=(T, None), dtype=dtype)
    W_in, W_rec, b = ((rng.normal(size=shape) * 0.5).astype(dtype) for shape in ((n_in, 4 * n), (n, 4 * n), (4 * n,)))
    outs = ptnative.lstm(x, W_in, W_rec, b, mask=mask, impl=impl)
    elems = [[rng.normal(size=(T, B, n_in)).astype(dtype), mask_of(ragged(rng, B, T, 1), T).astype(dtype)]
             for _ in range(M)]
    return [x, mask], list(outs), elems, [0]


def case_rnnt(dtype, rng):
    B, T, U, K = 3, 5, 3, 4
    acts = pt.tensor4("acts", shape=(None, T, U + 1, K), dtype=dtype)
    ins = [acts, pt.imatrix("labels", shape=(None, U)), pt.ivector("act_lens"), pt.ivector("label_lens")]
    costs = ptnative.rnnt_loss(*ins, blank=0)
    elems = []
    for _ in range(M):
        label_lens = ragged(rng, B, U)
        elems.append([rng.normal(size=(B, T, U + 1, K)).astype(dtype),
                      rng.integers(1, K, size=(B, U)).astype("int32"), ragged(rng, B, T, 1), label_lens])
    return ins, [costs], elems, [0]


def int_pairs(rng, B=4, Ta=5, Tb=6):
    return [rng.integers(0, 3, size=(B, Ta)).astype("int32"), ragged(rng, B, Ta),
            rng.integers(0, 3, size=(B, Tb)).astype("int32"), ragged(rng, B, Tb)]


def case_edit_distance(dtype, rng, fn="edit_distance"):
    ins = [pt.imatrix("a"), pt.ivector("a_len"), pt.imatrix("b"), pt.ivector("b_len")]
    return ins, [getattr(ptnative, fn)(*ins)], [int_pairs(rng) for _ in range(M)], []


def case_ocd_per_successor(dtype, rng):
    ins = [pt.imatrix("a"), pt.ivector("a_len"), pt.imatrix("b"), pt.ivector("b_len")]
    successors = np.array([0, 2, 1], "int32")  # shared by the map: no batch axis
    out = ptnative.optimal_completion_edit_distance_per_successor(*ins, successors)
    return ins, [out], [int_pairs(rng) for _ in range(M)], []


def case_next_row(dtype, rng):
    B, Tb = 4, 6
    ins = [pt.imatrix("last_row"), pt.ivector("a"), pt.ivector("a_n"), pt.ivector("a_ended"), pt.imatrix("b"),
           pt.ivector("b_len")]
    out = ptnative.next_edit_distance_row(*ins)
    elems = [[rng.integers(0, 4, size=(B, Tb + 1)).astype("int32"), rng.integers(0, 3, size=B).astype("int32"),
              rng.integers(0, 4, size=B).astype("int32"), rng.integers(0, 2, size=B).astype("int32"),
              rng.integers(0, 3, size=(B, Tb)).astype("int32"), ragged(rng, B, Tb)] for _ in range(M)]
    return ins, [out], elems, []


def coo(rng, N, B, T, D, dtype):
    return [rng.integers(0, T, size=(N, B)).astype(dtype), rng.integers(0, D, size=(N, B)).astype(dtype),
            rng.normal(size=(N, B)).astype(dtype), (rng.random(size=(N, B)) > 0.3).astype(dtype)]


def case_sparse_to_dense(dtype, rng):
    T, D, N = 4, 5, 6
    ins = [pt.matrix(n, shape=(N, None), dtype=dtype) for n in ("s0", "s1", "weight", "mask")]
    W = ptnative.sparse_to_dense(*ins, n_time=T, n_dim=D)
    return ins, [W], [coo(rng, N, 3, T, D, dtype) for _ in range(M)], [2]


def case_crossentropy(dtype, rng):
    T, D, N, B = 4, 5, 6, 3
    z, z_mask = pt.tensor3("z", shape=(T, None, D), dtype=dtype), pt.matrix("zm", shape=(T, None), dtype=dtype)
    entries = [pt.matrix(n, shape=(N, None), dtype=dtype) for n in ("yt", "yi", "yw", "ym")]
    ce, grad_z = ptnative.crossentropy_softmax_and_gradient_z_sparse(z, z_mask, *entries)
    elems = [[rng.normal(size=(T, B, D)).astype(dtype), mask_of(ragged(rng, B, T), T).astype(dtype),
              *coo(rng, N, B, T, D, dtype)] for _ in range(M)]
    return [z, z_mask, *entries], [ce, grad_z], elems, [0, 4]


def case_subtensor(dtype, rng):
    T, B, D = 5, 3, 4
    x, idx = pt.tensor3("x", shape=(T, None, D), dtype=dtype), pt.matrix("idx", shape=(T, None), dtype=dtype)
    elems = [[rng.normal(size=(T, B, D)).astype(dtype), rng.integers(0, D, size=(T, B)).astype(dtype)]
             for _ in range(M)]
    return [x, idx], [ptnative.subtensor_batched_index(x, idx)], elems, [0]


def case_max_and_argmax(dtype, rng):
    T, D, N, B = 4, 5, 6, 3
    ins = [pt.matrix(n, shape=(N, None), dtype=dtype) for n in ("s0", "s1", "w", "mask")]
    ins += [pt.matrix("out_max", shape=(T, None), dtype=dtype), pt.matrix("out_arg", shape=(T, None), dtype=dtype)]
    outs = ptnative.max_and_argmax_sparse(*ins)
    elems = [[*coo(rng, N, B, T, D, dtype), np.zeros((T, B), dtype), np.zeros((T, B), dtype)] for _ in range(M)]
    return ins, list(outs), elems, []


#: name -> builder(dtype, rng) returning (inputs, outputs, M value lists, positions of the inputs to differentiate).
CASES = {
    "ctc_loss": case_ctc,
    "ctc_loss_viterbi": lambda dtype, rng: case_ctc(dtype, rng, viterbi=True),
    "hmm_log_likelihood": case_hmm,
    "hmm_viterbi": lambda dtype, rng: case_hmm_inference(dtype, rng, "hmm_viterbi"),
    "hmm_posteriors": lambda dtype, rng: case_hmm_inference(dtype, rng, "hmm_posteriors"),
    "hmm_sample_states": lambda dtype, rng: case_hmm_inference(dtype, rng, "hmm_sample_states"),
    "lstm native2": lambda dtype, rng: case_lstm(dtype, rng, "native2"),
    "lstm lowmem": lambda dtype, rng: case_lstm(dtype, rng, "lowmem"),
    "rnnt_loss": case_rnnt,
    "edit_distance": case_edit_distance,
    "optimal_completion_edit_distance": lambda dtype, rng: case_edit_distance(
        dtype, rng, "optimal_completion_edit_distance"),
    "optimal_completion_edit_distance_per_successor": case_ocd_per_successor,
    "next_edit_distance_row": case_next_row,
    "sparse_to_dense": case_sparse_to_dense,
    "crossentropy_softmax_and_gradient_z_sparse": case_crossentropy,
    "subtensor_batched_index": case_subtensor,
    "max_and_argmax_sparse": case_max_and_argmax,
}


INTEGER_ONLY = {"edit_distance", "optimal_completion_edit_distance", "optimal_completion_edit_distance_per_successor",
                "next_edit_distance_row"}


def stack(elems):
    return [np.stack([e[i] for e in elems]) for i in range(len(elems[0]))]


def weighted_cost(f, rng, outputs):
    """``cost(*xs)``: the first output times fixed random weights, summed (each element's gradient depends on every
    entry of it)."""
    weights = []

    def cost(*xs):
        out = f(*xs)[0]
        if not weights:
            weights.append(rng.normal(size=out.shape).astype(outputs[0].dtype))
        return (out * weights[0]).sum()

    return cost


def ffi_calls(lowered_text):
    """The op variants a lowered program calls (their symbols, one entry per call site of ptnative's FFI target)
    and whether it loops."""
    calls = re.findall(r'custom_call @ptnative_\w+\(.*?symbol = "(ptn_\w+)"', lowered_text)
    return calls, "stablehlo.while" in lowered_text


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_vmap_equals_a_loop_over_elements(name, dtype):
    if dtype == "float32" and name in INTEGER_ONLY:
        pytest.skip("integer-only op: one dtype")
    rng = np.random.default_rng(sum(map(ord, name)))
    inputs, outputs, elems, wrt = CASES[name](dtype, rng)
    f = jaxify(inputs, outputs)
    stacked = stack(elems)

    got = jax.jit(jax.vmap(f))(*stacked)
    for k, values in enumerate(elems):
        for j, want in enumerate(f(*values)):
            assert_close(np.asarray(got[j])[k], want, dtype, f"{name} {dtype}: element {k}, output {j}")

    calls, loops = ffi_calls(jax.jit(jax.vmap(f)).lower(*stacked).as_text())
    assert len(calls) == 1 and not loops, f"{name}: the map was not folded into one call: {calls}, loop={loops}"

    if not wrt:
        return
    cost = weighted_cost(f, np.random.default_rng(3), outputs)
    cost(*elems[0])  # fix the weights outside the traces
    grad = jax.grad(cost, argnums=wrt)
    want = [grad(*values) for values in elems]
    per_element = jax.jit(jax.vmap(grad))(*stacked)
    of_map = jax.jit(jax.grad(lambda *xs: jax.vmap(cost)(*xs).sum(), argnums=wrt))(*stacked)
    for how, got in (("vmap(grad)", per_element), ("grad(vmap)", of_map)):
        for k in range(M):
            for i, g in enumerate(got):
                assert_close(np.asarray(g)[k], want[k][i], dtype, f"{name} {dtype} {how}: element {k}, input {i}")


def test_shared_inputs_are_repeated_along_the_batch_axis():
    """Only the logits are mapped; the lengths and targets (with batch axes) are the same for every element."""
    rng = np.random.default_rng(5)
    inputs, outputs, elems, _ = case_ctc("float64", rng)
    f = jaxify(inputs, outputs)
    logits = np.stack([e[0] for e in elems])
    shared = elems[0][1:]
    got = jax.jit(jax.vmap(lambda x: f(x, *shared)[0]))(logits)
    for k in range(M):
        assert_close(got[k], f(logits[k], *shared)[0], "float64", f"element {k}")
    calls, loops = ffi_calls(jax.jit(jax.vmap(lambda x: f(x, *shared)[0])).lower(logits).as_text())
    assert len(calls) == 1 and not loops


def test_nested_vmap_folds_twice():
    rng = np.random.default_rng(6)
    inputs, outputs, _, _ = case_rnnt("float64", rng)
    f = jaxify(inputs, outputs)
    grid = [[case_rnnt("float64", rng)[2][0] for _ in range(2)] for _ in range(M)]
    stacked = [np.stack([np.stack([e[i] for e in row]) for row in grid]) for i in range(4)]
    mapped = jax.jit(jax.vmap(jax.vmap(f)))
    got = mapped(*stacked)[0]
    for k in range(M):
        for m in range(2):
            assert_close(got[k, m], f(*grid[k][m])[0], "float64", f"element {k}, {m}")
    calls, loops = ffi_calls(mapped.lower(*stacked).as_text())
    assert len(calls) == 1 and not loops


def test_a_map_over_an_input_without_batch_axis_runs_one_call_per_element():
    """The HMM's transitions are shared by its sequences: mapping them cannot fold, so each element is one call
    (JAX's ``sequential``) — and the results still equal the loop."""
    rng = np.random.default_rng(8)
    T, B, K = 5, 2, 3
    le, lA, lpi, lf = hmm_data(rng, T, B, K)
    le_s, lA_s = pt.tensor3("le", shape=(T, B, K)), pt.matrix("lA", shape=(K, K))
    f = jaxify([le_s, lA_s], [ptnative.hmm_log_likelihood(le_s, lA_s, lpi, lf)])
    lAs = np.stack([lA + 0.1 * k for k in range(M)])
    mapped = jax.jit(jax.vmap(lambda a: f(le, a)[0]))
    got = mapped(lAs)
    for k in range(M):
        assert_close(got[k], f(le, lAs[k])[0], "float64", f"element {k}")
    calls, loops = ffi_calls(mapped.lower(lAs).as_text())
    assert len(calls) == 1 and loops  # one call site, inside the loop over elements


def test_an_op_without_batch_axes_keeps_one_call_per_element():
    op = NativeOp(in_info=[{"name": "x", "ndim": 1, "shape": (None,), "need_contiguous": True}],
                  out_info=[{"name": "y", "ndim": 1, "shape": ((0, 0),), "need_contiguous": True}],
                  c_fw_code="Ndarray_memcpy(Ndarray_DEV_DATA(*outputs[0]), Ndarray_DEV_DATA(inputs[0]), "
                            "Ndarray_SIZE(inputs[0]) * sizeof(Float));", name="VmapCopyNoBatchAxis")
    x = pt.dvector("x")
    f = jaxify([x], [op(x)])
    xs = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(jax.vmap(f)(xs)[0], xs)
    calls, loops = ffi_calls(jax.jit(jax.vmap(f)).lower(xs).as_text())
    assert len(calls) == 1 and loops


def test_batch_axis_is_carried_into_the_gradient_spec():
    grad_kwargs = HmmForwardBackwardOp.make_op().kwargs_for_grad_op()
    axes = {i["name"]: i.get("batch_axis") for i in grad_kwargs["in_info"]}
    assert axes == {"log_emissions": 1, "log_transitions": None, "log_initial": None, "log_final": None,
                    "mask": 1, "D_log_likelihood": 0}
    assert [i.get("batch_axis") for i in grad_kwargs["out_info"]] == [1, None, None, None]
    # An override of the shape without a batch axis drops it; one that names it keeps it.
    grad_out = SparseToDense.make_op().kwargs_for_grad_op()["out_info"]
    assert [i.get("batch_axis") for i in grad_out] == [1, 1]
    spec = dict(CtcFsaLossOp.in_info[0], bw_out_var={"shape": ((0, 0), (0, 1), (0, 2))})
    op = NativeOp(in_info=[spec, *CtcFsaLossOp.in_info[1:]], out_info=CtcFsaLossOp.out_info, c_fw_code=";",
                  c_bw_code=";", name="BatchAxisOverride")
    assert "batch_axis" not in op.kwargs_for_grad_op()["out_info"][0]


IN = {"name": "x", "ndim": 2, "shape": (None, None), "batch_axis": 1}
OUT = {"name": "y", "ndim": 1, "shape": ((0, 1),), "batch_axis": 0}


@pytest.mark.parametrize("in_info, out_info, match", [
    ([dict(IN, batch_axis=-1)], [OUT], r"in_info 'x' \(#0\), key 'batch_axis': a non-negative int"),
    ([dict(IN, batch_axis="1")], [OUT], r"key 'batch_axis': a non-negative int \(a dimension\) is required, got '1'"),
    ([dict(IN, batch_axis=True)], [OUT], r"key 'batch_axis': a non-negative int"),
    ([dict(IN, batch_axis=2)], [OUT], r"in_info 'x' \(#0\), key 'batch_axis': 2 is not a dimension of this 2-d"),
    ([IN], [dict(OUT, shape=((0, 0),))], r"out_info 'y' \(#0\), key 'batch_axis': dim 0 has size \(0, 0\), which "
                                         r"is not the batch axis of an input"),
    ([IN], [dict(OUT, shape=(4,))], r"key 'batch_axis': dim 0 has size 4"),
    ([dict(IN, batch_axis=0)], [OUT], r"out_info 'y' \(#0\), key 'batch_axis': dim 0 has size \(0, 1\)"),
    ([dict(IN, want_inplace=0)], [{"name": "y", "ndim": 2, "shape": ((0, 0), (0, 1))}],
     r"in_info 'x' \(#0\), key 'want_inplace': output 0 has batch_axis None, the input has 1"),
    ([dict(IN, bw_out_var={"batch_axis": "a"})], [OUT], r"key 'bw_out_var': override 'batch_axis': a non-negative"),
])
def test_bad_batch_axis_is_a_spec_error(in_info, out_info, match):
    with pytest.raises(ValueError, match=r"NativeOp 'BadAxis': .*" + match):
        NativeOp(in_info=in_info, out_info=out_info, c_fw_code=";", name="BadAxis")


def test_batch_axis_does_not_change_the_kernel_source():
    from ptnative.source import generate

    plain = NativeOp(in_info=[{k: v for k, v in IN.items() if k != "batch_axis"}],
                     out_info=[{k: v for k, v in OUT.items() if k != "batch_axis"}], c_fw_code=";", name="Axis")
    declared = NativeOp(in_info=[IN], out_info=[OUT], c_fw_code=";", name="Axis")
    assert plain != declared
    assert generate(plain, "float64").source == generate(declared, "float64").source


@pytest.mark.parametrize("n_map, batch", [(2, 0), (0, 3)])
def test_empty_map_or_empty_batch(n_map, batch):
    T, D, N = 5, 4, 2
    logits = pt.tensor3("logits", shape=(T, None, D), dtype="float64")
    ins = [logits, pt.ivector("lens"), pt.imatrix("targets", shape=(None, N)), pt.ivector("tlens")]
    f = jaxify(ins, [ptnative.ctc_loss(*ins, blank_index=0)])
    args = (np.zeros((n_map, T, batch, D)), np.full((n_map, batch), T, "int32"),
            np.ones((n_map, batch, N), "int32"), np.ones((n_map, batch), "int32"))
    assert jax.vmap(f)(*args)[0].shape == (n_map, batch)
    assert jax.vmap(jax.grad(lambda *a: f(*a)[0].sum()))(*args).shape == (n_map, T, batch, D)
