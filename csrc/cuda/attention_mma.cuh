// Tensor-core attention over the cache (included by attention.cu) for 16-bit types, head_dim 64
// or 128, decode and prefill alike: FlashAttention-2's tiling (Dao, "FlashAttention-2", 2023) with
// FlashInfer's GQA treatment, where a KV group's q heads are extra query rows. The rows of one
// (batch row b, KV head kv) are its (query i, q head h) pairs, r = i * grp + (h - kv * grp); all
// of them share K and V, so a block reads each K/V tile once for every head of the group. A warp
// owns 16 rows and keeps their RoPE'd Q (pre-scaled by scale * log2 e), the running max and sum
// and the output accumulator in registers (mma.sync m16n8k16 fragments, float accumulation).
// A block of WARPS warps walks the keys of its cache chunk in 64-key tiles that cp.async stages
// in shared memory NST deep: K^T [hd][64] and V [64][hd] straight from the cache layouts, 16-byte
// chunks XOR-swizzled by row so every ldmatrix phase is free of bank conflicts. Per tile:
// S = Q K^T, masks (causal, chunk end, left padding), online softmax in base 2, P rounded to T
// becomes the A operand of O += P V without leaving registers. Keys at or past the block's last
// key are zero-filled by cp.async and never read: a cache slot nobody wrote may hold NaN, and a
// zero probability times NaN is NaN. Decode (few rows) uses 1-warp blocks and splits the cache
// into chunks merged by merge_kernel; prefill uses 4-warp blocks.
#pragma once

#include <atomic>

#include "attention_mma_tiles.cuh"
#include "attention_split.cuh"

#ifndef PPO_MMA_NST_DECODE
#define PPO_MMA_NST_DECODE 2  // shared-memory stages of the 1-warp (decode) blocks
#endif
#ifndef PPO_MMA_NST_PREFILL
#define PPO_MMA_NST_PREFILL 2  // of the 4-warp (prefill) blocks
#endif
#ifndef PPO_MMA_DECODE_BLOCKS_PER_SM
#define PPO_MMA_DECODE_BLOCKS_PER_SM 6  // the split plan's target for 1-warp blocks
#endif

