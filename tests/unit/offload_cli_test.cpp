// `nvfp4mla store`: put/get round trip, ls, stats, verify, gc, and error paths.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "nvfp4mla/offload/block_file.h"
#include "nvfp4mla/offload/namespace.h"
#include "support/offload_fixtures.h"

#ifdef NVFP4MLA_CLI_PATH

using namespace nvfp4mla;
using namespace nvfp4mla::offload;
using nvfp4mla::testing::files_under;
using nvfp4mla::testing::pattern_bytes;
using nvfp4mla::testing::read_file;
using nvfp4mla::testing::ScratchDir;
using nvfp4mla::testing::write_file;
namespace fs = std::filesystem;

namespace {

struct CliRun {
  int code;
  std::string output;  // stdout and stderr
};

CliRun cli(const std::string& args) {
  const std::string command = std::string(NVFP4MLA_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

const std::string kIdentity = "nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1";

std::string geometry(int tokens = 4) {
  return " --tokens-per-block " + std::to_string(tokens) + " --layers-in-block 2 --model glm-test";
}
std::string ns_flags(int tokens = 4) { return "--identity " + kIdentity + geometry(tokens); }

}  // namespace

TEST(OffloadCli, PutGetListStatsVerifyGc) {
  ScratchDir dir;
  const std::string root = (dir.path() / "store").string();
  const auto block = pattern_bytes(4 * 2 * 368, 5);
  write_file(dir.path() / "in.bin", block);
  const std::string key = "00112233445566778899aabbccddeeff";

  CliRun r = cli("store put --root " + root + " --key " + key + " --input " + (dir.path() / "in.bin").string() + " " + ns_flags());
  ASSERT_EQ(r.code, 0) << r.output;
  // The same namespace through the format flags.
  r = cli("store get --root " + root + " --key " + key + " --output " + (dir.path() / "out.bin").string() +
          " --cache-dtype nvfp4_ds_mla --rope fp8 --scale-mode dynamic" + geometry());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_file(dir.path() / "out.bin"), block);
  // The implicit-scale 368-byte format has the same record width but is another namespace.
  r = cli("store get --root " + root + " --key " + key + " --output " + (dir.path() / "x.bin").string() +
          " --rope fp8 --scale-mode implicit" + geometry());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("no such namespace"), std::string::npos) << r.output;

  r = cli("store ls --root " + root);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(kIdentity), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model=glm-test"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("blocks=1"), std::string::npos) << r.output;

  r = cli("store stats --json --root " + root);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto stats = nlohmann::json::parse(r.output);
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0]["blocks"], 1);
  EXPECT_EQ(stats[0]["bytes"], block_file_size(key.size() / 2, block.size()));
  EXPECT_EQ(stats[0]["record_identity"], kIdentity);
  EXPECT_EQ(stats[0]["tokens_per_block"], 4);

  r = cli("store verify --root " + root);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("all 1 block files verified"), std::string::npos) << r.output;

  // Damage the block: verify reports it, moves it to quarantine and fails.
  const auto blocks = files_under(dir.path() / "store", ".blk");
  ASSERT_EQ(blocks.size(), 1u);
  auto bytes = read_file(blocks[0]);
  bytes[100] ^= 4;
  write_file(blocks[0], bytes);
  r = cli("store verify --root " + root);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("checksum mismatch"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed verification"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(blocks[0]));
  r = cli("store get --root " + root + " --key " + key + " --output " + (dir.path() / "out2.bin").string() + " " + ns_flags());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("not in the store"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.path() / "out2.bin"));

  // gc down to nothing.
  for (const char* k : {"01", "02", "03"}) {
    r = cli("store put --root " + root + " --key " + k + " --input " + (dir.path() / "in.bin").string() + " " + ns_flags());
    ASSERT_EQ(r.code, 0) << r.output;
  }
  r = cli("store gc --max-gib 0 --root " + root);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("freed"), std::string::npos) << r.output;
  EXPECT_TRUE(files_under(dir.path() / "store", ".blk").empty());
}

TEST(OffloadCli, ErrorsAreClear) {
  ScratchDir dir;
  const std::string root = (dir.path() / "store").string();
  write_file(dir.path() / "short.bin", pattern_bytes(100, 1));
  CliRun r = cli("store put --root " + root + " --key 01 --input " + (dir.path() / "short.bin").string() +
              " --identity vllm-default-v1" + geometry());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("compatibility sentinel"), std::string::npos) << r.output;
  r = cli("store put --root " + root + " --key 01 --input " + (dir.path() / "short.bin").string() + " " + ns_flags());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("blocks of this namespace are 2944 bytes"), std::string::npos) << r.output;
  r = cli("store put --root " + root + " --key xyzw --input " + (dir.path() / "short.bin").string() + " " + ns_flags());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("not hexadecimal"), std::string::npos) << r.output;
  r = cli("store get --root " + root + " --key 01 --output " + (dir.path() / "o").string() + " " + ns_flags(8));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("no such namespace"), std::string::npos) << r.output;
  r = cli("store get --root " + root + " --key 01 --output " + (dir.path() / "o").string() + " " + ns_flags() +
          " --rope fp8");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("not both"), std::string::npos) << r.output;
  r = cli("store gc --max-gib -1 --root " + root);
  EXPECT_NE(r.code, 0);
  r = cli("store ls --root " + (dir.path() / "missing").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("is not a directory"), std::string::npos) << r.output;
}

#endif
