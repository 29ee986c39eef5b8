// The Baum-Welch passes on CUDA: one launch per frame forward and one backward, each over the whole batch
// (fsa_baum_welch.h declares the problem; the CPU schedule is fsa_baum_welch_cpu.h).
//
// The scaled vectors are normalised lazily: a frame's launch accumulates the unnormalised vector of the next frame
// (alpha) or of its own (beta) and its per-sequence sums, and the next launch divides by those sums as it reads
// them (the same divisions as normalising in place, so the same numbers); the log-probability is summed from the
// per-frame sums at the end.  Each backward launch also writes the outputs of the frame after it (whose posterior
// mass is complete by then) and prepares the frame before it (clears its row of the three-row beta ring, puts the
// end weights of the sequences that end there).
#ifndef PTNATIVE_FSA_FSA_BAUM_WELCH_CUDA_H
#define PTNATIVE_FSA_FSA_BAUM_WELCH_CUDA_H

#include "../dialect/kernel.h"

#include "fsa_baum_welch.h"

#if CUDA
// The emission rows kept at a time, in elements (256 MB of doubles); a macro so that tests can make it small.
#ifndef FBW_MAX_ROW_ELEMENTS
#define FBW_MAX_ROW_ELEMENTS ((int64_t)32 * 1024 * 1024)
#endif

DEF_KERNEL void fbw_set_start(int64_t n_batch, const int32_t* start_states, double* alpha0) {
  GRID_LOOP(b, n_batch) alpha0[start_states[b]] = 1.0;
}

// Emission factors of the rows r = (t - t0) * n_batch + b of frames t0, t0 + 1, ... (n_rows in all), one block
// per row: P[r, d] = exp(-(a - min a)) with a = -log score; shift[r] = what -log p gains from the scaling;
// norm[r] = sum of P (softmax).  Rows of padded frames are left alone.
// A NaN in a row marks its sequence in `nan` (the row's NaNs count as impossible here); an infinitely likely
// score is recorded in `check`.
DEF_KERNEL void fbw_emissions(int mode, int64_t t0, int64_t n_rows, int64_t n_batch, int64_t n_classes,
                              const Float* am, const int32_t* seq_len, double* P, double* shift, double* norm,
                              int32_t* nan, FsaCheck* check) {
  DEF_SHARED(double, sh);
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  const double sign = mode == FBW_NEGLOG ? 1.0 : -1.0;
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const int64_t b = r % n_batch;
    if (t0 + r / n_batch >= seq_len[b]) continue;
    const Float* row = am + (t0 * n_batch + r) * n_classes;
    double* Pr = P + r * n_classes;
    double m = INFINITY, n_nan = 0.0;
    for (int64_t d = tid; d < n_classes; d += nt) {
      double a = sign * (double)row[d];
      if (a < m) m = a;
      if (a != a) n_nan += 1.0;
    }
    m = block_min(sh, m);  // the same in every thread of the block
    n_nan = block_sum(sh, n_nan);
    if (tid == 0 && n_nan > 0.0) nan[b] = 1;
    if (m == -INFINITY) {
      if (tid == 0) {
        int64_t d = 0;
        while (d + 1 < n_classes && !(sign * (double)row[d] == -INFINITY)) ++d;
        fsa_fail(check, FSA_CHECK_SCORE_INFINITE, t0 + r / n_batch, b, d, (double)row[d]);
      }
      m = INFINITY;  // the row then counts as impossible
    }
    double sum = 0.0;
    for (int64_t d = tid; d < n_classes; d += nt) {
      double a = sign * (double)row[d];
      double p = m < INFINITY && a < INFINITY ? fsa_exp(-(a - m)) : 0.0;
      Pr[d] = p;
      sum += p;
    }
    sum = block_sum(sh, sum);
    if (tid == 0) {
      norm[r] = sum;
      shift[r] = mode == FBW_LOGITS ? (sum > 0 ? log(sum) : 0.0) : (m < INFINITY ? m : 0.0);
    }
  }
}

// Rows of frames [t0, t0 + n_frames) through fbw_emissions; P, shift and norm point at frame t0's first row.
static void fbw_emission_rows(int mode, int64_t t0, int64_t n_frames, int64_t n_batch, int64_t n_classes,
                              const Float* am, const int32_t* seq_len, double* P, double* shift, double* norm,
                              int32_t* nan, FsaCheck* check) {
  const int64_t n_rows = n_frames * n_batch;
  if (n_rows == 0) return;
  start_dev_kernel2(fbw_emissions, std::min<int64_t>(n_rows, 65535), FSA_ROW_THREADS,
                    FSA_ROW_THREADS * sizeof(double), (mode, t0, n_rows, n_batch, n_classes, am, seq_len, P, shift,
                                                       norm, nan, check));
}