namespace {

struct MmaPlan {
  int64_t warps, row_blocks, splits, chunk;  // 16-row warps per block, blocks per (b, kv), chunks, keys per chunk
  float* part;                               // as Split::part, when splits > 1
  bool q_vec;                                // qkv, bias, cos, sin allow 16-byte loads (rows layout, aligned)
};

template <int HD, int WARPS, int NST>
constexpr size_t mma_smem_bytes() {
  return static_cast<size_t>(16 * WARPS * HD + NST * 2 * HD * MMA_TK) * 2;
}

// Row r of (b, kv): its query and q head.
struct QueryHead {
  int64_t i, h;
};
__device__ __forceinline__ QueryHead row_query(const Geom& g, int64_t kv, int64_t r) {
  return QueryHead{r / g.grp, kv * g.grp + r % g.grp};
}
// Last key row r may see (-1 for a padding row past the n_rows real ones).
__device__ __forceinline__ int64_t row_limit(const Geom& g, int64_t r, int64_t n_rows, int64_t j_end) {
  return r < n_rows ? min(g.t0 + r / g.grp, j_end - 1) : -1;
}

// q[d] and q[d + hd/2] of dims c..c+7 for one row, RoPE'd and scaled: lo / hi halves.
template <typename T, int HD>
__device__ __forceinline__ void rope_q8(const T* __restrict__ qkv, const T* __restrict__ bias,
                                        const T* __restrict__ cos_row, const T* __restrict__ sin_row, const Geom& g,
                                        int64_t b, int64_t i, int64_t base, int c, bool vec, float qscale,
                                        float (&lo)[8], float (&hi)[8]) {
  constexpr int H2 = HD / 2;
  float xl[8], xh[8], cl[8], ch[8], sl[8], sh[8];
  if (vec) {  // 16-byte loads: rows layout, aligned tensors
    const T* x = qkv + (b * g.Tq + i) * g.W + base;
    load_f<T, 8>(x + c, xl);
    load_f<T, 8>(x + c + H2, xh);
    if (bias) {
      float bl[8], bh[8];
      load_f<T, 8>(bias + base + c, bl);
      load_f<T, 8>(bias + base + c + H2, bh);
#pragma unroll
      for (int k = 0; k < 8; ++k) xl[k] += bl[k], xh[k] += bh[k];
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      xl[k] = qkv_at(qkv, bias, g, b, i, base + c + k);
      xh[k] = qkv_at(qkv, bias, g, b, i, base + c + k + H2);
    }
  }
  load_f<T, 8>(cos_row + c, cl);
  load_f<T, 8>(cos_row + c + H2, ch);
  load_f<T, 8>(sin_row + c, sl);
  load_f<T, 8>(sin_row + c + H2, sh);
#pragma unroll
  for (int k = 0; k < 8; ++k) {  // rotate_half: (x_lo, x_hi) -> (-x_hi, x_lo)
    lo[k] = (xl[k] * cl[k] - xh[k] * sl[k]) * qscale;
    hi[k] = (xh[k] * ch[k] + xl[k] * sh[k]) * qscale;
  }
}

// Eight floats rounded to T as one 16-byte store.
template <typename T>
__device__ __forceinline__ void store8(T* dst, const float (&v)[8]) {
  uint4 u;
  u.x = ppo_mma::pack2<T>(v[0], v[1]);
  u.y = ppo_mma::pack2<T>(v[2], v[3]);
  u.z = ppo_mma::pack2<T>(v[4], v[5]);
  u.w = ppo_mma::pack2<T>(v[6], v[7]);
  *reinterpret_cast<uint4*>(dst) = u;
}

// Swizzled [16 * WARPS][HD] tile of the block's rows' Q: RoPE, scale * log2 e, rounded to T; zero
// rows past n_rows. One item is 8 dims of each half of a row (the pairs RoPE mixes).
template <typename T, int HD, int WARPS>
__device__ void mma_stage_q(T* q_sm, const T* __restrict__ qkv, const T* __restrict__ bias,
                            const T* __restrict__ cos, const T* __restrict__ sin, const int64_t* __restrict__ pos,
                            const Geom& g, const MmaPlan& pl, int64_t b, int64_t kv, int64_t r0, int64_t n_rows) {
  constexpr int CH = HD / 16;  // items per row
  const float qscale = g.scale * LOG2E;
  for (int e = threadIdx.x; e < 16 * WARPS * CH; e += WARPS * 32) {
    const int row = e / CH, c = (e % CH) * 8;
    float lo[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, hi[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (r0 + row < n_rows) {
      const QueryHead q = row_query(g, kv, r0 + row);
      const int64_t pp = clip_pos(pos[b * g.Tq + q.i], g.P);
      rope_q8<T, HD>(qkv, bias, cos + pp * HD, sin + pp * HD, g, b, q.i, q_off(g, q.h), c, pl.q_vec, qscale, lo, hi);
    }
    store8<T>(q_sm + ppo_mma::swizzle(row, c, HD), lo);
    store8<T>(q_sm + ppo_mma::swizzle(row, c + HD / 2, HD), hi);
  }
}

// The rows' outputs (one chunk: O / l) or partial states (several: O, max in natural log, sum).
template <typename T, int HD>
__device__ void mma_write_rows(WarpState<HD>& st, T* __restrict__ out, const Geom& g, const MmaPlan& pl, int64_t b,
                               int64_t kv, int64_t ra, int64_t n_rows, int64_t split) {
  const int lane = threadIdx.x & 31, t2 = 2 * (lane & 3);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    st.l[k] += __shfl_xor_sync(0xffffffffu, st.l[k], 1);
    st.l[k] += __shfl_xor_sync(0xffffffffu, st.l[k], 2);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (ra + 8 * k >= n_rows) continue;
    const QueryHead q = row_query(g, kv, ra + 8 * k);
    if (pl.splits == 1) {
      const float inv = st.l[k] > 0.f ? 1.f / st.l[k] : 0.f;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        const int64_t at = out_index(g, b, q.i, q.h, n * 8 + t2);
        const float v0 = st.o[n][2 * k] * inv, v1 = st.o[n][2 * k + 1] * inv;
        if (g.cols) {
          out[at] = ppo_cuda::from_f<T>(v0);
          out[at + g.B] = ppo_cuda::from_f<T>(v1);
        } else {
          *reinterpret_cast<uint32_t*>(out + at) = ppo_mma::pack2<T>(v0, v1);
        }
      }
    } else {
      float* pa = part_ptr(g, pl.part, pl.splits, b * g.Tq + q.i, q.h, split);
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) *reinterpret_cast<float2*>(pa + n * 8 + t2) = make_float2(st.o[n][2 * k], st.o[n][2 * k + 1]);
      if ((lane & 3) == 0) {
        pa[HD] = st.m[k] == -INFINITY ? -INFINITY : st.m[k] * LN2;
        pa[HD + 1] = st.l[k];
      }
    }
  }
}

