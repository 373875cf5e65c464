// Plain-CUDA twin of csrc/cpu/sampling.cc (same contract; API in ppo_cuda.h), several blocks per
// row (sampling_parts.cuh: blocks_per_row). Kernels, in stream order:
//   chunk_stats   (row, chunk): online max/sum-exp of raw/T and work/T, greedy arg-max.
//   row_begin     (row): merges them: log-sum-exp, greedy token, the sampler's row state.
//   unfiltered:   chunk_weight (fixed-point mass per chunk), pick (the chunk where u * total is
//                 crossed, then an exact block scan inside it): the first id in id order.
//   top-k/top-p:  up to three radix searches over the probability's float bits (3 levels of
//                 11/10/10 bits; radix_hist + radix_select per level): the k-th largest key
//                 (counts), the top-p cut (mass >= top_p * kept mass), and the drawn rank
//                 (mass > u * kept mass); ties at a key are ranked by id. Then chunk_weight +
//                 pick find the j-th id holding the drawn key. No pass per kept token, no cap.
// Masses are probabilities in 2^-47 fixed point summed as integers: the result does not depend
// on the order of additions, so the token never depends on thread timing.
#include "sampling_parts.cuh"

namespace {

using namespace ppo_sample;
using u64 = unsigned long long;

template <typename T>
__device__ __forceinline__ RowView<T> row_view(const T* logits, const uint8_t* presence, const int64_t* rows,
                                               const Params& P, int64_t b) {
  return RowView<T>{logits, P.use_penalty ? presence + rows[b] * P.V : nullptr, &P, b};
}

// Adds x to an online (max, sum exp(x - max)): one exponential per entry, one more per new max.
__device__ __forceinline__ void add_softmax(float& m, float& s, float x) {
  if (x == -INFINITY) return;
  if (x > m) {
    s = s * __expf(m - x) + 1.f;  // m == -inf: s == 0
    m = x;
  } else {
    s += __expf(x - m);
  }
}

// One (row, chunk)'s or one thread's share of the first pass.
struct Stats {
  float m_raw, s_raw, m_w, s_w, bv;
  int64_t bi;
};

__device__ __forceinline__ void merge_stats(Stats& a, const Stats& b) {
  merge_softmax(a.m_raw, a.s_raw, b.m_raw, b.s_raw);
  merge_softmax(a.m_w, a.s_w, b.m_w, b.s_w);
  if (ppo_cuda::better(b.bv, b.bi, a.bv, a.bi)) {
    a.bv = b.bv;
    a.bi = b.bi;
  }
}

// The warp's merged Stats, in every lane.
__device__ __forceinline__ Stats warp_stats(Stats st) {
  for (int o = 16; o > 0; o >>= 1) {
    const Stats other{__shfl_xor_sync(0xffffffffu, st.m_raw, o), __shfl_xor_sync(0xffffffffu, st.s_raw, o),
                      __shfl_xor_sync(0xffffffffu, st.m_w, o),   __shfl_xor_sync(0xffffffffu, st.s_w, o),
                      __shfl_xor_sync(0xffffffffu, st.bv, o),    __shfl_xor_sync(0xffffffffu, st.bi, o)};
    merge_stats(st, other);
  }
  return st;
}

// The block's merged Stats, in thread 0 (a shuffle tree per warp, then one thread over the warps).
__device__ __forceinline__ Stats block_stats(Stats st) {
  __shared__ Stats sh[THREADS / 32];
  st = warp_stats(st);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = st;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < THREADS / 32; ++w) merge_stats(st, sh[w]);
  return st;
}

