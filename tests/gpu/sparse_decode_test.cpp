// GPU sparse decode against the CPU reference on the kernel's operands (support/output_compare.h):
// every element within what BF16 softmax weights, fp32 scores and the BF16 output allow (about
// 2^-8 of sum_j P_j |v_j|, from the independent oracle's probabilities and values), the norm of
// every (row, head)'s output within its bound (about 1.4%), FlashMLA's cosine limits, and the
// LSE within |d| <= 1e-5 or <= 8/65536 |ref|. Every problem holds the boundary indices
// capacity - 1, capacity, -1, INT32_MIN and INT32_MAX (support/attention_problem.h).
// Every suite runs once per decode kernel (the test parameter: GpuSparseDecode/Kernels.X/sm80_mma
// ...) on every shape that kernel can run on this device, so the portable sm80 kernels that
// sm_100 and sm_120 builds run are tested on the H200 too; a kernel the device cannot run skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/arch.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/error.h"
#include "support/attention_oracle.h"
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

struct GpuResult {
  DecodePlan plan;
  std::vector<uint16_t> out;
  std::vector<float> lse;
  bool merged_in_kernel = false;
};

GpuResult run_plan(const AttentionProblem& p, const DecodePlan& plan, LseBase base = LseBase::natural) {
  DeviceBuffer<uint16_t> q(p.q);
  DeviceBuffer<uint8_t> cache(p.cache);  // with the NaN guard record past the end
  DeviceBuffer<int32_t> idx(p.indices);
  DeviceBuffer<int32_t> len(p.topk_length);
  DeviceBuffer<uint16_t> out(static_cast<size_t>(p.rows) * p.heads * kLatentDim);
  DeviceBuffer<float> lse(static_cast<size_t>(p.rows) * p.heads);
  out.fill_bytes(0xFF);  // poison: every element must be written
  lse.fill_bytes(0xFF);
  SparseMlaArgs a = p.host_args();
  a.q = q.get();
  a.cache = cache.get();
  a.indices = idx.get();
  a.topk_length = p.topk_length.empty() ? nullptr : len.get();
  a.lse_base = base;
  const auto ws_layout = decode_workspace_layout(plan, p.rows, p.heads);
  DeviceBuffer<uint8_t> ws(ws_layout.total_bytes);
  ws.fill_bytes(0xFF);
  const bool merged = cuda::sparse_decode(p.spec, a, plan, ws.get(), ws.size(), out.get(), lse.get(), nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("kernel failed");
  return {plan, out.download(), lse.download(), merged};
}

GpuResult run_gpu(const AttentionProblem& p, DecodeKernel kernel, int forced_splits, LseBase base = LseBase::natural) {
  return run_plan(p, plan_sparse_decode(p.spec, p.rows, p.heads, p.topk, current_device_arch(), forced_splits, kernel), base);
}

// The largest error-to-bound ratios of a test, printed when it ends (how close the kernels come
// to the bounds on this device).
struct Margins {
  double element = 0, norm = 0, cos = 0;
};
Margins g_margins;

// The kernel under test; shapes it cannot run are left out (runs), and a test that ran none skips.
class GpuSparseDecode : public ::testing::TestWithParam<DecodeKernel> {
 protected:
  void SetUp() override {
    g_margins = {};
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    arch_ = current_device_arch();
  }
  DecodeKernel kernel() const { return GetParam(); }
  bool runs(const RecordSpec& spec, int heads) {
    const bool ok = !decode_kernel_unsupported(kernel(), arch_, spec, heads);
    ran_ += ok;
    return ok;
  }
  GpuResult run(const AttentionProblem& p, int forced_splits, LseBase base = LseBase::natural) {
    return run_gpu(p, kernel(), forced_splits, base);
  }
  void skip_if_none_ran() {
    if (ran_ == 0) GTEST_SKIP() << to_string(kernel()) << " runs none of these shapes on " << to_string(arch_);
  }
  void TearDown() override {
    if (IsSkipped()) return;
    std::printf("[bounds] worst |error| / bound: element %.3f, norm %.3f; worst cosine difference %.2e\n", g_margins.element,
                g_margins.norm, g_margins.cos);
  }
  ArchSpec arch_;
  int ran_ = 0;
};

// Compare with the fp64 reference on the kernel's operands (output_compare.h).
int64_t compare(const AttentionProblem& p, const GpuResult& g, LseBase base = LseBase::natural) {
  SparseMlaArgs a = p.host_args();
  a.lse_base = base;
  const auto c = nvfp4mla::testing::compare_plan_with_reference(p.spec, a, g.plan, g.out, g.lse);
  g_margins.element = std::max(g_margins.element, c.worst_element);
  g_margins.norm = std::max(g_margins.norm, c.worst_norm);
  g_margins.cos = std::max(g_margins.cos, c.worst_cos);
  return c.failures;
}

}  // namespace

