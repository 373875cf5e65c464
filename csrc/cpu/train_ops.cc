// Training ops with backward kernels (autograd through PD_BUILD_GRAD_OP), float32, CPU:
//
// train_rms_norm(X [..., H], Weight [H]; eps) -> Out [..., H], InvRms [rows]
//   Out = X * inv * Weight, inv = 1 / sqrt(mean(X^2 over H) + eps) per row (PaddleNLP's LlamaRMSNorm).
//   Backward: g = dOut * Weight; dX = inv * g - X * inv^3 * sum(g * X) / H; dWeight = sum_rows dOut * X * inv.
//
// train_rope(Q [B, S, Hq, D], K [B, S, Hk, D], Cos [Bc, S, D], Sin [Bc, S, D]) -> QOut, KOut
//   PaddleNLP's rotate_half RoPE: out = x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1),
//   Bc = 1 (positions shared by the batch) or B (per-row positions). No gradient for Cos / Sin.
//   Backward: dx1 = dy1 * c1 + dy2 * s2, dx2 = dy2 * c2 - dy1 * s1 (halves of D).
//
// train_swiglu(Gate, Up) -> Out = silu(Gate) * Up (same shapes), and
// train_swiglu_fused(X [..., 2I]) -> Out [..., I] with Gate = X[..., :I], Up = X[..., I:]
//   silu(g) = g * sigmoid(g); dGate = dOut * Up * sig * (1 + g * (1 - sig)), dUp = dOut * silu(g).
//
// Each op is one pass over its tensors instead of the 5-12 elementwise kernels (and their
// gradients) that the Python layers launch. GPU tensors are refused: on a CUDA build the model
// patch uses Paddle's fused GPU kernels instead (ppo/models/train_patch.py).
#include "../common.h"

namespace {

void check_cpu_f32(const paddle::Tensor& t, const char* what) {
  PD_CHECK(!t.is_gpu(), what, " is on a GPU: the train_* ops have CPU kernels only (the CUDA build uses Paddle's fused kernels)");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32, what, " must be float32 (the train_* ops compute in float32)");
}

float sigmoid_neg_exp(float g) { return 1.0f / (1.0f + std::exp(-g)); }

constexpr int64_t kSwigluWork = 5;  // work units per element (ppo_ops::kParallelMinWork): an exp, a division

}  // namespace

// ---------------------------------------------------------------- RMSNorm
std::vector<paddle::Tensor> TrainRmsNorm(const paddle::Tensor& x_in, const paddle::Tensor& w_in, float eps) {
  check_cpu_f32(x_in, "train_rms_norm: x");
  check_cpu_f32(w_in, "train_rms_norm: weight");
  const auto x = ppo_ops::contig(x_in);
  const auto w = ppo_ops::contig(w_in);
  const int64_t H = x.shape().back();
  PD_CHECK(w.numel() == H, "train_rms_norm: weight size ", w.numel(), " != hidden size ", H);
  const int64_t rows = H ? x.numel() / H : 0;
  auto out = paddle::empty(x.shape(), x.dtype(), x.place());
  auto inv = paddle::empty({rows}, paddle::DataType::FLOAT32, x.place());
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  float* po = out.data<float>();
  float* pi = inv.data<float>();
  ppo_ops::parallel_for(rows, rows * H * 2, [&](int64_t r) {
    const float* xr = px + r * H;
    float* orow = po + r * H;
    const float s = 1.0f / std::sqrt(ppo_ops::sum_squares(xr, H) / static_cast<float>(H) + eps);
    pi[r] = s;
    for (int64_t d = 0; d < H; ++d) orow[d] = (xr[d] * s) * pw[d];
  });
  return {out, inv};
}

