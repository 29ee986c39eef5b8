// Dense K-state HMM: log-likelihood and its gradients by scaled forward-backward.
//
// Scaled pass (double): emissions E_t = exp(log e_t - max_k log e_t) per (t, b),
// transitions A = exp(log A - max log A), initial / final likewise; the forward vector is
// renormalised every step (alpha_t = (alpha_{t-1} A) * E_t / c_t) and the log-scales summed.
// The forward op keeps no (T, B, K) array it would hand over; the gradient op (hmm_bw) runs the forward pass again
// into memory of its own, and HmmLikelihoodWithGradOp (hmm_fw_bw: value and gradient in one call, put in by a
// rewrite where the upstream gradient does not depend on the value) runs it once.  A sequence whose step mass c_t (or
// final mass) falls below HMM_TINY (the product underflowed: log-density gaps beyond double's ~700 nats within
// one step) is recomputed in log space (status 1); one with no path at all gets -inf and a
// zero gradient (status 2).
//
// CPU: the batch in blocks over the threads (hmm_run_parts), time outer and batch inner within a block: per step
// one small register-blocked GEMM over the block's sequences (hmm_gemm) and K-length vector loops (vectorised exp);
// or, where the batch fills groups of 8 well (hmm_use_lanes), the sequences in vector lanes (hmm_lanes.h).
// CUDA: one launch per step with a cuBLAS GEMM over the batch; the log-space fallback runs
// one thread per sequence on both.
//
// A sequence with no frame has probability 1 (log-likelihood 0, gradient 0).  A NaN log-emission on a valid
// frame of sequence b makes its log-likelihood NaN (status 3) and its emission gradient NaN on its valid frames;
// a NaN in the shared parameters does so for every sequence with a frame.  The gradients of the shared
// parameters are NaN when any sequence is.  +inf log-probabilities raise.
//
// hmm_model.h: the model, its checks and the CPU threads; hmm_gemm.h: the CPU step products; hmm_exp8.h: exp in
// eight lanes.
#include "../dialect/kernel.h"

#include "hmm_likelihood.h"
#include "hmm_loglik_small.h"
#include "hmm_rows.h"
#include "hmm_lanes.h"

#if !CUDA

// The scaled forward with the sequences in lanes (hmm_lanes.h): the groups of eight sequences split over the parts,
// each group's frames in turn; keep: the gradient op's pass (alpha, E and the scalings kept in p.aL, p.EL, p.sL).
static void hmm_forward_lanes(ptn::Scratch& scratch, const HmmParams& p, double* ll, bool keep) {
  const int64_t groups = (p.B + HMM_W - 1) / HMM_W;
  const int parts = (int)std::min<int64_t>(hmm_cpu_parts(p.T, p.B, p.K), groups);
  const int64_t per_part = (hmm_lane_work_doubles(p.K) + 7) / 8 * 8;
  double* work = hmm_aligned<double>(scratch, parts * per_part);
  hmm_run_parts(scratch, parts, groups, p.check, [&](int q, int64_t g0, int64_t g1, FsaCheck* check) {
    for (int64_t g = g0; g < g1; ++g) {
      FsaCheck first;
      memset(&first, 0, sizeof(first));
      hmm_lane_forward(p, g, keep, work + q * per_part, ll, &first);
      hmm_keep_first_failure(check, first);
    }
  });
}