TEST_P(GpuSparseDecode, EveryFormatAndHeadCountMatchesReference) {
  uint64_t seed = 1;
  for (const auto& spec : kAllSpecs) {
    for (int heads : {8, 16, 32, 64, 128}) {
      SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " heads " + std::to_string(heads));
      const auto p = make_problem(spec, /*rows=*/5, heads, /*topk=*/320, seed++);
      if (!runs(spec, heads)) continue;
      EXPECT_EQ(compare(p, run(p, 0)), 0);
    }
  }
  skip_if_none_ran();
}

TEST_P(GpuSparseDecode, SingleSplitAndManySplitsAgree) {
  // fp8 records (on the wide kernels) and NVFP4 records (16 heads too): 64-entry tiles on sm_90;
  // topk 2080 is 65 planner tiles, so with one split the last 64-entry tile is half past the end.
  // 24 heads: two 16-head groups, the second one half full.
  for (const auto& spec : {kAllSpecs[1], kAllSpecs[6]})
    for (int heads : {16, 24, 64, 128})
      for (int topk : {2048, 2080}) {
        SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " heads " + std::to_string(heads) + " topk " + std::to_string(topk));
        if (!runs(spec, heads)) continue;
        const auto p = make_problem(spec, 4, heads, topk, 11);
        const auto one = run(p, 1), many = run(p, 32), odd = run(p, 7);
        EXPECT_EQ(compare(p, one), 0);
        EXPECT_EQ(compare(p, many), 0);
        EXPECT_EQ(compare(p, odd), 0);
      }
  skip_if_none_ran();
}

TEST_P(GpuSparseDecode, TopkLengthEmptyRowsAndRaggedTopk) {
  ProblemOptions opt;
  opt.lengths = true;
  uint64_t seed = 50;
  for (const auto& spec : kAllSpecs) {
    for (int heads : {16, 128})
      for (int topk : {64, 100, 1000}) {  // ragged widths are masked up to the next multiple of 64
        SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " heads " + std::to_string(heads) + " topk " + std::to_string(topk));
        const auto p = make_problem(spec, 6, heads, topk, seed++, opt);
        if (!runs(spec, heads)) continue;
        EXPECT_EQ(compare(p, run(p, 0)), 0);
        EXPECT_EQ(compare(p, run(p, 3)), 0);
      }
  }
  skip_if_none_ran();
}

TEST_P(GpuSparseDecode, Base2LseAndLargeMagnitudes) {
  const ProblemOptions opt = ProblemOptions::wide_magnitudes();
  uint64_t seed = 77;
  for (const auto& spec : kAllSpecs) {
    SCOPED_TRACE(nvfp4mla::testing::spec_name(spec));
    const auto p = make_problem(spec, 3, 32, 512, seed++, opt);
    if (!runs(spec, 32)) continue;
    EXPECT_EQ(compare(p, run(p, 0, LseBase::base2), LseBase::base2), 0);
  }
  skip_if_none_ran();
}

