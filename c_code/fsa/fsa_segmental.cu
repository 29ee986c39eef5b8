// Segmental Baum-Welch (ptnative.ops.fsa.SegmentFastBaumWelchOp): forward-backward in which each edge consumes a
// segment of 1..L frames, in the -log semiring (double), over an edge list (fsa_automaton.h).
//
// Shapes: am_scores (L, Nb, D) -log score of emitting d over the segment of length i + 1 of column n;
// batch_idxs (F, B) int32: the column of sequence b's segments starting at frame t, or -1; edges (5, E) rows
// (from, to, emission, length model, sequence); weights (E,) -log; length_models (M, L) -log; start_end_states
// (2, B); index (L, Nb) 1 where segment (i, n) is allowed; am_score_scales (K,), epoch (): the emission scores are
// scaled by am_score_scales[min(int(epoch), K - 1)] (seg_scale).
//
// A segment (t, i) of sequence b exists if n = batch_idxs[t, b] >= 0 and index[i, n] != 0; it covers frames
// t .. t + i and scores w_e + scale am[i, n, emission] + length_models[m, i] on edge e.  Sequence b ends at
// F_b = the largest t + i + 1 over its segments.
//   alpha_0(start_b) = 0, alpha_{t+i+1}(q) (+)= alpha_t(p) + score (-log semiring, (+) = -log(e^-x + e^-y)),
//   beta_{F_b}(end_b) = 0, beta_t(p) (+)= score + beta_{t+i+1}(q),
//   nf[i, n] = (+) over edges and t of alpha_t(p) + score + beta_{t+i+1}(q) = -log P(segment (i, n) used, x),
//   out[i, n, d] = (+) over the edges emitting d of (the same) - nf[i, n]  (segmentwise_normalization: nf summed
//   over the allowed lengths of column n first).
// Outputs: output (L, Nb, D) (inf where unused), normalization_factors (L, Nb) (0 where unused), posterior_weigths
// (L, Nb) = exp(-(nf - (-log p(x)))).
#include "../dialect/kernel.h"

#include "fsa_automaton.h"

DEV_FUNC inline double seg_scale(const Float* scales, int64_t n_scales, const Float* epoch) {
  double ep = (double)epoch[0];
  int64_t k = ep > 0.0 ? (int64_t)ep : 0;
  if (k > n_scales - 1) k = n_scales - 1;
  return (double)scales[k];
}

// The column where the segments of edge e start at frame t: batch_idxs of the edge's sequence (-1: none).
DEV_FUNC inline int32_t seg_column(int64_t t, int64_t e, int64_t n_edges, int64_t n_batch, const int32_t* edges,
                                   const int32_t* bidx) {
  return bidx[t * n_batch + edges[4 * n_edges + e]];
}

// max state index + 1 over edges and start/end states (single thread), and index checks.
DEF_KERNEL void seg_check(int64_t n_edges, const int32_t* edges, int64_t n_classes, int64_t n_lenmods,
                          int64_t n_batch, const int32_t* start_end, int32_t* n_states) {
  GRID_LOOP(i, 1) {
    int32_t m = -1;
    for (int64_t e = 0; e < n_edges; ++e) {
      int32_t edge_from_state = edges[e], edge_to_state = edges[n_edges + e], edge_emission = edges[2 * n_edges + e];
      int32_t edge_length_model = edges[3 * n_edges + e], edge_seq = edges[4 * n_edges + e];
      assert_cmp(edge_from_state, >=, 0);
      assert_cmp(edge_to_state, >=, 0);
      assert_cmp(edge_emission, >=, 0);
      assert_cmp(edge_emission, <, n_classes);
      assert_cmp(edge_length_model, >=, 0);
      assert_cmp(edge_length_model, <, n_lenmods);
      assert_cmp(edge_seq, >=, 0);
      assert_cmp(edge_seq, <, n_batch);
      m = std::max(m, std::max(edge_from_state, edge_to_state));
    }
    for (int64_t b = 0; b < 2 * n_batch; ++b) {
      int32_t start_or_end_state = start_end[b];
      assert_cmp(start_or_end_state, >=, 0);
      m = std::max(m, start_or_end_state);
    }
    n_states[0] = m + 1;
  }
}

