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
// Bounds 4, 5, 6 are exactly 2x, 2x, 4x bounds 2, 3, 2 (t = 2.5, 3.5, 5 = 2 * 1.25, 2 * 1.75,
// 4 * 1.25; P and h scale alike, and directed rounding commutes with powers of two while the
// bounds stay normal, which the fast scale range guarantees).
#include <algorithm>
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

// Decoded E4M3 byte (finite, non-negative here: the group scales are RN(ymax / 6) saturated).
NVFP4MLA_HD float e4m3_decode(uint8_t byte) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<unsigned short>(byte)));
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(h2 & 0xFFFFu)));
  return f;
#else
  return codec::e4m3_decode(byte);
#endif
}

// E4M3 byte of RN(y / 6) for y >= 0 (the group scale byte of record::nvfp4_group_scale_byte)
// without a division: q = RN(y c), c = RN(1/6), corrected once with the exact residual
// (Markstein: RN(q + (y - 6q) c) is the correctly rounded quotient). y is clamped to 2784
// first (2784 / 6 = 464 and all above saturate to 448), which also keeps +Inf out.
NVFP4MLA_HD uint8_t e4m3_byte_div6(float y) {
  constexpr float kInv6 = static_cast<float>(1.0 / 6.0);
  const float yc = fminf(y, 2784.0f);
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(yc, kInv6);
  const float r = __fmaf_rn(-6.0f, q, yc);
  const float q1 = __fmaf_rn(r, kInv6, q);
#else
  const float q = yc * kInv6;
  const float r = std::fma(-6.0f, q, yc);
  const float q1 = std::fma(r, kInv6, q);
#endif
  return static_cast<uint8_t>(e4m3x2(q1, 0.0f) & 0xFFu);
}

// Correctly rounded reciprocal.
NVFP4MLA_HD float rcp_rn(float b) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(b);
#else
  return 1.0f / b;
#endif
}

// RN(x / b) from y = RN(1 / b) without a division (Markstein: q = RN(x y) is within an ulp, the
// residual x - b q is exact, and RN(q + r y) is the correctly rounded quotient) where b, y and
// x / b are normal and x is far enough above the underflow threshold for the residual (checked
// from 2^-100 on); callers handle the ends they meet. This form gives +0 for x = -0 (its
// residual is +0); div_rn_by_rcp below keeps the sign.
NVFP4MLA_HD float div_rn_by_rcp_nonneg(float x, float b, float y) {
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(x, y);
  return __fmaf_rn(__fmaf_rn(-b, q, x), y, q);
#else
  const float q = x * y;
  return std::fma(std::fma(-b, q, x), y, q);
#endif
}
NVFP4MLA_HD float div_rn_by_rcp(float x, float b, float y) {
  return codec::bits_float(codec::float_bits(div_rn_by_rcp_nonneg(x, b, y)) | (codec::float_bits(x) & 0x80000000u));
}

// Divisors with a normal reciprocal whose quotients of sanitized values stay finite here.
inline constexpr float kMinRcpDivisor = 0x1p-125f;
inline constexpr float kMaxRcpDivisor = 0x1p125f;

// Below this dividend the reciprocal method's residual is no longer exact (div_rn_by_rcp_nonneg).
inline constexpr float kMinRcpDividend = 0x1p-100f;