// Tokens whose outer scales are degenerate: zero latent (a zero dynamic scale), zero RoPE, both,
// and a latent 1e-36 of its RoPE (a subnormal dynamic scale). The 16-head NVFP4 kernel applies
// the outer scales in fp32 to scores and weights, so these are its edge cases; the other kernels
// fold them into the BF16 K values.
TEST_P(GpuSparseDecode, DegenerateOuterScales) {
  ProblemOptions opt;
  opt.degenerate = true;
  uint64_t seed = 300;
  for (const auto& spec : kAllSpecs) {
    for (int heads : {16, 64, 128}) {
      SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " heads " + std::to_string(heads));
      const auto p = make_problem(spec, 3, heads, 256, seed++, opt);
      if (!runs(spec, heads)) continue;
      EXPECT_EQ(compare(p, run(p, 0)), 0);
    }
  }
  skip_if_none_ran();
}

TEST_P(GpuSparseDecode, LongTopk) {
  ProblemOptions opt;
  opt.invalid_entries = false;
  for (int heads : {16, 128}) {
    SCOPED_TRACE(heads);
    if (!runs(kAllSpecs[6], heads)) continue;
    const auto p = make_problem(kAllSpecs[6], 2, heads, 16384, 99, opt);
    EXPECT_EQ(compare(p, run(p, 0)), 0);
  }
  skip_if_none_ran();
}

TEST_P(GpuSparseDecode, RejectsInconsistentPlanAndWorkspace) {
  const auto p = make_problem(kAllSpecs[4], 2, 16, 256, 5);
  if (!runs(p.spec, p.heads)) GTEST_SKIP() << to_string(kernel()) << " does not run 16 heads here";
  // Valid device arguments, so that the plan and the workspace are what is wrong.
  DeviceBuffer<uint16_t> q(p.q), out(static_cast<size_t>(p.rows) * p.heads * kLatentDim);
  DeviceBuffer<uint8_t> cache(p.cache);
  DeviceBuffer<int32_t> idx(p.indices);
  DeviceBuffer<float> lse(static_cast<size_t>(p.rows) * p.heads);
  SparseMlaArgs a = p.host_args();
  a.q = q.get();
  a.cache = cache.get();
  a.indices = idx.get();
  a.topk_length = nullptr;
  auto plan = plan_sparse_decode(p.spec, p.rows, p.heads, p.topk, arch_, 4, kernel());
  ASSERT_GT(plan.splits, 1);
  DeviceBuffer<uint8_t> ws(decode_workspace_layout(plan, p.rows, p.heads).total_bytes);
  EXPECT_THROW(cuda::sparse_decode(p.spec, a, plan, nullptr, 0, out.get(), lse.get(), nullptr), Error);  // no workspace
  EXPECT_THROW(cuda::sparse_decode(p.spec, a, plan, ws.get(), ws.size() - 256, out.get(), lse.get(), nullptr), Error);
  // Outputs off their alignment (the one-split kernels send whole 16-byte pieces of out).
  EXPECT_THROW(cuda::sparse_decode(p.spec, a, plan, ws.get(), ws.size(), out.get() + 2, lse.get(), nullptr), Error);
  EXPECT_THROW(cuda::sparse_decode(p.spec, a, plan, ws.get(), ws.size(), out.get(),
                                   reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(lse.get()) + 2), nullptr),
               Error);
  ASSERT_NO_THROW(cuda::sparse_decode(p.spec, a, plan, ws.get(), ws.size(), out.get(), lse.get(), nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  plan.num_tiles = 1;
  EXPECT_THROW(cuda::sparse_decode(p.spec, a, plan, ws.get(), ws.size(), out.get(), lse.get(), nullptr), Error);
}

// Splits merged inside the kernel's launch (after a grid-wide barrier) give the bits of the merge
// launch: every record format's path, one and two head groups, splits that do not divide the 64
// heads (some CTAs merge fewer heads, or none), lengths and an empty row; outputs poisoned. Kernels
// that cannot merge in their launch refuse such a plan.
TEST_P(GpuSparseDecode, MergeInKernelMatchesTheMergeLaunch) {
  ProblemOptions opt;
  opt.lengths = true;
  int merged = 0;
  for (const auto& spec : {kAllSpecs[6], kAllSpecs[1], kAllSpecs[0]})
    for (int heads : {64, 128})
      for (int splits : {5, 8, 16, 30}) {
        SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " heads " + std::to_string(heads) + " splits " + std::to_string(splits));
        if (!runs(spec, heads)) continue;
        const auto p = make_problem(spec, 2, heads, 2048, 700 + splits, opt);
        DecodePlan plan = plan_sparse_decode(spec, p.rows, heads, p.topk, arch_, splits, kernel());
        if (!decode_merges_in_kernel(kernel(), plan.splits)) {
          plan.merge_in_kernel = true;
          EXPECT_THROW(run_plan(p, plan), Error);
          continue;
        }
        ASSERT_TRUE(plan.merge_in_kernel);  // 2 rows: the grid fits one wave
        EXPECT_EQ(plan.partial_bytes, 2);    // the planner's BF16 partials for in-kernel merges
        ++merged;
        for (int partial_bytes : {2, 4}) {
          SCOPED_TRACE("partial bytes " + std::to_string(partial_bytes));
          plan.partial_bytes = partial_bytes;
          plan.merge_in_kernel = true;
          const GpuResult in_kernel = run_plan(p, plan);
          EXPECT_TRUE(in_kernel.merged_in_kernel);
          plan.merge_in_kernel = false;
          const GpuResult launched = run_plan(p, plan);
          EXPECT_FALSE(launched.merged_in_kernel);
          EXPECT_EQ(in_kernel.out, launched.out);
          EXPECT_EQ(in_kernel.lse, launched.lse);
          EXPECT_EQ(compare(p, in_kernel), 0);
        }
      }
  skip_if_none_ran();
  const bool ws = decode_merges_in_kernel(kernel(), 16);
  if (ws) EXPECT_GE(merged, 6);
}

