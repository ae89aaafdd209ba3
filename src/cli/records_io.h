#pragma once
// Records on the command line: the tensor `records` of a safetensors file, checked against the
// configuration (width, and the identity and static scale the encoder stored in metadata).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nvfp4mla/config.h"
#include "nvfp4mla/safetensors.h"

namespace nvfp4mla::cli {

// Metadata keys the encoder writes so that a reader can tell how the records were written.
inline constexpr const char* kMetaIdentity = "nvfp4mla.identity";
inline constexpr const char* kMetaDescription = "nvfp4mla.format";
// Static mode: the layer's outer scale. The identity names only the calibration file, not the
// layer, so this catches records decoded with another layer's scale.
inline constexpr const char* kMetaOuterScale = "nvfp4mla.outer_scale";

std::string exact_float(float v);  // 9 significant digits: round-trips any fp32
// A static configuration built from a bare --layer-scale has no identity (it names no file).
std::optional<std::string> identity_if_any(const FormatConfig& cfg);

// The records tensor as a flat list of records: [N, rb] or [pages, page_size, rb].
struct RecordRows {
  uint8_t* data;
  int64_t count;
};
RecordRows require_records(TensorMap& m, const std::string& origin, const FormatConfig& cfg,
                           const MetadataMap& metadata);

Tensor f32_tensor(std::vector<int64_t> shape, const std::vector<float>& values);

}  // namespace nvfp4mla::cli
