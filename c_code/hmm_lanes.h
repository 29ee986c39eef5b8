// hmm_log_likelihood's scaled forward-backward on the CPU with the sequences in vector lanes: the batch in groups of
// HMM_W = 8 sequences, one hmm_v8d per state holding that state's value for the group's eight sequences (AVX-512:
// one register; elsewhere two AVX ones).  A step is then K^2 lane-wise multiply-adds with the transition weight
// broadcast (no horizontal sum, no transpose on the chain): pred_j = sum_i alpha_{t-1,i} A_ij, alpha_t = pred E_t,
// its sum over the states lane-wise.  Each lane runs exactly the arithmetic of its own sequence (lanes never mix), so
// a sequence's results do not depend on its group, its lane or the number of threads; sums over the batch (the
// shared parameters' gradients) add the groups' partial sums in group order.
//
// The same recursions and status rules as hmm.cu's batch-inner path (hmm_forward_cpu / hmm_backward_cpu): alpha and
// beta scaled by powers of two, a step mass below HMM_TINY sends the sequence to the log-space fallback, a NaN row
// makes it NaN, a +inf one is recorded in `check` (the smallest (frame, sequence) first).  Lanes of padding (a last
// group of fewer than 8 sequences), of finished sequences and of sequences that left the scaled pass carry zeros.
//
// Layout of the kept forward pass (the gradient op's), per group g: alpha and E (T, K, 8) and the step scalings
// (T, 8), from (g T) on.  The forward op alone keeps two alpha vectors and a chunk of emission rows.

#define HMM_W 8              // sequences per group: the lanes of hmm_v8d
#define HMM_LANE_STEPS 32    // backward steps whose rows are buffered for U += X^T V

#if !CUDA
// Whether a batch of B sequences of K states runs in lanes rather than time outer and batch inner
// (hmm_forward_cpu / hmm_backward_cpu).  A group costs the same whatever number of its lanes hold a sequence, so
// the lanes win when the batch fills its groups well enough: when the batch rounded up to groups of 8 is at most
// r(K) B, with r(K) the measured cost of a sequence in the batch-inner path over its cost in a full group (value
// and gradient, T = 1000, same-process A/B at load ~6: 3.2 at K = 4, 1.6 at K = 8, 1.2 at K = 16, 1.05 at
// K = 32, 1.1 at K = 64, 0.87 at K = 128).  One sequence never: its padding costs 8 times its work.
static inline bool hmm_use_lanes(int64_t B, int64_t K) {
  const double r = K <= 4 ? 4.0 : K <= 8 ? 1.5 : K <= 16 ? 1.2 : K <= 64 ? 1.05 : 0.0;
  return B >= 2 && (double)((B + HMM_W - 1) / HMM_W * HMM_W) <= r * (double)B;
}

static inline hmm_v8d hmm_bc8(double x) { return x - hmm_v8d{}; }  // x in every lane (x - 0 is x exactly)

// 2^-e lane-wise for x = m 2^e, m in [1, 2), x normal; 0 in lanes of 0, subnormal, infinite or NaN x
// (hmm_inverse_power_of_two in eight lanes).
static inline hmm_v8d hmm_inverse_power_of_two8(hmm_v8d x) {
  const hmm_v8l e = ((hmm_v8l)x >> 52) & 0x7ff;
  const hmm_v8l ok = (e != 0) & (e != 0x7ff);
  return (hmm_v8d)((hmm_v8l)((hmm_v8u)(2046 - e) << 52) & ok);  // unsigned: 2046 - e is -1 for e = 0x7ff
}

// e lane-wise for x = m 2^e (x > 0 normal), as doubles.
static inline hmm_v8d hmm_exponent8(hmm_v8d x) {
  return __builtin_convertvector((((hmm_v8l)x >> 52) & 0x7ff) - 1023, hmm_v8d);
}

// out[j] (+)= sum_{i < n} x[i] M[i * ldm + j] for j < J, lane-wise (x[i] a vector, M's entries broadcast), each sum
// over i in order.
template <int J>
__attribute__((always_inline)) static inline void hmm_lane_tile(const hmm_v8d* __restrict__ x, int64_t n,
                                                                const double* __restrict__ M, int64_t ldm,
                                                                hmm_v8d* __restrict__ out) {
  hmm_v8d acc[J];
  for (int j = 0; j < J; ++j) acc[j] = x[0] * M[j];
  for (int64_t i = 1; i < n; ++i) {
    const hmm_v8d xi = x[i];
    for (int j = 0; j < J; ++j) acc[j] += xi * M[i * ldm + j];
  }
  for (int j = 0; j < J; ++j) out[j] = acc[j];
}

