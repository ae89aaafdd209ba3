// The decode planner: tile shapes per head count, split choice, workspace layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lib/ops/sparse_mla/decode/kernel_shapes.h"
#include "nvfp4mla/arch.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/error.h"

using namespace nvfp4mla;

namespace {
const ArchSpec kH200 = arch_spec(9, 0, 132);
}  // namespace

TEST(DecodePlan, HeadGroupsAreNativeNotPaddedTo64) {
  const RecordSpec spec = kSpecNvfp4Fp8Rope;
  EXPECT_EQ(plan_sparse_decode(spec, 128, 8, 2048, kH200).head_group, 16);
  EXPECT_EQ(plan_sparse_decode(spec, 128, 16, 2048, kH200).head_group, 16);
  // 17-32 heads: two groups of the 16-head kernel with NVFP4 records, one padded 64-head group with
  // FP8 and BF16 records.
  for (int heads : {17, 24, 32}) {
    const auto p = plan_sparse_decode(spec, 128, heads, 2048, kH200);
    EXPECT_EQ(p.head_group, 16);
    EXPECT_EQ(p.num_head_groups, 2);
    EXPECT_EQ(p.warps, decode::kSm90H16Warps);
    EXPECT_EQ(plan_sparse_decode(kSpecNvfp4Bf16Rope, 128, heads, 2048, kH200).head_group, 16);
    EXPECT_EQ(plan_sparse_decode(kSpecFp8, 128, heads, 2048, kH200).head_group, 64);  // one padded 64-head group
    EXPECT_EQ(plan_sparse_decode(kSpecBf16, 128, heads, 2048, kH200).head_group, 64);
  }
  EXPECT_EQ(plan_sparse_decode(spec, 128, 33, 2048, kH200).head_group, 64);
  EXPECT_EQ(plan_sparse_decode(spec, 128, 64, 2048, kH200).head_group, 64);
  const auto p128 = plan_sparse_decode(spec, 128, 128, 2048, kH200);
  EXPECT_EQ(p128.head_group, 64);
  EXPECT_EQ(p128.num_head_groups, 2);
}

TEST(DecodePlan, SplitsMinimizeTheWaveEstimateWithoutEmptySplits) {
  for (int rows : {1, 3, 32, 128, 256, 1000})
    for (int heads : {8, 16, 32, 64, 128})
      for (int topk : {64, 100, 2048, 16384}) {
        const auto p = plan_sparse_decode(kSpecNvfp4Fp8Rope, rows, heads, topk, kH200);
        SCOPED_TRACE(testing::Message() << rows << "x" << heads << "x" << topk);
        EXPECT_EQ(p.num_tiles, (topk + p.tile_tokens - 1) / p.tile_tokens);
        EXPECT_GE(p.splits, 1);
        EXPECT_LE(p.splits, p.num_tiles);
        EXPECT_LE(p.splits, (topk + 63) / 64);
        EXPECT_GE(int64_t(p.splits) * p.tiles_per_split, p.num_tiles);
        EXPECT_LT(int64_t(p.splits - 1) * p.tiles_per_split, p.num_tiles);  // the last split has work
        // No other split count has a smaller (waves x (tiles per split + fixed cost)) estimate.
        const int64_t slots = int64_t(132) * p.ctas_per_sm;
        const auto estimate = [&](const DecodePlan& q) { return (q.ctas(rows) + slots - 1) / slots * (q.tiles_per_split + decode::kCtaFixedTiles); };
        for (int s = 1; s <= std::min(p.num_tiles, (topk + 63) / 64); ++s)
          EXPECT_LE(estimate(p), estimate(plan_sparse_decode(kSpecNvfp4Fp8Rope, rows, heads, topk, kH200, s))) << s;
      }
  // Rows 256 x 64 heads: two waves of whole rows beat four waves of half rows plus a merge.
  EXPECT_EQ(plan_sparse_decode(kSpecNvfp4Fp8Rope, 256, 64, 2048, kH200).splits, 1);
  EXPECT_EQ(plan_sparse_decode(kSpecNvfp4Fp8Rope, 256, 128, 2048, kH200).splits, 1);
  EXPECT_EQ(plan_sparse_decode(kSpecNvfp4Fp8Rope, 128, 16, 2048, kH200).splits, 1);  // one wave at 1 CTA per SM
  // 16-head NVFP4 splits hold whole 64-entry tiles.
  for (int rows : {1, 3, 40})
    for (int topk : {64, 2048, 2080}) {
      const auto q = plan_sparse_decode(kSpecNvfp4Fp8Rope, rows, 16, topk, kH200);
      EXPECT_TRUE(q.splits == 1 || q.tiles_per_split % (decode::kSm90H16Tile / decode::kPlannerTile) == 0) << rows << " " << topk;
    }
  // (Only they have that cap: 128 heads with an odd tile count keeps its single split.)
  EXPECT_EQ(plan_sparse_decode(kSpecNvfp4Fp8Rope, 4, 128, 2080, kH200, 1).splits, 1);
  // ... and at most decode::kSm90H16MaxSplitEntries (their indices are staged in shared memory), even
  // when a single split would be the estimate's choice or is forced.
  for (int forced : {0, 1})
    for (int topk : {16384, 16448, 40000}) {
      const auto q = plan_sparse_decode(kSpecNvfp4Fp8Rope, 300, 16, topk, kH200, forced);
      EXPECT_LE(q.tiles_per_split * q.tile_tokens, decode::kSm90H16MaxSplitEntries) << topk;
      if (forced == 1)
        EXPECT_EQ(q.splits, (topk + decode::kSm90H16MaxSplitEntries - 1) / decode::kSm90H16MaxSplitEntries) << topk;
    }
  EXPECT_EQ(plan_sparse_decode(kSpecBf16, 128, 16, 2048, kH200, 0, DecodeKernel::sm80_mma).splits, 3);
  EXPECT_EQ(plan_sparse_decode(kSpecNvfp4Fp8Rope, 4, 64, 2048, kH200, 7).splits, 7);
  const auto clamped = plan_sparse_decode(kSpecNvfp4Fp8Rope, 4, 64, 128, kH200, 50);
  EXPECT_EQ(clamped.splits, 2);  // at least 64 entries per split
  EXPECT_THROW(plan_sparse_decode(kSpecNvfp4Fp8Rope, 4, 0, 128, kH200), Error);
  EXPECT_THROW(plan_sparse_decode(kSpecNvfp4Fp8Rope, 4, 8, 0, kH200), Error);
}

