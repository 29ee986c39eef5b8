// Sequence models on automata: Baum-Welch (forward-backward) over an edge list,
// Viterbi, the CTC automaton, a fused CTC loss, and segmental Baum-Welch.
//
// Edge list layout (FastBaumWelch / Viterbi): `edges` (4, E) int32 with rows
// (from state, to state, emission index, sequence index); states are global
// indices into one state space shared by the whole batch, each state belonging
// to one sequence.  Every edge consumes exactly one frame.
//
// Baum-Welch runs in probability space with per-frame scaling, in double:
// emissions are exp(-(score - min score of the frame)), edge weights
// exp(-(w - min w of the sequence)); the forward and backward vectors are
// renormalised per sequence and frame, the log-scales are accumulated.  This
// is exact (no log-add approximations), and its dynamic range per frame is
// that of double (~700 nats between the best and a competing path at one
// frame), while -log p itself may take any magnitude; sequences for which the
// scaled pass finds no path are recomputed in log space (so extreme score
// ranges stay exact).  Viterbi and the segmental op run in log space.

// Threads per block of the kernels that reduce over a row (a power of two; one on the CPU).
#if CUDA
#define FSA_ROW_THREADS 128
#else
#define FSA_ROW_THREADS 1
#endif

// fsa_exp, FsaCheck, fsa_mask_lengths, FsaTerms: c_code/fsa_common.cu, pasted before this file.
//
// NaN: a NaN score on a valid frame of sequence b (or a NaN weight of one of its edges) makes every output of b
// NaN (its loss, its -log posteriors / gradient on its valid frames, its sums); the other sequences are
// computed as usual.  The passes themselves treat NaN as impossible, and the NaN is written at the end.

// ---------------------------------------------------------------- atomics
#if CUDA
DEV_FUNC inline void fsa_atomic_max(float* p, float v) {
  int* ip = (int*)p;
  int old = *ip;
  while (v > __int_as_float(old)) {
    int assumed = old;
    old = atomicCAS(ip, assumed, __float_as_int(v));
    if (old == assumed) break;
  }
}
DEV_FUNC inline void fsa_atomic_max(double* p, double v) {
  unsigned long long* ip = (unsigned long long*)p;
  unsigned long long old = *ip;
  while (v > __longlong_as_double(old)) {
    unsigned long long assumed = old;
    old = atomicCAS(ip, assumed, (unsigned long long)__double_as_longlong(v));
    if (old == assumed) break;
  }
}
DEV_FUNC inline void fsa_atomic_min(double* p, double v) {
  unsigned long long* ip = (unsigned long long*)p;
  unsigned long long old = *ip;
  while (v < __longlong_as_double(old)) {
    unsigned long long assumed = old;
    old = atomicCAS(ip, assumed, (unsigned long long)__double_as_longlong(v));
    if (old == assumed) break;
  }
}
#else
template <typename T> inline void fsa_atomic_max(T* p, T v) { if (v > *p) *p = v; }
template <typename T> inline void fsa_atomic_min(T* p, T v) { if (v < *p) *p = v; }
#endif

// -log(exp(-a) + exp(-b)), with +inf as the zero.
DEV_FUNC inline double fsa_neglog_add(double a, double b) {
  if (a == INFINITY) return b;
  if (b == INFINITY) return a;
  double m = a < b ? a : b, d = a < b ? b - a : a - b;
  return m - log1p(exp(-d));
}

#if CUDA
DEV_FUNC inline void fsa_atomic_neglog_add(double* p, double v) {
  if (v == INFINITY) return;
  unsigned long long* ip = (unsigned long long*)p;
  unsigned long long old = *ip;
  while (true) {
    unsigned long long assumed = old;
    double nv = fsa_neglog_add(__longlong_as_double(assumed), v);
    old = atomicCAS(ip, assumed, (unsigned long long)__double_as_longlong(nv));
    if (old == assumed) break;
  }
}
#else
inline void fsa_atomic_neglog_add(double* p, double v) { *p = fsa_neglog_add(*p, v); }
#endif

// ---------------------------------------------------------------- validation
// Claim state q for sequence s; a state used by two sequences is an error.
DEV_FUNC inline int32_t fsa_claim(int32_t* state_seq, int32_t q, int32_t s) {
  int32_t old = elem_atomic_cas(state_seq + q, (int32_t)-1, s);
  return old == -1 ? s : old;
}

DEF_KERNEL void fsa_check_edges(int64_t n_edges, const int32_t* from, const int32_t* to, const int32_t* emis,
                                const int32_t* seq, int64_t n_states, int64_t n_classes, int64_t n_batch,
                                int32_t* state_seq, FsaCheck* check) {
  GRID_LOOP(e, n_edges) {
    int32_t f = from[e], q = to[e], em = emis[e], s = seq[e];
    if (f < 0 || f >= n_states) { fsa_fail(check, FSA_CHECK_EDGE_STATE, 0, e, 0, f); continue; }
    if (q < 0 || q >= n_states) { fsa_fail(check, FSA_CHECK_EDGE_STATE, 1, e, 0, q); continue; }
    if (em < 0 || em >= n_classes) { fsa_fail(check, FSA_CHECK_EDGE_EMISSION, 2, e, 0, em); continue; }
    if (s < 0 || s >= n_batch) { fsa_fail(check, FSA_CHECK_EDGE_SEQ, 3, e, 0, s); continue; }
    if (state_seq) {
      int32_t owner = fsa_claim(state_seq, f, s);
      if (owner != s) { fsa_fail(check, FSA_CHECK_SHARED_STATE, f, owner, s, 0); continue; }
      owner = fsa_claim(state_seq, q, s);
      if (owner != s) fsa_fail(check, FSA_CHECK_SHARED_STATE, q, owner, s, 0);
    }
  }
}

// Per sequence: the start state, and the length from a 0/1 prefix mask (index) or from lengths.
DEF_KERNEL void fsa_check_seqs(int64_t n_time, int64_t n_batch, const int32_t* start_states, int64_t n_states,
                               const Float* index, const int32_t* lens_in, int32_t* seq_len, int32_t* state_seq,
                               FsaCheck* check) {
  GRID_LOOP(b, n_batch) {
    seq_len[b] = 0;
    int32_t start_state = start_states[b];
    if (start_state < 0 || start_state >= n_states) {
      fsa_fail(check, FSA_CHECK_START_STATE, 0, b, 0, start_state);
      continue;
    }
    if (state_seq) {
      int32_t owner = fsa_claim(state_seq, start_state, (int32_t)b);
      if (owner != (int32_t)b) fsa_fail(check, FSA_CHECK_SHARED_STATE, start_state, owner, b, 0);
    }
    if (index) {
      seq_len[b] = fsa_mask_length(n_time, n_batch, index, b, check);
    } else {
      int32_t len = lens_in[b];
      if (len < 0 || len > n_time)
        fsa_fail(check, FSA_CHECK_LEN, 0, b, 0, len);
      else
        seq_len[b] = len;
    }
  }
}

