#include "nvfp4mla/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/strict_json.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"

namespace nvfp4mla {
namespace {

using nlohmann::json;

constexpr uint64_t kHeaderLengthBytes = 8;
// Upper bound on the JSON header; the reference implementation uses the same 100 MB limit.
// Anything larger is a corrupt length field, not a header.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";
// Containers nest at most 3 deep: the header object, a tensor description (or the metadata
// object), and a tensor's shape and data_offsets arrays.
constexpr int kMaxHeaderDepth = 3;
// Values quoted from the file in error messages are cut to this many characters.
constexpr size_t kMaxQuotedChars = 64;

struct DTypeName {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeName kDTypes[] = {
    {DType::U8, "U8", 1},   {DType::I32, "I32", 4}, {DType::I64, "I64", 8},
    {DType::F32, "F32", 4}, {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2},
};

std::string supported_dtypes() {
  std::string s;
  for (const auto& d : kDTypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& problem) {
  throw Error(path.string() + ": " + problem);
}

std::string errno_text() { return std::strerror(errno); }

// A string from the file as an error message shows it: cut short when long.
std::string excerpt(const std::string& s) {
  return s.size() <= kMaxQuotedChars ? s : s.substr(0, kMaxQuotedChars) + "... (" + std::to_string(s.size()) + " bytes)";
}

// Refuses a header that nests deeper than a header can, before it is parsed: the parser spends
// memory on every level, and an error message printing a deeply nested value recursed once per
// level (a stack overflow ~100000 levels down). Brackets inside strings do not count.
void check_nesting(const std::string& text, const std::filesystem::path& path) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxHeaderDepth)
        fail(path, "safetensors header nests deeper than a header can (" + std::to_string(kMaxHeaderDepth) +
                       " levels: the header, a tensor's description, its shape and data_offsets)");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

// Product of the extents times the element size, or false for a negative extent or on overflow.
// The nonzero extents must multiply within int64 even when a zero extent empties the tensor:
// otherwise Tensor::numel() overflows on the way to 0 (a fuzzed [3037000500, 3037000500, 0]).
bool byte_count(const std::vector<int64_t>& shape, size_t elem_size, uint64_t& out) {
  int64_t nonzero = 1;
  bool empty = false;
  for (int64_t e : shape) {
    if (e < 0) return false;
    if (e == 0) empty = true;
    else if (__builtin_mul_overflow(nonzero, e, &nonzero)) return false;
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(nonzero), static_cast<uint64_t>(elem_size), &bytes)) return false;
  out = empty ? 0 : bytes;
  return true;
}

std::string shape_to_string(const std::vector<int64_t>& shape, bool wildcard_as_n) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += (wildcard_as_n && shape[i] == kAnyExtent) ? std::string("N") : std::to_string(shape[i]);
  }
  return s + "]";
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

void read_exact(std::FILE* f, const std::filesystem::path& path, uint64_t offset, void* dst, uint64_t size,
                const std::string& what) {
  if (size == 0) return;
  if (fseeko(f, static_cast<off_t>(offset), SEEK_SET) != 0) fail(path, "cannot seek to " + what + ": " + errno_text());
  if (std::fread(dst, 1, size, f) != size)
    fail(path, "cannot read " + what + (std::ferror(f) ? ": " + errno_text() : ": file ended early (truncated?)"));
}

json parse_header(const std::string& text, const std::filesystem::path& path) {
  json header = io::parse_strict_json(text, path.string() + ": safetensors header");
  if (!header.is_object()) fail(path, "safetensors header must be a JSON object");
  return header;
}

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

uint64_t json_unsigned(const json& v, const std::filesystem::path& path, const std::string& what) {
  if (!v.is_number_unsigned()) fail(path, what + " must be a non-negative integer, got " + excerpt(v.dump()));
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& name, const json& desc, const std::filesystem::path& path) {
  const std::string where = "tensor '" + excerpt(name) + "'";
  if (name.empty()) fail(path, "safetensors header has a tensor with an empty name");
  if (!desc.is_object()) fail(path, where + ": description must be a JSON object");
  for (const auto& [key, value] : desc.items()) {
    (void)value;
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail(path, where + ": unexpected field '" + excerpt(key) + "' (expected dtype, shape, data_offsets)");
  }
  if (!desc.contains("dtype") || !desc.contains("shape") || !desc.contains("data_offsets"))
    fail(path, where + ": needs the fields dtype, shape and data_offsets");
  Entry e;
  e.name = name;
  const json& dt = desc["dtype"];
  if (!dt.is_string()) fail(path, where + ": dtype must be a string, got " + excerpt(dt.dump()));
  const auto& dname = dt.get_ref<const std::string&>();
  const auto* known = std::find_if(std::begin(kDTypes), std::end(kDTypes),
                                   [&](const DTypeName& d) { return dname == d.name; });
  if (known == std::end(kDTypes))
    fail(path, where + ": unsupported dtype '" + excerpt(dname) + "' (supported: " + supported_dtypes() + ")");
  e.dtype = known->dtype;
  const json& shape = desc["shape"];
  if (!shape.is_array()) fail(path, where + ": shape must be an array of non-negative integers");
  for (const json& d : shape) {
    const uint64_t extent = json_unsigned(d, path, where + ": shape extent");
    if (extent > static_cast<uint64_t>(INT64_MAX)) fail(path, where + ": shape extent " + excerpt(d.dump()) + " is too large");
    e.shape.push_back(static_cast<int64_t>(extent));
  }
  const json& offs = desc["data_offsets"];
  if (!offs.is_array() || offs.size() != 2) fail(path, where + ": data_offsets must be [begin, end]");
  e.begin = json_unsigned(offs[0], path, where + ": data_offsets begin");
  e.end = json_unsigned(offs[1], path, where + ": data_offsets end");
  if (e.end < e.begin)
    fail(path, where + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                   ") end before they begin");
  uint64_t expected = 0;
  if (!byte_count(e.shape, known->size, expected))
    fail(path, where + ": shape " + excerpt(shape_to_string(e.shape, false)) + " is too large");
  if (expected != e.end - e.begin)
    fail(path, where + ": shape " + excerpt(shape_to_string(e.shape, false)) + " of " + dname + " needs " +
                   std::to_string(expected) + " bytes but data_offsets span " + std::to_string(e.end - e.begin));
  return e;
}

void parse_metadata(const json& meta, const std::filesystem::path& path, MetadataMap* out) {
  if (!meta.is_object()) fail(path, std::string(kMetadataKey) + " must be a JSON object of strings");
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) fail(path, std::string(kMetadataKey) + " entry '" + excerpt(key) + "' must be a string");
    if (out) (*out)[key] = value.get<std::string>();
  }
}