// The planner's documented rule on a dense grid of shapes: the split count it picks has the
// smallest estimate, (waves of resident CTAs) x (tiles per split + decode::kCtaFixedTiles), of all
// allowed counts, and no plan with fewer splits reaches that estimate (the fewest splits win
// among equal estimates). Each candidate is the planner's own plan with that many splits forced;
// its tiles per split count whole kernel tiles (the 16-head NVFP4 kernels and paired 64-head
// NVFP4 groups work in tiles of two planner tiles, so a split of an odd tile count costs the
// masked half tile too).
TEST(DecodePlan, FewestSplitsWinAmongEqualEstimates) {
  const std::vector<int> topks = {1,    31,   32,   33,   64,   65,   100,  128,  129,  255,  256,  320,
                                  500,  513,  1000, 1024, 1500, 2047, 2048, 2080, 3000, 4095, 4096, 5811,
                                  6000, 8192, 10000, 12345, 16384, 16448, 20000, 32768};
  int64_t shapes = 0;
  for (const RecordSpec& spec : {kSpecNvfp4Fp8Rope, kSpecFp8, kSpecBf16})
    for (int sm_count : {132, 78})
      for (int heads : {8, 16, 32, 64, 128})
        for (int topk : topks) {
          const ArchSpec arch = arch_spec(9, 0, sm_count);
          // Forced plans do not depend on the row count: one per allowed split count.
          std::vector<DecodePlan> candidates;
          for (int s = 1; s <= (topk + 63) / 64; ++s) candidates.push_back(plan_sparse_decode(spec, 1, heads, topk, arch, s));
          for (int rows = 1; rows <= 64; ++rows, ++shapes) {
            const DecodePlan p = plan_sparse_decode(spec, rows, heads, topk, arch);
            const int64_t slots = int64_t(sm_count) * p.ctas_per_sm;
            const auto estimate = [&](const DecodePlan& q) {
              const int kernel_tile = decode::kernel_shape(q.kernel, spec, heads).split_tiles;
              const int tiles = (q.tiles_per_split + kernel_tile - 1) / kernel_tile * kernel_tile;
              return (q.ctas(rows) + slots - 1) / slots * (tiles + decode::kCtaFixedTiles);
            };
            int64_t best = INT64_MAX;
            int fewest = 0;
            for (const DecodePlan& q : candidates) {
              if (estimate(q) < best || (estimate(q) == best && q.splits < fewest)) fewest = q.splits;
              best = std::min(best, estimate(q));
            }
            if (estimate(p) != best || p.splits != fewest) {
              ADD_FAILURE() << to_string(spec.dtype) << "-" << spec.record_bytes() << " sm " << sm_count << ": rows " << rows << " x heads "
                            << heads << " x topk " << topk << ": " << p.splits << " splits (estimate " << estimate(p)
                            << "), want " << fewest << " (estimate " << best << ")";
              return;
            }
          }
        }
  EXPECT_EQ(shapes, 3 * 2 * 5 * static_cast<int64_t>(topks.size()) * 64);
}