// The scaled forward on the CPU: per part, time outer and batch inner.  Per chunk of frames, the emission rows first
// (off the recursion's chain), then per frame the step products alpha_{t-1} A of the part's sequences as one small
// register-blocked GEMM, and per sequence alpha_t = (alpha_{t-1} A) E_t / c_t with c_t the power of two that brings
// alpha_t's sum into [1, 2): an exact scaling, no division on the step's chain, and log c_t an integer times log 2
// (the log-likelihood, sum_t (log c_t + shift_t) + log(alpha_{T-1} . f), takes one log).  Status, log-likelihood
// and c_t live in part-local memory until the end (written per step into shared cache lines, they would bounce
// between the cores).
static void hmm_forward_cpu(ptn::Scratch& scratch, const HmmParams& p, double* ll) {
  const int64_t T = p.T, B = p.B, K = p.K, Kp = (K + 3) / 4 * 4;
  const int parts = hmm_cpu_parts(T, B, K);
  double* Ap = hmm_aligned<double>(scratch, K * Kp);
  double* pred_all = hmm_aligned<double>(scratch, B * Kp);
  double* c_all = scratch.get<double>(T * B);  // part q's block: (T, b1 - b0) from T * b0 on
  double* shift_all = scratch.get<double>(HMM_CHUNK * B);
  hmm_pad(p.A, K, Kp, Ap);
  hmm_run_parts(scratch, parts, B, p.check, [&](int q, int64_t b0, int64_t b1, FsaCheck* check) {
    (void)q;
    const int64_t nb = b1 - b0;
    if (Kp == 4 && nb == 1) {  // one sequence of few states: hmm_loglik_small.h
      if (p.seq_len[b0] > 0 && p.status[b0] == HMM_SCALED)
        hmm_with_k(K, [&](auto k) { p.status[b0] = hmm_small_forward<decltype(k)::value>(p, b0, check, ll + b0); });
      return;
    }
    double* pred = pred_all + b0 * Kp;
    double* c = parts == 1 ? p.c : c_all + T * b0;  // one part: straight into p.c ((T, B) = (T, nb))
    double* shift = shift_all + HMM_CHUNK * b0;
    std::vector<int> st(nb);
    std::vector<char> dead(nb);
    std::vector<double> shifts(nb, 0.0);
    std::vector<int64_t> mass_exp(nb, 0);
    int64_t t_end = 0;
    for (int64_t i = 0; i < nb; ++i) {
      st[i] = (int)p.status[b0 + i];
      dead[i] = st[i] != HMM_SCALED;
      t_end = std::max<int64_t>(t_end, p.seq_len[b0 + i]);
    }
    for (int64_t t0 = 0; t0 < t_end; t0 += HMM_CHUNK) {
      const int64_t t1 = std::min<int64_t>(t0 + HMM_CHUNK, t_end);
      hmm_emission_rows(p, t0, t1, b0, nb, dead.data(), shift, check);
      for (int64_t t = t0; t < t1; ++t) {
        if (t > 0) hmm_gemm(p.alpha + ((t - 1) * B + b0) * K, nb, K, K, Ap, Kp, pred, Kp);
        for (int64_t i = 0; i < nb; ++i) {
          const int64_t b = b0 + i, tb = t * B + b;
          if (t >= p.seq_len[b] || st[i] != HMM_SCALED) continue;
          const double m = shift[(t - t0) * nb + i];
          if (m != m) {
            st[i] = HMM_NAN;
            continue;
          }
          double* __restrict__ at = p.alpha + tb * K;
          const double s = hmm_dot(t == 0 ? p.pi : pred + i * Kp, p.E + tb * K, K, at);
          if (!(s >= HMM_TINY)) {  // the step's mass underflowed: log space
            st[i] = HMM_LOG_SPACE;
            continue;
          }
          const double scale = hmm_inverse_power_of_two(s);  // c_t = 1 / scale, a power of two
          c[t * nb + i] = 1.0 / scale;
          hmm_scale(at, K, scale);
          mass_exp[i] += hmm_exponent(s);
          shifts[i] += m + (t == 0 ? p.consts[1] : p.consts[0]);
        }
      }
    }
    for (int64_t i = 0; i < nb; ++i) {
      const int64_t b = b0 + i;
      if (parts > 1)
        for (int64_t t = 0; t < p.seq_len[b]; ++t) p.c[t * B + b] = c[t * nb + i];
      p.status[b] = st[i];
      if (p.seq_len[b] > 0 && st[i] == HMM_SCALED) {
        ll[b] = (double)mass_exp[i] * 0.6931471805599453 + shifts[i];
        hmm_fwd_final(p, b, ll);
      }
    }
  });
}
#else
DEF_KERNEL void hmm_fwd_step_kernel(HmmParams p, int64_t t, const double* pred, double* E, double* ll) {
  GRID_LOOP(b, p.B) {
    if (t >= p.seq_len[b] || p.status[b] != HMM_SCALED) continue;
    p.status[b] = hmm_fwd_step(p, t, b, t == 0 ? p.pi : pred + b * p.K, E + b * p.K, ll + b, p.c + t * p.B + b);
  }
}

