// Edit-distance family (Levenshtein distance on int32 label sequences).
//
// Notation: D[i][j] is the edit distance between a[:i] and b[:j]
// (D[i][0] = i, D[0][j] = j, unit costs for insertion, deletion, substitution).
//
// CPU build: per pair, the bit-parallel algorithm of Myers (1999) in Hyyro's
// formulation, over as many 64-bit words as the "pattern" needs, gives a whole
// DP row D[m][0..n] in O(ceil(m/64) * n) word operations.  The incremental ops
// (one DP row per beam-search step) use a plain row-wise recursion, and their
// reduction over candidate labels is computed in O(|b| + L) per batch entry
// from a closed form (see next_edit_distance_reduce_fw).
//
// CUDA build: the DP table is swept along anti-diagonals (all cells of one
// diagonal, of every batch entry, in parallel), and the per-candidate /
// per-successor ops use one thread per (batch entry, candidate).
//
// Both builds give the same results.  The CUDA branch uses only the dialect
// (no CUDA intrinsics), so the tests also run it on the CPU, through the
// launch emulation, by compiling this file with CUDA defined to 1.  Lengths are checked (0 <= len <= T);
// an out-of-range length is a ValueError, never an out-of-bounds access.
#include "../dialect/kernel.h"

#include "bit_parallel.h"

#define PTN_ED_INT32_MAX 2147483647

DEV_FUNC inline int64_t ptn_ed_min(int64_t x, int64_t y) { return x < y ? x : y; }

// ------------------------------------------------------------------ host-side checks
// Failed checks are ValueErrors that name the function (fn) and the argument as the user passed it.
[[noreturn]] static void ptn_ed_fail(const char* fn, const std::string& msg) {
  ptn::raise(PTN_STATUS_VALUE, std::string(fn) + ": " + msg);
}

// x.shape[0] == n_batch (the batch size of `ref`).
static void ptn_ed_check_batch(const char* fn, const Ndarray* x, const char* name, int64_t n_batch, const char* ref) {
  if (Ndarray_DIMS(x)[0] == n_batch) return;
  std::ostringstream s;
  s << name << " has batch size " << Ndarray_DIMS(x)[0] << ", " << ref << " has " << n_batch;
  ptn_ed_fail(fn, s.str());
}

static void ptn_ed_check_pairs(const char* fn, Ndarray* a, Ndarray* a_len, Ndarray* b, Ndarray* b_len) {
  int64_t n_batch = Ndarray_DIMS(a)[0];
  ptn_ed_check_batch(fn, a_len, "a_len", n_batch, "a");
  ptn_ed_check_batch(fn, b, "b", n_batch, "a");
  ptn_ed_check_batch(fn, b_len, "b_len", n_batch, "a");
}

// len[i] in [0, max_len = seq.shape[1]]; on CUDA the lengths are copied to the host for the check.
static void ptn_ed_check_lengths(const char* fn, const char* name, const char* seq, int64_t n, const int32_t* len,
                                 int64_t max_len) {
#if CUDA
  std::vector<int32_t> host(n);
  Ndarray_copy_to_host(host.data(), len, n * sizeof(int32_t));
  const int32_t* l = host.data();
#else
  const int32_t* l = len;
#endif
  for (int64_t i = 0; i < n; ++i) {
    if (l[i] >= 0 && l[i] <= max_len) continue;
    std::ostringstream s;
    s << name << "[" << i << "] = " << l[i] << " is out of range [0, " << max_len << "] (" << seq << ".shape[1])";
    ptn_ed_fail(fn, s.str());
  }
}

#if CUDA
// ================================================================== CUDA

DEF_KERNEL void ptn_ed_fill_kernel(int64_t n, int32_t* x, int32_t v) {
  for (int64_t idx = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x)
    x[idx] = v;
}

