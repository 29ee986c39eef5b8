"""Generated NativeOp specs for tests/test_fuzz.py: hypothesis strategies (parent side) and the cases that
one spec runs in the fuzz worker (child side).

A *valid* spec has input 0 of the generic float type, read by a small strided kernel that writes
``2 * x + 1`` into output 0 (shaped by refs to input 0); every other output k is filled with ``k + 1``.
Names (of the op, inputs and outputs) are drawn from fragments that break C string literals and format
strings.  An *invalid* spec is a valid one with one mutation from :data:`MUTATIONS`; creating the op must
raise ``ValueError`` naming the op (and, where the issue asks for it, the closest valid key or ``%%``).
"""

import numpy as np

#: Pieces of names: C format directives, quotes, backslashes, newlines, comment and trigraph openers.
NAME_FRAGMENTS = ["x", "in", "_", "%s", "%n", "%d", "%%", "%(fail)s", '"', "'", "\\", "\n", "\t", "*/", "/*",
                  "??/", "{", "}", "\u00e9", " ", "0"]
OUT_DTYPES = ["float32", "float64", "int32", "int64", "uint8"]
C_TYPES = {"float64": "double", "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t"}
NP_INT = {"int32": np.int32, "int64": np.int64, "uint8": np.uint8}

#: One-line defects of a valid spec, each of which must be a ValueError naming the op.
MUTATIONS = [
    "in_info_none", "in_info_int", "in_info_dict", "in_info_str", "out_info_none", "entry_not_dict",
    "ndim_missing", "ndim_negative", "ndim_float", "ndim_str", "ndim_bool", "ndim_too_big", "shape_wrong_length",
    "shape_entry_str", "shape_entry_float", "shape_entry_bool", "ref_str_idx", "ref_none_dim", "ref_float_idx",
    "ref_short", "ref_long", "ref_bad_input", "ref_bad_dim", "out_no_shape", "shape_negative", "unknown_dtype",
    "unknown_key", "inplace_bad_index", "inplace_twice", "inplace_ndim", "gradient_bad", "lone_percent",
]


# ------------------------------------------------------------------------------------------- parent side
def strategies():
    """``(valid_specs, invalid_specs)``: a hypothesis strategy of JSON-able spec dicts, and a function of a
    mutation name giving a strategy of specs with that mutation."""
    from hypothesis import strategies as st

    names = st.lists(st.sampled_from(NAME_FRAGMENTS), min_size=1, max_size=4).map("".join)

    @st.composite
    def valid(draw):
        n_in = draw(st.integers(1, 3))
        in_info, sizes = [], []
        for i in range(n_in):
            ndim = draw(st.integers(0, 3))
            dims = [draw(st.integers(0, 3)) for _ in range(ndim)]
            shape = [draw(st.sampled_from(["none", "int", "ref"])) for _ in range(ndim)]
            info = {"name": draw(names), "ndim": ndim,
                    "shape": [None if s == "none" else dims[d] if s == "int" else [0, 0] for d, s in enumerate(shape)]}
            if i == 0:
                if draw(st.booleans()):
                    info["need_contiguous"] = True
            else:
                dtype = draw(st.sampled_from(OUT_DTYPES))
                if dtype != "float32":
                    info["dtype"] = dtype
                if draw(st.booleans()):
                    info["gradient"] = "disconnected"
            in_info.append(info)
            sizes.append(dims)
        n_out = draw(st.integers(1, 3))
        out_info = [{"name": draw(names), "ndim": in_info[0]["ndim"],
                     "shape": [[0, d] for d in range(in_info[0]["ndim"])]}]
        for _ in range(1, n_out):
            ndim = draw(st.integers(0, 2))
            shape = []
            for _ in range(ndim):
                refs = [[i, d] for i, info in enumerate(in_info) for d in range(info["ndim"])]
                if refs and draw(st.booleans()):
                    shape.append(draw(st.sampled_from(refs)))
                else:
                    shape.append(draw(st.integers(0, 3)))
            info = {"name": draw(names), "ndim": ndim, "shape": shape}
            dtype = draw(st.sampled_from(OUT_DTYPES))
            if dtype != "float32":
                info["dtype"] = dtype
            out_info.append(info)
        if draw(st.booleans()):
            in_info[0]["want_inplace"] = 0
        return {"name": draw(names), "in_info": in_info, "out_info": out_info, "sizes": sizes,
                "float": draw(st.sampled_from(["float32", "float64"])), "seed": draw(st.integers(0, 2**16))}

    def invalid(mutation):
        return valid().map(lambda spec: dict(spec, mutation=mutation))

    return valid(), invalid