DEF_KERNEL void hmm_fwd_final_kernel(HmmParams p, double* ll) {
  GRID_LOOP(b, p.B) {
    if (p.seq_len[b] > 0 && p.status[b] == HMM_SCALED) hmm_fwd_final(p, b, ll);
  }
}

// Rows of sequences that are done or have left the scaled pass are zero (the GEMM then adds
// nothing for them; their alpha_{t} slot is not read by the scaled pass).
static void hmm_forward_cuda(ptn::Scratch& scratch, const HmmParams& p, double* ll) {
  double* pred = scratch.get<double>(p.B * p.K);
  double* E = scratch.get<double>(p.B * p.K);
  for (int64_t t = 0; t < p.T; ++t) {
    if (t > 0) affine_raw(p.alpha + (t - 1) * p.B * p.K, p.B, p.K, p.A, p.K, p.K, pred, p.B, p.K, false, false, 0.0);
    start_dev_kernel(hmm_fwd_step_kernel, (p, t, pred, E, ll));
  }
  start_dev_kernel(hmm_fwd_final_kernel, (p, ll));
}
#endif

static FsaTerms hmm_terms(const HmmParams& p) { return hmm_model_terms("hmm_log_likelihood", p.T, p.B, p.K); }

static HmmParams hmm_setup(ptn::Scratch& scratch, Ndarray** inputs) {
  HmmParams p;
  static_cast<HmmModel&>(p) = hmm_model_setup(scratch, inputs, "hmm_log_likelihood");
  return p;
}

DEF_KERNEL void hmm_store_ll(int64_t n_batch, const double* ll, const double* status, Float* out) {
  GRID_LOOP(b, n_batch) {
    out[b] = status[b] == HMM_NO_PATH ? (Float)-INFINITY : status[b] == HMM_NAN ? (Float)NAN_F : (Float)ll[b];
  }
}

