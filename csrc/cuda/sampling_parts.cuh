// Building blocks of the multi-block sampler (sampling.cu): the split plan, the workspace layout,
// the per-element view of a row (raw logit, penalised/suppressed logit, probability key and
// fixed-point mass) and exact integer block scans. Integer (fixed-point) masses make every sum
// independent of summation order, so the drawn token never depends on thread timing.
#pragma once

#include "common.cuh"

namespace ppo_sample {

// Tuning macros (bench/cuda_kernel_bench.py --variants builds other values beside the default):
#ifndef PPO_SAMPLE_CHUNK_TARGET
#define PPO_SAMPLE_CHUNK_TARGET 4096  // vocabulary entries per block, about (at most MAX_CHUNK)
#endif
#ifndef PPO_SAMPLE_UNROLL
#define PPO_SAMPLE_UNROLL 2  // 16-byte loads a thread has in flight in for_each_entry
#endif

constexpr int THREADS = 256;
constexpr int MAX_SUPPRESS = PPO_CUDA_MAX_SUPPRESS;
constexpr int64_t CHUNK_TARGET = PPO_SAMPLE_CHUNK_TARGET;
constexpr int LOAD_UNROLL = PPO_SAMPLE_UNROLL;
constexpr int64_t MAX_BLOCKS_PER_ROW = 64;
constexpr int LEVELS = 3;                 // radix levels over the 31 bits of a non-negative float
constexpr int BINS = 2048;                // 2^11: the widest level
constexpr float MASS_SCALE_F = 140737488355328.0f;  // 2^47: probability -> fixed point
constexpr int64_t MAX_CHUNK = 16384;  // per block: keeps the 32-bit shared histogram sums exact
constexpr int64_t MAX_VOCAB = MAX_BLOCKS_PER_ROW * MAX_CHUNK;
static_assert(MAX_VOCAB == PPO_CUDA_MAX_VOCAB, "ppo_cuda.h states the sampler's vocabulary limit");
static_assert(CHUNK_TARGET % 8 == 0 && CHUNK_TARGET >= 8 && CHUNK_TARGET <= MAX_CHUNK, "8 to MAX_CHUNK entries, a multiple of 8");
static_assert(LOAD_UNROLL >= 1 && LOAD_UNROLL <= 16, "1 to 16 loads in flight");

// Blocks per row for a vocabulary of V entries (1..64) and the chunk each block covers.
inline int64_t blocks_per_row(int64_t V) {
  const int64_t n = (V + CHUNK_TARGET - 1) / CHUNK_TARGET;
  return n < 1 ? 1 : (n > MAX_BLOCKS_PER_ROW ? MAX_BLOCKS_PER_ROW : n);
}
// A multiple of 8 entries (a chunk starts on a 16-byte boundary of a row), at most MAX_CHUNK.
inline int64_t chunk_size(int64_t V) { return ((V + blocks_per_row(V) - 1) / blocks_per_row(V) + 7) / 8 * 8; }

__host__ __device__ constexpr int level_shift(int level) { return level == 0 ? 20 : (level == 1 ? 10 : 0); }
__host__ __device__ constexpr int level_bits(int level) { return level == 0 ? 11 : 10; }

enum Kind : int32_t { KIND_TOPK = 0, KIND_TOPP = 1, KIND_DRAW = 2 };

// Per-row state of the sampler, carried between its kernels.
struct RowState {
  float lse, mw, inv_z, u;  // log-sum-exp of raw/T; max of work/T; 1 / sum exp(work/T - mw); the uniform
  int32_t done, kind;      // token written (or finished row); the current search (Kind)
  int32_t idle, pad;       // levels of the current search to skip (it ended at its first level)
  uint32_t prefix, lo_key, pick_key, pad2;  // key bits fixed so far; set floor; tie key to pick
  // the set searched: keys > lo_key plus the first lo_ties ids whose key == lo_key
  unsigned long long lo_ties, above_c, above_m, target, set_c, set_m, mass_k, pick_rank;
};

// Partial statistics of one (row, chunk).
struct ChunkStats {
  float m_raw, s_raw, m_work, s_work;  // max and sum exp(x - max) of raw/T and of work/T
  float best_v;                        // greedy: first arg-max of work in the chunk
  int32_t pad;
  int64_t best_i;
};

// Device workspace: rows [B], stats [B, nblk], chunk_w [B, nblk], hist_c / hist_m [B, BINS].
struct Work {
  RowState* rows;
  ChunkStats* stats;
  unsigned long long *chunk_w, *hist_c, *hist_m;
};

inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }

inline size_t workspace_bytes(int64_t B, int64_t V) {
  const size_t nb = static_cast<size_t>(B), nblk = static_cast<size_t>(blocks_per_row(V));
  return align256(nb * sizeof(RowState)) + align256(nb * nblk * sizeof(ChunkStats)) +
         align256(nb * nblk * 8) + 2 * align256(nb * BINS * 8);
}

