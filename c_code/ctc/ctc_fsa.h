// The CTC (or RNA) automaton of a batch of label sequences, as an edge list (fsa_automaton.h): built by
// get_ctc_fsa_fast_bw (ctc_fsa.cu) and inside the fused CTC losses (ctc_loss.h).
//
// Shapes: targets (B, N) int32, label lengths (B,) in [0, N] (and, for the losses, frame lengths (B,) in [0, T]
// and labels in [0, D)); out: edges (4, E) with E = B (5 (N - 1) + 10) edge slots, start_end (2, B).
//
// Sequence b with L labels owns the states (2N + 3) b + [0, 2L + 2]: 2k blank (k = 0..L), 2k + 1 label k,
// 2L + 1 a dummy, 2L + 2 the end state, entered by consuming the last frame, so every alignment is exactly one
// path.  label_loop: CTC (a label repeats on consecutive frames; two equal labels need a blank between them);
// without: RNA (every label on exactly one frame).
#ifndef PTNATIVE_CTC_CTC_FSA_H
#define PTNATIVE_CTC_CTC_FSA_H

#include "../dialect/kernel.h"

#include "../fsa/fsa_automaton.h"

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

#endif  // PTNATIVE_CTC_CTC_FSA_H
