// The GPU suites' output comparison (support/output_compare.h) on the CPU: outputs computed the
// way the decode kernels compute them (fp32 base-2 softmax per KV split, weights rounded to
// BF16, splits merged in fp32, BF16 output) stay within its bounds in every record format,
// while a uniform 2-3% scale error of the output, with a correct LSE, fails it. The bounds
// are the GPU suites' only defence against such an error; this is where their power is shown.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/sparse_mla.h"
#include "support/attention_oracle.h"
#include "support/attention_problem.h"
#include "support/output_compare.h"
#include "support/record_specs.h"

using namespace nvfp4mla;
namespace oracle = nvfp4mla::testing::oracle;

namespace {

enum class Normalize { rounded_sum_per_split, fp32_sum };

struct Emulated {
  std::vector<float> out_fp32;  // before the BF16 output rounding
  std::vector<float> lse;
};

// The kernels' arithmetic on the oracle's scores and values (K rounded to BF16 as theirs are):
// each split of `split_entries` positions takes weights 2^(s log2(e) - m) in fp32 against its
// maximum, rounded to BF16 for the output product, normalized by the sum of the rounded weights
// (the 32-, 64- and 128-head kernels) or of the fp32 ones (the 16-head NVFP4 kernel); splits
// merge with fp32 weights from their LSEs, their normalized outputs in fp32 or rounded to BF16
// (`bf16_partials`).
Emulated emulate_kernel(const nvfp4mla::testing::AttentionProblem& p, int split_entries, Normalize normalize,
                        bool bf16_partials = false) {
  const SparseMlaArgs a = p.host_args();
  const oracle::Result o = oracle::attention(p.spec, a, {.bf16_operands = true});
  const int splits = split_entries > 0 ? (p.topk + split_entries - 1) / split_entries : 1;
  const int span = split_entries > 0 ? split_entries : p.topk;
  Emulated e{std::vector<float>(static_cast<size_t>(p.rows) * p.heads * kLatentDim, 0.0f),
             std::vector<float>(static_cast<size_t>(p.rows) * p.heads)};
  std::vector<float> v(static_cast<size_t>(p.topk) * kQkDim);  // the row's values, BF16-rounded
  for (int r = 0; r < p.rows; ++r)
    for (int h = 0; h < p.heads; ++h) {
      if (h == 0)
        for (int j = 0; j < p.topk; ++j) {
          const int32_t slot = p.indices[static_cast<size_t>(r) * p.topk + j];
          if (slot < 0 || slot >= p.capacity) continue;
          float* k = &v[static_cast<size_t>(j) * kQkDim];
          oracle::read_k_row(p.spec, &p.cache[static_cast<size_t>(slot) * p.spec.record_bytes()], p.layer_scale, k);
          for (int d = 0; d < kLatentDim; ++d) k[d] = oracle::round_to_bf16(k[d]);
        }
      const size_t rh = static_cast<size_t>(r) * p.heads + h;
      std::vector<std::vector<float>> part(splits, std::vector<float>(kLatentDim, 0.0f));
      std::vector<float> part_lse2(splits, -INFINITY);
      for (int sp = 0; sp < splits; ++sp) {
        float m = -INFINITY;
        for (int j = sp * span; j < std::min(p.topk, (sp + 1) * span); ++j)
          m = std::max(m, static_cast<float>(o.scores[rh * p.topk + j] * M_LOG2E));
        if (m == -INFINITY) continue;
        float l = 0.0f, l_rounded = 0.0f;
        for (int j = sp * span; j < std::min(p.topk, (sp + 1) * span); ++j) {
          const double s = o.scores[rh * p.topk + j];
          if (std::isinf(s)) continue;
          const float w = std::exp2(static_cast<float>(s * M_LOG2E) - m);
          const float w16 = codec::bf16_decode(codec::bf16_encode_rn(w));
          l += w;
          l_rounded += w16;
          const float* vj = &v[static_cast<size_t>(j) * kQkDim];
          for (int d = 0; d < kLatentDim; ++d) part[sp][d] += w16 * vj[d];
        }
        const float inv = 1.0f / (normalize == Normalize::fp32_sum ? l : l_rounded);
        for (float& x : part[sp]) {
          x *= inv;
          if (bf16_partials) x = codec::bf16_decode(codec::bf16_encode_rn(x));
        }
        part_lse2[sp] = m + std::log2(l);
      }
      const float mm = *std::max_element(part_lse2.begin(), part_lse2.end());
      if (mm == -INFINITY) {
        e.lse[rh] = -INFINITY;
        continue;
      }
      float total = 0.0f;
      for (int sp = 0; sp < splits; ++sp) {
        const float w = part_lse2[sp] == -INFINITY ? 0.0f : std::exp2(part_lse2[sp] - mm);
        total += w;
        for (int d = 0; d < kLatentDim; ++d) e.out_fp32[rh * kLatentDim + d] += w * part[sp][d];
      }
      for (int d = 0; d < kLatentDim; ++d) e.out_fp32[rh * kLatentDim + d] /= total;
      e.lse[rh] = static_cast<float>((mm + std::log2(total)) * M_LN2);
    }
  return e;
}

// The emulated output times `scale`, rounded to BF16 as a kernel stores it.
std::vector<float> bf16_output(const Emulated& e, float scale) {
  std::vector<float> out(e.out_fp32.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = codec::bf16_decode(codec::bf16_encode_rn(scale * e.out_fp32[i]));
  return out;
}

}  // namespace

TEST(OutputCompare, KernelRoundingPassesAndAScaleErrorFails) {
  uint64_t seed = 4000;
  double worst_element = 0, worst_norm = 0;
  struct Kernel {
    int split_entries;
    Normalize normalize;
    bool bf16_partials = false;
  };
  // One split or splits of 64 entries normalized by their rounded sums, their partials in fp32 or
  // BF16; fp32 sums (no split dependence).
  const Kernel kernels[] = {{0, Normalize::rounded_sum_per_split},
                            {64, Normalize::rounded_sum_per_split},
                            {64, Normalize::rounded_sum_per_split, true},
                            {64, Normalize::fp32_sum}};
  for (const RecordSpec& spec : nvfp4mla::testing::kAllRecordSpecs) {
    const auto p = nvfp4mla::testing::make_problem(spec, 3, 8, 256, seed++);
    std::vector<float> ref_out(static_cast<size_t>(p.rows) * p.heads * kLatentDim), ref_lse(static_cast<size_t>(p.rows) * p.heads);
    sparse_mla_reference(spec, p.host_args(), ref_out.data(), ref_lse.data(), {.bf16_operands = true});
    for (const Kernel& k : kernels) {
      SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " split entries " + std::to_string(k.split_entries) +
                   (k.normalize == Normalize::fp32_sum ? " fp32 sums" : " rounded sums") +
                   (k.bf16_partials ? ", BF16 partials" : ""));
      const oracle::Result bounds = oracle::attention(
          spec, p.host_args(),
          {.bf16_operands = true, .bounds = true, .split_entries = k.split_entries, .bf16_partials = k.bf16_partials});
      const Emulated e = emulate_kernel(p, k.split_entries, k.normalize, k.bf16_partials);
      const auto ok = nvfp4mla::testing::compare_attention(bf16_output(e, 1.0f), ref_out, e.lse, ref_lse, bounds, p.heads,
                                                           {.cos_limit = 5e-6, .row_cos_limit = 5e-5});
      EXPECT_EQ(ok.failures, 0);
      worst_element = std::max(worst_element, ok.worst_element);
      worst_norm = std::max(worst_norm, ok.worst_norm);
      // The empty last row has no norm to scale; every other (row, head) must fail.
      const int64_t scaled_pairs = static_cast<int64_t>(p.rows - 1) * p.heads;
      for (float scale : {1.02f, 0.98f, 1.029f}) {
        const auto bad = nvfp4mla::testing::compare_attention(bf16_output(e, scale), ref_out, e.lse, ref_lse, bounds, p.heads,
                                                              {.cos_limit = 5e-6, .row_cos_limit = 5e-5}, 0);
        EXPECT_EQ(bad.norm_failures, scaled_pairs) << "scale " << scale;
      }
    }
  }
  // The element bound is at least 1.25x the first-order worst case (attention_oracle.h), so no
  // element may come closer than 0.8 of it; the norms stay well inside theirs. (On the device
  // the GPU suites print the same ratios.)
  std::printf("[bounds] emulated kernels, worst |error| / bound: element %.3f, norm %.3f\n", worst_element, worst_norm);
  EXPECT_LT(worst_element, 0.8);
  EXPECT_LT(worst_norm, 0.5);
}
