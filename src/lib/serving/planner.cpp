#include "nvfp4mla/serving/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "nvfp4mla/arch.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/error.h"

namespace nvfp4mla::serving {

namespace {
size_t align256(size_t n) { return (n + 255) / 256 * 256; }
}  // namespace

ArchSpec scratch_arch(const ScratchRequest& r) {
  return r.compute_capability > 0 ? arch_spec(r.compute_capability / 10, r.compute_capability % 10, r.sm_count)
                                  : planning_arch(r.sm_count);
}

ScratchPlan plan_scratch(const ScratchRequest& r) {
  if (r.num_heads <= 0 || r.dcp_world_size <= 0) throw Error("scratch plan: heads and DCP world size must be positive");
  if (r.max_num_seqs <= 0 || r.max_num_batched_tokens <= 0)
    throw Error("scratch plan: max_num_seqs and max_num_batched_tokens must be positive");
  if (r.topk <= 0) throw Error("scratch plan: topk must be positive");
  if (r.splits < 0 || r.sm_count <= 0) throw Error("scratch plan: splits must be >= 0 and the SM count positive");
  if (r.compute_capability < 0) throw Error("scratch plan: compute capability must be 0 (the planning device's) or 10 * major + minor");
  ScratchPlan p;
  p.q_per_request = decode_q_per_request(r.mode, r.spec.dtype, r.num_speculative_tokens);
  p.decode_rows = std::max<int64_t>(
      r.max_num_seqs, std::min<int64_t>(int64_t(r.max_num_seqs) * p.q_per_request, r.max_num_batched_tokens));
  p.heads = (r.num_heads * r.dcp_world_size + 7) / 8 * 8;
  p.partial_bytes = r.partials == PartialPrecision::fp32 ? 4 : 2;
  // Splits: fixed, or enough that decode_rows x splits covers the partials the decode planner
  // needs for any row count up to decode_rows (fewer rows get more splits).
  if (r.splits > 0) {
    p.splits = r.splits;
  } else {
    const ArchSpec arch = scratch_arch(r);
    int64_t worst_entries = 0;
    for (int64_t rows = 1; rows <= p.decode_rows; ++rows) {
      const DecodePlan d = plan_sparse_decode(r.spec, static_cast<int>(rows), p.heads, r.topk, arch);
      const int64_t entries = rows * (d.splits > 1 ? d.splits : 0);
      if (entries > worst_entries) {
        worst_entries = entries;
        p.splits = static_cast<int>((entries + p.decode_rows - 1) / p.decode_rows);
      }
    }
    p.splits = std::max(p.splits, 1);  // <= ceil(topk / 64): the decode planner's bound
  }
  const size_t rh = static_cast<size_t>(p.decode_rows) * p.heads;
  p.tmp_output_bytes = align256(rh * p.splits * kLatentDim * p.partial_bytes);
  p.tmp_lse_bytes = align256(rh * p.splits * 4);
  p.output_bytes = align256(rh * kLatentDim * 2);
  p.final_lse_bytes = align256(rh * 4);
  p.total_bytes = p.tmp_output_bytes + p.tmp_lse_bytes + p.output_bytes + p.final_lse_bytes;
  return p;
}

CapacityPlan plan_capacity(const CapacityRequest& r) {
  if (r.layers <= 0 || r.page_size <= 0 || r.indexer_bytes_per_token < 0)
    throw Error("capacity plan: layers and page size must be positive, indexer bytes not negative");
  auto gib = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  if (!(r.memory_gib > 0) || !std::isfinite(r.memory_gib))
    throw Error("capacity plan: the memory budget must be positive and finite, got " + gib(r.memory_gib) + " GiB");
  if (!(r.reserved_gib >= 0) || !std::isfinite(r.reserved_gib))
    throw Error("capacity plan: the reserved memory must be finite and not negative, got " + gib(r.reserved_gib) + " GiB");
  CapacityPlan p;
  p.bytes_per_token = int64_t(r.layers) * (int64_t(r.spec.record_bytes()) + r.indexer_bytes_per_token);
  const double usable = (r.memory_gib - r.reserved_gib) * 1073741824.0;
  if (usable <= 0) throw Error("capacity plan: the reserved memory exceeds the budget");
  int64_t page_bytes = 0;
  if (__builtin_mul_overflow(p.bytes_per_token, int64_t(r.page_size), &page_bytes))
    throw Error("capacity plan: a page of " + std::to_string(r.page_size) + " tokens does not fit in 64-bit byte counts");
  const double pages = std::floor(usable / static_cast<double>(page_bytes));
  // The tokens (pages x page size) must fit in int64; 2^63 is exact in a double.
  if (!(pages * static_cast<double>(r.page_size) < 0x1p63))
    throw Error("capacity plan: the token count of a " + gib(r.memory_gib) + " GiB budget does not fit in 64 bits");
  p.pages = static_cast<int64_t>(pages);
  p.tokens = p.pages * r.page_size;
  p.max_single_request_tokens = p.tokens;
  return p;
}

}  // namespace nvfp4mla::serving