// out[j] = sum_{i < K} x[i] M[i K + j] for j < K (M K x K row-major), lane-wise; K >= 1.
static inline void hmm_lane_matvec(const hmm_v8d* __restrict__ x, int64_t K, const double* __restrict__ M,
                                   hmm_v8d* __restrict__ out) {
  int64_t j = 0;
  for (; j + 8 <= K; j += 8) hmm_lane_tile<8>(x, K, M + j, K, out + j);
  switch (K - j) {
    case 7: hmm_lane_tile<7>(x, K, M + j, K, out + j); break;
    case 6: hmm_lane_tile<6>(x, K, M + j, K, out + j); break;
    case 5: hmm_lane_tile<5>(x, K, M + j, K, out + j); break;
    case 4: hmm_lane_tile<4>(x, K, M + j, K, out + j); break;
    case 3: hmm_lane_tile<3>(x, K, M + j, K, out + j); break;
    case 2: hmm_lane_tile<2>(x, K, M + j, K, out + j); break;
    case 1: hmm_lane_tile<1>(x, K, M + j, K, out + j); break;
    default: break;
  }
}

// The sum of x[0..K) lane-wise (of x[k] y[k] if y is given) in four interleaved partial sums ((s0 + s1) + (s2 + s3)):
// a short chain.
static inline hmm_v8d hmm_lane_sum(const hmm_v8d* __restrict__ x, int64_t K, const hmm_v8d* __restrict__ y = nullptr) {
  hmm_v8d s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t k = 0;
  if (y) {
    for (; k + 4 <= K; k += 4) {
      s0 += x[k] * y[k];
      s1 += x[k + 1] * y[k + 1];
      s2 += x[k + 2] * y[k + 2];
      s3 += x[k + 3] * y[k + 3];
    }
    if (k < K) s0 += x[k] * y[k];
    if (k + 1 < K) s1 += x[k + 1] * y[k + 1];
    if (k + 2 < K) s2 += x[k + 2] * y[k + 2];
  } else {
    for (; k + 4 <= K; k += 4) {
      s0 += x[k];
      s1 += x[k + 1];
      s2 += x[k + 2];
      s3 += x[k + 3];
    }
    if (k < K) s0 += x[k];
    if (k + 1 < K) s1 += x[k + 1];
    if (k + 2 < K) s2 += x[k + 2];
  }
  return (s0 + s1) + (s2 + s3);
}

// out[c] lane l = rows[l] lane c for c < 8: an 8 x 8 transpose in three rounds of two-vector shuffles.
static inline void hmm_transpose8(const hmm_v8d* __restrict__ r, hmm_v8d* __restrict__ out) {
  const hmm_v8l lo1 = {0, 8, 2, 10, 4, 12, 6, 14}, hi1 = {1, 9, 3, 11, 5, 13, 7, 15};
  const hmm_v8l lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
  const hmm_v8l lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
  hmm_v8d a[8], b[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = __builtin_shuffle(r[2 * i], r[2 * i + 1], lo1);      // columns 0, 2, 4, 6 of rows 2i, 2i + 1
    a[2 * i + 1] = __builtin_shuffle(r[2 * i], r[2 * i + 1], hi1);  // columns 1, 3, 5, 7
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h..4h+3
    b[4 * h + 0] = __builtin_shuffle(a[4 * h], a[4 * h + 2], lo2);      // columns 0, 4
    b[4 * h + 1] = __builtin_shuffle(a[4 * h], a[4 * h + 2], hi2);      // columns 2, 6
    b[4 * h + 2] = __builtin_shuffle(a[4 * h + 1], a[4 * h + 3], lo2);  // columns 1, 5
    b[4 * h + 3] = __builtin_shuffle(a[4 * h + 1], a[4 * h + 3], hi2);  // columns 3, 7
  }
  out[0] = __builtin_shuffle(b[0], b[4], lo4);
  out[4] = __builtin_shuffle(b[0], b[4], hi4);
  out[2] = __builtin_shuffle(b[1], b[5], lo4);
  out[6] = __builtin_shuffle(b[1], b[5], hi4);
  out[1] = __builtin_shuffle(b[2], b[6], lo4);
  out[5] = __builtin_shuffle(b[2], b[6], hi4);
  out[3] = __builtin_shuffle(b[3], b[7], lo4);
  out[7] = __builtin_shuffle(b[3], b[7], hi4);
}

