// Plain-CUDA twin of csrc/cpu/swiglu.cc (same contract; API in ppo_cuda.h).
#include "common.cuh"

namespace {

template <typename T>
__global__ void swiglu_kernel(const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ out, int64_t n_out,
                              int64_t I, int mode) {
  // mode 0: gate = x, up = y; mode 1: gate/up = halves of x's last axis (rows of width 2I);
  // mode 2: gate = x[:n_out], up = x[n_out:] (cols layout)
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_out;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float g, u;
    if (mode == 0) {
      g = ppo_cuda::to_f(x[i]);
      u = ppo_cuda::to_f(y[i]);
    } else if (mode == 1) {
      const int64_t r = i / I, c = i % I;
      g = ppo_cuda::to_f(x[r * 2 * I + c]);
      u = ppo_cuda::to_f(x[r * 2 * I + I + c]);
    } else {
      g = ppo_cuda::to_f(x[i]);
      u = ppo_cuda::to_f(x[n_out + i]);
    }
    out[i] = ppo_cuda::from_f<T>(g / (1.0f + __expf(-g)) * u);
  }
}

}  // namespace

extern "C" int ppo_cuda_swiglu(int dtype, const void* x, const void* y, void* out, int64_t n_out, int64_t I, int mode,
                               cudaStream_t stream) {
  if (n_out < 0 || mode < 0 || mode > 2 || (mode == 0 && y == nullptr) || (mode == 1 && I <= 0))
    return ppo_cuda::invalid();
  if (n_out == 0) return 0;
  const int threads = 256;
  const int64_t want = (n_out + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 ? want : 65535);
  PPO_CUDA_DISPATCH(dtype, [&] {
    swiglu_kernel<scalar_t><<<blocks, threads, 0, stream>>>(static_cast<const scalar_t*>(x),
                                                            static_cast<const scalar_t*>(y),
                                                            static_cast<scalar_t*>(out), n_out, I, mode);
  });
  return ppo_cuda::status(cudaGetLastError());
}
