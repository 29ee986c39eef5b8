// hmm_viterbi on the CPU with the sequences in vector lanes (as hmm_lanes.h runs the likelihood): the batch in
// groups of HMM_W = 8 sequences (hmm_lanes_base.h), one hmm_v8d per state holding that state's delta for the
// group's eight sequences.  A step is K^2 lane-wise adds of a broadcast log A(i, j) and running maxima over i in
// order (delta_t(j) = max_i (delta_{t-1}(i) + log A(i, j)) + log e_t(j)); nothing else is on the chain.  The deltas
// of every frame are kept ((T, K) vectors per group), and the backtrace recomputes the one backpointer it needs per
// frame and sequence, argmax_i delta_{t-1}(i) + log A(i, z_t) with ties to the lowest i, from the same sums: the
// path and score are bit-identical to hmm_viterbi.cu's sequence-at-a-time recursion (same double adds, same strict
// comparisons), whatever the group, the lane or the number of threads.
//
// Frames past a sequence's length, and lanes without a sequence, compute on zeros and are never read.  A NaN or
// +inf log-emission on a valid frame (or a NaN parameter) makes hmm_viterbi_lanes_fw decline: the general path
// then reports it (a ValueError for +inf, NaN for the sequence).  Memory: (T + 16) K 8 doubles per thread
// (the general path runs where that is above 64 MB and twice its own backpointers).
#ifndef PTNATIVE_HMM_HMM_VITERBI_LANES_H
#define PTNATIVE_HMM_HMM_VITERBI_LANES_H

#include "../dialect/kernel.h"

#include "hmm_lanes_base.h"

#if !CUDA
#define HMM_VIT_CHUNK 16  // frames whose emissions are put into lanes at a time

// Whether hmm_viterbi runs B sequences of K states in lanes: a group costs the same whatever number of its lanes
// hold a sequence, so the batch must fill its groups well enough: the batch rounded up to groups of 8 at most r(K) B,
// with r(K) = 8 x (a sequence's time in the sequence-at-a-time path) / (a group's time), measured in the same
// process at load ~5 (T = 200-1000): 2.9 at K = 3, 3.1 at K = 8, 2.8-3.7 at K = 16, 4.3 at K = 32, 5.6 at K = 64,
// 6.5 at K = 100, 5.7 at K = 128.  One sequence never.
static inline bool hmm_viterbi_use_lanes(int64_t B, int64_t K) {
  const double r = K <= 16 ? 2.8 : K <= 32 ? 4.2 : 5.5;
  return B >= 2 && (double)((B + HMM_W - 1) / HMM_W * HMM_W) <= r * (double)B;
}

// x[l K] in lane l where bit l of `on` is set, else 0 (the entry k of the group's rows of a frame, x = rows + k).
static inline hmm_v8d hmm_vit_column(const double* x, int64_t K, unsigned char on) {
#ifdef __AVX512F__
  typedef long long hmm_v8q __attribute__((vector_size(64)));
  const hmm_v8q at = hmm_v8q{0, 1, 2, 3, 4, 5, 6, 7} * (long long)K;
  return (hmm_v8d)__builtin_ia32_gatherdiv8df(hmm_v8d{}, x, at, (char)on, 8);
#else
  hmm_v8d v = {};
  for (int l = 0; l < 8; ++l) v[l] = on >> l & 1 ? x[l * K] : 0.0;
  return v;
#endif
}
static inline hmm_v8d hmm_vit_column(const float* x, int64_t K, unsigned char on) {
#ifdef __AVX512F__
  typedef float hmm_v8f __attribute__((vector_size(32)));
  typedef long long hmm_v8q __attribute__((vector_size(64)));
  const hmm_v8q at = hmm_v8q{0, 1, 2, 3, 4, 5, 6, 7} * (long long)K;
  return __builtin_convertvector((hmm_v8f)__builtin_ia32_gatherdiv16sf(hmm_v8f{}, x, at, (char)on, 4), hmm_v8d);
#else
  hmm_v8d v = {};
  for (int l = 0; l < 8; ++l) v[l] = on >> l & 1 ? (double)x[l * K] : 0.0;
  return v;
#endif
}

