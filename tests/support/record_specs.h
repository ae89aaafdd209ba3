#pragma once
// Every record format and scale mode, for suites that loop over all of them.
#include <string>

#include "nvfp4mla/format.h"

namespace nvfp4mla::testing {

inline constexpr RecordSpec kAllRecordSpecs[] = {
    {CacheDtype::bf16, RopeEncoding::bf16, ScaleMode::implicit},
    {CacheDtype::fp8_ds_mla, RopeEncoding::bf16, ScaleMode::implicit},
    {CacheDtype::nvfp4_ds_mla, RopeEncoding::bf16, ScaleMode::implicit},
    {CacheDtype::nvfp4_ds_mla, RopeEncoding::bf16, ScaleMode::static_calibrated},
    {CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::implicit},
    {CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::static_calibrated},
    {CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::dynamic},
};

inline std::string spec_name(const RecordSpec& s) {
  return std::string(to_string(s.dtype)) + "-" + std::to_string(s.record_bytes()) + "-" + to_string(s.scale_mode);
}

}  // namespace nvfp4mla::testing
