// C ABI: library information, format configurations and the CPU record functions.
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <vector>

#include "capi_support.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/index_key.h"
#include "nvfp4mla/paged_cache.h"
#include "nvfp4mla/record.h"

struct nvfp4mla_config {
  nvfp4mla::FormatConfig config;
};

namespace nvfp4mla::capi {

namespace {
thread_local std::string t_last_error;
thread_local std::string t_handed_out;

void check_code(const char* what, int32_t code, int32_t max) {
  if (code < 0 || code > max) throw Error(std::string("format: unknown ") + what + " code " + std::to_string(code));
}
}  // namespace

void set_last_error(const std::string& message) { t_last_error = message; }
const char* last_error() { return t_last_error.c_str(); }

const char* hand_out(std::string text) {
  t_handed_out = std::move(text);
  return t_handed_out.c_str();
}

void require(const void* p, const char* what) {
  if (!p) throw Error(std::string(what) + " is required (null pointer)");
}

FormatConfig config_of(const nvfp4mla_format* f) {
  require(f, "format");
  check_code("cache dtype", f->cache_dtype, NVFP4MLA_DTYPE_NVFP4_DS_MLA);
  check_code("RoPE encoding", f->rope, NVFP4MLA_ROPE_FP8);
  check_code("scale mode", f->scale_mode, NVFP4MLA_SCALE_DYNAMIC);
  FormatOptions o;
  o.cache_dtype = static_cast<CacheDtype>(f->cache_dtype);
  // Only settings that differ from the defaults are passed for the other dtypes, so that
  // FormatConfig::create names any that do not apply.
  const bool nvfp4 = f->cache_dtype == NVFP4MLA_DTYPE_NVFP4_DS_MLA;
  if (nvfp4 || f->rope != NVFP4MLA_ROPE_BF16) o.rope = static_cast<RopeEncoding>(f->rope);
  if (nvfp4 || f->scale_mode != NVFP4MLA_SCALE_IMPLICIT) o.scale_mode = static_cast<ScaleMode>(f->scale_mode);
  if (f->scale_mode == NVFP4MLA_SCALE_STATIC) o.layer_scale = f->layer_scale;
  return FormatConfig::create(o);
}

RecordSpec spec_of(const nvfp4mla_format* format) { return config_of(format).spec(); }

nvfp4mla_format format_of(const RecordSpec& spec, float layer_scale) {
  return {static_cast<int32_t>(spec.dtype), static_cast<int32_t>(spec.rope), static_cast<int32_t>(spec.scale_mode),
          layer_scale};
}

SparseMlaArgs attention_args(const nvfp4mla_attention* p, float layer_scale) {
  require(p, "attention problem");
  SparseMlaArgs a;
  a.q = p->q;
  a.rows = p->rows;
  a.heads = p->heads;
  a.cache = p->cache;
  a.capacity = p->capacity;
  a.indices = p->indices;
  a.topk = p->topk;
  a.topk_length = p->topk_length;
  a.sm_scale = p->sm_scale;
  a.layer_scale = layer_scale;
  a.lse_base = p->lse_base2 ? LseBase::base2 : LseBase::natural;
  return a;
}

namespace {

std::optional<std::string> optional_string(const char* s) {
  if (!s) return std::nullopt;
  return std::string(s);
}

// The slots 0..n-1 of a dense record array, read as a paged cache of n one-slot pages.
std::vector<int64_t> identity_slots(int64_t n) {
  std::vector<int64_t> slots(static_cast<size_t>(n));
  std::iota(slots.begin(), slots.end(), int64_t{0});
  return slots;
}

// The record copies of cuda/cache_write.h on the host. Gather (cache -> dense rows): a negative
// slot gives a zero row, a slot >= capacity a zero row that is counted. Scatter (dense rows ->
// cache): negative slots are skipped, those >= capacity skipped and counted.
void copy_records(int32_t record_bytes, const uint8_t* from, const int64_t* slots, int64_t n, uint8_t* to,
                  int64_t capacity, bool gather, uint64_t* error_count) {
  const char* op = gather ? "gather_records" : "scatter_records";
  if (record_bytes <= 0) throw Error(std::string(op) + ": record width must be positive");
  if (capacity < 0) throw Error(std::string(op) + ": negative capacity");
  check_count(n, op);
  if (n == 0) return;
  require(slots, "slots");
  if (gather ? capacity > 0 : true) require(from, gather ? "cache" : "src");  // an empty cache may be null
  if (gather ? true : capacity > 0) require(to, gather ? "dst" : "cache");
  const size_t rb = static_cast<size_t>(record_bytes);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slots[i];
    const size_t row = static_cast<size_t>(i) * rb;
    if (s >= 0 && s < capacity) {
      const size_t slot = static_cast<size_t>(s) * rb;
      std::memcpy(gather ? to + row : to + slot, gather ? from + slot : from + row, rb);
      continue;
    }
    if (gather) std::memset(to + row, 0, rb);
    if (s >= capacity && error_count) ++*error_count;
  }
}

}  // namespace
}  // namespace nvfp4mla::capi

