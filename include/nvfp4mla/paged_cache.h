#pragma once
// The paged KV cache of one layer on the CPU: [num_pages, page_size, record_bytes] bytes.
// A token's slot is page * page_size + offset. This is the reference the GPU writer and the
// gather kernels are checked against.
#include <cstdint>
#include <span>
#include <vector>

#include "nvfp4mla/config.h"
#include "nvfp4mla/record.h"

namespace nvfp4mla {

struct PagedCacheView {
  uint8_t* data = nullptr;
  int64_t num_pages = 0;
  int64_t page_size = 0;
  int record_bytes = 0;
  int64_t capacity() const { return num_pages * page_size; }
  uint8_t* slot(int64_t s) const { return data + s * record_bytes; }
};

// Input tokens: T rows of kv_c [T, 512] and k_pe [T, 64], in one of the accepted input types.
template <class In>
struct TokenBatch {
  const In* kv_c = nullptr;
  const In* k_pe = nullptr;
  int64_t num_tokens = 0;
};

// Write T tokens through an int64 slot mapping. Negative slots are skipped (padded CUDA-graph
// slots); a slot >= capacity throws Error naming it, before anything is written. When a slot
// appears twice, the later token's record is the one kept.
template <class In>
void write_paged_cache(const FormatConfig& cfg, const TokenBatch<In>& tokens,
                       std::span<const int64_t> slot_mapping, const PagedCacheView& cache);

// Gather-dequantize slots into fp32 kv_c [N, 512] and k_pe [N, 64]. Throws Error for a slot
// outside [0, capacity).
void gather_dequantize(const FormatConfig& cfg, const PagedCacheView& cache, std::span<const int64_t> slots,
                       float* kv_c, float* k_pe);

}  // namespace nvfp4mla