template <typename T>
__global__ void chunk_stats_kernel(const T* __restrict__ logits, const uint8_t* __restrict__ presence,
                                   const int64_t* __restrict__ rows, const int32_t* __restrict__ fin,
                                   const __grid_constant__ Params P, Work W) {
  const int64_t b = blockIdx.x, c = blockIdx.y;
  if (fin[b]) return;
  const RowView<T> row = row_view(logits, presence, rows, P, b);
  const int64_t v0 = c * P.chunk, v1 = min(P.V, v0 + P.chunk);
  const bool same = row.presence == nullptr && P.n_suppress == 0;  // work == raw
  Stats st{-INFINITY, 0.f, -INFINITY, 0.f, -INFINITY, INT64_MAX};
  for_each_entry(row, v0, v1, [&](int64_t v, float x, bool live) {
    if (!live) return;
    add_softmax(st.m_raw, st.s_raw, x * P.inv_t);
    const float w = same ? x : row.work_of(v, x);
    if (!P.do_sample) {
      if (ppo_cuda::better(w, v, st.bv, st.bi)) st.bv = w, st.bi = v;
    } else if (!same) {
      add_softmax(st.m_w, st.s_w, w * P.inv_t);
    }
  });
  if (P.do_sample && same) st.m_w = st.m_raw, st.s_w = st.s_raw;
  st = block_stats(st);
  if (threadIdx.x == 0) W.stats[b * P.nblk + c] = ChunkStats{st.m_raw, st.s_raw, st.m_w, st.s_w, st.bv, 0, st.bi};
}

constexpr int ROWS_PER_BEGIN_BLOCK = 4;  // row_begin: one warp per row

// One warp per row: merges the chunk statistics (a lane per chunk); writes finished and greedy
// rows' outputs and the sampler's row state.
template <typename T>
__global__ void row_begin_kernel(const T* __restrict__ logits, const int64_t* __restrict__ rows,
                                 const float* __restrict__ uniforms, const int32_t* __restrict__ fin,
                                 int64_t* __restrict__ tokens, float* __restrict__ logprobs,
                                 const __grid_constant__ Params P, Work W) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(ROWS_PER_BEGIN_BLOCK) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (b >= P.B) return;
  RowState s{};
  if (fin[b]) {
    if (lane == 0) {
      tokens[b] = P.pad_id;
      logprobs[b] = 0.f;
      s.done = 1;
      W.rows[b] = s;
    }
    return;
  }
  Stats st{-INFINITY, 0.f, -INFINITY, 0.f, -INFINITY, INT64_MAX};
  for (int64_t c = lane; c < P.nblk; c += 32) {
    const ChunkStats cs = W.stats[b * P.nblk + c];
    merge_stats(st, Stats{cs.m_raw, cs.s_raw, cs.m_work, cs.s_work, cs.best_v, cs.best_i});
  }
  st = warp_stats(st);
  if (lane != 0) return;
  s.lse = st.m_raw + logf(st.s_raw);
  s.mw = st.m_w;
  s.inv_z = 1.f / st.s_w;
  s.u = uniforms[P.step * P.B0 + rows[b]];
  s.kind = P.use_top_k ? KIND_TOPK : KIND_TOPP;
  if (!P.do_sample) {
    const int64_t t = st.bi == INT64_MAX ? 0 : st.bi;
    tokens[b] = t;
    logprobs[b] = RowView<T>{logits, nullptr, &P, b}.raw(t) * P.inv_t - s.lse;
    s.done = 1;
  }
  W.rows[b] = s;
}

// Per (row, chunk): sum of an entry weight over the chunk: its fixed-point mass (TIE false) or
// 1 where its key is the row's pick_key (TIE true).
template <typename T, bool TIE>
__global__ void chunk_weight_kernel(const T* __restrict__ logits, const uint8_t* __restrict__ presence,
                                    const int64_t* __restrict__ rows, const __grid_constant__ Params P, Work W) {
  const int64_t b = blockIdx.x, c = blockIdx.y;
  const RowState s = W.rows[b];
  if (s.done) return;
  const RowView<T> row = row_view(logits, presence, rows, P, b);
  const int64_t v0 = c * P.chunk, v1 = min(P.V, v0 + P.chunk);
  u64 sum = 0;
  for_each_entry(row, v0, v1, [&](int64_t v, float x, bool live) {
    if (!live) return;
    const uint32_t key = prob_key(row.work_of(v, x), P.inv_t, s.mw, s.inv_z);
    sum += TIE ? (key == s.pick_key ? 1ull : 0ull) : key_mass(key);
  });
  const u64 excl = block_exclusive_scan(sum, false);
  if (threadIdx.x == THREADS - 1) W.chunk_w[b * P.nblk + c] = excl + sum;
}

