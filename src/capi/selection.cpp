// C ABI: the DSA selection ops (index keys, the paged index key cache, indexer logits, top-k and
// fused selection), their CPU references and planners, and their GPU entry points.
#include <span>

#include "capi_support.h"
#include "nvfp4mla/fused_select.h"
#include "nvfp4mla/index_cache.h"
#include "nvfp4mla/index_key.h"
#include "nvfp4mla/indexer.h"
#include "nvfp4mla/topk.h"

#if defined(NVFP4MLA_WITH_CUDA)
#include "nvfp4mla/cuda/fused_select.h"
#include "nvfp4mla/cuda/index_cache.h"
#include "nvfp4mla/cuda/indexer.h"
#include "nvfp4mla/cuda/topk.h"
#endif

namespace nvfp4mla::capi {
namespace {

IndexCacheView index_cache_of(const nvfp4mla_index_cache* c) {
  require(c, "index cache");
  return {c->data, c->num_pages, c->page_size};
}

IndexerRaggedArgs ragged_of(const nvfp4mla_indexer_ragged* p) {
  require(p, "indexer arguments");
  IndexerRaggedArgs a;
  a.q = p->q;
  a.weights = p->weights;
  a.rows = p->rows;
  a.heads = p->heads;
  a.key_values = p->key_values;
  a.key_value_stride = p->key_value_stride;
  a.key_scales = p->key_scales;
  a.key_scale_stride = p->key_scale_stride;
  a.num_keys = p->num_keys;
  a.row_starts = p->row_starts;
  a.row_ends = p->row_ends;
  a.logits = p->logits;
  a.logits_stride = p->logits_stride;
  return a;
}

IndexerPagedArgs paged_of(const nvfp4mla_indexer_paged* p) {
  require(p, "indexer arguments");
  IndexerPagedArgs a;
  a.q = p->q;
  a.weights = p->weights;
  a.requests = p->requests;
  a.next_n = p->next_n;
  a.heads = p->heads;
  a.cache = p->cache;
  a.num_pages = p->num_pages;
  a.page_size = p->page_size;
  a.block_table = p->block_table;
  a.block_table_stride = p->block_table_stride;
  a.context_lens = p->context_lens;
  a.logits = p->logits;
  a.logits_stride = p->logits_stride;
  return a;
}

TopkArgs topk_of(const nvfp4mla_topk* p) {
  require(p, "top-k arguments");
  TopkArgs a;
  a.values = p->values;
  a.rows = p->rows;
  a.columns = p->columns;
  a.stride = p->stride;
  a.lengths = p->lengths;
  a.positions = p->positions;
  a.position_offset = p->position_offset;
  a.k = p->k;
  a.slots = {p->block_table, p->requests, p->pages, p->table_stride, p->page_size, p->rows_per_request, p->capacity};
  return a;
}

TopkOutputs outputs_of(const nvfp4mla_topk_outputs* p) {
  require(p, "top-k outputs");
  return {p->indices, p->topk_length, p->values};
}

FusedSelectArgs fused_of(const nvfp4mla_fused_select* p) {
  require(p, "fused selection arguments");
  return {paged_of(&p->keys), p->max_context, p->k, p->slot_ids != 0};
}

FusedSelectRaggedArgs fused_of(const nvfp4mla_fused_select_ragged* p) {
  require(p, "fused selection arguments");
  return {ragged_of(&p->keys), p->max_length, p->k};
}

nvfp4mla_fused_select_plan plan_out(const FusedSelectPlan& p, int32_t sm_count) {
  return {p.chunk, p.chunks, p.logits_stride, sm_count, p.workspace_bytes};
}

// The planners read shapes only; these stand for the tensors their argument checks ask for.
const uint8_t kPlaceholder[16] = {};
const int32_t kPlaceholderI32[4] = {};

#if defined(NVFP4MLA_WITH_CUDA)
TopkPlan topk_plan_of(const nvfp4mla_topk_plan* p, int rows) {
  require(p, "top-k plan");
  if (p->kernel < static_cast<int32_t>(TopkKernel::row_per_cta) || p->kernel > static_cast<int32_t>(TopkKernel::resident_rows))
    throw Error("top-k: unknown plan kernel code " + std::to_string(p->kernel));
  if (p->rows != rows)
    throw Error("top-k: the plan was made for " + std::to_string(p->rows) + " rows, the values have " + std::to_string(rows));
  return {static_cast<TopkKernel>(p->kernel), p->segments, p->segment_len, p->candidates};
}

// The plan the GPU chain runs: planned again from the arguments with the caller's chunk and SM
// count, so a plan made for other shapes is refused rather than trusted.
template <class Args>
FusedSelectPlan fused_plan_of(const Args& args, const nvfp4mla_fused_select_plan* p) {
  require(p, "fused selection plan");
  const FusedSelectPlan plan = plan_fused_select(args, p->chunk, p->sm_count);
  if (plan.workspace_bytes != p->workspace_bytes || plan.chunks != p->chunks)
    throw Error("fused selection: the plan was made for other shapes (it needs " + std::to_string(p->workspace_bytes) +
                " workspace bytes, these arguments " + std::to_string(plan.workspace_bytes) + "): plan again");
  return plan;
}
#endif

}  // namespace
}  // namespace nvfp4mla::capi

