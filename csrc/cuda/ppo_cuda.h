// The rollout ops' CUDA kernels as a plain C API: raw device pointers, sizes and a stream in,
// a cudaError_t code (as int, 0 = success) out. No Paddle types, so the .cu files compile with
// nvcc alone, link into the Paddle extension through the thin bindings in *_binding.cc, and can
// be called from ctypes with PyTorch or CuPy device pointers (tests/test_cuda_kernels.py).
//
// Every launcher only enqueues work on `stream` (no synchronisation); the contract of each op is
// the header comment of its CPU twin in ../cpu/. `dtype` is one of PPO_CUDA_FLOAT32/16/BF16 for
// the floating tensors of the op (integer and mask tensors have the fixed types named below).
// Bad arguments (unknown dtype, a limit exceeded) return cudaErrorInvalidValue and launch nothing.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#define PPO_CUDA_FLOAT32 0
#define PPO_CUDA_FLOAT16 1
#define PPO_CUDA_BFLOAT16 2

#define PPO_CUDA_MAX_HEAD_DIM 256      // attention: head_dim must be even and at most this
#define PPO_CUDA_MAX_SUPPRESS 64       // sample: suppressed token ids
#define PPO_CUDA_MAX_VOCAB 1048576     // sample: vocabulary entries (64 blocks of 16,384 per row)
#define PPO_CUDA_MAX_STOP_IDS 64       // update: stop token ids
#define PPO_CUDA_MAX_STOP_SEQS 32      // update: stop sequences
#define PPO_CUDA_MAX_STOP_TOKENS 256   // update: tokens of all stop sequences together