// The spans must tile [0, data_bytes) exactly: sorted by offset, each starts where the
// previous ended and the last ends at the end of the file.
void check_tiling(std::vector<const Entry*> entries, uint64_t data_bytes, const std::filesystem::path& path) {
  for (const Entry* e : entries) {
    if (e->end > data_bytes)
      fail(path, "tensor '" + excerpt(e->name) + "': data_offsets [" + std::to_string(e->begin) + ", " +
                     std::to_string(e->end) + ") reach past the end of the data section (" +
                     std::to_string(data_bytes) + " bytes; file truncated?)");
  }
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : entries) {
    if (e->begin < pos)
      fail(path, "tensors '" + excerpt(prev->name) + "' and '" + excerpt(e->name) + "' overlap (bytes [" + std::to_string(e->begin) +
                     ", " + std::to_string(pos) + ") of the data section)");
    if (e->begin > pos)
      fail(path, "data section has unused bytes [" + std::to_string(pos) + ", " + std::to_string(e->begin) +
                     ") before tensor '" + excerpt(e->name) + "'");
    pos = e->end;
    prev = e;
  }
  if (pos != data_bytes)
    fail(path, "data section has " + std::to_string(data_bytes - pos) + " trailing bytes after the last tensor");
}

}  // namespace

const char* to_string(DType d) {
  for (const auto& k : kDTypes)
    if (k.dtype == d) return k.name;
  return "?";
}

