// nvfp4mla bench decode|extend|write|indexer: GPU benchmarks with the device ceilings measured in the same
// run; nvfp4mla bench plot: PNG figures of their --json files.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "nvfp4mla/bench.h"
#include "nvfp4mla/config.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/safetensors.h"

namespace nvfp4mla::cli {
namespace {

struct BenchFlags {
  std::string cache_dtype = "nvfp4_ds_mla", rope = "fp8", scale_mode = "dynamic";
  bool all_formats = false;
  std::vector<int> rows, heads, topk;
  int splits = 0;
  bool resident = false;  // bench topk: split rows as resident_rows
  int64_t capacity = int64_t(1) << 20;
  int64_t tokens = 1 << 20;
  std::vector<int64_t> columns;  // bench topk
  int warmup = 3, iters = 20;
  double warmup_seconds = 5.0;
  std::string l2_flush = "read";
  std::string json_path;
  std::string kernel = "automatic";  // bench decode
  bool staged = false;               // bench extend
  bool walk_only = false;            // bench extend --staged
};

std::vector<RecordSpec> specs_of(const BenchFlags& f) {
  if (f.all_formats) return {std::begin(kAllRecordSpecs), std::end(kAllRecordSpecs)};
  FormatOptions o;
  o.cache_dtype = parse_cache_dtype(f.cache_dtype);
  if (o.cache_dtype == CacheDtype::nvfp4_ds_mla) {
    o.rope = parse_rope(f.rope);
    o.scale_mode = parse_scale_mode(f.scale_mode);
    if (o.scale_mode == ScaleMode::static_calibrated) o.layer_scale = 0.01f;
  }
  return {FormatConfig::create(o).spec()};
}

std::string spec_name(const RecordSpec& s) { return to_string(s); }

// Timing flags shared by every benchmark.
void add_timing(CLI::App* cmd, BenchFlags& f) {
  cmd->add_option("--warmup", f.warmup, "warm-up launches")->check(CLI::Range(0, 1000));
  cmd->add_option("--warmup-seconds", f.warmup_seconds, "seconds the GPU is kept busy after the ceilings (whose GEMMs lower its clocks) before any case is timed")
      ->check(CLI::Range(0.0, 600.0));
  cmd->add_option("--iters", f.iters, "timed launches (median reported)")->check(CLI::Range(1, 100000));
  cmd->add_option("--l2-flush", f.l2_flush,
                  "how L2 is flushed before each timed launch: read a 512 MB buffer (clean L2, default) or write it "
                  "(dirty L2, whose write-back overlaps the kernel)")
      ->check(CLI::IsMember({"read", "write"}));
  cmd->add_option("--json", f.json_path, "write every number as JSON to this file");
}

// Timing and record format flags.
void add_common(CLI::App* cmd, BenchFlags& f) {
  cmd->add_option("--cache-dtype", f.cache_dtype, "nvfp4_ds_mla | fp8_ds_mla | bf16");
  cmd->add_option("--rope", f.rope, "fp8 | bf16 (nvfp4)");
  cmd->add_option("--scale-mode", f.scale_mode, "implicit | static | dynamic (nvfp4)");
  cmd->add_flag("--all-formats", f.all_formats, "every format and scale mode");
  add_timing(cmd, f);
}

bench::Options options_of(const BenchFlags& f) {
  bench::Options o;
  o.warmup = f.warmup;
  o.iters = f.iters;
  o.warmup_seconds = f.warmup_seconds;
  o.l2_flush = f.l2_flush == "write" ? bench::L2Flush::write : bench::L2Flush::read;
  o.progress = [](const std::string& s) { std::fprintf(stderr, "  running %s ...\n", s.c_str()); };
  return o;
}

nlohmann::json ceilings_json(const bench::Ceilings& c, const bench::Options& o) {
  return {{"device", c.device}, {"copy_gbps", c.copy_gbps}, {"bf16_tflops", c.bf16_tflops}, {"max_clock_mhz", c.max_clock_mhz}, {"l2_flush", bench::to_string(o.l2_flush)}, {"warmup_seconds", o.warmup_seconds}};
}

void print_ceilings(const bench::Ceilings& c, const bench::Options& o) {
  std::printf("device: %s\nceilings (measured now): copy %.0f GB/s (read+write), BF16 GEMM %.0f TFLOP/s (cuBLAS 8192^3)\n"
              "timing: GPU kept busy %.0f s after the ceilings; median of %d launches after %d warm-up, L2 flushed before each by a 512 MB %s;\n"
              "MHz: median SM clock probed after each timed launch (top clock %.0f MHz)\n\n",
              c.device.c_str(), c.copy_gbps, c.bf16_tflops, o.warmup_seconds, o.iters, o.warmup, bench::to_string(o.l2_flush), c.max_clock_mhz);
}

void write_json(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  const std::string text = j.dump(2) + "\n";
  write_file_atomic(path, text.data(), text.size());
}

void run_decode_bench(const BenchFlags& f) {
  std::vector<bench::DecodeCase> cases;
  const auto specs = specs_of(f);
  const DecodeKernel kernel = parse_decode_kernel(f.kernel);
  if (f.rows.empty() && f.heads.empty() && f.topk.empty()) {
    // Defaults: the shapes of the performance table and FlashMLA's measured shapes (PEERS.md).
    const int shapes[][3] = {{256, 128, 2048}, {256, 64, 2048}, {128, 16, 2048}, {128, 128, 2048},
                             {128, 64, 2048},  {32, 128, 2048}, {8, 128, 2048},  {3, 128, 2048},
                             {128, 8, 2048},   {128, 32, 2048}, {148, 128, 16384}};
    for (const auto& spec : specs)
      for (const auto& s : shapes) cases.push_back({s[0], s[1], s[2], spec, f.splits, f.capacity, kernel, f.staged, f.walk_only});
  } else {
    const auto rows = f.rows.empty() ? std::vector<int>{256} : f.rows;
    const auto heads = f.heads.empty() ? std::vector<int>{128} : f.heads;
    const auto topk = f.topk.empty() ? std::vector<int>{2048} : f.topk;
    for (const auto& spec : specs)
      for (int r : rows)
        for (int h : heads)
          for (int k : topk) cases.push_back({r, h, k, spec, f.splits, f.capacity, kernel, f.staged, f.walk_only});
  }
  const auto opt = options_of(f);
  const auto ceil = bench::measure_ceilings(opt);
  const auto res = bench::run_decode(cases, ceil, opt);
  print_ceilings(ceil, opt);
  std::printf("cache of %lld slots; gather us: a plain kernel reading the same records once (%%gather = its time / ours)\n",
              static_cast<long long>(f.capacity));
  std::printf("%-26s %5s %5s %6s %-17s %6s %10s %9s %9s %7s %7s %9s %8s %5s\n", "format", "rows", "heads", "topk", "kernel",
              "splits", "median us", "TFLOP/s", "GB/s", "%MMA", "%copy", "gather us", "%gather", "MHz");
  nlohmann::json j = {{"ceilings", ceilings_json(ceil, opt)}, {"decode", nlohmann::json::array()}};
  for (const auto& r : res) {
    const std::string kernel_name = (r.c.staged ? "staged+" : "") + std::string(to_string(r.kernel));
    std::printf("%-26s %5d %5d %6d %-17s %6d %10.1f %9.1f %9.0f %6.1f%% %6.1f%% %9.1f %7.1f%% %5.0f%s\n", spec_name(r.c.spec).c_str(),
                r.c.rows, r.c.heads, r.c.topk, kernel_name.c_str(), r.splits, r.median_us, r.tflops, r.gbps, 100 * r.frac_mma, 100 * r.frac_copy,
                r.gather_us, 100 * r.frac_gather, r.clock_mhz, r.finite ? "" : "  NON-FINITE OUTPUT");
    j["decode"].push_back({{"format", spec_name(r.c.spec)}, {"rows", r.c.rows}, {"heads", r.c.heads}, {"topk", r.c.topk},
                           {"kernel", to_string(r.kernel)}, {"splits", r.splits}, {"head_group", r.head_group}, {"median_us", r.median_us},
                           {"min_us", r.min_us}, {"tflops", r.tflops}, {"gbps", r.gbps}, {"frac_mma", r.frac_mma},
                           {"frac_copy", r.frac_copy}, {"gather_us", r.gather_us}, {"frac_gather", r.frac_gather},
                           {"capacity", r.c.capacity}, {"finite", r.finite}, {"clock_mhz", r.clock_mhz},
                           {"staged", r.c.staged}, {"staging_us", r.staging_us}, {"tail_rows", r.tail_rows},
                           {"tail_splits", r.tail_splits}});
    if (r.c.staged) {
      std::printf("%-26s staging (part of the time above): %.1f us", "", r.staging_us);
      if (r.tail_rows > 0) std::printf("; the last %d rows first, %d splits each", r.tail_rows, r.tail_splits);
      std::printf("\n");
    }
  }
  write_json(f.json_path, j);
}

void run_write_bench(const BenchFlags& f) {
  std::vector<bench::WriteCase> cases;
  for (const auto& spec : specs_of(f)) cases.push_back({f.tokens, spec});
  const auto opt = options_of(f);
  const auto ceil = bench::measure_ceilings(opt);
  const auto res = bench::run_write(cases, ceil, opt);
  print_ceilings(ceil, opt);
  std::printf("%-26s %9s %10s %9s %7s %5s\n", "format", "tokens", "median us", "GB/s", "%copy", "MHz");
  nlohmann::json j = {{"ceilings", ceilings_json(ceil, opt)}, {"write", nlohmann::json::array()}};
  for (const auto& r : res) {
    std::printf("%-26s %9lld %10.1f %9.0f %6.1f%% %5.0f\n", spec_name(r.c.spec).c_str(), static_cast<long long>(r.c.tokens),
                r.median_us, r.gbps, 100 * r.frac_copy, r.clock_mhz);
    j["write"].push_back({{"format", spec_name(r.c.spec)}, {"tokens", r.c.tokens}, {"median_us", r.median_us},
                          {"gbps", r.gbps}, {"frac_copy", r.frac_copy}, {"clock_mhz", r.clock_mhz}});
  }
  write_json(f.json_path, j);
}

void run_topk_bench(const BenchFlags& f) {
  std::vector<bench::TopkCase> cases;
  if (f.rows.empty() && f.columns.empty()) {
    // The bars of issue 22 (k = 2048), then the torch.topk anchors of SELECTION.md.
    const int64_t shapes[][2] = {{1, 1 << 20}, {64, 131072}, {16, 1 << 20}, {4, 163840}, {1, 131072}, {128, 32768}};
    for (int k : f.topk.empty() ? std::vector<int>{2048} : f.topk)
      for (const auto& s : shapes) cases.push_back({static_cast<int>(s[0]), s[1], k, f.splits, f.resident});
  } else {
    for (int r : f.rows.empty() ? std::vector<int>{1} : f.rows)
      for (int64_t c : f.columns.empty() ? std::vector<int64_t>{1 << 20} : f.columns)
        for (int k : f.topk.empty() ? std::vector<int>{2048} : f.topk) cases.push_back({r, c, k, f.splits, f.resident});
  }
  const auto opt = options_of(f);
  const auto ceil = bench::measure_ceilings(opt);
  const auto res = bench::run_topk(cases, opt);
  print_ceilings(ceil, opt);
  std::printf("sort us: CUB segmented radix sort (pairs, descending) of the same rows; exact: top-k == its first k\n");
  std::printf("%5s %9s %5s %-12s %5s %10s %8s %10s %7s %6s %5s\n", "rows", "columns", "k", "kernel", "segs", "median us",
              "GB/s", "sort us", "x sort", "exact", "MHz");
  nlohmann::json j = {{"ceilings", ceilings_json(ceil, opt)}, {"topk", nlohmann::json::array()}};
  for (const auto& r : res) {
    std::printf("%5d %9lld %5d %-12s %5d %10.1f %8.0f %10.1f %7.1f %6s %5.0f\n", r.c.rows, static_cast<long long>(r.c.columns),
                r.c.k, r.kernel.c_str(), r.segments, r.median_us, r.gbps, r.sort_us, r.sort_us / r.median_us,
                r.matches_sort ? "yes" : "NO", r.clock_mhz);
    j["topk"].push_back({{"rows", r.c.rows}, {"columns", r.c.columns}, {"k", r.c.k}, {"kernel", r.kernel},
                         {"segments", r.segments}, {"median_us", r.median_us}, {"min_us", r.min_us}, {"gbps", r.gbps},
                         {"sort_us", r.sort_us}, {"matches_sort", r.matches_sort}, {"clock_mhz", r.clock_mhz}});
  }
  write_json(f.json_path, j);
  for (const auto& r : res)
    if (!r.matches_sort) throw Error("bench topk: a result differs from the sort's first k (see the table)");
}

// ---- bench indexer ----------------------------------------------------------------------------

struct IndexerBenchFlags {
  std::vector<int> heads;
  std::string mma = "auto";
  bool fused = false;
};

// The bench's names of cuda::IndexerMma (bench::IndexerCase::mma).
int indexer_mma_code(const std::string& name) {
  return name == "wgmma" ? 1 : name == "mma.sync" ? 2 : name == "wgmma.ws" ? 3 : 0;
}
const char* indexer_mma_name(int code) {
  return code == 1 ? "wgmma" : code == 2 ? "mma.sync" : code == 3 ? "wgmma.ws" : "auto";
}

void run_indexer_bench(const BenchFlags& f, const IndexerBenchFlags& x) {
  using Form = bench::IndexerCase::Form;
  const std::vector<std::pair<std::string, int>> mmas =
      x.mma == "all" ? std::vector<std::pair<std::string, int>>{{"wgmma", 1}, {"wgmma.ws", 3}, {"mma.sync", 2}}
                     : std::vector<std::pair<std::string, int>>{{x.mma, indexer_mma_code(x.mma)}};
  std::vector<bench::IndexerCase> cases;
  // The shapes: prefill 2048 rows x 32,768 keys, paged decode 64 requests x 2 rows x 131,072.
  for (int h : x.heads.empty() ? std::vector<int>{64} : x.heads)
    for (const auto& m : mmas) {
      if (x.fused) {  // decode shapes, each also as fused selection (k = 2048)
        cases.push_back({Form::decode, 1, 1048576, h, 1, 64, m.second, true});
        cases.push_back({Form::decode, 64, 131072, h, 2, 64, m.second, true});
        continue;
      }
      cases.push_back({Form::prefill, 2048, 32768, h, 1, 64, m.second});
      if (m.first != "wgmma.ws")  // the warp-specialized kernel is prefill-only (decode would time wgmma again)
        cases.push_back({Form::decode, 64, 131072, h, 2, 64, m.second});
    }
  const auto opt = options_of(f);
  const auto ceil = bench::measure_ceilings(opt);
  const auto res = bench::run_indexer(cases, ceil, opt);
  print_ceilings(ceil, opt);
  std::printf("TFLOP/s: 2 x heads x 128 x (sum of row lengths); key TB/s: 132-byte index keys read once per request (decode) or "
              "once (prefill); %%copy: key bytes against the copy's read rate\n");
  std::printf("%-8s %-9s %6s %8s %6s %6s %10s %9s %8s %7s %5s\n", "form", "mma", "rows", "keys", "next_n", "heads",
              "median us", "TFLOP/s", "key TB/s", "%copy", "MHz");
  nlohmann::json j = {{"ceilings", ceilings_json(ceil, opt)}, {"indexer", nlohmann::json::array()}};
  for (const auto& r : res) {
    const bool dec = r.c.form == Form::decode;
    const char* mma = indexer_mma_name(r.c.mma);
    std::printf("%-8s %-9s %6lld %8lld %6d %6d %10.1f %9.1f %8.2f %6.1f%% %5.0f%s\n", dec ? "decode" : "prefill", mma,
                static_cast<long long>(r.c.rows), static_cast<long long>(r.c.keys), dec ? r.c.next_n : 1, r.c.heads,
                r.median_us, r.tflops, r.key_tbps, 100 * r.frac_copy, r.clock_mhz, r.finite ? "" : "  NaN IN OUTPUT");
    if (r.c.fused)
      std::printf("  fused logits + top-k (k = %d, chunk %lld, workspace %lld bytes): %.1f us, %.2fx the logits alone\n",
                  r.c.fused_k, static_cast<long long>(r.fused_chunk), static_cast<long long>(r.fused_workspace_bytes),
                  r.fused_median_us, r.fused_median_us / r.median_us);
    j["indexer"].push_back({{"form", dec ? "decode" : "prefill"}, {"mma", mma}, {"rows", r.c.rows}, {"keys", r.c.keys},
                            {"next_n", dec ? r.c.next_n : 1}, {"heads", r.c.heads}, {"page_size", r.c.page_size},
                            {"median_us", r.median_us}, {"min_us", r.min_us}, {"tflops", r.tflops},
                            {"key_tbps", r.key_tbps}, {"frac_copy", r.frac_copy}, {"finite", r.finite},
                            {"clock_mhz", r.clock_mhz}});
    if (r.c.fused)
      j["indexer"].back().update({{"fused_k", r.c.fused_k}, {"fused_chunk", r.fused_chunk},
                                  {"fused_workspace_bytes", r.fused_workspace_bytes}, {"fused_median_us", r.fused_median_us}});
  }
  write_json(f.json_path, j);
}

// ---- bench dcp -------------------------------------------------------------------------------

void run_dcp_bench(const BenchFlags& f, const std::vector<int>& ranks) {
  std::vector<bench::DcpCase> cases;
  for (int rows : f.rows.empty() ? std::vector<int>{64, 128} : f.rows)
    for (int heads : f.heads.empty() ? std::vector<int>{64, 128} : f.heads)
      for (int n : ranks.empty() ? std::vector<int>{2, 4, 8} : ranks) cases.push_back({rows, heads, n, 2048});
  const auto opt = options_of(f);
  const auto ceil = bench::measure_ceilings(opt);
  const auto res = bench::run_dcp(cases, opt);
  print_ceilings(ceil, opt);
  std::printf("DCP, k = 2048. merge: cuda::dcp_merge of one rank (BF16 partials); gather: in-process all-gather of all N ranks "
              "on this GPU (N (N - 1) block copies in one kernel; %%copy: their read+write bytes against the copy ceiling); merge top-k: "
              "cuda::dcp_merge_topk of one rank; bytes: what one rank receives from the others per layer\n");
  std::printf("%5s %6s %5s | %8s %13s %6s %14s %13s | %13s %15s %5s\n", "rows", "heads", "ranks", "merge us", "gather out us",
              "%copy", "gather cand us", "merge top-k us", "partial bytes", "candidate bytes", "MHz");
  nlohmann::json j = {{"ceilings", ceilings_json(ceil, opt)}, {"dcp", nlohmann::json::array()}};
  for (const auto& r : res) {
    const double copied = 2.0 * r.c.ranks * double(r.partial_bytes);  // read + write of every copy
    const double frac = r.gather_partials_us > 0 ? copied / (r.gather_partials_us * 1e3) / ceil.copy_gbps : 0.0;
    std::printf("%5d %6d %5d | %8.1f %13.1f %5.1f%% %14.1f %13.1f | %13lld %15lld %5.0f\n", r.c.rows, r.c.heads, r.c.ranks,
                r.merge_us, r.gather_partials_us, 100 * frac, r.gather_candidates_us, r.merge_topk_us,
                static_cast<long long>(r.partial_bytes), static_cast<long long>(r.candidate_bytes), r.clock_mhz);
    j["dcp"].push_back({{"rows", r.c.rows}, {"heads", r.c.heads}, {"ranks", r.c.ranks}, {"k", r.c.k},
                        {"merge_us", r.merge_us}, {"gather_partials_us", r.gather_partials_us},
                        {"gather_candidates_us", r.gather_candidates_us}, {"merge_topk_us", r.merge_topk_us},
                        {"partial_bytes_per_rank_layer", r.partial_bytes},
                        {"candidate_bytes_per_rank_layer", r.candidate_bytes}, {"gather_partials_frac_copy", frac},
                        {"clock_mhz", r.clock_mhz}});
  }
  write_json(f.json_path, j);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* bench_cmd = app.add_subcommand("bench", "GPU benchmarks (CUDA events, L2 flushed, medians, ceilings measured in the same run)");
  bench_cmd->require_subcommand(1);
  auto f = std::make_shared<BenchFlags>();
  auto* dec = bench_cmd->add_subcommand("decode", "Sparse MLA decode kernel");
  add_common(dec, *f);
  dec->add_option("--rows", f->rows, "query rows (several values run several cases)");
  dec->add_option("--heads", f->heads, "query heads per row");
  dec->add_option("--topk", f->topk, "top-k entries per row");
  dec->add_option("--splits", f->splits, "force the number of KV splits (0 = planner)");
  dec->add_option("--kernel", f->kernel,
                  "decode kernel: automatic (the planner's choice), sm80_mma, sm80_h16, sm90_ws, sm90_ws_wide, sm90_ws_pair, "
                  "sm90_ws_pair_wide or sm90_h16 (an error when the device or the shape cannot run it)")
      ->capture_default_str();
  dec->add_option("--capacity", f->capacity, "cache slots the random indices point into (rounded up to a multiple of 65536)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 26))
      ->capture_default_str();
  dec->callback([f] { run_decode_bench(*f); });
  auto* ext = bench_cmd->add_subcommand("extend", "Sparse MLA extend/prefill (the decode kernel with one split per row)");
  add_common(ext, *f);
  ext->add_option("--rows", f->rows, "query rows (default 4096)");
  ext->add_option("--heads", f->heads, "query heads per row (default 128 and 64)");
  ext->add_option("--topk", f->topk, "top-k entries per row (default 2048)");
  ext->add_option("--capacity", f->capacity, "cache slots the random indices point into (rounded up to a multiple of 65536)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 26))
      ->capture_default_str();
  CLI::Option* staged = ext->add_flag("--staged", f->staged,
                "the staged extend: dequantize each attended record once into bf16 records, then attend over those "
                "(staging included in the time)");
  ext->add_flag("--walk-only", f->walk_only,
                "with --staged: walk every row, without running the rows the walking CTAs do not divide as a split "
                "launch first (for A/B timing)")
      ->needs(staged);
  ext->callback([f] {
    f->splits = 1;
    if (f->rows.empty()) f->rows = {4096};
    if (f->heads.empty()) f->heads = {128, 64};
    if (f->topk.empty()) f->topk = {2048};
    run_decode_bench(*f);
  });
  auto* wr = bench_cmd->add_subcommand("write", "Cache writer");
  add_common(wr, *f);
  wr->add_option("--tokens", f->tokens, "tokens written per launch")->check(CLI::Range(int64_t(1), int64_t(1) << 26));
  wr->callback([f] { run_write_bench(*f); });
  auto* topk = bench_cmd->add_subcommand("topk", "Exact top-k, against CUB's segmented radix sort of the same rows");
  add_timing(topk, *f);
  topk->add_option("--rows", f->rows, "rows (default: the issue's shapes)")->check(CLI::PositiveNumber);
  topk->add_option("--columns", f->columns, "entries per row")->check(CLI::Range(int64_t(1), int64_t(INT32_MAX)));
  topk->add_option("--k", f->topk, "entries selected per row (default 2048)")->check(CLI::Range(1, 4096));
  topk->add_flag("--resident", f->resident, "with --segments above 1: the resident_rows kernel instead of split_rows");
  topk->add_option("--segments", f->splits, "CTAs per row: 0 = the planner, 1 = one CTA per row, more = split rows")
      ->check(CLI::Range(0, 65535));
  topk->callback([f] { run_topk_bench(*f); });
  auto* idx = bench_cmd->add_subcommand("indexer", "Indexer logits: prefill 2048 x 32768 and paged decode 64 x 2 x 131072 (64 heads)");
  add_timing(idx, *f);
  auto ix = std::make_shared<IndexerBenchFlags>();
  idx->add_option("--heads", ix->heads, "index heads per row (default 64)")->check(CLI::Range(1, 64));
  idx->add_option("--mma", ix->mma,
                  "kernel: auto, wgmma (two warpgroups), wgmma.ws (warp-specialized: prefill with 17..64 heads; "
                  "otherwise as wgmma), mma.sync or all")
      ->check(CLI::IsMember({"auto", "wgmma", "wgmma.ws", "mma.sync", "all"}));
  idx->add_flag("--fused", ix->fused,
                "decode shapes 1 x 1,048,576 and 64 x 2 x 131,072, each also as fused selection (logits + top-k, k = 2048)");
  idx->callback([f, ix] { run_indexer_bench(*f, *ix); });
  auto* dcp = bench_cmd->add_subcommand("dcp", "DCP merge kernels and in-process all-gathers: rows 64/128 x heads 64/128 x ranks 2/4/8");
  add_timing(dcp, *f);
  auto dcp_ranks = std::make_shared<std::vector<int>>();
  dcp->add_option("--rows", f->rows, "query rows (default 64 and 128)")->check(CLI::PositiveNumber);
  dcp->add_option("--heads", f->heads, "query heads (default 64 and 128)")->check(CLI::PositiveNumber);
  dcp->add_option("--ranks", *dcp_ranks, "DCP sizes (default 2, 4 and 8)")->check(CLI::Range(1, 64));
  dcp->callback([f, dcp_ranks] { run_dcp_bench(*f, *dcp_ranks); });
  auto* plot = bench_cmd->add_subcommand("plot", "PNG figures of bench --json files: decode/extend times, writer bandwidth");
  auto plot_files = std::make_shared<std::vector<std::string>>();
  auto plot_dir = std::make_shared<std::string>();
  plot->add_option("--json", *plot_files, "a JSON file of bench decode|extend|write (repeat for several)")->required();
  plot->add_option("--out", *plot_dir, "folder for decode_time.png / writer_bandwidth.png (created if missing)")->required();
  plot->callback([plot_files, plot_dir] {
    const std::vector<std::filesystem::path> files(plot_files->begin(), plot_files->end());
    for (const auto& p : bench::write_plots(files, *plot_dir)) std::printf("%s\n", p.string().c_str());
  });
}

}  // namespace nvfp4mla::cli
