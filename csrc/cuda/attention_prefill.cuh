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

// The kernel's shared memory regions (all 128-byte aligned).
template <typename T, int HD>
struct PrefillSmem {
  static constexpr int SCR = HD > PF_KEYS ? HD : PF_KEYS;
  T* k;      // [HD][PF_KEYS] K^T tile; first the Q staging area [PF_ROWS][HD]
  T* v;      // [PF_KEYS][HD]
  float* scr;  // [warp][16][SCR]: S, then P V
  T* p;      // [warp][16][PF_KEYS]
  float *o, *m, *l, *corr;  // [PF_ROWS][HD], then [PF_ROWS] each
  __device__ explicit PrefillSmem(unsigned char* base) {
    k = reinterpret_cast<T*>(base);
    v = k + HD * PF_KEYS;
    scr = reinterpret_cast<float*>(v + PF_KEYS * HD);
    p = reinterpret_cast<T*>(scr + PF_WARPS * 16 * SCR);
    o = reinterpret_cast<float*>(p + PF_WARPS * 16 * PF_KEYS);
    m = o + PF_ROWS * HD;
    l = m + PF_ROWS;
    corr = l + PF_ROWS;
  }
};

// RoPE'd, scaled Q of rows i0.. (zeros past the last query) staged as [PF_ROWS][HD] in sm.k;
// O = 0, running max -inf, running sum 0.
template <typename T, int HD>
__device__ void stage_q(const PrefillSmem<T, HD>& sm, const T* __restrict__ qkv, const T* __restrict__ bias,
                        const T* __restrict__ cos, const T* __restrict__ sin, const int64_t* __restrict__ pos,
                        const Geom& g, int64_t b, int64_t h, int64_t i0, int64_t rows) {
  for (int e = threadIdx.x; e < PF_ROWS * HD; e += PF_WARPS * 32) {
    const int r = e / HD, d = e % HD;
    float v = 0.f;
    if (r < rows) {
      const int64_t i = i0 + r, pp = clip_pos(pos[b * g.Tq + i], g.P);
      v = rope_at(qkv, bias, g, b, i, q_off(g, h), d, cos + pp * HD, sin + pp * HD) * g.scale;
    }
    sm.k[e] = ppo_cuda::from_f<T>(v);
    sm.o[e] = 0.f;
  }
  if (threadIdx.x < PF_ROWS) {
    sm.m[threadIdx.x] = -INFINITY;
    sm.l[threadIdx.x] = 0.f;
  }
}

// Keys j0..j0+63 of the cache slab: K^T [HD][PF_KEYS] and V [PF_KEYS][HD] (zeros past S); with
// `vec` (S a multiple of 8, 16-byte aligned caches) in 16-byte pieces.
template <typename T, int HD>
__device__ void load_kv_tile(const PrefillSmem<T, HD>& sm, const T* __restrict__ kt, const T* __restrict__ vv,
                             int64_t S, int64_t j0, bool vec) {
  if (vec) {
    constexpr int N = 8;  // 16-bit values in 16 bytes
    const int4 zero = make_int4(0, 0, 0, 0);
    for (int e = threadIdx.x; e < HD * PF_KEYS / N; e += PF_WARPS * 32) {
      const int d = e / (PF_KEYS / N), c = e % (PF_KEYS / N) * N;  // j0 + c < S implies j0 + c + N <= S
      *reinterpret_cast<int4*>(sm.k + d * PF_KEYS + c) =
          j0 + c < S ? *reinterpret_cast<const int4*>(kt + d * S + j0 + c) : zero;
      const int c2 = e / (HD / N), d2 = e % (HD / N) * N;
      *reinterpret_cast<int4*>(sm.v + c2 * HD + d2) =
          j0 + c2 < S ? *reinterpret_cast<const int4*>(vv + (j0 + c2) * HD + d2) : zero;
    }
    return;
  }
  for (int e = threadIdx.x; e < HD * PF_KEYS; e += PF_WARPS * 32) {
    const int d = e / PF_KEYS, c = e % PF_KEYS;  // K^T: keys contiguous
    sm.k[e] = j0 + c < S ? kt[d * S + j0 + c] : ppo_cuda::from_f<T>(0.f);
    const int c2 = e / HD, d2 = e % HD;  // V: dims contiguous
    sm.v[e] = j0 + c2 < S ? vv[(j0 + c2) * HD + d2] : ppo_cuda::from_f<T>(0.f);
  }
}

// One warp's online-softmax step over its 16 rows of scr (two lanes per row, 32 keys each):
// P (rounded to T) into p, and the row's new max, sum and rescale factor.
template <typename T, int HD>
__device__ void softmax_rows(const PrefillSmem<T, HD>& sm, const int32_t* __restrict__ mask, const Geom& g,
                             int64_t b, int64_t i0, int64_t rows, int64_t j0) {
  constexpr int SCR = PrefillSmem<T, HD>::SCR;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
  const int row = warp * 16 + r;
  const float* scr = sm.scr + warp * 16 * SCR;
  T* p = sm.p + warp * 16 * PF_KEYS;
  float s[32], tmax = -INFINITY;
#pragma unroll
  for (int c = 0; c < 32; ++c) {
    const int64_t j = j0 + half * 32 + c;
    const bool ok = row < rows && j <= g.t0 + i0 + row && (j >= g.Tp || mask[b * g.Tp + j]);
    s[c] = ok ? scr[r * SCR + half * 32 + c] : -INFINITY;
    tmax = fmaxf(tmax, s[c]);
  }
  tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
  const float m_old = sm.m[row], m_new = fmaxf(m_old, tmax);
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < 32; ++c) {
    const float pc = s[c] == -INFINITY ? 0.f : __expf(s[c] - m_new);
    sum += pc;
    p[r * PF_KEYS + half * 32 + c] = ppo_cuda::from_f<T>(pc);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  const float corr = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
  __syncwarp();  // both lanes of a row have read m before it is written
  if (half == 0) {
    sm.m[row] = m_new;
    sm.l[row] = sm.l[row] * corr + sum;
    sm.corr[row] = corr;
  }
  __syncwarp();
}

