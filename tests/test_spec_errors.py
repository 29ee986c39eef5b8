"""A malformed spec is a ValueError naming the op, the entry and the key, raised when the op is created
(before anything is compiled); never a bare TypeError / KeyError from deep inside."""

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptnative import NativeOp
from ptnative.spec import INFO_KEYS

IN = ({"name": "x", "ndim": 2, "shape": (None, None)},)
OUT = ({"name": "y", "ndim": 2, "shape": ((0, 0), (0, 1))},)


def make(in_info=IN, out_info=OUT, c_fw_code="", **kw):
    return NativeOp(in_info, out_info, c_fw_code, name="Bad", **kw)


def entry_error(kind, entry, idx, key, detail=""):
    """The start of the message for a defect of one entry's key."""
    return re.escape(f"NativeOp 'Bad': {kind} {entry!r} (#{idx}), key {key!r}") + (": " + detail if detail else "")


# ------------------------------------------------------------------------------- containers
@pytest.mark.parametrize("kind", ["in_info", "out_info"])
@pytest.mark.parametrize("value, got", [
    (None, "NoneType None"), (3, "int 3"), ({"ndim": 1}, "dict"), ("x", "str 'x'"), (b"x", "bytes"),
    (1.5, "float"), ({"ndim", "shape"}, "set"),
])
def test_info_must_be_a_list_of_dicts(kind, value, got):
    spec = {"in_info": IN, "out_info": OUT, kind: value}
    with pytest.raises(ValueError, match=rf"NativeOp 'Bad': {kind} must be a list or tuple of dicts .*got {got}"):
        make(**spec)


@pytest.mark.parametrize("kind", ["in_info", "out_info"])
@pytest.mark.parametrize("entry", [None, 1, "ndim", [("ndim", 1)], ({"ndim": 1},)])
def test_entry_must_be_a_dict(kind, entry):
    spec = {"in_info": IN, "out_info": OUT}
    spec[kind] = tuple(spec[kind]) + (entry,)
    what = "input" if kind == "in_info" else "output"
    with pytest.raises(ValueError, match=rf"NativeOp 'Bad': {kind} #1 must be a dict describing {what} 1, "
                                         rf"got {type(entry).__name__}"):
        make(**spec)


def test_no_outputs():
    with pytest.raises(ValueError, match="NativeOp 'Bad': out_info is empty"):
        make(out_info=[])


# ------------------------------------------------------------------------------- keys
@pytest.mark.parametrize("key, closest", [
    ("need_contigous", "need_contiguous"), ("want_inplce", "want_inplace"), ("dtpye", "dtype"), ("shap", "shape"),
    ("ndims", "ndim"), ("host_mem", "host_memory"), ("bw_out", "bw_out_var"), ("Gradient", "gradient"),
])
def test_unknown_key_names_the_closest(key, closest):
    detail = f"unknown key; did you mean {closest!r}"
    with pytest.raises(ValueError, match=entry_error("in_info", "x", 0, key, detail)):
        make(in_info=[dict(IN[0], **{key: True})])


def test_unknown_key_without_a_close_one_lists_the_keys():
    keys = "unknown key; the keys are batch_axis, bw_grad_var, .*, want_inplace$"
    with pytest.raises(ValueError, match=entry_error("out_info", "y", 0, "zzz", keys)):
        make(out_info=[dict(OUT[0], zzz=1)])
    with pytest.raises(ValueError, match=entry_error("out_info", "y", 0, 5, "unknown key")):
        make(out_info=[{**OUT[0], 5: 1}])


def test_entry_name_must_be_a_str():
    with pytest.raises(ValueError, match=r"NativeOp 'Bad': in_info #0, key 'name': must be a str, got 7"):
        make(in_info=[dict(IN[0], name=7)])


@pytest.mark.parametrize("ndim, detail", [
    (None, "a non-negative int is required, got None"), (-1, "a non-negative int is required, got -1"),
    (1.0, "a non-negative int is required, got 1.0"), ("2", "a non-negative int is required, got '2'"),
    (True, "a non-negative int is required, got True"), (9, "at most 8 dimensions are supported, got 9"),
])
def test_bad_ndim(ndim, detail):
    with pytest.raises(ValueError, match=entry_error("in_info", "x", 0, "ndim", re.escape(detail))):
        make(in_info=[{"name": "x", "ndim": ndim}])


