// nvfp4mla select: exact top-k of logits rows (topk.h), on the CPU reference or the GPU kernels,
// optionally mapped to cache slots through a block table, with tensors in safetensors files.
// Second form: the rows' indexer logits (indexer.h, ragged form over per-token records, row r
// scoring positions 0..lengths[r]-1) computed first, then the same top-k.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "device_bytes.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/index_key.h"
#include "nvfp4mla/indexer.h"
#include "nvfp4mla/safetensors.h"
#include "nvfp4mla/topk.h"

#if defined(NVFP4MLA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "nvfp4mla/cuda/indexer.h"
#include "nvfp4mla/cuda/topk.h"
#endif

namespace nvfp4mla::cli {
namespace {

struct SelectArgs {
  std::string input, output, device = "cpu";
  int k = 0;
  int page_size = 0;
  int rows_per_request = 1;
  int64_t capacity = int64_t(1) << 31;
  bool logits_out = false;
};

#if defined(NVFP4MLA_WITH_CUDA)
void select_cuda(const TopkArgs& host, const TopkOutputs& out) {
  if (cuda_device_count() == 0) throw Error("--device cuda: no CUDA device is visible");
  const size_t n = host.rows == 0 ? 0 : size_t(host.rows - 1) * host.stride + host.columns;
  const auto& m = host.slots;
  DeviceBytes values(host.values, n * 4), lengths(host.lengths, host.lengths ? size_t(host.rows) * 4 : 0),
      table(m.block_table, m.block_table ? size_t(m.requests) * m.table_stride * 4 : 0),
      indices(size_t(host.rows) * host.k * 4), topk_length(size_t(host.rows) * 4), errors(8);
  TopkArgs a = host;
  a.values = values.as<float>();
  a.lengths = host.lengths ? lengths.as<int32_t>() : nullptr;
  a.slots.block_table = m.block_table ? table.as<int32_t>() : nullptr;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    throw Error("--device cuda: cannot query the GPU");
  const TopkPlan plan = plan_topk(a.rows, a.columns, sms);
  DeviceBytes workspace(topk_workspace_bytes(plan, a.rows));
  if (cudaMemset(errors.as<void>(), 0, 8) != cudaSuccess) throw Error("--device cuda: cudaMemset failed");
  cuda::topk(a, plan, workspace.as<void>(), topk_workspace_bytes(plan, a.rows),
             {indices.as<int32_t>(), topk_length.as<int32_t>(), nullptr}, errors.as<unsigned long long>(), nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess)
    throw Error(std::string("top-k kernel failed: ") + cudaGetErrorString(cudaGetLastError()));
  unsigned long long device_errors = 0;
  errors.download(&device_errors);
  // The host checked lengths and the block table first, so this only reports a disagreement.
  if (device_errors) throw Error("--device cuda: the kernel counted " + std::to_string(device_errors) + " invalid lengths or slots");
  indices.download(out.indices);
  topk_length.download(out.topk_length);
}

// The ragged logits on the GPU into the host buffer a.logits (the top-k then runs as in the
// first form, so both forms share one top-k path).
void logits_cuda(const IndexerRaggedArgs& host) {
  if (cuda_device_count() == 0) throw Error("--device cuda: no CUDA device is visible");
  const size_t rows = static_cast<size_t>(host.rows), n = static_cast<size_t>(host.num_keys);
  // The GPU reads keys from 16-byte aligned rows: the records split into values and scales.
  std::vector<uint8_t> values(n * index_key::kValueBytes);
  std::vector<float> scales(n);
  for (size_t t = 0; t < n; ++t) {
    std::memcpy(&values[t * index_key::kValueBytes], host.key_values + t * host.key_value_stride, index_key::kValueBytes);
    scales[t] = host.key_scales[t * host.key_scale_stride];
  }
  DeviceBytes q(host.q, rows * host.heads * index_key::kDim), weights(host.weights, rows * host.heads * 4),
      key_values(values.data(), values.size()), key_scales(scales.data(), n * 4), starts(host.row_starts, rows * 4),
      ends(host.row_ends, rows * 4), logits(rows * host.logits_stride * 4), invalid(8);
  IndexerRaggedArgs a = host;
  a.q = q.as<uint8_t>();
  a.weights = weights.as<float>();
  a.key_values = key_values.as<uint8_t>();
  a.key_value_stride = index_key::kValueBytes;
  a.key_scales = key_scales.as<float>();
  a.key_scale_stride = 1;
  a.row_starts = starts.as<int32_t>();
  a.row_ends = ends.as<int32_t>();
  a.logits = logits.as<float>();
  cuda::indexer_logits(a, invalid.as<unsigned long long>(), nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess)
    throw Error(std::string("indexer logits kernel failed: ") + cudaGetErrorString(cudaGetLastError()));
  unsigned long long bad = 0;
  invalid.download(&bad);
  // The host checked the lengths first, so this only reports a disagreement.
  if (bad) throw Error("--device cuda: the logits kernel counted " + std::to_string(bad) + " invalid rows");
  logits.download(host.logits);
}
#endif

// Every page a row's context touches must map inside the cache, so that the CPU and GPU paths
// fail alike, before anything is computed.
void check_block_table(const SelectArgs& args, const TopkArgs& a) {
  const TopkSlotMap& m = a.slots;
  for (int r = 0; r < a.rows; ++r) {
    const int64_t len = a.lengths ? a.lengths[r] : a.columns;
    const int64_t q = r / m.rows_per_request;
    for (int64_t pg = 0; pg * m.page_size < len; ++pg) {
      const int32_t entry = m.block_table[q * m.table_stride + pg];
      const int64_t last_slot = int64_t(entry) * m.page_size + m.page_size - 1;
      if (entry < 0 || last_slot >= m.capacity || last_slot > INT32_MAX)
        throw Error(args.input + ": block_table[" + std::to_string(q) + ", " + std::to_string(pg) + "] = " +
                    std::to_string(entry) + " is not a page inside the cache of " + std::to_string(m.capacity) +
                    " slots (--capacity), and row " + std::to_string(r) + " reaches position " + std::to_string(len - 1));
    }
  }
}

// The second form's logits: F32 [rows, N] for N records, -inf past each row's length.
Tensor indexer_logits_of(const SelectArgs& args, const TensorMap& in, const Tensor*& lengths) {
  const Tensor& q = require_tensor(in, "q", args.input, {DType::U8}, {kAnyExtent, kAnyExtent, index_key::kDim});
  const int64_t rows = q.shape[0], heads = q.shape[1];
  if (heads < 1 || heads > kIndexerMaxHeads)
    throw Error(args.input + ": q " + q.shape_string() + " has " + std::to_string(heads) + " heads (1.." +
                std::to_string(kIndexerMaxHeads) + ")");
  const Tensor& weights = require_tensor(in, "weights", args.input, {DType::F32}, {rows, heads});
  const Tensor& records = require_tensor(in, "records", args.input, {DType::U8}, {kAnyExtent, index_key::kRecordBytes});
  const int64_t n = records.shape[0];
  if (rows > INT32_MAX || n > INT32_MAX) throw Error(args.input + ": q or records is too large");
  if (!in.count("lengths")) throw Error(args.input + ": 'lengths' I32 [rows] is required with 'q' (keys each row scores)");
  lengths = &require_tensor(in, "lengths", args.input, {DType::I32}, {rows});
  std::vector<int32_t> starts(rows, 0), ends(lengths->as<int32_t>(), lengths->as<int32_t>() + rows);
  for (int64_t r = 0; r < rows; ++r)
    if (ends[r] < 0 || ends[r] > n)
      throw Error(args.input + ": lengths[" + std::to_string(r) + "] = " + std::to_string(ends[r]) + " is outside 0.." +
                  std::to_string(n) + " (the records)");
  Tensor logits = Tensor::zeros(DType::F32, {rows, n});
  IndexerRaggedArgs a;
  a.q = q.as<uint8_t>();
  a.weights = weights.as<float>();
  a.rows = rows;
  a.heads = static_cast<int>(heads);
  a.key_values = records.as<uint8_t>();
  a.key_value_stride = index_key::kRecordBytes;
  a.key_scales = reinterpret_cast<const float*>(records.as<uint8_t>() + index_key::kScaleOffset);
  a.key_scale_stride = index_key::kRecordBytes / 4;
  a.num_keys = n;
  a.row_starts = starts.data();
  a.row_ends = ends.data();
  a.logits = logits.as<float>();
  a.logits_stride = n;
  validate_indexer_args(a);
  if (args.device == "cuda") {
#if defined(NVFP4MLA_WITH_CUDA)
    logits_cuda(a);
#else
    throw Error("--device cuda: this nvfp4mla was built without CUDA");
#endif
  } else {
    indexer_logits_reference(a);
  }
  return logits;
}

void run_select(const SelectArgs& args) {
  const TensorMap in = read_safetensors(args.input);
  const bool scores = !in.count("logits") && in.count("q");
  if (args.logits_out && !scores) throw Error("--logits-out needs the second input form ('q', 'weights', 'records', 'lengths')");
  Tensor computed;
  const Tensor* lengths = nullptr;
  if (scores) computed = indexer_logits_of(args, in, lengths);
  const Tensor& logits =
      scores ? computed : require_tensor(in, "logits", args.input, {DType::F32}, {kAnyExtent, kAnyExtent});
  const int64_t rows = logits.shape[0], columns = logits.shape[1];
  if (rows > INT32_MAX || columns > INT32_MAX) throw Error(args.input + ": logits " + logits.shape_string() + " is too large");
  if (!scores && in.count("lengths")) lengths = &require_tensor(in, "lengths", args.input, {DType::I32}, {rows});
  if (lengths && !scores)
    for (int64_t r = 0; r < rows; ++r)
      if (lengths->as<int32_t>()[r] < 0 || lengths->as<int32_t>()[r] > columns)
        throw Error(args.input + ": lengths[" + std::to_string(r) + "] = " + std::to_string(lengths->as<int32_t>()[r]) +
                    " is outside 0.." + std::to_string(columns));

  TopkArgs a;
  a.values = logits.as<float>();
  a.rows = static_cast<int>(rows);
  a.columns = columns;
  a.stride = columns;
  a.lengths = lengths ? lengths->as<int32_t>() : nullptr;
  a.k = args.k;
  if (in.count("block_table")) {
    const Tensor& table = require_tensor(in, "block_table", args.input, {DType::I32}, {kAnyExtent, kAnyExtent});
    if (args.page_size == 0) throw Error("--page-size is required with a block_table (positions per page)");
    if (args.page_size < 0) throw Error("--page-size must be positive, got " + std::to_string(args.page_size));
    a.slots = {table.as<int32_t>(), table.shape[0], table.shape[1], table.shape[1], args.page_size, args.rows_per_request,
               args.capacity};
  }
  Tensor indices = Tensor::zeros(DType::I32, {rows, args.k}), topk_length = Tensor::zeros(DType::I32, {rows});
  const TopkOutputs out{indices.as<int32_t>(), topk_length.as<int32_t>(), nullptr};
  validate_topk_args(a, out);
  if (a.slots.block_table) check_block_table(args, a);
  if (args.device == "cuda") {
#if defined(NVFP4MLA_WITH_CUDA)
    select_cuda(a, out);
#else
    throw Error("--device cuda: this nvfp4mla was built without CUDA");
#endif
  } else {
    topk_reference(a, out);
  }
  TensorMap result{{"indices", std::move(indices)}, {"topk_length", std::move(topk_length)}};
  if (args.logits_out) result.emplace("logits", std::move(computed));
  write_safetensors(args.output, result, {{"nvfp4mla.k", std::to_string(args.k)}});
}

}  // namespace

void add_select_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "select", "Exact top-k of logits rows, or of indexer logits it computes (CPU reference or GPU kernels), optionally as cache slots");
  auto args = std::make_shared<SelectArgs>();
  cmd->add_option("--input", args->input,
                  "safetensors with F32 'logits' [rows, L] and optional I32 'lengths' [rows], or U8 'q' [rows, H, 128] (E4M3), "
                  "F32 'weights' [rows, H], U8 'records' [N, 132] and I32 'lengths' [rows] (row r scores positions "
                  "0..lengths[r]-1); optional I32 'block_table' [requests, pages]")
      ->required();
  cmd->add_option("--output", args->output,
                  "safetensors to write: I32 'indices' [rows, K] (ascending position, -1 padded; slots with a block_table) and "
                  "I32 'topk_length' [rows]")
      ->required();
  cmd->add_option("--k", args->k, "entries per row, 1..4096")->required()->check(CLI::Range(1, kTopkMaxK));
  cmd->add_option("--device", args->device, "cpu (reference) or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--page-size", args->page_size, "positions per page of the block_table");
  cmd->add_option("--rows-per-request", args->rows_per_request, "rows per block_table request (row r uses request r / R)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--capacity", args->capacity, "cache slots the block_table may point into (default 2^31, the int32 limit)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 31));
  cmd->add_flag("--logits-out", args->logits_out, "also write the computed F32 'logits' [rows, N] (second input form)");
  cmd->callback([args] { run_select(*args); });
}

}  // namespace nvfp4mla::cli
