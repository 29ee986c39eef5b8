// Shared by the automaton kernels (fsa_automaton.h and the files that include it) and the HMM kernels (hmm.cu):
// an exp for x <= 0, the record of a failed input check and its message in the user's terms, and the lengths of a
// 0/1 prefix mask (through the dialect's ptn_prefix_mask_length).
//
// Checks: a kernel records the first failed check of the user's input in an FsaCheck (device memory) and skips
// the failing item; the host reads the record after the launch (fsa_raise_check) and raises a ValueError whose
// message names the function and the argument as the user knows them (FsaTerms).
#ifndef PTNATIVE_COMMON_INPUT_CHECKS_H
#define PTNATIVE_COMMON_INPUT_CHECKS_H

#include "../dialect/kernel.h"

// exp(x) for x <= 0 (-inf allowed; x < -708 gives 0).  CPU: Cody-Waite reduction, degree-13
// Taylor (~1 ulp), with integer bit selects instead of FP compares so that g++ -O3
// vectorises loops over it without -ffast-math.  CUDA: exp.
DEV_FUNC inline double fsa_exp(double x) {
#if CUDA
  return x < -708.0 ? 0.0 : exp(x);
#else
  uint64_t xb;
  memcpy(&xb, &x, sizeof(double));
  uint64_t keep = (uint64_t)(xb > 0xc086200000000000ULL) - 1;  // all ones unless x < -708 (x <= 0)
  uint64_t xcb = (xb & keep) | (0xc086200000000000ULL & ~keep);
  double xc;
  memcpy(&xc, &xcb, sizeof(double));
  const double magic = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  double kb = xc * 1.4426950408889634 + magic;
  double k = kb - magic;
  double r = (xc - k * 0.6931471803691238) - k * 1.9082149292705877e-10;
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  int64_t kbits, mbits;
  memcpy(&kbits, &kb, sizeof(double));
  memcpy(&mbits, &magic, sizeof(double));
  int64_t sbits = (kbits - mbits + 1023) << 52;  // 2^k
  double scale;
  memcpy(&scale, &sbits, sizeof(double));
  double v = p * scale;
  uint64_t vb;
  memcpy(&vb, &v, sizeof(double));
  vb &= keep;
  memcpy(&v, &vb, sizeof(double));
  return v;
#endif
}


// ---------------------------------------------------------------- input checks
// Kernels record the first failed check of the user's input here (device memory; the first failure wins) and
// skip the failing item; the host reads the record after the launch and raises a ValueError that names the
// function and the argument (fsa_check_message below).  What i, j, k and value mean depends on
// the code.
enum FsaCheckCode {
  FSA_CHECK_OK = 0,
  FSA_CHECK_EDGE_STATE,      // edges[i, j] = value (i = 0: from, 1: to) outside [0, S)
  FSA_CHECK_EDGE_EMISSION,   // edges[2, j] = value outside [0, D)
  FSA_CHECK_EDGE_SEQ,        // edges[3, j] = value outside [0, B)
  FSA_CHECK_SHARED_STATE,    // state i used by sequences j and k
  FSA_CHECK_START_STATE,     // start state of sequence j = value outside [0, S)
  FSA_CHECK_END_STATE,       // end state entry j = value outside [0, S)
  FSA_CHECK_END_SEQ,         // end_states[j, 0] = value outside [0, B)
  FSA_CHECK_MASK_VALUE,      // mask[i, j] = value is not 0 or 1
  FSA_CHECK_MASK_PREFIX,     // mask[:, j] is 1 at frame i after a 0
  FSA_CHECK_LEN,             // lengths[j] = value outside [0, T]
  FSA_CHECK_TARGET_LEN,      // target lengths[j] = value outside [0, N]
  FSA_CHECK_LABEL,           // targets[j, k] = value outside [0, D)
  FSA_CHECK_WEIGHT_MINUS_INF,  // weights[j] = -inf
  FSA_CHECK_END_WEIGHT_MINUS_INF,  // end weight j = -inf
  FSA_CHECK_SCORE_INFINITE,  // scores[i, j, k] = value is infinitely likely
  FSA_CHECK_PARAM_PLUS_INF,  // a log-probability of +inf: parameter i (HMM), flat index j
};