// End states: `pairs` (n, 2) = (sequence, state), or `simple` (B,) = the end state of sequence n.
DEV_FUNC inline int32_t fsa_end_seq(const int32_t* pairs, int64_t n) { return pairs ? pairs[2 * n] : (int32_t)n; }
DEV_FUNC inline int32_t fsa_end_state(const int32_t* pairs, const int32_t* simple, int64_t n) {
  return pairs ? pairs[2 * n + 1] : simple[n];
}

DEF_KERNEL void fsa_check_ends(int64_t n_end, const int32_t* pairs, const int32_t* simple, int64_t n_states,
                               int64_t n_batch, int32_t* state_seq, FsaCheck* check) {
  GRID_LOOP(n, n_end) {
    int32_t end_seq = fsa_end_seq(pairs, n), end_state = fsa_end_state(pairs, simple, n);
    if (end_seq < 0 || end_seq >= n_batch) { fsa_fail(check, FSA_CHECK_END_SEQ, 0, n, 0, end_seq); continue; }
    if (end_state < 0 || end_state >= n_states) {
      fsa_fail(check, FSA_CHECK_END_STATE, pairs ? 1 : 0, n, 0, end_state);
      continue;
    }
    if (state_seq) {
      int32_t owner = fsa_claim(state_seq, end_state, end_seq);
      if (owner != end_seq) fsa_fail(check, FSA_CHECK_SHARED_STATE, end_state, owner, end_seq, 0);
    }
  }
}

// ---------------------------------------------------------------- Baum-Welch core
enum { FBW_NEGLOG = 0, FBW_LOGITS = 1, FBW_LOGPROBS = 2 };

// wmin[s] = the smallest finite weight of sequence s; NaN weights mark their sequence in `nan`.
DEF_KERNEL void fbw_init_weights(int64_t n_edges, const int32_t* seq, const Float* w, double* wmin, int32_t* nan,
                                 FsaCheck* check) {
  GRID_LOOP(e, n_edges) {
    double v = (double)w[e];
    if (v == -INFINITY) fsa_fail(check, FSA_CHECK_WEIGHT_MINUS_INF, 0, e, 0, v);
    if (v != v) nan[seq[e]] = 1;
    if (v < INFINITY) fsa_atomic_min(wmin + seq[e], v);
  }
}

DEF_KERNEL void fbw_weights(int64_t n_edges, const int32_t* seq, const Float* w, const double* wmin, double* W) {
  GRID_LOOP(e, n_edges) {
    double v = (double)w[e];
    W[e] = v < INFINITY ? exp(-(v - wmin[seq[e]])) : 0.0;
  }
}

