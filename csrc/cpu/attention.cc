// rollout_attention: rotary embedding + in-place KV-cache write + masked attention over the
// cache, for all heads of one layer, in one kernel. Serves both the prefill (Tq = prompt
// length, t0 = 0) and every decode step (Tq = 1, t0 = cache slot of the fed token).
//
//   QKV      [B, Tq, W] or [B, W] (Tq = 1), W = (nh + 2 * nkv) * hd, float32; with cols = true
//            [W, B] (Tq = 1, the transposed decode layout: token b is column b).
//            layout 0: [q heads | k heads | v heads]; layout 1: PaddleNLP fuse_attention_qkv
//            order, per kv head g: [group q heads, k, v].
//   Bias     optional [W]: added to q/k/v first (Qwen2's q/k/v biases).
//   KCache   [L, B, nkv, hd, S]  keys after RoPE, stored TRANSPOSED (slot index last) so the
//            q.k scores of 8 slots come out of one FMA per head dim, no horizontal sums;
//   VCache   [L, B, nkv, S, hd]  values. Both written IN PLACE at slots t0 .. t0+Tq-1 of `layer`.
//   Cos/Sin  [P, hd] rotary tables (the model's own cos_cached / sin_cached rows).
//   Pos      [B, Tq] (or [B]) int64 position ids of the fed tokens (from the attention mask);
//            clipped to [0, P-1].
//   KeyMask  [B, Tp] int32: 1 for real prompt tokens; cache slots >= Tp are generated tokens
//            and always valid.
//   Finished [B] int32: rows with 1 are skipped (output zeros, cache untouched).
// Query i of row b attends to slots j <= t0 + i with (j >= Tp or KeyMask[b, j] == 1), with
// softmax((rope(q) * scale) . rope(k)) like PaddleNLP's scaled_dot_product_attention. A query
// with no valid key (a padding position) outputs zeros. Out: [B, Tq, nh*hd] / [B, nh*hd], or
// [nh*hd, B] with cols = true.
#include "../common.h"

#ifdef PPO_WITH_CUDA
std::vector<paddle::Tensor> AttentionCUDA(const paddle::Tensor& qkv, paddle::Tensor& k_cache, paddle::Tensor& v_cache,
                                          const paddle::Tensor& cos, const paddle::Tensor& sin,
                                          const paddle::Tensor& pos, const paddle::Tensor& key_mask,
                                          const paddle::Tensor& finished, const paddle::optional<paddle::Tensor>& bias,
                                          int64_t layer, int64_t t0, int64_t num_heads, int64_t num_kv_heads,
                                          int64_t head_dim, int64_t layout, float scale, bool cols);
#endif

namespace {

// sc[j] = sum_d q[d] * kt[d * S + j] for j in [0, n). The transposed keys are read row by row
// (d-major), i.e. sequentially through the slab, which keeps the hardware prefetcher streaming;
// the n partial scores stay in L1.
void scores_transposed(const float* q, const float* kt, int64_t S, int64_t hd, int64_t n, float* sc) {
  std::memset(sc, 0, sizeof(float) * n);
  for (int64_t d = 0; d < hd; ++d) ppo_ops::axpy(q[d], kt + d * S, sc, n);
}

// out[d] = inv * sum_j p[j] * v[j * hd + d]   (p[j] == 0 rows skipped); V rows are read in order
void weighted_values(const float* p, const float* v, int64_t hd, int64_t n, float inv, float* out) {
  int64_t d0 = 0;
#ifdef PPO_AVX2
  for (; d0 + 64 <= hd; d0 += 64) {
    __m256 a[8];
    for (int k = 0; k < 8; ++k) a[k] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      if (p[j] == 0.f) continue;
      const __m256 bp = _mm256_set1_ps(p[j]);
      const float* vr = v + j * hd + d0;
      for (int k = 0; k < 8; ++k) a[k] = _mm256_fmadd_ps(bp, _mm256_loadu_ps(vr + 8 * k), a[k]);
    }
    const __m256 vi = _mm256_set1_ps(inv);
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(out + d0 + 8 * k, _mm256_mul_ps(a[k], vi));
  }
  for (; d0 + 8 <= hd; d0 += 8) {
    __m256 a0 = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j)
      if (p[j] != 0.f) a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + j * hd + d0), a0);
    _mm256_storeu_ps(out + d0, _mm256_mul_ps(a0, _mm256_set1_ps(inv)));
  }
