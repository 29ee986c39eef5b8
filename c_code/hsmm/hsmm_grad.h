// Explicit-duration HMM: the backward recursion of one sequence and the posteriors of its segments, which are the
// gradients of log p(x_b) (hsmm_model.h has the model and the forward recursion).
//
//   bend_e(j)   = logsumexp_{k != j} log A(j, k) + bstart_{e+1}(k)                        (e < L - 1)
//   bstart_s(k) = logsumexp_d W(e)_k(d) + sum_{t=s..e} log e_t(k) + [e < L - 1] bend_e(k),  e = s + d - 1 < L
// The posterior of the segment (k, s, e) is P = exp(start_s(k) + that term - log p), and
//   d log p / d log e_t(k)     = sum of P over the segments of k covering t (a difference array along t, summed),
//   d log p / d log p_k(d)     = sum of P over the segments of k and duration d that are not last; the last ones
//                                count for W = log L_k(d) (censored: chained through L in hsmm_grad_reduce) or log p,
//   d log p / d log A(j, k)    = sum_t exp(alpha_t(j) + log A(j, k) + bstart_{t+1}(k) - log p)   (j != k),
//   d log p / d log pi(k)      = exp(log pi(k) + bstart_0(k) - log p).
// Per sequence these go into its own accumulators (gA, gD, gL, gpi); hsmm_grad_reduce sums them over the batch in
// sequence order (the same bits whatever the split over threads), weighted by the upstream gradient.
#ifndef PTNATIVE_HSMM_HSMM_GRAD_H
#define PTNATIVE_HSMM_HSMM_GRAD_H

#include "../dialect/kernel.h"

#include "hsmm_model.h"

// Per-sequence arrays of the backward pass (doubles): bstart, bend (state-major, stride T), the difference array of
// the emission posteriors (stride T + 1), and the accumulators gA (K, K), gD and gL (K, D), gpi (K).
struct HsmmGradWork {
  double *bstart, *bend, *diff, *gA, *gD, *gL, *gpi;
};

HOST_FUNC DEV_FUNC inline int64_t hsmm_acc_size(const HsmmModel& m) { return m.K * m.K + 2 * m.K * m.D + m.K; }

DEV_FUNC inline HsmmGradWork hsmm_grad_work(const HsmmModel& m, double* work, int64_t b) {
  const int64_t per = 2 * m.K * m.T + m.K * (m.T + 1) + hsmm_acc_size(m);
  double* w = work + b * per;
  HsmmGradWork g;
  g.bstart = w;
  g.bend = w + m.K * m.T;
  g.diff = w + 2 * m.K * m.T;
  g.gA = g.diff + m.K * (m.T + 1);
  g.gD = g.gA + m.K * m.K;
  g.gL = g.gD + m.K * m.D;
  g.gpi = g.gL + m.K * m.D;
  return g;
}

static double* hsmm_grad_work_alloc(ptn::Scratch& scratch, const HsmmModel& m) {
  return scratch.get<double>(m.B * (2 * m.K * m.T + m.K * (m.T + 1) + hsmm_acc_size(m)));
}

// exp(v) of a log-posterior (at most 0 up to rounding).
DEV_FUNC inline double hsmm_post(double v) { return v <= 0.0 ? fsa_exp(v) : exp(v); }

