#pragma once
// Sparse MLA extend/prefill on the GPU (CUDA builds only): many query rows (prefill chunks,
// MTP verifier tokens, draft extends), each with its own top-k row and length, one online
// softmax over the whole row (no split workspace, no merge). Same semantics and reference as
// decode (sparse_mla.h); it is the decode kernel run with one split per row.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "nvfp4mla/format.h"
#include "nvfp4mla/sparse_mla.h"

namespace nvfp4mla::cuda {

// out: BF16 [rows, heads, 512]; lse: fp32 [rows, heads]. No allocation, no synchronization.
void sparse_extend(const RecordSpec& spec, const SparseMlaArgs& args, uint16_t* out, float* lse, cudaStream_t stream);

}  // namespace nvfp4mla::cuda
