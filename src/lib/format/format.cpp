#include "nvfp4mla/format.h"

#include <string>

namespace nvfp4mla {

const char* to_string(CacheDtype d) {
  switch (d) {
    case CacheDtype::bf16: return "bf16";
    case CacheDtype::fp8_ds_mla: return "fp8_ds_mla";
    case CacheDtype::nvfp4_ds_mla: return "nvfp4_ds_mla";
  }
  return "?";
}
const char* to_string(RopeEncoding r) { return r == RopeEncoding::fp8 ? "fp8" : "bf16"; }
const char* to_string(ScaleMode m) {
  switch (m) {
    case ScaleMode::implicit: return "implicit";
    case ScaleMode::static_calibrated: return "static";
    case ScaleMode::dynamic: return "dynamic";
  }
  return "?";
}
std::string to_string(const RecordSpec& s) {
  return std::string(to_string(s.dtype)) + "-" + std::to_string(s.record_bytes()) +
         (s.is_nvfp4() ? std::string("-") + to_string(s.scale_mode) : "");
}

}  // namespace nvfp4mla
