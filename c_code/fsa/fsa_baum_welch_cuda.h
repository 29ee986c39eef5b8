// The Baum-Welch passes on CUDA: per frame, two launches over the whole batch forward and two backward
// (fsa_baum_welch.h declares the problem; the CPU schedule is fsa_baum_welch_cpu.h).
#ifndef PTNATIVE_FSA_FSA_BAUM_WELCH_CUDA_H
#define PTNATIVE_FSA_FSA_BAUM_WELCH_CUDA_H

#include "../dialect/kernel.h"

#include "fsa_baum_welch.h"

#if CUDA
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

DEF_KERNEL void fbw_fwd_edges(int64_t t, int64_t n_edges, int64_t n_classes, const int32_t* from, const int32_t* to,
                              const int32_t* emis, const int32_t* seq, const int32_t* seq_len, const int32_t* live,
                              const double* W, const double* P, const double* alpha_t, double* alpha_next, double* c) {
  GRID_LOOP(e, n_edges) {
    int32_t s = seq[e];
    if (t >= seq_len[s] || !live[to[e]]) continue;
    double a = alpha_t[from[e]];
    if (a == 0.0) continue;
    double v = a * W[e] * P[s * n_classes + emis[e]];
    if (v == 0.0) continue;
    elem_atomic_add(alpha_next + to[e], v);
    elem_atomic_add(c + s, v);
  }
}

// One state of frame t: divide by its sequence's normaliser (0 where that is 0).
DEV_FUNC inline void fbw_normalize_state(int64_t t, int64_t q, const int32_t* state_seq, const int32_t* seq_len,
                                         const double* c, double* vec) {
  int32_t s = state_seq[q];
  if (s < 0 || t >= seq_len[s]) return;
  double cs = c[s];
  vec[q] = cs > 0.0 ? vec[q] / cs : 0.0;
}

// Frame t of the forward pass after its edges, in one launch: normalise the states (q < S) by their sequence's
// sum c_cur, and per sequence (S + b) add the frame's -log normaliser to nll and clear c_next for frame t + 1.
DEF_KERNEL void fbw_fwd_finish(int64_t t, int64_t n_states, int64_t n_batch, const int32_t* state_seq,
                               const int32_t* seq_len, const double* c_cur, double* c_next, double* alpha_next,
                               const double* shift, const double* wmin, double* nll) {
  GRID_LOOP(i, n_states + n_batch) {
    if (i < n_states) {
      fbw_normalize_state(t, i, state_seq, seq_len, c_cur, alpha_next);
      continue;
    }
    int64_t b = i - n_states;
    c_next[b] = 0.0;
    if (t >= seq_len[b]) continue;
    double cb = c_cur[b];
    if (cb > 0.0 && wmin[b] < INFINITY)
      nll[b] += shift[b] + wmin[b] - log(cb);
    else
      nll[b] = INFINITY;
  }
}

// After the forward pass: add -log(sum over end states of alpha * exp(-w_end)).
DEF_KERNEL void fbw_fwd_final(int64_t n_batch, int64_t n_states, const int32_t* seq_len, int64_t n_end,
                              const int32_t* end_pairs, const int32_t* end_simple, const Float* end_w,
                              const double* alpha, double* nll, double* end_wmin, int32_t* nan, FsaCheck* check) {
  GRID_LOOP(b, n_batch) {
    const double* a = alpha + (int64_t)seq_len[b] * n_states;
    double wm = INFINITY;
    FSA_END_LOOP(n, b, end_pairs, n_end) {
      double w = fsa_end_weight(end_w, n);
      if (w == -INFINITY) fsa_fail(check, FSA_CHECK_END_WEIGHT_MINUS_INF, 0, n, 0, w);
      if (w != w) nan[b] = 1;
      if (w < wm) wm = w;
    }
    double p = 0.0;
    if (wm < INFINITY) {
      FSA_END_LOOP(n, b, end_pairs, n_end) {
        double w = fsa_end_weight(end_w, n);
        if (w < INFINITY) p += a[fsa_end_state(end_pairs, end_simple, n)] * exp(-(w - wm));
      }
    }
    end_wmin[b] = wm;
    if (p > 0.0 && nll[b] < INFINITY)
      nll[b] += wm - log(p);
    else
      nll[b] = INFINITY;
  }
}

