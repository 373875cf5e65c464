// train_sdpa: PaddleNLP's non-flash scaled_dot_product_attention for training, float32, CPU,
// with a registered backward:
//
//   train_sdpa(Q [B, S, H, D], K [B, S, H, D], V [B, S, H, D], Mask [Bm, 1, S, S]; scale)
//     -> Out [B, S, H * D], Probs [B, H, S, S]
//   Probs = softmax(scale * Q K^T + Mask) over the keys (float32), Out = Probs V, heads merged.
//   Mask is PaddleNLP's additive mask (0 where a query sees a key, the dtype's lowest value
//   elsewhere), Bm = 1 or B. K / V carry H heads (grouped-query models repeat them first, as
//   PaddleNLP does on this path). A query row whose keys are all masked gets the softmax of
//   its raw scores plus that constant, exactly as PaddleNLP computes it (its padding rows never
//   reach a loss).
//   Backward: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP)), dQ = scale dS K,
//   dK = scale dS^T Q.
//
// The four batched matmuls run in Paddle's own matmul kernel (paddle::experimental::matmul);
// this file fuses everything between them: the head transposes, scale, mask, softmax and its
// gradient, which in the Python layer are ~10 kernels each way, several on strided views.
#include "../common.h"

namespace {

void check_f32(const paddle::Tensor& t, const char* what) {
  PD_CHECK(!t.is_gpu(), "train_sdpa: ", what, " is on a GPU (CPU kernel only; the CUDA build uses flash attention)");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32, "train_sdpa: ", what, " must be float32");
}

// [B, S, H, D] -> [B, H, S, D] (to_heads) and back; the (b, s) rows split over threads.
void to_heads(const float* x, float* y, int64_t B, int64_t S, int64_t H, int64_t D) {
  ppo_ops::parallel_for(B * S, B * S * H * D, [&](int64_t bs) {
    const int64_t b = bs / S, s = bs % S;
    for (int64_t h = 0; h < H; ++h)
      std::memcpy(y + ((b * H + h) * S + s) * D, x + ((b * S + s) * H + h) * D, sizeof(float) * D);
  });
}

void from_heads(const float* y, float* x, int64_t B, int64_t S, int64_t H, int64_t D) {
  ppo_ops::parallel_for(B * S, B * S * H * D, [&](int64_t bs) {
    const int64_t b = bs / S, s = bs % S;
    for (int64_t h = 0; h < H; ++h)
      std::memcpy(x + ((b * S + s) * H + h) * D, y + ((b * H + h) * S + s) * D, sizeof(float) * D);
  });
}

paddle::Tensor heads_of(const paddle::Tensor& x_in, const char* what, const std::vector<int64_t>& shape) {
  check_f32(x_in, what);
  const auto x = ppo_ops::contig(x_in);
  PD_CHECK(x.shape() == shape, "train_sdpa: ", what, " must be [batch, seq, heads, head_dim] like q");
  const int64_t B = shape[0], S = shape[1], H = shape[2], D = shape[3];
  auto y = paddle::empty({B, H, S, D}, paddle::DataType::FLOAT32, x.place());
  to_heads(x.data<float>(), y.data<float>(), B, S, H, D);
  return y;
}

paddle::Tensor merge_heads(const paddle::Tensor& y, int64_t B, int64_t S, int64_t H, int64_t D,
                           const std::vector<int64_t>& out_shape) {
  auto x = paddle::empty(out_shape, paddle::DataType::FLOAT32, y.place());
  from_heads(y.data<float>(), x.data<float>(), B, S, H, D);
  return x;
}

}  // namespace

