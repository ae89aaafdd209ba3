// FormatConfig: every validation rule, flag/environment precedence, record identities.
#include <gtest/gtest.h>

#include <string>

#include "nvfp4mla/config.h"
#include "nvfp4mla/error.h"
#include "support/temp_dir.h"

using namespace nvfp4mla;
using nvfp4mla::testing::TempDir;

namespace {

std::string calibration_json(int layers, double scale = 0.001) {
  std::string s = R"({"format": "nvfp4_ds_mla_outer_scale_v1", "num_layers": )" + std::to_string(layers) +
                  R"(, "latent_dim": 512, "denominator": 2688.0, "scales": [)";
  std::string m;
  for (int i = 0; i < layers; ++i) {
    s += (i ? ", " : "") + std::to_string(scale * (i + 1));
    m += (i ? ", " : "") + std::to_string(scale * (i + 1) * 2688);
  }
  return s + "], \"max_abs\": [" + m + "]}";
}

// Expect construction to fail with a message containing `needle`.
void expect_error(const FormatOptions& o, const EnvironmentSettings& env, const std::string& needle) {
  try {
    (void)FormatConfig::create(o, env);
    FAIL() << "expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(FormatConfig, DefaultsAreNvfp4Bf16RopeImplicit) {
  const auto c = FormatConfig::create({});
  EXPECT_EQ(c.cache_dtype(), CacheDtype::nvfp4_ds_mla);
  EXPECT_EQ(c.rope(), RopeEncoding::bf16);
  EXPECT_EQ(c.scale_mode(), ScaleMode::implicit);
  EXPECT_EQ(c.record_bytes(), 432);
  EXPECT_EQ(c.layer_scale(), 1.0f);
}

TEST(FormatConfig, IdentityStrings) {
  TempDir dir;
  const std::string cal_text = calibration_json(3);
  const auto cal = dir.write("scales.json", cal_text);
  const std::string sha = sha256_hex(cal_text.data(), cal_text.size());
  struct Case { FormatOptions o; std::string native, vllm; };
  const Case cases[] = {
      {{.cache_dtype = CacheDtype::bf16}, "bf16:1152:v1", "vllm-default-v1"},
      {{.cache_dtype = CacheDtype::fp8_ds_mla}, "fp8_ds_mla:656:v1", "vllm-default-v1"},
      {{.rope = RopeEncoding::fp8}, "nvfp4_ds_mla:fp8-rope-368:implicit-unit-v1", "vllm-default-v1"},
      {{.rope = RopeEncoding::bf16}, "nvfp4_ds_mla:bf16-rope-432:implicit-unit-v1", "vllm-default-v1"},
      {{.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic}, "nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1",
       "nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1"},
      {{.rope = RopeEncoding::fp8, .scales_file = cal.string()}, "nvfp4_ds_mla:fp8-rope-368:static-calibrated-v1:" + sha,
       "nvfp4_ds_mla:fp8-rope-368:static-calibrated-v1:" + sha},
      {{.rope = RopeEncoding::bf16, .scale_mode = ScaleMode::static_calibrated, .scales_file = cal.string(), .layer = 1},
       "nvfp4_ds_mla:bf16-rope-432:static-calibrated-v1:" + sha, "nvfp4_ds_mla:bf16-rope-432:static-calibrated-v1:" + sha},
  };
  for (const auto& k : cases) {
    const auto c = FormatConfig::create(k.o);
    EXPECT_EQ(c.identity(), k.native);
    EXPECT_EQ(c.identity(IdentityCompat::vllm), k.vllm);
  }
  EXPECT_EQ(sha.size(), 64u);
  EXPECT_EQ(sha.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(FormatConfig, StaticIdentityChangesWithCalibrationBytes) {
  TempDir dir;
  const auto a = dir.write("a.json", calibration_json(2, 0.001));
  const auto b = dir.write("b.json", calibration_json(2, 0.002));
  const auto ca = FormatConfig::create({.scales_file = a.string()});
  const auto cb = FormatConfig::create({.scales_file = b.string()});
  EXPECT_NE(ca.identity(), cb.identity());
}

TEST(FormatConfig, BareLayerScaleHasNoIdentity) {
  const auto c = FormatConfig::create({.layer_scale = 0.01f});
  EXPECT_EQ(c.scale_mode(), ScaleMode::static_calibrated);
  EXPECT_EQ(c.layer_scale(), 0.01f);
  EXPECT_THROW((void)c.identity(), Error);
}

TEST(FormatConfig, ValidationRules) {
  TempDir dir;
  const auto cal = dir.write("scales.json", calibration_json(3)).string();
  const EnvironmentSettings none;
  // dynamic and a scales file are mutually exclusive (flags and environment)
  expect_error({.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic, .scales_file = cal}, none, "mutually exclusive");
  expect_error({.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic, .layer_scale = 0.5f}, none, "mutually exclusive");
  expect_error({}, {.dynamic_scale = "1", .fp8_rope = "1", .scales_file = cal}, "mutually exclusive");
  // dynamic requires the 368-byte record
  expect_error({.rope = RopeEncoding::bf16, .scale_mode = ScaleMode::dynamic}, none, "368-byte");
  expect_error({.scale_mode = ScaleMode::dynamic}, none, "--rope fp8");
  expect_error({}, {.dynamic_scale = "1"}, "368-byte");
  // static requires a valid, readable calibration file
  expect_error({.scale_mode = ScaleMode::static_calibrated}, none, "needs a calibration");
  expect_error({.scales_file = (dir / "missing.json").string()}, none, "cannot read calibration file");
  expect_error({.scales_file = dir.write("bad.json", "{").string()}, none, "not valid JSON");
  expect_error({.scales_file = cal, .layer = 3}, none, "outside the calibration");
  expect_error({.scales_file = cal, .layer = -1}, none, "negative");
  expect_error({.scales_file = cal, .layer_scale = 1.0f}, none, "not both");
  expect_error({.layer_scale = 0.0f}, none, "finite positive");
  expect_error({.layer_scale = -2.0f}, none, "finite positive");
  // implicit mode with calibration inputs
  expect_error({.scale_mode = ScaleMode::implicit, .scales_file = cal}, none, "need --scale-mode static");
  expect_error({.layer = 2}, none, "need --scale-mode static");
  // RoPE option or scale mode on a non-nvfp4 dtype
  for (auto d : {CacheDtype::fp8_ds_mla, CacheDtype::bf16}) {
    expect_error({.cache_dtype = d, .rope = RopeEncoding::fp8}, none, "--rope applies to nvfp4_ds_mla only");
    expect_error({.cache_dtype = d, .rope = RopeEncoding::bf16}, none, "--rope applies to nvfp4_ds_mla only");
    expect_error({.cache_dtype = d, .scale_mode = ScaleMode::implicit}, none, "--scale-mode applies");
    expect_error({.cache_dtype = d, .scale_mode = ScaleMode::dynamic}, none, "--scale-mode applies");
    expect_error({.cache_dtype = d, .scales_file = cal}, none, "static mode only");
  }
  // malformed environment values
  expect_error({}, {.dynamic_scale = "yes please"}, "VLLM_NVFP4_MLA_DYNAMIC_SCALE");
  expect_error({}, {.fp8_rope = "2"}, "KV_FP8_ROPE");
}

TEST(FormatConfig, MissingLayerUsesUnitScaleOnlyWhenAsked) {
  TempDir dir;
  const auto cal = dir.write("scales.json", calibration_json(3)).string();
  const auto c = FormatConfig::create({.scales_file = cal, .layer = 3, .unit_scale_for_missing_layer = true});
  EXPECT_EQ(c.layer_scale(), 1.0f);
  const auto d = FormatConfig::create({.scales_file = cal, .layer = 1});
  EXPECT_FLOAT_EQ(d.layer_scale(), 0.002f);
  EXPECT_THROW((void)d.layer_scale_for(7), Error);
  const auto e = FormatConfig::create({.scales_file = cal});
  EXPECT_THROW((void)e.layer_scale(), Error);  // no layer chosen
  EXPECT_FLOAT_EQ(e.layer_scale_for(2), 0.003f);
}

TEST(FormatConfig, FlagsWinOverEnvironmentWhichWinsOverDefaults) {
  TempDir dir;
  const auto cal = dir.write("scales.json", calibration_json(3)).string();
  // environment over defaults
  auto c = FormatConfig::create({}, {.dynamic_scale = "1", .fp8_rope = "1"});
  EXPECT_EQ(c.scale_mode(), ScaleMode::dynamic);
  EXPECT_EQ(c.record_bytes(), 368);
  c = FormatConfig::create({.layer = 0}, {.scales_file = cal});
  EXPECT_EQ(c.scale_mode(), ScaleMode::static_calibrated);
  EXPECT_FLOAT_EQ(c.layer_scale(), 0.001f);
  c = FormatConfig::create({}, {.dynamic_scale = "0", .fp8_rope = " 0 "});
  EXPECT_EQ(c.scale_mode(), ScaleMode::implicit);
  EXPECT_EQ(c.rope(), RopeEncoding::bf16);
  // explicit flags over the environment
  c = FormatConfig::create({.rope = RopeEncoding::bf16, .scale_mode = ScaleMode::implicit}, {.dynamic_scale = "1", .fp8_rope = "1"});
  EXPECT_EQ(c.scale_mode(), ScaleMode::implicit);
  EXPECT_EQ(c.record_bytes(), 432);
  c = FormatConfig::create({.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic}, {.scales_file = cal});
  EXPECT_EQ(c.scale_mode(), ScaleMode::dynamic);
  // the vLLM variables configure nvfp4_ds_mla only
  c = FormatConfig::create({.cache_dtype = CacheDtype::fp8_ds_mla}, {.dynamic_scale = "1", .fp8_rope = "1"});
  EXPECT_EQ(c.record_bytes(), 656);
}

TEST(FormatConfig, Parsers) {
  EXPECT_EQ(parse_cache_dtype("nvfp4_ds_mla"), CacheDtype::nvfp4_ds_mla);
  EXPECT_EQ(parse_cache_dtype(" FP8_DS_MLA "), CacheDtype::fp8_ds_mla);
  EXPECT_EQ(parse_scale_mode("static"), ScaleMode::static_calibrated);
  EXPECT_EQ(parse_rope("fp8"), RopeEncoding::fp8);
  EXPECT_THROW(parse_cache_dtype("fp8"), Error);
  EXPECT_THROW(parse_scale_mode("calibrated"), Error);
  EXPECT_THROW(parse_rope("e4m3"), Error);
}
