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
#include "hmm_kept.h"

#if !CUDA && defined(__AVX512F__)
#include <immintrin.h>
#endif

#if !CUDA
// ---------------------------------------------------------------- one sequence, K <= 4, on the CPU
// The recursion of sequence b alone (one vector of states, K known at compile time), whose chain from frame to
// frame is then the whole work: delta and the rows of log A stay in registers, and a frame's chain is the
// broadcasts of delta, one add, a tree of maxima and the emission's add, with the same values as
// hmm_viterbi_frame.  For K <= 3 each state's delta is kept in every lane of its own vector (the maxima computed
// once per state, on the broadcast log A(i, j)): no broadcast on the chain (T=500: 4-10% less time in the same
// process; at K = 4 the extra adds cost as much as they save).  The backpointers are off that chain: the strict
// compares of the running maximum give, per state j, masks g_i(j) = "state i beats the states below it", and the
// lowest argmax is the largest such i; a frame's backpointers go into one 16-bit word (4 * the state in nibble j),
// so that the backtrace is a shift and a mask per frame (two instructions on its chain).  No check on the chain
// either: the emissions of the valid frames are checked for NaN and +inf in one pass before it.

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

// Bits 4j + 2 and 4j + 3 of a frame's backpointer word: bit j of a 4-bit mask spread to bit 4j.
static const uint16_t hmm_viterbi_nibbles[16] = {0x0000, 0x0001, 0x0010, 0x0011, 0x0100, 0x0101, 0x0110, 0x0111,
                                                 0x1000, 0x1001, 0x1010, 0x1011, 0x1100, 0x1101, 0x1110, 0x1111};

// A frame's K <= 4 backpointers as one word, nibble j holding 4 * the lowest argmax into state j, from the masks (bit
// j of m_i: g_i(j)): the backtrace's step is then a shift and a mask, `x = bp >> x & 12`, with x = 4 * the state.
static inline uint16_t hmm_viterbi_pack(int m1, int m2, int m3) {
  const int hi = m2 | m3, lo = m3 | (m1 & ~m2);  // the argmax's two bits, per state
  return (uint16_t)(hmm_viterbi_nibbles[lo] << 2 | hmm_viterbi_nibbles[hi] << 3);
}

// The score and path of sequence b (the one-sequence paths) from its last deltas d[0, K): the lowest state of the
// largest d[k] + log f(k), then the backtrace through the frames' words, whose field j (S bits from bit S j) holds
// 2^S * the lowest argmax into state j: x = 2^S * the state, and a step is `x = word >> x & (2^S - 1) << S`.
template <int S, typename Deltas, typename Word>
static void hmm_viterbi_small_end(const HmmInferParams& p, int64_t b, int K, const Deltas& d, const Word* bp,
                                  int32_t* path, Float* score) {
  const int64_t B = p.B, len = p.seq_len[b];
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
    return;
  }
  score[b] = (Float)best;
  typedef std::conditional_t<sizeof(Word) <= 4, unsigned, uint64_t> Reg;  // no narrowing on the chain
  const Reg field = (((Reg)1 << S) - 1) << S;
  Reg x = (Reg)arg << S;
  for (int64_t t = len - 1; t > 0; --t) {
    path[t * B + b] = (int32_t)(x >> S);
    x = (Reg)bp[t] >> x & field;
  }
  path[b] = (int32_t)(x >> S);
}

