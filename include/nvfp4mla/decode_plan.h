#pragma once
// How the split-KV sparse decode kernel divides a problem, and how much workspace it needs.
// Host-only and CUDA-free, so planners and tests use exactly what the kernel will use.
#include <cstddef>
#include <cstdint>

#include "nvfp4mla/format.h"

namespace nvfp4mla {

// The CTA shape for a head group (query heads per CTA = the MMA's M). Small head groups use
// few warps so that several CTAs share an SM and overlap their phases; the 64-head tile needs
// the whole SM (on sm_90 it runs as a warp-specialized kernel with the same 32-entry tiles, or
// for pairs of NVFP4 head groups with 64-entry tiles of two planner tiles: see sparse_decode.cu
// and decode_uses_wide_tiles below).
struct DecodeTileConfig {
  int head_group;   // 16, 32 or 64
  int warps;        // warps per CTA
  int tile_tokens;  // top-k entries per KV tile
  int min_ctas;     // CTAs per SM the kernel is compiled for (register budget)
};
constexpr DecodeTileConfig decode_tile_config(int head_group) {
  return head_group <= 16 ? DecodeTileConfig{16, 4, 32, 3}
       : head_group <= 32 ? DecodeTileConfig{32, 8, 32, 2}
                          : DecodeTileConfig{64, 8, 32, 1};
}
// Shared memory of one CTA: Q and K tiles in BF16 (rows padded by 8 values), fp32 scores,
// `stages` raw record buffers (none for bf16 records, which are copied straight into the K
// tile) and the top-k index ring of 2 stages + 1 tiles.
constexpr size_t decode_smem_bytes(const DecodeTileConfig& c, int record_bytes, bool raw_is_k_row, int stages) {
  const size_t row = (kQkDim + 8) * 2;
  return size_t(c.head_group) * row + size_t(c.tile_tokens) * row + size_t(c.head_group) * (c.tile_tokens + 8) * 4 +
         (raw_is_k_row ? 0 : size_t(stages) * c.tile_tokens * record_bytes) + size_t(2 * stages + 1) * c.tile_tokens * 4;
}
inline constexpr size_t kDecodeSmemPerSm = 228 * 1024;      // Hopper: shared memory per SM
inline constexpr size_t kDecodeSmemPerBlock = 227 * 1024;   // ... and per CTA (opt-in maximum)
inline constexpr size_t kDecodeSmemReservedPerCta = 1024;   // the runtime's reservation per CTA
// Raw record stages: how many KV tiles are in flight ahead of the one being computed. As many
// as fit (up to 4) while `min_ctas` CTAs still share an SM; bf16 records use a single tile.
constexpr int decode_stages(const DecodeTileConfig& c, int record_bytes, bool raw_is_k_row) {
  if (raw_is_k_row) return 1;
  for (int s = 4; s > 1; --s) {
    const size_t bytes = decode_smem_bytes(c, record_bytes, raw_is_k_row, s);
    if (bytes <= kDecodeSmemPerBlock && (bytes + kDecodeSmemReservedPerCta) * c.min_ctas <= kDecodeSmemPerSm) return s;
  }
  return 1;
}

// NVFP4 records with 16-head groups run kernels of their own (sparse_decode_h16_sm90.cu on
// sm_90: two warpgroups of wgmma on 64-entry tiles, kDecodeH16TileTiles planner tiles, records
// loaded into registers one tile ahead, one CTA per SM; sparse_decode_h16.cu elsewhere). The plan
// describes the sm_90 kernel: kDecodeH16Warps warps, kDecodeH16Stages tiles in flight,
// kDecodeH16CtasPerSm CTAs per SM, splits of whole 64-entry tiles.
inline constexpr int kDecodeH16Warps = 8;
inline constexpr int kDecodeH16Stages = 1;
inline constexpr int kDecodeH16CtasPerSm = 1;
inline constexpr int kDecodeH16TileTiles = 2;
// ... whose CTAs stage their split's top-k indices in shared memory: at most this many entries
// per split (the planner adds splits for longer top-k lists).
inline constexpr int kDecodeH16MaxSplitEntries = 16384;
// Whether a plan for this format and head group runs those kernels.
constexpr bool decode_uses_h16_kernel(const RecordSpec& spec, int head_group) { return spec.is_nvfp4() && head_group == 16; }

// NVFP4 records with 64-head groups in pairs (128 heads and more) run, on sm_90, a kernel whose
// K buffers hold kDecodeWideTileTiles planner tiles (64 entries); splits then cover whole wide
// tiles where they can (a wide tile reaching past its split's end only masks the rest).
inline constexpr int kDecodeWideTileTiles = 2;
constexpr bool decode_uses_wide_tiles(const RecordSpec& spec, int head_group, int num_head_groups) {
  return spec.is_nvfp4() && head_group == 64 && num_head_groups % 2 == 0;
}

// A CTA's fixed cost in the split planner's estimate, in KV tiles: loading Q, filling the
// pipeline and storing the output (each extra split also costs partials and a merge).
inline constexpr int kDecodeCtaFixedTiles = 4;

struct DecodePlan {
  int head_group = 64;     // query heads per CTA: 16, 32 or 64 (M of the MMA tiles)
  int num_head_groups = 1; // ceil(heads / head_group)
  int warps = 16;          // warps per CTA
  int tile_tokens = 64;    // top-k entries per KV tile
  int ctas_per_sm = 1;     // resident CTAs per SM the planner assumed
  int stages = 1;          // raw record tiles in flight ahead of the one being computed
  int num_tiles = 0;       // ceil(topk / tile_tokens)
  int splits = 1;          // KV splits per (row, head group); 1 = no partials, no merge
  int tiles_per_split = 0;
  int partial_bytes = 4;   // fp32 partial outputs

  int64_t ctas(int rows) const { return static_cast<int64_t>(rows) * num_head_groups * splits; }
};

// The planner: tile configuration from the head count (8 and 16 heads use 16-row tiles; 17-32
// heads 32-row tiles, or two 16-head groups with NVFP4 records; more heads 64-row tiles); splits
// minimizing (waves of resident CTAs) x (tiles per split + kDecodeCtaFixedTiles), the fewest on
// ties, without splitting below one tile or 64 entries (so splits <= ceil(topk/64)).
// `forced_splits` > 0 overrides (clamped the same way).
DecodePlan plan_sparse_decode(const RecordSpec& spec, int rows, int heads, int topk, int sm_count,
                              int forced_splits = 0);

// Workspace bytes for the plan: fp32 partial outputs [rows, heads, splits, 512] and partial
// log-sum-exp [rows, heads, splits], each region aligned to 256 bytes; 0 when splits == 1.
struct DecodeWorkspaceLayout {
  size_t partial_out_offset = 0, partial_out_bytes = 0;
  size_t partial_lse_offset = 0, partial_lse_bytes = 0;
  size_t total_bytes = 0;
};
DecodeWorkspaceLayout decode_workspace_layout(const DecodePlan& plan, int rows, int heads);

}  // namespace nvfp4mla
