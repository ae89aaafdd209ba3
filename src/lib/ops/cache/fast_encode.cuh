#pragma once
// Division-free NVFP4 and FP8 encoders for the GPU writer. They give the same bytes as the
// pinned recipes of record.h (tests/unit/fast_encode_test.cpp); host builds stand in the codec
// for the hardware conversions so the same functions can be tested on the CPU.
//
// NVFP4 nibbles without dividing: with y = RN(|x| / s), d the decoded group scale (> 0) and
// P = t d (exact: t has <= 3 significant bits, d 4), for the E2M1 rounding thresholds t:
//  (1) RN(y / d) >= t  <=>  y >= P  for t in {0.75, 1.75, 3.5} (ties round up to the even code),
//      RN(y / d) >  t  <=>  y >  P  for t in {0.25, 1.25, 2.5, 5} (ties round down):
//      the fp32 neighbours of t are closer to t (relatively, <= 2^-24 half-gaps) than those of
//      P are to P (> 2^-24; P is never a power of two for the first three t), so no y other
//      than P itself has a quotient that rounds onto t.
//  (2) RN(|x| / s) >= P  <=>  |x| >= RU(s (P - h)),  RN(|x| / s) > P  <=>  |x| > RD(s (P + h)),
//      h = ulp(P) / 2 (P has an even significand, so the ties go to P).
// So the nibble magnitude is the number of the seven per-group bounds that |x| reaches.
#include <cfloat>
#include <cstdint>

#include <cmath>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/record.h"

namespace nvfp4mla::fastenc {

// Outer scales for which the bounds of (2) are exact (s h stays a normal fp32).
inline constexpr float kMinFastScale = 0x1p-60f;
inline constexpr float kMaxFastScale = 0x1p60f;

NVFP4MLA_HD bool is_finite(float x) { return fabsf(x) <= FLT_MAX; }  // false for NaN

// E4M3 bytes of two values (lo in bits 0-7). The sm_89+ conversion rounds to nearest even and
// saturates like codec::e4m3_encode (the codec tests check it against NVIDIA's conversion).
NVFP4MLA_HD uint32_t e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return codec::e4m3_encode(lo) | (static_cast<uint32_t>(codec::e4m3_encode(hi)) << 8);
#endif
}

// fma rounded toward +inf (`up`) or -inf. The host version is exact only where a b + c fits a
// double, which holds for the bounds below (24-bit s times a 25-bit P -/+ h).
NVFP4MLA_HD float fma_directed(float a, float b, float c, bool up) {
#if defined(__CUDA_ARCH__)
  return up ? __fmaf_ru(a, b, c) : __fmaf_rd(a, b, c);
#else
  const double v = static_cast<double>(a) * b + c;
  const float f = static_cast<float>(v);
  return (up ? static_cast<double>(f) < v : static_cast<double>(f) > v) ? std::nextafter(f, up ? INFINITY : -INFINITY) : f;
#endif
}

// Seven increasing bounds on |x| (nibble magnitude = how many |x| reaches) and the sign bit
// mask (0 when d = 0: the recipe writes a zero nibble then, even for negative values).
struct Nvfp4Bounds {
  float b[7];
  uint32_t sign;
};

// `d` = decoded group scale, `s` = outer scale (1 in implicit mode), 0 or in
// [kMinFastScale, kMaxFastScale].
NVFP4MLA_HD Nvfp4Bounds nvfp4_bounds(float d, float s) {
  Nvfp4Bounds r;
  r.sign = d == 0.0f ? 0u : 8u;
  const float s24 = s * 0x1p-24f;
  const float t[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 7; ++k) {
    const float p = t[k] * d;
    const float h = s24 * codec::bits_float(codec::float_bits(p) & 0x7F800000u);  // s ulp(P) / 2
    // Strict bounds (even k) become |x| >= the next float above RD(s (P + h)).
    r.b[k] = (k & 1) ? fma_directed(s, p, -h, true)
                     : codec::bits_float(codec::float_bits(fma_directed(s, p, h, false)) + 1u);
    if (d == 0.0f) r.b[k] = INFINITY;
  }
  return r;
}

// Nibble of a finite (sanitized) value.
NVFP4MLA_HD uint32_t nvfp4_nibble(float x, const Nvfp4Bounds& bd) {
  const float a = fabsf(x);
  uint32_t n = (codec::float_bits(x) >> 28) & bd.sign;
#if defined(__CUDA_ARCH__)
  // set.ge gives an all-ones mask per reached bound: one FSET each, summed by 3-input adds.
  int32_t m[7];
#pragma unroll
  for (int k = 0; k < 7; ++k) asm("set.ge.s32.f32 %0, %1, %2;" : "=r"(m[k]) : "f"(a), "f"(bd.b[k]));
  return n - static_cast<uint32_t>(((m[0] + m[1]) + (m[2] + m[3])) + ((m[4] + m[5]) + m[6]));
#else
  for (int k = 0; k < 7; ++k) n += a >= bd.b[k] ? 1u : 0u;
  return n;
#endif
}

// One 16-value group of finite (sanitized) values: returns the E4M3 scale byte and writes the
// packed nibbles (value 2i in the low nibble of byte i). `gmax` = max |x| of the group;
// `unit` for the implicit mode, else s = 0 or s in [kMinFastScale, kMaxFastScale].
NVFP4MLA_HD uint8_t nvfp4_group(const float (&x)[16], float gmax, float s, bool unit, uint32_t (&nib)[2]) {
  const float ymax = unit ? gmax : record::nvfp4_prescale(gmax, s);  // RN(x / s) is monotone
  const uint8_t byte = static_cast<uint8_t>(e4m3x2(ymax / 6.0f, 0.0f) & 0xFFu);
  const Nvfp4Bounds bd = nvfp4_bounds(codec::e4m3_decode(byte), unit ? 1.0f : s);
  nib[0] = nib[1] = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 16; ++i) nib[i / 8] |= nvfp4_nibble(x[i], bd) << (4 * (i % 8));
  return byte;
}

// 1 / p for an fp8_ds_mla tile scale p (a power of two in [2^-126, 2^120]): x * (1 / p) is
// the same correctly rounded value as x / p.
NVFP4MLA_HD float fp8_inverse_scale(float p) {
  return codec::bits_float((254u - (codec::float_bits(p) >> 23)) << 23);
}

// E4M3 bytes of four finite values scaled by `inv`, little-endian.
NVFP4MLA_HD uint32_t fp8_word(float x0, float x1, float x2, float x3, float inv) {
  return e4m3x2(x0 * inv, x1 * inv) | (e4m3x2(x2 * inv, x3 * inv) << 16);
}

}  // namespace nvfp4mla::fastenc
