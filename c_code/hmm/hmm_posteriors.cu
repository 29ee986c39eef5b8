// Dense K-state HMM: smoothed state marginals gamma_t(k) = p(z_t = k | x) and expected transition counts
// xi(i, j) = sum_{t >= 1} p(z_{t-1} = i, z_t = j | x), and their vector-Jacobian product.
//
// Forward: the scaled filter of hmm_infer.h (kept as hidden outputs alpha, c, m, status for the gradient op).
// Backward: beta_{T_b-1} = f, beta_{t-1} = A (E_t * beta_t), each renormalised to sum 1 and set to 0 where
// alpha is 0 (states no path reaches: their beta does not matter, and zeroing keeps inf * 0 out);
// gamma_t = alpha_t beta_t / z_t with z_t = alpha_t . beta_t, and
// xi += alpha_{t-1}(i) A(i, j) E_t(j) beta_t(j) / (c_t z_t).
//
// Gradient: with upstream G (T, B, K) for gamma and H (B, K, K) for xi, the vector-Jacobian product is a
// covariance under the posterior: d/d log e_t(k) = E[F 1{z_t = k}] - E[F] gamma_t(k), with the path functional
// F = sum_t G_t(z_t) + sum_{t >= 1} H(z_{t-1}, z_t) (log e, log pi and log f enter log p(path) through state
// indicators, log A through transition indicators).  E[F 1{...}] comes from a tangent forward r (r_0 = alpha_0 G_0,
// r_t = ((r_{t-1} A + (alpha_{t-1} (A o H))) E_t / c_t + alpha_t G_t) and a tangent backward s (s_{T_b-1} = 0,
// s_{t-1}(i) = sum_j A(i, j) E_t(j) (s_t(j) + beta_t(j) (G_t(j) + H(i, j))), scaled like beta), so that
// E[F 1{z_t = k}] = (r_t(k) beta_t(k) + alpha_t(k) s_t(k)) / z_t.
//
// A sequence without a path gets all-zero marginals, counts and gradients; one with a NaN input NaN marginals and
// counts (and NaN gradients; the shared parameters' gradients are then NaN).  The empty series: zeros.
#include "../dialect/kernel.h"

#include "hmm_posteriors_steps.h"
#include "hmm_posteriors_small.h"
#include "hmm_posteriors_lanes.h"
#include "hmm_posteriors_grad.h"
#include "hmm_defaults.h"

#if !CUDA
// The sequential pass over the sequences [b0, b1) (status set, xi zeroed): time outer, batch inner (the sequences'
// independent recursions overlap in the pipeline), then the counts.
static void hmm_post_sequential(const HmmInferParams& p, const HmmPostState& st, const HmmPostWork& w, Float* gamma,
                                Float* xi_out, int64_t b0, int64_t b1) {
  hmm_time_outer(p.T, b0, b1, false, [&](int64_t t, int64_t b) { hmm_post_fwd_step(p, st, w, t, b); });
  hmm_time_outer(p.T, b0, b1, true, [&](int64_t t, int64_t b) { hmm_post_bwd_step(p, st, w, t, b, gamma); });
  for (int64_t b = b0; b < b1; ++b) hmm_post_finish(p, st, w, b, gamma, xi_out);
}
#endif

