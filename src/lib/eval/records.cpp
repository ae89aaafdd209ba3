// Helpers shared by the stages: calibration files, record encoding, queries, exact logits.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/safetensors.h"
#include "stages.h"

namespace nvfp4mla::eval::detail {

CalibrationFile::CalibrationFile(const Calibration& c, const std::filesystem::path& keep) : temporary_(keep.empty()) {
  if (temporary_) {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("nvfp4mla-eval-calibration-" + std::to_string(rd()) + std::to_string(rd()) + ".json");
  } else {
    path_ = keep;
  }
  // Atomically: a failed write reports its errno and leaves neither the file nor a temporary.
  const std::string text = c.to_json();
  write_file_atomic(path_, text.data(), text.size());
}

CalibrationFile::~CalibrationFile() {
  if (!temporary_) return;
  std::error_code ec;
  std::filesystem::remove(path_, ec);
}

std::vector<uint8_t> encode_tokens(const FormatConfig& config, float layer_scale, const TokenBlock& tokens,
                                   const std::vector<int64_t>& which) {
  const RecordSpec& spec = config.spec();
  const size_t rb = static_cast<size_t>(spec.record_bytes());
  const int64_t n = which.empty() ? tokens.count : static_cast<int64_t>(which.size());
  std::vector<uint8_t> cache(static_cast<size_t>(n) * rb);
  Bf16Bits kv[kLatentDim], pe[kRopeDim];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = which.empty() ? i : which[static_cast<size_t>(i)];
    const uint16_t* kb = tokens.kv_c_row(t);
    const uint16_t* pb = tokens.k_pe_row(t);
    for (int d = 0; d < kLatentDim; ++d) kv[d] = Bf16Bits{kb[d]};
    for (int d = 0; d < kRopeDim; ++d) pe[d] = Bf16Bits{pb[d]};
    record::encode(spec, kv, pe, layer_scale, cache.data() + static_cast<size_t>(i) * rb);
  }
  return cache;
}

LatentMeasure measure_latent(const FormatConfig& config, float layer_scale, const TokenBlock& tokens, int64_t count) {
  const RecordSpec& spec = config.spec();
  if (count < 0 || count > tokens.count) count = tokens.count;
  std::vector<uint8_t> rec(static_cast<size_t>(spec.record_bytes()));
  Bf16Bits kv[kLatentDim], pe[kRopeDim];
  float original[kLatentDim], latent[kLatentDim], rope[kRopeDim];
  LatentMeasure m;
  for (int64_t t = 0; t < count; ++t) {
    const uint16_t* kb = tokens.kv_c_row(t);
    const uint16_t* pb = tokens.k_pe_row(t);
    for (int d = 0; d < kLatentDim; ++d) {
      kv[d] = Bf16Bits{kb[d]};
      original[d] = codec::bf16_decode(kb[d]);
    }
    for (int d = 0; d < kRopeDim; ++d) pe[d] = Bf16Bits{pb[d]};
    record::encode(spec, kv, pe, layer_scale, rec.data());
    record::decode(spec, rec.data(), layer_scale, latent, rope);
    m.error.add_token(original, latent, kLatentDim);
    if (spec.is_nvfp4()) count_group_scales(rec.data(), original, record::nvfp4_outer_scale(spec, rec.data(), layer_scale), m.scales);
  }
  return m;
}

void add_matched_query(const uint16_t* kv_c, const std::vector<float>& c, double weight, double* q_nope) {
  double norm2 = 0.0;
  for (int d = 0; d < kLatentDim; ++d) {
    const double w = codec::bf16_decode(kv_c[d]) / c[static_cast<size_t>(d)];
    norm2 += w * w;
  }
  if (norm2 == 0.0) return;
  for (int d = 0; d < kLatentDim; ++d) {
    const double cd = c[static_cast<size_t>(d)];
    q_nope[d] += weight * codec::bf16_decode(kv_c[d]) / (cd * cd) / norm2;
  }
}

void exact_logits(const TokenBlock& tokens, const double* q, std::vector<float>& logits) {
  logits.resize(static_cast<size_t>(tokens.count));
  float qf[kQkDim];
  for (int d = 0; d < kQkDim; ++d) qf[d] = static_cast<float>(q[d]);
  for (int64_t t = 0; t < tokens.count; ++t) {
    const uint16_t* kb = tokens.kv_c_row(t);
    const uint16_t* pb = tokens.k_pe_row(t);
    // Independent partial sums keep the loop from serializing on one accumulator.
    float acc[8] = {};
    for (int d = 0; d < kLatentDim; d += 8)
      for (int j = 0; j < 8; ++j) acc[j] += qf[d + j] * codec::bf16_decode(kb[d + j]);
    for (int d = 0; d < kRopeDim; d += 8)
      for (int j = 0; j < 8; ++j) acc[j] += qf[kLatentDim + d + j] * codec::bf16_decode(pb[d + j]);
    float sum = 0.0f;
    for (float a : acc) sum += a;
    logits[static_cast<size_t>(t)] = kSmScale * sum;
  }
}

std::vector<int64_t> top_k_positions(const std::vector<float>& values, int64_t k) {
  std::vector<int64_t> idx(values.size());
  std::iota(idx.begin(), idx.end(), int64_t{0});
  k = std::min<int64_t>(k, static_cast<int64_t>(idx.size()));
  auto before = [&](int64_t a, int64_t b) {
    const float va = values[static_cast<size_t>(a)], vb = values[static_cast<size_t>(b)];
    return va != vb ? va > vb : a < b;
  };
  std::nth_element(idx.begin(), idx.begin() + k, idx.end(), before);
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace nvfp4mla::eval::detail