def test_missing_ndim():
    with pytest.raises(ValueError, match=entry_error("out_info", "y", 0, "ndim", "missing")):
        make(out_info=[{"name": "y", "shape": ()}])


@pytest.mark.parametrize("dtype", ["float16", "complex64", None, np.float32, "int"])
def test_bad_dtype(dtype):
    with pytest.raises(ValueError, match=entry_error("in_info", "x", 0, "dtype", "unknown dtype .*known: float32")):
        make(in_info=[dict(IN[0], dtype=dtype)])


@pytest.mark.parametrize("key", ["need_contiguous", "host_memory", "dummy", "is_inplace", "bw_input"])
@pytest.mark.parametrize("value", ["yes", 2, None, [True]])
def test_flags_are_bools(key, value):
    with pytest.raises(ValueError, match=entry_error("in_info", "x", 0, key, "must be True or False")):
        make(in_info=[dict(IN[0], **{key: value})])


@pytest.mark.parametrize("value", [True, "dummy", -2, 1.0, None, (0,)])
def test_bad_want_inplace_value(value):
    with pytest.raises(ValueError, match=entry_error("in_info", "x", 0, "want_inplace", "must be -1, 'dummy_out' or "
                                                                                         "an output index")):
        make(in_info=[dict(IN[0], want_inplace=value)])


@pytest.mark.parametrize("in_info, out_info, detail", [
    ([dict(IN[0], want_inplace=1)], OUT, "must be -1, 'dummy_out' or an output index < 1, got 1"),
    ([dict(IN[0], want_inplace=0), dict(IN[0], name="z", want_inplace=0)], OUT, None),
    ([dict(IN[0], want_inplace=0)], [{"name": "y", "ndim": 1, "shape": ((0, 0),)}],
     "output 0 has ndim 1, the input has 2"),
    ([dict(IN[0], want_inplace=0)], [dict(OUT[0], dtype="int32")], "output 0 has another dtype than the input"),
])
def test_want_inplace_target(in_info, out_info, detail):
    if detail is None:  # the second input claims output 0 again
        match = entry_error("in_info", "z", 1, "want_inplace", "output 0 is already claimed by input 0")
    else:
        match = entry_error("in_info", "x", 0, "want_inplace", re.escape(detail))
    with pytest.raises(ValueError, match=match):
        make(in_info=in_info, out_info=out_info)


@pytest.mark.parametrize("value", ["maybe", None, True, "Disconnected"])
def test_bad_gradient(value):
    with pytest.raises(ValueError, match=entry_error("in_info", "x", 0, "gradient", "only 'disconnected' is allowed")):
        make(in_info=[dict(IN[0], gradient=value)])


@pytest.mark.parametrize("value, detail", [
    (5, "must be a dict of overrides, got 5"),
    ({"need_contigous": True}, "override 'need_contigous': unknown key; did you mean 'need_contiguous'"),
    ({"ndim": -1}, "override 'ndim': a non-negative int is required"),
    ({"bw_in_var": {}}, "override 'bw_in_var': overrides do not nest"),
])
@pytest.mark.parametrize("key", ["bw_in_var", "bw_out_var", "bw_grad_var"])
def test_bad_overrides(key, value, detail):
    with pytest.raises(ValueError, match=entry_error("out_info", "y", 0, key, re.escape(detail))):
        make(out_info=[dict(OUT[0], **{key: value})])


