// Reading a user's activation dump as an evaluation workload (eval/dump.h).
#include "nvfp4mla/eval/dump.h"

#include <algorithm>
#include <cmath>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/index_key.h"
#include "nvfp4mla/layer_tensors.h"
#include "nvfp4mla/safetensors.h"

namespace nvfp4mla::eval {

namespace {

// The tensor's values as fp32; every value must be finite.
std::vector<float> finite_values(const Tensor& t, const std::string& name, const std::string& origin) {
  std::vector<float> f = to_f32(t, name, origin);
  const int64_t row = t.shape.empty() ? 1 : t.numel() / std::max<int64_t>(1, t.shape[0]);
  for (size_t i = 0; i < f.size(); ++i)
    if (!std::isfinite(f[i]))
      throw Error(origin + ": tensor '" + name + "' holds a non-finite value at row " + std::to_string(static_cast<int64_t>(i) / row) +
                  "; the evaluation needs finite activations");
  return f;
}

// The tensor's values as BF16 bits (exact for BF16, round to nearest even otherwise); every value
// must be finite.
std::vector<uint16_t> bf16_values(const Tensor& t, const std::string& name, const std::string& origin) {
  const std::vector<float> f = finite_values(t, name, origin);
  std::vector<uint16_t> out(f.size());
  const int64_t row = t.shape.empty() ? 1 : t.numel() / std::max<int64_t>(1, t.shape[0]);
  for (size_t i = 0; i < f.size(); ++i) {
    out[i] = bf16_bits_finite(f[i]);
    if (!std::isfinite(codec::bf16_decode(out[i])))
      throw Error(origin + ": tensor '" + name + "' holds a value beyond the BF16 range at row " +
                  std::to_string(static_cast<int64_t>(i) / row));
  }
  return out;
}

// Tokens [first, first + count) of a layer's latent and RoPE key.
TokenBlock token_range(const std::vector<uint16_t>& kv_c, const std::vector<uint16_t>& k_pe, int64_t first, int64_t count) {
  TokenBlock b;
  b.count = count;
  b.kv_c.assign(kv_c.begin() + first * kLatentDim, kv_c.begin() + (first + count) * kLatentDim);
  b.k_pe.assign(k_pe.begin() + first * kRopeDim, k_pe.begin() + (first + count) * kRopeDim);
  return b;
}

// Per-channel RMS of the latent and RMS of the RoPE key; zero channels get the smallest
// non-zero channel's value (the synthesized queries divide by them), an all-zero key 1.
void measure_shape(DumpLayer& l) {
  const TokenBlock& b = l.calibration;
  std::vector<double> sum2(kLatentDim, 0.0);
  for (int64_t t = 0; t < b.count; ++t)
    for (int c = 0; c < kLatentDim; ++c) {
      const double x = codec::bf16_decode(b.kv_c_row(t)[c]);
      sum2[static_cast<size_t>(c)] += x * x;
    }
  double smallest = 0.0;
  for (double s : sum2)
    if (s > 0.0 && (smallest == 0.0 || s < smallest)) smallest = s;
  if (smallest == 0.0) smallest = 1.0;
  l.channel_rms.resize(kLatentDim);
  for (int c = 0; c < kLatentDim; ++c)
    l.channel_rms[static_cast<size_t>(c)] =
        static_cast<float>(std::sqrt((sum2[static_cast<size_t>(c)] > 0.0 ? sum2[static_cast<size_t>(c)] : smallest) /
                                     static_cast<double>(b.count)));
  double r2 = 0.0;
  for (uint16_t v : b.k_pe) r2 += static_cast<double>(codec::bf16_decode(v)) * codec::bf16_decode(v);
  l.rope_rms = r2 > 0.0 ? std::sqrt(r2 / static_cast<double>(b.k_pe.size())) : 1.0;
}

// The layer's indexer keys, queries and weights (all three required once any is in the dump).
void read_index_tensors(const TensorMap& m, int l, int64_t tokens, const std::string& origin, DumpLayer& layer) {
  const std::string k_name = layer_tensor_name(l, "index_k"), q_name = layer_tensor_name(l, "index_q"),
                    w_name = layer_tensor_name(l, "index_w");
  for (const std::string& name : {k_name, q_name, w_name})
    if (!m.count(name))
      throw Error(origin + ": tensor '" + name + "' is missing; the dump has DSA indexer tensors, and every layer needs all "
                  "three: layers.<i>.index_k [tokens, 128], layers.<i>.index_q [rows, heads, 128], layers.<i>.index_w "
                  "[rows, heads]");
  const std::initializer_list<DType> types = {DType::BF16, DType::F16, DType::F32};
  const Tensor& k = require_tensor(m, k_name, origin, types, {tokens, index_key::kDim});
  const Tensor& q = require_tensor(m, q_name, origin, types, {kAnyExtent, kAnyExtent, index_key::kDim});
  if (q.shape[0] < 1 || q.shape[1] < 1 || q.shape[1] > 64)
    throw Error(origin + ": tensor '" + q_name + "' has shape " + q.shape_string() +
                "; it needs at least one row and 1..64 heads");
  const Tensor& w = require_tensor(m, w_name, origin, types, {q.shape[0], q.shape[1]});
  layer.index_k = bf16_values(k, k_name, origin);
  layer.index_q = finite_values(q, q_name, origin);
  layer.index_w = finite_values(w, w_name, origin);
  layer.index_rows = static_cast<int>(q.shape[0]);
  layer.index_heads = static_cast<int>(q.shape[1]);
}

}  // namespace

std::string DumpWorkload::describe() const {
  const int64_t calibration = layers.empty() ? 0 : layers.front().calibration.count;
  std::string s = "dump " + path.string() + ": " + std::to_string(layers.size()) + " layers x " + std::to_string(tokens) +
                  " tokens (static mode calibrated on tokens 0.." + std::to_string(calibration - 1) +
                  ", evaluated on tokens " + std::to_string(calibration) + ".." + std::to_string(tokens - 1) + ", out of sample); ";
  if (has_queries)
    s += "queries from the dump (layers.<i>.q, " + std::to_string(layers.front().q_heads) + " heads)";
  else
    s += "no layers.<i>.q in the dump: queries synthesized, correlated with a few context tokens as in the default workload";
  return s;
}

DumpWorkload read_dump(const std::filesystem::path& path) {
  const std::string origin = path.string();
  const TensorMap m = read_safetensors(path);
  const std::vector<std::string> latents = layer_tensor_names(m, "kv_c", origin);
  DumpWorkload d;
  d.path = path;
  const bool any_q = std::any_of(m.begin(), m.end(), [](const auto& e) {
    return e.first.rfind("layers.", 0) == 0 && e.first.size() > 2 && e.first.compare(e.first.size() - 2, 2, ".q") == 0;
  });
  d.has_index = std::any_of(m.begin(), m.end(), [](const auto& e) {
    return e.first.rfind("layers.", 0) == 0 && e.first.find(".index_") != std::string::npos;
  });
  if (any_q) {
    const std::vector<std::string> queries = layer_tensor_names(m, "q", origin);
    if (queries.size() != latents.size())
      throw Error(origin + ": " + std::to_string(queries.size()) + " layers have queries (layers.<i>.q) but " +
                  std::to_string(latents.size()) + " have latents; give queries for every layer or for none");
    d.has_queries = true;
  }
  for (int l = 0; l < static_cast<int>(latents.size()); ++l) {
    const std::string kv_name = layer_tensor_name(l, "kv_c"), pe_name = layer_tensor_name(l, "k_pe");
    const Tensor& kv = require_tensor(m, kv_name, origin, {DType::BF16, DType::F16, DType::F32}, {kAnyExtent, kLatentDim});
    if (!m.count(pe_name))
      throw Error(origin + ": tensor '" + pe_name + "' is missing; every layers.<i>.kv_c needs its layers.<i>.k_pe [tokens, " +
                  std::to_string(kRopeDim) + "]");
    const Tensor& pe = require_tensor(m, pe_name, origin, {DType::BF16, DType::F16, DType::F32}, {kv.shape[0], kRopeDim});
    if (l == 0) d.tokens = kv.shape[0];
    if (kv.shape[0] != d.tokens)
      throw Error(origin + ": tensor '" + kv_name + "' has " + std::to_string(kv.shape[0]) + " tokens but layers.0.kv_c has " +
                  std::to_string(d.tokens) + "; every layer of a dump must hold the same tokens");
    if (d.tokens < 2)
      throw Error(origin + ": tensor '" + kv_name + "' has " + std::to_string(d.tokens) +
                  " token(s); the evaluation needs at least 2 (one part calibrates the static mode, the other is evaluated)");
    const std::vector<uint16_t> kv_bits = bf16_values(kv, kv_name, origin), pe_bits = bf16_values(pe, pe_name, origin);
    DumpLayer layer;
    const int64_t calibration = d.tokens / 2;
    layer.calibration = token_range(kv_bits, pe_bits, 0, calibration);
    layer.evaluation = token_range(kv_bits, pe_bits, calibration, d.tokens - calibration);
    layer.max_abs = std::max(layer.calibration.max_abs_kv_c(), layer.evaluation.max_abs_kv_c());
    measure_shape(layer);
    if (d.has_queries) {
      const std::string q_name = layer_tensor_name(l, "q");
      const Tensor& q = require_tensor(m, q_name, origin, {DType::BF16, DType::F16, DType::F32}, {kAnyExtent, kAnyExtent, kQkDim});
      if (q.shape[0] < 1 || q.shape[1] < 1)
        throw Error(origin + ": tensor '" + q_name + "' has shape " + q.shape_string() + "; it needs at least one row and one head");
      if (l > 0 && q.shape[1] != d.layers.front().q_heads)
        throw Error(origin + ": tensor '" + q_name + "' has " + std::to_string(q.shape[1]) + " heads but layers.0.q has " +
                    std::to_string(d.layers.front().q_heads));
      // The evaluation takes the same number of query rows from every layer.
      if (l > 0 && q.shape[0] != d.layers.front().q_rows)
        throw Error(origin + ": tensor '" + q_name + "' has " + std::to_string(q.shape[0]) + " query rows but layers.0.q has " +
                    std::to_string(d.layers.front().q_rows) + "; every layer of a dump must hold the same query rows");
      layer.q = bf16_values(q, q_name, origin);
      layer.q_rows = static_cast<int>(q.shape[0]);
      layer.q_heads = static_cast<int>(q.shape[1]);
    }
    if (d.has_index) read_index_tensors(m, l, d.tokens, origin, layer);
    d.layers.push_back(std::move(layer));
  }
  return d;
}

}  // namespace nvfp4mla::eval
