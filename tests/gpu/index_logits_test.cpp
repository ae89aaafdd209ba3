// GPU indexer logits against the CPU references, for every kernel choice (wgmma: the
// two-warpgroup kernel on sm_90; wgmma_ws: the warp-specialized one for the ragged form with
// 17..64 heads, the two-warpgroup one elsewhere; mma.sync m16n8k32 E4M3 on sm_89+):
//   - small-integer data (every logit exact in fp32): bit for bit, -inf tails included;
//   - random data: within the tolerance of docs/SELECTION.md, |gpu - cpu| <= 2^-5 A with
//     A = s_t sum_h |w_h| sum_i |q_hi k_ti| (FP8 tensor cores add with ~13-bit truncation);
//   - ragged rows of different sequences in one block, lengths 0/1/stride, H = 1..64,
//     non-multiple-of-tile sizes, page boundaries, next_n 1..5, long contexts;
//   - NaN bytes and weights, metadata errors found on the device (nothing written), host
//     errors, and a CUDA-graph replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/indexer.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/indexer.h"
#include "support/indexer_problems.h"

using namespace nvfp4mla;
using nvfp4mla::testing::DeviceBuffer;
using nvfp4mla::testing::paged_problem;
using nvfp4mla::testing::PagedProblem;
using nvfp4mla::testing::ragged_problem;
using nvfp4mla::testing::RaggedProblem;
using nvfp4mla::testing::Values;

namespace {

constexpr uint8_t kPoisonByte = 0xFF;  // logits never written read as NaN 0xFFFFFFFF

bool device_supports(cuda::IndexerMma mma) {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return mma == cuda::IndexerMma::mma_sync ? major * 10 + minor >= 89 : (major == 9 && minor == 0);
}

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& v) {
  DeviceBuffer<T> d(std::max<size_t>(v.size(), 1));
  if (!v.empty() && cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
    throw std::runtime_error("upload failed");
  return d;
}

struct GpuOut {
  std::vector<float> logits;
  unsigned long long invalid = 0;
};

// Runs the GPU kernel on device copies of a problem's inputs; the output starts poisoned. Keys
// are laid out `value_stride` bytes and `scale_stride` floats apart on the device (the gaps
// NaN-poisoned).
GpuOut run_gpu(RaggedProblem& p, cuda::IndexerMma mma, cudaStream_t stream = nullptr, int64_t value_stride = 128,
               int64_t scale_stride = 1) {
  auto q = upload(p.q);
  auto w = upload(p.w);
  std::vector<uint8_t> values(std::max<int64_t>(1, p.num_keys * value_stride), 0x7F);
  std::vector<float> scales(std::max<int64_t>(1, p.num_keys * scale_stride), std::numeric_limits<float>::quiet_NaN());
  for (int64_t t = 0; t < p.num_keys; ++t) {
    std::memcpy(&values[t * value_stride], &p.key_values[t * 128], 128);
    scales[t * scale_stride] = p.key_scales[t];
  }
  auto kv = upload(values);
  auto ks = upload(scales);
  auto st = upload(p.starts);
  auto en = upload(p.ends);
  DeviceBuffer<float> out(std::max<int64_t>(1, p.rows * p.stride));
  out.fill_bytes(kPoisonByte);
  DeviceBuffer<unsigned long long> invalid(1);
  invalid.fill_bytes(0xEE);
  IndexerRaggedArgs a = p.args();
  a.q = q.get(), a.weights = w.get(), a.key_values = kv.get(), a.key_scales = ks.get();
  a.row_starts = st.get(), a.row_ends = en.get(), a.logits = out.get();
  a.key_value_stride = value_stride, a.key_scale_stride = scale_stride;
  cuda::indexer_logits(a, invalid.get(), stream, mma);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  GpuOut r{out.download(), invalid.download()[0]};
  r.logits.resize(p.rows * p.stride);
  return r;
}

GpuOut run_gpu(PagedProblem& p, cuda::IndexerMma mma) {
  auto q = upload(p.q);
  auto w = upload(p.w);
  auto cache = upload(p.cache);
  auto table = upload(p.table);
  auto lens = upload(p.context_lens);
  DeviceBuffer<float> out(std::max<int64_t>(1, p.requests * p.next_n * p.stride));
  out.fill_bytes(kPoisonByte);
  DeviceBuffer<unsigned long long> invalid(1);
  invalid.fill_bytes(0xEE);
  IndexerPagedArgs a = p.args();
  a.q = q.get(), a.weights = w.get(), a.cache = cache.get(), a.block_table = table.get();
  a.context_lens = lens.get(), a.logits = out.get();
  cuda::indexer_logits(a, invalid.get(), nullptr, mma);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  GpuOut r{out.download(), invalid.download()[0]};
  r.logits.resize(p.requests * p.next_n * p.stride);
  return r;
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, int64_t stride) {
  ASSERT_EQ(got.size(), want.size());
  int shown = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0 && shown++ < 8)
      ADD_FAILURE() << "row " << i / stride << " column " << i % stride << ": gpu " << got[i] << " cpu " << want[i];
}

