#pragma once
// Split-KV sparse MLA decode on the GPU (CUDA builds only). Semantics: sparse_mla.h.
// All pointers in `args` are device pointers. Every buffer comes from the caller: the kernel
// allocates nothing and never synchronizes, so it can be captured in a CUDA graph.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/sparse_mla.h"

namespace nvfp4mla::cuda {

// SM count of the current device.
int current_sm_count();

// The numerics of the plan's kernel (decode_plan.h: decode_rounds_k_to_bf16(DecodeKernel)).
inline bool decode_rounds_k_to_bf16(const RecordSpec&, const DecodePlan& plan) {
  return nvfp4mla::decode_rounds_k_to_bf16(plan.kernel);
}
inline bool decode_weights_are_bf16(const RecordSpec&, const DecodePlan& plan) {
  return nvfp4mla::decode_weights_are_bf16(plan.kernel);
}

// Runs the kernel the plan names (plan_sparse_decode for this problem; an error when the current
// device cannot run it or the plan does not match the problem).
// out: BF16 [rows, heads, 512], 16-byte aligned; lse: fp32 [rows, heads]; q and cache 16-byte
// aligned; workspace of at least
// decode_workspace_layout(plan, rows, heads).total_bytes, 256-byte aligned. Returns whether the
// splits were merged inside the kernel's launch (plan.merge_in_kernel on a device that holds the
// whole grid at once) rather than by a merge launch.
bool sparse_decode(const RecordSpec& spec, const SparseMlaArgs& args, const DecodePlan& plan, void* workspace,
                   size_t workspace_bytes, uint16_t* out, float* lse, cudaStream_t stream);

}  // namespace nvfp4mla::cuda