// a > b ? a : b lane-wise (b where they are equal), one instruction with AVX-512.
static inline hmm_v8d hmm_vit_max(hmm_v8d a, hmm_v8d b) {
#if defined(__AVX512F__) && defined(__clang__)
  return (hmm_v8d)__builtin_ia32_maxpd512(a, b, 4);
#elif defined(__AVX512F__)
  return (hmm_v8d)__builtin_ia32_maxpd512_mask(a, b, a, (unsigned char)-1, 4);
#else
  return ptn_select(a > b, a, b);
#endif
}

// out[j] = max_i (D[i] + lA[i K + j]) + E[j] for j < J, lane-wise, the maximum running over i in order with a
// strict comparison (the value of the lowest argmax, as hmm_viterbi_step).
template <int J>
__attribute__((always_inline)) static inline void hmm_vit_tile(const hmm_v8d* __restrict__ D, int64_t K,
                                                               const double* __restrict__ lA,
                                                               const hmm_v8d* __restrict__ E,
                                                               hmm_v8d* __restrict__ out) {
  hmm_v8d best[J];
  for (int j = 0; j < J; ++j) best[j] = D[0] + lA[j];
  for (int64_t i = 1; i < K; ++i) {
    const hmm_v8d d = D[i];
    for (int j = 0; j < J; ++j) best[j] = hmm_vit_max(d + lA[i * K + j], best[j]);
  }
  for (int j = 0; j < J; ++j) out[j] = best[j] + E[j];
}

// One frame of a group: out (K vectors) from D (the previous frame's) and the emissions E.
static inline void hmm_vit_step(const hmm_v8d* __restrict__ D, int64_t K, const double* __restrict__ lA,
                                const hmm_v8d* __restrict__ E, hmm_v8d* __restrict__ out) {
  int64_t j = 0;
  for (; j + 8 <= K; j += 8) hmm_vit_tile<8>(D, K, lA + j, E + j, out + j);
  switch (K - j) {
    case 7: hmm_vit_tile<7>(D, K, lA + j, E + j, out + j); break;
    case 6: hmm_vit_tile<6>(D, K, lA + j, E + j, out + j); break;
    case 5: hmm_vit_tile<5>(D, K, lA + j, E + j, out + j); break;
    case 4: hmm_vit_tile<4>(D, K, lA + j, E + j, out + j); break;
    case 3: hmm_vit_tile<3>(D, K, lA + j, E + j, out + j); break;
    case 2: hmm_vit_tile<2>(D, K, lA + j, E + j, out + j); break;
    case 1: hmm_vit_tile<1>(D, K, lA + j, E + j, out + j); break;
    default: break;
  }
}

// The lowest argmax over i of x[i * stride] + col[i] (i < K), and its value into *best.
static inline int64_t hmm_vit_argmax(const double* __restrict__ x, int64_t stride, const double* __restrict__ col,
                                     int64_t K, double* best) {
  double m = x[0] + col[0];
  int64_t arg = 0;
  for (int64_t i = 1; i < K; ++i) {
    const double v = x[i * stride] + col[i];
    arg = v > m ? i : arg;
    m = v > m ? v : m;
  }
  *best = m;
  return arg;
}

// Lane-wise argmax_i prev[i] + log A(i, arg) (arg: a state per lane) with ties to the lowest i, for K <= KK <= 16:
// the column entries picked from the rows of lA16 (log A, rows of 16, padded) by a permutation, the maximum as a
// tree, then the lowest i that reaches it (the same i as hmm_vit_argmax: the sums are the same, none is NaN).
template <int KK>
__attribute__((always_inline)) static inline hmm_v8l hmm_vit_back(const hmm_v8d* __restrict__ prev, int64_t K,
                                                                  const double* __restrict__ lA16, hmm_v8l arg) {
  hmm_v8d v[KK];
  for (int i = 0; i < KK; ++i) {
    if (i >= K) {
      v[i] = hmm_v8d{} - INFINITY;
      continue;
    }
    hmm_v8d lo, hi;
    memcpy(&lo, lA16 + i * 16, sizeof(lo));
    memcpy(&hi, lA16 + i * 16 + 8, sizeof(hi));
    v[i] = prev[i] + (KK <= 8 ? ptn_shuffle(lo, arg) : ptn_shuffle2(lo, hi, arg));
  }
  hmm_v8d m[KK / 2];
  for (int i = 0; i < KK / 2; ++i) m[i] = hmm_vit_max(v[i], v[i + KK / 2]);
  for (int w = KK / 4; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) m[i] = hmm_vit_max(m[i], m[i + w]);
  hmm_v8l a = {};
  for (int i = KK - 1; i > 0; --i) a = ptn_select(v[i] == m[0], hmm_v8l{} + i, a);
  return ptn_select(v[0] == m[0], hmm_v8l{}, a);
}