DEF_KERNEL void fbw_fill(int64_t n, double* p, double v) {
  GRID_LOOP(i, n) p[i] = v;
}

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
    int64_t n0 = end_pairs ? 0 : b, n1 = end_pairs ? n_end : b + 1;
    double wm = INFINITY;
    for (int64_t n = n0; n < n1; ++n) {
      if (fsa_end_seq(end_pairs, n) != b) continue;
      double w = end_w ? (double)end_w[n] : 0.0;
      if (w == -INFINITY) fsa_fail(check, FSA_CHECK_END_WEIGHT_MINUS_INF, 0, n, 0, w);
      if (w != w) nan[b] = 1;
      if (w < wm) wm = w;
    }
    double p = 0.0;
    if (wm < INFINITY) {
      for (int64_t n = n0; n < n1; ++n) {
        if (fsa_end_seq(end_pairs, n) != b) continue;
        double w = end_w ? (double)end_w[n] : 0.0;
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

// Backward, frame t, before its edges: clear beta_cur (q < S); per sequence (S + b) reset the sums, and
// sequences of length t + 1 start here (their end states get the end weights in beta_next).
DEF_KERNEL void fbw_bw_start(int64_t t, int64_t n_states, int64_t n_batch, const int32_t* seq_len, int64_t n_end,
                             const int32_t* end_pairs, const int32_t* end_simple, const Float* end_w,
                             const double* end_wmin, double* beta_cur, double* beta_next, double* dsum,
                             double* zsum) {
  GRID_LOOP(i, n_states + n_batch) {
    if (i < n_states) {
      beta_cur[i] = 0.0;
      continue;
    }
    int64_t b = i - n_states;
    dsum[b] = 0.0;
    zsum[b] = 0.0;
    if (seq_len[b] != t + 1 || !(end_wmin[b] < INFINITY)) continue;
    int64_t n0 = end_pairs ? 0 : b, n1 = end_pairs ? n_end : b + 1;
    for (int64_t n = n0; n < n1; ++n) {
      if (fsa_end_seq(end_pairs, n) != b) continue;
      double w = end_w ? (double)end_w[n] : 0.0;
      if (w < INFINITY) beta_next[fsa_end_state(end_pairs, end_simple, n)] += exp(-(w - end_wmin[b]));
    }
  }
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
// Backward, frame t, after its edges, in one launch: normalise beta_cur (q < S) and write the frame's outputs
// (S + b * D + d).
DEF_KERNEL void fbw_bw_finish(int mode, int64_t t, int64_t n_states, int64_t n_batch, int64_t n_classes,
                              const int32_t* state_seq, const int32_t* seq_len, const double* dsum, double* beta_cur,
                              const double* nll, const double* zsum, const double* P, const double* norm, double* G,
                              Float* out, Float* sums) {
  GRID_LOOP(j, n_states + n_batch * n_classes) {
    if (j < n_states) {
      fbw_normalize_state(t, j, state_seq, seq_len, dsum, beta_cur);
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
    const Float* row = am + (t * n_batch + b) * n_classes;
    double sign = mode == FBW_NEGLOG ? 1.0 : -1.0;
    double m = INFINITY, lse = 0.0;
    for (int64_t d = 0; d < n_classes; ++d) {
      double a = sign * (double)row[d];
      if (a < m) m = a;
    }
    if (mode == FBW_LOGITS && m < INFINITY) {
      double sum = 0.0;
      for (int64_t d = 0; d < n_classes; ++d) {
        double a = sign * (double)row[d];
        if (a < INFINITY) sum += exp(-(a - m));
      }
      lse = m - log(sum);  // -log sum exp(-a)
    }
    for (int64_t d = 0; d < n_classes; ++d) {
      double a = sign * (double)row[d];
      Q[b * n_classes + d] = a < INFINITY ? a - lse : INFINITY;
    }
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
    int64_t n0 = end_pairs ? 0 : b, n1 = end_pairs ? n_end : b + 1;
    double acc = INFINITY;
    for (int64_t n = n0; n < n1; ++n) {
      if (fsa_end_seq(end_pairs, n) != b) continue;
      double w = end_w ? (double)end_w[n] : 0.0;
      double v = a[fsa_end_state(end_pairs, end_simple, n)] + w;
      if (v < INFINITY) acc = fsa_neglog_add(acc, v);
    }
    nll[b] = acc;
  }
}

DEF_KERNEL void fbl_bw_init(int64_t t, int64_t n_batch, const int32_t* seq_len, const int32_t* redo, int64_t n_end,
                            const int32_t* end_pairs, const int32_t* end_simple, const Float* end_w,
                            double* lb_next) {
  GRID_LOOP(b, n_batch) {
    if (!redo[b] || seq_len[b] != t + 1) continue;
    int64_t n0 = end_pairs ? 0 : b, n1 = end_pairs ? n_end : b + 1;
    for (int64_t n = n0; n < n1; ++n) {
      if (fsa_end_seq(end_pairs, n) != b) continue;
      double w = end_w ? (double)end_w[n] : 0.0;
      if (w < INFINITY) {
        int32_t q = fsa_end_state(end_pairs, end_simple, n);
        lb_next[q] = fsa_neglog_add(lb_next[q], w);
      }
    }
  }
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

DEF_KERNEL void fbl_bw_out(int mode, int64_t t, int64_t n_batch, int64_t n_classes, const int32_t* seq_len,
                           const int32_t* redo, const double* nll, const double* Q, double* G, Float* out,
                           Float* sums) {
  GRID_LOOP(i, n_batch * n_classes) {
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

struct FbwProblem {
  int mode;
  int64_t T, B, D, E, S;
  const Float* am;
  const int32_t *from, *to, *emis, *seq;
  const Float* w;
  const int32_t* start;
  int64_t n_end;
  const int32_t* end_pairs;   // (n_end, 2) or null
  const int32_t* end_simple;  // (B,) when end_pairs is null
  const Float* end_w;         // (n_end,) or null (all 0)
  const Float* index;         // (T, B) prefix mask, or null
  const int32_t* lens;        // (B,) lengths when index is null
  Float* out;                 // (T, B, D)
  Float* sums;                // (T, B) or null
  Float* loss;                // (B,) or null
  FsaTerms terms;             // the caller's names, for the messages of failed checks
};

static void fbw_run(FbwProblem p) {
  ptn::Scratch scratch;
  const int64_t T = p.T, B = p.B, D = p.D, E = p.E, S = p.S;
  p.terms.T = T;
  p.terms.B = B;
  p.terms.D = D;
  p.terms.S = S;
  int32_t* state_seq = scratch.get<int32_t>(S);
  int32_t* seq_len = scratch.get<int32_t>(B);
  int32_t* nan = scratch.get<int32_t>(B);
  FsaCheck* check = scratch.get<FsaCheck>(1);
  Ndarray_memset(state_seq, 255, S * sizeof(int32_t));
  Ndarray_memset(nan, 0, B * sizeof(int32_t));
  Ndarray_memset(check, 0, sizeof(FsaCheck));
  start_dev_kernel(fsa_check_edges, (E, p.from, p.to, p.emis, p.seq, S, D, B, state_seq, check));
  start_dev_kernel(fsa_check_seqs, (T, B, p.start, S, p.index, p.lens, seq_len, state_seq, check));
  start_dev_kernel(fsa_check_ends, (p.n_end, p.end_pairs, p.end_simple, S, B, state_seq, check));
  fsa_raise_check(check, p.terms);
  if (B == 0) return;

  double* wmin = scratch.get<double>(B);
  double* W = scratch.get<double>(E);
  double* alpha = scratch.get<double>((T + 1) * S);
  double* beta = scratch.get<double>(2 * S);
  // Emission factors of every frame are computed up front and kept for the backward pass when they fit in
  // 256 MB; else frame by frame, twice.
  const bool keep_P = T * B * D <= (int64_t)32 * 1024 * 1024;
  double* P_all = scratch.get<double>(keep_P ? T * B * D : B * D);
  double* norm_all = scratch.get<double>(keep_P ? T * B : B);
  double* shift_all = scratch.get<double>(keep_P ? T * B : B);
  double* P = P_all;
  double* G = scratch.get<double>(B * D);
  double* c = scratch.get<double>(2 * B);  // frame t's per-sequence sums at c + (t & 1) * B
  double* nll = scratch.get<double>(B);
  double* end_wmin = scratch.get<double>(B);
  double* dsum = scratch.get<double>(B);
  double* zsum = scratch.get<double>(B);

  start_dev_kernel(fbw_fill, (B, wmin, (double)INFINITY));
  start_dev_kernel(fbw_init_weights, (E, p.seq, p.w, wmin, nan, check));
  fsa_raise_check(check, p.terms);
  start_dev_kernel(fbw_weights, (E, p.seq, p.w, wmin, W));
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

  // forward
  for (int64_t t = 0; t < T; ++t) {
    double* a_t = alpha + t * S;
    double* a_next = a_t + S;
    P = keep_P ? P_all + t * B * D : P_all;
    double* shift = keep_P ? shift_all + t * B : shift_all;
    if (!keep_P) fbw_emission_rows(p.mode, t, 1, B, D, p.am, seq_len, P, shift, norm_all, nan, check);
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

  // backward
  Ndarray_memset(beta, 0, 2 * S * sizeof(double));
  for (int64_t t = T - 1; t >= 0; --t) {
    double* b_next = beta + ((t + 1) & 1) * S;
    double* b_cur = beta + (t & 1) * S;
    start_dev_kernel(fbw_bw_start, (t, S, B, seq_len, p.n_end, p.end_pairs, p.end_simple, p.end_w, end_wmin, b_cur,
                                    b_next, dsum, zsum));
    P = keep_P ? P_all + t * B * D : P_all;
    double* norm = keep_P ? norm_all + t * B : norm_all;
    if (!keep_P) fbw_emission_rows(p.mode, t, 1, B, D, p.am, seq_len, P, shift_all, norm, nan, check);
    start_dev_kernel(fbw_bw_edges, (t, E, D, p.from, p.to, p.emis, p.seq, seq_len, W, P, alpha + t * S, b_next, b_cur,
                                    G, dsum, zsum));
    start_dev_kernel(fbw_bw_finish, (p.mode, t, S, B, D, state_seq, seq_len, dsum, b_cur, nll, zsum, P, norm, G,
                                     p.out, p.sums));
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
    start_dev_kernel(fbw_fill, ((T + 1) * S, la, (double)INFINITY));
    start_dev_kernel(fbw_fill, (2 * S, lb, (double)INFINITY));
    start_dev_kernel(fbw_fill, (B * D, G, (double)INFINITY));
    start_dev_kernel(fbl_start, (B, p.start, redo, la));
    for (int64_t t = 0; t < T; ++t) {
      start_dev_kernel(fbl_emissions, (p.mode, t, B, D, p.am, seq_len, redo, P));
      start_dev_kernel(fbl_fwd_edges, (t, E, D, p.from, p.to, p.emis, p.seq, seq_len, redo, p.w, P, la + t * S,
                                       la + (t + 1) * S));
    }
    start_dev_kernel(fbl_final, (B, S, seq_len, redo, p.n_end, p.end_pairs, p.end_simple, p.end_w, la, nll));
    HANDLE_LAST_ERROR();
    if (p.loss) start_dev_kernel(fbw_loss_out, (B, nll, p.loss));
    for (int64_t t = T - 1; t >= 0; --t) {
      double* b_next = lb + ((t + 1) & 1) * S;
      double* b_cur = lb + (t & 1) * S;
      start_dev_kernel(fbw_fill, (S, b_cur, (double)INFINITY));
      start_dev_kernel(fbl_bw_init, (t, B, seq_len, redo, p.n_end, p.end_pairs, p.end_simple, p.end_w, b_next));
      start_dev_kernel(fbl_emissions, (p.mode, t, B, D, p.am, seq_len, redo, P));
      start_dev_kernel(fbl_bw_edges, (t, E, D, p.from, p.to, p.emis, p.seq, seq_len, redo, p.w, P, nll, la + t * S,
                                      b_next, b_cur, G));
      start_dev_kernel(fbl_bw_out, (p.mode, t, B, D, seq_len, redo, nll, P, G, p.out, p.sums));
    }
  }
  start_dev_kernel(fbw_nan_out, (T, B, D, seq_len, nan, p.out, p.sums, p.loss));
  HANDLE_LAST_ERROR();
}

// The names of the automaton functions' arguments; the caller fills in the rest.
static FsaTerms fsa_terms(const char* fn, const char* scores) {
  FsaTerms t;
  t.fn = fn;
  t.scores = scores;
  t.edges = "edges";
  t.weights = "weights";
  t.start = "start_end_states";
  t.start_index = "0, ";
  t.end = "start_end_states";
  t.end_index = "1, ";
  t.mask = 0;
  t.lens = 0;
  t.targets = 0;
  t.target_lens = 0;
  t.n_states = "the number of states";
  t.T = t.B = t.D = t.S = t.N = 0;
  return t;
}

static std::string fsa_shape(const Ndarray* a) {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < a->ndim; ++i) s << (i ? ", " : "") << a->dims[i] << (a->ndim == 1 ? "," : "");
  s << ")";
  return s.str();
}

// edges (rows, E) and weights (E,).
static void fsa_check_edges_shape(Ndarray* edges, Ndarray* weights, int64_t n_rows, const FsaTerms& terms) {
  std::ostringstream s;
  s << terms.edges << " must have " << n_rows << " rows, got shape " << fsa_shape(edges);
  fsa_require(Ndarray_DIMS(edges)[0] == n_rows, terms, s.str());
  s.str("");
  s << terms.weights << " has shape " << fsa_shape(weights) << "; it needs one entry per edge (" << terms.edges
    << " has " << Ndarray_DIMS(edges)[1] << " columns)";
  fsa_require(Ndarray_DIMS(weights)[0] == Ndarray_DIMS(edges)[1], terms, s.str());
}

// `a` has shape `want` (-1: any size).
static void fsa_check_shape(const Ndarray* a, const char* name, std::initializer_list<int64_t> want,
                            const char* want_text, const FsaTerms& terms) {
  bool ok = (int64_t)want.size() == a->ndim;
  int i = 0;
  for (int64_t w : want) {
    if (ok && w >= 0 && a->dims[i] != w) ok = false;
    ++i;
  }
  if (!ok) {
    std::ostringstream s;
    s << name << " must have shape " << want_text << ", got " << fsa_shape(a);
    fsa_require(false, terms, s.str());
  }
}

// The fields every Baum-Welch entry point shares: scores (T,B,D), edges (4,E) and weights (E);
// the start / end / length fields are left empty for the caller.
static FbwProblem fbw_problem(int mode, Ndarray* am, Ndarray* edges, Ndarray* weights, const FsaTerms& terms) {
  FbwProblem p;
  p.mode = mode;
  p.terms = terms;
  p.T = Ndarray_DIMS(am)[0];
  p.B = Ndarray_DIMS(am)[1];
  p.D = Ndarray_DIMS(am)[2];
  p.terms.T = p.T;
  p.terms.B = p.B;
  p.terms.D = p.D;
  fsa_check_edges_shape(edges, weights, 4, terms);
  p.E = Ndarray_DIMS(edges)[1];
  p.S = 0;
  const int32_t* e = Ndarray_DEV_DATA_int32(edges);
  p.am = Ndarray_DEV_DATA(am);
  p.from = e;
  p.to = e + p.E;
  p.emis = e + 2 * p.E;
  p.seq = e + 3 * p.E;
  p.w = Ndarray_DEV_DATA(weights);
  p.start = 0;
  p.n_end = 0;
  p.end_pairs = 0;
  p.end_simple = 0;
  p.end_w = 0;
  p.index = 0;
  p.lens = 0;
  p.out = 0;
  p.sums = 0;
  p.loss = 0;
  return p;
}

// The (T, B) index mask and the (2, S) state buffer of the FastBaumWelch ops; outputs (T,B,D), (T,B).
static void fbw_set_index_and_buffer(FbwProblem& p, Ndarray* index, Ndarray* state_buffer, Ndarray*** outputs) {
  std::ostringstream s;
  s << "(T, B) = (" << p.T << ", " << p.B << ")";
  fsa_check_shape(index, p.terms.mask, {p.T, p.B}, s.str().c_str(), p.terms);
  fsa_check_shape(state_buffer, "state_buffer", {2, -1}, "(2, S)", p.terms);
  p.S = Ndarray_DIMS(state_buffer)[1];
  p.index = Ndarray_DEV_DATA(index);
  p.out = Ndarray_DEV_DATA(*outputs[0]);
  p.sums = Ndarray_DEV_DATA(*outputs[1]);
}

// inputs: am_scores (T,B,D), edges (4,E), weights (E), start_end_states (2,B), index (T,B), state_buffer (2,S)
// outputs: output (T,B,D), sums (T,B)
static void fast_bw_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 2);
  Ndarray* se = inputs[3];
  FsaTerms terms = fsa_terms("fast_baum_welch", "am_scores");
  terms.mask = "float_idx";
  terms.n_states = "S = state_buffer.shape[1]";
  FbwProblem p = fbw_problem(FBW_NEGLOG, inputs[0], inputs[1], inputs[2], terms);
  std::ostringstream s;
  s << "(2, B = " << p.B << ")";
  fsa_check_shape(se, "start_end_states", {2, p.B}, s.str().c_str(), p.terms);
  fbw_set_index_and_buffer(p, inputs[4], inputs[5], outputs);
  p.start = Ndarray_DEV_DATA_int32(se);
  p.n_end = p.B;
  p.end_simple = Ndarray_DEV_DATA_int32(se) + p.B;
  fbw_run(p);
}

// inputs: am_scores, edges (4,E), weights, start_states (B), end_states (N,2), end_state_weights (N),
//         index (T,B), state_buffer (2,S); outputs: output (T,B,D), sums (T,B)
static void multi_end_fast_bw_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 8);
  assert_cmp(n_outputs, ==, 2);
  Ndarray *starts = inputs[3], *ends = inputs[4], *end_w = inputs[5];
  FsaTerms terms = fsa_terms("MultiEndFastBaumWelchOp", "am_scores");
  terms.start = "start_states";
  terms.start_index = "";
  terms.end = "end_states";
  terms.mask = "index";
  terms.n_states = "S = state_buffer.shape[1]";
  FbwProblem p = fbw_problem(FBW_NEGLOG, inputs[0], inputs[1], inputs[2], terms);
  std::ostringstream s;
  s << "(B = " << p.B << ",)";
  fsa_check_shape(starts, "start_states", {p.B}, s.str().c_str(), p.terms);
  fsa_check_shape(ends, "end_states", {-1, 2}, "(N, 2)", p.terms);
  s.str("");
  s << "(N = " << Ndarray_DIMS(ends)[0] << ",) (one per row of end_states)";
  fsa_check_shape(end_w, "end_state_weights", {Ndarray_DIMS(ends)[0]}, s.str().c_str(), p.terms);
  fbw_set_index_and_buffer(p, inputs[6], inputs[7], outputs);
  p.start = Ndarray_DEV_DATA_int32(starts);
  p.n_end = Ndarray_DIMS(ends)[0];
  p.end_pairs = Ndarray_DEV_DATA_int32(ends);
  p.end_w = Ndarray_DEV_DATA(end_w);
  fbw_run(p);
}

// ---------------------------------------------------------------- Viterbi
DEF_KERNEL void vit_init(int64_t n, Float* val, int32_t* idx) {
  GRID_LOOP(i, n) {
    val[i] = -(Float)INFINITY;
    idx[i] = 0x7fffffff;
  }
}

DEF_KERNEL void vit_set_start(int64_t n_batch, const int32_t* start, Float* val0) {
  GRID_LOOP(b, n_batch) val0[start[b]] = Float(0);
}

DEV_FUNC inline Float vit_candidate(int64_t t, int64_t e, int64_t n_batch, int64_t n_classes, const int32_t* from,
                                    const int32_t* emis, const int32_t* seq, const Float* w, const Float* am,
                                    const Float* val_t) {
  Float pv = val_t[from[e]];
  if (!(pv > -(Float)INFINITY)) return -(Float)INFINITY;
  Float v = pv + w[e] + am[(t * n_batch + seq[e]) * n_classes + emis[e]];
  return v > -(Float)INFINITY ? v : -(Float)INFINITY;  // NaN: impossible here; its sequence is marked NaN
}

DEF_KERNEL void vit_max(int64_t t, int64_t n_edges, int64_t n_batch, int64_t n_classes, const int32_t* from,
                        const int32_t* to, const int32_t* emis, const int32_t* seq, const int32_t* seq_len,
                        const Float* w, const Float* am, const Float* val_t, Float* val_next) {
  GRID_LOOP(e, n_edges) {
    if (t >= seq_len[seq[e]]) continue;
    Float v = vit_candidate(t, e, n_batch, n_classes, from, emis, seq, w, am, val_t);
    if (v > -(Float)INFINITY) fsa_atomic_max(val_next + to[e], v);
  }
}

// Ties go to the lowest edge index.
DEF_KERNEL void vit_arg(int64_t t, int64_t n_edges, int64_t n_batch, int64_t n_classes, const int32_t* from,
                        const int32_t* to, const int32_t* emis, const int32_t* seq, const int32_t* seq_len,
                        const Float* w, const Float* am, const Float* val_t, const Float* val_next, int32_t* idx_next) {
  GRID_LOOP(e, n_edges) {
    if (t >= seq_len[seq[e]]) continue;
    Float v = vit_candidate(t, e, n_batch, n_classes, from, emis, seq, w, am, val_t);
    if (v > -(Float)INFINITY && v == val_next[to[e]]) elem_atomic_min(idx_next + to[e], (int32_t)e);
  }
}

// NaN sequences get score NaN and the alignment 0.
DEF_KERNEL void vit_backtrack(int64_t n_time, int64_t n_batch, int64_t n_states, int64_t n_edges,
                              const int32_t* from, const int32_t* emis, const int32_t* end, const int32_t* seq_len,
                              const int32_t* nan, const Float* val, const int32_t* idx, int32_t* out, Float* score) {
  GRID_LOOP(b, n_batch) {
    int64_t len = seq_len[b];
    int32_t cur = end[b];
    Float sc = nan[b] ? (Float)NAN_F : val[len * n_states + cur];
    score[b] = sc;
    for (int64_t t = n_time - 1; t >= 0; --t) {
      int32_t label = 0;
      if (t < len && sc > -(Float)INFINITY) {
        int32_t e = idx[(t + 1) * n_states + cur];
        if (e >= 0 && e < n_edges) {
          label = emis[e];
          cur = from[e];
        }
      }
      out[t * n_batch + b] = label;
    }
  }
}

enum { VIT_SCAN = 0, VIT_LOGITS = 1, VIT_LOGPROBS = 2 };

// One block per row (t, b) with t < seq_len[b]: a NaN marks sequence b in `nan`.  VIT_LOGITS / VIT_LOGPROBS
// record a +inf (infinitely likely) entry; VIT_LOGITS writes the row's log-softmax into lp (all -inf for a row
// of -inf logits).
DEF_KERNEL void vit_rows(int mode, int64_t n_rows, int64_t n_batch, int64_t n_classes, const Float* x,
                         const int32_t* seq_len, Float* lp, int32_t* nan, FsaCheck* check) {
  DEF_SHARED(double, sh);
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const int64_t b = r % n_batch, t = r / n_batch;
    if (t >= seq_len[b]) continue;
    const Float* row = x + r * n_classes;
    double m = -INFINITY, n_nan = 0.0;
    for (int64_t d = tid; d < n_classes; d += nt) {
      double v = (double)row[d];
      if (v > m) m = v;
      if (v != v) n_nan += 1.0;
    }
    m = block_max(sh, m);  // the same in every thread of the block
    n_nan = block_sum(sh, n_nan);
    if (n_nan > 0.0) {
      if (tid == 0) nan[b] = 1;
      continue;
    }
    if (mode == VIT_SCAN) continue;
    if (m == INFINITY) {
      if (tid == 0) {
        int64_t d = 0;
        while (d + 1 < n_classes && !((double)row[d] == INFINITY)) ++d;
        fsa_fail(check, FSA_CHECK_SCORE_INFINITE, t, b, d, (double)row[d]);
      }
      continue;
    }
    if (mode != VIT_LOGITS) continue;
    double sum = 0.0;
    if (m > -INFINITY)
      for (int64_t d = tid; d < n_classes; d += nt) sum += exp((double)row[d] - m);
    sum = block_sum(sh, sum);
    const double lse = m + log(sum);
    for (int64_t d = tid; d < n_classes; d += nt)
      lp[r * n_classes + d] = m > -INFINITY ? (Float)((double)row[d] - lse) : -(Float)INFINITY;
  }
}

static void vit_row_pass(int mode, int64_t T, int64_t B, int64_t D, const Float* x, const int32_t* seq_len, Float* lp,
                         int32_t* nan, FsaCheck* check) {
  const int64_t n_rows = T * B;
  if (n_rows == 0) return;
  start_dev_kernel2(vit_rows, std::min<int64_t>(n_rows, 65535), FSA_ROW_THREADS, FSA_ROW_THREADS * sizeof(double),
                    (mode, n_rows, B, D, x, seq_len, lp, nan, check));
}

DEF_KERNEL void fsa_mark_nan_weights(int64_t n_edges, const int32_t* seq, const Float* w, int32_t* nan) {
  GRID_LOOP(e, n_edges) if (w[e] != w[e]) nan[seq[e]] = 1;
}

struct VitProblem {
  int64_t T, B, D, E, S;
  const Float* am;  // +log scores (T, B, D)
  const int32_t *from, *to, *emis, *seq;
  const Float* w;
  const int32_t *start, *end;
  const int32_t* seq_len;  // checked lengths
  const int32_t* nan;      // (B,) NaN sequences
  int32_t* align;          // (T, B)
  Float* score;            // (B,)
};

static void vit_run(ptn::Scratch& scratch, const VitProblem& p) {
  const int64_t T = p.T, B = p.B, D = p.D, E = p.E, S = p.S;
  if (B == 0) return;
  Float* val = scratch.get<Float>((T + 1) * S);
  int32_t* idx = scratch.get<int32_t>((T + 1) * S);
  start_dev_kernel(vit_init, ((T + 1) * S, val, idx));
  start_dev_kernel(vit_set_start, (B, p.start, val));
  for (int64_t t = 0; t < T; ++t) {
    const Float* v_t = val + t * S;
    Float* v_next = val + (t + 1) * S;
    start_dev_kernel(vit_max, (t, E, B, D, p.from, p.to, p.emis, p.seq, p.seq_len, p.w, p.am, v_t, v_next));
    start_dev_kernel(vit_arg, (t, E, B, D, p.from, p.to, p.emis, p.seq, p.seq_len, p.w, p.am, v_t, v_next,
                               idx + (t + 1) * S));
  }
  start_dev_kernel(vit_backtrack, (T, B, S, E, p.from, p.emis, p.end, p.seq_len, p.nan, val, idx, p.align, p.score));
  HANDLE_LAST_ERROR();
}

// inputs: am_scores (T,B,D) +log, am_seq_len (B), edges (4,E), weights (E), start_end_states (2,B), n_states
// outputs: output (T,B) int32, scores (B)
static void fast_viterbi_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 2);
  Ndarray *am = inputs[0], *lens = inputs[1], *edges = inputs[2], *weights = inputs[3], *se = inputs[4];
  FsaTerms terms = fsa_terms("fast_viterbi", "am_scores");
  terms.lens = "am_seq_len";
  terms.n_states = "the largest state index + 1";
  VitProblem p;
  p.T = Ndarray_DIMS(am)[0];
  p.B = Ndarray_DIMS(am)[1];
  p.D = Ndarray_DIMS(am)[2];
  p.S = Ndarray_DEV_DATA_int32_scalar(inputs[5]);
  terms.T = p.T;
  terms.B = p.B;
  terms.D = p.D;
  terms.S = p.S;
  fsa_require(p.S >= 0, terms, "n_states must be >= 0");
  fsa_check_edges_shape(edges, weights, 4, terms);
  p.E = Ndarray_DIMS(edges)[1];
  std::ostringstream s;
  s << "(B = " << p.B << ",)";
  fsa_check_shape(lens, "am_seq_len", {p.B}, s.str().c_str(), terms);
  s.str("");
  s << "(2, B = " << p.B << ")";
  fsa_check_shape(se, "start_end_states", {2, p.B}, s.str().c_str(), terms);
  const int32_t* e = Ndarray_DEV_DATA_int32(edges);
  p.from = e;
  p.to = e + p.E;
  p.emis = e + 2 * p.E;
  p.seq = e + 3 * p.E;
  p.start = Ndarray_DEV_DATA_int32(se);
  p.end = p.start + p.B;
  p.w = Ndarray_DEV_DATA(weights);
  p.am = Ndarray_DEV_DATA(am);
  ptn::Scratch scratch;
  int32_t* seq_len = scratch.get<int32_t>(p.B);
  int32_t* nan = scratch.get<int32_t>(p.B);
  FsaCheck* check = scratch.get<FsaCheck>(1);
  Ndarray_memset(nan, 0, p.B * sizeof(int32_t));
  Ndarray_memset(check, 0, sizeof(FsaCheck));
  start_dev_kernel(fsa_check_edges, (p.E, p.from, p.to, p.emis, p.seq, p.S, p.D, p.B, (int32_t*)0, check));
  start_dev_kernel(fsa_check_seqs, (p.T, p.B, p.start, p.S, (const Float*)0, Ndarray_DEV_DATA_int32(lens), seq_len,
                                    (int32_t*)0, check));
  start_dev_kernel(fsa_check_ends, (p.B, (const int32_t*)0, p.end, p.S, p.B, (int32_t*)0, check));
  fsa_raise_check(check, terms);
  if (p.B == 0) return;
  vit_row_pass(VIT_SCAN, p.T, p.B, p.D, p.am, seq_len, (Float*)0, nan, check);
  start_dev_kernel(fsa_mark_nan_weights, (p.E, p.seq, p.w, nan));
  p.seq_len = seq_len;
  p.nan = nan;
  p.align = Ndarray_DEV_DATA_int32(*outputs[0]);
  p.score = Ndarray_DEV_DATA(*outputs[1]);
  vit_run(scratch, p);
}

