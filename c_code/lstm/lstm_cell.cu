// chainer's LSTM activation (ptnative.lstm_cell), its gradient and the gradient of its gradient.  Arrays are
// 3-D: c (Bc, H, R), x (Bx, 4H, R) with the gates of unit j interleaved: x[b, 4*j + g, r], g in (a = cell
// input, i, f, o).  Rows b >= Bx of c pass through.
#include "../dialect/kernel.h"
#include "lstm_common.h"

// Loop over (b, j, r) of a (nb, nh, nr) grid: flat grid-stride on CUDA, nested loops on the CPU.
#if CUDA
#define LSTM_CELL_FOR(b, j, r, nb, nh, nr)                                                               \
  for (int64_t _k = threadIdx.x + (int64_t)blockDim.x * blockIdx.x, b = 0, j = 0, r = 0;                \
       _k < (int64_t)(nb) * (nh) * (nr) ? (b = _k / ((nh) * (nr)), j = (_k / (nr)) % (nh), r = _k % (nr), true) \
                                        : false;                                                         \
       _k += (int64_t)gridDim.x * blockDim.x)
#else
#define LSTM_CELL_FOR(b, j, r, nb, nh, nr) \
  for (int64_t b = 0; b < (nb); ++b) for (int64_t j = 0; j < (nh); ++j) for (int64_t r = 0; r < (nr); ++r)
#endif

struct LstmCellGates {
  Float a, i, f, o;  // tanh(cell input), sigmoid(in), sigmoid(forget), sigmoid(out)
};

DEV_FUNC inline LstmCellGates lstm_cell_gates(const Float* x, int64_t b, int64_t j, int64_t r, int64_t nh, int64_t nr) {
  const Float* p = x + (b * 4 * nh + 4 * j) * nr + r;
  LstmCellGates g;
  g.a = lstm_tanh(p[0]);
  g.i = lstm_sigmoid(p[nr]);
  g.f = lstm_sigmoid(p[2 * nr]);
  g.o = lstm_sigmoid(p[3 * nr]);
  return g;
}

DEF_KERNEL void lstm_cell_fw_kernel(const Float* c_prev, const Float* x, Float* c, Float* h, int64_t nbx, int64_t nh,
                                    int64_t nr) {
  LSTM_CELL_FOR(b, j, r, nbx, nh, nr) {
    int64_t idx = (b * nh + j) * nr + r;
    LstmCellGates g = lstm_cell_gates(x, b, j, r, nh, nr);
    Float cv = g.a * g.i + g.f * c_prev[idx];
    c[idx] = cv;
    h[idx] = g.o * lstm_tanh(cv);
  }
}

DEF_KERNEL void lstm_cell_bw_kernel(const Float* c_prev, const Float* x, const Float* c, const Float* gc,
                                    const Float* gh, Float* gc_prev, Float* gx, int64_t nbx, int64_t nh, int64_t nr) {
  LSTM_CELL_FOR(b, j, r, nbx, nh, nr) {
    int64_t idx = (b * nh + j) * nr + r;
    LstmCellGates g = lstm_cell_gates(x, b, j, r, nh, nr);
    Float co = lstm_tanh(c[idx]);
    Float ghv = gh[idx];
    Float gcb = ghv * g.o * (Float(1) - co * co) + gc[idx];
    Float* q = gx + (b * 4 * nh + 4 * j) * nr + r;
    q[0] = gcb * g.i * (Float(1) - g.a * g.a);
    q[nr] = gcb * g.a * g.i * (Float(1) - g.i);
    q[2 * nr] = gcb * c_prev[idx] * g.f * (Float(1) - g.f);
    q[3 * nr] = ghv * co * g.o * (Float(1) - g.o);
    gc_prev[idx] = gcb * g.f;
  }
}

