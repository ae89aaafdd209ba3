#include "nvfp4mla/serving/route.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "nvfp4mla/error.h"

namespace nvfp4mla::serving {

namespace {
std::string normalized(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  std::string out(s.substr(b, e - b));
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}
}  // namespace

SpecDecodeMode parse_spec_decode_mode(std::string_view text) {
  const std::string v = normalized(text);
  if (v == "0" || v == "false" || v == "off" || v == "no") return SpecDecodeMode::off;
  if (v == "auto") return SpecDecodeMode::automatic;
  if (v == "1" || v == "true" || v == "on" || v == "yes") return SpecDecodeMode::on;
  throw Error("invalid verifier route mode '" + std::string(text) +
              "': use 0, false, off or no (extend), auto (decode for qualified formats), or 1, true, on or yes (decode)");
}

std::optional<SpecDecodeMode> spec_decode_mode_from_env() {
  const char* v = std::getenv(kSpecDecodeModeEnv);
  if (!v) return std::nullopt;
  return parse_spec_decode_mode(v);
}

const char* to_string(SpecDecodeMode m) {
  switch (m) {
    case SpecDecodeMode::off: return "off";
    case SpecDecodeMode::automatic: return "auto";
    case SpecDecodeMode::on: return "on";
  }
  return "?";
}

const char* to_string(Route r) { return r == Route::decode ? "decode" : "extend"; }

bool decode_qualified(CacheDtype dtype) {
  // The one qualification table (evidence: docs/ROUTING.md). fp8_ds_mla: qualified by the seed's
  // verifier correctness test. nvfp4_ds_mla (every record width and scale mode) and bf16:
  // qualified by nvfp4mla's GPU suite (GpuVerifierQualification, H200, 2026-11-29): on every
  // verifier batch both routes matched the fp64 reference and each other within FlashMLA's
  // tolerances. A kernel change that touches either route re-runs that suite before it lands.
  switch (dtype) {
    case CacheDtype::fp8_ds_mla: return true;
    case CacheDtype::nvfp4_ds_mla: return true;
    case CacheDtype::bf16: return true;
  }
  return false;
}

RouteDecision decide_route(SpecDecodeMode mode, CacheDtype dtype, const VerifierBatchShape& b) {
  if (mode == SpecDecodeMode::off) return {Route::extend, "verifier route mode is off: every verifier batch uses extend"};
  if (mode == SpecDecodeMode::automatic && !decode_qualified(dtype))
    return {Route::extend, std::string("auto: ") + to_string(dtype) + " is not decode-qualified for verification; extend"};
  const std::string why = mode == SpecDecodeMode::on ? "mode on" : std::string("auto: ") + to_string(dtype) + " is decode-qualified";
  if (b.any_prefill) return {Route::extend, why + ", but a request is still prefilling; extend"};
  if (b.max_query_len > b.max_q_per_request)
    return {Route::extend, why + ", but a request has " + std::to_string(b.max_query_len) + " query tokens (limit " +
                               std::to_string(b.max_q_per_request) + "); extend"};
  if (b.max_query_len > 1 + b.num_speculative_tokens)
    return {Route::extend, why + ", but the query length exceeds 1 + speculative tokens (not a verifier batch); extend"};
  if (b.decode_rows > b.decode_row_budget)
    return {Route::extend, why + ", but " + std::to_string(b.decode_rows) + " rows exceed the decode budget of " +
                               std::to_string(b.decode_row_budget) + "; extend"};
  return {Route::decode, why + "; decode"};
}

int decode_q_per_request(SpecDecodeMode mode, CacheDtype dtype, int num_speculative_tokens) {
  if (num_speculative_tokens < 0) throw Error("number of speculative tokens must not be negative");
  const bool decode_verifier =
      mode == SpecDecodeMode::on || (mode == SpecDecodeMode::automatic && decode_qualified(dtype));
  return decode_verifier ? 1 + num_speculative_tokens : 1;
}

VerifierRows build_verifier_rows(std::span<const int64_t> context_lens, int tokens_per_request, int topk,
                                 int64_t padded_rows) {
  if (tokens_per_request < 1) throw Error("verifier rows: at least one token per request");
  if (topk < 1) throw Error("verifier rows: topk must be positive");
  const int64_t real = static_cast<int64_t>(context_lens.size()) * tokens_per_request;
  if (padded_rows != 0 && padded_rows < real)
    throw Error("verifier rows: " + std::to_string(padded_rows) + " padded rows cannot hold " + std::to_string(real));
  VerifierRows v;
  const int64_t rows = std::max(real, padded_rows);
  v.causal_len.assign(rows, 0);
  v.topk_length.assign(rows, 0);
  for (size_t r = 0; r < context_lens.size(); ++r) {
    if (context_lens[r] < 0) throw Error("verifier rows: negative context length for request " + std::to_string(r));
    for (int i = 0; i < tokens_per_request; ++i) {
      const int64_t row = static_cast<int64_t>(r) * tokens_per_request + i;
      v.causal_len[row] = context_lens[r] + i + 1;
      v.topk_length[row] = static_cast<int32_t>(std::min<int64_t>(topk, v.causal_len[row]));
    }
  }
  return v;
}

}  // namespace nvfp4mla::serving
