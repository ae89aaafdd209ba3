// C ABI: sparse MLA references and planner, and every GPU entry point.
#include <cstring>

#include "capi_support.h"
#include "nvfp4mla/arch.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/sparse_mla.h"

#if defined(NVFP4MLA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "nvfp4mla/cuda/cache_write.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/cuda/sparse_extend.h"
#include "nvfp4mla/cuda/sparse_scores.h"
#endif

namespace nvfp4mla::capi {
namespace {

// A C plan names no kernel: it is the planner's choice for the current device (what
// nvfp4mla_plan_decode planned with, planning_arch), format and head count.
DecodePlan plan_of(const nvfp4mla_decode_plan* p, const RecordSpec& spec, int heads) {
  require(p, "decode plan");
  DecodePlan d;
  d.kernel = heads > 0 ? default_decode_kernel(planning_arch(1), spec, heads) : DecodeKernel::sm80_mma;  // SMs do not matter
  d.head_group = p->head_group;
  d.num_head_groups = p->num_head_groups;
  d.warps = p->warps;
  d.tile_tokens = p->tile_tokens;
  d.ctas_per_sm = p->ctas_per_sm;
  d.stages = p->stages;
  d.num_tiles = p->num_tiles;
  d.splits = p->splits;
  d.tiles_per_split = p->tiles_per_split;
  d.partial_bytes = p->partial_bytes;
  return d;
}


}  // namespace
}  // namespace nvfp4mla::capi

using namespace nvfp4mla;
using namespace nvfp4mla::capi;

