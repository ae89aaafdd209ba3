#pragma once
// The descriptor-relative form of read_regular_file (nvfp4mla/file_read.h), for callers that
// hold a directory descriptor and must not follow a symbolic link in the last path component.
#include <cstdint>
#include <filesystem>
#include <string>

namespace nvfp4mla::io {

enum class FinalLink { follow, refuse };

// Reads `name` relative to the directory descriptor `dir_fd` (AT_FDCWD: the working
// directory); `shown` is the path used in messages. With FinalLink::refuse a symbolic link is an
// Error that names it.
std::string read_regular_file_at(int dir_fd, const char* name, const std::filesystem::path& shown,
                                 uint64_t max_bytes, const std::string& what, FinalLink link);

}  // namespace nvfp4mla::io
