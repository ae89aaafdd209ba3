// Verifier-route qualification (issue 4): the same MTP verifier batches through the decode route
// (split-KV + merge, the planner's splits) and the extend route (one pass per row), for every
// format and scale mode, MTP widths 1..8, context positions up to 1,000,000, latent magnitudes
// 1e-4..1e2 and the boundary indices capacity - 1, capacity, -1, INT32_MIN, INT32_MAX in every
// row. Each route must match the fp64 reference on the same records, and the two routes each
// other, within the bounds of support/output_compare.h (elements and output norms within what
// BF16 softmax weights allow, LSE within FlashMLA's tolerance); the cosine bound is
// 1e-5, twice FlashMLA's 5e-6, because the kernels' BF16 probabilities are rounded against a
// running maximum the reference cannot reproduce (measured on the H200, 2026-11-29: the worst
// (row, head) over every batch was 5.39e-6, on the extend route, 128 heads, nvfp4-368 static;
// the worst per format and route is printed). A format whose batches all pass is
// decode-qualified (serving::decode_qualified, docs/ROUTING.md).
// Both suites run once per decode kernel the device supports (the test parameter): the decode
// route with the planner's splits, the extend route with one split per row (cuda::sparse_extend
// itself for the planner's kernel).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_support.h"
#include "lib/threads/parallel_for.h"
#include "nvfp4mla/arch.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/cache_write.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/cuda/sparse_extend.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/serving/route.h"
#include "nvfp4mla/sparse_mla.h"
#include "support/attention_oracle.h"
#include "support/output_compare.h"
#include "nvfp4mla/testing/random_tokens.h"
#include "support/record_specs.h"

using namespace nvfp4mla;
using nvfp4mla::testing::DeviceBuffer;

