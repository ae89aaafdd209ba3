#pragma once
// A user's own activations as the evaluation's workload (`nvfp4mla eval --dump FILE`): a
// safetensors file with, per layer i = 0..N-1,
//   layers.<i>.kv_c  [tokens, 512]          latent (BF16, F16 or F32)
//   layers.<i>.k_pe  [tokens, 64]           post-RoPE key (BF16, F16 or F32)
//   layers.<i>.q     [rows, heads, 576]     optional queries (BF16, F16 or F32; all layers or none)
//   layers.<i>.index_k [tokens, 128]        optional DSA indexer keys (BF16, F16 or F32), with
//   layers.<i>.index_q [rows, heads, 128]   the indexer's queries (heads 1..64) and
//   layers.<i>.index_w [rows, heads]        its per-head weights (the three together, all layers or none)
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
  // DSA indexer tensors (empty without them): keys of all the layer's tokens, queries, weights.
  std::vector<uint16_t> index_k;    // [tokens, 128] BF16 bits
  std::vector<float> index_q;       // [index_rows, index_heads, 128]
  std::vector<float> index_w;       // [index_rows, index_heads]
  int index_rows = 0, index_heads = 0;
};

struct DumpWorkload {
  std::filesystem::path path;
  int64_t tokens = 0;               // per layer
  bool has_queries = false;
  bool has_index = false;           // layers.<i>.index_k, index_q, index_w
  std::vector<DumpLayer> layers;

  int num_layers() const { return static_cast<int>(layers.size()); }
  std::string describe() const;     // file, layers, split, where the queries come from
};

// Reads and validates a dump; throws Error naming the file and the tensor for a missing tensor,
// a wrong dtype or shape, token counts that differ, fewer than 2 tokens or non-finite values.
// Index tensors: when any layers.<i>.index_* tensor is present, every layer needs all three, and
// the error names the first missing one.
DumpWorkload read_dump(const std::filesystem::path& path);

}  // namespace nvfp4mla::eval