// The forward pass of every sequence: p.status, the log-likelihoods ll (B) and what the backward pass reads (with
// `keep`; HmmParams' memory, set here: hmm_kept.h's per-thread memory, slot 0); raises for +inf log-emissions.  The
// scaled pass, then the log-space one for the sequences it gave up on.  On the CPU a batch that fills groups of 8
// well enough (hmm_use_lanes) runs with the sequences in lanes (hmm_lanes.h; the forward op alone keeps no (T, B, K)
// array then), others time outer and batch inner.
static void hmm_forward_all(ptn::Scratch& scratch, HmmParams& p, double* ll, bool keep) {
  const int64_t TBK = (p.T * p.B * p.K + 7) / 8 * 8, TB = p.T * p.B;  // each array on a cache line
  p.status = scratch.get<double>(p.B);
  p.alpha = p.E = p.c = p.aL = p.EL = p.sL = nullptr;
  p.lanes = false;
#if !CUDA
  p.lanes = hmm_use_lanes(p.B, p.K);
  if (p.lanes) {
    const int64_t groups = (p.B + HMM_W - 1) / HMM_W, GTK = groups * p.T * p.K * HMM_W;
    if (keep) {
      double* mem = hmm_kept_doubles<0>(scratch, 2 * GTK + groups * p.T * HMM_W);
      p.aL = mem;
      p.EL = mem + GTK;
      p.sL = mem + 2 * GTK;
    }
  }
#else
  (void)keep;
#endif
  if (!p.lanes) {
    double* mem = hmm_kept_doubles<0>(scratch, (CUDA ? 1 : 2) * TBK + TB);
    p.alpha = mem;
    p.E = CUDA ? nullptr : mem + TBK;
    p.c = mem + (CUDA ? 1 : 2) * TBK;
  }
#if CUDA
  Ndarray_memset(p.alpha, 0, TBK * sizeof(double));  // hmm_forward_cuda's GEMM reads the rows of finished sequences
#endif
  start_dev_kernel(hmm_init_status, (p, ll));
#if CUDA
  hmm_forward_cuda(scratch, p, ll);
#else
  if (p.lanes) {
    hmm_forward_lanes(scratch, p, ll, keep);
    bool log_space = false;
    for (int64_t b = 0; b < p.B; ++b) log_space |= p.status[b] == HMM_LOG_SPACE;
    if (log_space) p.alpha = hmm_aligned<double>(scratch, TBK);  // the log-space pass's log alpha (T, B, K)
  } else {
    hmm_forward_cpu(scratch, p, ll);
  }
#endif
  fsa_raise_check(p.check, hmm_terms(p));  // +inf log-emissions
  start_dev_kernel(hmm_log_forward, (p, ll));
  fsa_raise_check(p.check, hmm_terms(p));
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_initial (K), log_final (K), mask (T,B)
// outputs: log_likelihood (B)
static void hmm_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 1);
  ptn::Scratch scratch;
  HmmParams p = hmm_setup(scratch, inputs);
  if (p.B == 0) return;
  double* ll = scratch.get<double>(p.B);
  hmm_forward_all(scratch, p, ll, false);
  start_dev_kernel(hmm_store_ll, (p.B, ll, p.status, Ndarray_DEV_DATA(*outputs[0])));
  HANDLE_LAST_ERROR();
}