// Calls f(v, x) for v = a0..a1-1 in order (x the raw logit) until it returns true; 16-byte loads
// with P.vec (a0 a multiple of 8).
template <typename T, typename F>
__device__ __forceinline__ void segment_entries(const RowView<T>& row, int64_t a0, int64_t a1, F&& f) {
  constexpr int N = 16 / sizeof(T);
  if (!row.P->vec) {
    for (int64_t v = a0; v < a1; ++v)
      if (f(v, row.raw(v))) return;
    return;
  }
  const T* base = row.logits + row.b * row.P->V;
  for (int64_t v = a0; v < a1; v += N) {
    const int4 raw = *reinterpret_cast<const int4*>(base + v);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (v + i < a1 && f(v + i, ppo_cuda::to_f(e[i]))) return;
  }
}

// Per row: the first id whose cumulative weight (id order) exceeds the target: u * total mass
// (TIE false: unfiltered sampling), or pick_rank - 1 (TIE true: the pick_rank-th id with pick_key).
// Writes the token and its raw log-prob.
template <typename T, bool TIE>
__global__ void pick_kernel(const T* __restrict__ logits, const uint8_t* __restrict__ presence,
                            const int64_t* __restrict__ rows, int64_t* __restrict__ tokens,
                            float* __restrict__ logprobs, const __grid_constant__ Params P, Work W) {
  const int64_t b = blockIdx.x;
  const RowState s = W.rows[b];
  if (s.done) return;
  __shared__ int64_t chunk_sh, picked;
  __shared__ u64 rem_sh;
  if (threadIdx.x == 0) {
    u64 total = 0;
    for (int64_t c = 0; c < P.nblk; ++c) total += W.chunk_w[b * P.nblk + c];
    const u64 target = TIE ? s.pick_rank - 1 : static_cast<u64>(static_cast<double>(s.u) * static_cast<double>(total));
    u64 cum = 0;
    int64_t chunk = -1;
    for (int64_t c = 0; c < P.nblk && chunk < 0; ++c) {
      const u64 w = W.chunk_w[b * P.nblk + c];
      if (cum + w > target) chunk = c;
      else cum += w;
    }
    chunk_sh = chunk;
    rem_sh = target - cum;
    picked = -1;
  }
  __syncthreads();
  const int64_t chunk = chunk_sh;
  const u64 rem = rem_sh;
  if (chunk >= 0) {
    const RowView<T> row = row_view(logits, presence, rows, P, b);
    const int64_t v0 = chunk * P.chunk, v1 = min(P.V, v0 + P.chunk);
    const int64_t seg = ((v1 - v0 + THREADS - 1) / THREADS + 7) / 8 * 8;  // 16-byte aligned segments
    const int64_t a0 = min(v1, v0 + threadIdx.x * seg), a1 = min(v1, a0 + seg);
    auto weight = [&](int64_t v, float x) -> u64 {
      const uint32_t key = prob_key(row.work_of(v, x), P.inv_t, s.mw, s.inv_z);
      return TIE ? (key == s.pick_key ? 1ull : 0ull) : key_mass(key);
    };
    u64 sum = 0;
    segment_entries(row, a0, a1, [&](int64_t v, float x) {
      sum += weight(v, x);
      return false;
    });
    u64 run = block_exclusive_scan(sum, false);
    if (run <= rem && rem < run + sum)  // exactly one thread: the integer ranges partition the chunk
      segment_entries(row, a0, a1, [&](int64_t v, float x) {
        run += weight(v, x);
        if (run > rem) picked = v;
        return run > rem;
      });
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int64_t t = picked >= 0 ? picked : 0;  // -1 only when every probability is 0
    tokens[b] = t;
    logprobs[b] = RowView<T>{logits, nullptr, &P, b}.raw(t) * P.inv_t - s.lse;
  }
}

}  // namespace

