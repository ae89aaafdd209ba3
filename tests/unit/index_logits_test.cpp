// CPU references of the indexer logits: a hand-computed case, the formula written out
// independently, ragged == paged on the same keys, per-token records as a key buffer, NaN
// rules, causal row lengths, and argument errors that write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/index_cache.h"
#include "nvfp4mla/indexer.h"
#include "nvfp4mla/testing/index_data.h"
#include "support/indexer_problems.h"

using namespace nvfp4mla;
using nvfp4mla::testing::kPoisonLogit;
using nvfp4mla::testing::paged_problem;
using nvfp4mla::testing::ragged_problem;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool same_float(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// The formula, term by term in long double: sum_h w * relu(s * (q . k)).
double formula(const uint8_t* q, const float* w, int heads, const uint8_t* k, float s) {
  long double acc = 0;
  for (int h = 0; h < heads; ++h) {
    long double dot = 0;
    for (int i = 0; i < 128; ++i)
      dot += static_cast<long double>(codec::e4m3_decode(q[h * 128 + i])) * codec::e4m3_decode(k[i]);
    const long double x = static_cast<long double>(s) * dot;
    acc += static_cast<long double>(w[h]) * (x > 0 ? x : 0);
  }
  return static_cast<double>(acc);
}

TEST(IndexLogitsCpu, HandComputed) {
  // Head 0: q = 1 on dims 0..3; head 1: q = -1 on dim 0. Key: 2 on dims 0..3, scale 0.5.
  std::vector<uint8_t> q(2 * 128, 0), k(128, 0);
  for (int i = 0; i < 4; ++i) q[i] = codec::e4m3_encode(1.0f), k[i] = codec::e4m3_encode(2.0f);
  q[128] = codec::e4m3_encode(-1.0f);
  const float scale = 0.5f, w[2] = {1.5f, 7.0f};
  const int32_t start = 0, end = 1;
  std::vector<float> out(4, kPoisonLogit);
  IndexerRaggedArgs a;
  a.q = q.data();
  a.weights = w;
  a.rows = 1;
  a.heads = 2;
  a.key_values = k.data();
  a.key_scales = &scale;
  a.num_keys = 1;
  a.row_starts = &start;
  a.row_ends = &end;
  a.logits = out.data();
  a.logits_stride = 4;
  indexer_logits_reference(a);
  // head 0: 0.5 * 8 = 4 -> 1.5 * 4 = 6; head 1: relu(0.5 * -2) = 0.
  EXPECT_EQ(out[0], 6.0f);
  for (int j = 1; j < 4; ++j) EXPECT_EQ(out[j], kNegInf) << j;
}

TEST(IndexLogitsCpu, RaggedMatchesFormula) {
  for (int heads : {1, 7, 32, 64}) {
    SCOPED_TRACE(heads);
    auto p = ragged_problem(heads, 9, 300, 257, 100 + heads);
    indexer_logits_reference(p.args());
    for (int64_t r = 0; r < p.rows; ++r) {
      const int64_t len = p.ends[r] - p.starts[r];
      for (int64_t j = 0; j < p.stride; ++j) {
        const float got = p.out[r * p.stride + j];
        if (j >= len) {
          ASSERT_EQ(got, kNegInf) << r << " " << j;
          continue;
        }
        const int64_t t = p.starts[r] + j;
        const double want = formula(&p.q[r * heads * 128], &p.w[r * heads], heads, &p.key_values[t * 128], p.key_scales[t]);
        ASSERT_NEAR(got, want, std::fabs(want) * 0x1p-23 + 1e-37) << r << " " << j;
      }
    }
  }
}

TEST(IndexLogitsCpu, SmallIntegerLogitsAreExact) {
  // The GPU suites compare small-integer problems bit for bit: every logit must be exact.
  auto p = ragged_problem(64, 5, 200, 200, 77, nvfp4mla::testing::Values::small_integers);
  indexer_logits_reference(p.args());
  int nonzero = 0;
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t j = 0; j < p.ends[r] - p.starts[r]; ++j) {
      const int64_t t = p.starts[r] + j;
      const double want = formula(&p.q[r * 64 * 128], &p.w[r * 64], 64, &p.key_values[t * 128], p.key_scales[t]);
      ASSERT_EQ(double(p.out[r * p.stride + j]), want) << r << " " << j;
      nonzero += want != 0.0;
    }
  EXPECT_GT(nonzero, 100);
}