// ---------------------------------------------------------------- scaled backward
// Per sequence, from t = len-1 down: beta_t (renormalised; starts as f), z = alpha_t . beta_t,
// gamma_t = alpha_t beta_t / z -> d log e_t (and d log pi at t = 0, d log f at len-1);
// with v = E_t beta_t: U += alpha_{t-1}^T v g / (c_t z) (expected transitions / A) and
// beta_{t-1} = A v.
#if !CUDA
// Per part, time outer and batch inner like the forward: beta_{t-1} = A v of the part's sequences is one small GEMM,
// and the rows of alpha_{t-1} x and v are buffered for U += X^T V (one GEMM per HMM_ROWS rows).  U, d log pi and
// d log f are summed per part, then over the parts in order.
static void hmm_backward_cpu(ptn::Scratch& scratch, const HmmParams& p, const Float* g, Float* dle,
                             double* __restrict__ U, double* dpi, double* df) {
  const int64_t T = p.T, B = p.B, K = p.K, Kp = (K + 3) / 4 * 4;
  const int64_t HMM_ROWS = 256;
  const int parts = hmm_cpu_parts(T, B, K);
  double* ATp = hmm_aligned<double>(scratch, K * Kp);
  hmm_pad(p.AT, K, Kp, ATp);
  double* beta_all = hmm_aligned<double>(scratch, B * Kp);
  double* v_all = hmm_aligned<double>(scratch, B * Kp);
  memset(v_all, 0, B * Kp * sizeof(double));
  // per part: U (K x Kp), d log pi, d log f, alpha_t beta_t (Kp each), then the X and V row buffers (HMM_ROWS x Kp
  // each)
  const int64_t head = (K * Kp + 3 * Kp + 7) / 8 * 8, per_part = head + 2 * HMM_ROWS * Kp;  // X, V on cache lines
  double* part_all = hmm_aligned<double>(scratch, parts * per_part);
  hmm_run_parts(scratch, parts, B, p.check, [&](int q, int64_t b0, int64_t b1, FsaCheck*) {
    const int64_t nb = b1 - b0;
    double* Uq = part_all + q * per_part;
    double* dpiq = Uq + K * Kp;
    double* dfq = dpiq + Kp;
    double* __restrict__ Et = dfq + Kp;
    double* Xbuf = Uq + head;
    double* Vbuf = Xbuf + HMM_ROWS * Kp;
    memset(Uq, 0, (K * Kp + 2 * Kp) * sizeof(double));
    if (Kp == 4 && nb == 1) {  // one sequence of few states: hmm_loglik_small.h
      if (p.seq_len[b0] > 0 && p.status[b0] == HMM_SCALED && (double)g[b0] != 0.0)
        hmm_with_k(K, [&](auto k) {
          hmm_small_backward<decltype(k)::value>(p, b0, (double)g[b0], dle, Uq, Kp, dpiq, dfq);
        });
      return;
    }
    memset(Xbuf, 0, 2 * HMM_ROWS * Kp * sizeof(double));  // the padding columns stay 0
    double* beta_q = beta_all + b0 * Kp;
    double* v_q = v_all + b0 * Kp;
    std::vector<char> stepped(nb);
    int64_t n_rows = 0, t_end = 0;
    for (int64_t i = 0; i < nb; ++i) t_end = std::max<int64_t>(t_end, p.seq_len[b0 + i]);
    for (int64_t t = t_end - 1; t >= 0; --t) {
      bool any = false;
      for (int64_t i = 0; i < nb; ++i) {
        const int64_t b = b0 + i, len = p.seq_len[b];
        const double gb = (double)g[b];
        stepped[i] = 0;
        if (t >= len || p.status[b] != HMM_SCALED || gb == 0.0) continue;
        double* __restrict__ beta = beta_q + i * Kp;
        if (t == len - 1)
          for (int64_t k = 0; k < K; ++k) beta[k] = p.f[k];
        const int64_t tb = t * B + b;
        const double* __restrict__ at = p.alpha + tb * K;
        double* __restrict__ ab = Et;  // alpha_t beta_t
        const double z = hmm_dot(at, beta, K, ab);
        Float* __restrict__ d = dle + tb * K;
        if (!(z > 0.0)) {  // cannot happen after a successful forward pass
          hmm_zero_frames(dle, t, t + 1, B, K, b);
          continue;
        }
        const double r = gb / z;
#pragma GCC ivdep
        for (int64_t k = 0; k < K; ++k) d[k] = (Float)(ab[k] * r);
        if (t == len - 1)
          for (int64_t k = 0; k < K; ++k) dfq[k] += ab[k] * r;
        if (t == 0) {
          for (int64_t k = 0; k < K; ++k) dpiq[k] += ab[k] * r;
          continue;
        }
        const double* __restrict__ E = p.E + tb * K;
        double* __restrict__ v = v_q + i * Kp;
        double* __restrict__ V = Vbuf + n_rows * Kp;
        double* __restrict__ X = Xbuf + n_rows * Kp;
#pragma GCC ivdep
        for (int64_t k = 0; k < K; ++k) V[k] = v[k] = E[k] * beta[k];
        const double* __restrict__ ap = p.alpha + (tb - B) * K;
        const double x = r / p.c[tb];
#pragma GCC ivdep
        for (int64_t k = 0; k < K; ++k) X[k] = ap[k] * x;
        if (++n_rows == HMM_ROWS) {
          hmm_gemm(Xbuf, K, Kp, n_rows, Vbuf, Kp, Uq, Kp, true);
          n_rows = 0;
        }
        stepped[i] = 1;
        any = true;
      }
      if (!any) continue;
      hmm_gemm(v_q, nb, Kp, K, ATp, Kp, beta_q, Kp);  // beta_{t-1} = A v (rows that did not step are not read)
      for (int64_t i = 0; i < nb; ++i) {
        if (!stepped[i]) continue;
        double* __restrict__ beta = beta_q + i * Kp;
        hmm_v4d acc = hmm_splat(0.0);
        for (int64_t k = 0; k < Kp; k += 4) {  // the padding columns are 0
          hmm_v4d x;
          memcpy(&x, beta + k, sizeof(x));
          acc += x;
        }
        // Scaled by the power of two that brings its sum into [1, 2): exact, and no division on the step's chain
        // (beta's scale cancels in the gradients).  An all-zero beta stays 0.
        const double scale = hmm_inverse_power_of_two(hmm_hsum(acc));
#pragma GCC ivdep
        for (int64_t k = 0; k < Kp; ++k) beta[k] *= scale;
      }
    }
    if (n_rows > 0) hmm_gemm(Xbuf, K, Kp, n_rows, Vbuf, Kp, Uq, Kp, true);
  });
  for (int q = 0; q < parts; ++q) {
    const double* Uq = part_all + q * per_part;
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) U[i * K + j] += Uq[i * Kp + j];
    for (int64_t k = 0; k < K; ++k) {
      dpi[k] += Uq[K * Kp + k];
      df[k] += Uq[K * Kp + Kp + k];
    }
  }
}

