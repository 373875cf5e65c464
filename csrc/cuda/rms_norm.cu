// Plain-CUDA twin of csrc/cpu/rms_norm.cc (same contract; API in ppo_cuda.h): rows layout = one
// block per token; cols layout ([H, B]) = one block per column.
#include "common.cuh"

namespace {

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
  PPO_CUDA_DISPATCH(dtype, [&] {
    rms_kernel<scalar_t><<<static_cast<unsigned>(tokens), threads, 0, stream>>>(
        static_cast<const scalar_t*>(x), static_cast<scalar_t*>(residual), static_cast<const scalar_t*>(w),
        static_cast<scalar_t*>(out), H, tokens, eps, cols != 0, residual != nullptr);
  });
  return ppo_cuda::status(cudaGetLastError());
}
