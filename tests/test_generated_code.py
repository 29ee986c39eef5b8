"""Generated C never embeds a user string unescaped, and PyTensor's C module for a NativeOp is a trampoline into
ptnative's own library (no kernel code, no C++ exceptions, nothing that PyTensor's compiler flags can break)."""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import ptnative
from ptnative import NativeOp
from ptnative.backends import c as c_backend
from ptnative.build import cxx
from ptnative.source import c_string_literal, fill_glue, glue_sections

#: Names that break C when pasted raw: format directives, quotes, backslashes, line ends, comment ends,
#: trigraphs, placeholders of the glue template, non-ASCII (UTF-8 of 2, 3 and 4 bytes), a NUL-free control char.
HOSTILE = ["x%s%s%n", 'q"uote', "back\\slash\\", "new\nline", "*/ /*", "??/ ??= ??'", "@NAME@ @LABEL@", "é€😀",
           "tab\tcr\r", "%(fail)s"]


def test_c_string_literal_means_its_bytes(tmp_path):
    """Each literal, compiled with trigraphs enabled, prints exactly the UTF-8 bytes of its text."""
    texts = HOSTILE + ["", "plain", "??" * 3, "\\0 \\x41 \\101", "\x01\x7f", "8\n9", "a\u2028b"]
    body = "".join(f"  fwrite({c_string_literal(t)}, 1, sizeof({c_string_literal(t)}) - 1, stdout);\n"
                   f"  fputc(0, stdout);\n" for t in texts)
    src = tmp_path / "lit.cpp"
    src.write_text(f"#include <stdio.h>\nint main() {{\n{body}  return 0;\n}}\n")
    exe = tmp_path / "lit"
    subprocess.run([cxx(), "-trigraphs", "-Wno-trigraphs", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True).stdout
    assert out.split(b"\0")[:-1] == [t.encode() for t in texts]


def test_c_string_literal_is_plain_ascii():
    for t in HOSTILE:
        lit = c_string_literal(t)
        assert lit.startswith('"') and lit.endswith('"')
        inner = lit[1:-1]
        assert all(0x20 <= ord(ch) < 0x7F for ch in inner)
        assert "??" not in inner and "@" not in inner
        assert '"' not in inner.replace("\\\\", "").replace('\\"', "")


def test_fill_glue_is_one_pass():
    """A value holding a placeholder is not filled again; a placeholder without a value is an error."""
    assert fill_glue("a @X@ b @Y@", {"X": "@Y@", "Y": 1}) == "a @Y@ b 1"
    with pytest.raises(KeyError, match="@Z@ has no value"):
        fill_glue("@Z@", {})
    assert set(glue_sections("glue/pytensor_c_glue.c")) == {"support_code", "support_code_struct",
                                                          "init_code_struct", "code"}
    assert set(glue_sections("glue/variant_unit.cc")) == {"unit"}


def test_op_code_enters_the_translation_unit_verbatim():
    """Placeholders of the unit's template inside an op's code or name are text, not filled (one pass), except the
    namespace and symbol markers, which stand for this variant's own."""
    op = NativeOp(({"ndim": 1},), ({"ndim": 1, "shape": ((0, 0),)},), "/* @BODY@ @N_IN@ %(fail)s @X */",
                  c_extra_support_code="// @SUPPORT@ @DIALECT@ @OP@\n", name="@OP@ @CTYPE@")
    variant = op.variant("float32")
    assert "/* @BODY@ @N_IN@ ptn::fail_pending(); @X */" in variant.source
    assert "// @SUPPORT@ @DIALECT@ @OP@\n" in variant.source
    assert variant.source.startswith("// ptnative: op '@OP@ @CTYPE@', computing in float, for cpu.")
    assert "@NS@" not in variant.source and "@SYM@" not in variant.source and variant.symbol + "_ns" in variant.source


FW = """
  Ndarray* x = inputs[0];
  Ndarray* y = *outputs[0];
  if (Ndarray_DEV_DATA(x)[0] < 0) { ptn_set_error("negative first element"); %(fail)s }
  for (int64_t j = 0; j < Ndarray_DIMS(x)[0]; ++j) Ndarray_DEV_DATA(y)[j] = 3 * Ndarray_DEV_DATA(x)[j];
"""


def hostile_op(name, input_name):
    return NativeOp(in_info=({"name": input_name, "ndim": 1, "shape": (3,), "need_contiguous": True},),
                    out_info=({"name": input_name + "_out", "ndim": 1, "shape": ((0, 0),)},),
                    c_fw_code=FW, name=name)


@pytest.mark.parametrize("name", HOSTILE, ids=[f"name{i}" for i in range(len(HOSTILE))])
def test_hostile_names_in_every_mode(mode, name):
    """An op and an input named with any of HOSTILE: right values, and error messages that quote the names as the
    Python driver does, in every mode (the C modes once crashed on ``x%s%s%n``)."""
    op = hostile_op(name, name)
    x = pt.vector()
    f = pytensor.function([x], op(x), mode=mode)
    np.testing.assert_allclose(f(np.array([1.0, 2.0, 3.0])), [3.0, 6.0, 9.0])
    with pytest.raises(ValueError, match=re.escape(f"NativeOp {name!r}: input {name!r} must have size 3 in dim 0")):
        f(np.ones(4))
    with pytest.raises(RuntimeError, match=re.escape(f"NativeOp {name!r}: ") + ".*negative first element"):
        f(np.array([-1.0, 0.0, 0.0]))
    np.testing.assert_allclose(f(np.array([0.0, 1.0, 0.0])), [0.0, 3.0, 0.0])


def test_generated_source_keeps_names_in_one_comment_line():
    """The op's name appears in the kernel's translation unit only on its first line, as a Python repr (which
    never holds a raw line end, so the ``//`` comment cannot end early), and the symbol is a plain identifier."""
    for name in HOSTILE:
        variant = hostile_op(name, "x").variant("float64")
        first, rest = variant.source.split("\n", 1)
        assert first.startswith(f"// ptnative: op {name!r}, computing in double")
        assert "\r" not in first and "\u2028" not in first
        assert re.fullmatch(r"ptn_[A-Za-z0-9_]+_[0-9a-f]{16}", variant.symbol)


def test_c_module_holds_no_kernel_code():
    """PyTensor's module gets the trampoline only: no dialect header, no C++ exception handling, no kernel text,
    nothing of the op at all (no name, no symbol): the node's params name the variant."""
    op = hostile_op("Tramp", "x")
    x = pt.vector()
    node = op(x).owner
    sub = {"fail": "{ goto fail; }", "params": "V5"}
    code = op.c_support_code() + op.c_support_code_struct(node, "node_0") + op.c_init_code_struct(node, "node_0", sub)
    code += op.c_code(node, "node_0", ["V1"], ["V3"], sub)
    assert "negative first element" not in code and "native_op.h" not in code
    assert not re.search(r"\b(try|catch|throw|namespace|template)\b", code)
    assert "Tramp" not in code and "ptn_Tramp" not in code
    variant = op.variant("float64")
    assert op.get_params(node) == (variant.symbol, c_backend.plan_key(variant), ())


def test_c_modules_are_shared_between_ops(tmp_path):
    """Two ops with the same input and output types compile one PyTensor module per mode, not one each: the second
    function's module is the first one's (PyTensor finds its text compiled), and each calls its own kernel."""
    script = textwrap.dedent(f"""
        import glob, numpy as np, pytensor, pytensor.tensor as pt, ptnative
        def glue_modules():
            return sum("ptn_glue_run" in open(m).read() for m in glob.glob("{tmp_path}/*/*/mod.cpp"))
        x = pt.vector()
        for mode in ("C", "CVM"):
            for k in (2, 3):
                op = ptnative.NativeOp(({{"name": "x", "ndim": 1}},), ({{"name": "y", "ndim": 1, "shape": ((0, 0),)}},),
                    "/* {tmp_path.name} */ for (int64_t j = 0; j < Ndarray_DIMS(inputs[0])[0]; ++j) "
                    f"Ndarray_DEV_DATA(*outputs[0])[j] = {{k}} * Ndarray_DEV_DATA(inputs[0])[j];", name=f"Times{{k}}")
                f = pytensor.function([x], op(x), mode=mode)
                assert list(f(np.ones(2))) == [k, k], (mode, k)
                print(mode, k, glue_modules())
    """)
    env = dict(os.environ, PYTENSOR_FLAGS=f"base_compiledir={tmp_path}")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.split() == "C 2 1 C 3 1 CVM 2 2 CVM 3 2".split(), out.stdout


@pytest.mark.parametrize("mode", ["C", "CVM", "FAST_COMPILE", None])
def test_ops_with_one_kernel_text_keep_their_own_plans(mode, tmp_path):
    """Two specs whose kernel text is the same (same translation unit and symbol) but whose glues differ (one makes
    its input contiguous, the other not): each function calls with its own op's plan (the C modes once took the
    first op's plan for both).  The kernel writes the input's stride (in elements) into every output element.
    Specs whose outputs have other shapes have their own units: the entry point checks output shapes too."""
    code = f"/* {tmp_path.name} */" + """
  for (int64_t j = 0; j < Ndarray_DIMS(*outputs[0])[0]; ++j)
    Ndarray_DEV_DATA(*outputs[0])[j] = (Float)Ndarray_STRIDE(inputs[0], 0);"""
    as_is = NativeOp(({"name": "x", "ndim": 1},), ({"name": "y", "ndim": 1, "shape": ((0, 0),)},), code, name="Same")
    contiguous = NativeOp(({"name": "x", "ndim": 1, "need_contiguous": True},),
                          ({"name": "y", "ndim": 1, "shape": ((0, 0),)},), code, name="Same")
    fixed = NativeOp(({"name": "x", "ndim": 1},), ({"name": "y", "ndim": 1, "shape": (3,)},), code, name="Same")
    assert as_is.variant("float64").symbol == contiguous.variant("float64").symbol
    assert fixed.variant("float64").symbol != as_is.variant("float64").symbol
    x = pt.vector()
    for op, want in ((as_is, np.full(5, 2.0)), (contiguous, np.ones(5)), (as_is, np.full(5, 2.0)),
                     (fixed, np.full(3, 2.0))):
        np.testing.assert_array_equal(pytensor.function([x], op(x[::2]), mode=mode)(np.ones(10)), want)


_FLAGS_CHILD = r'''
import numpy as np, pytensor, pytensor.tensor as pt
from ptnative import NativeOp
op = NativeOp(in_info=({"name": "x", "ndim": 1, "need_contiguous": True},),
              out_info=({"name": "y", "ndim": 1, "shape": ((0, 0),)},),
              c_fw_code="""
  for (int64_t j = 0; j < Ndarray_DIMS(inputs[0])[0]; ++j) {
    Float v = Ndarray_DEV_DATA(inputs[0])[j];
    Ndarray_DEV_DATA(*outputs[0])[j] = std::isnan(v) ? Float(7) : v;  // -ffast-math would fold isnan to false
  }""", name="NanToSeven")
pytensor.config.gcc__cxxflags += " -fno-exceptions -fno-unwind-tables -fno-asynchronous-unwind-tables -ffast-math"
x = pt.vector()
for mode in ("C", "CVM", "FAST_COMPILE"):
    f = pytensor.function([x], op(x), mode=mode)
    np.testing.assert_array_equal(f(np.array([1.0, np.nan, 3.0])), [1.0, 7.0, 3.0])
print("flags-ok")
'''


def test_pymc_and_user_flags_do_not_reach_kernels():
    """``import pymc`` appends -fno-exceptions to PyTensor's C flags; -ffast-math would change a kernel's NaN
    handling.  Neither reaches the kernel: the C modes give the same numbers as the Python driver.  In a child
    process: a module linked with -ffast-math turns on flush-to-zero in every process that loads it."""
    proc = subprocess.run([sys.executable, "-c", _FLAGS_CHILD], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "flags-ok" in proc.stdout, proc.stderr[-4000:]


def test_unknown_symbol_is_an_import_error():
    with pytest.raises(ImportError, match="ptn_nothing_0123, which no NativeOp of this process has prepared"):
        c_backend.layout_address(("ptn_nothing_0123", "0123", ()))


def test_failure_at_module_import_is_a_python_exception(monkeypatch, tmp_path):
    """When the library cannot be loaded as the module is imported, compiling the function raises that error;
    nothing crashes, and the next compile works."""
    op = NativeOp(in_info=({"name": "x", "ndim": 1},), out_info=({"name": "y", "ndim": 1, "shape": ((0, 0),)},),
                  c_fw_code=f"/* {tmp_path.name} */ Ndarray_DEV_DATA(*outputs[0])[0] = 5;", name="FailsAtImport")
    x = pt.vector()

    def refuse(variant):
        raise RuntimeError(f"cannot load {variant.symbol} (test)")

    monkeypatch.setattr(c_backend, "load", refuse)
    with pytest.raises(RuntimeError, match=r"cannot load ptn_FailsAtImport_[0-9a-f]+ \(test\)"):
        pytensor.function([x], op(x), mode="C")
    monkeypatch.undo()
    np.testing.assert_array_equal(pytensor.function([x], op(x), mode="C")(np.zeros(2)), [5.0, 0.0])


def test_cached_c_module_in_a_fresh_process(tmp_path):
    """A second process imports the C module from PyTensor's cache without generating its code: the op's cache
    key alone prepares the library, and the module finds it."""
    script = textwrap.dedent(f"""
        import numpy as np, pytensor, pytensor.tensor as pt, ptnative
        op = ptnative.NativeOp(({{"name": "x", "ndim": 1}},), ({{"name": "y", "ndim": 1, "shape": ((0, 0),)}},),
            "/* {tmp_path.name} */ for (int64_t j = 0; j < Ndarray_DIMS(inputs[0])[0]; ++j) "
            "Ndarray_DEV_DATA(*outputs[0])[j] = 4 * Ndarray_DEV_DATA(inputs[0])[j];", name="Cached")
        x = pt.vector()
        f = pytensor.function([x], op(x), mode="{{mode}}")
        print(f(np.ones(2)))
    """)
    for mode in ("C", "C", "CVM", "CVM"):
        out = subprocess.run([sys.executable, "-c", script.replace("{mode}", mode)], capture_output=True, text=True,
                             env=dict(os.environ), timeout=300)
        assert out.returncode == 0, out.stderr
        assert "[4. 4.]" in out.stdout


@pytest.mark.parametrize("mode", ["C", "CVM"])
def test_kernel_compile_error_in_c_modes(mode, tmp_path):
    """A kernel that does not compile is ptnative's CompileError (with the compiler's output) in the C modes too,
    raised while PyTensor computes the node's cache key, before any C module is built."""
    op = NativeOp(({"ndim": 1},), ({"ndim": 1, "shape": ((0, 0),)},), f"/* {tmp_path.name} */ this is not C++;",
                  name="BrokenInC")
    x = pt.vector()
    with pytest.raises(ptnative.CompileError, match=r"(?s)compiling ptn_BrokenInC_[0-9a-f]+ \(cpu\) failed.*error"):
        pytensor.function([x], op(x), mode=mode)
