#include <string>

#include "nvfp4mla/error.h"
#include "nvfp4mla/paged_cache.h"

namespace nvfp4mla {
namespace {

void check_view(const FormatConfig& cfg, const PagedCacheView& cache, const char* op) {
  if (cache.record_bytes != cfg.record_bytes())
    throw Error(std::string(op) + ": the paged cache holds " + std::to_string(cache.record_bytes) +
                "-byte records but the configuration (" + cfg.describe() + ") uses " +
                std::to_string(cfg.record_bytes()) + "-byte records");
  if (cache.num_pages < 0 || cache.page_size < 0)
    throw Error(std::string(op) + ": paged cache has a negative size (" + std::to_string(cache.num_pages) +
                " pages of " + std::to_string(cache.page_size) + " slots)");
  if (cache.capacity() > 0 && cache.data == nullptr)
    throw Error(std::string(op) + ": paged cache of " + std::to_string(cache.capacity()) + " slots has no memory");
}

// Every slot is checked before any record is touched, so a bad mapping leaves the cache as it was.
void check_slots(std::span<const int64_t> slots, int64_t capacity, bool allow_negative, const char* op) {
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t s = slots[i];
    if ((s < 0 && !allow_negative) || s >= capacity)
      throw Error(std::string(op) + ": slot " + std::to_string(s) + " (entry " + std::to_string(i) +
                  ") is outside the paged cache's capacity of " + std::to_string(capacity) + " slots" +
                  (allow_negative ? "" : " (valid slots are 0.." + std::to_string(capacity - 1) + ")"));
  }
}

}  // namespace

template <class In>
void write_paged_cache(const FormatConfig& cfg, const TokenBatch<In>& tokens, std::span<const int64_t> slot_mapping,
                       const PagedCacheView& cache) {
  constexpr const char* kOp = "write_paged_cache";
  check_view(cfg, cache, kOp);
  if (tokens.num_tokens < 0 || static_cast<uint64_t>(tokens.num_tokens) != slot_mapping.size())
    throw Error(std::string(kOp) + ": " + std::to_string(tokens.num_tokens) + " tokens but " +
                std::to_string(slot_mapping.size()) + " slot mapping entries");
  if (tokens.num_tokens > 0 && (tokens.kv_c == nullptr || tokens.k_pe == nullptr))
    throw Error(std::string(kOp) + ": token batch has no kv_c or k_pe data");
  check_slots(slot_mapping, cache.capacity(), /*allow_negative=*/true, kOp);
  const RecordSpec spec = cfg.spec();
  const float layer_scale = cfg.layer_scale();
  for (int64_t t = 0; t < tokens.num_tokens; ++t) {
    const int64_t s = slot_mapping[static_cast<size_t>(t)];
    if (s < 0) continue;  // padded CUDA-graph slot
    record::encode(spec, tokens.kv_c + t * kLatentDim, tokens.k_pe + t * kRopeDim, layer_scale, cache.slot(s));
  }
}

template void write_paged_cache<float>(const FormatConfig&, const TokenBatch<float>&, std::span<const int64_t>,
                                       const PagedCacheView&);
template void write_paged_cache<Bf16Bits>(const FormatConfig&, const TokenBatch<Bf16Bits>&,
                                          std::span<const int64_t>, const PagedCacheView&);
template void write_paged_cache<Fp16Bits>(const FormatConfig&, const TokenBatch<Fp16Bits>&,
                                          std::span<const int64_t>, const PagedCacheView&);

void gather_dequantize(const FormatConfig& cfg, const PagedCacheView& cache, std::span<const int64_t> slots,
                       float* kv_c, float* k_pe) {
  constexpr const char* kOp = "gather_dequantize";
  check_view(cfg, cache, kOp);
  check_slots(slots, cache.capacity(), /*allow_negative=*/false, kOp);
  if (!slots.empty() && (kv_c == nullptr || k_pe == nullptr))
    throw Error(std::string(kOp) + ": no output buffers for kv_c or k_pe");
  const RecordSpec spec = cfg.spec();
  const float layer_scale = cfg.layer_scale();
  for (size_t i = 0; i < slots.size(); ++i)
    record::decode(spec, cache.slot(slots[i]), layer_scale, kv_c + i * kLatentDim, k_pe + i * kRopeDim);
}

}  // namespace nvfp4mla
