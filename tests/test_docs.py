"""The docs cannot rot: every Python block of README.md and docs/*.md runs as a user would run it, every
``ptnative.<...>`` path and every project file the docs name exists, and every relative link points at a file and
heading that exist.

Fenced blocks whose info string starts with ``python`` run in a fresh interpreter per file (in a scratch
directory), the blocks of one file in order in one namespace, so a later block may use an earlier one's names.
Words after ``python`` mark the exceptions:

* ```` ```python no-run ````: a fragment or a signature, not meant to run on its own;
* ```` ```python gpu ````: needs a CUDA GPU (and nvcc); skipped without one;
* ```` ```python needs:pymc ````: needs an optional package (any importable module name); skipped without it.

Later blocks must not depend on a skipped one (mark them too).

A statement whose last line ends in ``# -> TEXT`` is checked: the expression's ``repr`` (for ``print(...)``, what
it prints) must equal TEXT, whitespace aside.
"""

import glob
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

import ptnative
from ptnative import ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC_FILES = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
FLAGS = {"no-run", "gpu"}  # and needs:<module>
FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})\s*(.*)$")


def read(path):
    return open(os.path.join(ROOT, path), encoding="utf-8").read()


def code_blocks(text):
    """(first line number of the code, info words, code) for every fenced block of a markdown text."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or (m.group(2)[0] == "`" and "`" in m.group(3)):  # CommonMark: no backtick in a ``` info string
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3).split()
        start, i = i + 1, i + 1
        while i < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[i]):
            i += 1
        body = [line[indent:] if not line[:indent].strip() else line.lstrip() for line in lines[start:i]]
        blocks.append((start + 1, info, "\n".join(body) + "\n"))
        i += 1
    return blocks


def python_blocks(path, text=None):
    found = []
    for line, info, code in code_blocks(read(path) if text is None else text):
        if not info or info[0] != "python":
            continue
        unknown = {flag for flag in info[1:] if flag not in FLAGS and not re.fullmatch(r"needs:[\w.]+", flag)}
        assert not unknown, f"{path}:{line}: unknown block marker(s) {sorted(unknown)}; known: {sorted(FLAGS)}"
        found.append((line, set(info[1:]), code))
    return found


def can_run(flags):
    """Whether a block with these markers runs here."""
    if "no-run" in flags or ("gpu" in flags and not have_gpu()):
        return False
    return all(importlib.util.find_spec(flag[6:]) is not None for flag in flags if flag.startswith("needs:"))


def have_gpu():
    from ptnative.build import nvcc
    from ptnative.device import cuda_device_count

    return cuda_device_count() > 0 and nvcc() is not None


# Runs in the fresh interpreter: argv[1] is a JSON list of [path, first line, code].
RUNNER = r'''
import ast, contextlib, io, json, re, sys, tokenize

namespace = {"__name__": "__main__"}
for path, first, code in json.load(open(sys.argv[1])):
    padded = "\n" * (first - 1) + code
    expected = {}
    for tok in tokenize.generate_tokens(io.StringIO(padded).readline):
        m = re.match(r"#\s*->\s*(.*)", tok.string) if tok.type == tokenize.COMMENT else None
        if m:
            expected[tok.start[0]] = m.group(1).strip()
    for stmt in ast.parse(padded, path).body:
        want = expected.pop(stmt.end_lineno, None)
        if want is None:
            exec(compile(ast.Module([stmt], []), path, "exec"), namespace)
            continue
        if not isinstance(stmt, ast.Expr):
            raise SyntaxError(f"{path}:{stmt.end_lineno}: '# ->' follows a statement that is not an expression")
        is_print = isinstance(stmt.value, ast.Call) and getattr(stmt.value.func, "id", None) == "print"
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            value = eval(compile(ast.Expression(stmt.value), path, "eval"), namespace)
        got = printed.getvalue() if is_print else repr(value)
        sys.stdout.write(printed.getvalue())
        if got.split() != want.split():
            raise AssertionError(f"{path}:{stmt.end_lineno}: the docs say {want!r}, the code gives {got.strip()!r}")
    if expected:
        raise SyntaxError(f"{path}:{min(expected)}: '# ->' is not at the end of a statement")
'''


def run_blocks(blocks, directory):
    """Run [(path, first line, code)] in a fresh interpreter in ``directory``; the CompletedProcess."""
    spec = os.path.join(directory, "blocks.json")
    with open(spec, "w") as f:
        json.dump(blocks, f)
    # The same ptnative as this test process, whether from the checkout or installed (tests/conftest.py).
    return subprocess.run([sys.executable, "-c", RUNNER, spec], cwd=directory, capture_output=True,
                          text=True, timeout=1200)


@pytest.mark.parametrize("path", DOC_FILES)
def test_python_blocks_run(path, tmp_path):
    blocks = python_blocks(path)
    runnable = [[path, line, code] for line, flags, code in blocks if can_run(flags)]
    if not runnable:
        pytest.skip(f"{path}: no Python block to run here ({len(blocks)} marked no-run, gpu or needs:)")
    out = run_blocks(runnable, tmp_path)
    assert out.returncode == 0, f"a Python block of {path} failed:\n{out.stderr[-6000:]}"


def test_runner_shares_names_checks_outputs_and_names_the_failing_line(tmp_path):
    good = [["t.md", 3, "import numpy as np\nx = np.arange(3.0)\n"],
            ["t.md", 9, "print(x * 2)   # -> [0. 2. 4.]\nlen(x)  # -> 3\nfor i in x:\n    pass\n"]]
    out = run_blocks(good, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "[0. 2. 4.]\n"
    out = run_blocks([*good, ["t.md", 20, "y = 1\nint(x.sum())  # -> 4\n"]], tmp_path)
    assert out.returncode != 0 and "t.md:21: the docs say '4', the code gives '3'" in out.stderr
    out = run_blocks([["t.md", 5, "a = 1\nb = undefined_name\n"]], tmp_path)
    assert out.returncode != 0 and 'File "t.md", line 6' in out.stderr and "NameError" in out.stderr


def test_block_markers_are_parsed():
    text = "x\n```python\na = 1\n```\n  ```python no-run\n  f(a, b)\n  ```\n~~~~python gpu\n```\nb\n~~~~\n```sh\nls\n```\n"
    assert python_blocks("t.md", text) == [(3, set(), "a = 1\n"), (6, {"no-run"}, "f(a, b)\n"),
                                           (9, {"gpu"}, "```\nb\n")]
    assert [info for _, info, _ in code_blocks(text)][-1] == ["sh"]
    assert code_blocks("```` ```python ```` is inline code\n") == []
    assert python_blocks("t.md", "```python needs:pymc gpu\nx\n```\n") == [(2, {"needs:pymc", "gpu"}, "x\n")]
    assert can_run({"needs:numpy"}) and not can_run({"needs:no_such_module_here"}) and not can_run({"no-run"})
    with pytest.raises(AssertionError, match="unknown block marker"):
        python_blocks("t.md", "```python norun\nx\n```\n")


def resolve(dotted):
    """The object ``dotted`` names after ``import ptnative`` (attribute access, or importing a submodule)."""

    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:i + 1]))  # ModuleNotFoundError if neither
    return obj


@pytest.mark.parametrize("path", DOC_FILES)
def test_documented_paths_resolve(path):
    text = read(path)
    names = sorted(set(re.findall(r"(?<![\w./-])ptnative(?:\.[A-Za-z_]\w*)+", text)))
    bad = []
    for name in names:
        try:
            resolve(name)
        except (AttributeError, ImportError) as e:
            bad.append(f"{name}: {type(e).__name__}: {e}")
    assert not bad, f"{path} names paths that do not resolve:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", DOC_FILES)
def test_documented_files_exist(path):
    """Every file or folder of the project that the docs name in backticks (``c_code/fsa.cu``, ``bench/``)."""
    bad = []
    for token in sorted(set(re.findall(r"`([^`\s]+)`", read(path)))):
        if not re.fullmatch(r"(?![./])[\w.\-/]*/[\w.\-/]*", token) or not re.search(r"(/|\.\w+)$", token):
            continue
        bases = [ROOT, os.path.join(ROOT, "ptnative"), os.path.join(ROOT, os.path.dirname(path))]
        if not any(os.path.exists(os.path.join(base, token)) for base in bases):
            bad.append(token)
    assert not bad, f"{path} names files that do not exist: {bad}"


def heading_anchors(path):
    """GitHub's anchors for the headings of a markdown file (outside code blocks)."""
    text = read(path)
    text = re.sub(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", "", text, flags=re.S | re.M)
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


@pytest.mark.parametrize("path", DOC_FILES)
def test_relative_links_resolve(path):
    text = read(path)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = os.path.normpath(os.path.join(ROOT, os.path.dirname(path), file)) if file else os.path.join(ROOT, path)
        if not os.path.exists(linked):
            bad.append(f"{target}: no file {os.path.relpath(linked, ROOT)}")
        elif anchor and linked.endswith(".md") and anchor not in heading_anchors(os.path.relpath(linked, ROOT)):
            bad.append(f"{target}: no heading with anchor #{anchor}")
    assert not bad, f"{path} has broken links:\n" + "\n".join(bad)


def index_table():
    """{family: (function names, op names)} from the catalogue table of docs/index.md."""
    rows = {}
    for line in open(os.path.join(ROOT, "docs", "index.md"), encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 4 and cells[3].endswith(".md)"):
            rows[cells[0]] = (re.findall(r"`(\w+)`", cells[1]), re.findall(r"`(\w+)`", cells[2]))
    return rows


def test_index_lists_every_function_and_only_real_ops():
    rows = index_table()
    assert rows, "docs/index.md: the catalogue table was not found"
    listed_functions = {f for functions, _ in rows.values() for f in functions}
    assert listed_functions == set(ops.FUNCTIONS), (
        f"docs/index.md vs ptnative.ops.FUNCTIONS: missing {sorted(set(ops.FUNCTIONS) - listed_functions)}, "
        f"unknown {sorted(listed_functions - set(ops.FUNCTIONS))}")
    for functions, op_names in rows.values():
        for name in functions:
            assert getattr(ptnative, name) is ops.FUNCTIONS[name]
        for name in op_names:
            assert isinstance(getattr(ops, name), type), f"docs/index.md: ptnative.ops.{name} is not a class"


def test_every_family_has_a_page_linked_from_the_index():
    index = read(os.path.join("docs", "index.md"))
    for family in ops.FAMILIES:
        name = family.__name__.rpartition(".")[2]
        page = os.path.join("docs", f"{name}.md")
        assert os.path.exists(os.path.join(ROOT, page)), f"no {page} for the family module {family.__name__}"
        assert f"({name}.md)" in index, f"docs/index.md does not link {name}.md"
        assert f"`{family.__name__}`" in read(page), f"{page} does not name its module `{family.__name__}`"
