"""Names users reach: a family module is never shadowed by a function of the same name, every function of
the catalogue is at ``ptnative.<name>``, and every op class at ``ptnative.ops.<name>``."""

import importlib
import pickle
import pkgutil
import subprocess
import sys

import pytest

import ptnative
from ptnative import ops


def public_submodules(package):
    return {info.name for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_")}


def test_every_family_module_is_listed_and_reachable_by_its_name():
    names = public_submodules(ops)
    assert names == {family.__name__.rpartition(".")[2] for family in ops.FAMILIES}, (
        "a module in ptnative/ops/ is missing from ptnative.ops.FAMILIES (or listed but gone)")
    for name in names:
        module = importlib.import_module(f"ptnative.ops.{name}")
        assert getattr(ops, name) is module, f"ptnative.ops.{name} is {getattr(ops, name)!r}, not the module"
        assert name in ops.__all__


@pytest.mark.parametrize("package", [ptnative, ops], ids=["ptnative", "ptnative.ops"])
def test_no_exported_name_shadows_a_submodule(package):
    submodules = public_submodules(package)
    for name in package.__all__:
        if name in submodules:
            assert getattr(package, name) is importlib.import_module(f"{package.__name__}.{name}"), (
                f"{package.__name__}.{name} is shadowed by {getattr(package, name)!r}")


def test_families_export_distinct_names():
    seen = {}
    for family in ops.FAMILIES:
        for name in family.__all__:
            assert name not in seen, f"{name!r} is exported by both {seen[name]} and {family.__name__}"
            seen[name] = family.__name__
            assert hasattr(family, name), f"{family.__name__}.__all__ names {name!r}, which it lacks"


def test_functions_at_the_top_level_classes_in_ops():
    for family in ops.FAMILIES:
        family_name = family.__name__.rpartition(".")[2]
        for name in family.__all__:
            obj = getattr(family, name)
            if isinstance(obj, type):
                assert getattr(ops, name) is obj, f"ptnative.ops.{name}"
            else:
                assert ops.FUNCTIONS[name] is obj
                assert getattr(ptnative, name) is obj, f"ptnative.{name}"
                assert name in ptnative.__all__
                if name != family_name and name not in ops.FUNCTIONS.keys() & public_submodules(ops):
                    assert getattr(ops, name) is obj, f"ptnative.ops.{name}"
    # The two functions named like their family: reachable through the module and at the top level.
    assert ops.lstm.lstm is ptnative.lstm and ops.edit_distance.edit_distance is ptnative.edit_distance
    assert callable(ops.lstm.twod_lstm) and callable(ops.lstm.lstm_cell) and ops.lstm.NativeLstm2 is ops.NativeLstm2


def test_star_import_gives_what_all_lists():
    namespace = {}
    exec("from ptnative.ops import *", namespace)
    assert set(ops.__all__) <= namespace.keys()
    assert namespace["lstm"] is ops.lstm and namespace["ctc_loss"] is ptnative.ctc_loss


def test_module_import_spellings_agree_in_a_fresh_interpreter():
    code = ("import ptnative.ops.lstm as m, ptnative.ops.edit_distance as e, ptnative\n"
            "from ptnative.ops.lstm import lstm, NativeLstm2\n"
            "assert ptnative.ops.lstm is m and ptnative.ops.edit_distance is e\n"
            "assert m.lstm is lstm is ptnative.lstm and m.NativeLstm2 is NativeLstm2\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_op_classes_pickle_through_their_module_path():
    for cls in (ops.NativeLstm2, ops.EditDistanceOp, ops.RnntLattice):
        assert cls.__module__ in ("ptnative.ops.lstm", "ptnative.ops.edit_distance", "ptnative.ops.rnnt")
        assert pickle.loads(pickle.dumps(cls)) is cls
    op = ops.NativeLstm2.make_op()
    assert pickle.loads(pickle.dumps(op)) == op