std::vector<paddle::Tensor> TrainSdpa(const paddle::Tensor& q_in, const paddle::Tensor& k_in,
                                      const paddle::Tensor& v_in, const paddle::Tensor& mask_in, float scale) {
  check_f32(q_in, "q");
  const auto shape = q_in.shape();
  PD_CHECK(shape.size() == 4, "train_sdpa: q must be [batch, seq, heads, head_dim]");
  const int64_t B = shape[0], S = shape[1], H = shape[2], D = shape[3];
  check_f32(mask_in, "mask");
  const auto mask = ppo_ops::contig(mask_in);
  const auto& ms = mask.shape();
  PD_CHECK(ms.size() == 4 && (ms[0] == 1 || ms[0] == B) && ms[1] == 1 && ms[2] == S && ms[3] == S,
           "train_sdpa: mask must be [1 or batch, 1, seq, seq] (an additive mask)");
  const auto qh = heads_of(q_in, "q", shape);
  const auto kh = heads_of(k_in, "k", shape);
  const auto vh = heads_of(v_in, "v", shape);
  auto probs = paddle::experimental::matmul(qh, kh, false, true);  // [B, H, S, S]
  float* p = probs.data<float>();
  const float* m = mask.data<float>();
  const int64_t mask_batch = ms[0];
  // one softmax per (b, h, i) row of probs, the rows split over threads
  ppo_ops::parallel_for(B * H * S, B * H * S * S * 8, [&](int64_t bhi) {
    const int64_t b = bhi / (H * S), i = bhi % S;
    float* row = p + bhi * S;
    const float* mrow = m + (mask_batch == 1 ? 0 : b) * S * S + i * S;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < S; ++j) {
      row[j] = row[j] * scale + mrow[j];
      mx = std::max(mx, row[j]);
    }
    for (int64_t j = 0; j < S; ++j) row[j] -= mx;
    ppo_ops::exp_inplace(row, S);
    const float inv = 1.0f / ppo_ops::sum(row, S);
    for (int64_t j = 0; j < S; ++j) row[j] *= inv;
  });
  const auto oh = paddle::experimental::matmul(probs, vh, false, false);  // [B, H, S, D]
  return {merge_heads(oh, B, S, H, D, {B, S, H * D}), probs};
}

std::vector<paddle::Tensor> TrainSdpaGrad(const paddle::Tensor& q_in, const paddle::Tensor& k_in,
                                          const paddle::Tensor& v_in, const paddle::Tensor& probs,
                                          const paddle::Tensor& dout_in, float scale) {
  const auto shape = q_in.shape();
  const int64_t B = shape[0], S = shape[1], H = shape[2], D = shape[3];
  const auto qh = heads_of(q_in, "q", shape);
  const auto kh = heads_of(k_in, "k", shape);
  const auto vh = heads_of(v_in, "v", shape);
  check_f32(dout_in, "dout");
  const auto dout = ppo_ops::contig(dout_in);
  auto doh = paddle::empty({B, H, S, D}, paddle::DataType::FLOAT32, dout.place());
  to_heads(dout.data<float>(), doh.data<float>(), B, S, H, D);
  const auto dvh = paddle::experimental::matmul(probs, doh, true, false);  // [B, H, S, D]
  auto ds = paddle::experimental::matmul(doh, vh, false, true);          // dP [B, H, S, S] -> dS
  const float* p = probs.data<float>();
  float* g = ds.data<float>();
  const int64_t rows = B * H * S;
  ppo_ops::parallel_for(rows, rows * S * 3, [&](int64_t r) {
    const float* pr = p + r * S;
    float* gr = g + r * S;
    const float dot = ppo_ops::dot(pr, gr, S);
    for (int64_t j = 0; j < S; ++j) gr[j] = pr[j] * (gr[j] - dot) * scale;
  });
  const auto dqh = paddle::experimental::matmul(ds, kh, false, false);  // [B, H, S, D]
  const auto dkh = paddle::experimental::matmul(ds, qh, true, false);
  return {merge_heads(dqh, B, S, H, D, shape), merge_heads(dkh, B, S, H, D, shape),
          merge_heads(dvh, B, S, H, D, shape)};
}

std::vector<std::vector<int64_t>> TrainSdpaShape(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                                                 const std::vector<int64_t>& v, const std::vector<int64_t>& m) {
  return {{q[0], q[1], q[2] * q[3]}, {q[0], q[2], q[1], q[1]}};
}

std::vector<paddle::DataType> TrainSdpaDtype(const paddle::DataType& q, const paddle::DataType& k,
                                             const paddle::DataType& v, const paddle::DataType& m) {
  return {q, q};
}

PD_BUILD_OP(train_sdpa)
    .Inputs({"Q", "K", "V", "Mask"})
    .Outputs({"Out", "Probs"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(TrainSdpa))
    .SetInferShapeFn(PD_INFER_SHAPE(TrainSdpaShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(TrainSdpaDtype));

PD_BUILD_GRAD_OP(train_sdpa)
    .Inputs({"Q", "K", "V", "Probs", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Q"), paddle::Grad("K"), paddle::Grad("V")})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(TrainSdpaGrad));
