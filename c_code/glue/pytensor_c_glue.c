/* The C module side of a NativeOp in PyTensor's C backend (modes "C" and "CVM"): a thin trampoline in plain C.
 *
 * The kernel is not compiled into PyTensor's module.  It lives in the library that ptnative builds itself, with
 * its own compiler and flags (ptnative/build.py); this module only wraps PyTensor's arrays (contiguous copies,
 * output allocation, exactly as the Python driver does) and calls the library's entry point, which checks them
 * (ranks, element types, the op's fixed sizes: the same check in every mode).  So no
 * flag in pytensor.config.gcc__cxxflags (PyMC's -fno-exceptions, a user's -ffast-math) can reach a kernel, and
 * nothing here throws or needs a C++ runtime.
 *
 * Nothing in the text depends on the op: what a node calls and how (the entry point and the argument plan) is a
 * ptn_glue_layout that the node's params (a Python object from ptnative.backends.c.params) lead to when the
 * module's struct is initialised.  So nodes of different ops with the same input and output types share one
 * compiled module (PyTensor reuses a module whose source text it has compiled before).
 *
 * ptnative/backends/c.py fills the sections below (each starts with a "//@section <name>" line) with plain
 * substitutions (ptnative.source.fill_glue):
 *   @NAME@        the node's name in the module (an identifier from PyTensor)
 *   @MAX_NDIM@, @STATUS_VALUE@   ptnative.source.MAX_NDIM and STATUS_VALUE
 *   @N_IN@, @N_OUT@, @N@   the node's counts of inputs, outputs and both
 *   @PARAMS@, @INPUTS@, @OUTPUTS@, @FAIL@   PyTensor's names of the node's params and variables, its failure code
 */

//@section support_code
#ifndef PTNATIVE_PYTENSOR_C_GLUE
#define PTNATIVE_PYTENSOR_C_GLUE
#include <stdint.h>

#define PTN_GLUE_MAX_NDIM @MAX_NDIM@
#define PTN_GLUE_STATUS_VALUE @STATUS_VALUE@

/* int <symbol>(void** data, const int32_t* types, const int64_t* shapes, const int64_t* strides, char* err,
 *              int64_t errlen) */
typedef int (*ptn_glue_entry_t)(void**, const int32_t*, const int64_t*, const int64_t*, char*, int64_t);

/* What calling one node needs to know about its op, made from the spec; ptnative.backends.c.Layout mirrors it. */
typedef struct {
  ptn_glue_entry_t entry;      /* the kernel library's entry point */
  const char* label;           /* "NativeOp 'name'", the start of every message */
  int n_in, n_out;
  const int* ndim;             /* per array: the inputs, then the outputs */
  const int* contiguous;       /* per input: copied to C order first when it is not */
  const int* source_of;        /* per output: the input it starts as a copy of, or -1 (zeroed by the entry point) */
  const int* destroys;         /* per output: 1 when it may be its input's own buffer (the inplace op) */
  const int* typenum;          /* per output */
  const int64_t* out_dims;     /* per output, PTN_GLUE_MAX_NDIM each: a size >= 0, or -1 - (input * MAX_NDIM + dim) */
} ptn_glue_layout;

/* The layout that a node's params stand for: ptnative.backends.c.layout_address builds the op's library if
 * needed, loads it through ptnative.build (with its checks), sets its BLAS and keeps the layout for the rest of
 * the process.  NULL with a Python exception set when that fails. */
static const ptn_glue_layout* ptn_glue_layout_of(PyObject* params) {
  PyObject* module = PyImport_ImportModule("ptnative.backends.c");
  PyObject* address = module ? PyObject_CallMethod(module, "layout_address", "(O)", params) : NULL;
  void* layout = NULL;
  Py_XDECREF(module);
  if (!address) return NULL;
  layout = PyLong_AsVoidPtr(address);
  Py_DECREF(address);
  if (!layout && !PyErr_Occurred())
    PyErr_SetString(PyExc_ImportError, "ptnative: a NativeOp node has no layout");
  return (const ptn_glue_layout*)layout;
}

/* ptnative.errors.KernelValueError for a failed check (PTN_GLUE_STATUS_VALUE), else KernelRuntimeError, as the
 * other modes raise (a new reference; ValueError / RuntimeError if ptnative.errors cannot be imported). */
static PyObject* ptn_glue_error_class(int status) {
  int value = status == PTN_GLUE_STATUS_VALUE;
  PyObject* module = PyImport_ImportModule("ptnative.errors");
  PyObject* cls = module ? PyObject_GetAttrString(module, value ? "KernelValueError" : "KernelRuntimeError") : NULL;
  Py_XDECREF(module);
  if (!cls) {
    PyErr_Clear();
    cls = value ? PyExc_ValueError : PyExc_RuntimeError;
    Py_INCREF(cls);
  }
  return cls;
}

/* Make inputs contiguous where needed, allocate the outputs, call the entry point (which checks the arguments).
 * 0, or -1 with a Python exception set.  `in` may be replaced by the copies in `tmp`, which the caller releases. */