// One anti-diagonal d = i + j of every batch entry's DP table.  Buffers are
// indexed by batch entry and i (0..Ta): prev2 holds diagonal d-2, prev1 d-1.
// mode 0: out[b] = D[a_len][b_len]; mode 1: out[b] = min_j D[a_len][j]
// (atomicMin, out pre-set to INT32_MAX); mode 2: row[b][j] = D[a_len][j].
DEF_KERNEL void ptn_ed_diagonal_kernel(int64_t n_batch, int64_t Ta, int64_t Tb, int64_t d, const int32_t* a,
                                       const int32_t* a_len, const int32_t* b, const int32_t* b_len,
                                       const int32_t* prev2, const int32_t* prev1, int32_t* cur, int mode,
                                       int32_t* out, int32_t* row) {
  int64_t n_rows = Ta + 1;
  for (int64_t idx = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; idx < n_batch * n_rows;
       idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t bi = idx / n_rows, i = idx - bi * n_rows, j = d - i;
    if (j < 0 || j > Tb) continue;
    int64_t la = a_len[bi], lb = b_len[bi];
    if (i > la || j > lb) continue;
    int64_t base = bi * n_rows;
    int32_t v;
    if (i == 0) v = (int32_t)j;
    else if (j == 0) v = (int32_t)i;
    else {
      int32_t sub = prev2[base + i - 1] + (a[bi * Ta + i - 1] != b[bi * Tb + j - 1] ? 1 : 0);
      int32_t del = prev1[base + i - 1] + 1;
      int32_t ins = prev1[base + i] + 1;
      v = (int32_t)ptn_ed_min(sub, ptn_ed_min(del, ins));
    }
    cur[base + i] = v;
    if (i == la) {
      if (mode == 0) { if (j == lb) out[bi] = v; }
      else if (mode == 1) elem_atomic_min(out + bi, v);
      else row[bi * (Tb + 1) + j] = v;
    }
  }
}

// Sweeps all diagonals; lengths must have been checked.
static void ptn_ed_diagonal_sweep(int64_t n_batch, int64_t Ta, int64_t Tb, const int32_t* a, const int32_t* a_len,
                                  const int32_t* b, const int32_t* b_len, int mode, int32_t* out, int32_t* row) {
  if (n_batch == 0) return;
  int64_t n = n_batch * (Ta + 1);
  ptn::Scratch scratch;
  int32_t* buf = scratch.get<int32_t>(3 * n);
  int32_t* bufs[3] = {buf, buf + n, buf + 2 * n};
  for (int64_t d = 0; d <= Ta + Tb; ++d) {
    start_dev_kernel(ptn_ed_diagonal_kernel, (n_batch, Ta, Tb, d, a, a_len, b, b_len, bufs[(d + 1) % 3],
                                              bufs[(d + 2) % 3], bufs[d % 3], mode, out, row));
  }
  HANDLE_LAST_ERROR();
}

DEF_KERNEL void ptn_ed_per_successor_kernel(int64_t n_batch, int64_t n_succ, int64_t Tb, const int32_t* a_len,
                                            const int32_t* b, const int32_t* b_len, const int32_t* succ,
                                            const int32_t* row, int32_t* out) {
  for (int64_t idx = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; idx < n_batch * n_succ;
       idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t bi = idx / n_succ, s = idx - bi * n_succ;
    int64_t lb = b_len[bi];
    int32_t label = succ[s];
    const int32_t* r = row + bi * (Tb + 1);
    const int32_t* bb = b + bi * Tb;
    int64_t v = ptn_ed_min((int64_t)a_len[bi] + 1, (int64_t)r[lb] + 1);
    for (int64_t t = 0; t < lb; ++t) v = ptn_ed_min(v, (int64_t)r[t] + (bb[t] != label ? 1 : 0));
    out[idx] = (int32_t)v;
  }
}

DEF_KERNEL void ptn_ed_next_row_kernel(int64_t n_batch, int64_t Tb, const int32_t* last_row, const int32_t* a,
                                       const int32_t* a_n, const int32_t* a_ended, const int32_t* b,
                                       const int32_t* b_len, int32_t* next_row) {
  for (int64_t bi = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; bi < n_batch;
       bi += (int64_t)gridDim.x * blockDim.x) {
    int64_t lb = b_len[bi];
    const int32_t* last = last_row + bi * (Tb + 1);
    int32_t* next = next_row + bi * (Tb + 1);
    const int32_t* bb = b + bi * Tb;
    if (a_ended[bi]) {
      for (int64_t t = 0; t <= lb; ++t) next[t] = last[t];
    } else {
      int32_t label = a[bi];
      int64_t prev = (int64_t)a_n[bi] + 1;
      next[0] = (int32_t)prev;
      for (int64_t t = 1; t <= lb; ++t) {
        int64_t v = ptn_ed_min(ptn_ed_min((int64_t)last[t] + 1, prev + 1),
                               (int64_t)last[t - 1] + (label != bb[t - 1] ? 1 : 0));
        next[t] = (int32_t)v;
        prev = v;
      }
    }
    for (int64_t t = lb + 1; t <= Tb; ++t) next[t] = next[lb];
  }
}

