#pragma once
// A random sparse-attention problem over a cache of records: NaN-poisoned unused slots, a
// random slot layout (as a random page permutation gives), invalid indices of every kind,
// duplicates, per-row lengths and empty rows. Every row holds the boundary indices capacity - 1
// (a written slot), capacity, -1, INT32_MIN and INT32_MAX, and a NaN guard record lies past the
// end of the cache, so an implementation that reads index == capacity produces NaN. Shared by
// the CPU and GPU suites.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/sparse_mla.h"
#include "nvfp4mla/testing/random_tokens.h"

namespace nvfp4mla::testing {

struct AttentionProblem {
  RecordSpec spec;
  int rows = 0, heads = 0, topk = 0;
  int64_t capacity = 0;
  float sm_scale = 0, layer_scale = 1;
  std::vector<uint8_t> cache;        // [capacity + 1, record_bytes]: the last record is a NaN guard
  std::vector<uint16_t> q;           // [rows, heads, 576] BF16
  std::vector<int32_t> indices;      // [rows, topk]
  std::vector<int32_t> topk_length;  // [rows] (empty when unused)

  SparseMlaArgs host_args() const {
    SparseMlaArgs a;
    a.q = q.data();
    a.rows = rows;
    a.heads = heads;
    a.cache = cache.data();
    a.capacity = capacity;
    a.indices = indices.data();
    a.topk = topk;
    a.topk_length = topk_length.empty() ? nullptr : topk_length.data();
    a.sm_scale = sm_scale;
    a.layer_scale = layer_scale;
    return a;
  }
};

struct ProblemOptions {
  bool invalid_entries = true;  // -1, other negatives, INT32_MIN, >= capacity, INT32_MAX
  bool duplicates = true;
  bool lengths = false;         // per-row topk_length, including 0
  bool empty_row = true;        // one row whose entries are all invalid
  // Token magnitudes. FlashMLA's tolerances assume values of order 1 (its tests use randn);
  // wider ranges need a tolerance relative to the largest |V| (see the GPU suites).
  double log10_min = -0.3, log10_max = 0.3;
  bool outliers = false;
  // Degenerate tokens among the random ones: zero latent (a zero dynamic scale), zero RoPE (a
  // zero RoPE scale), both, and a latent 1e-36 times smaller than its RoPE.
  bool degenerate = false;
  // Adversarial magnitudes: tokens from 1e-4 to 1e2 with channel outliers.
  static ProblemOptions wide_magnitudes() {
    ProblemOptions o;
    o.log10_min = -4;
    o.log10_max = 2;
    o.outliers = true;
    return o;
  }
};

inline AttentionProblem make_problem(const RecordSpec& spec, int rows, int heads, int topk, uint64_t seed,
                                     const ProblemOptions& opt = {}) {
  AttentionProblem p;
  p.spec = spec;
  p.rows = rows;
  p.heads = heads;
  p.topk = topk;
  const int64_t used = std::max<int64_t>(2 * topk, 1024);
  p.capacity = used * 2;
  p.sm_scale = 1.0f / 24.0f;  // 1/sqrt(576)
  p.layer_scale = 0.0037f;
  const int rb = spec.record_bytes();
  // NaN in every format: unused slots and the guard record past the end must never be read.
  p.cache.assign((p.capacity + 1) * rb, 0xFF);
  std::mt19937_64 rng(seed);
  std::vector<int64_t> slots(p.capacity);
  for (int64_t i = 0; i < p.capacity; ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(used);
  if (std::find(slots.begin(), slots.end(), p.capacity - 1) == slots.end()) slots[0] = p.capacity - 1;  // the last slot holds a record
  auto tokens = random_tokens(used, seed + 1, opt.log10_min, opt.log10_max, false, opt.outliers);
  if (opt.degenerate)
    for (int64_t i = 0; i < used; ++i) {
      const int kind = static_cast<int>(i % 8);
      uint16_t* kv = &tokens.kv_c[i * kLatentDim];
      uint16_t* pe = &tokens.k_pe[i * kRopeDim];
      if (kind == 1 || kind == 3) std::fill(kv, kv + kLatentDim, uint16_t{0});
      if (kind == 2 || kind == 3) std::fill(pe, pe + kRopeDim, uint16_t{0});
      if (kind == 5)
        for (int d = 0; d < kLatentDim; ++d) kv[d] = codec::bf16_encode_rn(codec::bf16_decode(kv[d]) * 1e-36f);
    }
  for (int64_t i = 0; i < used; ++i)
    record::encode(spec, reinterpret_cast<const Bf16Bits*>(&tokens.kv_c[i * kLatentDim]),
                   reinterpret_cast<const Bf16Bits*>(&tokens.k_pe[i * kRopeDim]), p.layer_scale, &p.cache[slots[i] * rb]);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.q.resize(static_cast<size_t>(rows) * heads * kQkDim);
  for (auto& v : p.q) v = codec::bf16_encode_rn(normal(rng));
  p.indices.resize(static_cast<size_t>(rows) * topk);
  std::uniform_int_distribution<int64_t> pick(0, used - 1);
  std::uniform_real_distribution<double> u(0, 1);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < topk; ++k) {
      int32_t idx = static_cast<int32_t>(slots[pick(rng)]);
      const double w = u(rng);
      if (opt.invalid_entries && w < 0.03) idx = -1;
      else if (opt.invalid_entries && w < 0.04) idx = -1 - static_cast<int32_t>(rng() % 1000);
      else if (opt.invalid_entries && w < 0.05) idx = static_cast<int32_t>(p.capacity + rng() % 1000);
      else if (opt.invalid_entries && w < 0.055) idx = std::numeric_limits<int32_t>::max();
      else if (opt.duplicates && w < 0.08 && k > 0) idx = p.indices[static_cast<size_t>(r) * topk + k - 1];
      p.indices[static_cast<size_t>(r) * topk + k] = idx;
    }
  }
  // The boundary indices at the front of every row (where topk_length keeps them), in an order
  // that rotates from row to row (rows shorter than five take turns); without invalid entries
  // only the valid one.
  const int32_t cap = static_cast<int32_t>(p.capacity);
  const int32_t boundary[5] = {cap - 1, cap, -1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  const int n_boundary = opt.invalid_entries ? 5 : 1;
  const int front = std::min(topk, n_boundary);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < front; ++k) p.indices[static_cast<size_t>(r) * topk + k] = boundary[(r * (front < n_boundary ? front : 1) + k) % n_boundary];
  if (opt.empty_row && rows > 1)
    for (int k = 0; k < topk; ++k)
      p.indices[static_cast<size_t>(rows - 1) * topk + k] = k < 4 ? boundary[1 + k] : (k % 2) ? -1 : static_cast<int32_t>(p.capacity + k);
  if (opt.lengths) {
    p.topk_length.resize(rows);
    for (int r = 0; r < rows; ++r) p.topk_length[r] = static_cast<int32_t>(rng() % (topk + 1));
    p.topk_length[0] = 0;
    if (rows > 2) p.topk_length[1] = topk;
    if (rows > 3) p.topk_length[2] = topk + 100;  // longer than the list: clamped
  }
  return p;
}

}  // namespace nvfp4mla::testing