// NVFP4 records with 64-head groups run 64-entry K buffers on sm_90, paired or not: splits hold
// whole pairs of planner tiles (only a single split of an odd tile count ends on half of one).
TEST(DecodePlan, WideTilesKeepSplitsWhole) {
  EXPECT_EQ(default_decode_kernel(kH200, kSpecNvfp4Fp8Rope, 128), DecodeKernel::sm90_ws_pair_wide);
  EXPECT_EQ(default_decode_kernel(kH200, kSpecNvfp4Bf16Rope, 256), DecodeKernel::sm90_ws_pair_wide);
  EXPECT_EQ(default_decode_kernel(kH200, kSpecNvfp4Fp8Rope, 64), DecodeKernel::sm90_ws_wide);  // 64 heads: no pair
  EXPECT_EQ(default_decode_kernel(kH200, kSpecNvfp4Bf16Rope, 192), DecodeKernel::sm90_ws_wide);  // an odd group count
  EXPECT_EQ(default_decode_kernel(kH200, kSpecFp8, 128), DecodeKernel::sm90_ws_pair_wide);
  EXPECT_EQ(default_decode_kernel(kH200, kSpecNvfp4Fp8Rope, 16), DecodeKernel::sm90_h16);
  EXPECT_EQ(default_decode_kernel(kH200, kSpecFp8, 32), DecodeKernel::sm90_ws_wide);  // padded to one 64-head group
  EXPECT_EQ(default_decode_kernel(kH200, kSpecFp8, 16), DecodeKernel::sm90_ws_wide);
  for (int heads : {64, 128, 192, 256})
    for (int rows : {1, 4, 32, 256})
      for (int topk : {64, 100, 2048, 2080, 16384})
        for (int forced : {0, 3, 5, 7}) {
          const auto p = plan_sparse_decode(kSpecNvfp4Fp8Rope, rows, heads, topk, kH200, forced);
          SCOPED_TRACE(testing::Message() << rows << "x" << heads << "x" << topk << " splits " << forced);
          EXPECT_TRUE(p.tiles_per_split % (decode::kWsWideTile / decode::kPlannerTile) == 0 || (p.splits == 1 && p.tiles_per_split == p.num_tiles));
          EXPECT_GE(int64_t(p.splits) * p.tiles_per_split, p.num_tiles);
          EXPECT_LT(int64_t(p.splits - 1) * p.tiles_per_split, p.num_tiles);
        }
  // 64 tiles in 5 splits: 13 tiles each on the 32-entry kernels, 14 (seven wide tiles) on the
  // 64-entry ones, every format's default on sm_90a.
  EXPECT_EQ(plan_sparse_decode(kSpecBf16, 8, 128, 2048, kH200, 5, DecodeKernel::sm90_ws_pair).tiles_per_split, 13);
  EXPECT_EQ(plan_sparse_decode(kSpecBf16, 8, 128, 2048, kH200, 5).tiles_per_split, 14);
  EXPECT_EQ(default_decode_kernel(kH200, kSpecBf16, 128), DecodeKernel::sm90_ws_wide);
  EXPECT_EQ(default_decode_kernel(kH200, kSpecBf16, 64), DecodeKernel::sm90_ws_wide);
  EXPECT_EQ(plan_sparse_decode(kSpecFp8, 8, 128, 2048, kH200, 5).tiles_per_split, 14);
  EXPECT_EQ(plan_sparse_decode(kSpecNvfp4Fp8Rope, 8, 128, 2048, kH200, 5).tiles_per_split, 14);
  EXPECT_EQ(plan_sparse_decode(kSpecNvfp4Fp8Rope, 8, 64, 2048, kH200, 5).tiles_per_split, 14);
  // fp8 records on the wide kernels (by request): whole wide tiles too.
  EXPECT_EQ(plan_sparse_decode(kSpecFp8, 8, 128, 2048, kH200, 5, DecodeKernel::sm90_ws_pair_wide).tiles_per_split, 14);
  EXPECT_EQ(plan_sparse_decode(kSpecFp8, 8, 64, 2048, kH200, 5, DecodeKernel::sm90_ws_wide).tiles_per_split, 14);
}

