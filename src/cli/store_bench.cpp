// `nvfp4mla store bench`: put/get GB/s of the DRAM tier and the disk tier for 64-token blocks of
// 1 and 78 layers of 368-byte records, next to dd copying the same bytes in the same run.
#include "store_bench.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nvfp4mla/config.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/offload/disk_tier.h"
#include "nvfp4mla/offload/dram_tier.h"
#include "nvfp4mla/offload/store.h"

namespace nvfp4mla::cli {

namespace {

namespace fs = std::filesystem;
using namespace nvfp4mla::offload;

constexpr int kTokensPerBlock = 64;
constexpr size_t kKeyBytes = 32;

struct BenchArgs {
  std::string dir = ".";
  double total_mib = 64;
  int threads = 4;
  int repeat = 3;
  std::vector<int> layers = {1, 78};
};

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Deterministic, incompressible-looking bytes (splitmix64).
void fill_random(std::vector<uint8_t>& bytes, uint64_t seed) {
  uint64_t x = seed;
  for (size_t i = 0; i < bytes.size(); i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (size_t b = 0; b < 8 && i + b < bytes.size(); ++b) bytes[i + b] = static_cast<uint8_t>(z >> (8 * b));
  }
}

// Drops the page cache of a file, or of every file under a directory (the files are written and
// synced first), so the next read comes from the device.
void drop_cached_pages(const fs::path& path) {
  auto drop = [](const fs::path& file) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  if (!fs::is_directory(path)) return drop(path);
  for (const auto& e : fs::recursive_directory_iterator(path))
    if (e.is_regular_file()) drop(e.path());
}

// Runs dd with `args` and waits for it. No shell: the paths (from --dir) go to dd as they are.
void run_dd(const std::vector<std::string>& args) {
  std::vector<std::string> text{"dd"};
  text.insert(text.end(), args.begin(), args.end());
  std::string shown;
  for (const std::string& a : text) shown += (shown.empty() ? "" : " ") + a;
  std::vector<char*> argv;
  for (std::string& a : text) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (const int rc = ::posix_spawnp(&pid, "dd", nullptr, nullptr, argv.data(), environ); rc != 0)
    throw Error("benchmark baseline command failed: cannot run dd: " + std::string(std::strerror(rc)));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw Error("benchmark baseline command failed: waiting for dd: " + std::string(std::strerror(errno)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw Error("benchmark baseline command failed: " + shown);
}

// Runs `body` `reps` times, each after an untimed `prepare`, and prints the median rate with
// the range (the machine's disk is shared, so single runs are noisy).
void measure(const std::string& what, uint64_t bytes, int reps, const std::function<void(int)>& prepare,
             const std::function<void(int)>& body) {
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    prepare(r);
    const double s = seconds_of([&] { body(r); });
    rates.push_back(double(bytes) / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  std::printf("  %-46s %8.3f GB/s  (%d runs: %.3f .. %.3f)\n", what.c_str(), rates[rates.size() / 2], reps,
              rates.front(), rates.back());
}

void bench_block_size(const BenchArgs& a, const fs::path& work, int layers) {
  const FormatConfig format = FormatConfig::create({.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic});
  const NamespaceParams params = NamespaceParams::for_format(format, kTokensPerBlock, layers, "bench-model");
  const size_t block = params.block_bytes();
  const size_t n = std::max<size_t>(1, static_cast<size_t>(a.total_mib * 1024 * 1024 / double(block)));
  const uint64_t total = uint64_t(block) * n;
  const int reps = a.repeat;
  std::vector<uint8_t> data(total), out(total);
  fill_random(data, 42 + layers);
  std::vector<std::vector<uint8_t>> keys(n, std::vector<uint8_t>(kKeyBytes));
  for (size_t i = 0; i < n; ++i) fill_random(keys[i], 1000 + i);
  auto blk = [&](std::vector<uint8_t>& v, size_t i) { return std::span<uint8_t>(v.data() + i * block, block); };
  auto check_out = [&](const char* what) {
    if (out != data) throw Error(std::string("benchmark: ") + what + " returned different bytes");
    std::fill(out.begin(), out.end(), 0);
  };
  auto nothing = [](int) {};
  // Each run writes into a new directory; all are removed at the end (removing thousands of
  // files between runs would make the file system busy during the next timed run).
  auto fresh_root = [&](const std::string& name) { return work / name; };

  std::printf("block %zu B = %d tokens x %d layer(s) x %d B (%s); %zu blocks, %.1f MiB per run\n", block,
              kTokensPerBlock, layers, params.record_bytes, params.record_identity.c_str(), n, total / 1048576.0);

  std::unique_ptr<DramTier> dram;
  measure("DRAM tier put (1 thread)", total, reps, [&](int) { dram = std::make_unique<DramTier>(total + n * kKeyBytes); },
          [&](int) {
            for (size_t i = 0; i < n; ++i) dram->put(keys[i], blk(data, i));
          });
  measure("DRAM tier get (1 thread)", total, reps, nothing, [&](int) {
    for (size_t i = 0; i < n; ++i) dram->get(keys[i], blk(out, i));
  });
  check_out("DRAM get");
  dram.reset();

  std::unique_ptr<DiskTier> disk;
  const std::string tag = std::to_string(layers);
  measure("disk tier put, fsync (1 thread)", total, reps,
          [&](int r) {
            disk.reset();
            disk = std::make_unique<DiskTier>(fresh_root("sync-" + tag + "-" + std::to_string(r)), params);
          },
          [&](int) {
            for (size_t i = 0; i < n; ++i) disk->put(keys[i], blk(data, i));
          });
  measure("disk tier get, page cache (1 thread)", total, reps, nothing, [&](int) {
    for (size_t i = 0; i < n; ++i) disk->get(keys[i], blk(out, i));
  });
  check_out("disk get");
  measure("disk tier get, cold (1 thread)", total, reps, [&](int) { drop_cached_pages(disk->dir()); },
          [&](int) {
            for (size_t i = 0; i < n; ++i) disk->get(keys[i], blk(out, i));
          });
  check_out("disk get");
  measure("disk tier put, no fsync (1 thread)", total, reps,
          [&](int r) {
            disk.reset();
            disk = std::make_unique<DiskTier>(fresh_root("nosync-" + tag + "-" + std::to_string(r)), params,
                                              DiskTierOptions{.durable = false});
          },
          [&](int) {
            for (size_t i = 0; i < n; ++i) disk->put(keys[i], blk(data, i));
          });
  disk.reset();

  const std::string threads = std::to_string(a.threads) + " threads";
  std::unique_ptr<Store> store;
  std::vector<PutRequest> puts;
  std::vector<GetRequest> gets;
  for (size_t i = 0; i < n; ++i) {
    puts.push_back({keys[i], blk(data, i)});
    gets.push_back({keys[i], blk(out, i)});
  }
  measure("store put_async, fsync (" + threads + ")", total, reps,
          [&](int r) {
            store.reset();
            store = std::make_unique<Store>(fresh_root("async-" + tag + "-" + std::to_string(r)), params,
                                            StoreOptions{.io_threads = a.threads});
          },
          [&](int) {
            if (store->put_async(puts).get().count(OpStatus::stored) != n) throw Error("benchmark: async put failed");
          });
  measure("store get_async, cold (" + threads + ")", total, reps, [&](int) { drop_cached_pages(store->disk().dir()); },
          [&](int) {
            if (store->get_async(gets).get().count(OpStatus::hit) != n) throw Error("benchmark: async get missed");
          });
  check_out("async get");
  store.reset();

  // Baseline: the same bytes as one sequential file, copied by dd in block-sized writes.
  const fs::path src = work / "dd-src", dst = work / "dd-dst";
  {
    FILE* f = std::fopen(src.c_str(), "wb");
    if (!f || std::fwrite(data.data(), 1, data.size(), f) != data.size() || std::fclose(f) != 0)
      throw Error("benchmark: cannot write " + src.string());
  }
  const std::string bs = "bs=" + std::to_string(block);
  const std::string from_src = "if=" + src.string(), from_dst = "if=" + dst.string(), to_dst = "of=" + dst.string();
  auto remove_dst = [&](int) { fs::remove(dst); };
  measure("dd write, one fsync at the end (conv=fsync)", total, reps, remove_dst,
          [&](int) { run_dd({from_src, to_dst, bs, "status=none", "conv=fsync"}); });
  measure("dd read, cold", total, reps, [&](int) { drop_cached_pages(work / "dd-dst"); },
          [&](int) { run_dd({from_dst, "of=/dev/null", bs, "status=none"}); });
  measure("dd write, sync per block (oflag=dsync)", total, reps, remove_dst,
          [&](int) { run_dd({from_src, to_dst, bs, "status=none", "oflag=dsync"}); });
  fs::remove(src);
  fs::remove(dst);
}

}  // namespace

void add_store_bench(CLI::App* store) {
  auto* cmd = store->add_subcommand("bench", "Put/get throughput of the DRAM and disk tiers, against dd");
  auto a = std::make_shared<BenchArgs>();
  cmd->add_option("--dir", a->dir, "Directory on the disk to measure (a temporary folder is made inside)")
      ->capture_default_str();
  cmd->add_option("--total-mib", a->total_mib, "Bytes moved per measurement, MiB")->capture_default_str();
  cmd->add_option("--repeat", a->repeat, "Runs of each measurement (the median is printed)")->capture_default_str();
  cmd->add_option("--threads", a->threads, "I/O threads of the asynchronous measurements")->capture_default_str();
  cmd->add_option("--layers", a->layers, "Layers per 64-token block (one run each)")->capture_default_str();
  cmd->callback([a] {
    if (!(a->total_mib > 0)) throw Error("--total-mib must be positive");
    if (a->repeat < 1 || a->threads < 1) throw Error("--repeat and --threads must be at least 1");
    const fs::path work = fs::path(a->dir) / ("nvfp4mla-store-bench-" + std::to_string(::getpid()));
    std::error_code ec;
    fs::create_directories(a->dir, ec);
    if (ec) throw Error("cannot create '" + a->dir + "': " + ec.message());
    // A folder of our own: one that exists already (or a link planted under this name) would
    // have its files overwritten and, at the end, removed.
    if (!fs::create_directory(work, ec) || ec)
      throw Error("cannot create '" + work.string() + "': " + (ec ? ec.message() : std::string("it exists already")));
    try {
      for (int layers : a->layers) bench_block_size(*a, work, layers);
    } catch (...) {
      fs::remove_all(work, ec);
      throw;
    }
    fs::remove_all(work, ec);
  });
}

}  // namespace nvfp4mla::cli