// ---------------------------------------------------------------- CTC automaton
// Per sequence b with L labels and N = targets width: states (offset (2N+3) b)
// 2k blank (k = 0..L), 2k+1 label k, 2L+1 dummy, 2L+2 end.  5(N-1)+10 edge slots per
// sequence; the end state is entered by consuming the last frame, so every CTC
// alignment is exactly one path; unused slots are dummy -> dummy (never reach the end).
// An edge that cannot be used (a skip between two equal labels) goes to the dummy
// state with the blank as emission.  The lengths must be checked (ctc_check_inputs).
DEF_KERNEL void ctc_fsa_build(int64_t n_batch, int64_t n_labels_max, int64_t per_seq, const int32_t* targets,
                              const int32_t* seq_lens, int32_t blank, bool label_loop, int32_t* edges,
                              int32_t* start_end) {
  GRID_LOOP(b, n_batch) {
    int32_t L = seq_lens[b];
    int64_t E = n_batch * per_seq;
    int32_t off = (int32_t)((2 * n_labels_max + 3) * b);
    int32_t dummy = 2 * L + 1, end = 2 * L + 2;
    const int32_t* y = targets + b * n_labels_max;
    int64_t slot = b * per_seq, slot_end = slot + per_seq;
    auto put = [&](int32_t from, int32_t to, int32_t emission) {
      edges[slot] = off + from;
      edges[E + slot] = off + to;
      edges[2 * E + slot] = emission;
      edges[3 * E + slot] = (int32_t)b;
      ++slot;
    };
    for (int32_t k = 0; k + 1 < L; ++k) {
      int32_t bl = 2 * k, lab = 2 * k + 1;
      bool skip_ok = y[k] != y[k + 1] || !label_loop;
      put(bl, bl, blank);
      put(bl, lab, y[k]);
      put(lab, label_loop ? lab : dummy, y[k]);
      put(lab, lab + 1, blank);
      if (skip_ok) put(lab, lab + 2, y[k + 1]); else put(lab, dummy, blank);
    }
    if (L >= 2) {
      bool skip_ok = y[L - 2] != y[L - 1] || !label_loop;
      if (skip_ok) put(2 * L - 3, end, y[L - 1]); else put(2 * L - 3, dummy, blank);
    }
    if (L >= 1) {
      int32_t bl = 2 * L - 2, lab = 2 * L - 1;
      put(bl, bl, blank);
      put(bl, lab, y[L - 1]);
      put(bl, end, y[L - 1]);
      put(lab, label_loop ? lab : dummy, y[L - 1]);
      put(lab, lab + 1, blank);
      put(lab, label_loop ? end : dummy, y[L - 1]);
      put(lab, end, blank);
    }
    put(2 * L, 2 * L, blank);
    put(2 * L, end, blank);
    while (slot < slot_end) put(dummy, dummy, blank);
    start_end[b] = off;
    start_end[n_batch + b] = off + end;
  }
}

