#pragma once
// How the split-KV sparse decode kernel divides a problem, and how much workspace it needs.
// Host-only and CUDA-free, so planners and tests use exactly what the kernel will use.
#include <cstddef>
#include <cstdint>

namespace nvfp4mla {

struct DecodePlan {
  int head_group = 64;     // query heads per CTA: 16, 32 or 64 (M of the MMA tiles)
  int num_head_groups = 1; // ceil(heads / head_group)
  int tile_tokens = 64;    // top-k entries per KV tile
  int num_tiles = 0;       // ceil(topk / tile_tokens)
  int splits = 1;          // KV splits per (row, head group); 1 = no partials, no merge
  int tiles_per_split = 0;
  int partial_bytes = 4;   // fp32 partial outputs

  int64_t ctas(int rows) const { return static_cast<int64_t>(rows) * num_head_groups * splits; }
};

// The planner: head group from the head count (8 and 16 heads use 16-row tiles, 32 heads
// 32-row tiles, more heads 64-row tiles); splits so that the grid fills about two waves of
// the SMs without splitting below one tile. `forced_splits` > 0 overrides (clamped to tiles).
DecodePlan plan_sparse_decode(int rows, int heads, int topk, int sm_count, int forced_splits = 0);

// Workspace bytes for the plan: fp32 partial outputs [rows, heads, splits, 512] and partial
// log-sum-exp [rows, heads, splits], each region aligned to 256 bytes; 0 when splits == 1.
struct DecodeWorkspaceLayout {
  size_t partial_out_offset = 0, partial_out_bytes = 0;
  size_t partial_lse_offset = 0, partial_lse_bytes = 0;
  size_t total_bytes = 0;
};
DecodeWorkspaceLayout decode_workspace_layout(const DecodePlan& plan, int rows, int heads);

}  // namespace nvfp4mla
