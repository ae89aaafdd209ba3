#include "nvfp4mla/offload/staging.h"

#include <cstring>
#include <string>

#include "nvfp4mla/error.h"

namespace nvfp4mla::offload {

void check_staging_request(const StagingRequest& r) {
  if (r.layers.empty()) throw Error("staging request has no layers");
  if (r.tokens_per_block < 1) throw Error("staging request: tokens per block must be at least 1");
  const int record_bytes = r.layers.front().record_bytes;
  if (record_bytes < 1) throw Error("staging request: the cache views have no record width");
  for (size_t l = 0; l < r.layers.size(); ++l) {
    const PagedCacheView& v = r.layers[l];
    if (v.record_bytes != record_bytes)
      throw Error("staging request: layer " + std::to_string(l) + " has " + std::to_string(v.record_bytes) +
                  "-byte records, layer 0 has " + std::to_string(record_bytes));
    if (v.capacity() > 0 && v.data == nullptr) throw Error("staging request: layer " + std::to_string(l) + " has no data");
  }
  if (r.slots.size() % static_cast<size_t>(r.tokens_per_block) != 0)
    throw Error("staging request: " + std::to_string(r.slots.size()) + " slots is not a whole number of " +
                std::to_string(r.tokens_per_block) + "-token blocks");
  const uint64_t expected = uint64_t(r.slots.size()) * r.layers.size() * uint64_t(record_bytes);
  if (r.host.size() != expected)
    throw Error("staging request: host buffer is " + std::to_string(r.host.size()) + " bytes, expected " +
                std::to_string(expected) + " (blocks x layers x tokens x record bytes)");
  for (size_t l = 0; l < r.layers.size(); ++l)
    for (size_t i = 0; i < r.slots.size(); ++i)
      if (r.slots[i] >= r.layers[l].capacity())
        throw Error("staging request: slot " + std::to_string(r.slots[i]) + " (index " + std::to_string(i) +
                    ") is outside layer " + std::to_string(l) + "'s cache of " +
                    std::to_string(r.layers[l].capacity()) + " slots");
}

namespace {

class HostStager final : public BlockStager {
 public:
  void gather(const StagingRequest& r) override { copy(r, /*to_host=*/true); }
  void scatter(const StagingRequest& r) override { copy(r, /*to_host=*/false); }
  void synchronize() override {}

 private:
  static void copy(const StagingRequest& r, bool to_host) {
    check_staging_request(r);
    const size_t tokens = static_cast<size_t>(r.tokens_per_block);
    const size_t layers = r.layers.size();
    const size_t record = static_cast<size_t>(r.layers.front().record_bytes);
    const size_t blocks = r.slots.size() / tokens;
    for (size_t b = 0; b < blocks; ++b)
      for (size_t l = 0; l < layers; ++l)
        for (size_t t = 0; t < tokens; ++t) {
          const int64_t slot = r.slots[b * tokens + t];
          uint8_t* host = r.host.data() + ((b * layers + l) * tokens + t) * record;
          if (slot < 0) {
            if (to_host) std::memset(host, 0, record);
            continue;
          }
          uint8_t* cache = r.layers[l].slot(slot);
          if (to_host)
            std::memcpy(host, cache, record);
          else
            std::memcpy(cache, host, record);
        }
  }
};

}  // namespace

std::unique_ptr<BlockStager> make_host_stager() { return std::make_unique<HostStager>(); }

}  // namespace nvfp4mla::offload