// Backward, frame t, before its edges (the part of frame t + 1's fbw_bw_finish that prepares frame t; launched on its
// own for the last frame): clear beta_cur (q < S); per sequence (S + b) reset frame t's sums, and sequences of length
// t + 1 start here (their end states get the end weights in beta_next).
DEV_FUNC inline void fbw_bw_start_item(int64_t i, int64_t t, int64_t n_states, const int32_t* seq_len, int64_t n_end,
                                       const int32_t* end_pairs, const int32_t* end_simple, const Float* end_w,
                                       const double* end_wmin, double* beta_cur, double* beta_next, double* dsum,
                                       double* zsum) {
  if (i < n_states) {
    beta_cur[i] = 0.0;
    return;
  }
  int64_t b = i - n_states;
  dsum[b] = 0.0;
  zsum[b] = 0.0;
  if (seq_len[b] != t + 1 || !(end_wmin[b] < INFINITY)) return;
  FSA_END_LOOP(n, b, end_pairs, n_end) {
    double w = fsa_end_weight(end_w, n);
    if (w < INFINITY) beta_next[fsa_end_state(end_pairs, end_simple, n)] += exp(-(w - end_wmin[b]));
  }
}

DEF_KERNEL void fbw_bw_start(int64_t t, int64_t n_states, int64_t n_batch, const int32_t* seq_len, int64_t n_end,
                             const int32_t* end_pairs, const int32_t* end_simple, const Float* end_w,
                             const double* end_wmin, double* beta_cur, double* beta_next, double* dsum,
                             double* zsum) {
  GRID_LOOP(i, n_states + n_batch)
    fbw_bw_start_item(i, t, n_states, seq_len, n_end, end_pairs, end_simple, end_w, end_wmin, beta_cur, beta_next,
                      dsum, zsum);
}

DEF_KERNEL void fbw_bw_edges(int64_t t, int64_t n_edges, int64_t n_classes, const int32_t* from, const int32_t* to,
                             const int32_t* emis, const int32_t* seq, const int32_t* seq_len, const double* W,
                             const double* P, const double* alpha_t, const double* beta_next, double* beta_cur,
                             double* G, double* dsum, double* zsum) {
  GRID_LOOP(e, n_edges) {
    int32_t s = seq[e];
    if (t >= seq_len[s]) continue;
    double bn = beta_next[to[e]];
    if (bn == 0.0) continue;
    double pb = W[e] * P[s * n_classes + emis[e]] * bn;
    if (pb == 0.0) continue;
    elem_atomic_add(beta_cur + from[e], pb);
    elem_atomic_add(dsum + s, pb);
    double x = alpha_t[from[e]] * pb;
    if (x != 0.0) {
      elem_atomic_add(zsum + s, x);
      elem_atomic_add(G + s * n_classes + emis[e], x);
    }
  }
}