// Frame lengths in [0, T] (if given), label lengths in [0, N], labels in [0, D) (if n_classes >= 0).
DEF_KERNEL void ctc_check_inputs(int64_t n_batch, int64_t n_time, int64_t n_labels, int64_t n_classes,
                                 const int32_t* lens, const int32_t* tlens, const int32_t* targets, FsaCheck* check) {
  GRID_LOOP(b, n_batch) {
    if (lens && (lens[b] < 0 || lens[b] > n_time)) fsa_fail(check, FSA_CHECK_LEN, 0, b, 0, lens[b]);
    int32_t L = tlens[b];
    if (L < 0 || L > n_labels) {
      fsa_fail(check, FSA_CHECK_TARGET_LEN, 0, b, 0, L);
      continue;
    }
    if (n_classes < 0) continue;
    for (int32_t k = 0; k < L; ++k) {
      int32_t y = targets[b * n_labels + k];
      if (y < 0 || y >= n_classes) {
        fsa_fail(check, FSA_CHECK_LABEL, 0, b, k, y);
        break;
      }
    }
  }
}

// The CTC automaton of targets (B, N) with lengths tlens into edges (4, E) and start_end (2, B), after checking
// the lengths (and the labels against n_classes >= 0, and lens against n_time if lens is given).
static void ctc_fsa_checked_build(const FsaTerms& terms, int64_t B, int64_t N, int64_t n_time, int64_t n_classes,
                                  const int32_t* lens, const int32_t* targets, const int32_t* tlens, int32_t blank,
                                  bool label_loop, int32_t* edges, int32_t* start_end) {
  ptn::Scratch scratch;
  FsaCheck* check = scratch.get<FsaCheck>(1);
  Ndarray_memset(check, 0, sizeof(FsaCheck));
  start_dev_kernel(ctc_check_inputs, (B, n_time, N, n_classes, lens, tlens, targets, check));
  fsa_raise_check(check, terms);
  start_dev_kernel(ctc_fsa_build, (B, N, 5 * (N - 1) + 10, targets, tlens, blank, label_loop, edges, start_end));
  HANDLE_LAST_ERROR();
}