// live[q] = 0 for a sink: a state that is no end state and has no edge to another state (such as the CTC
// automaton's dummy state).  Its mass can never reach an end; the scaled forward pass drops it, since a sink that
// kept collecting mass would take over the per-frame normalisation and underflow the paths that matter.
DEF_KERNEL void fbw_mark_live(int64_t n_edges, const int32_t* from, const int32_t* to, int64_t n_end,
                              const int32_t* end_pairs, const int32_t* end_simple, int32_t* live) {
  GRID_LOOP(i, n_edges + n_end) {
    if (i < n_edges) {
      if (from[i] != to[i]) live[from[i]] = 1;
    } else {
      live[fsa_end_state(end_pairs, end_simple, i - n_edges)] = 1;
    }
  }
}

// Everything the passes' kernels read and write: the problem (its device pointers) and the passes' own arrays, passed
// by value to each launch.
struct FbwDev : FbwProblem {
  const int32_t *state_seq, *seq_len, *live;
  const double *wmin, *W;
  double* end_wmin;                // (B,)
  double *alpha, *csum;            // (T + 1, S) unnormalised forward vectors, (T + 1, B) their per-sequence sums
  double *beta, *dsum, *zsum;      // (3, S) ring of unnormalised backward vectors; (T, B) sums, posterior sums
  double* G;                       // (2, B, D) posterior mass of two frames
  double *P, *norm, *shift;        // emission rows of frames p0.. (P (rows, B, D), norm (rows, B)); shift (T, B)
  int64_t p0;
  double* nll;                     // (B,)
  const int32_t* redo;             // log space: the sequences redone
  double* Q;                       // log space: (3, B, D) ring of -log emissions
};

// Frame t's normalised forward value of state q (of sequence s).
DEV_FUNC inline double fbw_alpha_at(const FbwDev& d, int64_t t, int32_t q, int32_t s) {
  double a = d.alpha[t * d.S + q];
  if (t == 0) return a;
  double cs = d.csum[t * d.B + s];
  return cs > 0.0 ? a / cs : 0.0;
}

// Frame t's normalised backward value of state q (of sequence s); at the sequence's last frame + 1, the end weights.
DEV_FUNC inline double fbw_beta_at(const FbwDev& d, int64_t t, int32_t q, int32_t s) {
  double v = d.beta[(t % 3) * d.S + q];
  if (t >= d.seq_len[s]) return v;
  double ds = d.dsum[t * d.B + s];
  return ds > 0.0 ? v / ds : 0.0;
}

// Forward, frame t: every edge adds alpha_t(from) W P to the next frame's unnormalised value and its sequence's sum.
DEF_KERNEL void fbw_fwd_step(FbwDev d, int64_t t) {
  const double* P = d.P + (t - d.p0) * d.B * d.D;
  GRID_LOOP(e, d.E) {
    int32_t s = d.seq[e];
    if (t >= d.seq_len[s] || !d.live[d.to[e]]) continue;
    double a = fbw_alpha_at(d, t, d.from[e], s);
    if (a == 0.0) continue;
    double v = a * d.W[e] * P[s * d.D + d.emis[e]];
    if (v == 0.0) continue;
    elem_atomic_add(d.alpha + (t + 1) * d.S + d.to[e], v);
    elem_atomic_add(d.csum + (t + 1) * d.B + s, v);
  }
}

