#pragma once
// Minimal safetensors reader/writer: tensors travel between the CLI and users in this format.
// Readers validate the header (JSON), dtypes, shapes and offsets against the file size.
// Writers write to a temporary file in the destination folder and rename it into place
// only when complete, so a failed run leaves nothing behind.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace nvfp4mla {

enum class DType { U8, I32, I64, F32, F16, BF16 };
const char* to_string(DType d);
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

// Throws Error naming the file and what is wrong (missing, truncated, malformed header,
// unknown dtype, offsets out of range or overlapping).
TensorMap read_safetensors(const std::filesystem::path& path);
void write_safetensors(const std::filesystem::path& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Look up a tensor and check its dtype and rank; throws Error naming the file and tensor.
const Tensor& require_tensor(const TensorMap& m, const std::string& name, const std::string& origin);

// Write `bytes` to `path` atomically (temporary file + fsync + rename).
void write_file_atomic(const std::filesystem::path& path, const void* bytes, size_t size);

}  // namespace nvfp4mla
