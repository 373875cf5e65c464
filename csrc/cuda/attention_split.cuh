// Split-K ("flash-decoding") attention over the cache on CUDA cores, included by attention.cu: the
// float32 path and the fallback of the tensor-core kernel (other head sizes, unaligned caches,
// pre-sm_80 GPUs). One block serves the `hpb` q heads of one KV group that share its K/V (GQA: K
// and V are read once for all of them; the kernel is compiled for H = 1, 2, 4, 8 heads, so MHA
// does not pay for 8), for one (row, query) and one chunk of the cache; the chunks' partial softmax states
// (max, sum, unnormalised output) are merged by merge_kernel (Dao et al., "Flash-Decoding for
// long-context inference", 2023; FlashInfer's merge_state). K^T [hd, S]: each thread scores KPT
// adjacent keys with one 16-byte load per dimension; V [S, hd]: each thread accumulates DV
// adjacent dims of a slice of the keys, 16-byte loads when DV * sizeof(T) allows.
#pragma once

#include "common.cuh"

namespace {

constexpr int SPLIT_THREADS = 128;
constexpr int MAX_HPB = 8;        // q heads per block, at most
constexpr int MAX_TILE = 1024;    // keys per tile: SPLIT_THREADS * KPT

struct Split {
  int64_t hpb, n_hg, splits, chunk;  // heads per block, head groups per KV group, chunks, keys per chunk
  float* part;                       // [B*Tq, nh, splits, hd + 2] partial (acc..., max, sum); splits > 1
};

// N consecutive elements at p as floats; 16-byte loads when the size allows (p aligned by the caller).
template <typename T, int N>
__device__ __forceinline__ void load_f(const T* __restrict__ p, float (&out)[N]) {
  if constexpr ((N * sizeof(T)) % 16 == 0) {
    constexpr int PER = 16 / sizeof(T);
#pragma unroll
    for (int c = 0; c < N / PER; ++c) {
      const int4 raw = *reinterpret_cast<const int4*>(p + c * PER);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < PER; ++k) out[c * PER + k] = ppo_cuda::to_f(e[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = ppo_cuda::to_f(p[k]);
  }
}

// Block-wide max (IS_MAX) or sum of v[h] for each head h < H; every thread gets all.
template <bool IS_MAX, int H>
__device__ __forceinline__ void heads_reduce(float (&v)[H]) {
  __shared__ float sh[H][SPLIT_THREADS / 32];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
  for (int h = 0; h < H; ++h) {
    float x = IS_MAX ? ppo_cuda::warp_max(v[h]) : ppo_cuda::warp_sum(v[h]);
    if (lane == 0) sh[h][wid] = x;
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < H; ++h) {
    float x = sh[h][0];
    for (int w = 1; w < SPLIT_THREADS / 32; ++w) x = IS_MAX ? fmaxf(x, sh[h][w]) : x + sh[h][w];
    v[h] = x;
  }
  __syncthreads();
}

// Where one (row, query)'s output and one split's partial state of head h live.
struct SplitOut {
  int64_t z, b, i, split;
  __device__ int64_t out_at(const Geom& g, int64_t h, int64_t d) const { return out_index(g, b, i, h, d); }
  __device__ float* part_at(const Geom& g, const Split& sp, int64_t h) const {
    return part_ptr(g, sp.part, sp.splits, z, h, split);
  }
};

// Scores s[k][h] of the KPT keys jt.. for the block's heads (q pre-scaled in q_sh), -inf where a
// key is past j_end or masked; tmax[h]: this thread's max.
template <typename T, int KPT, int H>
__device__ __forceinline__ void score_keys(const T* __restrict__ kt, const float (*q_sh)[PPO_CUDA_MAX_HEAD_DIM],
                                           const int32_t* __restrict__ mask, const Geom& g, int64_t b, int hpb,
                                           int64_t jt, int64_t j_end, float (&s)[KPT][H], float (&tmax)[H]) {
#pragma unroll
  for (int k = 0; k < KPT; ++k)
#pragma unroll
    for (int h = 0; h < H; ++h) s[k][h] = 0.f;
  if (jt < j_end) {
#pragma unroll 4
    for (int64_t d = 0; d < g.hd; ++d) {  // unrolled: several 16-byte loads in flight per thread
      float kf[KPT];
      load_f<T, KPT>(kt + d * g.S + jt, kf);  // jt + KPT <= S: S % KPT == 0 and jt % KPT == 0
#pragma unroll
      for (int h = 0; h < H; ++h)
        if (h < hpb) {
          const float qd = q_sh[h][d];
#pragma unroll
          for (int k = 0; k < KPT; ++k) s[k][h] = fmaf(qd, kf[k], s[k][h]);
        }
    }
  }
#pragma unroll
  for (int h = 0; h < H; ++h) tmax[h] = -INFINITY;
#pragma unroll
  for (int k = 0; k < KPT; ++k) {
    const int64_t j = jt + k;
    const bool ok = j < j_end && (j >= g.Tp || mask[b * g.Tp + j]);
#pragma unroll
    for (int h = 0; h < H; ++h) {
      s[k][h] = ok ? s[k][h] : -INFINITY;
      tmax[h] = fmaxf(tmax[h], s[k][h]);
    }
  }
}

// Online-softmax step of one tile (block-wide): new running max m, sum l, the rescaled
// accumulators, and the tile's probabilities in p_sh[h * MAX_TILE + key] (published by the barriers).
template <int KPT, int DV, int H>
__device__ __forceinline__ void softmax_tile(float (&s)[KPT][H], float (&tmax)[H], float (&m)[H],
                                             float (&l)[H], float (&acc)[H][DV], float* p_sh) {
  heads_reduce<true, H>(tmax);
  float corr[H], tsum[H];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    const float nm = fmaxf(m[h], tmax[h]);
    corr[h] = m[h] == -INFINITY ? 0.f : __expf(m[h] - nm);
    m[h] = nm;
    tsum[h] = 0.f;
#pragma unroll
    for (int k = 0; k < KPT; ++k) {
      const float p = s[k][h] == -INFINITY ? 0.f : __expf(s[k][h] - nm);
      tsum[h] += p;
      p_sh[h * MAX_TILE + threadIdx.x * KPT + k] = p;
    }
  }
  heads_reduce<false, H>(tsum);
#pragma unroll
  for (int h = 0; h < H; ++h) {
    l[h] = l[h] * corr[h] + tsum[h];
#pragma unroll
    for (int e = 0; e < DV; ++e) acc[h][e] *= corr[h];
  }
}

// acc[h][e] += sum over this thread's keys jj (ks, ks + nks, ...) of p[h][jj] * V[tile0 + jj][dg*DV + e].
template <typename T, int DV, int H>
__device__ __forceinline__ void accumulate_pv(const T* __restrict__ vv, const float* p_sh, int64_t hd, int64_t tile0,
                                              int tile_len, int dg, int ks, int nks, float (&acc)[H][DV]) {
  for (int jj = ks; jj < tile_len; jj += nks) {
    float vf[DV];
    load_f<T, DV>(vv + (tile0 + jj) * hd + dg * DV, vf);
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const float p = p_sh[h * MAX_TILE + jj];
#pragma unroll
      for (int e = 0; e < DV; ++e) acc[h][e] = fmaf(p, vf[e], acc[h][e]);
    }
  }
}

// Sums the key slices' accumulators (through red, nks * hpb * hd floats) and writes each head's
// output (one split) or partial state (several splits).
template <typename T, int DV, int H>
__device__ __forceinline__ void write_heads(const float (&m)[H], const float (&l)[H],
                                            const float (&acc)[H][DV], float* red, T* __restrict__ out,
                                            const Geom& g, const Split& sp, const SplitOut& at, int64_t h0, int hpb,
                                            int dg, int ks, int nks) {
  if (ks < nks)
#pragma unroll
    for (int h = 0; h < H; ++h)
      if (h < hpb)
#pragma unroll
        for (int e = 0; e < DV; ++e) red[(ks * hpb + h) * g.hd + dg * DV + e] = acc[h][e];
  __syncthreads();
  for (int64_t e = threadIdx.x; e < hpb * g.hd; e += SPLIT_THREADS) {
    const int h = static_cast<int>(e / g.hd);
    const int64_t d = e % g.hd;
    float a = 0.f;
    for (int k = 0; k < nks; ++k) a += red[(k * hpb + h) * g.hd + d];
    float mh = m[0], lh = l[0];
#pragma unroll
    for (int hh = 1; hh < H; ++hh)
      if (hh == h) mh = m[hh], lh = l[hh];
    if (sp.splits == 1) {
      out[at.out_at(g, h0 + h, d)] = ppo_cuda::from_f<T>(mh == -INFINITY ? 0.f : a / lh);
    } else {
      float* pa = at.part_at(g, sp, h0 + h);
      pa[d] = a;
      if (d == 0) pa[g.hd] = mh, pa[g.hd + 1] = lh;
    }
  }
}

// Zero output (one split) or an empty partial state (max -inf) for the block's heads: a finished
// row (merge_kernel then writes zeros) or a chunk that starts past this query's last key.
template <typename T>
__device__ void write_empty(T* __restrict__ out, const Geom& g, const Split& sp, const SplitOut& at, int64_t h0,
                            int hpb) {
  for (int64_t e = threadIdx.x; e < hpb * g.hd; e += SPLIT_THREADS) {
    const int64_t h = h0 + e / g.hd, d = e % g.hd;
    if (sp.splits == 1) out[at.out_at(g, h, d)] = ppo_cuda::from_f<T>(0.f);
    else at.part_at(g, sp, h)[d] = 0.f;
  }
  if (sp.splits > 1 && static_cast<int>(threadIdx.x) < hpb) {
    float* pa = at.part_at(g, sp, h0 + threadIdx.x);
    pa[g.hd] = -INFINITY;
    pa[g.hd + 1] = 0.f;
  }
}

template <typename T, int KPT, int DV, int H>
__global__ void __launch_bounds__(SPLIT_THREADS)
    split_attend_kernel(const T* __restrict__ qkv, const T* __restrict__ bias, const T* __restrict__ kc,
                        const T* __restrict__ vc, const T* __restrict__ cos, const T* __restrict__ sin,
                        const int64_t* __restrict__ pos, const int32_t* __restrict__ mask,
                        const int32_t* __restrict__ fin, T* __restrict__ out, Geom g, Split sp) {
  const int64_t z = blockIdx.x, b = z / g.Tq, i = z % g.Tq;
  const int64_t kv = blockIdx.y / sp.n_hg, h0 = kv * g.grp + (blockIdx.y % sp.n_hg) * sp.hpb;
  const int64_t j_begin = blockIdx.z * sp.chunk, j_end = min(g.t0 + i + 1, j_begin + sp.chunk);
  const SplitOut at{z, b, i, static_cast<int64_t>(blockIdx.z)};
  const int hpb = static_cast<int>(sp.hpb), tid = threadIdx.x;
  __shared__ float q_sh[H][PPO_CUDA_MAX_HEAD_DIM];
  __shared__ float big[H * MAX_TILE];  // probabilities of a tile, then the key slices' outputs
  if (fin[b] || j_begin >= j_end) {
    write_empty(out, g, sp, at, h0, hpb);
    return;
  }
  const int64_t pp = clip_pos(pos[b * g.Tq + i], g.P);
  for (int64_t e = tid; e < hpb * g.hd; e += SPLIT_THREADS) {
    const int64_t h = h0 + e / g.hd, d = e % g.hd;
    q_sh[e / g.hd][d] = rope_at(qkv, bias, g, b, i, q_off(g, h), d, cos + pp * g.hd, sin + pp * g.hd) * g.scale;
  }
  __syncthreads();
  const int64_t slab = ((g.layer * g.B + b) * g.nkv + kv) * g.S * g.hd;
  const int ndg = static_cast<int>(g.hd) / DV, nks = SPLIT_THREADS / ndg;
  const int dg = tid % ndg, ks = tid / ndg;
  constexpr int TILE = SPLIT_THREADS * KPT;
  float m[H], l[H], acc[H][DV];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < DV; ++e) acc[h][e] = 0.f;
  }
  for (int64_t tile0 = j_begin; tile0 < j_end; tile0 += TILE) {
    float s[KPT][H], tmax[H];
    score_keys<T, KPT, H>(kc + slab, q_sh, mask, g, b, hpb, tile0 + static_cast<int64_t>(tid) * KPT, j_end, s, tmax);
    softmax_tile<KPT, DV, H>(s, tmax, m, l, acc, big);
    const int tile_len = static_cast<int>(min(static_cast<int64_t>(TILE), j_end - tile0));
    if (ks < nks) accumulate_pv<T, DV, H>(vc + slab, big, g.hd, tile0, tile_len, dg, ks, nks, acc);
    __syncthreads();  // `big` is rewritten by the next tile
  }
  write_heads<T, DV, H>(m, l, acc, big, out, g, sp, at, h0, hpb, dg, ks, nks);  // nks * hpb * hd <= H * MAX_TILE
}

