"""Bad inputs for every catalogue function, run by tests/fuzz_worker.py (one request per function and mode).

Each function has a :class:`Harness`: its symbolic inputs (named like the function's arguments), the graph
(the function's outputs and, where it is differentiable, a gradient), a valid batch, and its cases.  A case is
``(case_id, category, thunk)``; the thunk raises ``AssertionError`` when the result is neither a clear
exception nor the documented value.  Categories: ``nan``, ``inf``, ``empty_batch``, ``zero_length``,
``out_of_range_label``, ``out_of_range_length``, ``shape_mismatch``, ``wrong_dtype``, ``wrong_ndim``,
``non_contiguous``, ``negative_stride`` (plus ``bad_value`` for other documented value errors, and ``leak``:
resident memory over many failing and succeeding calls).

Every compiled graph is built once per (function, mode) with symbolic inputs, and all the run-time cases feed
it; the graph-build cases (``wrong_dtype``, ``wrong_ndim``, bad Python arguments) do not depend on the mode
and run in the default-mode request only.
"""

from __future__ import annotations

import re

import numpy as np

INF, NAN = np.inf, np.nan


# ----------------------------------------------------------------------------------------------- checks
def names_pattern(names):
    return "|".join(r"(?<![A-Za-z0-9_])" + re.escape(n) + r"(?![A-Za-z0-9_])" for n in names)


def expect_error(call, names, types=(ValueError, TypeError)):
    """``call()`` raises one of ``types`` whose message names the function ``names[0]`` (or is the op's own check of
    an input, "NativeOp '...': input 'x' ...") and, where ``names`` has more, one of the arguments ``names[1:]``: a
    message naming the function but another argument fails."""
    function, arguments = names[0], list(names[1:])
    try:
        call()
    except types as e:
        msg = str(e)
        if not (re.search(names_pattern([function]), msg) or msg.startswith("NativeOp '")):
            raise AssertionError(f"{type(e).__name__} does not name {function}: {msg[:600]}") from e
        if arguments and not re.search(names_pattern(arguments), msg):
            raise AssertionError(f"{type(e).__name__} does not name any of the arguments {arguments}: "
                                 f"{msg[:600]}") from e
        return
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"expected {'/'.join(t.__name__ for t in types)} naming one of {list(names)}, "
                             f"got {type(e).__name__}: {str(e)[:600]}") from e
    raise AssertionError(f"expected an error naming one of {list(names)}, nothing was raised")


def equal(got, want, what="output", exact=True, rtol=1e-10, atol=1e-12):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    same = (g == w) | (np.isnan(g) & np.isnan(w))
    if not exact:
        same |= np.abs(g - w) <= atol + rtol * np.abs(w)
    if not same.all():
        bad = np.argwhere(~same)[:4]
        raise AssertionError(f"{what}: {int((~same).sum())} of {same.size} entries differ, e.g. "
                             + ", ".join(f"{tuple(int(i) for i in k)}: {g[tuple(k)]!r} vs {w[tuple(k)]!r}"
                                         for k in bad))


def all_equal(got, want, names=None, skip=()):
    for k, (g, w) in enumerate(zip(got, want)):
        if k not in skip:
            equal(g, w, names[k] if names else f"output {k}")


def same_batch_entries(got, clean, axes, keep, names=None):
    """Outputs equal the clean run on the batch entries ``keep`` (``axes[k]`` is output k's batch axis)."""
    for k, (g, c) in enumerate(zip(got, clean)):
        if axes[k] is None:
            continue
        equal(np.take(g, keep, axis=axes[k]), np.take(c, keep, axis=axes[k]),
              f"{names[k] if names else k} (untouched batch entries)")


# ---------------------------------------------------------------------------------------------- harness
class Harness:
    """One catalogue function: ``symbols()``, ``graph(*symbols)``, ``valid(rng)`` and ``cases()``."""

    name = ""
    outputs: dict = {}  # each output's name: its batch axis (None: no batch axis)

    @property
    def output_names(self):
        return list(self.outputs)

    @property
    def batch_axes(self):
        return list(self.outputs.values())

    def __init__(self, mode, eager=False):
        self.mode = mode
        self.eager = eager  # graphs called through ptnative.eager.wrap (numpy arrays in, the default mode)
        self._compiled = {}
        self.rng = np.random.default_rng(0)

    # -- every harness defines symbols() (named like the function's arguments), graph(*symbols) and valid()
    def runtime_cases(self):
        return []

    def build_cases(self):
        return []

    # -- machinery
    def compile(self, key="main", builder=None):
        if key not in self._compiled:
            import pytensor

            if self.eager:
                from ptnative import eager

                self._compiled[key] = eager.wrap(builder or self.graph)
                return self._compiled[key]
            syms = self.symbols()
            outs = (builder or self.graph)(*syms)
            self._compiled[key] = pytensor.function(syms, list(outs), mode=self.mode, on_unused_input="ignore")
        return self._compiled[key]

    def __call__(self, *values, key="main", builder=None):
        return [np.asarray(o) for o in self.compile(key, builder)(*values)]

    def clean(self):
        if not hasattr(self, "_clean"):
            self._clean = self(*self.valid())
        return self._clean

    def with_values(self, **changes):
        """The valid values with some arguments replaced (by name, as in ``symbols()``)."""
        names = [s.name for s in self.symbols()]
        values = [v.copy() if isinstance(v, np.ndarray) else v for v in self.valid()]
        for k, v in changes.items():
            values[names.index(k)] = v(values[names.index(k)]) if callable(v) else v
        return values

    def rejected(self, arg, value, names=None):
        """A case: the valid values with ``arg`` replaced by ``value`` (a callable: applied to the valid value, as in
        ``with_values``) raise an error naming the function or one of ``names`` (default: ``arg`` alone)."""
        names = [arg] if names is None else names
        return lambda: expect_error(lambda: self(*self.with_values(**{arg: value})), [self.name, *names])

    def layout_cases(self):
        """Every array argument as a negative-stride view and as a non-contiguous view: same results.

        In the default (Numba) mode every new combination of array layouts compiles the graph again
        (seconds each), so there all arguments change layout at once, in three calls."""
        if self.mode is None:
            return self.combined_layout_cases()
        cases = []
        names = [s.name for s in self.symbols()]
        for k, (name, v) in enumerate(zip(names, self.valid())):
            if not isinstance(v, np.ndarray) or v.ndim == 0 or v.size < 2:
                continue

            def neg(k=k, v=v, name=name):
                vals = list(self.valid())
                view = v[::-1].copy()[::-1]
                assert view.strides[0] < 0
                vals[k] = view
                all_equal(self(*vals), self.clean(), self.output_names)

            def strided(k=k, v=v, name=name):
                vals = list(self.valid())
                big = np.repeat(v, 2, axis=v.ndim - 1)
                view = big[..., ::2]
                assert not view.flags.c_contiguous and np.array_equal(view, v)
                vals[k] = view
                all_equal(self(*vals), self.clean(), self.output_names)

            cases.append((f"negative_stride:{name}", neg))
            cases.append((f"non_contiguous:{name}", strided))
            if v.ndim >= 2:
                def fortran(k=k, v=v):
                    vals = list(self.valid())
                    vals[k] = np.asfortranarray(v)
                    all_equal(self(*vals), self.clean(), self.output_names)

                cases.append((f"non_contiguous:{name}_fortran", fortran))
        return cases

    def combined_layout_cases(self):
        def views(kind):
            out = []
            for v in self.valid():
                if not isinstance(v, np.ndarray) or v.ndim == 0 or v.size < 2:
                    out.append(v)
                elif kind == "negative_stride":
                    out.append(v[::-1].copy()[::-1])
                elif kind == "non_contiguous":
                    out.append(np.repeat(v, 2, axis=v.ndim - 1)[..., ::2])
                else:
                    out.append(np.asfortranarray(v) if v.ndim >= 2 else v[::-1].copy()[::-1])
            return out

        def run(kind):
            return lambda: all_equal(self(*views(kind)), self.clean(), self.output_names)

        return [("negative_stride:all_arguments", run("negative_stride")),
                ("non_contiguous:all_arguments", run("non_contiguous")),
                ("non_contiguous:all_arguments_fortran", run("fortran"))]

    def cases(self):
        out = [("valid:baseline", lambda: self.clean())]
        out += self.layout_cases() + self.runtime_cases()
        if self.mode is None:
            out += self.build_cases()
        return [(cid, cid.split(":")[0], fn) for cid, fn in out]


def _pt():
    import pytensor.tensor as pt

    return pt


def mask_of(lens, T):
    return (np.arange(T)[:, None] < np.asarray(lens)[None, :]).astype(np.float64)