// Column owners, and the length of every sequence.
DEF_KERNEL void seg_columns(int64_t n_frames, int64_t n_batch, int64_t max_len, int64_t n_cols, const int32_t* bidx,
                            const Float* index, int32_t* col_seq, int32_t* col_t, int32_t* seq_len) {
  GRID_LOOP(b, n_batch) {
    int32_t len = 0;
    for (int64_t t = 0; t < n_frames; ++t) {
      int32_t column = bidx[t * n_batch + b];
      assert_cmp(column, >=, -1);
      assert_cmp(column, <, n_cols);
      if (column < 0) continue;
      int32_t seq_owning_column = elem_atomic_cas(col_seq + column, (int32_t)-1, (int32_t)b);
      bool column_used_once = seq_owning_column == -1;
      assert_cmp(column_used_once, ==, true);
      col_t[column] = (int32_t)t;
      for (int64_t i = 0; i < max_len && t + i + 1 <= n_frames; ++i)
        if (index[i * n_cols + column] != Float(0) && t + i + 1 > len) len = (int32_t)(t + i + 1);
    }
    seq_len[b] = len;
  }
}

DEF_KERNEL void seg_fwd(int64_t t, int64_t n_frames, int64_t n_edges, int64_t n_states, int64_t n_batch,
                        int64_t max_len, int64_t n_cols, int64_t n_classes, const int32_t* edges, const Float* w,
                        const Float* am, const Float* lenmod, const int32_t* bidx, const Float* index,
                        const Float* scales, int64_t n_scales, const Float* epoch, double* alpha) {
  GRID_LOOP(e, n_edges) {
    double a = alpha[t * n_states + edges[e]];
    if (a == INFINITY) continue;
    int32_t n = seg_column(t, e, n_edges, n_batch, edges, bidx);
    if (n < 0) continue;
    double scale = seg_scale(scales, n_scales, epoch);
    double base = a + (double)w[e];
    int32_t to = edges[n_edges + e], emis = edges[2 * n_edges + e], lm = edges[3 * n_edges + e];
    for (int64_t i = 0; i < max_len && t + i + 1 <= n_frames; ++i) {
      if (index[i * n_cols + n] == Float(0)) continue;
      double v = base + scale * (double)am[(i * n_cols + n) * n_classes + emis] + (double)lenmod[lm * max_len + i];
      if (!(v < INFINITY)) continue;
      fsa_atomic_neglog_add(alpha + (t + i + 1) * n_states + to, v);
    }
  }
}

DEF_KERNEL void seg_bwd(int64_t t, int64_t n_frames, int64_t n_edges, int64_t n_states, int64_t n_batch,
                        int64_t max_len, int64_t n_cols, int64_t n_classes, const int32_t* edges, const Float* w,
                        const Float* am, const Float* lenmod, const int32_t* bidx, const Float* index,
                        const Float* scales, int64_t n_scales, const Float* epoch, double* beta) {
  GRID_LOOP(e, n_edges) {
    int32_t n = seg_column(t, e, n_edges, n_batch, edges, bidx);
    if (n < 0) continue;
    double scale = seg_scale(scales, n_scales, epoch);
    int32_t from = edges[e], to = edges[n_edges + e], emis = edges[2 * n_edges + e], lm = edges[3 * n_edges + e];
    double acc = INFINITY;
    for (int64_t i = 0; i < max_len && t + i + 1 <= n_frames; ++i) {
      if (index[i * n_cols + n] == Float(0)) continue;
      double bn = beta[(t + i + 1) * n_states + to];
      if (bn == INFINITY) continue;
      double v = bn + (double)w[e] + scale * (double)am[(i * n_cols + n) * n_classes + emis] +
                 (double)lenmod[lm * max_len + i];
      if (v < INFINITY) acc = fsa_neglog_add(acc, v);
    }
    if (acc < INFINITY) fsa_atomic_neglog_add(beta + t * n_states + from, acc);
  }
}

DEF_KERNEL void seg_set_ends(int64_t n_batch, int64_t n_states, const int32_t* start_end, const int32_t* seq_len,
                             double* alpha, double* beta) {
  GRID_LOOP(b, n_batch) {
    alpha[start_end[b]] = 0.0;
    beta[(int64_t)seq_len[b] * n_states + start_end[n_batch + b]] = 0.0;
  }
}

