#include "nvfp4mla/eval/backend.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/record.h"

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
  // No CUDA sparse-MLA kernel exists in the library yet (issue 3 adds it); until it does,
  // CUDA is reported as unavailable rather than emulated.
  std::string why;
  if (!built_with_cuda())
    why = "this build has no CUDA (configured without nvcc or with -DNVFP4MLA_CUDA=OFF)";
  else
    why = "this build has no CUDA sparse-MLA attention kernel yet (device: " + cuda_device_description(0) + ")";
  if (reason) *reason = why;
  return false;
}

ResolvedDevice resolve_device(Device requested) {
  std::string why;
  switch (requested) {
    case Device::cpu: return {Device::cpu, "cpu (requested)"};
    case Device::cuda:
      if (!cuda_attention_available(&why)) throw Error("--device cuda is not available: " + why + "; use --device cpu or auto");
      return {Device::cuda, "cuda (requested)"};
    case Device::automatic:
      if (cuda_attention_available(&why)) return {Device::cuda, "cuda (auto)"};
      return {Device::cpu, "cpu (auto: " + why + ")"};
  }
  throw Error("invalid device");
}

namespace {

// Scores of every index position. Each referenced record is decoded once per call (rows often
// share records), then fp64 dot products.
void scores_cpu(const RecordSpec& spec, const SparseMlaArgs& a, float* scores) {
  const int rb = spec.record_bytes();
  std::vector<int32_t> row_of_slot(static_cast<size_t>(a.capacity), -1);
  std::vector<float> k;
  int32_t decoded = 0;
  for (int r = 0; r < a.rows; ++r)
    for (int p = 0; p < a.topk; ++p) {
      if (!sparse_entry_valid(a, r, p)) continue;
      const int64_t slot = a.indices[static_cast<int64_t>(r) * a.topk + p];
      if (row_of_slot[static_cast<size_t>(slot)] >= 0) continue;
      row_of_slot[static_cast<size_t>(slot)] = decoded++;
      k.resize(static_cast<size_t>(decoded) * kQkDim);
      float* kp = &k[static_cast<size_t>(decoded - 1) * kQkDim];
      record::decode(spec, a.cache + slot * rb, a.layer_scale, kp, kp + kLatentDim);
    }
  double q[kQkDim];
  for (int r = 0; r < a.rows; ++r) {
    for (int h = 0; h < a.heads; ++h) {
      const uint16_t* qb = a.q + (static_cast<int64_t>(r) * a.heads + h) * kQkDim;
      for (int d = 0; d < kQkDim; ++d) q[d] = codec::bf16_decode(qb[d]);
      float* s = scores + (static_cast<int64_t>(r) * a.heads + h) * a.topk;
      for (int p = 0; p < a.topk; ++p) {
        if (!sparse_entry_valid(a, r, p)) {
          s[p] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const int64_t slot = a.indices[static_cast<int64_t>(r) * a.topk + p];
        const float* kp = &k[static_cast<size_t>(row_of_slot[static_cast<size_t>(slot)]) * kQkDim];
        // Four partial sums: fp64 keeps the result independent of the order to ~1e-15.
        double part[4] = {0.0, 0.0, 0.0, 0.0};
        for (int d = 0; d < kQkDim; d += 4)
          for (int j = 0; j < 4; ++j) part[j] += q[d + j] * kp[d + j];
        const double dot = (part[0] + part[1]) + (part[2] + part[3]);
        s[p] = static_cast<float>(static_cast<double>(a.sm_scale) * dot);
      }
    }
  }
}

}  // namespace

void sparse_attention(Device device, const RecordSpec& spec, const SparseMlaArgs& args, const AttentionOutputs& o) {
  if (device == Device::automatic) device = resolve_device(device).device;
  if (device == Device::cuda) {
    std::string why;
    if (!cuda_attention_available(&why)) throw Error("sparse attention on CUDA is not available: " + why);
  }
  validate_sparse_mla_args(spec, args);
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
  if (o.scores) scores_cpu(spec, args, o.scores);
}

}  // namespace nvfp4mla::eval