size_t dtype_size(DType d) {
  for (const auto& k : kDTypes)
    if (k.dtype == d) return k.size;
  return 0;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

std::string Tensor::shape_string() const { return shape_to_string(shape, false); }

Tensor Tensor::zeros(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  uint64_t bytes = 0;
  if (!byte_count(shape, dtype_size(dtype), bytes))
    throw Error("tensor shape " + shape_to_string(shape, false) + " is negative or too large");
  t.shape = std::move(shape);
  t.data.assign(bytes, 0);
  return t;
}

TensorMap read_safetensors(const std::filesystem::path& path, MetadataMap* metadata) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, "no such file");
  if (!std::filesystem::is_regular_file(path, ec)) fail(path, "not a regular file");
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot determine file size: " + ec.message());
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) fail(path, "cannot open: " + errno_text());

  if (file_size < kHeaderLengthBytes)
    fail(path, "file is " + std::to_string(file_size) + " bytes, too short for a safetensors header length (8 bytes)");
  uint8_t len_bytes[kHeaderLengthBytes];
  read_exact(f.get(), path, 0, len_bytes, kHeaderLengthBytes, "header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len < 2 || header_len > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(header_len) + " is not plausible (expected 2.." +
                   std::to_string(kMaxHeaderBytes) + "); not a safetensors file?");
  if (header_len > file_size - kHeaderLengthBytes)
    fail(path, "header length " + std::to_string(header_len) + " exceeds the " +
                   std::to_string(file_size - kHeaderLengthBytes) + " bytes after it (file truncated?)");
  std::string header_text(header_len, '\0');
  read_exact(f.get(), path, kHeaderLengthBytes, header_text.data(), header_len, "header");

  check_nesting(header_text, path);
  const json header = parse_header(header_text, path);
  std::vector<Entry> entries;
  for (const auto& [name, desc] : header.items()) {
    if (name == kMetadataKey) {
      parse_metadata(desc, path, metadata);
      continue;
    }
    entries.push_back(parse_entry(name, desc, path));
  }
  const uint64_t data_start = kHeaderLengthBytes + header_len;
  std::vector<const Entry*> views;
  for (const Entry& e : entries) views.push_back(&e);
  check_tiling(views, file_size - data_start, path);

  TensorMap out;
  for (const Entry& e : entries) {
    Tensor t;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.data.resize(e.end - e.begin);
    read_exact(f.get(), path, data_start + e.begin, t.data.data(), t.data.size(), "tensor '" + e.name + "'");
    out.emplace(e.name, std::move(t));
  }
  return out;
}

void write_safetensors(const std::filesystem::path& path, const TensorMap& tensors, const MetadataMap& metadata) {
  json header = json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == kMetadataKey) throw Error("cannot write a tensor named '" + name + "' to " + path.string());
    uint64_t bytes = 0;
    if (!byte_count(t.shape, dtype_size(t.dtype), bytes) || bytes != t.data.size())
      throw Error("cannot write tensor '" + name + "' to " + path.string() + ": shape " + t.shape_string() + " of " +
                  to_string(t.dtype) + " does not match its " + std::to_string(t.data.size()) + " data bytes");
    header[name] = {{"dtype", to_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Pad with spaces so the data starts 8-byte aligned, as other writers do.
  text.append((kHeaderLengthBytes - text.size() % kHeaderLengthBytes) % kHeaderLengthBytes, ' ');
  uint8_t len_bytes[kHeaderLengthBytes];
  for (size_t i = 0; i < kHeaderLengthBytes; ++i) len_bytes[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));

  AtomicFileWriter out(path);
  out.write(len_bytes, sizeof len_bytes);
  out.write(text.data(), text.size());
  for (const auto& [name, t] : tensors) out.write(t.data.data(), t.data.size());
  out.commit();
}

