// The DSA decode step on the GPU: the library's kernels in the order of dsa_pipeline.h, on one
// stream. No kernel of its own: what each step computes is tested with its part.
#include <cuda_runtime.h>

#include <string>

#include "device/alignment.h"
#include "nvfp4mla/cuda/cache_write.h"
#include "nvfp4mla/cuda/dsa_pipeline.h"
#include "nvfp4mla/cuda/fused_select.h"
#include "nvfp4mla/cuda/index_cache.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/error.h"

namespace nvfp4mla::cuda {
namespace {

constexpr const char* kOp = "dsa decode";

[[noreturn]] void fail(const std::string& what) { throw Error(std::string(kOp) + ": " + what); }

// The decode plan as plan_sparse_decode makes it for these arguments and the plan's splits
// (cuda::fused_select checks its own plan against the arguments and its workspace).
bool same_decode_plan(const DecodePlan& p, const DecodePlan& e) {
  return p.head_group == e.head_group && p.num_head_groups == e.num_head_groups && p.warps == e.warps &&
         p.tile_tokens == e.tile_tokens && p.stages == e.stages && p.num_tiles == e.num_tiles && p.splits == e.splits &&
         p.tiles_per_split == e.tiles_per_split && p.row_ctas == e.row_ctas;
}

}  // namespace

void dsa_decode(const DsaDecodeArgs& a, const DsaDecodePlan& plan, void* workspace, size_t workspace_bytes,
                const DsaDecodeOutputs& out, DsaDecodeErrors* errors, cudaStream_t stream, IndexerMma mma) {
  validate_dsa_decode_args(a, out);
  if (!errors) fail("errors (three device words) is required");
  const DsaDecodePlan expected = plan_dsa_decode(a, 1, plan.select.chunk, plan.decode.splits);
  const size_t decode_bytes = decode_workspace_layout(plan.decode, static_cast<int>(a.rows()), a.heads).total_bytes;
  if (!same_decode_plan(plan.decode, expected.decode) || plan.workspace_bytes < decode_bytes ||
      plan.workspace_bytes < plan.select.workspace_bytes)
    fail("plan does not match the arguments (use plan_dsa_decode)");
  if (workspace_bytes < plan.workspace_bytes)
    fail("workspace_bytes " + std::to_string(workspace_bytes) + " is below the plan's " + std::to_string(plan.workspace_bytes));
  if (plan.workspace_bytes > 0 && (!workspace || reinterpret_cast<uintptr_t>(workspace) % 256 != 0))
    fail("workspace must be non-null and 256-byte aligned");
  // What the GPU parts refuse beyond the shared checks, refused before the first write: a part
  // failing midway would leave one cache written and the other not.
  const DsaNewTokens& nt = a.tokens;
  if (nt.num_tokens > 0 && (!aligned(nt.kv_c, 16) || !aligned(nt.k_pe, 4) || !aligned(nt.index_k, 16)))
    fail("tokens: kv_c and index_k must be 16-byte aligned, k_pe 4-byte");
  if (!aligned(a.caches.latent, 16) || !aligned(a.caches.index, a.rows() > 0 ? 16 : 4))
    fail("caches: latent and (with query rows) index must be 16-byte aligned");
  if (a.rows() > 0) {
    if (a.caches.page_size % 4 != 0) fail("caches.page_size must be a multiple of 4 on the GPU (16-byte aligned index pages)");
    if (!aligned(a.q, 16) || !aligned(a.index_q, 16) || !aligned(a.index_w, 4) || !aligned(out.out, 16) ||
        !aligned(out.lse, 4))
      fail("q, index_q and out must be 16-byte aligned, index_w and lse 4-byte");
  }

  if (cudaMemsetAsync(errors, 0, sizeof *errors, stream) != cudaSuccess) fail("cudaMemsetAsync of errors failed");
  const DsaNewTokens& t = a.tokens;
  if (t.num_tokens > 0) {
    CacheWriteArgs w;
    w.kv_c = t.kv_c;
    w.k_pe = t.k_pe;
    w.input_type = InputType::bf16;
    w.num_tokens = t.num_tokens;
    w.slot_mapping = t.slot_mapping;
    w.cache = a.caches.latent;
    w.capacity = a.caches.capacity();
    w.layer_scale = a.layer_scale;
    w.error_count = &errors->latent_slots;
    write_cache(a.spec, w, stream);
    IndexCacheWriteArgs k;
    k.keys = t.index_k;
    k.input_type = InputType::bf16;
    k.num_tokens = t.num_tokens;
    k.slot_mapping = t.slot_mapping;
    k.cache = {a.caches.index, a.caches.num_pages, a.caches.page_size};
    k.invalid_count = &errors->index_slots;
    write_index_cache(k, stream);
  }
  if (a.rows() == 0) return;
  fused_select(dsa_select_args(a), plan.select, workspace, plan.select.workspace_bytes,
               {out.indices, out.topk_length, out.selected_logits}, &errors->selection, stream, mma);
  sparse_decode(a.spec, dsa_attention_args(a, out.indices, out.topk_length), plan.decode, workspace, decode_bytes, out.out,
                out.lse, stream);
}

}  // namespace nvfp4mla::cuda