struct FsaCheck {
  int32_t code;
  int32_t unused;
  int64_t i, j, k;
  double value;
};

DEV_FUNC inline void fsa_fail(FsaCheck* c, int32_t code, int64_t i, int64_t j, int64_t k, double value) {
  if (elem_atomic_cas(&c->code, (int32_t)0, code) == 0) {
    c->i = i;
    c->j = j;
    c->k = k;
    c->value = value;
  }
}

// The length of column b of a 0/1 prefix mask (T, B); a bad column is recorded (and gets length 0).
DEV_FUNC inline int32_t fsa_mask_length(int64_t n_time, int64_t n_batch, const Float* mask, int64_t b,
                                        FsaCheck* check) {
  int64_t bad_t = 0;
  int64_t len = ptn_prefix_mask_length(n_time, n_batch, mask, b, &bad_t);
  if (len == -1) fsa_fail(check, FSA_CHECK_MASK_VALUE, bad_t, b, 0, (double)mask[bad_t * n_batch + b]);
  if (len == -2) fsa_fail(check, FSA_CHECK_MASK_PREFIX, bad_t, b, 0, 1.0);
  return len < 0 ? 0 : (int32_t)len;
}

// Per sequence b, the length of a 0/1 prefix mask (T, B).
DEF_KERNEL void fsa_mask_lengths(int64_t n_time, int64_t n_batch, const Float* mask, int32_t* seq_len,
                                 FsaCheck* check) {
  GRID_LOOP(b, n_batch) seq_len[b] = fsa_mask_length(n_time, n_batch, mask, b, check);
}

// The names a function's user knows its arguments by, for the messages of failed checks.
struct FsaTerms {
  const char* fn;          // the function, e.g. "ctc_loss"
  const char* scores;      // (T, B, D) scores / logits / log-emissions
  const char* edges;
  const char* weights;
  const char* start;       // start states: start[start_index b], e.g. start_end_states[0, b]
  const char* start_index;
  const char* end;         // end states: end[end_index b], e.g. start_end_states[1, b] (or end_states[n, 1])
  const char* end_index;
  const char* mask;        // (T, B) mask, or null
  const char* lens;        // (B,) frame lengths, or null
  const char* targets;     // (B, N) labels, or null
  const char* target_lens; // (B,) label lengths, or null
  const char* n_states;    // where S comes from
  int64_t T, B, D, S, N;
};

