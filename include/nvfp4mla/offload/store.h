#pragma once
// The tiered KV offload store: a DRAM tier in front of a persistent disk tier, for one
// namespace, with synchronous calls and batched asynchronous calls run on a thread pool.
//
// put: the block goes to disk, then into DRAM (write-through: it is durable when put returns or
//      its batch item reports `stored`; a put that fails changes neither tier).
// get: DRAM first; on a DRAM miss the disk tier, and a disk hit is promoted into DRAM.
// Every block a get returns is complete and validated; a miss leaves `out` unspecified.
#include <cstdint>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "nvfp4mla/offload/disk_tier.h"
#include "nvfp4mla/offload/dram_tier.h"
#include "nvfp4mla/offload/namespace.h"

namespace nvfp4mla::offload {

struct StoreOptions {
  uint64_t dram_capacity_bytes = 0;  // 0: no DRAM tier
  DiskTierOptions disk;
  int io_threads = 4;           // workers running batch items
  size_t max_queued_items = 256;  // bounded queue: submitting waits while it is full
};

enum class OpStatus : uint8_t { stored, hit, miss, failed };
const char* to_string(OpStatus status);

struct OpResult {
  OpStatus status = OpStatus::failed;
  std::string error;  // set when failed
};

struct BatchResult {
  std::vector<OpResult> items;  // in request order
  size_t count(OpStatus status) const;
};

// The spans must stay valid until the batch's future is ready.
struct PutRequest {
  ByteSpan key;
  ByteSpan block;
};
struct GetRequest {
  ByteSpan key;
  MutableByteSpan out;
};

struct StoreStats {
  DramTierStats dram;
  DiskTierStats disk;
};

class Store {
 public:
  Store(const std::filesystem::path& root, const NamespaceParams& params, StoreOptions options = {});
  ~Store();  // finishes every queued item first
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const NamespaceParams& params() const;
  uint64_t block_bytes() const;

  void put(ByteSpan key, ByteSpan block);  // throws Error when the disk write fails
  bool get(ByteSpan key, MutableByteSpan out);

  // Each item runs on the pool; the future is ready when all items have finished. A failing
  // item reports `failed` with its message and does not affect the others. These calls wait
  // while the queue is full (back-pressure).
  std::future<BatchResult> put_async(std::vector<PutRequest> requests);
  std::future<BatchResult> get_async(std::vector<GetRequest> requests);

  StoreStats stats() const;
  DiskTier& disk();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nvfp4mla::offload
