"""docs/architecture.md's claims about imports, checked against the code: no import circle among ptnative's
modules, and the one-way rules of its "Dependencies" paragraph.  Every ``import`` of ptnative/**/*.py counts,
function-level (lazy) ones included; the imports are read from the source (ast), not by importing."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "ptnative")


def module_files() -> dict[str, str]:
    """{dotted module name: file} for every module of the package (a package is its ``__init__.py``)."""
    modules = {}
    for folder, _, files in os.walk(PACKAGE):
        for file in files:
            if not file.endswith(".py"):
                continue
            parts = os.path.relpath(os.path.join(folder, file), ROOT)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = os.path.join(folder, file)
    return modules


def imported_modules(name: str, path: str, modules) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports anywhere in its text.  ``from m import x`` imports
    ``m.x`` where that is a module, else ``m``."""
    is_package = os.path.basename(path) == "__init__.py"
    package = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
    return {m for m in found if m in modules and m != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def closure(graph, roots) -> set[str]:
    """``roots`` and every module they import, directly or not."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return seen


def find_circle(graph) -> list[str] | None:
    """One import circle (its modules, the first repeated at the end), or None."""
    state, stack = {}, []

    def visit(name):
        state[name] = "open"
        stack.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (circle := visit(dep)):
                return circle
        state[name] = "done"
        stack.pop()
        return None

    for name in sorted(graph):
        if name not in state and (circle := visit(name)):
            return circle
    return None


def test_the_graph_reads_every_kind_of_import(graph):
    """The reader itself: relative, absolute, package-level and function-level imports all count."""
    assert "ptnative.ops.hmm" in graph["ptnative.ops"]  # from . import chunking, ..., hmm, ...
    assert "ptnative.op" in graph["ptnative.ops.hmm"]  # from ..op import NativeOp
    assert "ptnative.build" in graph["ptnative.errors"]  # a function-level import
    assert "ptnative.cli" in graph["ptnative.__main__"]


def test_no_import_circle(graph):
    circle = find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the finder finds one


def test_the_dependency_rules_of_the_architecture_page(graph):
    """The "Dependencies" paragraph of docs/architecture.md, rule by rule."""
    core = {"ptnative.spec", "ptnative.plan", "ptnative.source", "ptnative.op", "ptnative.build"}
    assert graph["ptnative.spec"] == set(), "spec.py imports nothing of ptnative"
    assert graph["ptnative.plan"] == {"ptnative.spec"}, "plan.py imports only the spec"
    assert graph["ptnative.source"] <= {"ptnative.plan", "ptnative.spec"}, "source.py imports the plan and the spec"
    assert graph["ptnative.op"] <= {"ptnative.spec", "ptnative.source", "ptnative.device", "ptnative.settings"}
    below_op = closure(graph, ["ptnative.op"])
    assert not {m for m in below_op if m.startswith("ptnative.backends")}, "op.py reaches no backend"
    assert "ptnative.build" not in below_op, "op.py reaches no build"
    below_core = closure(graph, core)
    assert not {m for m in below_core if m.startswith(("ptnative.backends", "ptnative.ops"))}, (
        "spec, plan, source, op and build reach no backend and no op family")
    backends = {m for m in graph if m.startswith("ptnative.backends")}
    allowed = closure(graph, ["ptnative.op", "ptnative.source", "ptnative.build", "ptnative.errors"]) | backends
    for backend in backends:
        assert graph[backend] <= allowed, f"{backend} imports {sorted(graph[backend] - allowed)}"


def test_the_page_states_the_rules_this_test_checks():
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    paragraph = re.sub(r"\s+", " ", text[text.index("Dependencies run one way"):])
    for claim in ("`spec.py` imports nothing of ptnative", "`plan.py` only the spec",
                  "`source.py` the plan and the spec", "no import circle", "tests/test_architecture.py"):
        assert claim in paragraph, f"docs/architecture.md no longer says {claim!r}"