// Every kernel writes its partials in fp32 or BF16 as the plan says (the planner picks BF16 only
// for in-kernel merges), each within the reference's bounds for that precision, with the
// workspace poisoned; a partial width other than 4 or 2 bytes is refused.
TEST_P(GpuSparseDecode, PartialsInFp32AndBf16MatchReference) {
  ProblemOptions opt;
  opt.lengths = true;
  for (const auto& spec : {kAllSpecs[6], kAllSpecs[1], kAllSpecs[0]})
    for (int heads : {16, 64, 128}) {
      SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " heads " + std::to_string(heads));
      if (!runs(spec, heads)) continue;
      const auto p = make_problem(spec, 3, heads, 1000, 900 + heads, opt);
      DecodePlan plan = plan_sparse_decode(spec, p.rows, heads, p.topk, arch_, 3, kernel());
      ASSERT_GT(plan.splits, 1);
      plan.merge_in_kernel = false;
      for (int partial_bytes : {4, 2}) {
        SCOPED_TRACE("partial bytes " + std::to_string(partial_bytes));
        plan.partial_bytes = partial_bytes;
        EXPECT_EQ(compare(p, run_plan(p, plan)), 0);
      }
      plan.partial_bytes = 3;
      EXPECT_THROW(run_plan(p, plan), Error);
    }
  skip_if_none_ran();
}

