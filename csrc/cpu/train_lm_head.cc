// Per-row statistics of LM-head logits and their gradient, float32, CPU: the elementwise part of
// ppo.algos.lm_head's chunked log-probs (the logits chunk itself comes from Paddle's matmul and
// is never kept for the whole batch):
//
// train_logit_stats(Z [c, V], Y [c] int64; with_entropy) -> Logp [c], Entropy [c], Lse [c]
//   lse = logsumexp(z), logp = z[y] - lse, entropy = lse - sum_v p_v z_v (p = softmax(z));
//   Entropy is zeros when with_entropy is false.
// train_logit_dz(Z [c, V], Y [c], Lse [c], GLogp [c], GEntropy [c] optional; with_entropy)
//   -> GradZ [c, V], written over Z (in place): the gradient w.r.t. z of
//   sum_r GLogp_r * logp_r + GEntropy_r * entropy_r:
//   dz_v = GLogp * ([v == y] - p_v) - GEntropy * p_v * (z_v - sum_u p_u z_u).
// One pass (two with entropy) per row instead of the ~6 Paddle kernels, each over [c, V].
#include "../common.h"

namespace {

void check(const paddle::Tensor& t, const char* what, paddle::DataType dtype) {
  PD_CHECK(!t.is_gpu(), "train_logit_*: ", what, " is on a GPU (CPU kernel only)");
  PD_CHECK(t.dtype() == dtype, "train_logit_*: ", what, dtype == paddle::DataType::INT64 ? " must be int64" : " must be float32");
}

// exp(z - shift) into out; returns the sum.
float exp_shifted(const float* z, float shift, float* out, int64_t V) {
  for (int64_t v = 0; v < V; ++v) out[v] = z[v] - shift;
  ppo_ops::exp_inplace(out, V);
  return ppo_ops::sum(out, V);
}

void check_labels(const int64_t* y, int64_t c, int64_t V) {
  for (int64_t r = 0; r < c; ++r)
    PD_CHECK(y[r] >= 0 && y[r] < V, "train_logit_*: label ", y[r], " of row ", r, " is outside the vocabulary [0, ", V, ")");
}

}  // namespace

std::vector<paddle::Tensor> TrainLogitStats(const paddle::Tensor& z_in, const paddle::Tensor& y_in, bool with_entropy) {
  check(z_in, "logits", paddle::DataType::FLOAT32);
  check(y_in, "labels", paddle::DataType::INT64);
  const auto z = ppo_ops::contig(z_in);
  const auto y = ppo_ops::contig(y_in);
  PD_CHECK(z.shape().size() == 2 && y.numel() == z.shape()[0], "train_logit_stats: logits [c, V] and labels [c]");
  const int64_t c = z.shape()[0], V = z.shape()[1];
  check_labels(y.data<int64_t>(), c, V);
  auto logp = paddle::empty({c}, paddle::DataType::FLOAT32, z.place());
  auto ent = paddle::empty({c}, paddle::DataType::FLOAT32, z.place());
  auto lse = paddle::empty({c}, paddle::DataType::FLOAT32, z.place());
  const float* pz = z.data<float>();
  const int64_t* py = y.data<int64_t>();
  float* plse = lse.data<float>();
  float* plogp = logp.data<float>();
  float* pent = ent.data<float>();
  ppo_ops::parallel_team(c, c * V * (with_entropy ? 8 : 6), [&](int t, int T) {  // rows split over threads
    std::vector<float> e(V);
    const auto rb = ppo_ops::block_of(c, 1, t, T);
    for (int64_t r = rb.first; r < rb.second; ++r) {
      const float* zr = pz + r * V;
      const float mx = *std::max_element(zr, zr + V);
      const float s = exp_shifted(zr, mx, e.data(), V);
      const float l = mx + std::log(s);
      plse[r] = l;
      plogp[r] = zr[py[r]] - l;
      pent[r] = with_entropy ? l - ppo_ops::dot(e.data(), zr, V) / s : 0.0f;
    }
  });
  return {logp, ent, lse};
}

void TrainLogitGrad(paddle::Tensor& z, const paddle::Tensor& y_in, const paddle::Tensor& lse_in,
                    const paddle::Tensor& glp_in, const paddle::optional<paddle::Tensor>& gent_in, bool with_entropy) {
  check(z, "logits", paddle::DataType::FLOAT32);
  PD_CHECK(z.is_contiguous(), "train_logit_dz: logits must be contiguous (overwritten in place)");
  PD_CHECK(z.shape().size() == 2, "train_logit_dz: logits must be [c, V]");
  const int64_t c = z.shape()[0], V = z.shape()[1];
  check(y_in, "labels", paddle::DataType::INT64);
  check(lse_in, "lse", paddle::DataType::FLOAT32);
  check(glp_in, "logp gradient", paddle::DataType::FLOAT32);
  PD_CHECK(y_in.numel() == c, "train_logit_dz: labels must be [c] = [", c, "], got ", y_in.numel(), " values");
  PD_CHECK(lse_in.numel() == c, "train_logit_dz: lse must be [c] = [", c, "], got ", lse_in.numel(), " values");
  PD_CHECK(glp_in.numel() == c, "train_logit_dz: logp gradient must be [c] = [", c, "], got ", glp_in.numel(), " values");
  const auto y = ppo_ops::contig(y_in);
  const auto lse = ppo_ops::contig(lse_in);
  const auto glp = ppo_ops::contig(glp_in);
  check_labels(y.data<int64_t>(), c, V);
  const bool use_ent = with_entropy && gent_in;
  paddle::Tensor gent;
  if (use_ent) {
    check(*gent_in, "entropy gradient", paddle::DataType::FLOAT32);
    PD_CHECK(gent_in->numel() == c, "train_logit_dz: entropy gradient must be [c] = [", c, "], got ", gent_in->numel(),
             " values");
    gent = ppo_ops::contig(*gent_in);
  }
  float* pz = z.data<float>();
  const int64_t* py = y.data<int64_t>();
  const float* plse = lse.data<float>();
  const float* pglp = glp.data<float>();
  const float* pgent = use_ent ? gent.data<float>() : nullptr;
  ppo_ops::parallel_team(c, c * V * (use_ent ? 8 : 6), [&](int t, int T) {  // rows split over threads
    std::vector<float> p(V);
    const auto rb = ppo_ops::block_of(c, 1, t, T);
    for (int64_t r = rb.first; r < rb.second; ++r) {
      float* zr = pz + r * V;
      exp_shifted(zr, plse[r], p.data(), V);
      const float g = pglp[r];
      if (pgent) {
        const float ge = pgent[r];
        const float mean_z = ppo_ops::dot(p.data(), zr, V);
        for (int64_t v = 0; v < V; ++v) zr[v] = -p[v] * (g + ge * (zr[v] - mean_z));
      } else {
        for (int64_t v = 0; v < V; ++v) zr[v] = -p[v] * g;
      }
      zr[py[r]] += g;
    }
  });
}

PD_BUILD_OP(train_logit_stats)
    .Inputs({"Z", "Y"})
    .Outputs({"Logp", "Entropy", "Lse"})
    .Attrs({"with_entropy: bool"})
    .SetKernelFn(PD_KERNEL(TrainLogitStats));

PD_BUILD_OP(train_logit_dz)
    .Inputs({"Z", "Y", "Lse", "GLogp", paddle::Optional("GEntropy")})
    .Outputs({"GradZ"})
    .Attrs({"with_entropy: bool"})
    .SetInplaceMap({{"Z", "GradZ"}})
    .SetKernelFn(PD_KERNEL(TrainLogitGrad));
