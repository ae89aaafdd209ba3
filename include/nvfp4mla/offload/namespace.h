#pragma once
// The namespace of a persistent KV offload store: everything that gives a stored block's bytes
// their meaning. Blocks written under one namespace can never be read under another: the
// namespace digest names the directory, is written into every block file's header, and is
// re-checked on every read (docs/OFFLOAD.md).
#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "nvfp4mla/config.h"

namespace nvfp4mla::offload {

// Tensor/decode-context parallel position of the process whose cache shard a block holds.
struct ParallelLayout {
  int tp_rank = 0;
  int tp_size = 1;
  int dcp_rank = 0;
  int dcp_size = 1;
  bool operator==(const ParallelLayout&) const = default;
};

struct NamespaceParams {
  // The full native record identity (FormatConfig::identity()), e.g.
  // "nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1". Never a dtype name or vLLM's sentinel.
  std::string record_identity;
  int record_bytes = 0;      // bytes per token record; must agree with the identity
  int tokens_per_block = 0;  // page size
  int layers_in_block = 0;   // a block holds [layers_in_block][tokens_per_block][record_bytes]
  std::string model_identity;  // e.g. model name + revision; any non-empty string
  ParallelLayout parallel;

  // From a validated format configuration (its native identity and record width).
  static NamespaceParams for_format(const FormatConfig& format, int tokens_per_block, int layers_in_block,
                                    std::string model_identity, ParallelLayout parallel = {});
  // Throws Error naming the first invalid field and what to change.
  void validate() const;
  uint64_t block_bytes() const;  // payload bytes of one block
  bool operator==(const NamespaceParams&) const = default;
};

// SHA-256 over a length-prefixed, versioned encoding of every NamespaceParams field.
using NamespaceDigest = std::array<uint8_t, 32>;
NamespaceDigest namespace_digest(const NamespaceParams& params);
std::string to_hex(const NamespaceDigest& digest);

// Record width named by a native record identity; throws Error for anything that is not
// exactly an identity FormatConfig writes (a bare dtype name, vLLM's "vllm-default-v1"
// sentinel, an unknown dtype, width or scale semantics, an extra field, a static identity whose
// calibration hash is not 64 lowercase hex digits).
int record_bytes_of_identity(const std::string& identity);

// Human-readable JSON manifest kept in each namespace directory.
inline constexpr const char* kManifestFormat = "nvfp4mla-offload-namespace-v1";
inline constexpr const char* kManifestFileName = "manifest.json";
// A manifest is a few hundred bytes (the model identity is at most 4096 characters); a larger
// file is refused unread.
inline constexpr uint64_t kMaxManifestBytes = 64 * 1024;
std::string manifest_json(const NamespaceParams& params);
// Parses and validates a manifest (including that its stored digest matches its fields).
// `origin` names the source in error messages.
NamespaceParams parse_manifest(const std::string& json_text, const std::string& origin);
// Throws Error listing every field in which `found` (a directory's manifest) differs from
// `wanted`; does nothing when they agree.
void check_manifest_matches(const NamespaceParams& wanted, const NamespaceParams& found, const std::string& origin);

// <root>/<digest hex>: the directory of a namespace.
std::filesystem::path namespace_dir(const std::filesystem::path& root, const NamespaceParams& params);

// Every namespace directory under a root, with its manifest (or why it could not be read).
// Nothing below the root is followed: a symbolic link named like a namespace is listed as
// invalid, and a manifest that is a link, not a regular file or too large is a problem.
struct NamespaceListing {
  std::filesystem::path dir;
  bool valid = false;
  NamespaceParams params;  // when valid
  std::string problem;     // when not valid
};
std::vector<NamespaceListing> list_namespaces(const std::filesystem::path& root);

}  // namespace nvfp4mla::offload
