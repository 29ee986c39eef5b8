// RNN-Transducer losses: standard and multi-blank (arXiv 2211.03541), with
// FastEmit, logit under-normalisation (sigma) and gradient clamping.
//
// Lattice of sequence b: nodes (t, u), t < T_b = act_lens[b], u < U_b =
// label_lens[b] + 1.  One log-softmax over all K classes of acts[b, t, u, :];
// every arc weighs w = logp - sigma:
//   blank           (t, u) -> (t + 1, u)     class `blank`
//   big blank i     (t, u) -> (t + d_i, u)   class `blank - 1 - i`, d_i = durations[i] >= 2
//   label           (t, u) -> (t, u + 1)     class labels[b, u]          (u < U_b - 1)
// A path ends by a blank from (T_b - 1, U_b - 1) or a big blank i from
// (T_b - d_i, U_b - 1).  alpha(t, u): log-mass of the partial paths from (0, 0)
// to (t, u); beta(t, u): log-mass of the arcs leaving (t, u) and everything
// after them, so alpha + beta is the log-mass of the paths through (t, u).
//
// Work layout: the gradient buffer starts as a copy of acts (or IS acts when
// the op runs inplace).  Pass 1 turns each valid row into exp(acts - rowmax),
// keeping the arc weights in a small double array; the lattice recursions
// run on those in double; pass 2 turns each row into the gradient.  The CPU
// runs each sequence with plain t-major loops (cache-resident); CUDA uses one
// block per row for the passes and an anti-diagonal wavefront per sequence
// for alpha / beta, which also writes the alphas / betas / cost outputs: three
// launches per call, whatever the lattice size.
#include "../dialect/kernel.h"

#include "../common/softmax_row.h"

#define RNNT_MAX_BIG_BLANKS 32
#define RNNT_NEG_INF (-(double)INFINITY)

struct RnntConf {
  int64_t B, T, U1, K;     // acts dims
  int64_t label_stride;    // labels.shape[1]
  int32_t blank, n_big, nw;  // nw = 2 + n_big doubles per cell: [blank, label, big_0, ...]
  int32_t dur[RNNT_MAX_BIG_BLANKS];
  double sigma, lambda, log1p_lambda, clamp;
};

// log(sum_i exp(v[i])) of n terms with one log: max + log1p(sum of the others' exp).
DEV_FUNC inline double rnnt_lse_n(const double* v, int n) {
  int arg = 0;
  for (int i = 1; i < n; ++i) arg = v[i] > v[arg] ? i : arg;
  const double m = v[arg];
  if (m == RNNT_NEG_INF) return m;
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += i == arg ? 0.0 : exp(v[i] - m);
  return m + log1p(s);
}

// alpha(t, u) of one sequence; A and W start at the sequence, row stride U1.
DEV_FUNC inline double rnnt_alpha_at(const RnntConf& c, const double* W, const double* A, int64_t t, int64_t u) {
  if (t == 0 && u == 0) return 0.0;
  const int64_t U1 = c.U1, nw = c.nw;
  double v[RNNT_MAX_BIG_BLANKS + 2];
  int n = 0;
  if (u > 0) v[n++] = A[t * U1 + u - 1] + W[(t * U1 + u - 1) * nw + 1];
  if (t > 0) v[n++] = A[(t - 1) * U1 + u] + W[((t - 1) * U1 + u) * nw];
  for (int i = 0; i < c.n_big; ++i) {
    int64_t d = c.dur[i];
    if (t >= d) v[n++] = A[(t - d) * U1 + u] + W[((t - d) * U1 + u) * nw + 2 + i];
  }
  return rnnt_lse_n(v, n);
}

