#pragma once
// GPU cache writer and record gather (CUDA builds only).
//
// write_cache quantizes T tokens into a paged cache through an int64 slot mapping with the
// same recipes as the CPU writer (record.h), bit for bit. Negative slots are skipped (padded
// CUDA-graph slots); a slot >= capacity is skipped and counted in *error_count, which the host
// reads after the stream work completes (a kernel cannot throw). Neither function allocates or
// synchronizes, so both can be captured in a CUDA graph.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "nvfp4mla/format.h"

namespace nvfp4mla::cuda {

enum class InputType : uint8_t { bf16 = 0, fp16 = 1, f32 = 2 };

struct CacheWriteArgs {
  const void* kv_c = nullptr;      // [num_tokens, kv_c_stride] of InputType, 512 used per row
  const void* k_pe = nullptr;      // [num_tokens, k_pe_stride], 64 used per row
  InputType input_type = InputType::bf16;
  int64_t num_tokens = 0;
  int64_t kv_c_stride = kLatentDim;  // elements between rows; rows must stay 16-byte aligned
  int64_t k_pe_stride = kRopeDim;
  const int64_t* slot_mapping = nullptr;  // [num_tokens]
  uint8_t* cache = nullptr;               // [capacity, record_bytes]
  int64_t capacity = 0;
  float layer_scale = 1.0f;               // static mode
  unsigned long long* error_count = nullptr;  // optional device counter of slots >= capacity
};

// Validates arguments on the host (throws Error) and launches the writer.
void write_cache(const RecordSpec& spec, const CacheWriteArgs& args, cudaStream_t stream);

// Copy the records of `slots` into dst [n, record_bytes] (for offload and DCP). Negative slots
// give a zero record; slots >= capacity give a zero record and are counted in *error_count.
void gather_records(int record_bytes, const uint8_t* cache, int64_t capacity, const int64_t* slots, int64_t n,
                    uint8_t* dst, unsigned long long* error_count, cudaStream_t stream);

// The reverse: write src [n, record_bytes] into the slots (negative skipped, >= capacity counted).
void scatter_records(int record_bytes, const uint8_t* src, const int64_t* slots, int64_t n, uint8_t* cache,
                     int64_t capacity, unsigned long long* error_count, cudaStream_t stream);

}  // namespace nvfp4mla::cuda