TEST(DecodePlan, SharedMemoryFitsAndSmallTilesShareAnSm) {
  for (int hg : {16, 32, 64})
    for (const auto& spec : {kSpecBf16, kSpecFp8, kSpecNvfp4Bf16Rope, kSpecNvfp4Fp8Rope}) {
      const auto cfg = decode::tile_config(hg);
      const bool raw_is_k_row = spec.dtype == CacheDtype::bf16;
      const int stages = decode::mma_stages(cfg, spec.record_bytes(), raw_is_k_row);
      EXPECT_GE(stages, 1);
      EXPECT_LE(decode::mma_smem_bytes(cfg, spec.record_bytes(), raw_is_k_row, stages), decode::kSmemBudgetPerBlock);
    }
  // 16 heads, portable kernel (bf16 records here): three CTAs per SM (measured faster than two
  // CTAs with deeper prefetch).
  const auto p16 = plan_sparse_decode(kSpecBf16, 128, 16, 2048, kH200, 0, DecodeKernel::sm80_mma);
  EXPECT_EQ(p16.ctas_per_sm, 3);
  EXPECT_EQ(p16.stages, 1);
  // NVFP4 records with 16 heads: the 16-head kernel's own budget.
  const auto h16 = plan_sparse_decode(kSpecNvfp4Fp8Rope, 128, 16, 2048, kH200);
  EXPECT_EQ(h16.kernel, DecodeKernel::sm90_h16);
  EXPECT_EQ(h16.ctas_per_sm, 1);
  EXPECT_EQ(h16.stages, 1);
  EXPECT_EQ(h16.warps, decode::kSm90H16Warps);
  // 64 heads: the 32-entry kernel stages raw records in shared memory; the 64-entry one (the
  // planner's for NVFP4 records) holds them in registers.
  EXPECT_GE(plan_sparse_decode(kSpecNvfp4Fp8Rope, 128, 64, 2048, kH200, 0, DecodeKernel::sm90_ws).stages, 2);
  const auto wide = plan_sparse_decode(kSpecNvfp4Fp8Rope, 128, 64, 2048, kH200);
  EXPECT_EQ(wide.kernel, DecodeKernel::sm90_ws_wide);
  EXPECT_EQ(wide.stages, 0);
  EXPECT_LE(decode::ws_smem_bytes(kSpecNvfp4Bf16Rope.record_bytes(), false, decode::kWsWideTile, 0), decode::kSmemBudgetPerBlock);
  // fp8 records in the 64-entry kernels: in registers too, in the same shared memory.
  for (const DecodeKernel k : {DecodeKernel::sm90_ws_wide, DecodeKernel::sm90_ws_pair_wide}) {
    const auto fp8_wide = plan_sparse_decode(kSpecFp8, 128, 128, 2048, kH200, 0, k);
    EXPECT_EQ(fp8_wide.stages, 0);
    EXPECT_EQ(fp8_wide.tile_tokens, decode::kPlannerTile);
    EXPECT_EQ(decode::kernel_shape(k, kSpecFp8, 128).smem_bytes, decode::kernel_shape(k, kSpecNvfp4Fp8Rope, 128).smem_bytes);
    EXPECT_LE(decode::kernel_shape(k, kSpecFp8, 128).smem_bytes, decode::kSmemBudgetPerBlock);
  }
}

TEST(DecodePlan, WorkspaceLayout) {
  auto p = plan_sparse_decode(kSpecNvfp4Fp8Rope, 10, 16, 2048, kH200, 4);
  const auto w = decode_workspace_layout(p, 10, 16);
  EXPECT_EQ(w.partial_out_bytes, size_t(10) * 16 * 4 * 512 * 4);
  EXPECT_EQ(w.partial_lse_offset % 256, 0u);
  EXPECT_GE(w.partial_lse_bytes, size_t(10) * 16 * 4 * 4);
  EXPECT_EQ(w.total_bytes, w.partial_out_bytes + w.partial_lse_bytes);
  p = plan_sparse_decode(kSpecNvfp4Fp8Rope, 1000, 128, 2048, kH200, 1);
  EXPECT_EQ(decode_workspace_layout(p, 1000, 128).total_bytes, 0u);
}