std::vector<paddle::Tensor> TrainRmsNormGrad(const paddle::Tensor& x_in, const paddle::Tensor& w_in,
                                             const paddle::Tensor& inv, const paddle::Tensor& dy_in) {
  const auto x = ppo_ops::contig(x_in);
  const auto w = ppo_ops::contig(w_in);
  const auto dy = ppo_ops::contig(dy_in);
  check_cpu_f32(dy, "train_rms_norm_grad: dOut");
  const int64_t H = x.shape().back();
  const int64_t rows = H ? x.numel() / H : 0;
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  auto dw = paddle::empty(w.shape(), w.dtype(), w.place());
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const float* pi = inv.data<float>();
  const float* pg = dy.data<float>();
  float* pdx = dx.data<float>();
  float* pdw = dw.data<float>();
  const float invH = 1.0f / static_cast<float>(H);
  // Thread t computes the rows of dX in its block of rows, and dWeight over its block of columns
  // (16 at a time), each column summed over all rows in row order, as on one thread.
  ppo_ops::parallel_team(std::max<int64_t>(rows, 1), rows * H * 5, [&](int t, int T) {
    std::vector<float> g(H);
    const auto rb = ppo_ops::block_of(rows, 1, t, T);
    for (int64_t r = rb.first; r < rb.second; ++r) {
      const float* xr = px + r * H;
      const float* dyr = pg + r * H;
      float* dxr = pdx + r * H;
      const float s = pi[r];
      for (int64_t d = 0; d < H; ++d) g[d] = dyr[d] * pw[d];
      const float c = ppo_ops::dot(g.data(), xr, H) * s * s * s * invH;
      for (int64_t d = 0; d < H; ++d) dxr[d] = s * g[d] - xr[d] * c;
    }
    const auto cb = ppo_ops::block_of(H, 16, t, T);
    float* dwc = pdw + cb.first;
    const int64_t nc = cb.second - cb.first;
    std::fill(dwc, dwc + std::max<int64_t>(nc, 0), 0.0f);
    for (int64_t r = 0; r < rows && nc > 0; ++r) {
      const float* xr = px + r * H + cb.first;
      const float* dyr = pg + r * H + cb.first;
      const float s = pi[r];
      for (int64_t d = 0; d < nc; ++d) dwc[d] += dyr[d] * (xr[d] * s);
    }
  });
  return {dx, dw};
}

std::vector<std::vector<int64_t>> TrainRmsNormShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < x.size(); ++i) rows *= x[i];
  return {x, {rows}};
}

std::vector<paddle::DataType> TrainRmsNormDtype(const paddle::DataType& x, const paddle::DataType& w) {
  return {x, paddle::DataType::FLOAT32};
}

