// Plain-CUDA twin of csrc/cpu/sampling.cc (same contract; API in ppo_cuda.h). One block per row.
// Greedy: block argmax. Unfiltered sampling: a chunked block scan walks the vocabulary in id order. top-k / top-p:
// the kept tokens are found in rank order by repeated block arg-max (at most MAX_KEEP = 1024
// tokens: top_k is capped there, and a top-p nucleus that would need more is cut at 1024).
#include "common.cuh"

namespace {

constexpr int THREADS = 256;
constexpr int MAX_KEEP = PPO_CUDA_MAX_KEEP;
constexpr int MAX_SUPPRESS = PPO_CUDA_MAX_SUPPRESS;

struct Params {
  int64_t V, B0, step, top_k, pad_id, n_suppress;
  float temperature, top_p, penalty;
  bool do_sample, use_penalty, cols;
  int64_t suppress[MAX_SUPPRESS];
};

template <typename T>
__device__ __forceinline__ float raw_at(const T* logits, const Params& P, int64_t B, int64_t b, int64_t v) {
  return ppo_cuda::to_f(logits[P.cols ? v * B + b : b * P.V + v]);
}

// the penalised / suppressed logit the sampler works on
template <typename T>
__device__ __forceinline__ float work_at(const T* logits, const uint8_t* presence, const Params& P, int64_t B,
                                         int64_t b, int64_t r, int64_t v) {
  float x = raw_at(logits, P, B, b, v);
  if (P.use_penalty && presence[r * P.V + v]) x = x > 0.f ? x / P.penalty : x * P.penalty;
  for (int64_t s = 0; s < P.n_suppress; ++s)
    if (P.suppress[s] == v) x = -INFINITY;
  return x;
}

template <typename T>
__global__ void sample_kernel(const T* __restrict__ logits, const uint8_t* __restrict__ presence,
                              const int64_t* __restrict__ rows, const float* __restrict__ uniforms,
                              const int32_t* __restrict__ fin, int64_t* __restrict__ tokens,
                              float* __restrict__ logprobs, int64_t B, Params P) {
  const int64_t b = blockIdx.x;
  if (fin[b]) {
    if (threadIdx.x == 0) {
      tokens[b] = P.pad_id;
      logprobs[b] = 0.f;
    }
    return;
  }
  const int64_t r = rows[b];
  const float T_ = P.temperature;
  // log-sum-exp of the raw logits at this temperature
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < P.V; v += blockDim.x) m = fmaxf(m, raw_at(logits, P, B, b, v) / T_);
  m = ppo_cuda::block_max(m);
  float se = 0.f;
  for (int64_t v = threadIdx.x; v < P.V; v += blockDim.x) se += __expf(raw_at(logits, P, B, b, v) / T_ - m);
  se = ppo_cuda::block_sum(se);
  const float lse = m + logf(se);