// The scaled backward with the sequences in lanes: the groups over the parts, each group's partial sums of U, d log
// pi and d log f kept apart and added in group order (the same bits for any number of threads).
static void hmm_backward_lanes(ptn::Scratch& scratch, const HmmParams& p, const Float* g, Float* dle, double* U,
                               double* dpi, double* df) {
  const int64_t K = p.K, groups = (p.B + HMM_W - 1) / HMM_W;
  const int parts = (int)std::min<int64_t>(hmm_cpu_parts(p.T, p.B, K), groups);
  const int64_t per_part = (hmm_lane_back_doubles(K) + 7) / 8 * 8, per_group = K * K + 2 * K;
  double* work = hmm_aligned<double>(scratch, parts * per_part);
  double* sums = scratch.get<double>(groups * per_group);
  hmm_run_parts(scratch, parts, groups, p.check, [&](int q, int64_t g0, int64_t g1, FsaCheck*) {
    for (int64_t grp = g0; grp < g1; ++grp)
      hmm_lane_backward(p, grp, g, dle, work + q * per_part, sums + grp * per_group);
  });
  for (int64_t grp = 0; grp < groups; ++grp) {
    const double* s = sums + grp * per_group;
    for (int64_t i = 0; i < K * K; ++i) U[i] += s[i];
    for (int64_t k = 0; k < K; ++k) {
      dpi[k] += s[K * K + k];
      df[k] += s[K * K + K + k];
    }
  }
}
#else
DEF_KERNEL void hmm_bw_gamma(HmmParams p, int64_t t, const Float* g, double* beta, double* z, Float* dle, double* dpi,
                             double* df) {
  GRID_LOOP(b, p.B) {
    const int64_t K = p.K, len = p.seq_len[b], tb = t * p.B + b;
    double* bb = beta + b * K;
    z[b] = 0.0;
    if (t >= len || p.status[b] != HMM_SCALED) continue;
    if (t == len - 1)
      for (int64_t k = 0; k < K; ++k) bb[k] = p.f[k];
    const double* at = p.alpha + tb * K;
    double s = 0.0;
    for (int64_t k = 0; k < K; ++k) s += at[k] * bb[k];
    z[b] = s;
    double r = s > 0.0 ? (double)g[b] / s : 0.0;
    for (int64_t k = 0; k < K; ++k) {
      double gam = at[k] * bb[k] * r;
      dle[tb * K + k] = (Float)gam;
      if (t == 0) elem_atomic_add(dpi + k, gam);
      if (t == len - 1) elem_atomic_add(df + k, gam);
    }
  }
}