// out[(row, query), head] from the splits' partial states (one block per (row, query), head).
template <typename T>
__global__ void merge_kernel(const int32_t* __restrict__ fin, T* __restrict__ out, Geom g, Split sp) {
  const int64_t z = blockIdx.x, h = blockIdx.y, b = z / g.Tq, i = z % g.Tq;
  const float* base = sp.part + (z * g.nh + h) * sp.splits * (g.hd + 2);
  float M = -INFINITY;
  for (int64_t s = 0; s < sp.splits; ++s) M = fmaxf(M, base[s * (g.hd + 2) + g.hd]);
  float L = 0.f;
  for (int64_t s = 0; s < sp.splits; ++s) {
    const float ms = base[s * (g.hd + 2) + g.hd];
    if (ms != -INFINITY) L += base[s * (g.hd + 2) + g.hd + 1] * __expf(ms - M);
  }
  for (int64_t d = threadIdx.x; d < g.hd; d += blockDim.x) {
    float a = 0.f;
    for (int64_t s = 0; s < sp.splits; ++s) {
      const float ms = base[s * (g.hd + 2) + g.hd];
      if (ms != -INFINITY) a += base[s * (g.hd + 2) + d] * __expf(ms - M);
    }
    const float v = (fin[b] || M == -INFINITY) ? 0.f : a / L;
    out[g.cols ? (h * g.hd + d) * g.B + b : (b * g.Tq + i) * g.nh * g.hd + h * g.hd + d] = ppo_cuda::from_f<T>(v);
  }
}

}  // namespace
