// The DSA decode step: its pieces, host checks, planner and CPU reference (the composition of
// the caches' writers, fused_select_reference and sparse_mla_reference that the GPU chain mirrors).
#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include "nvfp4mla/config.h"
#include "nvfp4mla/dsa_pipeline.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/index_cache.h"
#include "nvfp4mla/paged_cache.h"

namespace nvfp4mla {
namespace {

constexpr const char* kOp = "dsa decode";

[[noreturn]] void fail(const std::string& what) { throw Error(std::string(kOp) + ": " + what); }

// The parts' own checks, their messages prefixed with the pipeline's name.
template <class F>
void as_pipeline(F&& check) {
  try {
    check();
  } catch (const Error& e) {
    throw Error(std::string(kOp) + ": " + e.what());
  }
}

}  // namespace

FormatConfig dsa_format_config(const RecordSpec& spec, float layer_scale) {
  FormatOptions o;
  o.cache_dtype = spec.dtype;
  if (spec.is_nvfp4()) {
    o.rope = spec.rope;
    o.scale_mode = spec.scale_mode;
    if (spec.scale_mode == ScaleMode::static_calibrated) o.layer_scale = layer_scale;
  }
  return FormatConfig::create(o, EnvironmentSettings{});
}

FusedSelectArgs dsa_select_args(const DsaDecodeArgs& a) {
  FusedSelectArgs s;
  s.keys.q = a.index_q;
  s.keys.weights = a.index_w;
  s.keys.requests = a.requests;
  s.keys.next_n = a.next_n;
  s.keys.heads = a.index_heads;
  s.keys.cache = a.caches.index;
  s.keys.num_pages = a.caches.num_pages;
  s.keys.page_size = a.caches.page_size;
  s.keys.block_table = a.block_table;
  s.keys.block_table_stride = a.block_table_stride;
  s.keys.context_lens = a.context_lens;
  s.max_context = a.max_context;
  s.k = a.k;
  s.slot_ids = true;
  return s;
}

SparseMlaArgs dsa_attention_args(const DsaDecodeArgs& a, const int32_t* indices, const int32_t* topk_length) {
  SparseMlaArgs s;
  s.q = a.q;
  s.rows = static_cast<int>(a.rows());
  s.heads = a.heads;
  s.cache = a.caches.latent;
  s.capacity = a.caches.capacity();
  s.indices = indices;
  s.topk = a.k;
  s.topk_length = topk_length;
  s.sm_scale = a.sm_scale;
  s.layer_scale = a.layer_scale;
  s.lse_base = a.lse_base;
  return s;
}

template <class Out>
void validate_dsa_decode_args(const DsaDecodeArgs& a, const DsaDecodeOutputsOf<Out>& out) {
  as_pipeline([&] { (void)dsa_format_config(a.spec, a.layer_scale); });
  if (!std::isfinite(a.layer_scale) || !(a.layer_scale > 0.0f))
    fail("layer_scale must be finite and positive (got " + std::to_string(a.layer_scale) + ")");
  if (a.requests < 0) fail("requests is negative (" + std::to_string(a.requests) + ")");
  if (a.next_n < 1) fail("next_n must be at least 1 (got " + std::to_string(a.next_n) + ")");
  if (a.rows() > INT32_MAX) fail("requests x next_n exceeds 2^31-1 rows");
  if (a.heads < 1) fail("heads must be at least 1 (got " + std::to_string(a.heads) + ")");
  const DsaNewTokens& t = a.tokens;
  if (t.num_tokens < 0) fail("tokens.num_tokens is negative (" + std::to_string(t.num_tokens) + ")");
  if (t.num_tokens > 0 && (!t.kv_c || !t.k_pe || !t.index_k || !t.slot_mapping))
    fail("tokens.kv_c, tokens.k_pe, tokens.index_k and tokens.slot_mapping are required for " +
         std::to_string(t.num_tokens) + " new tokens");
  as_pipeline([&] { validate_index_cache({a.caches.index, a.caches.num_pages, a.caches.page_size}, "caches.index"); });
  if (a.caches.capacity() > 0 && !a.caches.latent)
    fail("caches.latent is null for a cache of " + std::to_string(a.caches.capacity()) + " slots");
  if (a.caches.capacity() > int64_t(INT32_MAX))
    fail("the caches hold " + std::to_string(a.caches.capacity()) + " slots; slot ids are int32 (at most 2^31 - 1 slots)");
  if (a.rows() > 0 && (!out.out || !out.lse || !out.indices || !out.topk_length))
    fail("outputs out, lse, indices and topk_length are required");
  as_pipeline([&] {
    validate_fused_select_args(dsa_select_args(a), {out.indices, out.topk_length, out.selected_logits});
    validate_sparse_mla_args(a.spec, dsa_attention_args(a, out.indices, out.topk_length));
  });
}

template void validate_dsa_decode_args<uint16_t>(const DsaDecodeArgs&, const DsaDecodeOutputs&);
template void validate_dsa_decode_args<float>(const DsaDecodeArgs&, const DsaDecodeReferenceOutputs&);

DsaDecodePlan plan_dsa_decode(const DsaDecodeArgs& a, int sm_count, int64_t select_chunk, int forced_splits) {
  DsaDecodePlan p;
  as_pipeline([&] {
    p.select = plan_fused_select(dsa_select_args(a), select_chunk, sm_count);
    p.decode = plan_sparse_decode(a.spec, static_cast<int>(std::min<int64_t>(a.rows(), INT32_MAX)), a.heads, a.k, sm_count,
                                  forced_splits);
  });
  const size_t decode_bytes = decode_workspace_layout(p.decode, static_cast<int>(a.rows()), a.heads).total_bytes;
  p.workspace_bytes = std::max(p.select.workspace_bytes, decode_bytes);
  return p;
}

void dsa_decode_reference(const DsaDecodeArgs& a, int64_t select_chunk, const DsaDecodeReferenceOutputs& out,
                          const ReferenceOptions& options) {
  validate_dsa_decode_args(a, out);
  const FusedSelectArgs select = dsa_select_args(a);
  // Everything that could throw is checked before either cache is written.
  const std::span<const int64_t> slots(a.tokens.slot_mapping, static_cast<size_t>(a.tokens.num_tokens));
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i] >= a.caches.capacity())
      fail("tokens.slot_mapping[" + std::to_string(i) + "] = " + std::to_string(slots[i]) + " is at or past the capacity of " +
           std::to_string(a.caches.capacity()) + " slots");
  as_pipeline([&] {
    validate_fused_select_metadata(select);
    (void)plan_fused_select(select, select_chunk, 1);
  });
  const FormatConfig config = dsa_format_config(a.spec, a.layer_scale);
  const TokenBatch<Bf16Bits> tokens{reinterpret_cast<const Bf16Bits*>(a.tokens.kv_c),
                                    reinterpret_cast<const Bf16Bits*>(a.tokens.k_pe), a.tokens.num_tokens};
  write_paged_cache(config, tokens, slots,
                    PagedCacheView{a.caches.latent, a.caches.num_pages, a.caches.page_size, a.spec.record_bytes()});
  write_index_cache(reinterpret_cast<const Bf16Bits*>(a.tokens.index_k), a.tokens.num_tokens, slots,
                    IndexCacheView{a.caches.index, a.caches.num_pages, a.caches.page_size});
  fused_select_reference(select, select_chunk, {out.indices, out.topk_length, out.selected_logits});
  sparse_mla_reference(a.spec, dsa_attention_args(a, out.indices, out.topk_length), out.out, out.lse, options);
}

}  // namespace nvfp4mla
