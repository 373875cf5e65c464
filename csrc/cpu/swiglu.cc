// rollout_swiglu: silu(gate) * up, PaddleNLP's swiglu, with a vectorised exp.
//   Y absent, cols = false: X [..., 2I], gate = X[..., :I], up = X[..., I:] (fuse_attention_ffn);
//   Y absent, cols = true:  X [2I, B] (transposed decode layout), gate = X[:I], up = X[I:];
//   Y given: gate = X, up = Y (same shapes), any layout.
// silu(g) = g / (1 + exp(-g)).
#include "../common.h"

#ifdef PPO_WITH_CUDA
std::vector<paddle::Tensor> SwigluCUDA(const paddle::Tensor& x, const paddle::optional<paddle::Tensor>& y, bool cols);
#endif

namespace {

constexpr int64_t kWork = 5;  // work units per output (ppo_ops::kParallelMinWork): an exp, a division

void swiglu_span(const float* g, const float* u, float* out, int64_t n, float* tmp) {
  for (int64_t i = 0; i < n; ++i) tmp[i] = -g[i];
  ppo_ops::exp_inplace(tmp, n);
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + tmp[i]) * u[i];
}

}  // namespace

std::vector<paddle::Tensor> Swiglu(const paddle::Tensor& x_in, const paddle::optional<paddle::Tensor>& y_in,
                                   bool cols) {
  if (x_in.is_gpu()) {
#ifdef PPO_WITH_CUDA
    return SwigluCUDA(x_in, y_in, cols);
#else
    PD_THROW("rollout_swiglu: ops were built without CUDA");
#endif
  }
  const auto x = ppo_ops::contig(x_in);
  PPO_CHECK_CPU_F32(x, "rollout_swiglu: x");
  auto shape = x.shape();
  paddle::Tensor y;
  if (y_in) {
    y = ppo_ops::contig(*y_in);
    PPO_CHECK_CPU_F32(y, "rollout_swiglu: y");
    PD_CHECK(y.numel() == x.numel(), "rollout_swiglu: x and y must have the same size");
  } else if (cols) {
    PD_CHECK(shape.size() == 2 && shape[0] % 2 == 0, "rollout_swiglu: cols=True needs x [2I, B]");
    shape[0] /= 2;
  } else {
    PD_CHECK(shape.back() % 2 == 0, "rollout_swiglu: the last dim of x must be even when y is absent");
    shape.back() /= 2;
  }
  auto out = paddle::empty(shape, x.dtype(), x.place());
  const float* px = x.data<float>();
  float* po = out.data<float>();
  const int64_t n_out = out.numel();
  if (y_in || cols) {  // two contiguous spans, split over threads in blocks of 8 (exp_inplace's lanes)
    const float* pu = y_in ? y.data<float>() : px + n_out;
    ppo_ops::parallel_team((n_out + 7) / 8, n_out * kWork, [&](int t, int T) {
      const auto blk = ppo_ops::block_of(n_out, 8, t, T);
      if (blk.second <= blk.first) return;
      std::vector<float> tmp(blk.second - blk.first);
      swiglu_span(px + blk.first, pu + blk.first, po + blk.first, blk.second - blk.first, tmp.data());
    });
  } else {  // rows split over threads
    const int64_t I = shape.back();
    const int64_t rows = I ? n_out / I : 0;
    ppo_ops::parallel_team(rows, n_out * kWork, [&](int t, int T) {
      const auto blk = ppo_ops::block_of(rows, 1, t, T);
      std::vector<float> tmp(I);
      for (int64_t r = blk.first; r < blk.second; ++r)
        swiglu_span(px + r * 2 * I, px + r * 2 * I + I, po + r * I, I, tmp.data());
    });
  }
  return {out};
}

std::vector<std::vector<int64_t>> SwigluShape(const std::vector<int64_t>& x,
                                              const paddle::optional<std::vector<int64_t>>& y, bool cols) {
  std::vector<int64_t> out(x);
  if (!y) {
    if (cols)
      out[0] /= 2;
    else
      out.back() /= 2;
  }
  return {out};
}
std::vector<paddle::DataType> SwigluDtype(const paddle::DataType& x, const paddle::optional<paddle::DataType>& y) {
  return {x};
}

PD_BUILD_OP(rollout_swiglu)
    .Inputs({"X", paddle::Optional("Y")})
    .Outputs({"Out"})
    .Attrs({"cols: bool"})
    .SetKernelFn(PD_KERNEL(Swiglu))
    .SetInferShapeFn(PD_INFER_SHAPE(SwigluShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SwigluDtype));
