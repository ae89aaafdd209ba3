// The real nvfp4mla binary: encode/decode round trips for every format, abi strings, calibrate,
// inspect, and error paths (one error line, non-zero exit, no output file left behind).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "nvfp4mla/calibration.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/config.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/safetensors.h"
#include "nvfp4mla/testing/random_tokens.h"
#include "support/cli_child.h"
#include "support/cli_runner.h"
#include "support/temp_dir.h"
#include "support/tensors.h"

#ifdef NVFP4MLA_CLI_PATH

using namespace nvfp4mla;
using nvfp4mla::testing::TempDir;

namespace {

using nvfp4mla::testing::expect_cli_error;
using nvfp4mla::testing::run_cli;
using nvfp4mla::testing::RunResult;
using nvfp4mla::testing::slurp;

using Tokens = nvfp4mla::testing::Bf16Tokens;
using nvfp4mla::testing::as_bf16_inputs;

using nvfp4mla::testing::tensor_of;

void write_tokens(const std::filesystem::path& p, const Tokens& t) {
  write_safetensors(p, {{"kv_c", tensor_of(DType::BF16, {t.count, kLatentDim}, t.kv_c)},
                        {"k_pe", tensor_of(DType::BF16, {t.count, kRopeDim}, t.k_pe)}});
}

std::vector<float> as_float(const std::vector<Bf16Bits>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = codec::bf16_decode(v[i].bits);
  return out;
}

std::string write_calibration(const TempDir& dir, const std::string& name) {
  const std::string json = Calibration::from_max_abs({0.5f, 2.0f, 5.25f}).to_json();
  dir.write(name, json);
  return name;
}

struct FormatCase {
  std::string flags;
  FormatOptions options;  // the same configuration, built in-process
};

std::vector<FormatCase> format_cases(const TempDir& dir) {
  const std::string cal = write_calibration(dir, "scales.json");
  return {
      {"--cache-dtype bf16", {.cache_dtype = CacheDtype::bf16}},
      {"--cache-dtype fp8_ds_mla", {.cache_dtype = CacheDtype::fp8_ds_mla}},
      {"", {}},
      {"--rope fp8", {.rope = RopeEncoding::fp8}},
      {"--rope fp8 --scale-mode dynamic", {.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic}},
      {"--scale-mode static --layer-scale 0.0042", {.scale_mode = ScaleMode::static_calibrated, .layer_scale = 0.0042f}},
      {"--rope fp8 --scales-file " + cal + " --layer 1",
       {.rope = RopeEncoding::fp8, .scales_file = (dir / cal).string(), .layer = 1}},
      {"--scales-file " + cal + " --layer 3 --unit-scale-for-missing-layer",
       {.scales_file = (dir / cal).string(), .layer = 3, .unit_scale_for_missing_layer = true}},
  };
}

}  // namespace

