// train_adamw: one AdamW step over ALL parameters of a model in one op, in place, float32, CPU,
// with global-norm gradient clipping folded in. Same formulas and state as Paddle's
// `paddle.optimizer.AdamW` (its `adamw_` kernel) with `ClipGradByGlobalNorm`, so the optimizer's
// accumulators (moment1, moment2, beta1_pow_acc, beta2_pow_acc) stay its checkpointable state:
//
//   norm  = sqrt(sum over all grads of g^2);  scale = clip_norm / max(norm, clip_norm)  (1 if clip_norm <= 0)
//   g'    = g * scale
//   p     = p * (1 - lr * coeff)                                   (decoupled decay, where decay[i] != 0)
//   m1    = beta1 * m1 + (1 - beta1) * g'
//   m2    = beta2 * m2 + (1 - beta2) * g'^2
//   p     = p - lr * sqrt(1 - b2p) / (1 - b1p) * m1 / (sqrt(m2) + eps * sqrt(1 - b2p))
//   b1p  *= beta1;  b2p *= beta2                                  (b1p, b2p: the [1] pow accumulators)
//
// Inputs (vectors of equal length, one entry per parameter): Params, Grads, Moment1, Moment2,
// Beta1Pow, Beta2Pow; all but Grads are updated in place. Output GlobalNorm [1]: the norm before
// clipping. Replaces ~5 Paddle kernels per parameter (adamw_, square/sum for the norm, the clip
// multiply) by one pass over the parameters after one pass over the gradients.
#include <atomic>

#include "../common.h"

namespace {

void check_f32_cpu(const paddle::Tensor& t, const char* what, size_t i) {
  PD_CHECK(!t.is_gpu(), "train_adamw: ", what, "[", i, "] is on a GPU (CPU kernel only)");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32, "train_adamw: ", what, "[", i, "] must be float32");
  PD_CHECK(t.is_contiguous(), "train_adamw: ", what, "[", i, "] must be contiguous");
}

// One parameter's pointers and the step constants of its bias corrections.
struct Slot {
  float* p;
  float* m1;
  float* m2;
  const float* g;
  int64_t numel;
  float step, eps_hat, keep;
};

std::vector<Slot> slots_of(std::vector<paddle::Tensor>& params, const std::vector<paddle::Tensor>& grads,
                           std::vector<paddle::Tensor>& m1s, std::vector<paddle::Tensor>& m2s,
                           std::vector<paddle::Tensor>& b1ps, std::vector<paddle::Tensor>& b2ps, float lr, float eps,
                           float coeff, const std::vector<int>& decay) {
  std::vector<Slot> slots(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const float bc1 = 1.0f - b1ps[i].data<float>()[0];
    const float bc2_sqrt = std::sqrt(1.0f - b2ps[i].data<float>()[0]);
    slots[i] = {params[i].data<float>(), m1s[i].data<float>(), m2s[i].data<float>(), grads[i].data<float>(),
                params[i].numel(), lr * bc2_sqrt / bc1, eps * bc2_sqrt, decay[i] ? 1.0f - lr * coeff : 1.0f};
  }
  return slots;
}

// AdamW on elements [lo, hi) of one parameter. The pointers and constants are copied into
// restrict-qualified locals: read through the slot (or captured by reference), every store to a
// float could alias them, and the compiler would neither keep them in registers nor vectorise.
void update_block(const Slot& sl, int64_t lo, int64_t hi, float scale, float beta1, float beta2) {
  float* __restrict p = sl.p;
  float* __restrict m1 = sl.m1;
  float* __restrict m2 = sl.m2;
  const float* __restrict g = sl.g;
  const float keep = sl.keep, step = sl.step, eps_hat = sl.eps_hat;
  for (int64_t j = lo; j < hi; ++j) {
    const float gj = g[j] * scale;
    const float a = beta1 * m1[j] + (1.0f - beta1) * gj;
    const float b = beta2 * m2[j] + (1.0f - beta2) * gj * gj;
    m1[j] = a;
    m2[j] = b;
    p[j] = p[j] * keep - step * (a / (std::sqrt(b) + eps_hat));
  }
}

