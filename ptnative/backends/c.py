"""PyTensor's C backend (modes ``"C"`` and ``"CVM"``): the op's translation unit
goes into the module's support code, and ``c_code`` allocates the outputs and
calls its entry point, exactly as the Python driver does."""

from __future__ import annotations

import zlib

from ..source import GLUE_VERSION, MAX_NDIM, STATUS_VALUE

_NPY_TYPES = {"float32": "NPY_FLOAT32", "float64": "NPY_FLOAT64", "int32": "NPY_INT32", "int64": "NPY_INT64",
              "uint8": "NPY_UINT8"}


def init_code(device: str) -> str:
    """The module's init code: CPU kernels take sgemm/dgemm from scipy; the CUDA trampoline needs nothing."""
    return "if (ptn_init_blas_from_scipy() != 0) PyErr_Clear();" if device == "cpu" else ""

# The CUDA variant is built by nvcc into ptnative's library; the module calls it through dlopen.
_CUDA_TRAMPOLINE = """
#include <dlfcn.h>
typedef int (*@SYM@_t)(void**, const int64_t*, const int64_t*, char*, int64_t);
static int @SYM@(void** data, const int64_t* shapes, const int64_t* strides, char* err, int64_t errlen) {
  static @SYM@_t fn = 0;
  if (!fn) {
    void* lib = dlopen("@PATH@", RTLD_NOW | RTLD_LOCAL);
    fn = lib ? (@SYM@_t)dlsym(lib, "@SYM@") : 0;
    if (!fn) {
      snprintf(err, errlen, "cannot load the CUDA library @PATH@ (%s); run the function again to rebuild it",
               dlerror());
      return 1;
    }
  }
  return fn(data, shapes, strides, err, errlen);
}
"""


def support_code(op, float_dtype: str, device: str) -> str:
    variant = op.variant(float_dtype, device)
    if device == "cpu":
        return variant.source
    from ..build import build

    path = str(build(variant)).replace("\\", "\\\\").replace('"', '\\"')
    return _CUDA_TRAMPOLINE.replace("@SYM@", variant.symbol).replace("@PATH@", path)


def cache_version(op, float_dtype: str, device: str) -> tuple[int, ...]:
    version = (GLUE_VERSION, int(op.variant(float_dtype, device).digest, 16))
    if device == "cpu":
        return version
    from ..build import library_path

    return version + (zlib.crc32(str(library_path(op.variant(float_dtype, device))).encode()),)


