// Paddle binding of the CUDA packed transpose (pack_transposed.cu): called by
// csrc/cpu/pack_transposed.cc for GPU tensors. dst = concat([x_i^T], axis 0), in place.
#include "binding.h"

void PackTransposedCUDA(paddle::Tensor& dst, const std::vector<paddle::Tensor>& xs_in) {
  PD_CHECK(!xs_in.empty(), "rollout_pack_transposed: at least one input");
  std::vector<paddle::Tensor> xs;
  for (const auto& t : xs_in) xs.push_back(ppo_ops::contig(t));
  const int dt = ppo_cuda_bind::dtype_code(dst, "rollout_pack_transposed");
  PD_CHECK(xs[0].shape().size() == 2, "rollout_pack_transposed: inputs must be [K, N_i]");
  const int64_t K = xs[0].shape()[0];
  int64_t total = 0;
  for (const auto& t : xs) {
    PD_CHECK(t.shape().size() == 2 && t.shape()[0] == K && t.dtype() == dst.dtype(),
             "rollout_pack_transposed: inputs must be [K, N_i] of the dst dtype");
    total += t.shape()[1];
  }
  PD_CHECK(dst.is_contiguous() && dst.shape().size() == 2 && dst.shape()[0] == total && dst.shape()[1] == K,
           "rollout_pack_transposed: dst must be a contiguous [sum N_i, K]");
  const int64_t elem = static_cast<int64_t>(phi::SizeOf(dst.dtype()));
  char* base = static_cast<char*>(ppo_cuda_bind::mptr(dst));
  int64_t row0 = 0;
  for (const auto& t : xs) {
    const int64_t N = t.shape()[1];
    PPO_CUDA_CALL("rollout_pack_transposed",
                  ppo_cuda_transpose(dt, ppo_cuda_bind::cptr(t), base + row0 * K * elem, K, N, t.stream()));
    row0 += N;
  }
}
