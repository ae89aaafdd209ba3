// nvfp4mla select --device cpu: the CLI equals the library reference (with and without a block
// table), and malformed inputs fail with one clear line and no output file. Second form (q,
// weights, records, lengths): equals indexer_logits_reference + topk_reference, --logits-out
// writes those logits, and --device cuda gives the same file on small-integer data (exact
// logits; skipped without a device).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "nvfp4mla/device.h"
#include "nvfp4mla/indexer.h"
#include "nvfp4mla/safetensors.h"
#include "nvfp4mla/topk.h"
#include "support/cli_runner.h"
#include "support/temp_dir.h"
#include "nvfp4mla/testing/index_data.h"
#include "support/indexer_problems.h"
#include "support/topk_data.h"

#ifdef NVFP4MLA_CLI_PATH

using namespace nvfp4mla;
using nvfp4mla::testing::expect_cli_error;
using nvfp4mla::testing::run_cli;
using nvfp4mla::testing::TempDir;

namespace {

template <class T>
Tensor tensor_of(DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
  Tensor t = Tensor::zeros(dt, std::move(shape));
  EXPECT_EQ(t.data.size(), v.size() * sizeof(T));
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

struct SelectInput {
  int rows = 6;
  int64_t columns = 3000;
  std::vector<float> logits;
  std::vector<int32_t> lengths, table;
  SelectInput() : logits(size_t(rows) * columns) {
    for (int r = 0; r < rows; ++r)
      nvfp4mla::testing::fill_row(logits.data() + r * columns, columns, nvfp4mla::testing::kAllRowKinds[r], 20 + r);
    lengths = {3000, 0, 1, 2999, 100, 2048};
    // 3 requests x 2 rows, pages of 64: 47 pages each, distinct pages inside a 200-page cache.
    for (int q = 0; q < 3; ++q)
      for (int pg = 0; pg < 47; ++pg) table.push_back((q * 61 + pg * 3) % 200);
  }
  void write(const TempDir& dir, bool with_table) const {
    TensorMap m{{"logits", tensor_of(DType::F32, {rows, columns}, logits)},
                {"lengths", tensor_of(DType::I32, {rows}, lengths)}};
    if (with_table) m["block_table"] = tensor_of(DType::I32, {3, 47}, table);
    write_safetensors(dir / "in.safetensors", m);
  }
  nvfp4mla::testing::TopkResult reference(int k, bool with_table) const {
    TopkArgs a;
    a.values = logits.data();
    a.rows = rows;
    a.columns = columns;
    a.stride = columns;
    a.lengths = lengths.data();
    a.k = k;
    if (with_table) a.slots = {table.data(), 3, 47, 47, 64, 2, 200 * 64};
    return nvfp4mla::testing::reference(a);
  }
};

void expect_output(const TempDir& dir, const nvfp4mla::testing::TopkResult& want, int rows, int k) {
  const auto out = read_safetensors(dir / "out.safetensors");
  const Tensor& idx = require_tensor(out, "indices", "out", {DType::I32}, {rows, k});
  const Tensor& len = require_tensor(out, "topk_length", "out", {DType::I32}, {rows});
  EXPECT_EQ(std::vector<int32_t>(idx.as<int32_t>(), idx.as<int32_t>() + rows * k), want.indices);
  EXPECT_EQ(std::vector<int32_t>(len.as<int32_t>(), len.as<int32_t>() + rows), want.length);
}

// Second-form input: rows of queries scoring prefixes of N per-token records.
struct ScoresInput {
  int rows = 5, heads = 8;
  int64_t n = 700;
  std::vector<uint8_t> q, records;
  std::vector<float> w;
  std::vector<int32_t> lengths{700, 0, 1, 333, 64};
  explicit ScoresInput(nvfp4mla::testing::Values v) {
    std::vector<uint8_t> values;
    std::vector<float> scales;
    nvfp4mla::testing::make_keys(n, 3, v, values, scales);
    records.assign(n * 132, 0);
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(&records[t * 132], &values[t * 128], 128);
      std::memcpy(&records[t * 132 + 128], &scales[t], 4);
    }
    nvfp4mla::testing::make_queries(rows, heads, 4, v, q, w);
  }
  void write(const TempDir& dir) const {
    write_safetensors(dir / "in.safetensors", {{"q", tensor_of(DType::U8, {rows, heads, 128}, q)},
                                               {"weights", tensor_of(DType::F32, {rows, heads}, w)},
                                               {"records", tensor_of(DType::U8, {n, 132}, records)},
                                               {"lengths", tensor_of(DType::I32, {rows}, lengths)}});
  }
  std::vector<float> logits() const {
    std::vector<float> out(rows * n);
    std::vector<int32_t> starts(rows, 0);
    IndexerRaggedArgs a;
    a.q = q.data();
    a.weights = w.data();
    a.rows = rows;
    a.heads = heads;
    a.key_values = records.data();
    a.key_value_stride = 132;
    a.key_scales = reinterpret_cast<const float*>(records.data() + 128);
    a.key_scale_stride = 33;
    a.num_keys = n;
    a.row_starts = starts.data();
    a.row_ends = lengths.data();
    a.logits = out.data();
    a.logits_stride = n;
    indexer_logits_reference(a);
    return out;
  }
  nvfp4mla::testing::TopkResult reference(const std::vector<float>& logits, int k) const {
    TopkArgs a;
    a.values = logits.data();
    a.rows = rows;
    a.columns = n;
    a.stride = n;
    a.lengths = lengths.data();
    a.k = k;
    return nvfp4mla::testing::reference(a);
  }
};

std::vector<float> logits_in(const TempDir& dir, const std::string& file, int rows, int64_t n) {
  const auto out = read_safetensors(dir / file);
  const Tensor& t = require_tensor(out, "logits", file, {DType::F32}, {rows, n});
  return std::vector<float>(t.as<float>(), t.as<float>() + rows * n);
}

}  // namespace

