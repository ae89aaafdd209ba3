#pragma once
// GPU writer and gathers of the paged index key cache (CUDA builds only). The bytes equal those
// of the CPU reference (index_cache.h), bit for bit.
//
// Errors: arguments the host can see (sizes, pointers, alignment) throw Error before anything is
// launched. Slots live in device memory, so their check runs on the device: each call first
// sets *invalid_count (a device word the caller owns) to the number of bad slots, and the copy
// kernel writes nothing when it is not zero; read it after the stream's work completes. Nothing
// is allocated and nothing synchronizes, so every call can be captured in a CUDA graph.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "nvfp4mla/cuda/cache_write.h"
#include "nvfp4mla/index_key.h"

namespace nvfp4mla::cuda {

struct IndexCacheWriteArgs {
  const void* keys = nullptr;               // [num_tokens, key_stride] of input_type, 128 used per row
  InputType input_type = InputType::bf16;
  int64_t num_tokens = 0;
  int64_t key_stride = index_key::kDim;     // elements between rows; rows 16-byte aligned
  const int64_t* slot_mapping = nullptr;    // [num_tokens]; negative slots are skipped
  IndexCacheView cache;                     // device memory, 4-byte aligned
  unsigned long long* invalid_count = nullptr;  // required: set to the number of slots >= capacity
};

// Quantizes the keys into their slots (index_key.h's recipe). When a slot appears twice, which
// key is kept is unspecified (the CPU writer keeps the later one).
void write_index_cache(const IndexCacheWriteArgs& args, cudaStream_t stream);

// Copy the keys of `slots` [n] out of the cache as per-token records [n, 132] (4-byte aligned)
// or split into values [n, 128] (16-byte aligned) and scales [n]. Every slot must lie in
// [0, capacity); *invalid_count is set to the number that do not.
void gather_index_records(const IndexCacheView& cache, const int64_t* slots, int64_t n, uint8_t* records,
                          unsigned long long* invalid_count, cudaStream_t stream);
void gather_index_keys(const IndexCacheView& cache, const int64_t* slots, int64_t n, uint8_t* values,
                       float* scales, unsigned long long* invalid_count, cudaStream_t stream);

}  // namespace nvfp4mla::cuda
