// nvfp4mla info: the build, the device, and which decode kernel the planner runs for each record
// format and head count on that device (or on another GPU named by its compute capability), so
// that a deployment can see what it will get before it runs.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "nvfp4mla/arch.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/format.h"

namespace nvfp4mla::cli {
namespace {

constexpr const char* kVersion = NVFP4MLA_VERSION;  // CMake's project version
constexpr int kHeadCounts[] = {8, 16, 32, 64, 128};

struct InfoOptions {
  int compute_capability = 0;  // 0: this machine's GPU
  int sm_count = 0;            // 0: the GPU's (kDefaultSmCount without one)
  bool json = false;
};

// The GPU the table is for: the options' compute capability, else this machine's GPU, else none.
bool table_arch(const InfoOptions& o, ArchSpec& arch) {
  if (o.compute_capability > 0) {
    int sms = o.sm_count;
    if (sms == 0) sms = cuda_device_count() > 0 ? current_device_arch().sm_count : kDefaultSmCount;
    arch = arch_spec(o.compute_capability / 10, o.compute_capability % 10, sms);
    return true;
  }
  if (cuda_device_count() == 0) return false;
  arch = current_device_arch();
  if (o.sm_count > 0) arch.sm_count = o.sm_count;
  return true;
}

// "sm90_h16", or "sm80_mma/32" where sm80_mma splits the heads into groups of that many per CTA
// (its head group depends on the device's shared memory); "-" when no kernel runs the shape.
std::string kernel_cell(const ArchSpec& arch, const RecordSpec& spec, int heads, nlohmann::json& j) {
  try {
    const DecodePlan plan = plan_sparse_decode(spec, 128, heads, 2048, arch);
    j = {{"kernel", to_string(plan.kernel)}, {"head_group", plan.head_group}, {"stages", plan.stages}};
    std::string cell = to_string(plan.kernel);
    if (plan.kernel == DecodeKernel::sm80_mma && plan.head_group < heads) cell += "/" + std::to_string(plan.head_group);
    return cell;
  } catch (const Error& e) {
    j = {{"kernel", nullptr}, {"why", e.what()}};
    return "-";
  }
}

void run_info(const InfoOptions& o) {
  ArchSpec arch;
  const bool have_arch = table_arch(o, arch);
  nlohmann::json j = {{"version", kVersion}, {"cuda_kernels", built_with_cuda()}, {"device", cuda_device_description(0)}};
  if (!o.json)
    std::printf("nvfp4mla %s\nCUDA kernels: %s\ndevice: %s\n", kVersion, built_with_cuda() ? "built" : "not built",
                cuda_device_description(0).c_str());
  if (!have_arch) {
    if (o.json) std::printf("%s\n", j.dump(2).c_str());
    else std::printf("decode kernels: name a GPU with --compute-capability (no CUDA device here)\n");
    return;
  }
  j["arch"] = {{"compute_capability", arch.compute_capability()}, {"sm_count", arch.sm_count},
               {"smem_per_block", arch.smem_per_block}, {"wgmma", arch.wgmma}, {"clusters", arch.clusters}};
  nlohmann::json table = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  for (const RecordSpec& spec : kAllRecordSpecs) {
    nlohmann::json by_heads = nlohmann::json::object();
    std::vector<std::string> row{to_string(spec)};
    for (int heads : kHeadCounts) {
      nlohmann::json cell;
      row.push_back(kernel_cell(arch, spec, heads, cell));
      by_heads[std::to_string(heads)] = cell;
    }
    table.push_back({{"format", to_string(spec)}, {"heads", by_heads}});
    rows.push_back(row);
  }
  j["decode_kernels"] = table;
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("decode kernels on %s (the planner's choice; sm80_mma/N: N heads per CTA):\n",
              to_string(arch).c_str());
  std::printf("  %-28s", "format \\ heads");
  for (int heads : kHeadCounts) std::printf(" %-17d", heads);
  std::printf("\n");
  for (const auto& row : rows) {
    std::printf("  %-28s", row[0].c_str());
    for (size_t i = 1; i < row.size(); ++i) std::printf(" %-17s", row[i].c_str());
    std::printf("\n");
  }
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "info", "Build and device information, and the decode kernel each record format and head count runs on the GPU");
  auto o = std::make_shared<InfoOptions>();
  cmd->add_option("--compute-capability", o->compute_capability,
                  "10 x major + minor of the GPU to show the kernels for (e.g. 80, 86, 89, 90, 100, 120; default: this "
                  "machine's GPU)")
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--sm-count", o->sm_count, "SMs of that GPU (default: this machine's GPU's, else 132)")
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("--json", o->json, "print JSON");
  cmd->callback([o] { run_info(*o); });
}

}  // namespace nvfp4mla::cli
