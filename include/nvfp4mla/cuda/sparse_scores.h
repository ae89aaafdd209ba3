#pragma once
// Sparse attention scores on the GPU (CUDA builds only): the logits of every index position,
//   scores[row, head, pos] = sm_scale * q[row, head] . K[indices[row, pos]]   (fp32),
// -inf where the entry is masked (pos >= topk_length[row], index < 0 or >= capacity: such
// records are never read). K is dequantized exactly as the decode kernel does it (BF16 K rows),
// products of BF16 values accumulated in fp32. CPU reference: sparse_mla_scores_reference
// (sparse_mla.h) with ReferenceOptions::bf16_operands. The evaluation uses it for attention
// distributions (KL divergence) and needle ranks; it is not a serving kernel.
//
// All pointers in `args` are device pointers (q and cache 16-byte aligned); lse_base is unused.
// No allocation, no synchronization: the launch is queued on `stream`.
#include <cuda_runtime_api.h>

#include "nvfp4mla/format.h"
#include "nvfp4mla/sparse_mla.h"

namespace nvfp4mla::cuda {

// scores: fp32 [rows, heads, topk]. Throws Error for inconsistent arguments.
void sparse_scores(const RecordSpec& spec, const SparseMlaArgs& args, float* scores, cudaStream_t stream);

}  // namespace nvfp4mla::cuda