// E4M3 bytes of the two RoPE values of a 368-byte record, as record::rope_fp8_byte (lo = r0).
NVFP4MLA_HD uint32_t rope_fp8_pair(float r0, float r1, float rs) {
  if (rs == 0.0f) return 0u;
  if (!(rs >= kMinRcpDivisor && rs <= kMaxRcpDivisor)) return e4m3x2(r0 / rs, r1 / rs);
  const float y = rcp_rn(rs);
  // Tiny values (fp32 inputs; x / rs can still reach an E4M3 rounding boundary) are divided.
  auto quotient = [&](float r) { return fabsf(r) >= kMinRcpDividend ? div_rn_by_rcp(r, rs, y) : r / rs; };
  return e4m3x2(quotient(r0), quotient(r1));
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
// The k-th bound of (2) before the strict bounds' step: RU(s (P - h)) for odd k (|x| >= it),
// RD(s (P + h)) for even k (|x| > it); s24 = s * 2^-24.
NVFP4MLA_HD float nvfp4_directed_bound(int k, float d, float s, float s24) {
  const float p = codec::e2m1_rounding_bound(k) * d;
  const float h = s24 * codec::bits_float(codec::float_bits(p) & 0x7F800000u);  // s ulp(P) / 2
  return (k & 1) ? fma_directed(s, p, -h, true) : fma_directed(s, p, h, false);
}

NVFP4MLA_HD Nvfp4Bounds nvfp4_bounds(float d, float s) {
  Nvfp4Bounds r;
  r.sign = d == 0.0f ? 0u : 8u;
  const float s24 = s * 0x1p-24f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 7; ++k) {
    // Strict bounds (even k) become |x| >= the next float above RD(s (P + h)).
    const float b = nvfp4_directed_bound(k, d, s, s24);
    r.b[k] = (k & 1) ? b : codec::bits_float(codec::float_bits(b) + 1u);
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
  const uint8_t byte = e4m3_byte_div6(ymax);
  const Nvfp4Bounds bd = nvfp4_bounds(e4m3_decode(byte), unit ? 1.0f : s);
  nib[0] = nib[1] = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 16; ++i) nib[i / 8] |= nvfp4_nibble(x[i], bd) << (4 * (i % 8));
  return byte;
}

// ---- BF16 groups: seven packed comparisons per pair of values ----------------------------
// For BF16 inputs |x| is a BF16 value, so |x| >= b (b an fp32 bound of nvfp4_bounds) holds
// iff |x| >= RU_bf16(b). The seven rounded bounds are compared against two values at once
// (HSET2.BF16, an all-ones half per reached bound); the seven masks of a pair of values are
// summed as one 32-bit word w (= n_lo * 0xFFFF + n_hi * 0xFFFF0000) and -w * 0x10001 is
// n_lo + (n_hi << 16) exactly (mod 2^32), so one IMAD per pair also places both counts in
// their nibbles. Values are paired (v_a, v_a+4) so that the two counts of a pair land in
// nibbles a and a + 4 of the packed word.

// Per-half "a >= b" masks of two non-negative, non-NaN BF16 pairs.
NVFP4MLA_HD uint32_t bf16x2_ge_mask(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t m;
  asm("set.ge.u32.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(a), "r"(b));
  return m;
#else
  // Non-negative BF16 values compare like their bit patterns.
  return ((a & 0xFFFFu) >= (b & 0xFFFFu) ? 0xFFFFu : 0u) | ((a >> 16) >= (b >> 16) ? 0xFFFF0000u : 0u);
#endif
}

// Byte permute (PRMT, default mode; selector nibbles with bit 3 replicate the byte's sign).
NVFP4MLA_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
#else
  const uint64_t v = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (4 * i)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(v >> (8 * (s & 7u))) & 0xFFu;
    if (s & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    r |= byte << (8 * i);
  }
  return r;
#endif
}

// Magnitudes of a BF16 pair. On the device an abs that HSET2 can take as an operand modifier.
NVFP4MLA_HD uint32_t bf16x2_abs(uint32_t a) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("abs.bf16x2 %0, %1;" : "=r"(r) : "r"(a));
  return r;
#else
  return a & 0x7FFF7FFFu;
#endif
}

