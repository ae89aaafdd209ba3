#pragma once
// Staging between paged KV caches in GPU memory and pinned host buffers (CUDA builds only).
//
// The StagingRequest's cache views point to device memory and its host buffer must be pinned
// and mapped (cudaHostAlloc, or cudaHostRegister with cudaHostRegisterMapped): one kernel per
// call copies every record of the batch between the caches and the host buffer over PCIe/NVLink,
// in the block layout of staging.h, on the stager's stream. gather()/scatter() return once the
// work is queued; synchronize() waits for it.
#include <cuda_runtime_api.h>

#include <memory>

#include "nvfp4mla/offload/staging.h"

namespace nvfp4mla::offload {

// At most this many layers per request (the layer table travels as a kernel parameter).
inline constexpr int kMaxCudaStagingLayers = 128;

std::unique_ptr<BlockStager> make_cuda_stager(cudaStream_t stream);

}  // namespace nvfp4mla::offload