// A plan that names no kernel, or one the device cannot run, is refused before any launch.
TEST(GpuSparseDecodePlan, RejectsKernelsTheDeviceCannotRun) {
  NVFP4MLA_REQUIRE_GPU();
  // bf16 records with 192 heads: no 16-head kernel reads bf16 records, and no pair runs an odd
  // number of 64-head groups, on any device.
  const auto p = make_problem(kAllSpecs[0], 2, 192, 256, 5);
  const ArchSpec arch = current_device_arch();
  int refused = 0;
  auto plan = plan_sparse_decode(p.spec, p.rows, p.heads, p.topk, arch);
  // Every argument valid but the plan's kernel: the refusal is the only error left.
  DeviceBuffer<uint16_t> q(p.q);
  DeviceBuffer<uint8_t> cache(p.cache);
  DeviceBuffer<int32_t> idx(p.indices);
  DeviceBuffer<uint16_t> out(static_cast<size_t>(p.rows) * p.heads * kLatentDim);
  DeviceBuffer<float> lse(static_cast<size_t>(p.rows) * p.heads);
  DeviceBuffer<uint8_t> ws(decode_workspace_layout(plan, p.rows, p.heads).total_bytes + 256);
  SparseMlaArgs a = p.host_args();
  a.q = q.get();
  a.cache = cache.get();
  a.indices = idx.get();
  a.topk_length = nullptr;
  auto run = [&] { cuda::sparse_decode(p.spec, a, plan, ws.get(), ws.size(), out.get(), lse.get(), nullptr); };
  ASSERT_NO_THROW(run());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  plan.kernel = DecodeKernel::automatic;
  EXPECT_THROW(run(), Error);
  for (DecodeKernel k : all_decode_kernels()) {
    if (!decode_kernel_unsupported(k, arch, p.spec, p.heads)) continue;
    SCOPED_TRACE(to_string(k));
    EXPECT_THROW(plan_sparse_decode(p.spec, p.rows, p.heads, p.topk, arch, 0, k), Error);
    plan.kernel = k;
    EXPECT_THROW(run(), Error);
    ++refused;
  }
  EXPECT_GE(refused, 4);
}

// Plans made for the devices with less shared memory per CTA (sm_80: 163 KB; sm_86/89/120: 99 KB)
// run here too and match the reference: sm80_mma's 32-head groups (FP8 and BF16 records above 32
// heads) and sm80_h16 with its 99 KB stages (every NVFP4 format). A head group the kernel does not
// run for the heads is refused.
TEST(GpuSparseDecodePlan, PlansForSmallerSharedMemoryRunAndMatchReference) {
  NVFP4MLA_REQUIRE_GPU();
  const ArchSpec here = current_device_arch();
  uint64_t seed = 900;
  int ran = 0, groups_of_32 = 0;
  for (const ArchSpec& small : {arch_spec(8, 0, here.sm_count), arch_spec(8, 6, here.sm_count)})
    for (const auto& spec : kAllSpecs)
      for (int heads : {16, 64, 128}) {
        SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " heads " + std::to_string(heads) + " planned for " +
                     to_string(small));
        const auto p = make_problem(spec, /*rows=*/3, heads, /*topk=*/192, seed++);
        const DecodePlan plan = plan_sparse_decode(p.spec, p.rows, p.heads, p.topk, small);
        if (decode_kernel_unsupported(plan.kernel, here, spec, heads)) continue;
        groups_of_32 += plan.kernel == DecodeKernel::sm80_mma && plan.head_group == 32;
        EXPECT_EQ(compare(p, run_plan(p, plan)), 0);
        ++ran;
      }
  if (ran == 0) GTEST_SKIP() << "this device runs none of the sm80 kernels";
  EXPECT_GT(groups_of_32, 0);
  const auto p = make_problem(kAllSpecs[0], 2, 128, 128, 7);
  DecodePlan plan = plan_sparse_decode(p.spec, p.rows, p.heads, p.topk, here, 0, DecodeKernel::sm80_mma);
  plan.head_group = 48;
  plan.num_head_groups = 3;
  EXPECT_THROW(run_plan(p, plan), Error);
}

