// Plain-CUDA twin of csrc/cpu/swiglu.cc (same contract; API in ppo_cuda.h). When the sizes and
// pointers allow, each thread handles 16-byte vectors of gate, up and out (swiglu_vec_kernel);
// otherwise one element per thread.
#include "common.cuh"

namespace {

template <typename T>
struct alignas(16) Vec {
  static constexpr int N = 16 / sizeof(T);
  T e[N];
};

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

// Vector vi covers outputs [vi * N, vi * N + N) (never across a row of mode 1: I % N == 0).
template <typename T>
__global__ void swiglu_vec_kernel(const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ out,
                                  int64_t n_vec, int64_t I, int mode) {
  constexpr int N = Vec<T>::N;
  const Vec<T>* xv = reinterpret_cast<const Vec<T>*>(x);
  for (int64_t vi = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; vi < n_vec;
       vi += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Vec<T> g, u, o;
    if (mode == 0) {
      g = xv[vi];
      u = reinterpret_cast<const Vec<T>*>(y)[vi];
    } else if (mode == 1) {
      const int64_t i = vi * N, r = i / I, c = i % I;
      g = xv[(r * 2 * I + c) / N];
      u = xv[(r * 2 * I + I + c) / N];
    } else {
      g = xv[vi];
      u = xv[n_vec + vi];
    }
#pragma unroll
    for (int e = 0; e < N; ++e) o.e[e] = ppo_cuda::from_f<T>(silu_mul(ppo_cuda::to_f(g.e[e]), ppo_cuda::to_f(u.e[e])));
    reinterpret_cast<Vec<T>*>(out)[vi] = o;
  }
}

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
    out[i] = ppo_cuda::from_f<T>(silu_mul(g, u));
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
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t per = dtype == PPO_CUDA_FLOAT32 ? 4 : 8;  // elements in 16 bytes
  const bool vec = n_out % per == 0 && aligned(x) && aligned(out) && (mode != 0 || aligned(y)) &&
                   (mode != 1 || I % per == 0);
  PPO_CUDA_DISPATCH(dtype, [&] {
    if (vec) {
      const int64_t n_vec = n_out / per, want_v = (n_vec + threads - 1) / threads;
      const unsigned blocks_v = static_cast<unsigned>(want_v < 65535 ? want_v : 65535);
      swiglu_vec_kernel<scalar_t><<<blocks_v, threads, 0, stream>>>(
          static_cast<const scalar_t*>(x), static_cast<const scalar_t*>(y), static_cast<scalar_t*>(out), n_vec, I,
          mode);
      return;
    }
    swiglu_kernel<scalar_t><<<blocks, threads, 0, stream>>>(static_cast<const scalar_t*>(x),
                                                            static_cast<const scalar_t*>(y),
                                                            static_cast<scalar_t*>(out), n_out, I, mode);
  });
  return ppo_cuda::status(cudaGetLastError());
}