// Frame t's outputs.  FBW_NEGLOG: out = -log posterior (INF where none), sums = -log p on
// valid frames of sequences with a path, else 0.  FBW_LOGITS / FBW_LOGPROBS: out = d(-log p)/d
// logits = softmax - posterior (resp. -posterior), 0 on padded frames.
// Backward, frame t, after its edges, in one launch: normalise beta_cur (q < S), write the frame's outputs
// (S + b * D + d), and prepare frame t - 1 (fbw_bw_start_item, items from S + B D on) when t > 0.  Frame t's sums
// (dsum, zsum) and frame t - 1's are separate buffers (the caller alternates them); of the two beta rows, frame
// t - 1's beta_cur is frame t's beta_next (no item here reads it), and its beta_next is beta_cur, where only
// sequences of length t (whose states this frame leaves alone) get their end weights.
DEF_KERNEL void fbw_bw_finish(int mode, int64_t t, int64_t n_states, int64_t n_batch, int64_t n_classes,
                              const int32_t* state_seq, const int32_t* seq_len, const double* dsum, double* beta_cur,
                              const double* nll, const double* zsum, const double* P, const double* norm, double* G,
                              Float* out, Float* sums, int64_t n_end, const int32_t* end_pairs,
                              const int32_t* end_simple, const Float* end_w, const double* end_wmin,
                              double* beta_prev_cur, double* dsum_prev, double* zsum_prev) {
  const int64_t n_cells = n_batch * n_classes;
  GRID_LOOP(j, n_states + n_cells + (t > 0 ? n_states + n_batch : 0)) {
    if (j < n_states) {
      fbw_normalize_state(t, j, state_seq, seq_len, dsum, beta_cur);
      continue;
    }
    if (j >= n_states + n_cells) {
      fbw_bw_start_item(j - n_states - n_cells, t - 1, n_states, seq_len, n_end, end_pairs, end_simple, end_w,
                        end_wmin, beta_prev_cur, beta_cur, dsum_prev, zsum_prev);
      continue;
    }
    int64_t i = j - n_states;
    int64_t b = i / n_classes;
    bool valid = t < seq_len[b];
    bool has_path = valid && nll[b] < INFINITY && zsum[b] > 0.0;
    double g = has_path ? G[i] / zsum[b] : 0.0;  // G holds the unnormalised posterior mass
    G[i] = 0.0;
    Float* o = out + t * n_batch * n_classes + i;
    if (mode == FBW_NEGLOG) {
      *o = has_path && g > 0.0 ? (Float)(-log(g)) : (Float)INFINITY;
      if (sums && i % n_classes == 0) sums[t * n_batch + b] = has_path ? (Float)nll[b] : Float(0);
    } else if (!valid) {
      *o = Float(0);
    } else {
      double soft = mode == FBW_LOGITS && norm[b] > 0.0 ? P[i] / norm[b] : 0.0;
      *o = (Float)(soft - (has_path ? g : 0.0));
    }
  }
}

DEF_KERNEL void fbw_loss_out(int64_t n_batch, const double* nll, Float* loss) {
  GRID_LOOP(b, n_batch) loss[b] = (Float)nll[b];
}

// ---- log-space fallback, for sequences whose scaled pass found no path (no path at all,
// or emission / weight ranges beyond double's ~700 nats per frame).
DEF_KERNEL void fbl_mark(int64_t n_batch, const double* nll, const int32_t* nan, int32_t* redo, int32_t* n_redo) {
  GRID_LOOP(b, n_batch) {
    redo[b] = nll[b] < INFINITY || nan[b] ? 0 : 1;
    if (redo[b]) elem_atomic_add(n_redo, 1);
  }
}

// Q[b, d] = -log emission probability of frame t.
DEF_KERNEL void fbl_emissions(int mode, int64_t t, int64_t n_batch, int64_t n_classes, const Float* am,
                              const int32_t* seq_len, const int32_t* redo, double* Q) {
  GRID_LOOP(b, n_batch) {
    if (!redo[b] || t >= seq_len[b]) continue;
    fbl_emission_row(mode, n_classes, am + (t * n_batch + b) * n_classes, Q + b * n_classes);
  }
}