using namespace nvfp4mla;
using namespace nvfp4mla::capi;

extern "C" {

int nvfp4mla_index_key_encode(int32_t input_type, const void* keys, int64_t key_stride, int64_t n, uint8_t* records) {
  return guarded([&] {
    check_count(n, "index_key_encode");
    if (n == 0) return;
    require(keys, "keys");
    require(records, "records");
    if (key_stride < index_key::kDim) throw Error("index_key_encode: key_stride must cover the 128 values of a key");
    with_input_type(input_type, [&](auto tag) {
      using In = decltype(tag);
      const In* x = static_cast<const In*>(keys);
      for (int64_t t = 0; t < n; ++t) index_key::encode_record(x + t * key_stride, records + t * index_key::kRecordBytes);
    });
  });
}

int nvfp4mla_write_index_cache(int32_t input_type, const void* keys, int64_t n, const int64_t* slot_mapping,
                               const nvfp4mla_index_cache* cache) {
  return guarded([&] {
    check_count(n, "write_index_cache");
    if (n > 0) {
      require(keys, "keys");
      require(slot_mapping, "slot_mapping");
    }
    const IndexCacheView view = index_cache_of(cache);
    const std::span<const int64_t> slots(slot_mapping, static_cast<size_t>(n));
    with_input_type(input_type,
                    [&](auto tag) { write_index_cache(static_cast<const decltype(tag)*>(keys), n, slots, view); });
  });
}

int nvfp4mla_gather_index_records(const nvfp4mla_index_cache* cache, const int64_t* slots, int64_t n, uint8_t* records) {
  return guarded([&] {
    check_count(n, "gather_index_records");
    if (n > 0) require(slots, "slots");
    gather_index_records(index_cache_of(cache), {slots, static_cast<size_t>(n)}, records);
  });
}

int nvfp4mla_gather_index_keys(const nvfp4mla_index_cache* cache, const int64_t* slots, int64_t n, uint8_t* values,
                               float* scales) {
  return guarded([&] {
    check_count(n, "gather_index_keys");
    if (n > 0) require(slots, "slots");
    gather_index_keys(index_cache_of(cache), {slots, static_cast<size_t>(n)}, values, scales);
  });
}

int nvfp4mla_indexer_logits_ragged_reference(const nvfp4mla_indexer_ragged* args) {
  return guarded([&] { indexer_logits_reference(ragged_of(args)); });
}

int nvfp4mla_indexer_logits_paged_reference(const nvfp4mla_indexer_paged* args) {
  return guarded([&] { indexer_logits_reference(paged_of(args)); });
}

int nvfp4mla_plan_topk(int32_t rows, int64_t columns, int32_t sm_count, nvfp4mla_topk_plan* plan) {
  return guarded([&] {
    require(plan, "plan");
    const TopkPlan p = plan_topk(rows, columns, sm_count);
    *plan = {static_cast<int32_t>(p.kernel), p.segments, p.segment_len, rows, topk_workspace_bytes(p, rows), p.candidates};
  });
}

int nvfp4mla_topk_reference(const nvfp4mla_topk* args, const nvfp4mla_topk_outputs* out) {
  return guarded([&] { topk_reference(topk_of(args), outputs_of(out)); });
}

int nvfp4mla_plan_fused_select(int64_t requests, int32_t next_n, int32_t heads, int64_t page_size, int64_t max_context,
                               int32_t k, int64_t chunk, int32_t sm_count, nvfp4mla_fused_select_plan* plan) {
  return guarded([&] {
    require(plan, "plan");
    FusedSelectArgs a;
    a.keys.q = kPlaceholder;
    a.keys.weights = reinterpret_cast<const float*>(kPlaceholderI32);
    a.keys.context_lens = kPlaceholderI32;
    a.keys.requests = requests;
    a.keys.next_n = next_n;
    a.keys.heads = heads;
    a.keys.page_size = page_size;
    a.max_context = max_context;
    a.k = k;
    *plan = plan_out(plan_fused_select(a, chunk, sm_count), sm_count);
  });
}

int nvfp4mla_plan_fused_select_ragged(int64_t rows, int32_t heads, int64_t max_length, int32_t k, int64_t chunk,
                                      int32_t sm_count, nvfp4mla_fused_select_plan* plan) {
  return guarded([&] {
    require(plan, "plan");
    FusedSelectRaggedArgs a;
    a.keys.q = kPlaceholder;
    a.keys.weights = reinterpret_cast<const float*>(kPlaceholderI32);
    a.keys.row_starts = a.keys.row_ends = kPlaceholderI32;
    a.keys.rows = rows;
    a.keys.heads = heads;
    a.max_length = max_length;
    a.k = k;
    *plan = plan_out(plan_fused_select(a, chunk, sm_count), sm_count);
  });
}

int nvfp4mla_fused_select_reference(const nvfp4mla_fused_select* args, const nvfp4mla_fused_select_plan* plan,
                                    const nvfp4mla_topk_outputs* out) {
  return guarded([&] {
    require(plan, "plan");
    fused_select_reference(fused_of(args), plan->chunk, outputs_of(out));
  });
}

int nvfp4mla_fused_select_ragged_reference(const nvfp4mla_fused_select_ragged* args,
                                           const nvfp4mla_fused_select_plan* plan, const nvfp4mla_topk_outputs* out) {
  return guarded([&] {
    require(plan, "plan");
    fused_select_reference(fused_of(args), plan->chunk, outputs_of(out));
  });
}

#if defined(NVFP4MLA_WITH_CUDA)

int nvfp4mla_cuda_write_index_cache(int32_t input_type, const void* keys, int64_t key_stride, int64_t n,
                                    const int64_t* slot_mapping, const nvfp4mla_index_cache* cache,
                                    uint64_t* invalid_count, int32_t device, void* stream) {
  return guarded([&] {
    cuda::IndexCacheWriteArgs a;
    a.keys = keys;
    a.input_type = input_type_of(input_type);
    a.num_tokens = n;
    a.key_stride = key_stride;
    a.slot_mapping = slot_mapping;
    a.cache = index_cache_of(cache);
    a.invalid_count = counter_of(invalid_count);
    DeviceScope scope(device);
    cuda::write_index_cache(a, stream_of(stream));
  });
}

int nvfp4mla_cuda_gather_index_records(const nvfp4mla_index_cache* cache, const int64_t* slots, int64_t n,
                                       uint8_t* records, uint64_t* invalid_count, int32_t device, void* stream) {
  return guarded([&] {
    const IndexCacheView view = index_cache_of(cache);
    DeviceScope scope(device);
    cuda::gather_index_records(view, slots, n, records, counter_of(invalid_count), stream_of(stream));
  });
}

int nvfp4mla_cuda_gather_index_keys(const nvfp4mla_index_cache* cache, const int64_t* slots, int64_t n, uint8_t* values,
                                    float* scales, uint64_t* invalid_count, int32_t device, void* stream) {
  return guarded([&] {
    const IndexCacheView view = index_cache_of(cache);
    DeviceScope scope(device);
    cuda::gather_index_keys(view, slots, n, values, scales, counter_of(invalid_count), stream_of(stream));
  });
}

int nvfp4mla_cuda_indexer_logits_ragged(const nvfp4mla_indexer_ragged* args, uint64_t* invalid_count, int32_t device,
                                        void* stream) {
  return guarded([&] {
    const IndexerRaggedArgs a = ragged_of(args);
    DeviceScope scope(device);
    cuda::indexer_logits(a, counter_of(invalid_count), stream_of(stream));
  });
}

int nvfp4mla_cuda_indexer_logits_paged(const nvfp4mla_indexer_paged* args, uint64_t* invalid_count, int32_t device,
                                       void* stream) {
  return guarded([&] {
    const IndexerPagedArgs a = paged_of(args);
    DeviceScope scope(device);
    cuda::indexer_logits(a, counter_of(invalid_count), stream_of(stream));
  });
}

int nvfp4mla_cuda_topk(const nvfp4mla_topk* args, const nvfp4mla_topk_plan* plan, void* workspace,
                       uint64_t workspace_bytes, const nvfp4mla_topk_outputs* out, uint64_t* error_count,
                       int32_t device, void* stream) {
  return guarded([&] {
    const TopkArgs a = topk_of(args);
    const TopkPlan p = topk_plan_of(plan, a.rows);
    DeviceScope scope(device);
    cuda::topk(a, p, workspace, workspace_bytes, outputs_of(out), counter_of(error_count), stream_of(stream));
  });
}

int nvfp4mla_cuda_fused_select(const nvfp4mla_fused_select* args, const nvfp4mla_fused_select_plan* plan,
                               void* workspace, uint64_t workspace_bytes, const nvfp4mla_topk_outputs* out,
                               uint64_t* invalid_count, int32_t device, void* stream) {
  return guarded([&] {
    const FusedSelectArgs a = fused_of(args);
    const FusedSelectPlan p = fused_plan_of(a, plan);
    DeviceScope scope(device);
    cuda::fused_select(a, p, workspace, workspace_bytes, outputs_of(out), counter_of(invalid_count), stream_of(stream));
  });
}

int nvfp4mla_cuda_fused_select_ragged(const nvfp4mla_fused_select_ragged* args, const nvfp4mla_fused_select_plan* plan,
                                      void* workspace, uint64_t workspace_bytes, const nvfp4mla_topk_outputs* out,
                                      uint64_t* invalid_count, int32_t device, void* stream) {
  return guarded([&] {
    const FusedSelectRaggedArgs a = fused_of(args);
    const FusedSelectPlan p = fused_plan_of(a, plan);
    DeviceScope scope(device);
    cuda::fused_select(a, p, workspace, workspace_bytes, outputs_of(out), counter_of(invalid_count), stream_of(stream));
  });
}

#else  // built without CUDA: every GPU entry point says so

int nvfp4mla_cuda_write_index_cache(int32_t, const void*, int64_t, int64_t, const int64_t*, const nvfp4mla_index_cache*,
                                    uint64_t*, int32_t, void*) {
  return guarded([] { no_cuda("write_index_cache"); });
}
int nvfp4mla_cuda_gather_index_records(const nvfp4mla_index_cache*, const int64_t*, int64_t, uint8_t*, uint64_t*, int32_t,
                                       void*) {
  return guarded([] { no_cuda("gather_index_records"); });
}
int nvfp4mla_cuda_gather_index_keys(const nvfp4mla_index_cache*, const int64_t*, int64_t, uint8_t*, float*, uint64_t*,
                                    int32_t, void*) {
  return guarded([] { no_cuda("gather_index_keys"); });
}
int nvfp4mla_cuda_indexer_logits_ragged(const nvfp4mla_indexer_ragged*, uint64_t*, int32_t, void*) {
  return guarded([] { no_cuda("indexer_logits"); });
}
int nvfp4mla_cuda_indexer_logits_paged(const nvfp4mla_indexer_paged*, uint64_t*, int32_t, void*) {
  return guarded([] { no_cuda("indexer_logits_paged"); });
}
int nvfp4mla_cuda_topk(const nvfp4mla_topk*, const nvfp4mla_topk_plan*, void*, uint64_t, const nvfp4mla_topk_outputs*,
                       uint64_t*, int32_t, void*) {
  return guarded([] { no_cuda("topk"); });
}
int nvfp4mla_cuda_fused_select(const nvfp4mla_fused_select*, const nvfp4mla_fused_select_plan*, void*, uint64_t,
                               const nvfp4mla_topk_outputs*, uint64_t*, int32_t, void*) {
  return guarded([] { no_cuda("fused_select"); });
}
int nvfp4mla_cuda_fused_select_ragged(const nvfp4mla_fused_select_ragged*, const nvfp4mla_fused_select_plan*, void*,
                                      uint64_t, const nvfp4mla_topk_outputs*, uint64_t*, int32_t, void*) {
  return guarded([] { no_cuda("fused_select_ragged"); });
}

#endif

}  // extern "C"