// x[0..8) of a row of Float as doubles, and back.
static inline void hmm_store8(double* x, hmm_v8d v) { memcpy(x, &v, sizeof(v)); }
static inline void hmm_store8(float* x, hmm_v8d v) {
  typedef float hmm_v8f __attribute__((vector_size(32)));
  const hmm_v8f f = __builtin_convertvector(v, hmm_v8f);
  memcpy(x, &f, sizeof(f));
}

// A group of up to HMM_W sequences [b0, b0 + n): their lengths and statuses per lane (padding lanes: length 0).
struct HmmGroup {
  int64_t b0, n, t_end;
  hmm_v8l len;
};

static inline HmmGroup hmm_group(const HmmParams& p, int64_t g) {
  HmmGroup G;
  G.b0 = g * HMM_W;
  G.n = std::min<int64_t>(HMM_W, p.B - G.b0);
  G.t_end = 0;
  G.len = hmm_v8l{};
  for (int64_t l = 0; l < G.n; ++l) {
    G.len[l] = p.seq_len[G.b0 + l];
    G.t_end = std::max<int64_t>(G.t_end, G.len[l]);
  }
  return G;
}

// The smaller (frame, sequence) of two failed checks into *into (a group's first failure into its part's).
static inline void hmm_keep_first_failure(FsaCheck* into, const FsaCheck& c) {
  if (c.code == FSA_CHECK_OK) return;
  if (into->code == FSA_CHECK_OK || c.i < into->i || (c.i == into->i && c.j < into->j)) *into = c;
}

// The emission rows of frames [t0, t1) of group G, lane-wise: E[(t - t0) K + k] = exp(log e_t(k) - m_t) and
// shift[t - t0] = m_t, the row's largest log-density (NaN for a row with a NaN, after which the lane is dead and its
// rows are not read; -inf with a +inf, recorded in `check`, or when every entry is -inf).  Lanes not on a valid
// frame, and lanes of rows with m_t = -inf, get E = 0.  raw: K vectors of scratch.
static void hmm_lane_emissions(const HmmParams& p, const HmmGroup& G, int64_t t0, int64_t t1, char* dead,
                               double* __restrict__ raw, hmm_v8d* __restrict__ E, hmm_v8d* __restrict__ shift,
                               FsaCheck* check) {
  const int64_t B = p.B, K = p.K;
  for (int64_t t = t0; t < t1; ++t) {
    bool active[HMM_W], all = true;
    for (int64_t l = 0; l < HMM_W; ++l) {
      active[l] = l < G.n && t < G.len[l] && !dead[l];
      all &= active[l];
    }
    const Float* rows = p.le + (t * B + G.b0) * K;  // the group's rows of frame t, one after the other
    int64_t k0 = 0;
    if (all)  // eight rows of eight entries at a time, transposed
      for (; k0 + 8 <= K; k0 += 8) {
        hmm_v8d r[8];
        for (int l = 0; l < 8; ++l) r[l] = hmm_load8(rows + l * K + k0);
        hmm_transpose8(r, (hmm_v8d*)raw + k0);
      }
    for (int64_t l = 0; l < HMM_W; ++l)
      for (int64_t k = k0; k < K; ++k) raw[k * HMM_W + l] = active[l] ? (double)rows[l * K + k] : 0.0;
    // poison: sum of x * 0, NaN in lanes with a NaN or an infinity
    hmm_v8d mx = hmm_bc8(-INFINITY), mx1 = mx, poison = {}, poison1 = {};
    int64_t k = 0;
    for (; k + 2 <= K; k += 2) {
      const hmm_v8d x = hmm_load8(raw + k * HMM_W), y = hmm_load8(raw + (k + 1) * HMM_W);
      mx = x > mx ? x : mx;
      mx1 = y > mx1 ? y : mx1;
      poison += x * 0.0;
      poison1 += y * 0.0;
    }
    if (k < K) {
      const hmm_v8d x = hmm_load8(raw + k * HMM_W);
      mx = x > mx ? x : mx;
      poison += x * 0.0;
    }
    mx = mx1 > mx ? mx1 : mx;
    poison += poison1;
    for (int64_t l = 0; l < HMM_W; ++l) {
      if (!active[l] || poison[l] == 0.0) continue;
      double m;
      if (hmm_checked_max(p.le + (t * B + G.b0 + l) * K, K, &m, check, HmmEmissionReport{t, G.b0 + l})) {
        dead[l] = 1;
        m = NAN;
      }
      mx[l] = m;
    }
    hmm_v8l keep = mx > -INFINITY;  // false for NaN and -inf
    for (int64_t l = 0; l < HMM_W; ++l)
      if (!active[l]) keep[l] = 0;
    hmm_v8d* __restrict__ Et = E + (t - t0) * K;
    for (int64_t k = 0; k < K; ++k)
      Et[k] = (hmm_v8d)((hmm_v8l)hmm_exp8(hmm_load8(raw + k * HMM_W) - mx) & keep);
    shift[t - t0] = mx;
  }
}

