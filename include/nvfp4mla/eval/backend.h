#pragma once
// Where the evaluation's attention runs. Everything the evaluation needs from an attention
// implementation goes through sparse_attention(), so a GPU kernel plugs in at one place.
#include <cstdint>
#include <string>

#include "nvfp4mla/format.h"
#include "nvfp4mla/sparse_mla.h"

namespace nvfp4mla::eval {

enum class Device : uint8_t { cpu = 0, cuda = 1, automatic = 2 };

Device parse_device(const std::string& s);  // "cpu", "cuda" or "auto"; throws Error otherwise
const char* to_string(Device d);

// True when sparse attention can run on CUDA in this build and process (`reason` then names the
// device); otherwise `reason` says why (no CUDA in the build, no device visible).
bool cuda_attention_available(std::string* reason = nullptr);

struct ResolvedDevice {
  Device device = Device::cpu;  // cpu or cuda
  std::string note;             // why auto chose what it chose
};
// auto -> cuda when available, else cpu. Asking for cuda when it cannot run is an Error that
// says why; it never falls back silently.
ResolvedDevice resolve_device(Device requested);

// What to compute; null pointers are skipped.
struct AttentionOutputs {
  float* out = nullptr;     // [rows, heads, 512]   (sparse_mla.h semantics)
  float* lse = nullptr;     // [rows, heads]        natural log
  float* scores = nullptr;  // [rows, heads, topk]  sm_scale * q.K per index position; -inf where masked
};

// Sparse MLA attention over a cache of records on `device` (cpu or cuda, as resolved); `args`
// point to host memory either way. On the CPU, out and lse come from sparse_mla_reference and
// the scores from sparse_mla_scores_reference (exact dequantized records, fp64 dot products).
// On CUDA, out and lse come from the split-KV sparse decode (BF16 output, widened to fp32) and
// the scores from cuda::sparse_scores; both use BF16 K rows (see ReferenceOptions).
void sparse_attention(Device device, const RecordSpec& spec, const SparseMlaArgs& args, const AttentionOutputs& outputs);

}  // namespace nvfp4mla::eval
