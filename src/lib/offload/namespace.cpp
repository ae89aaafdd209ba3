#include "nvfp4mla/offload/namespace.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <system_error>

#include "io/file_read_at.h"
#include "io/strict_json.h"
#include "nvfp4mla/calibration.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/offload/block_file.h"
#include "manifest_file.h"
#include "posix_io.h"

namespace nvfp4mla::offload {

namespace {

constexpr const char* kVllmSentinel = "vllm-default-v1";
constexpr int kMaxTokensPerBlock = 1 << 20;
constexpr int kMaxLayersInBlock = 4096;
constexpr uint64_t kMaxBlockBytes = uint64_t(1) << 32;
constexpr size_t kMaxModelIdentityChars = 4096;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (;;) {
    const size_t end = s.find(sep, begin);
    out.push_back(s.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return out;
    begin = end + 1;
  }
}

// The record widths a dtype can have, with the identity's width field for each.
struct WidthField {
  std::string field;
  int record_bytes;
};
std::vector<WidthField> width_fields(CacheDtype dtype) {
  if (dtype != CacheDtype::nvfp4_ds_mla) {
    const RecordSpec spec{dtype, RopeEncoding::bf16, ScaleMode::implicit};
    return {{std::to_string(spec.record_bytes()), spec.record_bytes()}};
  }
  std::vector<WidthField> out;
  for (RopeEncoding rope : {RopeEncoding::fp8, RopeEncoding::bf16}) {
    const RecordSpec spec{dtype, rope, ScaleMode::implicit};
    out.push_back({std::string(to_string(rope)) + "-rope-" + std::to_string(spec.record_bytes()), spec.record_bytes()});
  }
  return out;
}

void append_field(std::string& out, const std::string& name, const std::string& value) {
  auto append_u64 = [&out](uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  };
  append_u64(name.size());
  out += name;
  append_u64(value.size());
  out += value;
}

std::vector<std::pair<std::string, std::string>> params_fields(const NamespaceParams& p) {
  return {
      {"record_identity", p.record_identity},
      {"record_bytes", std::to_string(p.record_bytes)},
      {"tokens_per_block", std::to_string(p.tokens_per_block)},
      {"layers_in_block", std::to_string(p.layers_in_block)},
      {"model_identity", p.model_identity},
      {"tp_rank", std::to_string(p.parallel.tp_rank)},
      {"tp_size", std::to_string(p.parallel.tp_size)},
      {"dcp_rank", std::to_string(p.parallel.dcp_rank)},
      {"dcp_size", std::to_string(p.parallel.dcp_size)},
  };
}

// The native identities of every configuration without a calibration, as FormatConfig
// writes them (the environment is not consulted).
const std::vector<std::string>& uncalibrated_identities() {
  static const std::vector<std::string> ids = [] {
    std::vector<std::string> out;
    for (CacheDtype d : {CacheDtype::bf16, CacheDtype::fp8_ds_mla})
      out.push_back(FormatConfig::create({.cache_dtype = d}, EnvironmentSettings{}).identity());
    for (RopeEncoding rope : {RopeEncoding::fp8, RopeEncoding::bf16})
      for (ScaleMode mode : {ScaleMode::implicit, ScaleMode::dynamic}) {
        try {
          out.push_back(FormatConfig::create({.cache_dtype = CacheDtype::nvfp4_ds_mla, .rope = rope, .scale_mode = mode},
                                             EnvironmentSettings{})
                            .identity());
        } catch (const Error&) {
          // A combination the format does not allow (dynamic scales need the fp8 RoPE record).
        }
      }
    return out;
  }();
  return ids;
}

constexpr const char* kStaticSemantics = "static-calibrated-v1";
constexpr size_t kSha256HexDigits = 64;

bool is_lowercase_hex(const std::string& s) {
  return s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

int record_bytes_of_identity(const std::string& identity) {
  if (identity == kVllmSentinel)
    throw Error("'vllm-default-v1' is vLLM's offload compatibility sentinel, shared by several record formats; "
                "a persistent store needs the native record identity (`nvfp4mla abi` without --compat)");
  const std::vector<std::string> fields = split(identity, ':');
  std::optional<CacheDtype> dtype;
  for (CacheDtype d : {CacheDtype::bf16, CacheDtype::fp8_ds_mla, CacheDtype::nvfp4_ds_mla})
    if (fields[0] == to_string(d)) dtype = d;
  if (!dtype)
    throw Error("'" + identity + "' is not a record identity: it must start with bf16:, fp8_ds_mla: or nvfp4_ds_mla: "
                "(print one with `nvfp4mla abi`)");
  if (fields.size() < 3)
    throw Error("'" + identity + "' is a dtype name, not a full record identity: the identity also names the record "
                "width and scale semantics (print it with `nvfp4mla abi`)");
  for (const auto& f : fields)
    if (f.empty()) throw Error("record identity '" + identity + "' has an empty field");
  std::optional<int> record_bytes;
  for (const WidthField& w : width_fields(*dtype))
    if (fields[1] == w.field) record_bytes = w.record_bytes;
  if (!record_bytes)
    throw Error("record identity '" + identity + "' names an unknown record width '" + fields[1] + "' for " +
                to_string(*dtype));
  // The rest must be exactly what FormatConfig writes: a near miss ("dynamic-tokn-v1", an extra
  // field) would otherwise name a namespace of its own that no reader ever opens.
  const std::string head = fields[0] + ":" + fields[1] + ":";
  for (const std::string& known : uncalibrated_identities())
    if (identity == known) return *record_bytes;
  const bool can_be_static = *dtype == CacheDtype::nvfp4_ds_mla;
  if (can_be_static && fields[2] == kStaticSemantics) {
    if (fields.size() != 4 || fields[3].size() != kSha256HexDigits || !is_lowercase_hex(fields[3]))
      throw Error("record identity '" + identity + "': a static identity ends in the calibration file's SHA-256, " +
                  std::to_string(kSha256HexDigits) + " lowercase hex digits (print it with `nvfp4mla abi --scales-file F`)");
    return *record_bytes;
  }
  std::string accepted;
  for (const std::string& known : uncalibrated_identities())
    if (known.starts_with(head)) accepted += (accepted.empty() ? "" : ", ") + known;
  if (can_be_static) accepted += ", " + head + kStaticSemantics + ":<SHA-256 of the calibration file>";
  throw Error("'" + identity + "' is not a record identity of this build; for " + fields[0] + ":" + fields[1] +
              " it is one of: " + accepted + " (print it with `nvfp4mla abi`)");
}

NamespaceParams NamespaceParams::for_format(const FormatConfig& format, int tokens_per_block, int layers_in_block,
                                            std::string model_identity, ParallelLayout parallel) {
  NamespaceParams p;
  p.record_identity = format.identity(IdentityCompat::native);
  p.record_bytes = format.record_bytes();
  p.tokens_per_block = tokens_per_block;
  p.layers_in_block = layers_in_block;
  p.model_identity = std::move(model_identity);
  p.parallel = parallel;
  p.validate();
  return p;
}

void NamespaceParams::validate() const {
  const int identity_bytes = record_bytes_of_identity(record_identity);
  if (record_bytes != identity_bytes)
    throw Error("record_bytes " + std::to_string(record_bytes) + " disagrees with the record identity '" +
                record_identity + "' (" + std::to_string(identity_bytes) + " bytes)");
  if (tokens_per_block < 1 || tokens_per_block > kMaxTokensPerBlock)
    throw Error("tokens per block (page size) must be in 1.." + std::to_string(kMaxTokensPerBlock) + ", got " +
                std::to_string(tokens_per_block));
  if (layers_in_block < 1 || layers_in_block > kMaxLayersInBlock)
    throw Error("layers in block must be in 1.." + std::to_string(kMaxLayersInBlock) + ", got " +
                std::to_string(layers_in_block));
  if (block_bytes() > kMaxBlockBytes)
    throw Error("a block of " + std::to_string(block_bytes()) + " bytes is too large (at most 4 GiB): "
                "put fewer layers or tokens in a block");
  if (model_identity.empty()) throw Error("the model identity must not be empty (e.g. model name and revision)");
  if (model_identity.size() > kMaxModelIdentityChars)
    throw Error("the model identity is longer than " + std::to_string(kMaxModelIdentityChars) + " characters");
  // The identity goes into manifest.json, and JSON text is UTF-8: reject what the manifest
  // writer would (a store opened on it would fail mid-way, after creating its lock file).
  try {
    (void)nlohmann::json(model_identity).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::type_error&) {
    throw Error("the model identity is not valid UTF-8");
  }
  auto check_rank = [](const char* what, int rank, int size) {
    if (size < 1) throw Error(std::string(what) + " size must be at least 1, got " + std::to_string(size));
    if (rank < 0 || rank >= size)
      throw Error(std::string(what) + " rank " + std::to_string(rank) + " is outside 0.." + std::to_string(size - 1));
  };
  check_rank("TP", parallel.tp_rank, parallel.tp_size);
  check_rank("DCP", parallel.dcp_rank, parallel.dcp_size);
}

uint64_t NamespaceParams::block_bytes() const {
  return uint64_t(std::max(record_bytes, 0)) * uint64_t(std::max(tokens_per_block, 0)) *
         uint64_t(std::max(layers_in_block, 0));
}

NamespaceDigest namespace_digest(const NamespaceParams& params) {
  // Length-prefixed name/value pairs behind a versioned tag: no two different parameter sets
  // encode to the same bytes.
  std::string encoded = kManifestFormat;
  encoded.push_back('\0');
  for (const auto& [name, value] : params_fields(params)) append_field(encoded, name, value);
  const std::string hex = sha256_hex(encoded.data(), encoded.size());
  NamespaceDigest digest{};
  for (size_t i = 0; i < digest.size(); ++i) digest[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  return digest;
}

std::string to_hex(const NamespaceDigest& digest) { return key_to_hex(ByteSpan(digest.data(), digest.size())); }

std::string manifest_json(const NamespaceParams& params) {
  nlohmann::ordered_json j;
  j["format"] = kManifestFormat;
  j["namespace_digest"] = to_hex(namespace_digest(params));
  j["record_identity"] = params.record_identity;
  j["record_bytes"] = params.record_bytes;
  j["tokens_per_block"] = params.tokens_per_block;
  j["layers_in_block"] = params.layers_in_block;
  j["block_payload_bytes"] = params.block_bytes();
  j["model_identity"] = params.model_identity;
  j["tp_rank"] = params.parallel.tp_rank;
  j["tp_size"] = params.parallel.tp_size;
  j["dcp_rank"] = params.parallel.dcp_rank;
  j["dcp_size"] = params.parallel.dcp_size;
  j["block_file_version"] = kBlockFileVersion;
  return j.dump(2) + "\n";
}

NamespaceParams parse_manifest(const std::string& json_text, const std::string& origin) {
  const nlohmann::json j = io::parse_strict_json(json_text, "manifest " + origin);
  if (!j.is_object()) throw Error("manifest " + origin + " is not a JSON object");
  auto field = [&](const char* name) -> const nlohmann::json& {
    if (!j.contains(name)) throw Error("manifest " + origin + " has no \"" + name + "\"");
    return j.at(name);
  };
  auto text = [&](const char* name) {
    const auto& v = field(name);
    if (!v.is_string()) throw Error("manifest " + origin + ": \"" + name + "\" must be a string");
    return v.get<std::string>();
  };
  auto integer = [&](const char* name) {
    const auto& v = field(name);
    if (!v.is_number_integer()) throw Error("manifest " + origin + ": \"" + name + "\" must be an integer");
    const auto x = v.get<int64_t>();
    if (x < INT32_MIN || x > INT32_MAX) throw Error("manifest " + origin + ": \"" + name + "\" is out of range");
    return static_cast<int>(x);
  };
  if (text("format") != kManifestFormat)
    throw Error("manifest " + origin + " has format \"" + text("format") + "\", expected \"" + kManifestFormat + "\"");
  if (integer("block_file_version") != static_cast<int>(kBlockFileVersion))
    throw Error("manifest " + origin + " is for block file version " + std::to_string(integer("block_file_version")) +
                "; this build reads version " + std::to_string(kBlockFileVersion));
  NamespaceParams p;
  p.record_identity = text("record_identity");
  p.record_bytes = integer("record_bytes");
  p.tokens_per_block = integer("tokens_per_block");
  p.layers_in_block = integer("layers_in_block");
  p.model_identity = text("model_identity");
  p.parallel.tp_rank = integer("tp_rank");
  p.parallel.tp_size = integer("tp_size");
  p.parallel.dcp_rank = integer("dcp_rank");
  p.parallel.dcp_size = integer("dcp_size");
  try {
    p.validate();
  } catch (const Error& e) {
    throw Error("manifest " + origin + " is invalid: " + e.what());
  }
  if (text("namespace_digest") != to_hex(namespace_digest(p)))
    throw Error("manifest " + origin + ": its namespace_digest does not match its fields (edited by hand or damaged)");
  return p;
}

void check_manifest_matches(const NamespaceParams& wanted, const NamespaceParams& found, const std::string& origin) {
  const auto a = params_fields(wanted);
  const auto b = params_fields(found);
  std::string diff;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].second != b[i].second)
      diff += "\n  " + a[i].first + ": wanted '" + a[i].second + "', directory has '" + b[i].second + "'";
  if (!diff.empty())
    throw Error("the namespace directory " + origin + " belongs to a different namespace; refusing to reuse it:" + diff);
}

std::filesystem::path namespace_dir(const std::filesystem::path& root, const NamespaceParams& params) {
  return root / to_hex(namespace_digest(params));
}

NamespaceParams read_manifest_at(int dir_fd, const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / kManifestFileName;
  return parse_manifest(io::read_regular_file_at(dir_fd, kManifestFileName, path, kMaxManifestBytes, "manifest",
                                                 io::FinalLink::refuse),
                        "'" + path.string() + "'");
}

std::vector<NamespaceListing> list_namespaces(const std::filesystem::path& root) {
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) throw Error("store root '" + root.string() + "' is not a directory");
  // The root is the caller's path and may be a link; nothing below it is followed.
  const posix::UniqueFd root_fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root_fd) throw Error(posix::describe_os_error("cannot open store root", root, errno));
  std::vector<NamespaceListing> out;
  for (const std::string& name : posix::list_dir(root_fd.get(), root)) {
    struct stat st {};
    if (::fstatat(root_fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // removed meanwhile
    NamespaceListing l;
    l.dir = root / name;
    if (S_ISLNK(st.st_mode)) {
      // A link named like a namespace is reported (ls, verify), not opened.
      if (name.size() != 2 * sizeof(NamespaceDigest) || !is_lowercase_hex(name)) continue;
      l.problem = "'" + l.dir.string() + "' is a symbolic link; the store never follows links it did not create";
      out.push_back(std::move(l));
      continue;
    }
    if (!S_ISDIR(st.st_mode)) continue;
    const posix::UniqueFd dir_fd(::openat(root_fd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    struct stat manifest {};
    if (!dir_fd || ::fstatat(dir_fd.get(), kManifestFileName, &manifest, AT_SYMLINK_NOFOLLOW) != 0) continue;
    try {
      l.params = read_manifest_at(dir_fd.get(), l.dir);
      if (name != to_hex(namespace_digest(l.params)))
        throw Error("directory name is not the namespace digest of its manifest");
      l.valid = true;
    } catch (const Error& e) {
      l.problem = e.what();
    }
    out.push_back(std::move(l));
  }
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.dir < y.dir; });
  return out;
}

}  // namespace nvfp4mla::offload