# ------------------------------------------------------------------------------------------------- LSTM
class Lstm(Harness):
    """``lstm`` with both implementations (native2 and lowmem) in one graph."""

    name = "lstm"
    outputs = {"Y": 1, "final_c": 0, "final_y": 0, "Y_lowmem": 1, "final_c_lowmem": 0, "final_y_lowmem": 0, "dx": 1}
    T, B, NIN, N = 4, 3, 2, 2
    LENS = [4, 2, 3]

    def symbols(self):
        pt = _pt()
        return [pt.tensor3("x"), pt.matrix("W_in"), pt.matrix("W_rec"), pt.vector("b"), pt.matrix("y0"),
                pt.matrix("c0"), pt.matrix("mask")]

    def graph(self, x, W_in, W_rec, b, y0, c0, mask):
        import pytensor

        from ptnative.ops.lstm import lstm

        a = lstm(x, W_in, W_rec, b, y0, c0, mask)
        lo = lstm(x, W_in, W_rec, b, y0, c0, mask, impl="lowmem")
        return [*a, *lo, pytensor.grad(a[0].sum() + a[1].sum(), x)]

    def valid(self):
        r = np.random.default_rng(1)
        T, B, NIN, N = self.T, self.B, self.NIN, self.N
        return [r.normal(size=(T, B, NIN)), r.normal(size=(NIN, 4 * N)), r.normal(size=(N, 4 * N)) * 0.5,
                r.normal(size=4 * N), r.normal(size=(B, N)), r.normal(size=(B, N)), mask_of(self.LENS, T)]

    def runtime_cases(self):
        from .reference import lstm as ref

        def nan_valid():
            got = self(*self.with_values(x=lambda x: _set(x, (1, 0, 0), NAN)))
            for k in (0, 3):
                assert np.isnan(got[k][1:, 0]).all(), f"{self.output_names[k]}: NaN in x[1, 0] must reach Y[1:, 0]"
            assert np.isnan(got[1][0]).all() and np.isnan(got[4][0]).all(), "final_c of sequence 0"
            same_batch_entries(got, self.clean(), self.batch_axes, [1, 2], self.output_names)

        def nan_padding():
            # x[3, 1] is padding (sequence 1 has 2 frames): Y is 0 there and c is carried
            got = self(*self.with_values(x=lambda x: _set(x, (3, 1, 0), NAN)))
            for k in range(6):
                equal(got[k], self.clean()[k], f"{self.output_names[k]} with NaN on a padded frame")

        def inf_x(sign):
            def run():
                vals = self.with_values(x=lambda x: _set(x, (0, 0, 0), sign * INF))
                got = self(*vals)
                x, W_in, W_rec, b, y0, c0, m = vals
                Y, C, H, d = ref.native_lstm2_forward(np.einsum("tbi,ij->tbj", x, W_in) + b, W_rec, y0, c0, m, 0, 1)
                equal(got[0], Y, "Y", exact=False)
                equal(got[1], d, "final_c", exact=False)
            return run

        def empty_batch():
            r = np.random.default_rng(2)
            vals = self.with_values(x=np.zeros((4, 0, 2)), y0=np.zeros((0, 2)), c0=np.zeros((0, 2)),
                                    mask=np.zeros((4, 0)))
            got = self(*vals)
            assert got[0].shape == (4, 0, 2) and got[1].shape == (0, 2) and got[6].shape == (4, 0, 2), \
                [g.shape for g in got]
            del r

        def zero_time():
            vals = self.with_values(x=np.zeros((0, 3, 2)), mask=np.zeros((0, 3)))
            got = self(*vals)
            equal(got[0], np.zeros((0, 3, 2)), "Y")
            for k in (1, 4):
                equal(got[k], vals[5], self.output_names[k] + " (= c0 when T = 0)")
            for k in (2, 5):
                equal(got[k], vals[4], self.output_names[k] + " (= y0 when T = 0)")

        def zero_length_sequence():
            vals = self.with_values(mask=lambda m: _set(m, (slice(None), 1), 0.0))
            got = self(*vals)
            for k in (0, 3):
                equal(got[k][:, 1], np.zeros((4, 2)), f"{self.output_names[k]} of an empty sequence")
            for k in (1, 4):
                equal(got[k][1], vals[5][1], "final_c of an empty sequence = c0")
            for k in (2, 5):
                equal(got[k][1], vals[4][1], "final_y of an empty sequence = y0")

        return [
            ("nan:x_valid_frame", nan_valid),
            ("nan:x_padded_frame", nan_padding),
            ("inf:x_pos", inf_x(1)),
            ("inf:x_neg", inf_x(-1)),
            ("empty_batch:B0", empty_batch),
            ("zero_length:T0", zero_time),
            ("zero_length:sequence", zero_length_sequence),
            ("shape_mismatch:mask", lambda: expect_error(
                lambda: self(*self.with_values(mask=np.ones((4, 4)))), ["lstm", "mask"])),
            ("shape_mismatch:W_rec", lambda: expect_error(
                lambda: self(*self.with_values(W_rec=np.ones((3, 8)))), ["lstm", "W_rec"])),
            ("shape_mismatch:y0", lambda: expect_error(
                lambda: self(*self.with_values(y0=np.ones((2, 2)))), ["lstm", "y0"])),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.lstm import lstm

        x, W_in, W_rec, b = pt.tensor3("x"), pt.matrix("W_in"), pt.matrix("W_rec"), pt.vector("b")
        return [
            ("wrong_ndim:x", lambda: expect_error(lambda: lstm(pt.matrix(), W_in, W_rec, b), ["lstm", "x"])),
            ("wrong_ndim:W_rec", lambda: expect_error(lambda: lstm(x, W_in, pt.vector(), b), ["lstm", "W_rec"])),
            ("wrong_ndim:mask", lambda: expect_error(lambda: lstm(x, W_in, W_rec, b, mask=pt.tensor3()),
                                                     ["lstm", "mask"])),
            ("wrong_dtype:x", lambda: expect_error(lambda: lstm(pt.itensor3(), W_in, W_rec, b), ["lstm", "x"])),
            ("bad_value:direction", lambda: expect_error(lambda: lstm(x, W_in, W_rec, b, direction=2),
                                                         ["lstm", "direction"])),
            ("bad_value:impl", lambda: expect_error(lambda: lstm(x, W_in, W_rec, b, impl="fast"), ["lstm", "impl"])),
        ]


def _set(a, idx, v):
    a = np.array(a, dtype=np.float64 if a.dtype.kind == "f" else a.dtype)
    a[idx] = v
    return a


class LstmCellH(Harness):
    name = "lstm_cell"
    outputs = {"c": 0, "h": 0, "dc_prev": 0, "dx": 0}

    def symbols(self):
        pt = _pt()
        return [pt.tensor3("c_prev"), pt.tensor3("x")]

    def graph(self, c_prev, x):
        import pytensor

        from ptnative.ops.lstm import lstm_cell

        c, h = lstm_cell(c_prev, x)
        return [c, h, *pytensor.grad(c.sum() + (h ** 2).sum(), [c_prev, x])]

    def valid(self):
        r = np.random.default_rng(3)
        return [r.normal(size=(3, 2, 2)), r.normal(size=(3, 8, 2))]

    def runtime_cases(self):
        from .reference import lstm as ref

        def nan():
            got = self(*self.with_values(x=lambda x: _set(x, (0, 0, 1), NAN)))  # cell input of unit 0
            assert np.isnan(got[0][0, 0, 1]) and np.isnan(got[1][0, 0, 1]), "NaN in x must reach c and h"
            same_batch_entries(got, self.clean(), self.batch_axes, [1, 2], self.output_names)

        def inf(sign):
            def run():
                vals = self.with_values(x=lambda x: _set(x, (1, 5, 0), sign * INF))  # input gate of unit 1
                got = self(*vals)
                c, h = ref.lstm_cell_forward(*vals)
                equal(got[0], c, "c", exact=False)
                equal(got[1], h, "h", exact=False)
            return run

        def shrinking_batch():
            vals = self.with_values(x=lambda x: x[:2].copy())
            got = self(*vals)
            c, h = ref.lstm_cell_forward(*vals)
            equal(got[0], c, "c", exact=False)
            equal(got[1], h, "h", exact=False)

        return [
            ("nan:x", nan),
            ("inf:x_pos", inf(1)),
            ("inf:x_neg", inf(-1)),
            ("valid:shrinking_batch", shrinking_batch),
            ("empty_batch:B0", lambda: _shapes(self(np.zeros((0, 2, 2)), np.zeros((0, 8, 2))),
                                               [(0, 2, 2), (0, 2, 2), (0, 2, 2), (0, 8, 2)])),
            ("zero_length:H0", lambda: _shapes(self(np.zeros((3, 0, 2)), np.zeros((3, 0, 2))),
                                               [(3, 0, 2), (3, 0, 2), (3, 0, 2), (3, 0, 2)])),
            ("out_of_range_length:x_longer_than_c_prev", lambda: expect_error(
                lambda: self(np.zeros((2, 2, 2)), np.zeros((3, 8, 2))), ["lstm_cell", "x", "c_prev"])),
            ("shape_mismatch:x_not_4H", lambda: expect_error(
                lambda: self(np.zeros((3, 2, 2)), np.zeros((3, 6, 2))), ["lstm_cell", "x", "c_prev"])),
            ("shape_mismatch:trailing", lambda: expect_error(
                lambda: self(np.zeros((3, 2, 2)), np.zeros((3, 8, 3))), ["lstm_cell", "x", "c_prev"])),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.lstm import lstm_cell

        return [
            ("wrong_dtype:x", lambda: expect_error(lambda: lstm_cell(pt.tensor3(), pt.itensor3()), ["lstm_cell", "x"])),
            ("wrong_ndim:c_prev", lambda: expect_error(lambda: lstm_cell(pt.vector(), pt.vector()),
                                                       ["lstm_cell", "c_prev"])),
            ("wrong_ndim:mismatch", lambda: expect_error(lambda: lstm_cell(pt.matrix(), pt.tensor3()),
                                                         ["lstm_cell", "c_prev", "x"])),
        ]


def _shapes(got, shapes):
    assert [g.shape for g in got] == [tuple(s) for s in shapes], f"shapes {[g.shape for g in got]}, expected {shapes}"


class TwoD(Harness):
    name = "twod_lstm"
    outputs = {"CompleteY": 2, "H": 2, "dX": 2, "dW": None}

    def symbols(self):
        pt = _pt()
        return [pt.tensor4("X"), pt.matrix("V_h"), pt.matrix("V_v"), pt.matrix("W"), pt.vector("b"),
                pt.matrix("sizes")]

    def graph(self, X, V_h, V_v, W, b, sizes):
        import pytensor

        from ptnative.ops.lstm import twod_lstm

        Y, H = twod_lstm(X, V_h, V_v, W, b, sizes)
        return [Y, H, *pytensor.grad((Y ** 2).sum(), [X, W])]

    def valid(self):
        r = np.random.default_rng(4)
        h, w, B, nin, n = 3, 2, 2, 2, 2
        return [r.normal(size=(h, w, B, nin)), r.normal(size=(n, 5 * n)) * 0.5, r.normal(size=(n, 5 * n)) * 0.5,
                r.normal(size=(nin, 5 * n)), r.normal(size=5 * n), np.array([[3.0, 2.0], [2.0, 1.0]])]

    def runtime_cases(self):
        from .reference import lstm as ref

        def nan():
            got = self(*self.with_values(X=lambda x: _set(x, (0, 0, 0, 0), NAN)))
            assert np.isnan(got[0][0, 0, 0]).all(), "NaN in X[0, 0, 0] must reach CompleteY[0, 0, 0]"
            same_batch_entries(got, self.clean(), self.batch_axes, [1], self.output_names)

        def nan_outside():
            # cell (2, 1) of pair 1 is outside its (2, 1) grid: its X is never used
            got = self(*self.with_values(X=lambda x: _set(x, (2, 1, 1, 0), NAN)))
            for k in (0, 2):
                equal(got[k][:, :, 1], self.clean()[k][:, :, 1], f"{self.output_names[k]} with NaN outside the grid")

        def inf(sign):
            def run():
                vals = self.with_values(X=lambda x: _set(x, (1, 0, 0, 1), sign * INF))
                got = self(*vals)
                Y, H = ref.twod_lstm_forward(*vals, np.zeros((1, 2, 2, 10)))
                equal(got[0], Y, "CompleteY", exact=False)
            return run

        def sizes_case(sizes, what):
            def run():
                vals = self.with_values(sizes=np.array(sizes, dtype=np.float64))
                try:
                    got = self(*vals)
                except ValueError as e:
                    if not re.search(names_pattern(["twod_lstm", "sizes"]), str(e)):
                        raise AssertionError(f"ValueError without the function or argument name: {e}") from e
                    return
                clipped = np.clip(np.nan_to_num(np.array(sizes), nan=0.0), 0, [[3, 2]])
                Y, H = ref.twod_lstm_forward(*vals[:5], clipped, np.zeros((1, 2, 2, 10)))
                equal(got[0], Y, f"CompleteY with sizes {what} (documented: cells outside the grid do not exist)",
                      exact=False)
            return run

        return [
            ("nan:X", nan),
            ("nan:X_outside_grid", nan_outside),
            ("inf:X_pos", inf(1)),
            ("inf:X_neg", inf(-1)),
            ("zero_length:pair", lambda: self._zero_pair()),
            ("empty_batch:B0", lambda: _shapes(
                self(*self.with_values(X=np.zeros((3, 2, 0, 2)), sizes=np.zeros((0, 2))))[:2],
                [(3, 2, 0, 2), (3, 2, 0, 10)])),
            ("zero_length:grid", lambda: _shapes(
                self(*self.with_values(X=np.zeros((0, 2, 2, 2)), sizes=np.zeros((2, 2))))[:3],
                [(0, 2, 2, 2), (0, 2, 2, 10), (0, 2, 2, 2)])),
            ("out_of_range_length:sizes_too_big", sizes_case([[5.0, 9.0], [2.0, 1.0]], "beyond the grid")),
            ("out_of_range_length:sizes_negative", sizes_case([[-1.0, 2.0], [2.0, 1.0]], "negative")),
            ("nan:sizes", sizes_case([[NAN, 2.0], [2.0, 1.0]], "NaN")),
            ("shape_mismatch:V_h", lambda: expect_error(
                lambda: self(*self.with_values(V_h=np.zeros((2, 8)))), ["twod_lstm", "V_h"])),
            ("shape_mismatch:sizes", lambda: expect_error(
                lambda: self(*self.with_values(sizes=np.ones((3, 2)))), ["twod_lstm", "sizes"])),
        ]

    def _zero_pair(self):
        got = self(*self.with_values(sizes=np.array([[3.0, 2.0], [0.0, 0.0]])))
        equal(got[0][:, :, 1], np.zeros((3, 2, 2)), "CompleteY of an empty pair")
        equal(got[2][:, :, 1], np.zeros((3, 2, 2)), "dX of an empty pair")

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.lstm import twod_lstm

        m = pt.matrix
        return [
            ("wrong_ndim:X", lambda: expect_error(lambda: twod_lstm(pt.tensor3(), m(), m(), m(), pt.vector(), m()),
                                                  ["twod_lstm", "X"])),
            ("wrong_dtype:X", lambda: expect_error(lambda: twod_lstm(pt.itensor4(), m(), m(), m(), pt.vector(), m()),
                                                   ["twod_lstm", "X"])),
        ]


# -------------------------------------------------------------------------------------------- automata
def ctc_automaton(targets, tlens, blank):
    import pytensor

    from ptnative.ops import fsa

    pt = _pt()
    tg, tl = pt.imatrix("targets"), pt.ivector("tlens")
    f = pytensor.function([tg, tl], list(fsa.get_ctc_fsa_fast_bw(tg, tl, blank)), mode="FAST_COMPILE")
    return [np.asarray(v) for v in f(np.asarray(targets, np.int32), np.asarray(tlens, np.int32))]


class FsaFunction(Harness):
    """A function of ``ptnative.ops.fsa`` (named ``name``) whose outputs are the graph of its symbols."""

    def graph(self, *symbols):
        from ptnative.ops import fsa

        return getattr(fsa, self.name)(*symbols)

    @staticmethod
    def automaton_symbols():
        pt = _pt()
        return [pt.imatrix("edges"), pt.vector("weights"), pt.imatrix("start_end_states")]

    def automaton(self):
        """The values of ``automaton_symbols()``: the CTC automaton of the labels [1, 2] and [2] (blank 0), its
        weights float64; built once."""
        if not hasattr(self, "_fsa"):
            edges, weights, se = ctc_automaton([[1, 2], [2, 0]], [2, 1], 0)
            self._fsa = [edges, weights.astype(np.float64), se]
        return self._fsa

    def bad_edges(self, row, value):
        """A case: ``edges[row, 0] = value`` raises an error naming the function or ``edges``."""
        def change(e):
            e = e.copy()
            e[row, 0] = value
            return e
        return lambda: expect_error(lambda: self(*self.with_values(edges=change)), [self.name, "edges"])


class CtcFsa(FsaFunction):
    name = "get_ctc_fsa_fast_bw"
    outputs = {"edges": None, "weights": None, "start_end_states": None}

    def symbols(self):
        pt = _pt()
        return [pt.imatrix("targets"), pt.ivector("seq_lens"), pt.iscalar("blank_idx")]

    def valid(self):
        return [np.array([[1, 2, 2], [0, 0, 0], [2, 1, 0]], np.int32), np.array([3, 0, 2], np.int32), np.int32(3)]

    def runtime_cases(self):
        def bad_len(v):
            return lambda: expect_error(lambda: self(*self.with_values(seq_lens=np.array([v, 0, 2], np.int32))),
                                        ["get_ctc_fsa_fast_bw", "seq_lens"])

        def empty_batch():
            got = self(np.zeros((0, 3), np.int32), np.zeros(0, np.int32), np.int32(3))
            _shapes(got, [(4, 0), (0,), (2, 0)])

        def no_labels():
            got = self(np.zeros((2, 0), np.int32), np.zeros(2, np.int32), np.int32(0))
            _shapes(got, [(4, 10), (10,), (2, 2)])

        return [
            ("out_of_range_length:seq_lens_too_big", bad_len(4)),
            ("out_of_range_length:seq_lens_negative", bad_len(-1)),
            ("empty_batch:B0", empty_batch),
            ("zero_length:N0", no_labels),
            ("shape_mismatch:seq_lens", lambda: expect_error(
                lambda: self(*self.with_values(seq_lens=np.array([1, 1], np.int32))),
                ["get_ctc_fsa_fast_bw", "seq_lens", "targets"])),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.fsa import get_ctc_fsa_fast_bw

        return [
            ("wrong_dtype:targets", lambda: expect_error(lambda: get_ctc_fsa_fast_bw(pt.matrix(), pt.ivector(), 0),
                                                         ["get_ctc_fsa_fast_bw", "targets"])),
            ("wrong_ndim:seq_lens", lambda: expect_error(lambda: get_ctc_fsa_fast_bw(pt.imatrix(), pt.imatrix(), 0),
                                                         ["get_ctc_fsa_fast_bw", "seq_lens"])),
        ]


class FastBW(FsaFunction):
    name = "fast_baum_welch"
    outputs = {"fwdbwd": 1, "obs_scores": 1}
    LENS = [5, 3]

    def symbols(self):
        pt = _pt()
        return [pt.tensor3("am_scores"), *self.automaton_symbols(), pt.matrix("float_idx")]

    def valid(self):
        r = np.random.default_rng(5)
        return [r.random((5, 2, 3)) * 2, *self.automaton(), mask_of(self.LENS, 5)]

    def runtime_cases(self):
        from .reference import fsa as ref

        def nan_in(arg, idx):
            # documented: NaN in makes fwdbwd and obs_scores of that sequence NaN on its valid frames
            def run():
                got = self(*self.with_values(**{arg: lambda a: _set(a, idx, NAN)}))
                assert np.isnan(got[0][:5, 0]).all() and np.isnan(got[1][:5, 0]).all(), \
                    f"NaN in {arg} must make sequence 0 NaN on its valid frames"
                same_batch_entries(got, self.clean(), self.batch_axes, [1], self.output_names)
            return run

        def nan_padding():
            got = self(*self.with_values(am_scores=lambda a: _set(a, (4, 1, 0), NAN)))  # sequence 1 has 3 frames
            all_equal(got, self.clean(), [n + " with NaN on a padded frame" for n in self.output_names])

        def plus_inf():
            vals = self.with_values(am_scores=lambda a: _set(a, (1, 0, 1), INF))
            got = self(*vals)
            nll, post = ref.forward_backward_edges(vals[0], vals[1], vals[2], vals[3], self.LENS)
            valid = mask_of(self.LENS, 5)
            equal(got[1], valid * nll[None], "obs_scores vs the log-space forward-backward", exact=False)
            equal(np.where(valid[:, :, None] > 0, np.exp(-got[0]), 0), np.where(valid[:, :, None] > 0, post, 0),
                  "posteriors vs the log-space forward-backward", exact=False)

        def minus_inf(arg, idx):
            return self.rejected(arg, lambda a: _set(a, idx, -INF))

        def empty_batch():
            got = self(np.zeros((5, 0, 3)), np.zeros((4, 0), np.int32), np.zeros(0), np.zeros((2, 0), np.int32),
                       np.zeros((5, 0)))
            _shapes(got, [(5, 0, 3), (5, 0)])

        def zero_length():
            got = self(*self.with_values(float_idx=mask_of([5, 0], 5)))
            equal(got[1][:, 1], np.zeros(5), "obs_scores of a sequence without frames")
            assert np.isinf(got[0][:, 1]).all(), "fwdbwd of a sequence without frames is inf"
            same_batch_entries(got, self.clean(), self.batch_axes, [0], self.output_names)

        return [
            ("nan:am_scores", nan_in("am_scores", (1, 0, 1))),
            ("nan:weights", nan_in("weights", (0,))),
            ("nan:am_scores_padded_frame", nan_padding),
            ("inf:am_scores_pos", plus_inf),
            ("inf:am_scores_neg", minus_inf("am_scores", (1, 0, 1))),
            ("inf:weights_neg", minus_inf("weights", (0,))),
            ("out_of_range_label:emission", self.bad_edges(2, 3)),  # emission >= D
            ("out_of_range_label:emission_negative", self.bad_edges(2, -1)),
            ("out_of_range_label:state_negative", self.bad_edges(0, -1)),
            ("out_of_range_label:sequence", self.bad_edges(3, 2)),  # sequence >= B
            ("bad_value:float_idx_not_01", lambda: expect_error(
                lambda: self(*self.with_values(float_idx=lambda m: _set(m, (0, 0), 0.5))),
                ["fast_baum_welch", "float_idx"])),
            ("bad_value:float_idx_not_prefix", lambda: expect_error(
                lambda: self(*self.with_values(float_idx=lambda m: _set(m, (1, 1), 0.0))),
                ["fast_baum_welch", "float_idx"])),
            ("empty_batch:B0", empty_batch),
            ("zero_length:sequence", zero_length),
            ("shape_mismatch:float_idx", lambda: expect_error(
                lambda: self(*self.with_values(float_idx=np.ones((5, 3)))), ["fast_baum_welch", "float_idx"])),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.fsa import fast_baum_welch

        i, v = pt.imatrix, pt.vector
        return [
            ("wrong_dtype:edges", lambda: expect_error(
                lambda: fast_baum_welch(pt.tensor3(), pt.matrix(), v(), i(), pt.matrix()),
                ["fast_baum_welch", "edges"])),
            ("wrong_dtype:am_scores", lambda: expect_error(
                lambda: fast_baum_welch(pt.tensor3(dtype="complex128"), i(), v(), i(), pt.matrix()),
                ["fast_baum_welch", "am_scores"])),
            ("wrong_ndim:am_scores", lambda: expect_error(
                lambda: fast_baum_welch(pt.matrix(), i(), v(), i(), pt.matrix()), ["fast_baum_welch", "am_scores"])),
        ]


class FastViterbi(FsaFunction):
    name = "fast_viterbi"
    outputs = {"alignment": 1, "scores": 0}

    def symbols(self):
        pt = _pt()
        return [pt.tensor3("am_scores"), pt.ivector("am_seq_len"), *self.automaton_symbols()]

    def valid(self):
        r = np.random.default_rng(6)
        return [np.log(r.dirichlet(np.ones(3), size=(5, 2))), np.array([5, 3], np.int32), *self.automaton()]

    def runtime_cases(self):
        from .reference import fsa as ref

        def nan():
            # documented: a NaN score on a valid frame of b gives b the score NaN and the alignment 0
            got = self(*self.with_values(am_scores=lambda a: _set(a, (1, 0, 1), NAN)))
            assert np.isnan(got[1][0]), f"score of a sequence with a NaN score: {got[1][0]}"
            equal(got[0][:, 0], np.zeros(5, np.int32), "alignment of a sequence with a NaN score")
            same_batch_entries(got, self.clean(), self.batch_axes, [1], self.output_names)

        def minus_inf():
            vals = self.with_values(am_scores=lambda a: _set(a, (1, 0, 1), -INF))
            got = self(*vals)
            al, sc = ref.viterbi_brute(vals[0], vals[2], vals[3], vals[4], vals[1])
            equal(got[0], al, "alignment")
            equal(got[1], sc, "scores", exact=False)

        def bad_len(v):
            return lambda: expect_error(lambda: self(*self.with_values(am_seq_len=np.array([v, 3], np.int32))),
                                        ["fast_viterbi", "am_seq_len"])

        def zero_length():
            got = self(*self.with_values(am_seq_len=np.array([5, 0], np.int32)))
            equal(got[0][:, 1], np.zeros(5, np.int32), "alignment of an empty sequence")
            assert got[1][1] == -INF, f"score of an empty sequence without an empty path: {got[1][1]}"

        return [
            ("nan:am_scores", nan),
            ("inf:am_scores_neg", minus_inf),
            ("out_of_range_length:am_seq_len_too_big", bad_len(6)),
            ("out_of_range_length:am_seq_len_negative", bad_len(-1)),
            ("out_of_range_label:emission", self.bad_edges(2, 3)),
            ("out_of_range_label:state_negative", self.bad_edges(1, -2)),
            ("out_of_range_label:sequence", self.bad_edges(3, 5)),
            ("zero_length:sequence", zero_length),
            ("empty_batch:B0", lambda: _shapes(self(np.zeros((5, 0, 3)), np.zeros(0, np.int32),
                                                    np.zeros((4, 0), np.int32), np.zeros(0),
                                                    np.zeros((2, 0), np.int32)), [(5, 0), (0,)])),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.fsa import fast_viterbi

        return [
            ("wrong_dtype:am_seq_len", lambda: expect_error(
                lambda: fast_viterbi(pt.tensor3(), pt.vector(), pt.imatrix(), pt.vector(), pt.imatrix()),
                ["fast_viterbi", "am_seq_len"])),
            ("wrong_ndim:edges", lambda: expect_error(
                lambda: fast_viterbi(pt.tensor3(), pt.ivector(), pt.ivector(), pt.vector(), pt.imatrix()),
                ["fast_viterbi", "edges"])),
        ]


class Ctc(Harness):
    """``ctc_loss`` (and, with ``viterbi = True``, ``ctc_loss_viterbi``)."""

    name = "ctc_loss"
    viterbi = False
    outputs = {"loss": 0, "dlogits": 1, "loss_zero_infinity": 0}
    LENS = [6, 4, 5]
    TLENS = [2, 0, 2]

    def fn(self):
        from ptnative.ops import fsa

        return fsa.ctc_loss_viterbi if self.viterbi else fsa.ctc_loss

    def symbols(self):
        pt = _pt()
        return [pt.tensor3("logits"), pt.ivector("logits_seq_lens"), pt.imatrix("targets"),
                pt.ivector("targets_seq_lens")]

    def graph(self, logits, lens, targets, tlens):
        import pytensor

        loss = self.fn()(logits, lens, targets, tlens)
        return [loss, pytensor.grad(loss.sum(), logits), self.fn()(logits, lens, targets, tlens, zero_infinity=True)]

    def valid(self):
        r = np.random.default_rng(7)
        return [r.normal(size=(6, 3, 4)), np.array(self.LENS, np.int32),
                np.array([[1, 2], [0, 0], [2, 2]], np.int32), np.array(self.TLENS, np.int32)]

    def runtime_cases(self):
        from .reference import fsa as ref

        fn = self.name

        def nan_valid():
            got = self(*self.with_values(logits=lambda x: _set(x, (1, 0, 2), NAN)))
            assert np.isnan(got[0][0]), f"{fn}: NaN logit on a valid frame gave loss {got[0][0]} (must be NaN)"
            assert np.isnan(got[2][0]), f"{fn}(zero_infinity=True): NaN logit gave loss {got[2][0]} (must stay NaN)"
            assert np.isnan(got[1][:6, 0]).any(), f"{fn}: NaN logit gave a NaN-free gradient"
            same_batch_entries(got, self.clean(), self.batch_axes, [1, 2], self.output_names)

        def nan_padding():
            got = self(*self.with_values(logits=lambda x: _set(x, (5, 1, 0), NAN)))  # sequence 1 has 4 frames
            for k in range(3):
                equal(got[k], self.clean()[k], f"{self.output_names[k]} with NaN on a padded frame")

        def minus_inf():
            vals = self.with_values(logits=lambda x: _set(x, (2, 0, 0), -INF))
            got = self(*vals)
            if self.viterbi:
                assert np.isfinite(got[0][0]), f"a -inf logit of an unneeded class gave loss {got[0][0]}"
                assert np.isfinite(got[1]).all(), "gradient not finite"
                return
            nll, grad = ref.ctc_graves(vals[0], vals[1], vals[2], vals[3], 3)
            equal(got[0], nll, "loss vs Graves' recursion", exact=False)
            equal(got[1], grad, "gradient vs Graves' recursion", exact=False)

        def plus_inf():
            try:
                got = self(*self.with_values(logits=lambda x: _set(x, (2, 0, 0), INF)))
            except ValueError as e:
                if not re.search(names_pattern([fn, "logits"]), str(e)):
                    raise AssertionError(f"ValueError without the function or argument name: {e}") from e
                return
            assert not np.isfinite(got[0][0]), f"{fn}: a +inf logit gave the finite loss {got[0][0]}"
            same_batch_entries(got, self.clean(), self.batch_axes, [1, 2], self.output_names)

        def empty_alignment():
            # T_b = 0 and L_b = 0: the empty alignment has probability 1 (issue 14, item 6)
            got = self(*self.with_values(logits_seq_lens=np.array([6, 0, 5], np.int32)))
            assert got[0][1] == 0 and got[2][1] == 0, f"{fn}: T_b = L_b = 0 gave loss {got[0][1]} (must be 0)"
            equal(got[1][:, 1], np.zeros((6, 4)), "gradient of the empty alignment")
            same_batch_entries(got, self.clean(), self.batch_axes, [0, 2], self.output_names)

        def empty_time():
            got = self(np.zeros((0, 2, 4)), np.zeros(2, np.int32), np.zeros((2, 1), np.int32),
                       np.zeros(2, np.int32))
            equal(got[0], np.zeros(2), f"{fn} over T = 0 with empty targets (must be 0)")
            _shapes(got, [(2,), (0, 2, 4), (2,)])

        def no_frames_for_labels():
            got = self(*self.with_values(logits_seq_lens=np.array([0, 4, 5], np.int32)))
            assert got[0][0] == INF and got[2][0] == 0, f"{fn}: L_b = 2 over 0 frames: {got[0][0]}, {got[2][0]}"
            same_batch_entries(got, self.clean(), self.batch_axes, [1, 2], self.output_names)

        return [
            ("nan:logits_valid_frame", nan_valid),
            ("nan:logits_padded_frame", nan_padding),
            ("inf:logits_neg", minus_inf),
            ("inf:logits_pos", plus_inf),
            ("zero_length:empty_alignment", empty_alignment),
            ("zero_length:T0", empty_time),
            ("zero_length:no_frames_for_labels", no_frames_for_labels),
            ("empty_batch:B0", lambda: _shapes(self(np.zeros((6, 0, 4)), np.zeros(0, np.int32),
                                                    np.zeros((0, 2), np.int32), np.zeros(0, np.int32)),
                                               [(0,), (6, 0, 4), (0,)])),
            ("out_of_range_length:logits_seq_lens_too_big",
             self.rejected("logits_seq_lens", np.array([7, 4, 5], np.int32))),
            ("out_of_range_length:logits_seq_lens_negative",
             self.rejected("logits_seq_lens", np.array([-1, 4, 5], np.int32))),
            ("out_of_range_length:targets_seq_lens_too_big",
             self.rejected("targets_seq_lens", np.array([3, 0, 2], np.int32))),
            ("out_of_range_length:targets_seq_lens_negative",
             self.rejected("targets_seq_lens", np.array([-1, 0, 2], np.int32))),
            ("out_of_range_label:targets_too_big",
             self.rejected("targets", np.array([[1, 4], [0, 0], [2, 2]], np.int32))),
            ("out_of_range_label:targets_negative",
             self.rejected("targets", np.array([[1, -1], [0, 0], [2, 2]], np.int32))),
            ("shape_mismatch:batch",
             self.rejected("logits_seq_lens", np.array([6, 4], np.int32), ["logits_seq_lens", "logits"])),
        ]

    def build_cases(self):
        pt = _pt()
        import pytensor

        fn = self.fn()
        x, l_, t, tl = pt.tensor3("x"), pt.ivector(), pt.imatrix(), pt.ivector()

        def bad_blank():
            loss = fn(x, l_, t, tl, blank_index=4)
            f = pytensor.function([x, l_, t, tl], loss, mode="FAST_COMPILE")
            f(np.zeros((6, 3, 4)), *self.valid()[1:])

        return [
            ("wrong_dtype:targets", lambda: expect_error(lambda: fn(x, l_, pt.matrix(), tl), [self.name, "targets"])),
            ("wrong_dtype:logits_seq_lens", lambda: expect_error(lambda: fn(x, pt.vector(), t, tl),
                                                                 [self.name, "logits_seq_lens"])),
            ("wrong_ndim:logits", lambda: expect_error(lambda: fn(pt.matrix(), l_, t, tl), [self.name, "logits"])),
            ("wrong_ndim:targets", lambda: expect_error(lambda: fn(x, l_, pt.ivector(), tl), [self.name, "targets"])),
            ("out_of_range_label:blank_index", lambda: expect_error(bad_blank, [self.name, "blank_index"])),
        ]


class CtcViterbi(Ctc):
    name = "ctc_loss_viterbi"
    viterbi = True


class Hmm(Harness):
    name = "hmm_log_likelihood"
    outputs = {"log_likelihood": 0, "d_log_emissions": 1, "d_log_transitions": None, "d_log_initial": None,
               "d_log_final": None}

    def symbols(self):
        pt = _pt()
        return [pt.tensor3("log_emissions"), pt.matrix("log_transitions"), pt.vector("log_initial"),
                pt.vector("log_final"), pt.matrix("mask")]

    def graph(self, le, lA, lpi, lf, mask):
        import pytensor

        from ptnative.ops.hmm import hmm_log_likelihood

        ll = hmm_log_likelihood(le, lA, lpi, lf, mask)
        return [ll, *pytensor.grad(ll.sum(), [le, lA, lpi, lf])]

    def valid(self):
        r = np.random.default_rng(8)
        K = 3
        return [r.normal(size=(5, 3, K)), np.log(r.dirichlet(np.ones(K), size=K)), np.log(r.dirichlet(np.ones(K))),
                r.normal(size=K) * 0.3, mask_of([5, 3, 1], 5)]

    def runtime_cases(self):
        from .reference import fsa as ref

        def bad(arg, idx, v, names):
            return self.rejected(arg, lambda a: _set(a, idx, v), names)

        def nan_emission():
            # documented: b's log-likelihood NaN, its emission gradient NaN on its valid frames, others unaffected
            got = self(*self.with_values(log_emissions=lambda a: _set(a, (1, 0, 0), NAN)))
            assert np.isnan(got[0][0]) and np.isnan(got[1][:5, 0]).all(), "NaN log-emission of sequence 0"
            same_batch_entries(got[:2], self.clean()[:2], [0, 1], [1, 2], self.output_names)

        def nan_shared(arg, idx):
            # documented: a NaN in log_transitions / log_initial makes every sequence with a frame NaN
            def run():
                got = self(*self.with_values(**{arg: lambda a: _set(a, idx, NAN)}))
                assert np.isnan(got[0]).all(), f"NaN in {arg}: log_likelihood {got[0]}"
            return run

        def minus_inf():
            vals = self.with_values(log_transitions=lambda a: _set(a, (0, 1), -INF))
            got = self(*vals)
            want = ref.hmm_forward(vals[0], vals[1], vals[2], vals[3], [5, 3, 1])
            equal(got[0], want, "log_likelihood with an impossible transition", exact=False)

        def zero_length():
            vals = self.with_values(mask=mask_of([5, 0, 1], 5))
            got = self(*vals)
            want = ref.hmm_forward(vals[0], vals[1], vals[2], vals[3], [5, 0, 1])
            equal(got[0], want, "log_likelihood with T_b = 0 (log sum pi f)", exact=False)

        def zero_time():
            vals = self.with_values(log_emissions=np.zeros((0, 3, 3)), mask=np.zeros((0, 3)))
            got = self(*vals)
            want = ref.hmm_forward(vals[0], vals[1], vals[2], vals[3], [0, 0, 0])
            equal(got[0], want, "log_likelihood with T = 0", exact=False)

        return [
            ("nan:log_emissions", nan_emission),
            ("nan:log_transitions", nan_shared("log_transitions", (0, 0))),
            ("nan:log_initial", nan_shared("log_initial", (0,))),
            ("inf:log_emissions_pos", bad("log_emissions", (1, 0, 0), INF, ["log_emissions"])),
            ("inf:log_transitions_neg", minus_inf),
            ("zero_length:sequence", zero_length),
            ("zero_length:T0", zero_time),
            ("empty_batch:B0", lambda: _shapes(self(*self.with_values(log_emissions=np.zeros((5, 0, 3)),
                                                                        mask=np.zeros((5, 0)))),
                                               [(0,), (5, 0, 3), (3, 3), (3,), (3,)])),
            ("bad_value:mask_not_prefix", bad("mask", (3, 2), 1.0, ["mask"])),
            ("bad_value:mask_not_01", bad("mask", (0, 0), 0.5, ["mask"])),
            ("shape_mismatch:log_transitions", lambda: expect_error(
                lambda: self(*self.with_values(log_transitions=np.zeros((4, 4)))),
                ["hmm_log_likelihood", "log_transitions"])),
            ("shape_mismatch:mask", lambda: expect_error(
                lambda: self(*self.with_values(mask=np.ones((5, 2)))), ["hmm_log_likelihood", "mask"])),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.hmm import hmm_log_likelihood

        return [
            ("wrong_ndim:log_transitions", lambda: expect_error(
                lambda: hmm_log_likelihood(pt.tensor3(), pt.vector(), pt.vector()),
                ["hmm_log_likelihood", "log_transitions"])),
            ("wrong_dtype:log_emissions", lambda: expect_error(
                lambda: hmm_log_likelihood(pt.tensor3(dtype="complex128"), pt.matrix(), pt.vector()),
                ["hmm_log_likelihood", "log_emissions"])),
        ]


class HmmInference(Hmm):
    """``hmm_viterbi``, ``hmm_posteriors`` and ``hmm_sample_states`` on :class:`Hmm`'s model."""

    LENS = [5, 3, 1]

    def fn(self):
        from ptnative.ops import hmm

        return getattr(hmm, self.name)

    def graph(self, le, lA, lpi, lf, mask):
        out = self.fn()(le, lA, lpi, lf, mask)
        return list(out) if isinstance(out, list | tuple) else [out]

    def reference(self, vals):
        raise AssertionError("defined by each function")

    def runtime_cases(self):
        def ref_check(**changes):
            def run():
                vals = self.with_values(**changes)
                for k, (g, w) in enumerate(zip(self(*vals), self.reference(vals))):
                    equal(g, w, self.output_names[k], exact=np.asarray(w).dtype.kind == "i")
            return run

        def nan_emission():
            got = self(*self.with_values(log_emissions=lambda a: _set(a, (1, 0, 0), NAN)))
            self.check_nan(got, 0)
            same_batch_entries(got, self.clean(), self.batch_axes, [1, 2], self.output_names)

        def nan_shared(arg, idx):
            def run():
                got = self(*self.with_values(**{arg: lambda a: _set(a, idx, NAN)}))
                for b in range(3):  # every sequence has a frame
                    self.check_nan(got, b)
            return run

        def nan_padding():
            got = self(*self.with_values(log_emissions=lambda a: _set(a, (4, 1, 0), NAN)))  # sequence 1: 3 frames
            all_equal(got, self.clean(), [n + " with NaN on a padded frame" for n in self.output_names])

        def bad(arg, idx, v):
            return self.rejected(arg, lambda a: _set(a, idx, v))

        return [
            ("valid:reference", ref_check()),
            ("inf:log_transitions_neg", ref_check(log_transitions=lambda a: _set(a, (0, 1), -INF))),
            ("zero_length:sequence", ref_check(mask=mask_of([5, 0, 1], 5))),
            ("zero_length:T0", ref_check(log_emissions=np.zeros((0, 3, 3)), mask=np.zeros((0, 3)))),
            ("empty_batch:B0", ref_check(log_emissions=np.zeros((5, 0, 3)), mask=np.zeros((5, 0)))),
            ("nan:log_emissions", nan_emission),
            ("nan:log_emissions_padded_frame", nan_padding),
            ("nan:log_transitions", nan_shared("log_transitions", (0, 0))),
            ("nan:log_initial", nan_shared("log_initial", (1,))),
            ("inf:log_emissions_pos", bad("log_emissions", (1, 0, 0), INF)),
            ("inf:log_final_pos", bad("log_final", (0,), INF)),
            ("bad_value:mask_not_prefix", bad("mask", (3, 2), 1.0)),
            ("bad_value:mask_not_01", bad("mask", (0, 0), 0.5)),
            ("shape_mismatch:log_transitions", lambda: expect_error(
                lambda: self(*self.with_values(log_transitions=np.zeros((4, 4)))), [self.name, "log_transitions"])),
            ("shape_mismatch:mask", lambda: expect_error(
                lambda: self(*self.with_values(mask=np.ones((5, 2)))), [self.name, "mask"])),
        ]

    def build_cases(self):
        pt = _pt()
        fn = self.fn()
        extra = {"uniforms": pt.matrix()} if self.name == "hmm_sample_states" else {}
        return [
            ("wrong_ndim:log_transitions", lambda: expect_error(
                lambda: fn(pt.tensor3(), pt.vector(), pt.vector(), **extra), [self.name, "log_transitions"])),
            ("wrong_dtype:log_emissions", lambda: expect_error(
                lambda: fn(pt.tensor3(dtype="complex128"), pt.matrix(), pt.vector(), **extra),
                [self.name, "log_emissions"])),
        ]


class HmmViterbiH(HmmInference):
    name = "hmm_viterbi"
    outputs = {"path": 1, "score": 0}

    def reference(self, vals):
        from .reference import hmm as ref

        lens = vals[4].sum(axis=0).astype(int)
        return list(ref.viterbi(*vals[:4], lens))

    def check_nan(self, got, b):
        assert np.isnan(got[1][b]), f"score of sequence {b} with a NaN input: {got[1][b]}"
        equal(got[0][:, b], np.full(got[0].shape[0], -1, np.int32), f"path of sequence {b} with a NaN input")


class HmmPosteriorsH(HmmInference):
    name = "hmm_posteriors"
    outputs = {"marginals": 1, "counts": 0}

    def reference(self, vals):
        from .reference import fsa as ref

        return list(ref.hmm_posteriors(*vals[:4], vals[4].sum(axis=0).astype(int)))

    def check_nan(self, got, b):
        L = self.LENS[b]
        assert np.isnan(got[0][:L, b]).all() and np.isnan(got[1][b]).all(), \
            f"marginals and counts of sequence {b} with a NaN input"


class HmmSampleH(HmmInference):
    name = "hmm_sample_states"
    outputs = {"path": 1}

    def symbols(self):
        return super().symbols() + [_pt().matrix("uniforms")]

    def valid(self):
        return super().valid() + [np.random.default_rng(18).random((5, 3))]

    def graph(self, le, lA, lpi, lf, mask, uniforms):
        return [self.fn()(le, lA, lpi, lf, mask, uniforms=uniforms)]

    def reference(self, vals):
        """Forward filtering, backward sampling in log space: the first state whose cumulative weight
        exceeds u times the total, frame T_b - 1 first."""
        from scipy.special import logsumexp

        le, lA, lpi, lf, mask, u = vals
        T, B, K = le.shape
        path = np.full((T, B), -1, np.int32)
        for b in range(B):
            L = int(mask[:, b].sum())
            if L == 0:
                continue
            la = np.zeros((L, K))
            la[0] = lpi + le[0, b]
            for t in range(1, L):
                la[t] = logsumexp(la[t - 1][:, None] + lA, axis=0) + le[t, b]
            w = la[L - 1] + lf
            for t in range(L - 1, -1, -1):
                if t < L - 1:
                    w = la[t] + lA[:, path[t + 1, b]]
                p = np.exp(w - w.max())
                path[t, b] = int(np.argmax(np.cumsum(p) > u[t, b] * p.sum()))
        return [path]

    def check_nan(self, got, b):
        equal(got[0][:, b], np.full(got[0].shape[0], -1, np.int32), f"path of sequence {b} with a NaN input")

    def runtime_cases(self):
        def bad_uniform(v):
            return lambda: expect_error(
                lambda: self(*self.with_values(uniforms=lambda a: _set(a, (1, 0), v))), [self.name, "uniforms"])

        cases = [c for c in super().runtime_cases() if c[0] not in ("zero_length:T0", "empty_batch:B0")]
        return cases + [
            ("out_of_range_label:uniform_1", bad_uniform(1.0)),
            ("out_of_range_label:uniform_negative", bad_uniform(-0.1)),
            ("nan:uniforms", bad_uniform(NAN)),
            ("valid:uniform_on_padded_frame_ignored", lambda: all_equal(
                self(*self.with_values(uniforms=lambda a: _set(a, (4, 1), 7.0))), self.clean(), ["path"])),
            ("zero_length:T0", lambda: _shapes(self(*self.with_values(
                log_emissions=np.zeros((0, 3, 3)), mask=np.zeros((0, 3)), uniforms=np.zeros((0, 3)))), [(0, 3)])),
            ("empty_batch:B0", lambda: _shapes(self(*self.with_values(
                log_emissions=np.zeros((5, 0, 3)), mask=np.zeros((5, 0)), uniforms=np.zeros((5, 0)))), [(5, 0)])),
        ]


# ------------------------------------------------------------------------------------------------ RNN-T
class Rnnt(Harness):
    name = "rnnt_loss"
    outputs = {"costs": 0, "dacts": 0}
    durations = ()
    B, T, U, K = 3, 4, 2, 4

    def call(self, acts, labels, act_lens, label_lens, **kw):
        from ptnative.ops.rnnt import rnnt_loss

        return rnnt_loss(acts, labels, act_lens, label_lens, **kw)

    def blank(self):
        return 0

    def symbols(self):
        pt = _pt()
        return [pt.tensor4("acts"), pt.imatrix("labels"), pt.ivector("act_lens"), pt.ivector("label_lens")]

    def graph(self, acts, labels, act_lens, label_lens):
        import pytensor

        costs = self.call(acts, labels, act_lens, label_lens)
        return [costs, pytensor.grad(costs.sum(), acts)]

    def valid(self):
        r = np.random.default_rng(9)
        B, T, U, K = self.B, self.T, self.U, self.K
        b = self.blank()
        labels = np.array([[1, 2], [3, 1], [2, 2]], np.int32)
        labels[labels == b] = 1
        return [r.normal(size=(B, T, U + 1, K)), labels, np.array([4, 2, 3], np.int32),
                np.array([2, 1, 0], np.int32)]

    def reference(self, vals):
        from .reference import rnnt as ref

        return ref.batch_lattice(*vals, self.blank(), self.durations)

    def runtime_cases(self):
        fn = self.name

        def nan_valid():
            got = self(*self.with_values(acts=lambda a: _set(a, (0, 1, 0, 2), NAN)))
            assert np.isnan(got[0][0]), f"{fn}: NaN logit at a valid (t, u) gave cost {got[0][0]} (must be NaN)"
            same_batch_entries(got, self.clean(), self.batch_axes, [1, 2], self.output_names)

        def nan_padding():
            got = self(*self.with_values(acts=lambda a: _set(a, (1, 3, 0, 0), NAN)))  # act_lens[1] = 2
            all_equal(got, self.clean(), [n + " with NaN on padding" for n in self.output_names])

        def minus_inf():
            vals = self.with_values(acts=lambda a: _set(a, (0, 1, 0, 3), -INF))
            got = self(*vals)
            costs, grads = self.reference(vals)[:2]
            equal(got[0], costs, "costs", exact=False)
            equal(got[1], grads, "grads", exact=False)

        def zero_frames():
            vals = self.with_values(act_lens=np.array([4, 0, 3], np.int32))
            got = self(*vals)
            assert got[0][1] == INF, f"{fn}: act_lens[b] = 0 gives cost +inf (documented), got {got[0][1]}"
            equal(got[1][1], np.zeros_like(got[1][1]), "gradient of a sequence without frames")

        def empty_alignment():
            # act_lens[b] = label_lens[b] = 0: the empty alignment, probability 1 (issue 14, item 6; docs/rnnt.md)
            vals = self.with_values(act_lens=np.array([4, 0, 3], np.int32), label_lens=np.array([2, 0, 0], np.int32))
            got = self(*vals)
            assert got[0][1] == 0, f"{fn}: act_lens[b] = label_lens[b] = 0 gives cost 0, got {got[0][1]}"
            equal(got[1][1], np.zeros_like(got[1][1]), "gradient of the empty alignment")

        def no_labels():
            vals = self.with_values(label_lens=np.array([2, 0, 0], np.int32))
            got = self(*vals)
            equal(got[0], self.reference(vals)[0], "costs of the blank-only lattice", exact=False)

        def padded():
            # documented: acts.shape[1] >= max(act_lens) and acts.shape[2] >= max(label_lens) + 1
            vals = self.with_values(act_lens=np.array([3, 2, 3], np.int32), label_lens=np.array([1, 1, 0], np.int32))
            got = self(*vals)
            costs, grads = self.reference(vals)[:2]
            equal(got[0], costs, "costs", exact=False)
            equal(got[1], grads, "grads", exact=False)

        return [
            ("nan:acts_valid", nan_valid),
            ("nan:acts_padding", nan_padding),
            ("inf:acts_neg", minus_inf),
            ("zero_length:act_lens", zero_frames),
            ("zero_length:label_lens", no_labels),
            ("zero_length:empty_alignment", empty_alignment),
            ("empty_batch:B0", lambda: _shapes(self(np.zeros((0, 4, 3, self.K)), np.zeros((0, 2), np.int32),
                                                    np.zeros(0, np.int32), np.zeros(0, np.int32)),
                                               [(0,), (0, 4, 3, self.K)])),
            ("out_of_range_label:labels_too_big",
             self.rejected("labels", np.array([[1, self.K], [3, 1], [2, 2]], np.int32))),
            ("out_of_range_label:labels_negative",
             self.rejected("labels", np.array([[1, -1], [3, 1], [2, 2]], np.int32))),
            ("out_of_range_length:act_lens_too_big", self.rejected("act_lens", np.array([5, 2, 3], np.int32))),
            ("out_of_range_length:act_lens_negative", self.rejected("act_lens", np.array([4, -1, 3], np.int32))),
            ("out_of_range_length:label_lens_too_big",
             self.rejected("label_lens", np.array([3, 1, 0], np.int32))),
            ("out_of_range_length:label_lens_negative",
             self.rejected("label_lens", np.array([2, -1, 0], np.int32))),
            ("valid:acts_padded_beyond_the_longest", padded),
            ("shape_mismatch:batch", self.rejected("act_lens", np.array([4, 2], np.int32), ["act_lens", "acts"])),
        ]

    def build_cases(self):
        pt = _pt()
        a, lab, al, ll = pt.tensor4(), pt.imatrix(), pt.ivector(), pt.ivector()
        return [
            ("wrong_dtype:labels", lambda: expect_error(lambda: self.call(a, pt.matrix(), al, ll),
                                                        [self.name, "labels"])),
            ("wrong_dtype:acts", lambda: expect_error(lambda: self.call(pt.itensor4(), lab, al, ll),
                                                      [self.name, "acts"])),
            ("wrong_ndim:acts", lambda: expect_error(lambda: self.call(pt.tensor3(), lab, al, ll),
                                                     [self.name, "acts"])),
            ("wrong_ndim:act_lens", lambda: expect_error(lambda: self.call(a, lab, pt.imatrix(), ll),
                                                         [self.name, "act_lens"])),
            ("bad_value:reduction", lambda: expect_error(lambda: self.call(a, lab, al, ll, reduction="avg"),
                                                         [self.name, "reduction"])),
            ("wrong_dtype:clamp", lambda: expect_error(lambda: self.call(a, lab, al, ll, clamp="1"),
                                                       [self.name, "clamp"])),
            ("nan:fastemit_lambda", lambda: expect_error(lambda: self.call(a, lab, al, ll, fastemit_lambda=NAN),
                                                         [self.name, "fastemit_lambda"])),
        ]


class MultiRnnt(Rnnt):
    name = "multiblank_rnnt_loss"
    durations = (2,)
    K = 5

    def blank(self):
        return self.K - 1

    def call(self, acts, labels, act_lens, label_lens, **kw):
        from ptnative.ops.rnnt import multiblank_rnnt_loss

        return multiblank_rnnt_loss(acts, labels, act_lens, label_lens, self.blank(), self.durations, **kw)

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.rnnt import multiblank_rnnt_loss

        a, lab, al, ll = pt.tensor4(shape=(None, None, None, 5)), pt.imatrix(), pt.ivector(), pt.ivector()
        return super().build_cases() + [
            ("bad_value:duration", lambda: expect_error(lambda: multiblank_rnnt_loss(a, lab, al, ll, 4, (1,)),
                                                        ["multiblank_rnnt_loss", "big_blank_durations"])),
            ("out_of_range_label:blank", lambda: expect_error(lambda: multiblank_rnnt_loss(a, lab, al, ll, 5, (2,)),
                                                              ["multiblank_rnnt_loss", "blank"])),
            ("nan:sigma", lambda: expect_error(lambda: multiblank_rnnt_loss(a, lab, al, ll, 4, (2,), sigma=NAN),
                                               ["multiblank_rnnt_loss", "sigma"])),
        ]


class RnntLattice(MultiRnnt):
    name = "multiblank_rnnt_lattice"
    outputs = {"costs": 0, "grads": 0, "loglik": 0, "alphas": 0, "betas": 0, "lognorm": 0}

    def call(self, acts, labels, act_lens, label_lens, **kw):
        from ptnative.ops.rnnt import multiblank_rnnt_lattice

        kw.pop("reduction", None)
        return multiblank_rnnt_lattice(acts, labels, act_lens, label_lens, self.blank(), self.durations, **kw).costs

    def graph(self, acts, labels, act_lens, label_lens):
        from ptnative.ops.rnnt import multiblank_rnnt_lattice

        return list(multiblank_rnnt_lattice(acts, labels, act_lens, label_lens, self.blank(), self.durations))

    def runtime_cases(self):
        cases = super().runtime_cases()

        def against_reference():
            vals = self.valid()
            got = self(*vals)
            for k, (g, w) in enumerate(zip(got, self.reference(vals))):
                equal(g, w, self.output_names[k], exact=False)

        return [("valid:reference", against_reference)] + [
            c for c in cases if c[0] not in ("empty_batch:B0",)] + [
            ("empty_batch:B0", lambda: _shapes(self(np.zeros((0, 4, 3, 5)), np.zeros((0, 2), np.int32),
                                                    np.zeros(0, np.int32), np.zeros(0, np.int32)),
                                               [(0,), (0, 4, 3, 5), (0,), (0, 4, 3), (0, 4, 3), (0, 4, 3)]))]

    def build_cases(self):
        return [c for c in super().build_cases() if not c[0].startswith("bad_value:reduction")]


# ---------------------------------------------------------------------------------------- edit distance
class EditDistance(Harness):
    name = "edit_distance"
    outputs = {"output": 0}
    ref_name = "edit_distance"

    def fn(self):
        from ptnative.ops import edit_distance as ed

        return getattr(ed, self.name)

    def symbols(self):
        pt = _pt()
        return [pt.imatrix("a"), pt.ivector("a_len"), pt.imatrix("b"), pt.ivector("b_len")]

    def graph(self, *s):
        return [self.fn()(*s)]

    def valid(self):
        r = np.random.default_rng(10)
        return [r.integers(0, 4, size=(3, 5)).astype(np.int32), np.array([5, 0, 3], np.int32),
                r.integers(0, 4, size=(3, 6)).astype(np.int32), np.array([4, 2, 0], np.int32)]

    def reference(self, vals):
        from .reference import edit_distance as ref

        return [np.asarray(getattr(ref, self.ref_name)(*vals))]

    def runtime_cases(self):
        fn = self.name

        def extreme_labels():
            vals = self.with_values(a=lambda a: _set(a, (0, 0), np.iinfo(np.int32).min),
                                    b=lambda b: _set(b, (0, 1), np.iinfo(np.int32).max))
            all_equal(self(*vals), self.reference(vals), ["output (int32 extremes as labels)"])

        def ref_check(**changes):
            def run():
                vals = self.with_values(**changes)
                all_equal(self(*vals), self.reference(vals), ["output"])
            return run

        n = len(self.symbols())
        empty = [np.zeros((0, 5), np.int32), np.zeros(0, np.int32), np.zeros((0, 6), np.int32),
                 np.zeros(0, np.int32)] + self.valid()[4:n]
        return [
            ("valid:reference", ref_check()),
            ("out_of_range_label:int32_extremes", extreme_labels),
            ("zero_length:T0", ref_check(a=np.zeros((3, 0), np.int32), a_len=np.zeros(3, np.int32))),
            ("empty_batch:B0", lambda: _shapes(self(*empty), [self.reference(empty)[0].shape])),
            ("out_of_range_length:a_len_too_big", self.rejected("a_len", np.array([6, 0, 3], np.int32))),
            ("out_of_range_length:a_len_negative", self.rejected("a_len", np.array([5, -1, 3], np.int32))),
            ("out_of_range_length:b_len_too_big", self.rejected("b_len", np.array([4, 7, 0], np.int32))),
            ("out_of_range_length:b_len_negative", self.rejected("b_len", np.array([4, 2, -3], np.int32))),
            ("shape_mismatch:batch", lambda: expect_error(
                lambda: self(*self.with_values(b_len=np.array([1, 1], np.int32), b=np.zeros((2, 6), np.int32))),
                [fn, "b", "b_len", "a"])),
        ]

    def build_cases(self):
        pt = _pt()
        fn = self.fn()
        extra = [pt.ivector()] if self.name.endswith("per_successor") else []
        return [
            ("wrong_dtype:a", lambda: expect_error(lambda: fn(pt.matrix(), pt.ivector(), pt.imatrix(), pt.ivector(),
                                                              *extra), [self.name, "a"])),
            ("wrong_ndim:b", lambda: expect_error(lambda: fn(pt.imatrix(), pt.ivector(), pt.ivector(), pt.ivector(),
                                                             *extra), [self.name, "b"])),
        ]


class OptimalCompletion(EditDistance):
    name = ref_name = "optimal_completion_edit_distance"


class PerSuccessor(EditDistance):
    name = ref_name = "optimal_completion_edit_distance_per_successor"

    def symbols(self):
        return super().symbols() + [_pt().ivector("successors")]

    def valid(self):
        return super().valid() + [np.array([0, 3, 1, -7], np.int32)]

    def runtime_cases(self):
        def no_successors():
            vals = self.with_values(successors=np.zeros(0, np.int32))
            _shapes(self(*vals), [(3, 0)])

        return super().runtime_cases() + [("zero_length:successors", no_successors)]


class NextRow(Harness):
    name = "next_edit_distance_row"
    outputs = {"output": 0}

    def symbols(self):
        pt = _pt()
        return [pt.imatrix("last_row"), pt.ivector("a"), pt.ivector("a_n"), pt.ivector("a_ended"), pt.imatrix("b"),
                pt.ivector("b_len")]

    def graph(self, *s):
        from ptnative.ops.edit_distance import next_edit_distance_row

        return [next_edit_distance_row(*s)]

    def valid(self):
        r = np.random.default_rng(11)
        return [np.tile(np.arange(6, dtype=np.int32), (3, 1)) + np.array([[0], [1], [2]], np.int32),
                np.array([1, 2, 3], np.int32), np.array([0, 1, 2], np.int32), np.array([0, 1, 0], np.int32),
                r.integers(0, 4, size=(3, 5)).astype(np.int32), np.array([5, 2, 0], np.int32)]

    def reference(self, vals):
        from .reference import edit_distance as ref

        return [np.asarray(ref.next_edit_distance_row(*vals))]

    def runtime_cases(self):
        return [
            ("valid:reference", lambda: all_equal(self(*self.valid()), self.reference(self.valid()),
                                                  self.output_names)),
            ("out_of_range_length:b_len_too_big", self.rejected("b_len", np.array([6, 2, 0], np.int32))),
            ("out_of_range_length:b_len_negative", self.rejected("b_len", np.array([5, -2, 0], np.int32))),
            ("shape_mismatch:last_row", self.rejected("last_row", np.zeros((3, 5), np.int32))),
            ("shape_mismatch:a", self.rejected("a", np.zeros(2, np.int32))),
            ("empty_batch:B0", lambda: _shapes(self(np.zeros((0, 6), np.int32), *[np.zeros(0, np.int32)] * 3,
                                                    np.zeros((0, 5), np.int32), np.zeros(0, np.int32)), [(0, 6)])),
            ("zero_length:Tb0", lambda: all_equal(
                self(*self.with_values(last_row=np.zeros((3, 1), np.int32), b=np.zeros((3, 0), np.int32),
                                       b_len=np.zeros(3, np.int32))),
                self.reference(self.with_values(last_row=np.zeros((3, 1), np.int32), b=np.zeros((3, 0), np.int32),
                                                b_len=np.zeros(3, np.int32))), ["output"])),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.edit_distance import next_edit_distance_row

        v, m = pt.ivector, pt.imatrix
        return [
            ("wrong_dtype:last_row", lambda: expect_error(
                lambda: next_edit_distance_row(pt.matrix(), v(), v(), v(), m(), v()), [self.name, "last_row"])),
            ("wrong_ndim:a", lambda: expect_error(
                lambda: next_edit_distance_row(m(), m(), v(), v(), m(), v()), [self.name, "a"])),
        ]


class NextReduce(NextRow):
    name = "next_edit_distance_reduce"
    outputs = {"output": 0, "output_oc": 0}

    def symbols(self):
        s = super().symbols()
        s[1] = _pt().imatrix("a")
        return s + [_pt().iscalar("a_blank_idx")]

    def graph(self, last_row, a, a_n, a_ended, b, b_len, blank):
        from ptnative.ops.edit_distance import next_edit_distance_reduce

        return [next_edit_distance_reduce(last_row, a, a_n, a_ended, b, b_len, False, blank),
                next_edit_distance_reduce(last_row, a, a_n, a_ended, b, b_len, True, blank)]

    def valid(self):
        v = super().valid()
        v[1] = np.array([[0, 1, 2, 3, 9]], np.int32)
        return v + [np.int32(3)]

    def reference(self, vals):
        from .reference import edit_distance as ref

        return [np.asarray(ref.next_edit_distance_reduce(*vals[:6], oc, vals[6])) for oc in (False, True)]

    def runtime_cases(self):
        cases = [c for c in super().runtime_cases() if not c[0].startswith(("shape_mismatch:a", "empty_batch",
                                                                            "zero_length"))]

        def per_entry():
            vals = self.with_values(a=np.array([[0, 1], [2, 3], [3, 3]], np.int32))
            all_equal(self(*vals), self.reference(vals), self.output_names)

        return cases + [
            ("valid:per_entry_candidates", per_entry),
            ("shape_mismatch:a", lambda: expect_error(lambda: self(*self.with_values(a=np.zeros((2, 4), np.int32))),
                                                      [self.name, "a"])),
            ("empty_batch:B0", lambda: _shapes(self(np.zeros((0, 6), np.int32), np.zeros((1, 4), np.int32),
                                                    *[np.zeros(0, np.int32)] * 2, np.zeros((0, 5), np.int32),
                                                    np.zeros(0, np.int32), np.int32(-1)), [(0, 4), (0, 4)])),
            ("zero_length:no_candidates", lambda: _shapes(self(*self.with_values(a=np.zeros((1, 0), np.int32))),
                                                          [(3, 0), (3, 0)])),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.edit_distance import next_edit_distance_reduce

        v, m = pt.ivector, pt.imatrix
        return [
            ("wrong_ndim:a", lambda: expect_error(
                lambda: next_edit_distance_reduce(m(), v(), v(), v(), m(), v()), [self.name, "a"])),
            ("bad_value:a_blank_idx", lambda: expect_error(
                lambda: next_edit_distance_reduce(m(), m(), v(), v(), m(), v(), a_blank_idx=2**40),
                [self.name, "a_blank_idx"])),
        ]


# ---------------------------------------------------------------------------------------------- chunking
class Chunk(Harness):
    name = "chunk"
    outputs = {"out": None, "oindex": None, "dx": 1}

    def symbols(self):
        pt = _pt()
        return [pt.tensor3("x"), pt.matrix("index"), pt.iscalar("chunk_size"), pt.iscalar("chunk_step")]

    def graph(self, x, index, size, step):
        import pytensor

        from ptnative.ops.chunking import chunk

        out, oindex = chunk(x, index, size, step)
        return [out, oindex, pytensor.grad((out ** 2).sum(), x)]

    def valid(self):
        r = np.random.default_rng(12)
        return [r.normal(size=(7, 2, 3)), mask_of([7, 4], 7), np.int32(3), np.int32(2)]

    def reference(self, vals):
        from .reference import chunking as ref

        x, m, size, step = vals
        out, oindex = ref.chunk(x, m, int(size), int(step))
        return [out, oindex]

    def runtime_cases(self):
        def ref_check(**changes):
            def run():
                vals = self.with_values(**changes)
                got = self(*vals)
                all_equal(got[:2], self.reference(vals), self.output_names)
            return run

        return [
            ("nan:x", ref_check(x=lambda x: _set(x, (2, 0, 1), NAN))),
            ("nan:index", ref_check(index=lambda m: _set(m, (1, 1), NAN))),
            ("inf:x", ref_check(x=lambda x: _set(x, (2, 0, 1), -INF))),
            ("bad_value:index_cutoff", ref_check(index=lambda m: _set(_set(m, (0, 0), 0.09), (1, 0), 0.11))),
            ("zero_length:T0", ref_check(x=np.zeros((0, 2, 3)), index=np.zeros((0, 2)))),
            ("empty_batch:B0", ref_check(x=np.zeros((7, 0, 3)), index=np.zeros((7, 0)))),
            ("bad_value:chunk_size_0", self.rejected("chunk_size", np.int32(0))),
            ("bad_value:chunk_step_0", self.rejected("chunk_step", np.int32(0))),
            ("bad_value:chunk_step_negative", self.rejected("chunk_step", np.int32(-2))),
            ("shape_mismatch:index", self.rejected("index", np.ones((7, 3)))),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.chunking import chunk, n_chunks, naive_chunk_start_frames

        x, m = pt.tensor3(), pt.matrix()
        return [
            ("wrong_dtype:x", lambda: expect_error(lambda: chunk(pt.itensor3(), m, 2, 1), ["chunk", "x"])),
            ("wrong_ndim:index", lambda: expect_error(lambda: chunk(x, pt.vector(), 2, 1), ["chunk", "index"])),
            ("bad_value:chunk_size", lambda: expect_error(lambda: chunk(x, m, 0, 1), ["chunk", "chunk_size"])),
            ("wrong_dtype:chunk_step", lambda: expect_error(lambda: chunk(x, m, 2, 1.5), ["chunk", "chunk_step"])),
            ("bad_value:n_chunks_step_0", lambda: expect_error(lambda: n_chunks(10, 5, 0),
                                                               ["n_chunks", "chunk_step"])),
            ("bad_value:naive_chunk_start_frames", lambda: expect_error(
                lambda: naive_chunk_start_frames(10, 0, 1), ["naive_chunk_start_frames", "chunk_size"])),
        ]


class Unchunk(Harness):
    name = "unchunk"
    outputs = {"out": 1, "oindex": 1, "factors": 1, "dx": None}

    def symbols(self):
        pt = _pt()
        return [pt.tensor3("x"), pt.matrix("index"), pt.iscalar("n_time"), pt.iscalar("n_batch")]

    def graph(self, x, index, n_time, n_batch):
        import pytensor

        from ptnative.ops.chunking import unchunk

        out, oindex, factors = unchunk(x, index, 3, 2, n_time, n_batch)
        return [out, oindex, factors, pytensor.grad((out ** 2).sum(), x)]

    def valid(self):
        r = np.random.default_rng(13)
        # T = 7, size 3, step 2: 3 chunks per sequence, B = 2
        m = (r.random((3, 6)) > 0.3).astype(np.float64)
        return [r.normal(size=(3, 6, 2)), m, np.int32(7), np.int32(2)]

    def reference(self, vals):
        from .reference import chunking as ref

        x, m, T, B = vals
        return list(ref.unchunk(x, m, 3, 2, int(T), int(B)))

    def runtime_cases(self):
        def ref_check(**changes):
            def run():
                vals = self.with_values(**changes)
                all_equal(self(*vals)[:3], self.reference(vals), self.output_names)
            return run

        return [
            ("nan:x", ref_check(x=lambda x: _set(x, (1, 0, 0), NAN), index=lambda m: _set(m, (1, 0), 1.0))),
            ("nan:x_uncounted", ref_check(x=lambda x: _set(x, (1, 0, 0), NAN), index=lambda m: _set(m, (1, 0), 0.0))),
            ("nan:index", ref_check(index=lambda m: _set(m, (1, 0), NAN))),
            ("inf:x", ref_check(x=lambda x: _set(x, (1, 0, 0), INF), index=lambda m: _set(m, (1, 0), 1.0))),
            ("bad_value:index_cutoff", ref_check(index=lambda m: _set(_set(m, (0, 0), 0.09), (1, 0), 0.11))),
            ("shape_mismatch:n_time", self.rejected("n_time", np.int32(3), ["n_time", "x"])),
            ("shape_mismatch:n_batch", self.rejected("n_batch", np.int32(3), ["n_batch", "x"])),
            ("out_of_range_length:n_time_negative", self.rejected("n_time", np.int32(-1), ["n_time"])),
            ("empty_batch:B0", ref_check(x=np.zeros((3, 0, 2)), index=np.zeros((3, 0)), n_batch=np.int32(0))),
            ("zero_length:T0", ref_check(x=np.zeros((3, 2, 2)), index=np.ones((3, 2)), n_time=np.int32(0))),
            ("shape_mismatch:index", self.rejected("index", np.ones((3, 5)), ["index"])),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.chunking import unchunk

        return [
            ("wrong_ndim:x", lambda: expect_error(lambda: unchunk(pt.matrix(), pt.matrix(), 2, 1, 4, 1),
                                                  ["unchunk", "x"])),
            ("out_of_range_length:n_time", lambda: expect_error(
                lambda: unchunk(pt.tensor3(), pt.matrix(), 2, 1, -1, 1), ["unchunk", "n_time"])),
        ]


# ------------------------------------------------------------------------------------------------ sparse
class BatchedIndex(Harness):
    name = "subtensor_batched_index"
    outputs = {"y": 1, "dx": 1}

    def symbols(self):
        pt = _pt()
        return [pt.tensor3("x"), pt.matrix("idx")]

    def graph(self, x, idx):
        import pytensor

        from ptnative.ops.sparse import subtensor_batched_index

        y = subtensor_batched_index(x, idx)
        return [y, pytensor.grad((y ** 2).sum(), x)]

    def strict(self, x, idx):
        from ptnative.ops.sparse import subtensor_batched_index

        return [subtensor_batched_index(x, idx, strict=True)]

    def valid(self):
        r = np.random.default_rng(14)
        return [r.normal(size=(4, 3, 5)), r.integers(0, 5, size=(4, 3)).astype(np.float64)]

    def runtime_cases(self):
        from .reference import sparse as ref

        def ref_check(**changes):
            def run():
                vals = self.with_values(**changes)
                equal(self(*vals)[0], ref.subtensor_batched_index(*vals), "y")
            return run

        def strict_bad(v):
            return lambda: expect_error(
                lambda: self(*self.with_values(idx=lambda i: _set(i, (1, 1), v)), key="strict", builder=self.strict),
                ["subtensor_batched_index", "idx"])

        return [
            ("nan:x_selected", lambda: self._nan_x()),
            ("nan:idx", ref_check(idx=lambda i: _set(i, (1, 1), NAN))),
            ("inf:idx_pos", ref_check(idx=lambda i: _set(i, (1, 1), INF))),
            ("inf:idx_neg", ref_check(idx=lambda i: _set(i, (1, 1), -INF))),
            ("inf:x", ref_check(x=lambda x: _set(x, (0, 0, 2), INF), idx=lambda i: _set(i, (0, 0), 2.0))),
            ("out_of_range_label:idx_clipped", ref_check(idx=lambda i: _set(_set(i, (0, 0), 7.0), (0, 1), -3.0))),
            ("out_of_range_label:strict_too_big", strict_bad(5.0)),
            ("out_of_range_label:strict_negative", strict_bad(-1.0)),
            ("out_of_range_label:strict_nan", strict_bad(NAN)),
            ("empty_batch:B0", ref_check(x=np.zeros((4, 0, 5)), idx=np.zeros((4, 0)))),
            ("zero_length:T0", ref_check(x=np.zeros((0, 3, 5)), idx=np.zeros((0, 3)))),
            ("zero_length:D0", lambda: expect_error(lambda: self(np.zeros((4, 3, 0)), np.zeros((4, 3))),
                                                    ["subtensor_batched_index", "x"])),
            ("shape_mismatch:idx", lambda: expect_error(lambda: self(*self.with_values(idx=np.zeros((4, 2)))),
                                                        ["subtensor_batched_index", "idx"])),
        ]

    def _nan_x(self):
        vals = self.with_values(x=lambda x: _set(x, (0, 0, 2), NAN), idx=lambda i: _set(i, (0, 0), 2.0))
        got = self(*vals)
        assert np.isnan(got[0][0, 0]), "a selected NaN must come out"

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.sparse import subtensor_batched_index

        return [
            ("wrong_ndim:x", lambda: expect_error(lambda: subtensor_batched_index(pt.vector(), pt.vector()),
                                                  ["subtensor_batched_index", "x"])),
            ("wrong_dtype:x", lambda: expect_error(lambda: subtensor_batched_index(pt.itensor3(), pt.matrix()),
                                                   ["subtensor_batched_index", "x"])),
            ("wrong_ndim:idx", lambda: expect_error(lambda: subtensor_batched_index(pt.tensor3(), pt.vector()),
                                                    ["subtensor_batched_index", "idx"])),
        ]


def coo_symbols(names=("s0", "s1", "weight", "mask")):
    """Symbols of a sparse (COO) batch: four float matrices named ``names``, fed by ``coo_values``."""
    return [_pt().matrix(name) for name in names]


def coo_values(seed, N=6, B=2, T=4, D=3):
    """A sparse (COO) batch: time and dimension indices (N, B) into (T, B, D), as floats, the second entry of
    each sequence repeating the first; normal weights; mask 1."""
    r = np.random.default_rng(seed)
    s0 = r.integers(0, T, size=(N, B)).astype(np.float64)
    s1 = r.integers(0, D, size=(N, B)).astype(np.float64)
    s0[1], s1[1] = s0[0], s1[0]
    return s0, s1, r.normal(size=(N, B)), np.ones((N, B))


class SparseToDenseH(Harness):
    name = "sparse_to_dense"
    outputs = {"W": 1, "dweight": 1}

    def symbols(self):
        return coo_symbols() + [_pt().iscalar("n_time"), _pt().iscalar("n_dim")]

    def graph(self, s0, s1, w, m, T, D):
        import pytensor

        from ptnative.ops.sparse import sparse_to_dense

        W = sparse_to_dense(s0, s1, w, m, T, D)
        return [W, pytensor.grad((W ** 2).sum(), w)]

    def strict(self, s0, s1, w, m, T, D):
        from ptnative.ops.sparse import sparse_to_dense

        return [sparse_to_dense(s0, s1, w, m, T, D, strict=True)]

    def valid(self):
        return [*coo_values(15), np.int32(4), np.int32(3)]

    def runtime_cases(self):
        from .reference import sparse as ref

        def ref_check(**changes):
            def run():
                vals = self.with_values(**changes)
                s0, s1, w, m, T, D = vals
                equal(self(*vals)[0], ref.dense_targets(s0, s1, w, m, int(T), int(D)), "W", exact=False)
            return run

        def strict_bad(arg, v):
            return lambda: expect_error(
                lambda: self(*self.with_values(**{arg: lambda a: _set(a, (2, 1), v)}), key="strict",
                             builder=self.strict), ["sparse_to_dense", arg])

        return [
            ("nan:weight", ref_check(weight=lambda w: _set(w, (2, 0), NAN))),
            ("nan:s0", ref_check(s0=lambda s: _set(s, (2, 0), NAN))),
            ("nan:mask", ref_check(mask=lambda s: _set(s, (2, 0), NAN))),
            ("inf:weight", ref_check(weight=lambda w: _set(w, (2, 0), INF))),
            ("inf:s1", ref_check(s1=lambda s: _set(s, (2, 0), INF))),
            ("bad_value:mask_cutoff", ref_check(mask=lambda m: _set(_set(m, (2, 0), 0.09), (3, 0), 0.11))),
            ("out_of_range_label:skipped", ref_check(s0=lambda s: _set(s, (2, 0), 4.0),
                                                     s1=lambda s: _set(s, (3, 1), -1.0))),
            ("out_of_range_label:strict_s0", strict_bad("s0", 4.0)),
            ("out_of_range_label:strict_s1", strict_bad("s1", -1.0)),
            ("out_of_range_label:strict_nan", strict_bad("s1", NAN)),
            ("empty_batch:B0", ref_check(s0=np.zeros((6, 0)), s1=np.zeros((6, 0)), weight=np.zeros((6, 0)),
                                         mask=np.zeros((6, 0)))),
            ("zero_length:N0", ref_check(s0=np.zeros((0, 2)), s1=np.zeros((0, 2)), weight=np.zeros((0, 2)),
                                         mask=np.zeros((0, 2)))),
            ("zero_length:n_time0", ref_check(n_time=np.int32(0))),
            ("shape_mismatch:weight", lambda: expect_error(
                lambda: self(*self.with_values(weight=np.zeros((5, 2)))), ["sparse_to_dense", "weight"])),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.sparse import sparse_to_dense

        m = pt.matrix
        return [
            ("wrong_ndim:s0", lambda: expect_error(lambda: sparse_to_dense(pt.vector(), m(), m(), m(), 3, 3),
                                                   ["sparse_to_dense", "s0"])),
            ("wrong_dtype:n_time", lambda: expect_error(lambda: sparse_to_dense(m(), m(), m(), m(), 3.5, 3),
                                                        ["sparse_to_dense", "n_time"])),
            ("bad_value:n_dim", lambda: expect_error(lambda: sparse_to_dense(m(), m(), m(), m(), 3, -1),
                                                     ["sparse_to_dense", "n_dim"])),
        ]


class MaxArgmax(Harness):
    name = "max_and_argmax_sparse"
    outputs = {"out_max": 1, "out_arg": 1}

    def symbols(self):
        return coo_symbols() + [_pt().matrix("out_max"), _pt().matrix("out_arg")]

    def graph(self, *s):
        from ptnative.ops.sparse import max_and_argmax_sparse

        return list(max_and_argmax_sparse(*s))

    def strict(self, *s):
        from ptnative.ops.sparse import max_and_argmax_sparse

        return list(max_and_argmax_sparse(*s, strict=True))

    def valid(self):
        return [*coo_values(16), np.zeros((4, 2)), np.zeros((4, 2))]

    def runtime_cases(self):
        from .reference import sparse as ref

        def ref_check(**changes):
            def run():
                vals = self.with_values(**changes)
                all_equal(self(*vals), ref.max_and_argmax_sparse(*vals), self.output_names)
            return run

        return [
            ("nan:weight", ref_check(weight=lambda w: _set(w, (2, 0), NAN))),
            ("nan:s0", ref_check(s0=lambda s: _set(s, (2, 0), NAN))),
            ("nan:mask", ref_check(mask=lambda s: _set(s, (2, 0), NAN))),
            ("inf:weight", ref_check(weight=lambda w: _set(w, (2, 0), INF))),
            ("bad_value:mask_cutoff", ref_check(weight=lambda w: w + 5, mask=lambda m: _set(_set(m, (0, 0), 0.09),
                                                                                        (1, 0), 0.11))),
            ("out_of_range_label:skipped", ref_check(s0=lambda s: _set(_set(s, (2, 0), 4.0), (3, 1), -1.0))),
            ("out_of_range_label:strict_s0", lambda: expect_error(
                lambda: self(*self.with_values(s0=lambda s: _set(s, (2, 0), 4.0)), key="strict", builder=self.strict),
                ["max_and_argmax_sparse", "s0"])),
            ("empty_batch:B0", ref_check(s0=np.zeros((6, 0)), s1=np.zeros((6, 0)), weight=np.zeros((6, 0)),
                                         mask=np.zeros((6, 0)), out_max=np.zeros((4, 0)), out_arg=np.zeros((4, 0)))),
            ("zero_length:N0", ref_check(s0=np.zeros((0, 2)), s1=np.zeros((0, 2)), weight=np.zeros((0, 2)),
                                         mask=np.zeros((0, 2)))),
            ("shape_mismatch:out_arg", lambda: expect_error(
                lambda: self(*self.with_values(out_arg=np.zeros((3, 2)))), ["max_and_argmax_sparse", "out_arg"])),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.sparse import max_and_argmax_sparse

        m = pt.matrix
        return [("wrong_ndim:out_max", lambda: expect_error(
            lambda: max_and_argmax_sparse(m(), m(), m(), m(), pt.vector(), m()), ["max_and_argmax_sparse", "out_max"]))]


class CrossEntropySparse(Harness):
    name = "crossentropy_softmax_and_gradient_z_sparse"
    outputs = {"ce": 1, "grad_z": 1, "dz": 1}

    def symbols(self):
        pt = _pt()
        return [pt.tensor3("z"), pt.matrix("z_mask"),
                *coo_symbols(("y_target_t", "y_target_i", "y_target_w", "y_target_mask"))]

    def graph(self, *s):
        import pytensor

        from ptnative.ops.sparse import crossentropy_softmax_and_gradient_z_sparse

        ce, grad_z = crossentropy_softmax_and_gradient_z_sparse(*s)
        return [ce, grad_z, pytensor.grad(ce.sum(), s[0])]

    def strict(self, *s):
        from ptnative.ops.sparse import crossentropy_softmax_and_gradient_z_sparse

        return list(crossentropy_softmax_and_gradient_z_sparse(*s, strict=True))

    def valid(self):
        r = np.random.default_rng(17)
        s0, s1, w, m = coo_values(17)
        return [r.normal(size=(4, 2, 3)), np.ones((4, 2)), s0, s1, w, m]

    def runtime_cases(self):
        from .reference import sparse as ref

        def ref_check(**changes):
            def run():
                vals = self.with_values(**changes)
                ce, grad, dz, _ = ref.crossentropy_softmax_sparse(*vals)
                all_equal([np.round(g, 10) for g in self(*vals)], [np.round(v, 10) for v in (ce, grad, dz)],
                          self.output_names)
            return run

        def nan_counted():
            vals = self.with_values(z=lambda z: _set(z, (1, 0, 0), NAN))
            got = self(*vals)
            assert np.isnan(got[0][1, 0]) and np.isnan(got[1][1, 0]).all(), "NaN logit on a counted frame"
            same_batch_entries(got, self.clean(), self.batch_axes, [1], self.output_names)

        return [
            ("nan:z_counted", nan_counted),
            ("nan:z_uncounted", ref_check(z=lambda z: _set(z, (1, 0, 0), NAN), z_mask=lambda m: _set(m, (1, 0), 0.0))),
            ("nan:z_mask", ref_check(z_mask=lambda m: _set(m, (1, 0), NAN))),
            ("nan:y_target_t", ref_check(y_target_t=lambda s: _set(s, (2, 0), NAN))),
            ("nan:y_target_mask", ref_check(y_target_mask=lambda s: _set(s, (2, 0), NAN))),
            ("bad_value:z_mask_cutoff", ref_check(z_mask=lambda m: _set(_set(m, (0, 0), 0.49), (1, 0), 0.51))),
            ("bad_value:y_target_mask_cutoff", ref_check(y_target_mask=lambda m: _set(_set(m, (2, 0), 0.09),
                                                                                      (3, 0), 0.11))),
            ("out_of_range_label:skipped", ref_check(y_target_i=lambda s: _set(s, (2, 0), 3.0))),
            ("out_of_range_label:strict", lambda: expect_error(
                lambda: self(*self.with_values(y_target_i=lambda s: _set(s, (2, 0), 3.0)), key="strict",
                             builder=self.strict), [self.name, "y_target_i"])),
            ("empty_batch:B0", ref_check(z=np.zeros((4, 0, 3)), z_mask=np.zeros((4, 0)),
                                         **{k: np.zeros((6, 0)) for k in ("y_target_t", "y_target_i", "y_target_w",
                                                                         "y_target_mask")})),
            ("zero_length:N0", ref_check(**{k: np.zeros((0, 2)) for k in ("y_target_t", "y_target_i", "y_target_w",
                                                                         "y_target_mask")})),
            ("shape_mismatch:z_mask", lambda: expect_error(lambda: self(*self.with_values(z_mask=np.ones((4, 3)))),
                                                           [self.name, "z_mask"])),
        ]

    def build_cases(self):
        pt = _pt()
        from ptnative.ops.sparse import crossentropy_softmax_and_gradient_z_sparse, onehot_to_sparse

        m = pt.matrix
        return [
            ("wrong_dtype:z", lambda: expect_error(
                lambda: crossentropy_softmax_and_gradient_z_sparse(pt.itensor3(), m(), m(), m(), m(), m()),
                [self.name, "z"])),
            ("wrong_ndim:z_mask", lambda: expect_error(
                lambda: crossentropy_softmax_and_gradient_z_sparse(pt.tensor3(), pt.vector(), m(), m(), m(), m()),
                [self.name, "z_mask"])),
            ("wrong_ndim:onehot_to_sparse", lambda: expect_error(lambda: onehot_to_sparse(pt.vector(), m()),
                                                                 ["onehot_to_sparse", "y"])),
        ]


# ------------------------------------------------------------------------------------------------- leaks
def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class MemoryLeak:
    """Many failing and succeeding calls (kernel errors included) leave the resident memory flat."""

    name = "memory_leak"
    CALLS, WARMUP, LIMIT = 3000, 300, 2 * 2**20  # the issue measured 4-8 KB per failing call in the default mode

    def __init__(self, mode):
        self.mode = mode

    def flat(self, harness, values, fails):
        import gc

        h = harness(self.mode)

        def call():
            try:
                h(*values)
            except ValueError:
                if not fails:
                    raise
            else:
                assert not fails, "the call was expected to fail"

        def run():
            for _ in range(self.WARMUP):
                call()
            gc.collect()
            before = rss_bytes()
            for _ in range(self.CALLS):
                call()
            gc.collect()
            grown = rss_bytes() - before
            assert grown < self.LIMIT, (f"{harness.name}: resident memory grew by {grown / 1024:.0f} KiB over "
                                        f"{self.CALLS} {'failing' if fails else 'succeeding'} calls")
        return run

    def cases(self):
        ctc, ed = Ctc(self.mode), EditDistance(self.mode)
        out = [
            ("leak:ctc_loss_failing", self.flat(Ctc, ctc.with_values(logits_seq_lens=np.array([7, 4, 5], np.int32)),
                                                True)),
            ("leak:ctc_loss_succeeding", self.flat(Ctc, ctc.valid(), False)),
            ("leak:edit_distance_failing", self.flat(EditDistance, ed.with_values(a_len=np.array([9, 0, 3], np.int32)),
                                                     True)),
            ("leak:rnnt_loss_failing", self.flat(Rnnt, Rnnt(self.mode).with_values(
                labels=np.array([[1, 9], [3, 1], [2, 2]], np.int32)), True)),
        ]
        return [(cid, "leak", fn) for cid, fn in out]


from . import fuzz_hsmm  # noqa: E402  (its harnesses build on Harness, above)

HARNESSES = {h.name: h for h in (
    Lstm, LstmCellH, TwoD, CtcFsa, FastBW, FastViterbi, Ctc, CtcViterbi, Hmm, Rnnt, MultiRnnt, RnntLattice,
    EditDistance, OptimalCompletion, PerSuccessor, NextRow, NextReduce, Chunk, Unchunk, BatchedIndex, SparseToDenseH,
    MaxArgmax, CrossEntropySparse, HmmViterbiH, HmmPosteriorsH, HmmSampleH, MemoryLeak, *fuzz_hsmm.HARNESSES)}
FUNCTIONS = sorted(HARNESSES)


def cases_for(function, mode, eager=False):
    """The cases of ``function`` in ``mode``; ``eager``: its graphs called through ``ptnative.eager.wrap`` instead
    (the run-time cases and the graph-build ones: a new dtype or rank is a new graph there)."""
    if eager:
        return [c for c in HARNESSES[function](None, eager=True).cases() if c[1] != "leak"]
    return HARNESSES[function](mode).cases()