// Rows lie along the grid's y, which holds 65,535 of them: more run as launches of row chunks,
// each with its rows' Q, indices, lengths, outputs, LSE and partials. 65,539 rows repeating four
// distinct ones (one head, so that it stays small; the pairs need more than 64 heads and skip),
// two splits: every row equals its original bit for bit, and the originals match the reference.
TEST_P(GpuSparseDecode, RowsPastTheGridLimit) {
  const auto& spec = kAllSpecs[6];
  constexpr int kHeads = 1, kTopk = 64, kDistinct = 4, kRows = 65535 + kDistinct;
  if (!runs(spec, kHeads)) return skip_if_none_ran();
  ProblemOptions opt;
  opt.lengths = true;
  const auto base = make_problem(spec, kDistinct, kHeads, kTopk, 21, opt);
  AttentionProblem big = base;
  big.rows = kRows;
  big.q.clear();
  big.indices.clear();
  big.topk_length.clear();
  for (int r = 0; r < kRows; ++r) {
    const int o = r % kDistinct;
    big.q.insert(big.q.end(), base.q.begin() + size_t(o) * kHeads * kQkDim, base.q.begin() + size_t(o + 1) * kHeads * kQkDim);
    big.indices.insert(big.indices.end(), base.indices.begin() + size_t(o) * kTopk, base.indices.begin() + size_t(o + 1) * kTopk);
    big.topk_length.push_back(base.topk_length[o]);
  }
  const auto small = run(base, 2), many = run(big, 2);
  EXPECT_EQ(compare(base, small), 0);
  int64_t differing = 0;
  for (int r = 0; r < kRows; ++r) {
    const int o = r % kDistinct;
    differing += !std::equal(many.out.begin() + size_t(r) * kHeads * kLatentDim, many.out.begin() + size_t(r + 1) * kHeads * kLatentDim,
                             small.out.begin() + size_t(o) * kHeads * kLatentDim) ||
                 std::memcmp(&many.lse[size_t(r) * kHeads], &small.lse[size_t(o) * kHeads], kHeads * sizeof(float)) != 0;
  }
  EXPECT_EQ(differing, 0);
}

// Small enough for compute-sanitizer: the 64-head path (warp-specialized on sm_90) and the
// 16-head path, several splits, masked entries, an empty row; NVFP4 and fp8 records (the two
// register-slice formats of the 64-entry kernels) and bf16 records (which sm90_ws_wide copies).
TEST_P(GpuSparseDecode, SanitizerSized) {
  ProblemOptions opt;
  opt.lengths = true;
  for (const auto& spec : {kAllSpecs[6], kAllSpecs[1], kAllSpecs[0]})
    for (int heads : {16, 64, 128}) {  // 128: the cluster-pair kernels on sm_90
      SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " heads " + std::to_string(heads));
      if (!runs(spec, heads)) continue;
      const auto p = make_problem(spec, 3, heads, 200, 123, opt);
      EXPECT_EQ(compare(p, run(p, 2)), 0);
    }
  skip_if_none_ran();
}

