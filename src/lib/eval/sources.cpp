// Where the magnitude sweep and the needle grid take their tokens from: the synthetic generator
// or a user's dump (stages.h). The stages themselves do not know which.
#include <algorithm>
#include <cmath>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/eval/random.h"
#include "stages.h"

namespace nvfp4mla::eval::detail {

namespace {

// `count` (at most `available`) evenly spaced indices first, first + step, ... of a range.
std::vector<int64_t> spread(int64_t first, int64_t available, int64_t count) {
  count = std::min(count, available);
  std::vector<int64_t> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[static_cast<size_t>(i)] = first + i * available / count;
  return v;
}

std::string range_text(const std::vector<int64_t>& v) {
  return std::to_string(v.front()) + ".." + std::to_string(v.back());
}

}  // namespace

void LayerModel::make_token(const double* z, double magnitude, const double* rope_base, int64_t position, uint16_t* kv_c,
                            uint16_t* k_pe) const {
  const double a = value_scale * magnitude;
  for (int c = 0; c < kLatentDim; ++c)
    kv_c[c] = bf16_bits_finite(static_cast<float>(a * (*channel_scale)[static_cast<size_t>(c)] * z[c]));
  double rotated[kRopeDim];
  rope(rope_base, position, rotated);
  for (int i = 0; i < kRopeDim; ++i) k_pe[i] = bf16_bits_finite(static_cast<float>(rope_scale * rotated[i]));
}

LayerModel synthetic_layer_model(const SyntheticWorkload& w, int layer) {
  LayerModel m;
  m.seed = w.seed();
  m.channel_scale = &w.channel_scale(layer);
  m.value_scale = w.value_scale(layer);
  m.rope_scale = w.rope_scale(layer);
  m.rope = [&w](const double* in, int64_t position, double* out) { w.apply_rope(in, position, out); };
  return m;
}

LayerModel dump_layer_model(const DumpLayer& d, uint64_t seed) {
  LayerModel m;
  m.seed = seed;
  m.channel_scale = &d.channel_rms;  // includes the layer's magnitude: value_scale stays 1
  m.rope_scale = d.rope_rms;
  m.rope = [](const double* in, int64_t, double* out) { std::copy(in, in + kRopeDim, out); };
  return m;
}

TokenBlock pick_tokens(const TokenBlock& b, const std::vector<int64_t>& rows, double scale) {
  TokenBlock out;
  out.count = static_cast<int64_t>(rows.size());
  out.kv_c.reserve(rows.size() * kLatentDim);
  out.k_pe.reserve(rows.size() * kRopeDim);
  for (int64_t r : rows) {
    const uint16_t* kv = b.kv_c_row(r);
    for (int c = 0; c < kLatentDim; ++c)
      out.kv_c.push_back(scale == 1.0 ? kv[c] : bf16_bits_finite(static_cast<float>(scale * codec::bf16_decode(kv[c]))));
    out.k_pe.insert(out.k_pe.end(), b.k_pe_row(r), b.k_pe_row(r) + kRopeDim);
  }
  return out;
}

TokenBlock first_tokens(const TokenBlock& b, int64_t count) {
  TokenBlock out;
  out.count = std::min(count, b.count);
  out.kv_c.assign(b.kv_c.begin(), b.kv_c.begin() + out.count * kLatentDim);
  out.k_pe.assign(b.k_pe.begin(), b.k_pe.begin() + out.count * kRopeDim);
  return out;
}

SweepSource synthetic_sweep_source(const SyntheticWorkload& w, int layer, int64_t count) {
  SweepSource s;
  s.layer = layer;
  s.count = count;
  s.tokens = [&w, layer, count](Sample sample, double scale) { return w.tokens(layer, sample, 0, 0, count, scale); };
  s.description = "the same " + std::to_string(count) + " tokens (layer " + std::to_string(layer) + "'s shape)";
  return s;
}

SweepSource dump_sweep_source(const DumpWorkload& dump, int layer, int64_t count) {
  const DumpLayer& d = dump.layers.at(static_cast<size_t>(layer));
  SweepSource s;
  s.layer = layer;
  s.calibration_indices = spread(0, d.calibration.count, count);
  s.token_indices = spread(d.calibration.count, d.evaluation.count, count);
  s.count = static_cast<int64_t>(s.token_indices.size());
  std::vector<int64_t> evaluated = s.token_indices, calibration = s.calibration_indices;
  for (int64_t& i : evaluated) i -= d.calibration.count;
  s.tokens = [&d, evaluated, calibration](Sample sample, double scale) {
    return sample == Sample::sweep_calibration ? pick_tokens(d.calibration, calibration, scale)
                                               : pick_tokens(d.evaluation, evaluated, scale);
  };
  s.description = std::to_string(s.count) + " tokens of dump layer " + std::to_string(layer) + " (evenly spaced in its tokens " +
                  range_text(s.token_indices) + "; static calibrated on " + std::to_string(s.calibration_indices.size()) +
                  " of its tokens " + range_text(s.calibration_indices) + " scaled alike)";
  return s;
}

NeedleSource synthetic_needle_source(const SyntheticWorkload& w, int layer) {
  NeedleSource s;
  s.model = synthetic_layer_model(w, layer);
  s.context = [&w, layer](int64_t length) {
    return w.tokens(layer, Sample::needle, static_cast<uint64_t>(length), 0, length);
  };
  return s;
}

NeedleSource dump_needle_source(const DumpWorkload& dump, int layer, uint64_t seed) {
  const DumpLayer& d = dump.layers.at(static_cast<size_t>(layer));
  NeedleSource s;
  s.model = dump_layer_model(d, seed);
  s.context = [&d, layer, seed](int64_t length) {
    const TokenBlock& pool = d.evaluation;
    if (length <= pool.count) return first_tokens(pool, length);
    Rng rng(stream_key(seed, static_cast<uint64_t>(Sample::needle_context), static_cast<uint64_t>(layer),
                       static_cast<uint64_t>(length)));
    std::vector<int64_t> rows(static_cast<size_t>(length));
    for (int64_t& r : rows) r = static_cast<int64_t>(rng.below(static_cast<uint64_t>(pool.count)));
    return pick_tokens(pool, rows);
  };
  return s;
}

}  // namespace nvfp4mla::eval::detail