DEF_KERNEL void ptn_ed_next_reduce_kernel(int64_t n_batch, int64_t n_labels, int64_t a_batch, int64_t Tb,
                                          const int32_t* last_row, const int32_t* a, const int32_t* a_n,
                                          const int32_t* a_ended, const int32_t* b, const int32_t* b_len,
                                          int optimal_completion, int32_t blank, int32_t* out) {
  for (int64_t idx = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; idx < n_batch * n_labels;
       idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t bi = idx / n_labels, l = idx - bi * n_labels;
    int64_t lb = b_len[bi];
    const int32_t* last = last_row + bi * (Tb + 1);
    const int32_t* bb = b + bi * Tb;
    int32_t label = a[(a_batch == 1 ? 0 : bi) * n_labels + l];
    int64_t total_min, final_v;
    if (a_ended[bi] || label == blank) {
      total_min = last[0];
      for (int64_t t = 1; t <= lb; ++t) total_min = ptn_ed_min(total_min, (int64_t)last[t]);
      final_v = last[lb];
    } else {
      int64_t prev = (int64_t)a_n[bi] + 1;
      total_min = prev;
      for (int64_t t = 1; t <= lb; ++t) {
        int64_t v = ptn_ed_min(ptn_ed_min((int64_t)last[t] + 1, prev + 1),
                               (int64_t)last[t - 1] + (label != bb[t - 1] ? 1 : 0));
        total_min = ptn_ed_min(total_min, v);
        prev = v;
      }
      final_v = prev;
    }
    out[idx] = (int32_t)(optimal_completion ? total_min : final_v);
  }
}

#else
// ================================================================== CPU
// (bit_parallel.h)
#endif  // CUDA

