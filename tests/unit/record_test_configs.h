#pragma once
// The seven record configurations the record tests cover, a fp32 token, and thin wrappers
// around record::encode / record::decode (shared by record_golden_test and
// record_properties_test).
#include <bit>
#include <cstdint>
#include <vector>

#include "nvfp4mla/record.h"
#include "unit/record_reference.h"

namespace nvfp4mla_test {

struct Token {
  std::vector<float> kv = std::vector<float>(nvfp4mla::kLatentDim, 0.0f);
  std::vector<float> pe = std::vector<float>(nvfp4mla::kRopeDim, 0.0f);
};

// A record configuration under test and its counterpart in the reference model.
struct Config {
  const char* name;
  nvfp4mla::RecordSpec spec;
  ref::Kind kind;
  ref::Outer outer;
};
namespace configs {
using nvfp4mla::CacheDtype, nvfp4mla::RopeEncoding, nvfp4mla::ScaleMode;
inline const Config kBf16{"bf16-1152", nvfp4mla::kSpecBf16, ref::Kind::bf16_1152, ref::Outer::unit};
inline const Config kFp8{"fp8_ds_mla-656", nvfp4mla::kSpecFp8, ref::Kind::fp8_656, ref::Outer::unit};
inline const Config k368{"nvfp4-368-implicit", nvfp4mla::kSpecNvfp4Fp8Rope, ref::Kind::nvfp4_368, ref::Outer::unit};
inline const Config k432{"nvfp4-432-implicit", nvfp4mla::kSpecNvfp4Bf16Rope, ref::Kind::nvfp4_432, ref::Outer::unit};
inline const Config k368Dynamic{"nvfp4-368-dynamic", {CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::dynamic},
                                ref::Kind::nvfp4_368, ref::Outer::token};
inline const Config k368Static{"nvfp4-368-static",
                               {CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::static_calibrated},
                               ref::Kind::nvfp4_368, ref::Outer::layer};
inline const Config k432Static{"nvfp4-432-static",
                               {CacheDtype::nvfp4_ds_mla, RopeEncoding::bf16, ScaleMode::static_calibrated},
                               ref::Kind::nvfp4_432, ref::Outer::layer};
inline const Config* const kAll[] = {&kBf16, &kFp8, &k368, &k432, &k368Dynamic, &k368Static, &k432Static};
}  // namespace configs

inline uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

// Encode into a buffer pre-filled with `fill`, so a byte the writer skips shows up.
template <class In>
std::vector<uint8_t> encode(const Config& c, const In* kv, const In* pe, float layer_scale, uint8_t fill = 0xA5) {
  std::vector<uint8_t> rec(c.spec.record_bytes(), fill);
  nvfp4mla::record::encode(c.spec, kv, pe, layer_scale, rec.data());
  return rec;
}
inline std::vector<uint8_t> encode(const Config& c, const Token& t, float layer_scale = 1.0f) {
  return encode(c, t.kv.data(), t.pe.data(), layer_scale);
}
inline Token decode(const Config& c, const std::vector<uint8_t>& rec, float layer_scale = 1.0f) {
  Token d;
  nvfp4mla::record::decode(c.spec, rec.data(), layer_scale, d.kv.data(), d.pe.data());
  return d;
}

}  // namespace nvfp4mla_test
