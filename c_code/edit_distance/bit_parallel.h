// The CPU's edit distances (edit_distance.cu): labels mapped to small ids (LabelMap), the bit-parallel DP of
// Myers (1999) in Hyyro's formulation over as many 64-bit words as a pattern needs (Solver), and the same
// multi-word step for several pairs at once, one pair per vector lane (lanes_last_score).
#ifndef PTNATIVE_EDIT_DISTANCE_BIT_PARALLEL_H
#define PTNATIVE_EDIT_DISTANCE_BIT_PARALLEL_H

#include "../dialect/kernel.h"

#if !CUDA
namespace ptn_ed {

// Maps int32 labels to small ids: a direct table when the labels of the whole
// call span a small range, else an open-addressing hash table.
struct LabelMap {
  bool dense = true;
  int64_t lo = 0, range = 0;
  std::vector<int32_t> table;     // dense: id per (label - lo); hash: id per slot (-1 = empty)
  std::vector<int32_t> keys;      // hash: label per slot
  std::vector<int32_t> inserted;  // dense: labels inserted since the last clear
  uint64_t mask = 0;
  int shift = 0;

  // The labels that will be looked up lie in [lo_, hi_].
  void configure(int64_t lo_, int64_t hi_) {
    dense = hi_ >= lo_ && hi_ - lo_ < (int64_t(1) << 16);
    if (dense) {
      lo = lo_;
      range = hi_ - lo_ + 1;
      table.assign(range, -1);
      inserted.clear();
    }
  }
  // Empty the map; it will hold at most `n` labels.
  void clear(int64_t n) {
    if (dense) {
      for (int32_t k : inserted) table[k - lo] = -1;
      inserted.clear();
      return;
    }
    int bits = 4;
    while ((int64_t(1) << bits) < 2 * n) ++bits;
    shift = 64 - bits;
    mask = (uint64_t(1) << bits) - 1;
    table.assign(size_t(1) << bits, -1);
    keys.resize(size_t(1) << bits);
  }
  inline uint64_t slot_of(int32_t key) const {
    return ((uint64_t)(uint32_t)key * 0x9E3779B97F4A7C15ull) >> shift;
  }
  // The id of `key`, inserting it with id `new_id` if absent.
  inline int32_t insert(int32_t key, int32_t new_id) {
    if (dense) {
      int32_t& e = table[key - lo];
      if (e < 0) {
        e = new_id;
        inserted.push_back(key);
      }
      return e;
    }
    uint64_t s = slot_of(key);
    while (table[s] >= 0) {
      if (keys[s] == key) return table[s];
      s = (s + 1) & mask;
    }
    keys[s] = key;
    table[s] = new_id;
    return new_id;
  }
  // The id of `key`, or -1.
  inline int32_t get(int32_t key) const {
    if (dense) {
      uint64_t k = (uint64_t)((int64_t)key - lo);
      return k < (uint64_t)range ? table[k] : -1;
    }
    uint64_t s = slot_of(key);
    while (table[s] >= 0) {
      if (keys[s] == key) return table[s];
      s = (s + 1) & mask;
    }
    return -1;
  }
};

// The range of the labels x[b * stride + t], t < len(b), over all b (len = NULL: every t < T).
inline void label_range(const int32_t* x, int64_t n_batch, int64_t T, const int32_t* len, int64_t& lo, int64_t& hi) {
  for (int64_t bi = 0; bi < n_batch; ++bi) {
    int64_t n = len ? (int64_t)len[bi] : T;
    const int32_t* p = x + bi * T;
    for (int64_t t = 0; t < n; ++t) {
      lo = std::min<int64_t>(lo, p[t]);
      hi = std::max<int64_t>(hi, p[t]);
    }
  }
}

// Per-thread scratch for the bit-parallel DP.
struct Solver {
  LabelMap map;
  std::vector<int32_t> pattern_ids, text_ids, scratch;
  std::vector<uint64_t> peq, vp, vn;
  static const int64_t kMaxPeqWords = int64_t(1) << 22;  // 32 MiB

