#ifndef NVFP4MLA_C_API_H
#define NVFP4MLA_C_API_H
/*
 * The C ABI of nvfp4mla, exported by the shared library libnvfp4mla_c.so for callers in other
 * languages (the Python package `nvfp4mla` loads it through ctypes).
 *
 * Conventions
 * - Every function that can fail returns an int status: NVFP4MLA_OK (0) or an error code. The
 *   message of the last failure on the calling thread is nvfp4mla_last_error(); it is the library's
 *   own nvfp4mla::Error message. Nothing is written or changed by a call that fails validation.
 * - Strings handed out (identity, description, route reason, store paths) live in thread-local
 *   storage and stay valid until the next call on the same thread: copy them at once.
 * - Pointers passed as tensors are raw memory: host memory for the CPU functions, device memory
 *   (of `device`) for the nvfp4mla_cuda_* functions. Shapes are the C++ API's; the caller checks
 *   dtypes and strides (the Python package does, before every call).
 * - nvfp4mla_cuda_* functions make `device` current for the call (restoring the previous one),
 *   queue their work on `stream` (a cudaStream_t; NULL is the legacy default stream) and never
 *   allocate or synchronize, so they can be captured in a CUDA graph. In a build without CUDA
 *   they return NVFP4MLA_ERROR_UNSUPPORTED.
 */
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define NVFP4MLA_C_EXPORT __declspec(dllexport)
#else
#define NVFP4MLA_C_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a signature or struct below changes; the Python package refuses another. */
#define NVFP4MLA_C_API_VERSION 4

enum {
  NVFP4MLA_OK = 0,
  NVFP4MLA_ERROR = 1,             /* invalid argument, bad file, failed I/O: nvfp4mla::Error */
  NVFP4MLA_ERROR_INTERNAL = 2,    /* any other exception (out of memory, ...) */
  NVFP4MLA_ERROR_UNSUPPORTED = 3  /* a CUDA entry point of a library built without CUDA */
};

/* Values of nvfp4mla::CacheDtype, RopeEncoding, ScaleMode and cuda::InputType. */
enum { NVFP4MLA_DTYPE_BF16 = 0, NVFP4MLA_DTYPE_FP8_DS_MLA = 1, NVFP4MLA_DTYPE_NVFP4_DS_MLA = 2 };
enum { NVFP4MLA_ROPE_BF16 = 0, NVFP4MLA_ROPE_FP8 = 1 };
enum { NVFP4MLA_SCALE_IMPLICIT = 0, NVFP4MLA_SCALE_STATIC = 1, NVFP4MLA_SCALE_DYNAMIC = 2 };
enum { NVFP4MLA_INPUT_BF16 = 0, NVFP4MLA_INPUT_FP16 = 1, NVFP4MLA_INPUT_F32 = 2 };

NVFP4MLA_C_EXPORT int nvfp4mla_c_api_version(void);
NVFP4MLA_C_EXPORT const char* nvfp4mla_last_error(void);
NVFP4MLA_C_EXPORT int nvfp4mla_built_with_cuda(void);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_device_count(void);
/* The model geometry every format shares: latent (kv_c, also V) and RoPE (k_pe) values per token. */
NVFP4MLA_C_EXPORT void nvfp4mla_dims(int32_t* latent_dim, int32_t* rope_dim);
/* Bytes per token of the DSA index key cache (index_key.h: 128 E4M3 values + one fp32 scale). */
NVFP4MLA_C_EXPORT int32_t nvfp4mla_index_key_record_bytes(void);
/* SM count of a device (for nvfp4mla_plan_decode). */
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_sm_count(int device, int* sm_count);

/* ---- format configuration ------------------------------------------------------------------ */