// Second order: the cotangents ggc_prev, ggx of (gc_prev, gx) pulled back to (c_prev, x, c, gc, gh).
DEF_KERNEL void lstm_cell_bw2_kernel(const Float* c_prev, const Float* x, const Float* c, const Float* gc,
                                     const Float* gh, const Float* ggc_prev, const Float* ggx, Float* g_c_prev,
                                     Float* g_x, Float* g_c, Float* g_gc, Float* g_gh, int64_t nbx, int64_t nh,
                                     int64_t nr) {
  LSTM_CELL_FOR(b, j, r, nbx, nh, nr) {
    int64_t idx = (b * nh + j) * nr + r;
    int64_t xo = (b * 4 * nh + 4 * j) * nr + r;
    LstmCellGates g = lstm_cell_gates(x, b, j, r, nh, nr);
    Float cp = c_prev[idx];
    Float co = lstm_tanh(c[idx]);
    Float ghv = gh[idx];
    Float gga = ggx[xo], ggi = ggx[xo + nr], ggf = ggx[xo + 2 * nr], ggo = ggx[xo + 3 * nr];
    Float ggcp = ggc_prev[idx];
    // first derivatives of the activations, and their derivatives w.r.t. the pre-activations
    Float ta = Float(1) - g.a * g.a, tc = Float(1) - co * co;
    Float si = g.i * (Float(1) - g.i), sf = g.f * (Float(1) - g.f), so = g.o * (Float(1) - g.o);
    Float dta = Float(-2) * g.a * ta, dtc = Float(-2) * co * tc;
    Float dsi = si * (Float(1) - Float(2) * g.i), dsf = sf * (Float(1) - Float(2) * g.f);
    Float dso = so * (Float(1) - Float(2) * g.o);
    Float gcb = ghv * g.o * tc + gc[idx];
    // K: the cotangent of gc_bar
    Float K = ggcp * g.f + gga * g.i * ta + ggi * g.a * si + ggf * cp * sf;
    g_c_prev[idx] = ggf * gcb * sf;
    g_x[xo] = (gga * g.i * dta + ggi * ta * si) * gcb;
    g_x[xo + nr] = (gga * ta * si + ggi * g.a * dsi) * gcb;
    g_x[xo + 2 * nr] = ggcp * gcb * sf + ggf * gcb * cp * dsf;
    g_x[xo + 3 * nr] = K * ghv * tc * so + ggo * ghv * co * dso;
    g_c[idx] = K * ghv * g.o * dtc + ggo * ghv * tc * so;
    g_gc[idx] = K;
    g_gh[idx] = K * g.o * tc + ggo * co * so;
  }
}

struct LstmCellDims {
  int64_t nbc, nbx, nh, nr, row;  // len(c_prev), len(x), H, R, H * R
};

// c_prev (Bc, H, R) and x (Bx, 4H, R): ValueError for a caller's mismatch.
static LstmCellDims check_lstm_cell_shapes(Ndarray* c_prev, Ndarray* x) {
  if (Ndarray_DIMS(x)[0] > Ndarray_DIMS(c_prev)[0]) {
    std::ostringstream s;
    s << "lstm_cell: len(x) = " << Ndarray_DIMS(x)[0] << " must not exceed len(c_prev) = " << Ndarray_DIMS(c_prev)[0];
    ptn::raise(PTN_STATUS_VALUE, s.str());
  }
  ptn::require_dim(x, "lstm_cell: x", 1, 4 * Ndarray_DIMS(c_prev)[1], "4 * c_prev.shape[1]");
  ptn::require_dim(x, "lstm_cell: x (trailing dimensions flattened)", 2, Ndarray_DIMS(c_prev)[2],
                   "the product of c_prev's trailing dimensions");
  int64_t nh = Ndarray_DIMS(c_prev)[1], nr = Ndarray_DIMS(c_prev)[2];
  return {Ndarray_DIMS(c_prev)[0], Ndarray_DIMS(x)[0], nh, nr, nh * nr};
}

static void check_same_shape(Ndarray* a, Ndarray* b) {
  for (int k = 0; k < 3; ++k) assert_cmp(Ndarray_DIMS(a)[k], ==, Ndarray_DIMS(b)[k]);
}

// The gradient ops' inputs: c_prev, x, then c and gc shaped like c_prev, gh (Bx, H, R).
static LstmCellDims check_lstm_cell_grad_shapes(Ndarray** inputs) {
  Ndarray *c_prev = inputs[0], *gh = inputs[4];
  LstmCellDims dm = check_lstm_cell_shapes(c_prev, inputs[1]);
  check_same_shape(inputs[2], c_prev);
  check_same_shape(inputs[3], c_prev);
  assert_cmp(Ndarray_DIMS(gh)[0], ==, dm.nbx);
  assert_cmp(Ndarray_DIMS(gh)[1], ==, dm.nh);
  assert_cmp(Ndarray_DIMS(gh)[2], ==, dm.nr);
  return dm;
}

