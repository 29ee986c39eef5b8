// The dense K-state HMM model every HMM op starts from: its inputs checked in the user's terms, the sequence
// lengths from the mask, the parameters' shifted exps, and the CPU's split of the batch over threads.
//
// Inputs 0-4 of every HMM op: log_emissions (T, B, K), log_transitions (K, K), log_initial (K,), log_final (K,),
// mask (T, B) (a 0/1 prefix mask).  hmm_model_setup checks their shapes, turns the mask into lengths and computes
// A = exp(log A - max log A), pi and f likewise (hmm_prep; consts holds the shifts and a NaN flag).  A failed check
// raises a ValueError naming the user's function and argument.  Per-sequence status codes: HMM_SCALED (computed by
// the scaled pass), HMM_LOG_SPACE (the likelihood's log-space fallback), HMM_NO_PATH, HMM_NAN.
//
// fsa_exp, FsaCheck, fsa_mask_lengths, FsaTerms: common/input_checks.h.
#ifndef PTNATIVE_HMM_HMM_MODEL_H
#define PTNATIVE_HMM_HMM_MODEL_H

#include "../dialect/kernel.h"

#include "../common/input_checks.h"
#include "hmm_mask_small.h"

// The dialect's scratch memory, under the name the HMM kernels of other files use.
typedef ptn::Scratch HmmScratch;

enum { HMM_SCALED = 0, HMM_LOG_SPACE = 1, HMM_NO_PATH = 2, HMM_NAN = 3 };

// Zeros into frames [t0, t1) of sequence b of a (T, B, K) array: the rows of a fully_written output (not zeroed by
// the entry point) that no pass of the kernels writes, such as padded frames.
template <typename X>
DEV_FUNC inline void hmm_zero_frames(X* x, int64_t t0, int64_t t1, int64_t B, int64_t K, int64_t b) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t k = 0; k < K; ++k) x[(t * B + b) * K + k] = X(0);
}

// The length of column b of the 0/1 prefix mask (T, B) for the passes that zero padded frames before or after the
// checks of hmm_model_setup: 0 for a column that is not a prefix mask (the setup raises for it).
DEV_FUNC inline int64_t hmm_mask_length(const Float* mask, int64_t T, int64_t B, int64_t b) {
  int64_t bad_t = 0;
  const int64_t len = ptn_prefix_mask_length(T, B, mask, b, &bad_t);
  return len < 0 ? 0 : len;
}

// *out = max of x[0..n) over the non-NaN entries (-inf if none); returns whether x has a NaN.  A +inf
// entry i is recorded in `check` (if given) by report(i), and *out is then -inf.
template <typename Report>
DEV_FUNC inline bool hmm_checked_max(const Float* x, int64_t n, double* out, FsaCheck* check, Report report) {
  double mq[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};  // four chains: the comparisons overlap
  int nan = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int q = 0; q < 4; ++q) {
      const double v = (double)x[i + q];
      nan |= v != v;
      mq[q] = v > mq[q] ? v : mq[q];
    }
  for (; i < n; ++i) {
    const double v = (double)x[i];
    nan |= v != v;
    mq[0] = v > mq[0] ? v : mq[0];
  }
  const bool has_nan = nan != 0;
  double m = mq[0] > mq[1] ? mq[0] : mq[1];
  m = mq[2] > m ? mq[2] : m;
  m = mq[3] > m ? mq[3] : m;
  if (m == INFINITY) {
    i = 0;
    while (i + 1 < n && !((double)x[i] == INFINITY)) ++i;
    if (check) report(check, i);
    m = -INFINITY;
  }
  *out = m;
  return has_nan;
}

// out[i] = exp(x[i] - m) (0 everywhere if m = -inf).
DEV_FUNC inline void hmm_exp_row(const Float* __restrict__ x, int64_t n, double m, double* __restrict__ out) {
  if (!(m > -INFINITY)) {
    for (int64_t i = 0; i < n; ++i) out[i] = 0.0;
    return;
  }
#if !CUDA
#pragma GCC ivdep
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = fsa_exp((double)x[i] - m);
}


