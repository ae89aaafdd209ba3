#pragma once
// Internal: the staging kernel's launch, callable from C++20 host code.
#include <cuda_runtime_api.h>

#include <cstdint>


namespace nvfp4mla::offload {

// The kernel is compiled as C++17 (the public staging headers use std::span), so the layer
// limit is restated here; staging_cuda.cpp checks that it equals kMaxCudaStagingLayers.
inline constexpr int kStagingKernelMaxLayers = 128;
struct StagingLayerTable {
  uint8_t* cache[kStagingKernelMaxLayers];
};

void launch_stage_kernel(const StagingLayerTable& layers, int num_layers, const int64_t* slots, int64_t num_slots,
                         int tokens_per_block, int record_bytes, uint8_t* host, bool to_host, cudaStream_t stream);

}  // namespace nvfp4mla::offload