// After the forward pass: -log p = the frames' -log sums (with their scaling shifts) and -log(sum over end states
// of alpha * exp(-w_end)); the loss when asked.
DEF_KERNEL void fbw_fwd_final(FbwDev d, int32_t* nan, FsaCheck* check) {
  GRID_LOOP(b, d.B) {
    const int64_t len = d.seq_len[b];
    double nll = 0.0;
    for (int64_t t = 0; t < len; ++t) {
      double cb = d.csum[(t + 1) * d.B + b];
      if (cb > 0.0 && d.wmin[b] < INFINITY)
        nll += d.shift[t * d.B + b] + d.wmin[b] - log(cb);
      else
        nll = INFINITY;
    }
    double wm = INFINITY;
    FSA_END_LOOP(n, b, d.end_pairs, d.n_end) {
      double w = fsa_end_weight(d.end_w, n);
      if (w == -INFINITY) fsa_fail(check, FSA_CHECK_END_WEIGHT_MINUS_INF, 0, n, 0, w);
      if (w != w) nan[b] = 1;
      if (w < wm) wm = w;
    }
    double p = 0.0;
    if (wm < INFINITY) {
      FSA_END_LOOP(n, b, d.end_pairs, d.n_end) {
        double w = fsa_end_weight(d.end_w, n);
        if (w < INFINITY) p += fbw_alpha_at(d, len, fsa_end_state(d.end_pairs, d.end_simple, n), (int32_t)b) *
                               exp(-(w - wm));
      }
    }
    d.end_wmin[b] = wm;
    nll = p > 0.0 && nll < INFINITY ? nll + wm - log(p) : INFINITY;
    d.nll[b] = nll;
    if (d.loss) d.loss[b] = (Float)nll;
  }
}

// Frame u's outputs from its posterior mass (item i = b D + k).  FBW_NEGLOG: out = -log posterior (INF where none),
// sums = -log p on valid frames of sequences with a path, else 0.  FBW_LOGITS / FBW_LOGPROBS: out = d(-log p)/d
// logits = softmax - posterior (resp. -posterior), 0 on padded frames.
DEV_FUNC inline void fbw_output_item(const FbwDev& d, int64_t u, int64_t i) {
  const int64_t b = i / d.D;
  const bool valid = u < d.seq_len[b];
  const double z = d.zsum[u * d.B + b];
  const bool has_path = valid && d.nll[b] < INFINITY && z > 0.0;
  double* Gi = d.G + (u & 1) * d.B * d.D + i;
  const double g = has_path ? *Gi / z : 0.0;  // G holds the unnormalised posterior mass
  *Gi = 0.0;
  Float* o = d.out + u * d.B * d.D + i;
  if (d.mode == FBW_NEGLOG) {
    *o = has_path && g > 0.0 ? (Float)(-log(g)) : (Float)INFINITY;
    if (d.sums && i % d.D == 0) d.sums[u * d.B + b] = has_path ? (Float)d.nll[b] : Float(0);
  } else if (!valid) {
    *o = Float(0);
  } else {
    const double* P = d.P + (u - d.p0) * d.B * d.D;
    const double nb = d.norm[(u - d.p0) * d.B + b];
    const double soft = d.mode == FBW_LOGITS && nb > 0.0 ? P[i] / nb : 0.0;
    *o = (Float)(soft - (has_path ? g : 0.0));
  }
}

// The item ranges of a backward launch for frame t: frame t's edges, frame t + 1's outputs, frame t - 1's start
// (its ring row cleared, S items; the end weights of sequences of length t, B items).
struct FbwBwItems {
  int64_t n_edges, n_out, n_prep;
  DEV_FUNC FbwBwItems(int64_t t, int64_t T, int64_t E, int64_t BD, int64_t SB)
      : n_edges(t >= 0 && t < T ? E : 0), n_out(t + 1 < T ? BD : 0), n_prep(t >= 1 ? SB : 0) {}
};

// Backward, frame t (t = T .. -1; see FbwBwItems).
DEF_KERNEL void fbw_bw_step(FbwDev d, int64_t t) {
  const int64_t BD = d.B * d.D;
  const FbwBwItems n(t, d.T, d.E, BD, d.S + d.B);
  const double* P = d.P + (t - d.p0) * BD;
  GRID_LOOP(j, n.n_edges + n.n_out + n.n_prep) {
    if (j < n.n_edges) {
      const int64_t e = j;
      int32_t s = d.seq[e];
      if (t >= d.seq_len[s]) continue;
      double bn = fbw_beta_at(d, t + 1, d.to[e], s);
      if (bn == 0.0) continue;
      double pb = d.W[e] * P[s * d.D + d.emis[e]] * bn;
      if (pb == 0.0) continue;
      elem_atomic_add(d.beta + (t % 3) * d.S + d.from[e], pb);
      elem_atomic_add(d.dsum + t * d.B + s, pb);
      double x = fbw_alpha_at(d, t, d.from[e], s) * pb;
      if (x != 0.0) {
        elem_atomic_add(d.zsum + t * d.B + s, x);
        elem_atomic_add(d.G + (t & 1) * BD + s * d.D + d.emis[e], x);
      }
    } else if (j < n.n_edges + n.n_out) {
      fbw_output_item(d, t + 1, j - n.n_edges);
    } else {
      const int64_t i = j - n.n_edges - n.n_out;
      if (i < d.S) {
        d.beta[((t - 1) % 3) * d.S + i] = 0.0;
        continue;
      }
      const int64_t b = i - d.S;
      if (d.seq_len[b] != t || !(d.end_wmin[b] < INFINITY)) continue;
      FSA_END_LOOP(k, b, d.end_pairs, d.n_end) {
        double w = fsa_end_weight(d.end_w, k);
        if (w < INFINITY) d.beta[(t % 3) * d.S + fsa_end_state(d.end_pairs, d.end_simple, k)] +=
            exp(-(w - d.end_wmin[b]));
      }
    }
  }
}