inline Work carve(void* base, int64_t B, int64_t V) {
  const size_t nb = static_cast<size_t>(B), nblk = static_cast<size_t>(blocks_per_row(V));
  char* p = static_cast<char*>(base);
  Work w;
  w.rows = reinterpret_cast<RowState*>(p);
  p += align256(nb * sizeof(RowState));
  w.stats = reinterpret_cast<ChunkStats*>(p);
  p += align256(nb * nblk * sizeof(ChunkStats));
  w.chunk_w = reinterpret_cast<unsigned long long*>(p);
  p += align256(nb * nblk * 8);
  w.hist_c = reinterpret_cast<unsigned long long*>(p);
  p += align256(nb * BINS * 8);
  w.hist_m = reinterpret_cast<unsigned long long*>(p);
  return w;
}

struct Params {
  int64_t V, B, B0, step, top_k, pad_id, n_suppress, nblk, chunk;
  float temperature, inv_t, top_p, penalty;  // inv_t = 1 / temperature: every kernel scales by it
  bool do_sample, use_penalty, cols, use_top_k, use_top_p;
  bool vec;  // rows layout, aligned, rows of a multiple of 16 bytes: 16-byte loads of 16 / sizeof(T) entries
  int64_t suppress[MAX_SUPPRESS];
};

// One row of the logits with its penalty and suppression.
template <typename T>
struct RowView {
  const T* logits;
  const uint8_t* presence;  // row rows[b] of presence, or nullptr
  const Params* P;
  int64_t b;
  __device__ float raw(int64_t v) const {
    return ppo_cuda::to_f(logits[P->cols ? v * P->B + b : b * P->V + v]);
  }
  __device__ float work(int64_t v) const { return work_of(v, raw(v)); }
  // the penalised, suppressed logit of entry v whose raw logit is x
  __device__ float work_of(int64_t v, float x) const {
    if (presence && presence[v]) x = x > 0.f ? x / P->penalty : x * P->penalty;
    for (int64_t s = 0; s < P->n_suppress; ++s)
      if (P->suppress[s] == v) x = -INFINITY;
    return x;
  }
};

// Calls f(v, x, live) for the entries v0..v1-1 of row b that this thread owns (x its raw logit);
// every lane of a warp makes the same number of calls (live false on the calls past the range),
// so f may use warp-wide intrinsics. With P.vec each lane reads 16 / sizeof(T) adjacent entries
// with one 16-byte load (v0 is a multiple of 8: chunk_size); otherwise one entry per call.
template <typename T, typename F>
__device__ __forceinline__ void for_each_entry(const RowView<T>& row, int64_t v0, int64_t v1, F&& f) {
  constexpr int N = 16 / sizeof(T);
  if (row.P->vec) {
    const T* base = row.logits + row.b * row.P->V;
    const int64_t nv = (v1 - v0 + N - 1) / N;  // the last vector may be partial
#pragma unroll LOAD_UNROLL
    for (int64_t k0 = 0; k0 < nv; k0 += THREADS) {
      const int64_t k = k0 + threadIdx.x, v = v0 + k * N;
      int4 raw = make_int4(0, 0, 0, 0);
      if (k < nv) raw = *reinterpret_cast<const int4*>(base + v);  // v + N <= V: V * sizeof(T) % 16 == 0
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < N; ++i) f(v + i, ppo_cuda::to_f(e[i]), k < nv && v + i < v1);
    }
    return;
  }
  for (int64_t v0t = v0; v0t < v1; v0t += THREADS) {
    const int64_t v = v0t + threadIdx.x;
    f(v, v < v1 ? row.raw(v) : 0.f, v < v1);
  }
}

// p = exp(work/T - mw) / z as its float bits (a non-negative float orders like its bits), as
// exp(w * inv_t - mw) * inv_z: the same operations in every kernel, so each computes the same
// key for an entry (mw = max of w * inv_t over the row, so the largest entry's p is exactly 1).
__device__ __forceinline__ uint32_t prob_key(float w, float inv_t, float mw, float inv_z) {
  if (w == -INFINITY) return 0u;
  return __float_as_uint(__expf(w * inv_t - mw) * inv_z);
}
// p * 2^47 is exact in float (a power-of-two scale of p <= 1), truncated to an integer.
__device__ __forceinline__ unsigned long long key_mass(uint32_t key) {
  return __float2ull_rz(__uint_as_float(key) * MASS_SCALE_F);
}

// Exclusive prefix sum over the block's threads (blockDim.x == THREADS), exact.
__device__ __forceinline__ unsigned long long block_exclusive_scan(unsigned long long x, bool reverse) {
  __shared__ unsigned long long sh[THREADS];
  const int t = reverse ? THREADS - 1 - static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x);
  __syncthreads();
  sh[t] = x;
  __syncthreads();
  for (int o = 1; o < THREADS; o <<= 1) {
    const unsigned long long add = t >= o ? sh[t - o] : 0ull;
    __syncthreads();
    sh[t] += add;
    __syncthreads();
  }
  const unsigned long long incl = sh[t];
  __syncthreads();
  return incl - x;
}

__device__ __forceinline__ int block_max_int(int v) {
  __shared__ int sh[THREADS / 32];
  __shared__ int result;
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    int m = sh[0];
    for (int i = 1; i < THREADS / 32; ++i) m = max(m, sh[i]);
    result = m;
  }
  __syncthreads();
  return result;
}

// (max, sum exp(x - max)) merge of two online-softmax partials.
__device__ __forceinline__ void merge_softmax(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float mm = fmaxf(m, m2);
  s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
  m = mm;
}

}  // namespace ppo_sample