#include "sampling_radix.cuh"

namespace {

int64_t n_searches(const Params& P) { return (P.use_top_k ? 1 : 0) + (P.use_top_p ? 1 : 0) + 1; }

template <typename T>
int launch(const T* logits, const uint8_t* presence, const int64_t* rows, const float* uniforms,
           const int32_t* fin, int64_t* tokens, float* logprobs, Params P, Work W, cudaStream_t stream) {
  P.vec = !P.cols && reinterpret_cast<uintptr_t>(logits) % 16 == 0 && (P.V * sizeof(T)) % 16 == 0;
  const dim3 grid(static_cast<unsigned>(P.B), static_cast<unsigned>(P.nblk));
  const unsigned row_blocks = static_cast<unsigned>((P.B + ROWS_PER_BEGIN_BLOCK - 1) / ROWS_PER_BEGIN_BLOCK);
  chunk_stats_kernel<T><<<grid, THREADS, 0, stream>>>(logits, presence, rows, fin, P, W);
  row_begin_kernel<T><<<row_blocks, 32 * ROWS_PER_BEGIN_BLOCK, 0, stream>>>(logits, rows, uniforms, fin, tokens,
                                                                            logprobs, P, W);
  if (!P.do_sample) return ppo_cuda::status(cudaGetLastError());
  if (!P.use_top_k && !P.use_top_p) {
    chunk_weight_kernel<T, false><<<grid, THREADS, 0, stream>>>(logits, presence, rows, P, W);
    pick_kernel<T, false><<<static_cast<unsigned>(P.B), THREADS, 0, stream>>>(logits, presence, rows, tokens,
                                                                             logprobs, P, W);
    return ppo_cuda::status(cudaGetLastError());
  }
  // hist_c and hist_m are adjacent (B * BINS * 8 bytes is a multiple of 256): one memset
  const cudaError_t e = cudaMemsetAsync(W.hist_c, 0, static_cast<size_t>(P.B) * BINS * 8 * 2, stream);
  if (e != cudaSuccess) return ppo_cuda::status(e);
  for (int64_t s = 0; s < n_searches(P); ++s)
    for (int level = 0; level < LEVELS; ++level) {
      radix_hist_kernel<T><<<grid, THREADS, 0, stream>>>(logits, presence, rows, P, W, level);
      radix_select_kernel<<<static_cast<unsigned>(P.B), THREADS, 0, stream>>>(P, W, level);
    }
  chunk_weight_kernel<T, true><<<grid, THREADS, 0, stream>>>(logits, presence, rows, P, W);
  pick_kernel<T, true><<<static_cast<unsigned>(P.B), THREADS, 0, stream>>>(logits, presence, rows, tokens, logprobs,
                                                                          P, W);
  return ppo_cuda::status(cudaGetLastError());
}

// Validates the arguments into P; false when they break ppo_cuda.h's contract.
bool make_params(Params& P, int64_t B, int64_t V, int64_t B0, int64_t step, float temperature, int64_t top_k,
                 float top_p, float penalty, int do_sample, int64_t pad_id, const int64_t* suppress,
                 int64_t n_suppress, int cols, const uint8_t* presence) {
  if (B < 0 || V <= 0 || V > MAX_VOCAB || B0 <= 0 || step < 0 || !(temperature > 0.f) || n_suppress < 0 ||
      n_suppress > MAX_SUPPRESS || (n_suppress > 0 && suppress == nullptr) || B > 0x7fffffff)
    return false;
  P.V = V;
  P.B = B;
  P.B0 = B0;
  P.step = step;
  P.top_k = top_k;
  P.pad_id = pad_id;
  P.temperature = temperature;
  P.inv_t = 1.f / temperature;
  P.vec = false;  // set per dtype by launch
  P.top_p = top_p;
  P.penalty = penalty;
  P.do_sample = do_sample != 0;
  P.use_penalty = penalty != 1.0f;
  P.cols = cols != 0;
  P.use_top_k = top_k > 0 && top_k < V;
  P.use_top_p = top_p < 1.0f;
  P.nblk = blocks_per_row(V);
  P.chunk = chunk_size(V);
  P.n_suppress = 0;
  for (int64_t s = 0; s < n_suppress; ++s)
    if (suppress[s] >= 0 && suppress[s] < V) P.suppress[P.n_suppress++] = suppress[s];
  return !(P.use_penalty && presence == nullptr);
}

}  // namespace