TEST(CliFormat, EncodeDecodeRoundTripEveryFormat) {
  TempDir dir;
  const Tokens tokens = as_bf16_inputs(nvfp4mla::testing::random_tokens(12, 11, -6, 4, /*non_finite=*/true));
  write_tokens(dir / "in.safetensors", tokens);
  for (const FormatCase& c : format_cases(dir)) {
    SCOPED_TRACE(c.flags);
    const FormatConfig cfg = FormatConfig::create(c.options);
    const RunResult enc = run_cli(dir, "encode " + c.flags + " --input in.safetensors --output rec.safetensors");
    ASSERT_EQ(enc.exit_code, 0) << enc.err;
    const TensorMap rec = read_safetensors(dir / "rec.safetensors");
    const Tensor& records = require_tensor(rec, "records", "rec", {DType::U8}, {tokens.count, cfg.record_bytes()});
    std::vector<uint8_t> want(cfg.record_bytes());
    for (int64_t i = 0; i < tokens.count; ++i) {
      record::encode(cfg.spec(), &tokens.kv_c[i * kLatentDim], &tokens.k_pe[i * kRopeDim], cfg.layer_scale(), want.data());
      ASSERT_EQ(0, std::memcmp(records.data.data() + i * cfg.record_bytes(), want.data(), want.size())) << i;
    }

    const RunResult dec = run_cli(dir, "decode " + c.flags + " --input rec.safetensors --output out.safetensors");
    ASSERT_EQ(dec.exit_code, 0) << dec.err;
    const TensorMap out = read_safetensors(dir / "out.safetensors");
    const Tensor& kv = require_tensor(out, "kv_c", "out", {DType::F32}, {tokens.count, kLatentDim});
    const Tensor& pe = require_tensor(out, "k_pe", "out", {DType::F32}, {tokens.count, kRopeDim});
    std::vector<float> want_kv(kLatentDim), want_pe(kRopeDim);
    for (int64_t i = 0; i < tokens.count; ++i) {
      record::decode(cfg.spec(), records.data.data() + i * cfg.record_bytes(), cfg.layer_scale(), want_kv.data(),
                     want_pe.data());
      ASSERT_EQ(0, std::memcmp(kv.as<float>() + i * kLatentDim, want_kv.data(), sizeof(float) * kLatentDim)) << i;
      ASSERT_EQ(0, std::memcmp(pe.as<float>() + i * kRopeDim, want_pe.data(), sizeof(float) * kRopeDim)) << i;
    }
    // The bf16 record is lossless for BF16 input.
    if (cfg.cache_dtype() == CacheDtype::bf16) {
      EXPECT_EQ(0, std::memcmp(kv.as<float>(), as_float(tokens.kv_c).data(), kv.data.size()));
      EXPECT_EQ(0, std::memcmp(pe.as<float>(), as_float(tokens.k_pe).data(), pe.data.size()));
    }
  }
}

TEST(CliFormat, AcceptsF32AndF16InputAndPagedRecords) {
  TempDir dir;
  const Tokens tokens = as_bf16_inputs(nvfp4mla::testing::random_tokens(8, 12));
  write_tokens(dir / "bf16.safetensors", tokens);
  // The same values as F32 (exact).
  write_safetensors(dir / "f32.safetensors", {{"kv_c", tensor_of(DType::F32, {8, kLatentDim}, as_float(tokens.kv_c))},
                                              {"k_pe", tensor_of(DType::F32, {8, kRopeDim}, as_float(tokens.k_pe))}});
  // FP16 input: a few exactly representable values.
  std::vector<uint16_t> h_kv(8 * kLatentDim), h_pe(8 * kRopeDim);
  std::vector<float> f_kv(h_kv.size()), f_pe(h_pe.size());
  for (size_t i = 0; i < h_kv.size(); ++i) h_kv[i] = static_cast<uint16_t>(0x3C00 + (i % 97)), f_kv[i] = codec::fp16_decode(h_kv[i]);
  for (size_t i = 0; i < h_pe.size(); ++i) h_pe[i] = static_cast<uint16_t>(0xB800 + (i % 13)), f_pe[i] = codec::fp16_decode(h_pe[i]);
  write_safetensors(dir / "f16.safetensors", {{"kv_c", tensor_of(DType::F16, {8, kLatentDim}, h_kv)},
                                              {"k_pe", tensor_of(DType::F16, {8, kRopeDim}, h_pe)}});
  write_safetensors(dir / "f16as32.safetensors", {{"kv_c", tensor_of(DType::F32, {8, kLatentDim}, f_kv)},
                                                  {"k_pe", tensor_of(DType::F32, {8, kRopeDim}, f_pe)}});
  const std::string flags = "--rope fp8 --scale-mode dynamic";
  for (const char* name : {"bf16", "f32", "f16", "f16as32"})
    ASSERT_EQ(run_cli(dir, "encode " + flags + " --input " + name + ".safetensors --output " + name + ".rec").exit_code, 0);
  EXPECT_EQ(slurp(dir / "bf16.rec"), slurp(dir / "f32.rec"));
  EXPECT_EQ(slurp(dir / "f16.rec"), slurp(dir / "f16as32.rec"));

  // Records laid out as a paged cache [pages, page_size, record_bytes] decode to the same rows.
  TensorMap rec = read_safetensors(dir / "bf16.rec");
  rec["records"].shape = {2, 4, 368};
  write_safetensors(dir / "paged.rec", rec);
  ASSERT_EQ(run_cli(dir, "decode " + flags + " --input bf16.rec --output flat.out").exit_code, 0);
  ASSERT_EQ(run_cli(dir, "decode " + flags + " --input paged.rec --output paged.out").exit_code, 0);
  EXPECT_EQ(read_safetensors(dir / "flat.out").at("kv_c").data, read_safetensors(dir / "paged.out").at("kv_c").data);
  EXPECT_EQ(read_safetensors(dir / "paged.out").at("kv_c").shape, (std::vector<int64_t>{8, kLatentDim}));
}

