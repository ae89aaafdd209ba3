#pragma once
// DCP test data shared by the CPU and GPU suites: gathered partial attention (random and
// adversarial) and the tolerance check of a merge against the fp64 reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <cstring>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/dcp.h"
#include "nvfp4mla/topk.h"
#include "support/topk_data.h"

namespace nvfp4mla::testing {

enum class MergeData {
  random,       // LSEs within a few units, some ranks empty
  wide,         // LSE spreads to 200 (weights underflow), LSEs near +-1e4
  mostly_empty  // most ranks empty, every third (row, head) empty on all ranks
};

struct MergeProblem {
  int ranks = 0, rows = 0, heads = 0;
  DcpPartialType type = DcpPartialType::f32;
  LseBase base = LseBase::natural;
  std::vector<float> out_f32;      // [ranks, rows, heads, 512] when type is f32
  std::vector<uint16_t> out_bf16;  // ... when bf16
  std::vector<float> lse;          // [ranks, rows, heads]

  int64_t row_heads() const { return int64_t(rows) * heads; }
  DcpMergeArgs args() const {
    DcpMergeArgs a;
    a.ranks = ranks;
    a.rows = rows;
    a.heads = heads;
    a.partial_type = type;
    a.partial_out = type == DcpPartialType::f32 ? static_cast<const void*>(out_f32.data()) : out_bf16.data();
    a.partial_lse = lse.data();
    a.lse_base = base;
    return a;
  }
  double partial(int r, int64_t rh, int d) const {
    const size_t i = (size_t(r) * row_heads() + rh) * kDcpLatentDim + d;
    return type == DcpPartialType::f32 ? out_f32[i] : codec::bf16_decode(out_bf16[i]);
  }
};

// Partials of empty ranks (LSE -inf) are NaN: a merge that reads them, or multiplies them by a
// zero weight, gives NaN.
inline MergeProblem make_merge_problem(int ranks, int rows, int heads, DcpPartialType type, LseBase base, MergeData kind,
                                       uint64_t seed) {
  MergeProblem p;
  p.ranks = ranks;
  p.rows = rows;
  p.heads = heads;
  p.type = type;
  p.base = base;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const int64_t rh_count = p.row_heads();
  p.lse.resize(size_t(ranks) * rh_count);
  for (int64_t rh = 0; rh < rh_count; ++rh) {
    const float center = kind == MergeData::wide ? (u(rng) - 0.5f) * 2e4f : normal(rng) * 3.0f;
    for (int r = 0; r < ranks; ++r) {
      float l = center + (kind == MergeData::wide ? (u(rng) - 0.5f) * 200.0f : normal(rng) * 2.0f);
      const float empty_p = kind == MergeData::mostly_empty ? 0.7f : 0.15f;
      if (u(rng) < empty_p || (kind == MergeData::mostly_empty && rh % 3 == 0)) l = -std::numeric_limits<float>::infinity();
      p.lse[size_t(r) * rh_count + rh] = l;
    }
  }
  const size_t n = size_t(ranks) * rh_count * kDcpLatentDim;
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t r_rh = i / kDcpLatentDim;
    values[i] = std::isinf(p.lse[r_rh]) ? std::numeric_limits<float>::quiet_NaN() : normal(rng) * (1.0f + 4.0f * u(rng));
  }
  if (type == DcpPartialType::f32) {
    p.out_f32 = std::move(values);
  } else {
    p.out_bf16.resize(n);
    for (size_t i = 0; i < n; ++i) p.out_bf16[i] = codec::bf16_encode_rn(values[i]);
  }
  return p;
}

