#pragma once
// From a RecordSpec known at run time to the compile-time Format<...> a kernel is instantiated
// for: with_record_format(spec, who, fn) calls fn(Format<...>{}) for the spec's record format,
// one case per entry of the format module's list (NVFP4MLA_FOR_EACH_RECORD_SPEC).
#include <string>

#include "nvfp4mla/error.h"
#include "nvfp4mla/format.h"
#include "ops/sparse_mla/kv_tile.cuh"

namespace nvfp4mla::cuda {

template <class Fn>
void with_record_format(const RecordSpec& spec, const char* who, Fn&& fn) {
#define NVFP4MLA_FORMAT_CASE(D, R, M)                                                      \
  if (same_record_format(spec, RecordSpec{CacheDtype::D, RopeEncoding::R, ScaleMode::M})) \
    return fn(Format<CacheDtype::D, RopeEncoding::R, ScaleMode::M>{});
  NVFP4MLA_FOR_EACH_RECORD_SPEC(NVFP4MLA_FORMAT_CASE)
#undef NVFP4MLA_FORMAT_CASE
  if (spec.is_nvfp4() && spec.scale_mode == ScaleMode::dynamic)
    throw Error(std::string(who) + ": dynamic scale mode requires the 368-byte (fp8 RoPE) record");
  throw Error(std::string(who) + ": not a valid record format");
}

}  // namespace nvfp4mla::cuda