#endif
  for (; d0 < hd; ++d0) {
    float a = 0.f;
    for (int64_t j = 0; j < n; ++j) a += p[j] * v[j * hd + d0];
    out[d0] = a * inv;
  }
}

}  // namespace

std::vector<paddle::Tensor> Attention(const paddle::Tensor& qkv_in, paddle::Tensor& k_cache, paddle::Tensor& v_cache,
                                      const paddle::Tensor& cos_in, const paddle::Tensor& sin_in,
                                      const paddle::Tensor& pos_in, const paddle::Tensor& key_mask_in,
                                      const paddle::Tensor& finished_in, const paddle::optional<paddle::Tensor>& bias_in,
                                      int64_t layer, int64_t t0, int64_t num_heads, int64_t num_kv_heads,
                                      int64_t head_dim, int64_t layout, float scale, bool cols) {
  if (qkv_in.is_gpu()) {
#ifdef PPO_WITH_CUDA
    return AttentionCUDA(qkv_in, k_cache, v_cache, cos_in, sin_in, pos_in, key_mask_in, finished_in, bias_in, layer,
                         t0, num_heads, num_kv_heads, head_dim, layout, scale, cols);
#else
    PD_THROW("rollout_attention: ops were built without CUDA");
#endif
  }
  const auto qkv = ppo_ops::contig(qkv_in);
  const auto cos = ppo_ops::contig(cos_in);
  const auto sin = ppo_ops::contig(sin_in);
  const auto pos = ppo_ops::contig(pos_in);
  const auto key_mask = ppo_ops::contig(key_mask_in);
  const auto finished = ppo_ops::contig(finished_in);
  PPO_CHECK_CPU_F32(qkv, "rollout_attention: qkv");
  PPO_CHECK_CPU_F32(k_cache, "rollout_attention: k_cache");
  PPO_CHECK_CPU_F32(v_cache, "rollout_attention: v_cache");
  PPO_CHECK_CONTIGUOUS(k_cache, "rollout_attention: k_cache");
  PPO_CHECK_CONTIGUOUS(v_cache, "rollout_attention: v_cache");
  PPO_CHECK_CPU_F32(cos, "rollout_attention: cos");
  PPO_CHECK_CPU_F32(sin, "rollout_attention: sin");
  PD_CHECK(pos.dtype() == paddle::DataType::INT64, "rollout_attention: pos must be int64");
  PD_CHECK(key_mask.dtype() == paddle::DataType::INT32, "rollout_attention: key_mask must be int32");
  PD_CHECK(finished.dtype() == paddle::DataType::INT32, "rollout_attention: finished must be int32");

  const auto qs = qkv.shape();
  PD_CHECK(!cols || qs.size() == 2, "rollout_attention: cols=True needs a 2-D [W, B] qkv (decode)");
  const int64_t B = cols ? qs[1] : qs[0];
  const int64_t Tq = qs.size() == 3 ? qs[1] : 1;
  const int64_t W = cols ? qs[0] : qs.back();
  const int64_t nh = num_heads, nkv = num_kv_heads, hd = head_dim;
  PD_CHECK(nkv > 0 && nh % nkv == 0, "rollout_attention: num_heads must be a multiple of num_kv_heads");
  PD_CHECK(W == (nh + 2 * nkv) * hd, "rollout_attention: qkv width must be (nh + 2*nkv) * head_dim");
  paddle::Tensor bias;
  if (bias_in) {
    bias = ppo_ops::contig(*bias_in);
    PPO_CHECK_CPU_F32(bias, "rollout_attention: bias");
    PD_CHECK(bias.numel() == W, "rollout_attention: bias must have W entries");
  }
  const auto ks = k_cache.shape();
  const auto vs = v_cache.shape();
  PD_CHECK(ks.size() == 5 && ks[1] == B && ks[2] == nkv && ks[3] == hd, "rollout_attention: k_cache must be [L, B, nkv, hd, S]");
  const int64_t L = ks[0], S = ks[4];
  PD_CHECK(vs.size() == 5 && vs[0] == L && vs[1] == B && vs[2] == nkv && vs[3] == S && vs[4] == hd,
           "rollout_attention: v_cache must be [L, B, nkv, S, hd]");
  PD_CHECK(layer >= 0 && layer < L, "rollout_attention: layer out of range");
  PD_CHECK(t0 >= 0 && t0 + Tq <= S, "rollout_attention: cache slots out of range");
  PD_CHECK(pos.numel() == B * Tq, "rollout_attention: pos must have B*Tq entries");
  PD_CHECK(finished.numel() == B, "rollout_attention: finished must have B entries");
  PD_CHECK(key_mask.shape().size() == 2 && key_mask.shape()[0] == B, "rollout_attention: key_mask must be [B, Tp]");
  const int64_t Tp = key_mask.shape()[1];
  const int64_t P = cos.shape()[0];
  PD_CHECK(cos.shape().back() == hd && sin.numel() == cos.numel(), "rollout_attention: cos/sin must be [P, hd]");
  const int64_t grp = nh / nkv;
  const int64_t D = nh * hd;

  std::vector<int64_t> out_shape = cols ? std::vector<int64_t>{D, B}
                                        : (qs.size() == 3 ? std::vector<int64_t>{B, Tq, D} : std::vector<int64_t>{B, D});
  auto out = paddle::empty(out_shape, qkv.dtype(), qkv.place());

  const float* pq = qkv.data<float>();
  const float* pbias = bias_in ? bias.data<float>() : nullptr;
  float* kc = k_cache.data<float>();
  float* vc = v_cache.data<float>();
  const float* pcos = cos.data<float>();
  const float* psin = sin.data<float>();
  const int64_t* ppos = pos.data<int64_t>();
  const int32_t* pmask = key_mask.data<int32_t>();
  const int32_t* pfin = finished.data<int32_t>();
  float* po = out.data<float>();

  auto q_off = [&](int64_t h) -> int64_t {
    return layout == 0 ? h * hd : ((h / grp) * (grp + 2) + (h % grp)) * hd;
  };
  auto k_off = [&](int64_t g) -> int64_t { return layout == 0 ? (nh + g) * hd : (g * (grp + 2) + grp) * hd; };
  auto v_off = [&](int64_t g) -> int64_t {
    return layout == 0 ? (nh + nkv + g) * hd : (g * (grp + 2) + grp + 1) * hd;
  };
  const int64_t plane = S * hd;  // one (layer, row, kv head) slab
  auto k_base = [&](int64_t b, int64_t g) { return kc + ((layer * B + b) * nkv + g) * plane; };
  auto v_base = [&](int64_t b, int64_t g) { return vc + ((layer * B + b) * nkv + g) * plane; };
  auto clip_pos = [&](int64_t p) { return p < 0 ? 0 : (p >= P ? P - 1 : p); };
  const float NEG_INF = -std::numeric_limits<float>::infinity();

  // this row's q/k/v (+ bias) as [Tq, W]: the input itself, or a copy (bias added, cols gathered)
  const bool own_rows = bias_in || cols;
  std::vector<float> rowbuf(own_rows ? B * Tq * W : 0), obuf(cols ? B * D : 0);
  auto rows_of = [&](int64_t b) -> const float* { return (own_rows ? rowbuf.data() : pq) + b * Tq * W; };

  // 1) per batch row (rows split over threads): finished rows output zeros; the others gather
  //    their q/k/v (+ bias) and write rotated K (transposed) and V of the Tq fed tokens into
  //    their cache slots
  ppo_ops::parallel_team(B, B * Tq * (W + 4 * nkv * hd), [&](int t, int T) {
    std::vector<float> kbuf(hd);
    const auto rb = ppo_ops::block_of(B, 1, t, T);
    for (int64_t b = rb.first; b < rb.second; ++b) {
      if (pfin[b]) {
        if (!cols) std::memset(po + b * Tq * D, 0, sizeof(float) * Tq * D);  // cols: obuf stays 0
        continue;
      }
      if (own_rows) {
        float* rbuf = rowbuf.data() + b * Tq * W;
        if (cols) {
          for (int64_t c = 0; c < W; ++c) rbuf[c] = pq[c * B + b];
        } else {
          std::memcpy(rbuf, pq + b * Tq * W, sizeof(float) * Tq * W);
        }
        if (bias_in) {
          for (int64_t i = 0; i < Tq; ++i)
            for (int64_t c = 0; c < W; ++c) rbuf[i * W + c] += pbias[c];
        }
      }
      const float* rows = rows_of(b);
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t p = clip_pos(ppos[b * Tq + i]);
        const float* row = rows + i * W;
        const int64_t slot = t0 + i;
        for (int64_t g = 0; g < nkv; ++g) {
          ppo_ops::rope(row + k_off(g), pcos + p * hd, psin + p * hd, kbuf.data(), hd, 1.0f);
          float* kt = k_base(b, g);
          for (int64_t d = 0; d < hd; ++d) kt[d * S + slot] = kbuf[d];
          std::memcpy(v_base(b, g) + slot * hd, row + v_off(g), sizeof(float) * hd);
        }
      }
    }
  });

  // 2) attention of each (row, query, head) over the valid cache slots of its row; the items
  //    are dealt to threads in turn (causal prefill: later queries cost more)
  const int64_t items = B * Tq * nh;
  ppo_ops::parallel_team(items, items * (t0 + Tq) * hd * 3, [&](int t, int T) {
    std::vector<float> qbuf(hd), scores(S + 8);
    for (int64_t item = t; item < items; item += T) {
      const int64_t b = item / (Tq * nh), i = (item / nh) % Tq, h = item % nh;
      if (pfin[b]) continue;
      const int32_t* mrow = pmask + b * Tp;
      const int64_t p = clip_pos(ppos[b * Tq + i]);
      const float* row = rows_of(b) + i * W;
      const int64_t n = t0 + i + 1;
      const int64_t g = h / grp;
      float* oh = (cols ? obuf.data() + b * D : po + b * Tq * D) + (i * nh + h) * hd;
      ppo_ops::rope(row + q_off(h), pcos + p * hd, psin + p * hd, qbuf.data(), hd, scale);
      float* sc = scores.data();
      // scores for n8 >= n slots (whole vectors when S allows; the extra slots are masked)
      const int64_t n8 = std::min((n + 7) / 8 * 8, S);
      scores_transposed(qbuf.data(), k_base(b, g), S, hd, n8, sc);
      float mx = NEG_INF;
      for (int64_t j = 0; j < n; ++j) {
        if (j < Tp && !mrow[j]) sc[j] = NEG_INF;
        mx = sc[j] > mx ? sc[j] : mx;
      }
      for (int64_t j = n; j < n8; ++j) sc[j] = NEG_INF;
      if (mx == NEG_INF) {
        std::memset(oh, 0, sizeof(float) * hd);
        continue;
      }
      for (int64_t j = 0; j < n8; ++j) sc[j] -= mx;  // -inf stays -inf -> exp gives 0
      ppo_ops::exp_inplace(sc, n8);
      const float denom = ppo_ops::sum(sc, n8);
      weighted_values(sc, v_base(b, g), hd, n, 1.0f / denom, oh);
    }
  });

  // 3) cols: token b's output is column b
  if (cols) {
    ppo_ops::parallel_for(D, D * B, [&](int64_t c) {
      for (int64_t b = 0; b < B; ++b) po[c * B + b] = obuf[b * D + c];
    });
  }
  return {out};
}

