// rollout_moe_experts: the routed experts of a mixture-of-experts MLP in one call (a decode step's
// tokens; the routing comes from Paddle, ppo/models/families/moe.py `route`).
//   X [N, H] float32 (normed activations, rows), Weights [N, k] float32 (each token's gate weights),
//   Indices [N, k] int64 (its experts, each in [0, E)), GateUp: E tensors [H, 2I] (gate and up
//   fused, [in, out]), Down: E tensors [I, H].
//   Out [N, H] = sum_j Weights[n, j] * down_e(silu(x_n @ gate_e) * (x_n @ up_e)), e = Indices[n, j].
// Each expert runs once on the rows routed to it, in slot order (n * k + j ascending), and the
// experts are added to a row in ascending expert order: the order of ppo/rollout/moe_mlp.py's
// grouped_dispatch (its pure-Paddle twin). Matmuls: AVX2/FMA, 8 weight rows streamed at a time into
// register blocks of 4 token rows x 16 columns (the weights read once per call); scalar otherwise.
#include "../common.h"

namespace {

constexpr int64_t KB = 8;  // rows of W streamed together (8 sequential streams: prefetch-friendly)

// C[r, :] += A[r, :kn] @ W[:kn, :] for RB rows of A (row stride lda), W [kn, N] (row stride N), C (stride ldc).
template <int RB>
void kblock(const float* a, int64_t lda, const float* w, int64_t kn, int64_t N, float* c, int64_t ldc) {
  int64_t j = 0;
#ifdef PPO_AVX2
  for (; j + 16 <= N; j += 16) {
    __m256 acc0[RB], acc1[RB];
    for (int r = 0; r < RB; ++r) {
      acc0[r] = _mm256_loadu_ps(c + r * ldc + j);
      acc1[r] = _mm256_loadu_ps(c + r * ldc + j + 8);
    }
    for (int64_t k = 0; k < kn; ++k) {
      const __m256 w0 = _mm256_loadu_ps(w + k * N + j), w1 = _mm256_loadu_ps(w + k * N + j + 8);
      for (int r = 0; r < RB; ++r) {
        const __m256 x = _mm256_broadcast_ss(a + r * lda + k);
        acc0[r] = _mm256_fmadd_ps(x, w0, acc0[r]);
        acc1[r] = _mm256_fmadd_ps(x, w1, acc1[r]);
      }
    }
    for (int r = 0; r < RB; ++r) {
      _mm256_storeu_ps(c + r * ldc + j, acc0[r]);
      _mm256_storeu_ps(c + r * ldc + j + 8, acc1[r]);
    }
  }
#endif
  for (int r = 0; r < RB; ++r) {  // the remaining columns (all of them without AVX2)
    for (int64_t jj = j; jj < N; ++jj) {
      float s = c[r * ldc + jj];
      for (int64_t k = 0; k < kn; ++k) s += a[r * lda + k] * w[k * N + jj];
      c[r * ldc + jj] = s;
    }
  }
}

// C [R, N] = A [R, K] @ W [K, N] (all row-major, contiguous): W read in blocks of KB rows, each
// block applied to every group of 4 rows of A while it is in cache.
void gemm(const float* a, int64_t R, int64_t K, const float* w, int64_t N, float* c) {
  std::fill(c, c + R * N, 0.f);
  for (int64_t k0 = 0; k0 < K; k0 += KB) {
    const int64_t kn = std::min(KB, K - k0);
    const float* wk = w + k0 * N;
    for (int64_t r = 0; r < R; r += 4) {
      const float* ar = a + r * K + k0;
      float* cr = c + r * N;
      switch (std::min<int64_t>(4, R - r)) {
        case 4: kblock<4>(ar, K, wk, kn, N, cr, N); break;
        case 3: kblock<3>(ar, K, wk, kn, N, cr, N); break;
        case 2: kblock<2>(ar, K, wk, kn, N, cr, N); break;
        default: kblock<1>(ar, K, wk, kn, N, cr, N); break;
      }
    }
  }
}

// act [R, I] = silu(g) * u of G [R, 2I] (g = G[:, :I], u = G[:, I:]), the formula of rollout_swiglu.
void swiglu_rows(const float* g, int64_t R, int64_t I, float* act, float* tmp) {
  for (int64_t r = 0; r < R; ++r) {
    const float* gr = g + r * 2 * I;
    for (int64_t i = 0; i < I; ++i) tmp[i] = -gr[i];
    ppo_ops::exp_inplace(tmp, I);
    float* ar = act + r * I;
    for (int64_t i = 0; i < I; ++i) ar[i] = gr[i] / (1.0f + tmp[i]) * gr[I + i];
  }
}

void check_expert(const paddle::Tensor& gate_up, const paddle::Tensor& down, int64_t H, size_t e) {
  PPO_CHECK_CPU_F32(gate_up, "rollout_moe_experts: gate_up");
  PPO_CHECK_CPU_F32(down, "rollout_moe_experts: down");
  const auto gs = gate_up.shape(), ds = down.shape();
  PD_CHECK(gs.size() == 2 && gs[0] == H && gs[1] % 2 == 0, "rollout_moe_experts: gate_up[", e,
           "] must be [H, 2I] with H = ", H);
  PD_CHECK(ds.size() == 2 && ds[0] * 2 == gs[1] && ds[1] == H, "rollout_moe_experts: down[", e, "] must be [I, H]");
}

}  // namespace