DEF_KERNEL void fbl_fwd_edges(int64_t t, int64_t n_edges, int64_t n_classes, const int32_t* from, const int32_t* to,
                              const int32_t* emis, const int32_t* seq, const int32_t* seq_len, const int32_t* redo,
                              const Float* w, const double* Q, const double* la_t, double* la_next) {
  GRID_LOOP(e, n_edges) {
    int32_t s = seq[e];
    if (!redo[s] || t >= seq_len[s]) continue;
    double a = la_t[from[e]];
    if (a == INFINITY) continue;
    double v = a + (double)w[e] + Q[s * n_classes + emis[e]];
    if (v < INFINITY) fsa_atomic_neglog_add(la_next + to[e], v);
  }
}

DEF_KERNEL void fbl_start(int64_t n_batch, const int32_t* start, const int32_t* redo, double* la0) {
  GRID_LOOP(b, n_batch) if (redo[b]) la0[start[b]] = 0.0;
}

DEF_KERNEL void fbl_final(int64_t n_batch, int64_t n_states, const int32_t* seq_len, const int32_t* redo,
                          int64_t n_end, const int32_t* end_pairs, const int32_t* end_simple, const Float* end_w,
                          const double* la, double* nll) {
  GRID_LOOP(b, n_batch) {
    if (!redo[b]) continue;
    const double* a = la + (int64_t)seq_len[b] * n_states;
    double acc = INFINITY;
    FSA_END_LOOP(n, b, end_pairs, n_end) {
      double v = a[fsa_end_state(end_pairs, end_simple, n)] + fsa_end_weight(end_w, n);
      if (v < INFINITY) acc = fsa_neglog_add(acc, v);
    }
    nll[b] = acc;
  }
}

// Log-space backward, frame t, before its edges (the part of frame t + 1's fbl_bw_out that prepares frame t;
// launched on its own for the last frame): clear lb_cur (q < S); per sequence (S + b) to redo: the end weights of
// sequences of length t + 1 into lb_next, and frame t's emissions Q.
DEV_FUNC inline void fbl_bw_prepare_item(int64_t i, int mode, int64_t t, int64_t n_states, int64_t n_classes,
                                         const Float* am, int64_t n_batch, const int32_t* seq_len, const int32_t* redo,
                                         int64_t n_end, const int32_t* end_pairs, const int32_t* end_simple,
                                         const Float* end_w, double* lb_cur, double* lb_next, double* Q) {
  if (i < n_states) {
    lb_cur[i] = INFINITY;
    return;
  }
  int64_t b = i - n_states;
  if (!redo[b] || t >= seq_len[b]) return;
  fbl_emission_row(mode, n_classes, am + (t * n_batch + b) * n_classes, Q + b * n_classes);
  if (seq_len[b] != t + 1) return;
  FSA_END_LOOP(n, b, end_pairs, n_end) {
    double w = fsa_end_weight(end_w, n);
    if (w < INFINITY) {
      int32_t q = fsa_end_state(end_pairs, end_simple, n);
      lb_next[q] = fsa_neglog_add(lb_next[q], w);
    }
  }
}

DEF_KERNEL void fbl_bw_prepare(int mode, int64_t t, int64_t n_states, int64_t n_classes, const Float* am,
                               int64_t n_batch, const int32_t* seq_len, const int32_t* redo, int64_t n_end,
                               const int32_t* end_pairs, const int32_t* end_simple, const Float* end_w, double* lb_cur,
                               double* lb_next, double* Q) {
  GRID_LOOP(i, n_states + n_batch)
    fbl_bw_prepare_item(i, mode, t, n_states, n_classes, am, n_batch, seq_len, redo, n_end, end_pairs, end_simple,
                        end_w, lb_cur, lb_next, Q);
}

