// C ABI: verifier routing, scratch and capacity plans (serving/route.h, serving/planner.h).
#include <algorithm>
#include <span>

#include "capi_support.h"
#include "nvfp4mla/serving/planner.h"
#include "nvfp4mla/serving/route.h"

namespace nvfp4mla::capi {
namespace {

using serving::SpecDecodeMode;

SpecDecodeMode mode_of(int32_t mode) {
  if (mode < 0 || mode > 2) throw Error("unknown verifier route mode code " + std::to_string(mode));
  return static_cast<SpecDecodeMode>(mode);
}

CacheDtype dtype_of(int32_t code) {
  if (code < NVFP4MLA_DTYPE_BF16 || code > NVFP4MLA_DTYPE_NVFP4_DS_MLA)
    throw Error("unknown cache dtype code " + std::to_string(code));
  return static_cast<CacheDtype>(code);
}

RecordSpec request_spec(int32_t dtype, int32_t rope, int32_t scale_mode) {
  const nvfp4mla_format f{dtype, rope, scale_mode, 1.0f};
  return spec_of(&f);
}

}  // namespace
}  // namespace nvfp4mla::capi

using namespace nvfp4mla;
using namespace nvfp4mla::capi;

extern "C" {

int nvfp4mla_parse_spec_decode_mode(const char* text, int32_t* mode) {
  return guarded([&] {
    require(text, "mode text");
    require(mode, "mode");
    *mode = static_cast<int32_t>(serving::parse_spec_decode_mode(text));
  });
}

int nvfp4mla_decode_qualified(int32_t cache_dtype, int32_t* qualified) {
  return guarded([&] {
    require(qualified, "qualified");
    *qualified = serving::decode_qualified(dtype_of(cache_dtype)) ? 1 : 0;
  });
}

int nvfp4mla_plan_route(int32_t mode, int32_t cache_dtype, const nvfp4mla_verifier_batch* batch, int32_t* route,
                        const char** reason) {
  return guarded([&] {
    require(batch, "verifier batch");
    require(route, "route");
    require(reason, "reason");
    serving::VerifierBatchShape b;
    b.num_speculative_tokens = batch->num_speculative_tokens;
    b.max_query_len = batch->max_query_len;
    b.any_prefill = batch->any_prefill != 0;
    b.max_q_per_request = batch->max_q_per_request;
    b.decode_rows = batch->decode_rows;
    b.decode_row_budget = batch->decode_row_budget;
    const serving::RouteDecision d = serving::decide_route(mode_of(mode), dtype_of(cache_dtype), b);
    *route = d.route == serving::Route::decode ? 0 : 1;
    *reason = hand_out(d.reason);
  });
}

int nvfp4mla_decode_q_per_request(int32_t mode, int32_t cache_dtype, int32_t num_speculative_tokens,
                                  int32_t* q_per_request) {
  return guarded([&] {
    require(q_per_request, "q_per_request");
    *q_per_request = serving::decode_q_per_request(mode_of(mode), dtype_of(cache_dtype), num_speculative_tokens);
  });
}

int nvfp4mla_verifier_rows(const int64_t* context_lens, int64_t n, int32_t tokens_per_request, int32_t topk,
                           int64_t padded_rows, int64_t* causal_len, int32_t* topk_length) {
  return guarded([&] {
    if (n < 0) throw Error("verifier rows: negative request count");
    if (n > 0) require(context_lens, "context_lens");
    const serving::VerifierRows rows = serving::build_verifier_rows(
        std::span<const int64_t>(context_lens, static_cast<size_t>(n)), tokens_per_request, topk, padded_rows);
    if (!rows.causal_len.empty()) {
      require(causal_len, "causal_len");
      require(topk_length, "topk_length");
    }
    std::copy(rows.causal_len.begin(), rows.causal_len.end(), causal_len);
    std::copy(rows.topk_length.begin(), rows.topk_length.end(), topk_length);
  });
}

int nvfp4mla_plan_scratch(const nvfp4mla_scratch_request* r, nvfp4mla_scratch_plan* plan) {
  return guarded([&] {
    require(r, "scratch request");
    require(plan, "scratch plan");
    serving::ScratchRequest q;
    q.spec = request_spec(r->cache_dtype, r->rope, r->scale_mode);
    q.num_heads = r->num_heads;
    q.dcp_world_size = r->dcp_world_size;
    q.topk = r->topk;
    q.max_num_seqs = r->max_num_seqs;
    q.max_num_batched_tokens = r->max_num_batched_tokens;
    q.num_speculative_tokens = r->num_speculative_tokens;
    q.mode = mode_of(r->mode);
    q.partials = r->partial_bf16 ? serving::PartialPrecision::bf16 : serving::PartialPrecision::fp32;
    q.splits = r->splits;
    q.sm_count = r->sm_count;
    q.compute_capability = r->compute_capability;
    const serving::ScratchPlan p = serving::plan_scratch(q);
    *plan = {p.q_per_request, p.decode_rows,       p.heads,        p.splits,          p.partial_bytes,
             p.tmp_output_bytes, p.tmp_lse_bytes, p.output_bytes, p.final_lse_bytes, p.total_bytes};
  });
}

int nvfp4mla_plan_capacity(const nvfp4mla_capacity_request* r, nvfp4mla_capacity_plan* plan) {
  return guarded([&] {
    require(r, "capacity request");
    require(plan, "capacity plan");
    serving::CapacityRequest q;
    q.spec = request_spec(r->cache_dtype, r->rope, r->scale_mode);
    q.layers = r->layers;
    q.indexer_bytes_per_token = r->indexer_bytes_per_token;
    q.page_size = r->page_size;
    q.memory_gib = r->memory_gib;
    q.reserved_gib = r->reserved_gib;
    const serving::CapacityPlan p = serving::plan_capacity(q);
    *plan = {p.bytes_per_token, p.pages, p.tokens, p.max_single_request_tokens};
  });
}

}  // extern "C"
