// Top-k on the CPU: argument checks, the reference (a full stable sort per row), the planner.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "nvfp4mla/error.h"
#include "nvfp4mla/topk.h"
#include "ops/topk/topk_radix.h"

namespace nvfp4mla {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

template <class T>
void require_aligned(const T* p, const char* name) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0)
    throw Error(std::string("top-k: ") + name + " is not aligned to " + str(alignof(T)) + " bytes");
}

bool selectable(float v) { return !std::isnan(v) && v != -std::numeric_limits<float>::infinity(); }

}  // namespace

const char* to_string(TopkKernel k) {
  switch (k) {
    case TopkKernel::split_rows: return "split_rows";
    case TopkKernel::resident_rows: return "resident_rows";
    default: return "row_per_cta";
  }
}

void validate_topk_args(const TopkArgs& a, const TopkOutputs& out) {
  if (a.k < 1 || a.k > kTopkMaxK) throw Error("top-k: k must be in 1.." + str(kTopkMaxK) + " (got " + str(a.k) + ")");
  if (a.rows < 0) throw Error("top-k: rows must be >= 0 (got " + str(a.rows) + ")");
  if (a.columns < 0 || a.columns > INT32_MAX)
    throw Error("top-k: columns must be in 0..2^31-1 (got " + str(a.columns) + ")");
  if (a.stride < a.columns) throw Error("top-k: stride (" + str(a.stride) + ") must be >= columns (" + str(a.columns) + ")");
  if (a.rows > 0 && a.columns > 0 && !a.values) throw Error("top-k: values is null");
  if (a.rows > 0 && (!out.indices || !out.topk_length)) throw Error("top-k: the indices and topk_length outputs are required");
  require_aligned(a.values, "values");
  require_aligned(a.lengths, "lengths");
  require_aligned(a.positions, "positions");
  require_aligned(a.slots.block_table, "block_table");
  require_aligned(out.indices, "indices");
  require_aligned(out.topk_length, "topk_length");
  require_aligned(out.values, "the values output");
  if (!a.positions && a.columns > 0 &&
      (a.position_offset < 0 || a.position_offset > int64_t(INT32_MAX) - (a.columns - 1)))
    throw Error("top-k: position_offset (" + str(a.position_offset) + ") + columns must stay within 0..2^31-1");
  const TopkSlotMap& m = a.slots;
  if (!m.block_table) return;
  if (m.page_size < 1) throw Error("top-k: block_table page_size must be positive (got " + str(m.page_size) + ")");
  if (m.rows_per_request < 1)
    throw Error("top-k: block_table rows_per_request must be positive (got " + str(m.rows_per_request) + ")");
  if (m.pages < 0 || m.table_stride < m.pages)
    throw Error("top-k: block_table has " + str(m.pages) + " pages per request and a stride of " + str(m.table_stride) +
                " (stride >= pages >= 0 required)");
  // An empty cache (capacity 0) is valid: every selected position then has no slot.
  if (m.capacity < 0) throw Error("top-k: block_table capacity must not be negative (got " + str(m.capacity) + ")");
  const int64_t requests_needed = (int64_t(a.rows) + m.rows_per_request - 1) / m.rows_per_request;
  if (m.requests < requests_needed)
    throw Error("top-k: block_table has " + str(m.requests) + " requests but " + str(a.rows) + " rows at " +
                str(m.rows_per_request) + " rows per request need " + str(requests_needed));
  if (!a.positions && a.columns + a.position_offset > m.pages * int64_t(m.page_size))
    throw Error("top-k: block_table covers " + str(m.pages * int64_t(m.page_size)) + " positions per request but rows reach position " +
                str(a.columns + a.position_offset - 1));
}

