// Explicit-duration HMM (hidden semi-Markov model): the model every HSMM op starts from, its input checks in the
// user's terms, and the forward recursion over segment ends (log space, double).
//
// Inputs 0-5 of every HSMM op: log_emissions (T, B, K), log_transitions (K, K) between different states (the
// diagonal is never read), log_durations (Bd, K, D) with Bd in {1, B} and log_durations[., k, d-1] = log p_k(d),
// log_initial (Bp, K) with Bp in {1, B}, mask (T, B) (a 0/1 prefix mask), right_censored (a host int32 flag).
//
// Sequence b has L = T_b frames t = 0..L-1.  A segment of state k covering frames s..e (d = e - s + 1 <= D) has
// the weight W(e)_k(d) + sum_{t=s..e} log e_t(k), with W(e) = log p while e < L - 1 and, for the last segment
// (e = L - 1), the survival log L_k(d) = log sum_{d' >= d} p_k(d') when right_censored, else log p again.
//   start_s(k) = log pi(k) for s = 0, else logsumexp_{j != k} alpha_{s-1}(j) + log A(j, k)
//   alpha_e(k) = logsumexp_d start_{e-d+1}(k) + W(e)_k(d) + sum_{t=e-d+1..e} log e_t(k)
//   log p(x_b) = logsumexp_k alpha_{L-1}(k)       (0 for the empty series, L = 0)
// The emission sums run along d as a running sum (no cumulative sums over t: an impossible frame, -inf, would
// make their differences NaN), so each (e, k) costs O(D) and the whole O(T K (D + K)).  Arrays of one sequence
// are state-major with stride T: x[k * T + t].
//
// Status codes per sequence: HSMM_OK, HSMM_NO_PATH (log p = -inf), HSMM_NAN (a NaN log-emission on a valid frame,
// or a NaN in the parameters the sequence uses, with L > 0).  +inf anywhere read is a ValueError naming the
// argument (HsmmCheck codes below, beside common/input_checks.h's mask and emission codes).
#ifndef PTNATIVE_HSMM_HSMM_MODEL_H
#define PTNATIVE_HSMM_HSMM_MODEL_H

#include "../dialect/kernel.h"

#include "../common/input_checks.h"

enum { HSMM_OK = 0, HSMM_NO_PATH = 2, HSMM_NAN = 3 };

// FsaCheck code of a +inf parameter: i = the parameter (0 log_transitions, 1 log_durations, 2 log_initial), j = the
// flat index into the array as the op got it (log_durations and log_initial: with their leading batch dim).
// HSMM_CHECK_UNIFORM: uniforms[i, j] = value is not in [0, 1) (hsmm_sample_states).
enum { HSMM_CHECK_PARAM_PLUS_INF = 100, HSMM_CHECK_UNIFORM = 101 };

// The model of one call (device pointers).
struct HsmmModel {
  int64_t T, B, K, D, Bd, Bp;
  const Float* le;        // (T, B, K)
  const int32_t* seq_len;  // (B,)
  const int32_t* status;   // (B,): HSMM_OK or HSMM_NAN
  const double* lA;       // (K, K), the diagonal -inf
  const double* ld;       // (Bd, K, D) log p
  const double* lW;       // (Bd, K, D) the last segment's weights: log L (censored) or log p
  const double* lpi;      // (Bp, K)
  FsaCheck* check;
};

// The largest of x[0..n) (-inf for n = 0 or all -inf); then x[i] = exp(x[i] - that) in place (0 where x[i] = -inf
// or the largest is -inf) and *sum = their sum.  The exps run vectorised on the CPU, the sum in four chains.
DEV_FUNC inline double hsmm_exps(double* __restrict__ x, int64_t n, double* sum) {
  double m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  if (!(m > -INFINITY)) {
    for (int64_t i = 0; i < n; ++i) x[i] = 0.0;
    *sum = 0.0;
    return m;
  }
#if !CUDA
#pragma GCC ivdep
#endif
  for (int64_t i = 0; i < n; ++i) x[i] = fsa_exp(x[i] - m);
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += x[i];
    s1 += x[i + 1];
    s2 += x[i + 2];
    s3 += x[i + 3];
  }
  for (; i < n; ++i) s0 += x[i];
  *sum = (s0 + s1) + (s2 + s3);
  return m;
}

