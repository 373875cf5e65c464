// Paddle binding of the CUDA step update (step_update.cu): called by csrc/cpu/step_update.cc for
// GPU tensors. Returns the number of rows still live as a [1] int64 tensor on the same GPU.
#include "binding.h"

std::vector<paddle::Tensor> UpdateCUDA(const paddle::Tensor& tokens, const paddle::Tensor& logprobs,
                                       const paddle::Tensor& rows, paddle::Tensor& finished, paddle::Tensor& pos,
                                       paddle::Tensor& out_tokens, paddle::Tensor& out_logprobs,
                                       paddle::Tensor& lengths, paddle::Tensor& presence, int64_t step,
                                       int64_t min_new_tokens, const std::vector<int64_t>& stop_ids,
                                       const std::vector<int64_t>& stop_seqs,
                                       const std::vector<int64_t>& stop_seq_lens, bool update_presence) {
  const std::initializer_list<const paddle::Tensor*> all = {&tokens, &logprobs, &rows, &finished, &pos,
                                                            &out_tokens, &out_logprobs, &lengths, &presence};
  for (const paddle::Tensor* t : all) PD_CHECK(t->is_contiguous(), "rollout_update: all tensors must be contiguous");
  PD_CHECK(tokens.dtype() == paddle::DataType::INT64 && rows.dtype() == paddle::DataType::INT64 &&
               pos.dtype() == paddle::DataType::INT64 && out_tokens.dtype() == paddle::DataType::INT64 &&
               lengths.dtype() == paddle::DataType::INT64 && logprobs.dtype() == paddle::DataType::FLOAT32 &&
               out_logprobs.dtype() == paddle::DataType::FLOAT32 && finished.dtype() == paddle::DataType::INT32,
           "rollout_update: dtypes (see csrc/cpu/step_update.cc)");
  PD_CHECK(static_cast<int64_t>(stop_ids.size()) <= PPO_CUDA_MAX_STOP_IDS &&
               static_cast<int64_t>(stop_seqs.size()) <= PPO_CUDA_MAX_STOP_TOKENS &&
               static_cast<int64_t>(stop_seq_lens.size()) <= PPO_CUDA_MAX_STOP_SEQS,
           "rollout_update (CUDA): at most 64 stop ids, 32 stop sequences, 256 stop-sequence tokens");
  PD_CHECK(out_tokens.shape().size() == 2, "rollout_update: out_tokens must be [B0, N]");
  const int64_t B = tokens.numel();
  const int64_t B0 = out_tokens.shape()[0];
  const int64_t N = out_tokens.shape()[1];
  PD_CHECK(step >= 0 && step < N, "rollout_update: step out of range");
  PD_CHECK(rows.numel() == B && finished.numel() == B && pos.numel() == B && logprobs.numel() == B,
           "rollout_update: B mismatch");
  PD_CHECK(lengths.numel() == B0 && out_logprobs.numel() == B0 * N, "rollout_update: B0 mismatch");
  int64_t V = 0;
  if (update_presence) {
    PD_CHECK(presence.dtype() == paddle::DataType::UINT8 && presence.shape().size() == 2 && presence.shape()[0] == B0,
             "rollout_update: presence must be uint8 [B0, V]");
    V = presence.shape()[1];
  }
  int64_t total_len = 0;
  for (int64_t l : stop_seq_lens) total_len += l;
  PD_CHECK(total_len == static_cast<int64_t>(stop_seqs.size()), "rollout_update: stop_seq_lens do not match");
  auto active = paddle::empty({1}, paddle::DataType::INT64, tokens.place());
  PPO_CUDA_CALL("rollout_update",
                ppo_cuda_update(tokens.data<int64_t>(), logprobs.data<float>(), rows.data<int64_t>(),
                                finished.data<int32_t>(), pos.data<int64_t>(), out_tokens.data<int64_t>(),
                                out_logprobs.data<float>(), lengths.data<int64_t>(),
                                update_presence ? presence.data<uint8_t>() : nullptr, active.data<int64_t>(), B, N, V,
                                step, min_new_tokens, stop_ids.data(), static_cast<int64_t>(stop_ids.size()),
                                stop_seqs.data(), static_cast<int64_t>(stop_seqs.size()), stop_seq_lens.data(),
                                static_cast<int64_t>(stop_seq_lens.size()), tokens.stream()));
  return {active};
}