// v = E_t beta_t; X = alpha_{t-1} g / (c_t z_t) (both 0 for rows not in the scaled pass at t).
DEF_KERNEL void hmm_bw_rows(HmmParams p, int64_t t, const Float* g, const double* beta, const double* z, double* v,
                            double* X) {
  GRID_LOOP(b, p.B) {
    const int64_t K = p.K, tb = t * p.B + b;
    bool ok = t < p.seq_len[b] && p.status[b] == HMM_SCALED && z[b] > 0.0;
    double r = ok ? (double)g[b] / (p.c[tb] * z[b]) : 0.0;
    double m = -INFINITY;
    if (ok) hmm_checked_max(p.le + tb * K, K, &m, (FsaCheck*)0, HmmEmissionReport{t, b});
    for (int64_t k = 0; k < K; ++k) {
      v[b * K + k] = ok ? fsa_exp((double)p.le[tb * K + k] - m) * beta[b * K + k] : 0.0;
      X[b * K + k] = ok ? p.alpha[(tb - p.B) * K + k] * r : 0.0;
    }
  }
}

DEF_KERNEL void hmm_bw_norm(int64_t n_batch, int64_t K, double* beta) {
  GRID_LOOP(b, n_batch) {
    double* bb = beta + b * K;
    double s = 0.0;
    for (int64_t k = 0; k < K; ++k) s += bb[k];
    double inv = s > 0.0 ? 1.0 / s : 0.0;
    for (int64_t k = 0; k < K; ++k) bb[k] *= inv;
  }
}

static void hmm_backward_cuda(ptn::Scratch& scratch, const HmmParams& p, const Float* g, Float* dle, double* U,
                              double* dpi, double* df) {
  const int64_t B = p.B, K = p.K;
  double* beta = scratch.get<double>(B * K);
  double* v = scratch.get<double>(B * K);
  double* X = scratch.get<double>(B * K);
  double* z = scratch.get<double>(B);
  Ndarray_memset(beta, 0, B * K * sizeof(double));
  for (int64_t t = p.T - 1; t >= 0; --t) {
    start_dev_kernel(hmm_bw_gamma, (p, t, g, beta, z, dle, dpi, df));
    if (t == 0) break;
    start_dev_kernel(hmm_bw_rows, (p, t, g, beta, z, v, X));
    affine_raw(X, B, K, v, B, K, U, K, K, true, false, 1.0);          // U += X^T v
    affine_raw(v, B, K, p.A, K, K, beta, B, K, false, true, 0.0);     // beta_{t-1} = v A^T
    start_dev_kernel(hmm_bw_norm, (B, K, beta));
  }
}
#endif

// NaN sequences: NaN emission gradient on their valid frames; any_nan[0] = 1 if there is one.
DEF_KERNEL void hmm_bw_nan(HmmParams p, Float* dle, int32_t* any_nan) {
  GRID_LOOP(b, p.B + 1) {
    if (b == p.B) {
      any_nan[0] = 0;
      for (int64_t i = 0; i < p.B; ++i) any_nan[0] |= p.status[i] == HMM_NAN;
      continue;
    }
    if (p.status[b] != HMM_NAN) continue;
    for (int64_t t = 0; t < p.seq_len[b]; ++t)
      for (int64_t k = 0; k < p.K; ++k) dle[(t * p.B + b) * p.K + k] = (Float)NAN_F;
  }
}

// d log e's rows that no backward pass writes, zeroed before they run (the output is fully_written): the padded
// frames, and every frame of a sequence the passes skip (no frame, no path, or scaled with upstream gradient 0, which
// the CPU passes skip).  The log-space pass writes its sequences' frames, hmm_bw_nan those of NaN sequences.
DEF_KERNEL void hmm_bw_unwritten(HmmParams p, const Float* g, Float* dle) {
  GRID_LOOP(b, p.B) {
    const int64_t len = p.seq_len[b];
    const int s = (int)p.status[b];
    const bool passed = len > 0 && (s == HMM_LOG_SPACE || s == HMM_NAN || (s == HMM_SCALED && (double)g[b] != 0.0));
    hmm_zero_frames(dle, passed ? len : 0, p.T, p.B, p.K, b);
  }
}