static void ctc_fsa_check_size(int64_t B, int64_t N, const FsaTerms& terms) {
  std::ostringstream s;
  s << "the CTC automaton of " << B << " sequences of up to N = " << N << " labels has more than 2^31 - 1 states";
  fsa_require(B * (2 * N + 3) <= (int64_t)std::numeric_limits<int32_t>::max(), terms, s.str());
}

// inputs: targets (B,N), seq_lens (B), blank_idx (host), weights (E) [shape only], label_loop (host)
// outputs: edges (4,E), start_end_states (2,B)
static void ctc_fsa_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 2);
  Ndarray *targets = inputs[0], *lens = inputs[1], *weights = inputs[3];
  int32_t blank = Ndarray_DEV_DATA_int32_scalar(inputs[2]);
  bool label_loop = Ndarray_DEV_DATA_int32_scalar(inputs[4]) != 0;
  int64_t B = Ndarray_DIMS(targets)[0], N = Ndarray_DIMS(targets)[1];
  FsaTerms terms = fsa_terms("get_ctc_fsa_fast_bw", "");
  terms.targets = "targets";
  terms.target_lens = "seq_lens";
  terms.B = B;
  terms.N = N;
  std::ostringstream s;
  s << "(B = " << B << ",)";
  fsa_check_shape(lens, "seq_lens", {B}, s.str().c_str(), terms);
  int64_t per_seq = 5 * (N - 1) + 10;
  s.str("");
  s << "(B * (5 * (N - 1) + 10) = " << B * per_seq << ",)";
  fsa_check_shape(weights, "weights", {B * per_seq}, s.str().c_str(), terms);
  ctc_fsa_check_size(B, N, terms);
  ctc_fsa_checked_build(terms, B, N, 0, -1, (const int32_t*)0, Ndarray_DEV_DATA_int32(targets),
                        Ndarray_DEV_DATA_int32(lens), blank, label_loop, Ndarray_DEV_DATA_int32(*outputs[0]),
                        Ndarray_DEV_DATA_int32(*outputs[1]));
}

