#pragma once
// The shapes of the decode kernels as the planner sees them: CTA sizes, tiles, shared memory and
// record stages. Host-only and CUDA-free; each kernel checks its own layout against these at
// compile time (static_assert), so the planner and the kernels cannot drift apart.
#include <cstddef>
#include <optional>

#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/format.h"

namespace nvfp4mla::decode {

// The shared-memory budget the kernels' stage counts and layouts are compiled for: the opt-in
// maximum of sm_90 and sm_100 (227 KB per CTA, 228 KB per SM, 1 KB reserved per CTA). A device
// with less (ArchSpec) runs only the kernels whose bytes fit (decode_kernel_unsupported).
inline constexpr size_t kSmemBudgetPerBlock = 227 * 1024;
inline constexpr size_t kSmemBudgetPerSm = 228 * 1024;
inline constexpr size_t kSmemBudgetReservedPerCta = 1024;

// ---- sm80_mma: 16, 32 or 64 heads per CTA (the MMA's M), 32-entry tiles -------------------------
// Small head groups use few warps so that several CTAs share an SM and overlap their phases.
struct TileConfig {
  int head_group;   // 16, 32 or 64
  int warps;        // warps per CTA
  int tile_tokens;  // top-k entries per KV tile
  int min_ctas;     // CTAs per SM the kernel is compiled for (register budget)
};
constexpr TileConfig tile_config(int heads) {
  return heads <= 16 ? TileConfig{16, 4, 32, 3} : heads <= 32 ? TileConfig{32, 8, 32, 2} : TileConfig{64, 8, 32, 1};
}
inline constexpr int kPlannerTile = 32;  // top-k entries per planner tile, every kernel
// Shared memory of one CTA: Q and K tiles in BF16 (rows padded by 8 values), fp32 scores,
// `stages` raw record buffers (none for bf16 records, which are copied straight into the K
// tile) and the top-k index ring of 2 stages + 1 tiles.
constexpr size_t mma_smem_bytes(const TileConfig& c, int record_bytes, bool raw_is_k_row, int stages) {
  const size_t row = (kQkDim + 8) * 2;
  return size_t(c.head_group) * row + size_t(c.tile_tokens) * row + size_t(c.head_group) * (c.tile_tokens + 8) * 4 +
         (raw_is_k_row ? 0 : size_t(stages) * c.tile_tokens * record_bytes) + size_t(2 * stages + 1) * c.tile_tokens * 4;
}
// Raw record stages: as many as fit (up to 4) while `min_ctas` CTAs still share an SM; bf16
// records use a single tile.
constexpr int mma_stages(const TileConfig& c, int record_bytes, bool raw_is_k_row) {
  if (raw_is_k_row) return 1;
  for (int s = 4; s > 1; --s) {
    const size_t bytes = mma_smem_bytes(c, record_bytes, raw_is_k_row, s);
    if (bytes <= kSmemBudgetPerBlock && (bytes + kSmemBudgetReservedPerCta) * c.min_ctas <= kSmemBudgetPerSm) return s;
  }
  return 1;
}
// sm80_mma's head group on a device that gives a CTA `smem_per_block` bytes: the group the heads
// call for (tile_config), or the largest smaller one (32, then 16) whose compiled stages fit. 16
// when none does (the planner then refuses the kernel, naming its bytes).
constexpr int mma_head_group(int heads, int record_bytes, bool raw_is_k_row, size_t smem_per_block) {
  for (int g = tile_config(heads).head_group; g > 16; g /= 2) {
    const TileConfig c = tile_config(g);
    if (mma_smem_bytes(c, record_bytes, raw_is_k_row, mma_stages(c, record_bytes, raw_is_k_row)) <= smem_per_block) return g;
  }
  return 16;
}

// ---- sm80_h16: NVFP4 records, 16 heads, four warps, 32-entry sub-tiles --------------------------
inline constexpr int kH16Warps = 4, kH16Sub = 32, kH16MaxStages = 5, kH16MinCtas = 2;
// The smallest opt-in shared memory per CTA of the devices this portable kernel serves (sm_86,
// sm_89, sm_120: 99 KB); its stage count is chosen to fit them.
inline constexpr size_t kSmemSmallestOptInPerBlock = 99 * 1024;
constexpr size_t h16_smem_bytes(int record_bytes, int stages) {
  const size_t raw = size_t(stages) * kH16Sub * record_bytes;
  const size_t idx = size_t(2 * stages) * kH16Sub * 4, mask = size_t(stages) * kH16Sub * 4;
  const size_t scores = size_t(kH16Warps) * 16 * (kH16Sub + 8) * 4, p = size_t(2) * 16 * (kH16Sub + 8) * 2;
  const size_t heads = size_t(3) * 16 * 4, q = size_t(kH16Warps) * (kLatentDim / kH16Warps / 16 + 1) * 16 * 32;
  return raw + idx + mask + scores + p + heads + q;
}
// Raw record sub-tiles in flight: as many (up to 5) as fit 99 KB, so that every record width runs
// on every device (432-byte records: 4, 88,256 bytes; with 5 they would need 102,464).
constexpr int h16_stages(int record_bytes) {
  for (int s = kH16MaxStages; s > 2; --s)
    if (h16_smem_bytes(record_bytes, s) <= kSmemSmallestOptInPerBlock) return s;
  return 2;
}
constexpr size_t h16_smem_bytes(int record_bytes) { return h16_smem_bytes(record_bytes, h16_stages(record_bytes)); }

// ---- sm90_ws*: 64 heads, four warpgroups (two producers, two consumers) ---------------------------
inline constexpr int kWsWarps = 16, kWsHeads = 64, kWsTile = 32, kWsWideTile = 64;
// Q, two K buffers, P, per-head factors, per-entry masks, 8 mbarriers, then (32-entry tiles) as
// many raw record stages (up to 4) as fit, and the top-k index ring of 2 stages + 1 tiles.
constexpr size_t ws_smem_bytes(int record_bytes, bool pair, int tile, int stages) {
  const size_t k_buf = size_t(tile) * kQkDim * 2, tokens = pair ? tile / 2 : tile;
  const size_t raw_off = size_t(kWsHeads) * kQkDim * 2 + 2 * k_buf + size_t(kWsHeads) * tile * 2 + size_t(2) * kWsHeads * 4 +
                         size_t(2) * tile * 4 + 4 * 16;
  return raw_off + stages * tokens * record_bytes + (stages > 0 ? size_t(2 * stages + 1) * tile * 4 : 0);
}
// Whether a 64-entry kernel copies records into its K buffers (bf16 records, K rows already;
// sm90_ws_wide only) rather than dequantizing register slices (kv_tile.cuh: RecordSlice; NVFP4
// and FP8 records, sm90_ws_wide and sm90_ws_pair_wide).
constexpr bool ws_wide_copies(const RecordSpec& spec) { return spec.dtype == CacheDtype::bf16; }
constexpr int ws_stages(int record_bytes, bool pair, int tile) {
  if (tile == kWsWideTile) return 0;  // wide tiles: records travel in registers or go straight to the K buffers
  for (int s = 4; s > 1; --s)
    if (ws_smem_bytes(record_bytes, pair, tile, s) <= kSmemBudgetPerBlock) return s;
  return 1;
}

// ---- sm90_h16: NVFP4 records, 16 heads, two warpgroups on 64-entry tiles ---------------------------
// Records travel in registers one tile ahead; one CTA per SM; splits of whole 64-entry tiles whose
// top-k indices are staged in shared memory (at most kSm90H16MaxSplitEntries per split).
inline constexpr int kSm90H16Warps = 8, kSm90H16Tile = 64, kSm90H16MaxSplitEntries = 16384;

// A CTA's fixed cost in the split planner's estimate, in planner tiles: loading Q, filling the
// pipeline and storing the output (each extra split also costs partials and a merge).
inline constexpr int kCtaFixedTiles = 4;
// The most KV splits a plan may have: the merge launch keeps a float per split in its default
// 48 KB of shared memory (and the splits are the grid's z, at most 65535).
inline constexpr int kMaxSplits = 48 * 1024 / 4;

// The splits the warp-specialized kernels merge inside their launch, when their whole grid is
// resident at once: from 8 (a CTA merges at most 8 of its group's 64 heads; with 2 splits, 32
// heads each, 32 x 128 heads took 66.7 us against 62.8 with the merge launch) to 64 (the merge's
// weights fit in Q's buffer).
inline constexpr int kMinMergeInKernelSplits = 8, kMaxMergeInKernelSplits = 64;

// What the planner needs of a kernel for a problem.
struct KernelShape {
  int head_group = 0, warps = 0, tile_tokens = kPlannerTile, stages = 0;
  int max_ctas_per_sm = 1;     // the kernel's register budget
  size_t smem_bytes = 0;       // per CTA (the largest, for kernels whose use depends on the split)
  int split_tiles = 1;         // splits are whole multiples of this many planner tiles
  int max_split_entries = 0;   // 0: unbounded
};
// The kernel's shape for `heads` on a device giving a CTA `smem_per_block` bytes (only sm80_mma's
// head group depends on it).
KernelShape kernel_shape(DecodeKernel kernel, const RecordSpec& spec, int heads,
                         size_t smem_per_block = kSmemBudgetPerBlock);
// The kernel's shape with `head_group` query heads per CTA; nothing when the kernel does not run
// that group for `heads` (sm80_mma: 16, 32 or 64 up to tile_config(heads)'s; the others: theirs).
std::optional<KernelShape> kernel_shape_for_group(DecodeKernel kernel, const RecordSpec& spec, int heads, int head_group);

}  // namespace nvfp4mla::decode
