#pragma once
// Turning raw records into BF16 K rows in shared memory, shared by the decode and extend
// kernels. A K row is the dequantized latent (512) followed by the dequantized RoPE (64); V
// is its first 512 values. Every format is read through format.h offsets and the reader
// expressions of record.h: x = (e2m1 * d) * s, r = e4m3 * rs, fp8: e4m3 * p.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/record.h"
#include "ops/sparse_mla/mma_sm80.cuh"

namespace nvfp4mla::cuda {

// A record format fixed at compile time (the kernels are instantiated per format).
template <CacheDtype D, RopeEncoding R, ScaleMode M>
struct Format {
  static constexpr RecordSpec spec{D, R, M};
  static constexpr int kRecordBytes = spec.record_bytes();
  // bf16 records are already K rows: they are copied straight into the K tile.
  static constexpr bool kRawIsKRow = D == CacheDtype::bf16;
};

// A K row is dequantized in 36 units of 16 values: 32 latent groups, then 4 RoPE chunks.
inline constexpr int kUnitsPerRow = kQkDim / 16;
inline constexpr int kLatentUnits = kLatentDim / 16;

__device__ __forceinline__ void store_16_bf16(__nv_bfloat16* dst, const float (&v)[16]) {
  uint4 w0, w1;
  w0.x = ptx::pack_bf16x2(v[0], v[1]);   w0.y = ptx::pack_bf16x2(v[2], v[3]);
  w0.z = ptx::pack_bf16x2(v[4], v[5]);   w0.w = ptx::pack_bf16x2(v[6], v[7]);
  w1.x = ptx::pack_bf16x2(v[8], v[9]);   w1.y = ptx::pack_bf16x2(v[10], v[11]);
  w1.z = ptx::pack_bf16x2(v[12], v[13]); w1.w = ptx::pack_bf16x2(v[14], v[15]);
  reinterpret_cast<uint4*>(dst)[0] = w0;
  reinterpret_cast<uint4*>(dst)[1] = w1;
}

__device__ __forceinline__ void store_16_zero(__nv_bfloat16* dst) {
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(0, 0, 0, 0);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(0, 0, 0, 0);
}

// Aligned fp32 field of a record in shared memory (record widths and fp32 offsets are
// multiples of 4).
__device__ __forceinline__ float load_f32_aligned(const uint8_t* p) { return *reinterpret_cast<const float*>(p); }

// 16 E4M3 bytes times a scale: e4m3 -> f16 pairs in hardware (exact: E4M3 is a subset of
// FP16, subnormals included), then fp32 products.
__device__ __forceinline__ void e4m3x16_scaled(const uint8_t* src, float scale, float (&v)[16]) {
  const uint4 b = *reinterpret_cast<const uint4*>(src);
  const uint32_t w[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    v[2 * i] = f.x * scale;
    v[2 * i + 1] = f.y * scale;
  }
}

// Two E2M1 nibbles (one byte) as FP16 bit patterns: sign to bit 15, exponent and mantissa to
// bits 10..9. The FP16 value is exactly e2m1 * 2^-14 (normal and subnormal alike).
__device__ __forceinline__ float2 e2m1x2_times_2pow_m14(uint32_t byte) {
  const uint32_t h2 = ((byte & 0x7u) << 9) | ((byte & 0x8u) << 12) | ((byte & 0x70u) << 21) | ((byte & 0x80u) << 24);
  return __half22float2(*reinterpret_cast<const __half2*>(&h2));
}

// Dequantize unit `u` (0..35) of one record into dst (16 BF16 values of the K row).
template <class F>
__device__ __forceinline__ void dequant_unit(const uint8_t* rec, int u, float layer_scale, __nv_bfloat16* dst) {
  float v[16];
  if constexpr (F::spec.dtype == CacheDtype::nvfp4_ds_mla) {
    namespace L = layout::nvfp4;
    if (u < kLatentUnits) {
      float s = 1.0f;
      if constexpr (F::spec.scale_mode == ScaleMode::dynamic) s = load_f32_aligned(rec + L::kTokenScaleOffset);
      if constexpr (F::spec.scale_mode == ScaleMode::static_calibrated) s = layer_scale;
      // (e2m1 * d) * s, with e2m1 * d formed as (e2m1 * 2^-14) * (d * 2^14): both factors and
      // the product are exact, so this equals the reader expression of record.h.
      const float d14 = codec::e4m3_decode(rec[L::kGroupScaleOffset + u]) * 16384.0f;
      const uint2 nib = *reinterpret_cast<const uint2*>(rec + L::kLatentOffset + 8 * u);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float2 e = e2m1x2_times_2pow_m14(((i < 4 ? nib.x : nib.y) >> (8 * (i % 4))) & 0xFFu);
        v[2 * i] = e.x * d14;
        v[2 * i + 1] = e.y * d14;
        if constexpr (F::spec.scale_mode != ScaleMode::implicit) {
          v[2 * i] *= s;
          v[2 * i + 1] *= s;
        }
      }
      store_16_bf16(dst, v);
    } else if constexpr (F::spec.rope == RopeEncoding::fp8) {
      e4m3x16_scaled(rec + L::kRopeOffset + 16 * (u - kLatentUnits), load_f32_aligned(rec + L::kRopeScaleOffset), v);
      store_16_bf16(dst, v);
    } else {
      const uint4* src = reinterpret_cast<const uint4*>(rec + L::kRopeOffset + 32 * (u - kLatentUnits));
      reinterpret_cast<uint4*>(dst)[0] = src[0];
      reinterpret_cast<uint4*>(dst)[1] = src[1];
    }
  } else if constexpr (F::spec.dtype == CacheDtype::fp8_ds_mla) {
    namespace L = layout::fp8;
    if (u < kLatentUnits) {
      const float p = load_f32_aligned(rec + L::kTileScaleOffset + 4 * (u * 16 / L::kTileDim));
      e4m3x16_scaled(rec + L::kLatentOffset + 16 * u, p, v);
      store_16_bf16(dst, v);
    } else {
      const uint4* src = reinterpret_cast<const uint4*>(rec + L::kRopeOffset + 32 * (u - kLatentUnits));
      reinterpret_cast<uint4*>(dst)[0] = src[0];
      reinterpret_cast<uint4*>(dst)[1] = src[1];
    }
  }
}

}  // namespace nvfp4mla::cuda
