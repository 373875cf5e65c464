// Paddle binding of the CUDA RMSNorm (rms_norm.cu): called by csrc/cpu/rms_norm.cc for GPU tensors.
#include "binding.h"

namespace {

std::vector<paddle::Tensor> launch(const paddle::Tensor& x_in, paddle::Tensor* residual, const paddle::Tensor& w_in,
                                   float eps, bool cols) {
  const auto x = ppo_ops::contig(x_in);
  const auto w = ppo_ops::contig(w_in);
  const int dt = ppo_cuda_bind::dtype_code(x, "rollout_rms_norm");
  PD_CHECK(w.dtype() == x.dtype(), "rollout_rms_norm: weight dtype must match x");
  const auto shape = x.shape();
  PD_CHECK(!cols || shape.size() == 2, "rollout_rms_norm: cols=True needs [H, B]");
  PD_CHECK(!shape.empty(), "rollout_rms_norm: x must have at least one dimension");
  const int64_t H = cols ? shape[0] : shape.back();
  PD_CHECK(H > 0, "rollout_rms_norm: the hidden size must be positive");
  const int64_t T = x.numel() / H;
  PD_CHECK(w.numel() == H, "rollout_rms_norm: weight size must equal the hidden size");
  if (residual) {
    PD_CHECK(residual->is_contiguous() && residual->numel() == x.numel() && residual->dtype() == x.dtype(),
             "rollout_add_rms_norm: residual must be contiguous, same size and dtype as x");
  }
  auto out = paddle::empty(shape, x.dtype(), x.place());
  PPO_CUDA_CALL("rollout_rms_norm",
                ppo_cuda_rms_norm(dt, ppo_cuda_bind::cptr(x), residual ? ppo_cuda_bind::mptr(*residual) : nullptr,
                                  ppo_cuda_bind::cptr(w), ppo_cuda_bind::mptr(out), T, H, eps, cols ? 1 : 0,
                                  x.stream()));
  return {out};
}

}  // namespace

std::vector<paddle::Tensor> RmsNormCUDA(const paddle::Tensor& x, const paddle::Tensor& w, float eps, bool cols) {
  return launch(x, nullptr, w, eps, cols);
}

std::vector<paddle::Tensor> AddRmsNormCUDA(const paddle::Tensor& x, paddle::Tensor& residual, const paddle::Tensor& w,
                                           float eps, bool cols) {
  return launch(x, &residual, w, eps, cols);
}