// logsumexp of x[0..n) (-inf for n = 0 or all -inf); x is overwritten (hsmm_exps).
DEV_FUNC inline double hsmm_lse(double* x, int64_t n) {
  double s;
  const double m = hsmm_exps(x, n, &s);
  return m > -INFINITY ? m + log(s) : m;
}

// max of x[0..n) and its first index (-inf and 0 for n = 0 or all -inf).
DEV_FUNC inline double hsmm_argmax(const double* x, int64_t n, int32_t* arg) {
  double m = -INFINITY;
  int32_t a = 0;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > m) {
      m = x[i];
      a = (int32_t)i;
    }
  *arg = a;
  return m;
}

// log(exp(a) + exp(b)).
DEV_FUNC inline double hsmm_logaddexp(double a, double b) {
  const double m = a > b ? a : b;
  if (!(m > -INFINITY)) return m;
  return m + log1p(fsa_exp(-fabs(a - b)));
}

// The parameters in double, checked: lA (diagonal -inf), ld, lW, lpi; pnan[0] = a NaN off the diagonal of
// log_transitions, pnan[1 + q] = a NaN in log_durations[q], pnan[1 + Bd + q] = in log_initial[q].  One thread.
DEF_KERNEL void hsmm_prep(int64_t K, int64_t D, int64_t Bd, int64_t Bp, bool censored, const Float* lA_in,
                          const Float* ld_in, const Float* lpi_in, double* lA, double* ld, double* lW, double* lpi,
                          int32_t* pnan, FsaCheck* check) {
  GRID_LOOP(unused, 1) {
    pnan[0] = 0;
    for (int64_t i = 0; i < K * K; ++i) {
      const double v = (double)lA_in[i];
      const bool diag = i / K == i % K;
      lA[i] = diag ? -INFINITY : v;
      if (diag) continue;
      if (v != v) pnan[0] = 1;
      if (v == INFINITY) fsa_fail(check, HSMM_CHECK_PARAM_PLUS_INF, 0, i, 0, v);
    }
    for (int64_t q = 0; q < Bd; ++q) {
      pnan[1 + q] = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t row = (q * K + k) * D;
        double acc = -INFINITY;
        for (int64_t d = D - 1; d >= 0; --d) {
          const double v = (double)ld_in[row + d];
          if (v != v) pnan[1 + q] = 1;
          if (v == INFINITY) fsa_fail(check, HSMM_CHECK_PARAM_PLUS_INF, 1, row + d, 0, v);
          ld[row + d] = v;
          acc = hsmm_logaddexp(acc, v);
          lW[row + d] = censored ? acc : v;
        }
      }
    }
    for (int64_t q = 0; q < Bp; ++q) {
      pnan[1 + Bd + q] = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double v = (double)lpi_in[q * K + k];
        if (v != v) pnan[1 + Bd + q] = 1;
        if (v == INFINITY) fsa_fail(check, HSMM_CHECK_PARAM_PLUS_INF, 2, q * K + k, 0, v);
        lpi[q * K + k] = v;
      }
    }
  }
}

// Per sequence: its length from the mask, and its status (NaN: a NaN log-emission on a valid frame).  A +inf log-emission on a valid frame is recorded as a failed check.
DEF_KERNEL void hsmm_lengths(int64_t T, int64_t B, int64_t K, const Float* le, const Float* mask, int32_t* seq_len,
                             int32_t* status, FsaCheck* check) {
  GRID_LOOP(b, B) {
    const int32_t len = fsa_mask_length(T, B, mask, b, check);
    seq_len[b] = len;
    status[b] = HSMM_OK;
    for (int64_t t = 0; t < len; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const double v = (double)le[(t * B + b) * K + k];
        if (v != v) status[b] = HSMM_NAN;
        if (v == INFINITY) fsa_fail(check, FSA_CHECK_SCORE_INFINITE, t, b, k, v);
      }
  }
}