// Zero outputs (one chunk) or empty partial states for the block's rows: a finished batch row,
// or a chunk that starts past every row's last key.
template <typename T, int WARPS>
__device__ void mma_write_empty(T* __restrict__ out, const Geom& g, const MmaPlan& pl, int64_t b, int64_t kv,
                                int64_t r0, int64_t n_rows, int64_t split) {
  const int64_t rows = min(static_cast<int64_t>(16 * WARPS), n_rows - r0);
  for (int64_t e = threadIdx.x; e < rows * g.hd; e += WARPS * 32) {
    const QueryHead q = row_query(g, kv, r0 + e / g.hd);
    const int64_t d = e % g.hd;
    if (pl.splits == 1) {
      out[out_index(g, b, q.i, q.h, d)] = ppo_cuda::from_f<T>(0.f);
    } else {
      float* pa = part_ptr(g, pl.part, pl.splits, b * g.Tq + q.i, q.h, split);
      pa[d] = 0.f;
      if (d == 0) pa[g.hd] = -INFINITY, pa[g.hd + 1] = 0.f;
    }
  }
}

// Smallest (lo) and largest (hi) last key over the warp's real rows (lo = INT64_MAX, hi = -1 without any).
__device__ __forceinline__ void warp_limits(int64_t lim_a, int64_t lim_b, int64_t& lo, int64_t& hi) {
  hi = max(lim_a, lim_b);
  lo = min(lim_a < 0 ? INT64_MAX : lim_a, lim_b < 0 ? INT64_MAX : lim_b);
  for (int o = 16; o > 0; o >>= 1) {
    hi = max(hi, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(hi), o)));
    lo = min(lo, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(lo), o)));
  }
}