// Forward op: the filter, then the backward pass writing gamma and xi.  The CPU runs time outer and batch inner
// (the sequences' independent recursions overlap in the pipeline) over the sequences [b0, b1) of one part of the
// batch (hmm_run_parts: one per CPU thread for large problems); CUDA one thread per sequence.
DEF_KERNEL void hmm_post_kernel(HmmInferParams p, HmmPostState st, HmmPostWork w, Float* gamma, Float* xi_out,
                                int64_t b0, int64_t b1) {
#if CUDA
  GRID_LOOP(i, b1 - b0) {
    const int64_t b = b0 + i;
    st.status[b] = p.status[b];
    for (int64_t j = 0; j < p.K * p.K; ++j) w.xi(b)[j] = 0.0;
    for (int64_t t = 0; t < p.seq_len[b]; ++t) hmm_post_fwd_step(p, st, w, t, b);
    for (int64_t t = p.seq_len[b] - 1; t >= 0; --t) hmm_post_bwd_step(p, st, w, t, b, gamma);
    hmm_post_finish(p, st, w, b, gamma, xi_out);
  }
#else
  for (int64_t b = b0; b < b1; ++b) {
    st.status[b] = p.status[b];
    for (int64_t j = 0; j < p.K * p.K; ++j) w.xi(b)[j] = 0.0;
  }
  if (w.small && b1 - b0 == 1 && p.seq_len[b0] > 0 && st.status[b0] == HMM_SCALED) {  // one sequence, few states
    bool done = false;
    hmm_with_k(p.K, [&](auto k) {
      done = hmm_post_small<decltype(k)::value>(p, st, b0, gamma, w.xi(b0), w.small + 16 * p.T * b0);
    });
    if (done) {
      hmm_post_finish(p, st, w, b0, gamma, xi_out);
      return;
    }
  }
  hmm_post_sequential(p, st, w, gamma, xi_out, b0, b1);
#endif
}

#if !CUDA
// Whether the posteriors of a batch of B sequences run in lanes.  A group costs the same whatever number of its lanes
// hold a sequence; a sequence in the sequential pass (time outer, batch inner) costs r times its share of a full
// group, measured (T = 1000, B = 8, one thread, CPU time, same process, load ~7) r = 3.3, 3.4, 2.8, 3.7, 3.6, 3.2,
// 3.1, 2.4, 2.7 at K = 2, 3, 4, 6, 8, 12, 16, 24, 32, and 2.4 - 3.4 up to K = 256 (shorter T): the lanes win when
// the batch rounded up to groups of 8 is at most 2.4 B, for every B >= 4, and measured also for B = 3 (1.06 - 1.21x
// faster at K = 4, 16, 32), not for B = 2 (1.11x faster at K = 4, 0.79x at K = 16).
static inline bool hmm_post_use_lanes(int64_t B) { return B >= 3; }

// hmm_posteriors_run on the CPU with the sequences in lanes, where hmm_post_use_lanes(B) and no parameter is NaN
// (returns false otherwise, having done nothing but the checks of hmm_model_setup).  Without hmm_infer_setup's scan
// of the emissions: hmm_lane_emissions finds NaN and +inf on the valid frames beside its own pass (the rest of a
// sequence after a NaN is searched for +inf separately), and +inf raises after the pass.  The groups split over the
// parts; the sequences a group leaves to the sequential pass run right after it, on the same thread.
static bool hmm_posteriors_lanes(Ndarray** inputs, const HmmPostState& st, Float* gamma, Float* xi_out) {
  const int64_t B = Ndarray_DIMS(inputs[0])[1], K = Ndarray_DIMS(inputs[0])[2];
  if (!hmm_post_use_lanes(B)) return false;
  HmmScratch scratch;
  HmmInferParams p;
  static_cast<HmmModel&>(p) = hmm_model_setup(scratch, inputs, "hmm_posteriors");
  if (p.consts[3] != 0.0) return false;
  p.Kp = (K + 3) / 4 * 4;  // the sequential pass's padded matrices (hmm_infer_setup's)
  double* Ap = scratch.get<double>(K * p.Kp);
  double* ATp = scratch.get<double>(K * p.Kp);
  start_dev_kernel(hmm_infer_pad, (p, Ap, ATp));
  p.Ap = Ap;
  p.ATp = ATp;
  p.status = scratch.get<int32_t>(B);
  for (int64_t b = 0; b < B; ++b) p.status[b] = HMM_SCALED;
  const HmmPostWork w = {scratch.get<double>(B * (3 * p.Kp + K * K)), B, p.Kp, K, (double*)0};
  const int64_t groups = (B + HMM_W - 1) / HMM_W;
  const int parts = (int)std::min<int64_t>(hmm_cpu_parts(p.T, B, K), groups);
  const int64_t per_part = (hmm_post_lane_doubles(p.T, K) + 7) / 8 * 8;
  double* mem = hmm_kept_doubles<1>(scratch, parts * per_part);
  char* redo = scratch.get<char>(B);
  memset(redo, 0, B);
  hmm_run_parts(scratch, parts, groups, p.check, [&](int q, int64_t g0, int64_t g1, FsaCheck* check) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t b0 = g * HMM_W, b1 = std::min<int64_t>(b0 + HMM_W, B);
      FsaCheck first;
      memset(&first, 0, sizeof(first));
      hmm_post_lane_group(p, st, g, mem + q * per_part, gamma, xi_out, redo, &first);
      for (int64_t b = b0; b < b1; ++b) {
        st.status[b] = p.status[b];
        if (redo[b]) {
          for (int64_t j = 0; j < K * K; ++j) w.xi(b)[j] = 0.0;
          hmm_post_sequential(p, st, w, gamma, xi_out, b, b + 1);
        } else if (st.status[b] == HMM_NAN) {
          hmm_post_finish(p, st, w, b, gamma, xi_out);
          for (int64_t t = 0; t < p.seq_len[b]; ++t)  // a +inf after the NaN still raises
            for (int64_t k = 0; k < K; ++k)
              if ((double)p.le[(t * B + b) * K + k] == INFINITY)
                fsa_fail(&first, FSA_CHECK_SCORE_INFINITE, t, b, k, INFINITY);
        }
      }
      hmm_keep_first_failure(check, first);
    }
  });
  hmm_infer_raise(p.check, hmm_model_terms("hmm_posteriors", p.T, B, K));
  return true;
}
#endif