# ------------------------------------------------------------------------------- shapes and refs
@pytest.mark.parametrize("kind", ["in_info", "out_info"])
@pytest.mark.parametrize("shape, detail", [
    ("ab", "must be a list or tuple of length ndim=2, got 'ab'"),
    ((0,), "must be a list or tuple of length ndim=2, got (0,)"),
    ((0, 0, 0), "must be a list or tuple of length ndim=2"),
    (5, "must be a list or tuple of length ndim=2, got 5"),
    ((1, "a"), "dim 1: expected an int"),
    ((1.5, 1), "dim 0: expected an int"),
    ((True, 1), "dim 0: expected an int"),
    ((1, -3), "dim 1: negative size -3"),
    ((("a", 0), 1), "dim 0: a ref is a pair of ints (in_idx, dim), got ('a', 0)"),
    (((0, None), 1), "dim 0: a ref is a pair of ints (in_idx, dim), got (0, None)"),
    (((0.0, 0), 1), "dim 0: a ref is a pair of ints (in_idx, dim), got (0.0, 0)"),
    (((True, 0), 1), "dim 0: a ref is a pair of ints (in_idx, dim), got (True, 0)"),
    (((0, False), 1), "dim 0: a ref is a pair of ints (in_idx, dim), got (0, False)"),
    (((0,), 1), "dim 0: a ref is a pair of ints (in_idx, dim), got (0,)"),
    ((1, (0, 0, 1)), "dim 1: a ref is a pair of ints (in_idx, dim), got (0, 0, 1)"),
    ((1, {0: 0}), "dim 1: expected an int"),
])
def test_bad_shape(kind, shape, detail):
    infos = {"in_info": IN, "out_info": OUT}
    name = "x" if kind == "in_info" else "y"
    infos[kind] = [{"name": name, "ndim": 2, "shape": shape}]
    with pytest.raises(ValueError, match=entry_error(kind, name, 0, "shape", re.escape(detail))):
        make(**infos)


@pytest.mark.parametrize("shape, detail", [
    (None, "outputs need a shape"),
    (((1, 0), 1), "dim 0: ref (1, 0) names input 1, but there are 1 inputs"),
    (((-1, 0), 1), "dim 0: ref (-1, 0) names input -1, but there are 1 inputs"),
    ((1, (0, 2)), "dim 1: ref (0, 2) names dim 2 of input 0, which has ndim 2"),
    ((1, (0, -1)), "dim 1: ref (0, -1) names dim -1 of input 0, which has ndim 2"),
    ((None, 1), "dim 0: expected an int or an (in_idx, dim) ref, got None"),
])
def test_bad_output_shape(shape, detail):
    out = {"name": "y", "ndim": 2} if shape is None else {"name": "y", "ndim": 2, "shape": shape}
    with pytest.raises(ValueError, match=entry_error("out_info", "y", 0, "shape", re.escape(detail))):
        make(out_info=[out])


def test_unnamed_entry_is_named_by_its_index():
    with pytest.raises(ValueError, match=entry_error("out_info", "#1", 1, "shape", "outputs need a shape")):
        make(out_info=[OUT[0], {"ndim": 0}])


# ------------------------------------------------------------------------------- kernel code
@pytest.mark.parametrize("key", ["c_fw_code", "c_bw_code"])
@pytest.mark.parametrize("code, line, what", [
    ('printf("%d\\n", n);', 1, "a lone '%'"),
    ("int a = 1;\nint b = a % 2;\n", 2, "a lone '%'"),
    ("x;\ny;\nz = 5 %", 3, "a lone '%'"),
    ("%%%", 1, "a lone '%'"),
    ("%(fail)d", 1, r"'%\(fail\)d' is not a substitution \(did you mean '%\(fail\)s'\?\)"),
    ("if (x) { %(failure)s }", 1, r"unknown substitution '%\(failure\)s' \(only '%\(fail\)s' is defined\)"),
    ("%(fail)", 1, r"'%\(fail\)' is not a substitution \(did you mean '%\(fail\)s'\?\)"),
    ("%s", 1, "a lone '%'"),
])
def test_lone_percent_in_code(key, code, line, what):
    kw = {key: code} if key == "c_bw_code" else {"c_fw_code": code}
    with pytest.raises(ValueError, match=rf"NativeOp 'Bad': {key} line {line}: {what} in .*write '%%' for a "
                                         r"literal percent sign"):
        make(**kw)


