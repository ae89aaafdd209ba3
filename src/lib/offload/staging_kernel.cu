// GPU block staging kernel: one warp per (block token, layer) record, 16-byte copies between
// the device caches and the mapped pinned host buffer. The host side is staging_cuda.cpp.
#include <cuda_runtime.h>

#include "device/cuda_check.h"
#include "offload/staging_kernel.h"

namespace nvfp4mla::offload {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void stage_kernel(const StagingLayerTable layers, int num_layers, const int64_t* __restrict__ slots,
                             int64_t num_slots, int tokens_per_block, int record_bytes, uint8_t* host, bool to_host) {
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (item >= num_slots * num_layers) return;
  const int64_t i = item / num_layers;  // slot index
  const int l = static_cast<int>(item % num_layers);
  const int64_t b = i / tokens_per_block, t = i % tokens_per_block;
  const int64_t slot = slots[i];
  uint4* h = reinterpret_cast<uint4*>(host + ((b * num_layers + l) * tokens_per_block + t) * record_bytes);
  const int vecs = record_bytes / 16;
  if (slot < 0) {  // padding: zero bytes out, nothing back
    if (to_host)
      for (int v = lane; v < vecs; v += 32) h[v] = make_uint4(0, 0, 0, 0);
    return;
  }
  uint4* c = reinterpret_cast<uint4*>(layers.cache[l] + slot * record_bytes);
  if (to_host)
    for (int v = lane; v < vecs; v += 32) h[v] = c[v];
  else
    for (int v = lane; v < vecs; v += 32) c[v] = h[v];
}

}  // namespace

void launch_stage_kernel(const StagingLayerTable& layers, int num_layers, const int64_t* slots, int64_t num_slots,
                         int tokens_per_block, int record_bytes, uint8_t* host, bool to_host, cudaStream_t stream) {
  const int64_t items = num_slots * num_layers;
  const unsigned blocks = static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
  stage_kernel<<<blocks, kWarpsPerBlock * 32, 0, stream>>>(layers, num_layers, slots, num_slots, tokens_per_block,
                                                            record_bytes, host, to_host);
  nvfp4mla::cuda::check_launch("offload staging kernel launch");
}

}  // namespace nvfp4mla::offload