// ---------------------------------------------------------------- CTC losses (fused)
// A sequence with an empty target over zero frames has the empty alignment, of probability 1: loss 0 (its
// gradient is 0: it has no valid frame).
DEF_KERNEL void ctc_empty_loss(int64_t n_batch, const int32_t* lens, const int32_t* tlens, Float* loss) {
  GRID_LOOP(b, n_batch) if (lens[b] == 0 && tlens[b] == 0) loss[b] = Float(0);
}

// Viterbi: the loss is minus the best alignment's log-probability (inf without an alignment, NaN for NaN
// sequences); the gradient w.r.t. the logits is softmax - onehot(alignment) (-onehot for log-probabilities) on
// valid frames of sequences with an alignment, NaN on valid frames of NaN sequences, else 0.
DEF_KERNEL void ctc_vit_loss(int64_t n_batch, int64_t n_classes, const int32_t* lens, const int32_t* nan,
                             const int32_t* align, const Float* score, const Float* lp, Float* loss) {
  GRID_LOOP(b, n_batch) {
    if (nan[b]) {
      loss[b] = (Float)NAN_F;
      continue;
    }
    if (!(score[b] > -(Float)INFINITY)) {
      loss[b] = (Float)INFINITY;
      continue;
    }
    double s = 0.0;
    for (int64_t t = 0; t < lens[b]; ++t) s += (double)lp[(t * n_batch + b) * n_classes + align[t * n_batch + b]];
    loss[b] = (Float)(-s);
  }
}

DEF_KERNEL void ctc_vit_grad(int mode, int64_t n_time, int64_t n_batch, int64_t n_classes, const int32_t* lens,
                             const int32_t* nan, const int32_t* align, const Float* score, const Float* lp,
                             Float* grad) {
  GRID_LOOP(i, n_time * n_batch * n_classes) {
    int64_t d = i % n_classes, b = (i / n_classes) % n_batch, t = i / (n_classes * n_batch);
    Float g = Float(0);
    if (t < lens[b]) {
      if (nan[b])
        g = (Float)NAN_F;
      else if (score[b] > -(Float)INFINITY)
        g = (mode == VIT_LOGITS ? (Float)exp((double)lp[i]) : Float(0)) - (d == align[t * n_batch + b] ? 1 : 0);
    }
    grad[i] = g;
  }
}