  // row[j] = D[m][j] for j = 0..n, rows over `p` (length m), columns over `t` (length n).
  void last_row(const int32_t* p, int64_t m, const int32_t* t, int64_t n, int32_t* row) {
    row[0] = (int32_t)m;
    if (m == 0) {
      for (int64_t j = 1; j <= n; ++j) row[j] = (int32_t)j;
      return;
    }
    if (n == 0) return;
    map.clear(m);
    pattern_ids.resize(m);
    int32_t n_ids = 0;
    for (int64_t i = 0; i < m; ++i) {
      int32_t id = map.insert(p[i], n_ids);
      if (id == n_ids) ++n_ids;
      pattern_ids[i] = id;
    }
    int64_t W = (m + 63) >> 6;
    if ((int64_t)(n_ids + 1) * W > kMaxPeqWords) {  // many distinct labels in a very long pattern
      plain_last_row(p, m, t, n, row);
      return;
    }
    // peq[id * W + w]: bit i of word w set iff p[64 w + i] has this id; id n_ids: no match.
    peq.assign((size_t)(n_ids + 1) * W, 0);
    for (int64_t i = 0; i < m; ++i) peq[(size_t)pattern_ids[i] * W + (i >> 6)] |= uint64_t(1) << (i & 63);
    text_ids.resize(n);
    for (int64_t j = 0; j < n; ++j) {
      int32_t id = map.get(t[j]);
      text_ids[j] = id < 0 ? n_ids : id;
    }
    const int last_bit = (int)((m - 1) & 63);
    int64_t score = m;
    if (W == 1) {
      uint64_t VP = ~uint64_t(0), VN = 0;
      for (int64_t j = 0; j < n; ++j) {
        uint64_t Eq = peq[text_ids[j]];
        uint64_t D0 = (((Eq & VP) + VP) ^ VP) | Eq | VN;
        uint64_t HP = VN | ~(D0 | VP);
        uint64_t HN = VP & D0;
        score += (int64_t)((HP >> last_bit) & 1) - (int64_t)((HN >> last_bit) & 1);
        HP = (HP << 1) | 1;  // row 0 grows by one per column
        HN = HN << 1;
        VP = HN | ~(D0 | HP);
        VN = HP & D0;
        row[j + 1] = (int32_t)score;
      }
      return;
    }
    vp.assign(W, ~uint64_t(0));
    vn.assign(W, 0);
    uint64_t* VPw = vp.data();
    uint64_t* VNw = vn.data();
    for (int64_t j = 0; j < n; ++j) {
      const uint64_t* eq = peq.data() + (size_t)text_ids[j] * W;
      uint64_t add_carry = 0, hp_carry = 1, hn_carry = 0, HP = 0, HN = 0;
      for (int64_t w = 0; w < W; ++w) {
        uint64_t Eq = eq[w], VP = VPw[w], VN = VNw[w];
        // (Eq & VP) + VP as one long addition over all words
        uint64_t x = Eq & VP;
        uint64_t s1 = x + VP;
        uint64_t s2 = s1 + add_carry;
        add_carry = (uint64_t)(s1 < x) | (uint64_t)(s2 < s1);
        uint64_t D0 = (s2 ^ VP) | Eq | VN;
        HP = VN | ~(D0 | VP);
        HN = VP & D0;
        uint64_t HPs = (HP << 1) | hp_carry;
        uint64_t HNs = (HN << 1) | hn_carry;
        hp_carry = HP >> 63;
        hn_carry = HN >> 63;
        VPw[w] = HNs | ~(D0 | HPs);
        VNw[w] = HPs & D0;
      }
      // HP, HN: the last word's horizontal deltas, bit last_bit is row m
      score += (int64_t)((HP >> last_bit) & 1) - (int64_t)((HN >> last_bit) & 1);
      row[j + 1] = (int32_t)score;
    }
  }