// beta(t, u) of one sequence with T_b = Tb, U_b = Ub.
DEV_FUNC inline double rnnt_beta_at(const RnntConf& c, const double* W, const double* Bt, int64_t t, int64_t u,
                                    int64_t Tb, int64_t Ub) {
  const int64_t U1 = c.U1;
  const double* w = W + (t * U1 + u) * c.nw;
  double v[RNNT_MAX_BIG_BLANKS + 2];
  int n = 0;
  if (t == Tb - 1 && u == Ub - 1) {
    v[n++] = w[0];
  } else {
    if (t + 1 < Tb) v[n++] = Bt[(t + 1) * U1 + u] + w[0];
    if (u + 1 < Ub) v[n++] = Bt[t * U1 + u + 1] + w[1];
  }
  for (int i = 0; i < c.n_big; ++i) {
    int64_t d = c.dur[i];
    if (t + d < Tb) v[n++] = Bt[(t + d) * U1 + u] + w[2 + i];
    else if (t + d == Tb && u == Ub - 1) v[n++] = w[2 + i];
  }
  return n ? rnnt_lse_n(v, n) : RNNT_NEG_INF;
}

// log p(labels | acts) from the alphas.  T_b = 0: the empty alignment (probability 1) if there is no label,
// else none.
DEV_FUNC inline double rnnt_loglik(const RnntConf& c, const double* W, const double* A, int64_t Tb, int64_t Ub) {
  if (Tb <= 0) return Ub == 1 ? 0.0 : RNNT_NEG_INF;
  const int64_t U1 = c.U1, u = Ub - 1;
  double v[RNNT_MAX_BIG_BLANKS + 1];
  int n = 0;
  v[n++] = A[(Tb - 1) * U1 + u] + W[((Tb - 1) * U1 + u) * c.nw];
  for (int i = 0; i < c.n_big; ++i) {
    int64_t d = c.dur[i];
    if (Tb >= d) v[n++] = A[(Tb - d) * U1 + u] + W[((Tb - d) * U1 + u) * c.nw + 2 + i];
  }
  return rnnt_lse_n(v, n);
}

// The arc terms of the gradient of class k at (t, u) (subtracted from the
// posterior term); y = the label at u (only used when u < Ub - 1).
DEV_FUNC inline double rnnt_arc_terms(const RnntConf& c, int64_t k, int64_t y, int64_t t, int64_t u, int64_t Tb,
                                      int64_t Ub, const double* w, const double* Bt, double a_minus_ll) {
  const int64_t U1 = c.U1, cell = t * U1 + u;
  double r = 0.0;
  if (k == c.blank) {
    if (t == Tb - 1 && u == Ub - 1) r += exp(a_minus_ll + w[0]);
    else if (t < Tb - 1) r += exp(a_minus_ll + w[0] + Bt[cell + U1]);
  } else if (k < c.blank && k >= c.blank - c.n_big) {
    int i = (int)(c.blank - 1 - k);
    int64_t d = c.dur[i];
    if (t == Tb - d && u == Ub - 1) r += exp(a_minus_ll + w[2 + i]);
    else if (t < Tb - d) r += exp(a_minus_ll + w[2 + i] + Bt[cell + d * U1]);
  }
  if (u < Ub - 1 && k == y) r += exp(c.log1p_lambda + a_minus_ll + w[1] + Bt[cell + 1]);
  return r;
}

// The factor of exp(acts - rowmax) in the gradient: posterior term plus FastEmit.
DEV_FUNC inline double rnnt_row_scale(const RnntConf& c, int64_t t, int64_t u, int64_t Ub, const double* w,
                                      const double* A, const double* Bt, double ls, double ll) {
  const int64_t cell = t * c.U1 + u;
  double a_minus_ll = A[cell] - ll;
  double s = exp(a_minus_ll + Bt[cell] - ls);
  if (c.lambda > 0 && u < Ub - 1) s += c.lambda * exp(a_minus_ll + w[1] + Bt[cell + 1] - ls);
  return s;
}

DEV_FUNC inline Float rnnt_clamp(const RnntConf& c, Float g) {
  if (c.clamp > 0) {
    Float cl = (Float)c.clamp;
    g = g > cl ? cl : (g < -cl ? -cl : g);
  }
  return g;
}

// The wavefront form runs on CUDA (tests/test_cuda_emulation.py runs it on the CPU too, threads and barriers
// included).
#if CUDA
#define RNNT_ROW_THREADS 128
#define RNNT_MAX_LATTICE_THREADS 1024
// ------------------------------------------------------------------ CUDA (wavefront)

