// Plain-CUDA twin of csrc/cpu/attention.cc (same contract: RoPE, in-place K^T/V cache write,
// masked attention over the cache, optional q/k/v bias, rows or cols layout, finished rows
// skipped; API in ppo_cuda.h). Launches on the caller's stream: (1) write the fed tokens' K/V
// into the cache; (2) for bf16/fp16 prefill (>= 16 tokens, head_dim 64/128) tensor-core
// attention (attention_prefill.cuh); otherwise split-K attention (attention_split.cuh): one
// block per (row, query, KV group's heads, cache chunk) with an online softmax, and (3) when the
// cache is split, a merge of the chunks' partial states. The split plan gives the grid about two
// blocks per SM.
#include "common.cuh"

namespace {

struct Geom {
  int64_t B, Tq, W, nh, nkv, hd, S, Tp, P, grp, layer, t0, layout;
  bool cols;
  float scale;
};

__device__ __forceinline__ int64_t q_off(const Geom& g, int64_t h) {
  return g.layout == 0 ? h * g.hd : ((h / g.grp) * (g.grp + 2) + (h % g.grp)) * g.hd;
}
__device__ __forceinline__ int64_t k_off(const Geom& g, int64_t kv) {
  return g.layout == 0 ? (g.nh + kv) * g.hd : (kv * (g.grp + 2) + g.grp) * g.hd;
}
__device__ __forceinline__ int64_t v_off(const Geom& g, int64_t kv) {
  return g.layout == 0 ? (g.nh + g.nkv + kv) * g.hd : (kv * (g.grp + 2) + g.grp + 1) * g.hd;
}
// element c of token (b, i) in qkv, plus its bias
template <typename T>
__device__ __forceinline__ float qkv_at(const T* qkv, const T* bias, const Geom& g, int64_t b, int64_t i, int64_t c) {
  const int64_t idx = g.cols ? c * g.B + b : (b * g.Tq + i) * g.W + c;
  float v = ppo_cuda::to_f(qkv[idx]);
  if (bias) v += ppo_cuda::to_f(bias[c]);
  return v;
}
__device__ __forceinline__ int64_t clip_pos(int64_t p, int64_t P) { return p < 0 ? 0 : (p >= P ? P - 1 : p); }

// rotate_half RoPE of element d of a head vector starting at column `base`
template <typename T>
__device__ __forceinline__ float rope_at(const T* qkv, const T* bias, const Geom& g, int64_t b, int64_t i,
                                         int64_t base, int64_t d, const T* cos_row, const T* sin_row) {
  const int64_t h2 = g.hd / 2;
  const float x = qkv_at(qkv, bias, g, b, i, base + d);
  const float rot = d < h2 ? -qkv_at(qkv, bias, g, b, i, base + d + h2) : qkv_at(qkv, bias, g, b, i, base + d - h2);
  return x * ppo_cuda::to_f(cos_row[d]) + rot * ppo_cuda::to_f(sin_row[d]);
}

template <typename T>
__global__ void write_kv_kernel(const T* __restrict__ qkv, const T* __restrict__ bias, T* __restrict__ kc,
                                T* __restrict__ vc, const T* __restrict__ cos, const T* __restrict__ sin,
                                const int64_t* __restrict__ pos, const int32_t* __restrict__ fin, Geom g) {
  const int64_t b = blockIdx.x, i = blockIdx.y, kv = blockIdx.z;
  if (fin[b]) return;
  const int64_t p = clip_pos(pos[b * g.Tq + i], g.P);
  const int64_t slot = g.t0 + i;
  const int64_t slab = ((g.layer * g.B + b) * g.nkv + kv) * g.S * g.hd;
  for (int64_t d = threadIdx.x; d < g.hd; d += blockDim.x) {
    const float k = rope_at(qkv, bias, g, b, i, k_off(g, kv), d, cos + p * g.hd, sin + p * g.hd);
    kc[slab + d * g.S + slot] = ppo_cuda::from_f<T>(k);
    vc[slab + slot * g.hd + d] = ppo_cuda::from_f<T>(qkv_at(qkv, bias, g, b, i, v_off(g, kv) + d));
  }
}

constexpr int MAX_HD = PPO_CUDA_MAX_HEAD_DIM;

}  // namespace

#include "attention_prefill.cuh"
#include "attention_split.cuh"