# -------------------------------------------------------------------------------------------- child side
def kernel_code(spec):
    """The forward code of a valid spec: output 0 = 2 * input 0 + 1 (strided reads), output k = k + 1."""
    lines = [
        "Ndarray* x = inputs[0];",
        "Ndarray* y = *outputs[0];",
        "int nd = Ndarray_NDIM(x);",
        "for (int64_t i = 0; i < (int64_t)Ndarray_SIZE(x); ++i) {",
        "  int64_t rem = i, off = 0;",
        "  for (int k = nd - 1; k >= 0; --k) {",
        "    int64_t d = Ndarray_DIMS(x)[k];",
        "    off += (rem %% d) * Ndarray_STRIDE(x, k);",
        "    rem /= d;",
        "  }",
        "  Ndarray_DEV_DATA(y)[i] = Ndarray_DEV_DATA(x)[off] * 2 + 1;",
        "}",
    ]
    for k, info in enumerate(spec["out_info"][1:], start=1):
        dtype = info.get("dtype", "float32")
        ctype = C_TYPES.get(dtype, "Float")
        lines.append(f"for (int64_t i = 0; i < (int64_t)Ndarray_SIZE(*outputs[{k}]); ++i) "
                     f"(({ctype}*)(*outputs[{k}])->data)[i] = ({ctype})({k} + 1);")
    return "\n".join(lines) + "\n"


def mutate(spec):
    """``(in_info, out_info, c_fw_code, expected message fragments)`` of an invalid spec."""
    m = spec["mutation"]
    ins = [dict(i) for i in spec["in_info"]]
    outs = [dict(o) for o in spec["out_info"]]
    code = kernel_code(spec)
    need = []
    last_in = ins[-1]
    if m == "in_info_none":
        ins = None
    elif m == "in_info_int":
        ins = 3
    elif m == "in_info_dict":
        ins = ins[0]
    elif m == "in_info_str":
        ins = "x"
    elif m == "out_info_none":
        outs = None
    elif m == "entry_not_dict":
        ins = ins + ["x"]
    elif m == "ndim_missing":
        del last_in["ndim"]
    elif m == "ndim_negative":
        last_in["ndim"] = -1
    elif m == "ndim_float":
        last_in["ndim"] = float(last_in["ndim"])
    elif m == "ndim_str":
        last_in["ndim"] = str(last_in["ndim"])
    elif m == "ndim_bool":
        outs[-1]["ndim"] = True
    elif m == "ndim_too_big":
        last_in["ndim"] = 9
        last_in["shape"] = [None] * 9
    elif m == "shape_wrong_length":
        outs[-1]["shape"] = list(outs[-1]["shape"]) + [1]
    elif m == "shape_entry_str":
        outs[-1]["shape"] = ["a"] + list(outs[-1]["shape"])
        outs[-1]["ndim"] += 1
    elif m == "shape_entry_float":
        outs[-1]["shape"] = [1.0] + list(outs[-1]["shape"])
        outs[-1]["ndim"] += 1
    elif m == "shape_entry_bool":
        outs[-1]["shape"] = [True] + list(outs[-1]["shape"])
        outs[-1]["ndim"] += 1
    elif m in ("ref_str_idx", "ref_none_dim", "ref_float_idx", "ref_short", "ref_long", "ref_bad_input",
               "ref_bad_dim"):
        ref = {"ref_str_idx": ["a", 0], "ref_none_dim": [0, None], "ref_float_idx": [0.0, 0], "ref_short": [0],
               "ref_long": [0, 0, 0], "ref_bad_input": [len(ins), 0],
               "ref_bad_dim": [0, ins[0]["ndim"]]}[m]
        outs[-1]["shape"] = [ref] + list(outs[-1]["shape"])
        outs[-1]["ndim"] += 1
    elif m == "out_no_shape":
        del outs[-1]["shape"]
    elif m == "shape_negative":
        outs[-1]["shape"] = [-1] + list(outs[-1]["shape"])
        outs[-1]["ndim"] += 1
    elif m == "unknown_dtype":
        last_in["dtype"] = "float16"
    elif m == "unknown_key":
        last_in["need_contigous"] = True
        need.append("need_contiguous")
    elif m == "inplace_bad_index":
        last_in["want_inplace"] = len(outs)
    elif m == "inplace_twice":
        ins = ins + [dict(ins[0], name="twin")]
        ins[0]["want_inplace"] = ins[-1]["want_inplace"] = 0
    elif m == "inplace_ndim":
        outs = outs + [{"name": "o", "ndim": ins[0]["ndim"] + 1, "shape": [0] * (ins[0]["ndim"] + 1)}]
        ins[0]["want_inplace"] = len(outs) - 1
    elif m == "gradient_bad":
        last_in["gradient"] = "connected"
    elif m == "lone_percent":
        code = 'printf("%d\\n", 1);\n' + code
        need.append("%%")
    else:
        raise AssertionError(f"unknown mutation {m!r}")
    return ins, outs, code, need