// The scaled forward of group G: statuses and log-likelihoods of its sequences into p.status and ll.  keep: the
// gradient op's pass, alpha, E and the scalings kept in p.aL, p.EL, p.sL; else two alpha vectors and a chunk of
// emission rows in `work` (hmm_lane_work_doubles).
static inline int64_t hmm_lane_work_doubles(int64_t K) { return (2 * K + (HMM_CHUNK + 1) * (K + 1)) * HMM_W; }

static void hmm_lane_forward(const HmmParams& p, int64_t g, bool keep, double* work, double* ll, FsaCheck* check) {
  const int64_t T = p.T, K = p.K;
  const HmmGroup G = hmm_group(p, g);
  hmm_v8l st = {};
  char dead[HMM_W];
  for (int64_t l = 0; l < HMM_W; ++l) {
    st[l] = l < G.n ? (int64_t)p.status[G.b0 + l] : HMM_SCALED;
    dead[l] = st[l] != HMM_SCALED;
  }
  hmm_v8d* roll = (hmm_v8d*)work;  // two alpha vectors (forward op)
  hmm_v8d* chunk_E = roll + 2 * K;
  hmm_v8d* shift = chunk_E + HMM_CHUNK * K;
  double* raw = (double*)(shift + HMM_CHUNK);
  hmm_v8d* aL = keep ? (hmm_v8d*)p.aL + g * T * K : nullptr;
  hmm_v8d* EL = keep ? (hmm_v8d*)p.EL + g * T * K : nullptr;
  hmm_v8d* sL = keep ? (hmm_v8d*)p.sL + g * T : nullptr;
  hmm_v8d mass = {}, shifts = {}, fin = {};
  for (int64_t t0 = 0; t0 < G.t_end; t0 += HMM_CHUNK) {
    const int64_t t1 = std::min<int64_t>(t0 + HMM_CHUNK, G.t_end);
    hmm_v8d* E0 = keep ? EL + t0 * K : chunk_E;
    hmm_lane_emissions(p, G, t0, t1, dead, raw, E0, shift, check);
    for (int64_t t = t0; t < t1; ++t) {
      hmm_v8d* __restrict__ at = keep ? aL + t * K : roll + (t & 1) * K;
      const hmm_v8d* __restrict__ Et = E0 + (t - t0) * K;
      if (t == 0) {
        for (int64_t k = 0; k < K; ++k) at[k] = hmm_bc8(p.pi[k]);
      } else {
        hmm_lane_matvec(keep ? aL + (t - 1) * K : roll + ((t - 1) & 1) * K, K, p.A, at);
      }
      for (int64_t k = 0; k < K; ++k) at[k] *= Et[k];
      const hmm_v8d s = hmm_lane_sum(at, K), m = shift[t - t0];
      const hmm_v8l act = (t < G.len) & (st == (int64_t)HMM_SCALED);
      const hmm_v8l nan = act & (m != m);
      const hmm_v8l ok = act & (m == m) & (s >= HMM_TINY);
      st = nan ? hmm_v8l{} + (int64_t)HMM_NAN : st;
      st = (act & ~nan & ~ok) ? hmm_v8l{} + (int64_t)HMM_LOG_SPACE : st;
      const hmm_v8d scale = (hmm_v8d)((hmm_v8l)hmm_inverse_power_of_two8(s) & ok);
      for (int64_t k = 0; k < K; ++k) at[k] *= scale;
      mass += (hmm_v8d)((hmm_v8l)hmm_exponent8(s) & ok);
      shifts += (hmm_v8d)((hmm_v8l)(m + (t == 0 ? p.consts[1] : p.consts[0])) & ok);
      if (keep) sL[t] = scale;
      const hmm_v8l last = ok & (t == G.len - 1);
      bool any_last = false;
      for (int64_t l = 0; l < HMM_W; ++l) any_last |= last[l] != 0;
      if (any_last) {
        hmm_v8d f = at[0] * p.f[0];
        for (int64_t k = 1; k < K; ++k) f += at[k] * p.f[k];
        fin = last ? f : fin;
      }
    }
  }
  for (int64_t l = 0; l < G.n; ++l) {
    const int64_t b = G.b0 + l;
    p.status[b] = (double)st[l];
    if (G.len[l] > 0 && st[l] == HMM_SCALED) {
      if (fin[l] >= HMM_TINY) {
        ll[b] = mass[l] * 0.6931471805599453 + shifts[l];
        ll[b] += log(fin[l]) + p.consts[2];
      } else {
        p.status[b] = HMM_LOG_SPACE;
      }
    }
  }
}

