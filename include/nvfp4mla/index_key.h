#pragma once
// Index keys of the DSA lightning indexer: the one place that knows their bytes and their
// recipe (docs/SELECTION.md, "Index key cache", is the specification).
//
// One key per cached token: 128 values stored as E4M3 with one fp32 power-of-two scale.
//   Per-token record (132 bytes): the 128 E4M3 bytes (element i at byte i), then the fp32
//   scale, little-endian, at [128, 132).
//   Paged cache ([num_pages, page_size * 132] bytes, DeepGEMM's fused layout, what vLLM
//   allocates): per page, the page_size x 128 E4M3 bytes of its tokens first (token o of the
//   page at o * 128), then their page_size fp32 scales (token o at page_size * 128 + 4 o).
//   Slot id = page * page_size + o.
// Recipe (CPU and GPU writers alike, bit for bit):
//   x_i = sanitize(widen(input_i)) (NaN -> +0, +-Inf -> +-FLT_MAX, as the latent recipes);
//   p = the smallest power of two with max |x_i| <= 448 p, at least 2^-126; p = 1 when the
//       maximum is 0 (the fp8_ds_mla tile scale of record.h);
//   byte_i = E4M3(x_i / p), round to nearest even, saturating.
// A value decodes as E4M3(byte_i) * p.
#include <cstdint>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/hd.h"
#include "nvfp4mla/record.h"

namespace nvfp4mla::index_key {

inline constexpr int kDim = 128;                         // values per key
inline constexpr int kValueBytes = kDim;                 // E4M3, one byte per value
inline constexpr int kScaleBytes = 4;                    // fp32
inline constexpr int kScaleOffset = kValueBytes;         // in the per-token record
inline constexpr int kRecordBytes = kValueBytes + kScaleBytes;  // 132
inline constexpr int64_t kDefaultPageSize = 64;

// Byte offsets in the paged cache: of token `i` of a page (0 <= i < page_size) from the page's
// start, and of a slot from the cache's start.
NVFP4MLA_HD int64_t page_bytes(int64_t page_size) { return page_size * kRecordBytes; }
NVFP4MLA_HD int64_t value_offset_in_page(int64_t i) { return i * kValueBytes; }
NVFP4MLA_HD int64_t scale_offset_in_page(int64_t i, int64_t page_size) { return page_size * kValueBytes + i * kScaleBytes; }
NVFP4MLA_HD int64_t value_offset(int64_t slot, int64_t page_size) {
  return (slot / page_size) * page_bytes(page_size) + value_offset_in_page(slot % page_size);
}
NVFP4MLA_HD int64_t scale_offset(int64_t slot, int64_t page_size) {
  return (slot / page_size) * page_bytes(page_size) + scale_offset_in_page(slot % page_size, page_size);
}

// The key's scale from the largest sanitized magnitude.
NVFP4MLA_HD float scale_of_amax(float amax) { return record::fp8_tile_scale(amax); }

// Encode one key of 128 input values (BF16, FP16 or fp32): writes the 128 E4M3 bytes to
// `values` and returns the scale.
template <class In>
NVFP4MLA_HD float encode(const In* x, uint8_t* values) {
  float amax = 0.0f;
  for (int i = 0; i < kDim; ++i) amax = record::max_f(amax, record::abs_f(record::sanitize(record::to_fp32(x[i]))));
  const float p = scale_of_amax(amax);
  for (int i = 0; i < kDim; ++i) values[i] = codec::e4m3_encode(record::sanitize(record::to_fp32(x[i])) / p);
  return p;
}

// Encode one key into its 132-byte per-token record.
template <class In>
NVFP4MLA_HD void encode_record(const In* x, uint8_t* rec) {
  record::store_f32(rec + kScaleOffset, encode(x, rec));
}

NVFP4MLA_HD float decode_value(uint8_t byte, float scale) { return codec::e4m3_decode(byte) * scale; }

}  // namespace nvfp4mla::index_key

namespace nvfp4mla {

// A paged index key cache in memory (host or device).
struct IndexCacheView {
  uint8_t* data = nullptr;
  int64_t num_pages = 0;
  int64_t page_size = index_key::kDefaultPageSize;
  int64_t capacity() const { return num_pages * page_size; }  // slots
};

// Checks a view (page size >= 1, sizes non-negative and at most 2^40 slots, memory present);
// throws Error naming `op`.
void validate_index_cache(const IndexCacheView& cache, const char* op);

}  // namespace nvfp4mla
