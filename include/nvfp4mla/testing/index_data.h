#pragma once
// Random data for the index key cache and indexer logits tests (CPU and GPU suites).
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/index_key.h"
#include "nvfp4mla/indexer.h"

namespace nvfp4mla::testing {

// n keys [n, 128] as fp32: per-key magnitudes over many decades, channel outliers, all-zero
// keys, and (on request) NaN / +-Inf values.
inline std::vector<float> random_index_keys(int64_t n, uint64_t seed, bool non_finite = false) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mag(-8.0, 6.0), u(0, 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(n) * index_key::kDim);
  for (int64_t t = 0; t < n; ++t) {
    const float scale = static_cast<float>(std::pow(10.0, mag(rng)));
    const bool zero = u(rng) < 0.02;
    for (int i = 0; i < index_key::kDim; ++i) {
      float v = zero ? 0.0f : normal(rng) * scale;
      if (i % 41 == 7) v *= 30.0f;
      if (non_finite && u(rng) < 0.003) {
        const double w = u(rng);
        v = w < 0.33 ? std::numeric_limits<float>::quiet_NaN()
                     : (w < 0.66 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity());
      }
      k[t * index_key::kDim + i] = v;
    }
  }
  return k;
}

// The same values rounded to BF16 (what a BF16 writer input holds).
inline std::vector<Bf16Bits> to_bf16_keys(const std::vector<float>& k) {
  std::vector<Bf16Bits> out(k.size());
  for (size_t i = 0; i < k.size(); ++i) out[i].bits = codec::bf16_encode_rn(k[i]);
  return out;
}

// E4M3 bytes of normal(0, sigma) values; never NaN.
inline std::vector<uint8_t> random_e4m3(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = codec::e4m3_encode(normal(rng));
  return b;
}

inline std::vector<float> random_weights(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  std::vector<float> w(n);
  for (auto& x : w) x = normal(rng);
  return w;
}

// E4M3 bytes of small integers -2..2: dot products of 128 of them are integers of magnitude
// at most 512, exact in any fp32 or tensor-core accumulation; with integer weights and
// power-of-two scales every logit is exact too, so all implementations agree bit for bit.
inline std::vector<uint8_t> small_integer_e4m3(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> v(-2, 2);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = codec::e4m3_encode(static_cast<float>(v(rng)));
  return b;
}
inline std::vector<float> small_integer_weights(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> v(-3, 3);
  std::vector<float> w(n);
  for (auto& x : w) x = static_cast<float>(v(rng));
  return w;
}

}  // namespace nvfp4mla::testing
