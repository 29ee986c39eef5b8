// The fused CTC losses on CUDA in one pass per batch (ctc_loss.cu, ctc_loss_viterbi.cu): one block per sequence
// runs the whole recursion over its frames inside the kernel (the states of its extended label sequence across the
// threads, the frames in a loop), with the log-softmax and the gradient fused.  Two launches per call: the input
// check (ctc_check_inputs) and the pass; the CPU runs Baum-Welch / Viterbi over the CTC automaton (ctc_fsa.h), and
// both compute the same functions (the automaton's paths are the extended sequence's alignments).
//
// Sequence b with L labels y_0..y_{L-1} has the extended states s = 0..2L: 2k the blank before label k, 2k + 1 label
// k.  After frame t the path is in state s (it emitted label(s) at t); before frame 0 it is in state 0 with nothing
// emitted.  Predecessors of s at the next frame: s itself (blanks; labels only with label_loop, CTC), s - 1, and
// s - 2 for a label whose previous label differs (always without label_loop, RNA).  A path ends in 2L or 2L - 1.
//
// ctc_loss: log space in double: la_t(s) = log sum over predecessors p of exp(la_{t-1}(p)) + logp_t(label(s)),
// lb_t(s) the log-probability of frames t+1.. from s, gamma_t(s) = exp(la_t(s) + lb_t(s) - log p), and
// grad_t(d) = softmax_t(d) - sum over states s with label d of gamma_t(s) (-sum when logits_normalized).
// ctc_loss_viterbi: the max-plus recursion in Float as fsa_viterbi.h does it (lp = log_softmax rounded to Float),
// ties to the predecessor with the lowest automaton edge index (s - 2, then s - 1, then s; at the end 2L - 1, then
// 2L), the loss the sum of lp along the best alignment in frame order.
#ifndef PTNATIVE_CTC_CTC_LOSS_CUDA_H
#define PTNATIVE_CTC_CTC_LOSS_CUDA_H

#include "../dialect/kernel.h"

#include "ctc_fsa.h"
#include "ctc_loss.h"

#if CUDA
#define CTC_MAX_THREADS 256

// A checked call (CtcLoss, ctc_loss.h: sizes, inputs, outputs) and the pass's scratch arrays.
struct CtcPass : CtcLoss {
  int64_t n_ext;                 // 2N + 1: the extended states of the longest target
  double* lse;                   // (B, T): log sum exp of each valid row (LOGITS)
  double* la;                    // ctc_loss: (B, T, S) forward log-values
  double* lb;                    // ctc_loss: (B, 2, S) backward log-values of two frames
  double* G;                     // ctc_loss: (B, D) posterior mass of the current frame per class
  Float* val;                    // viterbi: (B, T, S) best scores
  uint8_t* arg;                  // viterbi: (B, T, S) best predecessor: s - arg
  int32_t* align;                // viterbi: (B, T) best alignment
  FsaCheck* check;
};

DEV_FUNC inline int32_t ctc_state_label(const int32_t* y, int64_t s, int32_t blank) {
  return (s & 1) ? y[s >> 1] : blank;
}
DEV_FUNC inline bool ctc_has_self(int64_t s, bool label_loop) { return !(s & 1) || label_loop; }
DEV_FUNC inline bool ctc_has_skip(const int32_t* y, int64_t s, bool label_loop) {
  return (s & 1) && s >= 3 && (!label_loop || y[s >> 1] != y[(s >> 1) - 1]);
}
// log(exp(a) + exp(b)), with -inf as the zero.
DEV_FUNC inline double ctc_log_add(double a, double b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  double m = a > b ? a : b, d = a > b ? b - a : a - b;
  return m + log1p(exp(d));
}

