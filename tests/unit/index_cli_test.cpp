// The real nvfp4mla binary: `index encode` for BF16, F16 and F32 keys (records equal to the
// format module's recipe), an empty key set, and malformed inputs (one error line, non-zero
// exit, no output or temporary file left behind).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/index_key.h"
#include "nvfp4mla/safetensors.h"
#include "support/cli_runner.h"
#include "nvfp4mla/testing/index_data.h"
#include "support/temp_dir.h"
#include "support/tensors.h"

#ifdef NVFP4MLA_CLI_PATH

using namespace nvfp4mla;
using nvfp4mla::testing::expect_cli_error;
using nvfp4mla::testing::run_cli;
using nvfp4mla::testing::tensor_of;
using nvfp4mla::testing::TempDir;

namespace {

template <class In>
void check_encode(DType dtype, const std::vector<In>& keys, int64_t n) {
  SCOPED_TRACE(to_string(dtype));
  TempDir dir;
  write_safetensors(dir / "keys.safetensors", {{"keys", tensor_of(dtype, {n, 128}, keys)}});
  const auto r = run_cli(dir, "index encode --input keys.safetensors --output records.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const TensorMap out = read_safetensors(dir / "records.safetensors");
  const Tensor& rec = require_tensor(out, "records", "records.safetensors", {DType::U8}, {n, 132});
  for (int64_t t = 0; t < n; ++t) {
    uint8_t want[132];
    index_key::encode_record(keys.data() + t * 128, want);
    ASSERT_EQ(std::memcmp(want, rec.data.data() + t * 132, 132), 0) << "key " << t;
  }
}

TEST(IndexCli, EncodeEveryInputType) {
  const int64_t n = 300;
  const auto f32 = nvfp4mla::testing::random_index_keys(n, 1, /*non_finite=*/true);
  check_encode(DType::F32, f32, n);
  check_encode(DType::BF16, nvfp4mla::testing::to_bf16_keys(f32), n);
  std::mt19937_64 rng(2);
  std::vector<Fp16Bits> f16(n * 128);
  for (auto& h : f16) h.bits = static_cast<uint16_t>(rng());
  check_encode(DType::F16, f16, n);
  check_encode(DType::F32, std::vector<float>{}, 0);
}

TEST(IndexCli, MalformedInputsLeaveNothing) {
  TempDir dir;
  write_safetensors(dir / "narrow.safetensors", {{"keys", tensor_of(DType::F32, {2, 127}, std::vector<float>(254, 1.0f))}});
  write_safetensors(dir / "ints.safetensors", {{"keys", tensor_of(DType::I32, {1, 128}, std::vector<int32_t>(128, 1))}});
  write_safetensors(dir / "other.safetensors", {{"kv_c", tensor_of(DType::F32, {1, 128}, std::vector<float>(128, 1.0f))}});
  dir.write("junk.safetensors", "not a safetensors file");
  const std::string out = " --output records.safetensors";
  expect_cli_error(dir, "index encode --input narrow.safetensors" + out, "keys");
  expect_cli_error(dir, "index encode --input ints.safetensors" + out, "keys");
  expect_cli_error(dir, "index encode --input other.safetensors" + out, "keys");
  expect_cli_error(dir, "index encode --input junk.safetensors" + out, "junk.safetensors");
  expect_cli_error(dir, "index encode --input missing.safetensors" + out, "missing.safetensors");
  expect_cli_error(dir, "index encode --input narrow.safetensors", "--output");
}

}  // namespace

#endif
