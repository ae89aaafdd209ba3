// C ABI: the tiered KV offload store (offload/store.h).
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "capi_support.h"
#include "nvfp4mla/offload/store.h"

struct nvfp4mla_store {
  std::unique_ptr<nvfp4mla::offload::Store> store;
};

namespace nvfp4mla::capi {
namespace {

thread_local std::vector<std::string> t_item_errors;

offload::Store& store_of(const nvfp4mla_store* s) {
  require(s, "store");
  return *s->store;
}

offload::ByteSpan key_of(const uint8_t* key, size_t key_bytes) {
  if (key_bytes > 0) require(key, "key");
  return {key, key_bytes};
}

// Runs a batch and reports each item's status (0 stored, 1 hit, 2 miss, 3 failed) and message.
void report(const offload::BatchResult& result, int32_t* status) {
  t_item_errors.assign(result.items.size(), std::string());
  for (size_t i = 0; i < result.items.size(); ++i) {
    status[i] = static_cast<int32_t>(result.items[i].status);
    t_item_errors[i] = result.items[i].error;
  }
}

// Runs n items (keys[i], key_bytes[i], blocks[i] of block_bytes() each) as one batch on the
// store's pool and reports each item's status (0 stored, 1 hit, 2 miss, 3 failed) and message.
template <class Request, class Block>
void run_batch(offload::Store& store, int64_t n, const uint8_t* const* keys, const size_t* key_bytes,
               Block* const* blocks, int32_t* status) {
  if (n < 0) throw Error("store batch: negative item count");
  if (n == 0) return;
  require(keys, "keys");
  require(key_bytes, "key_bytes");
  require(blocks, "blocks");
  require(status, "status");
  // Every item is checked before any is submitted: on a validation failure nothing happens.
  const char* blocks_name = std::is_same_v<Request, offload::PutRequest> ? "blocks" : "outs";
  std::vector<Request> requests(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (!blocks[i]) throw Error(std::string(blocks_name) + "[" + std::to_string(i) + "] is required (null pointer)");
    requests[i] = {key_of(keys[i], key_bytes[i]), {blocks[i], static_cast<size_t>(store.block_bytes())}};
  }
  offload::BatchResult result;
  if constexpr (std::is_same_v<Request, offload::PutRequest>) result = store.put_async(std::move(requests)).get();
  else result = store.get_async(std::move(requests)).get();
  report(result, status);
}

}  // namespace
}  // namespace nvfp4mla::capi

using namespace nvfp4mla;
using namespace nvfp4mla::capi;

static_assert(static_cast<int>(offload::OpStatus::stored) == 0 && static_cast<int>(offload::OpStatus::hit) == 1 &&
                  static_cast<int>(offload::OpStatus::miss) == 2 && static_cast<int>(offload::OpStatus::failed) == 3,
              "c_api.h documents these status codes");

extern "C" {

int nvfp4mla_store_open(const char* root, const nvfp4mla_store_options* o, nvfp4mla_store** store) {
  return guarded([&] {
    require(root, "root");
    require(o, "store options");
    require(store, "store");
    require(o->record_identity, "record_identity");
    require(o->model_identity, "model_identity");
    offload::NamespaceParams params;
    params.record_identity = o->record_identity;
    params.record_bytes = o->record_bytes;
    params.tokens_per_block = o->tokens_per_block;
    params.layers_in_block = o->layers_in_block;
    params.model_identity = o->model_identity;
    params.parallel = {o->tp_rank, o->tp_size, o->dcp_rank, o->dcp_size};
    offload::StoreOptions options;
    options.dram_capacity_bytes = o->dram_capacity_bytes;
    if (o->disk_capacity_bytes > 0) options.disk.capacity_bytes = o->disk_capacity_bytes;
    options.disk.durable = o->durable != 0;
    if (o->io_threads < 1) throw Error("store: io_threads must be at least 1");
    options.io_threads = o->io_threads;
    *store = new nvfp4mla_store{std::make_unique<offload::Store>(root, params, options)};
  });
}

void nvfp4mla_store_close(nvfp4mla_store* store) { delete store; }

int nvfp4mla_store_block_bytes(const nvfp4mla_store* s, uint64_t* block_bytes) {
  return guarded([&] {
    require(block_bytes, "block_bytes");
    *block_bytes = store_of(s).block_bytes();
  });
}

int nvfp4mla_store_dir(const nvfp4mla_store* s, const char** dir) {
  return guarded([&] {
    require(dir, "dir");
    *dir = hand_out(store_of(s).disk().dir().string());
  });
}

int nvfp4mla_store_put(nvfp4mla_store* s, const uint8_t* key, size_t key_bytes, const uint8_t* block,
                       size_t block_bytes) {
  return guarded([&] {
    if (block_bytes > 0) require(block, "block");
    store_of(s).put(key_of(key, key_bytes), {block, block_bytes});
  });
}

int nvfp4mla_store_get(nvfp4mla_store* s, const uint8_t* key, size_t key_bytes, uint8_t* out, size_t out_bytes,
                       int32_t* hit) {
  return guarded([&] {
    require(hit, "hit");
    if (out_bytes > 0) require(out, "out");
    *hit = store_of(s).get(key_of(key, key_bytes), {out, out_bytes}) ? 1 : 0;
  });
}

int nvfp4mla_store_contains(nvfp4mla_store* s, const uint8_t* key, size_t key_bytes, int32_t* found) {
  return guarded([&] {
    require(found, "found");
    // The DRAM tier is write-through: every stored block is on disk.
    *found = store_of(s).disk().contains(key_of(key, key_bytes)) ? 1 : 0;
  });
}

int nvfp4mla_store_put_many(nvfp4mla_store* s, int64_t n, const uint8_t* const* keys, const size_t* key_bytes,
                            const uint8_t* const* blocks, int32_t* status) {
  return guarded([&] { run_batch<offload::PutRequest>(store_of(s), n, keys, key_bytes, blocks, status); });
}

int nvfp4mla_store_get_many(nvfp4mla_store* s, int64_t n, const uint8_t* const* keys, const size_t* key_bytes,
                            uint8_t* const* outs, int32_t* status) {
  return guarded([&] { run_batch<offload::GetRequest>(store_of(s), n, keys, key_bytes, outs, status); });
}

const char* nvfp4mla_store_item_error(int64_t item) {
  if (item < 0 || static_cast<size_t>(item) >= t_item_errors.size()) return "";
  return t_item_errors[static_cast<size_t>(item)].c_str();
}

int nvfp4mla_store_stats_get(const nvfp4mla_store* s, nvfp4mla_store_stats* stats) {
  return guarded([&] {
    require(stats, "stats");
    const offload::StoreStats st = store_of(s).stats();
    *stats = {st.dram.blocks,   st.dram.bytes,      st.dram.capacity_bytes, st.dram.hits,
              st.dram.misses,   st.dram.puts,       st.dram.evictions,      st.dram.rejected,
              st.disk.blocks,   st.disk.bytes,      st.disk.capacity_bytes, st.disk.hits,
              st.disk.misses,   st.disk.corrupt,    st.disk.read_errors,    st.disk.puts,
              st.disk.put_failures, st.disk.evictions, st.disk.quarantined_at_open};
  });
}

}  // extern "C"
