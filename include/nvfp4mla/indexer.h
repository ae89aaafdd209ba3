#pragma once
// Indexer logits of DeepSeek Sparse Attention (the "lightning indexer"): for a query row and a
// key token t,
//   logit[row, t] = s_t * sum_h w[row, h] * max(q[row, h] . k_t, 0)
// which is sum_h w[row, h] * relu(s_t * (q[row, h] . k_t)) for the writer's positive scales s_t.
//   q: E4M3 bytes [rows, heads, 128] (the query's own scale folded into w by the caller),
//   w: fp32 [rows, heads], heads any of 1..64,
//   k_t: the 128 E4M3 values of the token's index key, s_t its fp32 scale (index_key.h).
// max(x, 0) is 0 for NaN (a query or key byte 0x7F/0xFF, the E4M3 NaN, makes that head's dot
// product NaN and its term zero); NaN or infinite weights propagate under IEEE rules.
//
// Output: fp32 logits [rows, stride] written by the caller's buffer; row r's column j is the
// logit of the row's j-th key for j < length(r), and -inf for length(r) <= j < stride.
//
// Two forms:
//   ragged (prefill): row r scores keys starts[r] .. ends[r]-1 of a contiguous key buffer
//     (values [num_keys] rows of 128 E4M3 bytes at value_stride bytes apart, scales at
//     scale_stride floats apart, so per-token records [N, 132] are a buffer too);
//     length(r) = ends[r] - starts[r], column j = key starts[r] + j.
//   paged (decode): requests b with a block table row and a context length; rows are
//     requests x next_n (row b * next_n + i, the verifier rows of speculative decoding),
//     length(b, i) = max(0, context_lens[b] - next_n + i + 1), column j = the request's token
//     position j (slot = block_table[b, j / page_size] * page_size + j % page_size).
//
// Accuracy: fp32 accumulation. The CPU references below compute each dot product exactly and
// the head sum in double precision, rounded once to fp32; GPU kernels (cuda/indexer.h) agree
// within the tolerance stated in docs/SELECTION.md.
#include <cstdint>

#include "nvfp4mla/index_key.h"

namespace nvfp4mla {

inline constexpr int kIndexerMaxHeads = 64;

struct IndexerRaggedArgs {
  const uint8_t* q = nullptr;          // [rows, heads, 128] E4M3 bits
  const float* weights = nullptr;      // [rows, heads]
  int64_t rows = 0;
  int heads = 0;
  const uint8_t* key_values = nullptr;  // num_keys rows of 128 E4M3 bytes
  int64_t key_value_stride = index_key::kValueBytes;  // bytes between keys (kRecordBytes for per-token records)
  const float* key_scales = nullptr;    // num_keys fp32 scales
  int64_t key_scale_stride = 1;         // floats between scales (33 for per-token records)
  int64_t num_keys = 0;
  const int32_t* row_starts = nullptr;  // [rows]
  const int32_t* row_ends = nullptr;    // [rows]
  float* logits = nullptr;              // [rows, logits_stride]
  int64_t logits_stride = 0;
};

struct IndexerPagedArgs {
  const uint8_t* q = nullptr;          // [requests * next_n, heads, 128] E4M3 bits
  const float* weights = nullptr;      // [requests * next_n, heads]
  int64_t requests = 0;
  int next_n = 1;                      // query rows per request
  int heads = 0;
  const uint8_t* cache = nullptr;      // [num_pages, page_size * 132] (index_key.h)
  int64_t num_pages = 0;
  int64_t page_size = index_key::kDefaultPageSize;
  const int32_t* block_table = nullptr;  // [requests, block_table_stride] page ids
  int64_t block_table_stride = 0;
  const int32_t* context_lens = nullptr;  // [requests]
  float* logits = nullptr;                // [requests * next_n, logits_stride]
  int64_t logits_stride = 0;

  int64_t rows() const { return requests * next_n; }
};

// The causal length of row i (0 <= i < next_n) of a request with `context_len` tokens.
inline int64_t paged_row_length(int64_t context_len, int next_n, int i) {
  const int64_t l = context_len - next_n + i + 1;
  return l < 0 ? 0 : l;
}

// Checks shapes, pointers and the scalar arguments shared by every implementation; throws Error
// naming the argument. Device pointers are only checked for presence.
void validate_indexer_args(const IndexerRaggedArgs& a);
void validate_indexer_args(const IndexerPagedArgs& a);
// Checks the metadata arrays, which must be readable here (host memory): ranges inside the key
// buffer and not longer than the stride; context lengths >= 0 and <= the stride; every block
// table entry a request's length needs inside [0, num_pages) and inside the table's width.
// Throws Error naming the row or request and the argument.
void validate_indexer_metadata(const IndexerRaggedArgs& a);
void validate_indexer_metadata(const IndexerPagedArgs& a);

// CPU references (host memory throughout). Both validate everything first and write nothing
// when they throw.
void indexer_logits_reference(const IndexerRaggedArgs& a);
void indexer_logits_reference(const IndexerPagedArgs& a);

}  // namespace nvfp4mla
