#include "nvfp4mla/offload/store.h"

#include <atomic>
#include <vector>

#include "nvfp4mla/error.h"
#include "thread_pool.h"

namespace nvfp4mla::offload {

const char* to_string(OpStatus status) {
  switch (status) {
    case OpStatus::stored: return "stored";
    case OpStatus::hit: return "hit";
    case OpStatus::miss: return "miss";
    case OpStatus::failed: return "failed";
  }
  return "?";
}

size_t BatchResult::count(OpStatus status) const {
  size_t n = 0;
  for (const auto& item : items) n += item.status == status;
  return n;
}

struct Store::Impl {
  // Declaration order matters: the pool is destroyed (drained) before the tiers it uses.
  DiskTier disk;
  DramTier dram;
  ThreadPool pool;

  Impl(const std::filesystem::path& root, const NamespaceParams& params, const StoreOptions& o)
      : disk(root, params, o.disk), dram(o.dram_capacity_bytes), pool(o.io_threads, o.max_queued_items) {}

  void put(ByteSpan key, ByteSpan block) {
    if (block.size() != disk.block_bytes())
      throw Error("block is " + std::to_string(block.size()) + " bytes; blocks of this namespace are " +
                  std::to_string(disk.block_bytes()) + " bytes");
    // Disk first: a failed write changes neither tier (DRAM never holds a block that is not
    // on disk).
    disk.put(key, block);
    dram.put(key, block);
  }

  bool get(ByteSpan key, MutableByteSpan out) {
    // The key's epoch before the disk read: a put of the key that lands after it, even one DRAM
    // has evicted again, keeps the (possibly older) block read from being promoted.
    const uint64_t epoch = dram.write_epoch(key);
    if (dram.get(key, out)) return true;
    if (!disk.get(key, out)) return false;
    dram.put_if_unchanged(key, out, epoch);
    return true;
  }

  // Runs op(i) for every item on the pool; the future holds one result per item.
  template <class Op>
  std::future<BatchResult> run_batch(size_t n, Op op) {
    struct Batch {
      std::promise<BatchResult> promise;
      BatchResult result;
      std::atomic<size_t> remaining;
    };
    auto batch = std::make_shared<Batch>();
    batch->result.items.resize(n);
    batch->remaining = n;
    auto future = batch->promise.get_future();
    if (n == 0) {
      batch->promise.set_value(std::move(batch->result));
      return future;
    }
    for (size_t i = 0; i < n; ++i) {
      pool.submit([batch, i, op] {
        OpResult& r = batch->result.items[i];
        try {
          r.status = op(i);
        } catch (const std::exception& e) {
          r.status = OpStatus::failed;
          r.error = e.what();
        }
        if (batch->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1)
          batch->promise.set_value(std::move(batch->result));
      });
    }
    return future;
  }
};

Store::Store(const std::filesystem::path& root, const NamespaceParams& params, StoreOptions options)
    : impl_(std::make_unique<Impl>(root, params, options)) {}

Store::~Store() = default;

const NamespaceParams& Store::params() const { return impl_->disk.params(); }
uint64_t Store::block_bytes() const { return impl_->disk.block_bytes(); }

void Store::put(ByteSpan key, ByteSpan block) { impl_->put(key, block); }
bool Store::get(ByteSpan key, MutableByteSpan out) { return impl_->get(key, out); }

std::future<BatchResult> Store::put_async(std::vector<PutRequest> requests) {
  auto shared = std::make_shared<std::vector<PutRequest>>(std::move(requests));
  Impl* m = impl_.get();
  return m->run_batch(shared->size(), [m, shared](size_t i) {
    m->put((*shared)[i].key, (*shared)[i].block);
    return OpStatus::stored;
  });
}

std::future<BatchResult> Store::get_async(std::vector<GetRequest> requests) {
  auto shared = std::make_shared<std::vector<GetRequest>>(std::move(requests));
  Impl* m = impl_.get();
  return m->run_batch(shared->size(), [m, shared](size_t i) {
    return m->get((*shared)[i].key, (*shared)[i].out) ? OpStatus::hit : OpStatus::miss;
  });
}

StoreStats Store::stats() const { return {impl_->dram.stats(), impl_->disk.stats()}; }
DiskTier& Store::disk() { return impl_->disk; }

}  // namespace nvfp4mla::offload