extern "C" int64_t ppo_cuda_sample_workspace_bytes(int64_t B, int64_t V) {
  if (B < 0 || V <= 0 || V > MAX_VOCAB) return -1;
  return static_cast<int64_t>(workspace_bytes(B, V));
}

extern "C" int64_t ppo_cuda_sample_blocks_per_row(int64_t V) {
  return V <= 0 || V > MAX_VOCAB ? -1 : blocks_per_row(V);
}

extern "C" int ppo_cuda_sample_ws(int dtype, const void* logits, const uint8_t* presence, const int64_t* rows,
                                  const float* uniforms, const int32_t* finished, int64_t* tokens, float* logprobs,
                                  int64_t B, int64_t V, int64_t B0, int64_t step, float temperature, int64_t top_k,
                                  float top_p, float penalty, int do_sample, int64_t pad_id, const int64_t* suppress,
                                  int64_t n_suppress, int cols, void* workspace, int64_t workspace_bytes_,
                                  cudaStream_t stream) {
  Params P;
  if (!make_params(P, B, V, B0, step, temperature, top_k, top_p, penalty, do_sample, pad_id, suppress, n_suppress,
                   cols, presence))
    return ppo_cuda::invalid();
  if (dtype < PPO_CUDA_FLOAT32 || dtype > PPO_CUDA_BFLOAT16) return ppo_cuda::invalid();
  if (B == 0) return 0;
  if (workspace == nullptr || workspace_bytes_ < static_cast<int64_t>(workspace_bytes(B, V)))
    return ppo_cuda::invalid();
  const Work W = carve(workspace, B, V);
  int rc = 0;
  PPO_CUDA_DISPATCH(dtype, [&] {
    rc = launch(static_cast<const scalar_t*>(logits), P.use_penalty ? presence : nullptr, rows, uniforms, finished,
                tokens, logprobs, P, W, stream);
  });
  return rc;
}

extern "C" int ppo_cuda_sample(int dtype, const void* logits, const uint8_t* presence, const int64_t* rows,
                               const float* uniforms, const int32_t* finished, int64_t* tokens, float* logprobs,
                               int64_t B, int64_t V, int64_t B0, int64_t step, float temperature, int64_t top_k,
                               float top_p, float penalty, int do_sample, int64_t pad_id, const int64_t* suppress,
                               int64_t n_suppress, int cols, cudaStream_t stream) {
  Params P;
  if (!make_params(P, B, V, B0, step, temperature, top_k, top_p, penalty, do_sample, pad_id, suppress, n_suppress,
                   cols, presence) ||
      dtype < PPO_CUDA_FLOAT32 || dtype > PPO_CUDA_BFLOAT16)
    return ppo_cuda::invalid();
  if (B == 0) return 0;
  const size_t bytes = workspace_bytes(B, V);
  void* ws = nullptr;
  cudaError_t e = cudaMallocAsync(&ws, bytes, stream);
  if (e != cudaSuccess) return ppo_cuda::status(e);
  const int rc = ppo_cuda_sample_ws(dtype, logits, presence, rows, uniforms, finished, tokens, logprobs, B, V, B0,
                                    step, temperature, top_k, top_p, penalty, do_sample, pad_id, suppress, n_suppress,
                                    cols, ws, static_cast<int64_t>(bytes), stream);
  e = cudaFreeAsync(ws, stream);
  return rc != 0 ? rc : ppo_cuda::status(e);
}