void require_shape(const Tensor& t, const std::string& name, const std::string& origin,
                   const std::vector<int64_t>& shape) {
  bool ok = t.shape.size() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] == kAnyExtent || shape[i] == t.shape[i];
  if (!ok)
    throw Error(origin + ": tensor '" + name + "' has shape " + t.shape_string() + "; expected " +
                shape_to_string(shape, true));
}

const Tensor& find_tensor(const TensorMap& m, const std::string& name, const std::string& origin,
                          std::initializer_list<DType> dtypes) {
  const auto it = m.find(name);
  if (it == m.end()) {
    std::string present;
    for (const auto& [n, t] : m) present += (present.empty() ? "" : ", ") + n;
    throw Error(origin + ": no tensor named '" + name + "' (tensors present: " +
                (present.empty() ? std::string("none") : present) + ")");
  }
  const Tensor& t = it->second;
  if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) {
    std::string accepted;
    for (DType d : dtypes) accepted += (accepted.empty() ? "" : " or ") + std::string(to_string(d));
    throw Error(origin + ": tensor '" + name + "' has dtype " + to_string(t.dtype) + "; expected " + accepted);
  }
  return t;
}

const Tensor& require_tensor(const TensorMap& m, const std::string& name, const std::string& origin,
                             std::initializer_list<DType> dtypes, const std::vector<int64_t>& shape) {
  const Tensor& t = find_tensor(m, name, origin, dtypes);
  require_shape(t, name, origin, shape);
  return t;
}

std::vector<float> to_f32(const Tensor& t, const std::string& name, const std::string& origin) {
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  switch (t.dtype) {
    case DType::F32:
      if (n > 0) std::memcpy(out.data(), t.data.data(), n * sizeof(float));
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) out[i] = codec::fp16_decode(t.as<uint16_t>()[i]);
      break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) out[i] = codec::bf16_decode(t.as<uint16_t>()[i]);
      break;
    default:
      throw Error(origin + ": tensor '" + name + "' has dtype " + to_string(t.dtype) + "; expected F32, F16 or BF16");
  }
  return out;
}

// ---- atomic file writing --------------------------------------------------------------------

AtomicFileWriter::AtomicFileWriter(std::filesystem::path destination) : destination_(std::move(destination)) {
  if (destination_.filename().empty()) throw Error(destination_.string() + ": output path names a folder, not a file");
  std::filesystem::path folder = destination_.parent_path();
  if (folder.empty()) folder = ".";
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".tmp-%ld-%08x", static_cast<long>(::getpid()), static_cast<unsigned>(rd()));
    temporary_ = folder / ("." + destination_.filename().string() + suffix);
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) return;
    if (errno != EEXIST) break;
  }
  throw Error(destination_.string() + ": cannot create a temporary file in " + folder.string() + ": " + errno_text());
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) discard();
}

void AtomicFileWriter::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
}

void AtomicFileWriter::write(const void* bytes, size_t size) {
  if (fd_ < 0) throw Error(destination_.string() + ": write after the file was closed");
  const auto* p = static_cast<const uint8_t*>(bytes);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(destination_.string() + ": write failed: " + errno_text());
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  if (fd_ < 0) throw Error(destination_.string() + ": commit after the file was closed");
  if (::fsync(fd_) != 0) throw Error(destination_.string() + ": fsync failed: " + errno_text());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw Error(destination_.string() + ": close failed: " + errno_text());
  if (::rename(temporary_.c_str(), destination_.c_str()) != 0)
    throw Error(destination_.string() + ": cannot move the finished file into place: " + errno_text());
  committed_ = true;
  // Make the rename itself durable. Best effort: some filesystems refuse fsync on a folder,
  // and the file is already complete in place.
  std::filesystem::path folder = destination_.parent_path();
  if (folder.empty()) folder = ".";
  const int dir_fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_file_atomic(const std::filesystem::path& path, const void* bytes, size_t size) {
  AtomicFileWriter out(path);
  out.write(bytes, size);
  out.commit();
}

}  // namespace nvfp4mla
