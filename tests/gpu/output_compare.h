#pragma once
// Comparing attention outputs (out [rows, heads, 512], lse [rows, heads]) with FlashMLA's
// criteria. Cosine difference over the whole output <= cos_limit (FlashMLA's test: 5e-6, over
// the whole tensor), and per (row, head) <= row_cos_limit (default: the same 5e-6, stricter than
// FlashMLA; kernels with BF16 weights pass a looser one: a (row, head) whose softmax is carried
// by a few entries keeps their 2^-9 rounding, measured up to 5.7e-6 at 128 heads); an empty row
// must give exactly 0. Per element: |d| <= 1e-3 + 2/128 |want| + vmax/256, where vmax/256 bounds what
// BF16 probabilities (relative error 2^-9 per weight) can move a weighted mean of values of
// magnitude <= vmax (the row's largest |V|). LSE: |d| <= 1e-5 or <= 8/65536 |want|; -inf must
// stay -inf. Returns the number of failures (the first few are reported); `worst_cos`, when
// given, receives the largest cosine difference seen.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "nvfp4mla/format.h"

namespace nvfp4mla::testing {

inline int64_t compare_attention(const std::vector<float>& got_out, const std::vector<float>& want_out,
                                 const std::vector<float>& got_lse, const std::vector<float>& want_lse,
                                 const std::vector<float>& vmax_per_row, int heads, double cos_limit = 5e-6,
                                 double* worst_cos = nullptr, double row_cos_limit = 0.0) {
  if (row_cos_limit <= 0.0) row_cos_limit = cos_limit;
  int64_t bad = 0;
  double worst = 0.0, all_dot = 0.0, all_got = 0.0, all_want = 0.0;
  const int rows_heads = static_cast<int>(want_lse.size());
  for (int rh = 0; rh < rows_heads; ++rh) {
    const int row = rh / heads;
    double dot = 0, n_got = 0, n_want = 0;
    for (int d = 0; d < kLatentDim; ++d) {
      const size_t i = static_cast<size_t>(rh) * kLatentDim + d;
      const double got = got_out[i], want = want_out[i];
      dot += got * want;
      n_got += got * got;
      n_want += want * want;
      if (!(std::fabs(got - want) <= 1e-3 + (2.0 / 128.0) * std::fabs(want) + vmax_per_row[row] / 256.0) && bad++ < 5)
        ADD_FAILURE() << "out row " << row << " head " << rh % heads << " dim " << d << ": got " << got << " want " << want;
    }
    if (n_want == 0) {
      if (n_got != 0 && bad++ < 5) ADD_FAILURE() << "row " << row << " head " << rh % heads << ": empty row must give 0";
    } else {
      const double cos_diff = n_got > 0 ? 1.0 - dot / std::sqrt(n_got * n_want) : 1.0;
      worst = std::max(worst, cos_diff);
      all_dot += dot;
      all_got += n_got;
      all_want += n_want;
      if (!(cos_diff <= row_cos_limit) && bad++ < 5)
        ADD_FAILURE() << "row " << row << " head " << rh % heads << ": cosine difference " << cos_diff;
    }
    const float got = got_lse[rh], want = want_lse[rh];
    const bool ok = std::isinf(want) ? (std::isinf(got) && got < 0)
                                     : (std::fabs(got - want) <= 1e-5f || std::fabs(got - want) <= (8.0f / 65536.0f) * std::fabs(want));
    if (!ok && bad++ < 10) ADD_FAILURE() << "lse row " << row << " head " << rh % heads << ": got " << got << " want " << want;
  }
  if (all_want > 0) {
    const double cos_diff = all_got > 0 ? 1.0 - all_dot / std::sqrt(all_got * all_want) : 1.0;
    if (!(cos_diff <= cos_limit) && bad++ < 10) ADD_FAILURE() << "whole output: cosine difference " << cos_diff;
  }
  if (worst_cos) *worst_cos = worst;
  return bad;
}

}  // namespace nvfp4mla::testing
