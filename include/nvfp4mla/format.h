#pragma once
// Record formats: the one place that knows how a token's MLA KV state is laid out in bytes.
// Kernels, tools and tests take every width and offset from here.
#include <cstdint>
#include <string>

#include "nvfp4mla/hd.h"

namespace nvfp4mla {

// Model geometry shared by every format (DeepSeek-V3.2 / GLM-5.x MLA).
inline constexpr int kLatentDim = 512;  // kv_c ("NoPE"), also V
inline constexpr int kRopeDim = 64;     // k_pe, stored post-RoPE
inline constexpr int kQkDim = kLatentDim + kRopeDim;  // 576

enum class CacheDtype : uint8_t { bf16 = 0, fp8_ds_mla = 1, nvfp4_ds_mla = 2 };
// How the 64 RoPE values are stored. Only nvfp4_ds_mla has a choice; the other dtypes
// always store raw BF16.
enum class RopeEncoding : uint8_t { bf16 = 0, fp8 = 1 };
// Outer (second-level) scale of the NVFP4 latent. Other dtypes are always `implicit`.
enum class ScaleMode : uint8_t { implicit = 0, static_calibrated = 1, dynamic = 2 };

// fp32 constants of the recipes, each rounded once from the exact value.
inline constexpr float kInv448 = static_cast<float>(1.0 / 448.0);    // C448
inline constexpr float kInv2688 = static_cast<float>(1.0 / 2688.0);  // C2688 = 1/(6*448)
inline constexpr float kCalibrationDenominator = 2688.0f;

namespace layout {

// nvfp4_ds_mla: E2M1 latent with one E4M3 scale per 16 dims, plus RoPE.
namespace nvfp4 {
inline constexpr int kGroupSize = 16;
inline constexpr int kNumGroups = kLatentDim / kGroupSize;          // 32
inline constexpr int kLatentOffset = 0;                             // 256 bytes, 2 values/byte,
inline constexpr int kLatentBytes = kLatentDim / 2;                 //   even index in low nibble
inline constexpr int kGroupScaleOffset = kLatentOffset + kLatentBytes;  // 256: 32 E4M3 bytes
inline constexpr int kRopeScaleOffset = kGroupScaleOffset + kNumGroups;  // 288: fp32 (368 only)
inline constexpr int kTokenScaleOffset = kRopeScaleOffset + 4;           // 292: fp32 (dynamic)
inline constexpr int kRopeOffset = 304;                                  // RoPE values
inline constexpr int kRecordBytesFp8Rope = kRopeOffset + kRopeDim;       // 368
inline constexpr int kRecordBytesBf16Rope = kRopeOffset + 2 * kRopeDim;  // 432
}  // namespace nvfp4

// fp8_ds_mla (FlashMLA / vLLM DeepSeek-V3.2): E4M3 latent, one fp32 scale per 128 dims.
namespace fp8 {
inline constexpr int kTileDim = 128;
inline constexpr int kNumTiles = kLatentDim / kTileDim;            // 4
inline constexpr int kLatentOffset = 0;                            // 512 E4M3 bytes
inline constexpr int kTileScaleOffset = kLatentDim;                // 512: 4 fp32
inline constexpr int kRopeOffset = kTileScaleOffset + 4 * kNumTiles;  // 528: 64 BF16
inline constexpr int kRecordBytes = kRopeOffset + 2 * kRopeDim;       // 656
inline constexpr int kMinScaleLog2 = -126;
}  // namespace fp8

// bf16 reference record: 512 + 64 BF16 values.
namespace bf16 {
inline constexpr int kLatentOffset = 0;
inline constexpr int kRopeOffset = 2 * kLatentDim;           // 1024
inline constexpr int kRecordBytes = 2 * kQkDim;              // 1152
}  // namespace bf16

}  // namespace layout

// A plain description of one record format, small and trivially copyable so it can be a
// kernel parameter. Build it through FormatConfig (config.h), which validates it; the
// functions here assume a valid spec.
struct RecordSpec {
  CacheDtype dtype = CacheDtype::nvfp4_ds_mla;
  RopeEncoding rope = RopeEncoding::bf16;
  ScaleMode scale_mode = ScaleMode::implicit;

  NVFP4MLA_HD constexpr int record_bytes() const {
    switch (dtype) {
      case CacheDtype::bf16: return layout::bf16::kRecordBytes;
      case CacheDtype::fp8_ds_mla: return layout::fp8::kRecordBytes;
      case CacheDtype::nvfp4_ds_mla:
      default:
        return rope == RopeEncoding::fp8 ? layout::nvfp4::kRecordBytesFp8Rope
                                         : layout::nvfp4::kRecordBytesBf16Rope;
    }
  }
  NVFP4MLA_HD constexpr bool is_nvfp4() const { return dtype == CacheDtype::nvfp4_ds_mla; }
  NVFP4MLA_HD constexpr bool rope_is_fp8() const { return is_nvfp4() && rope == RopeEncoding::fp8; }
};

// Every valid record spec, as X(dtype, rope, scale_mode): the one list that kernel dispatch and
// instantiation, the CLI, the evaluation and the tests iterate over (kAllRecordSpecs below).
#define NVFP4MLA_FOR_EACH_RECORD_SPEC(X)   \
  X(bf16, bf16, implicit)                  \
  X(fp8_ds_mla, bf16, implicit)            \
  X(nvfp4_ds_mla, bf16, implicit)          \
  X(nvfp4_ds_mla, bf16, static_calibrated) \
  X(nvfp4_ds_mla, fp8, implicit)           \
  X(nvfp4_ds_mla, fp8, static_calibrated)  \
  X(nvfp4_ds_mla, fp8, dynamic)

#define NVFP4MLA_RECORD_SPEC_ENTRY(D, R, M) RecordSpec{CacheDtype::D, RopeEncoding::R, ScaleMode::M},
inline constexpr RecordSpec kAllRecordSpecs[] = {NVFP4MLA_FOR_EACH_RECORD_SPEC(NVFP4MLA_RECORD_SPEC_ENTRY)};
#undef NVFP4MLA_RECORD_SPEC_ENTRY

// Whether two specs describe the same records (the RoPE encoding and scale mode of bf16 and
// fp8_ds_mla records are not part of their format).
NVFP4MLA_HD constexpr bool same_record_format(const RecordSpec& a, const RecordSpec& b) {
  return a.dtype == b.dtype && (a.dtype != CacheDtype::nvfp4_ds_mla || (a.rope == b.rope && a.scale_mode == b.scale_mode));
}

// The four record widths and what each means.
inline constexpr RecordSpec kSpecNvfp4Fp8Rope{CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::implicit};
inline constexpr RecordSpec kSpecNvfp4Bf16Rope{CacheDtype::nvfp4_ds_mla, RopeEncoding::bf16, ScaleMode::implicit};
inline constexpr RecordSpec kSpecFp8{CacheDtype::fp8_ds_mla, RopeEncoding::bf16, ScaleMode::implicit};
inline constexpr RecordSpec kSpecBf16{CacheDtype::bf16, RopeEncoding::bf16, ScaleMode::implicit};

const char* to_string(CacheDtype d);
const char* to_string(RopeEncoding r);
const char* to_string(ScaleMode m);
// "bf16-1152", "fp8_ds_mla-656", "nvfp4_ds_mla-368-dynamic": dtype, record bytes, NVFP4 scale mode.
std::string to_string(const RecordSpec& spec);

}  // namespace nvfp4mla
