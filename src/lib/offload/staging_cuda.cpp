// GPU offload staging, host side: validation, the slot upload and the kernel launch
// (staging_kernel.cu).
#if defined(NVFP4MLA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "device/alignment.h"
#include "device/cuda_check.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/offload/cuda_staging.h"
#include "offload/staging_kernel.h"

namespace nvfp4mla::offload {
namespace {

using nvfp4mla::cuda::check;
static_assert(kStagingKernelMaxLayers == kMaxCudaStagingLayers);

class CudaStager final : public BlockStager {
 public:
  explicit CudaStager(cudaStream_t stream) : stream_(stream) {}
  ~CudaStager() override {
    if (slots_) {
      cudaStreamSynchronize(stream_);
      cudaFree(slots_);
    }
  }
  void gather(const StagingRequest& r) override { run(r, true); }
  void scatter(const StagingRequest& r) override { run(r, false); }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "offload staging: stream synchronize"); }

 private:
  void run(const StagingRequest& r, bool to_host) {
    check_staging_request(r);
    if (r.layers.size() > static_cast<size_t>(kMaxCudaStagingLayers))
      throw Error("offload staging: at most " + std::to_string(kMaxCudaStagingLayers) + " layers per request");
    const int rb = r.layers.front().record_bytes;
    if (rb % 16 != 0) throw Error("offload staging: record width must be a multiple of 16 bytes");
    // The kernel moves records 16 bytes at a time through both sides.
    if (!cuda::aligned(r.host.data(), 16)) throw Error("offload staging: the host buffer must be 16-byte aligned");
    for (size_t l = 0; l < r.layers.size(); ++l)
      if (!cuda::aligned(r.layers[l].data, 16))
        throw Error("offload staging: the cache of layer " + std::to_string(l) + " must be 16-byte aligned");
    if (r.slots.empty()) return;
    // Pageable memory is reported as unregistered (no API error), pinned memory with its
    // device-side address when it is mapped.
    cudaPointerAttributes attr{};
    check(cudaPointerGetAttributes(&attr, r.host.data()), "offload staging: host buffer attributes");
    void* host_dev = attr.devicePointer;
    if (attr.type != cudaMemoryTypeHost || host_dev == nullptr)
      throw Error("offload staging: the host buffer must be pinned and mapped (cudaHostAlloc or cudaHostRegister)");
    StagingLayerTable table{};
    for (size_t l = 0; l < r.layers.size(); ++l) table.cache[l] = r.layers[l].data;
    // The slot list travels to the device through a buffer the stager keeps (grown on demand,
    // after the previous use of it has finished).
    const size_t bytes = r.slots.size() * sizeof(int64_t);
    if (bytes > capacity_) {
      check(cudaStreamSynchronize(stream_), "offload staging: stream synchronize");
      if (slots_) cudaFree(slots_);
      slots_ = nullptr;
      check(cudaMalloc(&slots_, bytes), "offload staging: slot buffer");
      capacity_ = bytes;
    }
    check(cudaMemcpyAsync(slots_, r.slots.data(), bytes, cudaMemcpyHostToDevice, stream_), "offload staging: slots");
    launch_stage_kernel(table, static_cast<int>(r.layers.size()), static_cast<const int64_t*>(slots_),
                        static_cast<int64_t>(r.slots.size()), r.tokens_per_block, rb, static_cast<uint8_t*>(host_dev),
                        to_host, stream_);
    // cudaMemcpyAsync from pageable memory returns once it has consumed the source, so the
    // caller may reuse its slot list at once; the buffer it went to is stream-ordered.
  }

  cudaStream_t stream_;
  void* slots_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace

std::unique_ptr<BlockStager> make_cuda_stager(cudaStream_t stream) { return std::make_unique<CudaStager>(stream); }

}  // namespace nvfp4mla::offload
#endif
