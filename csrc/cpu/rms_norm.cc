// rollout_rms_norm / rollout_add_rms_norm: RMSNorm as PaddleNLP's LlamaRMSNorm computes it,
// (x * rsqrt(mean(x^2) + eps)) * weight, per token; the add variant first adds the branch
// output into the residual stream IN PLACE (residual += x) and normalises the sum.
// One kernel instead of the ~7 elementwise ops of the Python layer.
//   cols = false: x [..., H], one token per row (normalise over the last axis);
//   cols = true:  x [H, B], one token per COLUMN (the engine's transposed decode layout).
#include "../common.h"

#ifdef PPO_WITH_CUDA
std::vector<paddle::Tensor> RmsNormCUDA(const paddle::Tensor& x, const paddle::Tensor& w, float eps, bool cols);
std::vector<paddle::Tensor> AddRmsNormCUDA(const paddle::Tensor& x, paddle::Tensor& residual,
                                           const paddle::Tensor& w, float eps, bool cols);
#endif

namespace {

// Row r of out = RMSNorm of row r of x, or, with `res` (the residual stream), res[r] += x[r]
// in place and then RMSNorm of res[r]. Rows are split over threads; every row is computed as on
// one thread.
void rms_rows(const float* x, float* res, const float* w, float* out, int64_t rows, int64_t H, float eps) {
  ppo_ops::parallel_for(rows, rows * H * (res ? 3 : 2), [&](int64_t r) {
    const float* xr = x + r * H;
    if (res) {
      float* rr = res + r * H;
      for (int64_t d = 0; d < H; ++d) rr[d] = rr[d] + xr[d];
      xr = rr;
    }
    float* orow = out + r * H;
    const float var = ppo_ops::sum_squares(xr, H) / static_cast<float>(H);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int64_t d = 0; d < H; ++d) orow[d] = (xr[d] * inv) * w[d];
  });
}

// x [H, B]: token b is column b. Columns are split over threads in blocks of 16 (each column's
// sum of squares still runs over h in order).
void rms_cols(const float* x, float* res, const float* w, float* out, int64_t H, int64_t B, float eps) {
  ppo_ops::parallel_team((B + 15) / 16, H * B * (res ? 3 : 2), [&](int t, int T) {
    const auto blk = ppo_ops::block_of(B, 16, t, T);
    const int64_t b0 = blk.first, nb = blk.second - blk.first;
    if (nb <= 0) return;
    if (res) {
      for (int64_t h = 0; h < H; ++h) {
        float* rr = res + h * B + b0;
        const float* xr = x + h * B + b0;
        for (int64_t b = 0; b < nb; ++b) rr[b] = rr[b] + xr[b];
      }
    }
    const float* src = res ? res : x;
    std::vector<float> ss(nb, 0.f);
    for (int64_t h = 0; h < H; ++h) {
      const float* xr = src + h * B + b0;
      for (int64_t b = 0; b < nb; ++b) ss[b] += xr[b] * xr[b];
    }
    for (int64_t b = 0; b < nb; ++b) ss[b] = 1.0f / std::sqrt(ss[b] / static_cast<float>(H) + eps);
    for (int64_t h = 0; h < H; ++h) {
      const float* xr = src + h * B + b0;
      float* orow = out + h * B + b0;
      const float wh = w[h];
      for (int64_t b = 0; b < nb; ++b) orow[b] = (xr[b] * ss[b]) * wh;
    }
  });
}

void rms_any(const float* x, float* res, const float* w, float* out, const std::vector<int64_t>& shape,
             int64_t numel, float eps, bool cols) {
  if (cols) {
    PD_CHECK(shape.size() == 2, "rms_norm: cols=True needs a 2-D [H, B] input");
    rms_cols(x, res, w, out, shape[0], shape[1], eps);
  } else {
    const int64_t H = shape.back();
    rms_rows(x, res, w, out, H ? numel / H : 0, H, eps);
  }
}

}  // namespace

