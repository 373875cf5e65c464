// Shared helpers of the thin Paddle bindings (*_binding.cc): they check Paddle tensors, allocate
// outputs and call the plain-CUDA launchers of ppo_cuda.h on the tensor's stream. Compiled by the
// host compiler with PADDLE_WITH_CUDA (Paddle's cpp_extension defines it for .cc files of an
// extension that has .cu sources), only when Paddle has CUDA.
#pragma once

#include "../common.h"
#include "ppo_cuda.h"

// A launcher's status code as a Paddle error naming the op.
#define PPO_CUDA_CALL(OPNAME, EXPR)                                                        \
  do {                                                                                     \
    const int status__ = (EXPR);                                                           \
    PD_CHECK(status__ == 0, OPNAME " (CUDA): ",                                           \
             cudaGetErrorString(static_cast<cudaError_t>(status__)));                      \
  } while (0)

namespace ppo_cuda_bind {

// The ppo_cuda.h dtype code of a floating tensor; other dtypes are an error naming the op.
inline int dtype_code(const paddle::Tensor& t, const char* op) {
  switch (t.dtype()) {
    case paddle::DataType::FLOAT32:
      return PPO_CUDA_FLOAT32;
    case paddle::DataType::FLOAT16:
      return PPO_CUDA_FLOAT16;
    case paddle::DataType::BFLOAT16:
      return PPO_CUDA_BFLOAT16;
    default:
      PD_THROW(op, ": unsupported dtype on GPU (float32, float16, bfloat16 only)");
  }
  return -1;
}

// Untyped data pointers (the launchers take void* for the floating tensors).
inline const void* cptr(const paddle::Tensor& t) { return t.data(); }
inline void* mptr(paddle::Tensor& t) { return t.data(); }

}  // namespace ppo_cuda_bind
