// encode, decode, inspect and abi: the record format on the command line. Tensors travel in
// safetensors files; every output is written atomically.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "format_flags.h"
#include "records_io.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/paged_cache.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/safetensors.h"

namespace nvfp4mla::cli {
namespace {

constexpr int kDefaultInspectCount = 4;
constexpr int kValuesShownAtEachEnd = 4;

// Input tokens: kv_c [N, 512] and k_pe [N, 64], both BF16, both F16 or both F32.
struct InputTokens {
  const Tensor* kv_c;
  const Tensor* k_pe;
  int64_t count;
};

InputTokens require_input_tokens(const TensorMap& m, const std::string& origin) {
  const auto dtypes = {DType::BF16, DType::F16, DType::F32};
  const Tensor& kv_c = require_tensor(m, "kv_c", origin, dtypes, {kAnyExtent, kLatentDim});
  const Tensor& k_pe = require_tensor(m, "k_pe", origin, dtypes, {kAnyExtent, kRopeDim});
  if (kv_c.shape[0] != k_pe.shape[0])
    throw Error(origin + ": kv_c has " + std::to_string(kv_c.shape[0]) + " rows but k_pe has " +
                std::to_string(k_pe.shape[0]) + "; they must describe the same tokens");
  if (kv_c.dtype != k_pe.dtype)
    throw Error(origin + ": kv_c is " + to_string(kv_c.dtype) + " but k_pe is " + to_string(k_pe.dtype) +
                "; give both in the same dtype");
  return {&kv_c, &k_pe, kv_c.shape[0]};
}

template <class In>
void encode_tokens(const FormatConfig& cfg, const InputTokens& in, uint8_t* records) {
  std::vector<int64_t> slots(static_cast<size_t>(in.count));
  std::iota(slots.begin(), slots.end(), int64_t{0});
  const TokenBatch<In> batch{in.kv_c->as<In>(), in.k_pe->as<In>(), in.count};
  write_paged_cache(cfg, batch, slots, PagedCacheView{records, in.count, 1, cfg.record_bytes()});
}

void decode_records(const FormatConfig& cfg, const RecordRows& rows, float* kv_c, float* k_pe) {
  std::vector<int64_t> slots(static_cast<size_t>(rows.count));
  std::iota(slots.begin(), slots.end(), int64_t{0});
  gather_dequantize(cfg, PagedCacheView{rows.data, rows.count, 1, cfg.record_bytes()}, slots, kv_c, k_pe);
}

// ---- encode / decode ------------------------------------------------------------------------

struct FileArgs {
  std::string input, output;
};

void add_encode(CLI::App& app) {
  auto* cmd = app.add_subcommand("encode", "Encode kv_c [N,512] and k_pe [N,64] into records [N, record_bytes]");
  auto flags = FormatFlags::add_to(cmd);
  auto args = std::make_shared<FileArgs>();
  cmd->add_option("--input", args->input, "safetensors file with kv_c and k_pe (BF16, F16 or F32)")->required();
  cmd->add_option("--output", args->output, "safetensors file to write with the U8 tensor 'records'")->required();
  cmd->callback([flags, args] {
    const FormatConfig cfg = flags->config();
    const TensorMap in = read_safetensors(args->input);
    const InputTokens tokens = require_input_tokens(in, args->input);
    Tensor records = Tensor::zeros(DType::U8, {tokens.count, cfg.record_bytes()});
    switch (tokens.kv_c->dtype) {
      case DType::BF16: encode_tokens<Bf16Bits>(cfg, tokens, records.data.data()); break;
      case DType::F16: encode_tokens<Fp16Bits>(cfg, tokens, records.data.data()); break;
      default: encode_tokens<float>(cfg, tokens, records.data.data()); break;
    }
    MetadataMap meta{{kMetaDescription, cfg.describe()}};
    if (auto id = identity_if_any(cfg)) meta[kMetaIdentity] = *id;
    if (cfg.scale_mode() == ScaleMode::static_calibrated) meta[kMetaOuterScale] = exact_float(cfg.layer_scale());
    write_safetensors(args->output, {{"records", std::move(records)}}, meta);
    std::printf("encoded %lld tokens into %d-byte records (%s) -> %s\n", static_cast<long long>(tokens.count),
                cfg.record_bytes(), cfg.describe().c_str(), args->output.c_str());
  });
}

void add_decode(CLI::App& app) {
  auto* cmd = app.add_subcommand("decode", "Decode records into fp32 kv_c [N,512] and k_pe [N,64]");
  auto flags = FormatFlags::add_to(cmd);
  auto args = std::make_shared<FileArgs>();
  cmd->add_option("--input", args->input,
                  "safetensors file with the U8 tensor 'records' [N, record_bytes] or [pages, page_size, record_bytes]")
      ->required();
  cmd->add_option("--output", args->output, "safetensors file to write with F32 kv_c and k_pe")->required();
  cmd->callback([flags, args] {
    const FormatConfig cfg = flags->config();
    MetadataMap meta;
    TensorMap in = read_safetensors(args->input, &meta);
    const RecordRows rows = require_records(in, args->input, cfg, meta);
    std::vector<float> kv_c(static_cast<size_t>(rows.count) * kLatentDim), k_pe(static_cast<size_t>(rows.count) * kRopeDim);
    decode_records(cfg, rows, kv_c.data(), k_pe.data());
    write_safetensors(args->output, {{"kv_c", f32_tensor({rows.count, kLatentDim}, kv_c)},
                                     {"k_pe", f32_tensor({rows.count, kRopeDim}, k_pe)}});
    std::printf("decoded %lld records (%s) -> %s\n", static_cast<long long>(rows.count), cfg.describe().c_str(),
                args->output.c_str());
  });
}

// ---- inspect ------------------------------------------------------------------------------

// "0,5,9", "2-8" (inclusive) or a mix such as "0,10-12".
std::vector<int64_t> parse_record_selection(const std::string& text, int64_t count) {
  std::vector<int64_t> out;
  auto parse_index = [&](const std::string& s) -> int64_t {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
      throw Error("--records: '" + text + "' is not a list of record indices such as 0,5,9 or 2-8");
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || v >= count)  // out of range: beyond int64
      throw Error("--records: record " + s + " does not exist (the file holds " + std::to_string(count) + " records)");
    return v;
  };
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      out.push_back(parse_index(item));
    } else {
      const int64_t first = parse_index(item.substr(0, dash)), last = parse_index(item.substr(dash + 1));
      if (last < first) throw Error("--records: range '" + item + "' ends before it starts");
      for (int64_t i = first; i <= last; ++i) out.push_back(i);
    }
    start = comma + 1;
  }
  return out;
}

