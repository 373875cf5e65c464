// Plain-CUDA twin of csrc/cpu/rms_norm.cc (same contract; API in ppo_cuda.h). Rows layout with
// H a multiple of a 16-byte vector (and aligned pointers): one block per token keeps its row in
// registers, so x (and the residual) are read once and out written once with 16-byte accesses
// (the residual sum is written back rounded and normalised as stored, like the CPU kernel).
// Otherwise (cols layout [H, B], odd H): one block per token with scalar accesses.
#include "common.cuh"

namespace {

constexpr int MAX_VPT = 4;  // 16-byte vectors per thread in the register-resident kernel

template <typename T>
struct alignas(16) Vec {
  static constexpr int N = 16 / sizeof(T);
  T e[N];
};

template <typename T, int VPT>
__global__ void rms_vec_kernel(const T* __restrict__ x, T* __restrict__ res, const T* __restrict__ w,
                               T* __restrict__ out, int64_t H, float eps, bool add) {
  constexpr int N = Vec<T>::N;
  const int64_t nvec = H / N, row = blockIdx.x * nvec;
  const Vec<T>* xv = reinterpret_cast<const Vec<T>*>(x) + row;
  Vec<T>* rv = reinterpret_cast<Vec<T>*>(res) + row;
  float v[VPT][N];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t idx = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (idx >= nvec) continue;
    Vec<T> a = xv[idx];
    if (add) {
      const Vec<T> r = rv[idx];
#pragma unroll
      for (int e = 0; e < N; ++e) a.e[e] = ppo_cuda::from_f<T>(ppo_cuda::to_f(a.e[e]) + ppo_cuda::to_f(r.e[e]));
      rv[idx] = a;
    }
#pragma unroll
    for (int e = 0; e < N; ++e) {
      v[k][e] = ppo_cuda::to_f(a.e[e]);
      ss += v[k][e] * v[k][e];
    }
  }
  ss = ppo_cuda::block_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(H) + eps);
  const Vec<T>* wv = reinterpret_cast<const Vec<T>*>(w);
  Vec<T>* ov = reinterpret_cast<Vec<T>*>(out) + row;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t idx = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (idx >= nvec) continue;
    const Vec<T> wk = wv[idx];
    Vec<T> o;
#pragma unroll
    for (int e = 0; e < N; ++e) o.e[e] = ppo_cuda::from_f<T>((v[k][e] * inv) * ppo_cuda::to_f(wk.e[e]));
    ov[idx] = o;
  }
}

template <typename T>
__global__ void rms_kernel(const T* __restrict__ x, T* __restrict__ res, const T* __restrict__ w,
                           T* __restrict__ out, int64_t H, int64_t B, float eps, bool cols, bool add) {
  const int64_t tok = blockIdx.x;
  // element d of token tok
  auto at = [&](int64_t d) -> int64_t { return cols ? d * B + tok : tok * H + d; };
  float ss = 0.f;
  for (int64_t d = threadIdx.x; d < H; d += blockDim.x) {
    float v = ppo_cuda::to_f(x[at(d)]);
    if (add) {
      v += ppo_cuda::to_f(res[at(d)]);
      res[at(d)] = ppo_cuda::from_f<T>(v);
      v = ppo_cuda::to_f(res[at(d)]);  // normalise the stored (rounded) residual, like the CPU path
    }
    ss += v * v;
  }
  ss = ppo_cuda::block_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(H) + eps);
  const T* src = add ? res : x;
  for (int64_t d = threadIdx.x; d < H; d += blockDim.x)
    out[at(d)] = ppo_cuda::from_f<T>((ppo_cuda::to_f(src[at(d)]) * inv) * ppo_cuda::to_f(w[d]));
}

}  // namespace

extern "C" int ppo_cuda_rms_norm(int dtype, const void* x, void* residual, const void* w, void* out, int64_t tokens,
                                 int64_t H, float eps, int cols, cudaStream_t stream) {
  if (tokens < 0 || H <= 0 || tokens > 0x7fffffff) return ppo_cuda::invalid();
  if (tokens == 0) return 0;
  const int threads = H >= 1024 ? 1024 : (H >= 256 ? 256 : 128);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t elt = dtype == PPO_CUDA_FLOAT32 ? 4 : 2, nvec = H * elt / 16;
  const bool vec = cols == 0 && (H * elt) % 16 == 0 && nvec <= 1024 * MAX_VPT && aligned(x) && aligned(w) &&
                   aligned(out) && (residual == nullptr || aligned(residual));
  PPO_CUDA_DISPATCH(dtype, [&] {
    if (vec) {  // the fewest vectors per thread that fit in 1024 threads, threads a multiple of 32
      const int vpt = nvec <= 1024 ? 1 : (nvec <= 2048 ? 2 : 4);
      const int t = static_cast<int>(((nvec + vpt - 1) / vpt + 31) / 32 * 32);
      auto* px = static_cast<const scalar_t*>(x);
      auto* pr = static_cast<scalar_t*>(residual);
      auto* pw = static_cast<const scalar_t*>(w);
      auto* po = static_cast<scalar_t*>(out);
      const unsigned grid = static_cast<unsigned>(tokens);
      if (vpt == 1) rms_vec_kernel<scalar_t, 1><<<grid, t, 0, stream>>>(px, pr, pw, po, H, eps, pr != nullptr);
      else if (vpt == 2) rms_vec_kernel<scalar_t, 2><<<grid, t, 0, stream>>>(px, pr, pw, po, H, eps, pr != nullptr);
      else rms_vec_kernel<scalar_t, 4><<<grid, t, 0, stream>>>(px, pr, pw, po, H, eps, pr != nullptr);
      return;
    }
    rms_kernel<scalar_t><<<static_cast<unsigned>(tokens), threads, 0, stream>>>(
        static_cast<const scalar_t*>(x), static_cast<scalar_t*>(residual), static_cast<const scalar_t*>(w),
        static_cast<scalar_t*>(out), H, tokens, eps, cols != 0, residual != nullptr);
  });
  return ppo_cuda::status(cudaGetLastError());
}
