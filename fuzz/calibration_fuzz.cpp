// Fuzzes Calibration::parse (static-mode calibration files, --scales-file and
// VLLM_NVFP4_MLA_SCALES_FILE). Properties: an accepted file has num_layers finite positive
// scales and finite non-negative max_abs values, and to_json() parses back to the same fp32 bits.
#include <cmath>
#include <cstring>
#include <string>

#include "fuzz_support.h"
#include "nvfp4mla/calibration.h"

using namespace nvfp4mla;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Calibration c;
  if (!fuzz::accepts([&] { c = Calibration::parse(text, "fuzz"); })) return 0;

  fuzz::require(c.num_layers() > 0 && c.max_abs.size() == c.scales.size(), "accepted a calibration without layers");
  for (int l = 0; l < c.num_layers(); ++l) {
    const float s = c.layer_scale(l);
    fuzz::require(std::isfinite(s) && s > 0.0f, "accepted a scale that is not finite and positive");
    fuzz::require(std::isfinite(c.max_abs[l]) && c.max_abs[l] >= 0.0f, "accepted a bad max_abs");
  }
  fuzz::require(c.layer_scale(c.num_layers(), MissingLayer::unit_scale) == 1.0f, "missing layer is not unit scale");
  fuzz::require(!fuzz::accepts([&] { (void)c.layer_scale(c.num_layers()); }), "a layer past the file was accepted");
  fuzz::require(!fuzz::accepts([&] { (void)c.layer_scale(-1, MissingLayer::unit_scale); }), "layer -1 was accepted");

  const Calibration back = Calibration::parse(c.to_json(), "round trip");
  fuzz::require(same_bits(c.scales, back.scales) && same_bits(c.max_abs, back.max_abs),
                "to_json() does not parse back to the same values");
  return 0;
}