std::string abbreviated(const float* v, int n) {
  std::string s = "[";
  char buf[32];
  for (int i = 0; i < n; ++i) {
    if (n > 2 * kValuesShownAtEachEnd && i == kValuesShownAtEachEnd) {
      s += " ...,";
      i = n - kValuesShownAtEachEnd;
    }
    std::snprintf(buf, sizeof buf, "%s%.6g", i ? " " : "", v[i]);
    s += buf;
    if (i + 1 < n) s += ",";
  }
  return s + "]";
}

struct ErrorStats {
  double max_abs = 0.0, err_sq = 0.0, ref_sq = 0.0;
  void add(const float* got, const float* want, int n) {
    for (int i = 0; i < n; ++i) {
      const double e = double(got[i]) - double(want[i]);
      max_abs = std::max(max_abs, std::abs(e));
      err_sq += e * e;
      ref_sq += double(want[i]) * double(want[i]);
    }
  }
  double relative() const { return ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : (err_sq > 0 ? INFINITY : 0.0); }
  std::string text() const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "max abs error %.6g, relative L2 error %.6g", max_abs, relative());
    return buf;
  }
};

void print_nvfp4_scales(const FormatConfig& cfg, const uint8_t* rec) {
  namespace L = layout::nvfp4;
  const float s = record::nvfp4_outer_scale(cfg.spec(), rec, cfg.layer_scale());
  const char* origin = cfg.scale_mode() == ScaleMode::dynamic            ? "per token, stored in the record"
                       : cfg.scale_mode() == ScaleMode::static_calibrated ? "per layer, from the configuration"
                                                                          : "implicit unit scale";
  std::printf("  outer scale: %.9g (%s)\n", s, origin);
  int subnormal = 0, zero = 0;
  std::printf("  group scales (E4M3 byte = value):");
  for (int g = 0; g < L::kNumGroups; ++g) {
    const uint8_t b = rec[L::kGroupScaleOffset + g];
    if ((b & 0x7F) == 0) ++zero;
    else if (((b >> 3) & 0xF) == 0) ++subnormal;
    std::printf("%s g%-2d 0x%02x=%-10.6g", g % 4 == 0 ? "\n   " : "", g, b, codec::e4m3_decode(b));
  }
  std::printf("\n  group scales in E4M3 subnormals: %d, zero: %d (of %d)\n", subnormal, zero, L::kNumGroups);
  if (cfg.spec().rope_is_fp8())
    std::printf("  RoPE scale: %.9g (E4M3 RoPE values)\n", record::load_f32(rec + L::kRopeScaleOffset));
  else
    std::printf("  RoPE: raw BF16\n");
}

void print_record(const FormatConfig& cfg, const uint8_t* rec, int64_t index, const float* kv_c, const float* k_pe) {
  std::printf("record %lld\n", static_cast<long long>(index));
  if (cfg.cache_dtype() == CacheDtype::nvfp4_ds_mla) {
    print_nvfp4_scales(cfg, rec);
  } else if (cfg.cache_dtype() == CacheDtype::fp8_ds_mla) {
    namespace L = layout::fp8;
    std::printf("  tile scales (fp32, one per %d dims):", L::kTileDim);
    for (int t = 0; t < L::kNumTiles; ++t) std::printf(" %.9g", record::load_f32(rec + L::kTileScaleOffset + 4 * t));
    std::printf("\n  RoPE: raw BF16\n");
  }
  std::printf("  kv_c: %s\n  k_pe: %s\n", abbreviated(kv_c, kLatentDim).c_str(), abbreviated(k_pe, kRopeDim).c_str());
}

