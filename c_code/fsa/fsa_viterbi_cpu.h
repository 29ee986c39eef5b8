// The CPU schedule of vit_run (fsa_viterbi.h): the batch is split over threads (fsa_for_each_sequence: the LSTM's
// pool, $PTNATIVE_NUM_THREADS), a thread taking one whole sequence at a time, on its own edges (in the order of the
// edge list) and states renumbered locally, so the results do not depend on the thread count.  Frame t's row of D
// scores is read once: scanned for NaN (and, for a loss, +inf), turned into the log-softmax for logits, and, for a
// loss, written into grad as the softmax (exp(lp) by fsa_exp, or 0); only the scores of the U classes the
// sequence's edges emit are kept for the recursion.  The backpointers take (T_b + 1) S_b int32 per thread.
#ifndef PTNATIVE_FSA_FSA_VITERBI_CPU_H
#define PTNATIVE_FSA_FSA_VITERBI_CPU_H

#include "../dialect/kernel.h"

#include "fsa_viterbi.h"

#if !CUDA
struct VitSeq {
  int64_t len, S, E, U;
  int32_t start, end;
  std::vector<int32_t> from, to, slot, emis, local, cls, slot_of;
  std::vector<Float> w, val, lp;
  std::vector<int32_t> idx;
  std::vector<double> lse;
};

// Sequence b's edges (its group of g in the edge list's order) with states and classes numbered locally.
static void vit_seq_setup(const VitProblem& p, const std::vector<int64_t>& start, const std::vector<int32_t>& ids,
                          int64_t b, VitSeq& q) {
  if ((int64_t)q.local.size() < p.S) q.local.assign(p.S, -1);
  if ((int64_t)q.slot_of.size() < p.D) q.slot_of.assign(p.D, -1);
  std::vector<int32_t> states;
  auto local = [&](int32_t s) {
    if (q.local[s] < 0) {
      q.local[s] = (int32_t)states.size();
      states.push_back(s);
    }
    return q.local[s];
  };
  q.len = p.seq_len[b];
  q.E = start[b + 1] - start[b];
  q.start = local(p.start[b]);
  q.end = local(p.end[b]);
  q.from.resize(q.E);
  q.to.resize(q.E);
  q.slot.resize(q.E);
  q.emis.resize(q.E);
  q.w.resize(q.E);
  q.cls.clear();
  for (int64_t k = 0; k < q.E; ++k) {
    int32_t e = ids[start[b] + k];
    q.from[k] = local(p.from[e]);
    q.to[k] = local(p.to[e]);
    int32_t d = p.emis[e];
    if (q.slot_of[d] < 0) {
      q.slot_of[d] = (int32_t)q.cls.size();
      q.cls.push_back(d);
    }
    q.slot[k] = q.slot_of[d];
    q.emis[k] = d;
    q.w[k] = p.w[e];
  }
  for (int32_t s : states) q.local[s] = -1;  // clean for the next sequence
  for (int32_t d : q.cls) q.slot_of[d] = -1;
  q.S = (int64_t)states.size();
  q.U = (int64_t)q.cls.size();
  q.val.resize(2 * q.S);
  q.idx.resize((q.len + 1) * q.S);
  q.lp.resize(q.U);
  q.lse.resize(q.len);
}

// Frame t's row of sequence b: marks a NaN in nan, records a +inf score of a loss in fail (returns false), keeps the
// used classes' scores lp in q.lp and, for a loss, writes the softmax part of the gradient into grad's row.
static bool vit_seq_row(const VitProblem& p, int64_t t, int64_t b, VitSeq& q, FsaCheck* fail) {
  const int64_t D = p.D;
  const Float* row = p.x + (t * p.B + b) * D;
  double m = -INFINITY;
  bool has_nan = false;
  for (int64_t d = 0; d < D; ++d) {
    double v = (double)row[d];
    m = v > m ? v : m;
    has_nan |= v != v;
  }
  if (has_nan) p.nan[b] = 1;
  if (p.mode != VIT_SCAN && m == INFINITY && !has_nan) {
    int64_t k = 0;
    while (k + 1 < D && !((double)row[k] == INFINITY)) ++k;
    fsa_fail(fail, FSA_CHECK_SCORE_INFINITE, t, b, k, (double)row[k]);
    return false;
  }
  if (p.mode != VIT_LOGITS) {
    for (int64_t u = 0; u < q.U; ++u) q.lp[u] = row[q.cls[u]];
    if (p.mode == VIT_LOGPROBS) std::fill(p.grad + (t * p.B + b) * D, p.grad + (t * p.B + b + 1) * D, Float(0));
    return true;
  }
  // exp of arguments <= 0 (fsa_exp: vectorised), four partial sums
  double s4[4] = {0.0, 0.0, 0.0, 0.0};
  if (m > -INFINITY) {
    int64_t d = 0;
    for (; d + 4 <= D; d += 4)
      for (int j = 0; j < 4; ++j) s4[j] += fsa_exp((double)row[d + j] - m);
    for (; d < D; ++d) s4[0] += fsa_exp((double)row[d] - m);
  }
  const double lse = m + log((s4[0] + s4[1]) + (s4[2] + s4[3]));
  q.lse[t] = lse;
  Float* g = p.grad + (t * p.B + b) * D;
  for (int64_t d = 0; d < D; ++d) {
    Float lp = m > -INFINITY ? (Float)((double)row[d] - lse) : -(Float)INFINITY;
    g[d] = (Float)fsa_exp((double)lp);
  }
  for (int64_t u = 0; u < q.U; ++u)
    q.lp[u] = m > -INFINITY ? (Float)((double)row[q.cls[u]] - lse) : -(Float)INFINITY;
  return true;
}