TEST(CliFormat, ZeroTokensRoundTrip) {
  TempDir dir;
  write_tokens(dir / "in.safetensors", Tokens{{}, {}, 0});
  ASSERT_EQ(run_cli(dir, "encode --input in.safetensors --output rec.safetensors").exit_code, 0);
  EXPECT_EQ(read_safetensors(dir / "rec.safetensors").at("records").shape, (std::vector<int64_t>{0, 432}));
  ASSERT_EQ(run_cli(dir, "decode --input rec.safetensors --output out.safetensors").exit_code, 0);
  EXPECT_EQ(read_safetensors(dir / "out.safetensors").at("kv_c").shape, (std::vector<int64_t>{0, kLatentDim}));
}

TEST(CliFormat, AbiStrings) {
  TempDir dir;
  const std::string cal = write_calibration(dir, "scales.json");
  const std::string sha = sha256_file_hex(dir / cal);
  struct Case {
    std::string args, env, expected;
  };
  const Case cases[] = {
      {"", "", "nvfp4_ds_mla:bf16-rope-432:implicit-unit-v1"},
      {"--rope fp8", "", "nvfp4_ds_mla:fp8-rope-368:implicit-unit-v1"},
      {"--rope fp8 --scale-mode dynamic", "", "nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1"},
      {"--scales-file " + cal, "", "nvfp4_ds_mla:bf16-rope-432:static-calibrated-v1:" + sha},
      {"--cache-dtype fp8_ds_mla", "", "fp8_ds_mla:656:v1"},
      {"--cache-dtype bf16", "", "bf16:1152:v1"},
      {"--compat vllm", "", "vllm-default-v1"},
      {"--compat vllm --rope fp8", "", "vllm-default-v1"},
      {"--compat vllm --cache-dtype fp8_ds_mla", "", "vllm-default-v1"},
      {"--compat vllm --rope fp8 --scale-mode dynamic", "", "nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1"},
      {"--compat vllm --rope fp8 --scales-file " + cal, "", "nvfp4_ds_mla:fp8-rope-368:static-calibrated-v1:" + sha},
      // The vLLM environment applies; an explicit flag wins over it.
      {"", "KV_FP8_ROPE=1 VLLM_NVFP4_MLA_DYNAMIC_SCALE=1", "nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1"},
      {"--scale-mode implicit", "KV_FP8_ROPE=1 VLLM_NVFP4_MLA_DYNAMIC_SCALE=1", "nvfp4_ds_mla:fp8-rope-368:implicit-unit-v1"},
      {"", "VLLM_NVFP4_MLA_SCALES_FILE=" + cal, "nvfp4_ds_mla:bf16-rope-432:static-calibrated-v1:" + sha},
  };
  for (const Case& c : cases) {
    const RunResult r = run_cli(dir, "abi " + c.args, c.env);
    EXPECT_EQ(r.exit_code, 0) << c.args << ": " << r.err;
    EXPECT_EQ(r.out, c.expected + "\n") << c.args << " " << c.env;
  }
}

