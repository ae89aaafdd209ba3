#pragma once
// One layer's DeepSeek Sparse Attention decode step, end to end (docs/SELECTION.md, "The DSA
// pipeline"):
//   1. the step's new tokens are written through one slot mapping into both caches of the
//      layer: their latents (kv_c, k_pe) as records of `spec` (record.h) and their index keys
//      (index_key.h) into the paged index key cache;
//   2. every query row's exact top-k of its indexer logits over the request's context (the
//      paged form of indexer.h, rows = requests x next_n: the verifier rows of speculative
//      decoding), fused with the selection (fused_select.h, no [rows, context] logits buffer),
//      the selected positions mapped to cache slots through the block table (topk.h);
//   3. sparse MLA attention of every query row over its selected records (sparse_mla.h):
//      out, lse.
// The two caches share pages: slot s is page s / page_size, offset s % page_size in both, the
// latent cache holding [num_pages * page_size, record_bytes] bytes and the index key cache
// [num_pages, page_size * 132] (index_key.h). Context lengths count the step's new tokens (a
// decode row attends to itself).
//
// The result is, by construction, the composition of the library's parts:
//   write_paged_cache + write_index_cache, fused_select_reference(slot_ids), sparse_mla_reference
// which dsa_decode_reference (below) runs on the host; the GPU chain (cuda/dsa_pipeline.h) runs
// the GPU parts of the same steps. Selections agree bit for bit wherever the GPU indexer logits
// equal the CPU ones (always on small-integer data, docs/SELECTION.md), the attention within the
// decode kernels' tolerances.
#include <cstddef>
#include <cstdint>

#include "nvfp4mla/config.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/fused_select.h"
#include "nvfp4mla/sparse_mla.h"

namespace nvfp4mla {

// The step's new tokens (BF16 inputs, what the model's projections produce).
struct DsaNewTokens {
  const uint16_t* kv_c = nullptr;          // BF16 [num_tokens, 512]
  const uint16_t* k_pe = nullptr;          // BF16 [num_tokens, 64], post-RoPE
  const uint16_t* index_k = nullptr;       // BF16 [num_tokens, 128]: the indexer's keys
  const int64_t* slot_mapping = nullptr;   // [num_tokens]; negative slots are skipped (padding)
  int64_t num_tokens = 0;
};

// The layer's two caches (shared pages, see above).
struct DsaCaches {
  uint8_t* latent = nullptr;  // [num_pages * page_size, spec.record_bytes()]
  uint8_t* index = nullptr;   // [num_pages, page_size * 132]
  int64_t num_pages = 0;
  int64_t page_size = index_key::kDefaultPageSize;
  int64_t capacity() const { return num_pages * page_size; }
};

struct DsaDecodeArgs {
  RecordSpec spec;            // the latent record format and scale mode
  float layer_scale = 1.0f;   // static mode's calibrated scale (FormatConfig::layer_scale()); 1 otherwise
  DsaNewTokens tokens;
  DsaCaches caches;
  // Requests: rows b * next_n + i (i < next_n) of request b attend to its first
  // max(0, context_lens[b] - next_n + i + 1) positions (indexer.h's causal rows).
  int64_t requests = 0;
  int next_n = 1;
  const int32_t* block_table = nullptr;  // [requests, block_table_stride] page ids
  int64_t block_table_stride = 0;
  const int32_t* context_lens = nullptr;  // [requests], each in 0..max_context
  int64_t max_context = 0;                // sizes the selection's work (chunks)
  // Queries, [rows] = requests * next_n.
  const uint16_t* q = nullptr;        // BF16 [rows, heads, 576]
  int heads = 0;
  const uint8_t* index_q = nullptr;   // E4M3 [rows, index_heads, 128] (query scale folded into the weights)
  const float* index_w = nullptr;     // fp32 [rows, index_heads]
  int index_heads = 0;                // 1..64
  int k = 2048;                       // selected tokens per row, 1..4096
  float sm_scale = 0.0f;
  LseBase lse_base = LseBase::natural;

  int64_t rows() const { return requests * next_n; }
};

// Outputs the caller owns. `out` is BF16 on the GPU (uint16_t bits), fp32 in the CPU reference.
template <class Out>
struct DsaDecodeOutputsOf {
  Out* out = nullptr;              // [rows, heads, 512]
  float* lse = nullptr;            // [rows, heads]
  int32_t* indices = nullptr;      // [rows, k]: selected cache slots, ascending position order, -1 padded
  int32_t* topk_length = nullptr;  // [rows]
  float* selected_logits = nullptr;  // optional [rows, k]: the selected indexer logits, -inf padded
};
using DsaDecodeOutputs = DsaDecodeOutputsOf<uint16_t>;
using DsaDecodeReferenceOutputs = DsaDecodeOutputsOf<float>;

// What the GPU chain found wrong in device-side data (a kernel cannot throw); three device words
// the caller owns, set by every call, read after the stream's work completes.
struct DsaDecodeErrors {
  unsigned long long latent_slots = 0;  // new tokens' slots at or past the capacity (record not written)
  unsigned long long index_slots = 0;   // the same for the index key cache (no key written when not 0)
  unsigned long long selection = 0;     // bad context lengths or block table entries (every row then
                                        // selects nothing: topk_length 0, out 0, lse -inf)
};

// The launch plan and workspace. The selection's workspace and the decode's split partials are
// used one after the other, so they share the region at offset 0.
struct DsaDecodePlan {
  FusedSelectPlan select;
  DecodePlan decode;
  size_t workspace_bytes = 0;  // max of the two; 256-byte aligned start required
};

// The writer configuration of a record spec (a bare layer scale in static mode); throws Error for
// an impossible spec (e.g. dynamic scales without the 368-byte record).
FormatConfig dsa_format_config(const RecordSpec& spec, float layer_scale);

// The pieces of the step (the same for the CPU reference and the GPU chain).
FusedSelectArgs dsa_select_args(const DsaDecodeArgs& a);
SparseMlaArgs dsa_attention_args(const DsaDecodeArgs& a, const int32_t* indices, const int32_t* topk_length);

// Host checks every implementation makes (shapes, sizes, pointers, k, scales and the parts'
// own checks); throws Error naming the argument, prefixed "dsa decode: ".
template <class Out>
void validate_dsa_decode_args(const DsaDecodeArgs& a, const DsaDecodeOutputsOf<Out>& out);

// The planner (host only, nothing allocated): the fused selection's plan for `select_chunk` (0:
// the planner's choice, fused_select.h) and the decode plan for `sm_count` SMs (forced_splits
// as plan_sparse_decode: 1 is the extend route, one online softmax per row).
DsaDecodePlan plan_dsa_decode(const DsaDecodeArgs& a, int sm_count, int64_t select_chunk = 0, int forced_splits = 0);

// CPU reference (host pointers, small contexts): validates everything first (the token slots,
// context lengths, block table entries a context needs) and writes nothing, caches included,
// when it throws; then writes both caches, selects with fused_select_reference and attends with
// sparse_mla_reference (fp64; `options` as sparse_mla_reference takes them).
void dsa_decode_reference(const DsaDecodeArgs& a, int64_t select_chunk, const DsaDecodeReferenceOutputs& out,
                          const ReferenceOptions& options = {});

}  // namespace nvfp4mla