// One warp: scr = Q K^T (its 16 rows x 64 keys) on tensor cores.
template <typename T, int HD, typename QFrag>
__device__ void qk_tile(const PrefillSmem<T, HD>& sm, const QFrag (&qf)[HD / 16]) {
  namespace wmma = nvcuda::wmma;
  constexpr int SCR = PrefillSmem<T, HD>::SCR;
  float* scr = sm.scr + (threadIdx.x >> 5) * 16 * SCR;
#pragma unroll
  for (int n = 0; n < PF_KEYS / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> kf;
      wmma::load_matrix_sync(kf, sm.k + kk * 16 * PF_KEYS + n * 16, PF_KEYS);
      wmma::mma_sync(acc, qf[kk], kf, acc);
    }
    wmma::store_matrix_sync(scr + n * 16, acc, SCR, wmma::mem_row_major);
  }
  __syncwarp();
}

// One warp: scr = P V on tensor cores, then O = O * corr + scr for its 16 rows.
template <typename T, int HD>
__device__ void pv_update(const PrefillSmem<T, HD>& sm) {
  namespace wmma = nvcuda::wmma;
  constexpr int SCR = PrefillSmem<T, HD>::SCR;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* scr = sm.scr + warp * 16 * SCR;
  const T* p = sm.p + warp * 16 * PF_KEYS;
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < PF_KEYS / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pf;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
      wmma::load_matrix_sync(pf, p + kk * 16, PF_KEYS);
      wmma::load_matrix_sync(vf, sm.v + kk * 16 * HD + n * 16, HD);
      wmma::mma_sync(acc, pf, vf, acc);
    }
    wmma::store_matrix_sync(scr + n * 16, acc, SCR, wmma::mem_row_major);
  }
  __syncwarp();
  for (int e = lane; e < 16 * HD; e += 32) {
    const int r = e / HD, d = e % HD, row = warp * 16 + r;
    sm.o[row * HD + d] = sm.o[row * HD + d] * sm.corr[row] + scr[r * SCR + d];
  }
  __syncwarp();
}

template <typename T, int HD>
__global__ void __launch_bounds__(PF_WARPS * 32)
    prefill_mma_kernel(const T* __restrict__ qkv, const T* __restrict__ bias, const T* __restrict__ kc,
                       const T* __restrict__ vc, const T* __restrict__ cos, const T* __restrict__ sin,
                       const int64_t* __restrict__ pos, const int32_t* __restrict__ mask,
                       const int32_t* __restrict__ fin, T* __restrict__ out, Geom g, bool kv_vec) {
  namespace wmma = nvcuda::wmma;
  extern __shared__ __align__(128) unsigned char smem[];
  const PrefillSmem<T, HD> sm(smem);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * PF_ROWS, h = blockIdx.y, b = blockIdx.z;
  const int64_t D = g.nh * HD, rows = min(static_cast<int64_t>(PF_ROWS), g.Tq - i0);
  if (fin[b]) {
    for (int64_t e = threadIdx.x; e < rows * HD; e += PF_WARPS * 32)
      out[(b * g.Tq + i0 + e / HD) * D + h * HD + e % HD] = ppo_cuda::from_f<T>(0.f);
    return;
  }
  stage_q(sm, qkv, bias, cos, sin, pos, g, b, h, i0, rows);
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[HD / 16];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    wmma::load_matrix_sync(qf[kk], sm.k + (threadIdx.x >> 5) * 16 * HD + kk * 16, HD);
  __syncthreads();  // sm.k is overwritten by the first key tile
  const int64_t slab = ((g.layer * g.B + b) * g.nkv + h / g.grp) * g.S * HD;
  for (int64_t j0 = 0; j0 < g.t0 + i0 + rows; j0 += PF_KEYS) {  // up to the block's last query's keys
    load_kv_tile(sm, kc + slab, vc + slab, g.S, j0, kv_vec);
    __syncthreads();
    qk_tile(sm, qf);
    softmax_rows(sm, mask, g, b, i0, rows, j0);
    pv_update(sm);
    __syncthreads();  // sm.k / sm.v are overwritten by the next tile
  }
  for (int64_t e = threadIdx.x; e < rows * HD; e += PF_WARPS * 32) {
    const int r = static_cast<int>(e / HD), d = static_cast<int>(e % HD);
    const float l = sm.l[r];
    out[(b * g.Tq + i0 + r) * D + h * HD + d] = ppo_cuda::from_f<T>(l > 0.f ? sm.o[r * HD + d] / l : 0.f);
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
    const bool kv_vec = g.S % 8 == 0 && reinterpret_cast<uintptr_t>(kc) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(vc) % 16 == 0;
    const dim3 grid(static_cast<unsigned>((g.Tq + PF_ROWS - 1) / PF_ROWS), static_cast<unsigned>(g.nh),
                    static_cast<unsigned>(g.B));
    auto run = [&](auto kernel, size_t smem) {
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      kernel<<<grid, PF_WARPS * 32, smem, stream>>>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g, kv_vec);
    };
    if (g.hd == 64) run(prefill_mma_kernel<T, 64>, prefill_smem_bytes<64>());
    else run(prefill_mma_kernel<T, 128>, prefill_smem_bytes<128>());
    return true;
  }
}

}  // namespace
