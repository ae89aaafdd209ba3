#include "nvfp4mla/calibration.h"

#include <openssl/evp.h>

#include <cmath>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "io/strict_json.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/file_read.h"
#include "nvfp4mla/format.h"

namespace nvfp4mla {

using json = nlohmann::json;

std::string sha256_hex(const void* data, size_t size) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, size, digest, &len, EVP_sha256(), nullptr) != 1) throw Error("SHA-256 computation failed (OpenSSL)");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out.push_back(hex[digest[i] >> 4]);
    out.push_back(hex[digest[i] & 0xF]);
  }
  return out;
}

std::string sha256_file_hex(const std::filesystem::path& path) {
  const std::string bytes = read_regular_file(path, std::numeric_limits<uint64_t>::max(), "file");
  return sha256_hex(bytes.data(), bytes.size());
}

float Calibration::layer_scale(int layer, MissingLayer missing) const {
  if (layer >= 0 && layer < num_layers()) return scales[static_cast<size_t>(layer)];
  if (missing == MissingLayer::unit_scale && layer >= 0) return 1.0f;
  throw Error("layer " + std::to_string(layer) + " is outside the calibration" +
              (source.empty() ? std::string() : " '" + source.string() + "'") + " (" + std::to_string(num_layers()) +
              " layers); layers beyond the file (the MTP layer) use scale 1.0 only when asked for explicitly "
              "(--unit-scale-for-missing-layer)");
}

namespace {

// A JSON value that must be a number (booleans and strings are rejected) convertible to a
// finite fp32 value.
float finite_number(const json& v, const std::string& where, const std::string& origin) {
  if (!v.is_number()) throw Error("calibration " + origin + ": " + where + " must be a number, got " + std::string(v.type_name()));
  const double d = v.get<double>();
  const float f = static_cast<float>(d);
  if (!std::isfinite(d) || !std::isfinite(f)) throw Error("calibration " + origin + ": " + where + " is not a finite fp32 number");
  return f;
}

int64_t integer_field(const json& doc, const char* key, const std::string& origin) {
  if (!doc.contains(key)) throw Error("calibration " + origin + ": missing \"" + key + "\"");
  const json& v = doc.at(key);
  if (!v.is_number_integer()) throw Error("calibration " + origin + ": \"" + key + "\" must be an integer, got " + std::string(v.type_name()));
  // An unsigned value beyond int64 would convert to a negative one (2^64 - 1 to -1).
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw Error("calibration " + origin + ": \"" + key + "\" is out of range, got " + v.dump());
  return v.get<int64_t>();
}

std::vector<float> number_array(const json& doc, const char* key, int64_t n, const std::string& origin) {
  if (!doc.contains(key)) throw Error("calibration " + origin + ": missing \"" + key + "\"");
  const json& arr = doc.at(key);
  if (!arr.is_array()) throw Error("calibration " + origin + ": \"" + key + "\" must be an array");
  if (static_cast<int64_t>(arr.size()) != n)
    throw Error("calibration " + origin + ": \"" + key + "\" has " + std::to_string(arr.size()) + " entries but num_layers is " + std::to_string(n));
  std::vector<float> out;
  out.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) out.push_back(finite_number(arr[i], std::string(key) + "[" + std::to_string(i) + "]", origin));
  return out;
}

}  // namespace

Calibration Calibration::parse(const std::string& text, const std::string& origin) {
  const json doc = io::parse_strict_json(text, "calibration " + origin);
  if (!doc.is_object()) throw Error("calibration " + origin + ": top level must be a JSON object");
  if (!doc.contains("format") || !doc.at("format").is_string() || doc.at("format").get<std::string>() != kCalibrationFormat)
    throw Error("calibration " + origin + ": \"format\" must be \"" + kCalibrationFormat + "\"");
  const int64_t n = integer_field(doc, "num_layers", origin);
  if (n <= 0 || n > 100000) throw Error("calibration " + origin + ": num_layers must be a positive layer count, got " + std::to_string(n));
  const int64_t latent = integer_field(doc, "latent_dim", origin);
  if (latent != kLatentDim) throw Error("calibration " + origin + ": latent_dim must be " + std::to_string(kLatentDim) + ", got " + std::to_string(latent));
  if (!doc.contains("denominator")) throw Error("calibration " + origin + ": missing \"denominator\"");
  (void)finite_number(doc.at("denominator"), "denominator", origin);
  // Compared at full precision: 2688.0001 rounds to 2688 in fp32 but is not the recipe's constant.
  if (doc.at("denominator").get<double>() != static_cast<double>(kCalibrationDenominator)) throw Error("calibration " + origin + ": denominator must be 2688.0 (6 * 448)");
  Calibration c;
  c.scales = number_array(doc, "scales", n, origin);
  c.max_abs = number_array(doc, "max_abs", n, origin);
  for (size_t i = 0; i < c.scales.size(); ++i) {
    if (!(c.scales[i] > 0.0f)) throw Error("calibration " + origin + ": scales[" + std::to_string(i) + "] must be positive");
    if (c.max_abs[i] < 0.0f) throw Error("calibration " + origin + ": max_abs[" + std::to_string(i) + "] must not be negative");
  }
  return c;
}

Calibration Calibration::load(const std::filesystem::path& path) {
  const std::string bytes = read_regular_file(path, kMaxCalibrationFileBytes, "calibration file");
  Calibration c = parse(bytes, "'" + path.string() + "'");
  c.sha256_hex = nvfp4mla::sha256_hex(bytes.data(), bytes.size());
  c.source = path;
  return c;
}

Calibration Calibration::from_max_abs(const std::vector<float>& max_abs) {
  if (max_abs.empty()) throw Error("calibration needs at least one layer");
  Calibration c;
  c.max_abs = max_abs;
  for (size_t i = 0; i < max_abs.size(); ++i) {
    const float s = max_abs[i] * kInv2688;
    if (!std::isfinite(max_abs[i]) || !(s > 0.0f))
      throw Error("layer " + std::to_string(i) + ": max |kv_c| = " + std::to_string(max_abs[i]) +
                  " gives no usable positive scale (is the layer all zeros?)");
    c.scales.push_back(s);
  }
  return c;
}

std::string Calibration::to_json() const {
  // fp32 values go out as the exact double they widen to; nlohmann prints the shortest
  // decimal that reads back as that double, so parse() recovers the same fp32 bits.
  nlohmann::ordered_json doc;
  doc["format"] = kCalibrationFormat;
  doc["num_layers"] = num_layers();
  doc["latent_dim"] = kLatentDim;
  doc["denominator"] = static_cast<double>(kCalibrationDenominator);
  nlohmann::ordered_json s = nlohmann::ordered_json::array(), m = nlohmann::ordered_json::array();
  for (float v : scales) s.push_back(static_cast<double>(v));
  for (float v : max_abs) m.push_back(static_cast<double>(v));
  doc["scales"] = s;
  doc["max_abs"] = m;
  return doc.dump(2) + "\n";
}

}  // namespace nvfp4mla
