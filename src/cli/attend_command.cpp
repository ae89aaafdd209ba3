// nvfp4mla attend: sparse MLA attention over a cache of records, on the CPU reference or the
// GPU decode kernel, with tensors in safetensors files.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "commands.h"
#include "device_bytes.h"
#include "format_flags.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/safetensors.h"
#include "nvfp4mla/sparse_mla.h"
#include "records_io.h"

#if defined(NVFP4MLA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/decode_plan.h"
#endif

namespace nvfp4mla::cli {
namespace {

struct AttendArgs {
  std::string cache, query, indices, output, device = "cpu", lse = "natural";
  float sm_scale = 0.0f;
};

#if defined(NVFP4MLA_WITH_CUDA)
void attend_cuda(const RecordSpec& spec, const SparseMlaArgs& host, float* out, float* lse) {
  if (cuda_device_count() == 0) throw Error("--device cuda: no CUDA device is visible");
  const int rb = spec.record_bytes();
  DeviceBytes q(host.q, size_t(host.rows) * host.heads * kQkDim * 2), cache(host.cache, size_t(host.capacity) * rb),
      idx(host.indices, size_t(host.rows) * host.topk * 4),
      len(host.topk_length, host.topk_length ? size_t(host.rows) * 4 : 0),
      o(size_t(host.rows) * host.heads * kLatentDim * 2), l(size_t(host.rows) * host.heads * 4);
  SparseMlaArgs a = host;
  a.q = q.as<uint16_t>();
  a.cache = cache.as<uint8_t>();
  a.indices = idx.as<int32_t>();
  a.topk_length = host.topk_length ? len.as<int32_t>() : nullptr;
  const auto plan = plan_sparse_decode(spec, a.rows, a.heads, a.topk, current_device_arch());
  const auto ws_layout = decode_workspace_layout(plan, a.rows, a.heads);
  DeviceBytes ws(ws_layout.total_bytes);
  cuda::sparse_decode(spec, a, plan, ws.as<void>(), ws_layout.total_bytes, o.as<uint16_t>(), l.as<float>(), nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) throw Error(std::string("decode kernel failed: ") + cudaGetErrorString(cudaGetLastError()));
  std::vector<uint16_t> out_bf16(size_t(a.rows) * a.heads * kLatentDim);
  o.download(out_bf16.data());
  l.download(lse);
  for (size_t i = 0; i < out_bf16.size(); ++i) out[i] = codec::bf16_decode(out_bf16[i]);
}
#endif

void run_attend(const FormatFlags& flags, const AttendArgs& args) {
  const FormatConfig cfg = flags.config();
  MetadataMap cache_meta;
  TensorMap cache_file = read_safetensors(args.cache, &cache_meta);
  const RecordRows records = require_records(cache_file, args.cache, cfg, cache_meta);
  const TensorMap query_file = read_safetensors(args.query);
  const Tensor& q = require_tensor(query_file, "q", args.query, {DType::BF16}, {kAnyExtent, kAnyExtent, kQkDim});
  const TensorMap index_file = read_safetensors(args.indices);
  const Tensor& idx = require_tensor(index_file, "indices", args.indices, {DType::I32}, {q.shape[0], kAnyExtent});
  const Tensor* len = nullptr;
  if (index_file.count("topk_length"))
    len = &require_tensor(index_file, "topk_length", args.indices, {DType::I32}, {q.shape[0]});
  if (!std::isfinite(args.sm_scale) || args.sm_scale <= 0.0f) throw Error("--sm-scale must be a finite positive number");
  if (q.shape[1] <= 0) throw Error(args.query + ": q needs at least one head");
  if (idx.shape[1] <= 0) throw Error(args.indices + ": indices need at least one column (topk)");
  // The kernels count rows, heads and topk in int: a larger extent would be cut, not refused.
  auto check_extent = [](int64_t extent, const std::string& what) {
    if (extent > std::numeric_limits<int>::max())
      throw Error(what + " is " + std::to_string(extent) + "; at most " + std::to_string(std::numeric_limits<int>::max()) +
                  " are supported");
  };
  check_extent(q.shape[0], args.query + ": the number of rows of q");
  check_extent(q.shape[1], args.query + ": the number of heads of q");
  check_extent(idx.shape[1], args.indices + ": the number of columns (topk) of indices");

  SparseMlaArgs a;
  a.q = q.as<uint16_t>();
  a.rows = static_cast<int>(q.shape[0]);
  a.heads = static_cast<int>(q.shape[1]);
  a.cache = records.data;
  a.capacity = records.count;
  a.indices = idx.as<int32_t>();
  a.topk = static_cast<int>(idx.shape[1]);
  a.topk_length = len ? len->as<int32_t>() : nullptr;
  a.sm_scale = args.sm_scale;
  a.layer_scale = cfg.layer_scale();
  a.lse_base = args.lse == "base2" ? LseBase::base2 : LseBase::natural;

  std::vector<float> out(size_t(a.rows) * a.heads * kLatentDim), lse(size_t(a.rows) * a.heads);
  const bool use_cuda = args.device == "cuda" || (args.device == "auto" && cuda_device_count() > 0);
  if (use_cuda) {
#if defined(NVFP4MLA_WITH_CUDA)
    attend_cuda(cfg.spec(), a, out.data(), lse.data());
#else
    throw Error("--device cuda: this nvfp4mla was built without CUDA");
#endif
  } else {
    sparse_mla_reference(cfg.spec(), a, out.data(), lse.data());
  }
  write_safetensors(args.output, {{"out", f32_tensor({a.rows, a.heads, kLatentDim}, out)},
                                  {"lse", f32_tensor({a.rows, a.heads}, lse)}},
                    {{"nvfp4mla.device", use_cuda ? "cuda" : "cpu"}, {kMetaDescription, cfg.describe()}});
}

}  // namespace

void add_attend_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("attend", "Sparse MLA attention over a cache of records (CPU reference or GPU kernel)");
  auto flags = FormatFlags::add_to(cmd);
  auto args = std::make_shared<AttendArgs>();
  cmd->add_option("--cache", args->cache, "safetensors with U8 'records' [slots, rb] or [pages, page_size, rb]")->required();
  cmd->add_option("--query", args->query, "safetensors with BF16 'q' [rows, heads, 576]")->required();
  cmd->add_option("--indices", args->indices, "safetensors with I32 'indices' [rows, topk] and optional 'topk_length' [rows]")
      ->required();
  cmd->add_option("--sm-scale", args->sm_scale, "softmax scale (e.g. 1/sqrt(576))")->required();
  cmd->add_option("--output", args->output, "safetensors to write: F32 'out' [rows, heads, 512], F32 'lse' [rows, heads]")
      ->required();
  cmd->add_option("--device", args->device, "cpu (reference), cuda (decode kernel) or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->add_option("--lse", args->lse, "natural or base2")->check(CLI::IsMember({"natural", "base2"}));
  cmd->callback([flags, args] { run_attend(*flags, *args); });
}

}  // namespace nvfp4mla::cli