namespace {

constexpr int64_t MAX_SPLITS = 64;

// The largest divisor of the group size that is at most MAX_HPB: q heads served by one block.
int64_t heads_per_block(int64_t grp) {
  for (int64_t h = grp < MAX_HPB ? grp : MAX_HPB; h > 1; --h)
    if (grp % h == 0) return h;
  return 1;
}

int64_t keys_per_thread(int dtype) { return dtype == PPO_CUDA_FLOAT32 ? 4 : 8; }  // one 16-byte load

bool valid_args(int dtype, int64_t B, int64_t Tq, int64_t nh, int64_t nkv, int64_t hd, int64_t S, int64_t Tp,
                int64_t P, int64_t layer, int64_t t0, int64_t layout, int cols) {
  return !(dtype < PPO_CUDA_FLOAT32 || dtype > PPO_CUDA_BFLOAT16 || B < 0 || Tq <= 0 || nkv <= 0 || nh % nkv != 0 ||
           hd <= 0 || hd > MAX_HD || hd % 2 != 0 || P <= 0 || layer < 0 || t0 < 0 || t0 + Tq > S || Tp < 0 ||
           (cols && Tq != 1) || layout < 0 || layout > 1 || B * Tq > 0x7fffffff || Tq > 65535 || nh > 65535 ||
           nkv > 65535);
}

// Split plan of the current device: fills sp (no part pointer) and the workspace bytes it needs.
int plan_splits(int dtype, int64_t B, int64_t Tq, int64_t nh, int64_t nkv, int64_t hd, int64_t t0, Split& sp,
                int64_t& ws_bytes) {
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return ppo_cuda::status(e);
  sp.hpb = heads_per_block(nh / nkv);
  sp.n_hg = nh / nkv / sp.hpb;
  sp.splits = ppo_cuda_attention_split_plan(t0 + Tq, B * Tq * nkv * sp.n_hg, SPLIT_THREADS * keys_per_thread(dtype),
                                            sms, &sp.chunk);
  sp.part = nullptr;
  ws_bytes = sp.splits > 1 ? B * Tq * nh * sp.splits * (hd + 2) * static_cast<int64_t>(sizeof(float)) : 0;
  return 0;
}

template <typename T>
void launch_attend(const T* pq, const T* pb, const T* kc, const T* vc, const T* pc, const T* ps, const int64_t* pos,
                   const int32_t* mask, const int32_t* fin, T* out, const Geom& g, const Split& sp, bool vec,
                   cudaStream_t stream) {
  if (launch_prefill_mma<T>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g, stream)) return;
  const dim3 grid(static_cast<unsigned>(g.B * g.Tq), static_cast<unsigned>(g.nkv * sp.n_hg),
                  static_cast<unsigned>(sp.splits));
  if (vec)
    split_attend_kernel<T, 16 / sizeof(T), 8><<<grid, SPLIT_THREADS, 0, stream>>>(pq, pb, kc, vc, pc, ps, pos, mask,
                                                                                 fin, out, g, sp);
  else
    split_attend_kernel<T, 1, 2><<<grid, SPLIT_THREADS, 0, stream>>>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g,
                                                                    sp);
  if (sp.splits > 1)
    merge_kernel<T><<<dim3(static_cast<unsigned>(g.B * g.Tq), static_cast<unsigned>(g.nh)), 64, 0, stream>>>(
        fin, out, g, sp);
}

}  // namespace

extern "C" int64_t ppo_cuda_attention_split_plan(int64_t max_keys, int64_t base_blocks, int64_t tile,
                                                 int64_t sm_count, int64_t* chunk) {
  if (max_keys <= 0 || base_blocks <= 0 || tile <= 0 || sm_count <= 0) return -1;
  const int64_t most = (max_keys + tile - 1) / tile;  // at least one tile of keys per chunk
  int64_t splits = (2 * sm_count + base_blocks - 1) / base_blocks;
  splits = splits < 1 ? 1 : (splits > most ? most : (splits > MAX_SPLITS ? MAX_SPLITS : splits));
  const int64_t per = (max_keys + splits - 1) / splits;
  const int64_t c = (per + tile - 1) / tile * tile;
  if (chunk) *chunk = c;
  return (max_keys + c - 1) / c;
}

extern "C" int ppo_cuda_attention_workspace_bytes(int dtype, int64_t B, int64_t Tq, int64_t num_heads,
                                                  int64_t num_kv_heads, int64_t head_dim, int64_t t0,
                                                  int64_t* bytes) {
  if (bytes == nullptr || dtype < PPO_CUDA_FLOAT32 || dtype > PPO_CUDA_BFLOAT16 || B < 0 || Tq <= 0 ||
      num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || head_dim <= 0 || t0 < 0)
    return ppo_cuda::invalid();
  *bytes = 0;
  if (B == 0) return 0;
  Split sp;
  return plan_splits(dtype, B, Tq, num_heads, num_kv_heads, head_dim, t0, sp, *bytes);
}

