// The entry point shared by every op: wrap raw buffers as Ndarray views, run
// the op's body, and turn any failure into a status and a message.
#ifndef PTNATIVE_NATIVE_OP_ENTRY_H
#define PTNATIVE_NATIVE_OP_ENTRY_H

#include <new>

namespace ptn {

typedef void (*body_t)(int, Ndarray**, int, Ndarray***);

// The last failure's message on this thread, also readable one character at a
// time (`error_char`) by callers that cannot read back a buffer we wrote.
static thread_local std::string last_error;

inline void write_error(char* err, int64_t errlen, const char* msg) {
  last_error = msg;
  if (!err || errlen <= 0) return;
  strncpy(err, msg, (size_t)errlen - 1);
  err[errlen - 1] = 0;
}

inline int32_t error_char(int64_t j) {
  return j >= 0 && j < (int64_t)last_error.size() ? (int32_t)(unsigned char)last_error[j] : 0;
}

inline int run_entry(body_t body, int n_in, int n_out, const int* ndims, const int* itemsizes, const int* inplace_of,
                     void** data, const int64_t* shapes, const int64_t* strides, char* err, int64_t errlen) {
  try {
    std::vector<Ndarray> views(n_in + n_out);
    for (int j = 0; j < n_in + n_out; ++j) {
      Ndarray& v = views[j];
      v.data = data[j];
      v.ndim = ndims[j];
      v.itemsize = itemsizes[j];
      for (int d = 0; d < PTN_MAX_NDIM; ++d) {
        v.dims[d] = d < v.ndim ? shapes[j * PTN_MAX_NDIM + d] : 1;
        v.strides[d] = d < v.ndim ? strides[j * PTN_MAX_NDIM + d] : v.itemsize;
      }
    }
    std::vector<Ndarray*> outs(n_out + 1), ins(n_in + 1);
    std::vector<Ndarray**> out_slots(n_out + 1);
    for (int k = 0; k < n_out; ++k) {
      outs[k] = &views[n_in + k];
      out_slots[k] = &outs[k];
    }
    for (int i = 0; i < n_in; ++i) ins[i] = inplace_of[i] >= 0 ? outs[inplace_of[i]] : &views[i];
    body(n_in, ins.data(), n_out, out_slots.data());
#if PTN_CUDA
    HANDLE_LAST_ERROR();
#endif
    return PTN_STATUS_OK;
  } catch (const Error& e) {
    write_error(err, errlen, e.what());
    return e.status;
  } catch (const std::bad_alloc&) {
    write_error(err, errlen, "out of memory");
    return PTN_STATUS_RUNTIME;
  } catch (const std::exception& e) {
    write_error(err, errlen, e.what());
    return PTN_STATUS_RUNTIME;
  } catch (...) {
    write_error(err, errlen, "unknown C++ exception");
    return PTN_STATUS_RUNTIME;
  }
}

}  // namespace ptn

#if defined(Py_PYTHON_H) && !PTN_CUDA
// Inside a PyTensor C module: take sgemm/dgemm from scipy.linalg.cython_blas.
static int ptn_init_blas_from_scipy(void) {
  void* fn[2] = {0, 0};
  const char* names[2] = {"sgemm", "dgemm"};
  PyObject* mod = PyImport_ImportModule("scipy.linalg.cython_blas");
  if (!mod) return -1;
  PyObject* capi = PyObject_GetAttrString(mod, "__pyx_capi__");
  Py_DECREF(mod);
  if (!capi) return -1;
  for (int i = 0; i < 2; ++i) {
    PyObject* cap = PyDict_GetItemString(capi, names[i]);
    if (!cap) {
      Py_DECREF(capi);
      PyErr_Format(PyExc_ImportError, "scipy.linalg.cython_blas has no %s", names[i]);
      return -1;
    }
    fn[i] = PyCapsule_GetPointer(cap, PyCapsule_GetName(cap));
    if (!fn[i]) {
      Py_DECREF(capi);
      return -1;
    }
  }
  Py_DECREF(capi);
  ptn::set_blas(fn[0], fn[1]);
  return 0;
}
#endif

#endif  // PTNATIVE_NATIVE_OP_ENTRY_H