// Sequence b (T_b > 0, with neither NaN nor +inf in its valid frames and the parameters): its score and path (-1
// beyond T_b; all -1 without a path).  bp: T_b words of scratch.
template <int K>
static void hmm_viterbi_small(const HmmInferParams& p, int64_t b, uint16_t* bp, int32_t* path, Float* score) {
  const int64_t B = p.B, len = p.seq_len[b];
  const Float* const le = p.le;  // a local copy: the stores to bp do not make the loop read it again
  hmm_v4d rows[4];
  for (int i = 0; i < 4; ++i) rows[i] = i < K ? hmm_lanes<K>(p.lA + i * K, -INFINITY) : hmm_splat(-INFINITY);
  hmm_v4d bA[K][K];  // log A(i, j) in every lane
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < K; ++j) bA[i][j] = hmm_splat((double)p.lA[i * K + j]);
  hmm_v4d d = hmm_lanes<K>(p.lpi, -INFINITY) + hmm_lanes<K>(le + b * K, -INFINITY);
  hmm_v4d S[K];  // K <= 3: S[i] = delta(i) in every lane
  for (int i = 0; i < K; ++i) S[i] = hmm_splat(d[i]);
  for (int64_t t = 1; t < len; ++t) {
    const Float* et = le + (t * B + b) * K;
    hmm_v4d v[4];
    for (int i = 0; i < K; ++i) v[i] = (K <= 3 ? S[i] : hmm_splat(d[i])) + rows[i];
    const hmm_v4d low = K > 1 ? hmm_vmax(v[1], v[0]) : v[0];
    int m[4] = {0, 0, 0, 0};
    if (K > 1) m[1] = hmm_mask_bits(v[1] > v[0]);
    if (K > 2) m[2] = hmm_mask_bits(v[2] > low);
    if (K > 3) m[3] = hmm_mask_bits(v[3] > hmm_vmax(v[2], low));
    bp[t] = hmm_viterbi_pack(m[1], m[2], m[3]);
    if (K > 3) {
      d = hmm_vmax(hmm_vmax(v[3], v[2]), low) + hmm_lanes<K>(et, -INFINITY);
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
  hmm_viterbi_small_end<2>(p, b, K, d, bp, path, score);
}

// ---------------------------------------------------------------- one sequence, 4 < K <= 8, on the CPU
// As hmm_viterbi_small with delta in one vector of eight doubles: a frame's chain is the broadcasts of delta, K adds,
// a tree of maxima and the emission's add, the values of hmm_viterbi_frame (each maximum a > b ? a : b with a the
// higher states: equal values give the lower one's, as the general path's strict compares do).  The lowest argmax
// of every state j (the running strict maximum over i, off that chain) goes into byte j of the frame's word as
// 8 * the state, so that the backtrace's step is `x = word >> x & 56`.  Where eight doubles fill a register
// (AVX-512), or with clang (which keeps a wider vector in registers): g++'s ptn_wide form of the vector ran this
// loop 3x (AVX2) to 14x (SSE2) slower than the general path at T=500 K=5, which those builds keep.
#if defined(__AVX512F__) || defined(__clang__)
#define HMM_VIT_SMALL8 1
#else
#define HMM_VIT_SMALL8 0
#endif
#if HMM_VIT_SMALL8

// max(a, b) lane-wise as a > b ? a : b, in one instruction where there is one.
static inline hmm_v8d hmm_vmax8(hmm_v8d a, hmm_v8d b) {
#ifdef __AVX512F__
  return (hmm_v8d)_mm512_max_pd((__m512d)a, (__m512d)b);
#else
  return ptn_select(a > b, a, b);
#endif
}

// x[0, K) in the first K lanes, `fill` in the others.
template <int K>
static inline hmm_v8d hmm_lanes8(const Float* x, double fill) {
  hmm_v8d v = hmm_bc8(fill);
  for (int k = 0; k < K; ++k) v[k] = (double)x[k];
  return v;
}

// The maximum of v[i0, i1) as a tree (equal values: the lowest state's).
template <int I0, int I1>
static inline hmm_v8d hmm_vit_tree8(const hmm_v8d* v) {
  if (I1 - I0 == 1) return v[I0];
  constexpr int mid = I0 + (I1 - I0 + 1) / 2;
  return hmm_vmax8(hmm_vit_tree8<mid, I1>(v), hmm_vit_tree8<I0, mid>(v));
}

template <int K>
static void hmm_viterbi_small8(const HmmInferParams& p, int64_t b, uint64_t* bp, int32_t* path, Float* score) {
  typedef ptn_vec<uint8_t, 8> hmm_v8b;
  const int64_t B = p.B, len = p.seq_len[b];
  const Float* const le = p.le;  // a local copy: the stores to bp do not make the loop read it again
  hmm_v8d rows[K];
  for (int i = 0; i < K; ++i) rows[i] = hmm_lanes8<K>(p.lA + i * K, -INFINITY);
  hmm_v8d d = hmm_lanes8<K>(p.lpi, -INFINITY) + hmm_lanes8<K>(le + b * K, -INFINITY);
  for (int64_t t = 1; t < len; ++t) {
    hmm_v8d v[K];
    for (int i = 0; i < K; ++i) v[i] = hmm_bc8(d[i]) + rows[i];
    hmm_v8d best = v[0];
    hmm_v8l arg = {};
    for (int i = 1; i < K; ++i) {
      const hmm_v8l gt = v[i] > best;
      best = ptn_select(gt, v[i], best);
      arg = ptn_select(gt, hmm_v8l{} + 8 * i, arg);
    }
    const hmm_v8b bytes = ptn_convert<hmm_v8b>(arg);
    memcpy(bp + t, &bytes, 8);
    d = hmm_vit_tree8<0, K>(v) + hmm_lanes8<K>(le + (t * B + b) * K, -INFINITY);
  }
  hmm_viterbi_small_end<3>(p, b, K, d, bp, path, score);
}
#endif  // HMM_VIT_SMALL8

// Whether x[0, n) holds neither NaN nor +inf (one branch-free pass).
static inline bool hmm_below_inf(const Float* x, int64_t n) {
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= !(x[i] < (Float)INFINITY);
  return bad == 0;
}

// hmm_viterbi_fw (n_inputs = 5) or hmm_viterbi_defaults_fw (3: log_final 0, every frame valid) for one sequence of at
// most 8 states (4 without HMM_VIT_SMALL8; B = 1): hmm_model_setup's shape and mask checks (its errors), the length
// without a pass over a default mask, and the backpointers in the library's memory.  Returns false, having written nothing, where the
// general path must run: other sizes, a NaN or +inf in the parameters or on a valid frame (which that path reports
// or turns into a NaN score).
static bool hmm_viterbi_small_fw(int n_inputs, Ndarray** inputs, Ndarray*** outputs) {
  const int64_t T = Ndarray_DIMS(inputs[0])[0], K = Ndarray_DIMS(inputs[0])[2];
  if (Ndarray_DIMS(inputs[0])[1] != 1 || K > (HMM_VIT_SMALL8 ? 8 : 4) || T > INT32_MAX) return false;
  const FsaTerms terms = hmm_model_terms("hmm_viterbi", T, 1, K);
  hmm_check_shape(terms, inputs[1], "log_transitions", K, K, "(K, K)");
  hmm_check_shape(terms, inputs[2], "log_initial", K, 0, "(K,)");
  static const Float zeros[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // log_final's default
  HmmInferParams p = {};
  p.T = T;
  p.B = 1;
  p.K = K;
  p.Kp = 4;
  p.le = Ndarray_DEV_DATA(inputs[0]);
  p.lA = Ndarray_DEV_DATA(inputs[1]);
  p.lpi = Ndarray_DEV_DATA(inputs[2]);
  p.lf = zeros;
  int32_t len = (int32_t)T;
  if (n_inputs == 5) {
    hmm_check_shape(terms, inputs[3], "log_final", K, 0, "(K,)");
    hmm_check_shape(terms, inputs[4], "mask", T, 1, "(T, B)");
    p.lf = Ndarray_DEV_DATA(inputs[3]);
    FsaCheck check;
    memset(&check, 0, sizeof(check));
    len = hmm_one_mask_length(T, Ndarray_DEV_DATA(inputs[4]), &check);
    fsa_raise_check(&check, terms);
  }
  p.seq_len = &len;
  int32_t* path = Ndarray_DEV_DATA_int32(*outputs[0]);
  Float* score = Ndarray_DEV_DATA(*outputs[1]);
  if (len == 0 || K == 0) {
    if (len > 0) return false;  // K = 0: no path (the general path's -inf)
    for (int64_t t = 0; t < T; ++t) path[t] = -1;
    score[0] = (Float)0.0;
    return true;
  }
  if (!hmm_below_inf(p.lA, K * K) || !hmm_below_inf(p.lpi, K) || !hmm_below_inf(p.lf, K) ||
      !hmm_below_inf(p.le, len * K))
    return false;
  ptn::Scratch scratch;
  double* bp = hmm_kept_doubles<0>(scratch, len + 1);  // len words of 16 bits (K <= 4) or 64 (K > 4)
  switch (K) {
    case 1: hmm_viterbi_small<1>(p, 0, (uint16_t*)bp, path, score); break;
    case 2: hmm_viterbi_small<2>(p, 0, (uint16_t*)bp, path, score); break;
    case 3: hmm_viterbi_small<3>(p, 0, (uint16_t*)bp, path, score); break;
    case 4: hmm_viterbi_small<4>(p, 0, (uint16_t*)bp, path, score); break;
#if HMM_VIT_SMALL8
    case 5: hmm_viterbi_small8<5>(p, 0, (uint64_t*)bp, path, score); break;
    case 6: hmm_viterbi_small8<6>(p, 0, (uint64_t*)bp, path, score); break;
    case 7: hmm_viterbi_small8<7>(p, 0, (uint64_t*)bp, path, score); break;
    default: hmm_viterbi_small8<8>(p, 0, (uint64_t*)bp, path, score); break;
#endif
  }
  return true;
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
    uint16_t* words = (uint16_t*)bp + b * p.T;                                   // (bp holds T B K int32)
    hmm_with_k(p.K, [&](auto k) { hmm_viterbi_small<decltype(k)::value>(p, b, words, path, score); });
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
  if (hmm_viterbi_small_fw(n_inputs, inputs, outputs) || hmm_viterbi_lanes_fw(inputs, outputs)) return;
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
#if !CUDA
  if (hmm_viterbi_small_fw(n_inputs, inputs, outputs)) return;
#endif
  ptn::Scratch scratch;
  HmmWithDefaults five(scratch, inputs);
  hmm_viterbi_fw(5, five.all, n_outputs, outputs);
}