struct HmmParamReport {
  int q;
  DEV_FUNC void operator()(FsaCheck* c, int64_t i) const { fsa_fail(c, FSA_CHECK_PARAM_PLUS_INF, q, i, 0, INFINITY); }
};

// A, pi, f: shifted exps; consts = [log-shift of A, of pi, of f, 1 if any of them has a NaN].  AT = A transposed.
// Without `exps` only the checks and consts (A, AT, pi, f untouched: the ops that work in log space).
DEF_KERNEL void hmm_prep(int64_t K, const Float* lA, const Float* lpi, const Float* lf, double* A, double* AT,
                         double* pi, double* f, double* consts, FsaCheck* check, bool exps) {
  GRID_LOOP(i, 1) {
    const Float* src[3] = {lA, lpi, lf};
    double* dst[3] = {A, pi, f};
    int64_t n[3] = {K * K, K, K};
    consts[3] = 0.0;
    for (int q = 0; q < 3; ++q) {
      double m;
      if (hmm_checked_max(src[q], n[q], &m, check, HmmParamReport{q})) consts[3] = 1.0;
      if (exps) hmm_exp_row(src[q], n[q], m, dst[q]);
      consts[q] = m > -INFINITY ? m : 0.0;
    }
    if (exps)
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < K; ++b) AT[b * K + a] = A[a * K + b];
  }
}

// The model every HMM op starts from (hmm_model_setup): sizes, the log-probability inputs, the sequence lengths,
// and the parameters' shifted exps (A, its transpose AT, pi, f; consts as hmm_prep's).
struct HmmModel {
  int64_t T, B, K;
  const Float *le, *lA, *lpi, *lf;
  const int32_t* seq_len;
  const double *A, *AT, *pi, *f, *consts;
  FsaCheck* check;
};

// n elements of T from `scratch`, starting on a 64-byte boundary: the CPU kernels' vector loads and stores then take
// whole cache lines (a store split over two lines is slower, and a load of part of it cannot be forwarded from it).
template <typename T>
static T* hmm_aligned(ptn::Scratch& scratch, int64_t n) {
  char* at = (char*)scratch.get<T>(n + 64 / (int64_t)sizeof(T));
  return (T*)(at + (64 - (uintptr_t)at % 64) % 64);
}

#if !CUDA
// The CPU threads: the batch in contiguous blocks, one per part, as many parts as threads (at most B) when the
// sequences' K x K products (T B K^2 >= 1e7, a few ms on one core) pay for starting threads: below that, on a
// machine whose cores are busy, a part that waits for a core costs more than the split saves (measured: 2 parts
// of T=1000 B=8 K=16 took 30-50x the one-thread time on 2 cores under a load average of 8, on OpenBLAS's pool).  Results do not
// depend on the split except for sums over the batch, which add the parts' partial sums in part order (bit-for-bit
// reproducible for a fixed thread count).
static int hmm_cpu_parts(int64_t T, int64_t B, int64_t K) {
  const double work = (double)T * B * K * K;
  return work < 1e7 ? 1 : (int)std::max<int64_t>(1, std::min<int64_t>(ptn::cpu_threads(), B));
}

// body(q, b0, b1, check) for each part q over the sequences [b0, b1); each records failed checks in its own
// FsaCheck (the parts run time outer: their first failure is their smallest (frame, sequence)), and the smallest
// of those is reported: the failure one thread would meet first, whatever the number of threads and their timing.
template <typename F>
static void hmm_run_parts(ptn::Scratch& scratch, int parts, int64_t B, FsaCheck* check, F&& body) {
  FsaCheck* checks = scratch.get<FsaCheck>(parts);
  memset(checks, 0, parts * sizeof(FsaCheck));
  ptn::parallel_parts(parts, [&](int q) { body(q, q * B / parts, (q + 1) * B / parts, checks + q); });
  const FsaCheck* first = 0;
  for (int q = 0; q < parts; ++q) {
    const FsaCheck& c = checks[q];
    if (c.code != FSA_CHECK_OK && (!first || c.i < first->i || (c.i == first->i && c.j < first->j))) first = &c;
  }
  if (first && check->code == FSA_CHECK_OK) *check = *first;
}
#endif  // !CUDA

