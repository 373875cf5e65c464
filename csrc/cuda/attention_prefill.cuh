// Prefill attention on tensor cores (included by attention.cu), FlashAttention-2 style (Dao,
// "FlashAttention-2", 2023): one block of 4 warps per (64 queries, q head, row); each warp owns
// 16 query rows, keeps its RoPE'd, scaled Q as bf16/fp16 WMMA fragments (m16n16k16, float
// accumulation), and walks the causal key range in tiles of 64 keys staged in shared memory
// (K^T [hd, 64] and V [64, hd] straight from the cache layouts). Per tile: S = Q K^T on tensor
// cores, online softmax per row (masked keys: causal, left padding), P rounded to the input type,
// O = O * corr + P V on tensor cores. O lives in shared memory because a WMMA accumulator's
// element-to-row mapping is unspecified (row rescaling needs it). bf16/fp16, head_dim 64 or 128.
#pragma once

#include <mma.h>

#include "common.cuh"

namespace {

constexpr int PF_WARPS = 4, PF_ROWS = 16 * PF_WARPS, PF_KEYS = 64;

// Dynamic shared memory of the kernel for head_dim HD (all regions 128-byte aligned).
template <int HD>
constexpr size_t prefill_smem_bytes() {
  return 2 * HD * PF_KEYS * 2                                      // K^T and V tiles (16-bit)
         + PF_WARPS * 16 * (HD > PF_KEYS ? HD : PF_KEYS) * 4        // per-warp float scratch
         + PF_WARPS * 16 * PF_KEYS * 2                              // per-warp P (16-bit)
         + PF_ROWS * HD * 4                                         // O (float)
         + 3 * PF_ROWS * 4;                                         // m, l, corr per row
}

template <typename T, int HD>
__global__ void __launch_bounds__(PF_WARPS * 32)
    prefill_mma_kernel(const T* __restrict__ qkv, const T* __restrict__ bias, const T* __restrict__ kc,
                       const T* __restrict__ vc, const T* __restrict__ cos, const T* __restrict__ sin,
                       const int64_t* __restrict__ pos, const int32_t* __restrict__ mask,
                       const int32_t* __restrict__ fin, T* __restrict__ out, Geom g) {
  namespace wmma = nvcuda::wmma;
  constexpr int SCR = HD > PF_KEYS ? HD : PF_KEYS;
  extern __shared__ __align__(128) unsigned char smem[];
  T* k_sh = reinterpret_cast<T*>(smem);                              // [HD][PF_KEYS]; Q staging first
  T* v_sh = k_sh + HD * PF_KEYS;                                     // [PF_KEYS][HD]
  float* scr_all = reinterpret_cast<float*>(v_sh + PF_KEYS * HD);    // [warp][16][SCR]
  T* p_all = reinterpret_cast<T*>(scr_all + PF_WARPS * 16 * SCR);    // [warp][16][PF_KEYS]
  float* o_sh = reinterpret_cast<float*>(p_all + PF_WARPS * 16 * PF_KEYS);  // [PF_ROWS][HD]
  float* m_sh = o_sh + PF_ROWS * HD;
  float* l_sh = m_sh + PF_ROWS;
  float* c_sh = l_sh + PF_ROWS;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * PF_ROWS, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t D = g.nh * HD;
  const int64_t rows = min(static_cast<int64_t>(PF_ROWS), g.Tq - i0);
  if (fin[b]) {
    for (int64_t e = tid; e < rows * HD; e += PF_WARPS * 32)
      out[(b * g.Tq + i0 + e / HD) * D + h * HD + e % HD] = ppo_cuda::from_f<T>(0.f);
    return;
  }
  // RoPE'd, scaled Q of the block's rows, staged in k_sh as [PF_ROWS][HD] (zeros past Tq)
  T* q_stage = k_sh;
  for (int e = tid; e < PF_ROWS * HD; e += PF_WARPS * 32) {
    const int r = e / HD, d = e % HD;
    float v = 0.f;
    if (r < rows) {
      const int64_t i = i0 + r, pp = clip_pos(pos[b * g.Tq + i], g.P);
      v = rope_at(qkv, bias, g, b, i, q_off(g, h), d, cos + pp * HD, sin + pp * HD) * g.scale;
    }
    q_stage[e] = ppo_cuda::from_f<T>(v);
  }
  for (int e = tid; e < PF_ROWS * HD; e += PF_WARPS * 32) o_sh[e] = 0.f;
  if (tid < PF_ROWS) {
    m_sh[tid] = -INFINITY;
    l_sh[tid] = 0.f;
  }
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[HD / 16];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) wmma::load_matrix_sync(qf[kk], q_stage + warp * 16 * HD + kk * 16, HD);
  __syncthreads();  // k_sh is overwritten by the first key tile
  float* scr = scr_all + warp * 16 * SCR;
  T* p_sh = p_all + warp * 16 * PF_KEYS;
  const int64_t kv = h / g.grp, slab = ((g.layer * g.B + b) * g.nkv + kv) * g.S * HD;
  const int64_t n_keys = g.t0 + i0 + rows;  // keys of the block's last query
  for (int64_t j0 = 0; j0 < n_keys; j0 += PF_KEYS) {
    for (int e = tid; e < HD * PF_KEYS; e += PF_WARPS * 32) {
      const int d = e / PF_KEYS, c = e % PF_KEYS;  // K^T: keys contiguous
      k_sh[e] = j0 + c < g.S ? kc[slab + d * g.S + j0 + c] : ppo_cuda::from_f<T>(0.f);
      const int c2 = e / HD, d2 = e % HD;          // V: dims contiguous
      v_sh[e] = j0 + c2 < g.S ? vc[slab + (j0 + c2) * HD + d2] : ppo_cuda::from_f<T>(0.f);
    }
    __syncthreads();
    // S = Q K^T for the warp's 16 rows x 64 keys -> scr [16][SCR]
#pragma unroll
    for (int n = 0; n < PF_KEYS / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> kf;
        wmma::load_matrix_sync(kf, k_sh + kk * 16 * PF_KEYS + n * 16, PF_KEYS);
        wmma::mma_sync(acc, qf[kk], kf, acc);
      }
      wmma::store_matrix_sync(scr + n * 16, acc, SCR, wmma::mem_row_major);
    }
    __syncwarp();
    {  // online softmax: two lanes per row, 32 keys each
      const int r = lane >> 1, half = lane & 1, row = warp * 16 + r;
      const int64_t i = i0 + row;
      float s[32], tmax = -INFINITY;
#pragma unroll
      for (int c = 0; c < 32; ++c) {
        const int64_t j = j0 + half * 32 + c;
        const bool ok = row < rows && j <= g.t0 + i && (j >= g.Tp || mask[b * g.Tp + j]);
        s[c] = ok ? scr[r * SCR + half * 32 + c] : -INFINITY;
        tmax = fmaxf(tmax, s[c]);
      }
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
      const float m_old = m_sh[row], m_new = fmaxf(m_old, tmax);
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < 32; ++c) {
        const float p = s[c] == -INFINITY ? 0.f : __expf(s[c] - m_new);
        sum += p;
        p_sh[r * PF_KEYS + half * 32 + c] = ppo_cuda::from_f<T>(p);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      const float corr = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
      __syncwarp();  // both lanes of a row read m_sh before it is written
      if (half == 0) {
        m_sh[row] = m_new;
        l_sh[row] = l_sh[row] * corr + sum;
        c_sh[row] = corr;
      }
    }
    __syncwarp();
    // scr = P V (16 x HD), then O = O * corr + scr
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < PF_KEYS / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pf;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
        wmma::load_matrix_sync(pf, p_sh + kk * 16, PF_KEYS);
        wmma::load_matrix_sync(vf, v_sh + kk * 16 * HD + n * 16, HD);
        wmma::mma_sync(acc, pf, vf, acc);
      }
      wmma::store_matrix_sync(scr + n * 16, acc, SCR, wmma::mem_row_major);
    }
    __syncwarp();
    for (int e = lane; e < 16 * HD; e += 32) {
      const int r = e / HD, d = e % HD, row = warp * 16 + r;
      o_sh[row * HD + d] = o_sh[row * HD + d] * c_sh[row] + scr[r * SCR + d];
    }
    __syncthreads();  // k_sh / v_sh are overwritten by the next tile
  }
  for (int64_t e = tid; e < rows * HD; e += PF_WARPS * 32) {
    const int r = static_cast<int>(e / HD), d = static_cast<int>(e % HD);
    const float l = l_sh[r];
    out[(b * g.Tq + i0 + r) * D + h * HD + d] = ppo_cuda::from_f<T>(l > 0.f ? o_sh[r * HD + d] / l : 0.f);
  }
}

// Launches the tensor-core prefill for 16-bit types and head_dim 64/128; false when it does not
// apply (the caller then runs the split-K kernel).
template <typename T>
bool launch_prefill_mma(const T* pq, const T* pb, const T* kc, const T* vc, const T* pc, const T* ps,
                        const int64_t* pos, const int32_t* mask, const int32_t* fin, T* out, const Geom& g,
                        cudaStream_t stream) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    if (g.cols || g.Tq < 16 || (g.hd != 64 && g.hd != 128) || g.B > 65535) return false;
    const dim3 grid(static_cast<unsigned>((g.Tq + PF_ROWS - 1) / PF_ROWS), static_cast<unsigned>(g.nh),
                    static_cast<unsigned>(g.B));
    auto run = [&](auto kernel, size_t smem) {
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      kernel<<<grid, PF_WARPS * 32, smem, stream>>>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g);
    };
    if (g.hd == 64) run(prefill_mma_kernel<T, 64>, prefill_smem_bytes<64>());
    else run(prefill_mma_kernel<T, 128>, prefill_smem_bytes<128>());
    return true;
  }
}

}  // namespace
