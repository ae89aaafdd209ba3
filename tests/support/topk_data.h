#pragma once
// Top-k test data (random and adversarial rows) and the reference on it, shared by the CPU and
// GPU suites.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "nvfp4mla/topk.h"

namespace nvfp4mla::testing {

inline float float_of_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t bits_of_float(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Rows of logits [rows, stride] with optional lengths.
struct TopkProblem {
  int rows = 0;
  int64_t columns = 0, stride = 0;
  std::vector<float> values;
  std::vector<int32_t> lengths;  // empty: every row has `columns` entries

  TopkProblem(int r, int64_t c, int64_t s = -1) : rows(r), columns(c), stride(s < 0 ? c : s), values(size_t(r) * stride, 0.0f) {}
  float* row(int r) { return values.data() + r * stride; }
  TopkArgs args(int k) const {
    TopkArgs a;
    a.values = values.data();
    a.rows = rows;
    a.columns = columns;
    a.stride = stride;
    a.lengths = lengths.empty() ? nullptr : lengths.data();
    a.k = k;
    return a;
  }
};

struct TopkResult {
  std::vector<int32_t> indices, length;
  std::vector<float> values;
  TopkResult(int rows, int k) : indices(size_t(rows) * k, -7), length(rows, -7), values(size_t(rows) * k, 7.0f) {}
  TopkOutputs outputs() { return {indices.data(), length.data(), values.data()}; }
  bool operator==(const TopkResult& o) const {
    return indices == o.indices && length == o.length && values.size() == o.values.size() &&
           std::memcmp(values.data(), o.values.data(), values.size() * 4) == 0;
  }
};

inline TopkResult reference(const TopkArgs& a) {
  TopkResult r(a.rows, a.k);
  topk_reference(a, r.outputs());
  return r;
}

// Approximately normal values; with `levels` > 0 drawn from that many distinct values (ties).
inline void fill_random(float* v, int64_t n, uint64_t seed, int levels = 0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_int_distribution<int> level(0, std::max(levels, 1) - 1);
  for (int64_t i = 0; i < n; ++i) v[i] = levels > 0 ? static_cast<float>(level(rng)) * 0.25f - 3.0f : normal(rng);
}

// The adversarial row kinds of issue 22.
enum class RowKind {
  random,
  all_equal,
  increasing,
  decreasing,
  one_bin,        // >= 12,000 values 1.0 + i ulp (one 11-bit and one 22-bit radix prefix) above random noise
  last_ulp,       // consecutive floats around 3.0, shuffled
  denormals,      // positive and negative subnormals, zeros of both signs
  signed_zeros,   // mostly +-0.0 with a few larger and smaller values
  nan_inf,        // NaN payloads of both signs, -inf, +inf among random values
  few_selectable, // almost everything NaN or -inf
};

inline void fill_row(float* v, int64_t n, RowKind kind, uint64_t seed) {
  std::mt19937_64 rng(seed);
  switch (kind) {
    case RowKind::random: fill_random(v, n, seed); break;
    case RowKind::all_equal: std::fill(v, v + n, 0.625f); break;
    case RowKind::increasing:
      for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.5f - 1000.0f;
      break;
    case RowKind::decreasing:
      for (int64_t i = 0; i < n; ++i) v[i] = 1000.0f - static_cast<float>(i) * 0.25f;
      break;
    case RowKind::one_bin: {
      fill_random(v, n, seed);
      for (int64_t i = 0; i < n; ++i) v[i] = std::min(v[i], 0.5f);
      const int64_t m = std::min<int64_t>(n, 20000);
      std::vector<int64_t> at(n);
      for (int64_t i = 0; i < n; ++i) at[i] = i;
      std::shuffle(at.begin(), at.end(), rng);
      for (int64_t i = 0; i < m; ++i) v[at[i]] = float_of_bits(bits_of_float(1.0f) + static_cast<uint32_t>(i % 700));
      break;
    }
    case RowKind::last_ulp:
      for (int64_t i = 0; i < n; ++i) v[i] = float_of_bits(bits_of_float(3.0f) + static_cast<uint32_t>(i % 5000) - 2500);
      std::shuffle(v, v + n, rng);
      break;
    case RowKind::denormals:
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t mant = static_cast<uint32_t>(rng() % 0x800000u);
        v[i] = float_of_bits(mant | (rng() % 2 ? 0x80000000u : 0u));
      }
      break;
    case RowKind::signed_zeros:
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t r = rng() % 100;
        v[i] = r < 45 ? 0.0f : r < 90 ? -0.0f : r < 95 ? 1e-30f * static_cast<float>(r) : -1.5f;
      }
      break;
    case RowKind::nan_inf:
      fill_random(v, n, seed);
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t r = rng() % 16;
        if (r == 0) v[i] = float_of_bits(0x7FC00000u | static_cast<uint32_t>(rng() % 0x400000u));
        if (r == 1) v[i] = float_of_bits(0xFF800001u + static_cast<uint32_t>(rng() % 0x7FFFFEu));
        if (r == 2) v[i] = -std::numeric_limits<float>::infinity();
        if (r == 3 && rng() % 64 == 0) v[i] = std::numeric_limits<float>::infinity();
      }
      break;
    case RowKind::few_selectable:
      for (int64_t i = 0; i < n; ++i)
        v[i] = i % 97 == 5 ? static_cast<float>(i % 13) : (i % 2 ? -std::numeric_limits<float>::infinity()
                                                                  : std::numeric_limits<float>::quiet_NaN());
      break;
  }
}