// The marginals' padded frames (t >= T_b, T_b from the 0/1 prefix mask (T, B)) and the counts of sequences without
// a frame, zeroed before the passes run, which write every other element (the outputs are fully_written).
DEF_KERNEL void hmm_post_unwritten(const Float* mask, int64_t T, int64_t B, int64_t K, Float* gamma, Float* xi) {
  GRID_LOOP(b, B) {
    const int64_t len = hmm_mask_length(mask, T, B, b);
    hmm_zero_frames(gamma, len, T, B, K, b);
    if (len == 0)
      for (int64_t i = 0; i < K * K; ++i) xi[b * K * K + i] = (Float)0.0;
  }
}

// The forward pass of both forward ops: the marginals gamma (T,B,K) and the counts xi (B,K,K) from the inputs
// log_emissions (T,B,K), log_transitions (K,K), log_initial (K), log_final (K), mask (T,B); st: the hidden arrays
// (double) alpha (T,B,K), c (T,B), m (T,B), status (B).
static void hmm_posteriors_run(int n_inputs, Ndarray** inputs, const HmmPostState& st, Float* gamma, Float* xi) {
  const int64_t T = Ndarray_DIMS(inputs[0])[0], B = Ndarray_DIMS(inputs[0])[1];
  const bool mask_fits = Ndarray_NDIM(inputs[4]) == 2 && Ndarray_DIMS(inputs[4])[0] == T &&
                         Ndarray_DIMS(inputs[4])[1] == B;  // else the setup below raises
  if (B > 0 && mask_fits)
    start_dev_kernel(hmm_post_unwritten, (Ndarray_DEV_DATA(inputs[4]), T, B, Ndarray_DIMS(inputs[0])[2], gamma, xi));
#if !CUDA
  if (hmm_posteriors_small(inputs, st, gamma, xi) || hmm_posteriors_lanes(inputs, st, gamma, xi)) return;
#endif
  HmmInferCall call("hmm_posteriors", inputs, n_inputs, 5, 0, 0);
  const HmmInferParams& p = call.p;
  if (p.B == 0) return;
  HmmPostWork w = {call.scratch.get<double>(p.B * (3 * p.Kp + p.K * p.K)), p.B, p.Kp, p.K, (double*)0};
#if !CUDA
  if (p.Kp == 4 && hmm_cpu_parts(p.T, p.B, p.K) == p.B) w.small = hmm_kept_doubles<1>(call.scratch, 16 * p.T * p.B);
#endif
  HMM_OVER_BATCH(call, hmm_post_kernel, p, st, w, gamma, xi);
  HANDLE_LAST_ERROR();
}