/* FormatOptions and EnvironmentSettings of config.h. NULL strings and has_* = 0 mean "not given". */
typedef struct nvfp4mla_format_options {
  const char* cache_dtype;  /* "nvfp4_ds_mla", "fp8_ds_mla", "bf16" */
  const char* rope;         /* "bf16", "fp8" */
  const char* scale_mode;   /* "implicit", "static", "dynamic" */
  const char* scales_file;
  int32_t has_layer;
  int32_t layer;
  int32_t has_layer_scale;
  float layer_scale;
  int32_t unit_scale_for_missing_layer;
  /* The vLLM variables as read by the caller (NULL: unset). */
  const char* env_dynamic_scale;  /* VLLM_NVFP4_MLA_DYNAMIC_SCALE */
  const char* env_fp8_rope;       /* KV_FP8_ROPE */
  const char* env_scales_file;    /* VLLM_NVFP4_MLA_SCALES_FILE */
} nvfp4mla_format_options;

typedef struct nvfp4mla_config nvfp4mla_config; /* an immutable, validated FormatConfig */

NVFP4MLA_C_EXPORT int nvfp4mla_config_create(const nvfp4mla_format_options* options, nvfp4mla_config** config);
NVFP4MLA_C_EXPORT void nvfp4mla_config_destroy(nvfp4mla_config* config);

/* What every data function takes: the record spec and the layer's outer scale (static mode). */
typedef struct nvfp4mla_format {
  int32_t cache_dtype;
  int32_t rope;
  int32_t scale_mode;
  float layer_scale;
} nvfp4mla_format;

/* The spec of the configuration, with layer_scale = FormatConfig::layer_scale() (fails in static
 * mode when no layer was chosen). */
NVFP4MLA_C_EXPORT int nvfp4mla_config_format(const nvfp4mla_config* config, nvfp4mla_format* format);
/* The spec alone (layer_scale set to 1), for any configuration. */
NVFP4MLA_C_EXPORT int nvfp4mla_config_spec(const nvfp4mla_config* config, nvfp4mla_format* format);
NVFP4MLA_C_EXPORT int nvfp4mla_config_layer_scale_for(const nvfp4mla_config* config, int32_t layer, float* scale);
NVFP4MLA_C_EXPORT int nvfp4mla_config_layer(const nvfp4mla_config* config, int32_t* has_layer, int32_t* layer);
/* compat: 0 native, 1 vllm. */
NVFP4MLA_C_EXPORT int nvfp4mla_config_identity(const nvfp4mla_config* config, int32_t compat, const char** identity);
NVFP4MLA_C_EXPORT int nvfp4mla_config_describe(const nvfp4mla_config* config, const char** description);
/* The calibration file of a static configuration ("" without one). */
NVFP4MLA_C_EXPORT int nvfp4mla_config_scales_file(const nvfp4mla_config* config, const char** path);
/* Record bytes of a format (checks it as FormatConfig::create does). */
NVFP4MLA_C_EXPORT int nvfp4mla_format_record_bytes(const nvfp4mla_format* format, int32_t* record_bytes);

/* ---- records on the CPU ---------------------------------------------------------------------- */

/* Encode n tokens: kv_c rows of 512 and k_pe rows of 64 values of input_type, rows
 * kv_c_stride / k_pe_stride elements apart; records [n, record_bytes] written densely. */
NVFP4MLA_C_EXPORT int nvfp4mla_encode(const nvfp4mla_format* format, int32_t input_type, const void* kv_c,
                                      int64_t kv_c_stride, const void* k_pe, int64_t k_pe_stride, int64_t n,
                                      uint8_t* records);
/* Decode records [n, record_bytes] into fp32 kv_c [n, 512] and k_pe [n, 64]. */
NVFP4MLA_C_EXPORT int nvfp4mla_decode(const nvfp4mla_format* format, const uint8_t* records, int64_t n, float* kv_c,
                                      float* k_pe);
/* write_paged_cache: contiguous rows; negative slots skipped; a slot >= capacity fails, naming
 * it, before anything is written. */
NVFP4MLA_C_EXPORT int nvfp4mla_write_cache(const nvfp4mla_format* format, int32_t input_type, const void* kv_c,
                                           const void* k_pe, int64_t n, const int64_t* slot_mapping,
                                           uint8_t* cache, int64_t capacity);
