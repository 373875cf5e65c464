// Building blocks of the multi-block sampler (sampling.cu): the split plan, the workspace layout,
// the per-element view of a row (raw logit, penalised/suppressed logit, probability key and
// fixed-point mass) and exact integer block scans. Integer (fixed-point) masses make every sum
// independent of summation order, so the drawn token never depends on thread timing.
#pragma once

#include "common.cuh"

namespace ppo_sample {

constexpr int THREADS = 256;
constexpr int MAX_SUPPRESS = PPO_CUDA_MAX_SUPPRESS;
constexpr int64_t CHUNK_TARGET = 4096;   // vocabulary entries per block, about
constexpr int64_t MAX_BLOCKS_PER_ROW = 64;
constexpr int LEVELS = 3;                 // radix levels over the 31 bits of a non-negative float
constexpr int BINS = 2048;                // 2^11: the widest level
constexpr float MASS_SCALE_F = 140737488355328.0f;  // 2^47: probability -> fixed point
constexpr int64_t MAX_CHUNK = 16384;  // per block: keeps the 32-bit shared histogram sums exact
constexpr int64_t MAX_VOCAB = MAX_BLOCKS_PER_ROW * MAX_CHUNK;
static_assert(MAX_VOCAB == PPO_CUDA_MAX_VOCAB, "ppo_cuda.h states the sampler's vocabulary limit");

// Blocks per row for a vocabulary of V entries (1..64) and the chunk each block covers.
inline int64_t blocks_per_row(int64_t V) {
  const int64_t n = (V + CHUNK_TARGET - 1) / CHUNK_TARGET;
  return n < 1 ? 1 : (n > MAX_BLOCKS_PER_ROW ? MAX_BLOCKS_PER_ROW : n);
}
inline int64_t chunk_size(int64_t V) { return (V + blocks_per_row(V) - 1) / blocks_per_row(V); }

__host__ __device__ constexpr int level_shift(int level) { return level == 0 ? 20 : (level == 1 ? 10 : 0); }
__host__ __device__ constexpr int level_bits(int level) { return level == 0 ? 11 : 10; }

enum Kind : int32_t { KIND_TOPK = 0, KIND_TOPP = 1, KIND_DRAW = 2 };

// Per-row state of the sampler, carried between its kernels.
struct RowState {
  float lse, mw, z, u;  // log-sum-exp of raw/T; max of work/T; sum exp(work/T - mw); the uniform
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
  float temperature, top_p, penalty;
  bool do_sample, use_penalty, cols, use_top_k, use_top_p;
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
  __device__ float work(int64_t v) const {
    float x = raw(v);
    if (presence && presence[v]) x = x > 0.f ? x / P->penalty : x * P->penalty;
    for (int64_t s = 0; s < P->n_suppress; ++s)
      if (P->suppress[s] == v) x = -INFINITY;
    return x;
  }
};

// p = exp(work/T - mw) / z as its float bits (a non-negative float orders like its bits); the
// same explicit roundings everywhere, so every kernel computes the same key for an entry.
__device__ __forceinline__ uint32_t prob_key(float w, float T, float mw, float z) {
  if (w == -INFINITY) return 0u;
  const float p = __fdiv_rn(__expf(__fsub_rn(__fdiv_rn(w, T), mw)), z);
  return __float_as_uint(p);
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
