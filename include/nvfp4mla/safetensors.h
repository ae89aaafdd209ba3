#pragma once
// Minimal safetensors reader/writer: tensors travel between the CLI and users in this format.
//
// File layout: 8-byte little-endian header length H, H bytes of JSON header, then the data.
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// relative to the start of the data) plus an optional "__metadata__" object of strings.
//
// The reader is strict: a sane header length, valid JSON without duplicate keys, known dtypes,
// shape product * dtype size == byte span, and spans that tile the data exactly (no overlap,
// no gap, nothing past the end, no trailing bytes). Writers write to a temporary file in the
// destination folder and rename it into place only when complete, so a failed run leaves
// nothing behind.
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

namespace nvfp4mla {

enum class DType { U8, I32, I64, F32, F16, BF16 };
const char* to_string(DType d);  // the safetensors name: "U8", "BF16", ...
size_t dtype_size(DType d);

struct Tensor {
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // little-endian, row-major

  int64_t numel() const;
  std::string shape_string() const;  // "[4, 512]"
  template <class T> const T* as() const { return reinterpret_cast<const T*>(data.data()); }
  template <class T> T* as() { return reinterpret_cast<T*>(data.data()); }
  static Tensor zeros(DType dtype, std::vector<int64_t> shape);
};

using TensorMap = std::map<std::string, Tensor>;
using MetadataMap = std::map<std::string, std::string>;

// Throws Error naming the file and what is wrong (missing, truncated, malformed header,
// unknown dtype, size mismatch, offsets out of range or overlapping). When `metadata` is
// given it receives the "__metadata__" entries.
TensorMap read_safetensors(const std::filesystem::path& path, MetadataMap* metadata = nullptr);
// Validates every tensor (data size == numel * dtype size) before anything is written.
void write_safetensors(const std::filesystem::path& path, const TensorMap& tensors,
                       const MetadataMap& metadata = {});

// Shape extent that matches any size in require_tensor / require_shape.
inline constexpr int64_t kAnyExtent = -1;

// Look up a tensor and check that its dtype is one of `dtypes`. Throws Error naming `origin`
// (usually the file), the tensor and what was expected.
const Tensor& find_tensor(const TensorMap& m, const std::string& name, const std::string& origin,
                          std::initializer_list<DType> dtypes);
// find_tensor, then check that the shape matches `shape` (kAnyExtent matches any extent).
const Tensor& require_tensor(const TensorMap& m, const std::string& name, const std::string& origin,
                             std::initializer_list<DType> dtypes, const std::vector<int64_t>& shape);
void require_shape(const Tensor& t, const std::string& name, const std::string& origin,
                   const std::vector<int64_t>& shape);

// The values of an F32, F16 or BF16 tensor as fp32 (exact conversions); throws Error naming
// `origin` and the tensor for any other dtype.
std::vector<float> to_f32(const Tensor& t, const std::string& name, const std::string& origin);

// Writes a file atomically: the bytes go to a temporary file next to the destination, which
// is fsynced and renamed into place by commit(). Destroying the writer without commit()
// (an exception on the way) removes the temporary file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path destination);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* bytes, size_t size);
  void commit();

 private:
  void discard() noexcept;
  std::filesystem::path destination_;
  std::filesystem::path temporary_;
  int fd_ = -1;
  bool committed_ = false;
};

// Write `bytes` to `path` atomically (temporary file + fsync + rename).
void write_file_atomic(const std::filesystem::path& path, const void* bytes, size_t size);

}  // namespace nvfp4mla