// Per sequence: NaN parameters (pnan, hsmm_prep) make a sequence with a frame NaN.
DEF_KERNEL void hsmm_param_status(int64_t B, int64_t Bd, int64_t Bp, const int32_t* pnan, const int32_t* seq_len,
                                  int32_t* status) {
  GRID_LOOP(b, B) {
    const bool nan = pnan[0] || pnan[1 + (Bd == 1 ? 0 : b)] || pnan[1 + Bd + (Bp == 1 ? 0 : b)];
    if (seq_len[b] > 0 && nan) status[b] = HSMM_NAN;
  }
}

// The message of a failed check of `fn`'s arguments.
static std::string hsmm_check_message(const FsaCheck& c, const FsaTerms& terms) {
  std::ostringstream s;
  if (c.code == HSMM_CHECK_UNIFORM) {
    s << terms.fn << ": uniforms[" << c.i << ", " << c.j << "] = " << c.value << " is not in [0, 1)";
    return s.str();
  }
  if (c.code != HSMM_CHECK_PARAM_PLUS_INF) return fsa_check_message(c, terms);
  static const char* params[] = {"log_transitions", "log_durations", "log_initial"};
  s << terms.fn << ": " << params[c.i < 0 || c.i > 2 ? 0 : c.i] << ".flat[" << c.j
    << "] = inf (a log-probability above every finite value) is not allowed";
  return s.str();
}

static void hsmm_require(bool ok, const char* fn, const std::string& what) {
  if (!ok) ptn::raise(PTN_STATUS_VALUE, std::string(fn) + ": " + what);
}

// Raises the ValueError of a failed check recorded in m.check (T, B, K of m), in the terms of `fn`.
static void hsmm_raise_check(const HsmmModel& m, const char* fn) {
  FsaCheck c;
  Ndarray_copy_to_host(&c, m.check, sizeof(FsaCheck));
  if (c.code == FSA_CHECK_OK) return;
  FsaTerms terms;
  memset(&terms, 0, sizeof(terms));
  terms.fn = fn;
  terms.scores = "log_emissions";
  terms.mask = "mask";
  terms.T = m.T;
  terms.B = m.B;
  terms.D = m.K;
  ptn::raise(PTN_STATUS_VALUE, hsmm_check_message(c, terms));
}

