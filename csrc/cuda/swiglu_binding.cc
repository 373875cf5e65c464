// Paddle binding of the CUDA SwiGLU (swiglu.cu): called by csrc/cpu/swiglu.cc for GPU tensors.
#include "binding.h"

std::vector<paddle::Tensor> SwigluCUDA(const paddle::Tensor& x_in, const paddle::optional<paddle::Tensor>& y_in,
                                       bool cols) {
  const auto x = ppo_ops::contig(x_in);
  const int dt = ppo_cuda_bind::dtype_code(x, "rollout_swiglu");
  auto shape = x.shape();
  PD_CHECK(!shape.empty(), "rollout_swiglu: x must have at least one dimension");
  paddle::Tensor y;
  int mode;
  if (y_in) {
    y = ppo_ops::contig(*y_in);
    PD_CHECK(y.numel() == x.numel() && y.dtype() == x.dtype(), "rollout_swiglu: x and y must match");
    mode = 0;
  } else if (cols) {
    PD_CHECK(shape.size() == 2 && shape[0] % 2 == 0, "rollout_swiglu: cols=True needs x [2I, B]");
    shape[0] /= 2;
    mode = 2;
  } else {
    PD_CHECK(shape.back() % 2 == 0, "rollout_swiglu: the last dim of x must be even when y is absent");
    shape.back() /= 2;
    mode = 1;
  }
  auto out = paddle::empty(shape, x.dtype(), x.place());
  PPO_CUDA_CALL("rollout_swiglu",
                ppo_cuda_swiglu(dt, ppo_cuda_bind::cptr(x), mode == 0 ? ppo_cuda_bind::cptr(y) : nullptr,
                                ppo_cuda_bind::mptr(out), out.numel(), shape.back(), mode, x.stream()));
  return {out};
}