def _input_values(spec, rng, dtype):
    values = []
    for info, dims in zip(spec["in_info"], spec["sizes"]):
        d = info.get("dtype", "float32")
        if d == "float32":
            values.append(rng.normal(size=dims).astype(dtype))
        elif d == "float64":
            values.append(rng.normal(size=dims))
        else:
            values.append(rng.integers(0, 100, size=dims).astype(NP_INT[d]))
    return values


def _expected(spec, values, dtype):
    sizes = [v.shape for v in values]
    out = [values[0].astype(dtype) * 2 + 1]
    for k, info in enumerate(spec["out_info"][1:], start=1):
        shape = tuple(s if isinstance(s, int) else sizes[s[0]][s[1]] for s in info["shape"])
        d = info.get("dtype", "float32")
        out.append(np.full(shape, k + 1, dtype=dtype if d == "float32" else d))
    return out


def cases_for(spec):
    import pytensor
    import pytensor.tensor as pt

    from ptnative import NativeOp

    if "mutation" in spec:
        def invalid():
            ins, outs, code, need = mutate(spec)
            try:
                NativeOp(ins, outs, code, name=spec["name"])
            except ValueError as e:
                msg = str(e)
                assert spec["name"] in msg or repr(spec["name"]) in msg, \
                    f"the ValueError does not name the op {spec['name']!r}: {msg}"
                for fragment in need:
                    assert fragment in msg, f"the ValueError does not mention {fragment!r}: {msg}"
                return
            except Exception as e:  # noqa: BLE001
                raise AssertionError(f"expected ValueError naming the op, got {type(e).__name__}: {e}") from e
            raise AssertionError("creating the op raised nothing")

        return [(f"invalid_spec:{spec['mutation']}", "invalid_spec", invalid)]

    op = NativeOp(spec["in_info"], spec["out_info"], kernel_code(spec), name=spec["name"])
    dtype = spec["float"]
    variables = []
    for k, info in enumerate(spec["in_info"]):
        d = info.get("dtype", "float32")
        variables.append(pt.tensor(f"v{k}", dtype=dtype if d == "float32" else d, shape=(None,) * info["ndim"]))
    outs = op(*variables)
    outs = outs if isinstance(outs, list | tuple) else [outs]
    values = _input_values(spec, np.random.default_rng(spec["seed"]), dtype)
    expected = _expected(spec, values, dtype)
    cases = []
    compiled = {}

    def function(mode):
        """The spec's function in ``mode``, compiled once for the cases of that mode (a default-mode graph is
        compiled anew by every ``pytensor.function``)."""
        if mode not in compiled:
            compiled[mode] = pytensor.function(variables, outs, mode=mode)
        return compiled[mode]

    for mode in (None, "C", "CVM", "FAST_COMPILE"):
        def run(mode=mode):
            f = function(mode)
            got = f(*[v.copy() for v in values])
            for k, (g, e) in enumerate(zip(got, expected)):
                assert g.shape == e.shape and g.dtype == e.dtype, \
                    f"output {k}: {g.shape} {g.dtype}, expected {e.shape} {e.dtype}"
                np.testing.assert_array_equal(g, e, err_msg=f"output {k}")
            return f

        def strided(mode=mode):
            f = function(mode)
            v0 = values[0]
            big = np.zeros(tuple(2 * s for s in v0.shape), dtype=v0.dtype)
            view = big[tuple(slice(None, None, -2) for _ in v0.shape)]
            view[...] = v0
            got = f(view, *[v.copy() for v in values[1:]])
            np.testing.assert_array_equal(got[0], expected[0], err_msg="negative-stride view of input 0")

        m = mode or "default"
        cases.append((f"valid_spec:{m}", "valid_spec", run))
        if values[0].ndim:
            cases.append((f"negative_stride:{m}", "negative_stride", strided))
        sized = [(i, d, info["shape"][d]) for i, info in enumerate(spec["in_info"])
                 for d in range(info["ndim"]) if isinstance(info["shape"][d], int)]
        if sized:
            i, d, s = sized[0]

            def bad_size(mode=mode, i=i, d=d, s=s):
                f = function(mode)
                bad = list(values)
                shape = list(bad[i].shape)
                shape[d] = s + 1
                bad[i] = np.zeros(shape, dtype=bad[i].dtype)
                try:
                    f(*bad)
                except ValueError as e:
                    assert spec["name"] in str(e) or repr(spec["name"]) in str(e), \
                        f"the ValueError does not name the op {spec['name']!r}: {e}"
                    return
                raise AssertionError(f"input {i} with size {s + 1} in dim {d} (spec: {s}) raised nothing")

            cases.append((f"wrong_size:{m}", "wrong_size", bad_size))
    return cases
