#include "nvfp4mla/decode_plan.h"

#include <algorithm>
#include <cstdint>

#include "nvfp4mla/error.h"
#include "nvfp4mla/format.h"

namespace nvfp4mla {

namespace {
size_t align256(size_t n) { return (n + 255) / 256 * 256; }
}  // namespace

DecodePlan plan_sparse_decode(const RecordSpec& spec, int rows, int heads, int topk, int sm_count, int forced_splits) {
  if (rows < 0 || heads <= 0 || topk <= 0) throw Error("decode plan: rows >= 0, heads > 0 and topk > 0 required");
  if (sm_count <= 0) throw Error("decode plan: SM count must be positive");
  // NVFP4 records with up to 32 heads (e.g. 128 heads split 4 ways by tensor parallelism) run as
  // 16-head groups of the 16-head kernel: on the H200, rows 128 x 32 heads took 182.9 us in the
  // 32-head tiles of the generic kernel, as long as 128 x 128 heads (docs/PERF.md, twelfth session).
  const DecodeTileConfig cfg = decode_tile_config(decode_uses_h16_kernel(spec, 16) && heads <= 32 ? 16 : heads);
  DecodePlan p;
  p.head_group = cfg.head_group;
  p.warps = cfg.warps;
  p.tile_tokens = cfg.tile_tokens;
  const bool raw_is_k_row = spec.dtype == CacheDtype::bf16;
  p.stages = decode_stages(cfg, spec.record_bytes(), raw_is_k_row);
  const size_t smem = decode_smem_bytes(cfg, spec.record_bytes(), raw_is_k_row, p.stages) + kDecodeSmemReservedPerCta;
  p.ctas_per_sm = static_cast<int>(std::max<size_t>(1, std::min<size_t>(cfg.min_ctas, kDecodeSmemPerSm / smem)));
  if (decode_uses_h16_kernel(spec, cfg.head_group)) {
    p.warps = kDecodeH16Warps;
    p.stages = kDecodeH16Stages;
    p.ctas_per_sm = kDecodeH16CtasPerSm;
  }
  p.num_head_groups = (heads + p.head_group - 1) / p.head_group;
  p.num_tiles = (topk + p.tile_tokens - 1) / p.tile_tokens;
  // Never below 64 entries per split (the bound serving planners size scratch with).
  const int max_splits = std::min(p.num_tiles, (topk + 63) / 64);
  const int split_tiles = decode_uses_wide_tiles(spec, p.head_group, p.num_head_groups) ? kDecodeWideTileTiles
                          : decode_uses_h16_kernel(spec, p.head_group)                    ? kDecodeH16TileTiles
                                                                                          : 1;
  auto tiles_per_split = [&](int s) { return ((p.num_tiles + s - 1) / s + split_tiles - 1) / split_tiles * split_tiles; };
  // The 16-head NVFP4 kernels hold a split's indices in shared memory.
  int min_splits = 1;
  if (decode_uses_h16_kernel(spec, p.head_group))
    while (tiles_per_split(min_splits) * p.tile_tokens > kDecodeH16MaxSplitEntries) ++min_splits;
  int splits = 1;
  if (forced_splits > 0) {
    splits = std::clamp(forced_splits, std::min(min_splits, max_splits), max_splits);
  } else {
    // Estimated time ~ (waves of resident CTAs) x (tiles per CTA + kDecodeCtaFixedTiles); the
    // fewest splits reaching the smallest estimate win. H200, same call: rows 256 x 64 heads ran
    // 388 us with 1 split (2 waves of 64 tiles) and 467 us with 2; rows 128 x 16 heads 157 us
    // with 3 splits and 168 us with 7.
    const int64_t base = std::max<int64_t>(1, static_cast<int64_t>(rows) * p.num_head_groups);
    const int64_t slots = static_cast<int64_t>(sm_count) * p.ctas_per_sm;
    int64_t best = INT64_MAX;
    for (int s = std::min(min_splits, max_splits); s <= max_splits; ++s) {
      const int per_split = tiles_per_split(s);
      const int64_t ctas = base * ((p.num_tiles + per_split - 1) / per_split);
      const int64_t estimate = (ctas + slots - 1) / slots * (per_split + kDecodeCtaFixedTiles);
      if (estimate < best) {
        best = estimate;
        splits = s;
      }
    }
  }
  p.tiles_per_split = std::min(tiles_per_split(splits), p.num_tiles);
  p.splits = (p.num_tiles + p.tiles_per_split - 1) / p.tiles_per_split;  // no empty split
  return p;
}

DecodeWorkspaceLayout decode_workspace_layout(const DecodePlan& plan, int rows, int heads) {
  DecodeWorkspaceLayout w;
  if (plan.splits <= 1) return w;
  const size_t entries = static_cast<size_t>(rows) * heads * plan.splits;
  w.partial_out_bytes = align256(entries * kLatentDim * plan.partial_bytes);
  w.partial_lse_offset = w.partial_out_bytes;
  w.partial_lse_bytes = align256(entries * sizeof(float));
  w.total_bytes = w.partial_out_bytes + w.partial_lse_bytes;
  return w;
}

}  // namespace nvfp4mla
