// The per-tile steps of the tensor-core attention kernel (attention_mma.cuh, which describes the
// design): cp.async staging of a 64-key K^T / V tile with zero fill past the block's last key, the
// prompt's key mask as bits, S = Q K^T, the masks, and the online-softmax step with O += P V, all
// on one warp's 16 rows in registers.
#pragma once

#include "mma_primitives.cuh"

#ifndef PPO_MMA_AHEAD
#define PPO_MMA_AHEAD 3
#endif

namespace {

constexpr int MMA_TK = 64;  // keys per tile
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// cp.async of keys j0..j0+63 into the stage: K^T rows of 8 16-byte chunks, V rows of HD / 8; bytes
// of keys at or past j_end are zero-filled, not read.
template <typename T, int HD, int WARPS>
__device__ __forceinline__ void mma_load_tile(T* ks, T* vs, const T* kt, const T* vv, int64_t S, int64_t j0,
                                              int64_t j_end) {
  constexpr int CH = MMA_TK / 8;
#pragma unroll 4
  for (int c = threadIdx.x; c < HD * CH; c += WARPS * 32) {
    const int d = c / CH, ch = c % CH;
    const int64_t left = j_end - (j0 + ch * 8);
    const int bytes = left >= 8 ? 16 : (left > 0 ? static_cast<int>(left) * 2 : 0);
    ppo_mma::cp_async16(ks + ppo_mma::swizzle(d, ch * 8, MMA_TK), bytes ? kt + d * S + j0 + ch * 8 : kt, bytes);
  }
#pragma unroll 4
  for (int c = threadIdx.x; c < MMA_TK * (HD / 8); c += WARPS * 32) {
    const int jj = c / (HD / 8), ch = c % (HD / 8);
    const int bytes = j0 + jj < j_end ? 16 : 0;
    ppo_mma::cp_async16(vs + ppo_mma::swizzle(jj, ch * 8, HD), bytes ? vv + (j0 + jj) * HD + ch * 8 : vv, bytes);
  }
}

// Bit k set when key j0 + k is not masked out of the prompt (keys >= Tp always pass).
__device__ __forceinline__ uint64_t key_bits(const int32_t* __restrict__ mask, const Geom& g, int64_t b, int64_t j0) {
  if (j0 >= g.Tp) return ~0ull;
  const int64_t ja = j0 + (threadIdx.x & 31), jb = ja + 32;
  const bool va = ja >= g.Tp || mask[b * g.Tp + ja] != 0;
  const bool vb = jb >= g.Tp || mask[b * g.Tp + jb] != 0;
  return static_cast<uint64_t>(__ballot_sync(0xffffffffu, va)) |
         (static_cast<uint64_t>(__ballot_sync(0xffffffffu, vb)) << 32);
}

// Fragments of a tile are read AHEAD steps before the mma that uses them (mma and ldmatrix are
// issued in program order, so without it each mma would wait out its ldmatrix's latency).
constexpr int AHEAD = PPO_MMA_AHEAD;

// Shared-memory address of this lane's ldmatrix row for step (k16, n16) of a swizzled tile whose
// 16 x 16 blocks are read transposed: row k16*16 + (lane/8 % 2)*8 + lane%8, chunk 2*n16 + lane/16.
template <typename T, int ROW_ELEMS>
__device__ __forceinline__ const T* frag_addr(const T* tile, int k16, int n16) {
  const int lane = threadIdx.x & 31;
  return tile + ppo_mma::swizzle(k16 * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), (2 * n16 + (lane >> 4)) * 8, ROW_ELEMS);
}