struct InspectArgs {
  std::string input, original, records;
};

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Show chosen records: scales, dequantized values, error vs an original");
  auto flags = FormatFlags::add_to(cmd);
  auto args = std::make_shared<InspectArgs>();
  cmd->add_option("--input", args->input, "safetensors file with the U8 tensor 'records'")->required();
  cmd->add_option("--records", args->records, "Which records: e.g. 0,5,9 or 2-8 (default: the first 4)");
  cmd->add_option("--original", args->original, "safetensors file with the kv_c and k_pe the records were encoded from");
  cmd->callback([flags, args] {
    const FormatConfig cfg = flags->config();
    MetadataMap meta;
    TensorMap in = read_safetensors(args->input, &meta);
    const RecordRows rows = require_records(in, args->input, cfg, meta);
    std::vector<int64_t> chosen;
    if (args->records.empty()) {
      for (int64_t i = 0; i < std::min<int64_t>(kDefaultInspectCount, rows.count); ++i) chosen.push_back(i);
    } else {
      chosen = parse_record_selection(args->records, rows.count);
    }
    std::vector<float> orig_kv, orig_pe;
    if (!args->original.empty()) {
      const TensorMap orig = read_safetensors(args->original);
      const InputTokens tokens = require_input_tokens(orig, args->original);
      if (tokens.count != rows.count)
        throw Error(args->original + ": holds " + std::to_string(tokens.count) + " tokens but " + args->input +
                    " holds " + std::to_string(rows.count) + " records");
      orig_kv = to_f32(*tokens.kv_c, "kv_c", args->original);
      orig_pe = to_f32(*tokens.k_pe, "k_pe", args->original);
      // Compare against what the writer quantizes: NaN -> 0, +/-Inf -> +/-FLT_MAX.
      for (float& x : orig_kv) x = record::sanitize(x);
      for (float& x : orig_pe) x = record::sanitize(x);
    }
    std::printf("%s: %lld records of %d bytes, read as %s\n", args->input.c_str(), static_cast<long long>(rows.count),
                cfg.record_bytes(), cfg.describe().c_str());
    if (auto it = meta.find(kMetaDescription); it != meta.end()) std::printf("written as: %s\n", it->second.c_str());
    std::vector<float> kv_c(kLatentDim), k_pe(kRopeDim);
    ErrorStats total_kv, total_pe;
    for (int64_t idx : chosen) {
      const uint8_t* rec = rows.data + idx * cfg.record_bytes();
      record::decode(cfg.spec(), rec, cfg.layer_scale(), kv_c.data(), k_pe.data());
      print_record(cfg, rec, idx, kv_c.data(), k_pe.data());
      if (orig_kv.empty()) continue;
      ErrorStats kv, pe;
      kv.add(kv_c.data(), orig_kv.data() + idx * kLatentDim, kLatentDim);
      pe.add(k_pe.data(), orig_pe.data() + idx * kRopeDim, kRopeDim);
      total_kv.add(kv_c.data(), orig_kv.data() + idx * kLatentDim, kLatentDim);
      total_pe.add(k_pe.data(), orig_pe.data() + idx * kRopeDim, kRopeDim);
      std::printf("  vs original: kv_c %s\n               k_pe %s\n", kv.text().c_str(), pe.text().c_str());
    }
    if (!orig_kv.empty() && chosen.size() > 1)
      std::printf("all %zu shown records vs original: kv_c %s; k_pe %s\n", chosen.size(), total_kv.text().c_str(),
                  total_pe.text().c_str());
  });
}

// ---- abi ----------------------------------------------------------------------------------

void add_abi(CLI::App& app) {
  auto* cmd = app.add_subcommand("abi", "Print the record identity (record ABI) of a format configuration");
  auto flags = FormatFlags::add_to(cmd);
  auto compat = std::make_shared<std::string>("native");
  cmd->add_option("--compat", *compat,
                  "native (default): nvfp4mla's identity; vllm: the vLLM offload namespace token")
      ->check(CLI::IsMember({"native", "vllm"}));
  cmd->callback([flags, compat] {
    const FormatConfig cfg = flags->config();
    std::printf("%s\n", cfg.identity(*compat == "vllm" ? IdentityCompat::vllm : IdentityCompat::native).c_str());
  });
}

}  // namespace

void add_format_commands(CLI::App& app) {
  add_encode(app);
  add_decode(app);
  add_inspect(app);
  add_abi(app);
}

}  // namespace nvfp4mla::cli