// pass 0: nf[i, n] (+)= xi; pass 1: out[i, n, emis] (+)= xi - nf[i, n]   (-log semiring)
DEF_KERNEL void seg_post(int pass, int64_t n_frames, int64_t n_edges, int64_t n_states, int64_t n_batch,
                         int64_t max_len, int64_t n_cols, int64_t n_classes, const int32_t* edges, const Float* w,
                         const Float* am, const Float* lenmod, const int32_t* bidx, const Float* index,
                         const Float* scales, int64_t n_scales, const Float* epoch, const double* alpha,
                         const double* beta, double* nf, double* out) {
  GRID_LOOP(idx, n_frames * n_edges) {
    int64_t t = idx / n_edges, e = idx - t * n_edges;
    double a = alpha[t * n_states + edges[e]];
    if (a == INFINITY) continue;
    int32_t n = seg_column(t, e, n_edges, n_batch, edges, bidx);
    if (n < 0) continue;
    double scale = seg_scale(scales, n_scales, epoch);
    int32_t to = edges[n_edges + e], emis = edges[2 * n_edges + e], lm = edges[3 * n_edges + e];
    for (int64_t i = 0; i < max_len && t + i + 1 <= n_frames; ++i) {
      if (index[i * n_cols + n] == Float(0)) continue;
      double bn = beta[(t + i + 1) * n_states + to];
      if (bn == INFINITY) continue;
      double v = a + (double)w[e] + scale * (double)am[(i * n_cols + n) * n_classes + emis] +
                 (double)lenmod[lm * max_len + i] + bn;
      if (!(v < INFINITY)) continue;
      if (pass == 0)
        fsa_atomic_neglog_add(nf + i * n_cols + n, v);
      else
        fsa_atomic_neglog_add(out + (i * n_cols + n) * n_classes + emis, v - nf[i * n_cols + n]);
    }
  }
}

DEF_KERNEL void seg_merge(int64_t max_len, int64_t n_cols, const Float* index, double* nf) {
  GRID_LOOP(n, n_cols) {
    double acc = INFINITY;
    for (int64_t i = 0; i < max_len; ++i)
      if (index[i * n_cols + n] != Float(0)) acc = fsa_neglog_add(acc, nf[i * n_cols + n]);
    for (int64_t i = 0; i < max_len; ++i)
      if (index[i * n_cols + n] != Float(0)) nf[i * n_cols + n] = acc;
  }
}

DEF_KERNEL void seg_finish(int64_t max_len, int64_t n_cols, int64_t n_classes, int64_t n_states, int64_t n_batch,
                           const int32_t* col_seq, const int32_t* start_end, const double* beta, const double* nf,
                           const double* out_acc, Float* out, Float* nf_out, Float* pw_out) {
  GRID_LOOP(idx, max_len * n_cols) {
    int32_t s = col_seq[idx % n_cols];
    double nll = s >= 0 ? beta[start_end[s]] : INFINITY;
    double f = nf[idx];
    bool used = f < INFINITY && nll < INFINITY;
    nf_out[idx] = used ? (Float)f : Float(0);
    pw_out[idx] = used ? (Float)exp(-(f - nll)) : Float(0);
    for (int64_t d = 0; d < n_classes; ++d) out[idx * n_classes + d] = used ? (Float)out_acc[idx * n_classes + d]
                                                                            : (Float)INFINITY;
  }
}

