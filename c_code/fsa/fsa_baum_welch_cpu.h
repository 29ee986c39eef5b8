// The CPU schedule of fbw_run's passes (fsa_baum_welch.h): the batch is split over threads (ptn::parallel_parts,
// threads of its own; $PTNATIVE_NUM_THREADS, else $OMP_NUM_THREADS, else all cores), a thread taking
// one whole sequence at a time.  A sequence runs on its own edges and states, renumbered locally: the scaled
// forward-backward and, if that finds no path (and the sequence has no NaN), the log-space one.  Its edges keep
// their order in the edge list, so each sum is taken in the same order whatever the threads: the results do not
// depend on the thread count, bit for bit.
//
// Emissions are fused with the passes: the forward pass reads frame t's row of D scores once, finds its minimum
// a_min (a = -log score), sums its factors exp(-(a - a_min)) and writes the outputs' starting values into out's
// row (FBW_LOGITS: the softmax; FBW_LOGPROBS: 0; FBW_NEGLOG: inf); only the U classes the sequence's edges emit
// (U <= D) are kept, as the frame's emission factors.  The backward pass recomputes those U factors and
// overwrites the outputs of those U classes; the others keep what the forward pass wrote (a posterior of 0).
//
// Shapes per sequence b: T_b frames, S_b states, E_b edges, U_b classes; scratch per thread: alpha (T_b + 1, S_b),
// the row (D), and O(T + S_b + E_b + U_b + D) more.
#ifndef PTNATIVE_FSA_FSA_BAUM_WELCH_CPU_H
#define PTNATIVE_FSA_FSA_BAUM_WELCH_CPU_H

#include "../dialect/kernel.h"

#include "fsa_baum_welch.h"

#if !CUDA
// The batch grouped by sequence, built once per call (counting sorts, so each group keeps the global order):
// sequence b's edges are edge_ids[edge_start[b] .. edge_start[b + 1]), likewise its states and its end entries;
// local[q] is state q's index among its sequence's states.
struct FbwGroups {
  std::vector<int64_t> edge_start, state_start, end_start;
  std::vector<int32_t> edge_ids, state_ids, end_ids, local;
};

static void fbw_build_groups(const FbwProblem& p, const int32_t* state_seq, FbwGroups& g) {
  fsa_group(p.E, p.B, [&](int64_t e) { return (int64_t)p.seq[e]; }, g.edge_start, g.edge_ids);
  fsa_group(p.S, p.B, [&](int64_t q) { return (int64_t)state_seq[q]; }, g.state_start, g.state_ids);
  fsa_group(p.n_end, p.B, [&](int64_t n) { return (int64_t)fsa_end_seq(p.end_pairs, n); }, g.end_start, g.end_ids);
  g.local.assign(p.S, -1);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t i = g.state_start[b]; i < g.state_start[b + 1]; ++i)
      g.local[g.state_ids[i]] = (int32_t)(i - g.state_start[b]);
}

// One sequence's automaton in local numbering, and the thread's scratch (kept from sequence to sequence).
struct FbwSeq {
  int64_t len, S, E, U, n_end;
  int32_t start;
  std::vector<int32_t> from, to, slot;        // slot: the index of the edge's class in cls
  std::vector<double> W, w;                   // scaled weight factor, -log weight
  std::vector<uint8_t> live;                  // per edge: its target can still reach an end (fbw_mark_live)
  std::vector<int32_t> cls, slot_of;          // the classes emitted, and slot_of[d] (-1: not emitted)
  std::vector<int32_t> end_q, end_n;          // end states (local), their entries n, and their -log weights
  std::vector<double> end_w;
  std::vector<double> alpha, beta, row, P, G, a_min, norm;
};

