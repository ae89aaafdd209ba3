#pragma once
// A user's own activations as the evaluation's workload (`nvfp4mla eval --dump FILE`): a
// safetensors file with, per layer i = 0..N-1,
//   layers.<i>.kv_c  [tokens, 512]          latent (BF16, F16 or F32)
//   layers.<i>.k_pe  [tokens, 64]           post-RoPE key (BF16, F16 or F32)
//   layers.<i>.q     [rows, heads, 576]     optional queries (BF16, F16 or F32; all layers or none)
// the same layers.<i>.kv_c tensors `nvfp4mla calibrate` reads. Every layer holds the same
// tokens. They are split in two: the first half calibrates the static mode, the second half is
// evaluated (so the static mode is evaluated out of sample). Values are rounded to BF16, the
// cache writer's input type.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "nvfp4mla/eval/workload.h"

namespace nvfp4mla::eval {

struct DumpLayer {
  TokenBlock calibration;           // the first half of the layer's tokens
  TokenBlock evaluation;            // the second half
  std::vector<uint16_t> q;          // [q_rows, q_heads, 576] BF16 bits; empty without queries
  int q_rows = 0, q_heads = 0;
  std::vector<float> channel_rms;   // per latent channel, over the calibration half (> 0)
  double rope_rms = 1.0;            // of the k_pe values over the calibration half (> 0)
  float max_abs = 0.0f;             // max |kv_c| over all the layer's tokens
};

struct DumpWorkload {
  std::filesystem::path path;
  int64_t tokens = 0;               // per layer
  bool has_queries = false;
  std::vector<DumpLayer> layers;

  int num_layers() const { return static_cast<int>(layers.size()); }
  std::string describe() const;     // file, layers, split, where the queries come from
};

// Reads and validates a dump; throws Error naming the file and the tensor for a missing tensor,
// a wrong dtype or shape, token counts that differ, fewer than 2 tokens or non-finite values.
DumpWorkload read_dump(const std::filesystem::path& path);

}  // namespace nvfp4mla::eval