// out[i K + j] += sum over the n buffered steps and the lanes of X[i][s] * V[j][s] (X, V: K rows of n vectors,
// row stride ld vectors), 4 x 4 outputs at a time with their sums lane-wise, then over the lanes.
template <int RI, int RJ>
__attribute__((always_inline)) static inline void hmm_lane_outer_tile(const hmm_v8d* __restrict__ X,
                                                                      const hmm_v8d* __restrict__ V, int64_t ld,
                                                                      int64_t n, double* __restrict__ out,
                                                                      int64_t K) {
  hmm_v8d acc[RI][RJ] = {};
  for (int64_t s = 0; s < n; ++s) {
    hmm_v8d v[RJ];
    for (int j = 0; j < RJ; ++j) v[j] = V[j * ld + s];
    for (int i = 0; i < RI; ++i) {
      const hmm_v8d x = X[i * ld + s];
      for (int j = 0; j < RJ; ++j) acc[i][j] += x * v[j];
    }
  }
  for (int i = 0; i < RI; ++i)
    for (int j = 0; j < RJ; ++j) out[i * K + j] += hmm_hsum8(acc[i][j]);
}

template <int RI>
static inline void hmm_lane_outer_row(const hmm_v8d* X, const hmm_v8d* V, int64_t ld, int64_t n, double* out,
                                      int64_t K) {
  int64_t j = 0;
  for (; j + 4 <= K; j += 4) hmm_lane_outer_tile<RI, 4>(X, V + j * ld, ld, n, out + j, K);
  switch (K - j) {
    case 3: hmm_lane_outer_tile<RI, 3>(X, V + j * ld, ld, n, out + j, K); break;
    case 2: hmm_lane_outer_tile<RI, 2>(X, V + j * ld, ld, n, out + j, K); break;
    case 1: hmm_lane_outer_tile<RI, 1>(X, V + j * ld, ld, n, out + j, K); break;
    default: break;
  }
}

static void hmm_lane_outer(const hmm_v8d* X, const hmm_v8d* V, int64_t ld, int64_t n, double* U, int64_t K) {
  int64_t i = 0;
  for (; i + 4 <= K; i += 4) hmm_lane_outer_row<4>(X + i * ld, V, ld, n, U + i * K, K);
  switch (K - i) {
    case 3: hmm_lane_outer_row<3>(X + i * ld, V, ld, n, U + i * K, K); break;
    case 2: hmm_lane_outer_row<2>(X + i * ld, V, ld, n, U + i * K, K); break;
    case 1: hmm_lane_outer_row<1>(X + i * ld, V, ld, n, U + i * K, K); break;
    default: break;
  }
}

static inline int64_t hmm_lane_back_doubles(int64_t K) { return (5 * K + 2 * K * HMM_LANE_STEPS) * HMM_W; }