// The largest |kv_c| of each layer sits at its first or last element (BF16 and F32 inputs),
// and the expected scale follows FORMAT.md section 8 on its own: s_l = max_abs x C2688 rounded
// once to fp32, with C2688 the fp32 of bits 0x39C30C31 (the product of two floats is exact in
// double, so rounding it to float is the one correctly rounded fp32 multiply).
TEST(CliFormat, CalibrateWritesScalesThatParseBackExactly) {
  TempDir dir;
  // Layers: maximum at the first element; at the last element (negative, BF16); at the last
  // element. All values are exact in BF16. A k_pe tensor rides along (ignored).
  const float max_abs[3] = {0.01953125f, 1.3125f, 5.25f};
  const int64_t tokens = 5, n = tokens * kLatentDim;
  TensorMap acts;
  for (int layer = 0; layer < 3; ++layer) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = max_abs[layer] * static_cast<float>(i % 7) / 8.0f;  // at most 3/4 of the maximum
    if (layer == 0) v[0] = max_abs[0];
    if (layer == 1) v[n - 1] = -max_abs[1];
    if (layer == 2) v[n - 1] = max_abs[2];
    const std::string name = "layers." + std::to_string(layer) + ".kv_c";
    if (layer == 1) {
      std::vector<uint16_t> b(v.size());
      for (size_t i = 0; i < v.size(); ++i) b[i] = codec::bf16_encode_rn(v[i]);
      acts[name] = tensor_of(DType::BF16, {tokens, kLatentDim}, b);
    } else {
      acts[name] = tensor_of(DType::F32, {tokens, kLatentDim}, v);
    }
  }
  acts["layers.0.k_pe"] = Tensor::zeros(DType::F32, {tokens, kRopeDim});
  write_safetensors(dir / "acts.safetensors", acts);
  const RunResult r = run_cli(dir, "calibrate --input acts.safetensors --output scales.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Calibration cal = Calibration::load(dir / "scales.json");
  ASSERT_EQ(cal.num_layers(), 3);
  const uint32_t c2688_bits = 0x39C30C31u;
  float c2688;
  std::memcpy(&c2688, &c2688_bits, 4);
  for (int layer = 0; layer < 3; ++layer) {
    EXPECT_EQ(cal.max_abs[layer], max_abs[layer]) << layer;
    const float want = static_cast<float>(static_cast<double>(max_abs[layer]) * static_cast<double>(c2688));
    EXPECT_EQ(cal.scales[layer], want) << layer;
  }
  EXPECT_NE(r.out.find(sha256_file_hex(dir / "scales.json")), std::string::npos) << r.out;
  // The file serves static mode directly.
  EXPECT_EQ(run_cli(dir, "abi --scales-file scales.json").exit_code, 0);
}

