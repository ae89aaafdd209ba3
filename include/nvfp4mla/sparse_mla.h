#pragma once
// Sparse MLA attention over a cache of records (DeepSeek Sparse Attention), FlashMLA-style
// semantics:
//   q [rows, heads, 576] BF16 (512 latent + 64 RoPE; each row one query token),
//   indices [rows, topk] int32 slot ids (page * page_size + offset),
//   optional topk_length [rows] (entries at positions >= length are ignored).
//   K of a slot = dequantized latent (512) ++ dequantized RoPE (64); V = dequantized latent.
//   s = sm_scale * q.K over valid entries; out = softmax(s) V; lse = ln(sum exp(s))
//   (or log2 on request).
// An index is invalid when it is negative or >= capacity: it is masked and its record is
// never read. Duplicates count once per occurrence. A row with no valid entry gives out = 0
// and lse = -inf.
#include <cstdint>
#include <vector>

#include "nvfp4mla/format.h"

namespace nvfp4mla {

enum class LseBase : uint8_t { natural = 0, base2 = 1 };

struct SparseMlaArgs {
  const uint16_t* q = nullptr;           // [rows, heads, 576] BF16 bits
  int rows = 0;
  int heads = 0;
  const uint8_t* cache = nullptr;        // [capacity, record_bytes] (pages flattened)
  int64_t capacity = 0;                  // number of slots
  const int32_t* indices = nullptr;      // [rows, topk]
  int topk = 0;
  const int32_t* topk_length = nullptr;  // [rows] or null
  float sm_scale = 0.0f;
  float layer_scale = 1.0f;              // static mode outer scale (FormatConfig::layer_scale())
  LseBase lse_base = LseBase::natural;
};

// Rows [r0, r0 + n) of `a` (q, indices and topk_length advanced; host or device pointers alike).
inline SparseMlaArgs sparse_mla_rows(const SparseMlaArgs& a, int r0, int n) {
  SparseMlaArgs r = a;
  r.rows = n;
  r.q = a.q + static_cast<int64_t>(r0) * a.heads * kQkDim;
  r.indices = a.indices + static_cast<int64_t>(r0) * a.topk;
  if (a.topk_length) r.topk_length = a.topk_length + r0;
  return r;
}

// True when index position `pos` of a row is attended.
inline bool sparse_entry_valid(const SparseMlaArgs& a, int row, int pos) {
  if (a.topk_length && pos >= a.topk_length[row]) return false;
  const int32_t idx = a.indices[static_cast<int64_t>(row) * a.topk + pos];
  return idx >= 0 && idx < a.capacity;
}

struct ReferenceOptions {
  // Round the dequantized K and V to BF16 first, as the GPU kernels do for their BF16 matrix
  // operands (exact for bf16 and fp8_ds_mla records and for unit-scale NVFP4 latents; one
  // rounding for scaled NVFP4 latents and FP8 RoPE). Tests use it to compare kernels on the
  // same operands; the evaluation uses the exact dequantized values.
  bool bf16_operands = false;
};

// CPU reference (fp64 accumulation over the dequantized records): out fp32 [rows, heads, 512],
// lse fp32 [rows, heads]. Throws Error for inconsistent arguments.
void sparse_mla_reference(const RecordSpec& spec, const SparseMlaArgs& args, float* out, float* lse,
                          const ReferenceOptions& options = {});

// Attention logits of every index position, as the evaluation and the GPU scores kernel
// (cuda/sparse_scores.h) define them: scores [rows, heads, topk] fp32,
// s = sm_scale * q.K (fp64 dot product over the dequantized record, rounded once to fp32),
// -inf where the entry is masked (its record is never read).
void sparse_mla_scores_reference(const RecordSpec& spec, const SparseMlaArgs& args, float* scores,
                                 const ReferenceOptions& options = {});

// What the staged extend (cuda/sparse_extend.h) builds, on the CPU: the attended slots (valid
// entries of any row) in slot order, each dequantized once into a bf16-1152 record of its K row
// rounded to BF16, and every entry's staged record (-1 where masked).
struct StagedRecordsReference {
  std::vector<uint8_t> records;  // count x 1152 bytes
  std::vector<int32_t> indices;  // [rows, topk]
  int64_t count = 0;
};
StagedRecordsReference stage_records_reference(const RecordSpec& spec, const SparseMlaArgs& args);

// Checks shapes and pointers shared by every implementation; throws Error.
void validate_sparse_mla_args(const RecordSpec& spec, const SparseMlaArgs& args);

}  // namespace nvfp4mla
