#pragma once
// The launchers of the decode kernels, one per DecodeKernel family, explicitly instantiated per
// record format in instantiations/ (one small file per kernel and format, so builds parallelize);
// dispatch.cu calls the one the plan names.
#include <cuda_runtime.h>

#include "ops/sparse_mla/decode/common/decode_common.cuh"

namespace nvfp4mla::cuda {

// sm80/mma_kernel.cuh: DecodeKernel::sm80_mma with 16-, 32- or 64-head groups.
template <class F>
void launch_sm80_mma(const DecodeParams& p, int head_group, int rows, int head_groups, cudaStream_t stream);
// sm80/h16_kernel.cuh: DecodeKernel::sm80_h16 (NVFP4 formats).
template <class F>
void launch_decode_h16(const DecodeParams& p, int rows, int head_groups, cudaStream_t stream);
// sm90/ws_kernel.cuh: DecodeKernel::sm90_ws (kPair false, kTile 32), sm90_ws_wide (false, 64;
// NVFP4 and FP8 formats), sm90_ws_pair (true, 32) and sm90_ws_pair_wide (true, 64; NVFP4 and FP8
// formats). Returns whether the kernel merged the splits itself (p.merge_in_kernel and the whole
// grid resident on this device at once).
template <class F, bool kPair, int kTile>
bool launch_decode_ws(const DecodeParams& p, int rows, int head_groups, cudaStream_t stream);
// sm90/ws_kernel.cuh: DecodeKernel::sm90_ws_wide over the records it copies (bf16) with
// DecodePlan::row_ctas > 0 (one split): row_ctas CTAs per head group, each walking its rows.
template <class F>
void launch_decode_ws_rows(const DecodeParams& p, int rows, int head_groups, int row_ctas, cudaStream_t stream);
// sm90/h16_kernel.cuh: DecodeKernel::sm90_h16 (NVFP4 formats).
template <class F>
void launch_decode_h16_sm90(const DecodeParams& p, int rows, int head_groups, cudaStream_t stream);

// common/merge.cu: the final output and LSE of every (row, head) from its splits' partials.
void launch_merge_splits(const DecodeParams& p, int rows, cudaStream_t stream);

}  // namespace nvfp4mla::cuda