// The model of inputs 0-5 (see the top): shapes checked, parameters in double, lengths and statuses; failures raise
// a ValueError in the terms of `fn`.  Everything lives in `scratch`.
static HsmmModel hsmm_model_setup(ptn::Scratch& scratch, Ndarray** inputs, const char* fn) {
  Ndarray *le = inputs[0], *lA = inputs[1], *ld = inputs[2], *lpi = inputs[3], *mask = inputs[4];
  HsmmModel m;
  m.T = Ndarray_DIMS(le)[0];
  m.B = Ndarray_DIMS(le)[1];
  m.K = Ndarray_DIMS(le)[2];
  m.D = Ndarray_DIMS(ld)[2];
  m.Bd = Ndarray_DIMS(ld)[0];
  m.Bp = Ndarray_DIMS(lpi)[0];
  const bool censored = Ndarray_DEV_DATA_int32_scalar(inputs[5]) != 0;
  std::ostringstream les;
  les << " (log_emissions has shape (" << m.T << ", " << m.B << ", " << m.K << "))";
  std::ostringstream s;
  s << "log_transitions must have shape (K, K), got (" << Ndarray_DIMS(lA)[0] << ", " << Ndarray_DIMS(lA)[1] << ")"
    << les.str();
  hsmm_require(Ndarray_DIMS(lA)[0] == m.K && Ndarray_DIMS(lA)[1] == m.K, fn, s.str());
  s.str("");
  s << "log_durations must have shape (K, D) or (B, K, D), got K = " << Ndarray_DIMS(ld)[1] << les.str();
  hsmm_require(Ndarray_DIMS(ld)[1] == m.K, fn, s.str());
  s.str("");
  s << "log_durations must have shape (K, D) or (B, K, D), got B = " << m.Bd << les.str();
  hsmm_require(m.Bd == 1 || m.Bd == m.B, fn, s.str());
  s.str("");
  s << "log_initial must have shape (K,) or (B, K), got K = " << Ndarray_DIMS(lpi)[1] << les.str();
  hsmm_require(Ndarray_DIMS(lpi)[1] == m.K, fn, s.str());
  s.str("");
  s << "log_initial must have shape (K,) or (B, K), got B = " << m.Bp << les.str();
  hsmm_require(m.Bp == 1 || m.Bp == m.B, fn, s.str());
  s.str("");
  s << "mask must have shape (T, B), got (" << Ndarray_DIMS(mask)[0] << ", " << Ndarray_DIMS(mask)[1] << ")"
    << les.str();
  hsmm_require(Ndarray_DIMS(mask)[0] == m.T && Ndarray_DIMS(mask)[1] == m.B, fn, s.str());

  const int64_t check_doubles = (int64_t)((sizeof(FsaCheck) + sizeof(double) - 1) / sizeof(double));
  const int64_t n_par = m.K * m.K + 2 * m.Bd * m.K * m.D + m.Bp * m.K;
  double* par = scratch.get<double>(n_par + check_doubles);
  double *A = par, *d = A + m.K * m.K, *W = d + m.Bd * m.K * m.D, *pi = W + m.Bd * m.K * m.D;
  m.check = (FsaCheck*)(par + n_par);
  int32_t* ints = scratch.get<int32_t>(2 * m.B + 1 + m.Bd + m.Bp);
  int32_t *seq_len = ints, *status = ints + m.B, *pnan = ints + 2 * m.B;
  Ndarray_memset(m.check, 0, sizeof(FsaCheck));
  start_dev_kernel(hsmm_prep, (m.K, m.D, m.Bd, m.Bp, censored, Ndarray_DEV_DATA(lA), Ndarray_DEV_DATA(ld),
                               Ndarray_DEV_DATA(lpi), A, d, W, pi, pnan, m.check));
  start_dev_kernel(hsmm_lengths, (m.T, m.B, m.K, Ndarray_DEV_DATA(le), Ndarray_DEV_DATA(mask), seq_len, status,
                                  m.check));
  start_dev_kernel(hsmm_param_status, (m.B, m.Bd, m.Bp, pnan, seq_len, status));
  HANDLE_LAST_ERROR();
  hsmm_raise_check(m, fn);
  m.le = Ndarray_DEV_DATA(le);
  m.seq_len = seq_len;
  m.status = status;
  m.lA = A;
  m.ld = d;
  m.lW = W;
  m.lpi = pi;
  return m;
}

// Per-sequence work arrays (doubles, state-major with stride T): the emissions, the segment starts, the ends
// (alpha), and a buffer of max(D, K) values.
struct HsmmSeqWork {
  double *em, *start, *alpha, *buf;
};

DEV_FUNC inline HsmmSeqWork hsmm_seq_work(const HsmmModel& m, double* work, int64_t b) {
  const int64_t per = 3 * m.K * m.T + (m.D > m.K ? m.D : m.K);
  double* w = work + b * per;
  HsmmSeqWork s;
  s.em = w;
  s.start = w + m.K * m.T;
  s.alpha = w + 2 * m.K * m.T;
  s.buf = w + 3 * m.K * m.T;
  return s;
}

static double* hsmm_work_alloc(ptn::Scratch& scratch, const HsmmModel& m) {
  return scratch.get<double>(m.B * (3 * m.K * m.T + (m.D > m.K ? m.D : m.K)));
}

// w.em: the log-emissions of sequence b's valid frames in double, state-major.
DEV_FUNC inline void hsmm_load_emissions(const HsmmModel& m, int64_t b, const HsmmSeqWork& w) {
  const int64_t T = m.T, B = m.B, K = m.K, L = m.seq_len[b];
  for (int64_t t = 0; t < L; ++t)
    for (int64_t k = 0; k < K; ++k) w.em[k * T + t] = (double)m.le[(t * B + b) * K + k];
}