/* The record copies of cuda/cache_write.h on host memory, same semantics: gather writes a zero
 * record for a negative slot, and for a slot >= capacity also adds one to *error_count (when
 * not NULL); scatter skips negative slots and counts those >= capacity. */
NVFP4MLA_C_EXPORT int nvfp4mla_gather_records(int32_t record_bytes, const uint8_t* cache, int64_t capacity,
                                              const int64_t* slots, int64_t n, uint8_t* dst,
                                              uint64_t* error_count);
NVFP4MLA_C_EXPORT int nvfp4mla_scatter_records(int32_t record_bytes, const uint8_t* src, const int64_t* slots,
                                               int64_t n, uint8_t* cache, int64_t capacity, uint64_t* error_count);

/* ---- sparse MLA (sparse_mla.h) ----------------------------------------------------------------- */

/* The problem shared by every attention entry point (SparseMlaArgs): q BF16 bits
 * [rows, heads, 576], cache [capacity, record_bytes], indices int32 [rows, topk], topk_length
 * int32 [rows] or NULL; lse_base2 = 0 natural, 1 base 2. */
typedef struct nvfp4mla_attention {
  const uint16_t* q;
  int32_t rows;
  int32_t heads;
  const uint8_t* cache;
  int64_t capacity;
  const int32_t* indices;
  int32_t topk;
  const int32_t* topk_length;
  float sm_scale;
  int32_t lse_base2;
} nvfp4mla_attention;

/* CPU fp64 reference: out fp32 [rows, heads, 512], lse fp32 [rows, heads]. bf16_operands rounds
 * K and V to BF16 first, as the kernels with BF16 operands do. */
NVFP4MLA_C_EXPORT int nvfp4mla_sparse_mla_reference(const nvfp4mla_format* format, const nvfp4mla_attention* problem,
                                                    int32_t bf16_operands, float* out, float* lse);
/* CPU reference logits: scores fp32 [rows, heads, topk], -inf where masked. */
NVFP4MLA_C_EXPORT int nvfp4mla_sparse_scores_reference(const nvfp4mla_format* format,
                                                       const nvfp4mla_attention* problem, int32_t bf16_operands,
                                                       float* scores);

/* DecodePlan of decode_plan.h, plus the workspace it needs for (rows, heads). */
typedef struct nvfp4mla_decode_plan {
  int32_t head_group;
  int32_t num_head_groups;
  int32_t warps;
  int32_t tile_tokens;
  int32_t ctas_per_sm;
  int32_t stages;
  int32_t num_tiles;
  int32_t splits;
  int32_t tiles_per_split;
  int32_t partial_bytes;
  uint64_t workspace_bytes;
} nvfp4mla_decode_plan;

/* plan_sparse_decode (forced_splits 0: the planner's choice) + decode_workspace_layout. */
NVFP4MLA_C_EXPORT int nvfp4mla_plan_decode(const nvfp4mla_format* format, int32_t rows, int32_t heads, int32_t topk,
                                           int32_t sm_count, int32_t forced_splits, nvfp4mla_decode_plan* plan);

/* ---- GPU entry points ------------------------------------------------------------------------------ */

/* cuda::write_cache: kv_c/k_pe rows kv_c_stride/k_pe_stride elements apart; error_count: optional
 * device uint64 counter of slots >= capacity. */
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_write_cache(const nvfp4mla_format* format, int32_t input_type, const void* kv_c,
                                                int64_t kv_c_stride, const void* k_pe, int64_t k_pe_stride,
                                                int64_t n, const int64_t* slot_mapping, uint8_t* cache,
                                                int64_t capacity, uint64_t* error_count, int32_t device,
                                                void* stream);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_gather_records(int32_t record_bytes, const uint8_t* cache, int64_t capacity,
                                                   const int64_t* slots, int64_t n, uint8_t* dst,
                                                   uint64_t* error_count, int32_t device, void* stream);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_scatter_records(int32_t record_bytes, const uint8_t* src, const int64_t* slots,
                                                    int64_t n, uint8_t* cache, int64_t capacity,
                                                    uint64_t* error_count, int32_t device, void* stream);