// CTAs walking the rows (DecodePlan::row_ctas: sm90_ws_wide over bf16 records, the staged
// extend's plan) give the bits of one CTA per row: the same MMAs in the same order, each row's
// steps continuing its CTA's K-buffer ring and P hand-off from the row before. One to all of the
// rows per CTA, single-step rows (top-k up to 64: the hand-over of P meets the row's end),
// ragged lengths, empty rows and masked entries, head counts below and past 64 (heads padded
// in Q's copies, several head groups); outputs poisoned, and the walk within the reference's
// bounds. A plan that walks rows with another kernel, format or split count is refused.
TEST(GpuSparseDecodeRowWalk, EqualsOneCtaPerRowBitForBit) {
  NVFP4MLA_REQUIRE_GPU();
  const ArchSpec arch = current_device_arch();
  const RecordSpec spec = kSpecBf16;
  if (decode_kernel_unsupported(DecodeKernel::sm90_ws_wide, arch, spec, 64)) GTEST_SKIP() << "no sm90_ws_wide here";
  ProblemOptions opt;
  opt.lengths = true;
  uint64_t seed = 4100;
  for (int heads : {16, 64, 128, 192})
    for (int topk : {40, 64, 200, 2048})
      for (int rows : {1, 9}) {
        SCOPED_TRACE("heads " + std::to_string(heads) + " topk " + std::to_string(topk) + " rows " + std::to_string(rows));
        const auto p = make_problem(spec, rows, heads, topk, seed++, opt);
        DecodePlan plan = plan_sparse_decode(spec, rows, heads, topk, arch, 1, DecodeKernel::sm90_ws_wide);
        ASSERT_EQ(plan.splits, 1);
        ASSERT_EQ(plan.row_ctas, 0);
        const GpuResult per_row = run_plan(p, plan);
        for (int row_ctas : {1, 2, 4, rows + 3}) {
          SCOPED_TRACE("row_ctas " + std::to_string(row_ctas));
          plan.row_ctas = row_ctas;
          const GpuResult walked = run_plan(p, plan);
          EXPECT_EQ(walked.out, per_row.out);
          EXPECT_EQ(std::memcmp(walked.lse.data(), per_row.lse.data(), walked.lse.size() * sizeof(float)), 0);
          if (row_ctas == 2 && (topk <= 200 || heads <= 64)) EXPECT_EQ(compare(p, walked), 0);
        }
      }

  const auto p = make_problem(spec, 4, 64, 256, 77, opt);
  DecodePlan split = plan_sparse_decode(spec, p.rows, p.heads, p.topk, arch, 2, DecodeKernel::sm90_ws_wide);
  ASSERT_GT(split.splits, 1);
  split.row_ctas = 2;
  EXPECT_THROW(run_plan(p, split), Error);
  DecodePlan negative = plan_sparse_decode(spec, p.rows, p.heads, p.topk, arch, 1, DecodeKernel::sm90_ws_wide);
  negative.row_ctas = -1;
  EXPECT_THROW(run_plan(p, negative), Error);
  const auto nvfp4 = make_problem(kAllSpecs[6], 4, 64, 256, 78, opt);
  DecodePlan wide = plan_sparse_decode(nvfp4.spec, nvfp4.rows, nvfp4.heads, nvfp4.topk, arch, 1, DecodeKernel::sm90_ws_wide);
  wide.row_ctas = 2;
  EXPECT_THROW(run_plan(nvfp4, wide), Error);
}

// Small enough for compute-sanitizer: CTAs walking 2-3 rows each (two steps and one step per row,
// 64 and 128 heads, ragged lengths), bit for bit against one CTA per row.
TEST(GpuSparseDecodeRowWalk, SanitizerSized) {
  NVFP4MLA_REQUIRE_GPU();
  const ArchSpec arch = current_device_arch();
  if (decode_kernel_unsupported(DecodeKernel::sm90_ws_wide, arch, kSpecBf16, 64)) GTEST_SKIP() << "no sm90_ws_wide here";
  ProblemOptions opt;
  opt.lengths = true;
  for (int heads : {64, 128})
    for (int topk : {50, 128}) {
      SCOPED_TRACE("heads " + std::to_string(heads) + " topk " + std::to_string(topk));
      const auto p = make_problem(kSpecBf16, 5, heads, topk, 4300 + topk + heads, opt);
      DecodePlan plan = plan_sparse_decode(kSpecBf16, p.rows, heads, topk, arch, 1, DecodeKernel::sm90_ws_wide);
      const GpuResult per_row = run_plan(p, plan);
      plan.row_ctas = 2;
      const GpuResult walked = run_plan(p, plan);
      EXPECT_EQ(walked.out, per_row.out);
      EXPECT_EQ(std::memcmp(walked.lse.data(), per_row.lse.data(), walked.lse.size() * sizeof(float)), 0);
    }
}

INSTANTIATE_TEST_SUITE_P(Kernels, GpuSparseDecode, ::testing::ValuesIn(all_decode_kernels()),
                         [](const ::testing::TestParamInfo<DecodeKernel>& info) { return std::string(to_string(info.param)); });