// |gpu - cpu| <= 2^-5 A per logit (A from the problem's operands); -inf and NaN identical.
// Prints the largest and mean error relative to A.
void expect_within_bound(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& bound_a,
                         int64_t stride) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0, sum = 0;
  int64_t n = 0;
  int shown = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = got[i], c = want[i];
    bool ok;
    if (std::isnan(c) || std::isinf(c)) {
      ok = std::memcmp(&g, &c, 4) == 0 || (std::isnan(c) && std::isnan(g));
    } else {
      const double err = std::fabs(double(g) - double(c));
      ok = err <= 0x1p-5 * bound_a[i] + 0x1p-140;
      if (bound_a[i] > 0) {
        worst = std::max(worst, err / bound_a[i]);
        sum += err / bound_a[i];
        ++n;
      }
    }
    if (!ok && shown++ < 8)
      ADD_FAILURE() << "row " << i / stride << " column " << i % stride << ": gpu " << g << " cpu " << c << " A " << bound_a[i];
  }
  std::printf("      error / A: max %.3g (2^%.1f), mean %.3g over %lld logits\n", worst, worst > 0 ? std::log2(worst) : -999.0,
              n ? sum / n : 0.0, static_cast<long long>(n));
}

// A = s sum_h |w_h| sum_i |q_hi k_i| for one (row, key).
double abs_bound(const uint8_t* q, const float* w, int heads, const uint8_t* k, float s) {
  double a = 0;
  for (int h = 0; h < heads; ++h) {
    double d = 0;
    for (int i = 0; i < 128; ++i) d += std::fabs(double(codec::e4m3_decode(q[h * 128 + i])) * codec::e4m3_decode(k[i]));
    a += std::fabs(double(w[h])) * d;
  }
  return a * s;
}

std::vector<double> bounds(RaggedProblem& p) {
  std::vector<double> a(p.rows * p.stride, 0.0);
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t j = 0; j < p.ends[r] - p.starts[r]; ++j) {
      const int64_t t = p.starts[r] + j;
      a[r * p.stride + j] = abs_bound(&p.q[r * p.heads * 128], &p.w[r * p.heads], p.heads, &p.key_values[t * 128], p.key_scales[t]);
    }
  return a;
}

std::vector<double> bounds(PagedProblem& p) {
  std::vector<double> a(p.requests * p.next_n * p.stride, 0.0);
  for (int64_t b = 0; b < p.requests; ++b)
    for (int i = 0; i < p.next_n; ++i) {
      const int64_t r = b * p.next_n + i;
      for (int64_t j = 0; j < paged_row_length(p.context_lens[b], p.next_n, i); ++j) {
        const int64_t slot = int64_t(p.table[b * p.table_stride + j / p.page_size]) * p.page_size + j % p.page_size;
        a[r * p.stride + j] = abs_bound(&p.q[r * p.heads * 128], &p.w[r * p.heads], p.heads,
                                        &p.cache[index_key::value_offset(slot, p.page_size)],
                                        record::load_f32(&p.cache[index_key::scale_offset(slot, p.page_size)]));
      }
    }
  return a;
}

// Ragged rows of a prefill: `seqs` sequences one after another in the key buffer, each with
// causal rows (row i of a sequence of n rows over k keys: [base, base + k - n + i + 1)).
RaggedProblem causal_problem(int heads, int seqs, int64_t rows_per_seq, int64_t keys_per_seq, uint64_t seed, Values v) {
  auto p = ragged_problem(heads, seqs * rows_per_seq, seqs * keys_per_seq, keys_per_seq, seed, v);
  for (int s = 0; s < seqs; ++s)
    for (int64_t i = 0; i < rows_per_seq; ++i) {
      p.starts[s * rows_per_seq + i] = static_cast<int32_t>(s * keys_per_seq);
      p.ends[s * rows_per_seq + i] = static_cast<int32_t>(s * keys_per_seq + keys_per_seq - rows_per_seq + i + 1);
    }
  return p;
}

