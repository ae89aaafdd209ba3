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

// SM count of the current device (for plan_sparse_decode).
int current_sm_count();

// Whether the kernel sparse_decode runs for `spec` and `plan` rounds each dequantized K value to
// BF16 before its MMAs (the reference of the same operands: ReferenceOptions::bf16_operands). The
// 16-head NVFP4 kernel does not: it feeds the exact e2m1 * d products and applies the outer
// scales in fp32.
bool decode_rounds_k_to_bf16(const RecordSpec& spec, const DecodePlan& plan);
// Whether its softmax weights enter the output product as single BF16 values (relative error up
// to 2^-9 each, as in FlashMLA); the 16-head NVFP4 kernel adds a BF16 remainder (~16 bits).
bool decode_weights_are_bf16(const RecordSpec& spec, const DecodePlan& plan);

// out: BF16 [rows, heads, 512]; lse: fp32 [rows, heads]; workspace of at least
// decode_workspace_layout(plan, rows, heads).total_bytes, 256-byte aligned.
void sparse_decode(const RecordSpec& spec, const SparseMlaArgs& args, const DecodePlan& plan, void* workspace,
                   size_t workspace_bytes, uint16_t* out, float* lse, cudaStream_t stream);

}  // namespace nvfp4mla::cuda
