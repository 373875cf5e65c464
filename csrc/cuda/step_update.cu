// Plain-CUDA twin of csrc/cpu/step_update.cc (same contract; API in ppo_cuda.h): one thread per
// row; the number of rows still live is counted on the device into `active` ([1] int64).
#include "common.cuh"

namespace {

constexpr int MAX_STOP_IDS = PPO_CUDA_MAX_STOP_IDS;
constexpr int MAX_STOP_TOKENS = PPO_CUDA_MAX_STOP_TOKENS;
constexpr int MAX_STOP_SEQS = PPO_CUDA_MAX_STOP_SEQS;

struct Stops {
  int64_t n_ids, n_seqs;
  int64_t ids[MAX_STOP_IDS];
  int64_t seq_tokens[MAX_STOP_TOKENS];
  int64_t seq_lens[MAX_STOP_SEQS];
};

__global__ void update_kernel(const int64_t* __restrict__ tokens, const float* __restrict__ logprobs,
                              const int64_t* __restrict__ rows, int32_t* __restrict__ fin, int64_t* __restrict__ pos,
                              int64_t* __restrict__ out_tokens, float* __restrict__ out_logprobs,
                              int64_t* __restrict__ lengths, uint8_t* __restrict__ presence,
                              unsigned long long* __restrict__ active, int64_t B, int64_t N, int64_t V, int64_t step,
                              int64_t min_new_tokens, Stops st) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < B;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (fin[b]) continue;
    const int64_t r = rows[b];
    const int64_t tok = tokens[b];
    out_tokens[r * N + step] = tok;
    out_logprobs[r * N + step] = logprobs[b];
    lengths[r] = step + 1;
    pos[b] += 1;
    if (presence && tok >= 0 && tok < V) presence[r * V + tok] = 1;
    bool stop = false;
    if (step + 1 >= min_new_tokens) {
      for (int64_t s = 0; s < st.n_ids; ++s) stop = stop || tok == st.ids[s];
      int64_t off = 0;
      for (int64_t q = 0; q < st.n_seqs; ++q) {
        const int64_t l = st.seq_lens[q];
        if (!stop && l > 0 && l <= step + 1) {
          bool eq = true;
          for (int64_t k = 0; k < l && eq; ++k) eq = out_tokens[r * N + step - l + 1 + k] == st.seq_tokens[off + k];
          stop = eq;
        }
        off += l;
      }
    }
    if (stop)
      fin[b] = 1;
    else
      atomicAdd(active, 1ULL);
  }
}

}  // namespace

extern "C" int ppo_cuda_update(const int64_t* tokens, const float* logprobs, const int64_t* rows, int32_t* finished,
                               int64_t* pos, int64_t* out_tokens, float* out_logprobs, int64_t* lengths,
                               uint8_t* presence, int64_t* active, int64_t B, int64_t N, int64_t V, int64_t step,
                               int64_t min_new_tokens, const int64_t* stop_ids, int64_t n_stop_ids,
                               const int64_t* stop_seqs, int64_t n_stop_tokens, const int64_t* stop_seq_lens,
                               int64_t n_stop_seqs, cudaStream_t stream) {
  if (B < 0 || N <= 0 || step < 0 || step >= N || (presence != nullptr && V <= 0) || n_stop_ids < 0 ||
      n_stop_ids > MAX_STOP_IDS || n_stop_tokens < 0 || n_stop_tokens > MAX_STOP_TOKENS || n_stop_seqs < 0 ||
      n_stop_seqs > MAX_STOP_SEQS || active == nullptr)
    return ppo_cuda::invalid();
  Stops st;
  st.n_ids = n_stop_ids;
  st.n_seqs = n_stop_seqs;
  int64_t seq_total = 0;
  for (int64_t i = 0; i < n_stop_ids; ++i) st.ids[i] = stop_ids[i];
  for (int64_t i = 0; i < n_stop_seqs; ++i) {
    if (stop_seq_lens[i] < 0) return ppo_cuda::invalid();
    st.seq_lens[i] = stop_seq_lens[i];
    seq_total += stop_seq_lens[i];
  }
  if (seq_total != n_stop_tokens) return ppo_cuda::invalid();  // the lengths must split the tokens exactly
  for (int64_t i = 0; i < n_stop_tokens; ++i) st.seq_tokens[i] = stop_seqs[i];
  cudaError_t err = cudaMemsetAsync(active, 0, sizeof(int64_t), stream);
  if (err != cudaSuccess) return ppo_cuda::status(err);
  if (B > 0) {
    const int threads = 128;
    const int64_t want = (B + threads - 1) / threads;
    const unsigned blocks = static_cast<unsigned>(want < 1024 ? want : 1024);
    update_kernel<<<blocks, threads, 0, stream>>>(tokens, logprobs, rows, finished, pos, out_tokens, out_logprobs,
                                                  lengths, presence, reinterpret_cast<unsigned long long*>(active),
                                                  B, N, V, step, min_new_tokens, st);
  }
  return ppo_cuda::status(cudaGetLastError());
}