  __shared__ int64_t tok_sh;
  if (!P.do_sample) {
    float bv = -INFINITY;
    int64_t bi = INT64_MAX;
    for (int64_t v = threadIdx.x; v < P.V; v += blockDim.x) {
      const float x = work_at(logits, presence, P, B, b, r, v);
      if (ppo_cuda::better(x, v, bv, bi)) {
        bv = x;
        bi = v;
      }
    }
    const ppo_cuda::ArgBest best = ppo_cuda::block_argbest(bv, bi);
    if (threadIdx.x == 0) tok_sh = best.i;
  } else {
    float mw = -INFINITY;
    for (int64_t v = threadIdx.x; v < P.V; v += blockDim.x) mw = fmaxf(mw, work_at(logits, presence, P, B, b, r, v) / T_);
    mw = ppo_cuda::block_max(mw);
    float z = 0.f;
    for (int64_t v = threadIdx.x; v < P.V; v += blockDim.x) z += __expf(work_at(logits, presence, P, B, b, r, v) / T_ - mw);
    z = ppo_cuda::block_sum(z);
    auto prob = [&](int64_t v) {
      const float w = work_at(logits, presence, P, B, b, r, v);
      return w == -INFINITY ? 0.f : __expf(w / T_ - mw) / z;
    };
    const float u = uniforms[P.step * P.B0 + r];
    const bool filter = (P.top_k > 0 && P.top_k < P.V) || P.top_p < 1.0f;
    if (!filter) {
      // total mass in id order, then the first id whose running mass exceeds u * total
      float total = 0.f;
      for (int64_t v = threadIdx.x; v < P.V; v += blockDim.x) total += prob(v);
      total = ppo_cuda::block_sum(total);
      const float target = u * total;
      __shared__ float scan[THREADS];
      __shared__ float carry;
      __shared__ int64_t found;
      __shared__ int64_t last_nz;
      if (threadIdx.x == 0) {
        carry = 0.f;
        found = -1;
        last_nz = 0;
      }
      __syncthreads();
      for (int64_t v0 = 0; v0 < P.V; v0 += blockDim.x) {
        const int64_t v = v0 + threadIdx.x;
        const float pv = v < P.V ? prob(v) : 0.f;
        scan[threadIdx.x] = pv;
        __syncthreads();
        for (int o = 1; o < blockDim.x; o <<= 1) {  // Hillis-Steele inclusive scan
          const float add = threadIdx.x >= o ? scan[threadIdx.x - o] : 0.f;
          __syncthreads();
          scan[threadIdx.x] += add;
          __syncthreads();
        }
        const float c = carry + scan[threadIdx.x];
        const bool hit = v < P.V && pv > 0.f && c > target && (threadIdx.x == 0 || carry + scan[threadIdx.x - 1] <= target);
        if (v < P.V && pv > 0.f) atomicMax(reinterpret_cast<unsigned long long*>(&last_nz), static_cast<unsigned long long>(v));
        __syncthreads();
        if (hit && found < 0) found = v;
        __syncthreads();
        if (threadIdx.x == blockDim.x - 1) carry = c;
        __syncthreads();
        if (found >= 0) break;
      }
      if (threadIdx.x == 0) tok_sh = found >= 0 ? found : last_nz;
    } else {
      __shared__ int64_t kept_id[MAX_KEEP];
      __shared__ float kept_p[MAX_KEEP];
      const int64_t K = (P.top_k > 0 && P.top_k < P.V) ? min(P.top_k, static_cast<int64_t>(MAX_KEEP))
                                                       : min(P.V, static_cast<int64_t>(MAX_KEEP));
      // select tokens in rank order (prob desc, id asc), strictly after the previous pick
      float prev_p = INFINITY;
      int64_t prev_i = -1;
      int64_t n_sel = 0;
      float mass = 0.f;
      const bool need_all_k = P.top_k > 0 && P.top_k < P.V;
      for (int64_t k = 0; k < K; ++k) {
        float bv = -INFINITY;
        int64_t bi = INT64_MAX;
        for (int64_t v = threadIdx.x; v < P.V; v += blockDim.x) {
          const float pv = prob(v);
          const bool after = pv < prev_p || (pv == prev_p && v > prev_i);
          if (after && ppo_cuda::better(pv, v, bv, bi)) {
            bv = pv;
            bi = v;
          }
        }
        const ppo_cuda::ArgBest best = ppo_cuda::block_argbest(bv, bi);
        if (best.i == INT64_MAX || best.v <= 0.f) break;
        if (threadIdx.x == 0) {
          kept_id[k] = best.i;
          kept_p[k] = best.v;
        }
        prev_p = best.v;
        prev_i = best.i;
        mass += best.v;
        n_sel = k + 1;
        // without top-k, stop once the nucleus is complete (mass before the next token >= top_p)
        if (!need_all_k && P.top_p < 1.0f && !(mass < P.top_p)) break;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        const float mass_k = need_all_k ? mass : 1.0f;
        int64_t kept = n_sel;
        if (P.top_p < 1.0f) {
          float before = 0.f;
          kept = 0;
          for (int64_t k = 0; k < n_sel; ++k) {
            if (k > 0 && !(before < P.top_p)) break;
            before += kept_p[k] / mass_k;
            kept = k + 1;
          }
        }
        float total = 0.f;
        for (int64_t k = 0; k < kept; ++k) total += kept_p[k] / mass_k;
        const float target = u * total;
        float c = 0.f;
        int64_t t = kept > 0 ? kept_id[kept - 1] : 0;  // kept == 0 only when every token has probability 0
        for (int64_t k = 0; k < kept; ++k) {
          c += kept_p[k] / mass_k;
          if (c > target) {
            t = kept_id[k];
            break;
          }
        }
        tok_sh = t;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int64_t t = tok_sh;
    tokens[b] = t;
    logprobs[b] = raw_at(logits, P, B, b, t) / T_ - lse;
  }
}

}  // namespace

extern "C" int ppo_cuda_sample(int dtype, const void* logits, const uint8_t* presence, const int64_t* rows,
                               const float* uniforms, const int32_t* finished, int64_t* tokens, float* logprobs,
                               int64_t B, int64_t V, int64_t B0, int64_t step, float temperature, int64_t top_k,
                               float top_p, float penalty, int do_sample, int64_t pad_id, const int64_t* suppress,
                               int64_t n_suppress, int cols, cudaStream_t stream) {
  if (B < 0 || V <= 0 || B0 <= 0 || step < 0 || !(temperature > 0.f) || n_suppress < 0 ||
      n_suppress > MAX_SUPPRESS || (n_suppress > 0 && suppress == nullptr) || B > 0x7fffffff)
    return ppo_cuda::invalid();
  Params P;
  P.V = V;
  P.B0 = B0;
  P.step = step;
  P.top_k = top_k;
  P.pad_id = pad_id;
  P.temperature = temperature;
  P.top_p = top_p;
  P.penalty = penalty;
  P.do_sample = do_sample != 0;
  P.use_penalty = penalty != 1.0f;
  P.cols = cols != 0;
  P.n_suppress = 0;
  for (int64_t s = 0; s < n_suppress; ++s)
    if (suppress[s] >= 0 && suppress[s] < V) P.suppress[P.n_suppress++] = suppress[s];
  if (P.use_penalty && presence == nullptr) return ppo_cuda::invalid();
  if (B == 0) return 0;
  PPO_CUDA_DISPATCH(dtype, [&] {
    sample_kernel<scalar_t><<<static_cast<unsigned>(B), THREADS, 0, stream>>>(
        static_cast<const scalar_t*>(logits), P.use_penalty ? presence : nullptr, rows, uniforms, finished, tokens,
        logprobs, B, P);
  });
  return ppo_cuda::status(cudaGetLastError());
}