/* cuda::sparse_decode: out BF16 bits [rows, heads, 512] (16-byte aligned, like q and the cache),
 * lse fp32 [rows, heads]; the plan must
 * come from nvfp4mla_plan_decode for the same format, rows, heads and topk; workspace of at least
 * plan->workspace_bytes, 256-byte aligned (may be NULL when that is 0). */
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_sparse_decode(const nvfp4mla_format* format, const nvfp4mla_attention* problem,
                                                  const nvfp4mla_decode_plan* plan, void* workspace,
                                                  uint64_t workspace_bytes, uint16_t* out, float* lse,
                                                  int32_t device, void* stream);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_sparse_extend(const nvfp4mla_format* format, const nvfp4mla_attention* problem,
                                                  uint16_t* out, float* lse, int32_t device, void* stream);
/* The staged extend (cuda/sparse_extend.h): each record dequantized once into a BF16 record in
 * the workspace (every slot, or only the attended ones), then attention over those; same outputs
 * as nvfp4mla_cuda_sparse_extend.
 * The workspace holds at least nvfp4mla_cuda_extend_staging_bytes for the problem's capacity, rows
 * and topk, 256-byte aligned (may be NULL when rows is 0). The byte count is
 * cuda::extend_staging_layout's, whose scan storage CUB sizes for the current device. */
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_extend_staging_bytes(int64_t capacity, int32_t rows, int32_t topk,
                                                         uint64_t* bytes);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_sparse_extend_staged(const nvfp4mla_format* format,
                                                         const nvfp4mla_attention* problem, void* workspace,
                                                         uint64_t workspace_bytes, uint16_t* out, float* lse,
                                                         int32_t device, void* stream);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_sparse_scores(const nvfp4mla_format* format, const nvfp4mla_attention* problem,
                                                  float* scores, int32_t device, void* stream);
/* Which reference a decode result is compared against (cuda/sparse_decode.h). */
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_decode_numerics(const nvfp4mla_format* format, const nvfp4mla_decode_plan* plan,
                                                    int32_t* rounds_k_to_bf16, int32_t* weights_are_bf16);

/* ---- serving policy (serving/route.h, serving/planner.h) ------------------------------------------ */

/* mode: 0 off, 1 auto, 2 on (SpecDecodeMode). */
NVFP4MLA_C_EXPORT int nvfp4mla_parse_spec_decode_mode(const char* text, int32_t* mode);
NVFP4MLA_C_EXPORT int nvfp4mla_decode_qualified(int32_t cache_dtype, int32_t* qualified);

typedef struct nvfp4mla_verifier_batch {
  int32_t num_speculative_tokens;
  int32_t max_query_len;
  int32_t any_prefill;
  int32_t max_q_per_request;
  int64_t decode_rows;
  int64_t decode_row_budget;
} nvfp4mla_verifier_batch;

/* route: 0 decode, 1 extend; reason: thread-local string. */
NVFP4MLA_C_EXPORT int nvfp4mla_plan_route(int32_t mode, int32_t cache_dtype, const nvfp4mla_verifier_batch* batch,
                                          int32_t* route, const char** reason);
NVFP4MLA_C_EXPORT int nvfp4mla_decode_q_per_request(int32_t mode, int32_t cache_dtype,
                                                    int32_t num_speculative_tokens, int32_t* q_per_request);
/* build_verifier_rows: rows = max(n * tokens_per_request, padded_rows); causal_len and
 * topk_length must hold that many entries. */
NVFP4MLA_C_EXPORT int nvfp4mla_verifier_rows(const int64_t* context_lens, int64_t n, int32_t tokens_per_request,
                                             int32_t topk, int64_t padded_rows, int64_t* causal_len,
                                             int32_t* topk_length);