// The hidden filter's rows that the gradient op does not read, zeroed after the passes (the outputs are
// fully_written): frames t >= T_b, and every frame of a sequence that did not end HMM_SCALED (its filter stopped
// at a NaN or where the path ended).  The mask as in hmm_post_unwritten.
DEF_KERNEL void hmm_post_filter_unwritten(const Float* mask, int64_t T, int64_t B, int64_t K, HmmPostState st) {
  GRID_LOOP(b, B) {
    const int64_t t0 = (int)st.status[b] == HMM_SCALED ? hmm_mask_length(mask, T, B, b) : 0;
    hmm_zero_frames(st.alpha, t0, T, B, K, b);
    hmm_zero_frames(st.c, t0, T, B, 1, b);
    hmm_zero_frames(st.m, t0, T, B, 1, b);
  }
}

// HmmPosteriorsOp: outputs marginals, counts, then the hidden arrays.
static void hmm_posteriors_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 6);
  const HmmPostState st = {(double*)(*outputs[2])->data, (double*)(*outputs[3])->data, (double*)(*outputs[4])->data,
                           (double*)(*outputs[5])->data, true};
  hmm_posteriors_run(n_inputs, inputs, st, Ndarray_DEV_DATA(*outputs[0]), Ndarray_DEV_DATA(*outputs[1]));
  const int64_t T = Ndarray_DIMS(inputs[0])[0], B = Ndarray_DIMS(inputs[0])[1];  // the inputs passed the checks
  if (B > 0)
    start_dev_kernel(hmm_post_filter_unwritten, (Ndarray_DEV_DATA(inputs[4]), T, B, Ndarray_DIMS(inputs[0])[2], st));
  HANDLE_LAST_ERROR();
}

// HmmPosteriorsValuesOp (no gradient): outputs marginals and counts; the hidden arrays in the library's memory.
static void hmm_posteriors_values_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 2);
  const int64_t TB = Ndarray_DIMS(inputs[0])[0] * Ndarray_DIMS(inputs[0])[1], K = Ndarray_DIMS(inputs[0])[2];
  ptn::Scratch scratch;
  double* mem = hmm_kept_doubles<0>(scratch, TB * (K + 2) + Ndarray_DIMS(inputs[0])[1]);
  const HmmPostState st = {mem, mem + TB * K, mem + TB * (K + 1), mem + TB * (K + 2), false};
  hmm_posteriors_run(n_inputs, inputs, st, Ndarray_DEV_DATA(*outputs[0]), Ndarray_DEV_DATA(*outputs[1]));
}

// HmmPosteriorsDefaultsOp: HmmPosteriorsValuesOp on log_emissions (T,B,K), log_transitions, log_initial with the
// defaults log_final = 0 (K) and mask = 1 (T,B), made here (contiguous, like the inputs they stand for).
static void hmm_posteriors_defaults_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 3);
  ptn::Scratch scratch;
  HmmWithDefaults five(scratch, inputs);
  hmm_posteriors_values_fw(5, five.all, n_outputs, outputs);
}

// ---------------------------------------------------------------- gradient
// hmm_post_grad_seq's matrices: the one A, its gradient dA_acc (K x K), d log pi dpi_acc (K).
struct HmmSharedMats {
  const HmmInferParams* p;
  double *dA_acc, *dpi_acc;
  DEV_FUNC const double* A(int64_t, int64_t) const { return p->A; }
  DEV_FUNC double* dA(int64_t, int64_t) const { return dA_acc; }
  DEV_FUNC double* dpi(int64_t) const { return dpi_acc; }
};

