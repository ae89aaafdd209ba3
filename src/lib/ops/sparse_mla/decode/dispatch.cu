// The host side of cuda::sparse_decode: checks the arguments and the plan, fills the kernel
// parameters, runs the kernel the plan names (one switch; no other selection anywhere) and, with
// several splits, the merge. The kernels: sm80/ (mma.sync) and sm90/ (wgmma), instantiated per
// record format in instantiations/.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "device/cuda_check.h"
#include "nvfp4mla/arch.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/error.h"
#include "ops/sparse_mla/decode/common/decode_common.cuh"
#include "ops/sparse_mla/decode/common/launchers.h"
#include "ops/sparse_mla/decode/kernel_shapes.h"
#include "ops/sparse_mla/format_dispatch.cuh"

namespace nvfp4mla::cuda {
namespace {

// Runs the plan's kernel; returns whether it merged the splits itself.
template <class F>
bool run_kernel(DecodeKernel kernel, const DecodePlan& plan, const DecodeParams& p, int rows, cudaStream_t stream) {
  constexpr bool nvfp4 = F::spec.dtype == CacheDtype::nvfp4_ds_mla;
  const int groups = plan.num_head_groups;
  switch (kernel) {
    case DecodeKernel::sm80_mma: launch_sm80_mma<F>(p, plan.head_group, rows, groups, stream); return false;
    case DecodeKernel::sm80_h16:
      if constexpr (nvfp4) {
        launch_decode_h16<F>(p, rows, groups, stream);
        return false;
      }
      break;
    case DecodeKernel::sm90_ws: return launch_decode_ws<F, false, decode::kWsTile>(p, rows, groups, stream);
    case DecodeKernel::sm90_ws_wide:
      if (plan.row_ctas > 0) {
        if constexpr (decode::ws_wide_copies(F::spec)) {
          launch_decode_ws_rows<F>(p, rows, groups, plan.row_ctas, stream);
          return false;
        }
        break;
      }
      return launch_decode_ws<F, false, decode::kWsWideTile>(p, rows, groups, stream);
    case DecodeKernel::sm90_ws_pair: return launch_decode_ws<F, true, decode::kWsTile>(p, rows, groups, stream);
    case DecodeKernel::sm90_ws_pair_wide:
      if constexpr (!decode::ws_wide_copies(F::spec)) return launch_decode_ws<F, true, decode::kWsWideTile>(p, rows, groups, stream);
      break;
    case DecodeKernel::sm90_h16:
      if constexpr (nvfp4) {
        launch_decode_h16_sm90<F>(p, rows, groups, stream);
        return false;
      }
      break;
    case DecodeKernel::automatic: break;
  }
  throw Error(std::string("sparse decode: no ") + to_string(kernel) + " kernel for this record format");
}

}  // namespace

int current_sm_count() {
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SM count)");
  return sms;
}