TEST(CliSelect, ScoresFormEqualsLogitsThenTopk) {
  TempDir dir;
  const ScoresInput in(nvfp4mla::testing::Values::random);
  in.write(dir);
  const std::vector<float> logits = in.logits();
  auto r = run_cli(dir, "select --input in.safetensors --output out.safetensors --k 50");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_output(dir, in.reference(logits, 50), in.rows, 50);
  EXPECT_EQ(read_safetensors(dir / "out.safetensors").count("logits"), 0u);
  r = run_cli(dir, "select --input in.safetensors --output out.safetensors --k 50 --logits-out");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_output(dir, in.reference(logits, 50), in.rows, 50);
  const std::vector<float> written = logits_in(dir, "out.safetensors", in.rows, in.n);
  EXPECT_EQ(std::memcmp(written.data(), logits.data(), logits.size() * 4), 0);
}

TEST(CliSelect, ScoresFormRejectsMalformedInputsWithoutOutput) {
  TempDir dir;
  ScoresInput in(nvfp4mla::testing::Values::small_integers);
  auto write_and_expect = [&](TensorMap m, const std::string& needle, const std::string& flags = "") {
    write_safetensors(dir / "bad.safetensors", m);
    expect_cli_error(dir, "select --input bad.safetensors --output out.safetensors --k 8" + flags, needle);
  };
  auto good = [&] {
    return TensorMap{{"q", tensor_of(DType::U8, {in.rows, in.heads, 128}, in.q)},
                     {"weights", tensor_of(DType::F32, {in.rows, in.heads}, in.w)},
                     {"records", tensor_of(DType::U8, {in.n, 132}, in.records)},
                     {"lengths", tensor_of(DType::I32, {in.rows}, in.lengths)}};
  };
  TensorMap m = good();
  m.erase("lengths");
  write_and_expect(m, "'lengths'");
  m = good();
  m["weights"] = tensor_of(DType::F32, {in.rows, in.heads - 1}, std::vector<float>(in.rows * (in.heads - 1)));
  write_and_expect(m, "weights");
  m = good();
  m["records"] = tensor_of(DType::U8, {in.n, 128}, std::vector<uint8_t>(in.n * 128));
  write_and_expect(m, "records");
  m = good();
  in.lengths[2] = 701;
  m["lengths"] = tensor_of(DType::I32, {in.rows}, in.lengths);
  write_and_expect(m, "lengths[2] = 701");
  write_and_expect({{"logits", tensor_of(DType::F32, {3, 4}, std::vector<float>(12))}}, "--logits-out", " --logits-out");
}