// The plan names its kernel: the planner's choice per architecture, any supported kernel on
// request, and an error naming the reason for one that cannot run the problem.
TEST(DecodePlan, KernelChoicePerArchitecture) {
  const ArchSpec a100 = arch_spec(8, 0, 108);
  EXPECT_FALSE(a100.wgmma);
  EXPECT_TRUE(kH200.wgmma && kH200.clusters);
  EXPECT_EQ(default_decode_kernel(a100, kSpecNvfp4Fp8Rope, 16), DecodeKernel::sm80_h16);
  // sm80_mma's 64-head NVFP4 stages need more than an A100's 163 KB per CTA: it would run 32-head
  // groups there, and the automatic choice is 16-head groups of sm80_h16.
  EXPECT_FALSE(decode_kernel_unsupported(DecodeKernel::sm80_mma, a100, kSpecNvfp4Fp8Rope, 128).has_value());
  EXPECT_EQ(plan_sparse_decode(kSpecNvfp4Fp8Rope, 4, 128, 2048, a100, 0, DecodeKernel::sm80_mma).head_group, 32);
  EXPECT_EQ(default_decode_kernel(a100, kSpecNvfp4Fp8Rope, 128), DecodeKernel::sm80_h16);
  EXPECT_EQ(default_decode_kernel(kH200, kSpecFp8, 16), DecodeKernel::sm90_ws_wide);
  EXPECT_EQ(default_decode_kernel(a100, kSpecFp8, 16), DecodeKernel::sm80_mma);
  EXPECT_EQ(default_decode_kernel(kH200, kSpecFp8, 64), DecodeKernel::sm90_ws_wide);
  EXPECT_EQ(default_decode_kernel(kH200, kSpecBf16, 32), DecodeKernel::sm90_ws_wide);
  EXPECT_EQ(default_decode_kernel(a100, kSpecBf16, 32), DecodeKernel::sm80_mma);
  for (const RecordSpec& spec : kAllRecordSpecs)
    for (int heads : {8, 16, 24, 32, 64, 128}) {
      SCOPED_TRACE(to_string(spec) + " heads " + std::to_string(heads));
      const auto kernels = supported_decode_kernels(kH200, spec, heads);
      EXPECT_NE(std::find(kernels.begin(), kernels.end(), default_decode_kernel(kH200, spec, heads)), kernels.end());
      EXPECT_NE(std::find(kernels.begin(), kernels.end(), DecodeKernel::sm80_mma), kernels.end());  // the portable path
      for (DecodeKernel k : kernels) {
        const DecodePlan p = plan_sparse_decode(spec, 4, heads, 2048, kH200, 0, k);
        EXPECT_EQ(p.kernel, k);
        EXPECT_EQ(p.num_head_groups, (heads + p.head_group - 1) / p.head_group);
      }
    }
  // Requests the device or the problem cannot serve.
  EXPECT_THROW(plan_sparse_decode(kSpecNvfp4Fp8Rope, 4, 128, 2048, a100, 0, DecodeKernel::sm90_ws), Error);
  EXPECT_THROW(plan_sparse_decode(kSpecNvfp4Fp8Rope, 4, 64, 2048, kH200, 0, DecodeKernel::sm90_ws_pair), Error);
  EXPECT_THROW(plan_sparse_decode(kSpecFp8, 4, 16, 2048, kH200, 0, DecodeKernel::sm80_h16), Error);
  // sm90_ws_wide copies bf16 records into its K buffers and is the planner's choice for them at
  // every head count; the wide pairs dequantize register slices (NVFP4 and FP8 records) only.
  for (int heads : {16, 64, 128, 192}) {
    EXPECT_FALSE(decode_kernel_unsupported(DecodeKernel::sm90_ws_wide, kH200, kSpecBf16, heads).has_value()) << heads;
    EXPECT_EQ(plan_sparse_decode(kSpecBf16, 4, heads, 2048, kH200, 1, DecodeKernel::sm90_ws_wide).stages, 0) << heads;
    EXPECT_EQ(default_decode_kernel(kH200, kSpecBf16, heads), DecodeKernel::sm90_ws_wide) << heads;
  }
  EXPECT_FALSE(decode_kernel_unsupported(DecodeKernel::sm90_ws_pair_wide, kH200, kSpecFp8, 128).has_value());
  const auto why = decode_kernel_unsupported(DecodeKernel::sm90_ws_pair_wide, kH200, kSpecBf16, 128);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("NVFP4 and FP8 records only"), std::string::npos) << *why;
  EXPECT_THROW(plan_sparse_decode(kSpecBf16, 4, 128, 2048, kH200, 0, DecodeKernel::sm90_ws_pair_wide), Error);
  EXPECT_TRUE(decode_kernel_unsupported(DecodeKernel::sm90_ws_wide, a100, kSpecBf16, 64).has_value());
  try {
    plan_sparse_decode(kSpecNvfp4Fp8Rope, 4, 16, 2048, a100, 0, DecodeKernel::sm90_h16);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sm_90a"), std::string::npos) << e.what();
  }
  // A kernel whose compiled shared memory exceeds the device's is refused, not launched.
  ArchSpec small = arch_spec(8, 6, 84);
  small.smem_per_block = 64 * 1024;
  const auto too_big = decode_kernel_unsupported(DecodeKernel::sm80_h16, small, kSpecNvfp4Fp8Rope, 16);
  ASSERT_TRUE(too_big.has_value());
  EXPECT_NE(too_big->find("bytes of shared memory per CTA; the device allows 65536"), std::string::npos) << *too_big;
  EXPECT_THROW(plan_sparse_decode(kSpecNvfp4Fp8Rope, 4, 16, 2048, small, 0, DecodeKernel::sm80_h16), Error);
  EXPECT_THROW(arch_spec(7, 5, 40), Error);
  // Callers with only an SM count plan for the current device, or for sm_90 without one.
  if (cuda_device_count() == 0) {
    const DecodePlan by_count = plan_sparse_decode(kSpecNvfp4Fp8Rope, 3, 128, 2048, 132);
    const DecodePlan by_arch = plan_sparse_decode(kSpecNvfp4Fp8Rope, 3, 128, 2048, kH200);
    EXPECT_EQ(by_count.kernel, by_arch.kernel);
    EXPECT_EQ(by_count.splits, by_arch.splits);
  }
  EXPECT_THROW(planning_arch(0), Error);
  for (DecodeKernel k : all_decode_kernels()) EXPECT_EQ(parse_decode_kernel(to_string(k)), k);
  EXPECT_EQ(parse_decode_kernel("automatic"), DecodeKernel::automatic);
  EXPECT_THROW(parse_decode_kernel("sm90"), Error);
}