// fmax for the block reduction: a NaN logit is passed over, as in the per-thread loop.
struct RnntFmax { DEV_FUNC double operator()(double a, double b) const { return fmax(a, b); } };

// Pass 1, one block per row: W = raw logits of the arcs, row := exp(row - max),
// LS = log(sum), lognorm = max + LS, then W -= lognorm + sigma.
DEF_KERNEL void rnnt_prepare_rows_kernel(RnntConf c, Float* G, const int32_t* labels, const int32_t* act_lens,
                                         const int32_t* label_lens, double* W, double* LS, Float* lognorm) {
  DEF_SHARED(double, sh);
  const int64_t n_rows = c.B * c.T * c.U1;
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int64_t row = blockIdx.x; row < n_rows; row += gridDim.x) {
    int64_t u = row % c.U1, bt = row / c.U1, t = bt % c.T, b = bt / c.T;
    int64_t Tb = act_lens[b], Ub = (int64_t)label_lens[b] + 1;
    if (t >= Tb || u >= Ub) continue;
    Float* x = G + row * c.K;
    double* w = W + row * c.nw;
    if (tid == 0) {
      w[0] = x[c.blank];
      w[1] = u < Ub - 1 ? (double)x[labels[b * c.label_stride + u]] : 0.0;
      for (int i = 0; i < c.n_big; ++i) w[2 + i] = x[c.blank - 1 - i];
    }
    double m = RNNT_NEG_INF;
    for (int64_t k = tid; k < c.K; k += nt) m = fmax(m, (double)x[k]);
    m = ptn_block_reduce(&sh[0], m, RnntFmax());
    Float mf = m > RNNT_NEG_INF ? (Float)m : Float(0);
    double sum = 0;
    for (int64_t k = tid; k < c.K; k += nt) {
      Float e = exp(x[k] - mf);
      x[k] = e;
      sum += e;
    }
    sum = block_sum(sh, sum);
    if (tid == 0) {
      double ls = log(sum), lz = (double)mf + ls;
      LS[row] = ls;
      lognorm[row] = (Float)lz;
      for (int j = 0; j < c.nw; ++j) w[j] -= lz + c.sigma;
      if (u >= Ub - 1) w[1] = RNNT_NEG_INF;
    }
  }
}

