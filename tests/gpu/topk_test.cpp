// GPU top-k == CPU reference (a full stable sort), bit for bit: indices, topk_length and values,
// into poisoned outputs, for every plan kind; lengths and row kinds of issue 22; the fold; the
// slot transform; device-side errors; bad arguments; CUDA-graph replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/cuda/topk.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/topk.h"
#include "support/topk_data.h"

using namespace nvfp4mla;
using nvfp4mla::testing::DeviceBuffer;
using nvfp4mla::testing::RowKind;
using nvfp4mla::testing::TopkProblem;
using nvfp4mla::testing::TopkResult;

namespace {

constexpr int kPoisonByte = 0xAB;

int sm_count() {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

// A device copy of host[0, n), or an empty buffer when host is null or n is 0.
template <class T>
DeviceBuffer<T> device_copy(const T* host, size_t n) {
  return host && n ? DeviceBuffer<T>(std::vector<T>(host, host + n)) : DeviceBuffer<T>();
}

// Device copies of a problem's inputs, poisoned outputs, and a run of cuda::topk.
struct GpuTopk {
  TopkArgs args;  // device pointers
  DeviceBuffer<float> values, out_values;
  DeviceBuffer<int32_t> lengths, positions, table, indices, topk_length;
  DeviceBuffer<unsigned long long> errors{1};

  explicit GpuTopk(const TopkArgs& h) : args(h) {
    const size_t n = h.rows == 0 ? 0 : size_t(h.rows - 1) * h.stride + h.columns;
    values = device_copy(h.values, n);
    lengths = device_copy(h.lengths, h.rows);
    positions = device_copy(h.positions, n);
    if (h.slots.block_table)
      table = device_copy(h.slots.block_table, size_t(h.slots.requests - 1) * h.slots.table_stride + h.slots.pages);
    indices = DeviceBuffer<int32_t>(size_t(h.rows) * h.k);
    out_values = DeviceBuffer<float>(size_t(h.rows) * h.k);
    topk_length = DeviceBuffer<int32_t>(h.rows);
    args.values = h.values ? values.get() : nullptr;
    args.lengths = h.lengths ? lengths.get() : nullptr;
    args.positions = h.positions ? positions.get() : nullptr;
    args.slots.block_table = h.slots.block_table ? table.get() : nullptr;
  }
  TopkOutputs outputs() const { return {indices.get(), topk_length.get(), out_values.get()}; }
  void poison() {
    indices.fill_bytes(kPoisonByte);
    out_values.fill_bytes(kPoisonByte);
    topk_length.fill_bytes(kPoisonByte);
    errors.fill_bytes(0);
  }
  // Runs the plan into poisoned outputs and downloads them.
  TopkResult run(const TopkPlan& plan, unsigned long long* error_count = nullptr) {
    poison();
    DeviceBuffer<uint8_t> ws(topk_workspace_bytes(plan, args.rows));
    cuda::topk(args, plan, ws.get(), ws.size(), outputs(), errors.get(), nullptr);
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error(cudaGetErrorString(cudaGetLastError()));
    TopkResult r(args.rows, args.k);
    r.indices = indices.download();
    r.length = topk_length.download();
    r.values = out_values.download();
    const auto e = errors.download();
    if (error_count) *error_count = e[0];
    return r;
  }
};

// The planner's plan, one CTA per row, and splits into 3 and into 256-entry segments; the splits
// with the default candidate buffer, with none (three histogram passes for every row) and with a
// small one (rows whose k-th entry's bin overflows it take the second or third pass).
std::vector<TopkPlan> plans_for(int rows, int64_t columns, bool all = true) {
  std::vector<TopkPlan> p{plan_topk(rows, columns, sm_count()), TopkPlan{}};
  if (all) {
    const int fine = static_cast<int>(std::min<int64_t>(1000, (columns + 255) / 256));
    for (int64_t candidates : {int64_t(-1), int64_t(0), int64_t(300)}) {
      p.push_back(split_topk_plan(columns, 3, candidates));
      p.push_back(split_topk_plan(columns, fine, candidates));
    }
    // resident_rows where all its CTAs fit at once.
    for (int segments : {3, fine}) {
      const auto r = resident_topk_plan(columns, segments);
      if (int64_t(rows) * r.segments <= int64_t(kTopkResidentCtasPerSm) * sm_count()) p.push_back(r);
    }
  }
  return p;
}

std::string plan_name(const TopkPlan& p) {
  return std::string(to_string(p.kernel)) + " x" + std::to_string(p.segments) + " of " + std::to_string(p.segment_len) +
         ", " + std::to_string(p.candidates) + " candidates";
}

// Where two results differ first (for the failure message).
std::string first_difference(const TopkResult& got, const TopkResult& want, int k) {
  for (size_t i = 0; i < want.length.size(); ++i)
    if (got.length[i] != want.length[i])
      return "row " + std::to_string(i) + " length " + std::to_string(got.length[i]) + " want " + std::to_string(want.length[i]);
  for (size_t i = 0; i < want.indices.size(); ++i)
    if (got.indices[i] != want.indices[i] ||
        nvfp4mla::testing::bits_of_float(got.values[i]) != nvfp4mla::testing::bits_of_float(want.values[i]))
      return "row " + std::to_string(i / k) + " place " + std::to_string(i % k) + ": index " + std::to_string(got.indices[i]) +
             " want " + std::to_string(want.indices[i]);
  return "none";
}

// Every plan of `plans` gives the reference's result bit for bit.
void expect_matches_reference(const TopkArgs& h, const std::vector<TopkPlan>& plans, const std::string& what) {
  const TopkResult want = nvfp4mla::testing::reference(h);
  GpuTopk g(h);
  for (const auto& plan : plans) {
    unsigned long long errors = 0;
    const TopkResult got = g.run(plan, &errors);
    EXPECT_TRUE(got == want) << what << ", k " << h.k << ", " << plan_name(plan) << ": " << first_difference(got, want, h.k);
    EXPECT_EQ(errors, 0u) << what;
  }
}

}  // namespace

TEST(TopkGpu, LengthSweepEveryPlan) {
  NVFP4MLA_REQUIRE_GPU();
  for (int k : {1, 2048, 4096}) {
    const std::vector<int32_t> lengths{0, 1, std::max(k - 1, 0), k, k + 1, 65535, 65536, 65537};
    TopkProblem p(static_cast<int>(lengths.size()), 65537, 65540);
    for (int r = 0; r < p.rows; ++r) nvfp4mla::testing::fill_random(p.row(r), p.stride, 1000 + r, r % 2 ? 0 : 64);
    p.lengths = lengths;
    expect_matches_reference(p.args(k), plans_for(p.rows, p.columns), "length sweep");
  }
}

TEST(TopkGpu, AdversarialRowsEveryPlan) {
  NVFP4MLA_REQUIRE_GPU();
  // One row of each kind of issue 22: all equal, monotonic, >= 12,000 values in one radix bin,
  // last-ulp differences, denormals, +-0.0, NaN/-inf patterns, fewer selectable than k.
  const int64_t n = 40000;
  TopkProblem p(10, n);
  for (int r = 0; r < 10; ++r) nvfp4mla::testing::fill_row(p.row(r), n, nvfp4mla::testing::kAllRowKinds[r], 50 + r);
  for (int k : {1, 2, 2048, 4096}) expect_matches_reference(p.args(k), plans_for(p.rows, n), "adversarial rows");
}

TEST(TopkGpu, SanitizerSized) {
  NVFP4MLA_REQUIRE_GPU();
  // Small enough for compute-sanitizer (memcheck, racecheck): every plan kind, ties, NaN rows,
  // lengths, positions and a block table.
  TopkProblem p(5, 9000);
  for (int r = 0; r < 5; ++r) nvfp4mla::testing::fill_row(p.row(r), p.columns, nvfp4mla::testing::kAllRowKinds[2 * r + 1], 90 + r);
  p.lengths = {9000, 0, 4097, 8999, 3};
  for (int k : {1, 2048}) expect_matches_reference(p.args(k), plans_for(p.rows, p.columns), "sanitizer sized");
  std::vector<int32_t> positions(p.values.size()), table(5 * 141);
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int32_t>(3 * (i % p.columns) + 1);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * 7) % table.size());
  TopkArgs a = p.args(100);
  a.positions = positions.data();
  a.slots = {table.data(), 5, 141, 141, 192, 1, int64_t(table.size()) * 192};
  expect_matches_reference(a, plans_for(p.rows, p.columns), "sanitizer sized, positions and slots");
}

