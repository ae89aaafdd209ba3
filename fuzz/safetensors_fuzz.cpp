// Fuzzes read_safetensors (every CLI input file goes through it), and on an accepted file the
// readers above it: the record decoder on a "records" tensor, the layers.<i>.<kind> name parser
// and the activation dump reader (`eval --dump`, `calibrate`). Properties: an accepted file's
// tensors hold exactly shape x dtype bytes, convert to fp32 where they are floating point, and
// survive write_safetensors -> read_safetensors unchanged, metadata included; an accepted dump
// has the same token count in every layer, split into calibration and evaluation halves.
#include <algorithm>
#include <vector>

#include "fuzz_support.h"
#include "nvfp4mla/eval/dump.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/layer_tensors.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/safetensors.h"

using namespace nvfp4mla;

namespace {

constexpr int64_t kMaxRecordsDecoded = 16;

void check_tensor(const std::string& name, const Tensor& t) {
  unsigned __int128 bytes = dtype_size(t.dtype);
  for (int64_t e : t.shape) {
    fuzz::require(e >= 0, "negative extent accepted in '" + name + "'");
    bytes *= static_cast<unsigned __int128>(e);
    if (bytes == 0) break;
  }
  fuzz::require(bytes == t.data.size(), "tensor '" + name + "' data size differs from shape x dtype");
  fuzz::require(t.numel() >= 0, "numel of '" + name + "' is negative");
  if (t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16) {
    const std::vector<float> v = to_f32(t, name, "fuzz");
    fuzz::require(v.size() == static_cast<size_t>(t.numel()), "to_f32 of '" + name + "' has the wrong length");
  }
}

// The record formats a width can mean, as the decode command would read them.
std::vector<RecordSpec> specs_of_width(int64_t width) {
  std::vector<RecordSpec> out;
  for (RecordSpec base : {kSpecNvfp4Fp8Rope, kSpecNvfp4Bf16Rope, kSpecFp8, kSpecBf16}) {
    if (base.record_bytes() != width) continue;
    if (base.is_nvfp4()) {
      for (ScaleMode m : {ScaleMode::implicit, ScaleMode::static_calibrated, ScaleMode::dynamic}) {
        if (m == ScaleMode::dynamic && !base.rope_is_fp8()) continue;
        out.push_back({base.dtype, base.rope, m});
      }
    } else {
      out.push_back(base);
    }
  }
  return out;
}

void decode_records(const Tensor& t) {
  if (t.dtype != DType::U8 || t.shape.size() < 2 || t.shape.size() > 3) return;
  const int64_t width = t.shape.back();
  for (const RecordSpec& spec : specs_of_width(width)) {
    const int64_t count = std::min<int64_t>(t.numel() / width, kMaxRecordsDecoded);
    float kv_c[kLatentDim], k_pe[kRopeDim];
    for (int64_t r = 0; r < count; ++r) record::decode(spec, t.data.data() + r * width, 0.5f, kv_c, k_pe);
  }
}

void read_as_dump(const TensorMap& tensors, const std::filesystem::path& path) {
  for (const char* kind : {"kv_c", "k_pe", "q"}) (void)fuzz::accepts([&] { (void)layer_tensor_names(tensors, kind, "fuzz"); });
  eval::DumpWorkload dump;
  if (!fuzz::accepts([&] { dump = eval::read_dump(path); })) return;
  fuzz::require(dump.num_layers() > 0 && dump.tokens >= 2, "accepted a dump without layers or tokens");
  for (const eval::DumpLayer& l : dump.layers) {
    fuzz::require(l.calibration.count + l.evaluation.count == dump.tokens, "a layer's halves do not add up");
    fuzz::require(l.channel_rms.size() == static_cast<size_t>(kLatentDim), "channel RMS of the wrong size");
    fuzz::require(dump.has_queries == !l.q.empty(), "queries in some layers only");
  }
  (void)dump.describe();
}

bool same(const TensorMap& a, const TensorMap& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second.dtype != t.dtype || it->second.shape != t.shape || it->second.data != t.data)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile file;
  file.assign(data, size);
  TensorMap tensors;
  MetadataMap metadata;
  if (!fuzz::accepts([&] { tensors = read_safetensors(file.path(), &metadata); })) return 0;

  for (const auto& [name, t] : tensors) check_tensor(name, t);
  if (const auto it = tensors.find("records"); it != tensors.end()) decode_records(it->second);
  read_as_dump(tensors, file.path());

  const auto copy = fuzz::scratch_dir() / "round-trip.safetensors";
  write_safetensors(copy, tensors, metadata);
  MetadataMap metadata_back;
  const TensorMap back = read_safetensors(copy, &metadata_back);
  fuzz::require(same(tensors, back), "tensors changed in a write/read round trip");
  fuzz::require(metadata == metadata_back, "metadata changed in a write/read round trip");
  return 0;
}