// The Viterbi recursion and backtrace of sequence b (and its loss); false after a failed check.
static bool vit_seq_run(const VitProblem& p, int64_t b, VitSeq& q, FsaCheck* fail) {
  const int64_t S = q.S, len = q.len, B = p.B;
  Float* v_t = q.val.data();
  Float* v_next = v_t + S;
  std::fill(v_t, v_t + S, -(Float)INFINITY);
  v_t[q.start] = Float(0);
  for (int64_t t = 0; t < len; ++t) {
    if (!vit_seq_row(p, t, b, q, fail)) return false;
    int32_t* idx = q.idx.data() + (t + 1) * S;
    std::fill(v_next, v_next + S, -(Float)INFINITY);
    std::fill(idx, idx + S, (int32_t)0x7fffffff);
    for (int64_t k = 0; k < q.E; ++k) {
      Float pv = v_t[q.from[k]];
      if (!(pv > -(Float)INFINITY)) continue;
      Float v = pv + q.w[k] + q.lp[q.slot[k]];
      if (v > v_next[q.to[k]]) {  // NaN never is; ties keep the lowest edge
        v_next[q.to[k]] = v;
        idx[q.to[k]] = (int32_t)k;
      }
    }
    std::swap(v_t, v_next);
  }
  const Float sc = p.nan[b] ? (Float)NAN_F : v_t[q.end];
  p.score[b] = sc;
  int32_t cur = q.end;
  for (int64_t t = p.T - 1; t >= 0; --t) {
    int32_t label = 0;
    if (t < len && sc > -(Float)INFINITY) {
      int32_t k = q.idx[(t + 1) * S + cur];
      if (k >= 0 && k < q.E) {
        label = q.emis[k];
        cur = q.from[k];
      }
    }
    p.align[t * B + b] = label;
  }
  if (p.mode == VIT_SCAN) return true;
  double lp_sum = 0.0;
  for (int64_t t = 0; t < len; ++t) {
    const Float x = p.x[(t * B + b) * p.D + p.align[t * B + b]];
    lp_sum += p.mode == VIT_LOGITS ? (double)(Float)((double)x - q.lse[t]) : (double)x;
  }
  // the loss, and the gradient's one-hot part
  for (int64_t t = len; t < p.T; ++t) std::fill(p.grad + (t * B + b) * p.D, p.grad + (t * B + b + 1) * p.D, Float(0));
  const bool has_path = !p.nan[b] && sc > -(Float)INFINITY;
  p.loss[b] = p.nan[b] ? (Float)NAN_F : has_path ? (Float)(-lp_sum) : (Float)INFINITY;
  for (int64_t t = 0; t < len; ++t) {
    Float* g = p.grad + (t * B + b) * p.D;
    if (has_path)
      g[p.align[t * B + b]] -= 1;
    else
      std::fill(g, g + p.D, p.nan[b] ? (Float)NAN_F : Float(0));
  }
  return true;
}

static void vit_run(ptn::Scratch&, const VitProblem& p) {
  const int64_t B = p.B;
  if (B == 0) return;
  std::vector<int64_t> start;
  std::vector<int32_t> ids;
  fsa_group(p.E, B, [&](int64_t e) { return (int64_t)p.seq[e]; }, start, ids);
  std::vector<FsaCheck> fails(B);
  memset(fails.data(), 0, B * sizeof(FsaCheck));
  double cost = 0.0;
  for (int64_t b = 0; b < B; ++b) cost += (double)p.seq_len[b] * (double)(start[b + 1] - start[b] + p.D);
  fsa_for_each_sequence<VitSeq>(B, cost, [&](int64_t b, VitSeq& q) {
    vit_seq_setup(p, start, ids, b, q);
    vit_seq_run(p, b, q, &fails[b]);
  });
  const FsaCheck* first = fsa_first_by_frame(fails);
  if (first) fsa_raise_check(first, p.terms);
}
#endif  // !CUDA

#endif  // PTNATIVE_FSA_FSA_VITERBI_CPU_H