TEST(TopkGpu, LongRowsTo2Pow21) {
  NVFP4MLA_REQUIRE_GPU();
  const struct {
    int64_t n;
    RowKind kind;
    int k;
  } cases[] = {{1 << 20, RowKind::random, 2048},     {1 << 21, RowKind::random, 2048},
               {1 << 21, RowKind::all_equal, 2048},  {1 << 21, RowKind::all_equal, 4096},
               {1 << 20, RowKind::increasing, 2048}, {1 << 20, RowKind::decreasing, 2048},
               {1 << 21, RowKind::one_bin, 2048},    {4 * 118750, RowKind::random, 2048},
               {(1 << 16) - 1, RowKind::last_ulp, 4096}, {(1 << 16) + 1, RowKind::signed_zeros, 2048}};
  for (const auto& c : cases) {
    TopkProblem p(1, c.n);
    nvfp4mla::testing::fill_row(p.row(0), c.n, c.kind, 7);
    expect_matches_reference(p.args(c.k), plans_for(1, c.n, false),
                             std::string(nvfp4mla::testing::kind_name(c.kind)) + " x " + std::to_string(c.n));
  }
}

TEST(TopkGpu, ManyRows) {
  NVFP4MLA_REQUIRE_GPU();
  {  // 300 rows of random lengths (one CTA each), ties in every other row
    TopkProblem p(300, 5000);
    std::mt19937 rng(3);
    for (int r = 0; r < p.rows; ++r) {
      nvfp4mla::testing::fill_random(p.row(r), p.columns, 2000 + r, r % 2 ? 0 : 100);
      p.lengths.push_back(static_cast<int32_t>(rng() % (p.columns + 1)));
    }
    for (int k : {1, 2048, 4096}) expect_matches_reference(p.args(k), plans_for(p.rows, p.columns), "300 rows");
  }
  {  // the bar shape 64 x 131,072 with mixed row kinds
    TopkProblem p(64, 131072);
    for (int r = 0; r < p.rows; ++r)
      nvfp4mla::testing::fill_row(p.row(r), p.columns, nvfp4mla::testing::kAllRowKinds[r % 10], 3000 + r);
    expect_matches_reference(p.args(2048), plans_for(p.rows, p.columns, false), "64 x 131072");
  }
}