// The backward pass of sequence b (L > 0): bstart and bend, and with GRAD (log p = ll finite; hsmm_forward_seq has
// filled w) the accumulators of g.  Without GRAD only w.em (hsmm_load_emissions) and w.buf are read.
template <bool GRAD>
DEV_FUNC void hsmm_backward_seq(const HsmmModel& m, int64_t b, double ll, const HsmmSeqWork& w,
                                const HsmmGradWork& g) {
  const int64_t T = m.T, K = m.K, D = m.D, L = m.seq_len[b];
  const double* ld = m.ld + (m.Bd == 1 ? 0 : b) * K * D;
  const double* lW = m.lW + (m.Bd == 1 ? 0 : b) * K * D;
  const double* lpi = m.lpi + (m.Bp == 1 ? 0 : b) * K;
  if constexpr (GRAD) {
    for (int64_t i = 0; i < hsmm_acc_size(m); ++i) g.gA[i] = 0.0;
    for (int64_t i = 0; i < K * (T + 1); ++i) g.diff[i] = 0.0;
  }
  for (int64_t t = L - 1; t >= 0; --t) {
    if (t < L - 1) {
      for (int64_t j = 0; j < K; ++j) {
        for (int64_t k = 0; k < K; ++k) w.buf[k] = m.lA[j * K + k] + g.bstart[k * T + t + 1];
        double sum;
        const double mx = hsmm_exps(w.buf, K, &sum);  // w.buf[k] = exp(log A(j, k) + bstart_{t+1}(k) - mx)
        g.bend[j * T + t] = mx > -INFINITY ? mx + log(sum) : mx;
        if constexpr (!GRAD) continue;
        const double a = w.alpha[j * T + t] - ll;
        if (!(a > -INFINITY) || !(mx > -INFINITY)) continue;
        const double f = hsmm_post(a + mx);
        for (int64_t k = 0; k < K; ++k) g.gA[j * K + k] += f * w.buf[k];  // the diagonal's buf is 0
      }
    }
    const int64_t n = D < L - t ? D : L - t;
    for (int64_t k = 0; k < K; ++k) {
      const double* em = w.em + k * T + t;
      const double* be = g.bend + k * T + t;
      double seg = 0.0;
      for (int64_t d = 0; d < n; ++d) {
        seg += em[d];
        w.buf[d] = (t + d == L - 1 ? lW[k * D + d] : ld[k * D + d] + be[d]) + seg;
      }
      double sum;
      const double mx = hsmm_exps(w.buf, n, &sum);  // w.buf[d] = exp(term_d - mx)
      g.bstart[k * T + t] = mx > -INFINITY ? mx + log(sum) : mx;
      if constexpr (!GRAD) continue;
      const double sk = w.start[k * T + t] - ll;
      if (!(sk > -INFINITY) || !(mx > -INFINITY)) continue;
      const double f = hsmm_post(sk + mx);  // P_d = exp(start + term_d - ll) = f w.buf[d]
      double* diff = g.diff + k * (T + 1);
      double* acc = g.gD + k * D;
      const int64_t n_mid = t + n == L ? n - 1 : n;  // segments that are not the last one
      double total = 0.0;
      for (int64_t d = 0; d < n_mid; ++d) {
        const double P = f * w.buf[d];
        total += P;
        diff[t + d + 1] -= P;
        acc[d] += P;
      }
      if (n_mid < n) {  // the last segment: its posterior counts for W = log L (censored) or log p
        const double P = f * w.buf[n - 1];
        total += P;
        diff[L] -= P;
        g.gL[k * D + n - 1] += P;
      }
      diff[t] += total;
    }
  }
  if constexpr (GRAD) {
    for (int64_t k = 0; k < K; ++k) {
      const double v = lpi[k] + g.bstart[k * T] - ll;
      g.gpi[k] = v > -INFINITY ? hsmm_post(v) : 0.0;
    }
  }
}

// The gradient of the log-emissions of sequence b from its difference array (status OK), NaN on its valid frames
// (status NaN), or zeros (no path, the empty series); zeros on its padded frames.  Its accumulators are NaN for a NaN
// status and zeros without a path.
DEV_FUNC void hsmm_emission_grad(const HsmmModel& m, int64_t b, int status, Float g_b, const HsmmGradWork& g,
                                 Float* gle) {
  const int64_t T = m.T, B = m.B, K = m.K, L = m.seq_len[b];
  if (status != HSMM_OK) {
    const double fill = status == HSMM_NAN ? (double)NAN_F : 0.0;
    for (int64_t i = 0; i < hsmm_acc_size(m); ++i) g.gA[i] = fill;
  }
  for (int64_t k = 0; k < K; ++k) {
    const double* diff = g.diff + k * (T + 1);
    double acc = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      Float v = 0;
      if (t < L) {
        if (status == HSMM_OK) {
          acc += diff[t];
          v = (Float)((double)g_b * acc);
        } else if (status == HSMM_NAN) {
          v = (Float)NAN_F;
        }
      }
      gle[(t * B + b) * K + k] = v;
    }
  }
}

