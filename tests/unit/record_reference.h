#pragma once
// An independent reference model of the record formats, used only by the tests.
//
// It is deliberately written differently from include/nvfp4mla/record.h and codec.h so that
// a shared mistake is unlikely: quantizers are nearest-value searches over explicit value
// tables with an explicit ties-to-even rule (no bit tricks), fp32 operations are computed in
// double precision and rounded once to float (exact for a single +, *, / of two floats,
// since 53 >= 2*24 + 2), the fp8_ds_mla tile scale is found by doubling, and all byte
// offsets come from the literal tables of docs/FORMAT.md, not from format.h.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace nvfp4mla_test::ref {

// ---- byte tables of docs/FORMAT.md, written out literally ---------------------------------
inline constexpr int kLatent = 512, kRope = 64;
inline constexpr int kBf16Bytes = 1152, kBf16RopeAt = 1024;
inline constexpr int kFp8Bytes = 656, kFp8TileScalesAt = 512, kFp8RopeAt = 528;
inline constexpr int kNvfp4ScalesAt = 256, kNvfp4RopeScaleAt = 288, kNvfp4TokenScaleAt = 292,
                     kNvfp4RopeAt = 304, kNvfp4Fp8RopeBytes = 368, kNvfp4Bf16RopeBytes = 432;

// fp32 nearest to 1/448 and to 1/2688 (worked out with exact rational arithmetic).
inline constexpr uint32_t kC448Bits = 0x3B124925u;   // 9586981 * 2^-32
inline constexpr uint32_t kC2688Bits = 0x39C30C31u;  // 12782641 * 2^-35
inline float c448() { return std::bit_cast<float>(kC448Bits); }
inline float c2688() { return std::bit_cast<float>(kC2688Bits); }

enum class Kind { bf16_1152, fp8_656, nvfp4_368, nvfp4_432 };
enum class Outer { unit, layer, token };  // implicit, static, dynamic

inline int width(Kind k) {
  switch (k) {
    case Kind::bf16_1152: return kBf16Bytes;
    case Kind::fp8_656: return kFp8Bytes;
    case Kind::nvfp4_368: return kNvfp4Fp8RopeBytes;
    case Kind::nvfp4_432: return kNvfp4Bf16RopeBytes;
  }
  return 0;
}

// ---- single-rounding fp32 arithmetic --------------------------------------------------------
inline float div32(float a, float b) { return static_cast<float>(static_cast<double>(a) / b); }
inline float mul32(float a, float b) { return static_cast<float>(static_cast<double>(a) * b); }

// ---- value tables -------------------------------------------------------------------------
// E4M3 magnitude of code c (0..126, in increasing order): c = 8e + m.
inline double e4m3_magnitude(int c) {
  const int e = c / 8, m = c % 8;
  return e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
}
inline const std::vector<double>& e4m3_table() {
  static const std::vector<double> t = [] {
    std::vector<double> v;
    for (int c = 0; c <= 126; ++c) v.push_back(e4m3_magnitude(c));
    return v;
  }();
  return t;
}
inline const std::vector<double>& e2m1_table() {
  static const std::vector<double> t = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return t;
}

// Index of the table entry nearest to a >= 0; equidistant: the even index; beyond the last
// entry: the last (saturation).
inline int nearest_index(const std::vector<double>& t, double a) {
  const auto above = std::upper_bound(t.begin(), t.end(), a);
  const int lo = static_cast<int>(above - t.begin()) - 1;
  if (lo + 1 == static_cast<int>(t.size())) return lo;
  const double down = a - t[lo], up = t[lo + 1] - a;
  if (down < up) return lo;
  if (up < down) return lo + 1;
  return lo % 2 == 0 ? lo : lo + 1;
}

// Quantizers for finite inputs; the sign bit follows the input's sign (so -tiny -> "-0").
inline uint8_t e4m3(float x) {
  return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | nearest_index(e4m3_table(), std::fabs(x)));
}
inline uint8_t e2m1(float x) {
  return static_cast<uint8_t>((std::signbit(x) ? 0x8 : 0) | nearest_index(e2m1_table(), std::fabs(x)));
}
inline double e4m3_value(uint8_t b) { return (b & 0x80 ? -1.0 : 1.0) * e4m3_magnitude(b & 0x7F); }
inline double e2m1_value(uint8_t n) { return (n & 0x8 ? -1.0 : 1.0) * e2m1_table()[n & 0x7]; }

