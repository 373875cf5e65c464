// Plain-CUDA twin of csrc/cpu/pack_transposed.cc (API in ppo_cuda.h): one tiled transpose per
// packed input; the binding calls it once per input with the destination offset applied.
#include "common.cuh"

namespace {

constexpr int TILE = 32;

template <typename T>
__global__ void transpose_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t K, int64_t N) {
  __shared__ T tile[TILE][TILE + 1];
  const int64_t n0 = blockIdx.x * static_cast<int64_t>(TILE), k0 = blockIdx.y * static_cast<int64_t>(TILE);
  for (int r = threadIdx.y; r < TILE; r += blockDim.y) {
    const int64_t k = k0 + r, n = n0 + threadIdx.x;
    if (k < K && n < N) tile[r][threadIdx.x] = x[k * N + n];
  }
  __syncthreads();
  for (int r = threadIdx.y; r < TILE; r += blockDim.y) {
    const int64_t n = n0 + r, k = k0 + threadIdx.x;
    if (k < K && n < N) out[n * K + k] = tile[threadIdx.x][r];
  }
}

}  // namespace

extern "C" int ppo_cuda_transpose(int dtype, const void* x, void* out, int64_t K, int64_t N, cudaStream_t stream) {
  if (K < 0 || N < 0) return ppo_cuda::invalid();
  if (K == 0 || N == 0) return 0;
  const dim3 block(TILE, 8);
  const dim3 grid(static_cast<unsigned>((N + TILE - 1) / TILE), static_cast<unsigned>((K + TILE - 1) / TILE));
  PPO_CUDA_DISPATCH(dtype, [&] {
    transpose_kernel<scalar_t><<<grid, block, 0, stream>>>(static_cast<const scalar_t*>(x),
                                                           static_cast<scalar_t*>(out), K, N);
  });
  return ppo_cuda::status(cudaGetLastError());
}