TEST(CliFormat, InspectShowsScalesAndErrorAgainstTheOriginal) {
  TempDir dir;
  const Tokens tokens = as_bf16_inputs(nvfp4mla::testing::random_tokens(16, 13));
  write_tokens(dir / "in.safetensors", tokens);
  ASSERT_EQ(run_cli(dir, "encode --rope fp8 --input in.safetensors --output rec.safetensors").exit_code, 0);
  // Count the E4M3-subnormal and zero group scales of each record from its bytes, and pick a
  // small-magnitude token whose unit-scale group scales fall into subnormals.
  const TensorMap rec = read_safetensors(dir / "rec.safetensors");
  auto scale_counts = [&](int64_t i) {
    const uint8_t* scales = rec.at("records").data.data() + i * 368 + layout::nvfp4::kGroupScaleOffset;
    int subnormal = 0, zero = 0;
    for (int g = 0; g < layout::nvfp4::kNumGroups; ++g) {
      if ((scales[g] & 0x7F) == 0) ++zero;
      else if ((scales[g] & 0x78) == 0) ++subnormal;
    }
    return "group scales in E4M3 subnormals: " + std::to_string(subnormal) + ", zero: " + std::to_string(zero);
  };
  int64_t small = -1;
  for (int64_t i = 0; i < tokens.count && small < 0; ++i)
    if (scale_counts(i).find("subnormals: 0,") == std::string::npos) small = i;
  ASSERT_GE(small, 0) << "the seed should produce a token with subnormal group scales";
  const int64_t other = small == 0 ? 1 : 0;
  const std::string selection = std::to_string(other) + "," + std::to_string(small) + "-" + std::to_string(small);
  const RunResult r =
      run_cli(dir, "inspect --rope fp8 --input rec.safetensors --records " + selection + " --original in.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string& want : {"outer scale: 1", "RoPE scale:", "kv_c max abs error", "k_pe max abs error",
                                  "all 2 shown records"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  size_t shown = 0;
  for (size_t at = r.out.find("\nrecord "); at != std::string::npos; at = r.out.find("\nrecord ", at + 1)) ++shown;
  EXPECT_EQ(shown, 2u) << r.out;
  // Each record's printed counts match its bytes.
  for (int64_t i : {other, small}) {
    const size_t at = r.out.find("record " + std::to_string(i) + "\n");
    ASSERT_NE(at, std::string::npos) << r.out;
    const size_t next = r.out.find("record ", at + 1);
    const size_t line = r.out.find(scale_counts(i), at);
    EXPECT_TRUE(line != std::string::npos && line < next) << scale_counts(i) << "\n" << r.out;
  }

  // Default selection: the first records; fp8_ds_mla shows its tile scales.
  ASSERT_EQ(run_cli(dir, "encode --cache-dtype fp8_ds_mla --input in.safetensors --output fp8.safetensors").exit_code, 0);
  const RunResult f = run_cli(dir, "inspect --cache-dtype fp8_ds_mla --input fp8.safetensors");
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE(f.out.find("record 3\n"), std::string::npos);
  EXPECT_EQ(f.out.find("record 4\n"), std::string::npos);
  EXPECT_NE(f.out.find("tile scales"), std::string::npos);
}

TEST(CliFormat, ErrorsGiveOneLineAndLeaveNoOutput) {
  TempDir dir;
  const Tokens tokens = as_bf16_inputs(nvfp4mla::testing::random_tokens(4, 14));
  write_tokens(dir / "in.safetensors", tokens);
  // Inputs with one thing wrong each.
  write_safetensors(dir / "wrong_name.safetensors", {{"kv", tensor_of(DType::BF16, {4, kLatentDim}, tokens.kv_c)},
                                                     {"k_pe", tensor_of(DType::BF16, {4, kRopeDim}, tokens.k_pe)}});
  write_safetensors(dir / "wrong_dtype.safetensors", {{"kv_c", Tensor::zeros(DType::I32, {4, kLatentDim})},
                                                      {"k_pe", tensor_of(DType::BF16, {4, kRopeDim}, tokens.k_pe)}});
  write_safetensors(dir / "wrong_shape.safetensors", {{"kv_c", Tensor::zeros(DType::BF16, {4, 500})},
                                                      {"k_pe", tensor_of(DType::BF16, {4, kRopeDim}, tokens.k_pe)}});
  write_safetensors(dir / "wrong_rows.safetensors", {{"kv_c", tensor_of(DType::BF16, {4, kLatentDim}, tokens.kv_c)},
                                                     {"k_pe", Tensor::zeros(DType::BF16, {3, kRopeDim})}});
  const std::string whole = slurp(dir / "in.safetensors");
  dir.write("truncated.safetensors", whole.substr(0, whole.size() - 100));
  ASSERT_EQ(run_cli(dir, "encode --input in.safetensors --output rec432.safetensors").exit_code, 0);
  ASSERT_EQ(run_cli(dir, "encode --rope fp8 --scale-mode dynamic --input in.safetensors --output dyn.safetensors").exit_code, 0);
  ASSERT_EQ(run_cli(dir, "encode --scale-mode static --layer-scale 0.5 --input in.safetensors --output st.safetensors").exit_code, 0);
  write_calibration(dir, "scales.json");
  dir.write("bad_scales.json", "{\"format\": \"nope\"}");
  write_safetensors(dir / "acts_gap.safetensors", {{"layers.0.kv_c", Tensor::zeros(DType::F32, {2, kLatentDim})},
                                                   {"layers.2.kv_c", Tensor::zeros(DType::F32, {2, kLatentDim})}});
  TensorMap acts_shape;
  acts_shape["layers.0.kv_c"] = Tensor::zeros(DType::F32, {2, 256});
  write_safetensors(dir / "acts_shape.safetensors", acts_shape);
  TensorMap acts_name;
  acts_name["layers.01.kv_c"] = Tensor::zeros(DType::F32, {2, kLatentDim});
  write_safetensors(dir / "acts_name.safetensors", acts_name);
  TensorMap acts_empty;
  acts_empty["layers.0.kv_c"] = Tensor::zeros(DType::BF16, {0, kLatentDim});
  write_safetensors(dir / "acts_empty.safetensors", acts_empty);
  TensorMap acts_zero;
  acts_zero["layers.0.kv_c"] = Tensor::zeros(DType::F32, {2, kLatentDim});
  write_safetensors(dir / "acts_zero.safetensors", acts_zero);

  const std::string enc = "encode --output out.safetensors --input ";
  expect_cli_error(dir, enc + "absent.safetensors", "absent.safetensors: no such file");
  expect_cli_error(dir, enc + "wrong_name.safetensors", "no tensor named 'kv_c'");
  expect_cli_error(dir, enc + "wrong_dtype.safetensors", "dtype I32");
  expect_cli_error(dir, enc + "wrong_shape.safetensors", "shape [4, 500]; expected [N, 512]");
  expect_cli_error(dir, enc + "wrong_rows.safetensors", "kv_c has 4 rows but k_pe has 3");
  expect_cli_error(dir, enc + "truncated.safetensors", "truncated");
  expect_cli_error(dir, enc + "in.safetensors --cache-dtype fp8_ds_mla --rope bf16", "--rope applies to nvfp4_ds_mla only");
  expect_cli_error(dir, enc + "in.safetensors --scale-mode dynamic --rope bf16", "368-byte record");
  expect_cli_error(dir, enc + "in.safetensors --scale-mode dynamic", "368-byte record", "KV_FP8_ROPE=0");
  expect_cli_error(dir, enc + "in.safetensors --cache-dtype fp4", "unknown cache dtype 'fp4'");
  expect_cli_error(dir, enc + "in.safetensors --scale-mode static", "needs a calibration");
  expect_cli_error(dir, enc + "in.safetensors --scale-mode static --layer-scale 0", "finite positive");
  expect_cli_error(dir, enc + "in.safetensors --scales-file scales.json", "--layer");
  expect_cli_error(dir, enc + "in.safetensors --scales-file scales.json --layer 3", "layer 3 is outside the calibration");
  expect_cli_error(dir, enc + "in.safetensors --scales-file bad_scales.json --layer 0", "bad_scales.json");
  expect_cli_error(dir, enc + "in.safetensors --scales-file absent.json --layer 0", "absent.json");
  expect_cli_error(dir, "encode --input in.safetensors --output no-such-folder/out.safetensors",
                   "cannot create a temporary file");
  expect_cli_error(dir, "encode --input in.safetensors", "--output is required");
  expect_cli_error(dir, enc + "in.safetensors --bogus", "--bogus");

  const std::string dec = "decode --output out.safetensors --input ";
  expect_cli_error(dir, dec + "rec432.safetensors --rope fp8", "records are 432 bytes wide");
  expect_cli_error(dir, dec + "rec432.safetensors --rope fp8", "expects 368-byte records");
  expect_cli_error(dir, dec + "in.safetensors", "no tensor named 'records'");
  expect_cli_error(dir, dec + "dyn.safetensors --rope fp8", "written as nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1");
  expect_cli_error(dir, dec + "st.safetensors --scale-mode static --layer-scale 0.25", "outer scale 0.5");
  expect_cli_error(dir, dec + "truncated.safetensors", "truncated");

  expect_cli_error(dir, "inspect --input rec432.safetensors --records 9", "record 9 does not exist");
  // Beyond int64: was std::stoll's out_of_range, an "internal error" (exit 2).
  expect_cli_error(dir, "inspect --input rec432.safetensors --records 99999999999999999999",
                   "record 99999999999999999999 does not exist");
  expect_cli_error(dir, "inspect --input rec432.safetensors --records 0-99999999999999999999",
                   "record 99999999999999999999 does not exist");
  expect_cli_error(dir, "inspect --input rec432.safetensors --records 2-1", "ends before it starts");
  expect_cli_error(dir, "inspect --input rec432.safetensors --records x", "not a list of record indices");
  expect_cli_error(dir, "inspect --input rec432.safetensors --original wrong_rows.safetensors", "4 rows but k_pe has 3");
  expect_cli_error(dir, "abi --scale-mode static --layer-scale 0.5", "--scales-file");
  expect_cli_error(dir, "abi --compat other", "--compat");

  const std::string cal = "calibrate --output cal.json --input ";
  expect_cli_error(dir, cal + "absent.safetensors", "no such file");
  expect_cli_error(dir, cal + "in.safetensors", "no tensors named layers.<i>.kv_c");
  expect_cli_error(dir, cal + "acts_gap.safetensors", "layers.1.kv_c is missing");
  expect_cli_error(dir, cal + "acts_shape.safetensors", "shape [2, 256]; expected [N, 512]");
  expect_cli_error(dir, cal + "acts_name.safetensors", "'layers.01.kv_c' does not name a layer");
  expect_cli_error(dir, cal + "acts_zero.safetensors", "all zeros");
  expect_cli_error(dir, cal + "acts_empty.safetensors", "is empty");
  expect_cli_error(dir, cal + "truncated.safetensors", "truncated");
}

// Records read in another scale mode decoded to garbage: a bare --layer-scale (no identity) skipped
// the identity check, and the stored static outer scale was compared in static mode only.
TEST(CliFormat, RecordsOfAnotherScaleModeAreRefused) {
  TempDir dir;
  write_tokens(dir / "in.safetensors", as_bf16_inputs(nvfp4mla::testing::random_tokens(4, 21)));
  write_calibration(dir, "scales.json");
  const std::string enc = "encode --input in.safetensors --output ";
  ASSERT_EQ(run_cli(dir, enc + "dyn.safetensors --rope fp8 --scale-mode dynamic").exit_code, 0);
  ASSERT_EQ(run_cli(dir, enc + "unit.safetensors --rope fp8").exit_code, 0);
  ASSERT_EQ(run_cli(dir, enc + "bare.safetensors --scale-mode static --layer-scale 0.5").exit_code, 0);
  ASSERT_EQ(run_cli(dir, enc + "cal.safetensors --scales-file scales.json --layer 1").exit_code, 0);

  const std::string dec = "decode --output out.safetensors --input ";
  // Dynamic or implicit records read with a bare static scale.
  expect_cli_error(dir, dec + "dyn.safetensors --rope fp8 --layer-scale 3",
                   "written as nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1");
  expect_cli_error(dir, dec + "unit.safetensors --rope fp8 --scale-mode static --layer-scale 1",
                   "written as nvfp4_ds_mla:fp8-rope-368:implicit-unit-v1");
  expect_cli_error(dir, "inspect --rope fp8 --layer-scale 3 --input dyn.safetensors",
                   "written as nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1");
  // Static records (bare scale: no identity, only the outer scale) read in another mode.
  expect_cli_error(dir, dec + "bare.safetensors", "written with the static outer scale 0.5");
  expect_cli_error(dir, "inspect --input bare.safetensors", "written with the static outer scale 0.5");
  // Static records read with a bare scale: the scale they were written with is accepted, another not.
  char scale[32];
  std::snprintf(scale, sizeof scale, "%.9g", Calibration::from_max_abs({0.5f, 2.0f, 5.25f}).scales[1]);
  EXPECT_EQ(run_cli(dir, dec + "cal.safetensors --layer-scale " + scale).exit_code, 0);
  EXPECT_EQ(run_cli(dir, dec + "bare.safetensors --layer-scale 0.5").exit_code, 0);
  expect_cli_error(dir, dec + "cal.safetensors --layer-scale 0.5", "static outer scale " + std::string(scale));
}

// Issue 20 item 5: under `ulimit -f`, SIGXFSZ killed encode and decode (exit 153), and decode
// left its partial temporary .<output>.tmp-<pid>-... behind.
TEST(CliFormat, FileSizeLimitIsAnErrorAndLeavesNoTemporary) {
  TempDir dir;
  write_tokens(dir / "in.safetensors", as_bf16_inputs(nvfp4mla::testing::random_tokens(64, 3)));
  ASSERT_EQ(run_cli(dir, "encode --input in.safetensors --output rec.safetensors").exit_code, 0);
  const auto before = nvfp4mla::testing::dir_listing(dir);
  // Records are 432 bytes a token, decoded values 2304: a 16 KiB limit stops both part way.
  const nvfp4mla::testing::ChildLimits limit{.file_size_bytes = 16 * 1024};
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"encode", "--input", "in.safetensors", "--output", "out.safetensors"},
        std::vector<std::string>{"decode", "--input", "rec.safetensors", "--output", "out.safetensors"}}) {
    SCOPED_TRACE(args[0]);
    const auto r = nvfp4mla::testing::run_cli_child(dir.path(), args, limit);
    nvfp4mla::testing::expect_clean_failure(r, "File too large");
    EXPECT_EQ(nvfp4mla::testing::dir_listing(dir), before);
  }
}