// Row statistics of sequence b's valid frames: NaN rows make it a NaN sequence (the return value, the same in every
// thread); a +inf entry is recorded in check (ctc_loss: in every row; viterbi: in rows without NaN, as the automaton
// passes do); lse[t] = log sum exp of the row (-inf for a row of -inf; only without `normalized`).
DEV_FUNC inline bool ctc_rows(const CtcPass& c, int64_t b, int64_t Tb, bool inf_in_nan_rows, double* sh) {
  const int64_t tid = threadIdx.x, nt = blockDim.x, D = c.D;
  bool nan_seq = false;
  for (int64_t t = 0; t < Tb; ++t) {
    const Float* row = c.logits + (t * c.B + b) * D;
    double m = -INFINITY, n_nan = 0.0;
    for (int64_t d = tid; d < D; d += nt) {
      double v = (double)row[d];
      if (v > m) m = v;
      if (v != v) n_nan += 1.0;
    }
    m = block_max(sh, m);
    n_nan = block_sum(sh, n_nan);
    if (n_nan > 0.0) nan_seq = true;
    if (m == INFINITY && (inf_in_nan_rows || n_nan == 0.0)) {
      if (tid == 0) {
        int64_t d = 0;
        while (d + 1 < D && !((double)row[d] == INFINITY)) ++d;
        fsa_fail(c.check, FSA_CHECK_SCORE_INFINITE, t, b, d, (double)row[d]);
      }
    }
    if (c.normalized) continue;
    double sum = 0.0;
    if (m > -INFINITY && m < INFINITY)
      for (int64_t d = tid; d < D; d += nt) sum += exp((double)row[d] - m);
    sum = block_sum(sh, sum);
    if (tid == 0) c.lse[b * c.T + t] = m > -INFINITY && m < INFINITY ? m + log(sum) : -INFINITY;
  }
  __syncthreads();  // lse is read by every thread from here on
  return nan_seq;
}

// log p_t(d) of sequence b (the logits' log-softmax, or the logits themselves when normalized).
DEV_FUNC inline double ctc_logp(const CtcPass& c, int64_t t, int64_t b, int32_t d) {
  double x = (double)c.logits[(t * c.B + b) * c.D + d];
  if (c.normalized || x == -INFINITY) return x;
  double l = c.lse[b * c.T + t];
  return l == -INFINITY ? -INFINITY : x - l;
}

// Writes grad rows [t0, t1) of sequence b as `value` (0 for padded frames, NaN for a NaN sequence's valid frames).
DEV_FUNC inline void ctc_fill_rows(const CtcPass& c, int64_t b, int64_t t0, int64_t t1, Float value) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t d = threadIdx.x; d < c.D; d += blockDim.x) c.grad[(t * c.B + b) * c.D + d] = value;
}

