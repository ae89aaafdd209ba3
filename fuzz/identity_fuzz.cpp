// Fuzzes the parsers of identity strings: record identities (store --identity, manifests;
// record_bytes_of_identity), block keys in hex (store --key, block file names; key_from_hex),
// and the format names of the flags and environment (parse_cache_dtype, parse_rope,
// parse_scale_mode). Properties: an accepted record identity is one FormatConfig::identity()
// writes, names a valid record width and a namespace can be built on it; an accepted key is
// 1..kMaxKeyBytes bytes and prints back as the lowercase input; an accepted format name prints
// back to a name that parses to the same value.
#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <string>

#include "fuzz_support.h"
#include "nvfp4mla/calibration.h"
#include "nvfp4mla/config.h"
#include "nvfp4mla/offload/block_file.h"
#include "nvfp4mla/offload/namespace.h"

using namespace nvfp4mla;
using namespace nvfp4mla::offload;

namespace {

// Every native identity the library writes; a static one ends in a calibration file's SHA-256,
// kept here as its prefix "...:static-calibrated-v1:".
struct NativeIdentities {
  std::set<std::string> exact, static_prefixes;
};

const NativeIdentities& native_identities() {
  static const NativeIdentities ids = [] {
    NativeIdentities out;
    const auto calibration = fuzz::scratch_dir() / "calibration.json";
    std::ofstream(calibration) << Calibration::from_max_abs({1.0f}).to_json();
    for (CacheDtype d : {CacheDtype::bf16, CacheDtype::fp8_ds_mla}) {
      FormatOptions o;
      o.cache_dtype = d;
      out.exact.insert(FormatConfig::create(o).identity());
    }
    for (RopeEncoding r : {RopeEncoding::fp8, RopeEncoding::bf16}) {
      for (ScaleMode m : {ScaleMode::implicit, ScaleMode::dynamic, ScaleMode::static_calibrated}) {
        if (m == ScaleMode::dynamic && r != RopeEncoding::fp8) continue;
        FormatOptions o;
        o.rope = r;
        o.scale_mode = m;
        if (m == ScaleMode::static_calibrated) o.scales_file = calibration.string();
        const std::string id = FormatConfig::create(o).identity();
        if (m == ScaleMode::static_calibrated)
          out.static_prefixes.insert(id.substr(0, id.rfind(':') + 1));
        else
          out.exact.insert(id);
      }
    }
    return out;
  }();
  return ids;
}

bool is_native_identity(const std::string& s) {
  const NativeIdentities& ids = native_identities();
  if (ids.exact.count(s)) return true;
  for (const std::string& prefix : ids.static_prefixes) {
    if (!s.starts_with(prefix) || s.size() != prefix.size() + 64) continue;
    return std::all_of(s.begin() + prefix.size(), s.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  }
  return false;
}

void check_record_identity(const std::string& s) {
  int bytes = 0;
  if (!fuzz::accepts([&] { bytes = record_bytes_of_identity(s); })) return;
  fuzz::require(bytes == kSpecNvfp4Fp8Rope.record_bytes() || bytes == kSpecNvfp4Bf16Rope.record_bytes() ||
                    bytes == kSpecFp8.record_bytes() || bytes == kSpecBf16.record_bytes(),
                "an accepted identity names an unknown record width");
  fuzz::require(is_native_identity(s), "accepted a record identity the library never writes: '" + s + "'");
  NamespaceParams p;
  p.record_identity = s;
  p.record_bytes = bytes;
  p.tokens_per_block = 1;
  p.layers_in_block = 1;
  p.model_identity = "fuzz";
  p.validate();  // must hold for an accepted identity: a throw escapes as a finding
  fuzz::require(parse_manifest(manifest_json(p), "round trip") == p, "manifest round trip of an identity failed");
}

void check_key(const std::string& s) {
  std::vector<uint8_t> key;
  if (!fuzz::accepts([&] { key = key_from_hex(s); })) return;
  fuzz::require(!key.empty() && key.size() <= kMaxKeyBytes, "accepted a key of a bad length");
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  fuzz::require(key_to_hex(key) == lower, "key does not print back as its hex");
}

template <class Parse>
void check_name(const std::string& s, Parse parse) {
  decltype(parse(s)) v{};
  if (!fuzz::accepts([&] { v = parse(s); })) return;
  fuzz::require(parse(to_string(v)) == v, "a format name does not print back to itself");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)native_identities();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string s(reinterpret_cast<const char*>(data), size);
  check_record_identity(s);
  check_key(s);
  check_name(s, parse_cache_dtype);
  check_name(s, parse_rope);
  check_name(s, parse_scale_mode);
  return 0;
}
