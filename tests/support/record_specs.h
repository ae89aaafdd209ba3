#pragma once
// Every record format and scale mode, for suites that loop over all of them: the format
// module's list (format.h: kAllRecordSpecs).
#include <string>

#include "nvfp4mla/format.h"

namespace nvfp4mla::testing {

using nvfp4mla::kAllRecordSpecs;

inline std::string spec_name(const RecordSpec& s) { return to_string(s); }

}  // namespace nvfp4mla::testing
