#pragma once
// Staging between a paged KV cache and host buffers holding offload blocks.
//
// A block is [layers_in_block][tokens_per_block][record_bytes] bytes: for each layer, the
// records of a page of tokens, in slot order. gather() copies the records of the given slots out
// of each layer's paged cache into the host buffer; scatter() copies them back. The host
// implementation here works on caches in host memory; a CUDA implementation (pinned host
// buffers, device caches, one stream) implements the same interface.
#include <cstdint>
#include <memory>
#include <span>

#include "nvfp4mla/paged_cache.h"

namespace nvfp4mla::offload {

struct StagingRequest {
  // One cache view per layer of the block, in block order; all with the same record_bytes.
  std::span<const PagedCacheView> layers;
  // num_blocks * tokens_per_block slots (slot = page * page_size + offset). A negative slot is
  // padding: gather writes zero bytes for it, scatter skips it.
  std::span<const int64_t> slots;
  int tokens_per_block = 0;
  // num_blocks blocks back to back: [block][layer][token][record_bytes].
  std::span<uint8_t> host;
};

// Throws Error for an inconsistent request: no layers, differing record widths, a slot count
// that is not a multiple of tokens_per_block, a host buffer of the wrong size, or a slot at or
// beyond a layer's capacity (named). Implementations call it before copying anything.
void check_staging_request(const StagingRequest& request);

class BlockStager {
 public:
  virtual ~BlockStager() = default;
  virtual void gather(const StagingRequest& request) = 0;   // cache -> host
  virtual void scatter(const StagingRequest& request) = 0;  // host -> cache
  // Waits for submitted copies (asynchronous implementations); the host one copies at once.
  virtual void synchronize() = 0;
};

// Copies between caches and buffers that are both in host memory.
std::unique_ptr<BlockStager> make_host_stager();

}  // namespace nvfp4mla::offload