extern "C" {

int nvfp4mla_sparse_mla_reference(const nvfp4mla_format* format, const nvfp4mla_attention* problem,
                                  int32_t bf16_operands, float* out, float* lse) {
  return guarded([&] {
    const RecordSpec spec = spec_of(format);
    const SparseMlaArgs a = attention_args(problem, format->layer_scale);
    if (a.rows > 0) {
      require(out, "out");
      require(lse, "lse");
    }
    sparse_mla_reference(spec, a, out, lse, {.bf16_operands = bf16_operands != 0});
  });
}

int nvfp4mla_sparse_scores_reference(const nvfp4mla_format* format, const nvfp4mla_attention* problem,
                                     int32_t bf16_operands, float* scores) {
  return guarded([&] {
    const RecordSpec spec = spec_of(format);
    const SparseMlaArgs a = attention_args(problem, format->layer_scale);
    if (a.rows > 0) require(scores, "scores");
    sparse_mla_scores_reference(spec, a, scores, {.bf16_operands = bf16_operands != 0});
  });
}

int nvfp4mla_plan_decode(const nvfp4mla_format* format, int32_t rows, int32_t heads, int32_t topk, int32_t sm_count,
                         int32_t forced_splits, nvfp4mla_decode_plan* plan) {
  return guarded([&] {
    require(plan, "plan");
    if (forced_splits < 0) throw Error("decode plan: splits must not be negative (0: the planner's choice)");
    const DecodePlan d = plan_sparse_decode(spec_of(format), rows, heads, topk, sm_count, forced_splits);
    *plan = {d.head_group, d.num_head_groups, d.warps, d.tile_tokens, d.ctas_per_sm, d.stages, d.num_tiles,
             d.splits, d.tiles_per_split, d.partial_bytes, decode_workspace_layout(d, rows, heads).total_bytes};
  });
}

int nvfp4mla_cuda_sparse_decode_call(const nvfp4mla_sparse_decode_call* call) {
  if (!call) return guarded([] { require(nullptr, "sparse decode call"); });
  nvfp4mla_sparse_decode_call c;  // a copy: an interpreter's buffer need not be aligned for the struct
  std::memcpy(&c, call, sizeof c);
  return nvfp4mla_cuda_sparse_decode(c.format, &c.problem, c.plan, c.workspace, c.workspace_bytes, c.out, c.lse,
                                     c.device, c.stream);
}

#if defined(NVFP4MLA_WITH_CUDA)

int nvfp4mla_cuda_sm_count(int device, int* sm_count) {
  return guarded([&] {
    require(sm_count, "sm_count");
    check_cuda(cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute(SM count)");
  });
}

int nvfp4mla_cuda_write_cache(const nvfp4mla_format* format, int32_t input_type, const void* kv_c, int64_t kv_c_stride,
                              const void* k_pe, int64_t k_pe_stride, int64_t n, const int64_t* slot_mapping,
                              uint8_t* cache, int64_t capacity, uint64_t* error_count, int32_t device, void* stream) {
  return guarded([&] {
    const RecordSpec spec = spec_of(format);
    cuda::CacheWriteArgs a;
    a.kv_c = kv_c;
    a.k_pe = k_pe;
    a.input_type = input_type_of(input_type);
    a.num_tokens = n;
    a.kv_c_stride = kv_c_stride;
    a.k_pe_stride = k_pe_stride;
    a.slot_mapping = slot_mapping;
    a.cache = cache;
    a.capacity = capacity;
    a.layer_scale = format->layer_scale;
    a.error_count = counter_of(error_count);
    DeviceScope scope(device);
    cuda::write_cache(spec, a, stream_of(stream));
  });
}

int nvfp4mla_cuda_gather_records(int32_t record_bytes, const uint8_t* cache, int64_t capacity, const int64_t* slots,
                                 int64_t n, uint8_t* dst, uint64_t* error_count, int32_t device, void* stream) {
  return guarded([&] {
    DeviceScope scope(device);
    cuda::gather_records(record_bytes, cache, capacity, slots, n, dst, counter_of(error_count), stream_of(stream));
  });
}

int nvfp4mla_cuda_scatter_records(int32_t record_bytes, const uint8_t* src, const int64_t* slots, int64_t n,
                                  uint8_t* cache, int64_t capacity, uint64_t* error_count, int32_t device,
                                  void* stream) {
  return guarded([&] {
    DeviceScope scope(device);
    cuda::scatter_records(record_bytes, src, slots, n, cache, capacity, counter_of(error_count), stream_of(stream));
  });
}

int nvfp4mla_cuda_sparse_decode(const nvfp4mla_format* format, const nvfp4mla_attention* problem,
                                const nvfp4mla_decode_plan* plan, void* workspace, uint64_t workspace_bytes,
                                uint16_t* out, float* lse, int32_t device, void* stream) {
  return guarded([&] {
    const RecordSpec spec = spec_of(format);
    const SparseMlaArgs a = attention_args(problem, format->layer_scale);
    DeviceScope scope(device);
    DecodePlan d = plan_of(plan, spec, a.heads);
    // As the planner decides it (a C plan does not carry it), for the device that runs it.
    d.merge_in_kernel = plan_merges_in_kernel(d, a.rows, cuda::current_sm_count());
    cuda::sparse_decode(spec, a, d, workspace, workspace_bytes, out, lse, stream_of(stream));
  });
}

int nvfp4mla_cuda_sparse_extend(const nvfp4mla_format* format, const nvfp4mla_attention* problem, uint16_t* out,
                                float* lse, int32_t device, void* stream) {
  return guarded([&] {
    const RecordSpec spec = spec_of(format);
    const SparseMlaArgs a = attention_args(problem, format->layer_scale);
    DeviceScope scope(device);
    cuda::sparse_extend(spec, a, out, lse, stream_of(stream));
  });
}

int nvfp4mla_cuda_extend_staging_bytes(int64_t capacity, int32_t rows, int32_t topk, uint64_t* bytes) {
  return guarded([&] {
    require(bytes, "bytes");
    *bytes = cuda::extend_staging_layout(capacity, rows, topk).total_bytes;
  });
}

int nvfp4mla_cuda_sparse_extend_staged(const nvfp4mla_format* format, const nvfp4mla_attention* problem,
                                       void* workspace, uint64_t workspace_bytes, uint16_t* out, float* lse,
                                       int32_t device, void* stream) {
  return guarded([&] {
    const RecordSpec spec = spec_of(format);
    const SparseMlaArgs a = attention_args(problem, format->layer_scale);
    DeviceScope scope(device);
    cuda::sparse_extend_staged(spec, a, workspace, workspace_bytes, out, lse, stream_of(stream));
  });
}

int nvfp4mla_cuda_sparse_scores(const nvfp4mla_format* format, const nvfp4mla_attention* problem, float* scores,
                                int32_t device, void* stream) {
  return guarded([&] {
    const RecordSpec spec = spec_of(format);
    const SparseMlaArgs a = attention_args(problem, format->layer_scale);
    DeviceScope scope(device);
    cuda::sparse_scores(spec, a, scores, stream_of(stream));
  });
}

int nvfp4mla_cuda_decode_numerics(const nvfp4mla_format* format, const nvfp4mla_decode_plan* plan,
                                  int32_t* rounds_k_to_bf16, int32_t* weights_are_bf16) {
  return guarded([&] {
    const RecordSpec spec = spec_of(format);
    require(plan, "decode plan");
    const DecodePlan d = plan_of(plan, spec, plan->head_group * plan->num_head_groups);
    require(rounds_k_to_bf16, "rounds_k_to_bf16");
    require(weights_are_bf16, "weights_are_bf16");
    *rounds_k_to_bf16 = cuda::decode_rounds_k_to_bf16(spec, d) ? 1 : 0;
    *weights_are_bf16 = cuda::decode_weights_are_bf16(spec, d) ? 1 : 0;
  });
}

#else  // built without CUDA: every GPU entry point says so

int nvfp4mla_cuda_sm_count(int, int*) {
  return guarded([] { no_cuda("cuda_sm_count"); });
}
int nvfp4mla_cuda_write_cache(const nvfp4mla_format*, int32_t, const void*, int64_t, const void*, int64_t, int64_t,
                              const int64_t*, uint8_t*, int64_t, uint64_t*, int32_t, void*) {
  return guarded([] { no_cuda("write_cache"); });
}
int nvfp4mla_cuda_gather_records(int32_t, const uint8_t*, int64_t, const int64_t*, int64_t, uint8_t*, uint64_t*,
                                 int32_t, void*) {
  return guarded([] { no_cuda("gather_records"); });
}
int nvfp4mla_cuda_scatter_records(int32_t, const uint8_t*, const int64_t*, int64_t, uint8_t*, int64_t, uint64_t*,
                                  int32_t, void*) {
  return guarded([] { no_cuda("scatter_records"); });
}
int nvfp4mla_cuda_sparse_decode(const nvfp4mla_format*, const nvfp4mla_attention*, const nvfp4mla_decode_plan*, void*,
                                uint64_t, uint16_t*, float*, int32_t, void*) {
  return guarded([] { no_cuda("sparse_decode"); });
}
int nvfp4mla_cuda_sparse_extend(const nvfp4mla_format*, const nvfp4mla_attention*, uint16_t*, float*, int32_t,
                                void*) {
  return guarded([] { no_cuda("sparse_extend"); });
}
int nvfp4mla_cuda_extend_staging_bytes(int64_t, int32_t, int32_t, uint64_t*) {
  return guarded([] { no_cuda("extend_staging_bytes"); });
}
int nvfp4mla_cuda_sparse_extend_staged(const nvfp4mla_format*, const nvfp4mla_attention*, void*, uint64_t, uint16_t*,
                                       float*, int32_t, void*) {
  return guarded([] { no_cuda("sparse_extend_staged"); });
}
int nvfp4mla_cuda_sparse_scores(const nvfp4mla_format*, const nvfp4mla_attention*, float*, int32_t, void*) {
  return guarded([] { no_cuda("sparse_scores"); });
}
int nvfp4mla_cuda_decode_numerics(const nvfp4mla_format*, const nvfp4mla_decode_plan*, int32_t*, int32_t*) {
  return guarded([] { no_cuda("decode_numerics"); });
}

#endif

}  // extern "C"