class IndexLogitsGpu : public ::testing::TestWithParam<cuda::IndexerMma> {
 protected:
  void SetUp() override {
    NVFP4MLA_REQUIRE_GPU();
    if (!device_supports(GetParam())) GTEST_SKIP() << "this GPU lacks the tensor-core path";
  }
};

TEST_P(IndexLogitsGpu, RaggedExactRandomRanges) {
  // Random ranges: rows of one block with unrelated starts (gaps), lengths 0 .. stride.
  for (int heads : {1, 7, 16, 24, 32, 48, 64}) {
    SCOPED_TRACE(heads);
    auto p = ragged_problem(heads, 37, 1000, 611, 100 + heads, Values::small_integers);
    p.starts[0] = 0, p.ends[0] = 611;   // the full stride
    p.starts[1] = 999, p.ends[1] = 1000;  // one key, the buffer's last
    p.starts[2] = 5, p.ends[2] = 5;     // empty
    const auto g = run_gpu(p, GetParam());
    EXPECT_EQ(g.invalid, 0u);
    indexer_logits_reference(p.args());
    expect_bitwise(g.logits, p.out, p.stride);
  }
}

TEST_P(IndexLogitsGpu, RaggedExactCausalSequences) {
  // Three sequences of 45 causal rows over 700 keys each (blocks straddle sequences).
  for (int heads : {64, 32, 16}) {
    SCOPED_TRACE(heads);
    auto p = causal_problem(heads, 3, 45, 700, 200 + heads, Values::small_integers);
    const auto g = run_gpu(p, GetParam());
    EXPECT_EQ(g.invalid, 0u);
    indexer_logits_reference(p.args());
    expect_bitwise(g.logits, p.out, p.stride);
  }
}

TEST_P(IndexLogitsGpu, RaggedRandomWithinBound) {
  for (int heads : {64, 32, 5}) {
    SCOPED_TRACE(heads);
    auto p = causal_problem(heads, 2, 20, 3000, 300 + heads, Values::random);
    const auto g = run_gpu(p, GetParam());
    EXPECT_EQ(g.invalid, 0u);
    indexer_logits_reference(p.args());
    expect_within_bound(g.logits, p.out, bounds(p), p.stride);
  }
}

TEST_P(IndexLogitsGpu, RaggedBlockBoundariesExact) {
  // The warp-specialized kernel's edges (256 query columns x 128 keys per block, chunks of whole
  // blocks):
  // row counts not a multiple of 4, a single row, key counts not a multiple of 128 (down to one
  // key), ranges that start and end inside a block, empty rows between full ones, rows of one
  // block far apart in the buffer. 64 and 40 heads (padded to 64), 24 (padded to 32: 8 rows a
  // block), 16 (the two-warpgroup kernel).
  struct Shape {
    int64_t rows, keys, stride;
  };
  for (int heads : {64, 40, 24, 16}) {
    for (const Shape& sh : {Shape{1, 1, 1}, Shape{1, 1, 5}, Shape{1, 300, 300}, Shape{3, 129, 129}, Shape{6, 1000, 333},
                            Shape{9, 4099, 2100}, Shape{13, 257, 257}}) {
      SCOPED_TRACE(::testing::Message() << "heads " << heads << " rows " << sh.rows << " keys " << sh.keys << " stride "
                                        << sh.stride);
      auto p = ragged_problem(heads, sh.rows, sh.keys, sh.stride, 900 + heads + sh.rows, Values::small_integers);
      const int64_t len = std::min(sh.stride, sh.keys);
      for (int64_t r = 0; r < sh.rows; ++r) {
        switch (r % 5) {
          case 0:  // the whole buffer (or the stride's worth) from key 0
            p.starts[r] = 0, p.ends[r] = static_cast<int32_t>(len);
            break;
          case 1:  // mid-block to mid-block
            p.starts[r] = static_cast<int32_t>(std::min<int64_t>(sh.keys, 37));
            p.ends[r] = static_cast<int32_t>(std::min<int64_t>(sh.keys, p.starts[r] + std::min<int64_t>(len, 200)));
            break;
          case 2:  // empty
            p.starts[r] = p.ends[r] = static_cast<int32_t>(sh.keys / 2);
            break;
          case 3:  // ending at the buffer's last key
            p.ends[r] = static_cast<int32_t>(sh.keys), p.starts[r] = static_cast<int32_t>(sh.keys - std::min<int64_t>(len, 131));
            break;
          default:  // ragged_problem's random range
            break;
        }
      }
      const auto g = run_gpu(p, GetParam());
      EXPECT_EQ(g.invalid, 0u);
      indexer_logits_reference(p.args());
      expect_bitwise(g.logits, p.out, p.stride);
    }
  }
}

