// Dense K-state HMM: the most likely state path (max-plus in log space, double) and its log score.
//
// delta_0 = log pi + log e_0, delta_t(j) = max_i (delta_{t-1}(i) + log A(i, j)) + log e_t(j), the score is
// max_k delta_{T_b-1}(k) + log f(k).  Ties go to the lowest state, at the end and at every step of the backtrace.
// Padded frames get -1; a sequence with a NaN input or without a path gets -1 on every frame and the score NaN
// or -inf.  One thread per sequence (CUDA), or per block of sequences (CPU); the backpointers live in a (T, B, K)
// int32 scratch.
#include "../dialect/kernel.h"

#include "hmm_vectors_small.h"
#include "hmm_viterbi_steps.h"
#include "hmm_viterbi_lanes.h"
#include "hmm_defaults.h"

#if !CUDA
// ---------------------------------------------------------------- one sequence, K <= 4, on the CPU
// The recursion of sequence b alone (one vector of states, K known at compile time), whose chain from frame to
// frame is then the whole work: delta and the rows of log A stay in registers, and a frame's chain is the
// broadcasts of delta, one add, a tree of maxima and the emission's add, with the same values as
// hmm_viterbi_frame.  For K <= 3 each state's delta is kept in every lane of its own vector (the maxima computed
// once per state, on the broadcast log A(i, j)): no broadcast on the chain (T=500: 4-10% less time in the same
// process; at K = 4 the extra adds cost as much as they save).  The backpointers are off that chain: the strict compares of the running maximum give, per
// state j, masks g_i(j) = "state i beats the states below it", and the lowest argmax is the largest such i; the
// frame's backpointers go into one byte (2 bits per state), so that the backtrace is a shift and a mask per frame.
// No check on the chain either: whether a frame had a NaN or +inf log-emission is collected beside it.

// Bit k set where lane k of a comparison's result is true.
static inline int hmm_mask_bits(hmm_v4l m) {
#ifdef __AVX__
  return __builtin_ia32_movmskpd256((hmm_v4d)m);
#else
  return (int)((m[0] & 1) | (m[1] & 2) | (m[2] & 4) | (m[3] & 8));
#endif
}

// max(a, b) lane-wise as a > b ? a : b (b where either is NaN), in one instruction where there is one (g++ turns
// the select into a compare and a masked move with AVX-512: a longer chain).
static inline hmm_v4d hmm_vmax(hmm_v4d a, hmm_v4d b) {
#ifdef __AVX__
  return __builtin_ia32_maxpd256(a, b);
#else
  return ptn_select(a > b, a, b);
#endif
}

// The byte of K 2-bit backpointers from the masks (bit j of m_i: g_i(j)); K <= 4.
static inline uint8_t hmm_viterbi_pack(int m1, int m2, int m3) {
  static const uint8_t spread[16] = {0x00, 0x01, 0x04, 0x05, 0x10, 0x11, 0x14, 0x15,
                                     0x40, 0x41, 0x44, 0x45, 0x50, 0x51, 0x54, 0x55};  // bit j -> bit 2j
  const int hi = m2 | m3, lo = m3 | (m1 & ~m2);  // the argmax's two bits, per state
  return (uint8_t)(spread[lo] | (spread[hi] << 1));
}