#ifdef __cplusplus
extern "C" {
#endif

// RMSNorm of `tokens` tokens of width H. residual == NULL: out = rms_norm(x) * w.
// residual != NULL: residual += x in place, out = rms_norm(residual) * w.
// cols == 0: x/residual/out [tokens, H]; cols == 1: [H, tokens] (token b is column b).
int ppo_cuda_rms_norm(int dtype, const void* x, void* residual, const void* w, void* out, int64_t tokens,
                      int64_t H, float eps, int cols, cudaStream_t stream);

// out[i] = silu(gate[i]) * up[i] for i < n_out. mode 0: gate = x, up = y; mode 1: rows of x are
// [gate(I) | up(I)] (out [n_out / I, I]); mode 2: gate = x[:n_out], up = x[n_out:] (cols layout).
int ppo_cuda_swiglu(int dtype, const void* x, const void* y, void* out, int64_t n_out, int64_t I, int mode,
                    cudaStream_t stream);

// out[n, k] = x[k, n] for x [K, N] (out [N, K], contiguous): one block of the packed transpose.
int ppo_cuda_transpose(int dtype, const void* x, void* out, int64_t K, int64_t N, cudaStream_t stream);

// RoPE + write of the fed tokens' K^T / V into k_cache [L, B, nkv, hd, S] / v_cache
// [L, B, nkv, S, hd] at slots t0..t0+Tq-1 of `layer`, then attention of every head over cache
// slots 0..t0+i (prompt slots j < Tp only where key_mask[b, j] != 0); finished rows write zeros.
// qkv: cols == 0 -> [B, Tq, W] (Tq == 1 allowed as [B, W]); cols == 1 -> [W, B] (Tq must be 1),
// W = (nh + 2 nkv) hd; layout 0 = [q heads | k heads | v heads], 1 = per kv group [q.. k v].
// bias (W entries) may be NULL. cos/sin [P, hd], pos int64 [B, Tq] (clipped to 0..P-1),
// key_mask int32 [B, Tp], finished int32 [B]. out: [B, Tq, nh*hd], or [nh*hd, B] with cols.
int ppo_cuda_attention(int dtype, const void* qkv, const void* bias, void* k_cache, void* v_cache, const void* cos,
                       const void* sin, const int64_t* pos, const int32_t* key_mask, const int32_t* finished,
                       void* out, int64_t B, int64_t Tq, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                       int64_t S, int64_t Tp, int64_t P, int64_t layer, int64_t t0, int64_t layout, float scale,
                       int cols, cudaStream_t stream);
// ppo_cuda_attention with a caller-owned device workspace of at least the bytes that
// ppo_cuda_attention_workspace_bytes gives for the same sizes on the current device (0 when the
// cache is not split; ppo_cuda_attention allocates it with cudaMallocAsync on `stream`).
int ppo_cuda_attention_ws(int dtype, const void* qkv, const void* bias, void* k_cache, void* v_cache,
                          const void* cos, const void* sin, const int64_t* pos, const int32_t* key_mask,
                          const int32_t* finished, void* out, int64_t B, int64_t Tq, int64_t num_heads,
                          int64_t num_kv_heads, int64_t head_dim, int64_t S, int64_t Tp, int64_t P, int64_t layer,
                          int64_t t0, int64_t layout, float scale, int cols, void* workspace,
                          int64_t workspace_bytes, cudaStream_t stream);
int ppo_cuda_attention_workspace_bytes(int dtype, int64_t B, int64_t Tq, int64_t num_heads, int64_t num_kv_heads,
                                       int64_t head_dim, int64_t t0, int64_t* bytes);
// Host-only split plan (no CUDA call): how many chunks of `*chunk` keys (a multiple of `tile`)
// the longest query's `max_keys` keys are cut into so that `base_blocks` blocks per chunk give
// about two blocks per SM (at most 64 chunks, at least one tile each); -1 for invalid sizes.
int64_t ppo_cuda_attention_split_plan(int64_t max_keys, int64_t base_blocks, int64_t tile, int64_t sm_count,
                                      int64_t* chunk);

// One token per row b of logits ([B, V], or [V, B] with cols): repetition penalty from
// presence uint8 [B0, V] (row rows[b]; may be NULL when penalty == 1), suppressed ids (host
// array, out-of-range ids ignored), temperature, top-k, top-p, greedy when do_sample == 0; the
// draw uses uniforms float [steps, B0] at [step, rows[b]]. tokens int64 [B], logprobs float [B]
// (log-prob of the token under the raw logits / temperature). Finished rows get pad_id and 0.
int ppo_cuda_sample(int dtype, const void* logits, const uint8_t* presence, const int64_t* rows,
                    const float* uniforms, const int32_t* finished, int64_t* tokens, float* logprobs, int64_t B,
                    int64_t V, int64_t B0, int64_t step, float temperature, int64_t top_k, float top_p,
                    float penalty, int do_sample, int64_t pad_id, const int64_t* suppress, int64_t n_suppress,
                    int cols, cudaStream_t stream);

// ppo_cuda_sample with a caller-owned device workspace of at least
// ppo_cuda_sample_workspace_bytes(B, V) bytes (no allocation: what a CUDA graph capture wants);
// ppo_cuda_sample allocates it with cudaMallocAsync on `stream`. Any top-k, any nucleus size.
int ppo_cuda_sample_ws(int dtype, const void* logits, const uint8_t* presence, const int64_t* rows,
                       const float* uniforms, const int32_t* finished, int64_t* tokens, float* logprobs, int64_t B,
                       int64_t V, int64_t B0, int64_t step, float temperature, int64_t top_k, float top_p,
                       float penalty, int do_sample, int64_t pad_id, const int64_t* suppress, int64_t n_suppress,
                       int cols, void* workspace, int64_t workspace_bytes, cudaStream_t stream);
// Host-only queries of the sampler's plan (no CUDA call): workspace bytes for B rows of V
// entries, and how many blocks share one row (-1 for invalid sizes).
int64_t ppo_cuda_sample_workspace_bytes(int64_t B, int64_t V);
int64_t ppo_cuda_sample_blocks_per_row(int64_t V);

// Per live row b (finished[b] == 0), r = rows[b]: out_tokens/out_logprobs [B0, N] at [r, step],
// lengths[r] = step + 1, pos[b] += 1, presence [B0, V] (may be NULL) marks the token; from
// step + 1 >= min_new_tokens a stop id or a completed stop sequence sets finished[b] = 1.
// active (device int64 [1]) is zeroed, then counts the rows still live after this step.
// stop_ids / stop_seqs (concatenated) / stop_seq_lens are host arrays.
int ppo_cuda_update(const int64_t* tokens, const float* logprobs, const int64_t* rows, int32_t* finished,
                    int64_t* pos, int64_t* out_tokens, float* out_logprobs, int64_t* lengths, uint8_t* presence,
                    int64_t* active, int64_t B, int64_t N, int64_t V, int64_t step, int64_t min_new_tokens,
                    const int64_t* stop_ids, int64_t n_stop_ids, const int64_t* stop_seqs, int64_t n_stop_tokens,
                    const int64_t* stop_seq_lens, int64_t n_stop_seqs, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