std::vector<paddle::Tensor> MoeExperts(const paddle::Tensor& x_in, const paddle::Tensor& weights_in,
                                       const paddle::Tensor& indices_in, const std::vector<paddle::Tensor>& gate_up_in,
                                       const std::vector<paddle::Tensor>& down_in) {
  PD_CHECK(x_in.is_cpu(), "rollout_moe_experts: a CPU kernel (on a GPU the engine runs the Paddle path)");
  const auto x = ppo_ops::contig(x_in);
  const auto wts = ppo_ops::contig(weights_in);
  const auto idx = ppo_ops::contig(indices_in);
  PPO_CHECK_CPU_F32(x, "rollout_moe_experts: x");
  PPO_CHECK_CPU_F32(wts, "rollout_moe_experts: weights");
  PD_CHECK(idx.dtype() == paddle::DataType::INT64, "rollout_moe_experts: indices must be int64");
  PD_CHECK(x.shape().size() == 2, "rollout_moe_experts: x must be [N, H]");
  const int64_t N = x.shape()[0], H = x.shape()[1];
  PD_CHECK(idx.shape().size() == 2 && idx.shape()[0] == N, "rollout_moe_experts: indices must be [N, k]");
  PD_CHECK(wts.shape() == idx.shape(), "rollout_moe_experts: weights must have the shape of indices [N, k]");
  const int64_t k = idx.shape()[1];
  const size_t E = gate_up_in.size();
  PD_CHECK(E > 0 && down_in.size() == E, "rollout_moe_experts: gate_up and down need one tensor per expert");
  std::vector<paddle::Tensor> gate_up, down;  // contiguous (a view, e.g. a slice, is copied once here)
  for (size_t e = 0; e < E; ++e) {
    gate_up.push_back(ppo_ops::contig(gate_up_in[e]));
    down.push_back(ppo_ops::contig(down_in[e]));
    check_expert(gate_up[e], down[e], H, e);
  }

  const int64_t* pi = idx.data<int64_t>();
  std::vector<std::vector<int64_t>> slots(E);  // per expert, its slots n * k + j in ascending order
  for (int64_t s = 0; s < N * k; ++s) {
    PD_CHECK(pi[s] >= 0 && pi[s] < static_cast<int64_t>(E), "rollout_moe_experts: expert index ", pi[s],
             " out of [0, ", E, ")");
    slots[pi[s]].push_back(s);
  }
  auto out = paddle::empty({N, H}, paddle::DataType::FLOAT32, x.place());
  float* po = out.data<float>();
  std::fill(po, po + N * H, 0.f);
  const float* px = x.data<float>();
  const float* pw = wts.data<float>();
  std::vector<float> xs, g, act, y, tmp;
  for (size_t e = 0; e < E; ++e) {
    const int64_t R = static_cast<int64_t>(slots[e].size());
    if (R == 0) continue;
    const int64_t I = down[e].shape()[0];
    xs.resize(R * H);
    g.resize(R * 2 * I);
    act.resize(R * I);
    y.resize(R * H);
    tmp.resize(I);
    for (int64_t r = 0; r < R; ++r) std::memcpy(&xs[r * H], px + (slots[e][r] / k) * H, H * sizeof(float));
    gemm(xs.data(), R, H, gate_up[e].data<float>(), 2 * I, g.data());
    swiglu_rows(g.data(), R, I, act.data(), tmp.data());
    gemm(act.data(), R, I, down[e].data<float>(), H, y.data());
    for (int64_t r = 0; r < R; ++r) {
      const float scale = pw[slots[e][r]];
      float* orow = po + (slots[e][r] / k) * H;
      const float* yr = &y[r * H];
      for (int64_t h = 0; h < H; ++h) orow[h] += yr[h] * scale;
    }
  }
  return {out};
}

std::vector<std::vector<int64_t>> MoeExpertsShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                                  const std::vector<int64_t>&, const std::vector<std::vector<int64_t>>&,
                                                  const std::vector<std::vector<int64_t>>&) {
  return {x};
}
std::vector<paddle::DataType> MoeExpertsDtype(const paddle::DataType& x, const paddle::DataType&,
                                              const paddle::DataType&, const std::vector<paddle::DataType>&,
                                              const std::vector<paddle::DataType>&) {
  return {x};
}

PD_BUILD_OP(rollout_moe_experts)
    .Inputs({"X", "Weights", "Indices", paddle::Vec("GateUp"), paddle::Vec("Down")})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(MoeExperts))
    .SetInferShapeFn(PD_INFER_SHAPE(MoeExpertsShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MoeExpertsDtype));