// Sequence b (T_b > 0, status not NaN): its score and path (-1 beyond T_b; all -1 without a path).  bp: T_b bytes
// of scratch.  Returns false, having written nothing, if a valid frame has a NaN or +inf log-emission (the caller
// then takes the general path, which reports it).
template <int K>
static bool hmm_viterbi_small(const HmmInferParams& p, int64_t b, uint8_t* bp, int32_t* path, Float* score) {
  const int64_t B = p.B, len = p.seq_len[b];
  hmm_v4d rows[4];
  for (int i = 0; i < 4; ++i) rows[i] = i < K ? hmm_lanes<K>(p.lA + i * K, -INFINITY) : hmm_splat(-INFINITY);
  const hmm_v4d inf = hmm_splat(INFINITY);
  hmm_v4d e = hmm_lanes<K>(p.le + b * K, -INFINITY);
  hmm_v4l ok = e < inf;  // every lane of every frame so far neither NaN nor +inf
  hmm_v4d bA[K][K];  // log A(i, j) in every lane
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < K; ++j) bA[i][j] = hmm_splat((double)p.lA[i * K + j]);
  hmm_v4d d = hmm_lanes<K>(p.lpi, -INFINITY) + e;
  hmm_v4d S[K];  // K <= 3: S[i] = delta(i) in every lane
  for (int i = 0; i < K; ++i) S[i] = hmm_splat(d[i]);
  for (int64_t t = 1; t < len; ++t) {
    const Float* et = p.le + (t * B + b) * K;
    e = hmm_lanes<K>(et, -INFINITY);
    ok &= e < inf;
    hmm_v4d v[4];
    for (int i = 0; i < K; ++i) v[i] = (K <= 3 ? S[i] : hmm_splat(d[i])) + rows[i];
    const hmm_v4d low = K > 1 ? hmm_vmax(v[1], v[0]) : v[0];
    int m[4] = {0, 0, 0, 0};
    if (K > 1) m[1] = hmm_mask_bits(v[1] > v[0]);
    if (K > 2) m[2] = hmm_mask_bits(v[2] > low);
    if (K > 3) m[3] = hmm_mask_bits(v[3] > hmm_vmax(v[2], low));
    bp[t] = hmm_viterbi_pack(m[1], m[2], m[3]);
    if (K > 3) {
      d = hmm_vmax(hmm_vmax(v[3], v[2]), low) + e;
      continue;
    }
    hmm_v4d next[K];
    for (int j = 0; j < K; ++j) {  // the same maxima column by column, each in every lane: no broadcast on the chain
      hmm_v4d w[K];
      for (int i = 0; i < K; ++i) w[i] = S[i] + bA[i][j];
      const hmm_v4d lo = K > 1 ? hmm_vmax(w[1], w[0]) : w[0];
      next[j] = (K > 2 ? hmm_vmax(w[2], lo) : lo) + hmm_splat((double)et[j]);
    }
    for (int j = 0; j < K; ++j) S[j] = next[j];
  }
  if (K <= 3)
    for (int k = 0; k < K; ++k) d[k] = S[k][0];
  for (int k = 0; k < 4; ++k)
    if (!ok[k]) return false;
  double best = -INFINITY;
  int arg = 0;
  for (int k = 0; k < K; ++k) {
    const double v = d[k] + (double)p.lf[k];
    if (v > best) {
      best = v;
      arg = k;
    }
  }
  for (int64_t t = len; t < p.T; ++t) path[t * B + b] = -1;
  if (!(best > -INFINITY)) {  // no path
    score[b] = (Float)-INFINITY;
    for (int64_t t = 0; t < len; ++t) path[t * B + b] = -1;
    return true;
  }
  score[b] = (Float)best;
  unsigned two_arg = 2 * arg;  // 2 * the state: the shift of its backpointer
  for (int64_t t = len - 1; t > 0; --t) {
    path[t * B + b] = (int32_t)(two_arg >> 1);
    two_arg = ((unsigned)bp[t] >> two_arg & 3u) << 1;
  }
  path[b] = (int32_t)(two_arg >> 1);
  return true;
}

