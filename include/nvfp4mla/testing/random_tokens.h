#pragma once
// Random KV tokens for record and kernel tests: magnitudes spread over many decades, channel
// outliers, occasional exact zeros, and (on request) non-finite values.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/record.h"

namespace nvfp4mla::testing {

struct TokenSet {
  std::vector<uint16_t> kv_c;  // BF16 bits [n, 512]
  std::vector<uint16_t> k_pe;  // BF16 bits [n, 64]
  int64_t n = 0;
};

inline TokenSet random_tokens(int64_t n, uint64_t seed, double log10_min = -6, double log10_max = 4,
                              bool non_finite = false, bool outliers = true) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mag(log10_min, log10_max), u(0, 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  TokenSet t;
  t.n = n;
  t.kv_c.resize(n * kLatentDim);
  t.k_pe.resize(n * kRopeDim);
  for (int64_t i = 0; i < n; ++i) {
    const float scale = static_cast<float>(std::pow(10.0, mag(rng)));
    const double kind = u(rng);
    for (int d = 0; d < kLatentDim; ++d) {
      float v = normal(rng) * scale;
      if (outliers && d % 97 == 5) v *= 20.0f;  // channel outliers
      if (kind < 0.02) v = 0.0f;              // an all-zero token
      if (non_finite && u(rng) < 0.002) {
        const double w = u(rng);
        v = w < 0.33 ? std::numeric_limits<float>::quiet_NaN()
                     : (w < 0.66 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity());
      }
      t.kv_c[i * kLatentDim + d] = codec::bf16_encode_rn(v);
    }
    for (int d = 0; d < kRopeDim; ++d) t.k_pe[i * kRopeDim + d] = codec::bf16_encode_rn(normal(rng) * scale);
  }
  return t;
}

// The same tokens as typed BF16 inputs, for record::encode and TokenBatch<Bf16Bits>.
struct Bf16Tokens {
  std::vector<Bf16Bits> kv_c, k_pe;
  int64_t count = 0;
};
inline Bf16Tokens as_bf16_inputs(const TokenSet& t) {
  Bf16Tokens out{std::vector<Bf16Bits>(t.kv_c.size()), std::vector<Bf16Bits>(t.k_pe.size()), t.n};
  for (size_t i = 0; i < t.kv_c.size(); ++i) out.kv_c[i].bits = t.kv_c[i];
  for (size_t i = 0; i < t.k_pe.size(); ++i) out.k_pe[i].bits = t.k_pe[i];
  return out;
}

}  // namespace nvfp4mla::testing