DEF_KERNEL void hmm_bw_store(int64_t K, const double* U, const double* A, const double* dA_log, const double* dpi,
                             const double* df, const int32_t* any_nan, Float* dA, Float* dpi_out, Float* df_out) {
  GRID_LOOP(i, K * K) {
    const Float nan = (Float)NAN_F;
    dA[i] = any_nan[0] ? nan : (Float)(U[i] * A[i] + dA_log[i]);
    if (i < K) {
      dpi_out[i] = any_nan[0] ? nan : (Float)dpi[i];
      df_out[i] = any_nan[0] ? nan : (Float)df[i];
    }
  }
}

// The gradients (d log_emissions (T, B, K), d log_transitions (K, K), d log_initial, d log_final (K)) into `grads`
// and, if ll_out is given, the log-likelihoods (B); inputs: log_emissions, log_transitions, log_initial, log_final,
// mask, D_log_likelihood (B).  The forward pass runs here (hmm_forward_all; the same arithmetic as the forward op's,
// so the same alpha).
static void hmm_gradients(Ndarray** inputs, Ndarray** grads, Float* ll_out) {
  ptn::Scratch scratch;
  HmmParams p = hmm_setup(scratch, inputs);
  const int64_t B = p.B, K = p.K;
  assert_cmp(Ndarray_DIMS(inputs[5])[0], ==, B);
  if (B == 0) return;
  double* ll = scratch.get<double>(B);
  hmm_forward_all(scratch, p, ll, true);
  if (ll_out) start_dev_kernel(hmm_store_ll, (B, ll, p.status, ll_out));
  const Float* g = Ndarray_DEV_DATA(inputs[5]);
  double* U = scratch.get<double>(K * K);
  double* dA_log = scratch.get<double>(K * K);
  double* dpi = scratch.get<double>(K);
  double* df = scratch.get<double>(K);
  Ndarray_memset(U, 0, K * K * sizeof(double));
  Ndarray_memset(dA_log, 0, K * K * sizeof(double));
  Ndarray_memset(dpi, 0, K * sizeof(double));
  Ndarray_memset(df, 0, K * sizeof(double));
  Float* dle = Ndarray_DEV_DATA(grads[0]);
  start_dev_kernel(hmm_bw_unwritten, (p, g, dle));
#if CUDA
  hmm_backward_cuda(scratch, p, g, dle, U, dpi, df);
#else
  if (p.lanes)
    hmm_backward_lanes(scratch, p, g, dle, U, dpi, df);
  else
    hmm_backward_cpu(scratch, p, g, dle, U, dpi, df);
#endif
  HANDLE_LAST_ERROR();
  start_dev_kernel(hmm_log_backward, (p, g, scratch.get<double>(B * 2 * K), dle, dA_log, dpi, df));
  int32_t* any_nan = scratch.get<int32_t>(1);
  start_dev_kernel(hmm_bw_nan, (p, dle, any_nan));
  start_dev_kernel(hmm_bw_store, (K, U, p.A, dA_log, dpi, df, any_nan, Ndarray_DEV_DATA(grads[1]),
                                  Ndarray_DEV_DATA(grads[2]), Ndarray_DEV_DATA(grads[3])));
  HANDLE_LAST_ERROR();
}

// The gradient op: inputs as hmm_gradients'; outputs the four gradients.
static void hmm_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 4);
  Ndarray* grads[4] = {*outputs[0], *outputs[1], *outputs[2], *outputs[3]};
  hmm_gradients(inputs, grads, nullptr);
}

// HmmLikelihoodWithGradOp: inputs as hmm_gradients'; outputs the log-likelihoods (B) then the four gradients (one
// forward pass for both).
static void hmm_fw_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 5);
  Ndarray* grads[4] = {*outputs[1], *outputs[2], *outputs[3], *outputs[4]};
  hmm_gradients(inputs, grads, Ndarray_DEV_DATA(*outputs[0]));
}
