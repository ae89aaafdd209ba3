// DecodeKernel::sm90_ws_wide for bf16 records, its CTAs walking the rows (DecodePlan::row_ctas:
// the staged extend's plan).
#include "ops/sparse_mla/decode/sm90/ws_kernel.cuh"

namespace nvfp4mla::cuda {
template void launch_decode_ws_rows<Format<CacheDtype::bf16, RopeEncoding::bf16, ScaleMode::implicit>>(const DecodeParams&, int, int, int,
                                                                                                      cudaStream_t);
}  // namespace nvfp4mla::cuda
