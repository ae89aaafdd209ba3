#pragma once
// One layer's DSA decode step on the GPU (CUDA builds only). Semantics: dsa_pipeline.h. The
// chain on `stream`: the error words cleared, the latent writer (cuda/cache_write.h) and the
// index key writer (cuda/index_cache.h) through the shared slot mapping, fused selection with
// slot ids (cuda/fused_select.h), sparse decode over the selected records
// (cuda/sparse_decode.h; the extend route when the plan has one split).
//
// All pointers are device pointers (alignment as the parts require: BF16 rows, the latent and
// index caches and q 16-byte aligned). The workspace (plan.workspace_bytes, 256-byte aligned)
// and `errors` (three device words) come from the caller. Nothing is allocated and nothing
// synchronizes; the launches depend only on the host arguments and the plan, so a step can be
// captured in a CUDA graph and replayed with new tokens, slots, context lengths and queries.
//
// Host-visible errors (validate_dsa_decode_args, a plan that does not match the arguments, a
// small or misaligned workspace) throw Error before anything is launched. Device data is checked
// on the device and counted in *errors (dsa_pipeline.h: DsaDecodeErrors).
#include <cuda_runtime_api.h>

#include <cstddef>

#include "nvfp4mla/cuda/indexer.h"
#include "nvfp4mla/dsa_pipeline.h"

namespace nvfp4mla::cuda {

void dsa_decode(const DsaDecodeArgs& args, const DsaDecodePlan& plan, void* workspace, size_t workspace_bytes,
                const DsaDecodeOutputs& out, DsaDecodeErrors* errors, cudaStream_t stream,
                IndexerMma mma = IndexerMma::automatic);

}  // namespace nvfp4mla::cuda
