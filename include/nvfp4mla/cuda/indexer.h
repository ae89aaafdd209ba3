#pragma once
// GPU indexer logits (CUDA builds only): the semantics of indexer.h, on FP8 tensor cores with
// fp32 accumulation; results agree with the CPU references within the tolerance of
// docs/SELECTION.md.
//
// The arguments are those of the CPU references, with every pointer in device memory. Neither
// function allocates or synchronizes, and all work sizes come from the host-side arguments
// (rows, requests, logits_stride), so calls can be captured in a CUDA graph; row lengths,
// ranges and block tables are read on the device.
//
// Errors: shapes, strides, head counts, null or misaligned pointers (q, key values and the
// cache 16-byte aligned, key_value_stride and page_size * 132 multiples of 16) throw Error
// before anything is launched. The metadata in device memory (ranges outside the key buffer,
// lengths past logits_stride, negative context lengths, block table entries a request needs
// outside the cache or past the table's width) is checked on the device first: *invalid_count (a
// device word the caller owns) is set to the number of bad rows, requests and table entries,
// and the logits kernel writes nothing when it is not zero.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "nvfp4mla/indexer.h"

namespace nvfp4mla::cuda {

// Which tensor-core instructions and kernel compute the dot products. `automatic` takes wgmma on
// sm_90 and mma.sync (m16n8k32 E4M3, sm_89 and later) elsewhere; on sm_90 the ragged form with
// 17..64 heads runs the warp-specialized wgmma kernel (TMA loads, separate math and epilogue
// warpgroups) where the key buffer allows a TMA tensor map (key_value_stride below 2^40 bytes,
// num_keys >= 1), the two-warpgroup wgmma kernel otherwise. The explicit choices exist for tests
// and benchmarks: `wgmma` is always the two-warpgroup kernel, `wgmma_ws` the warp-specialized one
// where it applies and the two-warpgroup one elsewhere (paged form, up to 16 heads). All give
// the same kind of result (same tolerance).
enum class IndexerMma : uint8_t { automatic = 0, wgmma = 1, mma_sync = 2, wgmma_ws = 3 };

void indexer_logits(const IndexerRaggedArgs& args, unsigned long long* invalid_count, cudaStream_t stream,
                    IndexerMma mma = IndexerMma::automatic);
void indexer_logits(const IndexerPagedArgs& args, unsigned long long* invalid_count, cudaStream_t stream,
                    IndexerMma mma = IndexerMma::automatic);

}  // namespace nvfp4mla::cuda