DEF_KERNEL void fbl_bw_edges(int64_t t, int64_t n_edges, int64_t n_classes, const int32_t* from, const int32_t* to,
                             const int32_t* emis, const int32_t* seq, const int32_t* seq_len, const int32_t* redo,
                             const Float* w, const double* Q, const double* nll, const double* la_t,
                             const double* lb_next, double* lb_cur, double* G) {
  GRID_LOOP(e, n_edges) {
    int32_t s = seq[e];
    if (!redo[s] || t >= seq_len[s] || !(nll[s] < INFINITY)) continue;
    double bn = lb_next[to[e]];
    if (bn == INFINITY) continue;
    double pb = (double)w[e] + Q[s * n_classes + emis[e]] + bn;
    if (!(pb < INFINITY)) continue;
    fsa_atomic_neglog_add(lb_cur + from[e], pb);
    double a = la_t[from[e]];
    if (a < INFINITY) fsa_atomic_neglog_add(G + s * n_classes + emis[e], a + pb - nll[s]);
  }
}

// Frame t's outputs in log space (items i < B D), and frame t - 1's preparation (fbl_bw_prepare_item, items from
// B D on) when t > 0: frame t - 1's lb_cur is frame t's lb_next, its lb_next is frame t's lb_cur (where only
// sequences of length t get their end weights), and its emissions go to Q_prev (frame t's are Q).
DEF_KERNEL void fbl_bw_out(int mode, int64_t t, int64_t n_batch, int64_t n_classes, const int32_t* seq_len,
                           const int32_t* redo, const double* nll, const double* Q, double* G, Float* out,
                           Float* sums, int64_t n_states, const Float* am, int64_t n_end, const int32_t* end_pairs,
                           const int32_t* end_simple, const Float* end_w, double* lb_prev_cur, double* lb_cur,
                           double* Q_prev) {
  const int64_t n_cells = n_batch * n_classes;
  GRID_LOOP(i, n_cells + (t > 0 ? n_states + n_batch : 0)) {
    if (i >= n_cells) {
      fbl_bw_prepare_item(i - n_cells, mode, t - 1, n_states, n_classes, am, n_batch, seq_len, redo, n_end,
                          end_pairs, end_simple, end_w, lb_prev_cur, lb_cur, Q_prev);
      continue;
    }
    int64_t b = i / n_classes;
    if (!redo[b]) continue;
    bool valid = t < seq_len[b];
    bool has_path = valid && nll[b] < INFINITY;
    double g = G[i];
    G[i] = INFINITY;
    Float* o = out + t * n_batch * n_classes + i;
    if (mode == FBW_NEGLOG) {
      *o = has_path ? (Float)g : (Float)INFINITY;
      if (sums && i % n_classes == 0) sums[t * n_batch + b] = has_path ? (Float)nll[b] : Float(0);
    } else if (valid) {
      double soft = mode == FBW_LOGITS ? exp(-Q[i]) : 0.0;
      *o = (Float)(soft - (has_path ? exp(-g) : 0.0));
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

// The passes over a checked problem (c: what fbw_run's checks computed).
static void fbw_passes(const FbwProblem& p, ptn::Scratch& scratch, const FbwChecked& ck) {
  const int64_t T = p.T, B = p.B, D = p.D, E = p.E, S = p.S;
  const int32_t *state_seq = ck.state_seq, *seq_len = ck.seq_len;
  int32_t* nan = ck.nan;
  FsaCheck* check = ck.check;
  const double *wmin = ck.wmin, *W = ck.W;
  double* alpha = scratch.get<double>((T + 1) * S);
  double* beta = scratch.get<double>(2 * S);
  // Emission factors of up to `chunk` frames at a time, computed in one launch (256 MB at most): for every frame
  // up front when they all fit (and kept for the backward pass), else chunk by chunk, in each pass.
  const int64_t max_rows = (int64_t)32 * 1024 * 1024 / std::max<int64_t>(B * D, 1);
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(T, max_rows));
  const bool keep_P = chunk >= T;
  double* P_all = scratch.get<double>(std::max<int64_t>(chunk, 2) * B * D);  // two frames for the log-space pass
  double* norm_all = scratch.get<double>(chunk * B);
  double* shift_all = scratch.get<double>(chunk * B);
  double* P = P_all;
  double* G = scratch.get<double>(B * D);
  double* c = scratch.get<double>(2 * B);  // frame t's per-sequence sums at c + (t & 1) * B
  double* nll = scratch.get<double>(B);
  double* end_wmin = scratch.get<double>(B);
  double* dsum = scratch.get<double>(2 * B);  // frame t's at + (t & 1) * B
  double* zsum = scratch.get<double>(2 * B);

  Ndarray_memset(alpha, 0, (T + 1) * S * sizeof(double));
  Ndarray_memset(c, 0, 2 * B * sizeof(double));
  Ndarray_memset(nll, 0, B * sizeof(double));
  Ndarray_memset(G, 0, B * D * sizeof(double));
  start_dev_kernel(fbw_set_start, (B, p.start, alpha));
  int32_t* live = scratch.get<int32_t>(S);
  Ndarray_memset(live, 0, S * sizeof(int32_t));
  start_dev_kernel(fbw_mark_live, (E, p.from, p.to, p.n_end, p.end_pairs, p.end_simple, live));
  if (keep_P) {
    fbw_emission_rows(p.mode, 0, T, B, D, p.am, seq_len, P_all, shift_all, norm_all, nan, check);
    fsa_raise_check(check, p.terms);
  }

  // forward: two launches per frame (and one per chunk of emission rows)
  for (int64_t t = 0; t < T; ++t) {
    double* a_t = alpha + t * S;
    double* a_next = a_t + S;
    const int64_t k = t % chunk;
    if (!keep_P && k == 0)
      fbw_emission_rows(p.mode, t, std::min(chunk, T - t), B, D, p.am, seq_len, P_all, shift_all, norm_all, nan,
                        check);
    P = P_all + k * B * D;
    double* shift = shift_all + k * B;
    double* c_cur = c + (t & 1) * B;
    double* c_next = c + ((t + 1) & 1) * B;
    start_dev_kernel(fbw_fwd_edges, (t, E, D, p.from, p.to, p.emis, p.seq, seq_len, live, W, P, a_t, a_next,
                                     c_cur));
    start_dev_kernel(fbw_fwd_finish, (t, S, B, state_seq, seq_len, c_cur, c_next, a_next, shift, wmin, nll));
  }
  start_dev_kernel(fbw_fwd_final, (B, S, seq_len, p.n_end, p.end_pairs, p.end_simple, p.end_w, alpha, nll, end_wmin,
                                   nan, check));
  fsa_raise_check(check, p.terms);
  if (p.loss) start_dev_kernel(fbw_loss_out, (B, nll, p.loss));

  // backward: two launches per frame (the edges, then the frame's outputs with the next frame's start)
  Ndarray_memset(beta, 0, 2 * S * sizeof(double));
  if (T > 0)
    start_dev_kernel(fbw_bw_start, (T - 1, S, B, seq_len, p.n_end, p.end_pairs, p.end_simple, p.end_w, end_wmin,
                                    beta + ((T - 1) & 1) * S, beta + (T & 1) * S, dsum + ((T - 1) & 1) * B,
                                    zsum + ((T - 1) & 1) * B));
  for (int64_t t = T - 1; t >= 0; --t) {
    double* b_next = beta + ((t + 1) & 1) * S;
    double* b_cur = beta + (t & 1) * S;
    double* ds = dsum + (t & 1) * B;
    double* zs = zsum + (t & 1) * B;
    double* ds_prev = dsum + ((t + 1) & 1) * B;
    double* zs_prev = zsum + ((t + 1) & 1) * B;
    const int64_t k = t % chunk;
    if (!keep_P && (k == chunk - 1 || t == T - 1)) {
      const int64_t t0 = t - k;
      fbw_emission_rows(p.mode, t0, t - t0 + 1, B, D, p.am, seq_len, P_all, shift_all, norm_all, nan, check);
    }
    P = P_all + k * B * D;
    double* norm = norm_all + k * B;
    start_dev_kernel(fbw_bw_edges, (t, E, D, p.from, p.to, p.emis, p.seq, seq_len, W, P, alpha + t * S, b_next, b_cur,
                                    G, ds, zs));
    start_dev_kernel(fbw_bw_finish, (p.mode, t, S, B, D, state_seq, seq_len, ds, b_cur, nll, zs, P, norm, G,
                                     p.out, p.sums, p.n_end, p.end_pairs, p.end_simple, p.end_w, end_wmin, b_next,
                                     ds_prev, zs_prev));
  }
  HANDLE_LAST_ERROR();

  // log-space pass over the sequences without a path so far (NaN sequences are not retried)
  int32_t* redo = scratch.get<int32_t>(B);
  int32_t* n_redo_dev = scratch.get<int32_t>(1);
  Ndarray_memset(n_redo_dev, 0, sizeof(int32_t));
  start_dev_kernel(fbl_mark, (B, nll, nan, redo, n_redo_dev));
  int32_t n_redo = 0;
  Ndarray_copy_to_host(&n_redo, n_redo_dev, sizeof(int32_t));
  if (n_redo > 0) {
    double* la = alpha;
    double* lb = beta;
    P = P_all;
    start_dev_kernel(fsa_fill, ((T + 1) * S, la, (double)INFINITY));
    start_dev_kernel(fsa_fill, (2 * S, lb, (double)INFINITY));
    start_dev_kernel(fsa_fill, (B * D, G, (double)INFINITY));
    start_dev_kernel(fbl_start, (B, p.start, redo, la));
    for (int64_t t = 0; t < T; ++t) {
      start_dev_kernel(fbl_emissions, (p.mode, t, B, D, p.am, seq_len, redo, P));
      start_dev_kernel(fbl_fwd_edges, (t, E, D, p.from, p.to, p.emis, p.seq, seq_len, redo, p.w, P, la + t * S,
                                       la + (t + 1) * S));
    }
    start_dev_kernel(fbl_final, (B, S, seq_len, redo, p.n_end, p.end_pairs, p.end_simple, p.end_w, la, nll));
    HANDLE_LAST_ERROR();
    if (p.loss) start_dev_kernel(fbw_loss_out, (B, nll, p.loss));
    // two launches per frame: the edges, then the frame's outputs with the previous frame's preparation
    double* Q2 = P_all;  // frame t's emissions at Q2 + (t & 1) B D
    if (T > 0)
      start_dev_kernel(fbl_bw_prepare, (p.mode, T - 1, S, D, p.am, B, seq_len, redo, p.n_end, p.end_pairs,
                                        p.end_simple, p.end_w, lb + ((T - 1) & 1) * S, lb + (T & 1) * S,
                                        Q2 + ((T - 1) & 1) * B * D));
    for (int64_t t = T - 1; t >= 0; --t) {
      double* b_next = lb + ((t + 1) & 1) * S;
      double* b_cur = lb + (t & 1) * S;
      double* Q = Q2 + (t & 1) * B * D;
      start_dev_kernel(fbl_bw_edges, (t, E, D, p.from, p.to, p.emis, p.seq, seq_len, redo, p.w, Q, nll, la + t * S,
                                      b_next, b_cur, G));
      start_dev_kernel(fbl_bw_out, (p.mode, t, B, D, seq_len, redo, nll, Q, G, p.out, p.sums, S, p.am, p.n_end,
                                    p.end_pairs, p.end_simple, p.end_w, b_next, b_cur, Q2 + ((t + 1) & 1) * B * D));
    }
  }
  start_dev_kernel(fbw_nan_out, (T, B, D, seq_len, nan, p.out, p.sums, p.loss));
  HANDLE_LAST_ERROR();
}

#endif

#endif  // PTNATIVE_FSA_FSA_BAUM_WELCH_CUDA_H