DEF_KERNEL void ctc_loss_pass(CtcPass c) {
  DEF_SHARED(double, sh);
  const int64_t tid = threadIdx.x, nt = blockDim.x, S = c.n_ext, D = c.D;
  for (int64_t b = blockIdx.x; b < c.B; b += gridDim.x) {
    const int64_t Tb = c.lens[b], L = c.tlens[b], Sb = 2 * L + 1;
    const int32_t* y = c.targets + b * c.N;
    double* la = c.la + b * c.T * S;
    double* G = c.G + b * D;
    ctc_fill_rows(c, b, Tb, c.T, Float(0));
    if (ctc_rows(c, b, Tb, true, sh)) {
      ctc_fill_rows(c, b, 0, Tb, (Float)NAN_F);
      if (tid == 0) c.loss[b] = (Float)NAN_F;
      __syncthreads();
      continue;
    }
    // forward
    for (int64_t t = 0; t < Tb; ++t) {
      const double* prev = la + (t > 0 ? t - 1 : 0) * S;
      for (int64_t s = tid; s < Sb; s += nt) {
        double v;
        if (t == 0) {
          v = s <= 1 ? 0.0 : -INFINITY;
        } else {
          v = ctc_has_self(s, c.label_loop) ? prev[s] : -INFINITY;
          if (s >= 1) v = ctc_log_add(v, prev[s - 1]);
          if (ctc_has_skip(y, s, c.label_loop)) v = ctc_log_add(v, prev[s - 2]);
        }
        la[t * S + s] = v == -INFINITY ? -INFINITY : v + ctc_logp(c, t, b, ctc_state_label(y, s, c.blank));
      }
      __syncthreads();
    }
    double nll;
    if (Tb == 0) {
      nll = L == 0 ? 0.0 : INFINITY;
    } else {
      const double* last = la + (Tb - 1) * S;
      double lp = ctc_log_add(last[2 * L], L > 0 ? last[2 * L - 1] : -INFINITY);
      nll = lp == -INFINITY ? INFINITY : -lp;
    }
    if (tid == 0) c.loss[b] = (Float)nll;
    const bool has_path = nll < INFINITY;
    // backward, with each frame's gradient
    for (int64_t d = tid; d < D; d += nt) G[d] = 0.0;
    __syncthreads();
    for (int64_t t = Tb - 1; t >= 0; --t) {
      double* cur = c.lb + (b * 2 + (t & 1)) * S;
      const double* nxt = c.lb + (b * 2 + ((t + 1) & 1)) * S;
      if (has_path) {
        for (int64_t s = tid; s < Sb; s += nt) {
          double v;
          if (t == Tb - 1) {
            v = s == 2 * L || s == 2 * L - 1 ? 0.0 : -INFINITY;
          } else {
            v = -INFINITY;
            if (ctc_has_self(s, c.label_loop))
              v = ctc_log_add(v, nxt[s] + ctc_logp(c, t + 1, b, ctc_state_label(y, s, c.blank)));
            if (s + 1 < Sb) v = ctc_log_add(v, nxt[s + 1] + ctc_logp(c, t + 1, b, ctc_state_label(y, s + 1, c.blank)));
            if (s + 2 < Sb && ctc_has_skip(y, s + 2, c.label_loop))
              v = ctc_log_add(v, nxt[s + 2] + ctc_logp(c, t + 1, b, ctc_state_label(y, s + 2, c.blank)));
          }
          cur[s] = v;
          double e = la[t * S + s] + v + nll;
          if (e > -INFINITY) elem_atomic_add(G + ctc_state_label(y, s, c.blank), exp(e));
        }
      }
      __syncthreads();
      const Float* row = c.logits + (t * c.B + b) * D;
      const double l = c.normalized ? 0.0 : c.lse[b * c.T + t];
      for (int64_t d = tid; d < D; d += nt) {
        double x = (double)row[d];
        double soft = !c.normalized && l > -INFINITY && x > -INFINITY ? exp(x - l) : 0.0;
        c.grad[(t * c.B + b) * D + d] = (Float)(soft - G[d]);
        G[d] = 0.0;
      }
      __syncthreads();
    }
  }
}

DEF_KERNEL void ctc_viterbi_pass(CtcPass c) {
  DEF_SHARED(double, sh);
  const int64_t tid = threadIdx.x, nt = blockDim.x, S = c.n_ext, D = c.D;
  const Float NEG = -(Float)INFINITY;
  for (int64_t b = blockIdx.x; b < c.B; b += gridDim.x) {
    const int64_t Tb = c.lens[b], L = c.tlens[b], Sb = 2 * L + 1;
    const int32_t* y = c.targets + b * c.N;
    Float* val = c.val + b * c.T * S;
    uint8_t* arg = c.arg + b * c.T * S;
    int32_t* align = c.align + b * c.T;
    ctc_fill_rows(c, b, Tb, c.T, Float(0));
    if (ctc_rows(c, b, Tb, false, sh)) {
      ctc_fill_rows(c, b, 0, Tb, (Float)NAN_F);
      if (tid == 0) c.loss[b] = (Float)NAN_F;
      __syncthreads();
      continue;
    }
    // lp as fsa_viterbi.h's rows: the log-softmax rounded to Float (or the log-probabilities as given)
    auto lp = [&](int64_t t, int32_t d) -> Float {
      Float x = c.logits[(t * c.B + b) * D + d];
      if (c.normalized) return x;
      double l = c.lse[b * c.T + t];
      return l > -INFINITY ? (Float)((double)x - l) : NEG;
    };
    for (int64_t t = 0; t < Tb; ++t) {
      const Float* prev = val + (t > 0 ? t - 1 : 0) * S;
      for (int64_t s = tid; s < Sb; s += nt) {
        const Float e = lp(t, ctc_state_label(y, s, c.blank));
        Float best = NEG;
        int a = 0;
        auto consider = [&](Float pv, int k) {
          if (!(pv > NEG)) return;
          Float v = pv + e;
          if (v > best) {
            best = v;
            a = k;
          }
        };
        if (t == 0) {
          if (s <= 1) consider(Float(0), 0);
        } else {
          if (ctc_has_skip(y, s, c.label_loop)) consider(prev[s - 2], 2);
          if (s >= 1) consider(prev[s - 1], 1);
          if (ctc_has_self(s, c.label_loop)) consider(prev[s], 0);
        }
        val[t * S + s] = best;
        arg[t * S + s] = (uint8_t)a;
      }
      __syncthreads();
    }
    bool has_path = Tb == 0 && L == 0;
    if (tid == 0) {
      if (Tb > 0) {
        const Float* last = val + (Tb - 1) * S;
        int64_t q = 2 * L;
        if (L > 0 && last[2 * L - 1] >= last[2 * L]) q = 2 * L - 1;
        has_path = last[q] > NEG;
        if (has_path)
          for (int64_t t = Tb - 1; t >= 0; --t) {
            align[t] = ctc_state_label(y, q, c.blank);
            q -= arg[t * S + q];
          }
      }
      double sum = 0.0;
      if (has_path)
        for (int64_t t = 0; t < Tb; ++t) sum += (double)lp(t, align[t]);
      c.loss[b] = has_path ? (Float)(-sum) : (Float)INFINITY;
      sh[0] = has_path ? 1.0 : 0.0;
    }
    __syncthreads();
    has_path = sh[0] != 0.0;
    __syncthreads();
    for (int64_t i = tid; i < Tb * D; i += nt) {
      const int64_t t = i / D, d = i % D;
      Float g = Float(0);
      if (has_path) g = (!c.normalized ? (Float)exp((double)lp(t, (int32_t)d)) : Float(0)) - (d == align[t] ? 1 : 0);
      c.grad[(t * c.B + b) * D + d] = g;
    }
    __syncthreads();
  }
}