// ------------------------------------------------------------------ EditDistanceOp / OptimalCompletionEditDistanceOp
// inputs: a (B,Ta), a_len (B), b (B,Tb), b_len (B); output (B).
static void ptn_edit_distance_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs,
                                 bool optimal_completion) {
  assert_cmp(n_inputs, ==, 4);
  assert_cmp(n_outputs, ==, 1);
  Ndarray *a = inputs[0], *a_len = inputs[1], *b = inputs[2], *b_len = inputs[3];
  const char* fn = optimal_completion ? "optimal_completion_edit_distance" : "edit_distance";
  ptn_ed_check_pairs(fn, a, a_len, b, b_len);
  int64_t n_batch = Ndarray_DIMS(a)[0], Ta = Ndarray_DIMS(a)[1], Tb = Ndarray_DIMS(b)[1];
  const int32_t *pa = Ndarray_DEV_DATA_int32(a), *pla = Ndarray_DEV_DATA_int32(a_len);
  const int32_t *pb = Ndarray_DEV_DATA_int32(b), *plb = Ndarray_DEV_DATA_int32(b_len);
  int32_t* out = Ndarray_DEV_DATA_int32(*outputs[0]);
  ptn_ed_check_lengths(fn, "a_len", "a", n_batch, pla, Ta);
  ptn_ed_check_lengths(fn, "b_len", "b", n_batch, plb, Tb);
#if CUDA
  if (optimal_completion) start_dev_kernel(ptn_ed_fill_kernel, (n_batch, out, (int32_t)PTN_ED_INT32_MAX));
  ptn_ed_diagonal_sweep(n_batch, Ta, Tb, pa, pla, pb, plb, optimal_completion ? 1 : 0, out, (int32_t*)0);
#else
  ptn_ed::Solver solver;
  int64_t lo = PTN_ED_INT32_MAX, hi = -int64_t(PTN_ED_INT32_MAX) - 1;
  ptn_ed::label_range(pa, n_batch, Ta, pla, lo, hi);
  ptn_ed::label_range(pb, n_batch, Tb, plb, lo, hi);
  solver.map.configure(lo, hi);
  // Pairs whose pattern (the vertical sequence, as Solver::distance / last_row orient it) spans several words go
  // kLanes at a time through lanes_last_score, which computes every word of every column.  edit_distance first
  // gives a pair alone (Solver::wave: its words over the lanes, in a band around the diagonal) the cases where the
  // band is cheaper (band_plan): where the diagonal alignment bounds the distance to a band of at most half of the
  // words, or where the band's first, cheap try finds the distance; and a group of 2 left at the end too.  The
  // other pairs, and a group of one, go through the solver.
  std::vector<char> done(n_batch, 0);
  std::vector<int64_t> group;
  ptn_ed::LanePair lanes[ptn_ed::kLanes];
  int32_t lane_out[ptn_ed::kLanes];
  for (int64_t bi = 0; bi <= n_batch; ++bi) {
    if (bi < n_batch) {
      const int32_t *sa = pa + bi * Ta, *sb = pb + bi * Tb;
      const int64_t la = pla[bi], lb = plb[bi];
      const bool a_vertical = optimal_completion || ptn_ed::Solver::a_vertical(la, lb);
      ptn_ed::LanePair q = a_vertical ? ptn_ed::LanePair{sa, la, sb, lb} : ptn_ed::LanePair{sb, lb, sa, la};
      if (q.m <= 64 || q.n == 0 || (int64_t)(q.m + 1) * ((q.m + 63) >> 6) > ptn_ed::Solver::kMaxPeqWords) continue;
      if (!optimal_completion) {
        const int plan = ptn_ed::band_plan(q.p, q.m, q.t, q.n);
        if (plan == 2) continue;
        const int64_t d = plan == 1 ? solver.solve(q.p, q.m, q.t, q.n, (int32_t*)0, true) : -1;
        if (d >= 0) {
          out[bi] = (int32_t)d;
          done[bi] = 1;
          continue;
        }
      }
      lanes[group.size()] = q;
      group.push_back(bi);
    }
    const size_t alone = optimal_completion ? 1 : 2;  // a group this small at the end: each pair alone
    if (group.size() == (size_t)ptn_ed::kLanes || (bi == n_batch && group.size() > alone)) {
      const int n = (int)group.size();
      if (n > 2) ptn_ed::lanes_last_score<4>(solver, lanes, n, optimal_completion, lane_out);
      else ptn_ed::lanes_last_score<2>(solver, lanes, n, optimal_completion, lane_out);
      for (size_t k = 0; k < group.size(); ++k) {
        out[group[k]] = lane_out[k];
        done[group[k]] = 1;
      }
      group.clear();
    }
  }
  std::vector<int32_t> row;
  for (int64_t bi = 0; bi < n_batch; ++bi) {
    if (done[bi]) continue;
    const int32_t *sa = pa + bi * Ta, *sb = pb + bi * Tb;
    int64_t la = pla[bi], lb = plb[bi];
    if (!optimal_completion) {
      out[bi] = solver.distance(sa, la, sb, lb);
    } else {
      row.resize(lb + 1);
      solver.last_row(sa, la, sb, lb, row.data());
      out[bi] = *std::min_element(row.begin(), row.end());
    }
  }
#endif
}

static void edit_distance_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  ptn_edit_distance_fw(n_inputs, inputs, n_outputs, outputs, false);
}

static void optimal_completion_edit_distance_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  ptn_edit_distance_fw(n_inputs, inputs, n_outputs, outputs, true);
}