static int ptn_glue_run(const ptn_glue_layout* op, PyArrayObject** in, PyArrayObject** tmp, PyArrayObject*** out,
                        void** data, int32_t* types, int64_t* shapes, int64_t* strides) {
  char err[2048];
  int i, j, k, d, nd, status;
  PyObject* error_class;
  err[0] = 0;
  for (i = 0; i < op->n_in; ++i) {
    if (op->contiguous[i] && !PyArray_IS_C_CONTIGUOUS(in[i])) {
      tmp[i] = (PyArrayObject*)PyArray_NewCopy(in[i], NPY_CORDER);
      if (!tmp[i]) return -1;
      in[i] = tmp[i];
    }
  }
  for (k = 0; k < op->n_out; ++k) {
    PyArrayObject* o = *out[k];
    int src = op->source_of[k];
    nd = op->ndim[op->n_in + k];
    if (src >= 0) {
      Py_XDECREF(o);
      if (op->destroys[k] && PyArray_ISCARRAY(in[src])) {
        Py_INCREF(in[src]);
        *out[k] = in[src];
      } else {
        *out[k] = (PyArrayObject*)PyArray_NewCopy(in[src], NPY_CORDER);
      }
    } else {
      npy_intp dims[PTN_GLUE_MAX_NDIM + 1];
      int reuse = o && PyArray_NDIM(o) == nd && PyArray_TYPE(o) == op->typenum[k] && PyArray_ISCARRAY(o);
      for (d = 0; d < nd; ++d) {
        int64_t s = op->out_dims[k * PTN_GLUE_MAX_NDIM + d];
        dims[d] = s >= 0 ? (npy_intp)s
                         : PyArray_DIMS(in[(-1 - s) / PTN_GLUE_MAX_NDIM])[(-1 - s) % PTN_GLUE_MAX_NDIM];
        if (reuse && PyArray_DIMS(o)[d] != dims[d]) reuse = 0;
      }
      if (!reuse) {  /* the entry point zeroes it */
        Py_XDECREF(o);
        *out[k] = (PyArrayObject*)PyArray_EMPTY(nd, dims, op->typenum[k], 0);
      }
    }
    if (!*out[k]) return -1;
  }
  for (j = 0; j < op->n_in + op->n_out; ++j) {
    PyArrayObject* a = j < op->n_in ? in[j] : *out[j - op->n_in];
    nd = PyArray_NDIM(a) < PTN_GLUE_MAX_NDIM ? PyArray_NDIM(a) : PTN_GLUE_MAX_NDIM;
    data[j] = PyArray_DATA(a);
    types[2 * j] = PyArray_NDIM(a);
    types[2 * j + 1] = (int32_t)((unsigned char)PyArray_DESCR(a)->kind << 8 | (int)PyArray_ITEMSIZE(a));
    for (d = 0; d < PTN_GLUE_MAX_NDIM; ++d) {
      shapes[j * PTN_GLUE_MAX_NDIM + d] = d < nd ? (int64_t)PyArray_DIMS(a)[d] : 0;
      strides[j * PTN_GLUE_MAX_NDIM + d] = d < nd ? (int64_t)PyArray_STRIDES(a)[d] : 0;
    }
  }
  status = op->entry(data, types, shapes, strides, err, (int64_t)sizeof(err));
  if (status == 0) return 0;
  err[sizeof(err) - 1] = 0;
  error_class = ptn_glue_error_class(status);
  PyErr_Format(error_class, "%s: %s", op->label, err[0] ? err : "the kernel reported a failure");
  Py_DECREF(error_class);
  return -1;
}
#endif

//@section support_code_struct
const ptn_glue_layout* @NAME@_layout;

//@section init_code_struct
@NAME@_layout = ptn_glue_layout_of(@PARAMS@);
if (!@NAME@_layout) { @FAIL@ }

//@section code
{
  PyArrayObject* ptn_in[@N_IN@ + 1] = {@INPUTS@};
  PyArrayObject* ptn_tmp[@N_IN@ + 1] = {NULL};
  PyArrayObject** ptn_out[@N_OUT@ + 1] = {@OUTPUTS@};
  void* ptn_data[@N@ + 1];
  int32_t ptn_types[2 * (@N@ + 1)];
  int64_t ptn_shapes[(@N@ + 1) * PTN_GLUE_MAX_NDIM];
  int64_t ptn_strides[(@N@ + 1) * PTN_GLUE_MAX_NDIM];
  int ptn_i;
  int ptn_status = ptn_glue_run(@NAME@_layout, ptn_in, ptn_tmp, ptn_out, ptn_data, ptn_types, ptn_shapes,
                                    ptn_strides);
  for (ptn_i = 0; ptn_i < @N_IN@; ++ptn_i) Py_XDECREF(ptn_tmp[ptn_i]);
  if (ptn_status != 0) { @FAIL@ }
}
