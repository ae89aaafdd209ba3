#pragma once
// Fused selection problems (host memory) for the CPU and GPU suites: a paged indexer problem
// (indexer_problems.h) with k, and the unfused answer (materialized logits, then top-k).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "nvfp4mla/fused_select.h"
#include "nvfp4mla/topk.h"
#include "support/indexer_problems.h"

namespace nvfp4mla::testing {

struct Selection {
  std::vector<int32_t> indices, topk_length;
  std::vector<float> values;
  explicit Selection(int64_t rows = 0, int k = 0)
      : indices(rows * k, 12345), topk_length(rows, 12345), values(rows * k, kPoisonLogit) {}
  TopkOutputs outputs() { return {indices.data(), topk_length.data(), values.data()}; }
  bool operator==(const Selection&) const = default;
};

// Fused-selection arguments over a paged problem (its logits unset: nothing materialized).
inline FusedSelectArgs fused_args(PagedProblem& p, int k, bool slot_ids) {
  FusedSelectArgs a;
  a.keys = p.args();
  a.keys.logits = nullptr;
  a.keys.logits_stride = 0;
  a.max_context = p.stride;
  a.k = k;
  a.slot_ids = slot_ids;
  return a;
}

// Ragged fused-selection arguments: rows of `p` whose first ranges are forced to the lengths
// 0, 1, k-1, k, k+1 (starting at key 0), the rest random.
inline FusedSelectRaggedArgs fused_ragged_args(RaggedProblem& p, int k) {
  const int64_t edge[] = {0, 1, k - 1, k, k + 1};
  for (int64_t r = 0; r < 5 && r < p.rows; ++r)
    if (edge[r] <= std::min(p.stride, p.num_keys)) {
      p.starts[r] = 0;
      p.ends[r] = static_cast<int32_t>(edge[r]);
    }
  FusedSelectRaggedArgs a;
  a.keys = p.args();
  a.keys.logits = nullptr;
  a.keys.logits_stride = 0;
  a.max_length = p.stride;
  a.k = k;
  return a;
}

// The slot map fused selection uses with slot_ids (topk.h).
inline TopkSlotMap fused_slot_map(const PagedProblem& p) {
  return {p.table.data(), p.requests, p.table_stride, p.table_stride, static_cast<int>(p.page_size), p.next_n,
          p.num_pages * p.page_size};
}

// The paged problem with `lengths` per request and every context within `max_context`.
inline PagedProblem selection_problem(int heads, int next_n, int64_t page_size, std::vector<int32_t> lengths, int64_t max_context,
                                      uint64_t seed, Values v) {
  return paged_problem(heads, next_n, page_size, std::move(lengths), max_context, seed, v);
}

}  // namespace nvfp4mla::testing
