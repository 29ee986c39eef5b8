// Automata as edge lists: what Baum-Welch, Viterbi, the CTC automaton and segmental Baum-Welch share.
//
// Layout: `edges` (4, E) int32 with rows (from state, to state, emission index, sequence index) (the segmental
// op's (5, E) adds a length-model row before the sequence); `weights` (E,); start and end states per sequence.
// States are global indices into one state space shared by the whole batch, each state belonging to one sequence
// (fsa_check_edges / fsa_check_seqs / fsa_check_ends claim them and report a state used by two sequences).  Every
// edge consumes exactly one frame; a path of sequence b takes T_b edges from its start state to its end state.
//
// Here: the atomics of the passes (max, min, and -log(exp(-a) + exp(-b)) in the -log semiring, with +inf as
// its zero), the input checks of an edge list, the argument names of the automaton functions (fsa_terms) and
// their shape checks.
//
// NaN: a NaN score on a valid frame of sequence b (or a NaN weight of one of its edges) makes every output of b
// NaN (its loss, its -log posteriors / gradient on its valid frames, its sums); the other sequences are
// computed as usual.  The passes themselves treat NaN as impossible, and the NaN is written at the end.
#ifndef PTNATIVE_FSA_FSA_AUTOMATON_H
#define PTNATIVE_FSA_FSA_AUTOMATON_H

#include "../dialect/kernel.h"

#include "../common/input_checks.h"

// Threads per block of the kernels that reduce over a row (a power of two; one on the CPU).
#if CUDA
#define FSA_ROW_THREADS 128
#else
#define FSA_ROW_THREADS 1
#endif

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
// The weight of end entry n: `weights[n]` (one per entry), or 0 without weights.
DEV_FUNC inline double fsa_end_weight(const Float* weights, int64_t n) { return weights ? (double)weights[n] : 0.0; }

// Runs the statement after it for every end entry n of sequence b: each of the `count` pairs whose sequence is b,
// or entry b alone without pairs.  `continue` goes to the next entry.
#define FSA_END_LOOP(n, b, pairs, count)                                                                   \
  for (int64_t n = (pairs) ? 0 : (b), n##_stop = (pairs) ? (int64_t)(count) : (b) + 1; n < n##_stop; ++n) \
    if (fsa_end_seq(pairs, n) != (b)) {                                                                     \
    } else

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

DEF_KERNEL void fsa_fill(int64_t n, double* p, double v) {
  GRID_LOOP(i, n) p[i] = v;
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

#if !CUDA
// CPU: items [0, n) grouped by key_of(i) in [0, n_batch) (-1: in no group) by a counting sort, so that each group
// keeps the items' order: group b is ids[start[b] .. start[b + 1]).
template <typename KeyOf>
static void fsa_group(int64_t n, int64_t n_batch, KeyOf key_of, std::vector<int64_t>& start,
                      std::vector<int32_t>& ids) {
  start.assign(n_batch + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t s = key_of(i);
    if (s >= 0) ++start[s + 1];
  }
  for (int64_t b = 0; b < n_batch; ++b) start[b + 1] += start[b];
  ids.resize(start[n_batch]);
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < n; ++i) {
    int64_t s = key_of(i);
    if (s >= 0) ids[next[s]++] = (int32_t)i;
  }
}

// CPU: body(b, work) for every sequence b in [0, n_batch), on up to ptn::cpu_threads() threads when `cost` (about
// the number of inner-loop steps) pays for starting them.  Each thread has its own Work and takes the next
// sequence not yet taken, so what body computes from b alone does not depend on the threads.
template <typename Work, typename F>
static void fsa_for_each_sequence(int64_t n_batch, double cost, F&& body) {
  const int parts = cost < 5e4 ? 1 : (int)std::min<int64_t>(ptn::cpu_threads(), n_batch);
  std::atomic<int64_t> next(0);
  ptn::parallel_parts(parts, [&](int) {
    Work work;
    for (int64_t b = next++; b < n_batch; b = next++) body(b, work);
  });
}

// CPU: of per-sequence records of failed checks of the scores, the one a frame-major scan finds first (the lowest
// frame i, then the lowest sequence), or null.
static const FsaCheck* fsa_first_by_frame(const std::vector<FsaCheck>& fails) {
  const FsaCheck* first = 0;
  for (const FsaCheck& c : fails)
    if (c.code != FSA_CHECK_OK && (!first || c.i < first->i)) first = &c;
  return first;
}
#endif

#endif  // PTNATIVE_FSA_FSA_AUTOMATON_H