@pytest.mark.parametrize("code", ["", "%%", "%(fail)s", "a = b %% 2; if (a) { %(fail)s }\n%%%%", "100%%\n"])
def test_valid_percent_directives(code):
    op = make(c_fw_code=code, c_bw_code=code)
    assert op.c_fw_code == code
    code % {"fail": "F"}  # what source.generate does: it formats


FRAGMENTS = ["%", "%%", "%(fail)s", "%(fail)", "(fail)s", "%d", "x", " ", "\n", "%("]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=8).map("".join))
def test_percent_rule_matches_python_formatting(code):
    """Accepted iff the only directives are %% and %(fail)s; then %-formatting with {"fail": ...} works."""
    valid = "%" not in re.sub(r"%%|%\(fail\)s", "", code)
    try:
        make(c_fw_code=code)
    except ValueError as e:
        assert not valid, f"{code!r} is valid but was refused: {e}"
        assert "NativeOp 'Bad': c_fw_code line " in str(e) and "'%%'" in str(e)
        return
    assert valid, f"{code!r} was accepted"
    expected = re.sub(r"%%|%\(fail\)s", lambda m: "%" if m.group() == "%%" else "F", code)
    assert code % {"fail": "F"} == expected


@pytest.mark.parametrize("key, value, detail", [
    ("c_fw_code", None, "c_fw_code must be a str, got NoneType"),
    ("c_fw_code", b"x", "c_fw_code must be a str, got bytes"),
    ("c_fw_code", ["x"], "c_fw_code must be a str, got list"),
    ("c_bw_code", 5, "c_bw_code must be a str or None, got int"),
    ("c_extra_support_code", 5, "c_extra_support_code must be a str, a dict of str or a list of str, got int"),
    ("c_extra_support_code", {"a": 5}, "c_extra_support_code['a'] must be a str, got int"),
    ("c_extra_support_code", ["x", None], "c_extra_support_code[1] must be a str, got NoneType"),
    ("c_extra_support_code", {1: "x", "b": "y"}, "c_extra_support_code keys must be str"),
    ("code_version", "abc", "code_version must be an int or a tuple of ints, got 'abc'"),
    ("code_version", 1.5, "code_version must be an int or a tuple of ints, got 1.5"),
    ("code_version", (1, "2"), "code_version must be an int or a tuple of ints, got (1, '2')"),
    ("code_version", (True,), "code_version must be an int or a tuple of ints, got (True,)"),
    ("cpu_support", "no", "cpu_support must be True or False, got 'no'"),
    ("cpu_support", None, "cpu_support must be True or False, got None"),
])
def test_bad_arguments(key, value, detail):
    kw = {"c_fw_code": ""}
    kw[key] = value
    with pytest.raises(ValueError, match="NativeOp 'Bad': " + re.escape(detail)):
        make(**kw)


def test_name_must_be_a_str():
    with pytest.raises(ValueError, match="NativeOp: name must be a str or None, got 5"):
        NativeOp(IN, OUT, "", name=5)


@pytest.mark.parametrize("value, detail", [
    ((0, "1"), "grad_input_map[1] must be an int, got '1'"),
    ((0, 1.0), "grad_input_map[1] must be an int, got 1.0"),
    ((True,), "grad_input_map[0] must be an int, got True"),
    ((0, 3), "grad_input_map[1] = 3 is out of range (inputs + outputs + output grads = 3)"),
    ((-1,), "grad_input_map[0] = -1 is out of range"),
    ((0, 0), "grad_input_map names an index twice: (0, 0)"),
    (5, "grad_input_map must be a sequence of ints or a callable returning one, got 5"),
    ("01", "grad_input_map must be a sequence of ints or a callable returning one, got '01'"),
    (lambda x, y, dy: None, "grad_input_map must be a sequence of ints or a callable returning one, got None"),
    (lambda x, y: (x, y), "grad_input_map, called with the indices 0..2 of inputs + outputs + output grads, "
                          "raised TypeError"),
    (lambda x, y, dy: (x, 7), "grad_input_map[1] = 7 is out of range"),
])
def test_bad_grad_input_map(value, detail):
    with pytest.raises(ValueError, match="NativeOp 'Bad': " + re.escape(detail)):
        make(grad_input_map=value)