template <typename T, int HD, int WARPS, int NST>
__global__ void __launch_bounds__(WARPS * 32)
    mma_attend_kernel(const T* __restrict__ qkv, const T* __restrict__ bias, const T* __restrict__ kc,
                      const T* __restrict__ vc, const T* __restrict__ cos, const T* __restrict__ sin,
                      const int64_t* __restrict__ pos, const int32_t* __restrict__ mask,
                      const int32_t* __restrict__ fin, T* __restrict__ out, Geom g, MmaPlan pl) {
  constexpr int TILE = 2 * HD * MMA_TK;  // elements of one stage: K^T then V
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* q_sm = reinterpret_cast<T*>(smem_raw);
  T* kv_sm = q_sm + 16 * WARPS * HD;
  const int64_t bkv = g.B * g.nkv, rb = pl.row_blocks - 1 - blockIdx.x / bkv;  // latest queries first
  const int64_t b = (blockIdx.x % bkv) / g.nkv, kv = blockIdx.x % g.nkv, split = blockIdx.y;
  const int64_t n_rows = g.Tq * g.grp, r0 = rb * 16 * WARPS;
  const int64_t i_last = (min(r0 + 16 * WARPS, n_rows) - 1) / g.grp;
  const int64_t j_begin = split * pl.chunk, j_end = min(g.t0 + i_last + 1, j_begin + pl.chunk);
  if (fin[b] || j_begin >= j_end) {
    mma_write_empty<T, WARPS>(out, g, pl, b, kv, r0, n_rows, split);
    return;
  }
  const T* kt = kc + ((g.layer * g.B + b) * g.nkv + kv) * g.S * HD;
  const T* vv = vc + ((g.layer * g.B + b) * g.nkv + kv) * g.S * HD;
  const int64_t n_tiles = (j_end - j_begin + MMA_TK - 1) / MMA_TK;
#pragma unroll
  for (int st = 0; st < NST - 1; ++st) {  // the first tiles' copies run while Q is staged
    if (st < n_tiles) mma_load_tile<T, HD, WARPS>(kv_sm + st * TILE, kv_sm + st * TILE + HD * MMA_TK, kt, vv, g.S,
                                                  j_begin + st * MMA_TK, j_end);
    ppo_mma::cp_async_commit();
  }
  mma_stage_q<T, HD, WARPS>(q_sm, qkv, bias, cos, sin, pos, g, pl, b, kv, r0, n_rows);
  __syncthreads();  // Q staged
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    ppo_mma::ldsm_x4(qf[kk], q_sm + ppo_mma::swizzle(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8, HD));
  const int64_t ra = r0 + warp * 16 + (lane >> 2);
  const int64_t lim_a = row_limit(g, ra, n_rows, j_end), lim_b = row_limit(g, ra + 8, n_rows, j_end);
  int64_t warp_lo, warp_hi;
  warp_limits(lim_a, lim_b, warp_lo, warp_hi);
  WarpState<HD> ws;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) ws.o[n][0] = ws.o[n][1] = ws.o[n][2] = ws.o[n][3] = 0.f;
  ws.m[0] = ws.m[1] = -INFINITY;
  ws.l[0] = ws.l[1] = 0.f;
  for (int64_t t = 0; t < n_tiles; ++t) {
    const int64_t tn = t + NST - 1;  // refills the stage computed in the previous iteration
    if (tn < n_tiles) mma_load_tile<T, HD, WARPS>(kv_sm + (tn % NST) * TILE, kv_sm + (tn % NST) * TILE + HD * MMA_TK,
                                                  kt, vv, g.S, j_begin + tn * MMA_TK, j_end);
    ppo_mma::cp_async_commit();
    ppo_mma::cp_async_wait<NST - 1>();  // this thread's copies of tile t landed
    __syncthreads();                    // everyone's did
    const int64_t j0 = j_begin + t * MMA_TK;
    const T* ks = kv_sm + (t % NST) * TILE;
    if (j0 <= warp_hi) {  // warp-uniform: some row of the warp sees a key of this tile
      const uint64_t kbits = key_bits(mask, g, b, j0);
      if (kbits != 0ull) {
        float s[MMA_TK / 8][4];
        qk_scores<T, HD>(s, qf, ks);
        if (kbits != ~0ull || j0 + MMA_TK - 1 > warp_lo) mask_scores(s, j0, lim_a, lim_b, kbits);
        softmax_pv<T, HD>(ws, s, ks + HD * MMA_TK);
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration
  }
  mma_write_rows<T, HD>(ws, out, g, pl, b, kv, ra, n_rows, split);
}

// Launches mma_attend_kernel<T, HD, WARPS, NST> (raising its shared-memory limit first).
template <typename T, int HD, int WARPS, int NST>
cudaError_t launch_mma_kernel(const T* pq, const T* pb, const T* kc, const T* vc, const T* pc, const T* ps,
                              const int64_t* pos, const int32_t* mask, const int32_t* fin, T* out, const Geom& g,
                              const MmaPlan& pl, cudaStream_t stream) {
  constexpr size_t smem = mma_smem_bytes<HD, WARPS, NST>();
  auto kernel = mma_attend_kernel<T, HD, WARPS, NST>;
  static std::atomic<uint64_t> raised{0};  // devices whose limit is raised (once: no host call in a graph capture)
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = 1ull << (dev & 63);
  if (!(raised.load() & bit)) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    raised.fetch_or(bit);
  }
  const dim3 grid(static_cast<unsigned>(g.B * g.nkv * pl.row_blocks), static_cast<unsigned>(pl.splits));
  kernel<<<grid, WARPS * 32, smem, stream>>>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g, pl);
  return cudaGetLastError();
}

template <typename T, int HD>
cudaError_t launch_mma_hd(const T* pq, const T* pb, const T* kc, const T* vc, const T* pc, const T* ps,
                          const int64_t* pos, const int32_t* mask, const int32_t* fin, T* out, const Geom& g,
                          const MmaPlan& pl, cudaStream_t stream) {
  if (pl.warps == 1)
    return launch_mma_kernel<T, HD, 1, PPO_MMA_NST_DECODE>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g, pl, stream);
  return launch_mma_kernel<T, HD, 4, PPO_MMA_NST_PREFILL>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g, pl, stream);
}

// The tensor-core path for 16-bit T and head_dim 64 / 128 (the caller checked the plan applies).
template <typename T>
cudaError_t launch_mma(const T* pq, const T* pb, const T* kc, const T* vc, const T* pc, const T* ps,
                       const int64_t* pos, const int32_t* mask, const int32_t* fin, T* out, const Geom& g,
                       const MmaPlan& pl, cudaStream_t stream) {
  if constexpr (sizeof(T) != 2) {
    return cudaErrorInvalidValue;
  } else {
    if (g.hd == 64) return launch_mma_hd<T, 64>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g, pl, stream);
    return launch_mma_hd<T, 128>(pq, pb, kc, vc, pc, ps, pos, mask, fin, out, g, pl, stream);
  }
}

}  // namespace