// Sequence b's forward and backward passes: its emission posteriors times g_b in gle (the emission gradient; all
// of (T, b, K) written) and its accumulators in g (hsmm_emission_grad's cases).  Returns log p(x_b) (0 for the empty
// series, NaN for a NaN status, -inf without a path).
DEV_FUNC double hsmm_seq_posteriors(const HsmmModel& m, int64_t b, double* work, double* gwork, Float g_b,
                                    Float* gle) {
  const HsmmGradWork g = hsmm_grad_work(m, gwork, b);
  int status = m.status[b];
  double ll = m.seq_len[b] == 0 ? 0.0 : (double)NAN_F;
  if (m.seq_len[b] > 0 && status == HSMM_OK) {
    const HsmmSeqWork w = hsmm_seq_work(m, work, b);
    ll = hsmm_forward_seq<false>(m, b, w, nullptr, nullptr);
    if (ll > -INFINITY)
      hsmm_backward_seq<true>(m, b, ll, w, g);
    else
      status = HSMM_NO_PATH;
  }
  hsmm_emission_grad(m, b, status, g_b, g, gle);
  return ll;
}

// Sums of the accumulators over the sequences of each duration row q (all of them when Bd = 1), weighted by the
// upstream gradient: GLw (Bd, K, D) = sum_b g_b gL_b.  Sequences without a frame add nothing.
DEF_KERNEL void hsmm_grad_last(HsmmModel m, const double* gwork, const Float* g_ll, double* GLw) {
  const int64_t per = 2 * m.K * m.T + m.K * (m.T + 1) + hsmm_acc_size(m);
  const int64_t off = 2 * m.K * m.T + m.K * (m.T + 1) + m.K * m.K + m.K * m.D;  // gL within a sequence's block
  GRID_LOOP(i, m.Bd * m.K * m.D) {
    const int64_t q = i / (m.K * m.D), r = i % (m.K * m.D);
    double s = 0.0;
    for (int64_t b = (m.Bd == 1 ? 0 : q); b < (m.Bd == 1 ? m.B : q + 1); ++b)
      if (m.seq_len[b] > 0) s += (double)g_ll[b] * gwork[b * per + off + r];
    GLw[i] = s;
  }
}

// The gradients of log_transitions (K, K), log_durations (Bd, K, D) and log_initial (Bp, K): every element
// written.  Censored: the last segments' sums GLw reach log p through log L_k(d) = log sum_{d' >= d} p_k(d'), so
// d/d log p_k(d') gets sum_{d <= d'} GLw(d) exp(log p_k(d') - log L_k(d)).
DEF_KERNEL void hsmm_grad_reduce(HsmmModel m, bool censored, const double* gwork, const Float* g_ll,
                                 const double* GLw, Float* gA, Float* gd, Float* gpi) {
  const int64_t K = m.K, D = m.D;
  const int64_t per = 2 * K * m.T + K * (m.T + 1) + hsmm_acc_size(m);
  const int64_t acc0 = 2 * K * m.T + K * (m.T + 1);
  const int64_t nA = K * K, nd = m.Bd * K * D, npi = m.Bp * K;
  GRID_LOOP(i, nA + nd + npi) {
    int64_t q = 0, r = i, off = acc0, Bq = 1;
    if (i < nA) {
      r = i;
    } else if (i < nA + nd) {
      q = (i - nA) / (K * D);
      r = (i - nA) % (K * D);
      off = acc0 + nA;
      Bq = m.Bd;
    } else {
      q = (i - nA - nd) / K;
      r = (i - nA - nd) % K;
      off = acc0 + nA + 2 * K * D;
      Bq = m.Bp;
    }
    double s = 0.0;
    for (int64_t b = (Bq == 1 ? 0 : q); b < (Bq == 1 ? m.B : q + 1); ++b)
      if (m.seq_len[b] > 0) s += (double)g_ll[b] * gwork[b * per + off + r];
    if (i < nA) {
      gA[i] = (Float)s;
    } else if (i < nA + nd) {
      const int64_t k = r / D, dd = r % D, row = (q * K + k) * D;
      if (!censored) {
        s += GLw[row + dd];
      } else {
        for (int64_t d = 0; d <= dd; ++d) {
          const double G = GLw[row + d];
          if (G == 0.0) continue;
          const double e = m.ld[row + dd] - m.lW[row + d];
          s += G * (e == e ? exp(e) : 0.0);
        }
      }
      gd[i - nA] = (Float)s;
    } else {
      gpi[i - nA - nd] = (Float)s;
    }
  }
}

#endif  // PTNATIVE_HSMM_HSMM_GRAD_H
