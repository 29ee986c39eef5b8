"""Checks of native ops under JAX on several devices, run by tests/test_jax_scaling.py in a fresh process whose
``XLA_FLAGS`` force 4 host devices (the flag must be set before JAX is imported, so the rest of the suite keeps
one device).  ``python -m tests.jax_multidevice CHECK [DTYPE]``; exit status 0 when every case of the check agrees.

* ``cases DTYPE``: every graph of tests/gpu/cases.py (outputs, and ``jax.grad`` of its costs) on a stack of 4
  different value sets: under ``jit`` + ``vmap``, under ``shard_map`` of ``vmap`` (one set per device), and under
  ``jit`` + ``vmap`` with the stack placed with a ``NamedSharding`` — each equal to the 4 unbatched calls.
* ``batch_axis``: ``ctc_loss``, ``hmm_log_likelihood``, ``rnnt_loss`` and ``lstm`` (and their gradients) with the
  op's own batch axis sharded over the 4 devices by ``shard_map``, equal to the unsharded call.
"""

from __future__ import annotations

import sys

import jax
import numpy as np
import pytensor.tensor as pt
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import ptnative

from .gpu.cases import CASES, CASES_BY_NAME
from .test_fsa import hmm_data, mask_of
from .test_jax_grad import assert_close, build, jaxify
from .test_rnnt import rnnt_data

N_DEVICES = 4


def shard_map(f, mesh, in_specs, out_specs):
    """``jax.shard_map`` (``jax.experimental.shard_map`` before JAX 0.7)."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    from jax.experimental.shard_map import shard_map as experimental
    return experimental(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def case_function(name, dtype):
    """(F, value sets): ``F(*values)`` returns the case's outputs and the ``jax.grad`` of each first-order cost;
    4 value sets differ in the cost weights and (slightly) in the differentiated inputs."""
    inputs, values, outputs, costs = build(name, dtype)
    f_out = jaxify(inputs, outputs)
    grad_fns = []
    for cost, positions, _ in costs:
        fc = jaxify(inputs, [cost])
        grad_fns.append(jax.grad(lambda *xs, fc=fc: fc(*xs)[0], argnums=positions))

    def F(*xs):
        return [*f_out(*xs), *(g for grad in grad_fns for g in grad(*xs))]

    varied = {p for _, positions, _ in costs for p in positions}
    varied |= {i for i, v in enumerate(inputs) if v.name and v.name.startswith("w") and "_" in v.name}
    rng = np.random.default_rng(7)
    sets = []
    for k in range(N_DEVICES):
        vs = [np.asarray(v) for v in values]
        for i in varied:
            vs[i] = (vs[i] + 0.05 * k * rng.normal(size=vs[i].shape)).astype(vs[i].dtype)
        sets.append(vs)
    return F, sets


def check_cases(dtype):
    mesh = Mesh(np.array(jax.devices()[:N_DEVICES]), ("b",))
    failures = []
    for name in (case.name for case in CASES):
        if dtype not in CASES_BY_NAME[name].dtypes and dtype != "float64":
            continue  # int-only cases run once, with the float64 ones
        try:
            F, sets = case_function(name, dtype)
            unbatched = jax.jit(F)  # traced before the batched forms, as a sampler re-traces a model
            want = [unbatched(*vs) for vs in sets]
            stacked = [np.stack([vs[i] for vs in sets]) for i in range(len(sets[0]))]
            n_out = len(want[0])
            batched = jax.jit(jax.vmap(F))
            sharded = jax.jit(shard_map(jax.vmap(F), mesh, P("b"), P("b")))
            placed = [jax.device_put(x, NamedSharding(mesh, P("b"))) for x in stacked]
            for how, got in (("jit(vmap)", batched(*stacked)), ("shard_map(vmap)", sharded(*stacked)),
                             ("jit(vmap) on NamedSharding inputs", batched(*placed))):
                assert len(got) == n_out
                for k in range(N_DEVICES):
                    for j in range(n_out):
                        assert_close(np.asarray(got[j])[k], want[k][j], dtype,
                                     f"{name} {dtype} {how}: set {k}, result {j}")
            print(f"ok {name} {dtype}")
        except Exception as e:  # report every case, then fail
            failures.append(name)
            print(f"FAILED {name} {dtype}: {type(e).__name__}: {e}")
    return failures


def batch_axis_graphs():
    """(name, inputs, values, outputs, cost, wrt, batch axis of each input, of each output then gradient) for
    catalogue functions, with ragged lengths such that some shards' longest sequence is shorter than the padding."""
    rng = np.random.default_rng(11)
    B = 8
    graphs = []

    T, D = 9, 5
    lens = np.array([9, 7, 4, 2, 9, 3, 5, 6], "int32")  # shards' longest sequences are shorter than T
    targets = rng.integers(1, D, size=(B, 3)).astype("int32")
    tlens = np.array([3, 2, 1, 1, 3, 0, 2, 2], "int32")
    # The batch dimensions are left unknown (None): under shard_map each device sees its shard's size.
    logits = pt.tensor3("logits", shape=(T, None, D))
    lens_s, targets_s, tlens_s = pt.ivector("lens"), pt.imatrix("t", shape=(None, 3)), pt.ivector("tl")
    loss = ptnative.ctc_loss(logits, lens_s, targets_s, tlens_s, blank_index=0)
    graphs.append(("ctc_loss", [logits, lens_s, targets_s, tlens_s], [rng.normal(size=(T, B, D)), lens, targets, tlens],
                   [loss], loss.sum(), [logits], [1, 0, 0, 0], [0, 1]))

    le, lA, lpi, lf = hmm_data(rng, T, B, 3, scale=2.0)
    le_s, m_s = pt.tensor3("le", shape=(T, None, 3)), pt.matrix("mask", shape=(T, None))
    ll = ptnative.hmm_log_likelihood(le_s, lA, lpi, lf, mask=m_s)
    graphs.append(("hmm_log_likelihood", [le_s, m_s], [le, mask_of(lens, T)],
                   [ll], ll.sum(), [le_s], [1, 1], [0, 1]))

    U, K, Tr = 3, 5, 7
    acts_v, labels, act_lens, label_lens = rnnt_data(B, Tr, U, K, 0, 0, "float64", seed=3)
    act_lens = np.array([7, 5, 3, 2, 7, 4, 1, 6], "int32")  # shards whose longest sequence is shorter than Tr
    label_lens = np.minimum(label_lens, act_lens).astype("int32")
    acts = pt.tensor4("acts", shape=(None, *acts_v.shape[1:]))
    ins = [acts, pt.imatrix("labels", shape=(None, labels.shape[1])), pt.ivector("al"), pt.ivector("ll")]
    costs = ptnative.rnnt_loss(*ins, blank=0)
    graphs.append(("rnnt_loss", ins, [acts_v, labels, act_lens, label_lens],
                   [costs], costs.sum(), [acts], [0, 0, 0, 0], [0, 0]))

    n_in, n = 3, 4
    x = pt.tensor3("x", shape=(T, None, n_in))
    mask = pt.matrix("m", shape=(T, None))
    W_in, W_rec, b = (rng.normal(size=s) * 0.4 for s in ((n_in, 4 * n), (n, 4 * n), (4 * n,)))
    y, _, _ = ptnative.lstm(x, W_in, W_rec, b, mask=mask)
    graphs.append(("lstm", [x, mask], [rng.normal(size=(T, B, n_in)), mask_of(lens, T)],
                   [y], (y ** 2).sum(), [x], [1, 1], [1, 1]))
    return graphs