// Rows >= Bx of dst (the rows that x does not reach) from src.
static void lstm_cell_copy_rest(Ndarray* dst, Ndarray* src, const LstmCellDims& dm) {
  if (dm.nbc > dm.nbx)
    Ndarray_memcpy(Ndarray_DEV_DATA(dst) + dm.nbx * dm.row, Ndarray_DEV_DATA(src) + dm.nbx * dm.row,
                   (dm.nbc - dm.nbx) * dm.row * sizeof(Float));
}

// The data pointers of an entry point's arrays: in[k] of inputs[k], out[k] of *outputs[k].
struct LstmCellArrays {
  Float *in[7] = {}, *out[5] = {};
  LstmCellArrays(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
    for (int k = 0; k < n_inputs; ++k) in[k] = Ndarray_DEV_DATA(inputs[k]);
    for (int k = 0; k < n_outputs; ++k) out[k] = Ndarray_DEV_DATA(*outputs[k]);
  }
};

// An entry point's work: launch(a) when there is a cell to compute, then rows >= Bx of *outputs[dst] from
// inputs[src] (the rows that x does not reach).
template <typename F>
static void lstm_cell_run(const LstmCellDims& dm, int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs,
                          F&& launch, int dst, int src) {
  LstmCellArrays a(n_inputs, inputs, n_outputs, outputs);
  if (dm.nbx * dm.row > 0) launch(a);
  lstm_cell_copy_rest(*outputs[dst], inputs[src], dm);
  HANDLE_LAST_ERROR();
}

// inputs: c_prev (Bc,H,R), x (Bx,4H,R); outputs: c (Bc,H,R), h (Bx,H,R).  Rows >= Bx: c = c_prev.
static void lstm_cell_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 2);
  assert_cmp(n_outputs, ==, 2);
  LstmCellDims dm = check_lstm_cell_shapes(inputs[0], inputs[1]);
  auto launch = [&](const LstmCellArrays& a) {
    start_dev_kernel(lstm_cell_fw_kernel, (a.in[0], a.in[1], a.out[0], a.out[1], dm.nbx, dm.nh, dm.nr));
  };
  lstm_cell_run(dm, n_inputs, inputs, n_outputs, outputs, launch, 0, 0);
}

// inputs: c_prev, x, c (Bc,H,R), gc (Bc,H,R), gh (Bx,H,R); outputs: gc_prev (Bc,H,R), gx (Bx,4H,R).
// Rows >= Bx: gc_prev = gc.
static void lstm_cell_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 2);
  LstmCellDims dm = check_lstm_cell_grad_shapes(inputs);
  auto launch = [&](const LstmCellArrays& a) {
    start_dev_kernel(lstm_cell_bw_kernel,
                     (a.in[0], a.in[1], a.in[2], a.in[3], a.in[4], a.out[0], a.out[1], dm.nbx, dm.nh, dm.nr));
  };
  lstm_cell_run(dm, n_inputs, inputs, n_outputs, outputs, launch, 0, 3);
}

// inputs: c_prev, x, c, gc, gh, ggc_prev (Bc,H,R), ggx (Bx,4H,R);
// outputs: g_c_prev, g_x, g_c, g_gc, g_gh (shaped like c_prev, x, c, gc, gh).
// Rows >= Bx: gc_prev = gc there, so g_gc = ggc_prev; g_c_prev and g_c stay 0.
static void lstm_cell_bw2(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 5);
  LstmCellDims dm = check_lstm_cell_grad_shapes(inputs);
  check_same_shape(inputs[5], inputs[0]);  // ggc_prev like c_prev
  check_same_shape(inputs[6], inputs[1]);  // ggx like x
  auto launch = [&](const LstmCellArrays& a) {
    start_dev_kernel(lstm_cell_bw2_kernel, (a.in[0], a.in[1], a.in[2], a.in[3], a.in[4], a.in[5], a.in[6], a.out[0],
                                            a.out[1], a.out[2], a.out[3], a.out[4], dm.nbx, dm.nh, dm.nr));
  };
  lstm_cell_run(dm, n_inputs, inputs, n_outputs, outputs, launch, 3, 5);
}