def test_valid_forms_are_normalised():
    op = make(in_info=[{"name": "x", "ndim": np.int64(2), "shape": [None, np.int32(3)], "need_contiguous": 1}],
              out_info=[{"name": "y", "ndim": 2, "shape": [[0, 0], (np.int64(0), 1)]}],
              code_version=[1, np.int64(2)], grad_input_map=lambda x, y, dy: [x, dy], cpu_support=np.True_)
    assert op.in_info[0]["ndim"] == 2 and type(op.in_info[0]["ndim"]) is int
    assert op.in_info[0]["shape"] == (None, 3) and op.out_info[0]["shape"] == ((0, 0), (0, 1))
    assert op.code_version == (1, 2) and op.grad_input_map == (0, 2) and op.cpu_support is True
    assert op == make(in_info=[{"name": "x", "ndim": 2, "shape": (None, 3), "need_contiguous": 1}],
                      out_info=[{"name": "y", "ndim": 2, "shape": ((0, 0), (0, 1))}], code_version=(1, 2),
                      grad_input_map=(0, 2))
    assert make(code_version=3).code_version == (3,)


# ------------------------------------------------------------------------------- any garbage
GARBAGE = st.one_of(st.none(), st.booleans(), st.integers(-3, 12), st.floats(allow_nan=True), st.text(max_size=4),
                    st.binary(max_size=2), st.lists(st.integers(-1, 3), max_size=3).map(tuple),
                    st.lists(st.one_of(st.none(), st.integers(-1, 3), st.text(max_size=1)), max_size=3),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
KEYS = st.one_of(st.sampled_from(sorted(INFO_KEYS)), st.text(min_size=1, max_size=12))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["in_info", "out_info"]), key=KEYS, value=GARBAGE)
def test_any_garbage_value_is_accepted_or_a_named_value_error(kind, key, value):
    """Whatever one key holds: the op is made, or a ValueError names the op, the entry and the key."""
    infos = {"in_info": [dict(IN[0])], "out_info": [dict(OUT[0])]}
    infos[kind][0][key] = value
    try:
        make(**infos)
    except ValueError as e:
        msg = str(e)
        # The mutated entry, or the other one when the value breaks a ref or a want_inplace target across entries.
        assert re.match(r"NativeOp 'Bad': (in|out)_info (.+ \(#0\)|#0), key .+: ", msg, re.S), msg
        if f"key {key!r}" not in msg:
            assert key in ("ndim", "want_inplace", "dtype", "shape", "dummy"), msg


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["in_info", "out_info"]), value=st.one_of(GARBAGE, st.lists(GARBAGE, max_size=3)))
def test_any_garbage_container_is_a_named_value_error(kind, value):
    infos = {"in_info": IN, "out_info": OUT, kind: value}
    try:
        make(**infos)
    except ValueError as e:
        assert re.match(r"NativeOp 'Bad': (in|out)_info", str(e)), str(e)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(["code_version", "grad_input_map", "cpu_support", "c_bw_code", "c_extra_support_code"]),
       value=GARBAGE)
def test_any_garbage_argument_is_accepted_or_a_named_value_error(key, value):
    try:
        make(**{key: value})
    except ValueError as e:
        assert str(e).startswith(f"NativeOp 'Bad': {key}"), str(e)


# ------------------------------------------------------------------------------- nothing is compiled
def test_malformed_specs_compile_nothing(tmp_path, monkeypatch):
    import ptnative.build

    cache = tmp_path / "cache"
    monkeypatch.setenv("PTNATIVE_CACHE_DIR", str(cache))
    compiled = []
    monkeypatch.setattr(ptnative.build, "build", lambda *a, **k: compiled.append(a))
    for kw in [dict(c_fw_code='printf("%d");'), dict(in_info=None), dict(out_info=[dict(OUT[0], need_contigous=1)]),
               dict(grad_input_map=(9,)), dict(out_info=[{"name": "y", "ndim": 1, "shape": (("a", 0),)}])]:
        with pytest.raises(ValueError, match="NativeOp 'Bad': "):
            make(**kw)
    assert compiled == [] and not (cache.exists() and any(cache.iterdir()))
