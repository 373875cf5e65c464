// Radix search of the top-k / top-p sampler (included by sampling.cu). A search finds, per row,
// the largest probability key x with F(x) = sum over the row's set of the entries with key >= x
// meeting a target (counts >= k, mass >= top_p * set mass, mass > u * set mass), fixing 11, 10
// and 10 bits of x per level. The set is {key > lo_key} plus the first lo_ties ids with key ==
// lo_key: those tie entries are left out of the histograms and added back as lo_ties entries of
// the same key in the select step, so ties are always ranked by id like the CPU kernel's sort.
#pragma once

#include "sampling_parts.cuh"

namespace {

using namespace ppo_sample;

// Per (row, chunk): histogram of the digit at `level` of the keys in the set that match the bits
// fixed so far; counts and fixed-point masses added into the row's global histogram (integer
// atomics: the sums do not depend on their order). Shared memory holds only 32-bit sums (native
// shared atomics, no compare-and-swap loops): a mass m <= 2^47 as m >> 16 and m & 0xffff, whose
// sums over a chunk of at most 16,384 entries (probabilities summing to about 1) fit 32 bits. The
// top-k search counts only. (Summing a warp's lanes of one digit first, with __match_any_sync and
// __reduce_add_sync, made the top-p draw 1.8x slower on an H200.)
template <typename T>
__global__ void radix_hist_kernel(const T* __restrict__ logits, const uint8_t* __restrict__ presence,
                                  const int64_t* __restrict__ rows, const __grid_constant__ Params P, Work W,
                                  int level) {
  const int64_t b = blockIdx.x, c = blockIdx.y;
  const RowState s = W.rows[b];
  if (s.done || s.idle) return;
  __shared__ unsigned int hc[BINS], hm_hi[BINS], hm_lo[BINS];
  const int shift = level_shift(level), nb = 1 << level_bits(level), hi = shift + level_bits(level);
  for (int d = threadIdx.x; d < nb; d += THREADS) {
    hc[d] = 0u;
    hm_hi[d] = 0u;
    hm_lo[d] = 0u;
  }
  __syncthreads();
  const RowView<T> row = row_view(logits, presence, rows, P, b);
  const int64_t v0 = c * P.chunk, v1 = min(P.V, v0 + P.chunk);
  const bool need_mass = s.kind != KIND_TOPK;  // the top-k search counts
  for_each_entry(row, v0, v1, [&](int64_t v, float x, bool live) {
    if (!live) return;
    const uint32_t key = prob_key(row.work_of(v, x), P.inv_t, s.mw, s.inv_z);
    if (key <= s.lo_key || (key >> hi) != (s.prefix >> hi)) return;
    const int d = static_cast<int>((key >> shift) & static_cast<uint32_t>(nb - 1));
    atomicAdd(&hc[d], 1u);
    if (need_mass) {
      const unsigned long long mass = key_mass(key);
      atomicAdd(&hm_hi[d], static_cast<unsigned int>(mass >> 16));
      atomicAdd(&hm_lo[d], static_cast<unsigned int>(mass & 0xffffull));
    }
  });
  __syncthreads();
  unsigned long long* gc = W.hist_c + b * BINS;
  unsigned long long* gm = W.hist_m + b * BINS;
  for (int d = threadIdx.x; d < nb; d += THREADS)
    if (hc[d]) {
      atomicAdd(&gc[d], static_cast<unsigned long long>(hc[d]));
      atomicAdd(&gm[d], (static_cast<unsigned long long>(hm_hi[d]) << 16) + hm_lo[d]);
    }
}

// A finished search of one row (one thread): the next search's set and target, or the pick.
// x: the key found; above_*: count / mass of the set's keys > x; eq_*: of the keys == x.
__device__ void finish_search(RowState& s, const Params& P, bool found, uint32_t x, unsigned long long above_m,
                              unsigned long long eq_c) {
  const unsigned long long w = key_mass(x);
  if (s.kind == KIND_TOPK) {
    if (found) {  // the k-th largest key; the first (k - above) ids of that key are in the top-k
      s.lo_ties = static_cast<unsigned long long>(P.top_k) - s.above_c;
      s.lo_key = x;
    }  // else fewer than k non-zero probabilities: the set stays every non-zero entry
    s.kind = P.use_top_p ? KIND_TOPP : KIND_DRAW;
  } else if (s.kind == KIND_TOPP) {
    if (found) {  // the smallest number of ties at x that brings the kept mass to the target
      unsigned long long n = w == 0 ? eq_c : (s.target - above_m + w - 1) / w;
      n = n < 1 ? 1 : (n > eq_c ? eq_c : n);
      s.lo_key = x;
      s.lo_ties = n;
    }
    s.kind = KIND_DRAW;
  } else {
    if (found) {  // the j-th tie (id order) at x is the first entry whose cumulative mass passes the target
      unsigned long long j = (w == 0 ? 0 : (s.target - above_m) / w) + 1;
      s.pick_key = x;
      s.pick_rank = j > eq_c ? eq_c : j;
    } else {  // every kept probability is 0: the last kept entry in rank order
      s.pick_key = s.lo_key;
      s.pick_rank = s.lo_ties > 0 ? s.lo_ties : 1;
    }
    s.kind = KIND_DRAW + 1;
  }
  s.prefix = 0u;
  s.above_c = 0ull;
  s.above_m = 0ull;
}

// The target of a search, from its set's total count / mass (known after its first level).
__device__ __forceinline__ unsigned long long search_target(const RowState& s, const Params& P,
                                                            unsigned long long set_m) {
  if (s.kind == KIND_TOPK) return static_cast<unsigned long long>(P.top_k);
  if (s.kind == KIND_TOPP) {
    const double want = static_cast<double>(P.top_p) * static_cast<double>(set_m);
    const unsigned long long t = static_cast<unsigned long long>(want);
    return t < 1 ? 1 : t;
  }
  return static_cast<unsigned long long>(static_cast<double>(s.u) * static_cast<double>(set_m));
}

// Per row: reads (and clears) the row's histogram of this level, picks the largest digit whose
// cumulative count / mass from the top meets the target, and fixes it in the row's prefix.
__global__ void radix_select_kernel(const __grid_constant__ Params P, Work W, int level) {
  const int64_t b = blockIdx.x;
  RowState s = W.rows[b];
  if (s.done) return;
  if (s.idle) {  // the search ended at its first level: this level has nothing to do
    if (threadIdx.x == 0) W.rows[b].idle = s.idle - 1;
    return;
  }
  const int shift = level_shift(level), nb = 1 << level_bits(level), hi = shift + level_bits(level);
  const int per = nb / THREADS, base = static_cast<int>(threadIdx.x) * per;
  const bool bonus = s.lo_ties > 0 && (s.lo_key >> hi) == (s.prefix >> hi);
  const int bonus_d = static_cast<int>((s.lo_key >> shift) & static_cast<uint32_t>(nb - 1));
  unsigned long long* gc = W.hist_c + b * BINS;
  unsigned long long* gm = W.hist_m + b * BINS;
  unsigned long long c[BINS / THREADS], m[BINS / THREADS], my_c = 0, my_m = 0;
  for (int j = 0; j < per; ++j) {
    c[j] = gc[base + j];
    m[j] = gm[base + j];
    gc[base + j] = 0ull;  // ready for the next level
    gm[base + j] = 0ull;
    if (bonus && base + j == bonus_d) {
      c[j] += s.lo_ties;
      m[j] += s.lo_ties * key_mass(s.lo_key);
    }
    my_c += c[j];
    my_m += m[j];
  }
  const unsigned long long sfx_c = block_exclusive_scan(my_c, true), sfx_m = block_exclusive_scan(my_m, true);
  __shared__ unsigned long long total_m;
  if (threadIdx.x == 0) total_m = sfx_m + my_m;
  __syncthreads();
  if (level == 0) s.target = search_target(s, P, total_m);
  const bool by_count = s.kind == KIND_TOPK, strict = s.kind == KIND_DRAW;
  const unsigned long long above = (by_count ? s.above_c : s.above_m) + (by_count ? sfx_c : sfx_m);
  int local = -1;
  unsigned long long run = 0;
  for (int j = per - 1; j >= 0 && local < 0; --j) {
    run += by_count ? c[j] : m[j];
    if (strict ? above + run > s.target : above + run >= s.target) local = base + j;
  }
  const int d = block_max_int(local);
  if (d < 0) {  // only at level 0: the whole set does not meet the target
    if (threadIdx.x == 0) {
      finish_search(s, P, false, 0u, 0ull, 0ull);
      s.idle = LEVELS - 1;  // the next search starts with the next search's first launch
      W.rows[b] = s;
    }
    return;
  }
  if (d < base || d >= base + per) return;
  for (int j = per - 1; base + j > d; --j) {
    s.above_c += c[j];
    s.above_m += m[j];
  }
  s.above_c += sfx_c;
  s.above_m += sfx_m;
  s.prefix |= static_cast<uint32_t>(d) << shift;
  if (level == LEVELS - 1) finish_search(s, P, true, s.prefix, s.above_m, c[d - base]);
  W.rows[b] = s;
}

}  // namespace