// Mismatches of a merge result (out as floats, lse) against the fp64 reference's (ref_out,
// ref_lse): NaN and -inf LSEs exactly, empty rows exactly 0, others within the fp32 error of the
// weighted sum (relative to sum_r w_r |out_r| / sum_r w_r) plus two BF16 roundings (ours and the
// reference's) when `out_bf16`. `first` gets the first mismatch.
inline int64_t merge_mismatches(const MergeProblem& p, const std::vector<float>& out, const std::vector<float>& lse,
                                const std::vector<float>& ref_out, const std::vector<float>& ref_lse, bool out_bf16,
                                std::string& first) {
  const int64_t rh_count = p.row_heads();
  const bool base2 = p.base == LseBase::base2;
  int64_t bad = 0;
  auto mismatch = [&](int64_t rh, int d, double got, double want, double tol) {
    if (bad++ == 0)
      first = "row-head " + std::to_string(rh) + (d < 0 ? " lse " : " dim " + std::to_string(d) + " ") + std::to_string(got) +
              ", reference " + std::to_string(want) + ", tolerance " + std::to_string(tol);
  };
  for (int64_t rh = 0; rh < rh_count; ++rh) {
    const float rl = ref_lse[rh], gl = lse[rh];
    if (std::isnan(rl) || std::isinf(rl)) {
      if (!(std::isnan(rl) ? std::isnan(gl) : gl == rl)) mismatch(rh, -1, gl, rl, 0);
    } else if (!(std::fabs(gl - rl) <= 0x1p-18 * (1.0 + std::fabs(rl)))) {
      mismatch(rh, -1, gl, rl, 0x1p-18 * (1.0 + std::fabs(rl)));
    }
    double m = -INFINITY;
    for (int r = 0; r < p.ranks; ++r) m = std::max(m, double(p.lse[size_t(r) * rh_count + rh]));
    for (int d = 0; d < kDcpLatentDim; ++d) {
      const size_t i = size_t(rh) * kDcpLatentDim + d;
      const float g = out[i], want = ref_out[i];
      if (std::isnan(want) || std::isinf(rl)) {
        if (std::isnan(want) ? !std::isnan(g) : std::memcmp(&g, &want, 4) != 0) mismatch(rh, d, g, want, 0);
        continue;
      }
      double num = 0.0, den = 0.0;
      for (int r = 0; r < p.ranks; ++r) {
        const double l = p.lse[size_t(r) * rh_count + rh];
        if (l == -INFINITY) continue;
        const double w = base2 ? std::exp2(l - m) : std::exp(l - m);
        num += w * std::fabs(p.partial(r, rh, d));
        den += w;
      }
      const double tol = p.ranks * 0x1p-18 * (num / den) + (out_bf16 ? 0x1p-6 * std::fabs(want) : 0.0);
      if (!(std::fabs(double(g) - want) <= tol)) mismatch(rh, d, g, want, tol);
    }
  }
  return bad;
}

// Twelve 3000-entry rows for the DCP selection tests: every adversarial row kind (ties, NaN,
// -inf/+inf, signed zeros, few selectable), a row of six distinct values, a random row; lengths
// from 0 to 3000, some shorter than one rank's first block.
inline TopkProblem dcp_selection_rows(uint64_t seed) {
  constexpr int64_t kColumns = 3000;
  TopkProblem prob(12, kColumns, kColumns + 3);
  int row = 0;
  for (RowKind kind : kAllRowKinds) {
    fill_row(prob.row(row), kColumns, kind, seed + row);
    ++row;
  }
  fill_random(prob.row(row++), kColumns, seed + 77, 6);
  fill_random(prob.row(row++), kColumns, seed + 78);
  prob.lengths = {3000, 2999, 0, 1, 17, 63, 64, 65, 1000, 2048, 2500, 129};
  return prob;
}

// The DCP selection's gathered candidates for a problem's rows: each rank takes the top-k_rank
// (topk_reference) of the entries it holds by the placement (row r has lengths[r] entries), with
// their global positions; [ranks, rows, k_rank].
struct DcpCandidates {
  int ranks = 0, rows = 0, k_rank = 0;
  std::vector<int32_t> indices, topk_length;
  std::vector<float> values;

  DcpCandidates(const TopkProblem& prob, const DcpPlacement& place, int k)
      : ranks(place.ranks), rows(prob.rows), k_rank(k), indices(size_t(ranks) * rows * k), topk_length(size_t(ranks) * rows),
        values(indices.size()) {
    for (int r = 0; r < ranks; ++r) {
      const int64_t cols = dcp_local_length(place, r, prob.columns);
      std::vector<float> local(size_t(rows) * std::max<int64_t>(cols, 1));
      std::vector<int32_t> positions(local.size()), lengths(rows);
      dcp_global_positions(place, r, positions.data(), cols);
      for (int i = 0; i < rows; ++i) {
        for (int64_t c = 0; c < cols; ++c) local[i * cols + c] = prob.values[i * prob.stride + positions[c]];
        if (i > 0) std::copy(positions.begin(), positions.begin() + cols, positions.begin() + i * cols);
        lengths[i] = static_cast<int32_t>(dcp_local_length(place, r, prob.lengths.empty() ? prob.columns : prob.lengths[i]));
      }
      TopkArgs a;
      a.values = local.data();
      a.rows = rows;
      a.columns = cols;
      a.stride = std::max<int64_t>(cols, 1);
      a.lengths = lengths.data();
      a.positions = positions.data();
      a.k = k_rank;
      const size_t at = size_t(r) * rows * k_rank;
      topk_reference(a, {indices.data() + at, topk_length.data() + size_t(r) * rows, values.data() + at});
    }
  }
  DcpTopkMergeArgs args(int k) const {
    DcpTopkMergeArgs m;
    m.ranks = ranks;
    m.rows = rows;
    m.k_rank = k_rank;
    m.indices = indices.data();
    m.values = values.data();
    m.topk_length = topk_length.data();
    m.k = k;
    return m;
  }
};

}  // namespace nvfp4mla::testing