// inputs: logits (T,B,D), logits_seq_lens (B), targets (B,N), targets_seq_lens (B), blank_index (host; negative
//         counts from the end), label_loop (host), logits_normalized (host)
// outputs: loss (B), grad (T,B,D)
static void ctc_loss_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs, bool viterbi) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 2);
  Ndarray *logits = inputs[0], *lens = inputs[1], *targets = inputs[2], *tlens = inputs[3];
  const int64_t blank_index = Ndarray_DEV_DATA_int32_scalar(inputs[4]);
  const bool label_loop = Ndarray_DEV_DATA_int32_scalar(inputs[5]) != 0;
  const bool normalized = Ndarray_DEV_DATA_int32_scalar(inputs[6]) != 0;
  const int64_t T = Ndarray_DIMS(logits)[0], B = Ndarray_DIMS(logits)[1], D = Ndarray_DIMS(logits)[2];
  const int64_t N = Ndarray_DIMS(targets)[1];
  FsaTerms terms = fsa_terms(viterbi ? "ctc_loss_viterbi" : "ctc_loss", "logits");
  terms.lens = "logits_seq_lens";
  terms.targets = "targets";
  terms.target_lens = "targets_seq_lens";
  terms.T = T;
  terms.B = B;
  terms.D = D;
  terms.N = N;
  std::ostringstream s;
  s << "(B = " << B << ",) (B = logits.shape[1])";
  fsa_check_shape(lens, "logits_seq_lens", {B}, s.str().c_str(), terms);
  fsa_check_shape(tlens, "targets_seq_lens", {B}, s.str().c_str(), terms);
  s.str("");
  s << "(B = " << B << ", N) (B = logits.shape[1])";
  fsa_check_shape(targets, "targets", {B, -1}, s.str().c_str(), terms);
  s.str("");
  s << "blank_index = " << blank_index << " is out of range [-D, D) for D = " << D << " classes (logits.shape[2])";
  fsa_require(B == 0 || (blank_index >= -D && blank_index < D), terms, s.str());
  const int32_t blank = (int32_t)(blank_index < 0 ? blank_index + D : blank_index);
  ctc_fsa_check_size(B, N, terms);

  const int64_t per_seq = 5 * (N - 1) + 10, E = B * per_seq, S = B * (2 * N + 3);
  ptn::Scratch scratch;
  int32_t* edges = scratch.get<int32_t>(4 * E);
  int32_t* start_end = scratch.get<int32_t>(2 * B);
  Float* weights = scratch.get<Float>(E);
  Ndarray_memset(weights, 0, E * sizeof(Float));
  const int32_t* d_lens = Ndarray_DEV_DATA_int32(lens);
  const int32_t* d_tlens = Ndarray_DEV_DATA_int32(tlens);
  ctc_fsa_checked_build(terms, B, N, T, D, d_lens, Ndarray_DEV_DATA_int32(targets), d_tlens, blank, label_loop, edges,
                        start_end);
  Float* loss = Ndarray_DEV_DATA(*outputs[0]);
  Float* grad = Ndarray_DEV_DATA(*outputs[1]);
  if (!viterbi) {
    FbwProblem p;
    p.mode = normalized ? FBW_LOGPROBS : FBW_LOGITS;
    p.T = T;
    p.B = B;
    p.D = D;
    p.E = E;
    p.S = S;
    p.am = Ndarray_DEV_DATA(logits);
    p.from = edges;
    p.to = edges + E;
    p.emis = edges + 2 * E;
    p.seq = edges + 3 * E;
    p.w = weights;
    p.start = start_end;
    p.n_end = B;
    p.end_pairs = 0;
    p.end_simple = start_end + B;
    p.end_w = 0;
    p.index = 0;
    p.lens = d_lens;
    p.out = grad;
    p.sums = 0;
    p.loss = loss;
    p.terms = terms;
    fbw_run(p);
    start_dev_kernel(ctc_empty_loss, (B, d_lens, d_tlens, loss));
    HANDLE_LAST_ERROR();
    return;
  }
  if (B == 0) return;
  int32_t* nan = scratch.get<int32_t>(B);
  FsaCheck* check = scratch.get<FsaCheck>(1);
  Ndarray_memset(nan, 0, B * sizeof(int32_t));
  Ndarray_memset(check, 0, sizeof(FsaCheck));
  const int mode = normalized ? VIT_LOGPROBS : VIT_LOGITS;
  Float* lp = normalized ? Ndarray_DEV_DATA(logits) : scratch.get<Float>(T * B * D);
  vit_row_pass(mode, T, B, D, Ndarray_DEV_DATA(logits), d_lens, lp, nan, check);
  fsa_raise_check(check, terms);
  int32_t* align = scratch.get<int32_t>(T * B);
  Float* score = scratch.get<Float>(B);
  VitProblem v;
  v.T = T;
  v.B = B;
  v.D = D;
  v.E = E;
  v.S = S;
  v.am = lp;
  v.from = edges;
  v.to = edges + E;
  v.emis = edges + 2 * E;
  v.seq = edges + 3 * E;
  v.w = weights;
  v.start = start_end;
  v.end = start_end + B;
  v.seq_len = d_lens;
  v.nan = nan;
  v.align = align;
  v.score = score;
  vit_run(scratch, v);
  start_dev_kernel(ctc_vit_loss, (B, D, d_lens, nan, align, score, lp, loss));
  start_dev_kernel(ctc_vit_grad, (mode, T, B, D, d_lens, nan, align, score, lp, grad));
  start_dev_kernel(ctc_empty_loss, (B, d_lens, d_tlens, loss));
  HANDLE_LAST_ERROR();
}

// ---------------------------------------------------------------- segmental Baum-Welch (log space)

DEV_FUNC inline double seg_scale(const Float* scales, int64_t n_scales, const Float* epoch) {
  double ep = (double)epoch[0];
  int64_t k = ep > 0.0 ? (int64_t)ep : 0;
  if (k > n_scales - 1) k = n_scales - 1;
  return (double)scales[k];
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
    int32_t s = edges[4 * n_edges + e];
    int32_t n = bidx[t * n_batch + s];
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
    int32_t s = edges[4 * n_edges + e];
    int32_t n = bidx[t * n_batch + s];
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
    int32_t s = edges[4 * n_edges + e];
    int32_t n = bidx[t * n_batch + s];
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
  start_dev_kernel(fbw_fill, ((F + 1) * S, alpha, (double)INFINITY));
  start_dev_kernel(fbw_fill, ((F + 1) * S, beta, (double)INFINITY));
  start_dev_kernel(fbw_fill, (L * Nb, nf, (double)INFINITY));
  start_dev_kernel(fbw_fill, (L * Nb * D, out_acc, (double)INFINITY));
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