typedef struct nvfp4mla_scratch_request {
  int32_t cache_dtype;
  int32_t rope;
  int32_t scale_mode;
  int32_t num_heads;
  int32_t dcp_world_size;
  int32_t topk;
  int32_t max_num_seqs;
  int64_t max_num_batched_tokens;
  int32_t num_speculative_tokens;
  int32_t mode;          /* SpecDecodeMode as above */
  int32_t partial_bf16;  /* 0: fp32 partials (what the kernel writes), 1: bf16 */
  int32_t splits;        /* 0: the decode planner's worst case */
  int32_t sm_count;
  int32_t compute_capability; /* 10 * major + minor; 0: the GPU nvfp4mla_plan_decode plans for */
} nvfp4mla_scratch_request;

typedef struct nvfp4mla_scratch_plan {
  int32_t q_per_request;
  int64_t decode_rows;
  int32_t heads;
  int32_t splits;
  int32_t partial_bytes;
  uint64_t tmp_output_bytes;
  uint64_t tmp_lse_bytes;
  uint64_t output_bytes;
  uint64_t final_lse_bytes;
  uint64_t total_bytes;
} nvfp4mla_scratch_plan;

NVFP4MLA_C_EXPORT int nvfp4mla_plan_scratch(const nvfp4mla_scratch_request* request, nvfp4mla_scratch_plan* plan);

typedef struct nvfp4mla_capacity_request {
  int32_t cache_dtype;
  int32_t rope;
  int32_t scale_mode;
  int32_t layers;
  int32_t indexer_bytes_per_token;
  int32_t page_size;
  double memory_gib;
  double reserved_gib;
} nvfp4mla_capacity_request;

typedef struct nvfp4mla_capacity_plan {
  int64_t bytes_per_token;
  int64_t pages;
  int64_t tokens;
  int64_t max_single_request_tokens;
} nvfp4mla_capacity_plan;

NVFP4MLA_C_EXPORT int nvfp4mla_plan_capacity(const nvfp4mla_capacity_request* request, nvfp4mla_capacity_plan* plan);

/* ---- offload store (offload/store.h) -------------------------------------------------------------- */

typedef struct nvfp4mla_store_options {
  const char* record_identity;  /* native identity, e.g. nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1 */
  int32_t record_bytes;
  int32_t tokens_per_block;
  int32_t layers_in_block;
  const char* model_identity;
  int32_t tp_rank, tp_size, dcp_rank, dcp_size;
  uint64_t dram_capacity_bytes;  /* 0: no DRAM tier */
  uint64_t disk_capacity_bytes;  /* 0: unlimited */
  int32_t durable;
  int32_t io_threads;
} nvfp4mla_store_options;

typedef struct nvfp4mla_store nvfp4mla_store;

NVFP4MLA_C_EXPORT int nvfp4mla_store_open(const char* root, const nvfp4mla_store_options* options,
                                          nvfp4mla_store** store);
/* Finishes queued work, releases the namespace lock. */
NVFP4MLA_C_EXPORT void nvfp4mla_store_close(nvfp4mla_store* store);
NVFP4MLA_C_EXPORT int nvfp4mla_store_block_bytes(const nvfp4mla_store* store, uint64_t* block_bytes);
/* The namespace directory (thread-local string). */
NVFP4MLA_C_EXPORT int nvfp4mla_store_dir(const nvfp4mla_store* store, const char** dir);
NVFP4MLA_C_EXPORT int nvfp4mla_store_put(nvfp4mla_store* store, const uint8_t* key, size_t key_bytes,
                                         const uint8_t* block, size_t block_bytes);
/* *hit = 1 and out filled on a hit, 0 on a miss. */
NVFP4MLA_C_EXPORT int nvfp4mla_store_get(nvfp4mla_store* store, const uint8_t* key, size_t key_bytes, uint8_t* out,
                                         size_t out_bytes, int32_t* hit);
NVFP4MLA_C_EXPORT int nvfp4mla_store_contains(nvfp4mla_store* store, const uint8_t* key, size_t key_bytes,
                                              int32_t* found);