// Per-half "a > b" masks of two non-negative, non-NaN BF16 pairs.
NVFP4MLA_HD uint32_t bf16x2_gt_mask(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t m;
  asm("set.gt.u32.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(a), "r"(b));
  return m;
#else
  return ((a & 0xFFFFu) > (b & 0xFFFFu) ? 0xFFFFu : 0u) | ((a >> 16) > (b >> 16) ? 0xFFFF0000u : 0u);
#endif
}

// BF16 bound k of a value pair reached: |x| >= b[k] for odd k, |x| > b[k] for even k.
NVFP4MLA_HD uint32_t bf16x2_bound_mask(int k, uint32_t abs_pair, uint32_t bound) {
  return (k & 1) ? bf16x2_ge_mask(abs_pair, bound) : bf16x2_gt_mask(abs_pair, bound);
}

// The seven bounds of nvfp4_bounds(d, s) among BF16 values, each in both halves of a word
// (d > 0; s as there): for odd k, RU_bf16 of the bound (|x| >= it); for even k, RD_bf16 of
// RD(s (P + h)) (|x| > it: a BF16 value exceeds an fp32 value iff it exceeds its RD_bf16).
// Bounds 0..3 are computed; 4..6 follow from 2..3 by adding 1 or 2 to the BF16 exponents
// (exact, see the top), so a table of the first four per scale byte serves as well.
NVFP4MLA_HD void nvfp4_bounds_bf16x2_first4(float d, float s, uint32_t (&b)[4]) {
  const float s24 = s * 0x1p-24f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 4; ++k) {
    // Odd k: RU(s (P - h)) rounded up to BF16 (a carry into the exponent, or to +Inf, stays
    // correct). Even k: RD(s (P + h)) truncated.
    const uint32_t u = codec::float_bits(nvfp4_directed_bound(k, d, s, s24)) + ((k & 1) ? 0xFFFFu : 0u);
    b[k] = byte_perm(u, 0u, 0x3232u);
  }
}
NVFP4MLA_HD void nvfp4_bounds_bf16x2_from4(const uint32_t (&first4)[4], uint32_t (&b)[7]) {
  for (int k = 0; k < 4; ++k) b[k] = first4[k];
  b[4] = b[2] + 0x00800080u;
  b[5] = b[3] + 0x00800080u;
  b[6] = b[2] + 0x01000100u;
}
NVFP4MLA_HD void nvfp4_bounds_bf16x2(float d, float s, uint32_t (&b)[7]) {
  uint32_t first4[4];
  nvfp4_bounds_bf16x2_first4(d, s, first4);
  nvfp4_bounds_bf16x2_from4(first4, b);
}

// Packed BF16 product of two pairs, rounded to nearest even (exact for the products used here).
NVFP4MLA_HD uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  auto half = [](uint32_t x, uint32_t y) -> uint32_t {
    return codec::bf16_encode_rn(codec::bf16_decode(static_cast<uint16_t>(x)) * codec::bf16_decode(static_cast<uint16_t>(y)));
  };
  return half(a & 0xFFFFu, b & 0xFFFFu) | (half(a >> 16, b >> 16) << 16);
#endif
}

// nvfp4_bounds_bf16x2(d, 1) (implicit mode, d > 0): with s = 1 every bound is P = t d itself,
// which has at most 3 + 4 significant bits and so is a BF16 value, t d exactly.
NVFP4MLA_HD void nvfp4_bounds_bf16x2_unit(float d, uint32_t (&b)[7]) {
  const uint32_t dd = byte_perm(codec::float_bits(d), 0u, 0x3232u);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 7; ++k) {
    const uint32_t t = codec::float_bits(codec::e2m1_rounding_bound(k)) >> 16;
    b[k] = bf16x2_mul(dd, t | (t << 16));
  }
}

// Largest |x| bit pattern (0x0000..0x7FFF; >= 0x7F80 when some value is Inf or NaN) of
// 2n BF16 values held as n words.
template <int N>
NVFP4MLA_HD uint32_t bf16_abs_max_bits(const uint32_t (&w)[N]) {
  uint32_t m = 0;
#if defined(__CUDA_ARCH__)
  // Packed BF16 max of magnitudes that keeps NaN (as 0x7FFF): HMNMX2 takes |a|, |b| itself.
  m = w[0];
#pragma unroll
  for (int i = 1; i < N; ++i) asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(m), "r"(w[i]));
  m &= 0x7FFF7FFFu;
  return max(m & 0xFFFFu, m >> 16);
