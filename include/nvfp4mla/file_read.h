#pragma once
// Whole-file reads with a size bound, for files whose bytes come from outside the program
// (calibration files, block inputs, store manifests). A directory, FIFO, device or socket is
// refused before anything is read, and the size is checked (fstat) before any allocation, so a
// wrong path such as /dev/zero fails at once instead of growing memory without limit.
#include <cstdint>
#include <filesystem>
#include <string>

namespace nvfp4mla {

// The bytes of the regular file `path`, which must hold at most `max_bytes` bytes. Throws Error
// naming `what` and the path: missing or unreadable, not a regular file, or too large.
std::string read_regular_file(const std::filesystem::path& path, uint64_t max_bytes, const std::string& what);

}  // namespace nvfp4mla