// Builds sequence b's local automaton in q.
static void fbw_seq_setup(const FbwProblem& p, const FbwChecked& ck, const FbwGroups& g, int64_t b, FbwSeq& q) {
  q.len = ck.seq_len[b];
  q.S = g.state_start[b + 1] - g.state_start[b];
  q.E = g.edge_start[b + 1] - g.edge_start[b];
  q.n_end = g.end_start[b + 1] - g.end_start[b];
  q.start = g.local[p.start[b]];
  q.from.resize(q.E);
  q.to.resize(q.E);
  q.slot.resize(q.E);
  q.W.resize(q.E);
  q.w.resize(q.E);
  q.live.resize(q.E);
  if ((int64_t)q.slot_of.size() < p.D) q.slot_of.assign(p.D, -1);
  q.cls.clear();
  std::vector<uint8_t> live_state(q.S, 0);
  for (int64_t k = 0; k < q.E; ++k) {
    int32_t e = g.edge_ids[g.edge_start[b] + k];
    q.from[k] = g.local[p.from[e]];
    q.to[k] = g.local[p.to[e]];
    if (p.from[e] != p.to[e]) live_state[q.from[k]] = 1;
    int32_t d = p.emis[e];
    if (q.slot_of[d] < 0) {
      q.slot_of[d] = (int32_t)q.cls.size();
      q.cls.push_back(d);
    }
    q.slot[k] = q.slot_of[d];
    q.W[k] = ck.W[e];
    q.w[k] = (double)p.w[e];
  }
  for (int32_t d : q.cls) q.slot_of[d] = -1;  // clean for the next sequence
  q.U = (int64_t)q.cls.size();
  q.end_q.resize(q.n_end);
  q.end_n.resize(q.n_end);
  q.end_w.resize(q.n_end);
  for (int64_t k = 0; k < q.n_end; ++k) {
    int32_t n = g.end_ids[g.end_start[b] + k];
    q.end_n[k] = n;
    q.end_q[k] = g.local[fsa_end_state(p.end_pairs, p.end_simple, n)];
    q.end_w[k] = p.end_w ? (double)p.end_w[n] : 0.0;
    live_state[q.end_q[k]] = 1;
  }
  for (int64_t k = 0; k < q.E; ++k) q.live[k] = live_state[q.to[k]];
  q.alpha.resize((q.len + 1) * q.S);
  q.beta.resize(2 * q.S);
  q.row.resize(p.D);
  q.P.resize(q.U);
  q.G.resize(std::max<int64_t>(q.U, p.D));
  q.a_min.resize(q.len);
  q.norm.resize(q.len);
}

// Frame t's emission factors of the used classes: P[u] = exp(-(a - a_min)) with a = sign * score (0 if impossible).
static inline void fbw_seq_factors(const FbwSeq& q, const Float* row, double sign, double a_min, double* P) {
  for (int64_t u = 0; u < q.U; ++u) {
    double a = sign * (double)row[q.cls[u]];
    P[u] = a_min < INFINITY && a < INFINITY ? fsa_exp(-(a - a_min)) : 0.0;
  }
}

