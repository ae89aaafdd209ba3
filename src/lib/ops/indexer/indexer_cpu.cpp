// CPU references of the indexer logits (ragged and paged forms) and the argument checks every
// implementation shares.
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/index_key.h"
#include "nvfp4mla/indexer.h"
#include "nvfp4mla/record.h"

namespace nvfp4mla {
namespace {

[[noreturn]] void fail(const char* op, const std::string& what) { throw Error(std::string(op) + ": " + what); }

void check_heads(const char* op, int heads) {
  if (heads < 1 || heads > kIndexerMaxHeads)
    fail(op, "heads must be in 1.." + std::to_string(kIndexerMaxHeads) + " (got " + std::to_string(heads) + ")");
}

// Every E4M3 byte's value in double precision (NaN bytes stay NaN).
const std::array<double, 256>& e4m3_values() {
  static const std::array<double, 256> table = [] {
    std::array<double, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = codec::e4m3_decode(static_cast<uint8_t>(b));
    return t;
  }();
  return table;
}

// One query row's heads, decoded once.
struct DecodedQuery {
  std::vector<double> q;  // [heads, 128]
  const float* w = nullptr;
  int heads = 0;
};
DecodedQuery decode_query(const uint8_t* q, const float* w, int heads) {
  const auto& v = e4m3_values();
  DecodedQuery d{std::vector<double>(static_cast<size_t>(heads) * index_key::kDim), w, heads};
  for (size_t i = 0; i < d.q.size(); ++i) d.q[i] = v[q[i]];
  return d;
}

// s * sum_h w_h * max(q_h . k, 0): each dot product is exact in double (E4M3 products are
// multiples of 2^-18 below 2^18, so 128 of them sum exactly within 53 bits); the head sum is
// double; one rounding to fp32 at the end.
float logit(const DecodedQuery& q, const uint8_t* key, float scale) {
  const auto& v = e4m3_values();
  double k[index_key::kDim];
  for (int i = 0; i < index_key::kDim; ++i) k[i] = v[key[i]];
  double acc = 0.0;
  for (int h = 0; h < q.heads; ++h) {
    const double* qh = q.q.data() + static_cast<size_t>(h) * index_key::kDim;
    double dot = 0.0;
    for (int i = 0; i < index_key::kDim; ++i) dot += qh[i] * k[i];
    const double relu = dot > 0.0 ? dot : 0.0;  // NaN -> 0
    acc += static_cast<double>(q.w[h]) * relu;
  }
  return static_cast<float>(static_cast<double>(scale) * acc);
}

void fill_tail(float* row, int64_t from, int64_t stride) {
  for (int64_t j = from; j < stride; ++j) row[j] = -std::numeric_limits<float>::infinity();
}

constexpr const char* kRagged = "indexer logits (ragged)";
constexpr const char* kPaged = "indexer logits (paged)";

}  // namespace

void validate_indexer_args(const IndexerRaggedArgs& a) {
  const char* op = kRagged;
  check_heads(op, a.heads);
  if (a.rows < 0) fail(op, "rows is negative (" + std::to_string(a.rows) + ")");
  if (a.num_keys < 0) fail(op, "num_keys is negative (" + std::to_string(a.num_keys) + ")");
  if (a.logits_stride < 0) fail(op, "logits_stride is negative (" + std::to_string(a.logits_stride) + ")");
  if (a.key_value_stride < index_key::kValueBytes)
    fail(op, "key_value_stride must be at least 128 bytes (got " + std::to_string(a.key_value_stride) + ")");
  if (a.key_scale_stride < 1) fail(op, "key_scale_stride must be at least 1 (got " + std::to_string(a.key_scale_stride) + ")");
  if (a.rows > 0) {
    if (!a.q) fail(op, "q is null");
    if (!a.weights) fail(op, "weights is null");
    if (!a.row_starts) fail(op, "row_starts is null");
    if (!a.row_ends) fail(op, "row_ends is null");
    if (!a.logits && a.logits_stride > 0) fail(op, "logits is null");
  }
  if (a.num_keys > 0 && (!a.key_values || !a.key_scales)) fail(op, "key_values or key_scales is null");
}

void validate_indexer_args(const IndexerPagedArgs& a) {
  const char* op = kPaged;
  check_heads(op, a.heads);
  if (a.requests < 0) fail(op, "requests is negative (" + std::to_string(a.requests) + ")");
  if (a.next_n < 1) fail(op, "next_n must be at least 1 (got " + std::to_string(a.next_n) + ")");
  if (a.requests > (int64_t(1) << 31) / a.next_n) fail(op, "requests x next_n exceeds 2^31 rows");
  if (a.page_size < 1) fail(op, "page_size must be at least 1 (got " + std::to_string(a.page_size) + ")");
  if (a.num_pages < 0) fail(op, "num_pages is negative (" + std::to_string(a.num_pages) + ")");
  if (a.num_pages > 0 && a.page_size > (int64_t(1) << 40) / a.num_pages)
    fail(op, "the cache of " + std::to_string(a.num_pages) + " pages of " + std::to_string(a.page_size) +
                 " slots is too large (at most 2^40 slots)");
  if (a.block_table_stride < 0) fail(op, "block_table_stride is negative (" + std::to_string(a.block_table_stride) + ")");
  if (a.logits_stride < 0) fail(op, "logits_stride is negative (" + std::to_string(a.logits_stride) + ")");
  if (a.requests > 0) {
    if (!a.q) fail(op, "q is null");
    if (!a.weights) fail(op, "weights is null");
    if (!a.context_lens) fail(op, "context_lens is null");
    if (!a.block_table && a.block_table_stride > 0) fail(op, "block_table is null");
    if (!a.logits && a.logits_stride > 0) fail(op, "logits is null");
  }
  if (a.num_pages > 0 && !a.cache) fail(op, "cache is null");
}

void validate_indexer_metadata(const IndexerRaggedArgs& a) {
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t s = a.row_starts[r], e = a.row_ends[r];
    const std::string row = "row " + std::to_string(r) + ": ";
    if (s < 0 || s > e || e > a.num_keys)
      fail(kRagged, row + "row_starts/row_ends range [" + std::to_string(s) + ", " + std::to_string(e) +
                        ") is not inside the " + std::to_string(a.num_keys) + " keys");
    if (e - s > a.logits_stride)
      fail(kRagged, row + "length " + std::to_string(e - s) + " (row_ends - row_starts) exceeds logits_stride " +
                        std::to_string(a.logits_stride));
  }
}