PD_BUILD_OP(train_rms_norm)
    .Inputs({"X", "Weight"})
    .Outputs({"Out", "InvRms"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(TrainRmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(TrainRmsNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(TrainRmsNormDtype));

PD_BUILD_GRAD_OP(train_rms_norm)
    .Inputs({"X", "Weight", "InvRms", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Weight")})
    .SetKernelFn(PD_KERNEL(TrainRmsNormGrad));

// ---------------------------------------------------------------- RoPE
namespace {

// sign = +1: forward rotation; sign = -1: its transpose (the backward).
void rope_rows(const float* x, const float* cos, const float* sin, float* out, int64_t B, int64_t S, int64_t heads,
               int64_t D, int64_t cos_batch, float sign) {
  const int64_t h = D / 2;
  ppo_ops::parallel_for(B * S, B * S * heads * D * 2, [&](int64_t bs) {
    const int64_t b = bs / S, s = bs % S;
    const int64_t cs = ((cos_batch == 1 ? 0 : b) * S + s) * D;
    const float* c = cos + cs;
    const float* sn = sin + cs;
    for (int64_t n = 0; n < heads; ++n) {
      const int64_t off = ((b * S + s) * heads + n) * D;
      const float* xr = x + off;
      float* o = out + off;
      if (sign > 0) {
        for (int64_t d = 0; d < h; ++d) o[d] = xr[d] * c[d] - xr[d + h] * sn[d];
        for (int64_t d = h; d < D; ++d) o[d] = xr[d] * c[d] + xr[d - h] * sn[d];
      } else {
        for (int64_t d = 0; d < h; ++d) o[d] = xr[d] * c[d] + xr[d + h] * sn[d + h];
        for (int64_t d = h; d < D; ++d) o[d] = xr[d] * c[d] - xr[d - h] * sn[d - h];
      }
    }
  });
}

paddle::Tensor rope_one(const paddle::Tensor& x_in, const paddle::Tensor& cos, const paddle::Tensor& sin, float sign,
                        const char* what) {
  check_cpu_f32(x_in, what);
  const auto x = ppo_ops::contig(x_in);
  const auto& xs = x.shape();
  PD_CHECK(xs.size() == 4, what, " must be [batch, seq, heads, head_dim]");
  const int64_t B = xs[0], S = xs[1], heads = xs[2], D = xs[3];
  const auto& cshape = cos.shape();
  PD_CHECK(cshape.size() == 3 && cshape[1] == S && cshape[2] == D && (cshape[0] == 1 || cshape[0] == B),
           "train_rope: cos/sin must be [1 or batch, seq, head_dim] matching ", what);
  PD_CHECK(D % 2 == 0, "train_rope: head_dim must be even");
  auto out = paddle::empty(xs, x.dtype(), x.place());
  rope_rows(x.data<float>(), cos.data<float>(), sin.data<float>(), out.data<float>(), B, S, heads, D, cshape[0], sign);
  return out;
}

}  // namespace

std::vector<paddle::Tensor> TrainRope(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& cos_in,
                                      const paddle::Tensor& sin_in) {
  check_cpu_f32(cos_in, "train_rope: cos");
  check_cpu_f32(sin_in, "train_rope: sin");
  const auto cos = ppo_ops::contig(cos_in);
  const auto sin = ppo_ops::contig(sin_in);
  return {rope_one(q, cos, sin, 1.0f, "train_rope: q"), rope_one(k, cos, sin, 1.0f, "train_rope: k")};
}

std::vector<paddle::Tensor> TrainRopeGrad(const paddle::Tensor& cos_in, const paddle::Tensor& sin_in,
                                          const paddle::Tensor& dq, const paddle::Tensor& dk) {
  const auto cos = ppo_ops::contig(cos_in);
  const auto sin = ppo_ops::contig(sin_in);
  return {rope_one(dq, cos, sin, -1.0f, "train_rope_grad: dq"), rope_one(dk, cos, sin, -1.0f, "train_rope_grad: dk")};
}

std::vector<std::vector<int64_t>> TrainRopeShape(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                                                 const std::vector<int64_t>& c, const std::vector<int64_t>& s) {
  return {q, k};
}

std::vector<paddle::DataType> TrainRopeDtype(const paddle::DataType& q, const paddle::DataType& k,
                                             const paddle::DataType& c, const paddle::DataType& s) {
  return {q, k};
}

PD_BUILD_OP(train_rope)
    .Inputs({"Q", "K", "Cos", "Sin"})
    .Outputs({"QOut", "KOut"})
    .SetKernelFn(PD_KERNEL(TrainRope))
    .SetInferShapeFn(PD_INFER_SHAPE(TrainRopeShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(TrainRopeDtype));

PD_BUILD_GRAD_OP(train_rope)
    .Inputs({"Cos", "Sin", paddle::Grad("QOut"), paddle::Grad("KOut")})
    .Outputs({paddle::Grad("Q"), paddle::Grad("K")})
    .SetKernelFn(PD_KERNEL(TrainRopeGrad));

// ---------------------------------------------------------------- SwiGLU
namespace {

// gate/up/out rows of `n` elements at strides (gate and up may interleave in one fused row).
#ifdef PPO_AVX2
// sigmoid(g) on 8 lanes: 1 / (1 + exp(-g)); exp256 saturates, so large |g| gives 0 or 1.
inline __m256 sigmoid256(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, ppo_ops::exp256(_mm256_sub_ps(_mm256_setzero_ps(), g))));
}
#endif

void swiglu_fwd(const float* g, const float* u, float* o, int64_t n) {
  int64_t i = 0;
#ifdef PPO_AVX2
  for (; i + 8 <= n; i += 8) {
    const __m256 vg = _mm256_loadu_ps(g + i);
    _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(vg, sigmoid256(vg)), _mm256_loadu_ps(u + i)));
  }
#endif
  for (; i < n; ++i) o[i] = g[i] * sigmoid_neg_exp(g[i]) * u[i];
}

void swiglu_bwd(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n) {
  int64_t i = 0;
#ifdef PPO_AVX2
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 vg = _mm256_loadu_ps(g + i);
    const __m256 vdy = _mm256_loadu_ps(dy + i);
    const __m256 sig = sigmoid256(vg);
    _mm256_storeu_ps(du + i, _mm256_mul_ps(vdy, _mm256_mul_ps(vg, sig)));
    const __m256 dsilu = _mm256_mul_ps(sig, _mm256_fmadd_ps(vg, _mm256_sub_ps(one, sig), one));
    _mm256_storeu_ps(dg + i, _mm256_mul_ps(_mm256_mul_ps(vdy, _mm256_loadu_ps(u + i)), dsilu));
  }
#endif
  for (; i < n; ++i) {
    const float sig = sigmoid_neg_exp(g[i]);
    const float silu = g[i] * sig;
    du[i] = dy[i] * silu;
    dg[i] = dy[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
  }
}

}  // namespace

std::vector<paddle::Tensor> TrainSwiglu(const paddle::Tensor& g_in, const paddle::Tensor& u_in) {
  check_cpu_f32(g_in, "train_swiglu: gate");
  check_cpu_f32(u_in, "train_swiglu: up");
  PD_CHECK(g_in.shape() == u_in.shape(), "train_swiglu: gate and up must have the same shape");
  const auto g = ppo_ops::contig(g_in);
  const auto u = ppo_ops::contig(u_in);
  auto out = paddle::empty(g.shape(), g.dtype(), g.place());
  const float* pg = g.data<float>();
  const float* pu = u.data<float>();
  float* po = out.data<float>();
  const int64_t n = g.numel();
  ppo_ops::parallel_team((n + 7) / 8, n * kSwigluWork, [&](int t, int T) {
    const auto b = ppo_ops::block_of(n, 8, t, T);  // edges on the 8 lanes of the vector loop
    if (b.second > b.first) swiglu_fwd(pg + b.first, pu + b.first, po + b.first, b.second - b.first);
  });
  return {out};
}

std::vector<paddle::Tensor> TrainSwigluGrad(const paddle::Tensor& g_in, const paddle::Tensor& u_in,
                                            const paddle::Tensor& dy_in) {
  const auto g = ppo_ops::contig(g_in);
  const auto u = ppo_ops::contig(u_in);
  const auto dy = ppo_ops::contig(dy_in);
  auto dg = paddle::empty(g.shape(), g.dtype(), g.place());
  auto du = paddle::empty(u.shape(), u.dtype(), u.place());
  const float* pg = g.data<float>();
  const float* pu = u.data<float>();
  const float* pdy = dy.data<float>();
  float* pdg = dg.data<float>();
  float* pdu = du.data<float>();
  const int64_t n = g.numel();
  ppo_ops::parallel_team((n + 7) / 8, n * kSwigluWork * 2, [&](int t, int T) {
    const auto b = ppo_ops::block_of(n, 8, t, T);
    const int64_t o = b.first;
    if (b.second > o) swiglu_bwd(pg + o, pu + o, pdy + o, pdg + o, pdu + o, b.second - o);
  });
  return {dg, du};
}

std::vector<std::vector<int64_t>> TrainSwigluShape(const std::vector<int64_t>& g, const std::vector<int64_t>& u) {
  return {g};
}

std::vector<paddle::DataType> TrainSwigluDtype(const paddle::DataType& g, const paddle::DataType& u) { return {g}; }

PD_BUILD_OP(train_swiglu)
    .Inputs({"Gate", "Up"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(TrainSwiglu))
    .SetInferShapeFn(PD_INFER_SHAPE(TrainSwigluShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(TrainSwigluDtype));

PD_BUILD_GRAD_OP(train_swiglu)
    .Inputs({"Gate", "Up", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Gate"), paddle::Grad("Up")})
    .SetKernelFn(PD_KERNEL(TrainSwigluGrad));

std::vector<paddle::Tensor> TrainSwigluFused(const paddle::Tensor& x_in) {
  check_cpu_f32(x_in, "train_swiglu_fused: x");
  const auto x = ppo_ops::contig(x_in);
  auto shape = x.shape();
  PD_CHECK(!shape.empty() && shape.back() % 2 == 0, "train_swiglu_fused: the last dim of x must be even ([..., 2I])");
  const int64_t I = shape.back() / 2;
  shape.back() = I;
  auto out = paddle::empty(shape, x.dtype(), x.place());
  const int64_t rows = I ? out.numel() / I : 0;
  const float* px = x.data<float>();
  float* po = out.data<float>();
  ppo_ops::parallel_for(rows, rows * I * kSwigluWork,
                        [&](int64_t r) { swiglu_fwd(px + r * 2 * I, px + r * 2 * I + I, po + r * I, I); });
  return {out};
}

std::vector<paddle::Tensor> TrainSwigluFusedGrad(const paddle::Tensor& x_in, const paddle::Tensor& dy_in) {
  const auto x = ppo_ops::contig(x_in);
  const auto dy = ppo_ops::contig(dy_in);
  const int64_t I = x.shape().back() / 2;
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  const int64_t rows = I ? dy.numel() / I : 0;
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  ppo_ops::parallel_for(rows, rows * I * kSwigluWork * 2, [&](int64_t r) {
    const int64_t o = r * 2 * I;
    swiglu_bwd(px + o, px + o + I, pdy + r * I, pdx + o, pdx + o + I, I);
  });
  return {dx};
}

std::vector<std::vector<int64_t>> TrainSwigluFusedShape(const std::vector<int64_t>& x) {
  auto s = x;
  if (!s.empty() && s.back() > 0) s.back() /= 2;
  return {s};
}

std::vector<paddle::DataType> TrainSwigluFusedDtype(const paddle::DataType& x) { return {x}; }

PD_BUILD_OP(train_swiglu_fused)
    .Inputs({"X"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(TrainSwigluFused))
    .SetInferShapeFn(PD_INFER_SHAPE(TrainSwigluFusedShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(TrainSwigluFusedDtype));

PD_BUILD_GRAD_OP(train_swiglu_fused)
    .Inputs({"X", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X")})
    .SetKernelFn(PD_KERNEL(TrainSwigluFusedGrad));