// ---- log-space fallback, for sequences whose scaled pass found no path (no path at all,
// or emission / weight ranges beyond double's ~700 nats per frame).
DEF_KERNEL void fbl_mark(int64_t n_batch, const double* nll, const int32_t* nan, int32_t* redo, int32_t* n_redo) {
  GRID_LOOP(b, n_batch) {
    redo[b] = nll[b] < INFINITY || nan[b] ? 0 : 1;
    if (redo[b]) elem_atomic_add(n_redo, 1);
  }
}

// Frame u's -log emissions Q of sequence b (redone, u valid) into its row of the Q ring.
DEV_FUNC inline void fbl_emission_item(const FbwDev& d, int64_t u, int64_t b) {
  if (!d.redo[b] || u >= d.seq_len[b]) return;
  fbl_emission_row(d.mode, d.D, d.am + (u * d.B + b) * d.D, d.Q + (u % 3) * d.B * d.D + b * d.D);
}

// Log-space forward, frame t (t = -1 .. T - 1): frame t's edges (la = -log alpha), and frame t + 1's emissions.
// Launched with t = -1 it also puts the start states.
DEF_KERNEL void fbl_fwd_step(FbwDev d, int64_t t) {
  const int64_t n_edges = t >= 0 ? d.E : 0, n_rows = t + 1 < d.T || t < 0 ? d.B : 0;
  double* la = d.alpha;
  GRID_LOOP(j, n_edges + n_rows) {
    if (j >= n_edges) {
      const int64_t b = j - n_edges;
      fbl_emission_item(d, t + 1, b);
      if (t < 0 && d.redo[b]) la[d.start[b]] = 0.0;
      continue;
    }
    const int64_t e = j;
    int32_t s = d.seq[e];
    if (!d.redo[s] || t >= d.seq_len[s]) continue;
    double a = la[t * d.S + d.from[e]];
    if (a == INFINITY) continue;
    double v = a + (double)d.w[e] + d.Q[(t % 3) * d.B * d.D + s * d.D + d.emis[e]];
    if (v < INFINITY) fsa_atomic_neglog_add(la + (t + 1) * d.S + d.to[e], v);
  }
}

DEF_KERNEL void fbl_final(FbwDev d) {
  GRID_LOOP(b, d.B) {
    if (!d.redo[b]) continue;
    const double* a = d.alpha + (int64_t)d.seq_len[b] * d.S;
    double acc = INFINITY;
    FSA_END_LOOP(n, b, d.end_pairs, d.n_end) {
      double v = a[fsa_end_state(d.end_pairs, d.end_simple, n)] + fsa_end_weight(d.end_w, n);
      if (v < INFINITY) acc = fsa_neglog_add(acc, v);
    }
    d.nll[b] = acc;
    if (d.loss) d.loss[b] = (Float)acc;
  }
}