// ------------------------------------------------------------------ OptimalCompletionEditDistancePerSuccessorOp
// inputs: a (B,Ta), a_len (B), b (B,Tb), b_len (B), successors (L); output (B,L).
// With R = D[a_len][0..b_len] and a' = a + [s]:
//   OCD(a', b) = min(a_len + 1, R[b_len] + 1, min_{t < b_len} R[t] + [s != b_t]),
// because the next row's "insertion" term never attains its minimum first.
static void optimal_completion_edit_distance_per_successor_fw(int n_inputs, Ndarray** inputs, int n_outputs,
                                                              Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 1);
  Ndarray *a = inputs[0], *a_len = inputs[1], *b = inputs[2], *b_len = inputs[3], *succ = inputs[4];
  const char* fn = "optimal_completion_edit_distance_per_successor";
  ptn_ed_check_pairs(fn, a, a_len, b, b_len);
  int64_t n_batch = Ndarray_DIMS(a)[0], Ta = Ndarray_DIMS(a)[1], Tb = Ndarray_DIMS(b)[1];
  int64_t n_succ = Ndarray_DIMS(succ)[0];
  Ndarray* output = *outputs[0];
  assert_cmp(Ndarray_DIMS(output)[0], ==, n_batch);
  assert_cmp(Ndarray_DIMS(output)[1], ==, n_succ);
  const int32_t *pa = Ndarray_DEV_DATA_int32(a), *pla = Ndarray_DEV_DATA_int32(a_len);
  const int32_t *pb = Ndarray_DEV_DATA_int32(b), *plb = Ndarray_DEV_DATA_int32(b_len);
  const int32_t* ps = Ndarray_DEV_DATA_int32(succ);
  int32_t* out = Ndarray_DEV_DATA_int32(output);
  ptn_ed_check_lengths(fn, "a_len", "a", n_batch, pla, Ta);
  ptn_ed_check_lengths(fn, "b_len", "b", n_batch, plb, Tb);
#if CUDA
  if (n_batch == 0) return;
  ptn::Scratch scratch;
  int32_t* rows = scratch.get<int32_t>(n_batch * (Tb + 1));
  ptn_ed_diagonal_sweep(n_batch, Ta, Tb, pa, pla, pb, plb, 2, (int32_t*)0, rows);
  start_dev_kernel(ptn_ed_per_successor_kernel, (n_batch, n_succ, Tb, pla, pb, plb, ps, rows, out));
  HANDLE_LAST_ERROR();
#else
  ptn_ed::Solver solver;
  int64_t lo = PTN_ED_INT32_MAX, hi = -int64_t(PTN_ED_INT32_MAX) - 1;
  ptn_ed::label_range(pa, n_batch, Ta, pla, lo, hi);
  ptn_ed::label_range(pb, n_batch, Tb, plb, lo, hi);
  ptn_ed::label_range(ps, 1, n_succ, (const int32_t*)0, lo, hi);
  solver.map.configure(lo, hi);
  ptn_ed::LabelMap bmap;
  bmap.configure(lo, hi);
  std::vector<int32_t> row(Tb + 1);
  std::vector<int64_t> best;
  for (int64_t bi = 0; bi < n_batch; ++bi) {
    const int32_t *sa = pa + bi * Ta, *sb = pb + bi * Tb;
    int64_t la = pla[bi], lb = plb[bi];
    solver.last_row(sa, la, sb, lb, row.data());
    int64_t base = std::min<int64_t>(la + 1, (int64_t)row[lb] + 1);
    bmap.clear(lb);
    best.clear();
    for (int64_t t = 0; t < lb; ++t) {
      base = std::min<int64_t>(base, (int64_t)row[t] + 1);
      int32_t id = bmap.insert(sb[t], (int32_t)best.size());
      if (id == (int32_t)best.size()) best.push_back(row[t]);
      else best[id] = std::min<int64_t>(best[id], row[t]);
    }
    int32_t* o = out + bi * n_succ;
    for (int64_t s = 0; s < n_succ; ++s) {
      int32_t id = bmap.get(ps[s]);
      o[s] = (int32_t)(id < 0 ? base : std::min(base, best[id]));
    }
  }
#endif
}

// ------------------------------------------------------------------ NextEditDistanceRowOp
// inputs: last_row (B,Tb+1), a (B), a_n (B), a_ended (B), b (B,Tb), b_len (B); output (B,Tb+1).
// What the two "next" ops share: their first six inputs, whose shapes (all but a's) are checked here.
struct PtnEdNext {
  Ndarray* a;  // each op checks its own shape
  int64_t n_batch, Tb;
  const int32_t *last, *pa, *pan, *pend, *pb, *plb;  // last_row, a, a_n, a_ended, b, b_len
};