TEST_P(IndexLogitsGpu, RaggedStridedKeysExact) {
  // Keys 256 bytes and scales 3 floats apart (NaN bytes and scales in between, never read).
  for (int heads : {64, 33, 20}) {
    SCOPED_TRACE(heads);
    auto p = causal_problem(heads, 2, 30, 900, 950 + heads, Values::small_integers);
    const auto g = run_gpu(p, GetParam(), nullptr, 256, 3);
    EXPECT_EQ(g.invalid, 0u);
    indexer_logits_reference(p.args());
    expect_bitwise(g.logits, p.out, p.stride);
  }
}

TEST_P(IndexLogitsGpu, RaggedLongRowsWithinBound) {
  // Many key blocks and several chunks per row, rows of two sequences in one query block.
  for (int heads : {64, 32}) {
    SCOPED_TRACE(heads);
    auto p = causal_problem(heads, 2, 6, 6000, 977 + heads, Values::random);
    const auto g = run_gpu(p, GetParam());
    EXPECT_EQ(g.invalid, 0u);
    indexer_logits_reference(p.args());
    expect_within_bound(g.logits, p.out, bounds(p), p.stride);
  }
}

TEST_P(IndexLogitsGpu, RaggedPerTokenRecordsAreRejected) {
  // The GPU reads 16-byte aligned key rows; records [N, 132] must be split first.
  auto p = ragged_problem(8, 4, 50, 50, 5);
  auto a = p.args();
  a.key_value_stride = 132;
  DeviceBuffer<unsigned long long> invalid(1);
  EXPECT_THROW(cuda::indexer_logits(a, invalid.get(), nullptr, GetParam()), Error);
}

TEST_P(IndexLogitsGpu, PagedExact) {
  int combo = 0;
  for (int64_t page_size : {64, 16, 4, 128, 192}) {
    for (int next_n : {1, 2, 3, 5}) {
      {
        const int heads = std::vector<int>{64, 32, 1, 48, 16}[combo++ % 5];
        SCOPED_TRACE(::testing::Message() << "page " << page_size << " next_n " << next_n << " heads " << heads);
        const int32_t ps = static_cast<int32_t>(page_size);
        std::vector<int32_t> lens = {0, 1, ps - 1, ps, ps + 1, 2 * ps, 3, 777, next_n - 1};
        auto p = paged_problem(heads, next_n, page_size, lens, 800, page_size * 100 + next_n * 10 + heads,
                               Values::small_integers);
        const auto g = run_gpu(p, GetParam());
        EXPECT_EQ(g.invalid, 0u);
        indexer_logits_reference(p.args());
        expect_bitwise(g.logits, p.out, p.stride);
      }
    }
  }
}

TEST_P(IndexLogitsGpu, PagedRandomWithinBound) {
  auto p = paged_problem(64, 2, 64, {5000, 4097, 63, 1}, 5100, 41, Values::random);
  const auto g = run_gpu(p, GetParam());
  EXPECT_EQ(g.invalid, 0u);
  indexer_logits_reference(p.args());
  expect_within_bound(g.logits, p.out, bounds(p), p.stride);
}

TEST_P(IndexLogitsGpu, PagedLongContextExact) {
  // Past 65,536 positions and many chunks; a stride well beyond the longest row.
  auto p = paged_problem(16, 2, 64, {70001, 12345}, 90000, 43, Values::small_integers);
  const auto g = run_gpu(p, GetParam());
  EXPECT_EQ(g.invalid, 0u);
  indexer_logits_reference(p.args());
  expect_bitwise(g.logits, p.out, p.stride);
}