// The sequences [b0, b0 + n) of group g: their paths and scores.  lA, lAT, lf: log A, its transpose and log f in
// double, lA16 (K <= 16) log A in rows of 16; D: T K vectors; E: HMM_VIT_CHUNK K vectors.  Returns false, with the
// outputs incomplete, if a valid frame has a NaN or +inf log-emission.
static bool hmm_viterbi_group(const HmmModel& p, const double* lA, const double* lAT, const double* lf,
                              const double* lA16, int64_t g, hmm_v8d* D, hmm_v8d* E, int32_t* path, Float* score) {
  const int64_t T = p.T, B = p.B, K = p.K, b0 = g * HMM_W, n = std::min<int64_t>(HMM_W, B - b0);
  int64_t len[HMM_W], t_end = 0;
  for (int64_t l = 0; l < HMM_W; ++l) {
    len[l] = l < n ? p.seq_len[b0 + l] : 0;
    t_end = std::max(t_end, len[l]);
  }
  const hmm_v8d inf = hmm_v8d{} + INFINITY;
  hmm_v8l ok = hmm_v8l{} == 0;  // every valid frame's log-emissions below +inf (and not NaN)
  for (int64_t t0 = 0; t0 < t_end; t0 += HMM_VIT_CHUNK) {
    // the emissions of a chunk of frames into lanes first (their scalar stores are then long done when the steps
    // load them as vectors)
    const int64_t t1 = std::min<int64_t>(t0 + HMM_VIT_CHUNK, t_end);
    for (int64_t t = t0; t < t1; ++t) {
      const Float* rows = p.le + (t * B + b0) * K;  // the group's rows of frame t, one after the other
      unsigned char on = 0;
      for (int64_t l = 0; l < HMM_W; ++l) on |= (unsigned char)(t < len[l]) << l;
      hmm_v8d* Et = E + (t - t0) * K;
      int64_t k0 = 0;
      if (on == 0xff)  // eight states of the eight rows at a time, transposed
        for (; k0 + 8 <= K; k0 += 8) {
          hmm_v8d r[8];
          for (int l = 0; l < 8; ++l) r[l] = hmm_load8(rows + l * K + k0);
          hmm_transpose8(r, Et + k0);
        }
      for (int64_t k = k0; k < K; ++k) Et[k] = hmm_vit_column(rows + k, K, on);
    }
    for (int64_t i = 0; i < (t1 - t0) * K; ++i) ok &= E[i] < inf;
    for (int64_t t = t0; t < t1; ++t) {
      hmm_v8d* Dt = D + t * K;
      const hmm_v8d* Et = E + (t - t0) * K;
      if (t == 0)
        for (int64_t k = 0; k < K; ++k) Dt[k] = (double)p.lpi[k] + Et[k];
      else
        hmm_vit_step(Dt - K, K, lA, Et, Dt);
    }
  }
  for (int64_t l = 0; l < HMM_W; ++l)
    if (!ok[l]) return false;
  hmm_v8l arg = {}, live = {};  // the path's state per lane; lanes with a path
  for (int64_t l = 0; l < n; ++l) {
    const int64_t b = b0 + l;
    if (len[l] == 0) {
      score[b] = (Float)0.0;
      continue;
    }
    double best;
    arg[l] = hmm_vit_argmax((const double*)(D + (len[l] - 1) * K) + l, HMM_W, lf, K, &best);
    live[l] = best > -INFINITY ? -1 : 0;
    score[b] = (Float)best;
  }
  for (int64_t t = T - 1; t >= 0; --t) {
    int32_t* row = path + t * B + b0;
    for (int64_t l = 0; l < n; ++l) row[l] = t < len[l] && live[l] ? (int32_t)arg[l] : -1;
    if (t == 0 || t >= t_end) continue;
    const hmm_v8l on = (t < hmm_v8l{len[0], len[1], len[2], len[3], len[4], len[5], len[6], len[7]}) & live;
    const hmm_v8d* prev = D + (t - 1) * K;
    if (K <= 16) {
      const hmm_v8l back = K <= 4 ? hmm_vit_back<4>(prev, K, lA16, arg)
                           : K <= 8 ? hmm_vit_back<8>(prev, K, lA16, arg) : hmm_vit_back<16>(prev, K, lA16, arg);
      arg = ptn_select(on, back, arg);
    } else {
      for (int64_t l = 0; l < n; ++l) {
        double v;
        if (on[l]) arg[l] = hmm_vit_argmax((const double*)prev + l, HMM_W, lAT + arg[l] * K, K, &v);
      }
    }
  }
  return true;
}