inline const char* kind_name(RowKind k) {
  static const char* names[] = {"random", "all_equal", "increasing", "decreasing", "one_bin",
                                "last_ulp", "denormals", "signed_zeros", "nan_inf", "few_selectable"};
  return names[static_cast<int>(k)];
}
inline constexpr RowKind kAllRowKinds[] = {RowKind::random,    RowKind::all_equal, RowKind::increasing,
                                           RowKind::decreasing, RowKind::one_bin,  RowKind::last_ulp,
                                           RowKind::denormals, RowKind::signed_zeros, RowKind::nan_inf,
                                           RowKind::few_selectable};

// The fold of one row: chunk c covers columns [bounds[c], bounds[c + 1]); each chunk's top-k
// (values and absolute positions, padding included) is concatenated in chunk order. `select`
// runs a top-k (the CPU reference or a GPU kernel) on given arguments.
template <class Select>
TopkResult fold_row(const float* row, const std::vector<int64_t>& bounds, int k, Select select) {
  const int chunks = static_cast<int>(bounds.size()) - 1;
  std::vector<float> cand_values;
  std::vector<int32_t> cand_positions;
  for (int c = 0; c < chunks; ++c) {
    TopkArgs a;
    a.values = row + bounds[c];
    a.rows = 1;
    a.columns = bounds[c + 1] - bounds[c];
    a.stride = a.columns;
    a.position_offset = bounds[c];
    a.k = k;
    const TopkResult part = select(a);
    cand_values.insert(cand_values.end(), part.values.begin(), part.values.end());
    cand_positions.insert(cand_positions.end(), part.indices.begin(), part.indices.end());
  }
  TopkArgs a;
  a.values = cand_values.data();
  a.positions = cand_positions.data();
  a.rows = 1;
  a.columns = static_cast<int64_t>(cand_values.size());
  a.stride = a.columns;
  a.k = k;
  return select(a);
}

// The seed's four 118,750-entry chunks, and random chunkings (some chunks empty or shorter than k).
inline std::vector<int64_t> even_bounds(int64_t n, int chunks) {
  std::vector<int64_t> b;
  for (int c = 0; c <= chunks; ++c) b.push_back(n * c / chunks);
  return b;
}
inline std::vector<int64_t> random_bounds(int64_t n, int chunks, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> b{0, n};
  for (int c = 1; c < chunks; ++c) b.push_back(static_cast<int64_t>(rng() % (n + 1)));
  std::sort(b.begin(), b.end());
  return b;
}

}  // namespace nvfp4mla::testing
