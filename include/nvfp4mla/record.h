#pragma once
// Writer and reader recipes for every record format (docs/FORMAT.md is the specification).
//
// The recipes are pinned IEEE fp32 operations (division is a true division, no FMA
// contraction, no flush-to-zero), so the CPU writer here and the GPU writer, which calls the
// same step functions, produce identical bytes. Maxima are exact, so any reduction order
// gives the same result.
#include <cfloat>
#include <cstdint>
#include <cstring>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/hd.h"

namespace nvfp4mla {

// Raw 16-bit inputs. A writer accepts BF16, FP16 or fp32 values.
struct Bf16Bits { uint16_t bits; };
struct Fp16Bits { uint16_t bits; };

namespace record {

NVFP4MLA_HD float to_fp32(float x) { return x; }
NVFP4MLA_HD float to_fp32(Bf16Bits x) { return codec::bf16_decode(x.bits); }
NVFP4MLA_HD float to_fp32(Fp16Bits x) { return codec::fp16_decode(x.bits); }

// NaN -> +0, +/-Inf -> +/-FLT_MAX; finite values unchanged.
NVFP4MLA_HD float sanitize(float x) {
  const uint32_t u = codec::float_bits(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0.0f;
  if (a == 0x7F800000u) return codec::bits_float((u & 0x80000000u) | 0x7F7FFFFFu);
  return x;
}
NVFP4MLA_HD float abs_f(float x) { return codec::bits_float(codec::float_bits(x) & 0x7FFFFFFFu); }
NVFP4MLA_HD float max_f(float a, float b) { return a > b ? a : b; }  // inputs are never NaN

NVFP4MLA_HD void store_f32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }
NVFP4MLA_HD float load_f32(const uint8_t* p) { float v; std::memcpy(&v, p, 4); return v; }
NVFP4MLA_HD void store_u16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v & 0xFF); p[1] = uint8_t(v >> 8); }
NVFP4MLA_HD uint16_t load_u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }

// ---- step functions shared by the CPU and GPU writers ------------------------------------

// Dynamic per-token outer scale: s_t = token_amax * C2688.
NVFP4MLA_HD float nvfp4_dynamic_scale(float token_amax) { return token_amax * kInv2688; }
// Latent value relative to the outer scale: y = x / s, y = 0 when s = 0.
NVFP4MLA_HD float nvfp4_prescale(float x, float s) { return s == 0.0f ? 0.0f : x / s; }
// E4M3 group scale byte from the group's largest |y|.
NVFP4MLA_HD uint8_t nvfp4_group_scale_byte(float group_amax) { return codec::e4m3_encode(group_amax / codec::kE2M1Max); }
// E2M1 nibble of y against the decoded group scale d (0 when d = 0).
NVFP4MLA_HD uint8_t nvfp4_nibble(float y, float d) { return d == 0.0f ? uint8_t(0) : codec::e2m1_encode(y / d); }
// FP8 RoPE scale of the 368-byte record: rs = rope_amax * C448.
NVFP4MLA_HD float rope_fp8_scale(float rope_amax) { return rope_amax * kInv448; }
NVFP4MLA_HD uint8_t rope_fp8_byte(float r, float rs) { return rs == 0.0f ? uint8_t(0) : codec::e4m3_encode(r / rs); }
// fp8_ds_mla tile scale: the smallest power of two p with amax <= 448 p, at least 2^-126,
// and 1 when amax = 0. With amax = m * 2^e (1 <= m < 2), p = 2^(e-8) suffices exactly
// when m <= 1.75 (448 = 1.75 * 2^8), otherwise p = 2^(e-7).
NVFP4MLA_HD float fp8_tile_scale(float amax) {
  if (amax == 0.0f) return 1.0f;
  const uint32_t u = codec::float_bits(amax);
  const int32_t biased = static_cast<int32_t>(u >> 23);
  if (biased == 0) return 0x1p-126f;  // fp32 subnormal amax: far below 448 * 2^-126
  const int32_t e = biased - 127;
  const uint32_t mant = u & 0x7FFFFFu;
  int32_t k = (mant <= 0x600000u) ? e - 8 : e - 7;  // 0x600000 = 0.75 in the mantissa field
  if (k < layout::fp8::kMinScaleLog2) k = layout::fp8::kMinScaleLog2;
  return codec::bits_float(static_cast<uint32_t>(k + 127) << 23);
}