// Forward, frame t's row: records a NaN (nan) or an infinitely likely score (fail; returns false), and keeps
// a_min and the factors' sum (norm); writes the starting outputs into out's row and the used factors into q.P;
// *shift = what -log p gains from the scaling.
static bool fbw_seq_row(const FbwProblem& p, int64_t t, int64_t b, FbwSeq& q, int32_t* nan, FsaCheck* fail,
                        double* shift) {
  const int64_t D = p.D;
  const Float* row = p.am + (t * p.B + b) * D;
  const double sign = p.mode == FBW_NEGLOG ? 1.0 : -1.0;
  double m4[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
  bool has_nan = false;
  int64_t d = 0;
  for (; d + 4 <= D; d += 4)
    for (int j = 0; j < 4; ++j) {
      double a = sign * (double)row[d + j];
      m4[j] = a < m4[j] ? a : m4[j];
      has_nan |= a != a;
    }
  for (; d < D; ++d) {
    double a = sign * (double)row[d];
    m4[0] = a < m4[0] ? a : m4[0];
    has_nan |= a != a;
  }
  double m = std::min(std::min(m4[0], m4[1]), std::min(m4[2], m4[3]));
  if (has_nan) nan[b] = 1;
  if (m == -INFINITY) {
    int64_t k = 0;
    while (k + 1 < D && !(sign * (double)row[k] == -INFINITY)) ++k;
    fsa_fail(fail, FSA_CHECK_SCORE_INFINITE, t, b, k, (double)row[k]);
    return false;
  }
  double* P = q.row.data();
  for (d = 0; d < D; ++d) {
    double a = sign * (double)row[d];
    P[d] = m < INFINITY && a < INFINITY ? fsa_exp(-(a - m)) : 0.0;
  }
  double s4[4] = {0.0, 0.0, 0.0, 0.0};
  for (d = 0; d + 4 <= D; d += 4)
    for (int j = 0; j < 4; ++j) s4[j] += P[d + j];
  for (; d < D; ++d) s4[0] += P[d];
  const double sum = (s4[0] + s4[1]) + (s4[2] + s4[3]);
  Float* o = p.out + (t * p.B + b) * D;
  if (p.mode == FBW_LOGITS) {
    const double inv = sum > 0.0 ? 1.0 / sum : 0.0;  // the softmax is P * inv, here and in the backward pass
    for (d = 0; d < D; ++d) o[d] = (Float)(P[d] * inv);
  } else {
    const Float v = p.mode == FBW_NEGLOG ? (Float)INFINITY : Float(0);
    for (d = 0; d < D; ++d) o[d] = v;
  }
  if (p.sums) p.sums[t * p.B + b] = Float(0);
  for (int64_t u = 0; u < q.U; ++u) q.P[u] = P[q.cls[u]];
  q.a_min[t] = m;
  q.norm[t] = sum;
  *shift = p.mode == FBW_LOGITS ? (sum > 0 ? log(sum) : 0.0) : (m < INFINITY ? m : 0.0);
  return true;
}

// Frame t's row of a padded frame (t >= T_b): -log posterior inf (sums 0), or a gradient of 0.
static void fbw_seq_padded_row(const FbwProblem& p, int64_t t, int64_t b) {
  Float* o = p.out + (t * p.B + b) * p.D;
  const Float v = p.mode == FBW_NEGLOG ? (Float)INFINITY : Float(0);
  for (int64_t d = 0; d < p.D; ++d) o[d] = v;
  if (p.sums) p.sums[t * p.B + b] = Float(0);
}

// The scaled forward-backward of sequence b; returns -log p(x_b) (inf: no path found).  A failed check is
// recorded in fail (a score) or end_fail (an end weight), and the sequence stops there (the call raises).
static double fbw_seq_scaled(const FbwProblem& p, const FbwChecked& ck, int64_t b, FbwSeq& q, int32_t* nan,
                             FsaCheck* fail, FsaCheck* end_fail) {
  const int64_t S = q.S, len = q.len;
  const double wmin = ck.wmin[b];
  double nll = 0.0;
  double* alpha = q.alpha.data();
  std::fill(alpha, alpha + S, 0.0);
  alpha[q.start] = 1.0;
  for (int64_t t = 0; t < len; ++t) {
    double shift;
    if (!fbw_seq_row(p, t, b, q, nan, fail, &shift)) return NAN;
    const double* a_t = alpha + t * S;
    double* a_next = alpha + (t + 1) * S;
    std::fill(a_next, a_next + S, 0.0);
    double c = 0.0;
    for (int64_t k = 0; k < q.E; ++k) {
      if (!q.live[k]) continue;
      double a = a_t[q.from[k]];
      if (a == 0.0) continue;
      double v = a * q.W[k] * q.P[q.slot[k]];
      if (v == 0.0) continue;
      a_next[q.to[k]] += v;
      c += v;
    }
    for (int64_t s = 0; s < S; ++s) a_next[s] = c > 0.0 ? a_next[s] / c : 0.0;
    if (c > 0.0 && wmin < INFINITY)
      nll += shift + wmin - log(c);
    else
      nll = INFINITY;
  }
  for (int64_t t = len; t < p.T; ++t) fbw_seq_padded_row(p, t, b);
  // the end states
  double wm = INFINITY;
  for (int64_t k = 0; k < q.n_end; ++k) {
    double w = q.end_w[k];
    if (w == -INFINITY) {
      fsa_fail(end_fail, FSA_CHECK_END_WEIGHT_MINUS_INF, 0, q.end_n[k], 0, w);
      return NAN;
    }
    if (w != w) nan[b] = 1;
    if (w < wm) wm = w;
  }
  double pe = 0.0;
  if (wm < INFINITY)
    for (int64_t k = 0; k < q.n_end; ++k)
      if (q.end_w[k] < INFINITY) pe += alpha[len * S + q.end_q[k]] * exp(-(q.end_w[k] - wm));
  nll = pe > 0.0 && nll < INFINITY ? nll + (wm - log(pe)) : INFINITY;
  if (!(nll < INFINITY)) return nll;

  // backward
  const double sign = p.mode == FBW_NEGLOG ? 1.0 : -1.0;
  double* b_next = q.beta.data();
  double* b_cur = b_next + S;
  double* G = q.G.data();
  std::fill(b_next, b_next + S, 0.0);
  std::fill(G, G + q.U, 0.0);
  for (int64_t k = 0; k < q.n_end; ++k)
    if (q.end_w[k] < INFINITY) b_next[q.end_q[k]] += exp(-(q.end_w[k] - wm));
  for (int64_t t = len - 1; t >= 0; --t) {
    const Float* row = p.am + (t * p.B + b) * p.D;
    fbw_seq_factors(q, row, sign, q.a_min[t], q.P.data());
    const double* a_t = alpha + t * S;
    std::fill(b_cur, b_cur + S, 0.0);
    double dsum = 0.0, zsum = 0.0;
    for (int64_t k = 0; k < q.E; ++k) {
      double bn = b_next[q.to[k]];
      if (bn == 0.0) continue;
      double pb = q.W[k] * q.P[q.slot[k]] * bn;
      if (pb == 0.0) continue;
      b_cur[q.from[k]] += pb;
      dsum += pb;
      double x = a_t[q.from[k]] * pb;
      if (x != 0.0) {
        zsum += x;
        G[q.slot[k]] += x;
      }
    }
    for (int64_t s = 0; s < S; ++s) b_cur[s] = dsum > 0.0 ? b_cur[s] / dsum : 0.0;
    const bool has_path = zsum > 0.0;
    const double inv = q.norm[t] > 0.0 ? 1.0 / q.norm[t] : 0.0;
    Float* o = p.out + (t * p.B + b) * p.D;
    for (int64_t u = 0; u < q.U; ++u) {
      double gu = has_path ? G[u] / zsum : 0.0;
      G[u] = 0.0;
      if (p.mode == FBW_NEGLOG) {
        o[q.cls[u]] = has_path && gu > 0.0 ? (Float)(-log(gu)) : (Float)INFINITY;
      } else {
        double soft = p.mode == FBW_LOGITS ? q.P[u] * inv : 0.0;
        o[q.cls[u]] = (Float)(soft - gu);
      }
    }
    if (p.sums) p.sums[t * p.B + b] = has_path ? (Float)nll : Float(0);
    std::swap(b_next, b_cur);
  }
  return nll;
}

// The log-space forward-backward of sequence b (for one whose scaled pass found no path); returns -log p(x_b).
// It overwrites out's (and sums') rows of the valid frames.
static double fbw_seq_log_space(const FbwProblem& p, int64_t b, FbwSeq& q) {
  const int64_t S = q.S, len = q.len, D = p.D;
  double* la = q.alpha.data();
  double* Q = q.row.data();
  std::fill(la, la + (len + 1) * S, (double)INFINITY);
  la[q.start] = 0.0;
  for (int64_t t = 0; t < len; ++t) {
    fbl_emission_row(p.mode, D, p.am + (t * p.B + b) * D, Q);
    const double* la_t = la + t * S;
    double* la_next = la + (t + 1) * S;
    for (int64_t k = 0; k < q.E; ++k) {
      double a = la_t[q.from[k]];
      if (a == INFINITY) continue;
      double v = a + q.w[k] + Q[q.cls[q.slot[k]]];
      if (v < INFINITY) la_next[q.to[k]] = fsa_neglog_add(la_next[q.to[k]], v);
    }
  }
  double nll = INFINITY;
  for (int64_t k = 0; k < q.n_end; ++k) {
    double v = la[len * S + q.end_q[k]] + q.end_w[k];
    if (v < INFINITY) nll = fsa_neglog_add(nll, v);
  }
  const bool has_path = nll < INFINITY;
  double* lb_next = q.beta.data();
  double* lb_cur = lb_next + S;
  double* G = q.G.data();
  std::fill(lb_next, lb_next + S, (double)INFINITY);
  std::fill(G, G + D, (double)INFINITY);
  for (int64_t k = 0; k < q.n_end; ++k)
    if (q.end_w[k] < INFINITY) lb_next[q.end_q[k]] = fsa_neglog_add(lb_next[q.end_q[k]], q.end_w[k]);
  for (int64_t t = len - 1; t >= 0; --t) {
    std::fill(lb_cur, lb_cur + S, (double)INFINITY);
    fbl_emission_row(p.mode, D, p.am + (t * p.B + b) * D, Q);
    const double* la_t = la + t * S;
    for (int64_t k = 0; has_path && k < q.E; ++k) {
      double bn = lb_next[q.to[k]];
      if (bn == INFINITY) continue;
      const int32_t d = q.cls[q.slot[k]];
      double pb = q.w[k] + Q[d] + bn;
      if (!(pb < INFINITY)) continue;
      lb_cur[q.from[k]] = fsa_neglog_add(lb_cur[q.from[k]], pb);
      double a = la_t[q.from[k]];
      if (a < INFINITY) G[d] = fsa_neglog_add(G[d], a + pb - nll);
    }
    Float* o = p.out + (t * p.B + b) * D;
    for (int64_t d = 0; d < D; ++d) {
      double g = G[d];
      G[d] = INFINITY;
      if (p.mode == FBW_NEGLOG)
        o[d] = has_path ? (Float)g : (Float)INFINITY;
      else
        o[d] = (Float)((p.mode == FBW_LOGITS ? exp(-Q[d]) : 0.0) - (has_path ? exp(-g) : 0.0));
    }
    if (p.sums) p.sums[t * p.B + b] = has_path ? (Float)nll : Float(0);
    std::swap(lb_next, lb_cur);
  }
  return nll;
}

static void fbw_passes(const FbwProblem& p, ptn::Scratch&, const FbwChecked& ck) {
  const int64_t B = p.B, D = p.D;
  FbwGroups g;
  fbw_build_groups(p, ck.state_seq, g);
  std::vector<double> nll(B);
  std::vector<FsaCheck> fails(B), end_fails(B);
  memset(fails.data(), 0, B * sizeof(FsaCheck));
  memset(end_fails.data(), 0, B * sizeof(FsaCheck));
  double cost = 0.0;
  for (int64_t b = 0; b < B; ++b) cost += (double)ck.seq_len[b] * (double)(g.edge_start[b + 1] - g.edge_start[b] + D);
  fsa_for_each_sequence<FbwSeq>(B, cost, [&](int64_t b, FbwSeq& q) {
    fbw_seq_setup(p, ck, g, b, q);
    double v = fbw_seq_scaled(p, ck, b, q, ck.nan, &fails[b], &end_fails[b]);
    if (fails[b].code != FSA_CHECK_OK || end_fails[b].code != FSA_CHECK_OK) return;
    if (!(v < INFINITY) && !ck.nan[b]) v = fbw_seq_log_space(p, b, q);
    nll[b] = v;
  });
  // the failed check the device schedule reports: infinitely likely scores first, then -inf end weights
  const FsaCheck* first = fsa_first_by_frame(fails);
  if (!first) first = fsa_first_by_frame(end_fails);
  if (first) fsa_raise_check(first, p.terms);
  for (int64_t b = 0; b < B; ++b) {
    if (p.loss) p.loss[b] = ck.nan[b] ? (Float)NAN_F : (Float)nll[b];
    if (!ck.nan[b]) continue;
    for (int64_t t = 0; t < ck.seq_len[b]; ++t) {
      Float* o = p.out + (t * B + b) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = (Float)NAN_F;
      if (p.sums) p.sums[t * B + b] = (Float)NAN_F;
    }
  }
}
#endif  // !CUDA

#endif  // PTNATIVE_FSA_FSA_BAUM_WELCH_CPU_H