// hmm_viterbi_fw with the sequences in lanes (where hmm_viterbi_use_lanes); returns false, having written
// outputs that the general path overwrites, where that path must run: other sizes, a NaN parameter, a NaN or +inf
// log-emission.
static bool hmm_viterbi_lanes_fw(Ndarray** inputs, Ndarray*** outputs) {
  const int64_t T = Ndarray_DIMS(inputs[0])[0], B = Ndarray_DIMS(inputs[0])[1], K = Ndarray_DIMS(inputs[0])[2];
  if (T == 0 || K == 0 || !hmm_viterbi_use_lanes(B, K)) return false;
  // the deltas take 64 bytes per frame and state (per thread); the general path's backpointers 4 B per frame, state
  // and sequence: beyond 64 MB, no more than twice those
  const int64_t groups = (B + HMM_W - 1) / HMM_W;
  const int parts = (int)std::min<int64_t>(hmm_cpu_parts(T, B, K), groups);
  const double lane_bytes = 64.0 * (double)(T + HMM_VIT_CHUNK) * K * parts;
  if (lane_bytes > (double)(1 << 26) && lane_bytes > 8.0 * T * B * K) return false;
  HmmScratch scratch;
  const HmmModel p = hmm_model_setup(scratch, inputs, "hmm_viterbi", false);
  if (p.consts[3] != 0.0) return false;
  double* lA = scratch.get<double>(2 * K * K + K + 16 * 16);
  double* lAT = lA + K * K;
  double* lf = lAT + K * K;
  double* lA16 = lf + K;
  for (int64_t i = 0; i < 16 * 16; ++i) lA16[i] = i / 16 < K && i % 16 < K ? (double)p.lA[i / 16 * K + i % 16] : 0.0;
  for (int64_t k = 0; k < K; ++k) lf[k] = (double)p.lf[k];
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < K; ++j) lA[i * K + j] = lAT[j * K + i] = (double)p.lA[i * K + j];
  const int64_t per_part = (T + HMM_VIT_CHUNK) * K * HMM_W;  // D and E
  double* work = hmm_aligned<double>(scratch, parts * per_part);
  int32_t* path = Ndarray_DEV_DATA_int32(*outputs[0]);
  Float* score = Ndarray_DEV_DATA(*outputs[1]);
  char ok[64];
  int n_ok = std::min(parts, 64);
  ptn::parallel_parts(n_ok, [&](int q) {
    hmm_v8d* D = (hmm_v8d*)(work + q * per_part);
    ok[q] = 1;
    for (int64_t g = q * groups / n_ok; g < (q + 1) * groups / n_ok && ok[q]; ++g)
      ok[q] = hmm_viterbi_group(p, lA, lAT, lf, lA16, g, D, D + T * K, path, score);
  });
  for (int q = 0; q < n_ok; ++q)
    if (!ok[q]) return false;
  return true;
}
#endif  // !CUDA

#endif  // PTNATIVE_HMM_HMM_VITERBI_LANES_H