using namespace nvfp4mla;
using namespace nvfp4mla::capi;

extern "C" {

int nvfp4mla_c_api_version(void) { return NVFP4MLA_C_API_VERSION; }
const char* nvfp4mla_last_error(void) { return last_error(); }
int nvfp4mla_built_with_cuda(void) { return built_with_cuda() ? 1 : 0; }
void nvfp4mla_dims(int32_t* latent_dim, int32_t* rope_dim) {
  if (latent_dim) *latent_dim = kLatentDim;
  if (rope_dim) *rope_dim = kRopeDim;
}
int32_t nvfp4mla_index_key_record_bytes(void) { return index_key::kRecordBytes; }
int nvfp4mla_cuda_device_count(void) { return cuda_device_count(); }

int nvfp4mla_config_create(const nvfp4mla_format_options* o, nvfp4mla_config** config) {
  return guarded([&] {
    require(o, "format options");
    require(config, "config");
    FormatOptions flags;
    if (o->cache_dtype) flags.cache_dtype = parse_cache_dtype(o->cache_dtype);
    if (o->rope) flags.rope = parse_rope(o->rope);
    if (o->scale_mode) flags.scale_mode = parse_scale_mode(o->scale_mode);
    flags.scales_file = optional_string(o->scales_file);
    if (o->has_layer) flags.layer = o->layer;
    if (o->has_layer_scale) flags.layer_scale = o->layer_scale;
    flags.unit_scale_for_missing_layer = o->unit_scale_for_missing_layer != 0;
    EnvironmentSettings env;
    env.dynamic_scale = optional_string(o->env_dynamic_scale);
    env.fp8_rope = optional_string(o->env_fp8_rope);
    env.scales_file = optional_string(o->env_scales_file);
    *config = new nvfp4mla_config{FormatConfig::create(flags, env)};
  });
}

void nvfp4mla_config_destroy(nvfp4mla_config* config) { delete config; }

int nvfp4mla_config_format(const nvfp4mla_config* c, nvfp4mla_format* format) {
  return guarded([&] {
    require(c, "config");
    require(format, "format");
    *format = format_of(c->config.spec(), c->config.layer_scale());
  });
}

int nvfp4mla_config_spec(const nvfp4mla_config* c, nvfp4mla_format* format) {
  return guarded([&] {
    require(c, "config");
    require(format, "format");
    *format = format_of(c->config.spec(), 1.0f);
  });
}

int nvfp4mla_config_layer_scale_for(const nvfp4mla_config* c, int32_t layer, float* scale) {
  return guarded([&] {
    require(c, "config");
    require(scale, "scale");
    if (layer < 0) throw Error("layer must not be negative");
    *scale = c->config.layer_scale_for(layer);
  });
}

int nvfp4mla_config_layer(const nvfp4mla_config* c, int32_t* has_layer, int32_t* layer) {
  return guarded([&] {
    require(c, "config");
    require(has_layer, "has_layer");
    require(layer, "layer");
    const auto l = c->config.layer();
    *has_layer = l.has_value() ? 1 : 0;
    *layer = l.value_or(0);
  });
}

int nvfp4mla_config_identity(const nvfp4mla_config* c, int32_t compat, const char** identity) {
  return guarded([&] {
    require(c, "config");
    require(identity, "identity");
    if (compat != 0 && compat != 1) throw Error("identity compat must be native or vllm");
    *identity = hand_out(c->config.identity(compat == 1 ? IdentityCompat::vllm : IdentityCompat::native));
  });
}

int nvfp4mla_config_describe(const nvfp4mla_config* c, const char** description) {
  return guarded([&] {
    require(c, "config");
    require(description, "description");
    *description = hand_out(c->config.describe());
  });
}

int nvfp4mla_config_scales_file(const nvfp4mla_config* c, const char** path) {
  return guarded([&] {
    require(c, "config");
    require(path, "path");
    const Calibration* calibration = c->config.calibration();
    *path = hand_out(calibration ? calibration->source.string() : std::string());
  });
}

int nvfp4mla_format_record_bytes(const nvfp4mla_format* format, int32_t* record_bytes) {
  return guarded([&] {
    require(record_bytes, "record_bytes");
    *record_bytes = config_of(format).record_bytes();
  });
}

int nvfp4mla_encode(const nvfp4mla_format* format, int32_t input_type, const void* kv_c, int64_t kv_c_stride,
                    const void* k_pe, int64_t k_pe_stride, int64_t n, uint8_t* records) {
  return guarded([&] {
    const FormatConfig cfg = config_of(format);
    check_count(n, "encode");
    if (n == 0) return;
    require(kv_c, "kv_c");
    require(k_pe, "k_pe");
    require(records, "records");
    if (kv_c_stride < kLatentDim || k_pe_stride < kRopeDim)
      throw Error("encode: row strides must cover 512 latent and 64 RoPE values");
    const RecordSpec spec = cfg.spec();
    const float layer_scale = cfg.layer_scale();
    const int rb = cfg.record_bytes();
    with_input_type(input_type, [&](auto tag) {
      using In = decltype(tag);
      const In* kv = static_cast<const In*>(kv_c);
      const In* pe = static_cast<const In*>(k_pe);
      for (int64_t t = 0; t < n; ++t)
        record::encode(spec, kv + t * kv_c_stride, pe + t * k_pe_stride, layer_scale, records + t * rb);
    });
  });
}

int nvfp4mla_decode(const nvfp4mla_format* format, const uint8_t* records, int64_t n, float* kv_c, float* k_pe) {
  return guarded([&] {
    const FormatConfig cfg = config_of(format);
    check_count(n, "decode");
    if (n == 0) return;
    require(records, "records");
    const std::vector<int64_t> slots = identity_slots(n);
    gather_dequantize(cfg, PagedCacheView{const_cast<uint8_t*>(records), n, 1, cfg.record_bytes()}, slots, kv_c, k_pe);
  });
}

int nvfp4mla_write_cache(const nvfp4mla_format* format, int32_t input_type, const void* kv_c, const void* k_pe,
                         int64_t n, const int64_t* slot_mapping, uint8_t* cache, int64_t capacity) {
  return guarded([&] {
    const FormatConfig cfg = config_of(format);
    check_count(n, "write_cache");
    if (n > 0) require(slot_mapping, "slot_mapping");
    const std::span<const int64_t> slots(slot_mapping, static_cast<size_t>(n));
    const PagedCacheView view{cache, capacity, 1, cfg.record_bytes()};
    with_input_type(input_type, [&](auto tag) {
      using In = decltype(tag);
      write_paged_cache(cfg, TokenBatch<In>{static_cast<const In*>(kv_c), static_cast<const In*>(k_pe), n}, slots, view);
    });
  });
}

int nvfp4mla_gather_records(int32_t record_bytes, const uint8_t* cache, int64_t capacity, const int64_t* slots,
                            int64_t n, uint8_t* dst, uint64_t* error_count) {
  return guarded([&] { copy_records(record_bytes, cache, slots, n, dst, capacity, true, error_count); });
}

int nvfp4mla_scatter_records(int32_t record_bytes, const uint8_t* src, const int64_t* slots, int64_t n, uint8_t* cache,
                             int64_t capacity, uint64_t* error_count) {
  return guarded([&] { copy_records(record_bytes, src, slots, n, cache, capacity, false, error_count); });
}

}  // extern "C"
