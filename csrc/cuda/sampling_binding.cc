// Paddle binding of the CUDA sampler (sampling.cu): called by csrc/cpu/sampling.cc for GPU tensors.
#include "binding.h"

std::vector<paddle::Tensor> SampleCUDA(const paddle::Tensor& logits_in, const paddle::Tensor& presence_in,
                                       const paddle::Tensor& rows_in, const paddle::Tensor& uniforms_in,
                                       const paddle::Tensor& finished_in, int64_t step, float temperature, int64_t top_k,
                                       float top_p, float penalty, bool do_sample, int64_t pad_id,
                                       const std::vector<int64_t>& suppress, bool cols) {
  const auto logits = ppo_ops::contig(logits_in);
  const auto presence = ppo_ops::contig(presence_in);
  const auto rows = ppo_ops::contig(rows_in);
  const auto uniforms = ppo_ops::contig(uniforms_in);
  const auto finished = ppo_ops::contig(finished_in);
  const int dt = ppo_cuda_bind::dtype_code(logits, "rollout_sample");
  PD_CHECK(temperature > 0.f, "rollout_sample: temperature must be > 0");
  PD_CHECK(logits.shape().size() == 2, "rollout_sample: logits must be 2-D");
  PD_CHECK(static_cast<int64_t>(suppress.size()) <= PPO_CUDA_MAX_SUPPRESS,
           "rollout_sample (CUDA): at most 64 suppressed ids");
  PD_CHECK(rows.dtype() == paddle::DataType::INT64 && uniforms.dtype() == paddle::DataType::FLOAT32 &&
               finished.dtype() == paddle::DataType::INT32,
           "rollout_sample: rows int64, uniforms float32, finished int32");
  PD_CHECK(uniforms.shape().size() == 2, "rollout_sample: uniforms must be [steps, B0]");
  const int64_t B = cols ? logits.shape()[1] : logits.shape()[0];
  const int64_t V = cols ? logits.shape()[0] : logits.shape()[1];
  PD_CHECK(step >= 0 && step < uniforms.shape()[0], "rollout_sample: step out of range of uniforms");
  PD_CHECK(rows.numel() == B && finished.numel() == B, "rollout_sample: rows/finished must have B entries");
  const bool use_penalty = penalty != 1.0f;
  if (use_penalty)
    PD_CHECK(presence.dtype() == paddle::DataType::UINT8 && presence.shape().size() == 2 &&
                 presence.shape()[0] == uniforms.shape()[1] && presence.shape()[1] == V,
             "rollout_sample: presence must be uint8 [B0, V]");
  auto tokens = paddle::empty({B}, paddle::DataType::INT64, logits.place());
  auto logprobs = paddle::empty({B}, paddle::DataType::FLOAT32, logits.place());
  // the sampler's device workspace from Paddle's allocator (no cudaMalloc inside the launcher)
  const int64_t ws_bytes = ppo_cuda_sample_workspace_bytes(B, V);
  PD_CHECK(ws_bytes >= 0, "rollout_sample: empty vocabulary");
  auto workspace = paddle::empty({ws_bytes > 0 ? ws_bytes : 1}, paddle::DataType::UINT8, logits.place());
  PPO_CUDA_CALL("rollout_sample",
                ppo_cuda_sample_ws(dt, ppo_cuda_bind::cptr(logits), use_penalty ? presence.data<uint8_t>() : nullptr,
                                   rows.data<int64_t>(), uniforms.data<float>(), finished.data<int32_t>(),
                                   tokens.data<int64_t>(), logprobs.data<float>(), B, V, uniforms.shape()[1], step,
                                   temperature, top_k, top_p, penalty, do_sample ? 1 : 0, pad_id, suppress.data(),
                                   static_cast<int64_t>(suppress.size()), cols ? 1 : 0, workspace.data<uint8_t>(),
                                   ws_bytes, logits.stream()));
  return {tokens, logprobs};
}
