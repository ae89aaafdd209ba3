// Decode context parallelism on the CPU: placement, the merge reference, the top-k merge.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/dcp.h"
#include "nvfp4mla/error.h"
#include "ops/dcp/dcp_math.h"

namespace nvfp4mla {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

void require_rank(const DcpPlacement& p, int rank) {
  if (rank < 0 || rank >= p.ranks)
    throw Error("dcp: rank must be in 0.." + str(p.ranks - 1) + " (got " + str(rank) + ")");
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

void validate_dcp_placement(const DcpPlacement& p) {
  if (p.ranks < 1) throw Error("dcp: ranks must be >= 1 (got " + str(p.ranks) + ")");
  if (p.interleave < 1 || p.interleave > (1 << 30) || (p.interleave & (p.interleave - 1)) != 0)
    throw Error("dcp: interleave must be a power of two in 1..2^30 (got " + str(p.interleave) + ")");
}

DcpLocation dcp_locate(const DcpPlacement& p, int64_t global) {
  validate_dcp_placement(p);
  if (global < 0) throw Error("dcp: global position must be >= 0 (got " + str(global) + ")");
  return {dcp_math::rank_of(global, p.ranks, p.interleave), dcp_math::local_of(global, p.ranks, p.interleave)};
}

int64_t dcp_global_position(const DcpPlacement& p, int rank, int64_t local) {
  validate_dcp_placement(p);
  require_rank(p, rank);
  if (local < 0) throw Error("dcp: local position must be >= 0 (got " + str(local) + ")");
  const int64_t cycle = local / p.interleave, within = local % p.interleave;
  const int64_t stride = int64_t(p.interleave) * p.ranks;  // < 2^62
  const int64_t head = int64_t(rank) * p.interleave + within;
  if (cycle > (std::numeric_limits<int64_t>::max() - head) / stride)
    throw Error("dcp: local position " + str(local) + " of rank " + str(rank) + " lies past global position 2^63-1");
  return cycle * stride + head;
}

int64_t dcp_local_length(const DcpPlacement& p, int rank, int64_t context_length) {
  validate_dcp_placement(p);
  require_rank(p, rank);
  if (context_length < 0) throw Error("dcp: context_length must be >= 0 (got " + str(context_length) + ")");
  const int64_t stride = int64_t(p.interleave) * p.ranks;
  const int64_t rest = context_length % stride - int64_t(rank) * p.interleave;
  return context_length / stride * p.interleave + std::clamp<int64_t>(rest, 0, p.interleave);
}

void dcp_global_positions(const DcpPlacement& p, int rank, int32_t* out, int64_t n) {
  validate_dcp_placement(p);
  require_rank(p, rank);
  if (n < 0) throw Error("dcp: n must be >= 0 (got " + str(n) + ")");
  if (n == 0) return;
  const int64_t last = dcp_global_position(p, rank, n - 1);
  if (last > INT32_MAX)
    throw Error("dcp: out holds int32 global positions, but rank " + str(rank) + "'s local position " + str(n - 1) +
                " is global position " + str(last) + ", which exceeds 2^31-1");
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(dcp_global_position(p, rank, i));
}

void validate_dcp_slot_mapping_args(const DcpPlacement& p, int page_size, int rank, int64_t n) {
  validate_dcp_placement(p);
  require_rank(p, rank);
  if (page_size < 1 || page_size % p.interleave != 0)
    throw Error("dcp: page_size must be a positive multiple of the interleave " + str(p.interleave) + " (got " +
                str(page_size) + ")");
  if (n < 0) throw Error("dcp: n must be >= 0 (got " + str(n) + ")");
}

void dcp_local_slot_mapping(const DcpPlacement& p, int page_size, int rank, const int64_t* global_slots, int64_t n,
                            int64_t* local_slots) {
  validate_dcp_slot_mapping_args(p, page_size, rank, n);
  for (int64_t i = 0; i < n; ++i)
    local_slots[i] = dcp_math::local_slot(global_slots[i], p.ranks, p.interleave, page_size, rank);
}

void validate_dcp_local_indices_args(const DcpPlacement& p, int rank, const int32_t* positions, int rows, int k,
                                     const TopkSlotMap& m, const int32_t* local_indices) {
  validate_dcp_placement(p);
  require_rank(p, rank);
  if (rows < 0 || k < 0) throw Error("dcp local indices: rows and k must be >= 0 (got " + str(rows) + ", " + str(k) + ")");
  if (int64_t(rows) * k == 0) return;
  if (!positions || !local_indices) throw Error("dcp local indices: positions and local_indices are required");
  if (!m.block_table) throw Error("dcp local indices: block_table is null");
  if (m.page_size < 1 || m.rows_per_request < 1 || m.pages < 0 || m.table_stride < m.pages || m.capacity < 1)
    throw Error("dcp local indices: block_table needs page_size >= 1, rows_per_request >= 1, table_stride >= pages >= 0 "
                "and capacity >= 1");
  if (m.requests < (int64_t(rows) + m.rows_per_request - 1) / m.rows_per_request)
    throw Error("dcp local indices: block_table has " + str(m.requests) + " requests, too few for " + str(rows) + " rows");
}

void dcp_local_indices_reference(const DcpPlacement& p, int rank, const int32_t* positions, int rows, int k,
                                 const TopkSlotMap& m, int32_t* local_indices) {
  validate_dcp_local_indices_args(p, rank, positions, rows, k, m, local_indices);
  const int64_t n = int64_t(rows) * k;
  for (int64_t i = 0; i < n; ++i)
    if (dcp_math::local_index(positions[i], i / k, p.ranks, p.interleave, rank, m) == -2)
      throw Error("dcp local indices: position " + str(positions[i]) + " of row " + str(i / k) +
                  " has no valid slot in block_table");
  for (int64_t i = 0; i < n; ++i)
    local_indices[i] = static_cast<int32_t>(dcp_math::local_index(positions[i], i / k, p.ranks, p.interleave, rank, m));
}

// ---- merge ----

void validate_dcp_merge_args(const DcpMergeArgs& a, const DcpMergeOutputs& out) {
  if (a.ranks < 1) throw Error("dcp merge: ranks must be >= 1 (got " + str(a.ranks) + ")");
  if (a.rows < 0) throw Error("dcp merge: rows must be >= 0 (got " + str(a.rows) + ")");
  if (a.heads < 0) throw Error("dcp merge: heads must be >= 0 (got " + str(a.heads) + ")");
  if (a.partial_type != DcpPartialType::f32 && a.partial_type != DcpPartialType::bf16)
    throw Error("dcp merge: partial_type is not f32 or bf16");
  if (out.out_type != DcpPartialType::f32 && out.out_type != DcpPartialType::bf16)
    throw Error("dcp merge: out_type is not f32 or bf16");
  if (int64_t(a.rows) * a.heads == 0) return;
  if (!a.partial_out) throw Error("dcp merge: partial_out is null");
  if (!a.partial_lse) throw Error("dcp merge: partial_lse is null");
  if (!out.out) throw Error("dcp merge: out is null");
  // The kernel moves 16 bytes (f32) or 8 bytes (bf16) per access.
  auto require_aligned = [](const void* ptr, DcpPartialType t, const char* name) {
    const uintptr_t need = t == DcpPartialType::f32 ? 16 : 8;
    if (reinterpret_cast<uintptr_t>(ptr) % need != 0)
      throw Error(std::string("dcp merge: ") + name + " is not aligned to " + str(int64_t(need)) + " bytes");
  };
  require_aligned(a.partial_out, a.partial_type, "partial_out");
  require_aligned(out.out, out.out_type, "out");
  if (reinterpret_cast<uintptr_t>(a.partial_lse) % 4 != 0) throw Error("dcp merge: partial_lse is not aligned to 4 bytes");
  if (reinterpret_cast<uintptr_t>(out.lse) % 4 != 0) throw Error("dcp merge: lse is not aligned to 4 bytes");
}

void dcp_merge_reference(const DcpMergeArgs& a, const DcpMergeOutputs& out) {
  validate_dcp_merge_args(a, out);
  const int64_t rh_count = int64_t(a.rows) * a.heads;
  const bool base2 = a.lse_base == LseBase::base2;
  auto partial = [&](int r, int64_t rh, int d) -> double {
    const int64_t i = (r * rh_count + rh) * kDcpLatentDim + d;
    return a.partial_type == DcpPartialType::f32 ? static_cast<const float*>(a.partial_out)[i]
                                                 : codec::bf16_decode(static_cast<const uint16_t*>(a.partial_out)[i]);
  };
  auto store = [&](int64_t rh, int d, float v) {
    const int64_t i = rh * kDcpLatentDim + d;
    if (out.out_type == DcpPartialType::f32)
      static_cast<float*>(out.out)[i] = v;
    else
      static_cast<uint16_t*>(out.out)[i] = codec::bf16_encode_rn(v);
  };
  std::vector<double> w(a.ranks);
  for (int64_t rh = 0; rh < rh_count; ++rh) {
    double m = -INFINITY;
    bool bad = false;  // a NaN or +inf LSE: the row's result is NaN
    for (int r = 0; r < a.ranks; ++r) {
      const float l = a.partial_lse[r * rh_count + rh];
      bad |= std::isnan(l) || l == INFINITY;
      m = std::max(m, double(l));
    }
    if (bad || m == -INFINITY) {
      const float fill = bad ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
      for (int d = 0; d < kDcpLatentDim; ++d) store(rh, d, fill);
      if (out.lse) out.lse[rh] = bad ? fill : kNegInf;
      continue;
    }
    double sum = 0.0;
    for (int r = 0; r < a.ranks; ++r) {
      const double l = a.partial_lse[r * rh_count + rh];
      w[r] = l == -INFINITY ? 0.0 : (base2 ? std::exp2(l - m) : std::exp(l - m));
      sum += w[r];
    }
    for (int d = 0; d < kDcpLatentDim; ++d) {
      double acc = 0.0;
      for (int r = 0; r < a.ranks; ++r)
        if (w[r] != 0.0) acc += w[r] * partial(r, rh, d);  // an empty rank's output is never read
      store(rh, d, static_cast<float>(acc / sum));
    }
    if (out.lse) out.lse[rh] = static_cast<float>(m + (base2 ? std::log2(sum) : std::log(sum)));
  }
}

// ---- selection ----

void validate_dcp_merge_topk_args(const DcpTopkMergeArgs& a, const TopkOutputs& out) {
  if (a.ranks < 1) throw Error("dcp top-k merge: ranks must be >= 1 (got " + str(a.ranks) + ")");
  if (a.rows < 0) throw Error("dcp top-k merge: rows must be >= 0 (got " + str(a.rows) + ")");
  if (a.k_rank < 1 || a.k_rank > kTopkMaxK)
    throw Error("dcp top-k merge: k_rank must be in 1.." + str(kTopkMaxK) + " (got " + str(a.k_rank) + ")");
  if (a.k < 1 || a.k > a.k_rank)
    throw Error("dcp top-k merge: k must be in 1..k_rank (" + str(a.k_rank) + ") (got " + str(a.k) + ")");
  if (a.rows > 0 && (!a.indices || !a.values || !a.topk_length))
    throw Error("dcp top-k merge: indices, values and topk_length are required");
  if (a.rows > 0 && (!out.indices || !out.topk_length))
    throw Error("dcp top-k merge: the indices and topk_length outputs are required");
}

namespace {
constexpr size_t kWorkspaceAlign = 256;
size_t align_up(size_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }
}  // namespace

DcpMergeTopkWorkspace dcp_merge_topk_workspace(const DcpTopkMergeArgs& a, const TopkPlan& plan) {
  const size_t rows = size_t(std::max(a.rows, 0));
  const size_t entries = rows * size_t(std::max(a.ranks, 0)) * size_t(std::max(a.k_rank, 0));
  DcpMergeTopkWorkspace w;
  w.positions_offset = align_up(entries * 4);
  w.lengths_offset = w.positions_offset + align_up(entries * 4);
  w.topk_offset = w.lengths_offset + align_up(rows * 4);
  w.total_bytes = w.topk_offset + topk_workspace_bytes(plan, a.rows);
  return w;
}

void dcp_merge_topk_reference(const DcpTopkMergeArgs& a, const TopkOutputs& out) {
  validate_dcp_merge_topk_args(a, out);
  // The candidates of each row, rank after rank, sorted by position: a list topk_reference takes
  // with positions (topk.h), whose top-k is the row's top-k because every entry of the global
  // top-k on a rank is among that rank's top k_rank >= k.
  const int64_t columns = int64_t(a.ranks) * a.k_rank;
  std::vector<float> values(size_t(a.rows) * columns, kNegInf);
  std::vector<int32_t> positions(size_t(a.rows) * columns, 0), lengths(a.rows, 0);
  std::vector<std::pair<int32_t, float>> row;
  for (int i = 0; i < a.rows; ++i) {
    row.clear();
    for (int r = 0; r < a.ranks; ++r) {
      const int64_t base = (int64_t(r) * a.rows + i) * a.k_rank;
      const int32_t len = a.topk_length[int64_t(r) * a.rows + i];
      if (len < 0 || len > a.k_rank)
        throw Error("dcp top-k merge: topk_length of rank " + str(r) + " row " + str(i) + " is " + str(len) +
                    ", outside 0..k_rank (" + str(a.k_rank) + ")");
      for (int32_t c = 0; c < len; ++c) {
        const int32_t pos = a.indices[base + c];
        if (pos < 0 || (c > 0 && pos <= a.indices[base + c - 1]))
          throw Error("dcp top-k merge: indices of rank " + str(r) + " row " + str(i) +
                      " are not non-negative and strictly increasing at entry " + str(c));
        row.emplace_back(pos, a.values[base + c]);
      }
    }
    std::sort(row.begin(), row.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    for (size_t c = 0; c < row.size(); ++c) {
      if (c > 0 && row[c].first == row[c - 1].first)
        throw Error("dcp top-k merge: position " + str(row[c].first) + " of row " + str(i) + " comes from two ranks");
      positions[size_t(i) * columns + c] = row[c].first;
      values[size_t(i) * columns + c] = row[c].second;
    }
    lengths[i] = static_cast<int32_t>(row.size());
  }
  TopkArgs t;
  t.values = values.data();
  t.rows = a.rows;
  t.columns = columns;
  t.stride = columns;
  t.lengths = lengths.data();
  t.positions = positions.data();
  t.k = a.k;
  topk_reference(t, out);
}

}  // namespace nvfp4mla