std::vector<std::vector<int64_t>> AttentionShape(const std::vector<int64_t>& qkv, const std::vector<int64_t>& kc,
                                                 const std::vector<int64_t>& vc, const std::vector<int64_t>& cos,
                                                 const std::vector<int64_t>& sin, const std::vector<int64_t>& pos,
                                                 const std::vector<int64_t>& mask, const std::vector<int64_t>& fin,
                                                 const paddle::optional<std::vector<int64_t>>& bias, int64_t layer,
                                                 int64_t t0, int64_t num_heads, int64_t num_kv_heads,
                                                 int64_t head_dim, int64_t layout, float scale, bool cols) {
  std::vector<int64_t> out(qkv);
  if (cols)
    out[0] = num_heads * head_dim;
  else
    out.back() = num_heads * head_dim;
  return {out};
}
std::vector<paddle::DataType> AttentionDtype(const paddle::DataType& qkv, const paddle::DataType& kc,
                                             const paddle::DataType& vc, const paddle::DataType& cos,
                                             const paddle::DataType& sin, const paddle::DataType& pos,
                                             const paddle::DataType& mask, const paddle::DataType& fin,
                                             const paddle::optional<paddle::DataType>& bias) {
  return {qkv};
}

PD_BUILD_OP(rollout_attention)
    .Inputs({"QKV", "KCache", "VCache", "Cos", "Sin", "Pos", "KeyMask", "Finished", paddle::Optional("Bias")})
    .Outputs({"Out", "KCacheOut", "VCacheOut"})
    .Attrs({"layer: int64_t", "t0: int64_t", "num_heads: int64_t", "num_kv_heads: int64_t", "head_dim: int64_t",
            "layout: int64_t", "scale: float", "cols: bool"})
    .SetInplaceMap({{"KCache", "KCacheOut"}, {"VCache", "VCacheOut"}})
    .SetKernelFn(PD_KERNEL(Attention))
    .SetInferShapeFn(PD_INFER_SHAPE(AttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AttentionDtype));