static PtnEdNext ptn_ed_next_inputs(const char* fn, Ndarray** inputs) {
  Ndarray *last_row = inputs[0], *a_n = inputs[2], *a_ended = inputs[3], *b = inputs[4], *b_len = inputs[5];
  int64_t n_batch = Ndarray_DIMS(last_row)[0];
  if (Ndarray_DIMS(last_row)[1] != Ndarray_DIMS(b)[1] + 1) {
    std::ostringstream s;
    s << "last_row has " << Ndarray_DIMS(last_row)[1] << " columns; it needs b.shape[1] + 1 = "
      << Ndarray_DIMS(b)[1] + 1;
    ptn_ed_fail(fn, s.str());
  }
  ptn_ed_check_batch(fn, a_n, "a_n", n_batch, "last_row");
  ptn_ed_check_batch(fn, a_ended, "a_ended", n_batch, "last_row");
  ptn_ed_check_batch(fn, b, "b", n_batch, "last_row");
  ptn_ed_check_batch(fn, b_len, "b_len", n_batch, "last_row");
  PtnEdNext in;
  in.a = inputs[1];
  in.n_batch = n_batch;
  in.Tb = Ndarray_DIMS(b)[1];
  in.last = Ndarray_DEV_DATA_int32(last_row);
  in.pa = Ndarray_DEV_DATA_int32(in.a);
  in.pan = Ndarray_DEV_DATA_int32(a_n);
  in.pend = Ndarray_DEV_DATA_int32(a_ended);
  in.pb = Ndarray_DEV_DATA_int32(b);
  in.plb = Ndarray_DEV_DATA_int32(b_len);
  return in;
}

static void next_edit_distance_row_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 1);
  const char* fn = "next_edit_distance_row";
  const PtnEdNext in = ptn_ed_next_inputs(fn, inputs);
  ptn_ed_check_batch(fn, in.a, "a", in.n_batch, "last_row");
  int32_t* next = Ndarray_DEV_DATA_int32(*outputs[0]);
  ptn_ed_check_lengths(fn, "b_len", "b", in.n_batch, in.plb, in.Tb);
#if CUDA
  start_dev_kernel(ptn_ed_next_row_kernel,
                   (in.n_batch, in.Tb, in.last, in.pa, in.pan, in.pend, in.pb, in.plb, next));
  HANDLE_LAST_ERROR();
#else
  for (int64_t bi = 0; bi < in.n_batch; ++bi) {
    const int32_t* l = in.last + bi * (in.Tb + 1);
    int32_t* o = next + bi * (in.Tb + 1);
    const int32_t* sb = in.pb + bi * in.Tb;
    int64_t lb = in.plb[bi];
    if (in.pend[bi]) {
      memcpy(o, l, (lb + 1) * sizeof(int32_t));
    } else {
      int32_t label = in.pa[bi];
      int64_t prev = (int64_t)in.pan[bi] + 1;
      o[0] = (int32_t)prev;
      for (int64_t t = 1; t <= lb; ++t) {
        int64_t v = std::min<int64_t>(std::min<int64_t>((int64_t)l[t], prev) + 1,
                                      (int64_t)l[t - 1] + (label != sb[t - 1] ? 1 : 0));
        o[t] = (int32_t)v;
        prev = v;
      }
    }
    std::fill(o + lb + 1, o + in.Tb + 1, o[lb]);
  }
#endif
}

