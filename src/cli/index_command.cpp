// nvfp4mla index encode: DSA indexer keys [N,128] (BF16, F16 or F32) into per-token index key
// records U8 [N,132] (index_key.h: 128 E4M3 bytes, then the fp32 scale, little-endian). The
// output is written atomically; a failed run leaves nothing behind.
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "nvfp4mla/index_key.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/safetensors.h"

namespace nvfp4mla::cli {
namespace {

constexpr const char* kMetaDescription = "nvfp4mla.format";
constexpr const char* kIndexKeyDescription = "index_key: 128 E4M3 values + fp32 power-of-two scale (132 bytes per token)";

template <class In>
void encode_keys(const Tensor& keys, Tensor& records) {
  const In* x = keys.as<In>();
  uint8_t* out = records.as<uint8_t>();
  for (int64_t t = 0; t < keys.shape[0]; ++t)
    index_key::encode_record(x + t * index_key::kDim, out + t * index_key::kRecordBytes);
}

struct EncodeArgs {
  std::string input, output;
};

void add_index_encode(CLI::App& index) {
  auto* cmd = index.add_subcommand(
      "encode", "Quantize index keys [N,128] (BF16, F16 or F32) into records U8 [N,132]: 128 E4M3 bytes, then the fp32 scale");
  auto args = std::make_shared<EncodeArgs>();
  cmd->add_option("--input", args->input, "safetensors file with the tensor 'keys' [N,128] (BF16, F16 or F32)")->required();
  cmd->add_option("--output", args->output, "safetensors file to write with the U8 tensor 'records' [N,132]")->required();
  cmd->callback([args] {
    const TensorMap in = read_safetensors(args->input);
    const Tensor& keys = require_tensor(in, "keys", args->input, {DType::BF16, DType::F16, DType::F32},
                                        {kAnyExtent, index_key::kDim});
    Tensor records = Tensor::zeros(DType::U8, {keys.shape[0], index_key::kRecordBytes});
    switch (keys.dtype) {
      case DType::BF16: encode_keys<Bf16Bits>(keys, records); break;
      case DType::F16: encode_keys<Fp16Bits>(keys, records); break;
      default: encode_keys<float>(keys, records); break;
    }
    write_safetensors(args->output, {{"records", std::move(records)}}, {{kMetaDescription, kIndexKeyDescription}});
    std::printf("encoded %lld index keys into %d-byte records -> %s\n", static_cast<long long>(keys.shape[0]),
                index_key::kRecordBytes, args->output.c_str());
  });
}

}  // namespace

void add_index_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("index", "DSA indexer key cache: index key records");
  cmd->require_subcommand(1);
  add_index_encode(*cmd);
}

}  // namespace nvfp4mla::cli