// Issue 20 item 7: a directory as --scales-file and 1e999 in a calibration file were
// "internal error" (exit 2); a FIFO as --scales-file waited forever.
TEST(CliFormat, UnreadableCalibrationIsACleanError) {
  TempDir dir;
  write_tokens(dir / "in.safetensors", as_bf16_inputs(nvfp4mla::testing::random_tokens(4, 5)));
  std::filesystem::create_directory(dir / "folder.json");
  dir.write("overflow.json", R"({"format": "nvfp4_ds_mla_outer_scale_v1", "num_layers": 1, "latent_dim": 512,
                                 "denominator": 2688.0, "scales": [1e999], "max_abs": [1.0]})");
  ASSERT_EQ(::mkfifo((dir / "fifo.json").c_str(), 0600), 0);
  for (const auto& [file, needle] : std::vector<std::pair<std::string, std::string>>{
           {"folder.json", "is a directory"}, {"overflow.json", "not valid JSON"}, {"fifo.json", "is a FIFO"}}) {
    SCOPED_TRACE(file);
    const auto r = nvfp4mla::testing::run_cli_child(
        dir.path(), {"encode", "--output", "out.safetensors", "--input", "in.safetensors", "--layer", "0",
                     "--scales-file", file},
        {.timeout_s = 20});
    nvfp4mla::testing::expect_clean_failure(r, needle);
  }
}

#endif  // NVFP4MLA_CLI_PATH