// Outer scale a writer divides the latent by: the layer's calibrated scale in static mode,
// s_t = token_amax * C2688 in dynamic mode (`token_amax` = max |x| of the sanitized latent), 1 in
// implicit mode.
NVFP4MLA_HD float nvfp4_writer_scale(ScaleMode mode, float layer_scale, float token_amax) {
  switch (mode) {
    case ScaleMode::static_calibrated: return layer_scale;
    case ScaleMode::dynamic: return nvfp4_dynamic_scale(token_amax);
    default: return 1.0f;
  }
}

// Outer scale a reader applies to the NVFP4 latent of a record: the stored per-token scale in
// dynamic mode, the layer's calibrated scale in static mode, 1 otherwise.
NVFP4MLA_HD float nvfp4_outer_scale(const RecordSpec& spec, const uint8_t* rec, float layer_scale) {
  switch (spec.scale_mode) {
    case ScaleMode::dynamic: return load_f32(rec + layout::nvfp4::kTokenScaleOffset);
    case ScaleMode::static_calibrated: return layer_scale;
    default: return 1.0f;
  }
}

// BF16 bits of an input value for the bf16 reference record: BF16 inputs unchanged,
// others rounded to nearest even.
NVFP4MLA_HD uint16_t bf16_bits_of(Bf16Bits x) { return x.bits; }
NVFP4MLA_HD uint16_t bf16_bits_of(Fp16Bits x) { return codec::bf16_encode_rn(codec::fp16_decode(x.bits)); }
NVFP4MLA_HD uint16_t bf16_bits_of(float x) { return codec::bf16_encode_rn(x); }

// ---- whole-record writer and reader -------------------------------------------------------

// Raw BF16 RoPE of the 432- and 656-byte records: the sanitized value rounded to BF16 with
// saturation (a BF16 input comes through unchanged unless it was NaN or infinite).
template <class In>
NVFP4MLA_HD void encode_rope_bf16(const In* k_pe, uint8_t* dst) {
  for (int i = 0; i < kRopeDim; ++i)
    store_u16(dst + 2 * i, codec::bf16_encode_satfinite(sanitize(to_fp32(k_pe[i]))));
}