// Alphas (blockIdx.y == 0, also the log-likelihood and the cost) or betas (blockIdx.y == 1) of sequence
// blockIdx.x: a wavefront over the anti-diagonals t + u = n; then the sequence's cells of the alphas (betas)
// output (0 on padding).
DEF_KERNEL void rnnt_lattice_kernel(RnntConf c, const int32_t* act_lens, const int32_t* label_lens, const double* W,
                                    double* A, double* Bt, double* LL, Float* alphas, Float* betas, Float* costs,
                                    Float* loglik) {
  const int64_t b = blockIdx.x;
  if (b >= c.B) return;
  const int64_t Tb = act_lens[b], Ub = (int64_t)label_lens[b] + 1, cells = c.T * c.U1;
  const double* Wb = W + b * cells * c.nw;
  double* Ab = A + b * cells;
  double* Bb = Bt + b * cells;
  const int64_t n_diag = Tb + Ub - 1;
  if (blockIdx.y == 0) {
    for (int64_t n = 0; n < n_diag; ++n) {
      for (int64_t u = threadIdx.x; u < Ub; u += blockDim.x) {
        int64_t t = n - u;
        if (t >= 0 && t < Tb) Ab[t * c.U1 + u] = rnnt_alpha_at(c, Wb, Ab, t, u);
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      double ll = rnnt_loglik(c, Wb, Ab, Tb, Ub);
      LL[b] = ll;
      loglik[b] = (Float)ll;
      costs[b] = (Float)(-(1.0 + c.lambda) * ll);
    }
  } else {
    for (int64_t n = n_diag - 1; n >= 0; --n) {
      for (int64_t u = threadIdx.x; u < Ub; u += blockDim.x) {
        int64_t t = n - u;
        if (t >= 0 && t < Tb) Bb[t * c.U1 + u] = rnnt_beta_at(c, Wb, Bb, t, u, Tb, Ub);
      }
      __syncthreads();
    }
  }
  const double* from = blockIdx.y == 0 ? Ab : Bb;
  Float* to = (blockIdx.y == 0 ? alphas : betas) + b * cells;
  for (int64_t i = threadIdx.x; i < cells; i += blockDim.x) {
    const int64_t t = i / c.U1, u = i % c.U1;
    to[i] = t < Tb && u < Ub ? (Float)from[i] : (Float)0;
  }
}

// Pass 2, one block per row: the gradient (0 on padding).
DEF_KERNEL void rnnt_grad_rows_kernel(RnntConf c, Float* G, const int32_t* labels, const int32_t* act_lens,
                                      const int32_t* label_lens, const double* W, const double* A, const double* Bt,
                                      const double* LS, const double* LL) {
  const int64_t n_rows = c.B * c.T * c.U1, cells = c.T * c.U1;
  for (int64_t row = blockIdx.x; row < n_rows; row += gridDim.x) {
    int64_t u = row % c.U1, bt = row / c.U1, t = bt % c.T, b = bt / c.T;
    int64_t Tb = act_lens[b], Ub = (int64_t)label_lens[b] + 1;
    Float* g = G + row * c.K;
    if (t >= Tb || u >= Ub) {
      for (int64_t k = threadIdx.x; k < c.K; k += blockDim.x) g[k] = 0;
      continue;
    }
    const double* w = W + row * c.nw;
    const double* Ab = A + b * cells;
    const double* Bb = Bt + b * cells;
    double ll = LL[b];
    double scale = rnnt_row_scale(c, t, u, Ub, w, Ab, Bb, LS[row], ll);
    int64_t y = u < Ub - 1 ? labels[b * c.label_stride + u] : -1;
    double a_minus_ll = Ab[t * c.U1 + u] - ll;
    for (int64_t k = threadIdx.x; k < c.K; k += blockDim.x) {
      double v = (double)g[k] * scale;
      if ((k <= c.blank && k >= c.blank - c.n_big) || k == y) v -= rnnt_arc_terms(c, k, y, t, u, Tb, Ub, w, Bb, a_minus_ll);
      g[k] = rnnt_clamp(c, (Float)v);
    }
  }
}

#endif  // CUDA

#if !CUDA
// ------------------------------------------------------------------ CPU
// One sequence, t-major: pass 1 on its valid rows, alphas, betas, pass 2.
// W, A, Bt, LS are per-sequence scratch (T x U1 cells).
static double rnnt_cpu_sequence(const RnntConf& c, Float* G, const int32_t* y, int64_t Tb, int64_t Ub, double* W,
                                double* A, double* Bt, double* LS, Float* lognorm) {
  const int64_t U1 = c.U1, K = c.K, nw = c.nw;
  for (int64_t t = 0; t < Tb; ++t) {
    for (int64_t u = 0; u < Ub; ++u) {
      const int64_t cell = t * U1 + u;
      Float* x = G + cell * K;
      double* w = W + cell * nw;
      double raw_blank = x[c.blank], raw_label = u < Ub - 1 ? (double)x[y[u]] : 0.0;
      for (int i = 0; i < c.n_big; ++i) w[2 + i] = x[c.blank - 1 - i];
      Float m = ptn_row_max(x, K);
      if (!(m > -std::numeric_limits<Float>::infinity())) m = 0;
      double sum = ptn_row_exp_sum(x, x, K, m);
      double ls = log(sum), lz = (double)m + ls, off = lz + c.sigma;
      LS[cell] = ls;
      lognorm[cell] = (Float)lz;
      w[0] = raw_blank - off;
      w[1] = u < Ub - 1 ? raw_label - off : RNNT_NEG_INF;
      for (int i = 0; i < c.n_big; ++i) w[2 + i] -= off;
    }
  }
  for (int64_t t = 0; t < Tb; ++t)
    for (int64_t u = 0; u < Ub; ++u) A[t * U1 + u] = rnnt_alpha_at(c, W, A, t, u);
  const double ll = rnnt_loglik(c, W, A, Tb, Ub);
  for (int64_t t = Tb - 1; t >= 0; --t)
    for (int64_t u = Ub - 1; u >= 0; --u) Bt[t * U1 + u] = rnnt_beta_at(c, W, Bt, t, u, Tb, Ub);
  const int64_t lo = c.blank - c.n_big, hi = c.blank;  // the blank classes are [lo, hi]
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t u = 0; u < U1; ++u) {
      const int64_t cell = t * U1 + u;
      Float* g = G + cell * K;
      if (t >= Tb || u >= Ub) {
        memset(g, 0, K * sizeof(Float));
        continue;
      }
      const double* w = W + cell * nw;
      const double dscale = rnnt_row_scale(c, t, u, Ub, w, A, Bt, LS[cell], ll);
      const Float scale = (Float)dscale;
      const int64_t yu = u < Ub - 1 ? y[u] : -1;
      double e_special[RNNT_MAX_BIG_BLANKS + 2];
      for (int64_t k = lo; k <= hi; ++k) e_special[k - lo] = g[k];
      double e_label = yu >= 0 ? (double)g[yu] : 0.0;
      for (int64_t k = 0; k < K; ++k) g[k] *= scale;
      const double a_minus_ll = A[cell] - ll;
      for (int64_t k = lo; k <= hi; ++k)
        g[k] = (Float)(e_special[k - lo] * dscale - rnnt_arc_terms(c, k, yu, t, u, Tb, Ub, w, Bt, a_minus_ll));
      if (yu >= 0 && (yu < lo || yu > hi))
        g[yu] = (Float)(e_label * dscale - rnnt_arc_terms(c, yu, yu, t, u, Tb, Ub, w, Bt, a_minus_ll));
      if (c.clamp > 0)
        for (int64_t k = 0; k < K; ++k) g[k] = rnnt_clamp(c, g[k]);
    }
  }
  return ll;
}
#endif