def c_code(op, node, name: str, inputs: list[str], outputs: list[str], sub: dict) -> str:
    float_dtype, device = op.target(node)
    symbol = op.variant(float_dtype, device).symbol
    n_in, n_out = len(inputs), len(outputs)
    n = n_in + n_out
    cname = op.name.replace("\\", "\\\\").replace('"', '\\"')
    code = [
        "{",
        f"  PyArrayObject* ptn_in[{n_in + 1}] = {{{', '.join(inputs + ['NULL'])}}};",
        f"  PyArrayObject* ptn_tmp[{n_in + 1}] = {{NULL}};",
        f"  PyArrayObject** ptn_out[{n_out + 1}] = {{{', '.join(['&' + o for o in outputs] + ['NULL'])}}};",
        f"  void* ptn_data[{n}];",
        f"  int64_t ptn_shapes[{n * MAX_NDIM}] = {{0}};",
        f"  int64_t ptn_strides[{n * MAX_NDIM}] = {{0}};",
        "  char ptn_err[2048] = {0};",
        "  int ptn_status = 0;",
        "  do {",
    ]

    def fail(exc, fmt, *args):
        a = "".join(", " + x for x in args)
        return [f'    PyErr_Format({exc}, "NativeOp \'%s\': {fmt}", "{cname}"{a});', "    ptn_status = -1; break;"]

    for i, info in enumerate(op.in_info):
        if info["ndim"] > 0 and (info.get("need_contiguous") or (device == "cuda" and not info.get("host_memory"))):
            code += [
                f"    if (!PyArray_IS_C_CONTIGUOUS(ptn_in[{i}])) {{",
                f"      ptn_tmp[{i}] = (PyArrayObject*)PyArray_NewCopy(ptn_in[{i}], NPY_CORDER);",
                f"      if (!ptn_tmp[{i}]) {{ ptn_status = -1; break; }}",
                f"      ptn_in[{i}] = ptn_tmp[{i}];",
                "    }",
            ]
        for d, s in enumerate(info.get("shape") or ()):
            if isinstance(s, int):
                code += [f"    if (PyArray_DIMS(ptn_in[{i}])[{d}] != {s}) {{",
                         *fail("PyExc_ValueError", f"input '{info.get('name', i)}' must have size {s} in dim {d}"),
                         "    }"]
    source_of = {info["want_inplace"]: i for i, info in enumerate(op.in_info) if info.get("want_inplace", -1) >= 0}
    for k, info in enumerate(op.out_info):
        nd = info["ndim"]
        if k in source_of:
            i = source_of[k]
            code += [f"    Py_XDECREF(*ptn_out[{k}]);"]
            if i in op.inplace:
                code += [
                    f"    if (PyArray_ISCARRAY(ptn_in[{i}])) {{ *ptn_out[{k}] = ptn_in[{i}]; Py_INCREF(ptn_in[{i}]); }}",
                    f"    else *ptn_out[{k}] = (PyArrayObject*)PyArray_NewCopy(ptn_in[{i}], NPY_CORDER);",
                ]
            else:
                code += [f"    *ptn_out[{k}] = (PyArrayObject*)PyArray_NewCopy(ptn_in[{i}], NPY_CORDER);"]
            code += [f"    if (!*ptn_out[{k}]) {{ ptn_status = -1; break; }}"]
            continue
        dims = [str(s) if isinstance(s, int) else f"PyArray_DIMS(ptn_in[{s[0]}])[{s[1]}]" for s in info["shape"]]
        typenum = _NPY_TYPES[op.array_dtype(info, float_dtype)]
        code += [
            "    {",
            f"      npy_intp dims[{nd + 1}] = {{{', '.join(dims + ['0'])}}};",
            f"      PyArrayObject* o = *ptn_out[{k}];",
            f"      int reuse = o && PyArray_NDIM(o) == {nd} && PyArray_TYPE(o) == {typenum} && PyArray_ISCARRAY(o);",
            f"      for (int d = 0; reuse && d < {nd}; ++d) reuse = PyArray_DIMS(o)[d] == dims[d];",
            "      if (!reuse) {  /* the entry point zeroes it */",
            "        Py_XDECREF(o);",
            f"        *ptn_out[{k}] = (PyArrayObject*)PyArray_EMPTY({nd}, dims, {typenum}, 0);",
            f"        if (!*ptn_out[{k}]) {{ ptn_status = -1; break; }}",
            "      }",
            "    }",
        ]
    for j in range(n):
        arr = f"ptn_in[{j}]" if j < n_in else f"(*ptn_out[{j - n_in}])"
        nd = (op.in_info[j] if j < n_in else op.out_info[j - n_in])["ndim"]
        code += [
            f"    ptn_data[{j}] = PyArray_DATA({arr});",
            f"    for (int d = 0; d < {nd}; ++d) {{ ptn_shapes[{j * MAX_NDIM} + d] = PyArray_DIMS({arr})[d]; "
            f"ptn_strides[{j * MAX_NDIM} + d] = PyArray_STRIDES({arr})[d]; }}",
        ]
    code += [
        f"    ptn_status = {symbol}(ptn_data, ptn_shapes, ptn_strides, ptn_err, sizeof(ptn_err));",
        "    if (ptn_status != 0)",
        f'      PyErr_Format(ptn_status == {STATUS_VALUE} ? PyExc_ValueError : PyExc_RuntimeError, '
        f'"NativeOp \'%s\': %s", "{cname}", ptn_err);',
        "  } while (0);",
        f"  for (int i = 0; i < {n_in}; ++i) Py_XDECREF(ptn_tmp[i]);",
        f"  if (ptn_status != 0) {{ {sub['fail']} }}",
        "}",
    ]
    return "\n".join(code)
