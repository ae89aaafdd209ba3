// nvfp4mla attend --device cpu: the CLI path equals the library reference, and its inputs are
// validated.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "nvfp4mla/safetensors.h"
#include "nvfp4mla/sparse_mla.h"
#include "support/attention_problem.h"
#include "support/cli_runner.h"
#include "support/temp_dir.h"

#ifdef NVFP4MLA_CLI_PATH

using namespace nvfp4mla;
using nvfp4mla::testing::expect_cli_error;
using nvfp4mla::testing::run_cli;
using nvfp4mla::testing::TempDir;

namespace {

Tensor bytes_tensor(DType dt, std::vector<int64_t> shape, const void* data) {
  Tensor t = Tensor::zeros(dt, std::move(shape));
  std::memcpy(t.data.data(), data, t.data.size());
  return t;
}

// Writes the problem's cache, query and indices files into `dir`.
void write_problem(const TempDir& dir, const nvfp4mla::testing::AttentionProblem& p) {
  const int rb = p.spec.record_bytes();
  write_safetensors(dir / "cache.safetensors", {{"records", bytes_tensor(DType::U8, {p.capacity, rb}, p.cache.data())}});
  write_safetensors(dir / "q.safetensors", {{"q", bytes_tensor(DType::BF16, {p.rows, p.heads, kQkDim}, p.q.data())}});
  TensorMap idx{{"indices", bytes_tensor(DType::I32, {p.rows, p.topk}, p.indices.data())}};
  if (!p.topk_length.empty()) idx["topk_length"] = bytes_tensor(DType::I32, {p.rows}, p.topk_length.data());
  write_safetensors(dir / "idx.safetensors", idx);
}

}  // namespace

TEST(CliAttend, CpuDeviceEqualsLibraryReference) {
  TempDir dir;
  nvfp4mla::testing::ProblemOptions opt;
  opt.lengths = true;
  const RecordSpec spec{CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::dynamic};
  const auto p = nvfp4mla::testing::make_problem(spec, 4, 8, 96, 3, opt);
  write_problem(dir, p);
  const auto r = run_cli(dir, "attend --cache-dtype nvfp4_ds_mla --rope fp8 --scale-mode dynamic --cache cache.safetensors "
                              "--query q.safetensors --indices idx.safetensors --sm-scale 0.041666668 --lse base2 "
                              "--output o.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = read_safetensors(dir / "o.safetensors");
  std::vector<float> want_out(size_t(p.rows) * p.heads * kLatentDim), want_lse(size_t(p.rows) * p.heads);
  auto a = p.host_args();
  a.sm_scale = 0.041666668f;
  a.lse_base = LseBase::base2;
  sparse_mla_reference(spec, a, want_out.data(), want_lse.data());
  const Tensor& got_out = require_tensor(out, "out", "o", {DType::F32}, {p.rows, p.heads, kLatentDim});
  const Tensor& got_lse = require_tensor(out, "lse", "o", {DType::F32}, {p.rows, p.heads});
  EXPECT_EQ(std::memcmp(got_out.data.data(), want_out.data(), got_out.data.size()), 0);
  EXPECT_EQ(std::memcmp(got_lse.data.data(), want_lse.data(), got_lse.data.size()), 0);
  EXPECT_TRUE(std::isinf(want_lse[0]) && want_lse[0] < 0);  // row 0 has topk_length 0
}

TEST(CliAttend, RejectsInconsistentInputs) {
  TempDir dir;
  const auto p = nvfp4mla::testing::make_problem(kSpecNvfp4Bf16Rope, 2, 8, 64, 4);
  write_problem(dir, p);
  const std::string files = " --query q.safetensors --indices idx.safetensors --sm-scale 0.04 --output o.safetensors";
  expect_cli_error(dir, "attend --rope fp8 --cache cache.safetensors" + files, "bytes wide");
  expect_cli_error(dir, "attend --cache missing.safetensors" + files, "missing.safetensors");
  expect_cli_error(dir, "attend --cache q.safetensors" + files, "records");
  expect_cli_error(dir, "attend --cache cache.safetensors --query idx.safetensors --indices idx.safetensors --sm-scale 0.04 --output o.safetensors", "'q'");
  expect_cli_error(dir, "attend --cache cache.safetensors --query q.safetensors --indices idx.safetensors --sm-scale -1 --output o.safetensors", "--sm-scale");
  // Issue 20 item 9: q of shape [0, 2^32 + 1, 576] holds no bytes, and its head count was cut
  // to 1 on the way into an int.
  write_safetensors(dir / "wide_q.safetensors", {{"q", Tensor::zeros(DType::BF16, {0, (int64_t(1) << 32) + 1, kQkDim})}});
  write_safetensors(dir / "no_rows.safetensors", {{"indices", Tensor::zeros(DType::I32, {0, 4})}});
  expect_cli_error(dir, "attend --cache cache.safetensors --query wide_q.safetensors --indices no_rows.safetensors --sm-scale 0.04 --output o.safetensors", "number of heads of q is 4294967297");
}

#endif  // NVFP4MLA_CLI_PATH
