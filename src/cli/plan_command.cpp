// nvfp4mla plan route|scratch|capacity: serving policy and sizing, as a table or JSON.
#include <cstdio>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "format_flags.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/serving/planner.h"
#include "nvfp4mla/serving/route.h"

namespace nvfp4mla::cli {
namespace {

using namespace nvfp4mla::serving;

struct PlanArgs {
  std::optional<std::string> mode;  // unset: the environment (VLLM_B12X_MLA_SPEC_EXTEND_AS_DECODE), else auto
  bool json = false;
  // route
  int spec_tokens = 0, max_query_len = 1, max_q_per_request = 8;
  int64_t decode_rows = 0, decode_row_budget = 0;
  bool prefilling = false;
  // scratch
  int heads = 0, dcp = 1, topk = 2048, max_num_seqs = 0, splits = 0, sm_count = kDefaultSmCount, compute_capability = 0;
  int64_t max_batched_tokens = 0;
  std::string partials = "fp32";
  // capacity
  double memory_gib = 0, reserved_gib = 0;
  int layers = 0, indexer_bytes = 132, page_size = 64;
};

SpecDecodeMode mode_of(const PlanArgs& a) {
  // A given --mode is parsed even when empty, so `--mode ''` is the same error as the variable
  // set to ''.
  if (a.mode) return parse_spec_decode_mode(*a.mode);
  return spec_decode_mode_from_env().value_or(SpecDecodeMode::automatic);
}

double mib(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

void print_json(const nlohmann::json& j) { std::printf("%s\n", j.dump(2).c_str()); }

void require_not_negative(int64_t v, const char* flag) {
  if (v < 0) throw Error(std::string(flag) + " must not be negative, got " + std::to_string(v));
}

void run_route(const FormatFlags& f, const PlanArgs& a) {
  require_not_negative(a.decode_rows, "--decode-rows");
  require_not_negative(a.decode_row_budget, "--decode-row-budget");
  const FormatConfig cfg = f.config();
  VerifierBatchShape b;
  b.num_speculative_tokens = a.spec_tokens;
  b.max_query_len = a.max_query_len;
  b.any_prefill = a.prefilling;
  b.max_q_per_request = a.max_q_per_request;
  b.decode_rows = a.decode_rows;
  b.decode_row_budget = a.decode_row_budget > 0 ? a.decode_row_budget : a.decode_rows;
  const SpecDecodeMode mode = mode_of(a);
  const RouteDecision d = decide_route(mode, cfg.cache_dtype(), b);
  if (a.json) {
    print_json({{"mode", to_string(mode)}, {"cache_dtype", to_string(cfg.cache_dtype())},
                {"decode_qualified", decode_qualified(cfg.cache_dtype())}, {"route", to_string(d.route)},
                {"reason", d.reason}});
    return;
  }
  std::printf("route: %s\nreason: %s\n", to_string(d.route), d.reason.c_str());
}

void run_scratch(const FormatFlags& f, const PlanArgs& a) {
  require_not_negative(a.max_batched_tokens, "--max-batched-tokens");
  const FormatConfig cfg = f.config();
  ScratchRequest r;
  r.spec = cfg.spec();
  r.num_heads = a.heads;
  r.dcp_world_size = a.dcp;
  r.topk = a.topk;
  r.max_num_seqs = a.max_num_seqs;
  r.max_num_batched_tokens = a.max_batched_tokens > 0 ? a.max_batched_tokens : int64_t(a.max_num_seqs) * 64;
  r.num_speculative_tokens = a.spec_tokens;
  r.mode = mode_of(a);
  r.partials = a.partials == "bf16" ? PartialPrecision::bf16 : PartialPrecision::fp32;
  r.splits = a.splits;
  r.sm_count = a.sm_count;
  r.compute_capability = a.compute_capability;
  const ScratchPlan p = plan_scratch(r);
  if (a.json) {
    print_json({{"q_per_request", p.q_per_request}, {"decode_rows", p.decode_rows}, {"heads", p.heads},
                {"splits", p.splits}, {"partial_bytes", p.partial_bytes}, {"tmp_output_bytes", p.tmp_output_bytes},
                {"tmp_lse_bytes", p.tmp_lse_bytes}, {"output_bytes", p.output_bytes},
                {"final_lse_bytes", p.final_lse_bytes}, {"total_bytes", p.total_bytes}});
    return;
  }
  std::printf("mode %s, %s: %d query rows per request, decode rows %lld, heads %d, splits %d, %s partials\n",
              to_string(r.mode), to_string(cfg.cache_dtype()), p.q_per_request, static_cast<long long>(p.decode_rows),
              p.heads, p.splits, p.partial_bytes == 4 ? "fp32" : "bf16");
  const struct { const char* name; size_t bytes; } rows[] = {{"tmp_output", p.tmp_output_bytes},
                                                               {"tmp_lse", p.tmp_lse_bytes},
                                                               {"output", p.output_bytes},
                                                               {"final_lse", p.final_lse_bytes},
                                                               {"total", p.total_bytes}};
  for (const auto& row : rows) std::printf("  %-11s %14zu bytes %12.3f MiB\n", row.name, row.bytes, mib(row.bytes));
}

void run_capacity(const FormatFlags& f, const PlanArgs& a) {
  const FormatConfig cfg = f.config();
  CapacityRequest r;
  r.spec = cfg.spec();
  r.layers = a.layers;
  r.indexer_bytes_per_token = a.indexer_bytes;
  r.page_size = a.page_size;
  r.memory_gib = a.memory_gib;
  r.reserved_gib = a.reserved_gib;
  const CapacityPlan p = plan_capacity(r);
  if (a.json) {
    print_json({{"record_bytes", cfg.record_bytes()}, {"bytes_per_token", p.bytes_per_token}, {"pages", p.pages},
                {"tokens", p.tokens}, {"max_single_request_tokens", p.max_single_request_tokens}});
    return;
  }
  std::printf("%s: %lld bytes per token over %d layers (record %d + indexer %d)\n", cfg.describe().c_str(),
              static_cast<long long>(p.bytes_per_token), a.layers, cfg.record_bytes(), a.indexer_bytes);
  std::printf("  pages of %d tokens: %lld\n  tokens that fit:    %lld\n  largest request:    %lld tokens\n", a.page_size,
              static_cast<long long>(p.pages), static_cast<long long>(p.tokens),
              static_cast<long long>(p.max_single_request_tokens));
}

void add_mode(CLI::App* cmd, PlanArgs& a) {
  cmd->add_option("--mode")
      ->description("verifier route mode: 0|false|off|no, auto, 1|true|on|yes (default: $" +
                    std::string(kSpecDecodeModeEnv) + ", else auto)")
      ->type_name("TEXT")
      ->each([&a](const std::string& v) { a.mode = v; });
  cmd->add_flag("--json", a.json, "print JSON");
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto* plan = app.add_subcommand("plan", "Serving policy and sizing: verifier route, decode scratch, KV capacity");
  plan->require_subcommand(1);
  auto a = std::make_shared<PlanArgs>();

  auto* route = plan->add_subcommand("route", "Which kernel a verifier batch takes, and why");
  auto route_flags = FormatFlags::add_to(route);
  add_mode(route, *a);
  route->add_option("--spec-tokens", a->spec_tokens, "speculative tokens per request (MTP k)")->check(CLI::Range(0, 64));
  route->add_option("--max-query-len", a->max_query_len, "longest query in the batch")->check(CLI::Range(1, 1 << 20));
  route->add_flag("--prefilling", a->prefilling, "some request is still prefilling");
  route->add_option("--max-q-per-request", a->max_q_per_request, "decode kernel limit per request")->check(CLI::Range(1, 1024));
  route->add_option("--decode-rows", a->decode_rows, "rows the batch needs in the decode kernel");
  route->add_option("--decode-row-budget", a->decode_row_budget, "rows the decode scratch holds (default: --decode-rows)");
  route->callback([route_flags, a] { run_route(*route_flags, *a); });

  auto* scratch = plan->add_subcommand("scratch", "Exact decode scratch regions for a server configuration");
  auto scratch_flags = FormatFlags::add_to(scratch);
  add_mode(scratch, *a);
  scratch->add_option("--heads", a->heads, "query heads per rank")->required()->check(CLI::Range(1, 4096));
  scratch->add_option("--dcp", a->dcp, "decode context parallel world size")->check(CLI::Range(1, 1024));
  scratch->add_option("--topk", a->topk, "top-k entries per row")->check(CLI::Range(1, 1 << 20));
  scratch->add_option("--max-num-seqs", a->max_num_seqs, "max concurrent requests")->required()->check(CLI::Range(1, 1 << 20));
  scratch->add_option("--max-batched-tokens", a->max_batched_tokens, "max tokens per batch (default 64 x seqs)");
  scratch->add_option("--mtp", a->spec_tokens, "speculative tokens per request")->check(CLI::Range(0, 64));
  scratch->add_option("--partials", a->partials, "split partial precision (the kernel writes fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  scratch->add_option("--splits", a->splits, "fixed number of KV splits (default: the decode planner's)");
  scratch->add_option("--sm-count", a->sm_count, "SMs of the GPU (H200: 132)")->check(CLI::Range(1, 1024));
  scratch->add_option("--compute-capability", a->compute_capability,
                      "10 x major + minor of the GPU (H200: 90; default: this machine's GPU, else 90)")
      ->check(CLI::Range(0, 1000));
  scratch->callback([scratch_flags, a] { run_scratch(*scratch_flags, *a); });

  auto* capacity = plan->add_subcommand("capacity", "Tokens of KV cache that fit in a memory budget");
  auto capacity_flags = FormatFlags::add_to(capacity);
  capacity->add_flag("--json", a->json, "print JSON");
  capacity->add_option("--memory-gib", a->memory_gib, "memory for the KV cache (GiB)")->required();
  capacity->add_option("--reserved-gib", a->reserved_gib, "taken out of it first (GiB)");
  capacity->add_option("--layers", a->layers, "decoder layers with a KV cache")->required()->check(CLI::Range(1, 10000));
  capacity->add_option("--indexer-bytes", a->indexer_bytes, "DSA indexer key bytes per token (132)")->check(CLI::Range(0, 1 << 20));
  capacity->add_option("--page-size", a->page_size, "tokens per page")->check(CLI::Range(1, 1 << 20));
  capacity->callback([capacity_flags, a] { run_capacity(*capacity_flags, *a); });
}

}  // namespace nvfp4mla::cli