TEST(TopkGpu, FoldOfChunksEqualsDirect) {
  NVFP4MLA_REQUIRE_GPU();
  auto gpu_select = [](const TopkArgs& a) {
    GpuTopk g(a);
    return g.run(plan_topk(a.rows, a.columns, sm_count()));
  };
  const int64_t n = 4 * 118750;
  std::vector<float> row(n);
  for (int trial = 0; trial < 6; ++trial) {
    const RowKind kind = trial < 2 ? RowKind::random : nvfp4mla::testing::kAllRowKinds[trial + 2];
    nvfp4mla::testing::fill_row(row.data(), n, kind, 400 + trial);
    if (trial == 1) nvfp4mla::testing::fill_random(row.data(), n, 401, 300);  // ties across chunks
    TopkProblem p(1, n);
    p.values = row;
    const auto direct = nvfp4mla::testing::reference(p.args(2048));
    const auto bounds = trial < 2 ? nvfp4mla::testing::even_bounds(n, 4) : nvfp4mla::testing::random_bounds(n, 3 + trial, trial);
    const auto folded = nvfp4mla::testing::fold_row(row.data(), bounds, 2048, gpu_select);
    EXPECT_TRUE(folded == direct) << nvfp4mla::testing::kind_name(kind) << " chunks " << bounds.size() - 1 << ": "
                                  << first_difference(folded, direct, 2048);
    EXPECT_TRUE(gpu_select(p.args(2048)) == direct);
  }
}

TEST(TopkGpu, SlotTransformMatchesReference) {
  NVFP4MLA_REQUIRE_GPU();
  // 3 requests x 2 rows, page 64, contexts up to 20,000, permuted pages; vLLM-style padding
  // entries (-1) past each request's pages.
  const int page = 64, rows = 6, R = 2;
  const int64_t n = 20000, pages = (n + page - 1) / page, stride = pages + 5;
  TopkProblem p(rows, n);
  std::mt19937 rng(11);
  for (int r = 0; r < rows; ++r) {
    nvfp4mla::testing::fill_random(p.row(r), n, 500 + r);
    p.lengths.push_back(static_cast<int32_t>(n - (r % 3) * 3000));
  }
  std::vector<int32_t> perm(3 * pages);
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(3 * stride, -1);
  for (int q = 0; q < 3; ++q)
    for (int64_t pg = 0; pg < pages; ++pg) table[q * stride + pg] = perm[q * pages + pg];
  for (int k : {1, 2048}) {
    TopkArgs a = p.args(k);
    a.slots = {table.data(), 3, pages, stride, page, R, int64_t(3) * pages * page};
    expect_matches_reference(a, plans_for(rows, n), "slot transform");
  }
}

