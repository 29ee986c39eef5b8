// The translation unit of one op variant: ptnative/source.py (generate) fills the section below with plain
// substitutions (ptnative.source.fill_glue) and compiles it with g++ or nvcc (ptnative/build.py).  Not compiled on
// its own.  Its text is part of every kernel's cache key, like the dialect headers: editing it rebuilds every
// library.
//
//   @OP@          the op's name as a Python repr (one line: it never holds a raw line end)
//   @CTYPE@       float | double;  @DEVICE@  cpu | cuda
//   @DIALECT@     c_code/native_op.h with its #includes inlined;  @TYPED@  c_code/native_op_typed.h
//   @SUPPORT@     the op's c_extra_support_code;  @BODY@  its c_fw_code, %-formatted
//   @NDIMS@ @ITEMSIZES@ @DTYPE_CODES@ @INPLACE_OF@ @HOST_MEMORY@ @FULLY_WRITTEN@ @CHECK_INPUT@ @CHECK_DIM@
//   @CHECK_SIZE@ @OUT_DIMS@  the argument plan's tables (ptnative/plan.py), C array initialisers with a trailing 0
//                 (ptnative.source.c_array)
//   @LABELS@      per array, how messages name it: C string literals (ptnative.source.c_string_literal)
//   @N_IN@ @N_OUT@ @N_CHECKS@  the number of inputs, outputs (dummy outputs included) and fixed sizes
//   @NS@ @SYM@    left as they are: replaced after hashing by the namespace and the entry point's symbol,
//                 ptn_<name>_<first 16 hex digits of the SHA-256 of the filled text>
// The entry point's ABI is documented at the top of ptnative/source.py.

//@section unit
// ptnative: op @OP@, computing in @CTYPE@, for @DEVICE@.  Generated; do not edit.
#define PTNATIVE_IN_VARIANT_UNIT 1
@DIALECT@
// Op code written with plain `assert` gets the non-aborting check.
#pragma push_macro("assert")
#undef assert
#define assert(x) ptn_assert(x)
namespace @NS@ {
typedef @CTYPE@ Float;
@TYPED@
// ---- support code
@SUPPORT@
// ---- fw code
static void body(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  (void)n_inputs; (void)n_outputs; (void)inputs; (void)outputs;
@BODY@
}
}  // namespace @NS@
#pragma pop_macro("assert")

namespace @NS@ {
static const int ndims[] = @NDIMS@;
static const int itemsizes[] = @ITEMSIZES@;
static const int dtype_codes[] = @DTYPE_CODES@;
static const char* const labels[] = @LABELS@;
static const int inplace_of[] = @INPLACE_OF@;
static const int host_memory[] = @HOST_MEMORY@;
static const int fully_written[] = @FULLY_WRITTEN@;
static const int check_input[] = @CHECK_INPUT@;
static const int check_dim[] = @CHECK_DIM@;
static const int64_t check_size[] = @CHECK_SIZE@;
static const int64_t out_dims[] = @OUT_DIMS@;
static const ptn::EntryPlan plan = {@N_IN@, @N_OUT@, ndims, itemsizes, dtype_codes, labels, inplace_of, host_memory,
                                    fully_written, @N_CHECKS@, check_input, check_dim, check_size, out_dims};
}  // namespace @NS@

// The entry point (ABI at the top of ptnative/source.py):
extern "C" PTN_EXPORT int @SYM@(
    void** data,            // the inputs' then the outputs' buffers
    const int32_t* types,   // per array: its rank, then its element type (ptnative.plan.dtype_code)
    const int64_t* shapes,  // per array: PTN_MAX_NDIM sizes, the first rank of them read
    const int64_t* strides, // per array: PTN_MAX_NDIM strides in bytes
    char* err,              // the message of a failure (may be null)
    int64_t errlen) {       // err's size in bytes
  return ptn::run_entry(&@NS@::body, @NS@::plan, data, types, shapes, strides, err, errlen);
}

// The entry point's argument checks alone (ptn::check_arguments), for glues that check before they allocate.
extern "C" PTN_EXPORT int @SYM@_check_arguments(const int32_t* types, const int64_t* shapes, char* err,
                                                int64_t errlen) {
  return ptn::run_check(@NS@::plan, types, shapes, err, errlen);
}
#if PTN_CUDA
extern "C" PTN_EXPORT int ptn_@SYM@_run_on_device(cudaStream_t stream, void** data, const int32_t* types,
                                                 const int64_t* shapes, const int64_t* strides, char* err,
                                                 int64_t errlen) {
  return ptn::run_entry_device(stream, &@NS@::body, @NS@::plan, data, types, shapes, strides, err, errlen);
}
#endif

extern "C" PTN_EXPORT void @SYM@_set_blas(void* sgemm, void* dgemm) { ptn::set_blas(sgemm, dgemm); }
extern "C" PTN_EXPORT void @SYM@_set_parts_pool(void* run) { ptn::set_parts_pool(run); }

extern "C" PTN_EXPORT int32_t @SYM@_error_char(int64_t j) { return ptn::error_char(j); }
