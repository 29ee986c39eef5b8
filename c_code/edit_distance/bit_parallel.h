// The CPU's edit distances (edit_distance.cu): labels mapped to small ids (LabelMap), the bit-parallel DP of
// Myers (1999) in Hyyro's formulation over as many 64-bit words as a pattern needs (Solver: one word alone, or a
// pattern's words as a wavefront over the lanes of a vector, WaveGroup, in a band around the diagonal where only
// the distance is needed), and the multi-word step for several pairs at once, one pair per vector lane
// (lanes_last_score).
#ifndef PTNATIVE_EDIT_DISTANCE_BIT_PARALLEL_H
#define PTNATIVE_EDIT_DISTANCE_BIT_PARALLEL_H

#include "../dialect/kernel.h"
#include "../common/simd.h"

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

// ------------------------------------------------------------------ one pair over the lanes of a vector
// The words of one column depend on each other through the carries, so one pair's words are computed as a
// wavefront: the pattern's words in groups of L (group g: words gL .. gL+L-1), lane k of a group computing word
// gL+k at column s-k in step s.  Lane k's carries of column c (the horizontal deltas leaving its bottom row) are
// lane k+1's input of column c in the next step, so the L lanes of one step are independent.  Lane 0 takes the
// carries of the group above from hpc/hnc (per column), lane L-1 leaves its own there for the group below.
//
// Band (Ukkonen): if D[m][n] <= k, every cell (i, j) of an optimal path has |i - j| + |(m - n) - (i - j)| <= k,
// i.e. i - j in [dlo, dhi]; group g computes only the columns where one of its rows is in that band.  Cells outside
// are not computed and stand for upper bounds of their values: a group's first column starts from vertical +1
// deltas (D[i][j] <= D[i-1][j] + 1), and the columns past the group above's last one enter its top with a
// horizontal +1 (D[i][j] <= D[i][j-1] + 1).  The step (Myers' block form: a horizontal -1 entering a word sets its
// bit 0 of the match mask, so the carries are the two horizontal deltas) computes the DP recurrence from whatever
// column and top deltas it is given, so every computed value is an upper bound of the true one, and equals it
// along an optimal path that stays in the band: the band's D[m][n] is exact when it is <= k.

template <typename M, int L>
inline M wave_shift_mask() {  // for ptn_shuffle2(a, b, .): r[0] = b[0], r[k] = a[k - 1]
  M r;
  for (int k = 0; k < L; ++k) r[k] = k == 0 ? L : k - 1;
  return r;
}

// One group's steps over the columns js..je.  pg: the group's first word in peq (stride Wp words per label id);
// off[c]: column c's label row offset (c in [1-L, n+L], padding: the all-zero row); hpc/hnc[c]: the carries into
// lane 0, replaced by lane L-1's.  kScore: the group holds row m (lane kl, bit lb): returns D'[m][je] from
// score = D'[m][js-1]; kRow: also row[c] = D'[m][c].
template <int L, bool kScore, bool kRow>
struct WaveGroup {
  typedef ptn_vec<uint64_t, L> V;
  typedef ptn_vec<int64_t, L> M;
  const uint64_t* pg;
  const int64_t* off;
  uint64_t *hpc, *hnc;
  int64_t js, je;
  int kl, lb;
  int32_t* row;
  int64_t score;
  V vp, vn, hpo, hno, acc;
  M shift, lane;

  WaveGroup(const uint64_t* pg_, const int64_t* off_, uint64_t* hpc_, uint64_t* hnc_, int64_t js_, int64_t je_,
            int kl_, int lb_, int32_t* row_, int64_t score_)
      : pg(pg_), off(off_), hpc(hpc_), hnc(hnc_), js(js_), je(je_), kl(kl_), lb(lb_), row(row_), score(score_) {}

  __attribute__((always_inline)) inline V gather(int64_t s) const {
    V eq;
    for (int k = 0; k < L; ++k) eq[k] = pg[off[s - k] + k];
    return eq;
  }