// BF16: pick the nearer of the two BF16 values around x (ties: even pattern). The value above
// the largest finite BF16 is 2^128 ("infinity"). saturate: clamp it to 0x7F7F.
inline uint16_t bf16(float x, bool saturate) {
  if (std::isnan(x)) return 0x7FFF;
  if (std::isinf(x)) return saturate ? (x < 0 ? 0xFF7F : 0x7F7F) : (x < 0 ? 0xFF80 : 0x7F80);
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint16_t below = static_cast<uint16_t>((u >> 16) & 0x7FFFu);  // truncated magnitude
  const auto magnitude = [](uint16_t p) {
    return p == 0x7F80 ? std::ldexp(1.0, 128) : static_cast<double>(std::bit_cast<float>(uint32_t(p) << 16));
  };
  const double a = std::fabs(static_cast<double>(x));
  const double down = a - magnitude(below), up = magnitude(below + 1) - a;
  uint16_t pick = (down < up || (down == up && below % 2 == 0)) ? below : static_cast<uint16_t>(below + 1);
  if (pick == 0x7F80 && saturate) pick = 0x7F7F;
  return static_cast<uint16_t>(sign | pick);
}
inline float bf16_value(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

// ---- recipes ---------------------------------------------------------------------------------
inline float clean(float x) {
  if (std::isnan(x)) return 0.0f;
  if (std::isinf(x)) return x > 0 ? FLT_MAX : -FLT_MAX;
  return x;
}
// Largest magnitude; max_abs sanitizes raw inputs first, max_magnitude takes values as they are.
inline float max_magnitude(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}
inline float max_abs(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(clean(x[i])));
  return m;
}
// Smallest power of two p >= 2^-126 with amax <= 448 p; 1 for amax = 0.
inline float fp8_tile_scale(float amax) {
  if (amax == 0.0f) return 1.0f;
  double p = std::ldexp(1.0, -126);
  while (static_cast<double>(amax) > 448.0 * p) p *= 2.0;
  return static_cast<float>(p);
}

inline void put_u16(std::vector<uint8_t>& r, int at, uint16_t v) { r[at] = uint8_t(v & 0xFF); r[at + 1] = uint8_t(v >> 8); }
inline void put_f32(std::vector<uint8_t>& r, int at, float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) r[at + i] = uint8_t(u >> (8 * i));
}
inline float get_f32(const uint8_t* r, int at) {
  uint32_t u = 0;
  for (int i = 0; i < 4; ++i) u |= uint32_t(r[at + i]) << (8 * i);
  return std::bit_cast<float>(u);
}
inline uint16_t get_u16(const uint8_t* r, int at) { return uint16_t(r[at] | (r[at + 1] << 8)); }