// Numerics follow the kernel: the 16-head NVFP4 kernels keep K exact; only sm80_h16 carries a
// BF16 remainder of the weights.
TEST(DecodePlan, NumericsAreTheKernels) {
  for (DecodeKernel k : all_decode_kernels()) {
    const bool h16 = k == DecodeKernel::sm80_h16 || k == DecodeKernel::sm90_h16;
    EXPECT_EQ(decode_rounds_k_to_bf16(k), !h16) << to_string(k);
    EXPECT_EQ(decode_weights_are_bf16(k), k != DecodeKernel::sm80_h16) << to_string(k);
  }
}

// The warp-specialized kernels merge their splits inside the launch when the grid fits one wave
// of resident CTAs; other kernels and larger grids keep the merge launch.
TEST(DecodePlan, SplitsMergeInKernelWhenTheGridFitsOneWave) {
  const DecodePlan small = plan_sparse_decode(kSpecNvfp4Fp8Rope, 3, 128, 2048, kH200);
  EXPECT_EQ(small.kernel, DecodeKernel::sm90_ws_pair_wide);
  EXPECT_EQ(small.splits, 16);  // 96 CTAs
  EXPECT_TRUE(small.merge_in_kernel);
  EXPECT_EQ(small.partial_bytes, 2);  // BF16 partials when the splits merge inside the launch
  EXPECT_EQ(decode_workspace_layout(small, 3, 128).partial_out_bytes, size_t(3) * 128 * 16 * 512 * 2);
  EXPECT_TRUE(plan_sparse_decode(kSpecNvfp4Fp8Rope, 8, 128, 2048, kH200).merge_in_kernel);  // 128 CTAs
  EXPECT_TRUE(plan_sparse_decode(kSpecBf16, 3, 64, 2048, kH200).merge_in_kernel);
  // More CTAs than SMs, one split, fewer than 8 splits (32 heads or more for a CTA to merge), or a
  // 16-head kernel: no.
  const DecodePlan two = plan_sparse_decode(kSpecNvfp4Fp8Rope, 32, 128, 2048, kH200);
  EXPECT_EQ(two.splits, 2);
  EXPECT_FALSE(two.merge_in_kernel);
  EXPECT_EQ(two.partial_bytes, 4);  // fp32 partials for the merge launch
  EXPECT_FALSE(plan_sparse_decode(kSpecNvfp4Fp8Rope, 8, 128, 2048, kH200, 32).merge_in_kernel);
  EXPECT_FALSE(plan_sparse_decode(kSpecNvfp4Fp8Rope, 256, 64, 2048, kH200).merge_in_kernel);
  const DecodePlan h16 = plan_sparse_decode(kSpecNvfp4Fp8Rope, 3, 16, 2048, kH200);
  EXPECT_GT(h16.splits, 1);
  EXPECT_FALSE(h16.merge_in_kernel);
  EXPECT_EQ(h16.partial_bytes, 4);
  EXPECT_FALSE(plan_sparse_decode(kSpecFp8, 3, 64, 2048, kH200, 0, DecodeKernel::sm80_mma).merge_in_kernel);
  for (DecodeKernel k : all_decode_kernels()) {
    const bool ws = k == DecodeKernel::sm90_ws || k == DecodeKernel::sm90_ws_wide || k == DecodeKernel::sm90_ws_pair ||
                    k == DecodeKernel::sm90_ws_pair_wide;
    EXPECT_EQ(decode_merges_in_kernel(k, 16), ws) << to_string(k);
    EXPECT_FALSE(decode_merges_in_kernel(k, 1)) << to_string(k);
    EXPECT_FALSE(decode_merges_in_kernel(k, 65)) << to_string(k);
  }
}