TEST(IndexLogitsCpu, RecordsAreAKeyBuffer) {
  auto p = ragged_problem(16, 6, 200, 200, 7);
  indexer_logits_reference(p.args());
  std::vector<uint8_t> records(200 * 132);
  for (int64_t t = 0; t < 200; ++t) {
    std::memcpy(&records[t * 132], &p.key_values[t * 128], 128);
    record::store_f32(&records[t * 132 + 128], p.key_scales[t]);
  }
  std::vector<float> out2(p.out.size(), kPoisonLogit);
  auto a = p.args();
  a.key_values = records.data();
  a.key_value_stride = 132;
  a.key_scales = reinterpret_cast<const float*>(records.data() + 128);
  a.key_scale_stride = 33;
  a.logits = out2.data();
  indexer_logits_reference(a);
  ASSERT_EQ(std::memcmp(out2.data(), p.out.data(), out2.size() * 4), 0);
}

TEST(IndexLogitsCpu, NanRules) {
  auto p = ragged_problem(4, 3, 50, 50, 9);
  for (int64_t r = 0; r < 3; ++r) p.starts[r] = 0, p.ends[r] = 50;
  // Row 0: a NaN byte in head 2 (0x7F) -> that head's term is 0, as if its weight were 0.
  // Row 1: a NaN weight -> every logit NaN. Row 2: -0x7F (0xFF) behaves like 0x7F.
  p.q[0 * 512 + 2 * 128 + 5] = 0x7F;
  p.w[1 * 4 + 3] = std::numeric_limits<float>::quiet_NaN();
  p.q[2 * 512 + 0 * 128 + 9] = 0xFF;
  indexer_logits_reference(p.args());
  auto expected = p;
  expected.q[0 * 512 + 2 * 128 + 5] = 0;
  expected.w[0 * 4 + 2] = 0.0f;
  expected.q[2 * 512 + 0 * 128 + 9] = 0;
  expected.w[2 * 4 + 0] = 0.0f;
  std::fill(expected.out.begin(), expected.out.end(), kPoisonLogit);
  indexer_logits_reference(expected.args());
  for (int64_t j = 0; j < 50; ++j) {
    EXPECT_TRUE(same_float(p.out[j], expected.out[j])) << j;
    EXPECT_TRUE(std::isnan(p.out[50 + j])) << j;
    EXPECT_TRUE(same_float(p.out[100 + j], expected.out[100 + j])) << j;
  }
}

TEST(IndexLogitsCpu, PagedMatchesRaggedOnGatheredKeys) {
  for (int64_t page_size : {64, 16, 3}) {
    for (int next_n : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "page " << page_size << " next_n " << next_n);
      // Lengths 0, 1, a page and one past it, one short of it, and longer.
      const std::vector<int32_t> lens = {0, 1, static_cast<int32_t>(page_size), static_cast<int32_t>(page_size + 1),
                                         static_cast<int32_t>(page_size - 1), 150, 2};
      auto p = paged_problem(8, next_n, page_size, lens, 160, page_size * 10 + next_n);
      indexer_logits_reference(p.args());
      for (int64_t b = 0; b < p.requests; ++b) {
        // The request's keys in position order, gathered from the cache.
        std::vector<int64_t> slots;
        for (int64_t j = 0; j < lens[b]; ++j) slots.push_back(int64_t(p.table[b * p.table_stride + j / page_size]) * page_size + j % page_size);
        std::vector<uint8_t> values(slots.size() * 128);
        std::vector<float> scales(slots.size());
        gather_index_keys(IndexCacheView{p.cache.data(), p.num_pages, page_size}, slots, values.data(), scales.data());
        for (int i = 0; i < next_n; ++i) {
          const int64_t r = b * next_n + i, len = paged_row_length(lens[b], next_n, i);
          ASSERT_EQ(len, std::max<int64_t>(0, lens[b] - next_n + i + 1));
          const int32_t start = 0, end = static_cast<int32_t>(len);
          std::vector<float> out(p.stride, kPoisonLogit);
          IndexerRaggedArgs a;
          a.q = &p.q[r * 8 * 128];
          a.weights = &p.w[r * 8];
          a.rows = 1;
          a.heads = 8;
          a.key_values = values.data();
          a.key_scales = scales.data();
          a.num_keys = static_cast<int64_t>(slots.size());
          a.row_starts = &start;
          a.row_ends = &end;
          a.logits = out.data();
          a.logits_stride = p.stride;
          indexer_logits_reference(a);
          ASSERT_EQ(std::memcmp(out.data(), &p.out[r * p.stride], p.stride * 4), 0) << "request " << b << " row " << i;
        }
      }
    }
  }
}

