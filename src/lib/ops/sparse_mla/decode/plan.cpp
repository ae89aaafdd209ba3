// The decode planner: which kernel, its CTA shape and the KV splits (decode_plan.h).
#include "nvfp4mla/decode_plan.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "nvfp4mla/device.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/format.h"
#include "ops/sparse_mla/decode/kernel_shapes.h"

namespace nvfp4mla {

namespace {
size_t align256(size_t n) { return (n + 255) / 256 * 256; }
bool is_sm90(DecodeKernel k) {
  return k == DecodeKernel::sm90_ws || k == DecodeKernel::sm90_ws_wide || k == DecodeKernel::sm90_ws_pair ||
         k == DecodeKernel::sm90_ws_pair_wide || k == DecodeKernel::sm90_h16;
}
}  // namespace

const std::vector<DecodeKernel>& all_decode_kernels() {
  static const std::vector<DecodeKernel> all = {
      DecodeKernel::sm80_mma,     DecodeKernel::sm80_h16,          DecodeKernel::sm90_ws, DecodeKernel::sm90_ws_wide,
      DecodeKernel::sm90_ws_pair, DecodeKernel::sm90_ws_pair_wide, DecodeKernel::sm90_h16};
  return all;
}

const char* to_string(DecodeKernel k) {
  switch (k) {
    case DecodeKernel::automatic: return "automatic";
    case DecodeKernel::sm80_mma: return "sm80_mma";
    case DecodeKernel::sm80_h16: return "sm80_h16";
    case DecodeKernel::sm90_ws: return "sm90_ws";
    case DecodeKernel::sm90_ws_wide: return "sm90_ws_wide";
    case DecodeKernel::sm90_ws_pair: return "sm90_ws_pair";
    case DecodeKernel::sm90_ws_pair_wide: return "sm90_ws_pair_wide";
    case DecodeKernel::sm90_h16: return "sm90_h16";
  }
  return "unknown";
}

DecodeKernel parse_decode_kernel(const std::string& name) {
  if (name == "automatic") return DecodeKernel::automatic;
  std::string names = "automatic";
  for (DecodeKernel k : all_decode_kernels()) {
    if (name == to_string(k)) return k;
    names += std::string(", ") + to_string(k);
  }
  throw Error("decode kernel: unknown name '" + name + "' (one of " + names + ")");
}

bool decode_merges_in_kernel(DecodeKernel k, int splits) {
  const bool ws = k == DecodeKernel::sm90_ws || k == DecodeKernel::sm90_ws_wide || k == DecodeKernel::sm90_ws_pair ||
                  k == DecodeKernel::sm90_ws_pair_wide;
  return ws && splits >= decode::kMinMergeInKernelSplits && splits <= decode::kMaxMergeInKernelSplits;
}

bool plan_merges_in_kernel(const DecodePlan& plan, int rows, int sm_count) {
  return decode_merges_in_kernel(plan.kernel, plan.splits) &&
         plan.ctas(rows) <= static_cast<int64_t>(sm_count) * plan.ctas_per_sm;
}

std::optional<std::string> decode_row_walk_unsupported(const DecodePlan& plan, const RecordSpec& spec) {
  if (plan.row_ctas < 0) return std::string("must not be negative");
  if (plan.row_ctas == 0) return std::nullopt;
  if (plan.kernel != DecodeKernel::sm90_ws_wide || !decode::ws_wide_copies(spec))
    return std::string("only sm90_ws_wide over bf16 records walks rows");
  if (plan.splits != 1 || plan.merge_in_kernel) return std::string("walking rows needs one split per row");
  return std::nullopt;
}

bool decode_rounds_k_to_bf16(DecodeKernel k) { return k != DecodeKernel::sm80_h16 && k != DecodeKernel::sm90_h16; }
bool decode_weights_are_bf16(DecodeKernel k) { return k != DecodeKernel::sm80_h16; }

namespace decode {

std::optional<KernelShape> kernel_shape_for_group(DecodeKernel kernel, const RecordSpec& spec, int heads, int head_group) {
  const int rb = spec.record_bytes();
  const bool raw_is_k_row = spec.dtype == CacheDtype::bf16;
  KernelShape s;
  switch (kernel) {
    case DecodeKernel::sm80_mma: {
      if (head_group != 16 && head_group != 32 && head_group != 64) return std::nullopt;
      if (head_group > tile_config(heads).head_group) return std::nullopt;
      const TileConfig c = tile_config(head_group);
      s.head_group = c.head_group;
      s.warps = c.warps;
      s.tile_tokens = c.tile_tokens;
      s.stages = mma_stages(c, rb, raw_is_k_row);
      s.max_ctas_per_sm = c.min_ctas;
      s.smem_bytes = mma_smem_bytes(c, rb, raw_is_k_row, s.stages);
      return s;
    }
    case DecodeKernel::sm80_h16:
      s.head_group = 16;
      s.warps = kH16Warps;
      s.stages = h16_stages(rb);
      s.max_ctas_per_sm = kH16MinCtas;
      s.smem_bytes = h16_smem_bytes(rb);
      break;
    case DecodeKernel::sm90_ws:
    case DecodeKernel::sm90_ws_wide:
    case DecodeKernel::sm90_ws_pair:
    case DecodeKernel::sm90_ws_pair_wide: {
      const bool pair = kernel == DecodeKernel::sm90_ws_pair || kernel == DecodeKernel::sm90_ws_pair_wide;
      const bool wide = kernel == DecodeKernel::sm90_ws_wide || kernel == DecodeKernel::sm90_ws_pair_wide;
      const int tile = wide ? kWsWideTile : kWsTile;
      s.head_group = kWsHeads;
      s.warps = kWsWarps;
      s.stages = ws_stages(rb, pair, tile);
      s.smem_bytes = ws_smem_bytes(rb, pair, tile, s.stages);
      // A wide tile reaching past its split's end only masks the rest; splits cover whole ones.
      s.split_tiles = tile / kPlannerTile;
      break;
    }
    case DecodeKernel::sm90_h16:
      s.head_group = 16;
      s.warps = kSm90H16Warps;
      s.stages = 1;  // records in registers, one tile ahead
      s.smem_bytes = kSmemBudgetPerBlock;
      s.split_tiles = kSm90H16Tile / kPlannerTile;
      s.max_split_entries = kSm90H16MaxSplitEntries;
      break;
    case DecodeKernel::automatic: throw Error("decode plan: 'automatic' names no kernel");
  }
  if (head_group != s.head_group) return std::nullopt;
  return s;
}

KernelShape kernel_shape(DecodeKernel kernel, const RecordSpec& spec, int heads, size_t smem_per_block) {
  if (kernel == DecodeKernel::automatic) throw Error("decode plan: 'automatic' names no kernel");
  int group = 16;
  if (kernel == DecodeKernel::sm80_mma)
    group = mma_head_group(heads, spec.record_bytes(), spec.dtype == CacheDtype::bf16, smem_per_block);
  else if (kernel == DecodeKernel::sm90_ws || kernel == DecodeKernel::sm90_ws_wide || kernel == DecodeKernel::sm90_ws_pair ||
           kernel == DecodeKernel::sm90_ws_pair_wide)
    group = kWsHeads;
  return *kernel_shape_for_group(kernel, spec, heads, group);
}

}  // namespace decode

std::optional<std::string> decode_kernel_unsupported(DecodeKernel kernel, const ArchSpec& arch, const RecordSpec& spec,
                                                     int heads) {
  if (kernel == DecodeKernel::automatic) return "names no kernel";
  if (heads <= 0) return "needs a positive head count";
  if (arch.cc_major < 8) return "needs compute capability 8.0 or later";
  const bool h16 = kernel == DecodeKernel::sm80_h16 || kernel == DecodeKernel::sm90_h16;
  if (h16 && !spec.is_nvfp4()) return "runs NVFP4 records only";
  if (kernel == DecodeKernel::sm90_ws_pair_wide && decode::ws_wide_copies(spec))
    return "runs NVFP4 and FP8 records only (bf16 records: sm90_ws_wide)";
  if (is_sm90(kernel) && !arch.wgmma)
    return "needs sm_90a (wgmma, setmaxnreg) and a library built for it; the device is sm_" +
           std::to_string(arch.compute_capability());
  if ((kernel == DecodeKernel::sm90_ws_pair || kernel == DecodeKernel::sm90_ws_pair_wide)) {
    if (!arch.clusters) return std::string("needs thread block clusters");
    const int groups = (heads + decode::kWsHeads - 1) / decode::kWsHeads;
    if (groups % 2 != 0) return "pairs 64-head groups: needs an even number of them (" + std::to_string(heads) + " heads)";
  }
  const decode::KernelShape s = decode::kernel_shape(kernel, spec, heads, arch.smem_per_block);
  if (s.smem_bytes > arch.smem_per_block)
    return "needs " + std::to_string(s.smem_bytes) + " bytes of shared memory per CTA; the device allows " +
           std::to_string(arch.smem_per_block);
  return std::nullopt;
}

std::vector<DecodeKernel> supported_decode_kernels(const ArchSpec& arch, const RecordSpec& spec, int heads) {
  std::vector<DecodeKernel> out;
  for (DecodeKernel k : all_decode_kernels())
    if (!decode_kernel_unsupported(k, arch, spec, heads)) out.push_back(k);
  return out;
}

namespace {

// The kernel measured fastest for the shape, whether or not this device can run it.
DecodeKernel preferred_decode_kernel(const ArchSpec& arch, const RecordSpec& spec, int heads) {
  // NVFP4 records with up to 32 heads (e.g. 128 heads split 4 ways by tensor parallelism) run as
  // 16-head groups of a 16-head kernel: on the H200, rows 128 x 32 heads in the 32-head tiles of
  // sm80_mma took 182.9 us, as long as 128 x 128 heads; as two 16-head groups 111.3 us.
  if (spec.is_nvfp4() && heads <= 32) return arch.wgmma ? DecodeKernel::sm90_h16 : DecodeKernel::sm80_h16;
  if (!arch.wgmma) return DecodeKernel::sm80_mma;
  // BF16 records: single 64-entry CTAs copying the records into swizzled K buffers, every head
  // count (H200, 256 rows x 2048: 192.1 us at 64 heads against sm90_ws's 394.2; 371.8 at 128
  // heads against sm90_ws_pair's 581.5; 176.6 / 170.5 us at 32 / 16 heads, padded to 64, against
  // sm80_mma's 337.7 / 241.7).
  if (decode::ws_wide_copies(spec)) return DecodeKernel::sm90_ws_wide;
  // FP8 records with up to 32 heads run one 64-head group of the warp-specialized kernel, padded
  // (FlashMLA pads to 64 too): in sm80_mma's 16- and 32-row tiles they took longer than 64 heads
  // (H200, 256 rows: 328.4 us at 32 heads, 286.4 at 16, 263.3 at 64).
  if (heads <= 32) return DecodeKernel::sm90_ws_wide;
  // 64-entry tiles against 32 (H200, 256 rows x 2048): NVFP4-368 at 64 heads 215.0 us against
  // 267.6; FP8 at 64 heads 222.0 against 264.6, at 128 heads (pairs) 365.2 against 422.9.
  if (((heads + decode::kWsHeads - 1) / decode::kWsHeads) % 2 == 0 && arch.clusters) return DecodeKernel::sm90_ws_pair_wide;
  return DecodeKernel::sm90_ws_wide;
}

}  // namespace

DecodeKernel default_decode_kernel(const ArchSpec& arch, const RecordSpec& spec, int heads) {
  const DecodeKernel preferred = preferred_decode_kernel(arch, spec, heads);
  // Where sm80_mma's head group does not fit the device (its 64-head stages need more than the 163
  // KB of an sm_80 CTA or the 99 KB of sm_86/89/120), it runs smaller groups; NVFP4 records then
  // run 16-head groups of sm80_h16 instead, which measured faster than sm80_mma's 32-head groups
  // (H200, rows 128 x 32 heads: 111.3 us against 182.9).
  const bool shrunk = preferred == DecodeKernel::sm80_mma &&
                      decode::kernel_shape(preferred, spec, heads, arch.smem_per_block).head_group <
                          decode::tile_config(heads).head_group;
  if (!decode_kernel_unsupported(preferred, arch, spec, heads) && !(shrunk && spec.is_nvfp4())) return preferred;
  // Otherwise the portable kernel that runs; the preferred one when none does, so that the error
  // names it.
  for (DecodeKernel k : {DecodeKernel::sm80_h16, DecodeKernel::sm80_mma})
    if (!decode_kernel_unsupported(k, arch, spec, heads)) return k;
  return preferred;
}

DecodePlan plan_sparse_decode(const RecordSpec& spec, int rows, int heads, int topk, const ArchSpec& arch,
                              int forced_splits, DecodeKernel kernel) {
  if (rows < 0 || heads <= 0 || topk <= 0) throw Error("decode plan: rows >= 0, heads > 0 and topk > 0 required");
  if (arch.sm_count <= 0) throw Error("decode plan: SM count must be positive");
  if (kernel == DecodeKernel::automatic) kernel = default_decode_kernel(arch, spec, heads);
  if (const auto why = decode_kernel_unsupported(kernel, arch, spec, heads))
    throw Error(std::string("decode plan: kernel ") + to_string(kernel) + " " + *why + " (" + to_string(arch) + ")");
  const decode::KernelShape shape = decode::kernel_shape(kernel, spec, heads, arch.smem_per_block);
  DecodePlan p;
  p.kernel = kernel;
  p.head_group = shape.head_group;
  p.warps = shape.warps;
  p.tile_tokens = shape.tile_tokens;
  p.stages = shape.stages;
  const size_t per_cta = shape.smem_bytes + arch.smem_reserved_per_cta;
  p.ctas_per_sm = static_cast<int>(std::max<size_t>(1, std::min<size_t>(shape.max_ctas_per_sm, arch.smem_per_sm / per_cta)));
  p.num_head_groups = (heads + p.head_group - 1) / p.head_group;
  p.num_tiles = (topk + p.tile_tokens - 1) / p.tile_tokens;
  // Never below 64 entries per split (the bound serving planners size scratch with).
  const int max_splits = std::min({p.num_tiles, (topk + 63) / 64, decode::kMaxSplits});
  const int split_tiles = shape.split_tiles;
  auto tiles_per_split = [&](int s) { return ((p.num_tiles + s - 1) / s + split_tiles - 1) / split_tiles * split_tiles; };
  int min_splits = 1;
  if (shape.max_split_entries > 0)
    while (tiles_per_split(min_splits) * p.tile_tokens > shape.max_split_entries) ++min_splits;
  int splits = 1;
  if (forced_splits > 0) {
    splits = std::clamp(forced_splits, std::min(min_splits, max_splits), max_splits);
  } else {
    // Estimated time ~ (waves of resident CTAs) x (tiles per CTA + kCtaFixedTiles); the fewest
    // splits reaching the smallest estimate win. H200, same call: rows 256 x 64 heads ran 388 us
    // with 1 split (2 waves of 64 tiles) and 467 us with 2; rows 128 x 16 heads 157 us with 3
    // splits and 168 us with 7.
    const int64_t base = std::max<int64_t>(1, static_cast<int64_t>(rows) * p.num_head_groups);
    const int64_t slots = static_cast<int64_t>(arch.sm_count) * p.ctas_per_sm;
    int64_t best = INT64_MAX;
    for (int s = std::min(min_splits, max_splits); s <= max_splits; ++s) {
      const int per_split = tiles_per_split(s);
      const int64_t ctas = base * ((p.num_tiles + per_split - 1) / per_split);
      const int64_t estimate = (ctas + slots - 1) / slots * (per_split + decode::kCtaFixedTiles);
      if (estimate < best) {
        best = estimate;
        splits = s;
      }
    }
  }
  p.tiles_per_split = std::min(tiles_per_split(splits), p.num_tiles);
  p.splits = (p.num_tiles + p.tiles_per_split - 1) / p.tiles_per_split;  // no empty split
  p.merge_in_kernel = plan_merges_in_kernel(p, rows, arch.sm_count);
  // Merged inside the launch, the partials' trip through L2 (written, then read by other CTAs)
  // is most of a small batch's time, and BF16 partials halve it (docs/PERF.md). The merge launch
  // keeps fp32 ones.
  p.partial_bytes = p.merge_in_kernel ? 2 : 4;
  return p;
}

ArchSpec planning_arch(int sm_count) {
  if (sm_count <= 0) throw Error("decode plan: SM count must be positive");
  if (cuda_device_count() == 0) return arch_spec(9, 0, sm_count);
  ArchSpec a = current_device_arch();
  a.sm_count = sm_count;
  return a;
}

DecodePlan plan_sparse_decode(const RecordSpec& spec, int rows, int heads, int topk, int sm_count, int forced_splits) {
  return plan_sparse_decode(spec, rows, heads, topk, planning_arch(sm_count), forced_splits);
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