def check_batch_axis():
    mesh = Mesh(np.array(jax.devices()[:N_DEVICES]), ("b",))
    failures = []
    for name, inputs, values, outputs, cost, wrt, in_axes, out_axes in batch_axis_graphs():
        try:
            f_out = jaxify(inputs, outputs)
            fc = jaxify(inputs, [cost])
            positions = [inputs.index(v) for v in wrt]
            grad = jax.grad(lambda *xs: fc(*xs)[0], argnums=positions)

            def F(*xs):
                return [*f_out(*xs), *grad(*xs)]

            want = F(*values)
            spec = [P(*([None] * a + ["b"])) for a in in_axes]
            out_spec = [P(*([None] * a + ["b"])) for a in out_axes]
            got = jax.jit(shard_map(F, mesh, tuple(spec), out_spec))(*values)
            for j, (a, b) in enumerate(zip(got, want)):
                assert_close(a, b, "float64", f"{name} sharded over its batch axis: result {j}")
            print(f"ok {name}")
        except Exception as e:
            failures.append(name)
            print(f"FAILED {name}: {type(e).__name__}: {e}")
    return failures


def main(argv):
    assert len(jax.devices()) >= N_DEVICES, f"{len(jax.devices())} devices; set XLA_FLAGS first"
    check = argv[0]
    failures = check_cases(argv[1]) if check == "cases" else check_batch_axis()
    print("failures:", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
