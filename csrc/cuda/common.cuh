// Shared device helpers of the rollout ops' plain-CUDA kernels (no Paddle headers; the API is
// ppo_cuda.h). Kernels read float32, float16 (__half) and bfloat16 (__nv_bfloat16) and accumulate
// in float; __half / __nv_bfloat16 have the bit layout of phi::dtype::float16 / bfloat16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "ppo_cuda.h"

// Runs the lambda with `scalar_t` bound to the element type of the dtype code; an unknown code
// makes the enclosing launcher return cudaErrorInvalidValue.
#define PPO_CUDA_DISPATCH(DTYPE_, ...)          \
  do {                                          \
    switch (DTYPE_) {                           \
      case PPO_CUDA_FLOAT32: {                  \
        using scalar_t = float;                 \
        __VA_ARGS__();                          \
        break;                                  \
      }                                         \
      case PPO_CUDA_FLOAT16: {                  \
        using scalar_t = __half;                \
        __VA_ARGS__();                          \
        break;                                  \
      }                                         \
      case PPO_CUDA_BFLOAT16: {                 \
        using scalar_t = __nv_bfloat16;         \
        __VA_ARGS__();                          \
        break;                                  \
      }                                         \
      default:                                  \
        return ppo_cuda::invalid();             \
    }                                           \
  } while (0)

namespace ppo_cuda {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

inline int status(cudaError_t e) { return static_cast<int>(e); }
inline int invalid() { return status(cudaErrorInvalidValue); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum / max (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float sh[32];
  __shared__ float result;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  if (wid == 0) {
    float w = lane < (blockDim.x >> 5) ? sh[lane] : 0.f;
    w = warp_sum(w);
    if (lane == 0) result = w;
  }
  __syncthreads();
  return result;
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float sh[32];
  __shared__ float result;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  if (wid == 0) {
    float w = lane < (blockDim.x >> 5) ? sh[lane] : -INFINITY;
    w = warp_max(w);
    if (lane == 0) result = w;
  }
  __syncthreads();
  return result;
}

// (value, index) pair "better" = larger value, ties -> smaller index.
struct ArgBest {
  float v;
  int64_t i;
};
__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}
__device__ __forceinline__ ArgBest block_argbest(float v, int64_t i) {
  __shared__ float shv[32];
  __shared__ int64_t shi[32];
  __shared__ ArgBest result;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
  __syncthreads();
  if (lane == 0) {
    shv[wid] = v;
    shi[wid] = i;
  }
  __syncthreads();
  if (wid == 0) {
    float w = lane < (blockDim.x >> 5) ? shv[lane] : -INFINITY;
    int64_t wi = lane < (blockDim.x >> 5) ? shi[lane] : INT64_MAX;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, w, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, wi, o);
      if (better(ov, oi, w, wi)) {
        w = ov;
        wi = oi;
      }
    }
    if (lane == 0) result = ArgBest{w, wi};
  }
  __syncthreads();
  return result;
}

}  // namespace ppo_cuda