// inputs: am_scores (L,Nb,D), batch_idxs (F,B), edges (5,E), weights (E), length_models (M,L),
//         start_end_states (2,B), index (L,Nb), am_score_scales (K), epoch ()
// outputs: output (L,Nb,D), normalization_factors (L,Nb), posterior_weigths (L,Nb)
static void segment_fast_bw_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs,
                               bool segmentwise_normalization) {
  assert_cmp(n_inputs, ==, 9);
  assert_cmp(n_outputs, ==, 3);
  Ndarray *am = inputs[0], *bidx = inputs[1], *edges = inputs[2], *weights = inputs[3], *lenmod = inputs[4],
          *se = inputs[5], *index = inputs[6], *scales = inputs[7], *epoch = inputs[8];
  const int64_t L = Ndarray_DIMS(am)[0], Nb = Ndarray_DIMS(am)[1], D = Ndarray_DIMS(am)[2];
  const int64_t F = Ndarray_DIMS(bidx)[0], B = Ndarray_DIMS(bidx)[1];
  const int64_t E = Ndarray_DIMS(edges)[1], M = Ndarray_DIMS(lenmod)[0], K = Ndarray_DIMS(scales)[0];
  assert_cmp(Ndarray_DIMS(edges)[0], ==, 5);
  assert_cmp(Ndarray_DIMS(weights)[0], ==, E);
  assert_cmp(Ndarray_DIMS(lenmod)[1], ==, L);
  assert_cmp(Ndarray_DIMS(se)[0], ==, 2);
  assert_cmp(Ndarray_DIMS(se)[1], ==, B);
  assert_cmp(Ndarray_DIMS(index)[0], ==, L);
  assert_cmp(Ndarray_DIMS(index)[1], ==, Nb);
  assert_cmp(K, >=, 1);
  Float* out = Ndarray_DEV_DATA(*outputs[0]);
  ptn::Scratch scratch;
  int32_t* n_states_dev = scratch.get<int32_t>(1);
  const int32_t* e = Ndarray_DEV_DATA_int32(edges);
  const int32_t* start_end = Ndarray_DEV_DATA_int32(se);
  start_dev_kernel(seg_check, (E, e, D, M, B, start_end, n_states_dev));
  HANDLE_LAST_ERROR();
  int32_t n_states_host = 0;
  Ndarray_copy_to_host(&n_states_host, n_states_dev, sizeof(int32_t));
  const int64_t S = n_states_host;
  int32_t* col_seq = scratch.get<int32_t>(Nb);
  int32_t* col_t = scratch.get<int32_t>(Nb);
  int32_t* seq_len = scratch.get<int32_t>(B);
  Ndarray_memset(col_seq, 255, Nb * sizeof(int32_t));
  const Float* idx = Ndarray_DEV_DATA(index);
  start_dev_kernel(seg_columns, (F, B, L, Nb, Ndarray_DEV_DATA_int32(bidx), idx, col_seq, col_t, seq_len));
  HANDLE_LAST_ERROR();
  double* alpha = scratch.get<double>((F + 1) * S);
  double* beta = scratch.get<double>((F + 1) * S);
  double* nf = scratch.get<double>(L * Nb);
  double* out_acc = scratch.get<double>(L * Nb * D);
  start_dev_kernel(fsa_fill, ((F + 1) * S, alpha, (double)INFINITY));
  start_dev_kernel(fsa_fill, ((F + 1) * S, beta, (double)INFINITY));
  start_dev_kernel(fsa_fill, (L * Nb, nf, (double)INFINITY));
  start_dev_kernel(fsa_fill, (L * Nb * D, out_acc, (double)INFINITY));
  start_dev_kernel(seg_set_ends, (B, S, start_end, seq_len, alpha, beta));
  const int32_t* bi = Ndarray_DEV_DATA_int32(bidx);
  const Float *a = Ndarray_DEV_DATA(am), *w = Ndarray_DEV_DATA(weights), *lm = Ndarray_DEV_DATA(lenmod);
  const Float *sc = Ndarray_DEV_DATA(scales), *ep = Ndarray_DEV_DATA(epoch);
  for (int64_t t = 0; t < F; ++t)
    start_dev_kernel(seg_fwd, (t, F, E, S, B, L, Nb, D, e, w, a, lm, bi, idx, sc, K, ep, alpha));
  for (int64_t t = F - 1; t >= 0; --t)
    start_dev_kernel(seg_bwd, (t, F, E, S, B, L, Nb, D, e, w, a, lm, bi, idx, sc, K, ep, beta));
  start_dev_kernel(seg_post, (0, F, E, S, B, L, Nb, D, e, w, a, lm, bi, idx, sc, K, ep, alpha, beta, nf, out_acc));
  if (segmentwise_normalization) start_dev_kernel(seg_merge, (L, Nb, idx, nf));
  start_dev_kernel(seg_post, (1, F, E, S, B, L, Nb, D, e, w, a, lm, bi, idx, sc, K, ep, alpha, beta, nf, out_acc));
  start_dev_kernel(seg_finish, (L, Nb, D, S, B, col_seq, start_end, beta, nf, out_acc, out,
                                Ndarray_DEV_DATA(*outputs[1]), Ndarray_DEV_DATA(*outputs[2])));
  HANDLE_LAST_ERROR();
}
