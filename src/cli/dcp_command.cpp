// nvfp4mla dcp: decode context parallelism tools. `dcp union` measures union mode's quality
// effect (eval/dcp_union.h) on the CPU: recall of the exact top-k, attended tokens, needles kept
// and the attention output difference against the exact global top-k, per (ranks, interleave,
// per-rank k). `dcp run` (dcp_run_command.cpp): one process of a multi-GPU run over NCCL.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/dcp_union.h"
#include "nvfp4mla/safetensors.h"

namespace nvfp4mla::cli {
namespace {

void run_union(const eval::DcpUnionOptions& o, const std::string& json_path) {
  const std::vector<eval::DcpUnionCell> cells = eval::evaluate_dcp_union(o);
  std::printf("DCP union mode vs exact global top-k: needle workload, context %lld, %d rows, k %d, seed %llu\n",
              static_cast<long long>(o.context), o.rows, o.k, static_cast<unsigned long long>(o.seed));
  std::printf("%5s %10s %6s | %8s %8s %9s %7s | %11s %11s %12s %12s\n", "ranks", "interleave", "k_rank", "recall",
              "min", "|U|/k", "needles", "mean relL2", "max relL2", "mean 1-cos", "max 1-cos");
  nlohmann::json cells_json = nlohmann::json::array();
  for (const auto& c : cells) {
    std::printf("%5d %10d %6d | %8.4f %8.4f %9.3f %3d/%-3d | %11.3e %11.3e %12.3e %12.3e\n", c.ranks, c.interleave, c.k_rank,
                c.recall, c.min_recall, c.union_size, c.needles, c.rows, c.mean_rel_l2, c.max_rel_l2, c.mean_cos_diff,
                c.max_cos_diff);
    cells_json.push_back({{"ranks", c.ranks},
                          {"interleave", c.interleave},
                          {"k_rank", c.k_rank},
                          {"recall", c.recall},
                          {"min_recall", c.min_recall},
                          {"union_size_over_k", c.union_size},
                          {"needles", c.needles},
                          {"rows", c.rows},
                          {"mean_rel_l2", c.mean_rel_l2},
                          {"max_rel_l2", c.max_rel_l2},
                          {"mean_cos_diff", c.mean_cos_diff},
                          {"max_cos_diff", c.max_cos_diff}});
  }
  if (!json_path.empty()) {
    const nlohmann::json j = {{"context", o.context}, {"rows", o.rows}, {"k", o.k}, {"seed", o.seed}, {"cells", cells_json}};
    const std::string text = j.dump(2) + "\n";
    write_file_atomic(json_path, text.data(), text.size());
  }
}

}  // namespace

void add_dcp_command(CLI::App& app) {
  auto* dcp = app.add_subcommand("dcp", "Decode context parallelism: union-mode quality, multi-GPU runs over NCCL");
  dcp->require_subcommand(1);
  auto* uni = dcp->add_subcommand(
      "union", "Union mode (each rank attends its own top-k) against the exact global top-k, on the CPU");
  auto o = std::make_shared<eval::DcpUnionOptions>();
  auto json = std::make_shared<std::string>();
  uni->add_option("--context", o->context, "Context length (tokens)")->capture_default_str();
  uni->add_option("--rows", o->rows, "Query rows (one needle each, at depths (i + 0.5) / rows)")->capture_default_str();
  uni->add_option("-k", o->k, "The exact mode's k")->capture_default_str();
  uni->add_option("--ranks", o->ranks, "DCP sizes")->delimiter(',')->capture_default_str();
  uni->add_option("--interleaves", o->interleaves, "Interleaves")->delimiter(',')->capture_default_str();
  uni->add_option("--seed", o->seed, "Workload seed")->capture_default_str();
  uni->add_option("--threads", o->threads, "Threads (0: all cores)")->capture_default_str();
  uni->add_option("--json", *json, "Also write the cells as JSON");
  uni->callback([o, json] { run_union(*o, *json); });
  add_dcp_run_command(dcp);
}

}  // namespace nvfp4mla::cli
