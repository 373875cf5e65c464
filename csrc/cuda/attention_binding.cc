// Paddle binding of the CUDA attention (attention.cu): called by csrc/cpu/attention.cc for GPU tensors.
#include "binding.h"

std::vector<paddle::Tensor> AttentionCUDA(const paddle::Tensor& qkv_in, paddle::Tensor& k_cache, paddle::Tensor& v_cache,
                                          const paddle::Tensor& cos_in, const paddle::Tensor& sin_in,
                                          const paddle::Tensor& pos_in, const paddle::Tensor& key_mask_in,
                                          const paddle::Tensor& finished_in, const paddle::optional<paddle::Tensor>& bias_in,
                                          int64_t layer, int64_t t0, int64_t num_heads, int64_t num_kv_heads,
                                          int64_t head_dim, int64_t layout, float scale, bool cols) {
  const auto qkv = ppo_ops::contig(qkv_in);
  const auto cos = ppo_ops::contig(cos_in);
  const auto sin = ppo_ops::contig(sin_in);
  const auto pos = ppo_ops::contig(pos_in);
  const auto key_mask = ppo_ops::contig(key_mask_in);
  const auto finished = ppo_ops::contig(finished_in);
  paddle::Tensor bias;
  if (bias_in) bias = ppo_ops::contig(*bias_in);
  const int dt = ppo_cuda_bind::dtype_code(qkv, "rollout_attention");
  PD_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "rollout_attention: caches must be contiguous");
  PD_CHECK(k_cache.dtype() == qkv.dtype() && v_cache.dtype() == qkv.dtype() && cos.dtype() == qkv.dtype() &&
               sin.dtype() == qkv.dtype() && (!bias_in || bias.dtype() == qkv.dtype()),
           "rollout_attention: qkv, caches, cos/sin and bias must share one dtype");
  PD_CHECK(pos.dtype() == paddle::DataType::INT64 && key_mask.dtype() == paddle::DataType::INT32 &&
               finished.dtype() == paddle::DataType::INT32,
           "rollout_attention: pos int64, key_mask and finished int32");
  const auto qs = qkv.shape();
  PD_CHECK(qs.size() == 2 || qs.size() == 3, "rollout_attention: qkv must be [B, W], [B, Tq, W] or [W, B]");
  PD_CHECK(!cols || qs.size() == 2, "rollout_attention: cols=True needs [W, B]");
  const int64_t B = cols ? qs[1] : qs[0];
  const int64_t Tq = qs.size() == 3 ? qs[1] : 1;
  const int64_t W = cols ? qs[0] : qs.back();
  PD_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0,
           "rollout_attention: num_heads must be a multiple of num_kv_heads");
  PD_CHECK(W == (num_heads + 2 * num_kv_heads) * head_dim,
           "rollout_attention: qkv width must be (nh + 2*nkv) * head_dim");
  PD_CHECK(head_dim <= PPO_CUDA_MAX_HEAD_DIM && head_dim % 2 == 0,
           "rollout_attention (CUDA): head_dim must be even and <= 256");
  const auto ks = k_cache.shape();
  PD_CHECK(ks.size() == 5 && ks[1] == B && ks[2] == num_kv_heads && ks[3] == head_dim,
           "rollout_attention: k_cache [L, B, nkv, hd, S]");
  const int64_t S = ks[4];
  const auto vs = v_cache.shape();
  PD_CHECK(vs.size() == 5 && vs[0] == ks[0] && vs[1] == B && vs[2] == num_kv_heads && vs[3] == S && vs[4] == head_dim,
           "rollout_attention: v_cache [L, B, nkv, S, hd]");
  PD_CHECK(layer >= 0 && layer < ks[0] && t0 >= 0 && t0 + Tq <= S, "rollout_attention: layer / slots out of range");
  PD_CHECK(pos.numel() == B * Tq && finished.numel() == B, "rollout_attention: pos / finished sizes");
  PD_CHECK(key_mask.shape().size() == 2 && key_mask.shape()[0] == B, "rollout_attention: key_mask [B, Tp]");
  PD_CHECK(!bias_in || bias.numel() == W, "rollout_attention: bias must have W entries");
  PD_CHECK(cos.shape().size() == 2 && cos.shape()[1] == head_dim && sin.numel() == cos.numel(),
           "rollout_attention: cos/sin [P, head_dim]");
  const int64_t D = num_heads * head_dim;
  std::vector<int64_t> out_shape = cols ? std::vector<int64_t>{D, B}
                                        : (qs.size() == 3 ? std::vector<int64_t>{B, Tq, D} : std::vector<int64_t>{B, D});
  auto out = paddle::empty(out_shape, qkv.dtype(), qkv.place());
  // the split-K partial states, from Paddle's allocator (no cudaMalloc inside the launcher)
  int64_t ws_bytes = 0;
  PPO_CUDA_CALL("rollout_attention", ppo_cuda_attention_workspace_bytes(dt, B, Tq, num_heads, num_kv_heads,
                                                                        head_dim, t0, &ws_bytes));
  auto workspace = paddle::empty({ws_bytes > 0 ? ws_bytes : 1}, paddle::DataType::UINT8, qkv.place());
  PPO_CUDA_CALL("rollout_attention",
                ppo_cuda_attention_ws(dt, ppo_cuda_bind::cptr(qkv), bias_in ? ppo_cuda_bind::cptr(bias) : nullptr,
                                      ppo_cuda_bind::mptr(k_cache), ppo_cuda_bind::mptr(v_cache),
                                      ppo_cuda_bind::cptr(cos), ppo_cuda_bind::cptr(sin), pos.data<int64_t>(),
                                      key_mask.data<int32_t>(), finished.data<int32_t>(), ppo_cuda_bind::mptr(out),
                                      B, Tq, num_heads, num_kv_heads, head_dim, S, key_mask.shape()[1],
                                      cos.shape()[0], layer, t0, layout, scale, cols ? 1 : 0,
                                      workspace.data<uint8_t>(), ws_bytes, qkv.stream()));
  return {out};
}
