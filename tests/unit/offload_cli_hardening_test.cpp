// `nvfp4mla store` against a careless user and a hostile store directory (issue 20): limits that
// overflow, links in and next to the store, the file size limit, inputs without a size bound,
// exit codes, and namespace identities. Each test names the item of the issue it guards.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "nvfp4mla/offload/block_file.h"
#include "nvfp4mla/offload/disk_tier.h"
#include "nvfp4mla/offload/namespace.h"
#include "support/cli_child.h"
#include "support/offload_fixtures.h"

#ifdef NVFP4MLA_CLI_PATH

using namespace nvfp4mla;
using namespace nvfp4mla::offload;
using nvfp4mla::testing::ChildLimits;
using nvfp4mla::testing::ChildResult;
using nvfp4mla::testing::expect_clean_failure;
using nvfp4mla::testing::files_under;
using nvfp4mla::testing::pattern_bytes;
using nvfp4mla::testing::read_file;
using nvfp4mla::testing::run_cli_child;
using nvfp4mla::testing::ScratchDir;
using nvfp4mla::testing::write_file;
namespace fs = std::filesystem;

namespace {

const std::string kIdentity = "nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1";
constexpr size_t kBlockBytes = 4 * 2 * 368;  // the namespace of ns_args()

std::vector<std::string> ns_args(const std::string& identity = kIdentity) {
  return {"--identity", identity, "--tokens-per-block", "4", "--layers-in-block", "2", "--model", "glm-test"};
}

// A store under dir/store with one block under key 01 (input dir/in.bin).
struct StoreFixture {
  ScratchDir dir;
  fs::path root = dir.path() / "store";
  std::vector<uint8_t> block = pattern_bytes(kBlockBytes, 7);

  StoreFixture() {
    write_file(dir.path() / "in.bin", block);
    const ChildResult r = put("01", "in.bin");
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  ChildResult run(std::vector<std::string> args, const ChildLimits& limits = {}) const {
    return run_cli_child(dir.path(), args, limits);
  }
  ChildResult put(const std::string& key, const std::string& input, const ChildLimits& limits = {},
                  const std::string& identity = kIdentity) const {
    std::vector<std::string> args{"store", "put", "--root", "store", "--key", key, "--input", input};
    for (const auto& a : ns_args(identity)) args.push_back(a);
    return run(args, limits);
  }
  ChildResult get(const std::string& key, const std::string& output, const ChildLimits& limits = {}) const {
    std::vector<std::string> args{"store", "get", "--root", "store", "--key", key, "--output", output};
    for (const auto& a : ns_args()) args.push_back(a);
    return run(args, limits);
  }
  fs::path ns_dir() const {
    for (const auto& e : fs::directory_iterator(root)) return e.path();
    return {};
  }
  size_t namespace_count() const {
    std::error_code ec;
    if (!fs::exists(root, ec)) return 0;
    return static_cast<size_t>(std::distance(fs::directory_iterator(root), fs::directory_iterator()));
  }
};

}  // namespace

// Item 1: a --max-gib too large for 64 bits of bytes used to wrap around and delete everything.
TEST(OffloadCliHardening, GcWithAHugeLimitKeepsEverything) {
  StoreFixture s;
  for (const std::string limit : {"inf", "1e999", "2e10", "17179869184"}) {
    SCOPED_TRACE(limit);
    const ChildResult r = s.run({"store", "gc", "--root", "store", "--max-gib", limit});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("freed 0 B"), std::string::npos) << r.out;
    EXPECT_EQ(files_under(s.root, ".blk").size(), 1u);
  }
  for (const std::string limit : {"nan", "-1", "-inf", "abc", "1x", ""}) {
    SCOPED_TRACE(limit);
    const ChildResult r = s.run({"store", "gc", "--root", "store", "--max-gib", limit});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("--max-gib"), std::string::npos) << r.err;
    EXPECT_EQ(files_under(s.root, ".blk").size(), 1u);
  }
  const ChildResult r = s.run({"store", "gc", "--root", "store", "--max-gib", "0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(files_under(s.root, ".blk").empty());
}

// Item 3: `store get --output X` wrote through a link planted at X.tmp.
TEST(OffloadCliHardening, GetNeverWritesThroughALinkAtOrNextToTheOutput) {
  StoreFixture s;
  const fs::path secret = s.dir.path() / "secret";
  write_file(secret, {'k', 'e', 'e', 'p'});
  fs::create_symlink(secret, s.dir.path() / "out.tmp");
  const ChildResult r = s.get("01", "out");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(secret), (std::vector<uint8_t>{'k', 'e', 'e', 'p'}));
  EXPECT_FALSE(fs::is_symlink(s.dir.path() / "out"));
  EXPECT_EQ(read_file(s.dir.path() / "out"), s.block);
  EXPECT_TRUE(fs::is_symlink(s.dir.path() / "out.tmp"));  // not ours: left alone
  // A link at the output path itself is replaced, never written through.
  fs::create_symlink(secret, s.dir.path() / "linked");
  const ChildResult linked = s.get("01", "linked");
  ASSERT_EQ(linked.exit_code, 0) << linked.err;
  EXPECT_EQ(read_file(secret), (std::vector<uint8_t>{'k', 'e', 'e', 'p'}));
  EXPECT_FALSE(fs::is_symlink(s.dir.path() / "linked"));
  EXPECT_EQ(read_file(s.dir.path() / "linked"), s.block);
}