void validate_indexer_metadata(const IndexerPagedArgs& a) {
  for (int64_t b = 0; b < a.requests; ++b) {
    const int64_t len = a.context_lens[b];
    const std::string req = "request " + std::to_string(b) + ": ";
    if (len < 0) fail(kPaged, req + "context_lens is negative (" + std::to_string(len) + ")");
    if (len > a.logits_stride)
      fail(kPaged, req + "context_lens " + std::to_string(len) + " exceeds logits_stride " + std::to_string(a.logits_stride));
    const int64_t pages = (len + a.page_size - 1) / a.page_size;
    if (pages > a.block_table_stride)
      fail(kPaged, req + "context_lens " + std::to_string(len) + " needs " + std::to_string(pages) +
                       " pages but block_table_stride is " + std::to_string(a.block_table_stride));
    for (int64_t p = 0; p < pages; ++p) {
      const int64_t page = a.block_table[b * a.block_table_stride + p];
      if (page < 0 || page >= a.num_pages)
        fail(kPaged, req + "block_table entry " + std::to_string(p) + " is page " + std::to_string(page) +
                         ", outside the cache's " + std::to_string(a.num_pages) + " pages");
    }
  }
}

void indexer_logits_reference(const IndexerRaggedArgs& a) {
  validate_indexer_args(a);
  validate_indexer_metadata(a);
  const int64_t qrow = int64_t(a.heads) * index_key::kDim;
  for (int64_t r = 0; r < a.rows; ++r) {
    const DecodedQuery q = decode_query(a.q + r * qrow, a.weights + r * a.heads, a.heads);
    float* out = a.logits + r * a.logits_stride;
    const int64_t start = a.row_starts[r], len = a.row_ends[r] - start;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t t = start + j;
      out[j] = logit(q, a.key_values + t * a.key_value_stride, a.key_scales[t * a.key_scale_stride]);
    }
    fill_tail(out, len, a.logits_stride);
  }
}

void indexer_logits_reference(const IndexerPagedArgs& a) {
  validate_indexer_args(a);
  validate_indexer_metadata(a);
  const int64_t qrow = int64_t(a.heads) * index_key::kDim;
  for (int64_t b = 0; b < a.requests; ++b) {
    for (int i = 0; i < a.next_n; ++i) {
      const int64_t r = b * a.next_n + i;
      const DecodedQuery q = decode_query(a.q + r * qrow, a.weights + r * a.heads, a.heads);
      float* out = a.logits + r * a.logits_stride;
      const int64_t len = paged_row_length(a.context_lens[b], a.next_n, i);
      for (int64_t j = 0; j < len; ++j) {
        const int64_t slot = int64_t(a.block_table[b * a.block_table_stride + j / a.page_size]) * a.page_size + j % a.page_size;
        out[j] = logit(q, a.cache + index_key::value_offset(slot, a.page_size),
                       record::load_f32(a.cache + index_key::scale_offset(slot, a.page_size)));
      }
      fill_tail(out, len, a.logits_stride);
    }
  }
}

}  // namespace nvfp4mla