// Per sequence: hmm_post_grad_seq, or the zeros / NaN of a sequence without a path / with a NaN.
// dA_acc (K x K), dpi_acc, df_acc (K): double accumulators shared by the batch (atomics on CUDA).
DEF_KERNEL void hmm_post_grad_kernel(HmmInferParams p, HmmPostState st, const Float* G, const Float* H, double* r,
                                     double* work, Float* dle, double* dA_acc, double* dpi_acc, double* df_acc,
                                     int32_t* any_nan) {
  GRID_LOOP(b, p.B) {
    const int64_t B = p.B, K = p.K, len = p.seq_len[b];
    const int status = (int)st.status[b];
    hmm_zero_frames(dle, len == 0 || status == HMM_NO_PATH ? 0 : len, p.T, B, K, b);  // padded frames too
    if (len == 0 || status == HMM_NO_PATH) continue;
    if (status == HMM_NAN) {
      for (int64_t t = 0; t < len; ++t)
        for (int64_t k = 0; k < K; ++k) dle[(t * B + b) * K + k] = (Float)NAN_F;
      elem_atomic_add(any_nan, 1);
      continue;
    }
    hmm_post_grad_seq(p, st, G, H, r, work, dle, HmmSharedMats{&p, dA_acc, dpi_acc}, df_acc, b);
  }
}

DEF_KERNEL void hmm_post_grad_store(int64_t K, const double* dA_acc, const double* dpi_acc, const double* df_acc,
                                    const int32_t* any_nan, Float* dA, Float* dpi, Float* df) {
  GRID_LOOP(i, K * K) {
    const bool nan = any_nan[0] != 0;
    dA[i] = nan ? (Float)NAN_F : (Float)dA_acc[i];
    if (i < K) {
      dpi[i] = nan ? (Float)NAN_F : (Float)dpi_acc[i];
      df[i] = nan ? (Float)NAN_F : (Float)df_acc[i];
    }
  }
}

// inputs: the five inputs, alpha, c, m, status (hidden outputs), D_marginals (T,B,K), D_counts (B,K,K)
// outputs: d log_emissions (T,B,K), d log_transitions (K,K), d log_initial (K), d log_final (K)
static void hmm_posteriors_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmInferCall call("hmm_posteriors", inputs, n_inputs, 11, n_outputs, 4);
  const HmmInferParams& p = call.p;
  HmmScratch& scratch = call.scratch;
  const int64_t T = p.T, B = p.B, K = p.K;
  if (B == 0) return;
  assert_cmp(Ndarray_DIMS(inputs[9])[0], ==, T);
  assert_cmp(Ndarray_DIMS(inputs[10])[0], ==, B);
  HmmPostState st;
  st.alpha = (double*)inputs[5]->data;
  st.c = (double*)inputs[6]->data;
  st.m = (double*)inputs[7]->data;
  st.status = (double*)inputs[8]->data;
  st.filter_read = true;
  double* acc = scratch.get<double>(K * K + 2 * K);
  Ndarray_memset(acc, 0, (K * K + 2 * K) * sizeof(double));
  int32_t* any_nan = scratch.get<int32_t>(1);
  Ndarray_memset(any_nan, 0, sizeof(int32_t));
  double* r = scratch.get<double>(T * B * K);
  double* work = scratch.get<double>(B * 5 * p.Kp);
  start_dev_kernel(hmm_post_grad_kernel, (p, st, Ndarray_DEV_DATA(inputs[9]), Ndarray_DEV_DATA(inputs[10]), r, work,
                                          Ndarray_DEV_DATA(*outputs[0]), acc, acc + K * K, acc + K * K + K, any_nan));
  start_dev_kernel(hmm_post_grad_store, (K, acc, acc + K * K, acc + K * K + K, any_nan, Ndarray_DEV_DATA(*outputs[1]),
                                         Ndarray_DEV_DATA(*outputs[2]), Ndarray_DEV_DATA(*outputs[3])));
  HANDLE_LAST_ERROR();
}