static std::string fsa_check_message(const FsaCheck& c, const FsaTerms& n) {
  std::ostringstream s;
  s << n.fn << ": ";
  switch (c.code) {
    case FSA_CHECK_EDGE_STATE:
      s << n.edges << "[" << c.i << ", " << c.j << "] = " << (int64_t)c.value << " (the " << (c.i ? "to" : "from")
        << " state of edge " << c.j << ") is out of range [0, " << n.S << ") (" << n.n_states << ")";
      break;
    case FSA_CHECK_EDGE_EMISSION:
      s << n.edges << "[2, " << c.j << "] = " << (int64_t)c.value << " (the emission of edge " << c.j
        << ") is out of range [0, D = " << n.D << ") (D = " << n.scores << ".shape[2])";
      break;
    case FSA_CHECK_EDGE_SEQ:
      s << n.edges << "[3, " << c.j << "] = " << (int64_t)c.value << " (the sequence of edge " << c.j
        << ") is out of range [0, B = " << n.B << ")";
      break;
    case FSA_CHECK_SHARED_STATE:
      s << "state " << c.i << " is used by sequences " << c.j << " and " << c.k
        << " (in " << n.edges << " or the start / end states); each state must belong to one sequence";
      break;
    case FSA_CHECK_START_STATE:
      s << n.start << "[" << n.start_index << c.j << "] = " << (int64_t)c.value << " (a start state) is out of range [0, " << n.S
        << ") (" << n.n_states << ")";
      break;
    case FSA_CHECK_END_STATE:
      if (c.i == 1)
        s << n.end << "[" << c.j << ", 1]";
      else
        s << n.end << "[" << n.end_index << c.j << "]";
      s << " = " << (int64_t)c.value << " (an end state) is out of range [0, " << n.S
        << ") (" << n.n_states << ")";
      break;
    case FSA_CHECK_END_SEQ:
      s << n.end << "[" << c.j << ", 0] = " << (int64_t)c.value << " (a sequence) is out of range [0, B = " << n.B
        << ")";
      break;
    case FSA_CHECK_MASK_VALUE:
      s << n.mask << "[" << c.i << ", " << c.j << "] = " << c.value << " is not 0 or 1";
      break;
    case FSA_CHECK_MASK_PREFIX:
      s << n.mask << "[:, " << c.j << "] is not a prefix mask (1 at frame " << c.i << " after a 0)";
      break;
    case FSA_CHECK_LEN:
      s << n.lens << "[" << c.j << "] = " << (int64_t)c.value
        << (c.value < 0 ? " is negative" : " exceeds the number of frames T = ");
      if (c.value >= 0) s << n.T << " (" << n.scores << ".shape[0])";
      break;
    case FSA_CHECK_TARGET_LEN:
      s << n.target_lens << "[" << c.j << "] = " << (int64_t)c.value
        << (c.value < 0 ? " is negative" : " exceeds the number of labels N = ");
      if (c.value >= 0) s << n.N << " (" << n.targets << ".shape[1])";
      break;
    case FSA_CHECK_LABEL:
      s << n.targets << "[" << c.j << ", " << c.k << "] = " << (int64_t)c.value << " is out of range [0, D = " << n.D
        << ") (D = " << n.scores << ".shape[2])";
      break;
    case FSA_CHECK_WEIGHT_MINUS_INF:
      s << n.weights << "[" << c.j << "] = -inf (an edge infinitely more likely than certain) is not allowed";
      break;
    case FSA_CHECK_END_WEIGHT_MINUS_INF:
      s << "end_state_weights[" << c.j << "] = -inf (infinitely more likely than certain) is not allowed";
      break;
    case FSA_CHECK_SCORE_INFINITE:
      s << n.scores << "[" << c.i << ", " << c.j << ", " << c.k << "] = " << c.value
        << " is infinitely likely (only impossible scores may be infinite)";
      break;
    case FSA_CHECK_PARAM_PLUS_INF: {
      static const char* params[] = {"log_transitions", "log_initial", "log_final"};
      s << params[c.i < 0 || c.i > 2 ? 0 : c.i] << ".flat[" << c.j
        << "] = inf (a log-probability above every finite value) is not allowed";
      break;
    }
    default:
      s << "input check " << c.code << " failed";
  }
  return s.str();
}

// Raises the recorded failure, if any (a ValueError in Python).
static void fsa_raise_check(const FsaCheck* check_dev, const FsaTerms& terms) {
  HANDLE_LAST_ERROR();
  FsaCheck c;
  Ndarray_copy_to_host(&c, check_dev, sizeof(FsaCheck));
  if (c.code != FSA_CHECK_OK) ptn::raise(PTN_STATUS_VALUE, fsa_check_message(c, terms));
}

// A host-side check in the user's terms.
static void fsa_require(bool ok, const FsaTerms& terms, const std::string& what) {
  if (!ok) ptn::raise(PTN_STATUS_VALUE, std::string(terms.fn) + ": " + what);
}

#endif  // PTNATIVE_COMMON_INPUT_CHECKS_H
