// `nvfp4mla store bench`: put/get GB/s of the DRAM tier and the disk tier for 64-token blocks of
// 1 and 78 layers of 368-byte records, next to dd copying the same bytes in the same run.
#include "store_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
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

// Drops the page cache of every file under `dir` (the files are clean: written and synced),
// so the next read comes from the device.
void drop_cached_pages(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

void run_shell(const std::string& command) {
  if (std::system(command.c_str()) != 0) throw Error("benchmark baseline command failed: " + command);
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

void report(const char* what, uint64_t bytes, double seconds) {
  std::printf("  %-46s %8.3f GB/s  (%.3f s)\n", what, bytes / seconds / 1e9, seconds);
}

void bench_block_size(const BenchArgs& a, const fs::path& work, int layers) {
  const FormatConfig format = FormatConfig::create({.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic});
  const NamespaceParams params = NamespaceParams::for_format(format, kTokensPerBlock, layers, "bench-model");
  const size_t block = params.block_bytes();
  const size_t n = std::max<size_t>(1, static_cast<size_t>(a.total_mib * 1024 * 1024 / double(block)));
  const uint64_t total = uint64_t(block) * n;
  std::vector<uint8_t> data(total), out(total);
  fill_random(data, 42 + layers);
  std::vector<std::vector<uint8_t>> keys(n, std::vector<uint8_t>(kKeyBytes));
  for (size_t i = 0; i < n; ++i) fill_random(keys[i], 1000 + i);
  auto blk = [&](std::vector<uint8_t>& v, size_t i) { return std::span<uint8_t>(v.data() + i * block, block); };
  auto verify = [&](const char* what) {
    if (out != data) throw Error(std::string("benchmark: ") + what + " returned different bytes");
    std::fill(out.begin(), out.end(), 0);
  };

  std::printf("block %zu B = %d tokens x %d layer(s) x %d B (%s); %zu blocks, %.1f MiB\n", block, kTokensPerBlock,
              layers, params.record_bytes, params.record_identity.c_str(), n, total / 1048576.0);

  {
    DramTier dram(total + n * kKeyBytes);
    report("DRAM tier put (1 thread)", total, seconds_of([&] {
             for (size_t i = 0; i < n; ++i) dram.put(keys[i], blk(data, i));
           }));
    report("DRAM tier get (1 thread)", total, seconds_of([&] {
             for (size_t i = 0; i < n; ++i) dram.get(keys[i], blk(out, i));
           }));
    verify("DRAM get");
  }

  const fs::path sync_root = work / ("sync-" + std::to_string(layers));
  {
    DiskTier disk(sync_root, params);
    report("disk tier put, fsync (1 thread)", total, seconds_of([&] {
             for (size_t i = 0; i < n; ++i) disk.put(keys[i], blk(data, i));
           }));
    report("disk tier get, page cache (1 thread)", total, seconds_of([&] {
             for (size_t i = 0; i < n; ++i) disk.get(keys[i], blk(out, i));
           }));
    verify("disk get");
    drop_cached_pages(sync_root);
    report("disk tier get, cold (1 thread)", total, seconds_of([&] {
             for (size_t i = 0; i < n; ++i) disk.get(keys[i], blk(out, i));
           }));
    verify("disk get");
  }
  {
    DiskTier disk(work / ("nosync-" + std::to_string(layers)), params, {.durable = false});
    report("disk tier put, no fsync (1 thread)", total, seconds_of([&] {
             for (size_t i = 0; i < n; ++i) disk.put(keys[i], blk(data, i));
           }));
  }
  {
    const std::string label = std::to_string(a.threads) + " threads";
    Store store(work / ("async-" + std::to_string(layers)), params, {.io_threads = a.threads});
    std::vector<PutRequest> puts;
    std::vector<GetRequest> gets;
    for (size_t i = 0; i < n; ++i) {
      puts.push_back({keys[i], blk(data, i)});
      gets.push_back({keys[i], blk(out, i)});
    }
    report(("store put_async, fsync (" + label + ")").c_str(), total, seconds_of([&] {
             if (store.put_async(puts).get().count(OpStatus::stored) != n) throw Error("benchmark: async put failed");
           }));
    drop_cached_pages(store.disk().dir());
    report(("store get_async, cold (" + label + ")").c_str(), total, seconds_of([&] {
             if (store.get_async(gets).get().count(OpStatus::hit) != n) throw Error("benchmark: async get missed");
           }));
    verify("async get");
  }

  // Baseline: the same bytes as one sequential file, copied by dd in block-sized writes.
  const fs::path src = work / "dd-src", dst = work / "dd-dst";
  {
    FILE* f = std::fopen(src.c_str(), "wb");
    if (!f || std::fwrite(data.data(), 1, data.size(), f) != data.size() || std::fclose(f) != 0)
      throw Error("benchmark: cannot write " + src.string());
  }
  const std::string bs = " bs=" + std::to_string(block) + " status=none";
  report("dd write, one fsync at the end (conv=fsync)", total,
         seconds_of([&] { run_shell("dd if=" + quoted(src) + " of=" + quoted(dst) + bs + " conv=fsync"); }));
  drop_cached_pages(dst.parent_path());
  report("dd read, cold", total, seconds_of([&] { run_shell("dd if=" + quoted(dst) + " of=/dev/null" + bs); }));
  fs::remove(dst);
  report("dd write, sync per block (oflag=dsync)", total,
         seconds_of([&] { run_shell("dd if=" + quoted(src) + " of=" + quoted(dst) + bs + " oflag=dsync"); }));
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
  cmd->add_option("--threads", a->threads, "I/O threads of the asynchronous measurements")->capture_default_str();
  cmd->add_option("--layers", a->layers, "Layers per 64-token block (one run each)")->capture_default_str();
  cmd->callback([a] {
    if (!(a->total_mib > 0)) throw Error("--total-mib must be positive");
    const fs::path work = fs::path(a->dir) / ("nvfp4mla-store-bench-" + std::to_string(::getpid()));
    std::error_code ec;
    fs::create_directories(work, ec);
    if (ec) throw Error("cannot create '" + work.string() + "': " + ec.message());
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