TEST_P(IndexLogitsGpu, NanRules) {
  // A NaN query byte zeroes that head's term; a NaN weight makes the row NaN (as on the CPU).
  for (int heads : {8, 64}) {
    SCOPED_TRACE(heads);
    auto p = ragged_problem(heads, 6, 300, 300, 51, Values::small_integers);
    for (int64_t r = 0; r < 6; ++r) p.starts[r] = 0, p.ends[r] = 300;
    p.q[0 * heads * 128 + 3 * 128 + 17] = 0x7F;
    p.q[2 * heads * 128 + 0 * 128 + 100] = 0xFF;
    p.w[4 * heads + 6] = std::numeric_limits<float>::quiet_NaN();
    const auto g = run_gpu(p, GetParam());
    indexer_logits_reference(p.args());
    for (size_t i = 0; i < g.logits.size(); ++i) {
      if (i / 300 == 4) {
        ASSERT_TRUE(std::isnan(g.logits[i])) << i;
        continue;
      }
      ASSERT_EQ(std::memcmp(&g.logits[i], &p.out[i], 4), 0) << "row " << i / 300 << " col " << i % 300 << " gpu "
                                                            << g.logits[i] << " cpu " << p.out[i];
    }
  }
}

bool untouched(const std::vector<float>& v) {
  uint32_t poison;
  std::memset(&poison, kPoisonByte, 4);
  return std::all_of(v.begin(), v.end(), [&](float x) { return std::memcmp(&x, &poison, 4) == 0; });
}

TEST_P(IndexLogitsGpu, DeviceMetadataErrorsWriteNothing) {
  for (int heads : {16, 64}) {
    auto p = ragged_problem(heads, 10, 100, 60, 61);
    p.ends[3] = 101;  // past the key buffer
    auto g = run_gpu(p, GetParam());
    EXPECT_EQ(g.invalid, 1u);
    EXPECT_TRUE(untouched(g.logits));
    p.ends[3] = p.starts[3];
    p.starts[7] = 0, p.ends[7] = 61;  // longer than the stride
    p.starts[8] = -1;                 // negative
    g = run_gpu(p, GetParam());
    EXPECT_EQ(g.invalid, 2u);
    EXPECT_TRUE(untouched(g.logits));
  }
  {
    auto p = paged_problem(64, 2, 16, {40, 17, 100}, 128, 62);
    p.table[1 * p.table_stride + 1] = static_cast<int32_t>(p.num_pages);  // a needed page past the cache
    auto g = run_gpu(p, GetParam());
    EXPECT_EQ(g.invalid, 1u);
    EXPECT_TRUE(untouched(g.logits));
    p.table[1 * p.table_stride + 1] = 0;
    p.table[1 * p.table_stride + 2] = -7;  // not needed (17 tokens = 2 pages): ignored
    p.context_lens[0] = -1;                // negative
    p.context_lens[2] = 129;               // past the stride, and 9 pages where the table holds 8
    // Three counts: requests 0 and 2, and request 2's last needed entry (the table's padding, -1).
    g = run_gpu(p, GetParam());
    EXPECT_EQ(g.invalid, 3u);
    EXPECT_TRUE(untouched(g.logits));
    p.context_lens[0] = 40, p.context_lens[2] = 100;
    g = run_gpu(p, GetParam());
    EXPECT_EQ(g.invalid, 0u);
    indexer_logits_reference(p.args());
    expect_within_bound(g.logits, p.out, bounds(p), p.stride);
  }
}