// hmm_viterbi_fw for one sequence of at most 4 states (B = 1), without hmm_infer_setup's scan of the emissions
// (hmm_viterbi_small checks them beside its chain).  Returns false where the general path must run: other sizes,
// a NaN in the parameters, a NaN or +inf log-emission.
static bool hmm_viterbi_small_fw(Ndarray** inputs, Ndarray*** outputs) {
  if (Ndarray_DIMS(inputs[0])[1] != 1 || Ndarray_DIMS(inputs[0])[2] > 4) return false;
  HmmScratch scratch;
  HmmInferParams p;
  static_cast<HmmModel&>(p) = hmm_model_setup(scratch, inputs, "hmm_viterbi", false);
  int32_t* path = Ndarray_DEV_DATA_int32(*outputs[0]);
  Float* score = Ndarray_DEV_DATA(*outputs[1]);
  const int64_t len = p.seq_len[0];
  if (len == 0 || p.K == 0) {
    for (int64_t t = 0; t < p.T; ++t) path[t] = -1;
    score[0] = (Float)0.0;
    return len == 0;
  }
  if (p.consts[3] != 0.0) return false;
  uint8_t* bp = scratch.get<uint8_t>(len);
  bool done = false;
  hmm_with_k(p.K, [&](auto k) { done = hmm_viterbi_small<decltype(k)::value>(p, 0, bp, path, score); });
  return done;
}
#endif

// The CPU runs time outer and batch inner (independent recursions overlap) over the sequences [b0, b1) of one
// part of the batch (hmm_run_parts: one per CPU thread for large problems); CUDA one thread per sequence.
DEF_KERNEL void hmm_viterbi_kernel(HmmInferParams p, const double* lAd, double* delta, int32_t* bp, int32_t* path,
                                   Float* score,
                                   int64_t b0, int64_t b1) {
#if CUDA
  GRID_LOOP(i, b1 - b0) {
    const int64_t b = b0 + i;
    for (int64_t t = 0; t < p.seq_len[b]; ++t) hmm_viterbi_frame(p, lAd, p.lpi, t, b, delta, bp);
    hmm_viterbi_finish(p, b, delta, bp, path, score);
  }
#else
  const int64_t b = b0;
  if (p.Kp == 4 && b1 - b0 == 1 && p.seq_len[b] > 0 && p.status[b] != HMM_NAN) {  // one sequence of few states
    uint8_t* bytes = (uint8_t*)bp + b * p.T;                                     // (bp holds T B K int32)
    hmm_with_k(p.K, [&](auto k) { hmm_viterbi_small<decltype(k)::value>(p, b, bytes, path, score); });
    return;
  }
  hmm_time_outer(p.T, b0, b1, false, [&](int64_t t, int64_t b) { hmm_viterbi_frame(p, lAd, p.lpi, t, b, delta, bp); });
  for (int64_t b = b0; b < b1; ++b) hmm_viterbi_finish(p, b, delta, bp, path, score);
#endif
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_initial (K), log_final (K), mask (T,B)
// outputs: path (T,B) int32, score (B)
static void hmm_viterbi_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 2);
#if !CUDA
  if (hmm_viterbi_small_fw(inputs, outputs) || hmm_viterbi_lanes_fw(inputs, outputs)) return;
#endif
  HmmInferCall call("hmm_viterbi", inputs, n_inputs, 5, n_outputs, 2);
  const HmmInferParams& p = call.p;
  if (p.B == 0) return;
  double* delta = call.scratch.get<double>(p.B * 2 * p.K);
  int32_t* bp = call.scratch.get<int32_t>(p.T * p.B * p.K);
  double* lAd = call.scratch.get<double>(p.K * p.Kp);
  start_dev_kernel(hmm_viterbi_prep, (p, lAd));
  HMM_OVER_BATCH(call, hmm_viterbi_kernel, p, lAd, delta, bp, Ndarray_DEV_DATA_int32(*outputs[0]),
                 Ndarray_DEV_DATA(*outputs[1]));
  HANDLE_LAST_ERROR();
}

// HmmViterbiDefaultsOp: inputs log_emissions (T,B,K), log_transitions (K,K), log_initial (K); hmm_viterbi_fw with
// the defaults log_final = 0 and mask = 1.
static void hmm_viterbi_defaults_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 3);
  ptn::Scratch scratch;
  HmmWithDefaults five(scratch, inputs);
  hmm_viterbi_fw(5, five.all, n_outputs, outputs);
}
