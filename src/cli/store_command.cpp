// nvfp4mla store: inspect and maintain a persistent KV offload store (docs/OFFLOAD.md).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "format_flags.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/file_read.h"
#include "nvfp4mla/offload/disk_tier.h"
#include "nvfp4mla/offload/namespace.h"
#include "nvfp4mla/safetensors.h"
#include "store_bench.h"

namespace nvfp4mla::cli {

namespace {

namespace fs = std::filesystem;
using namespace nvfp4mla::offload;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The namespace of put/get: the record format through the common format flags (or, for a
// format whose calibration file is not at hand, its identity string as `nvfp4mla abi` prints
// it), plus the block geometry, model and ranks.
struct NamespaceFlags {
  std::shared_ptr<FormatFlags> format;
  std::string identity;
  CLI::Option* identity_opt = nullptr;
  int tokens_per_block = 0;
  int layers = 0;
  std::string model;
  ParallelLayout parallel;

  void add_to(CLI::App* cmd) {
    format = FormatFlags::add_to(cmd);
    identity_opt = cmd->add_option("--identity", identity,
                                   "Full record identity as printed by `nvfp4mla abi`, instead of the format flags");
    cmd->add_option("--tokens-per-block", tokens_per_block, "Tokens per block (page size)")->required();
    cmd->add_option("--layers-in-block", layers, "Layers in a block")->required();
    cmd->add_option("--model", model, "Model identity (name and revision)")->required();
    cmd->add_option("--tp-rank", parallel.tp_rank, "Tensor-parallel rank")->capture_default_str();
    cmd->add_option("--tp-size", parallel.tp_size, "Tensor-parallel size")->capture_default_str();
    cmd->add_option("--dcp-rank", parallel.dcp_rank, "Decode-context-parallel rank")->capture_default_str();
    cmd->add_option("--dcp-size", parallel.dcp_size, "Decode-context-parallel size")->capture_default_str();
  }
  NamespaceParams params() const {
    if (!identity_opt->count()) return NamespaceParams::for_format(format->config(), tokens_per_block, layers, model, parallel);
    const FormatOptions given = format->options();
    if (given.cache_dtype || given.rope || given.scale_mode || given.scales_file || given.layer || given.layer_scale)
      throw Error("give the record format either as --identity or through the format flags, not both");
    NamespaceParams p;
    p.record_identity = identity;
    p.record_bytes = record_bytes_of_identity(identity);
    p.tokens_per_block = tokens_per_block;
    p.layers_in_block = layers;
    p.model_identity = model;
    p.parallel = parallel;
    p.validate();
    return p;
  }
};

std::string format_time(int64_t ns) {
  if (ns == 0) return "-";
  const std::time_t t = static_cast<std::time_t>(ns / 1000000000);
  char buf[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string format_bytes(uint64_t bytes) {
  char buf[48];
  if (bytes >= 1024ull * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / kGiB);
  else if (bytes >= 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1024.0 * 1024.0));
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  return buf;
}

std::string parallel_text(const ParallelLayout& p) {
  return "tp " + std::to_string(p.tp_rank) + "/" + std::to_string(p.tp_size) + ", dcp " + std::to_string(p.dcp_rank) +
         "/" + std::to_string(p.dcp_size);
}

// The namespaces a command works on: all valid ones, or the one whose digest starts with `prefix`.
std::vector<NamespaceListing> select_namespaces(const fs::path& root, const std::string& prefix) {
  std::vector<NamespaceListing> out;
  for (auto& l : list_namespaces(root))
    if (prefix.empty() || l.dir.filename().string().rfind(prefix, 0) == 0) out.push_back(std::move(l));
  if (!prefix.empty() && out.empty()) throw Error("no namespace under '" + root.string() + "' starts with " + prefix);
  if (!prefix.empty() && out.size() > 1)
    throw Error("namespace prefix " + prefix + " is ambiguous (" + std::to_string(out.size()) + " match): give more digits");
  return out;
}

// --max-gib: a number of GiB; a limit beyond what 64 bits of bytes can count (1e999, inf) keeps
// everything rather than wrapping around to a small number.
uint64_t max_bytes_of_gib(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double gib = std::strtod(begin, &end);
  if (text.empty() || end == begin || *end != '\0' || std::isnan(gib))
    throw Error("--max-gib: '" + text + "' is not a number of GiB");
  if (gib < 0) throw Error("--max-gib must not be negative, got " + text);
  const double bytes = gib * kGiB;  // inf (and ERANGE overflow) stays inf
  if (!(bytes < 18446744073709551616.0)) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(bytes);
}

void add_ls(CLI::App* store) {
  auto* cmd = store->add_subcommand("ls", "List the namespaces of a store with their identities, sizes and block counts");
  auto root = std::make_shared<std::string>();
  cmd->add_option("--root", *root, "Store root directory")->required();
  cmd->callback([root] {
    const auto listings = list_namespaces(*root);
    if (listings.empty()) std::printf("no namespaces under %s\n", root->c_str());
    for (const auto& l : listings) {
      const std::string name = l.dir.filename().string();
      if (!l.valid) {
        std::printf("%s  INVALID: %s\n", name.c_str(), l.problem.c_str());
        continue;
      }
      const DiskUsage u = disk_usage(l.dir);
      const NamespaceParams& p = l.params;
      std::printf("%.16s  %s  model=%s  %d tok x %d layers x %d B  %s  blocks=%llu  %s%s\n", name.c_str(),
                  p.record_identity.c_str(), p.model_identity.c_str(), p.tokens_per_block, p.layers_in_block,
                  p.record_bytes, parallel_text(p.parallel).c_str(), static_cast<unsigned long long>(u.blocks),
                  format_bytes(u.bytes).c_str(),
                  u.quarantined ? ("  quarantined=" + std::to_string(u.quarantined)).c_str() : "");
    }
  });
}

void add_stats(CLI::App* store) {
  auto* cmd = store->add_subcommand("stats", "Per-namespace usage: blocks, bytes, access times, quarantine");
  struct Args {
    std::string root, ns;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--root", a->root, "Store root directory")->required();
  cmd->add_option("--namespace", a->ns, "Only the namespace whose digest starts with this hex prefix");
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a] {
    nlohmann::ordered_json all = nlohmann::ordered_json::array();
    uint64_t total_blocks = 0, total_bytes = 0;
    for (const auto& l : select_namespaces(a->root, a->ns)) {
      nlohmann::ordered_json j;
      j["namespace"] = l.dir.filename().string();
      if (!l.valid) {
        j["problem"] = l.problem;
      } else {
        const DiskUsage u = disk_usage(l.dir);
        j["record_identity"] = l.params.record_identity;
        j["model_identity"] = l.params.model_identity;
        j["tokens_per_block"] = l.params.tokens_per_block;
        j["layers_in_block"] = l.params.layers_in_block;
        j["record_bytes"] = l.params.record_bytes;
        j["block_payload_bytes"] = l.params.block_bytes();
        j["tp_rank"] = l.params.parallel.tp_rank;
        j["tp_size"] = l.params.parallel.tp_size;
        j["dcp_rank"] = l.params.parallel.dcp_rank;
        j["dcp_size"] = l.params.parallel.dcp_size;
        j["blocks"] = u.blocks;
        j["bytes"] = u.bytes;
        j["oldest_access"] = format_time(u.oldest_access_ns);
        j["newest_access"] = format_time(u.newest_access_ns);
        j["quarantined_files"] = u.quarantined;
        j["quarantined_bytes"] = u.quarantined_bytes;
        j["temporary_files"] = u.temporaries;
        total_blocks += u.blocks;
        total_bytes += u.bytes;
      }
      all.push_back(j);
    }
    if (a->json) {
      std::printf("%s\n", all.dump(2).c_str());
      return;
    }
    for (const auto& j : all) {
      std::printf("namespace %s\n", j["namespace"].get<std::string>().c_str());
      for (const auto& [k, v] : j.items())
        if (k != "namespace") std::printf("  %-20s %s\n", k.c_str(), v.is_string() ? v.get<std::string>().c_str() : v.dump().c_str());
    }
    std::printf("total: %zu namespaces, %llu blocks, %s\n", all.size(), static_cast<unsigned long long>(total_blocks),
                format_bytes(total_bytes).c_str());
  });
}

void add_verify(CLI::App* store) {
  auto* cmd = store->add_subcommand("verify", "Re-check every block file's header and checksum; quarantine bad files");
  struct Args {
    std::string root, ns;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--root", a->root, "Store root directory")->required();
  cmd->add_option("--namespace", a->ns, "Only the namespace whose digest starts with this hex prefix");
  cmd->callback([a] {
    uint64_t checked = 0, quarantined = 0, unreadable = 0, invalid = 0;
    for (const auto& l : select_namespaces(a->root, a->ns)) {
      if (!l.valid) {
        std::printf("%s: INVALID namespace: %s\n", l.dir.filename().string().c_str(), l.problem.c_str());
        ++invalid;
        continue;
      }
      const auto tier = DiskTier::open_existing(l.dir);
      const VerifyReport r = tier->verify();
      checked += r.checked;
      quarantined += r.quarantined;
      unreadable += r.unreadable;
      std::printf("%.16s  %s: %llu checked, %llu ok, %zu bad\n", l.dir.filename().string().c_str(),
                  l.params.record_identity.c_str(), static_cast<unsigned long long>(r.checked),
                  static_cast<unsigned long long>(r.ok), r.problems.size());
      for (const auto& p : r.problems) std::printf("  %s\n", p.c_str());
    }
    std::vector<std::string> failures;
    if (quarantined)
      failures.push_back(std::to_string(quarantined) + " of " + std::to_string(checked) +
                         " block files failed verification and were moved to their namespace's quarantine/ folder "
                         "(see quarantine/reasons.log)");
    if (unreadable)
      failures.push_back(std::to_string(unreadable) + " of " + std::to_string(checked) +
                         " block files could not be read and were left in place (check their permissions)");
    if (invalid)
      failures.push_back(std::to_string(invalid) + " namespace directories are invalid and were not verified "
                         "(see the lines above)");
    if (!failures.empty()) {
      std::string message;
      for (const auto& f : failures) message += (message.empty() ? "" : "; ") + f;
      throw Error(message);
    }
    std::printf("all %llu block files verified\n", static_cast<unsigned long long>(checked));
  });
}

void add_gc(CLI::App* store) {
  auto* cmd = store->add_subcommand("gc", "Evict least-recently-used blocks across all namespaces down to a size");
  struct Args {
    std::string root, max_gib;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--root", a->root, "Store root directory")->required();
  cmd->add_option("--max-gib", a->max_gib, "Keep at most this many GiB of block files (inf: keep everything)")
      ->required();
  cmd->callback([a] {
    const uint64_t freed = collect_garbage(a->root, max_bytes_of_gib(a->max_gib));
    std::printf("freed %s\n", format_bytes(freed).c_str());
  });
}

void add_put_get(CLI::App* store) {
  struct Args {
    std::string root, key, file;
    NamespaceFlags ns;
  };
  auto put = std::make_shared<Args>();
  auto* put_cmd = store->add_subcommand("put", "Store a file's bytes as one block (debugging)");
  put_cmd->add_option("--root", put->root, "Store root directory")->required();
  put_cmd->add_option("--key", put->key, "Block key in hex (1..64 bytes)")->required();
  put_cmd->add_option("--input", put->file, "File holding exactly one block's bytes")->required();
  put->ns.add_to(put_cmd);
  put_cmd->callback([put] {
    // Everything is checked before the store is touched, so a bad request creates nothing.
    const NamespaceParams params = put->ns.params();
    const auto key = key_from_hex(put->key);
    const uint64_t block_bytes = params.block_bytes();
    const std::string input = read_regular_file(put->file, block_bytes, "block input");
    if (input.size() != block_bytes)
      throw Error("block input '" + put->file + "' is " + std::to_string(input.size()) +
                  " bytes; blocks of this namespace are " + std::to_string(block_bytes) + " bytes");
    const fs::path dir = namespace_dir(put->root, params);
    std::error_code ec;
    const bool existed = fs::exists(fs::symlink_status(dir, ec));
    try {
      DiskTier tier(put->root, params);
      tier.put(key, {reinterpret_cast<const uint8_t*>(input.data()), input.size()});
    } catch (...) {
      if (!existed) remove_namespace_if_empty(dir);  // a failed first put leaves no empty namespace
      throw;
    }
    std::printf("stored %zu bytes under %s in %s\n", input.size(), put->key.c_str(), dir.string().c_str());
  });

  auto get = std::make_shared<Args>();
  auto* get_cmd = store->add_subcommand("get", "Fetch one block into a file (debugging)");
  get_cmd->add_option("--root", get->root, "Store root directory")->required();
  get_cmd->add_option("--key", get->key, "Block key in hex (1..64 bytes)")->required();
  get_cmd->add_option("--output", get->file, "Output file")->required();
  get->ns.add_to(get_cmd);
  get_cmd->callback([get] {
    const NamespaceParams params = get->ns.params();
    const auto key = key_from_hex(get->key);
    if (!fs::exists(namespace_dir(get->root, params)))
      throw Error("no such namespace under '" + get->root + "' (" + namespace_dir(get->root, params).filename().string() +
                  "); `nvfp4mla store ls --root " + get->root + "` lists the namespaces there");
    DiskTier tier(get->root, params);
    auto missing = [&] {
      return Error("block " + get->key + " is not in the store" +
                   (tier.stats().corrupt ? std::string(" (its file failed validation and was quarantined)") : std::string()));
    };
    // The key first: a miss allocates nothing (a block can be up to 4 GiB).
    if (!tier.contains(key)) throw missing();
    const size_t size = tier.block_bytes();
    const std::unique_ptr<uint8_t[]> block(new uint8_t[size]);  // filled (or zeroed) by get
    if (!tier.get(key, {block.get(), size})) throw missing();
    write_file_atomic(get->file, block.get(), size);
    std::printf("wrote %zu bytes to %s\n", size, get->file.c_str());
  });
}

}  // namespace

void add_store_command(CLI::App& app) {
  auto* store = app.add_subcommand("store", "Persistent KV offload store: ls, stats, verify, gc, put, get, bench");
  store->require_subcommand(1);
  add_ls(store);
  add_stats(store);
  add_verify(store);
  add_gc(store);
  add_put_get(store);
  add_store_bench(store);
}

}  // namespace nvfp4mla::cli
