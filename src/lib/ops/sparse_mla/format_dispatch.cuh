#pragma once
// From a RecordSpec known at run time to the compile-time Format<...> a kernel is instantiated
// for: with_record_format(spec, who, fn) calls fn(Format<...>{}) for the spec's record format.
#include <string>

#include "nvfp4mla/error.h"
#include "nvfp4mla/format.h"
#include "ops/sparse_mla/kv_tile.cuh"

namespace nvfp4mla::cuda {

// X(rope, mode) for each nvfp4_ds_mla format (the ones with_record_format accepts), for kernels
// instantiated only for NVFP4 records.
#define NVFP4MLA_FOR_EACH_NVFP4_FORMAT(X) \
  X(fp8, implicit) X(fp8, static_calibrated) X(fp8, dynamic) X(bf16, implicit) X(bf16, static_calibrated)

template <class Fn>
void with_record_format(const RecordSpec& spec, const char* who, Fn&& fn) {
  using D = CacheDtype;
  using R = RopeEncoding;
  using M = ScaleMode;
  if (spec.dtype == D::bf16) return fn(Format<D::bf16, R::bf16, M::implicit>{});
  if (spec.dtype == D::fp8_ds_mla) return fn(Format<D::fp8_ds_mla, R::bf16, M::implicit>{});
  if (spec.rope == R::fp8) {
    switch (spec.scale_mode) {
      case M::implicit: return fn(Format<D::nvfp4_ds_mla, R::fp8, M::implicit>{});
      case M::static_calibrated: return fn(Format<D::nvfp4_ds_mla, R::fp8, M::static_calibrated>{});
      case M::dynamic: return fn(Format<D::nvfp4_ds_mla, R::fp8, M::dynamic>{});
    }
  } else {
    switch (spec.scale_mode) {
      case M::implicit: return fn(Format<D::nvfp4_ds_mla, R::bf16, M::implicit>{});
      case M::static_calibrated: return fn(Format<D::nvfp4_ds_mla, R::bf16, M::static_calibrated>{});
      case M::dynamic: break;
    }
  }
  throw Error(std::string(who) + ": dynamic scale mode requires the 368-byte (fp8 RoPE) record");
}

}  // namespace nvfp4mla::cuda