namespace {

constexpr int64_t kContextLimit = 1'000'000;

struct RouteOutputs {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};

struct BatchFailures {
  int64_t decode_vs_reference = 0, extend_vs_reference = 0, decode_vs_extend = 0;
  double worst_cos_decode = 0, worst_cos_extend = 0;  // against the reference
  double worst_element = 0, worst_norm = 0;           // largest |error| / bound of either route
};
constexpr double kCosLimit = 1e-5;
// Per (row, head), the cosine difference grows with the squared rounding errors: BF16 weights and
// the BF16 output, and with BF16 split partials (DecodePlan::partial_bytes 2, the planner's choice
// when the splits merge inside the launch) a third rounding of the same size. Such plans get twice
// the limit per (row, head); the whole output keeps kCosLimit.
double row_cos_limit(const DecodePlan& plan) { return plan.splits > 1 && plan.partial_bytes == 2 ? 2 * kCosLimit : kCosLimit; }

// Records of `n` random tokens with adversarial magnitudes (1e-4 to 1e2, channel outliers),
// generated and encoded in chunks of 4096 tokens spread over the hardware threads: one thread took
// most of the suite's time on the 16-core device machine for these up to 49,000 tokens a batch.
std::vector<uint8_t> random_records(const RecordSpec& spec, int64_t n, uint64_t seed, float layer_scale) {
  constexpr int64_t kChunk = 4096;
  const int rb = spec.record_bytes();
  std::vector<uint8_t> records(size_t(n) * rb);
  nvfp4mla::detail::parallel_for((n + kChunk - 1) / kChunk, nvfp4mla::detail::hardware_threads(), [&](int64_t c) {
    const int64_t first = c * kChunk, count = std::min(kChunk, n - first);
    const auto tokens = nvfp4mla::testing::random_tokens(count, seed + 1000003 * uint64_t(c), -4, 2);
    for (int64_t i = 0; i < count; ++i)
      record::encode(spec, reinterpret_cast<const Bf16Bits*>(&tokens.kv_c[i * kLatentDim]),
                     reinterpret_cast<const Bf16Bits*>(&tokens.k_pe[i * kRopeDim]), layer_scale,
                     &records[size_t(first + i) * rb]);
  });
  return records;
}

// Runs one verifier batch through both routes and the fp64 reference; counts the failures.
BatchFailures check_batch(const RecordSpec& spec, DecodeKernel kernel, int width, uint64_t seed, int heads = 64) {
  const int topk = 2048, requests = 3;
  const std::vector<int64_t> context = {kContextLimit - width - 1, 600'000 + int64_t(seed % 1000), 3000};
  const auto rows_info = serving::build_verifier_rows(context, width, topk);
  const int rows = requests * width;
  // Slot = position. Each row picks top-k positions below its causal length: the newest 64
  // and random older ones (duplicates allowed), then the boundary indices; unused entries
  // beyond topk_length stay -1.
  const int64_t capacity = kContextLimit + 16;
  const int32_t cap = static_cast<int32_t>(capacity);
  const int32_t boundary[5] = {cap - 1, cap, -1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  std::mt19937_64 rng(seed);
  std::vector<int32_t> idx(size_t(rows) * topk, -1);
  std::vector<int64_t> used;
  for (int r = 0; r < rows; ++r) {
    const int64_t causal = rows_info.causal_len[r];
    for (int k = 0; k < rows_info.topk_length[r]; ++k) {
      const int64_t pos = k < 64 ? causal - 1 - k : static_cast<int64_t>(rng() % causal);
      int32_t& entry = idx[size_t(r) * topk + k];
      entry = k >= 64 && k < 69 ? boundary[(r + k) % 5] : static_cast<int32_t>(pos);
      if (entry >= 0 && entry < capacity) used.push_back(entry);
    }
  }
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  const int rb = spec.record_bytes();
  const float layer_scale = 0.0123f;
  std::vector<uint8_t> records = random_records(spec, static_cast<int64_t>(used.size()), seed + 7, layer_scale);
  DeviceBuffer<uint8_t> cache(size_t(capacity + 1) * rb), staged(records);
  cache.fill_bytes(0xFF);  // NaN everywhere no record was written, and in the guard record past the end
  DeviceBuffer<int64_t> slots(used);
  cuda::scatter_records(rb, staged.get(), slots.get(), static_cast<int64_t>(used.size()), cache.get(), capacity, nullptr,
                        nullptr);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> q(size_t(rows) * heads * kQkDim);
  for (auto& v : q) v = codec::bf16_encode_rn(normal(rng));
  DeviceBuffer<uint16_t> dq(q);
  DeviceBuffer<int32_t> didx(idx), dlen(rows_info.topk_length);
  SparseMlaArgs a;
  a.q = dq.get();
  a.rows = rows;
  a.heads = heads;
  a.cache = cache.get();
  a.capacity = capacity;
  a.indices = didx.get();
  a.topk = topk;
  a.topk_length = dlen.get();
  a.sm_scale = 1.0f / 24.0f;
  a.layer_scale = layer_scale;
  auto run = [&](bool decode) {
    DeviceBuffer<uint16_t> out(size_t(rows) * heads * kLatentDim);
    DeviceBuffer<float> lse(size_t(rows) * heads);
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
    const ArchSpec arch = current_device_arch();
    if (decode || kernel != default_decode_kernel(arch, spec, heads)) {
      const auto plan = plan_sparse_decode(spec, rows, heads, topk, arch, decode ? 0 : 1, kernel);
      const auto ws_layout = decode_workspace_layout(plan, rows, heads);
      DeviceBuffer<uint8_t> ws(ws_layout.total_bytes);
      cuda::sparse_decode(spec, a, plan, ws.get(), ws.size(), out.get(), lse.get(), nullptr);
      if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("decode failed");
    } else {
      cuda::sparse_extend(spec, a, out.get(), lse.get(), nullptr);
      if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("extend failed");
    }
    return RouteOutputs{out.download(), lse.download()};
  };
  const RouteOutputs dec = run(true), ext = run(false);
  auto as_float = [](const std::vector<uint16_t>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = codec::bf16_decode(v[i]);
    return f;
  };
  // The fp64 reference on the kernels' operands, over a compact cache of the used records
  // (slot = rank of the position among the used ones) with its own NaN guard record; invalid
  // indices stay invalid in the same way (capacity becomes the compact capacity).
  const int64_t compact_capacity = static_cast<int64_t>(used.size());
  std::vector<int32_t> compact_idx(idx.size());
  for (size_t e = 0; e < idx.size(); ++e)
    compact_idx[e] = idx[e] >= 0 && idx[e] < capacity
                         ? static_cast<int32_t>(std::lower_bound(used.begin(), used.end(), idx[e]) - used.begin())
                         : idx[e] == cap ? static_cast<int32_t>(compact_capacity) : idx[e];
  records.resize(records.size() + rb, 0xFF);
  SparseMlaArgs h = a;
  h.q = q.data();
  h.cache = records.data();
  h.capacity = compact_capacity;
  h.indices = compact_idx.data();
  h.topk_length = rows_info.topk_length.data();
  std::vector<float> ref_out(size_t(rows) * heads * kLatentDim), ref_lse(size_t(rows) * heads);
  const auto plan = plan_sparse_decode(spec, rows, heads, topk, current_device_arch(), 0, kernel);
  const bool bf16_k = cuda::decode_rounds_k_to_bf16(spec, plan);
  sparse_mla_reference(spec, h, ref_out.data(), ref_lse.data(), {.bf16_operands = bf16_k});
  // Error bounds of each route (their KV splits differ) and of the difference of the two.
  namespace oracle = nvfp4mla::testing::oracle;
  const oracle::Result decode_bounds =
      oracle::attention(spec, h, nvfp4mla::testing::plan_bound_options(plan, bf16_k));
  const oracle::Result extend_bounds =
      plan.splits == 1 ? decode_bounds : oracle::attention(spec, h, {.bf16_operands = bf16_k, .bounds = true});
  oracle::Result both_bounds = decode_bounds;
  for (size_t i = 0; i < both_bounds.element_bound.size(); ++i) both_bounds.element_bound[i] += extend_bounds.element_bound[i];
  for (size_t i = 0; i < both_bounds.norm_bound.size(); ++i) both_bounds.norm_bound[i] += extend_bounds.norm_bound[i];
  using nvfp4mla::testing::compare_attention;
  const nvfp4mla::testing::CompareLimits limits{.cos_limit = kCosLimit};
  const nvfp4mla::testing::CompareLimits decode_limits{.cos_limit = kCosLimit, .row_cos_limit = row_cos_limit(plan)};
  BatchFailures f;
  auto note = [&](const nvfp4mla::testing::Comparison& c) {
    f.worst_element = std::max(f.worst_element, c.worst_element);
    f.worst_norm = std::max(f.worst_norm, c.worst_norm);
    return c;
  };
  {
    SCOPED_TRACE("decode route vs reference");
    const auto c = note(compare_attention(as_float(dec.out), ref_out, dec.lse, ref_lse, decode_bounds, heads, decode_limits));
    f.decode_vs_reference = c.failures;
    f.worst_cos_decode = c.worst_cos;
  }
  {
    SCOPED_TRACE("extend route vs reference");
    const auto c = note(compare_attention(as_float(ext.out), ref_out, ext.lse, ref_lse, extend_bounds, heads, limits));
    f.extend_vs_reference = c.failures;
    f.worst_cos_extend = c.worst_cos;
  }
  {
    SCOPED_TRACE("decode route vs extend route");
    // Each route is within angle a = acos(1 - c) of the reference, so the two are within 2a of
    // each other: 1 - cos(2a) ~ 4c for small c.
    const nvfp4mla::testing::CompareLimits pair_limits{.cos_limit = 4 * kCosLimit, .row_cos_limit = 4 * row_cos_limit(plan)};
    f.decode_vs_extend =
        compare_attention(as_float(dec.out), as_float(ext.out), dec.lse, ext.lse, both_bounds, heads, pair_limits).failures;
  }
  return f;
}

// Sums the failures of every batch of one format, prints the per-format record line.
void qualify(const RecordSpec& spec, DecodeKernel kernel, const std::vector<int>& widths, int heads, uint64_t& seed) {
  BatchFailures total;
  for (int width : widths) {
    SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " MTP width " + std::to_string(width) + " heads " + std::to_string(heads));
    const BatchFailures f = check_batch(spec, kernel, width, seed++, heads);
    total.decode_vs_reference += f.decode_vs_reference;
    total.extend_vs_reference += f.extend_vs_reference;
    total.decode_vs_extend += f.decode_vs_extend;
    total.worst_cos_decode = std::max(total.worst_cos_decode, f.worst_cos_decode);
    total.worst_cos_extend = std::max(total.worst_cos_extend, f.worst_cos_extend);
    total.worst_element = std::max(total.worst_element, f.worst_element);
    total.worst_norm = std::max(total.worst_norm, f.worst_norm);
  }
  // One line per format and head count for the qualification record in docs/ROUTING.md.
  std::printf(
      "[qualification] %s %s heads %d: failures decode-vs-reference %lld, extend-vs-reference %lld, decode-vs-extend %lld; "
      "worst cosine difference vs reference: decode %.2e, extend %.2e; worst |error| / bound: element %.3f, norm %.3f\n",
      to_string(kernel), nvfp4mla::testing::spec_name(spec).c_str(), heads, static_cast<long long>(total.decode_vs_reference),
      static_cast<long long>(total.extend_vs_reference), static_cast<long long>(total.decode_vs_extend),
      total.worst_cos_decode, total.worst_cos_extend, total.worst_element, total.worst_norm);
  EXPECT_EQ(total.decode_vs_reference + total.extend_vs_reference + total.decode_vs_extend, 0);
}

}  // namespace

class GpuVerifierQualification : public ::testing::TestWithParam<DecodeKernel> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    arch_ = current_device_arch();
  }
  // Qualifies every format the kernel runs with `heads`; false when it runs none.
  bool qualify_all(const std::vector<int>& widths, int heads, uint64_t& seed) {
    bool any = false;
    for (const auto& spec : nvfp4mla::testing::kAllRecordSpecs) {
      if (decode_kernel_unsupported(GetParam(), arch_, spec, heads)) continue;
      any = true;
      qualify(spec, GetParam(), widths, heads, seed);
    }
    return any;
  }
  ArchSpec arch_;
};

TEST_P(GpuVerifierQualification, RoutesMatchTheReferenceAndEachOther) {
  uint64_t seed = 1000;
  if (!qualify_all({1, 2, 3, 4, 5, 6, 7, 8}, 64, seed)) GTEST_SKIP() << to_string(GetParam()) << " does not run 64 heads here";
}

// The other kernel shapes a verifier batch can take: 16 heads (the portable kernel) and 128
// heads (on sm_90 the 2-CTA cluster kernel), at the narrowest, a middle and the widest MTP width.
TEST_P(GpuVerifierQualification, OtherHeadCounts) {
  uint64_t seed = 5000;
  bool any = false;
  for (int heads : {16, 128}) any = qualify_all({1, 4, 8}, heads, seed) || any;
  if (!any) GTEST_SKIP() << to_string(GetParam()) << " does not run 16 or 128 heads here";
}

INSTANTIATE_TEST_SUITE_P(Kernels, GpuVerifierQualification, ::testing::ValuesIn(all_decode_kernels()),
                         [](const ::testing::TestParamInfo<DecodeKernel>& info) { return std::string(to_string(info.param)); });