// The names the user of function `fn` knows the arguments by.
static FsaTerms hmm_model_terms(const char* fn, int64_t T, int64_t B, int64_t K) {
  FsaTerms t;
  memset(&t, 0, sizeof(t));
  t.fn = fn;
  t.scores = "log_emissions";
  t.mask = "mask";
  t.T = T;
  t.B = B;
  t.D = K;
  return t;
}

// `a` has shape `want`, else a ValueError in the user's terms.
static void hmm_check_shape(const FsaTerms& terms, const Ndarray* a, const char* name, int64_t d0, int64_t d1,
                            const char* want) {
  bool ok = a->dims[0] == d0 && (a->ndim < 2 || a->dims[1] == d1);
  if (ok) return;
  std::ostringstream s;
  s << name << " must have shape " << want << ", got (" << a->dims[0];
  if (a->ndim > 1) s << ", " << a->dims[1];
  s << (a->ndim == 1 ? ",)" : ")") << " (log_emissions has shape (" << terms.T << ", " << terms.B << ", " << terms.D
    << "))";
  fsa_require(false, terms, s.str());
}

// Inputs 0-4 are log_emissions (T, B, K), log_transitions (K, K), log_initial (K,), log_final (K,), mask (T, B):
// shapes checked, lengths, the parameters' shifted exps (without `exps`: A, AT, pi, f null, consts set); failures
// raise in the terms of `fn`.  One block of scratch memory for all of it.
static HmmModel hmm_model_setup(ptn::Scratch& scratch, Ndarray** inputs, const char* fn, bool exps = true) {
  Ndarray *le = inputs[0], *lA = inputs[1], *lpi = inputs[2], *lf = inputs[3], *mask = inputs[4];
  HmmModel p;
  p.T = Ndarray_DIMS(le)[0];
  p.B = Ndarray_DIMS(le)[1];
  p.K = Ndarray_DIMS(le)[2];
  const FsaTerms terms = hmm_model_terms(fn, p.T, p.B, p.K);
  hmm_check_shape(terms, lA, "log_transitions", p.K, p.K, "(K, K)");
  hmm_check_shape(terms, lpi, "log_initial", p.K, 0, "(K,)");
  hmm_check_shape(terms, lf, "log_final", p.K, 0, "(K,)");
  hmm_check_shape(terms, mask, "mask", p.T, p.B, "(T, B)");
  p.le = Ndarray_DEV_DATA(le);
  p.lA = Ndarray_DEV_DATA(lA);
  p.lpi = Ndarray_DEV_DATA(lpi);
  p.lf = Ndarray_DEV_DATA(lf);
  const int64_t check_doubles = (int64_t)((sizeof(FsaCheck) + sizeof(double) - 1) / sizeof(double));
  double* A = scratch.get<double>(2 * p.K * p.K + 2 * p.K + 4 + check_doubles + (p.B + 1) / 2);
  double* AT = A + p.K * p.K;
  double* pi = AT + p.K * p.K;
  double* f = pi + p.K;
  double* consts = f + p.K;
  p.check = (FsaCheck*)(consts + 4);
  int32_t* seq_len = (int32_t*)(consts + 4 + check_doubles);
  Ndarray_memset(p.check, 0, sizeof(FsaCheck));
#if !CUDA
  if (p.B == 1)
    seq_len[0] = hmm_one_mask_length(p.T, Ndarray_DEV_DATA(mask), p.check);
  else
#endif
    start_dev_kernel(fsa_mask_lengths, (p.T, p.B, Ndarray_DEV_DATA(mask), seq_len, p.check));
  start_dev_kernel(hmm_prep, (p.K, p.lA, p.lpi, p.lf, A, AT, pi, f, consts, p.check, exps));
  fsa_raise_check(p.check, terms);
  p.seq_len = seq_len;
  p.A = exps ? A : nullptr;
  p.AT = exps ? AT : nullptr;
  p.pi = exps ? pi : nullptr;
  p.f = exps ? f : nullptr;
  p.consts = consts;
  return p;
}

#endif  // PTNATIVE_HMM_HMM_MODEL_H
