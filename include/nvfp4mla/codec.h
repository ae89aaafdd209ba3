#pragma once
// Scalar codecs for E2M1 (FP4), E4M3 (e4m3fn), BF16 and FP16.
//
// Encoders round to nearest, ties to even, saturate finite overflow (and infinities) to the
// largest finite magnitude, and keep the sign bit of negative values that round to zero.
// They are bit-identical to NVIDIA's host conversions
//   __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)
//   __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)
// for every input, NaN included (E4M3 NaN -> 0x7F, E2M1 NaN -> +6). Decoders are exact.
// Everything works on bit patterns with integer arithmetic, so the same code runs on the host
// and on the device and does not depend on FTZ or rounding-mode settings.
#include <cstdint>
#include <cstring>

#include "nvfp4mla/hd.h"

namespace nvfp4mla::codec {

NVFP4MLA_HD uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
NVFP4MLA_HD float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// Round the magnitude `full` (an integer significand) right by `shift` bits, ties to even.
NVFP4MLA_HD uint32_t shift_round_even(uint32_t full, uint32_t shift) {
  const uint32_t q = full >> shift;
  const uint32_t rem = full & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// ---- E4M3 (bias 7, max 448, min normal 2^-6, min subnormal 2^-9, NaN 0x7F/0xFF) ----------
inline constexpr float kE4M3Max = 448.0f;
inline constexpr uint8_t kE4M3MaxByte = 0x7E;
inline constexpr uint8_t kE4M3NaNByte = 0x7F;

NVFP4MLA_HD uint8_t e4m3_encode(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return kE4M3NaNByte;  // NaN (canonical, positive)
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (a <= 0x3A800000u) return sign;                       // |x| <= 2^-10: rounds to (signed) zero
  if (a > 0x43E80000u) return sign | kE4M3MaxByte;         // |x| > 464 (or inf): saturate to 448
  const int32_t exp = static_cast<int32_t>(a >> 23) - 127;
  const uint32_t mant = a & 0x7FFFFFu;
  uint32_t q;
  if (exp >= -6) {
    // Normal: the exponent field is adjacent to the mantissa, so a carry out of the
    // mantissa correctly bumps the exponent.
    q = shift_round_even((static_cast<uint32_t>(exp + 7) << 23) | mant, 20);
  } else {
    // Subnormal result, units of 2^-9: value = (1.mant) * 2^exp = full * 2^(exp-23).
    q = shift_round_even(mant | 0x800000u, static_cast<uint32_t>(14 - exp));
  }
  return static_cast<uint8_t>(sign | q);
}

NVFP4MLA_HD float e4m3_decode(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xFu;
  const uint32_t m = b & 0x7u;
  if (e == 0) {
    // Subnormal: m * 2^-9, exact in fp32.
    return bits_float(float_bits(static_cast<float>(m) * 0x1p-9f) | sign);
  }
  if (e == 0xF && m == 0x7) return bits_float(0x7FC00000u | sign);
  return bits_float(sign | ((e - 7u + 127u) << 23) | (m << 20));
}

// ---- E2M1 (values 0, 0.5, 1, 1.5, 2, 3, 4, 6; sign in bit 3) ----------------------------
inline constexpr float kE2M1Max = 6.0f;

// Rounding bound k (0..6) of E2M1 magnitudes: the midpoint of magnitudes k and k + 1
// (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5). A value on a bound rounds to the even code: up for
// odd k, down for even k.
NVFP4MLA_HD constexpr float e2m1_rounding_bound(int k) {
  constexpr float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, kE2M1Max};
  return 0.5f * (kMagnitudes[k] + kMagnitudes[k + 1]);
}

NVFP4MLA_HD uint8_t e2m1_encode(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7;  // NaN -> +6, as NVIDIA's conversion does
  const uint8_t sign = static_cast<uint8_t>((u >> 28) & 0x8u);
  if (a <= 0x3E800000u) return sign;         // |x| <= 0.25
  if (a > 0x40C00000u) return sign | 0x7u;   // |x| > 6 (or inf): saturate
  const int32_t exp = static_cast<int32_t>(a >> 23) - 127;
  const uint32_t mant = a & 0x7FFFFFu;
  uint32_t q;
  if (exp >= 0) {
    q = shift_round_even((static_cast<uint32_t>(exp + 1) << 23) | mant, 22);
  } else {
    // Subnormal result, units of 0.5: value = full * 2^(exp-23).
    q = shift_round_even(mant | 0x800000u, static_cast<uint32_t>(22 - exp));
  }
  return static_cast<uint8_t>(sign | q);
}

NVFP4MLA_HD float e2m1_decode(uint8_t nibble) {
  const uint32_t sign = static_cast<uint32_t>(nibble & 0x8u) << 28;
  const uint32_t e = (nibble >> 1) & 0x3u;
  const uint32_t m = nibble & 0x1u;
  if (e == 0) return bits_float(float_bits(m ? 0.5f : 0.0f) | sign);
  return bits_float(sign | ((e - 1u + 127u) << 23) | (m << 22));
}

// E2M1 to BF16 without tables, for kernels that feed BF16 MMAs: eight nibbles (element i in
// bits 4i..4i+3) become four BF16 pairs, pair e holding elements e (low half) and e + 4 (high
// half). Each nibble's exponent and mantissa bits drop into the lowest BF16 exponent bits and the
// top mantissa bit, its sign onto the BF16 sign, so a value is e2m1 * 2^-126 (0.5 lands on the
// subnormal 2^-127). One BF16 multiply by d * kE2m1PairScale then gives e2m1 * d *
// 2^-kE2m1PairShift exactly for any E4M3 d (at most 6 significant bits, far from the BF16
// subnormal range, and the scale itself stays below the BF16 maximum).
inline constexpr int kE2m1PairShift = 8;
inline constexpr float kE2m1PairScale = 0x1p118f;  // 2^(126 - kE2m1PairShift)
// How: nibbles e and e + 4 sit 16 bits apart, as the halves of their pair do. Masking the two and
// one multiply by 2^6 + 2^12 (2^2 + 2^8 for the nibble 4 bits higher) makes two non-overlapping
// copies of each, one with the exponent and mantissa bits at BF16 bits 6..8, one with the sign at
// bit 15; a last mask keeps those bits. Three operations per pair (a mask, a multiply, a mask)
// where shifting the magnitude and the sign separately took four or five.
NVFP4MLA_HD void e2m1x8_to_bf16_pairs(uint32_t nib, uint32_t (&pair)[4]) {
  constexpr uint32_t kKeep = 0x81C081C0u;  // sign and the 3 exponent/mantissa bits of each half
  const uint32_t upper = nib >> 8;          // nibbles 2, 3, 6, 7 where 0, 1, 4, 5 were
  pair[0] = ((nib & 0x000F000Fu) * 0x1040u) & kKeep;
  pair[1] = ((nib & 0x00F000F0u) * 0x0104u) & kKeep;
  pair[2] = ((upper & 0x000F000Fu) * 0x1040u) & kKeep;
  pair[3] = ((upper & 0x00F000F0u) * 0x0104u) & kKeep;
}

// ---- BF16 ------------------------------------------------------------------------------
// IEEE round-to-nearest-even; overflow goes to infinity; NaN becomes 0x7FFF (as
// __float2bfloat16_rn on the host). Used where BF16 carries values unchanged (outputs,
// the bf16 reference record).
NVFP4MLA_HD uint16_t bf16_encode_rn(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  const uint32_t rem = u & 0xFFFFu;
  uint32_t r = u >> 16;
  if (rem > 0x8000u || (rem == 0x8000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(r);
}

// Round to nearest even, saturating finite overflow and infinities to +/-0x1.FEp127
// (0x7F7F); NaN -> 0x7FFF. Used for raw BF16 RoPE fields in quantized records.
NVFP4MLA_HD uint16_t bf16_encode_satfinite(float x) {
  const uint16_t r = bf16_encode_rn(x);
  if ((r & 0x7FFFu) == 0x7F80u) return static_cast<uint16_t>((r & 0x8000u) | 0x7F7Fu);
  return r;
}

NVFP4MLA_HD float bf16_decode(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// ---- FP16 (inputs may arrive as FP16) ------------------------------------------------------
NVFP4MLA_HD float fp16_decode(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0) return bits_float(float_bits(static_cast<float>(m) * 0x1p-24f) | sign);
  if (e == 0x1F) return bits_float(sign | 0x7F800000u | (m << 13));
  return bits_float(sign | ((e - 15u + 127u) << 23) | (m << 13));
}

}  // namespace nvfp4mla::codec