/* Batches on the store's thread pool, waiting for all items: n keys (keys[i], key_bytes[i]) and
 * blocks of block_bytes() each, blocks[i] for put and outs[i] for get. status[i]: 0 stored, 1 hit,
 * 2 miss, 3 failed (nvfp4mla_store_item_error gives a failed item's message until the next batch
 * on this thread). */
NVFP4MLA_C_EXPORT int nvfp4mla_store_put_many(nvfp4mla_store* store, int64_t n, const uint8_t* const* keys,
                                              const size_t* key_bytes, const uint8_t* const* blocks,
                                              int32_t* status);
NVFP4MLA_C_EXPORT int nvfp4mla_store_get_many(nvfp4mla_store* store, int64_t n, const uint8_t* const* keys,
                                              const size_t* key_bytes, uint8_t* const* outs, int32_t* status);
NVFP4MLA_C_EXPORT const char* nvfp4mla_store_item_error(int64_t item);

typedef struct nvfp4mla_store_stats {
  uint64_t dram_blocks, dram_bytes, dram_capacity_bytes, dram_hits, dram_misses, dram_puts, dram_evictions,
      dram_rejected;
  uint64_t disk_blocks, disk_bytes, disk_capacity_bytes, disk_hits, disk_misses, disk_corrupt, disk_read_errors,
      disk_puts, disk_put_failures, disk_evictions, disk_quarantined_at_open;
} nvfp4mla_store_stats;

NVFP4MLA_C_EXPORT int nvfp4mla_store_stats_get(const nvfp4mla_store* store, nvfp4mla_store_stats* stats);

/* ---- sparse decode in one argument (the per-step call of the Python package) -------------------- */

/* Every argument of nvfp4mla_cuda_sparse_decode in one struct, so that a caller in an interpreter
 * converts one buffer instead of nine arguments and a problem struct. */
typedef struct nvfp4mla_sparse_decode_call {
  const nvfp4mla_format* format;
  const nvfp4mla_decode_plan* plan;
  nvfp4mla_attention problem;
  void* workspace;
  uint64_t workspace_bytes;
  uint16_t* out;
  float* lse;
  int32_t device;
  void* stream;
} nvfp4mla_sparse_decode_call;

NVFP4MLA_C_EXPORT int nvfp4mla_cuda_sparse_decode_call(const nvfp4mla_sparse_decode_call* call);

/* ---- DSA selection (index_key.h, index_cache.h, indexer.h, topk.h, fused_select.h) ---------------- */

/* Encode n index keys (128 values of input_type per row, rows key_stride elements apart) into
 * per-token records [n, 132]: 128 E4M3 bytes, then the fp32 scale. */
NVFP4MLA_C_EXPORT int nvfp4mla_index_key_encode(int32_t input_type, const void* keys, int64_t key_stride, int64_t n,
                                                uint8_t* records);

/* A paged index key cache: [num_pages, page_size * 132] bytes (IndexCacheView). */
typedef struct nvfp4mla_index_cache {
  uint8_t* data;
  int64_t num_pages;
  int64_t page_size;
} nvfp4mla_index_cache;

/* write_index_cache (CPU): keys [n, 128] packed rows; negative slots skipped; a slot >= capacity
 * fails, naming it, before anything is written. */
NVFP4MLA_C_EXPORT int nvfp4mla_write_index_cache(int32_t input_type, const void* keys, int64_t n,
                                                 const int64_t* slot_mapping, const nvfp4mla_index_cache* cache);
/* gather_index_records / gather_index_keys (CPU): every slot in [0, capacity) or Error. */
NVFP4MLA_C_EXPORT int nvfp4mla_gather_index_records(const nvfp4mla_index_cache* cache, const int64_t* slots, int64_t n,
                                                    uint8_t* records);
NVFP4MLA_C_EXPORT int nvfp4mla_gather_index_keys(const nvfp4mla_index_cache* cache, const int64_t* slots, int64_t n,
                                                 uint8_t* values, float* scales);