// Encode one token given as fp32 values. `layer_scale` is used for Outer::layer only.
// The bf16 record rounds fp32 inputs to nearest even (NaN -> 0x7FFF, overflow -> infinity).
inline std::vector<uint8_t> encode(Kind kind, Outer outer, const float* kv, const float* pe, float layer_scale) {
  std::vector<uint8_t> r(width(kind), 0);
  if (kind == Kind::bf16_1152) {
    for (int j = 0; j < kLatent; ++j) put_u16(r, 2 * j, bf16(kv[j], false));
    for (int i = 0; i < kRope; ++i) put_u16(r, kBf16RopeAt + 2 * i, bf16(pe[i], false));
    return r;
  }
  if (kind == Kind::fp8_656) {
    for (int t = 0; t < 4; ++t) {
      const float p = fp8_tile_scale(max_abs(kv + 128 * t, 128));
      put_f32(r, kFp8TileScalesAt + 4 * t, p);
      for (int i = 0; i < 128; ++i) r[128 * t + i] = e4m3(div32(clean(kv[128 * t + i]), p));
    }
    for (int i = 0; i < kRope; ++i) put_u16(r, kFp8RopeAt + 2 * i, bf16(clean(pe[i]), true));
    return r;
  }
  float s = 1.0f;
  if (outer == Outer::layer) s = layer_scale;
  if (outer == Outer::token) {
    s = mul32(max_abs(kv, kLatent), c2688());
    put_f32(r, kNvfp4TokenScaleAt, s);
  }
  for (int g = 0; g < 32; ++g) {
    float y[16];
    for (int i = 0; i < 16; ++i) {
      const float x = clean(kv[16 * g + i]);
      y[i] = (outer == Outer::unit) ? x : (s == 0.0f ? 0.0f : div32(x, s));
    }
    const uint8_t scale = e4m3(div32(max_magnitude(y, 16), 6.0f));
    r[kNvfp4ScalesAt + g] = scale;
    const float d = static_cast<float>(e4m3_value(scale));
    for (int i = 0; i < 16; ++i) {
      const uint8_t nib = d == 0.0f ? 0 : e2m1(div32(y[i], d));
      const int j = 16 * g + i;
      r[j / 2] |= static_cast<uint8_t>(j % 2 == 0 ? nib : nib << 4);
    }
  }
  if (kind == Kind::nvfp4_368) {
    const float rs = mul32(max_abs(pe, kRope), c448());
    put_f32(r, kNvfp4RopeScaleAt, rs);
    for (int i = 0; i < kRope; ++i) r[kNvfp4RopeAt + i] = rs == 0.0f ? 0 : e4m3(div32(clean(pe[i]), rs));
  } else {
    for (int i = 0; i < kRope; ++i) put_u16(r, kNvfp4RopeAt + 2 * i, bf16(clean(pe[i]), true));
  }
  return r;
}

// Reader expressions, each rounded once to fp32: nvfp4 (e2m1 * d) * s (e2m1 * d is exact),
// fp8 e4m3 * p, 368 RoPE e4m3 * rs, raw BF16 exactly.
struct Decoded { std::vector<float> kv = std::vector<float>(kLatent), pe = std::vector<float>(kRope); };
inline Decoded decode(Kind kind, Outer outer, const uint8_t* r, float layer_scale) {
  Decoded o;
  if (kind == Kind::bf16_1152) {
    for (int j = 0; j < kLatent; ++j) o.kv[j] = bf16_value(get_u16(r, 2 * j));
    for (int i = 0; i < kRope; ++i) o.pe[i] = bf16_value(get_u16(r, kBf16RopeAt + 2 * i));
    return o;
  }
  if (kind == Kind::fp8_656) {
    for (int j = 0; j < kLatent; ++j)
      o.kv[j] = static_cast<float>(e4m3_value(r[j]) * get_f32(r, kFp8TileScalesAt + 4 * (j / 128)));
    for (int i = 0; i < kRope; ++i) o.pe[i] = bf16_value(get_u16(r, kFp8RopeAt + 2 * i));
    return o;
  }
  const double s = outer == Outer::token ? get_f32(r, kNvfp4TokenScaleAt) : outer == Outer::layer ? layer_scale : 1.0;
  for (int j = 0; j < kLatent; ++j) {
    const uint8_t nib = static_cast<uint8_t>(j % 2 == 0 ? (r[j / 2] & 0xF) : (r[j / 2] >> 4));
    o.kv[j] = static_cast<float>(e2m1_value(nib) * e4m3_value(r[kNvfp4ScalesAt + j / 16]) * s);
  }
  if (kind == Kind::nvfp4_368) {
    const double rs = get_f32(r, kNvfp4RopeScaleAt);
    for (int i = 0; i < kRope; ++i) o.pe[i] = static_cast<float>(e4m3_value(r[kNvfp4RopeAt + i]) * rs);
  } else {
    for (int i = 0; i < kRope; ++i) o.pe[i] = bf16_value(get_u16(r, kNvfp4RopeAt + 2 * i));
  }
  return o;
}

}  // namespace nvfp4mla_test::ref
