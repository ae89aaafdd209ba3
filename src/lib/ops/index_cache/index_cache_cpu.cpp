// CPU reference of the index key cache: writer through a slot mapping and gathers.
#include <cstring>
#include <string>

#include "nvfp4mla/error.h"
#include "nvfp4mla/index_cache.h"

namespace nvfp4mla {
namespace {

// Every slot is checked before any byte is touched, so a bad mapping leaves everything as it was.
void check_slots(std::span<const int64_t> slots, int64_t capacity, bool allow_negative, const char* op) {
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t s = slots[i];
    if ((s < 0 && !allow_negative) || s >= capacity)
      throw Error(std::string(op) + ": slot_mapping entry " + std::to_string(i) + " is slot " + std::to_string(s) +
                  ", outside the index cache's " + std::to_string(capacity) + " slots" +
                  (allow_negative ? " (negative slots are skipped)" : ""));
  }
}

template <class Store>
void gather(const IndexCacheView& cache, std::span<const int64_t> slots, const char* op, bool have_output, Store store) {
  validate_index_cache(cache, op);
  check_slots(slots, cache.capacity(), /*allow_negative=*/false, op);
  if (!slots.empty() && !have_output) throw Error(std::string(op) + ": no output buffer");
  for (size_t i = 0; i < slots.size(); ++i) {
    const uint8_t* values = cache.data + index_key::value_offset(slots[i], cache.page_size);
    const float scale = record::load_f32(cache.data + index_key::scale_offset(slots[i], cache.page_size));
    store(static_cast<int64_t>(i), values, scale);
  }
}

}  // namespace

void validate_index_cache(const IndexCacheView& cache, const char* op) {
  if (cache.page_size < 1)
    throw Error(std::string(op) + ": page_size must be at least 1 (got " + std::to_string(cache.page_size) + ")");
  if (cache.num_pages < 0)
    throw Error(std::string(op) + ": num_pages is negative (" + std::to_string(cache.num_pages) + ")");
  // Byte offsets are int64: the whole cache must stay far below 2^63 bytes.
  if (cache.num_pages > 0 && cache.page_size > (int64_t(1) << 40) / cache.num_pages)
    throw Error(std::string(op) + ": index cache of " + std::to_string(cache.num_pages) + " pages of " +
                std::to_string(cache.page_size) + " slots is too large (at most 2^40 slots)");
  if (cache.capacity() > 0 && cache.data == nullptr)
    throw Error(std::string(op) + ": index cache of " + std::to_string(cache.capacity()) + " slots has no memory");
}

template <class In>
void write_index_cache(const In* keys, int64_t num_tokens, std::span<const int64_t> slot_mapping,
                       const IndexCacheView& cache) {
  constexpr const char* kOp = "write_index_cache";
  validate_index_cache(cache, kOp);
  if (num_tokens < 0 || static_cast<uint64_t>(num_tokens) != slot_mapping.size())
    throw Error(std::string(kOp) + ": " + std::to_string(num_tokens) + " keys but " +
                std::to_string(slot_mapping.size()) + " slot_mapping entries");
  if (num_tokens > 0 && keys == nullptr) throw Error(std::string(kOp) + ": keys has no data");
  check_slots(slot_mapping, cache.capacity(), /*allow_negative=*/true, kOp);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t s = slot_mapping[static_cast<size_t>(t)];
    if (s < 0) continue;  // padded CUDA-graph slot
    const float p = index_key::encode(keys + t * index_key::kDim, cache.data + index_key::value_offset(s, cache.page_size));
    record::store_f32(cache.data + index_key::scale_offset(s, cache.page_size), p);
  }
}

template void write_index_cache<float>(const float*, int64_t, std::span<const int64_t>, const IndexCacheView&);
template void write_index_cache<Bf16Bits>(const Bf16Bits*, int64_t, std::span<const int64_t>, const IndexCacheView&);
template void write_index_cache<Fp16Bits>(const Fp16Bits*, int64_t, std::span<const int64_t>, const IndexCacheView&);

void gather_index_records(const IndexCacheView& cache, std::span<const int64_t> slots, uint8_t* records) {
  gather(cache, slots, "gather_index_records", records != nullptr, [&](int64_t i, const uint8_t* values, float scale) {
    uint8_t* rec = records + i * index_key::kRecordBytes;
    std::memcpy(rec, values, index_key::kValueBytes);
    record::store_f32(rec + index_key::kScaleOffset, scale);
  });
}

void gather_index_keys(const IndexCacheView& cache, std::span<const int64_t> slots, uint8_t* values, float* scales) {
  gather(cache, slots, "gather_index_keys", values != nullptr && scales != nullptr,
         [&](int64_t i, const uint8_t* v, float scale) {
           std::memcpy(values + i * index_key::kValueBytes, v, index_key::kValueBytes);
           scales[i] = scale;
         });
}

}  // namespace nvfp4mla