  template <bool kMasked>
  __attribute__((always_inline)) inline void step(int64_t s) {
    const V eq = gather(s);
    const V zero = {};
    const V hpi = ptn_shuffle2(hpo, zero + hpc[s], shift);
    const V hni = ptn_shuffle2(hno, zero + hnc[s], shift);
    const V x = eq | hni;
    const V d0 = (((x & vp) + vp) ^ vp) | x | vn;
    const V hp = vn | ~(d0 | vp);
    const V hn = d0 & vp;
    hpo = hp >> 63;
    hno = hn >> 63;
    const V hps = (hp << 1) | hpi;
    const V hns = (hn << 1) | hni;
    const V nvp = hns | ~(d0 | hps);
    const V nvn = hps & d0;
    if (kMasked) {  // lanes before their first column keep their initial state
      const M started = lane <= (s - js);
      vp = ptn_select(started, nvp, vp);
      vn = ptn_select(started, nvn, vn);
    } else {
      vp = nvp;
      vn = nvn;
    }
    hpc[s - L + 1] = hpo[L - 1];
    hnc[s - L + 1] = hno[L - 1];
    if (kRow) {
      const int64_t c = s - kl;
      if (c >= js && c <= je) {
        score += (int64_t)((hp[kl] >> lb) & 1) - (int64_t)((hn[kl] >> lb) & 1);
        row[c] = (int32_t)score;
      }
    } else if (kScore) {
      V d = ((hp >> lb) & 1) - ((hn >> lb) & 1);
      if (kMasked) d &= (V)((lane <= (s - js)) & (lane >= (s - je)));
      acc += d;
    }
  }

  int64_t run() {
    const V zero = {};
    vp = ~zero;
    vn = hpo = hno = acc = zero;
    shift = wave_shift_mask<M, L>();
    for (int k = 0; k < L; ++k) lane[k] = k;
    int64_t s = js;
    for (const int64_t e = std::min(js + L - 1, je + L); s < e; ++s) step<true>(s);
    for (; s <= je; ++s) step<false>(s);
    for (; s < je + L; ++s) step<true>(s);
    return kRow ? score : score + (int64_t)acc[kl];
  }
};

// Per-thread scratch for the bit-parallel DP.
struct Solver {
  LabelMap map;
  std::vector<int32_t> pattern_ids, text_ids, scratch;
  std::vector<uint64_t> peq, hpc, hnc;
  std::vector<int64_t> off;
  static const int64_t kMaxPeqWords = int64_t(1) << 22;  // 32 MiB

  // row[j] = D[m][j] for j = 0..n, rows over `p` (length m), columns over `t` (length n).
  void last_row(const int32_t* p, int64_t m, const int32_t* t, int64_t n, int32_t* row) { solve(p, m, t, n, row); }