  // The plain O(m n) row-wise recursion (fallback for huge label sets).
  void plain_last_row(const int32_t* p, int64_t m, const int32_t* t, int64_t n, int32_t* row) {
    for (int64_t j = 0; j <= n; ++j) row[j] = (int32_t)j;
    for (int64_t i = 1; i <= m; ++i) {
      int32_t diag = row[0], label = p[i - 1];
      row[0] = (int32_t)i;
      for (int64_t j = 1; j <= n; ++j) {
        int32_t up = row[j];
        int32_t v = diag + (label != t[j - 1] ? 1 : 0);
        v = std::min(v, std::min(up, row[j - 1]) + 1);
        diag = up;
        row[j] = v;
      }
    }
  }

  // D[m][n], choosing the cheaper orientation (the distance is symmetric).
  int32_t distance(const int32_t* a, int64_t la, const int32_t* b, int64_t lb) {
    if (la == 0) return (int32_t)lb;
    if (lb == 0) return (int32_t)la;
    bool a_vertical = ((la + 63) >> 6) * lb <= ((lb + 63) >> 6) * la;
    int64_t n = a_vertical ? lb : la;
    scratch.resize(n + 1);
    if (a_vertical) last_row(a, la, b, lb, scratch.data());
    else last_row(b, lb, a, la, scratch.data());
    return scratch[n];
  }
};

// ------------------------------------------------------------------ several pairs at once
// The multi-word step of Solver::last_row for up to kLanes pairs at once, one pair per lane of a vector of 64-bit
// words (the GCC/clang vector extension: AVX-512, AVX2, NEON or scalar code, as the target has).  The words of one
// column depend on each other through the carries, so one pair cannot fill a vector; pairs can.  Every lane runs to
// the longest pattern's word count and the longest text: a lane's words above its own pattern only receive carries
// (they never feed its lower words), its score is read at its own last row, and its columns past its text are
// masked off.  The integers are those of last_row, lane by lane.  A group of 2 pairs runs on vectors of 2 lanes,
// one of 3 or 4 on 4 lanes (each lane's words are gathered from its own tables: fewer lanes, fewer loads).
template <int L>
struct Lanes {
  typedef uint64_t type __attribute__((vector_size(8 * L)));
};
constexpr int kLanes = 4;  // 8 lanes measured slower than two groups of 4 (AVX-512, Zen 5)

struct LanePair {
  const int32_t* p;  // pattern (rows), m > 64 labels
  int64_t m;
  const int32_t* t;  // text (columns), n > 0 labels
  int64_t n;
};

// For each of the `n_pairs` <= L pairs: out[k] = D[m][n] (min_over_row: min_j D[m][j]).
template <int L>
inline void lanes_last_score(Solver& solver, const LanePair* pairs, int n_pairs, bool min_over_row, int32_t* out) {
  typedef typename Lanes<L>::type ptn_ed_lanes;
  const int kLanes = L;
  int64_t W = 0, n_max = 0;
  for (int k = 0; k < n_pairs; ++k) {
    W = std::max<int64_t>(W, (pairs[k].m + 63) >> 6);
    n_max = std::max<int64_t>(n_max, pairs[k].n);
  }
  // Per lane: its peq rows (W words each, zero above its own words), the row of each text label, and the row of
  // "no match" for the columns past its text.
  std::vector<int64_t> peq_start(kLanes + 1, 0), no_match(kLanes, 0);
  std::vector<std::vector<int32_t>> ids(kLanes);
  std::vector<uint64_t>& peq = solver.peq;
  peq.clear();
  for (int k = 0; k < kLanes; ++k) {
    peq_start[k] = (int64_t)peq.size();
    if (k >= n_pairs) {  // an idle lane: one all-zero row
      peq.resize(peq.size() + W, 0);
      continue;
    }
    const LanePair& q = pairs[k];
    solver.map.clear(q.m);
    int32_t n_ids = 0;
    solver.pattern_ids.resize(q.m);
    for (int64_t i = 0; i < q.m; ++i) {
      int32_t id = solver.map.insert(q.p[i], n_ids);
      if (id == n_ids) ++n_ids;
      solver.pattern_ids[i] = id;
    }
    peq.resize(peq.size() + (size_t)(n_ids + 1) * W, 0);
    uint64_t* rows = peq.data() + peq_start[k];
    for (int64_t i = 0; i < q.m; ++i) rows[(size_t)solver.pattern_ids[i] * W + (i >> 6)] |= uint64_t(1) << (i & 63);
    ids[k].resize(q.n);
    for (int64_t j = 0; j < q.n; ++j) {
      int32_t id = solver.map.get(q.t[j]);
      ids[k][j] = id < 0 ? n_ids : id;
    }
    no_match[k] = n_ids;
  }
  ptn_ed_lanes last_word, last_bit, n_lane, score, best;
  for (int k = 0; k < kLanes; ++k) {
    const bool on = k < n_pairs;
    last_word[k] = on ? (uint64_t)((pairs[k].m - 1) >> 6) : 0;
    last_bit[k] = on ? (uint64_t)((pairs[k].m - 1) & 63) : 0;
    n_lane[k] = on ? (uint64_t)pairs[k].n : 0;
    score[k] = on ? (uint64_t)pairs[k].m : 0;
  }
  best = score;
  const ptn_ed_lanes zero = {}, one = zero + 1;
  std::vector<ptn_ed_lanes> vp(W, ~zero), vn(W, zero);  // (std::allocator aligns them since C++17)
  const uint64_t* eq[kLanes];
  for (int64_t j = 0; j < n_max; ++j) {
    for (int k = 0; k < kLanes; ++k)
      eq[k] = peq.data() + peq_start[k] + (size_t)(j < (int64_t)n_lane[k] ? ids[k][j] : no_match[k]) * W;
    ptn_ed_lanes carry = zero, hp_carry = one, hn_carry = zero, hp_last = zero, hn_last = zero;
    for (int64_t w = 0; w < W; ++w) {
      ptn_ed_lanes Eq;
      for (int k = 0; k < kLanes; ++k) Eq[k] = eq[k][w];
      const ptn_ed_lanes VP = vp[w], VN = vn[w];
      const ptn_ed_lanes x = Eq & VP;
      const ptn_ed_lanes sum = x + VP + carry;  // (Eq & VP) + VP as one long addition over all words
      carry = ((x & VP) | ((x ^ VP) & ~sum)) >> 63;
      const ptn_ed_lanes D0 = (sum ^ VP) | Eq | VN;
      const ptn_ed_lanes HP = VN | ~(D0 | VP);
      const ptn_ed_lanes HN = VP & D0;
      const ptn_ed_lanes at_last = (ptn_ed_lanes)(last_word == (uint64_t)w);
      hp_last |= HP & at_last;
      hn_last |= HN & at_last;
      const ptn_ed_lanes HPs = (HP << 1) | hp_carry;
      const ptn_ed_lanes HNs = (HN << 1) | hn_carry;
      hp_carry = HP >> 63;
      hn_carry = HN >> 63;
      vp[w] = HNs | ~(D0 | HPs);
      vn[w] = HPs & D0;
    }
    const ptn_ed_lanes active = (ptn_ed_lanes)((uint64_t)j < n_lane);
    score += (((hp_last >> last_bit) & 1) - ((hn_last >> last_bit) & 1)) & active;
    if (min_over_row) {
      const ptn_ed_lanes lower = (ptn_ed_lanes)(score < best);
      best = (score & lower) | (best & ~lower);
    }
  }
  for (int k = 0; k < n_pairs; ++k) out[k] = (int32_t)(min_over_row ? best[k] : score[k]);
}

}  // namespace ptn_ed
#endif  // !CUDA

#endif  // PTNATIVE_EDIT_DISTANCE_BIT_PARALLEL_H