TEST(TopkGpu, InvalidSlotsBecomeMinusOneAndAreCounted) {
  NVFP4MLA_REQUIRE_GPU();
  const int page = 16, rows = 2;
  const int64_t n = 4096, pages = n / page;
  TopkProblem p(rows, n);
  for (int r = 0; r < rows; ++r) nvfp4mla::testing::fill_random(p.row(r), n, 600 + r);
  std::vector<int32_t> table(2 * pages);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  table[3] = -5;                      // a negative entry
  table[pages + 7] = 1 << 27;         // a slot past 2^31
  table[pages + 9] = 2 * pages;       // a slot past the capacity
  const int k = 2048;
  const auto plain = nvfp4mla::testing::reference(p.args(k));
  TopkArgs a = p.args(k);
  a.slots = {table.data(), 2, pages, pages, page, 1, 2 * pages * page};
  TopkResult want = plain;
  unsigned long long want_errors = 0;
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < plain.length[r]; ++i) {
      int32_t& id = want.indices[r * k + i];
      id = static_cast<int32_t>(topk_slot(a.slots, r, id));
      want_errors += id < 0;
    }
  ASSERT_GT(want_errors, 10u);
  GpuTopk g(a);
  for (const auto& plan : plans_for(rows, n)) {
    unsigned long long errors = 0;
    const auto got = g.run(plan, &errors);
    EXPECT_TRUE(got == want) << plan_name(plan) << ": " << first_difference(got, want, k);
    EXPECT_EQ(errors, want_errors) << plan_name(plan);
  }
}

TEST(TopkGpu, BadDeviceLengthsGiveEmptyRowsAndAreCounted) {
  NVFP4MLA_REQUIRE_GPU();
  TopkProblem p(4, 9000);
  for (int r = 0; r < 4; ++r) nvfp4mla::testing::fill_random(p.row(r), p.columns, 700 + r);
  p.lengths = {9000, 1, 9000, 5000};
  auto want = nvfp4mla::testing::reference(p.args(64));
  GpuTopk g(p.args(64));
  g.lengths.upload({9000, -1, 9001, 5000});
  for (int r : {1, 2}) {
    want.length[r] = 0;
    for (int i = 0; i < 64; ++i) {
      want.indices[r * 64 + i] = -1;
      want.values[r * 64 + i] = -std::numeric_limits<float>::infinity();
    }
  }
  for (const auto& plan : plans_for(p.rows, p.columns)) {
    unsigned long long errors = 0;
    const auto got = g.run(plan, &errors);
    EXPECT_TRUE(got == want) << plan_name(plan) << ": " << first_difference(got, want, 64);
    EXPECT_EQ(errors, 2u) << plan_name(plan);
  }
}

