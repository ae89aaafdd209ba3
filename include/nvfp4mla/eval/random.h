#pragma once
// Deterministic random numbers for the synthetic workloads: the same seed gives the same
// tokens on every run, thread count and standard library (std::normal_distribution is
// implementation-defined, so it is not used).
#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace nvfp4mla::eval {

// SplitMix64 step: mixes a 64-bit state into a well-distributed output.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A stream key from a seed and up to three labels (layer, purpose, index): independent
// streams for independent samples.
inline uint64_t stream_key(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  uint64_t s = seed;
  uint64_t k = splitmix64(s);
  for (uint64_t label : {a, b, c}) {
    s = k ^ (label * 0xD6E8FEB86659FD93ull);
    k = splitmix64(s);
  }
  return k;
}

// xoshiro256** generator with uniform and standard-normal draws.
class Rng {
 public:
  explicit Rng(uint64_t key) {
    uint64_t s = key;
    for (auto& w : state_) w = splitmix64(s);
  }
  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>(uniform() * static_cast<double>(n)) % n; }
  // Standard normal by the ziggurat method (Marsaglia and Tsang, 2000) with 128 layers: most
  // draws cost one 64-bit random number and a table lookup. The layer index and the value
  // come from separate bits of the draw.
  double normal();

 private:
  double normal_slow(int layer, int32_t hz);  // the rare draws outside a layer's core
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
};

namespace detail {

struct ZigguratTables {
  static constexpr int kLayers = 128;
  static constexpr double kTail = 3.442619855899;        // x of the base layer's edge
  static constexpr double kArea = 9.91256303526217e-3;   // area of each layer
  static constexpr double kScale = 2147483648.0;         // 2^31: values are signed 32-bit
  uint32_t k[kLayers];  // |hz| below k[i]: the point is inside layer i's core rectangle
  double w[kLayers];    // hz * w[i] is the x coordinate
  double f[kLayers];    // exp(-x_i^2 / 2) at the layers' edges
  ZigguratTables() {
    double dn = kTail, tn = dn;
    const double q = kArea / std::exp(-0.5 * dn * dn);
    k[0] = static_cast<uint32_t>((dn / q) * kScale);
    k[1] = 0;
    w[0] = q / kScale;
    w[kLayers - 1] = dn / kScale;
    f[0] = 1.0;
    f[kLayers - 1] = std::exp(-0.5 * dn * dn);
    for (int i = kLayers - 2; i >= 1; --i) {
      dn = std::sqrt(-2.0 * std::log(kArea / dn + std::exp(-0.5 * dn * dn)));
      k[i + 1] = static_cast<uint32_t>((dn / tn) * kScale);
      tn = dn;
      f[i] = std::exp(-0.5 * dn * dn);
      w[i] = dn / kScale;
    }
  }
};

// Built once at program start (no lazy-initialization check on every draw).
inline const ZigguratTables kZiggurat{};

}  // namespace detail

inline double Rng::normal() {
  // Fast path (about 99% of draws): the point lies in a layer's core rectangle.
  const auto& z = detail::kZiggurat;
  const uint64_t u = next();
  const int i = static_cast<int>(u & (detail::ZigguratTables::kLayers - 1));
  const int32_t hz = static_cast<int32_t>(static_cast<uint32_t>(u >> 32));
  const uint32_t mag = hz < 0 ? static_cast<uint32_t>(-(static_cast<int64_t>(hz))) : static_cast<uint32_t>(hz);
  if (mag < z.k[i]) return static_cast<double>(hz) * z.w[i];
  return normal_slow(i, hz);
}

inline double Rng::normal_slow(int i, int32_t hz) {
  const auto& z = detail::kZiggurat;
  for (;;) {
    const double x = static_cast<double>(hz) * z.w[i];
    if (i == 0) {
      // Base layer: sample the tail beyond kTail.
      double tx, ty;
      do {
        double u1 = uniform(), u2 = uniform();
        while (u1 <= 0.0) u1 = uniform();
        while (u2 <= 0.0) u2 = uniform();
        tx = -std::log(u1) / detail::ZigguratTables::kTail;
        ty = -std::log(u2);
      } while (ty + ty < tx * tx);
      return hz > 0 ? detail::ZigguratTables::kTail + tx : -detail::ZigguratTables::kTail - tx;
    }
    // Wedge between the core rectangle and the curve: accept under the density.
    if (z.f[i] + uniform() * (z.f[i - 1] - z.f[i]) < std::exp(-0.5 * x * x)) return x;
    // Rejected: a fresh draw.
    const uint64_t u = next();
    i = static_cast<int>(u & (detail::ZigguratTables::kLayers - 1));
    hz = static_cast<int32_t>(static_cast<uint32_t>(u >> 32));
    const uint32_t mag = hz < 0 ? static_cast<uint32_t>(-(static_cast<int64_t>(hz))) : static_cast<uint32_t>(hz);
    if (mag < z.k[i]) return static_cast<double>(hz) * z.w[i];
  }
}

}  // namespace nvfp4mla::eval