template <class Args>
void expect_error(Args a, std::vector<float>& out, const std::string& needle) {
  const auto before = out;
  try {
    indexer_logits_reference(a);
    ADD_FAILURE() << "no error for " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::memcmp(before.data(), out.data(), out.size() * 4), 0) << needle;
}

TEST(IndexLogitsCpu, RaggedBadArguments) {
  auto p = ragged_problem(4, 3, 40, 40, 5);
  const auto good = p.args();
  auto a = good;
  a.heads = 0;
  expect_error(a, p.out, "heads must be in 1..64");
  a = good, a.heads = 65;
  expect_error(a, p.out, "heads must be in 1..64");
  a = good, a.rows = -1;
  expect_error(a, p.out, "rows is negative");
  a = good, a.q = nullptr;
  expect_error(a, p.out, "q is null");
  a = good, a.row_ends = nullptr;
  expect_error(a, p.out, "row_ends is null");
  a = good, a.key_value_stride = 127;
  expect_error(a, p.out, "key_value_stride");
  a = good, a.logits_stride = -1;
  expect_error(a, p.out, "logits_stride is negative");
  auto starts = p.starts, ends = p.ends;
  a = good;
  a.row_starts = starts.data();
  a.row_ends = ends.data();
  starts[2] = -1;
  expect_error(a, p.out, "row 2: row_starts/row_ends range [-1");
  starts = p.starts, ends[1] = 41;
  expect_error(a, p.out, "row 1: row_starts/row_ends range");
  ends = p.ends, starts[0] = ends[0] + 1;
  expect_error(a, p.out, "row 0: row_starts/row_ends range");
  std::fill(starts.begin(), starts.end(), 0);
  std::fill(ends.begin(), ends.end(), 10);
  a.logits_stride = 10;
  ends[1] = 11;
  expect_error(a, p.out, "row 1: length 11 (row_ends - row_starts) exceeds logits_stride 10");
}

TEST(IndexLogitsCpu, PagedBadArguments) {
  auto p = paged_problem(4, 2, 16, {5, 40, 17}, 64, 3);
  const auto good = p.args();
  auto a = good;
  a.next_n = 0;
  expect_error(a, p.out, "next_n must be at least 1");
  a = good, a.page_size = 0;
  expect_error(a, p.out, "page_size must be at least 1");
  a = good, a.context_lens = nullptr;
  expect_error(a, p.out, "context_lens is null");
  auto lens = p.context_lens, table = p.table;
  a = good;
  a.context_lens = lens.data();
  a.block_table = table.data();
  lens[1] = -3;
  expect_error(a, p.out, "request 1: context_lens is negative");
  lens = p.context_lens, lens[2] = 65;
  expect_error(a, p.out, "request 2: context_lens 65 exceeds logits_stride 64");
  lens = p.context_lens, a.block_table_stride = 2;
  expect_error(a, p.out, "request 1: context_lens 40 needs 3 pages but block_table_stride is 2");
  a.block_table_stride = good.block_table_stride;
  table[1 * p.table_stride + 2] = static_cast<int32_t>(p.num_pages);
  expect_error(a, p.out, "request 1: block_table entry 2 is page " + std::to_string(p.num_pages));
  table = p.table, table[2 * p.table_stride + 1] = -1;
  expect_error(a, p.out, "request 2: block_table entry 1 is page -1");
  // Entries past a request's pages are never read: -1 there is fine, and short contexts give
  // empty first rows (context 1 with next_n 2: lengths 0 and 1).
  table = p.table, lens[0] = 1;
  indexer_logits_reference(a);
  EXPECT_EQ(p.out[0], kNegInf);
  EXPECT_NE(p.out[64], kNegInf);
  EXPECT_EQ(p.out[65], kNegInf);
}

}  // namespace