TEST(TopkGpu, BadArgumentsThrowAndWriteNothing) {
  NVFP4MLA_REQUIRE_GPU();
  TopkProblem p(2, 10000);
  nvfp4mla::testing::fill_random(p.values.data(), 20000, 9);
  GpuTopk g(p.args(16));
  const auto split = split_topk_plan(p.columns, 4);
  DeviceBuffer<uint8_t> ws(topk_workspace_bytes(split, 2) + 16);
  auto expect_error = [&](TopkArgs a, TopkPlan plan, void* w, size_t bytes, TopkOutputs o, const std::string& needle) {
    g.poison();
    try {
      cuda::topk(a, plan, w, bytes, o, g.errors.get(), nullptr);
      ADD_FAILURE() << "no error, expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int32_t x : g.indices.download()) ASSERT_EQ(static_cast<uint32_t>(x), 0xABABABABu) << needle;
    for (int32_t x : g.topk_length.download()) ASSERT_EQ(static_cast<uint32_t>(x), 0xABABABABu) << needle;
  };
  const size_t bytes = topk_workspace_bytes(split, 2);
  TopkArgs a = g.args;
  a.k = 0;
  expect_error(a, split, ws.get(), bytes, g.outputs(), "k must be");
  a.k = kTopkMaxK + 1;
  expect_error(a, split, ws.get(), bytes, g.outputs(), "k must be");
  a = g.args;
  a.stride = a.columns - 1;
  expect_error(a, split, ws.get(), bytes, g.outputs(), "stride");
  a = g.args;
  a.values = reinterpret_cast<const float*>(reinterpret_cast<const char*>(g.values.get()) + 1);
  expect_error(a, split, ws.get(), bytes, g.outputs(), "values is not aligned");
  auto o = g.outputs();
  o.indices = reinterpret_cast<int32_t*>(reinterpret_cast<char*>(o.indices) + 2);
  expect_error(g.args, split, ws.get(), bytes, o, "indices is not aligned");
  expect_error(g.args, split, ws.get(), bytes - 1, g.outputs(), "workspace");
  expect_error(g.args, split, ws.get() + 8, bytes, g.outputs(), "workspace");
  expect_error(g.args, split_topk_plan(p.columns / 2, 4), ws.get(), bytes, g.outputs(), "do not cover");
  auto with_candidates = resident_topk_plan(p.columns, 4);
  with_candidates.candidates = 100;
  DeviceBuffer<uint8_t> resident_ws(topk_workspace_bytes(with_candidates, 2));
  expect_error(g.args, with_candidates, resident_ws.get(), resident_ws.size(), g.outputs(), "keeps no candidates");
  std::vector<int32_t> table(10, 0);
  DeviceBuffer<int32_t> dtable(table);
  a = g.args;
  a.slots = {dtable.get(), 2, 5, 5, 64, 1, 1 << 20};
  expect_error(a, split, ws.get(), bytes, g.outputs(), "block_table covers 320 positions");
}

TEST(TopkGpu, ResidentPlanLargerThanTheGpuIsRefused) {
  NVFP4MLA_REQUIRE_GPU();
  // More resident CTAs than the GPU holds at once would wait for each other forever: refused
  // before anything runs, outputs untouched.
  const int segments = 64;
  const int rows = kTopkResidentCtasPerSm * sm_count() / segments + 1;
  TopkProblem p(rows, int64_t(segments) * 256);
  nvfp4mla::testing::fill_random(p.values.data(), static_cast<int64_t>(p.values.size()), 5);
  GpuTopk g(p.args(16));
  const auto plan = resident_topk_plan(p.columns, segments);
  ASSERT_EQ(plan.segments, segments);
  DeviceBuffer<uint8_t> ws(topk_workspace_bytes(plan, rows));
  g.poison();
  try {
    cuda::topk(g.args, plan, ws.get(), ws.size(), g.outputs(), g.errors.get(), nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit"), std::string::npos) << e.what();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int32_t x : g.topk_length.download()) ASSERT_EQ(static_cast<uint32_t>(x), 0xABABABABu);
}

TEST(TopkGpu, CudaGraphReplayFollowsNewValues) {
  NVFP4MLA_REQUIRE_GPU();
  TopkProblem p(3, 300000);
  for (int r = 0; r < 3; ++r) nvfp4mla::testing::fill_random(p.row(r), p.columns, 800 + r);
  GpuTopk g(p.args(2048));
  // The planner's resident plan (one cooperative launch) and a split one (a chain of launches).
  ASSERT_EQ(plan_topk(p.rows, p.columns, sm_count()).kernel, TopkKernel::resident_rows);
  for (const auto& plan : {plan_topk(p.rows, p.columns, sm_count()), split_topk_plan(p.columns, 20)}) {
    SCOPED_TRACE(plan_name(plan));
    DeviceBuffer<uint8_t> ws(topk_workspace_bytes(plan, p.rows));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cuda::topk(g.args, plan, ws.get(), ws.size(), g.outputs(), nullptr, s);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int round = 0; round < 3; ++round) {
      if (round > 0)
        for (int r = 0; r < 3; ++r) nvfp4mla::testing::fill_row(p.row(r), p.columns, nvfp4mla::testing::kAllRowKinds[round * 3 + r], round);
      g.values.upload(p.values);
      g.poison();
      CUDA_OK(cudaGraphLaunch(exec, s));
      CUDA_OK(cudaStreamSynchronize(s));
      TopkResult got(p.rows, 2048);
      got.indices = g.indices.download();
      got.length = g.topk_length.download();
      got.values = g.out_values.download();
      const auto want = nvfp4mla::testing::reference(p.args(2048));
      EXPECT_TRUE(got == want) << "replay " << round << ": " << first_difference(got, want, 2048);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
  }
}