// The function the user called, for the messages: params[3] when given (see rnnt.py's RNNT_FUNCTIONS).
static const char* rnnt_function_name(const Ndarray* params) {
  static const char* names[] = {"multiblank_rnnt_loss", "rnnt_loss", "multiblank_rnnt_lattice"};
  if (params->dims[0] < 4) return "MultiBlankRnntLoss";
  double code = ((const double*)params->data)[3];
  return code >= 0 && code < 3 && code == (double)(int)code ? names[(int)code] : "MultiBlankRnntLoss";
}

// inputs: acts (B,T,U+1,K) [grads is its buffer], labels (B,U'), act_lens (B,), label_lens (B,),
//         durations (n_big,) host, blank () host, params (3,) float64 host = [sigma, fastemit_lambda, clamp];
// outputs: costs (B,), grads (B,T,U+1,K), loglik (B,), alphas, betas, lognorm (B,T,U+1).
static void rnnt_multiblank_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 6);
  Ndarray* labels = inputs[1];
  Ndarray* act_lens = inputs[2];
  Ndarray* label_lens = inputs[3];
  Ndarray* durations = inputs[4];
  Ndarray* costs = *outputs[0];
  Ndarray* grads = *outputs[1];
  Ndarray* loglik = *outputs[2];
  Ndarray* alphas = *outputs[3];
  Ndarray* betas = *outputs[4];
  Ndarray* lognorm = *outputs[5];
  const double* params = (const double*)inputs[6]->data;
  const std::string fn = std::string(rnnt_function_name(inputs[6])) + ": ";
  auto rnnt_value_error = [&fn](const std::string& msg) { ptn::raise(PTN_STATUS_VALUE, fn + msg); };
  if (inputs[6]->dims[0] < 3) rnnt_value_error("params must hold [sigma, fastemit_lambda, clamp]");

  const int64_t* acts_dims = Ndarray_DIMS(grads);  // (B, T, U + 1, K)
  RnntConf c = {acts_dims[0], acts_dims[1], acts_dims[2], acts_dims[3], Ndarray_DIMS(labels)[1]};
  std::ostringstream err;
  if (Ndarray_DIMS(labels)[0] != c.B || Ndarray_DIMS(act_lens)[0] != c.B || Ndarray_DIMS(label_lens)[0] != c.B) {
    err << "batch sizes differ: acts " << c.B << ", labels " << Ndarray_DIMS(labels)[0] << ", act_lens "
        << Ndarray_DIMS(act_lens)[0] << ", label_lens " << Ndarray_DIMS(label_lens)[0];
    rnnt_value_error(err.str());
  }
  int64_t n_big = Ndarray_DIMS(durations)[0];
  if (n_big > RNNT_MAX_BIG_BLANKS) {
    err << "at most " << RNNT_MAX_BIG_BLANKS << " big blanks are supported, got " << n_big;
    rnnt_value_error(err.str());
  }
  c.n_big = (int32_t)n_big;
  c.nw = 2 + c.n_big;
  int64_t blank = Ndarray_DEV_DATA_int32_scalar(inputs[5]);
  if (c.B > 0 && (blank < 0 || blank >= c.K)) {
    err << "blank = " << blank << " is out of range for K = " << c.K << " classes";
    rnnt_value_error(err.str());
  }
  if (blank - n_big < 0) {
    err << "blank = " << blank << " leaves no room for " << n_big << " big blanks at indices blank-1 .. blank-"
        << n_big;
    rnnt_value_error(err.str());
  }
  c.blank = (int32_t)blank;
  const int32_t* dur = (const int32_t*)durations->data;
  for (int i = 0; i < c.n_big; ++i) {
    if (dur[i] < 2) {
      err << "big blank durations must be >= 2, got " << dur[i] << " at position " << i;
      rnnt_value_error(err.str());
    }
    c.dur[i] = dur[i];
  }
  for (int i = c.n_big; i < RNNT_MAX_BIG_BLANKS; ++i) c.dur[i] = 0;
  c.sigma = params[0];
  c.lambda = params[1];
  c.clamp = params[2];
  if (!std::isfinite(c.sigma)) rnnt_value_error("sigma must be finite");
  if (!(c.lambda >= 0) || !std::isfinite(c.lambda)) {
    err << "fastemit_lambda must be finite and >= 0, got " << c.lambda;
    rnnt_value_error(err.str());
  }
  if (!(c.clamp >= 0 || c.clamp == -1.0)) {
    err << "clamp must be >= 0 (0: off) or -1 (off), got " << c.clamp;
    rnnt_value_error(err.str());
  }
  c.log1p_lambda = log1p(c.lambda);

  // Lengths and labels on the host, for the checks (and the CPU loops).
  const int64_t n_lab = c.B * c.label_stride;
