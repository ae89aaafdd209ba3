#pragma once
// MTP verifier routing: a speculative-decoding verifier batch (1 + k query tokens per request)
// runs either through the split-KV decode kernel or the extend/prefill kernel. The choice is a
// tested policy: a format goes to decode in `auto` mode only when it is decode-qualified
// (decode_qualified(), one table, changed only with measured evidence).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nvfp4mla/format.h"

namespace nvfp4mla::serving {

// VLLM_B12X_MLA_SPEC_EXTEND_AS_DECODE: 0|false|off|no, auto, 1|true|on|yes (case-insensitive,
// trimmed).
enum class SpecDecodeMode : uint8_t { off, automatic, on };
inline constexpr const char* kSpecDecodeModeEnv = "VLLM_B12X_MLA_SPEC_EXTEND_AS_DECODE";

SpecDecodeMode parse_spec_decode_mode(std::string_view text);  // throws Error naming the accepted values
// The environment variable, read once by the caller; unset -> nullopt.
std::optional<SpecDecodeMode> spec_decode_mode_from_env();
const char* to_string(SpecDecodeMode m);

// Formats whose decode kernel passed the verifier qualification suite (docs/ROUTING.md).
bool decode_qualified(CacheDtype dtype);

enum class Route : uint8_t { decode, extend };
const char* to_string(Route r);

struct VerifierBatchShape {
  int num_speculative_tokens = 0;  // k: each request verifies 1 + k tokens
  int max_query_len = 1;           // longest query of any request in the batch
  bool any_prefill = false;        // some request has not finished its prompt
  int max_q_per_request = 8;       // decode kernel limit on query tokens per request
  int64_t decode_rows = 0;         // rows the batch needs through the decode kernel
  int64_t decode_row_budget = 0;   // rows the decode scratch was sized for
};

struct RouteDecision {
  Route route = Route::extend;
  std::string reason;
};

// The policy: mode off -> extend; on -> decode; automatic -> decode only for qualified
// formats. Decode also needs a pure verifier batch (no prefill), a query length within the
// per-request limit and rows within the decode budget; otherwise extend, with the reason.
RouteDecision decide_route(SpecDecodeMode mode, CacheDtype dtype, const VerifierBatchShape& batch);

// Query rows a request contributes to the decode kernel: 1 + k when verifier batches can take
// the decode route for this format and mode, else 1.
int decode_q_per_request(SpecDecodeMode mode, CacheDtype dtype, int num_speculative_tokens);

// Verifier rows of a batch: request r contributes tokens_per_request rows; token i of request r
// sees context_lens[r] + i + 1 cached tokens (causal), so its top-k list is truncated to that
// length. Rows beyond the real ones (padding up to padded_rows, e.g. for a CUDA graph) get
// length 0: every entry invalid.
struct VerifierRows {
  std::vector<int64_t> causal_len;   // per row (0 for padding)
  std::vector<int32_t> topk_length;  // per row: min(topk, causal_len)
};
VerifierRows build_verifier_rows(std::span<const int64_t> context_lens, int tokens_per_request, int topk,
                                 int64_t padded_rows = 0);

}  // namespace nvfp4mla::serving
