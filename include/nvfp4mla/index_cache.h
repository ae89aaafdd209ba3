#pragma once
// The paged index key cache of one layer on the CPU: [num_pages, page_size * 132] bytes in the
// layout of index_key.h. This is the reference the GPU writer and gather (cuda/index_cache.h)
// are checked against.
#include <cstdint>
#include <span>

#include "nvfp4mla/index_key.h"
#include "nvfp4mla/record.h"

namespace nvfp4mla {

// Write T keys [T, 128] (BF16, FP16 or fp32 values) through an int64 slot mapping [T]. Negative
// slots are skipped (padded CUDA-graph slots); a slot >= capacity throws Error naming it before
// anything is written. When a slot appears twice, the later token's key is the one kept.
template <class In>
void write_index_cache(const In* keys, int64_t num_tokens, std::span<const int64_t> slot_mapping,
                       const IndexCacheView& cache);

// Copy the keys of `slots` out of the cache, as per-token records [n, 132] or split into
// values [n, 128] and scales [n] (the contiguous key buffer of the ragged logits form). Every
// slot must lie in [0, capacity); otherwise Error, and nothing is written.
void gather_index_records(const IndexCacheView& cache, std::span<const int64_t> slots, uint8_t* records);
void gather_index_keys(const IndexCacheView& cache, std::span<const int64_t> slots, uint8_t* values, float* scales);

}  // namespace nvfp4mla