#if CUDA
  std::vector<int32_t> h_act(c.B), h_lab_len(c.B), h_labels(n_lab);
  Ndarray_copy_to_host(h_act.data(), act_lens->data, c.B * sizeof(int32_t));
  Ndarray_copy_to_host(h_lab_len.data(), label_lens->data, c.B * sizeof(int32_t));
  Ndarray_copy_to_host(h_labels.data(), labels->data, n_lab * sizeof(int32_t));
  const int32_t* alen = h_act.data();
  const int32_t* llen = h_lab_len.data();
  const int32_t* lab = h_labels.data();
#else
  const int32_t* alen = Ndarray_DEV_DATA_int32(act_lens);
  const int32_t* llen = Ndarray_DEV_DATA_int32(label_lens);
  const int32_t* lab = Ndarray_DEV_DATA_int32(labels);
#endif
  for (int64_t b = 0; b < c.B; ++b) {
    if (alen[b] < 0 || alen[b] > c.T) {
      err << "act_lens[" << b << "] = " << alen[b] << " is out of range [0, " << c.T << "] (acts.shape[1])";
      rnnt_value_error(err.str());
    }
    if (llen[b] < 0 || llen[b] > c.U1 - 1 || llen[b] > c.label_stride) {
      err << "label_lens[" << b << "] = " << llen[b] << " is out of range [0, "
          << std::min<int64_t>(c.U1 - 1, c.label_stride) << "] (acts.shape[2] - 1 = " << c.U1 - 1
          << ", labels.shape[1] = " << c.label_stride << ")";
      rnnt_value_error(err.str());
    }
    for (int64_t u = 0; u < llen[b]; ++u) {
      int32_t v = lab[b * c.label_stride + u];
      if (v < 0 || v >= c.K) {
        err << "labels[" << b << ", " << u << "] = " << v << " is out of range [0, " << c.K << ")";
        rnnt_value_error(err.str());
      }
    }
  }
  if (c.B == 0) return;
  const int64_t cells = c.T * c.U1;
  Float* G = Ndarray_DEV_DATA(grads);