// sqrt(sum of the gradients' squares): each gradient's float sum of squares (one thread per
// gradient, the largest first), then their sum in double in parameter order, as on one thread.
float global_norm(const std::vector<Slot>& slots, int64_t total) {
  const int64_t n = static_cast<int64_t>(slots.size());
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return slots[a].numel > slots[b].numel; });
  std::vector<float> part(n);
  std::atomic<int64_t> next{0};
  ppo_ops::parallel_team(n, total * 2, [&](int, int) {
    for (int64_t k = next++; k < n; k = next++) part[order[k]] = ppo_ops::sum_squares(slots[order[k]].g, slots[order[k]].numel);
  });
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(part[i]);
  return static_cast<float>(std::sqrt(sq));
}

}  // namespace

std::vector<paddle::Tensor> TrainAdamW(std::vector<paddle::Tensor>& params, const std::vector<paddle::Tensor>& grads,
                                       std::vector<paddle::Tensor>& m1s, std::vector<paddle::Tensor>& m2s,
                                       std::vector<paddle::Tensor>& b1ps, std::vector<paddle::Tensor>& b2ps, float lr,
                                       float beta1, float beta2, float eps, float coeff, float clip_norm,
                                       const std::vector<int>& decay) {
  const size_t n = params.size();
  PD_CHECK(grads.size() == n && m1s.size() == n && m2s.size() == n && b1ps.size() == n && b2ps.size() == n &&
               decay.size() == n,
           "train_adamw: params, grads, moments, pow accumulators and decay flags must have one entry per parameter");
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    check_f32_cpu(params[i], "params", i);
    check_f32_cpu(grads[i], "grads", i);
    check_f32_cpu(m1s[i], "moment1", i);
    check_f32_cpu(m2s[i], "moment2", i);
    PD_CHECK(grads[i].numel() == params[i].numel() && m1s[i].numel() == params[i].numel() &&
                 m2s[i].numel() == params[i].numel(),
             "train_adamw: grads/moments [", i, "] differ in size from their parameter");
    PD_CHECK(b1ps[i].numel() == 1 && b2ps[i].numel() == 1, "train_adamw: pow accumulators must hold one value");
    total += params[i].numel();
  }
  const std::vector<Slot> slots = slots_of(params, grads, m1s, m2s, b1ps, b2ps, lr, eps, coeff, decay);
  const float norm = global_norm(slots, total);
  const float scale = clip_norm > 0.0f ? clip_norm / std::max(norm, clip_norm) : 1.0f;
  // every thread updates its block of every parameter (blocks of 16 elements)
  ppo_ops::parallel_team((total + 15) / 16, total * 12, [&](int t, int T) {
    for (const Slot& sl : slots) {
      const auto blk = ppo_ops::block_of(sl.numel, 16, t, T);
      update_block(sl, blk.first, blk.second, scale, beta1, beta2);
    }
  });
  for (size_t i = 0; i < n; ++i) {
    b1ps[i].data<float>()[0] *= beta1;
    b2ps[i].data<float>()[0] *= beta2;
  }
  auto out = paddle::full({1}, norm, paddle::DataType::FLOAT32, paddle::CPUPlace());
  return {out};
}

PD_BUILD_OP(train_adamw)
    .Inputs({paddle::Vec("Params"), paddle::Vec("Grads"), paddle::Vec("Moment1"), paddle::Vec("Moment2"),
             paddle::Vec("Beta1Pow"), paddle::Vec("Beta2Pow")})
    .Outputs({"GlobalNorm", paddle::Vec("ParamsOut"), paddle::Vec("Moment1Out"), paddle::Vec("Moment2Out"),
              paddle::Vec("Beta1PowOut"), paddle::Vec("Beta2PowOut")})
    .Attrs({"lr: float", "beta1: float", "beta2: float", "eps: float", "coeff: float", "clip_norm: float",
            "decay: std::vector<int>"})
    .SetInplaceMap({{paddle::Vec("Params"), paddle::Vec("ParamsOut")},
                    {paddle::Vec("Moment1"), paddle::Vec("Moment1Out")},
                    {paddle::Vec("Moment2"), paddle::Vec("Moment2Out")},
                    {paddle::Vec("Beta1Pow"), paddle::Vec("Beta1PowOut")},
                    {paddle::Vec("Beta2Pow"), paddle::Vec("Beta2PowOut")}})
    .SetKernelFn(PD_KERNEL(TrainAdamW));