// Every format and head count has a kernel on every supported device. Where the preferred kernel
// does not fit the device, the automatic choice is one that does: sm80_mma's 64-head stages need
// more shared memory than sm_80 (163 KB) or sm_86/89/120 (99 KB) give a CTA, so FP8 and BF16
// records run its 32-head groups there and NVFP4 records 16-head groups of sm80_h16.
TEST(DecodePlan, AutomaticChoiceFallsBackToAKernelThatFits) {
  for (const ArchSpec& arch : {arch_spec(8, 0, 108), arch_spec(8, 6, 84), arch_spec(8, 9, 128), arch_spec(12, 0, 148),
                               arch_spec(10, 0, 148), arch_spec(9, 0, 132)})
    for (const RecordSpec& spec : kAllRecordSpecs)
      for (int heads : {8, 16, 32, 48, 64, 128}) {
        const std::string what = to_string(spec) + " " + std::to_string(heads) + " heads on " + to_string(arch);
        EXPECT_FALSE(supported_decode_kernels(arch, spec, heads).empty()) << what;
        const DecodeKernel k = default_decode_kernel(arch, spec, heads);
        EXPECT_FALSE(decode_kernel_unsupported(k, arch, spec, heads).has_value()) << what << ": " << to_string(k);
        const DecodePlan plan = plan_sparse_decode(spec, 4, heads, 2048, arch);
        const auto shape = decode::kernel_shape_for_group(plan.kernel, spec, heads, plan.head_group);
        ASSERT_TRUE(shape.has_value()) << what;
        EXPECT_LE(shape->smem_bytes, arch.smem_per_block) << what;
        EXPECT_EQ(plan.num_head_groups, (heads + plan.head_group - 1) / plan.head_group) << what;
        if (!arch.wgmma && heads > 32) {
          EXPECT_EQ(plan.kernel, spec.is_nvfp4() && arch.smem_per_block < decode::kSmemBudgetPerBlock ? DecodeKernel::sm80_h16
                                                                                                      : DecodeKernel::sm80_mma)
              << what;
        }
      }
  // FP8 records at 128 heads: 64-head groups where 227 KB allow them (sm_100), 32-head ones on
  // sm_80 and the 99 KB devices.
  EXPECT_EQ(plan_sparse_decode(kSpecFp8, 4, 128, 2048, arch_spec(10, 0, 148)).head_group, 64);
  for (const ArchSpec& arch : {arch_spec(8, 0, 108), arch_spec(12, 0, 148)}) {
    const DecodePlan fp8 = plan_sparse_decode(kSpecFp8, 4, 128, 2048, arch);
    EXPECT_EQ(fp8.kernel, DecodeKernel::sm80_mma);
    EXPECT_EQ(fp8.head_group, 32) << to_string(arch);
    EXPECT_EQ(fp8.num_head_groups, 4);
    EXPECT_EQ(plan_sparse_decode(kSpecBf16, 4, 64, 2048, arch).head_group, arch.smem_per_block < 163 * 1024 ? 32 : 64);
  }
  // A group the kernel does not run for the heads is no shape.
  EXPECT_FALSE(decode::kernel_shape_for_group(DecodeKernel::sm80_mma, kSpecFp8, 32, 64).has_value());
  EXPECT_FALSE(decode::kernel_shape_for_group(DecodeKernel::sm80_mma, kSpecFp8, 128, 48).has_value());
  EXPECT_FALSE(decode::kernel_shape_for_group(DecodeKernel::sm90_ws_wide, kSpecFp8, 128, 32).has_value());
  EXPECT_TRUE(decode::kernel_shape_for_group(DecodeKernel::sm80_mma, kSpecFp8, 128, 16).has_value());
  // sm_90a keeps its measured choices.
  if (const ArchSpec h200 = arch_spec(9, 0, 132); h200.wgmma)
    EXPECT_EQ(default_decode_kernel(h200, kSpecNvfp4Fp8Rope, 128), DecodeKernel::sm90_ws_pair_wide);
}