#if CUDA
  const int64_t n_rows = c.B * cells;
  ptn::Scratch scratch;
  double* W = scratch.get<double>(n_rows * c.nw);
  double* A = scratch.get<double>(n_rows);
  double* Bt = scratch.get<double>(n_rows);
  double* LS = scratch.get<double>(n_rows);
  double* LL = scratch.get<double>(c.B);
  const int32_t* d_labels = Ndarray_DEV_DATA_int32(labels);
  const int32_t* d_alen = Ndarray_DEV_DATA_int32(act_lens);
  const int32_t* d_llen = Ndarray_DEV_DATA_int32(label_lens);
  int64_t row_grid = std::min<int64_t>(std::max<int64_t>(n_rows, 1), 65535);
  if (n_rows > 0)
    start_dev_kernel2(rnnt_prepare_rows_kernel, row_grid, RNNT_ROW_THREADS, RNNT_ROW_THREADS * sizeof(double),
                      (c, G, d_labels, d_alen, d_llen, W, LS, Ndarray_DEV_DATA(lognorm)));
  int lattice_threads = (int)std::min<int64_t>(((c.U1 + 31) / 32) * 32, RNNT_MAX_LATTICE_THREADS);
  start_dev_kernel2(rnnt_lattice_kernel, dim3((unsigned)c.B, 2), lattice_threads, 0,
                    (c, d_alen, d_llen, W, A, Bt, LL, Ndarray_DEV_DATA(alphas), Ndarray_DEV_DATA(betas),
                     Ndarray_DEV_DATA(costs), Ndarray_DEV_DATA(loglik)));
  if (n_rows > 0)
    start_dev_kernel2(rnnt_grad_rows_kernel, row_grid, RNNT_ROW_THREADS, 0,
                      (c, G, d_labels, d_alen, d_llen, W, A, Bt,
                       LS, LL));
  HANDLE_LAST_ERROR();
#else
  std::vector<double> W(std::max<int64_t>(cells * c.nw, 1)), A(std::max<int64_t>(cells, 1)),
      Bt(std::max<int64_t>(cells, 1)), LS(std::max<int64_t>(cells, 1));
  Float* alpha_out = Ndarray_DEV_DATA(alphas);
  Float* beta_out = Ndarray_DEV_DATA(betas);
  Float* lognorm_out = Ndarray_DEV_DATA(lognorm);
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t Tb = alen[b], Ub = (int64_t)llen[b] + 1;
    double ll = rnnt_cpu_sequence(c, G + b * cells * c.K, lab + b * c.label_stride, Tb, Ub, W.data(), A.data(),
                                  Bt.data(), LS.data(), lognorm_out + b * cells);
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t u = 0; u < c.U1; ++u) {
        const int64_t cell = t * c.U1 + u;
        const bool valid = t < Tb && u < Ub;
        alpha_out[b * cells + cell] = valid ? (Float)A[cell] : (Float)0;
        beta_out[b * cells + cell] = valid ? (Float)Bt[cell] : (Float)0;
        if (!valid) lognorm_out[b * cells + cell] = 0;
      }
    }
    Ndarray_DEV_DATA(loglik)[b] = (Float)ll;
    Ndarray_DEV_DATA(costs)[b] = (Float)(-(1.0 + c.lambda) * ll);
  }
#endif
}
