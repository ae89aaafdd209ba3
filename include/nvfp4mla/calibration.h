#pragma once
// Per-layer outer scales for the static (calibrated) NVFP4 mode.
//
// File format (JSON), validated strictly on load:
//   {"format": "nvfp4_ds_mla_outer_scale_v1", "num_layers": N, "latent_dim": 512,
//    "denominator": 2688.0, "scales": [N finite positive numbers], "max_abs": [N numbers]}
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace nvfp4mla {

inline constexpr const char* kCalibrationFormat = "nvfp4_ds_mla_outer_scale_v1";
// Larger files are refused unread: 100000 layers of two numbers need a few MB.
inline constexpr uint64_t kMaxCalibrationFileBytes = uint64_t(64) << 20;

// What to do for a layer index the file does not cover.
enum class MissingLayer { error, unit_scale /* the MTP-layer convention: scale 1.0 */ };

struct Calibration {
  std::vector<float> scales;   // s_l = max_abs_l * C2688, one per layer
  std::vector<float> max_abs;  // per-layer latent max |kv_c| the scales came from
  std::string sha256_hex;      // lowercase hex SHA-256 of the file's exact bytes ("" if built in memory)
  std::filesystem::path source;

  int num_layers() const { return static_cast<int>(scales.size()); }
  // The layer's scale; throws Error for a layer outside the file unless `missing` allows 1.0.
  float layer_scale(int layer, MissingLayer missing = MissingLayer::error) const;

  // Parse and validate JSON text; `origin` names the source in error messages.
  static Calibration parse(const std::string& json_text, const std::string& origin = "<memory>");
  // Read, hash and validate a file. An unreadable or invalid file is an Error, never a default;
  // so are a repeated key, a number beyond fp32, a file that is not a regular file and one
  // larger than kMaxCalibrationFileBytes.
  static Calibration load(const std::filesystem::path& path);
  // Build from per-layer max |kv_c| (s_l = max_abs_l * C2688).
  static Calibration from_max_abs(const std::vector<float>& max_abs);
  // Serialize; numbers are printed so that they parse back to the same fp32 values.
  std::string to_json() const;
};

// Lowercase hex SHA-256 of a byte string / of a file's bytes (OpenSSL).
std::string sha256_hex(const void* data, size_t size);
std::string sha256_file_hex(const std::filesystem::path& path);

}  // namespace nvfp4mla