  // D[m][n]; with row != NULL also row[j] = D[m][j] for j = 0..n.  probe (row NULL, m > 64): only the band's first,
  // cheap try (Solver::wave): D[m][n] if it is within that try's bound, else -1.
  int64_t solve(const int32_t* p, int64_t m, const int32_t* t, int64_t n, int32_t* row, bool probe = false) {
    if (row) row[0] = (int32_t)m;
    if (m == 0) {
      if (row)
        for (int64_t j = 1; j <= n; ++j) row[j] = (int32_t)j;
      return n;
    }
    if (n == 0) return m;
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
      if (!row) {
        scratch.resize(n + 1);
        row = scratch.data();
      }
      plain_last_row(p, m, t, n, row);
      return row[n];
    }
    text_ids.resize(n);
    for (int64_t j = 0; j < n; ++j) {
      int32_t id = map.get(t[j]);
      text_ids[j] = id < 0 ? n_ids : id;
    }
    if (W > 1) {
      const int L = wave_lanes(W);
      return L == 2 ? wave<2>(m, n, W, n_ids, row, probe) : L == 4 ? wave<4>(m, n, W, n_ids, row, probe)
                                                                  : wave<kWaveLanes>(m, n, W, n_ids, row, probe);
    }
    // peq[id]: bit i set iff p[i] has this id; id n_ids: no match.
    peq.assign((size_t)(n_ids + 1), 0);
    for (int64_t i = 0; i < m; ++i) peq[pattern_ids[i]] |= uint64_t(1) << i;
    const int last_bit = (int)(m - 1);
    int64_t score = m;
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
      if (row) row[j + 1] = (int32_t)score;
    }
    return score;
  }

  static constexpr int64_t kFirstSlack = 64;  // the band's first bound: |m - n| + this
  // The lanes of the widest vector the target has (2 to 8).
  static constexpr int kWaveLanes = PTN_VECTOR_BYTES >= 64 ? 8 : PTN_VECTOR_BYTES >= 32 ? 4 : 2;
  // The lanes for a pattern of W words: no more than the words need.
  static int wave_lanes(int64_t W) { return W <= 2 || kWaveLanes == 2 ? 2 : W <= 4 || kWaveLanes == 4 ? 4 : kWaveLanes; }

  // solve() for a pattern of W > 1 words over the wavefront of L lanes: with row, the whole DP; without, the band
  // of a bound k that grows until the band's D[m][n] is within it (see WaveGroup); probe: the first k only (-1 if
  // D[m][n] is above it).
  template <int L>
  int64_t wave(int64_t m, int64_t n, int64_t W, int32_t n_ids, int32_t* row, bool probe) {
    const int64_t G = (W + L - 1) / L, Wp = G * L;
    peq.assign((size_t)(n_ids + 1) * Wp, 0);
    for (int64_t i = 0; i < m; ++i) peq[(size_t)pattern_ids[i] * Wp + (i >> 6)] |= uint64_t(1) << (i & 63);
    off.assign(n + 2 * L, (int64_t)n_ids * Wp);
    hpc.resize(n + 2 * L);
    hnc.resize(n + 2 * L);
    int64_t* o = off.data() + (L - 1);  // o[c]: column c = 1..n (text_ids[c - 1]); padding c in [1-L, 0], (n, n+L]
    for (int64_t c = 1; c <= n; ++c) o[c] = (int64_t)text_ids[c - 1] * Wp;
    if (row) return wave_band<L>(m, n, G, -n, m, -1, row);
    // An upper bound: the diagonal alignment (substitutions, then the length difference).
    const int64_t dm = m - n, adm = dm < 0 ? -dm : dm;
    int64_t ub = adm;
    for (int64_t i = 0, e = std::min(m, n); i < e; ++i) ub += pattern_ids[i] != text_ids[i];
    const int64_t ub_cost = wave_cost(m, n, G, L, ub);
    for (int64_t slack = kFirstSlack;; slack *= 2) {
      const int64_t k = adm + slack;
      if (k >= ub || 2 * wave_cost(m, n, G, L, k) > ub_cost) break;
      const int64_t d = wave_band<L>(m, n, G, -((k - dm) >> 1), (k + dm) >> 1, k, (int32_t*)0);
      if (d >= 0 && d <= k) return d;
      if (probe) return -1;
      if (d >= 0) ub = std::min(ub, d);
    }
    if (probe) return -1;
    return wave_band<L>(m, n, G, -((ub - dm) >> 1), (ub + dm) >> 1, -1, (int32_t*)0);
  }

  // The steps of the band dlo <= i - j <= dhi (groups of L words of 64 rows).
  static int64_t wave_cost(int64_t m, int64_t n, int64_t G, int L, int64_t k) {
    const int64_t dm = m - n, dlo = -((k - dm) >> 1), dhi = (k + dm) >> 1;
    int64_t cost = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r0 = 64 * L * g + 1, r1 = std::min(m, 64 * L * (g + 1));
      cost += std::min(n, r1 - dlo) - std::max<int64_t>(1, r0 - dhi) + L;
    }
    return cost;
  }

  // D'[m][n] of the band dlo <= i - j <= dhi (which holds (0, 0) and (m, n)); with row, row[j] = D'[m][j] (the
  // whole DP: dlo = -n, dhi = m).  abort_k >= 0: -1 as soon as a group's bottom row shows D[m][n] > abort_k (no
  // band cell of that row can lie on a path of cost <= abort_k).
  template <int L>
  int64_t wave_band(int64_t m, int64_t n, int64_t G, int64_t dlo, int64_t dhi, int64_t abort_k, int32_t* row) {
    const int64_t dm = m - n;
    const int64_t* o = off.data() + (L - 1);
    uint64_t* hp = hpc.data() + (L - 1);
    uint64_t* hn = hnc.data() + (L - 1);
    int64_t filled = 0;  // hp/hn hold the carries of the row above the group up to this column
    int64_t base = 0;    // D'[top][js - 1]: the row above the group, at the column before its first
    for (int64_t g = 0; g < G; ++g) {
      const int64_t top = 64 * L * g, r0 = top + 1, r1 = std::min(m, top + 64 * L);
      const int64_t js = std::max<int64_t>(1, r0 - dhi), je = std::min(n, r1 - dlo);
      if (g == 0) base = js - 1;
      for (int64_t c = std::max(filled + 1, js); c <= je; ++c) {  // past the group above: horizontal +1
        hp[c] = 1;
        hn[c] = 0;
      }
      filled = std::max(filled, je);
      if (g == G - 1) {
        const int kl = (int)(((m - 1) >> 6) - g * L), lb = (int)((m - 1) & 63);
        const int64_t start = base + (m - top);  // D'[m][js - 1]
        if (row) {
          WaveGroup<L, true, true> wg{peq.data() + g * L, o, hp, hn, js, je, kl, lb, row, start};
          return wg.run();
        }
        WaveGroup<L, true, false> wg{peq.data() + g * L, o, hp, hn, js, je, kl, lb, row, start};
        return wg.run();
      }
      WaveGroup<L, false, false> wg{peq.data() + g * L, o, hp, hn, js, je, 0, 0, row, 0};
      wg.run();
      // The group's bottom row (row r): its values from D'[r][js - 1] = base + 64 L, for the next group's base and
      // the abort test.
      const int64_t r = top + 64 * L;
      const int64_t js_next = std::max<int64_t>(1, r + 1 - dhi);
      const int64_t lo = std::max<int64_t>(0, r - dhi), hi = std::min(n, r - dlo);
      int64_t v = base + 64 * L, best = INT64_MAX;
      int64_t next_base = v;
      for (int64_t c = js - 1;; ++c) {
        if (c >= lo && c <= hi) {
          const int64_t diag = r - c - dm;
          best = std::min(best, v + (diag < 0 ? -diag : diag));
        }
        if (c == js_next - 1) next_base = v;
        if (c == je) {
          if (js_next - 1 > je) next_base = v + (js_next - 1 - je);
          break;
        }
        v += (int64_t)hp[c + 1] - (int64_t)hn[c + 1];
      }
      if (abort_k >= 0 && best > abort_k) return -1;
      base = next_base;
    }
    return -1;  // not reached: the last group returns
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
    return (int32_t)(a_vertical(la, lb) ? solve(a, la, b, lb, (int32_t*)0) : solve(b, lb, a, la, (int32_t*)0));
  }
  // Whether a (length la) goes on the bit axis: the orientation with fewer word operations.
  static bool a_vertical(int64_t la, int64_t lb) { return ((la + 63) >> 6) * lb <= ((lb + 63) >> 6) * la; }
};

// How edit_distance's pair (pattern p of m > 64 labels, text t) is best computed: 2 alone (Solver::distance, in its
// band), where the band of the diagonal alignment's distance (an upper bound) covers at most half of the words;
// 1 the band's first try alone (Solver::solve with probe), where that try costs at most an eighth of the words and
// may find the distance; 0 in a group of pairs (lanes_last_score, every word of every column).  (Measured on
// AVX-512, Zen: a word of the wavefront costs about 1.7 times a word of a group of 4 pairs, and the band's first
// tries with smaller bounds add up to about as much again.)
inline int band_plan(const int32_t* p, int64_t m, const int32_t* t, int64_t n) {
  const int64_t W = (m + 63) >> 6;
  const int L = Solver::wave_lanes(W);
  const int64_t G = (W + L - 1) / L, adm = m > n ? m - n : n - m;
  int64_t ub = adm;
  for (int64_t i = 0, e = std::min(m, n); i < e; ++i) ub += p[i] != t[i];
  if (2 * Solver::wave_cost(m, n, G, L, ub) * L <= W * n) return 2;
  const int64_t k = adm + Solver::kFirstSlack;
  return k < ub && 8 * Solver::wave_cost(m, n, G, L, k) * L <= W * n ? 1 : 0;
}

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