// The scaled backward of group G after hmm_lane_forward(keep): d log e of its sequences into dle, and the group's
// partial sums of U (K x K, expected transitions / A), d log pi and d log f (K each) into out (zeroed here).
// work: hmm_lane_back_doubles(K) doubles on a cache line.
static void hmm_lane_backward(const HmmParams& p, int64_t g, const Float* gout, Float* dle, double* work,
                              double* out) {
  const int64_t T = p.T, B = p.B, K = p.K;
  const HmmGroup G = hmm_group(p, g);
  double* U = out;
  double* dpi = U + K * K;
  double* df = dpi + K;
  memset(out, 0, (K * K + 2 * K) * sizeof(double));
  hmm_v8d* beta = (hmm_v8d*)work;
  hmm_v8d* v = beta + K;
  hmm_v8d* dpiL = v + K;
  hmm_v8d* dfL = dpiL + K;
  hmm_v8d* Xb = dfL + K;  // K rows of HMM_LANE_STEPS vectors
  hmm_v8d* Vb = Xb + K * HMM_LANE_STEPS;
  hmm_v8d* gam = Vb + K * HMM_LANE_STEPS;  // gamma_t
  hmm_v8d gv = {};
  hmm_v8l on = {};  // lanes the backward runs for: scaled, with a frame and a nonzero upstream gradient
  for (int64_t l = 0; l < G.n; ++l) {
    gv[l] = (double)gout[G.b0 + l];
    on[l] = G.len[l] > 0 && p.status[G.b0 + l] == HMM_SCALED && gv[l] != 0.0 ? -1 : 0;
  }
  bool any_on = false;
  for (int64_t l = 0; l < HMM_W; ++l) any_on |= on[l] != 0;
  if (!any_on) return;
  for (int64_t k = 0; k < K; ++k) beta[k] = dpiL[k] = dfL[k] = hmm_v8d{};
  const hmm_v8d* aL = (const hmm_v8d*)p.aL + g * T * K;
  const hmm_v8d* EL = (const hmm_v8d*)p.EL + g * T * K;
  const hmm_v8d* sL = (const hmm_v8d*)p.sL + g * T;
  int64_t n_steps = 0;
  for (int64_t t = G.t_end - 1; t >= 0; --t) {
    const hmm_v8l act = on & (t < G.len), start = act & (t == G.len - 1);
    for (int64_t k = 0; k < K; ++k) beta[k] = start ? hmm_bc8(p.f[k]) : beta[k];
    const hmm_v8d* __restrict__ at = aL + t * K;
    const hmm_v8d z = hmm_lane_sum(at, K, beta);
    const hmm_v8d r = (hmm_v8d)((hmm_v8l)(gv / z) & (act & (z > 0.0)));
    // gamma_t = alpha_t beta_t r into d log e (the lanes' rows of frame t), and d log f / d log pi
    bool all = true;
    for (int64_t l = 0; l < HMM_W; ++l) all &= act[l] != 0;
    for (int64_t k = 0; k < K; ++k) {
      gam[k] = at[k] * beta[k] * r;
      dfL[k] = start ? gam[k] : dfL[k];
      if (t == 0) dpiL[k] = gam[k];
    }
    Float* rows = dle + (t * B + G.b0) * K;  // the group's rows of frame t, one after the other
    int64_t k0 = 0;
    if (all)  // eight columns at a time, transposed into eight rows
      for (; k0 + 8 <= K; k0 += 8) {
        hmm_v8d r8[8];
        hmm_transpose8(gam + k0, r8);
        for (int l = 0; l < 8; ++l) hmm_store8(rows + l * K + k0, r8[l]);
      }
    for (int64_t l = 0; l < G.n; ++l)
      if (act[l])
        for (int64_t k = k0; k < K; ++k) rows[l * K + k] = (Float)gam[k][l];
    if (t == 0) break;
    const hmm_v8d* __restrict__ Et = EL + t * K;
    const hmm_v8d x = r * sL[t];  // r / c_t, c_t = 1 / scale (powers of two: exact)
    const hmm_v8d* __restrict__ ap = aL + (t - 1) * K;
    for (int64_t k = 0; k < K; ++k) {
      v[k] = Et[k] * beta[k];
      Vb[k * HMM_LANE_STEPS + n_steps] = v[k];
      Xb[k * HMM_LANE_STEPS + n_steps] = ap[k] * x;
    }
    if (++n_steps == HMM_LANE_STEPS) {
      hmm_lane_outer(Xb, Vb, HMM_LANE_STEPS, n_steps, U, K);
      n_steps = 0;
    }
    // beta_{t-1} = A v, scaled by the power of two that brings its sum into [1, 2) (0 in lanes not running)
    hmm_lane_matvec(v, K, p.AT, beta);
    const hmm_v8d scale = hmm_inverse_power_of_two8(hmm_lane_sum(beta, K));
    for (int64_t k = 0; k < K; ++k) beta[k] *= scale;
  }
  if (n_steps > 0) hmm_lane_outer(Xb, Vb, HMM_LANE_STEPS, n_steps, U, K);
  for (int64_t l = 0; l < G.n; ++l)
    for (int64_t k = 0; k < K; ++k) {
      dpi[k] += dpiL[k][l];
      df[k] += dfL[k][l];
    }
}
#endif  // !CUDA