// Log-space backward, frame t (t = T .. -1; the items of FbwBwItems): frame t's edges (lb = -log beta, in a ring
// of three rows), frame t + 1's outputs, frame t - 1's start (its ring row cleared; per redone sequence its
// emissions into the Q ring and, for sequences of length t, the end weights).
DEF_KERNEL void fbl_bw_step(FbwDev d, int64_t t) {
  const int64_t BD = d.B * d.D;
  const FbwBwItems n(t, d.T, d.E, BD, d.S + d.B);
  double* lb = d.beta;
  GRID_LOOP(j, n.n_edges + n.n_out + n.n_prep) {
    if (j < n.n_edges) {
      const int64_t e = j;
      int32_t s = d.seq[e];
      if (!d.redo[s] || t >= d.seq_len[s] || !(d.nll[s] < INFINITY)) continue;
      double bn = lb[((t + 1) % 3) * d.S + d.to[e]];
      if (bn == INFINITY) continue;
      double pb = (double)d.w[e] + d.Q[(t % 3) * BD + s * d.D + d.emis[e]] + bn;
      if (!(pb < INFINITY)) continue;
      fsa_atomic_neglog_add(lb + (t % 3) * d.S + d.from[e], pb);
      double a = d.alpha[t * d.S + d.from[e]];
      if (a < INFINITY) fsa_atomic_neglog_add(d.G + (t & 1) * BD + s * d.D + d.emis[e], a + pb - d.nll[s]);
    } else if (j < n.n_edges + n.n_out) {
      const int64_t u = t + 1, i = j - n.n_edges, b = i / d.D;
      if (!d.redo[b]) continue;
      const bool valid = u < d.seq_len[b], has_path = valid && d.nll[b] < INFINITY;
      double* Gi = d.G + (u & 1) * BD + i;
      const double g = *Gi;
      *Gi = INFINITY;
      Float* o = d.out + u * BD + i;
      if (d.mode == FBW_NEGLOG) {
        *o = has_path ? (Float)g : (Float)INFINITY;
        if (d.sums && i % d.D == 0) d.sums[u * d.B + b] = has_path ? (Float)d.nll[b] : Float(0);
      } else if (valid) {
        double soft = d.mode == FBW_LOGITS ? exp(-d.Q[(u % 3) * BD + i]) : 0.0;
        *o = (Float)(soft - (has_path ? exp(-g) : 0.0));
      }
    } else {
      const int64_t i = j - n.n_edges - n.n_out;
      if (i < d.S) {
        lb[((t - 1) % 3) * d.S + i] = INFINITY;
        continue;
      }
      const int64_t b = i - d.S;
      fbl_emission_item(d, t - 1, b);
      if (!d.redo[b] || d.seq_len[b] != t) continue;
      FSA_END_LOOP(k, b, d.end_pairs, d.n_end) {
        double w = fsa_end_weight(d.end_w, k);
        if (w < INFINITY) {
          double* q = lb + (t % 3) * d.S + fsa_end_state(d.end_pairs, d.end_simple, k);
          *q = fsa_neglog_add(*q, w);
        }
      }
    }
  }
}

// NaN sequences: their loss and their outputs on valid frames (out, sums) become NaN.
DEF_KERNEL void fbw_nan_out(int64_t n_time, int64_t n_batch, int64_t n_classes, const int32_t* seq_len,
                            const int32_t* nan, Float* out, Float* sums, Float* loss) {
  const int64_t n_cells = n_time * n_batch * n_classes;
  GRID_LOOP(i, n_cells + n_batch) {
    if (i >= n_cells) {
      if (loss && nan[i - n_cells]) loss[i - n_cells] = (Float)NAN_F;
      continue;
    }
    int64_t b = (i / n_classes) % n_batch, t = i / (n_classes * n_batch);
    if (!nan[b] || t >= seq_len[b]) continue;
    out[i] = (Float)NAN_F;
    if (sums && i % n_classes == 0) sums[t * n_batch + b] = (Float)NAN_F;
  }
}

