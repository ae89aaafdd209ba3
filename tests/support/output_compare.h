#pragma once
// Comparing attention outputs of a GPU kernel (out [rows, heads, 512] as BF16 widened to fp32,
// lse [rows, heads]) with the fp64 reference on the kernel's operands. Each check fails on its
// own:
//  - per element: |got - want| <= the oracle's element bound (attention_oracle.h: what BF16
//    softmax weights, fp32 scores and the BF16 output allow, 2^-8 (1.25 sum_j P_j |v_jd| +
//    |want_d|) plus the score-rounding term);
//  - per (row, head): | |got| - |want| | <= the oracle's norm bound (about 1.3-1.5% of |want| for
//    a softmax over many entries), so a uniform scale error of the output fails even where each
//    element's error hides below its bound;
//  - cosine difference per (row, head) <= row_cos_limit and over the whole output <= cos_limit
//    (FlashMLA's test: 5e-6 over the whole tensor);
//  - a row without valid entries gives exactly 0;
//  - LSE: |d| <= 1e-5 or <= 8/65536 |want| (FlashMLA's); -inf must stay -inf.
// Between two kernels, pass the sum of both kernels' bounds (each carries its own error).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/sparse_mla.h"
#include "support/attention_oracle.h"

namespace nvfp4mla::testing {

struct CompareLimits {
  double cos_limit = 5e-6;
  double row_cos_limit = 0.0;  // 0: cos_limit
};

struct Comparison {
  int64_t failures = 0;
  int64_t element_failures = 0, norm_failures = 0;  // of those: elements, (row, head) norms
  double worst_cos = 0.0;      // largest cosine difference of a (row, head)
  double worst_element = 0.0;  // largest |got - want| / element bound
  double worst_norm = 0.0;     // largest | |got| - |want| | / norm bound
};

// Entries per KV split of a decode plan, as attention_oracle.h's Options::split_entries wants it.
inline int plan_split_entries(const DecodePlan& plan) { return plan.splits > 1 ? plan.tiles_per_split * plan.tile_tokens : 0; }

// The oracle's options that bound a decode plan's output: K rounded to BF16 or not (`bf16_k`), the
// plan's KV splits and the precision of their partials.
inline oracle::Options plan_bound_options(const DecodePlan& plan, bool bf16_k) {
  return {.bf16_operands = bf16_k,
          .bounds = true,
          .split_entries = plan_split_entries(plan),
          .bf16_partials = plan.splits > 1 && plan.partial_bytes == 2};
}

// Compares; reports the first `max_reports` failures through ADD_FAILURE (0: silent).
inline Comparison compare_attention(const std::vector<float>& got_out, const std::vector<float>& want_out,
                                    const std::vector<float>& got_lse, const std::vector<float>& want_lse,
                                    const oracle::Result& bounds, int heads, const CompareLimits& limits = {},
                                    int max_reports = 5) {
  const double row_cos_limit = limits.row_cos_limit > 0.0 ? limits.row_cos_limit : limits.cos_limit;
  Comparison c;
  auto fail = [&]() { return c.failures++ < max_reports; };
  double all_dot = 0.0, all_got = 0.0, all_want = 0.0;
  const int rows_heads = static_cast<int>(want_lse.size());
  for (int rh = 0; rh < rows_heads; ++rh) {
    const int row = rh / heads, head = rh % heads;
    double dot = 0, n_got = 0, n_want = 0;
    for (int d = 0; d < kLatentDim; ++d) {
      const size_t i = static_cast<size_t>(rh) * kLatentDim + d;
      const double got = got_out[i], want = want_out[i];
      dot += got * want;
      n_got += got * got;
      n_want += want * want;
      const double bound = bounds.element_bound[i];
      const double err = std::fabs(got - want);
      c.worst_element = std::max(c.worst_element, err / bound);
      if (!(err <= bound) && (++c.element_failures, fail()))
        ADD_FAILURE() << "out row " << row << " head " << head << " dim " << d << ": got " << got << " want " << want
                      << " (bound " << bound << ")";
    }
    const double norm_err = std::fabs(std::sqrt(n_got) - std::sqrt(n_want));
    const double norm_bound = bounds.norm_bound[rh];
    c.worst_norm = std::max(c.worst_norm, norm_err / norm_bound);
    if (!(norm_err <= norm_bound) && (++c.norm_failures, fail()))
      ADD_FAILURE() << "row " << row << " head " << head << ": |out| " << std::sqrt(n_got) << ", want " << std::sqrt(n_want)
                    << " (relative error " << norm_err / std::sqrt(n_want) << ", bound " << norm_bound / std::sqrt(n_want)
                    << ")";
    if (n_want == 0) {
      if (n_got != 0 && fail()) ADD_FAILURE() << "row " << row << " head " << head << ": empty row must give 0";
    } else {
      const double cos_diff = n_got > 0 ? 1.0 - dot / std::sqrt(n_got * n_want) : 1.0;
      c.worst_cos = std::max(c.worst_cos, cos_diff);
      all_dot += dot;
      all_got += n_got;
      all_want += n_want;
      if (!(cos_diff <= row_cos_limit) && fail())
        ADD_FAILURE() << "row " << row << " head " << head << ": cosine difference " << cos_diff;
    }
    const float got = got_lse[rh], want = want_lse[rh];
    const bool ok = std::isinf(want) ? (std::isinf(got) && got < 0)
                                     : (std::fabs(got - want) <= 1e-5f || std::fabs(got - want) <= (8.0f / 65536.0f) * std::fabs(want));
    if (!ok && fail()) ADD_FAILURE() << "lse row " << row << " head " << head << ": got " << got << " want " << want;
  }
  if (all_want > 0) {
    const double cos_diff = all_got > 0 ? 1.0 - all_dot / std::sqrt(all_got * all_want) : 1.0;
    if (!(cos_diff <= limits.cos_limit) && fail()) ADD_FAILURE() << "whole output: cosine difference " << cos_diff;
  }
  return c;
}

// A decode-plan kernel's BF16 output and LSE against the fp64 reference on its operands, within the
// oracle's bounds: K rounded to BF16 where the plan's kernel does, its splits' partials (fp32 or
// BF16), and FlashMLA's cosine limit per (row, head) (10x looser for kernels with BF16 weights, all
// but the portable 16-head NVFP4 kernel, whose weights carry a BF16 remainder).
inline Comparison compare_plan_with_reference(const RecordSpec& spec, const SparseMlaArgs& host_args,
                                              const DecodePlan& plan, const std::vector<uint16_t>& out_bf16,
                                              const std::vector<float>& lse) {
  const size_t rows_heads = static_cast<size_t>(host_args.rows) * host_args.heads;
  std::vector<float> ref_out(rows_heads * kLatentDim), ref_lse(rows_heads);
  const bool bf16_k = decode_rounds_k_to_bf16(plan.kernel);
  sparse_mla_reference(spec, host_args, ref_out.data(), ref_lse.data(), {.bf16_operands = bf16_k});
  const auto bounds = oracle::attention(spec, host_args, plan_bound_options(plan, bf16_k));
  std::vector<float> got(out_bf16.size());
  for (size_t i = 0; i < got.size(); ++i) got[i] = codec::bf16_decode(out_bf16[i]);
  const double row_cos_limit = decode_weights_are_bf16(plan.kernel) ? 5e-5 : 5e-6;
  return compare_attention(got, ref_out, lse, ref_lse, bounds, host_args.heads, {.cos_limit = 5e-6, .row_cos_limit = row_cos_limit});
}

}  // namespace nvfp4mla::testing
