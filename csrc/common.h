// Shared helpers for the rollout custom ops' CPU kernels (the CUDA kernels live in cuda/).
// With -mavx2 -mfma (set by build_ops.py when the CPU has them) the hot loops use AVX2/FMA
// intrinsics; otherwise plain scalar code computes the same thing. With -fopenmp (build_ops.py)
// the kernels split their outer loops over threads (`parallel_team` below).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "paddle/extension.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PPO_AVX2 1
#endif

#define PPO_CHECK_CPU_F32(t, name)                                             \
  PD_CHECK((t).dtype() == paddle::DataType::FLOAT32,                           \
           name " must be float32 on CPU (the engine computes in float32)")

#define PPO_CHECK_CONTIGUOUS(t, name) PD_CHECK((t).is_contiguous(), name " must be contiguous")

namespace ppo_ops {

// ---------------------------------------------------------------- threads
// The kernels run on the OpenMP thread count of the process: OMP_NUM_THREADS as read at the first
// call (importing Paddle sets it to 1 when unset; libgomp itself read the environment before
// that, so omp_get_max_threads() would not see Paddle's 1). Threads only ever split loops whose
// iterations write disjoint outputs, each output computed by the same code as on one thread: the
// results are bitwise the same at any thread count. No reduction is split across threads.
inline int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  const long v = std::strtol(s, nullptr, 10);  // "2,1" (nested levels) reads as 2
  return v > 0 ? static_cast<int>(std::min<long>(v, 1024)) : fallback;
}

inline int threads() {
#ifdef _OPENMP
  static const int n = env_int("OMP_NUM_THREADS", 1);
  return n;
#else
  return 1;
#endif
}

// Work units: about one float load-op-store (an element of an elementwise pass); an exp counts 4.
// Below kParallelMinWork (~5-10 us on one core, a few times the fork/join of a warm libgomp
// team) a kernel stays on the calling thread and makes no OpenMP call at all. One decode row
// (B = 1) and the decode-step RMSNorm of a small model stay below it. The environment variable
// PPO_OPS_PARALLEL_MIN_WORK (read once) overrides it, for tuning; results do not depend on it.
constexpr int64_t kParallelMinWork = 16384;

inline int64_t parallel_min_work() {
  static const int64_t n = env_int("PPO_OPS_PARALLEL_MIN_WORK", static_cast<int>(kParallelMinWork));
  return n;
}

// Threads for a loop of `items` independent iterations worth `work` units in all.
inline int team_size(int64_t items, int64_t work) {
  const int t = threads();
  if (t <= 1 || items <= 1 || work < parallel_min_work()) return 1;
  return static_cast<int>(std::min<int64_t>(t, items));
}

// body(t, T) on T threads, t = 0..T-1 (T = team_size(items, work)); T = 1 runs on the calling
// thread without entering OpenMP. `body` must not throw (check inputs before) and must write
// only what thread t owns.
template <class F>
inline void parallel_team(int64_t items, int64_t work, const F& body) {
  const int T = team_size(items, work);
  if (T <= 1) {
    body(0, 1);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(T)
  body(omp_get_thread_num(), omp_get_num_threads());
#endif
}

// Thread t's block [begin, end) of [0, n) when split into T contiguous blocks whose edges are
// multiples of `align` (a vector loop that starts at a block edge then covers the same elements
// with the same lanes, and the same scalar tail, as one loop over [0, n)).
inline std::pair<int64_t, int64_t> block_of(int64_t n, int64_t align, int t, int T) {
  const int64_t units = (n + align - 1) / align;
  const int64_t per = (units + T - 1) / T;
  return {std::min(n, t * per * align), std::min(n, (t + 1) * per * align)};
}

// body(i) for i in [0, n), contiguous blocks of i per thread.
template <class F>
inline void parallel_for(int64_t n, int64_t work, const F& body) {
  parallel_team(n, work, [&](int t, int T) {
    const auto r = block_of(n, 1, t, T);
    for (int64_t i = r.first; i < r.second; ++i) body(i);
  });
}

// A contiguous version of a read-only input (strided views from paddle.transpose / slicing).
inline paddle::Tensor contig(const paddle::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

#ifdef PPO_AVX2
inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

// Cephes-style expf on 8 lanes (relative error ~1e-7); inputs below -88.37 (and -inf) give 0.
inline __m256 exp256(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f);
  const __m256 lo = _mm256_set1_ps(-88.3762626647949f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, z, x);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  __m256i e = _mm256_cvttps_epi32(fx);
  e = _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(under, y);
}
#endif

inline float dot(const float* a, const float* b, int64_t n) {
  int64_t d = 0;
  float s = 0.f;
#ifdef PPO_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; d + 16 <= n; d += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), acc1);
  }
  for (; d + 8 <= n; d += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
  s = hsum256(_mm256_add_ps(acc0, acc1));
#endif
  for (; d < n; ++d) s += a[d] * b[d];
  return s;
}

inline float sum_squares(const float* a, int64_t n) { return dot(a, a, n); }

// x[i] = exp(x[i]); -inf -> 0 exactly.
inline void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
#ifdef PPO_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp256(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::exp(x[i]);
}

inline float sum(const float* x, int64_t n) {
  int64_t i = 0;
  float s = 0.f;
#ifdef PPO_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
  s = hsum256(acc);
#endif
  for (; i < n; ++i) s += x[i];
  return s;
}

// y += a * x
inline void axpy(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef PPO_AVX2
  const __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

// PaddleNLP's rotate_half RoPE: out = (x * cos + rotate_half(x) * sin) * scale,
// rotate_half(x) = concat(-x[h:], x[:h]); cos/sin rows hold [freqs, freqs].
inline void rope(const float* x, const float* cos, const float* sin, float* out, int64_t hd, float scale) {
  const int64_t h = hd / 2;
  for (int64_t d = 0; d < h; ++d) out[d] = (x[d] * cos[d] + (-x[d + h]) * sin[d]) * scale;
  for (int64_t d = h; d < hd; ++d) out[d] = (x[d] * cos[d] + x[d - h] * sin[d]) * scale;
}

}  // namespace ppo_ops