#else
  for (int i = 0; i < N; ++i) {
    const uint32_t a = w[i] & 0x7FFF7FFFu;
    m = std::max(m, std::max(a & 0xFFFFu, a >> 16));
  }
  return m;
#endif
}

// RN(gmax / s) of the recipe (record::nvfp4_prescale) for gmax >= +0 (a maximum of magnitudes)
// and s = 0 or s in [kMinFastScale, kMaxFastScale], with inv_s = nvfp4_inverse_scale(s) instead
// of a division; an overflow gives NaN, which e4m3_byte_div6 turns into the recipe's saturated
// byte as it does +Inf.
NVFP4MLA_HD float nvfp4_inverse_scale(float s) { return s == 0.0f ? 0.0f : rcp_rn(s); }
NVFP4MLA_HD float nvfp4_prescale_by_rcp(float gmax, float s, float inv_s) { return div_rn_by_rcp_nonneg(gmax, s, inv_s); }

// Nibbles of a 16-value BF16 group (w[i] = values 2i, 2i+1; all finite) against the group's
// BF16 bounds; zero nibbles (signs included) when d_zero, as the recipe writes for d = 0.
NVFP4MLA_HD void nvfp4_nibbles_bf16(const uint32_t (&w)[8], const uint32_t (&b)[7], bool d_zero, uint32_t (&nib)[2]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < 2; ++j) {
    const uint32_t* in = w + 4 * j;  // values 8j .. 8j+7
    const uint32_t p[4] = {byte_perm(in[0], in[2], 0x5410u), byte_perm(in[0], in[2], 0x7632u),
                           byte_perm(in[1], in[3], 0x5410u), byte_perm(in[1], in[3], 0x7632u)};  // (v_a, v_a+4)
    // Sign bits: value 2m in bit 3 of byte m, value 2m+1 in bit 7 (sign-replicating PRMT).
    const uint32_t even = byte_perm(p[0], p[2], 0xFBD9u), odd = byte_perm(p[1], p[3], 0xFBD9u);
    uint32_t acc = (even & 0x08080808u) | (odd & 0x80808080u);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int a = 0; a < 4; ++a) {
      const uint32_t av = bf16x2_abs(p[a]);
      uint32_t m[7];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int k = 0; k < 7; ++k) m[k] = bf16x2_bound_mask(k, av, b[k]);
      const uint32_t sum = (m[0] + m[1] + m[2]) + (m[3] + m[4] + m[5]) + m[6];
      acc += sum * (0xFFFEFFFFu << (4 * a));  // (n_lo << 4a) + (n_hi << (4a + 16))
    }
    nib[j] = d_zero ? 0u : acc;
  }
}

// One 16-value BF16 group (w[i] = values 2i, 2i+1; all finite): same bytes as nvfp4_group of
// the decoded values. `ymax` = RN(gmax / s) of the group's largest |x| (gmax itself when
// kUnit, the implicit mode, where s is unused), else s = 0 or s in [kMinFastScale, kMaxFastScale].
template <bool kUnit>
NVFP4MLA_HD uint8_t nvfp4_group_bf16(const uint32_t (&w)[8], float ymax, float s, uint32_t (&nib)[2]) {
  const uint8_t byte = e4m3_byte_div6(ymax);
  const float d = e4m3_decode(byte);
  uint32_t b[7];
  if (kUnit) {
    nvfp4_bounds_bf16x2_unit(d, b);
  } else {
    nvfp4_bounds_bf16x2(d, s, b);
  }
  nvfp4_nibbles_bf16(w, b, d == 0.0f, nib);
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