extern "C" int ppo_cuda_attention_ws(int dtype, const void* qkv, const void* bias, void* k_cache, void* v_cache,
                                     const void* cos, const void* sin, const int64_t* pos, const int32_t* key_mask,
                                     const int32_t* finished, void* out, int64_t B, int64_t Tq, int64_t num_heads,
                                     int64_t num_kv_heads, int64_t head_dim, int64_t S, int64_t Tp, int64_t P,
                                     int64_t layer, int64_t t0, int64_t layout, float scale, int cols,
                                     void* workspace, int64_t workspace_bytes, cudaStream_t stream) {
  if (!valid_args(dtype, B, Tq, num_heads, num_kv_heads, head_dim, S, Tp, P, layer, t0, layout, cols))
    return ppo_cuda::invalid();
  if (B == 0) return 0;
  Split sp;
  int64_t need = 0;
  const int rc = plan_splits(dtype, B, Tq, num_heads, num_kv_heads, head_dim, t0, sp, need);
  if (rc != 0) return rc;
  if (need > 0 && (workspace == nullptr || workspace_bytes < need)) return ppo_cuda::invalid();
  sp.part = static_cast<float*>(workspace);
  Geom g;
  g.B = B;
  g.Tq = Tq;
  g.nh = num_heads;
  g.nkv = num_kv_heads;
  g.hd = head_dim;
  g.W = (num_heads + 2 * num_kv_heads) * head_dim;
  g.S = S;
  g.Tp = Tp;
  g.P = P;
  g.grp = num_heads / num_kv_heads;
  g.layer = layer;
  g.t0 = t0;
  g.layout = layout;
  g.cols = cols != 0;
  g.scale = scale;
  // 16-byte loads: K^T rows hold S keys (S a multiple of a load), V rows hd dims (a multiple of 8)
  const bool vec = S % keys_per_thread(dtype) == 0 && head_dim % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(k_cache) % 16 == 0 && reinterpret_cast<uintptr_t>(v_cache) % 16 == 0;
  const unsigned ub = static_cast<unsigned>(B), uq = static_cast<unsigned>(Tq);
  PPO_CUDA_DISPATCH(dtype, [&] {
    const scalar_t* pq = static_cast<const scalar_t*>(qkv);
    const scalar_t* pb = static_cast<const scalar_t*>(bias);
    const scalar_t* pc = static_cast<const scalar_t*>(cos);
    const scalar_t* ps = static_cast<const scalar_t*>(sin);
    scalar_t* kc = static_cast<scalar_t*>(k_cache);
    scalar_t* vc = static_cast<scalar_t*>(v_cache);
    write_kv_kernel<scalar_t><<<dim3(ub, uq, static_cast<unsigned>(num_kv_heads)), 64, 0, stream>>>(
        pq, pb, kc, vc, pc, ps, pos, finished, g);
    launch_attend<scalar_t>(pq, pb, kc, vc, pc, ps, pos, key_mask, finished, static_cast<scalar_t*>(out), g, sp, vec,
                            stream);
  });
  return ppo_cuda::status(cudaGetLastError());
}

extern "C" int ppo_cuda_attention(int dtype, const void* qkv, const void* bias, void* k_cache, void* v_cache,
                                  const void* cos, const void* sin, const int64_t* pos, const int32_t* key_mask,
                                  const int32_t* finished, void* out, int64_t B, int64_t Tq, int64_t num_heads,
                                  int64_t num_kv_heads, int64_t head_dim, int64_t S, int64_t Tp, int64_t P,
                                  int64_t layer, int64_t t0, int64_t layout, float scale, int cols,
                                  cudaStream_t stream) {
  if (!valid_args(dtype, B, Tq, num_heads, num_kv_heads, head_dim, S, Tp, P, layer, t0, layout, cols))
    return ppo_cuda::invalid();
  if (B == 0) return 0;
  int64_t bytes = 0;
  int rc = ppo_cuda_attention_workspace_bytes(dtype, B, Tq, num_heads, num_kv_heads, head_dim, t0, &bytes);
  if (rc != 0) return rc;
  void* ws = nullptr;
  if (bytes > 0) {
    const cudaError_t e = cudaMallocAsync(&ws, static_cast<size_t>(bytes), stream);
    if (e != cudaSuccess) return ppo_cuda::status(e);
  }
  rc = ppo_cuda_attention_ws(dtype, qkv, bias, k_cache, v_cache, cos, sin, pos, key_mask, finished, out, B, Tq,
                             num_heads, num_kv_heads, head_dim, S, Tp, P, layer, t0, layout, scale, cols, ws, bytes,
                             stream);
  if (ws != nullptr) {
    const cudaError_t e = cudaFreeAsync(ws, stream);
    if (rc == 0) rc = ppo_cuda::status(e);
  }
  return rc;
}