// ------------------------------------------------------------------ NextEditDistanceReduceOp
// inputs: last_row (B,Tb+1), a (B|1,L), a_n (B), a_ended (B), b (B,Tb), b_len (B),
//         optimal_completion (host scalar), a_blank_idx (host scalar); output (B,L).
// For a candidate label s (not ended, s != blank) the next row is
//   N[0] = a_n + 1,  N[k] = min(S_k, N[k-1] + 1),  S_k = min(last[k] + 1, last[k-1] + [s != b_{k-1}]),
// hence (n = b_len)
//   min_k N[k] = min(a_n + 1, last[n] + 1 (if n > 0), min_{t<n} last[t] + [s != b_t]),
//   N[n]       = min(a_n + 1 + n, min_{k>=1} last[k] + 1 + n - k, min_{t<n} last[t] + n - 1 - t + [s != b_t]).
// Both are "a label-independent base, lowered by the positions t with b_t == s", so the CPU
// computes them for all L candidates in O(n + L) per batch entry.
static void next_edit_distance_reduce_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 8);
  assert_cmp(n_outputs, ==, 1);
  const char* fn = "next_edit_distance_reduce";
  const PtnEdNext in = ptn_ed_next_inputs(fn, inputs);
  bool optimal_completion = Ndarray_DEV_DATA_int32_scalar(inputs[6]) != 0;
  int32_t blank = Ndarray_DEV_DATA_int32_scalar(inputs[7]);
  int64_t a_batch = Ndarray_DIMS(in.a)[0], n_labels = Ndarray_DIMS(in.a)[1];
  if (a_batch != 1 && a_batch != in.n_batch) {
    std::ostringstream s;
    s << "a has batch size " << a_batch << "; it must be 1 (the same candidates for all) or B = " << in.n_batch
      << " (last_row.shape[0])";
    ptn_ed_fail(fn, s.str());
  }
  Ndarray* output = *outputs[0];
  assert_cmp(Ndarray_DIMS(output)[0], ==, in.n_batch);
  assert_cmp(Ndarray_DIMS(output)[1], ==, n_labels);
  int32_t* out = Ndarray_DEV_DATA_int32(output);
  ptn_ed_check_lengths(fn, "b_len", "b", in.n_batch, in.plb, in.Tb);
#if CUDA
  start_dev_kernel(ptn_ed_next_reduce_kernel, (in.n_batch, n_labels, a_batch, in.Tb, in.last, in.pa, in.pan, in.pend,
                                               in.pb, in.plb, optimal_completion ? 1 : 0, blank, out));
  HANDLE_LAST_ERROR();
#else
  int64_t lo = PTN_ED_INT32_MAX, hi = -int64_t(PTN_ED_INT32_MAX) - 1;
  ptn_ed::label_range(in.pb, in.n_batch, in.Tb, in.plb, lo, hi);
  ptn_ed::label_range(in.pa, 1, a_batch * n_labels, (const int32_t*)0, lo, hi);
  ptn_ed::LabelMap bmap;
  bmap.configure(lo, hi);
  std::vector<int64_t> best;
  for (int64_t bi = 0; bi < in.n_batch; ++bi) {
    const int32_t* l = in.last + bi * (in.Tb + 1);
    const int32_t* sb = in.pb + bi * in.Tb;
    const int32_t* cand = in.pa + (a_batch == 1 ? 0 : bi) * n_labels;
    int32_t* o = out + bi * n_labels;
    int64_t n = in.plb[bi];
    // The value of a candidate that does not extend the hypothesis (ended, or blank).
    int64_t keep = l[n];
    if (optimal_completion)
      for (int64_t t = 0; t < n; ++t) keep = std::min<int64_t>(keep, l[t]);
    if (in.pend[bi]) {
      for (int64_t k = 0; k < n_labels; ++k) o[k] = (int32_t)keep;
      continue;
    }
    int64_t base;
    bmap.clear(n);
    best.clear();
    if (optimal_completion) base = (int64_t)in.pan[bi] + 1;
    else base = (int64_t)in.pan[bi] + 1 + n;
    if (optimal_completion && n > 0) base = std::min<int64_t>(base, (int64_t)l[n] + 1);  // k = n >= 1
    for (int64_t t = 0; t < n; ++t) {
      int64_t key = optimal_completion ? (int64_t)l[t] : (int64_t)l[t] + n - 1 - t;
      base = std::min(base, key + 1);
      if (!optimal_completion) base = std::min(base, (int64_t)l[t + 1] + n - t);  // k = t + 1
      int32_t id = bmap.insert(sb[t], (int32_t)best.size());
      if (id == (int32_t)best.size()) best.push_back(key);
      else best[id] = std::min(best[id], key);
    }
    for (int64_t k = 0; k < n_labels; ++k) {
      int32_t label = cand[k];
      if (label == blank) {
        o[k] = (int32_t)keep;
        continue;
      }
      int32_t id = bmap.get(label);
      o[k] = (int32_t)(id < 0 ? base : std::min(base, best[id]));
    }
  }
#endif
}
