#include "records_io.h"

#include <cstdio>
#include <cstring>

#include "nvfp4mla/error.h"

namespace nvfp4mla::cli {

std::string exact_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);  // 9 significant digits round-trip any fp32
  return buf;
}

std::optional<std::string> identity_if_any(const FormatConfig& cfg) {
  if (cfg.scale_mode() == ScaleMode::static_calibrated && cfg.calibration() == nullptr) return std::nullopt;
  return cfg.identity();
}

RecordRows require_records(TensorMap& m, const std::string& origin, const FormatConfig& cfg,
                           const MetadataMap& metadata) {
  const Tensor& t = find_tensor(m, "records", origin, {DType::U8});
  if (t.shape.size() != 2 && t.shape.size() != 3)
    throw Error(origin + ": tensor 'records' has shape " + t.shape_string() +
                "; expected [N, record_bytes] or [pages, page_size, record_bytes]");
  const int64_t width = t.shape.back();
  if (width != cfg.record_bytes())
    throw Error(origin + ": records are " + std::to_string(width) + " bytes wide but the configuration (" +
                cfg.describe() + ") expects " + std::to_string(cfg.record_bytes()) +
                "-byte records; pass the format flags the records were written with");
  const bool reading_static = cfg.scale_mode() == ScaleMode::static_calibrated;
  const auto written_as = metadata.find(kMetaIdentity);
  const auto reading_as = identity_if_any(cfg);
  // A bare --layer-scale has no identity to compare: the records must still be static ones (the
  // width already matched the layout); their scale is compared below.
  const bool identity_matches =
      written_as == metadata.end() ||
      (reading_as ? written_as->second == *reading_as
                  : written_as->second.find(":static-calibrated-v1:") != std::string::npos);
  if (!identity_matches)
    throw Error(origin + ": records were written as " + written_as->second + " but the configuration reads " +
                (reading_as ? *reading_as : cfg.describe()) + "; pass the format flags the records were written with");
  const auto written_scale = metadata.find(kMetaOuterScale);
  if (written_scale != metadata.end() && !reading_static)
    throw Error(origin + ": records were written with the static outer scale " + written_scale->second +
                " but the configuration reads them in scale mode " + to_string(cfg.scale_mode()) +
                "; pass the format flags the records were written with");
  if (written_scale != metadata.end() && written_scale->second != exact_float(cfg.layer_scale()))
    throw Error(origin + ": records were written with the static outer scale " + written_scale->second +
                " but the configuration reads them with " + exact_float(cfg.layer_scale()) +
                "; pass the --layer (or --layer-scale) the records were written with");
  return {m.at("records").data.data(), t.numel() / width};
}

Tensor f32_tensor(std::vector<int64_t> shape, const std::vector<float>& values) {
  Tensor t = Tensor::zeros(DType::F32, std::move(shape));
  if (!t.data.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

}  // namespace nvfp4mla::cli