TEST_P(IndexLogitsGpu, HostErrors) {
  auto p = paged_problem(64, 2, 64, {100}, 128, 71);
  auto q = upload(p.q);
  auto w = upload(p.w);
  auto cache = upload(p.cache);
  auto table = upload(p.table);
  auto lens = upload(p.context_lens);
  DeviceBuffer<float> out(2 * 128);
  DeviceBuffer<unsigned long long> invalid(1);
  IndexerPagedArgs good = p.args();
  good.q = q.get(), good.weights = w.get(), good.cache = cache.get(), good.block_table = table.get();
  good.context_lens = lens.get(), good.logits = out.get();
  auto expect_error = [&](const IndexerPagedArgs& a, const char* needle, unsigned long long* inv) {
    try {
      cuda::indexer_logits(a, inv, nullptr, GetParam());
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto a = good;
  expect_error(a, "invalid_count", nullptr);
  a.heads = 65;
  expect_error(a, "heads must be in 1..64", invalid.get());
  a = good, a.q = q.get() + 8;
  expect_error(a, "q must be 16-byte aligned", invalid.get());
  a = good, a.page_size = 6;
  expect_error(a, "page_size a multiple of 4", invalid.get());
  a = good, a.cache = cache.get() + 4;
  expect_error(a, "16-byte aligned", invalid.get());
  a = good, a.next_n = 0;
  expect_error(a, "next_n", invalid.get());
  a = good, a.logits_stride = -1;
  expect_error(a, "logits_stride is negative", invalid.get());
}

// Calls `call(stream)` once outside capture (one-time setup), captures it in a CUDA graph
// (capturing must write nothing to `out`), lets `change()` edit metadata on the device, and
// replays the graph: the replay must read the new metadata there.
template <class Call, class Change>
void capture_change_replay(DeviceBuffer<float>& out, Call call, Change change) {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  call(s);
  CUDA_OK(cudaStreamSynchronize(s));
  out.fill_bytes(kPoisonByte);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  call(s);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_TRUE(untouched(out.download()));  // capturing ran nothing
  change();
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

TEST_P(IndexLogitsGpu, GraphReplayMatchesDirectCall) {
  auto p = paged_problem(32, 2, 64, {3000, 200, 1}, 3100, 81, Values::small_integers);
  auto q = upload(p.q);
  auto w = upload(p.w);
  auto cache = upload(p.cache);
  auto table = upload(p.table);
  auto lens = upload(p.context_lens);
  DeviceBuffer<float> out(p.requests * p.next_n * p.stride);
  DeviceBuffer<unsigned long long> invalid(1);
  IndexerPagedArgs a = p.args();
  a.q = q.get(), a.weights = w.get(), a.cache = cache.get(), a.block_table = table.get();
  a.context_lens = lens.get(), a.logits = out.get();
  capture_change_replay(
      out, [&](cudaStream_t s) { cuda::indexer_logits(a, invalid.get(), s, GetParam()); },
      [&] {
        p.context_lens = {2999, 64, 0};
        lens.upload(p.context_lens);
      });
  EXPECT_EQ(invalid.download()[0], 0u);
  indexer_logits_reference(p.args());
  expect_bitwise(out.download(), p.out, p.stride);
}

TEST_P(IndexLogitsGpu, RaggedGraphReplayMatchesDirectCall) {
  // The ragged form (the warp-specialized kernel with 64 and 32 heads): row ends changed on the
  // device between capture and replay.
  for (int heads : {64, 24}) {
    SCOPED_TRACE(heads);
    auto p = causal_problem(heads, 2, 9, 1500, 83 + heads, Values::small_integers);
    auto q = upload(p.q);
    auto w = upload(p.w);
    auto kv = upload(p.key_values);
    auto ks = upload(p.key_scales);
    auto st = upload(p.starts);
    auto en = upload(p.ends);
    DeviceBuffer<float> out(p.rows * p.stride);
    DeviceBuffer<unsigned long long> invalid(1);
    IndexerRaggedArgs a = p.args();
    a.q = q.get(), a.weights = w.get(), a.key_values = kv.get(), a.key_scales = ks.get();
    a.row_starts = st.get(), a.row_ends = en.get(), a.logits = out.get();
    capture_change_replay(
        out, [&](cudaStream_t s) { cuda::indexer_logits(a, invalid.get(), s, GetParam()); },
        [&] {
          for (int64_t r = 0; r < p.rows; ++r) p.ends[r] = std::max(p.starts[r], p.ends[r] - static_cast<int32_t>(r * 37 % 300));
          en.upload(p.ends);
        });
    EXPECT_EQ(invalid.download()[0], 0u);
    indexer_logits_reference(p.args());
    expect_bitwise(out.download(), p.out, p.stride);
  }
}

INSTANTIATE_TEST_SUITE_P(Mma, IndexLogitsGpu,
                         ::testing::Values(cuda::IndexerMma::wgmma, cuda::IndexerMma::wgmma_ws, cuda::IndexerMma::mma_sync),
                         [](const ::testing::TestParamInfo<cuda::IndexerMma>& i) {
                           return std::string(i.param == cuda::IndexerMma::wgmma      ? "Wgmma"
                                              : i.param == cuda::IndexerMma::wgmma_ws ? "WgmmaWs"
                                                                                      : "MmaSync");
                         });

}  // namespace
