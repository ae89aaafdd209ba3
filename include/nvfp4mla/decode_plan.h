#pragma once
// Which split-KV sparse decode kernel runs a problem, how it divides the problem, and how much
// workspace it needs. Host-only and CUDA-free, so planners and tests use exactly what the kernel
// will use. The plan names its kernel; cuda::sparse_decode runs that kernel and no other.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nvfp4mla/arch.h"
#include "nvfp4mla/format.h"

namespace nvfp4mla {

// The decode kernels. sm80 kernels use mma.sync and cp.async (compute capability 8.0 and later:
// what sm_100 and sm_120 builds run); sm90 kernels use wgmma, setmaxnreg and clusters (sm_90a).
enum class DecodeKernel {
  automatic,          // the planner's choice for the architecture, format and head count
  sm80_mma,           // any format; 16-, 32- or 64-head groups by head count
  sm80_h16,           // NVFP4 records, 16-head groups, dequantization fed into registers
  sm90_ws,            // 64-head groups, warp-specialized, 32-entry tiles, one CTA per group
  sm90_ws_wide,       // ... with 64-entry tiles, NVFP4 and FP8 records
  sm90_ws_pair,       // ... the two groups of a row as a 2-CTA cluster (an even number of groups)
  sm90_ws_pair_wide,  // ... with 64-entry tiles, NVFP4 and FP8 records
  sm90_h16,           // NVFP4 records, 16-head groups, wgmma with the entries as M
};
// Every concrete kernel (not `automatic`), in declaration order.
const std::vector<DecodeKernel>& all_decode_kernels();
const char* to_string(DecodeKernel k);
// The kernel named `name` (to_string's names, "automatic" included); throws for another name.
DecodeKernel parse_decode_kernel(const std::string& name);

// Why `kernel` cannot run `spec` with `heads` query heads on `arch`, or nothing when it can.
std::optional<std::string> decode_kernel_unsupported(DecodeKernel kernel, const ArchSpec& arch, const RecordSpec& spec,
                                                     int heads);
// The kernels that can run it (what the GPU tests run every suite over).
std::vector<DecodeKernel> supported_decode_kernels(const ArchSpec& arch, const RecordSpec& spec, int heads);
// The planner's choice: the 16-head NVFP4 kernel for NVFP4 records with up to 32 heads, the
// warp-specialized kernels for more heads on sm_90a (in cluster pairs, with 64-entry tiles for
// NVFP4 records, when the groups pair up), else sm80_mma; where that one does not fit the device,
// sm80_h16 or sm80_mma if either does (else the preferred one, which the planner then refuses).
DecodeKernel default_decode_kernel(const ArchSpec& arch, const RecordSpec& spec, int heads);

// Whether `kernel` can merge `splits` splits inside its own launch (the warp-specialized sm90_ws*
// kernels, 8 to 64 splits).
bool decode_merges_in_kernel(DecodeKernel kernel, int splits);

// Whether `kernel` rounds each dequantized K value to BF16 before its MMAs (the reference of the
// same operands: ReferenceOptions::bf16_operands). The 16-head NVFP4 kernels do not: they feed
// the exact e2m1 * d products and apply the outer scales in fp32.
bool decode_rounds_k_to_bf16(DecodeKernel kernel);
// Whether its softmax weights enter the output product as single BF16 values (relative error up
// to 2^-9 each, as in FlashMLA); sm80_h16 adds a BF16 remainder (~16 bits).
bool decode_weights_are_bf16(DecodeKernel kernel);

struct DecodePlan {
  DecodeKernel kernel = DecodeKernel::sm80_mma;
  int head_group = 64;     // query heads per CTA: 16, 32 or 64
  int num_head_groups = 1; // ceil(heads / head_group)
  int warps = 16;          // warps per CTA
  int tile_tokens = 32;    // top-k entries per planner tile (splits are whole tiles)
  int ctas_per_sm = 1;     // resident CTAs per SM the planner assumed
  int stages = 1;          // record tiles in flight ahead of the one being computed (0: in registers)
  int num_tiles = 0;       // ceil(topk / tile_tokens)
  int splits = 1;          // KV splits per (row, head group); 1 = no partials, no merge
  int tiles_per_split = 0;
  int partial_bytes = 4;   // splits > 1: partial outputs in fp32 (4) or BF16 (2; the planner's choice with merge_in_kernel)
  // splits > 1: the split CTAs merge the partials themselves after a grid-wide barrier (a
  // cooperative launch: the whole grid resident at once) instead of a second, merge launch. The
  // planner sets it when the CTAs fit one wave of resident CTAs (decode_merges_in_kernel); a device
  // whose SMs hold fewer of the kernel's clusters at once runs the merge launch instead.
  bool merge_in_kernel = false;
  // 0: one CTA per (row, head group). n > 0 (sm90_ws_wide over bf16 records with one split: the
  // staged extend's plan, plan_extend_staged): n CTAs per head group, CTA y attending rows y,
  // y + n, ... in turn, its record copies and the next row's Q load running while it finishes a
  // row (decode_row_walk_unsupported).
  int row_ctas = 0;

  int64_t ctas(int rows) const {
    return static_cast<int64_t>(row_ctas > 0 && row_ctas < rows ? row_ctas : rows) * num_head_groups * splits;
  }
};

// The planner's DecodePlan::merge_in_kernel: the kernel can merge the plan's splits and its CTAs
// for `rows` fit one wave of resident CTAs on `sm_count` SMs.
bool plan_merges_in_kernel(const DecodePlan& plan, int rows, int sm_count);

// Why `plan` cannot walk rows (DecodePlan::row_ctas > 0) for `spec`, or nothing when it can:
// sm90_ws_wide over records it copies (bf16), one split.
std::optional<std::string> decode_row_walk_unsupported(const DecodePlan& plan, const RecordSpec& spec);

// The planner: the kernel (`kernel`, or default_decode_kernel for `automatic`; throws, naming
// the reason, for one that cannot run the problem on `arch`), its CTA shape, and the splits
// minimizing (waves of resident CTAs) x (tiles per split + a CTA's fixed cost of 4 tiles), the
// fewest on ties, without splitting below one tile or 64 entries (so splits <= ceil(topk/64)).
// `forced_splits` > 0 overrides (clamped the same way).
DecodePlan plan_sparse_decode(const RecordSpec& spec, int rows, int heads, int topk, const ArchSpec& arch,
                              int forced_splits = 0, DecodeKernel kernel = DecodeKernel::automatic);
// For callers that know only an SM count: the planner's kernel for the current CUDA device's
// architecture with `sm_count` SMs, or for compute capability 9.0 when no device is visible.
DecodePlan plan_sparse_decode(const RecordSpec& spec, int rows, int heads, int topk, int sm_count,
                              int forced_splits = 0);
// That architecture.
ArchSpec planning_arch(int sm_count);

// Workspace bytes for the plan: fp32 partial outputs [rows, heads, splits, 512] and partial
// log-sum-exp [rows, heads, splits], each region aligned to 256 bytes; 0 when splits == 1.
struct DecodeWorkspaceLayout {
  size_t partial_out_offset = 0, partial_out_bytes = 0;
  size_t partial_lse_offset = 0, partial_lse_bytes = 0;
  size_t total_bytes = 0;
};
DecodeWorkspaceLayout decode_workspace_layout(const DecodePlan& plan, int rows, int heads);

}  // namespace nvfp4mla
