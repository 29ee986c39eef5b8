"""Bad inputs for the explicit-duration HMM functions (``hsmm_log_likelihood``, ``hsmm_viterbi``,
``hsmm_posteriors``, ``hsmm_sample_states``): their harnesses for tests/fuzz_cases.py (which lists them in ``HARNESSES``).  Comparisons go through ``fuzz_cases.equal`` (the CUDA
emulation's fuzz run replaces it)."""

from __future__ import annotations

import numpy as np

from . import fuzz_cases as fc

INF, NAN = np.inf, np.nan


class HsmmH(fc.Harness):
    name = "hsmm_log_likelihood"
    outputs = {"log_likelihood": 0, "d_log_emissions": 1, "d_log_transitions": None, "d_log_durations": None,
               "d_log_initial": None}
    LENS = [5, 3, 1]

    def fn(self):
        from ptnative.ops import hsmm

        return getattr(hsmm, self.name)

    def symbols(self):
        pt = fc._pt()
        return [pt.tensor3("log_emissions"), pt.matrix("log_transitions"), pt.matrix("log_durations"),
                pt.vector("log_initial"), pt.matrix("mask")]

    def graph(self, le, lA, ld, lpi, mask):
        import pytensor

        ll = self.fn()(le, lA, ld, lpi, mask)
        return [ll, *pytensor.grad(ll.sum(), [le, lA, ld, lpi])]

    def valid(self):
        r = np.random.default_rng(8)
        K, D = 3, 4
        return [r.normal(size=(5, 3, K)), np.log(r.dirichlet(np.ones(K), size=K)),
                np.log(r.dirichlet(np.ones(D), size=K)), np.log(r.dirichlet(np.ones(K))), fc.mask_of(self.LENS, 5)]

    def check_reference(self, vals, got):
        from .reference import hsmm as ref

        lens = vals[4].sum(axis=0).astype(int)
        fc.equal(got[0], ref.brute_force(*vals[:4], lens)[0], "log_likelihood", exact=False)

    def check_nan(self, got, b):
        L = self.LENS[b]
        assert np.isnan(got[0][b]) and np.isnan(got[1][:L, b]).all(), f"sequence {b} with a NaN input: {got[0]}"

    def runtime_cases(self):
        def ref_check(**changes):
            def run():
                vals = self.with_values(**changes)
                self.check_reference(vals, self(*vals))
            return run

        def nan_emission():
            got = self(*self.with_values(log_emissions=lambda a: fc._set(a, (1, 0, 0), NAN)))
            self.check_nan(got, 0)
            fc.same_batch_entries(got, self.clean(), self.batch_axes, [1, 2], self.output_names)

        def nan_shared(arg, idx):
            def run():
                got = self(*self.with_values(**{arg: lambda a: fc._set(a, idx, NAN)}))
                for b in range(3):  # every sequence has a frame
                    self.check_nan(got, b)
            return run

        def unchanged(arg, idx, v):
            def run():
                got = self(*self.with_values(**{arg: lambda a: fc._set(a, idx, v)}))
                fc.all_equal(got, self.clean(), [f"{n} with {v} on {arg}{list(idx)}" for n in self.output_names])
            return run

        def bad(arg, idx, v):
            return self.rejected(arg, lambda a: fc._set(a, idx, v))

        def mismatch(arg, value):
            return lambda: fc.expect_error(lambda: self(*self.with_values(**{arg: value})), [self.name, arg])

        return [
            ("valid:reference", ref_check()),
            ("inf:log_durations_neg", ref_check(log_durations=lambda a: fc._set(a, (slice(None), 0), -INF))),
            ("inf:log_transitions_neg", ref_check(log_transitions=lambda a: fc._set(a, (0, 1), -INF))),
            ("zero_length:sequence", ref_check(mask=fc.mask_of([5, 0, 1], 5))),
            ("zero_length:T0", ref_check(log_emissions=np.zeros((0, 3, 3)), mask=np.zeros((0, 3)))),
            ("empty_batch:B0", ref_check(log_emissions=np.zeros((5, 0, 3)), mask=np.zeros((5, 0)))),
            ("nan:log_emissions", nan_emission),
            ("nan:log_emissions_padded_frame", unchanged("log_emissions", (4, 1, 0), NAN)),
            ("nan:log_transitions_diagonal", unchanged("log_transitions", (1, 1), NAN)),
            ("inf:log_transitions_diagonal", unchanged("log_transitions", (2, 2), INF)),
            ("nan:log_transitions", nan_shared("log_transitions", (0, 1))),
            ("nan:log_durations", nan_shared("log_durations", (0, 2))),
            ("nan:log_initial", nan_shared("log_initial", (1,))),
            ("inf:log_emissions_pos", bad("log_emissions", (1, 0, 0), INF)),
            ("inf:log_transitions_pos", bad("log_transitions", (0, 2), INF)),
            ("inf:log_durations_pos", bad("log_durations", (1, 3), INF)),
            ("inf:log_initial_pos", bad("log_initial", (0,), INF)),
            ("bad_value:mask_not_prefix", bad("mask", (3, 2), 1.0)),
            ("bad_value:mask_not_01", bad("mask", (0, 0), 0.5)),
            ("shape_mismatch:log_transitions", mismatch("log_transitions", np.zeros((4, 4)))),
            ("shape_mismatch:log_durations", mismatch("log_durations", np.zeros((4, 4)))),
            ("shape_mismatch:log_initial", mismatch("log_initial", np.zeros(2))),
            ("shape_mismatch:mask", mismatch("mask", np.ones((5, 2)))),
        ]

    def build_cases(self):
        pt = fc._pt()
        fn = self.fn()
        return [
            ("wrong_ndim:log_durations", lambda: fc.expect_error(
                lambda: fn(pt.tensor3(), pt.matrix(), pt.vector(), pt.vector()), [self.name, "log_durations"])),
            ("wrong_ndim:log_transitions", lambda: fc.expect_error(
                lambda: fn(pt.tensor3(), pt.vector(), pt.matrix(), pt.vector()), [self.name, "log_transitions"])),
            ("wrong_dtype:log_emissions", lambda: fc.expect_error(
                lambda: fn(pt.tensor3(dtype="complex128"), pt.matrix(), pt.matrix(), pt.vector()),
                [self.name, "log_emissions"])),
        ]