// The forward recursion of sequence b (L > 0): starts and alpha for t < L; returns the log-likelihood (MAX: the
// Viterbi score, with backpointers bp_d (best duration of alpha, from 1) and bp_j (best previous state of a start),
// state-major like alpha; ties: the shortest duration, the lowest previous state).
template <bool MAX>
DEV_FUNC double hsmm_forward_seq(const HsmmModel& m, int64_t b, const HsmmSeqWork& w, int32_t* bp_d, int32_t* bp_j) {
  const int64_t T = m.T, K = m.K, D = m.D, L = m.seq_len[b];
  const double* ld = m.ld + (m.Bd == 1 ? 0 : b) * K * D;
  const double* lW = m.lW + (m.Bd == 1 ? 0 : b) * K * D;
  const double* lpi = m.lpi + (m.Bp == 1 ? 0 : b) * K;
  hsmm_load_emissions(m, b, w);
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      if (t == 0) {
        w.start[k * T] = lpi[k];
        continue;
      }
      for (int64_t j = 0; j < K; ++j) w.buf[j] = w.alpha[j * T + t - 1] + m.lA[j * K + k];
      if (MAX) {
        int32_t arg;
        w.start[k * T + t] = hsmm_argmax(w.buf, K, &arg);
        bp_j[k * T + t] = arg;
      } else {
        w.start[k * T + t] = hsmm_lse(w.buf, K);
      }
    }
    const double* W = t == L - 1 ? lW : ld;
    const int64_t n = D < t + 1 ? D : t + 1;
    for (int64_t k = 0; k < K; ++k) {
      const double* em = w.em + k * T + t;
      const double* st = w.start + k * T + t;
      const double* Wk = W + k * D;
      double seg = 0.0;
      for (int64_t d = 0; d < n; ++d) {
        seg += em[-d];
        w.buf[d] = st[-d] + Wk[d] + seg;
      }
      if (MAX) {
        int32_t arg;
        w.alpha[k * T + t] = hsmm_argmax(w.buf, n, &arg);
        bp_d[k * T + t] = arg + 1;
      } else {
        w.alpha[k * T + t] = hsmm_lse(w.buf, n);
      }
    }
  }
  for (int64_t k = 0; k < K; ++k) w.buf[k] = w.alpha[k * T + L - 1];
  int32_t arg;
  return MAX ? hsmm_argmax(w.buf, K, &arg) : hsmm_lse(w.buf, K);
}

#if !CUDA
// The number of CPU parts for a batch (one per thread, at most B) when the work pays for starting threads.
static int hsmm_cpu_parts(const HsmmModel& m) {
  const double work = (double)m.T * m.B * m.K * (m.D + m.K);
  return work < 2e6 ? 1 : (int)std::max<int64_t>(1, std::min<int64_t>(ptn::cpu_threads(), m.B));
}
#endif

// kernel(args..., b0, b1) over the batch: on CUDA one launch (one thread per sequence), on the CPU one call per part
// of contiguous sequences (hsmm_cpu_parts).
#if CUDA
#define HSMM_OVER_BATCH(m, kernel, ...) start_dev_kernel(kernel, (__VA_ARGS__, (int64_t)0, (m).B))
#else
#define HSMM_OVER_BATCH(m, kernel, ...)                                                        \
  do {                                                                                         \
    const int hsmm_parts_ = hsmm_cpu_parts(m);                                                 \
    const int64_t hsmm_b_ = (m).B;                                                             \
    ptn::parallel_parts(hsmm_parts_, [&](int q) {                                              \
      kernel(__VA_ARGS__, q * hsmm_b_ / hsmm_parts_, (q + 1) * hsmm_b_ / hsmm_parts_);         \
    });                                                                                        \
  } while (0)
#endif

#endif  // PTNATIVE_HSMM_HSMM_MODEL_H