// The pass over a checked CtcLoss (ctc_loss.h), its scratch arrays still to be set.
static CtcPass ctc_pass_of(const CtcLoss& l) {
  CtcPass c;
  memset(&c, 0, sizeof(c));
  static_cast<CtcLoss&>(c) = l;
  c.n_ext = 2 * l.N + 1;
  return c;
}

// The scratch of a pass (one block of device memory) and its launch: checks the lengths and labels first.
static void ctc_run_pass(bool viterbi, CtcPass c, const FsaTerms& terms) {
  ptn::Scratch scratch;
  const int64_t T = c.T, B = c.B, S = c.n_ext;
  size_t bytes = 0;
  auto take = [&](size_t n) {
    size_t at = bytes;
    bytes += (n + 15) / 16 * 16;
    return at;
  };
  const size_t at_check = take(sizeof(FsaCheck)), at_lse = take(sizeof(double) * T * B);
  const size_t at_la = viterbi ? take(sizeof(Float) * T * B * S) : take(sizeof(double) * T * B * S);
  const size_t at_lb = viterbi ? take((size_t)T * B * S) : take(sizeof(double) * 2 * B * S);
  const size_t at_g = viterbi ? take(sizeof(int32_t) * T * B) : take(sizeof(double) * B * c.D);
  char* base = scratch.get<char>((int64_t)bytes);
  c.check = (FsaCheck*)(base + at_check);
  c.lse = (double*)(base + at_lse);
  if (viterbi) {
    c.val = (Float*)(base + at_la);
    c.arg = (uint8_t*)(base + at_lb);
    c.align = (int32_t*)(base + at_g);
  } else {
    c.la = (double*)(base + at_la);
    c.lb = (double*)(base + at_lb);
    c.G = (double*)(base + at_g);
  }
  Ndarray_memset(c.check, 0, sizeof(FsaCheck));
  if (B == 0) return;
  start_dev_kernel(ctc_check_inputs, (B, T, c.N, c.D, c.lens, c.tlens, c.targets, c.check));
  fsa_raise_check(c.check, terms);
  int64_t want = std::max<int64_t>(S, c.D), threads = 32;
  while (threads < want && threads < CTC_MAX_THREADS) threads *= 2;
  const unsigned grid = (unsigned)std::min<int64_t>(B, 65535);
  if (viterbi)
    start_dev_kernel2(ctc_viterbi_pass, grid, (unsigned)threads, threads * sizeof(double), (c));
  else
    start_dev_kernel2(ctc_loss_pass, grid, (unsigned)threads, threads * sizeof(double), (c));
  fsa_raise_check(c.check, terms);
}
#endif

#endif  // PTNATIVE_CTC_CTC_LOSS_CUDA_H