class HsmmViterbiH(HsmmH):
    name = "hsmm_viterbi"
    outputs = {"path": 1, "score": 0}

    def graph(self, le, lA, ld, lpi, mask):
        return list(self.fn()(le, lA, ld, lpi, mask))

    def check_reference(self, vals, got):
        from .reference import hsmm as ref

        lens = vals[4].sum(axis=0).astype(int)
        _, score, best = ref.brute_force(*vals[:4], lens)
        fc.equal(got[1], score, "score", exact=False)
        for b, L in enumerate(lens):
            assert (got[0][L:, b] == -1).all(), f"path of sequence {b} on padded frames: {got[0][:, b]}"
            assert tuple(got[0][:L, b]) in best[b] or not best[b], f"path of sequence {b}: {got[0][:, b]}"

    def check_nan(self, got, b):
        assert np.isnan(got[1][b]), f"score of sequence {b} with a NaN input: {got[1][b]}"
        fc.equal(got[0][:, b], np.full(got[0].shape[0], -1, np.int32), f"path of sequence {b} with a NaN input")


class HsmmPosteriorsH(HsmmH):
    name = "hsmm_posteriors"
    outputs = {"marginals": 1}

    def graph(self, le, lA, ld, lpi, mask):
        return [self.fn()(le, lA, ld, lpi, mask)]

    def check_reference(self, vals, got):
        from .reference import hsmm as ref

        lens = vals[4].sum(axis=0).astype(int)
        fc.equal(got[0], ref.marginals_brute_force(*vals[:4], lens), "marginals", exact=False)

    def check_nan(self, got, b):
        L = self.LENS[b]
        assert np.isnan(got[0][:L, b]).all(), f"marginals of sequence {b} with a NaN input: {got[0][:, b]}"


class HsmmSampleH(HsmmH):
    name = "hsmm_sample_states"
    outputs = {"path": 1}

    def fn(self):
        """hsmm_sample_states with symbolic uniforms by default (the build cases pass none)."""
        import functools

        return functools.partial(super().fn(), uniforms=fc._pt().matrix("uniforms"))

    def symbols(self):
        return super().symbols() + [fc._pt().matrix("uniforms")]

    def valid(self):
        return super().valid() + [np.random.default_rng(19).random((5, 3))]

    def graph(self, le, lA, ld, lpi, mask, uniforms):
        return [self.fn()(le, lA, ld, lpi, mask, uniforms=uniforms)]

    def check_reference(self, vals, got):
        from .reference import hsmm as ref

        lens = vals[4].sum(axis=0).astype(int)
        fc.equal(got[0], ref.sample_states(*vals[:4], lens, vals[5]), "path")

    def check_nan(self, got, b):
        fc.equal(got[0][:, b], np.full(got[0].shape[0], -1, np.int32), f"path of sequence {b} with a NaN input")

    def runtime_cases(self):
        def bad_uniform(v):
            return lambda: fc.expect_error(
                lambda: self(*self.with_values(uniforms=lambda a: fc._set(a, (1, 0), v))), [self.name, "uniforms"])

        def empty(T, B):
            def run():
                vals = self.with_values(log_emissions=np.zeros((T, B, 3)), mask=np.zeros((T, B)),
                                        uniforms=np.zeros((T, B)))
                self.check_reference(vals, self(*vals))
            return run

        cases = [c for c in super().runtime_cases() if c[0] not in ("zero_length:T0", "empty_batch:B0")]
        return cases + [
            ("out_of_range_label:uniform_1", bad_uniform(1.0)),
            ("out_of_range_label:uniform_negative", bad_uniform(-0.1)),
            ("nan:uniforms", bad_uniform(NAN)),
            ("valid:uniform_on_padded_frame_ignored", lambda: fc.all_equal(
                self(*self.with_values(uniforms=lambda a: fc._set(a, (4, 1), 7.0))), self.clean(), ["path"])),
            ("shape_mismatch:uniforms", lambda: fc.expect_error(
                lambda: self(*self.with_values(uniforms=np.zeros((4, 3)))), [self.name, "uniforms"])),
            ("zero_length:T0", empty(0, 3)),
            ("empty_batch:B0", empty(5, 0)),
        ]


HARNESSES = (HsmmH, HsmmViterbiH, HsmmPosteriorsH, HsmmSampleH)
