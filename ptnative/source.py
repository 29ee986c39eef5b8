"""Variants: what a spec compiles to per floating type and device, made once and shared by every glue.

A :class:`Variant` is the translation unit of one op variant (dialect headers, the op's support code and its fw
code wrapped in a C entry point: the template ``c_code/glue/variant_unit.cc``, filled), its entry point's symbol and its
argument plan (:mod:`ptnative.plan`).
:func:`variant` makes each once per (spec, floating type, device); :func:`generate` is the computation.  The
text is compiled by ptnative's own build (g++ or nvcc, see :mod:`ptnative.build`); every glue
(:mod:`ptnative.backends`) calls its entry point as the plan says.  The entry point's ABI::

    int <symbol>(void** data, const int32_t* types, const int64_t* shapes,
                 const int64_t* strides, char* err, int64_t errlen);
    int <symbol>_check_arguments(const int32_t* types, const int64_t* shapes,
                                 char* err, int64_t errlen);

``data`` holds the inputs' then the outputs' buffer addresses; ``types`` two int32 per array in the same order,
the array's rank and its element type (:func:`ptnative.plan.dtype_code`); ``shapes`` and
``strides`` (bytes) hold ``PTN_MAX_NDIM`` entries per array.  The entry point checks ranks, types and the fixed
sizes against the plan before anything else (``<symbol>_check_arguments`` does only that): the one place where
every mode's arguments are checked.
Outputs are allocated by the caller and zeroed by the entry point; a
``want_inplace`` input and its output are the same buffer.  The return value is 0, or a ``PTN_STATUS_*`` with a
message in ``err``.  The CUDA build takes host arrays too (C-contiguous ones):
it copies them to device buffers that it keeps for the next call, runs, and
copies the outputs back; ``host_memory`` inputs stay on the host.

This module also reads the files of ``c_code/`` (kernels, dialect headers and glue templates with named
sections).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import threading
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from .plan import ArgumentPlan
from .spec import MAX_NDIM

#: The entry point's status for a failed check (the dialect's PTN_STATUS_VALUE; tests/test_constants.py ties them).
STATUS_VALUE = 2
#: The template of every variant's translation unit (see :func:`generate`).
UNIT_FILE = "glue/variant_unit.cc"
#: Bumped whenever the generated glue changes incompatibly.
GLUE_VERSION = 6

_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


@cache
def kernel_dir():
    """``c_code/``: the installed ``ptnative.c_code`` package, or the checkout's folder."""
    try:
        return resources.files("ptnative.c_code")
    except ModuleNotFoundError:  # running from a source checkout that is not installed
        return Path(__file__).resolve().parent.parent / "c_code"


@cache
def read_kernel_file(path: str) -> str:
    """The text of a file in ``c_code/``, by its path there (``"hmm/hmm.cu"``)."""
    return kernel_dir().joinpath(*path.split("/")).read_text()


def inline_includes(text: str, seen: set[str] | None = None, folder: str = "") -> str:
    """Replace each ``#include "x.h"`` of ``text`` (a file in ``c_code/folder``) by the text of the file it names,
    resolved as the preprocessor does (relative to the including file's folder), once each: a later include of a
    file in ``seen`` (paths in ``c_code/``) is dropped, as its include guard would drop it."""
    seen = set() if seen is None else seen

    def repl(m):
        path = posixpath.normpath(posixpath.join(folder, m.group(1)))
        if path in seen:
            return ""
        seen.add(path)
        return inline_includes(read_kernel_file(path), seen, posixpath.dirname(path))

    return _LOCAL_INCLUDE.sub(repl, text)


#: The dialect: every variant's unit opens with it (``native_op.h`` and what it includes), declares ``Float`` and
#: includes ``native_op_typed.h`` in the op's namespace.  ``kernel.h`` is what kernel files include to get the same
#: when compiled on their own.
DIALECT_HEADER = "dialect/native_op.h"
TYPED_HEADER = "dialect/native_op_typed.h"
KERNEL_HEADER = "dialect/kernel.h"


@cache
def _dialect_files() -> frozenset[str]:
    seen: set[str] = set()
    dialect_header(seen)
    return frozenset(seen | {TYPED_HEADER, KERNEL_HEADER})


def dialect_header(seen: set[str] | None = None) -> str:
    """``dialect/native_op.h`` with its includes inlined."""
    return inline_includes(f'#include "{DIALECT_HEADER}"\n', seen)


@cache
def kernel_unit(path: str) -> str:
    """Support code from ``c_code/<path>`` (``"hmm/hmm.cu"``): its text with the ``#include "x"`` of other files in
    ``c_code/`` inlined once each, in include order; the dialect headers (which open every translation unit already)
    are dropped.  A kernel file thus names what it needs itself, compiles on its own, and is read as one unit."""
    return inline_includes(read_kernel_file(path), set(_dialect_files()), posixpath.dirname(path))


def c_name(name: str) -> str:
    """An identifier made from ``name``: its word characters, at most 40 (``"op"`` when none are left)."""
    return re.sub(r"[^0-9A-Za-z_]", "_", name).strip("_")[:40] or "op"


_LITERAL_SAFE = frozenset(range(0x20, 0x7F)) - {ord('"'), ord("\\"), ord("?"), ord("@")}


def c_string_literal(text: str) -> str:
    """``text`` as a C/C++ string literal (double quotes included) that means exactly its UTF-8 bytes.

    Printable ASCII stays as is except ``"``, ``\\``, ``?`` (no trigraph can form) and ``@`` (no glue placeholder
    can form); every other byte, newlines and non-ASCII included, is a three-digit octal escape, which never
    swallows the digits after it.  Use it for every user string that ends up in generated C, and pass the result as
    an argument, never as a format."""
    data = text.encode("utf-8", "surrogatepass")
    return '"' + "".join(chr(b) if b in _LITERAL_SAFE else f"\\{b:03o}" for b in data) + '"'


