"""Constants that Python and the kernels' C text both hold, tied: each Python value must equal its C twin.

The C text is read as the package reads it (``ptnative.source.dialect_header()``, an op's own support code), not by
file name, so these checks follow the kernel files wherever ``c_code/`` puts them."""

import importlib
import inspect
import pkgutil
import re

import ptnative
from ptnative import catalogue, ops, source, spec
from ptnative.ops import rnnt


def c_define(text: str, name: str) -> int:
    """The integer value of ``#define name <int>`` in ``text`` (exactly one such line)."""
    found = re.findall(rf"^\s*#\s*define\s+{name}\s+(-?\d+)\s*$", text, flags=re.M)
    assert len(found) == 1, f"#define {name} occurs {len(found)} times"
    return int(found[0])


def test_max_ndim_is_the_dialects():
    assert spec.MAX_NDIM == c_define(source.dialect_header(), "PTN_MAX_NDIM")
    assert source.MAX_NDIM is spec.MAX_NDIM


def test_status_value_is_the_dialects():
    assert source.STATUS_VALUE == c_define(source.dialect_header(), "PTN_STATUS_VALUE")


def test_rnnt_function_names_are_the_kernels_table_in_its_order():
    """``params[3]`` is an index into the kernel's ``names[]``: the same names in the same order, and the kernel
    bounds the index by the table's length."""
    code = rnnt.MultiBlankRnntLoss.c_extra_support_code
    table = re.search(r"names\[\]\s*=\s*\{([^}]*)\}", code)
    assert table, "the RNN-T kernel has no names[] table"
    assert tuple(re.findall(r'"([^"]*)"', table.group(1))) == rnnt.RNNT_FUNCTIONS
    bounds = re.findall(r"code\s*>=\s*0\s*&&\s*code\s*<\s*(\d+)", code)
    assert bounds == [str(len(rnnt.RNNT_FUNCTIONS))], f"the kernel bounds the function index by {bounds}"


def test_rnnt_big_blank_limit_is_the_kernels():
    assert rnnt.MAX_BIG_BLANKS == c_define(rnnt.MultiBlankRnntLoss.c_extra_support_code, "RNNT_MAX_BIG_BLANKS")


def test_the_catalogue_is_every_spec_of_the_families():
    """``catalogue.catalogue()`` is derived from ``ops.FAMILIES``: no module of ``ptnative/ops/`` (private ones
    included) defines a spec with kernel code that the catalogue, and so ``python -m ptnative build``, misses."""
    defined = set()
    for info in pkgutil.iter_modules(ops.__path__):
        module = importlib.import_module(f"{ops.__name__}.{info.name}")
        defined |= {obj for _, obj in inspect.getmembers(module, inspect.isclass)
                    if issubclass(obj, ptnative.NativeOpGenBase) and obj.__module__ == module.__name__
                    and obj.c_fw_code is not None}
    listed = catalogue.catalogue()
    assert len(listed) == len(set(listed)) and set(listed) == defined
    assert [gen.__module__ for gen in listed] == sorted((gen.__module__ for gen in listed),
                                                        key=[f.__name__ for f in ops.FAMILIES].index)