void topk_reference(const TopkArgs& a, const TopkOutputs& out) {
  validate_topk_args(a, out);
  const int64_t k = a.k;
  std::vector<int32_t> indices(size_t(a.rows) * k, -1), lengths(a.rows, 0);
  std::vector<float> values(out.values ? size_t(a.rows) * k : 0, -std::numeric_limits<float>::infinity());
  std::vector<int64_t> order;
  for (int r = 0; r < a.rows; ++r) {
    const int64_t len = a.lengths ? a.lengths[r] : a.columns;
    if (len < 0 || len > a.columns)
      throw Error("top-k: lengths[" + str(r) + "] = " + str(len) + " is outside 0..columns (" + str(a.columns) + ")");
    const float* v = a.values + r * a.stride;
    auto position = [&](int64_t c) -> int64_t { return a.positions ? a.positions[r * a.stride + c] : c + a.position_offset; };
    order.clear();
    for (int64_t c = 0; c < len; ++c)
      if (selectable(v[c])) {
        if (a.positions && (position(c) < 0 || (!order.empty() && position(c) <= position(order.back()))))
          throw Error("top-k: positions of row " + str(r) + " are not strictly increasing and non-negative at column " + str(c));
        order.push_back(c);
      }
    // Columns in position order; a stable sort by value keeps equal values in that order
    // (float comparison: -0.0 == +0.0).
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return v[x] > v[y]; });
    const int64_t n = std::min<int64_t>(k, static_cast<int64_t>(order.size()));
    std::sort(order.begin(), order.begin() + n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = position(order[i]);
      int64_t id = pos;
      if (a.slots.block_table) {
        id = topk_slot(a.slots, r, pos);
        if (id < 0)
          throw Error("top-k: block_table has no valid slot for position " + str(pos) + " of row " + str(r) +
                      " (negative entry, page past the table, or slot past the capacity or 2^31)");
      }
      indices[r * k + i] = static_cast<int32_t>(id);
      if (out.values) values[r * k + i] = v[order[i]];
    }
    lengths[r] = static_cast<int32_t>(n);
  }
  std::copy(indices.begin(), indices.end(), out.indices);
  std::copy(lengths.begin(), lengths.end(), out.topk_length);
  if (out.values) std::copy(values.begin(), values.end(), out.values);
}

TopkPlan split_topk_plan(int64_t columns, int segments, int64_t candidates) {
  if (columns < 0 || segments < 1) throw Error("top-k plan: columns >= 0 and segments >= 1 required");
  if (candidates < -1 || candidates > kTopkCandidates)
    throw Error("top-k plan: candidates must be -1 or in 0.." + std::to_string(kTopkCandidates));
  TopkPlan p;
  p.candidates = candidates < 0 ? std::min(columns, kTopkCandidates) : candidates;
  p.kernel = TopkKernel::split_rows;
  p.segment_len = std::max<int64_t>(256, ((columns + segments - 1) / segments + 255) / 256 * 256);
  p.segments = static_cast<int>(std::max<int64_t>(1, (columns + p.segment_len - 1) / p.segment_len));
  return p;
}

TopkPlan plan_topk(int rows, int64_t columns, int sm_count) {
  if (rows < 0 || columns < 0) throw Error("top-k plan: rows and columns must be >= 0");
  if (sm_count <= 0) throw Error("top-k plan: SM count must be positive");
  const int64_t target = int64_t(kTopkCtasPerSm) * sm_count;
  const int64_t by_length = (columns + kTopkMinSegment - 1) / kTopkMinSegment;
  const int64_t by_rows = (target + std::max(rows, 1) - 1) / std::max(rows, 1);
  int64_t segments = std::min(by_length, by_rows);
  if (segments > 1) {
    const int64_t resident = std::max(segments, (columns + kTopkResidentMaxSegment - 1) / kTopkResidentMaxSegment);
    if (int64_t(std::max(rows, 1)) * resident <= int64_t(kTopkResidentCtasPerSm) * sm_count)
      return resident_topk_plan(columns, static_cast<int>(resident));
    const bool filter = int64_t(std::max(rows, 1)) * columns >= kTopkFilterMinEntries;
    if (filter)  // at most kTopkCtasPerSm CTAs per SM, unless segments would pass kTopkFilterMaxSegment
      segments = std::max(std::min(by_length, std::max<int64_t>(1, target / std::max(rows, 1))),
                          (columns + kTopkFilterMaxSegment - 1) / kTopkFilterMaxSegment);
    else
      segments = std::max(segments, (columns + kTopkMaxSegment - 1) / kTopkMaxSegment);
    const TopkPlan p = split_topk_plan(columns, static_cast<int>(segments), filter ? -1 : 0);
    if (p.segments > 1) return p;
  }
  TopkPlan p;
  p.segment_len = columns;
  return p;
}

TopkPlan resident_topk_plan(int64_t columns, int segments) {
  if (columns < 0 || segments < 1) throw Error("top-k plan: columns >= 0 and segments >= 1 required");
  const int64_t at_least = (columns + kTopkResidentMaxSegment - 1) / kTopkResidentMaxSegment;
  TopkPlan p = split_topk_plan(columns, static_cast<int>(std::max<int64_t>(segments, at_least)), 0);
  p.kernel = TopkKernel::resident_rows;
  return p;
}

size_t topk_workspace_bytes(const TopkPlan& plan, int rows) {
  if (plan.kernel == TopkKernel::row_per_cta || rows <= 0) return 0;
  return topk_radix::split_layout(rows, plan.segments, plan.candidates).total_bytes;
}

}  // namespace nvfp4mla
