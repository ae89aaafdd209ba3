#pragma once
// Scratch and capacity planning for serving: exact sizes of the decode kernel's buffers for a
// server configuration, and how many tokens of KV cache fit in a memory budget.
#include <cstddef>
#include <cstdint>
#include <string>

#include "nvfp4mla/arch.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/index_key.h"
#include "nvfp4mla/serving/route.h"

namespace nvfp4mla::serving {

enum class PartialPrecision : uint8_t { fp32, bf16 };  // fp32 covers every nvfp4mla decode plan (DecodePlan::partial_bytes 4 or 2)

struct ScratchRequest {
  RecordSpec spec;
  int num_heads = 0;              // query heads per rank
  int dcp_world_size = 1;         // query heads are all-gathered under decode context parallelism
  int topk = 2048;
  int max_num_seqs = 0;
  int64_t max_num_batched_tokens = 0;
  int num_speculative_tokens = 0;
  SpecDecodeMode mode = SpecDecodeMode::automatic;
  PartialPrecision partials = PartialPrecision::fp32;
  int splits = 0;                 // 0: the decode planner's worst case for this device; else fixed
  int sm_count = 132;             // the GPU the decode planner plans for: SMs (H200: 132)
  // ... and compute capability, 10 * major + minor (H200: 90); 0: the one plan_sparse_decode(...,
  // sm_count) plans for (planning_arch: the current GPU's, sm_90 without a GPU), so that the
  // scratch covers the plans a server makes at run time.
  int compute_capability = 0;
};

struct ScratchPlan {
  int q_per_request = 1;
  int64_t decode_rows = 0;  // min(max_num_seqs * q_per_request, max_num_batched_tokens), >= max_num_seqs
  int heads = 0;            // num_heads * dcp_world_size padded to a multiple of 8
  int splits = 0;           // KV splits the regions are sized for
  int partial_bytes = 4;
  // Each region is aligned to 256 bytes.
  size_t tmp_output_bytes = 0;  // rows * heads * splits * 512 * partial_bytes
  size_t tmp_lse_bytes = 0;     // rows * heads * splits * 4
  size_t output_bytes = 0;      // rows * heads * 512 * 2 (BF16)
  size_t final_lse_bytes = 0;   // rows * heads * 4
  size_t total_bytes = 0;
};

// Throws Error for an inconsistent request.
ScratchPlan plan_scratch(const ScratchRequest& r);
// The GPU the request's scratch is planned for (compute_capability 0: planning_arch).
ArchSpec scratch_arch(const ScratchRequest& r);

struct CapacityRequest {
  RecordSpec spec;
  int layers = 0;
  int indexer_bytes_per_token = index_key::kRecordBytes;  // DSA indexer key cache (index_key.h)
  int page_size = 64;
  double memory_gib = 0;              // KV cache budget
  double reserved_gib = 0;            // taken out first (scratch, activations)
};

struct CapacityPlan {
  int64_t bytes_per_token = 0;  // layers * (record bytes + indexer bytes)
  int64_t pages = 0;
  int64_t tokens = 0;           // pages * page_size
  int64_t max_single_request_tokens = 0;  // one request may use every page
};

CapacityPlan plan_capacity(const CapacityRequest& r);

}  // namespace nvfp4mla::serving