// The passes over a checked problem (ck: what fbw_run's checks computed).
static void fbw_passes(const FbwProblem& p, ptn::Scratch& scratch, const FbwChecked& ck) {
  const int64_t T = p.T, B = p.B, D = p.D, E = p.E, S = p.S;
  int32_t* nan = ck.nan;
  FsaCheck* check = ck.check;
  FbwDev d;
  memset(&d, 0, sizeof(d));
  static_cast<FbwProblem&>(d) = p;
  d.state_seq = ck.state_seq;
  d.seq_len = ck.seq_len;
  d.wmin = ck.wmin;
  d.W = ck.W;
  // Emission rows of up to `rows` frames at a time (256 MB at most; at least three frames for the log-space
  // pass's ring): every frame up front when they fit (kept for the backward pass), else chunk by chunk.
  const int64_t max_rows = FBW_MAX_ROW_ELEMENTS / std::max<int64_t>(B * D, 1);
  const int64_t rows = std::max<int64_t>(2, std::min<int64_t>(T, max_rows));
  const bool keep_P = rows >= T;
  d.alpha = scratch.get<double>((T + 1) * S);
  d.csum = scratch.get<double>((T + 1) * B);
  d.beta = scratch.get<double>(3 * S);
  d.dsum = scratch.get<double>(T * B);
  d.zsum = scratch.get<double>(T * B);
  d.G = scratch.get<double>(2 * B * D);
  d.P = scratch.get<double>(std::max<int64_t>(rows, 3) * B * D);
  d.norm = scratch.get<double>(rows * B);
  d.shift = scratch.get<double>(T * B);
  d.nll = scratch.get<double>(B);
  d.end_wmin = scratch.get<double>(B);
  int32_t* live = scratch.get<int32_t>(S);
  d.live = live;

  Ndarray_memset(d.alpha, 0, (T + 1) * S * sizeof(double));
  Ndarray_memset(d.csum, 0, (T + 1) * B * sizeof(double));
  Ndarray_memset(d.dsum, 0, T * B * sizeof(double));
  Ndarray_memset(d.zsum, 0, T * B * sizeof(double));
  Ndarray_memset(d.beta, 0, 3 * S * sizeof(double));
  Ndarray_memset(d.G, 0, 2 * B * D * sizeof(double));
  Ndarray_memset(live, 0, S * sizeof(int32_t));
  start_dev_kernel(fbw_set_start, (B, p.start, d.alpha));
  start_dev_kernel(fbw_mark_live, (E, p.from, p.to, p.n_end, p.end_pairs, p.end_simple, live));
  // Frames [t0, t0 + n) into the emission rows (their shifts into shift, for every frame).
  auto emission_rows = [&](int64_t t0, int64_t n) {
    d.p0 = t0;
    fbw_emission_rows(p.mode, t0, n, B, D, p.am, d.seq_len, d.P, d.shift + t0 * B, d.norm, nan, check);
  };
  if (keep_P) {
    emission_rows(0, T);
    fsa_raise_check(check, p.terms);
  }

  // forward: one launch per frame
  for (int64_t t = 0; t < T; ++t) {
    if (!keep_P && (t < d.p0 || t >= d.p0 + rows || t == 0)) emission_rows(t, std::min(rows, T - t));
    start_dev_kernel(fbw_fwd_step, (d, t));
  }
  start_dev_kernel(fbw_fwd_final, (d, nan, check));
  fsa_raise_check(check, p.terms);

  // backward: one launch per frame, t = T (the start of frame T - 1) .. -1 (the outputs of frame 0)
  for (int64_t t = T; t >= -1; --t) {
    const int64_t hi = std::min(t + 1, T - 1);  // the frames this launch reads: t and t + 1
    if (!keep_P && t < T && (std::max<int64_t>(t, 0) < d.p0 || hi >= d.p0 + rows)) {
      const int64_t t0 = std::max<int64_t>(0, hi - rows + 1);
      emission_rows(t0, hi - t0 + 1);
    }
    start_dev_kernel(fbw_bw_step, (d, t));
  }
  HANDLE_LAST_ERROR();

  // log-space pass over the sequences without a path so far (NaN sequences are not retried)
  int32_t* redo = scratch.get<int32_t>(B);
  int32_t* n_redo_dev = scratch.get<int32_t>(1);
  Ndarray_memset(n_redo_dev, 0, sizeof(int32_t));
  start_dev_kernel(fbl_mark, (B, d.nll, nan, redo, n_redo_dev));
  int32_t n_redo = 0;
  Ndarray_copy_to_host(&n_redo, n_redo_dev, sizeof(int32_t));
  if (n_redo > 0) {
    d.redo = redo;
    d.Q = d.P;
    start_dev_kernel(fsa_fill, ((T + 1) * S, d.alpha, (double)INFINITY));
    start_dev_kernel(fsa_fill, (3 * S, d.beta, (double)INFINITY));
    start_dev_kernel(fsa_fill, (2 * B * D, d.G, (double)INFINITY));
    for (int64_t t = -1; t < T; ++t) start_dev_kernel(fbl_fwd_step, (d, t));
    start_dev_kernel(fbl_final, (d));
    HANDLE_LAST_ERROR();
    for (int64_t t = T; t >= -1; --t) start_dev_kernel(fbl_bw_step, (d, t));
  }
  start_dev_kernel(fbw_nan_out, (T, B, D, d.seq_len, nan, p.out, p.sums, p.loss));
  HANDLE_LAST_ERROR();
}
#endif

#endif  // PTNATIVE_FSA_FSA_BAUM_WELCH_CUDA_H