/* IndexerRaggedArgs and IndexerPagedArgs of indexer.h. */
typedef struct nvfp4mla_indexer_ragged {
  const uint8_t* q;          /* [rows, heads, 128] E4M3 */
  const float* weights;      /* [rows, heads] */
  int64_t rows;
  int32_t heads;
  const uint8_t* key_values; /* num_keys rows of 128 E4M3 bytes, key_value_stride bytes apart */
  int64_t key_value_stride;
  const float* key_scales;   /* num_keys scales, key_scale_stride floats apart */
  int64_t key_scale_stride;
  int64_t num_keys;
  const int32_t* row_starts; /* [rows] */
  const int32_t* row_ends;   /* [rows] */
  float* logits;             /* [rows, logits_stride] */
  int64_t logits_stride;
} nvfp4mla_indexer_ragged;

typedef struct nvfp4mla_indexer_paged {
  const uint8_t* q;         /* [requests * next_n, heads, 128] E4M3 */
  const float* weights;     /* [requests * next_n, heads] */
  int64_t requests;
  int32_t next_n;
  int32_t heads;
  const uint8_t* cache;     /* [num_pages, page_size * 132] */
  int64_t num_pages;
  int64_t page_size;
  const int32_t* block_table; /* [requests, block_table_stride] */
  int64_t block_table_stride;
  const int32_t* context_lens; /* [requests] */
  float* logits;               /* [requests * next_n, logits_stride] */
  int64_t logits_stride;
} nvfp4mla_indexer_paged;

/* CPU references (host memory; the metadata validated first, nothing written on failure). */
NVFP4MLA_C_EXPORT int nvfp4mla_indexer_logits_ragged_reference(const nvfp4mla_indexer_ragged* args);
NVFP4MLA_C_EXPORT int nvfp4mla_indexer_logits_paged_reference(const nvfp4mla_indexer_paged* args);

/* TopkArgs (with its TopkSlotMap; block_table NULL: no slot transform) and TopkOutputs of topk.h. */
typedef struct nvfp4mla_topk {
  const float* values;       /* [rows, stride] */
  int32_t rows;
  int32_t k;
  int64_t columns;
  int64_t stride;
  const int32_t* lengths;    /* [rows] or NULL */
  const int32_t* positions;  /* [rows, stride] or NULL */
  int64_t position_offset;
  const int32_t* block_table; /* [requests, table_stride] or NULL */
  int64_t requests;
  int64_t pages;
  int64_t table_stride;
  int32_t page_size;
  int32_t rows_per_request;
  int64_t capacity;
} nvfp4mla_topk;

typedef struct nvfp4mla_topk_outputs {
  int32_t* indices;      /* [rows, k] */
  int32_t* topk_length;  /* [rows] */
  float* values;         /* [rows, k] or NULL */
} nvfp4mla_topk_outputs;

/* TopkPlan of topk.h (kernel: 0 row_per_cta, 1 split_rows, 2 resident_rows) and the workspace it needs for `rows`. */
typedef struct nvfp4mla_topk_plan {
  int32_t kernel;
  int32_t segments;
  int64_t segment_len;
  int32_t rows;
  uint64_t workspace_bytes;
  int64_t candidates; /* candidate entries a split row may keep (0: the three histogram passes) */
} nvfp4mla_topk_plan;

NVFP4MLA_C_EXPORT int nvfp4mla_plan_topk(int32_t rows, int64_t columns, int32_t sm_count, nvfp4mla_topk_plan* plan);
NVFP4MLA_C_EXPORT int nvfp4mla_topk_reference(const nvfp4mla_topk* args, const nvfp4mla_topk_outputs* out);

/* FusedSelectArgs and FusedSelectRaggedArgs of fused_select.h (their keys' logits NULL, stride 0). */
typedef struct nvfp4mla_fused_select {
  nvfp4mla_indexer_paged keys;
  int64_t max_context;
  int32_t k;
  int32_t slot_ids;
} nvfp4mla_fused_select;

typedef struct nvfp4mla_fused_select_ragged {
  nvfp4mla_indexer_ragged keys;
  int64_t max_length;
  int32_t k;
} nvfp4mla_fused_select_ragged;