bool sparse_decode(const RecordSpec& spec, const SparseMlaArgs& a, const DecodePlan& plan, void* workspace,
                   size_t workspace_bytes, uint16_t* out, float* lse, cudaStream_t stream) {
  validate_sparse_mla_args(spec, a);
  if (a.rows == 0) return false;
  if (!out || !lse) throw Error("sparse decode: out and lse are required");
  if (a.capacity > INT32_MAX) throw Error("sparse decode: capacity above 2^31 slots is not supported by int32 indices");
  if (plan.kernel == DecodeKernel::automatic)
    throw Error("sparse decode: the plan names no kernel; build it with plan_sparse_decode");
  const ArchSpec arch = current_device_arch();
  if (const auto why = decode_kernel_unsupported(plan.kernel, arch, spec, a.heads))
    throw Error(std::string("sparse decode: the plan's kernel ") + to_string(plan.kernel) + " " + *why);
  // The plan's head group: any the kernel runs for these heads (a plan made for a device with less
  // shared memory may have a smaller sm80_mma group) whose bytes fit this device.
  const std::optional<decode::KernelShape> group_shape =
      decode::kernel_shape_for_group(plan.kernel, spec, a.heads, plan.head_group);
  if (!group_shape)
    throw Error(std::string("sparse decode: ") + to_string(plan.kernel) + " runs no " + std::to_string(plan.head_group) +
                "-head groups for " + std::to_string(a.heads) + " heads; build the plan with plan_sparse_decode");
  const decode::KernelShape& shape = *group_shape;
  if (shape.smem_bytes > arch.smem_per_block)
    throw Error(std::string("sparse decode: the plan's ") + std::to_string(plan.head_group) + "-head groups of " +
                to_string(plan.kernel) + " need " + std::to_string(shape.smem_bytes) +
                " bytes of shared memory per CTA; the device allows " + std::to_string(arch.smem_per_block));
  const int expect_groups = (a.heads + shape.head_group - 1) / shape.head_group;
  if (plan.num_head_groups != expect_groups || plan.warps != shape.warps ||
      plan.tile_tokens != shape.tile_tokens || plan.num_tiles != (a.topk + shape.tile_tokens - 1) / shape.tile_tokens ||
      plan.splits < 1 || plan.splits > decode::kMaxSplits || plan.tiles_per_split < 1 ||
      (plan.partial_bytes != 4 && plan.partial_bytes != 2) ||
      static_cast<int64_t>(plan.splits) * plan.tiles_per_split < plan.num_tiles ||
      (shape.max_split_entries > 0 && int64_t(plan.tiles_per_split) * plan.tile_tokens > shape.max_split_entries))
    throw Error("sparse decode: the plan does not match rows/heads/topk; build it with plan_sparse_decode");
  if (const auto why = decode_row_walk_unsupported(plan, spec)) throw Error("sparse decode: the plan's row_ctas: " + *why);
  if (plan.merge_in_kernel && !decode_merges_in_kernel(plan.kernel, plan.splits))
    throw Error(std::string("sparse decode: ") + to_string(plan.kernel) + " cannot merge " + std::to_string(plan.splits) +
                " splits inside its launch; build the plan with plan_sparse_decode");
  const auto ws = decode_workspace_layout(plan, a.rows, a.heads);
  if (workspace_bytes < ws.total_bytes || (ws.total_bytes > 0 && !workspace))
    throw Error("sparse decode: workspace of " + std::to_string(ws.total_bytes) + " bytes required, got " +
                std::to_string(workspace_bytes));
  if ((reinterpret_cast<uintptr_t>(a.q) & 15) || (reinterpret_cast<uintptr_t>(a.cache) & 15) ||
      (reinterpret_cast<uintptr_t>(out) & 15) || (reinterpret_cast<uintptr_t>(lse) & 3) ||
      (reinterpret_cast<uintptr_t>(workspace) & 255))
    throw Error("sparse decode: q, cache and out must be 16-byte aligned, lse 4-byte, the workspace 256-byte aligned");

  DecodeParams p{};
  p.q = a.q;
  p.cache = a.cache;
  p.capacity = a.capacity;
  p.indices = a.indices;
  p.topk_length = a.topk_length;
  p.topk = a.topk;
  p.heads = a.heads;
  p.splits = plan.splits;
  p.tiles_per_split = plan.tiles_per_split;
  p.num_tiles = plan.num_tiles;
  p.scale_log2 = a.sm_scale * kLog2e;
  p.layer_scale = a.layer_scale;
  p.lse_base2 = a.lse_base == LseBase::base2;
  p.out = reinterpret_cast<__nv_bfloat16*>(out);
  p.lse = lse;
  if (plan.splits > 1) {
    p.part_out = static_cast<uint8_t*>(workspace) + ws.partial_out_offset;
    p.part_lse = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + ws.partial_lse_offset);
    p.partials_bf16 = plan.partial_bytes == 2;
  }
  p.merge_in_kernel = plan.merge_in_kernel;
  // Rows lie along the grid's y (decode_grid): more than kMaxGridRows go as launches of row chunks.
  // If any chunk did not merge its splits itself, the merge kernel takes every row.
  bool merged = true;
  for (int r0 = 0; r0 < a.rows; r0 += kMaxGridRows) {
    const DecodeParams chunk = rows_from(p, r0);
    const int n = std::min(kMaxGridRows, a.rows - r0);
    with_record_format(spec, "sparse decode",
                       [&](auto format) { merged = run_kernel<decltype(format)>(plan.kernel, plan, chunk, n, stream) && merged; });
  }
  if (plan.splits > 1 && !merged) launch_merge_splits(p, a.rows, stream);
  return merged;
}

}  // namespace nvfp4mla::cuda