// Encode one token. `layer_scale` is used in static mode only. Every byte of the record
// (spec.record_bytes()) is written, padding as zero.
template <class In>
NVFP4MLA_HD void encode(const RecordSpec& spec, const In* kv_c, const In* k_pe, float layer_scale,
                        uint8_t* rec) {
  for (int i = 0; i < spec.record_bytes(); ++i) rec[i] = 0;
  if (spec.dtype == CacheDtype::bf16) {
    for (int i = 0; i < kLatentDim; ++i) store_u16(rec + layout::bf16::kLatentOffset + 2 * i, bf16_bits_of(kv_c[i]));
    for (int i = 0; i < kRopeDim; ++i) store_u16(rec + layout::bf16::kRopeOffset + 2 * i, bf16_bits_of(k_pe[i]));
    return;
  }
  if (spec.dtype == CacheDtype::fp8_ds_mla) {
    namespace L = layout::fp8;
    for (int t = 0; t < L::kNumTiles; ++t) {
      float amax = 0.0f;
      for (int i = 0; i < L::kTileDim; ++i) amax = max_f(amax, abs_f(sanitize(to_fp32(kv_c[t * L::kTileDim + i]))));
      const float p = fp8_tile_scale(amax);
      store_f32(rec + L::kTileScaleOffset + 4 * t, p);
      for (int i = 0; i < L::kTileDim; ++i) {
        const int j = t * L::kTileDim + i;
        rec[L::kLatentOffset + j] = codec::e4m3_encode(sanitize(to_fp32(kv_c[j])) / p);
      }
    }
    encode_rope_bf16(k_pe, rec + L::kRopeOffset);
    return;
  }
  // nvfp4_ds_mla
  namespace L = layout::nvfp4;
  float token_amax = 0.0f;
  if (spec.scale_mode == ScaleMode::dynamic)
    for (int i = 0; i < kLatentDim; ++i) token_amax = max_f(token_amax, abs_f(sanitize(to_fp32(kv_c[i]))));
  const float s = nvfp4_writer_scale(spec.scale_mode, layer_scale, token_amax);
  if (spec.scale_mode == ScaleMode::dynamic) store_f32(rec + L::kTokenScaleOffset, s);
  const bool unit = spec.scale_mode == ScaleMode::implicit;
  for (int g = 0; g < L::kNumGroups; ++g) {
    float y[L::kGroupSize];
    float amax = 0.0f;
    for (int i = 0; i < L::kGroupSize; ++i) {
      const float x = sanitize(to_fp32(kv_c[g * L::kGroupSize + i]));
      y[i] = unit ? x : nvfp4_prescale(x, s);
      amax = max_f(amax, abs_f(y[i]));
    }
    const uint8_t scale_byte = nvfp4_group_scale_byte(amax);
    rec[L::kGroupScaleOffset + g] = scale_byte;
    const float d = codec::e4m3_decode(scale_byte);
    for (int i = 0; i < L::kGroupSize; i += 2) {
      const uint8_t lo = nvfp4_nibble(y[i], d), hi = nvfp4_nibble(y[i + 1], d);
      rec[L::kLatentOffset + (g * L::kGroupSize + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
  if (spec.rope == RopeEncoding::fp8) {
    float rope_amax = 0.0f;
    for (int i = 0; i < kRopeDim; ++i) rope_amax = max_f(rope_amax, abs_f(sanitize(to_fp32(k_pe[i]))));
    const float rs = rope_fp8_scale(rope_amax);
    store_f32(rec + L::kRopeScaleOffset, rs);
    for (int i = 0; i < kRopeDim; ++i) rec[L::kRopeOffset + i] = rope_fp8_byte(sanitize(to_fp32(k_pe[i])), rs);
  } else {
    encode_rope_bf16(k_pe, rec + L::kRopeOffset);
  }
}

// Dequantize latent element j of an NVFP4 record with outer scale s: (e2m1 * d) * s.
NVFP4MLA_HD float nvfp4_latent(const uint8_t* rec, int j, float s) {
  const uint8_t byte = rec[layout::nvfp4::kLatentOffset + (j >> 1)];
  const uint8_t nib = (j & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xF);
  const float d = codec::e4m3_decode(rec[layout::nvfp4::kGroupScaleOffset + j / layout::nvfp4::kGroupSize]);
  return (codec::e2m1_decode(nib) * d) * s;
}

// Decode one record to fp32 latent (512) and RoPE (64). `layer_scale` is used in static mode.
NVFP4MLA_HD void decode(const RecordSpec& spec, const uint8_t* rec, float layer_scale, float* kv_c, float* k_pe) {
  if (spec.dtype == CacheDtype::bf16) {
    for (int i = 0; i < kLatentDim; ++i) kv_c[i] = codec::bf16_decode(load_u16(rec + layout::bf16::kLatentOffset + 2 * i));
    for (int i = 0; i < kRopeDim; ++i) k_pe[i] = codec::bf16_decode(load_u16(rec + layout::bf16::kRopeOffset + 2 * i));
    return;
  }
  if (spec.dtype == CacheDtype::fp8_ds_mla) {
    namespace L = layout::fp8;
    for (int j = 0; j < kLatentDim; ++j)
      kv_c[j] = codec::e4m3_decode(rec[L::kLatentOffset + j]) * load_f32(rec + L::kTileScaleOffset + 4 * (j / L::kTileDim));
    for (int i = 0; i < kRopeDim; ++i) k_pe[i] = codec::bf16_decode(load_u16(rec + L::kRopeOffset + 2 * i));
    return;
  }
  namespace L = layout::nvfp4;
  const float s = nvfp4_outer_scale(spec, rec, layer_scale);
  for (int j = 0; j < kLatentDim; ++j) kv_c[j] = nvfp4_latent(rec, j, s);
  if (spec.rope == RopeEncoding::fp8) {
    const float rs = load_f32(rec + L::kRopeScaleOffset);
    for (int i = 0; i < kRopeDim; ++i) k_pe[i] = codec::e4m3_decode(rec[L::kRopeOffset + i]) * rs;
  } else {
    for (int i = 0; i < kRopeDim; ++i) k_pe[i] = codec::bf16_decode(load_u16(rec + L::kRopeOffset + 2 * i));
  }
}

}  // namespace record
}  // namespace nvfp4mla
