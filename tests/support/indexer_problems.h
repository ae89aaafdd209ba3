#pragma once
// Indexer logits problems (host memory) for the CPU and GPU suites: ragged rows over a key
// buffer, and requests over a paged cache with shuffled pages.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "nvfp4mla/index_cache.h"
#include "nvfp4mla/indexer.h"
#include "nvfp4mla/testing/index_data.h"

namespace nvfp4mla::testing {

inline constexpr float kPoisonLogit = 12345.0f;

// random: keys through the writer's recipe from values spread over many decades, normal q and
// weights. small_integers: q and key values in -2..2, integer weights, power-of-two scales, so
// every logit is exact in fp32 whatever the order of accumulation.
enum class Values { random, small_integers };

// `n` keys in split form.
inline void make_keys(int64_t n, uint64_t seed, Values v, std::vector<uint8_t>& values, std::vector<float>& scales) {
  values.assign(n * 128, 0);
  scales.assign(n, 0.0f);
  if (v == Values::small_integers) {
    values = small_integer_e4m3(n * 128, seed);
    std::mt19937_64 rng(seed + 1);
    std::uniform_int_distribution<int> e(-8, 8);
    for (auto& s : scales) s = std::ldexp(1.0f, e(rng));
    return;
  }
  const auto x = random_index_keys(n, seed);
  for (int64_t t = 0; t < n; ++t) scales[t] = index_key::encode(x.data() + t * 128, values.data() + t * 128);
}

inline void make_queries(int64_t rows, int heads, uint64_t seed, Values v, std::vector<uint8_t>& q, std::vector<float>& w) {
  if (v == Values::small_integers) {
    q = small_integer_e4m3(rows * heads * 128, seed);
    w = small_integer_weights(rows * heads, seed + 1);
  } else {
    q = random_e4m3(rows * heads * 128, seed);
    w = random_weights(rows * heads, seed + 1);
  }
}

struct RaggedProblem {
  int heads = 0;
  int64_t rows = 0, stride = 0, num_keys = 0;
  std::vector<uint8_t> key_values, q;
  std::vector<float> key_scales, w, out;
  std::vector<int32_t> starts, ends;
  IndexerRaggedArgs args() {
    IndexerRaggedArgs a;
    a.q = q.data();
    a.weights = w.data();
    a.rows = rows;
    a.heads = heads;
    a.key_values = key_values.data();
    a.key_scales = key_scales.data();
    a.num_keys = num_keys;
    a.row_starts = starts.data();
    a.row_ends = ends.data();
    a.logits = out.data();
    a.logits_stride = stride;
    return a;
  }
};

// Rows with random ranges (lengths 0 .. min(stride, num_keys), random starts).
inline RaggedProblem ragged_problem(int heads, int64_t rows, int64_t num_keys, int64_t stride, uint64_t seed,
                                    Values v = Values::random) {
  RaggedProblem p;
  p.heads = heads;
  p.rows = rows;
  p.stride = stride;
  p.num_keys = num_keys;
  make_keys(num_keys, seed, v, p.key_values, p.key_scales);
  make_queries(rows, heads, seed + 10, v, p.q, p.w);
  p.out.assign(rows * stride, kPoisonLogit);
  std::mt19937_64 rng(seed + 3);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = std::uniform_int_distribution<int64_t>(0, std::min(stride, num_keys))(rng);
    const int64_t start = std::uniform_int_distribution<int64_t>(0, num_keys - len)(rng);
    p.starts.push_back(static_cast<int32_t>(start));
    p.ends.push_back(static_cast<int32_t>(start + len));
  }
  return p;
}

struct PagedProblem {
  int heads = 0, next_n = 0;
  int64_t requests = 0, page_size = 0, num_pages = 0, table_stride = 0, stride = 0;
  std::vector<uint8_t> cache, q;
  std::vector<float> w, out;
  std::vector<int32_t> table, context_lens;
  IndexerPagedArgs args() {
    IndexerPagedArgs a;
    a.q = q.data();
    a.weights = w.data();
    a.requests = requests;
    a.next_n = next_n;
    a.heads = heads;
    a.cache = cache.data();
    a.num_pages = num_pages;
    a.page_size = page_size;
    a.block_table = table.data();
    a.block_table_stride = table_stride;
    a.context_lens = context_lens.data();
    a.logits = out.data();
    a.logits_stride = stride;
    return a;
  }
};

// Requests whose pages are spread over a shuffled cache (with spare pages); table entries past a
// request's pages are -1.
inline PagedProblem paged_problem(int heads, int next_n, int64_t page_size, std::vector<int32_t> context_lens,
                                  int64_t stride, uint64_t seed, Values v = Values::random) {
  PagedProblem p;
  p.heads = heads;
  p.next_n = next_n;
  p.requests = static_cast<int64_t>(context_lens.size());
  p.page_size = page_size;
  p.context_lens = context_lens;
  p.stride = stride;
  int64_t max_pages = 0, total_pages = 0;
  for (int32_t c : context_lens) {
    max_pages = std::max<int64_t>(max_pages, (c + page_size - 1) / page_size);
    total_pages += (c + page_size - 1) / page_size;
  }
  p.table_stride = max_pages + 1;
  p.num_pages = total_pages + 3;
  std::vector<int32_t> pages(p.num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(pages.begin(), pages.end(), rng);
  p.table.assign(p.requests * p.table_stride, -1);
  int64_t next = 0;
  for (int64_t b = 0; b < p.requests; ++b)
    for (int64_t j = 0; j < (context_lens[b] + page_size - 1) / page_size; ++j) p.table[b * p.table_stride + j] = pages[next++];
  const int64_t slots = p.num_pages * page_size;
  std::vector<uint8_t> values;
  std::vector<float> scales;
  make_keys(slots, seed + 1, v, values, scales);
  p.cache.assign(slots * 132, 0);
  for (int64_t s = 0; s < slots; ++s) {
    std::copy_n(&values[s * 128], 128, &p.cache[index_key::value_offset(s, page_size)]);
    record::store_f32(&p.cache[index_key::scale_offset(s, page_size)], scales[s]);
  }
  make_queries(p.requests * next_n, heads, seed + 20, v, p.q, p.w);
  p.out.assign(p.requests * next_n * stride, kPoisonLogit);
  return p;
}

}  // namespace nvfp4mla::testing