std::vector<paddle::Tensor> RmsNorm(const paddle::Tensor& x_in, const paddle::Tensor& w_in, float eps, bool cols) {
  if (x_in.is_gpu()) {
#ifdef PPO_WITH_CUDA
    return RmsNormCUDA(x_in, w_in, eps, cols);
#else
    PD_THROW("rollout_rms_norm: ops were built without CUDA");
#endif
  }
  const auto x = ppo_ops::contig(x_in);
  const auto w = ppo_ops::contig(w_in);
  PPO_CHECK_CPU_F32(x, "rollout_rms_norm: x");
  PPO_CHECK_CPU_F32(w, "rollout_rms_norm: weight");
  const int64_t H = cols ? x.shape()[0] : x.shape().back();
  PD_CHECK(w.numel() == H, "rollout_rms_norm: weight size must equal the hidden size");
  auto out = paddle::empty(x.shape(), x.dtype(), x.place());
  rms_any(x.data<float>(), nullptr, w.data<float>(), out.data<float>(), x.shape(), x.numel(), eps, cols);
  return {out};
}

std::vector<paddle::Tensor> AddRmsNorm(const paddle::Tensor& x_in, paddle::Tensor& residual,
                                       const paddle::Tensor& w_in, float eps, bool cols) {
  if (x_in.is_gpu()) {
#ifdef PPO_WITH_CUDA
    return AddRmsNormCUDA(x_in, residual, w_in, eps, cols);
#else
    PD_THROW("rollout_add_rms_norm: ops were built without CUDA");
#endif
  }
  const auto x = ppo_ops::contig(x_in);
  const auto w = ppo_ops::contig(w_in);
  PPO_CHECK_CPU_F32(x, "rollout_add_rms_norm: x");
  PPO_CHECK_CPU_F32(residual, "rollout_add_rms_norm: residual");
  PPO_CHECK_CONTIGUOUS(residual, "rollout_add_rms_norm: residual (written in place)");
  PPO_CHECK_CPU_F32(w, "rollout_add_rms_norm: weight");
  PD_CHECK(x.numel() == residual.numel(), "rollout_add_rms_norm: x and residual must have the same size");
  const int64_t H = cols ? x.shape()[0] : x.shape().back();
  PD_CHECK(w.numel() == H, "rollout_add_rms_norm: weight size must equal the hidden size");
  auto out = paddle::empty(x.shape(), x.dtype(), x.place());
  // residual += x row by row (column block by block) just before each is normalised
  rms_any(x.data<float>(), residual.data<float>(), w.data<float>(), out.data<float>(), x.shape(), x.numel(), eps, cols);
  return {out};
}

std::vector<std::vector<int64_t>> RmsNormShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  return {x};
}
std::vector<paddle::DataType> RmsNormDtype(const paddle::DataType& x, const paddle::DataType& w) { return {x}; }
std::vector<std::vector<int64_t>> AddRmsNormShape(const std::vector<int64_t>& x, const std::vector<int64_t>& r,
                                                  const std::vector<int64_t>& w) {
  return {x};
}
std::vector<paddle::DataType> AddRmsNormDtype(const paddle::DataType& x, const paddle::DataType& r,
                                              const paddle::DataType& w) {
  return {x};
}

PD_BUILD_OP(rollout_rms_norm)
    .Inputs({"X", "Weight"})
    .Outputs({"Out"})
    .Attrs({"eps: float", "cols: bool"})
    .SetKernelFn(PD_KERNEL(RmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(RmsNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RmsNormDtype));

PD_BUILD_OP(rollout_add_rms_norm)
    .Inputs({"X", "Residual", "Weight"})
    .Outputs({"Out", "ResidualOut"})
    .Attrs({"eps: float", "cols: bool"})
    .SetInplaceMap({{"Residual", "ResidualOut"}})
    .SetKernelFn(PD_KERNEL(AddRmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(AddRmsNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AddRmsNormDtype));