// Item 9: a failed rename reported "Success" (errno overwritten by the clean-up).
TEST(OffloadCliHardening, GetIntoADirectoryNamesTheRealError) {
  StoreFixture s;
  fs::create_directory(s.dir.path() / "dd");
  write_file(s.dir.path() / "dd" / "x", {1});
  const ChildResult r = s.get("01", "dd");
  expect_clean_failure(r, "Is a directory");
  EXPECT_EQ(r.err.find("Success"), std::string::npos) << r.err;
  for (const auto& e : fs::directory_iterator(s.dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

// Item 5: SIGXFSZ killed the CLI (exit 153) and left tmp/<key>.0.tmp behind.
TEST(OffloadCliHardening, FileSizeLimitIsAnErrorNotASignal) {
  StoreFixture s;
  write_file(s.dir.path() / "in2.bin", pattern_bytes(kBlockBytes, 8));
  const ChildResult r = s.put("02", "in2.bin", {.file_size_bytes = 1024});
  expect_clean_failure(r, "ulimit -f");
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  EXPECT_TRUE(files_under(s.ns_dir() / "tmp").empty());
  EXPECT_EQ(files_under(s.root, ".blk").size(), 1u);
  const ChildResult g = s.get("01", "out");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_EQ(read_file(s.dir.path() / "out"), s.block);
  // The same for get: the output is larger than the limit.
  const ChildResult big = s.get("01", "out2", {.file_size_bytes = 1024});
  expect_clean_failure(big, "File too large");
  for (const auto& e : fs::directory_iterator(s.dir.path()))
    EXPECT_EQ(e.path().filename().string().find("out2"), std::string::npos) << e.path();
}

// Items 5 and 8: a first put that fails leaves neither a temporary nor an empty namespace.
TEST(OffloadCliHardening, FailedFirstPutLeavesNoNamespace) {
  ScratchDir dir;
  write_file(dir.path() / "in.bin", pattern_bytes(kBlockBytes, 1));
  write_file(dir.path() / "short.bin", pattern_bytes(100, 1));
  std::vector<std::string> base{"store", "put", "--root", "store", "--key", "01", "--input"};
  auto args = [&](const std::string& input) {
    std::vector<std::string> a = base;
    a.push_back(input);
    for (const auto& x : ns_args()) a.push_back(x);
    return a;
  };
  auto namespaces = [&] {
    std::error_code ec;
    if (!fs::exists(dir.path() / "store", ec)) return size_t{0};
    return static_cast<size_t>(
        std::distance(fs::directory_iterator(dir.path() / "store"), fs::directory_iterator()));
  };
  expect_clean_failure(run_cli_child(dir.path(), args("short.bin")), "blocks of this namespace are 2944 bytes");
  EXPECT_EQ(namespaces(), 0u);
  expect_clean_failure(run_cli_child(dir.path(), args("in.bin"), {.file_size_bytes = 2048}), "ulimit -f");
  EXPECT_EQ(namespaces(), 0u);
  const ChildResult ok = run_cli_child(dir.path(), args("in.bin"));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(namespaces(), 1u);
}

// Items 6 and 7: the input is checked (type, size) before it is read.
TEST(OffloadCliHardening, PutRefusesInputsThatAreNotOneBlock) {
  StoreFixture s;
  fs::create_directory(s.dir.path() / "folder");
  expect_clean_failure(s.put("02", "folder"), "is a directory");
  expect_clean_failure(s.put("02", "/dev/zero"), "is a device");
  ASSERT_EQ(::mkfifo((s.dir.path() / "fifo").c_str(), 0600), 0);
  expect_clean_failure(s.put("02", "fifo", {.timeout_s = 10}), "is a FIFO");
  // A 3 GB (sparse) input is refused from its size, not read.
  const fs::path huge = s.dir.path() / "huge.bin";
  write_file(huge, {});
  fs::resize_file(huge, 3'000'000'000ull);
  ChildLimits limits{.timeout_s = 20};
  if (nvfp4mla::testing::kAddressSpaceLimitsWork) limits.address_space_bytes = 1ull << 30;
  expect_clean_failure(s.put("02", "huge.bin", limits), "at most 2944 bytes");
  EXPECT_EQ(files_under(s.root, ".blk").size(), 1u);
}

// Item 6: `store get` zero-filled a whole block (here 4 GiB) before looking the key up.
TEST(OffloadCliHardening, GetOfAMissingKeyAllocatesNothing) {
  if (!nvfp4mla::testing::kAddressSpaceLimitsWork) GTEST_SKIP() << "address-space limits do not work under sanitizers";
  ScratchDir dir;
  // 65536 tokens x 178 layers x 368 bytes: just under the 4 GiB block limit.
  const std::vector<std::string> ns{"--identity", kIdentity, "--tokens-per-block", "65536", "--layers-in-block", "178",
                                    "--model", "m"};
  const FormatConfig format = FormatConfig::create({.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic});
  { DiskTier tier(dir.path() / "store", NamespaceParams::for_format(format, 65536, 178, "m")); }
  std::vector<std::string> args{"store", "get", "--root", "store", "--key", "01", "--output", "out"};
  args.insert(args.end(), ns.begin(), ns.end());
  expect_clean_failure(run_cli_child(dir.path(), args, {.address_space_bytes = 1ull << 30}), "not in the store");
}

// Item 7: bad_alloc is a clean error (exit 1), not "internal error" (exit 2).
TEST(OffloadCliHardening, OutOfMemoryIsACleanError) {
  if (!nvfp4mla::testing::kAddressSpaceLimitsWork) GTEST_SKIP() << "address-space limits do not work under sanitizers";
  ScratchDir dir;
  // A safetensors file whose one tensor is 2 GB of (sparse) zeros: reading it needs the memory.
  const std::string header = R"({"kv_c":{"dtype":"F32","shape":[1000000,512],"data_offsets":[0,2048000000]}})";
  std::vector<uint8_t> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(uint64_t(header.size()) >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  write_file(dir.path() / "big.safetensors", bytes);
  fs::resize_file(dir.path() / "big.safetensors", bytes.size() + 2048000000ull);
  const ChildResult r = run_cli_child(dir.path(), {"encode", "--input", "big.safetensors", "--output", "o.safetensors"},
                                      {.address_space_bytes = 1ull << 30});
  expect_clean_failure(r, "out of memory");
  EXPECT_FALSE(fs::exists(dir.path() / "o.safetensors"));
}

// Item 8: --identity is validated like the identities the library writes; a near miss used to
// create a namespace of its own.
TEST(OffloadCliHardening, IdentityMustBeOneTheLibraryWrites) {
  StoreFixture s;
  const std::string sha(64, 'a');
  for (const std::string& bad : std::vector<std::string>{"nvfp4_ds_mla:fp8-rope-368:dynamic-tokn-v1", kIdentity + ":extra", "nvfp4_ds_mla:fp8-rope-368:static-calibrated-v1:nothex",
        "nvfp4_ds_mla:fp8-rope-368:static-calibrated-v1:" + std::string(64, 'A'),
        "nvfp4_ds_mla:fp8-rope-368:static-calibrated-v1:" + sha + ":x", "nvfp4_ds_mla:bf16-rope-432:dynamic-token-v1",
        "bf16:1152:v2"}) {
    SCOPED_TRACE(bad);
    const ChildResult r = s.put("02", "in.bin", {}, bad);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("identity"), std::string::npos) << r.err;
    EXPECT_EQ(s.namespace_count(), 1u);
  }
  const ChildResult r = s.put("02", "in.bin", {}, "nvfp4_ds_mla:fp8-rope-368:static-calibrated-v1:" + sha);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(s.namespace_count(), 2u);
}

// Item 2: opening a store emptied the folder a planted <namespace>/tmp link pointed to.
TEST(OffloadCliHardening, LinkedTmpIsRefusedAndItsTargetKept) {
  StoreFixture s;
  const fs::path victim = s.dir.path() / "v";
  fs::create_directory(victim);
  write_file(victim / "important", {1, 2, 3});
  fs::remove_all(s.ns_dir() / "tmp");
  fs::create_directory_symlink(victim, s.ns_dir() / "tmp");
  const ChildResult r = s.get("01", "o");
  expect_clean_failure(r, (s.ns_dir() / "tmp").filename().string());
  EXPECT_NE(r.err.find("symbolic link"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(victim / "important"));
}

// Item 6: a manifest that is a FIFO hung `store ls`; one far larger than any manifest was read whole.
TEST(OffloadCliHardening, LsReportsManifestsThatAreNotSmallFiles) {
  StoreFixture s;
  const fs::path ns = s.ns_dir();
  const fs::path manifest = ns / "manifest.json";
  fs::remove(manifest);
  ASSERT_EQ(::mkfifo(manifest.c_str(), 0600), 0);
  ChildResult r = s.run({"store", "ls", "--root", "store"}, {.timeout_s = 10});
  ASSERT_EQ(r.exit_code, 0) << "signal " << r.signal << " " << r.err;
  EXPECT_NE(r.out.find("INVALID"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FIFO"), std::string::npos) << r.out;
  fs::remove(manifest);
  write_file(manifest, std::vector<uint8_t>(kMaxManifestBytes + 1, ' '));
  r = s.run({"store", "ls", "--root", "store"}, {.timeout_s = 10});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("at most"), std::string::npos) << r.out;
  fs::remove(manifest);
  fs::create_symlink("/dev/zero", manifest);
  r = s.run({"store", "ls", "--root", "store"}, {.timeout_s = 10});
  ASSERT_EQ(r.exit_code, 0) << "signal " << r.signal << " " << r.err;
  EXPECT_NE(r.out.find("symbolic link"), std::string::npos) << r.out;
}

// Item 9: verify said "1 of 0 block files ... moved to quarantine" for an invalid namespace.
TEST(OffloadCliHardening, VerifyTellsInvalidNamespacesFromQuarantinedFiles) {
  StoreFixture s;
  const fs::path manifest = s.ns_dir() / "manifest.json";
  auto text = read_file(manifest);
  const std::string edited = [&] {
    std::string t(text.begin(), text.end());
    t.replace(t.find("glm-test"), 8, "glm-tess");
    return t;
  }();
  write_file(manifest, std::vector<uint8_t>(edited.begin(), edited.end()));
  const ChildResult r = s.run({"store", "verify", "--root", "store"});
  expect_clean_failure(r, "invalid and were not verified");
  EXPECT_EQ(r.err.find("of 0 block files"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("quarantine"), std::string::npos) << r.err;
  EXPECT_EQ(files_under(s.root, ".blk").size(), 1u);
}

// Item 9: verify said an unreadable block file was quarantined, but it stays where it is.
TEST(OffloadCliHardening, VerifyLeavesUnreadableFilesAndSaysSo) {
  StoreFixture s;
  constexpr uid_t kNobody = 65534;
  if (::geteuid() == 0) {
    for (const auto& e : fs::recursive_directory_iterator(s.root)) ASSERT_EQ(::lchown(e.path().c_str(), kNobody, kNobody), 0);
    ASSERT_EQ(::chown(s.root.c_str(), kNobody, kNobody), 0);
  }
  const auto blocks = files_under(s.root, ".blk");
  ASSERT_EQ(blocks.size(), 1u);
  fs::permissions(blocks[0], fs::perms::none);
  const ChildResult r = s.run({"store", "verify", "--root", "store"}, {.user = kNobody});
  expect_clean_failure(r, "could not be read and were left in place");
  EXPECT_EQ(r.err.find("moved"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(blocks[0]));
}

// `store bench --dir` went into the dd command lines it gave the shell, quoted with '...' but not
// escaped: a quote in the folder's name ended the quoting and the rest of the name ran as commands.
TEST(OffloadCliHardening, StoreBenchRunsDdWithoutAShell) {
  ScratchDir dir;
  const std::string folder = "q'; touch INJECTED; '";
  const ChildResult r = run_cli_child(dir.path(), {"store", "bench", "--dir", folder, "--total-mib", "0.02", "--repeat", "1",
                                                   "--layers", "1", "--threads", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("dd write, sync per block"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir.path() / "INJECTED"));
  // The bench's own folder inside it is removed at the end.
  EXPECT_TRUE(fs::is_directory(dir.path() / folder));
  EXPECT_TRUE(fs::is_empty(dir.path() / folder));
}

#endif
