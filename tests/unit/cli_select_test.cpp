// nvfp4mla select --device cpu: the CLI equals the library reference (with and without a block
// table), and malformed inputs fail with one clear line and no output file.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "nvfp4mla/safetensors.h"
#include "nvfp4mla/topk.h"
#include "support/cli_runner.h"
#include "support/temp_dir.h"
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

}  // namespace

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
  expect_cli_error(dir, "select" + io + " --k 8", "--page-size");
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
