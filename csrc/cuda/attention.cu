// Plain-CUDA twin of csrc/cpu/attention.cc (same contract: RoPE, in-place K^T/V cache write,
// masked attention over the cache, optional q/k/v bias, rows or cols layout, finished rows
// skipped; API in ppo_cuda.h). Launches on the caller's stream: (1) write the fed tokens' K/V
// into the cache; (2) attention over the cache: for bf16/fp16 with head_dim 64/128, 16-byte
// aligned caches of a length that is a multiple of 8 and an sm_80+ GPU, on tensor cores
// (attention_mma.cuh: decode and prefill); otherwise on CUDA cores (attention_split.cuh: one
// block per (row, query, KV group's heads, cache chunk)); (3) when the cache is split into
// chunks across blocks, a merge of the chunks' partial states.
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
// Output element (query i of row b, q head h, dim d) and a split's partial state
// [B*Tq, nh, splits, hd + 2] (acc..., max, sum) of (row-query z, head h).
__device__ __forceinline__ int64_t out_index(const Geom& g, int64_t b, int64_t i, int64_t h, int64_t d) {
  return g.cols ? (h * g.hd + d) * g.B + b : (b * g.Tq + i) * g.nh * g.hd + h * g.hd + d;
}
__device__ __forceinline__ float* part_ptr(const Geom& g, float* part, int64_t splits, int64_t z, int64_t h,
                                           int64_t split) {
  return part + ((z * g.nh + h) * splits + split) * (g.hd + 2);
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

#include "attention_mma.cuh"  // includes attention_split.cuh

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

struct DeviceFacts {
  int sms, major;
};

int device_facts(DeviceFacts& d) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
  return ppo_cuda::status(e);
}

// The tensor-core kernel's types, head sizes and GPUs (it also needs 16-byte cache rows, checked at launch).
bool mma_shapes(int dtype, int64_t hd, int major) {
#ifdef PPO_ATTENTION_NO_MMA  // a bench variant: the CUDA-core kernel for every type
  return false;
#endif
  return dtype != PPO_CUDA_FLOAT32 && (hd == 64 || hd == 128) && major >= 8;
}

int64_t part_bytes(int64_t B, int64_t Tq, int64_t nh, int64_t hd, int64_t splits) {
  return splits > 1 ? B * Tq * nh * splits * (hd + 2) * static_cast<int64_t>(sizeof(float)) : 0;
}

// The CUDA-core kernel's plan: heads per block and cache chunks (about two blocks per SM).
void plan_cuda_cores(int dtype, int64_t B, int64_t Tq, int64_t nh, int64_t nkv, int64_t t0, int sms, Split& sp) {
  sp.hpb = heads_per_block(nh / nkv);
  sp.n_hg = nh / nkv / sp.hpb;
  sp.splits = ppo_cuda_attention_split_plan(t0 + Tq, B * Tq * nkv * sp.n_hg, SPLIT_THREADS * keys_per_thread(dtype),
                                            sms, &sp.chunk);
  sp.part = nullptr;
}

// The tensor-core kernel's plan: 1-warp blocks while a (row, KV head) has fewer than 64 (query,
// head) rows (decode), 4-warp blocks otherwise; cache chunks for enough blocks to fill the GPU.
void plan_mma(int64_t B, int64_t Tq, int64_t nh, int64_t nkv, int64_t t0, int sms, MmaPlan& mp) {
  const int64_t rows = Tq * (nh / nkv);
  mp.warps = rows >= 64 ? 4 : 1;
  mp.row_blocks = (rows + 16 * mp.warps - 1) / (16 * mp.warps);
  const int64_t per_sm = mp.warps == 1 ? PPO_MMA_DECODE_BLOCKS_PER_SM : 2;  // the plan aims at 2 per "SM"
  mp.splits = ppo_cuda_attention_split_plan(t0 + Tq, B * nkv * mp.row_blocks, MMA_TK, sms * per_sm / 2, &mp.chunk);
  mp.part = nullptr;
}

// Workspace bytes for either kernel (the launch picks one once it sees the caches).
int workspace_need(int dtype, int64_t B, int64_t Tq, int64_t nh, int64_t nkv, int64_t hd, int64_t t0,
                   int64_t& bytes) {
  DeviceFacts dev;
  const int rc = device_facts(dev);
  if (rc != 0) return rc;
  Split sp;
  plan_cuda_cores(dtype, B, Tq, nh, nkv, t0, dev.sms, sp);
  bytes = part_bytes(B, Tq, nh, hd, sp.splits);
  if (mma_shapes(dtype, hd, dev.major)) {
    MmaPlan mp;
    plan_mma(B, Tq, nh, nkv, t0, dev.sms, mp);
    const int64_t m = part_bytes(B, Tq, nh, hd, mp.splits);
    bytes = m > bytes ? m : bytes;
  }
  return 0;
}

