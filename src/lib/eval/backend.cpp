#include "nvfp4mla/eval/backend.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/record.h"

#if defined(NVFP4MLA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/cuda/sparse_scores.h"
#include "nvfp4mla/decode_plan.h"
#endif
#include "device_bytes.h"

namespace nvfp4mla::eval {

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu;
  if (s == "cuda") return Device::cuda;
  if (s == "auto") return Device::automatic;
  throw Error("unknown device '" + s + "': use cpu, cuda or auto");
}

const char* to_string(Device d) {
  switch (d) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
    case Device::automatic: return "auto";
  }
  return "?";
}

bool cuda_attention_available(std::string* reason) {
  // Decided once per process: the build and the visible devices do not change.
  static const std::pair<bool, std::string> answer = []() -> std::pair<bool, std::string> {
    if (!built_with_cuda()) return {false, "this build has no CUDA (configured without nvcc or with -DNVFP4MLA_CUDA=OFF)"};
    if (cuda_device_count() == 0) return {false, "this build has CUDA but no CUDA device is visible"};
    return {true, cuda_device_description(0)};
  }();
  if (reason) *reason = answer.second;
  return answer.first;
}

ResolvedDevice resolve_device(Device requested) {
  std::string why;
  switch (requested) {
    case Device::cpu: return {Device::cpu, "cpu (requested)"};
    case Device::cuda:
      if (!cuda_attention_available(&why)) throw Error("--device cuda is not available: " + why + "; use --device cpu or auto");
      return {Device::cuda, "cuda (requested: " + why + ")"};
    case Device::automatic:
      if (cuda_attention_available(&why)) return {Device::cuda, "cuda (auto: " + why + ")"};
      return {Device::cpu, "cpu (auto: " + why + ")"};
  }
  throw Error("invalid device");
}

namespace {

#if defined(NVFP4MLA_WITH_CUDA)
using detail::cuda_ok;
using detail::DeviceBytes;

// out and lse from the split-KV sparse decode, scores from the scores kernel; both read the
// same device copy of the records. Each host thread uses its own stream.
void attention_cuda(const RecordSpec& spec, const SparseMlaArgs& host, const AttentionOutputs& o) {
  if (host.rows == 0) return;
  const cudaStream_t stream = cudaStreamPerThread;
  const size_t pairs = static_cast<size_t>(host.rows) * host.heads;
  const DeviceBytes q(host.q, pairs * kQkDim * sizeof(uint16_t), stream);
  const DeviceBytes cache(host.cache, static_cast<size_t>(host.capacity) * spec.record_bytes(), stream);
  const DeviceBytes indices(host.indices, static_cast<size_t>(host.rows) * host.topk * sizeof(int32_t), stream);
  const DeviceBytes lengths(host.topk_length, static_cast<size_t>(host.rows) * sizeof(int32_t), stream);
  SparseMlaArgs a = host;
  a.q = q.as<uint16_t>();
  a.cache = cache.as<uint8_t>();
  a.indices = indices.as<int32_t>();
  a.topk_length = host.topk_length ? lengths.as<int32_t>() : nullptr;
  a.lse_base = LseBase::natural;

  const bool attend = o.out || o.lse;
  const DeviceBytes out(attend ? pairs * kLatentDim * sizeof(uint16_t) : 0), lse(attend ? pairs * sizeof(float) : 0);
  const DeviceBytes scores(o.scores ? pairs * static_cast<size_t>(a.topk) * sizeof(float) : 0);
  std::vector<uint16_t> out_bf16(o.out ? pairs * kLatentDim : 0);
  std::vector<float> lse_host(attend ? pairs : 0);
  if (attend) {
    const DecodePlan plan = plan_sparse_decode(spec, a.rows, a.heads, a.topk, current_device_arch());
    const DecodeWorkspaceLayout layout = decode_workspace_layout(plan, a.rows, a.heads);
    const DeviceBytes workspace(layout.total_bytes);
    cuda::sparse_decode(spec, a, plan, workspace.as<void>(), layout.total_bytes, out.as<uint16_t>(), lse.as<float>(), stream);
    lse.download(lse_host.data(), stream);
    if (o.out) out.download(out_bf16.data(), stream);
    cuda_ok(cudaStreamSynchronize(stream), "sparse decode");  // before the workspace is freed
  }
  if (o.scores) {
    cuda::sparse_scores(spec, a, scores.as<float>(), stream);
    scores.download(o.scores, stream);
  }
  cuda_ok(cudaStreamSynchronize(stream), "sparse scores");
  for (size_t i = 0; i < out_bf16.size(); ++i) o.out[i] = codec::bf16_decode(out_bf16[i]);
  if (o.lse) std::copy(lse_host.begin(), lse_host.end(), o.lse);
}
#endif

}  // namespace

void sparse_attention(Device device, const RecordSpec& spec, const SparseMlaArgs& args, const AttentionOutputs& outputs) {
  if (device == Device::automatic) device = resolve_device(device).device;
  validate_sparse_mla_args(spec, args);
  if (device == Device::cuda) {
    std::string why;
    if (!cuda_attention_available(&why)) throw Error("sparse attention on CUDA is not available: " + why);
#if defined(NVFP4MLA_WITH_CUDA)
    attention_cuda(spec, args, outputs);
#endif
    return;
  }
  const AttentionOutputs& o = outputs;
  if (o.out || o.lse) {
    std::vector<float> out_tmp, lse_tmp;
    float* out = o.out;
    float* lse = o.lse;
    if (!out) {
      out_tmp.resize(static_cast<size_t>(args.rows) * args.heads * kLatentDim);
      out = out_tmp.data();
    }
    if (!lse) {
      lse_tmp.resize(static_cast<size_t>(args.rows) * args.heads);
      lse = lse_tmp.data();
    }
    SparseMlaArgs natural = args;
    natural.lse_base = LseBase::natural;
    sparse_mla_reference(spec, natural, out, lse);
  }
  if (o.scores) sparse_mla_scores_reference(spec, args, o.scores);
}

}  // namespace nvfp4mla::eval