// The portable 16-head kernel fits the smallest shared memory of the devices it serves (99 KB
// on sm_86/89/120) for every NVFP4 record width, so those devices run every NVFP4 format at 16
// heads with it: 432-byte records keep 4 record stages, 368-byte records 5.
TEST(DecodePlan, PortableSixteenHeadKernelFitsNinetyNineKilobytesForEveryNvfp4Format) {
  EXPECT_EQ(decode::h16_stages(368), 5);
  EXPECT_EQ(decode::h16_stages(432), 4);
  EXPECT_GT(decode::h16_smem_bytes(432, 5), decode::kSmemSmallestOptInPerBlock);  // why 432 keeps 4
  for (const ArchSpec& arch : {arch_spec(8, 6, 84), arch_spec(8, 9, 128), arch_spec(12, 0, 188), arch_spec(8, 0, 108)})
    for (const RecordSpec& spec : kAllRecordSpecs) {
      if (!spec.is_nvfp4()) continue;
      const auto why = decode_kernel_unsupported(DecodeKernel::sm80_h16, arch, spec, 16);
      EXPECT_FALSE(why.has_value()) << to_string(spec) << " on " << to_string(arch) << ": " << why.value_or("");
      for (int heads : {8, 16, 32}) {
        const DecodePlan plan = plan_sparse_decode(spec, 128, heads, 2048, arch);
        EXPECT_EQ(plan.kernel, DecodeKernel::sm80_h16) << to_string(spec) << " " << heads << " heads on " << to_string(arch);
        EXPECT_EQ(plan.stages, decode::h16_stages(spec.record_bytes()));
      }
    }
}

// No plan has more splits than the merge launch holds (a float per split in 48 KB) or the grid's
// z allows, however many the caller forces.
TEST(DecodePlan, SplitsStayWithinTheMergeLimit) {
  const DecodePlan p = plan_sparse_decode(kSpecNvfp4Fp8Rope, 2, 64, 1 << 20, kH200, 16384);
  EXPECT_LE(p.splits, decode::kMaxSplits);
  EXPECT_LE(decode::kMaxSplits, 65535);
  EXPECT_GE(int64_t(p.splits) * p.tiles_per_split, p.num_tiles);
}

// Walking rows (DecodePlan::row_ctas > 0) is sm90_ws_wide over bf16 records with one split only;
// the CTA count of such a plan is row_ctas per head group (or the rows, when fewer).
TEST(DecodePlan, OnlyTheBf16WideKernelWithOneSplitWalksRows) {
  DecodePlan bf16 = plan_sparse_decode(kSpecBf16, 500, 128, 2048, kH200, 1);
  ASSERT_EQ(bf16.kernel, DecodeKernel::sm90_ws_wide);
  EXPECT_EQ(bf16.row_ctas, 0);  // the decode planner never walks rows; the staged extend's does
  EXPECT_FALSE(decode_row_walk_unsupported(bf16, kSpecBf16));
  EXPECT_EQ(bf16.ctas(500), 1000);
  bf16.row_ctas = 66;
  EXPECT_FALSE(decode_row_walk_unsupported(bf16, kSpecBf16));
  EXPECT_EQ(bf16.ctas(500), 132);
  EXPECT_EQ(bf16.ctas(40), 80);  // fewer rows than row_ctas: one CTA per row
  bf16.row_ctas = -1;
  EXPECT_TRUE(decode_row_walk_unsupported(bf16, kSpecBf16));

  DecodePlan split = plan_sparse_decode(kSpecBf16, 3, 64, 2048, kH200, 4);
  ASSERT_GT(split.splits, 1);
  split.row_ctas = 2;
  EXPECT_TRUE(decode_row_walk_unsupported(split, kSpecBf16));
  for (const RecordSpec& spec : kAllRecordSpecs)
    for (DecodeKernel k : all_decode_kernels()) {
      if (decode_kernel_unsupported(k, kH200, spec, 128)) continue;
      DecodePlan plan = plan_sparse_decode(spec, 8, 128, 512, kH200, 1, k);
      plan.row_ctas = 4;
      const bool walks = k == DecodeKernel::sm90_ws_wide && spec.dtype == CacheDtype::bf16;
      EXPECT_EQ(!decode_row_walk_unsupported(plan, spec), walks) << to_string(k) << " " << to_string(spec);
    }
}