TEST(CliSelect, ScoresFormCudaEqualsCpuOnExactData) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TempDir dir;
  const ScoresInput in(nvfp4mla::testing::Values::small_integers);
  in.write(dir);
  for (const char* device : {"cpu", "cuda"}) {
    const auto r = run_cli(dir, std::string("select --input in.safetensors --output ") + device +
                                    ".safetensors --k 64 --logits-out --device " + device);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  const auto cpu = read_safetensors(dir / "cpu.safetensors"), cuda = read_safetensors(dir / "cuda.safetensors");
  for (const char* name : {"indices", "topk_length", "logits"}) EXPECT_EQ(cpu.at(name).data, cuda.at(name).data) << name;
}

TEST(CliSelect, CpuEqualsLibraryReference) {
  TempDir dir;
  SelectInput in;
  in.write(dir, false);
  const auto r = run_cli(dir, "select --input in.safetensors --output out.safetensors --k 2048");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_output(dir, in.reference(2048, false), in.rows, 2048);
}

TEST(CliSelect, BlockTableGivesSlots) {
  TempDir dir;
  SelectInput in;
  in.write(dir, true);
  const auto r = run_cli(dir, "select --input in.safetensors --output out.safetensors --k 100 --page-size 64 "
                              "--rows-per-request 2 --capacity 12800 --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_output(dir, in.reference(100, true), in.rows, 100);
}

TEST(CliSelect, RejectsMalformedInputsWithoutOutput) {
  TempDir dir;
  SelectInput in;
  in.write(dir, true);
  const std::string io = " --input in.safetensors --output out.safetensors";
  expect_cli_error(dir, "select" + io + " --k 4097", "--k");
  expect_cli_error(dir, "select" + io + " --k 8", "--page-size is required");
  // A negative page size was reported as missing.
  expect_cli_error(dir, "select" + io + " --k 8 --page-size -4", "--page-size must be positive, got -4");
  expect_cli_error(dir, "select" + io + " --k 8 --page-size 32 --rows-per-request 2", "block_table covers 1504 positions");
  expect_cli_error(dir, "select" + io + " --k 8 --page-size 64 --rows-per-request 1", "block_table has 3 requests");
  expect_cli_error(dir, "select" + io + " --k 8 --page-size 64 --rows-per-request 2 --capacity 6400", "block_table[");
  expect_cli_error(dir, "select --input missing.safetensors --output out.safetensors --k 8", "missing.safetensors");

  auto write_and_expect = [&](const TensorMap& m, const std::string& needle) {
    write_safetensors(dir / "bad.safetensors", m);
    expect_cli_error(dir, "select --input bad.safetensors --output out.safetensors --k 8", needle);
  };
  const std::vector<float> v(12, 1.0f);
  write_and_expect({{"lengths", tensor_of(DType::I32, {3}, std::vector<int32_t>{1, 2, 3})}}, "'logits'");
  write_and_expect({{"logits", tensor_of(DType::I32, {3, 4}, std::vector<int32_t>(12))}}, "logits");
  write_and_expect({{"logits", tensor_of(DType::F32, {3, 4}, v)}, {"lengths", tensor_of(DType::I32, {2}, std::vector<int32_t>{1, 2})}},
                   "lengths");
  write_and_expect({{"logits", tensor_of(DType::F32, {3, 4}, v)}, {"lengths", tensor_of(DType::I32, {3}, std::vector<int32_t>{1, 5, 2})}},
                   "lengths[1] = 5");
  dir.write("garbage.safetensors", "not a safetensors file");
  expect_cli_error(dir, "select --input garbage.safetensors --output out.safetensors --k 8", "garbage.safetensors");
}

#endif  // NVFP4MLA_CLI_PATH