// s = Q K^T for the warp's 16 rows and the tile's 64 keys (fragments of 8 keys each).
template <typename T, int HD>
__device__ __forceinline__ void qk_scores(float (&s)[MMA_TK / 8][4], const uint32_t (&qf)[HD / 16][4], const T* ks) {
  constexpr int NP = MMA_TK / 16, STEPS = HD / 16 * NP;  // step = (16 dims kk, 16 keys p)
#pragma unroll
  for (int n = 0; n < MMA_TK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
  uint32_t bf[AHEAD + 1][4];
#pragma unroll
  for (int st = 0; st < AHEAD; ++st) ppo_mma::ldsm_x4_trans(bf[st], frag_addr<T, MMA_TK>(ks, st / NP, st % NP));
#pragma unroll
  for (int st = 0; st < STEPS; ++st) {
    if (st + AHEAD < STEPS)
      ppo_mma::ldsm_x4_trans(bf[(st + AHEAD) % (AHEAD + 1)],
                             frag_addr<T, MMA_TK>(ks, (st + AHEAD) / NP, (st + AHEAD) % NP));
    const uint32_t(&f)[4] = bf[st % (AHEAD + 1)];
    ppo_mma::mma<T>(s[2 * (st % NP)], qf[st / NP], f[0], f[1]);
    ppo_mma::mma<T>(s[2 * (st % NP) + 1], qf[st / NP], f[2], f[3]);
  }
}

// -inf where key j0 + col is past its row's last key or masked out of the prompt.
__device__ __forceinline__ void mask_scores(float (&s)[MMA_TK / 8][4], int64_t j0, int64_t lim_a, int64_t lim_b,
                                            uint64_t kbits) {
  const int t2 = 2 * (threadIdx.x & 3);
#pragma unroll
  for (int n = 0; n < MMA_TK / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = n * 8 + t2 + (e & 1);
      const bool ok = j0 + col <= (e < 2 ? lim_a : lim_b) && ((kbits >> col) & 1ull);
      s[n][e] = ok ? s[n][e] : -INFINITY;
    }
}

// A thread's share of its warp's state: O fragments and, for rows g and g + 8, the running max
// (base 2) and this thread's part of the running sum.
template <int HD>
struct WarpState {
  float o[HD / 8][4];
  float m[2], l[2];
};

// Online-softmax step of one tile, then O += P V.
template <typename T, int HD>
__device__ __forceinline__ void softmax_pv(WarpState<HD>& st, float (&s)[MMA_TK / 8][4], const T* vs) {
  float mx[2] = {-INFINITY, -INFINITY}, base[2], corr[2];
#pragma unroll
  for (int n = 0; n < MMA_TK / 8; ++n) {
    mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {  // the 4 lanes of a row hold its 64 scores
    mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
    mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
    const float mn = fmaxf(st.m[k], mx[k]);
    base[k] = mn == -INFINITY ? 0.f : mn;  // a row with no key yet: every p is 0, never NaN
    corr[k] = ppo_mma::exp2_approx(st.m[k] - base[k]);
    st.m[k] = mn;
    st.l[k] *= corr[k];
  }
#pragma unroll
  for (int n = 0; n < MMA_TK / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = ppo_mma::exp2_approx(s[n][e] - base[e >> 1]);
      st.l[e >> 1] += s[n][e];
    }
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    st.o[n][0] *= corr[0];
    st.o[n][1] *= corr[0];
    st.o[n][2] *= corr[1];
    st.o[n][3] *= corr[1];
  }
  constexpr int NP = HD / 16, STEPS = MMA_TK / 16 * NP;  // step = (16 keys kk, 16 dims p)
  uint32_t a[MMA_TK / 16][4];  // P as A fragments: keys kk*16..+15 are accumulators 2kk, 2kk+1
#pragma unroll
  for (int kk = 0; kk < MMA_TK / 16; ++kk) {
    a[kk][0] = ppo_mma::pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = ppo_mma::pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = ppo_mma::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = ppo_mma::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
  uint32_t bf[AHEAD + 1][4];
#pragma unroll
  for (int k = 0; k < AHEAD; ++k) ppo_mma::ldsm_x4_trans(bf[k], frag_addr<T, HD>(vs, k / NP, k % NP));
#pragma unroll
  for (int k = 0; k < STEPS; ++k) {
    if (k + AHEAD < STEPS)
      ppo_mma::ldsm_x4_trans(bf[(k + AHEAD) % (AHEAD + 1)], frag_addr<T, HD>(vs, (k + AHEAD) / NP, (k + AHEAD) % NP));
    const uint32_t(&f)[4] = bf[k % (AHEAD + 1)];
    ppo_mma::mma<T>(st.o[2 * (k % NP)], a[k / NP], f[0], f[1]);
    ppo_mma::mma<T>(st.o[2 * (k % NP) + 1], a[k / NP], f[2], f[3]);
  }
}

}  // namespace
