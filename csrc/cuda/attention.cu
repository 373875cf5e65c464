// Plain-CUDA twin of csrc/cpu/attention.cc (same contract: RoPE, in-place K^T/V cache write,
// masked attention over the cache, optional q/k/v bias, rows or cols layout, finished rows
// skipped; API in ppo_cuda.h). Two launches on the caller's stream: (1) write the fed tokens' K/V
// into the cache; (2) one block per (row, head, query) computes attention with an online softmax
// over chunks of keys, so any cache length works without large shared memory.
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

constexpr int ATT_THREADS = 128;
constexpr int MAX_HD = PPO_CUDA_MAX_HEAD_DIM;

template <typename T>
__global__ void attend_kernel(const T* __restrict__ qkv, const T* __restrict__ bias, const T* __restrict__ kc,
                              const T* __restrict__ vc, const T* __restrict__ cos, const T* __restrict__ sin,
                              const int64_t* __restrict__ pos, const int32_t* __restrict__ mask,
                              const int32_t* __restrict__ fin, T* __restrict__ out, Geom g) {
  const int64_t b = blockIdx.x, h = blockIdx.y, i = blockIdx.z;
  const int64_t D = g.nh * g.hd;
  auto out_at = [&](int64_t d) -> int64_t { return g.cols ? (h * g.hd + d) * g.B + b : (b * g.Tq + i) * D + h * g.hd + d; };
  __shared__ float q[MAX_HD];
  __shared__ float p[ATT_THREADS];
  if (fin[b]) {
    for (int64_t d = threadIdx.x; d < g.hd; d += blockDim.x) out[out_at(d)] = ppo_cuda::from_f<T>(0.f);
    return;
  }
  const int64_t pp = clip_pos(pos[b * g.Tq + i], g.P);
  for (int64_t d = threadIdx.x; d < g.hd; d += blockDim.x)
    q[d] = rope_at(qkv, bias, g, b, i, q_off(g, h), d, cos + pp * g.hd, sin + pp * g.hd) * g.scale;
  __syncthreads();
  const int64_t kv = h / g.grp;
  const int64_t slab = ((g.layer * g.B + b) * g.nkv + kv) * g.S * g.hd;
  const T* kt = kc + slab;
  const T* vv = vc + slab;
  const int64_t n = g.t0 + i + 1;
  float run_max = -INFINITY, run_sum = 0.f;
  float acc[MAX_HD / ATT_THREADS] = {0.f, 0.f};  // dims threadIdx.x, threadIdx.x + 128
  for (int64_t j0 = 0; j0 < n; j0 += ATT_THREADS) {
    const int64_t j = j0 + threadIdx.x;
    float s = -INFINITY;
    if (j < n && (j >= g.Tp || mask[b * g.Tp + j])) {
      s = 0.f;
      for (int64_t d = 0; d < g.hd; ++d) s += q[d] * ppo_cuda::to_f(kt[d * g.S + j]);
    }
    const float cmax = ppo_cuda::block_max(s);
    const float new_max = fmaxf(run_max, cmax);
    const float e = (s == -INFINITY) ? 0.f : __expf(s - new_max);
    const float csum = ppo_cuda::block_sum(e);
    const float corr = (run_max == -INFINITY) ? 0.f : __expf(run_max - new_max);
    p[threadIdx.x] = e;
    __syncthreads();
    const int64_t cn = min(static_cast<int64_t>(ATT_THREADS), n - j0);
    for (int r = 0; r < MAX_HD / ATT_THREADS; ++r) {
      const int64_t d = threadIdx.x + r * ATT_THREADS;
      if (d < g.hd) {
        float a = acc[r] * corr;
        for (int64_t jj = 0; jj < cn; ++jj)
          if (p[jj] != 0.f) a += p[jj] * ppo_cuda::to_f(vv[(j0 + jj) * g.hd + d]);
        acc[r] = a;
      }
    }
    run_sum = run_sum * corr + csum;
    run_max = new_max;
    __syncthreads();
  }
  const bool none = run_max == -INFINITY;
  for (int r = 0; r < MAX_HD / ATT_THREADS; ++r) {
    const int64_t d = threadIdx.x + r * ATT_THREADS;
    if (d < g.hd) out[out_at(d)] = ppo_cuda::from_f<T>(none ? 0.f : acc[r] / run_sum);
  }
}

}  // namespace

extern "C" int ppo_cuda_attention(int dtype, const void* qkv, const void* bias, void* k_cache, void* v_cache,
                                  const void* cos, const void* sin, const int64_t* pos, const int32_t* key_mask,
                                  const int32_t* finished, void* out, int64_t B, int64_t Tq, int64_t num_heads,
                                  int64_t num_kv_heads, int64_t head_dim, int64_t S, int64_t Tp, int64_t P,
                                  int64_t layer, int64_t t0, int64_t layout, float scale, int cols,
                                  cudaStream_t stream) {
  if (B < 0 || Tq <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || head_dim <= 0 ||
      head_dim > MAX_HD || head_dim % 2 != 0 || P <= 0 || layer < 0 || t0 < 0 || t0 + Tq > S || Tp < 0 ||
      (cols && Tq != 1) || layout < 0 || layout > 1 || B > 0x7fffffff || Tq > 65535 || num_heads > 65535 ||
      num_kv_heads > 65535)
    return ppo_cuda::invalid();
  if (B == 0) return 0;
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
    attend_kernel<scalar_t><<<dim3(ub, static_cast<unsigned>(num_heads), uq), ATT_THREADS, 0, stream>>>(
        pq, pb, kc, vc, pc, ps, pos, key_mask, finished, static_cast<scalar_t*>(out), g);
  });
  return ppo_cuda::status(cudaGetLastError());
}
