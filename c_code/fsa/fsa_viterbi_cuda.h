// The Viterbi passes on CUDA: one launch per frame over the whole batch (fsa_viterbi.h declares the problem; the CPU
// schedule is fsa_viterbi_cpu.h).
#ifndef PTNATIVE_FSA_FSA_VITERBI_CUDA_H
#define PTNATIVE_FSA_FSA_VITERBI_CUDA_H

#include "../dialect/kernel.h"

#include "fsa_viterbi.h"

#if CUDA
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

// Viterbi: the loss is minus the best alignment's log-probability (inf without an alignment, NaN for NaN
// sequences); the gradient w.r.t. the logits is softmax - onehot(alignment) (-onehot for log-probabilities) on
// valid frames of sequences with an alignment, NaN on valid frames of NaN sequences, else 0.
DEF_KERNEL void vit_loss(int64_t n_batch, int64_t n_classes, const int32_t* lens, const int32_t* nan,
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

DEF_KERNEL void vit_grad(int mode, int64_t n_time, int64_t n_batch, int64_t n_classes, const int32_t* lens,
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

static void vit_run(ptn::Scratch& scratch, const VitProblem& p) {
  const int64_t T = p.T, B = p.B, D = p.D, E = p.E, S = p.S;
  if (B == 0) return;
  FsaCheck* check = scratch.get<FsaCheck>(1);
  Ndarray_memset(check, 0, sizeof(FsaCheck));
  const Float* lp = p.mode == VIT_LOGITS ? scratch.get<Float>(T * B * D) : p.x;
  vit_row_pass(p.mode, T, B, D, p.x, p.seq_len, (Float*)lp, p.nan, check);
  fsa_raise_check(check, p.terms);
  Float* val = scratch.get<Float>((T + 1) * S);
  int32_t* idx = scratch.get<int32_t>((T + 1) * S);
  start_dev_kernel(vit_init, ((T + 1) * S, val, idx));
  start_dev_kernel(vit_set_start, (B, p.start, val));
  for (int64_t t = 0; t < T; ++t) {
    const Float* v_t = val + t * S;
    Float* v_next = val + (t + 1) * S;
    start_dev_kernel(vit_max, (t, E, B, D, p.from, p.to, p.emis, p.seq, p.seq_len, p.w, lp, v_t, v_next));
    start_dev_kernel(vit_arg, (t, E, B, D, p.from, p.to, p.emis, p.seq, p.seq_len, p.w, lp, v_t, v_next,
                               idx + (t + 1) * S));
  }
  start_dev_kernel(vit_backtrack, (T, B, S, E, p.from, p.emis, p.end, p.seq_len, p.nan, val, idx, p.align, p.score));
  if (p.mode != VIT_SCAN) {
    start_dev_kernel(vit_loss, (B, D, p.seq_len, p.nan, p.align, p.score, lp, p.loss));
    start_dev_kernel(vit_grad, (p.mode, T, B, D, p.seq_len, p.nan, p.align, p.score, lp, p.grad));
  }
  HANDLE_LAST_ERROR();
}
#endif

#endif  // PTNATIVE_FSA_FSA_VITERBI_CUDA_H