template <typename T, int KPT, int DV>
void launch_split_kernel(const T* pq, const T* pb, const T* kc, const T* vc, const T* pc, const T* ps,
                         const int64_t* pos, const int32_t* mask, const int32_t* fin, T* out, const Geom& g,
                         const Split& sp, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(g.B * g.Tq), static_cast<unsigned>(g.nkv * sp.n_hg),
                  static_cast<unsigned>(sp.splits));
  const auto args = [&](auto kernel) {
    kernel<<<grid, SPLIT_THREADS, 0, stream>>>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g, sp);
  };
  if (sp.hpb == 1) args(split_attend_kernel<T, KPT, DV, 1>);
  else if (sp.hpb == 2) args(split_attend_kernel<T, KPT, DV, 2>);
  else if (sp.hpb <= 4) args(split_attend_kernel<T, KPT, DV, 4>);
  else args(split_attend_kernel<T, KPT, DV, 8>);
}

// Attention over the cache (after the K/V write) and, for a split cache, the merge.
template <typename T>
cudaError_t launch_attend(const T* pq, const T* pb, const T* kc, const T* vc, const T* pc, const T* ps,
                          const int64_t* pos, const int32_t* mask, const int32_t* fin, T* out, const Geom& g,
                          bool use_mma, const MmaPlan& mp, const Split& sp, bool vec, cudaStream_t stream) {
  Split merge = sp;
  if (use_mma) {
    const cudaError_t e = launch_mma<T>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g, mp, stream);
    if (e != cudaSuccess) return e;
    merge.splits = mp.splits;
    merge.part = mp.part;
  } else if (vec) {
    launch_split_kernel<T, 16 / sizeof(T), 8>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g, sp, stream);
  } else {
    launch_split_kernel<T, 1, 2>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g, sp, stream);
  }
  if (merge.splits > 1)
    merge_kernel<T><<<dim3(static_cast<unsigned>(g.B * g.Tq), static_cast<unsigned>(g.nh)), 64, 0, stream>>>(
        fin, out, g, merge);
  return cudaGetLastError();
}

Geom make_geom(int64_t B, int64_t Tq, int64_t nh, int64_t nkv, int64_t hd, int64_t S, int64_t Tp, int64_t P,
               int64_t layer, int64_t t0, int64_t layout, float scale, int cols) {
  Geom g;
  g.B = B;
  g.Tq = Tq;
  g.nh = nh;
  g.nkv = nkv;
  g.hd = hd;
  g.W = (nh + 2 * nkv) * hd;
  g.S = S;
  g.Tp = Tp;
  g.P = P;
  g.grp = nh / nkv;
  g.layer = layer;
  g.t0 = t0;
  g.layout = layout;
  g.cols = cols != 0;
  g.scale = scale;
  return g;
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
  return workspace_need(dtype, B, Tq, num_heads, num_kv_heads, head_dim, t0, *bytes);
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
  DeviceFacts dev;
  int rc = device_facts(dev);
  if (rc != 0) return rc;
  const Geom g = make_geom(B, Tq, num_heads, num_kv_heads, head_dim, S, Tp, P, layer, t0, layout, scale, cols);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // 16-byte loads: K^T rows hold S keys (S a multiple of a load), V rows hd dims (a multiple of 8)
  const bool vec = S % keys_per_thread(dtype) == 0 && head_dim % 8 == 0 && aligned(k_cache) && aligned(v_cache);
  Split sp;
  MmaPlan mp;
  plan_cuda_cores(dtype, B, Tq, num_heads, num_kv_heads, t0, dev.sms, sp);
  plan_mma(B, Tq, num_heads, num_kv_heads, t0, dev.sms, mp);
  const bool use_mma = mma_shapes(dtype, head_dim, dev.major) && S % 8 == 0 && aligned(k_cache) &&
                       aligned(v_cache) && B * num_kv_heads * mp.row_blocks <= 0x7fffffff;
  const int64_t need = part_bytes(B, Tq, num_heads, head_dim, use_mma ? mp.splits : sp.splits);
  if (need > 0 && (workspace == nullptr || workspace_bytes < need)) return ppo_cuda::invalid();
  sp.part = mp.part = static_cast<float*>(workspace);
  mp.q_vec = cols == 0 && aligned(qkv) && aligned(cos) && aligned(sin) && (bias == nullptr || aligned(bias));
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
    rc = ppo_cuda::status(launch_attend<scalar_t>(pq, pb, kc, vc, pc, ps, pos, key_mask, finished,
                                                  static_cast<scalar_t*>(out), g, use_mma, mp, sp, vec, stream));
  });
  return rc != 0 ? rc : ppo_cuda::status(cudaGetLastError());
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