/* The planner's choice (chunk, chunks, logits_stride, workspace_bytes) and what it was made for:
 * the GPU calls plan again from their arguments with this chunk and sm_count and refuse a plan
 * made for other shapes. */
typedef struct nvfp4mla_fused_select_plan {
  int64_t chunk;
  int64_t chunks;
  int64_t logits_stride;
  int32_t sm_count;
  uint64_t workspace_bytes;
} nvfp4mla_fused_select_plan;

/* plan_fused_select from shapes alone (the tensors are not needed to plan). chunk 0: the
 * planner's choice. */
NVFP4MLA_C_EXPORT int nvfp4mla_plan_fused_select(int64_t requests, int32_t next_n, int32_t heads, int64_t page_size,
                                                 int64_t max_context, int32_t k, int64_t chunk, int32_t sm_count,
                                                 nvfp4mla_fused_select_plan* plan);
NVFP4MLA_C_EXPORT int nvfp4mla_plan_fused_select_ragged(int64_t rows, int32_t heads, int64_t max_length, int32_t k,
                                                        int64_t chunk, int32_t sm_count,
                                                        nvfp4mla_fused_select_plan* plan);
/* CPU references with the chunk of `plan`. */
NVFP4MLA_C_EXPORT int nvfp4mla_fused_select_reference(const nvfp4mla_fused_select* args,
                                                      const nvfp4mla_fused_select_plan* plan,
                                                      const nvfp4mla_topk_outputs* out);
NVFP4MLA_C_EXPORT int nvfp4mla_fused_select_ragged_reference(const nvfp4mla_fused_select_ragged* args,
                                                             const nvfp4mla_fused_select_plan* plan,
                                                             const nvfp4mla_topk_outputs* out);

/* GPU entry points of cuda/index_cache.h, cuda/indexer.h, cuda/topk.h and cuda/fused_select.h;
 * invalid_count (a device uint64) is required where those headers require it, error_count of
 * top-k is optional. The key rows of write_index_cache are key_stride elements apart. */
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_write_index_cache(int32_t input_type, const void* keys, int64_t key_stride,
                                                      int64_t n, const int64_t* slot_mapping,
                                                      const nvfp4mla_index_cache* cache, uint64_t* invalid_count,
                                                      int32_t device, void* stream);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_gather_index_records(const nvfp4mla_index_cache* cache, const int64_t* slots,
                                                         int64_t n, uint8_t* records, uint64_t* invalid_count,
                                                         int32_t device, void* stream);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_gather_index_keys(const nvfp4mla_index_cache* cache, const int64_t* slots,
                                                      int64_t n, uint8_t* values, float* scales,
                                                      uint64_t* invalid_count, int32_t device, void* stream);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_indexer_logits_ragged(const nvfp4mla_indexer_ragged* args,
                                                          uint64_t* invalid_count, int32_t device, void* stream);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_indexer_logits_paged(const nvfp4mla_indexer_paged* args, uint64_t* invalid_count,
                                                         int32_t device, void* stream);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_topk(const nvfp4mla_topk* args, const nvfp4mla_topk_plan* plan, void* workspace,
                                         uint64_t workspace_bytes, const nvfp4mla_topk_outputs* out,
                                         uint64_t* error_count, int32_t device, void* stream);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_fused_select(const nvfp4mla_fused_select* args,
                                                 const nvfp4mla_fused_select_plan* plan, void* workspace,
                                                 uint64_t workspace_bytes, const nvfp4mla_topk_outputs* out,
                                                 uint64_t* invalid_count, int32_t device, void* stream);
NVFP4MLA_C_EXPORT int nvfp4mla_cuda_fused_select_ragged(const nvfp4mla_fused_select_ragged* args,
                                                        const nvfp4mla_fused_select_plan* plan, void* workspace,
                                                        uint64_t workspace_bytes, const nvfp4mla_topk_outputs* out,
                                                        uint64_t* invalid_count, int32_t device, void* stream);

#ifdef __cplusplus
}
#endif
#endif /* NVFP4MLA_C_API_H */