def c_array(values) -> str:
    """A C array initialiser: ints (bools as 0/1) or C names (str), with a trailing 0, so that it is never empty
    (C wants no empty initialiser; the glues index these tables by their own counts)."""
    return "{" + "".join(f"{v if isinstance(v, str) else int(v)}, " for v in values) + "0}"


_GLUE_SECTION = re.compile(r"^//@section (\w+)[ \t]*\n", re.M)
_GLUE_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


@cache
def glue_sections(filename: str) -> dict[str, str]:
    """The named sections of a glue template in ``c_code/`` (each starts with a ``//@section <name>`` line; the
    text before the first is the file's comment): ``{name: text}``."""
    parts = _GLUE_SECTION.split(read_kernel_file(filename))
    return dict(zip(parts[1::2], parts[2::2]))


def fill_glue(template: str, fields: dict[str, object]) -> str:
    """``template`` with each ``@KEY@`` replaced by ``str(fields[KEY])`` in one pass (a value is never rescanned,
    so a value holding ``@...@`` stays as it is).  Raises ``KeyError`` naming a placeholder without a field."""

    def value(m):
        if m.group(1) not in fields:
            raise KeyError(f"glue template placeholder @{m.group(1)}@ has no value")
        return str(fields[m.group(1)])

    return _GLUE_PLACEHOLDER.sub(value, template)


@dataclass(frozen=True)
class Variant:
    """One compiled form of a spec: per floating type and device, its translation unit (``source``, whose entry
    point is ``symbol``) and its argument plan (how every glue calls that entry point).  Made once per
    (spec, floating type, device) by :func:`variant`; every glue takes it from there."""

    symbol: str
    source: str
    device: str  # "cpu" | "cuda"
    include_dirs: tuple[str, ...] = ()
    float_dtype: str = "float32"
    plan: ArgumentPlan | None = None

    @property
    def digest(self) -> str:
        return self.symbol.rsplit("_", 1)[-1]

    def __hash__(self):  # consistent with the generated __eq__, without hashing the source text each time
        return hash((self.symbol, self.device, self.include_dirs))


#: Every variant made in this process, by (spec identity, floating type, device); see :func:`variant`.
_variants: dict[tuple, Variant] = {}
_variants_lock = threading.Lock()


def variant(spec, float_dtype: str, device: str = "cpu") -> Variant:
    """The variant of ``spec`` (a :class:`ptnative.spec.NativeOpBase`) computing in ``float_dtype`` on ``device``,
    computed by :func:`generate` the first time and cached on the spec's identity
    (:attr:`ptnative.spec.NativeOpBase.variant_identity`), so that the ops of one spec (an op, its inplace
    form, the same op on another device setting) share it and no glue computes it again."""
    key = (spec.variant_identity, float_dtype, device)
    found = _variants.get(key)
    if found is None:
        with _variants_lock:  # threads (``python -m ptnative build``) compute each variant once too
            found = _variants.get(key)
            if found is None:
                found = _variants[key] = generate(spec, float_dtype, device)
    return found


def generate(spec, float_dtype: str, device: str = "cpu") -> Variant:
    """The variant of ``spec``'s fw code computing in ``float_dtype`` on ``device``: its argument plan
    (:class:`ptnative.plan.ArgumentPlan`) and the translation unit made from the spec and that plan.  Computes
    every time; glues take variants from :func:`variant`, which calls this once per spec, type and device."""
    ctype = {"float32": "float", "float64": "double"}[float_dtype]
    plan = ArgumentPlan.of(spec, float_dtype, device)
    body = spec.c_fw_code % {"fail": "ptn::fail_pending();"}

    text = fill_glue(glue_sections(UNIT_FILE)["unit"], {
        "OP": repr(spec.name), "CTYPE": ctype, "DEVICE": device,
        "DIALECT": dialect_header(), "TYPED": read_kernel_file(TYPED_HEADER),
        "SUPPORT": spec.c_extra_support_code, "BODY": body,
        "NDIMS": c_array(plan.ndims), "ITEMSIZES": c_array(plan.itemsizes), "DTYPE_CODES": c_array(plan.dtype_codes),
        "LABELS": c_array(map(c_string_literal, plan.array_labels)), "INPLACE_OF": c_array(plan.inplace_of),
        "HOST_MEMORY": c_array(plan.host_memory), "FULLY_WRITTEN": c_array(plan.fully_written),
        "CHECK_INPUT": c_array(c.input for c in plan.size_checks), "CHECK_DIM": c_array(c.dim for c in plan.size_checks),
        "CHECK_SIZE": c_array(c.size for c in plan.size_checks), "N_CHECKS": len(plan.size_checks),
        "OUT_DIMS": c_array(plan.out_dim_codes),
        "N_IN": plan.n_in, "N_OUT": plan.n_out,
        "NS": "@NS@", "SYM": "@SYM@",  # filled after hashing
    })
    digest = hashlib.sha256(f"{GLUE_VERSION}\0{text}".encode()).hexdigest()[:16]
    symbol = f"ptn_{c_name(spec.name)}_{digest}"
    text = text.replace("@NS@", symbol + "_ns").replace("@SYM@", symbol)
    return Variant(symbol=symbol, source=text, device=device, float_dtype=float_dtype, plan=plan)

