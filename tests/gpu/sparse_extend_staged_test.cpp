// The staged extend (cuda/sparse_extend.h): staging against its CPU reference bit for bit (every
// record format, NaN-poisoned unattended slots, invalid indices of every kind, duplicates,
// lengths, an empty row), then attention over the staged records against the direct extend: bit
// for bit where both run the same 64-entry kernel (the same BF16 K operands, the same MMAs in the
// same order), else against the CPU reference within the decode suites' bounds. Outputs are poisoned
// first, so every element must be written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/arch.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/sparse_extend.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/error.h"
#include "support/attention_problem.h"
#include "support/output_compare.h"
#include "support/record_specs.h"

using namespace nvfp4mla;
using nvfp4mla::testing::AttentionProblem;
using nvfp4mla::testing::DeviceBuffer;
using nvfp4mla::testing::make_problem;
using nvfp4mla::testing::ProblemOptions;

namespace {

const auto& kAllSpecs = nvfp4mla::testing::kAllRecordSpecs;

// The problem's arrays on the device.
struct DeviceProblem {
  DeviceBuffer<uint16_t> q;
  DeviceBuffer<uint8_t> cache;
  DeviceBuffer<int32_t> indices, lengths;
  explicit DeviceProblem(const AttentionProblem& p) : q(p.q), cache(p.cache), indices(p.indices), lengths(p.topk_length) {}
  SparseMlaArgs args(const AttentionProblem& p) const {
    SparseMlaArgs a = p.host_args();
    a.q = q.get();
    a.cache = cache.get();
    a.indices = indices.get();
    a.topk_length = p.topk_length.empty() ? nullptr : lengths.get();
    return a;
  }
};

struct Outputs {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};

// Runs the staged extend (with `plan`, else its own; or the direct one) with poisoned outputs and a
// poisoned workspace.
Outputs run_extend(const AttentionProblem& p, bool staged, const cuda::ExtendStagedPlan* plan = nullptr) {
  DeviceProblem d(p);
  const SparseMlaArgs a = d.args(p);
  DeviceBuffer<uint16_t> out(size_t(p.rows) * p.heads * kLatentDim);
  DeviceBuffer<float> lse(size_t(p.rows) * p.heads);
  out.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  DeviceBuffer<uint8_t> ws(staged ? cuda::extend_staging_layout(p.capacity, p.rows, p.topk).total_bytes : 0);
  ws.fill_bytes(0xFF);
  if (staged && plan) cuda::sparse_extend_staged(p.spec, a, *plan, ws.get(), ws.size(), out.get(), lse.get(), nullptr);
  else if (staged) cuda::sparse_extend_staged(p.spec, a, ws.get(), ws.size(), out.get(), lse.get(), nullptr);
  else cuda::sparse_extend(p.spec, a, out.get(), lse.get(), nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("extend failed");
  return {out.download(), lse.download()};
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// Rows [r0, r0 + n) of an output.
template <class T>
std::vector<T> rows_of(const std::vector<T>& v, int rows, int r0, int n) {
  const size_t per_row = v.size() / rows;
  return {v.begin() + r0 * per_row, v.begin() + (r0 + n) * per_row};
}

}  // namespace

// Both ways of staging: the attended slots only (rows x topk below the capacity) and every slot.
TEST(GpuRecordStaging, MatchesTheReferenceBitForBit) {
  NVFP4MLA_REQUIRE_GPU();
  ProblemOptions opt;
  opt.lengths = true;
  uint64_t seed = 900;
  int modes[2] = {0, 0};
  constexpr size_t kBytes = layout::bf16::kRecordBytes;
  for (const auto& spec : kAllSpecs)
    for (int topk : {64, 333, 512}) {
      SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " topk " + std::to_string(topk));
      const auto p = make_problem(spec, 6, 1, topk, seed++, opt);
      const auto ref = stage_records_reference(spec, p.host_args());
      DeviceProblem d(p);
      const auto layout = cuda::extend_staging_layout(p.capacity, p.rows, p.topk);
      ASSERT_EQ(layout.every_slot, p.capacity <= int64_t(p.rows) * p.topk);
      ++modes[layout.every_slot];
      DeviceBuffer<uint8_t> ws(layout.total_bytes);
      ws.fill_bytes(0xFF);
      const auto s = cuda::stage_records(spec, d.args(p), ws.get(), ws.size(), nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      ASSERT_EQ(s.every_slot, layout.every_slot);
      std::vector<uint8_t> records(size_t(s.record_capacity) * kBytes);
      std::vector<int32_t> indices(ref.indices.size());
      CUDA_OK(cudaMemcpy(records.data(), s.records, records.size(), cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(indices.data(), s.indices, indices.size() * 4, cudaMemcpyDeviceToHost));
      if (s.every_slot) {
        // The caller's indices, unchanged; each attended slot's record at the slot itself.
        EXPECT_EQ(s.indices, d.indices.get());
        EXPECT_EQ(s.count, nullptr);
        const SparseMlaArgs a = p.host_args();
        for (int r = 0; r < p.rows; ++r)
          for (int k = 0; k < p.topk; ++k) {
            if (!sparse_entry_valid(a, r, k)) continue;
            const size_t e = size_t(r) * p.topk + k;
            ASSERT_EQ(std::memcmp(&records[size_t(indices[e]) * kBytes], &ref.records[size_t(ref.indices[e]) * kBytes], kBytes), 0)
                << "row " << r << " entry " << k;
          }
        continue;
      }
      int32_t count = -1;
      CUDA_OK(cudaMemcpy(&count, s.count, 4, cudaMemcpyDeviceToHost));
      ASSERT_EQ(count, ref.count);
      EXPECT_EQ(indices, ref.indices);
      records.resize(ref.records.size());
      EXPECT_EQ(records, ref.records);
    }
  EXPECT_GT(modes[0], 0);
  EXPECT_GT(modes[1], 0);
}

TEST(GpuSparseExtendStaged, SameResultsAsTheDirectExtend) {
  NVFP4MLA_REQUIRE_GPU();
  const ArchSpec arch = current_device_arch();
  ProblemOptions opt;
  opt.lengths = true;
  uint64_t seed = 950;
  int bit_exact = 0;
  for (const auto& spec : kAllSpecs)
    for (int heads : {16, 64, 128})
      for (int topk : {320, 512}) {  // attended slots staged, every slot staged
        SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " heads " + std::to_string(heads) + " topk " + std::to_string(topk));
        const auto p = make_problem(spec, 5, heads, topk, seed++, opt);
        const Outputs staged = run_extend(p, true), direct = run_extend(p, false);
        const DecodePlan staged_plan = cuda::plan_extend_staged(p.rows, heads, p.topk, arch).walk;
        const DecodePlan direct_plan = plan_sparse_decode(spec, p.rows, heads, p.topk, arch, 1);
        const bool wide = staged_plan.kernel == DecodeKernel::sm90_ws_wide || staged_plan.kernel == DecodeKernel::sm90_ws_pair_wide;
        if (wide && direct_plan.kernel == staged_plan.kernel) {
          ++bit_exact;
          EXPECT_EQ(staged.out, direct.out);
          for (size_t i = 0; i < staged.lse.size(); ++i) ASSERT_TRUE(same_bits(staged.lse[i], direct.lse[i])) << i;
          continue;
        }
        // Other kernels: the staged run against the CPU reference on its kernel's operands.
        EXPECT_EQ(nvfp4mla::testing::compare_plan_with_reference(spec, p.host_args(), staged_plan, staged.out, staged.lse).failures, 0);
      }
  // At least the six NVFP4 and FP8 formats at 64 heads, both ways of staging, are compared bit for bit.
  if (arch.wgmma) EXPECT_GE(bit_exact, 12);
}

// The staged plan's CTAs walk the rows (DecodePlan::row_ctas, sm_90a), each taking several here;
// at 64 heads the outputs equal the direct extend's (the same 64-entry kernel, one CTA per row)
// bit for bit. Both head counts within the reference's bounds for NVFP4 records.
TEST(GpuSparseExtendStaged, RowsWalkedByEachCta) {
  NVFP4MLA_REQUIRE_GPU();
  const ArchSpec arch = current_device_arch();
  ProblemOptions opt;
  opt.lengths = true;
  const int rows = 2 * arch.sm_count + 7;
  for (int heads : {64, 128}) {
    SCOPED_TRACE("heads " + std::to_string(heads));
    const auto p = make_problem(kAllSpecs[6], rows, heads, 128, 960 + heads, opt);
    const cuda::ExtendStagedPlan plan = cuda::plan_extend_staged(p.rows, heads, p.topk, arch);
    EXPECT_EQ(plan.tail_rows, 0);  // 128 entries: a split launch costs more than the row it saves
    const DecodePlan& staged_plan = plan.walk;
    if (arch.wgmma) {
      ASSERT_EQ(staged_plan.kernel, DecodeKernel::sm90_ws_wide);
      EXPECT_EQ(staged_plan.row_ctas, arch.sm_count / staged_plan.num_head_groups);
      EXPECT_LT(staged_plan.ctas(rows), int64_t(rows) * staged_plan.num_head_groups);
    }
    const Outputs staged = run_extend(p, true);
    const DecodePlan direct_plan = plan_sparse_decode(p.spec, p.rows, heads, p.topk, arch, 1);
    if (heads == 64 && direct_plan.kernel == staged_plan.kernel) EXPECT_EQ(staged.out, run_extend(p, false).out);
    EXPECT_EQ(nvfp4mla::testing::compare_plan_with_reference(p.spec, p.host_args(), staged_plan, staged.out, staged.lse).failures, 0);
  }
}

// Where the plan runs the rows the walking CTAs leave over as a split launch (host only: no device).
TEST(GpuSparseExtendStaged, PlansASplitTailWhereItSavesARow) {
  const ArchSpec h100 = arch_spec(9, 0, 132);
  for (int heads : {64, 128}) {
    SCOPED_TRACE("heads " + std::to_string(heads));
    const int ctas = heads == 64 ? 132 : 66;
    const cuda::ExtendStagedPlan s = cuda::plan_extend_staged(4096, heads, 2048, h100);
    ASSERT_EQ(s.walk.row_ctas, ctas);
    EXPECT_EQ(s.walk_rows, 4096 - 4096 % ctas);
    EXPECT_EQ(s.tail_rows, 4096 % ctas);
    EXPECT_GT(s.tail.splits, 1);
    EXPECT_EQ(s.tail.partial_bytes, 4);
    EXPECT_EQ(s.tail.row_ctas, 0);
    EXPECT_LE(s.tail.ctas(s.tail_rows), int64_t(h100.sm_count) * s.tail.ctas_per_sm);  // one wave
    // No tail: rows that divide, fewer rows than CTAs, short rows, and a remainder near a wave.
    for (const auto& [rows, topk] : std::vector<std::pair<int, int>>{{31 * ctas, 2048}, {ctas - 5, 2048}, {4096, 128}, {2 * ctas - 2, 2048}}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " topk " + std::to_string(topk));
      const cuda::ExtendStagedPlan n = cuda::plan_extend_staged(rows, heads, topk, h100);
      EXPECT_EQ(n.tail_rows, 0);
      EXPECT_EQ(n.walk_rows, rows);
      EXPECT_EQ(n.walk.row_ctas, std::min(rows, ctas));
    }
  }
  // Before sm_90a nothing walks and nothing is split off.
  const cuda::ExtendStagedPlan a100 = cuda::plan_extend_staged(4096, 64, 2048, arch_spec(8, 0, 108));
  EXPECT_EQ(a100.walk.row_ctas, 0);
  EXPECT_EQ(a100.tail_rows, 0);
  EXPECT_EQ(a100.walk_rows, 4096);
}

// A plan made for fewer SMs gives a small problem a tail: its rows run first as splits, their
// partials in the walked rows' (poisoned) outputs, which the walk then writes. Walked rows equal
// the direct extend's bit for bit at 64 heads; every row within its own plan's bounds.
TEST(GpuSparseExtendStaged, TailRowsRunFirstAsSplits) {
  NVFP4MLA_REQUIRE_GPU();
  const ArchSpec arch = current_device_arch();
  if (!arch.wgmma) GTEST_SKIP() << "rows are walked on sm_90a only";
  ProblemOptions opt;
  opt.lengths = true;
  for (const auto& [heads, sms, rows] : std::vector<std::tuple<int, int, int>>{{64, 4, 13}, {128, 8, 13}}) {
    SCOPED_TRACE("heads " + std::to_string(heads));
    ArchSpec fewer = arch;
    fewer.sm_count = sms;
    const auto p = make_problem(kAllSpecs[6], rows, heads, 2048, 970 + heads, opt);
    const cuda::ExtendStagedPlan plan = cuda::plan_extend_staged(rows, heads, p.topk, fewer);
    ASSERT_EQ(plan.tail_rows, 1);
    ASSERT_EQ(plan.walk_rows, rows - 1);
    ASSERT_GT(plan.tail.splits, 1);
    const Outputs staged = run_extend(p, true, &plan);
    const SparseMlaArgs host = p.host_args();
    for (const auto& [r0, n, part] : std::vector<std::tuple<int, int, const DecodePlan*>>{{0, plan.walk_rows, &plan.walk},
                                                                                          {plan.walk_rows, 1, &plan.tail}}) {
      SCOPED_TRACE("rows from " + std::to_string(r0));
      EXPECT_EQ(nvfp4mla::testing::compare_plan_with_reference(p.spec, sparse_mla_rows(host, r0, n), *part,
                                                               rows_of(staged.out, rows, r0, n), rows_of(staged.lse, rows, r0, n))
                    .failures,
                0);
    }
    if (heads == 64)
      EXPECT_EQ(rows_of(staged.out, rows, 0, plan.walk_rows), rows_of(run_extend(p, false).out, rows, 0, plan.walk_rows));
  }
  // A plan whose rows do not add up, or whose tail's partials do not fit the walked rows' outputs.
  const auto p = make_problem(kAllSpecs[6], 3, 64, 2048, 975, opt);
  cuda::ExtendStagedPlan bad = cuda::plan_extend_staged(p.rows, p.heads, p.topk, arch);
  bad.walk_rows += 1;
  EXPECT_THROW(run_extend(p, true, &bad), Error);
  ArchSpec one = arch;
  one.sm_count = 1;
  bad = cuda::plan_extend_staged(3, 64, p.topk, one);  // walks 3 rows on one CTA: no tail
  ASSERT_EQ(bad.tail_rows, 0);
  bad.tail = plan_sparse_decode(kSpecBf16, 2, 64, p.topk, arch, 32);
  bad.tail.partial_bytes = 4;
  bad.walk_rows = 1;
  bad.tail_rows = 2;
  EXPECT_THROW(run_extend(p, true, &bad), Error);
}

TEST(GpuSparseExtendStaged, NothingAttendedAndNoRows) {
  NVFP4MLA_REQUIRE_GPU();
  auto p = make_problem(kAllSpecs[6], 3, 64, 128, 12);
  std::fill(p.indices.begin(), p.indices.end(), -1);
  const Outputs o = run_extend(p, true);
  for (uint16_t v : o.out) ASSERT_EQ(v, 0);
  for (float l : o.lse) ASSERT_TRUE(std::isinf(l) && l < 0);
  p.rows = 0;
  DeviceProblem d(p);
  EXPECT_NO_THROW(cuda::sparse_extend_staged(p.spec, d.args(p), nullptr, 0, nullptr, nullptr, nullptr));
}

TEST(GpuSparseExtendStaged, RejectsAShortOrMisalignedWorkspace) {
  NVFP4MLA_REQUIRE_GPU();
  const auto p = make_problem(kAllSpecs[6], 2, 64, 128, 13);
  DeviceProblem d(p);
  const SparseMlaArgs a = d.args(p);
  DeviceBuffer<uint16_t> out(size_t(p.rows) * p.heads * kLatentDim);
  DeviceBuffer<float> lse(size_t(p.rows) * p.heads);
  const size_t need = cuda::extend_staging_layout(p.capacity, p.rows, p.topk).total_bytes;
  DeviceBuffer<uint8_t> ws(need + 256);
  EXPECT_THROW(cuda::sparse_extend_staged(p.spec, a, ws.get(), need - 1, out.get(), lse.get(), nullptr), Error);
  EXPECT_THROW(cuda::sparse_extend_staged(p.spec, a, nullptr, need, out.get(), lse.get(), nullptr), Error);
  EXPECT_THROW(cuda::sparse_extend_staged(p.spec, a, ws.get() + 16, need, out.get(), lse.get(), nullptr), Error);
  EXPECT_NO_THROW(cuda::sparse_extend_staged(p.spec, a, ws.get(), need, out.get(), lse.get(), nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_THROW(cuda::extend_staging_layout(-1, 2, 128), Error);
  EXPECT_THROW(cuda::extend_staging_layout(int64_t(1) << 31, 2, 128), Error);
}

// Small enough for compute-sanitizer: both ways of staging and attention over copied bf16 records,
// masked entries, lengths and an empty row.
TEST(GpuSparseExtendStaged, SanitizerSized) {
  NVFP4MLA_REQUIRE_GPU();
  ProblemOptions opt;
  opt.lengths = true;
  for (const auto& spec : {kAllSpecs[6], kAllSpecs[0]})
    for (int heads : {64, 128})  // one and two 64-head groups
      for (int topk : {200, 512}) {
        SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " heads " + std::to_string(heads) + " topk " + std::to_string(topk));
        const auto p = make_problem(spec, topk == 512 ? 5 : 3, heads, topk, 14, opt);
        const Outputs staged = run_extend(p, true), direct = run_extend(p, false);
        for (size_t i = 0; i < staged.out.size(); ++i) ASSERT_TRUE(std::isfinite(codec::bf16_decode(staged.out[i]))) << i;
        if (spec.dtype != CacheDtype::bf16) EXPECT_EQ(staged.out, direct.out);
        // Every format (the bf16 copies included) against the CPU reference on its kernel's operands.
        const DecodePlan staged_plan = cuda::plan_extend_staged(p.rows, heads, p.topk, current_device_arch()).walk;
        EXPECT_EQ(nvfp4mla::testing::compare_plan_with_reference(spec, p.host_args(), staged_plan, staged.out, staged.lse).failures, 0);
      }
}
