#pragma once
// Reading a namespace's manifest.json through the namespace directory's descriptor (private).
#include <filesystem>

#include "nvfp4mla/offload/namespace.h"

namespace nvfp4mla::offload {

// Reads and validates manifest.json in the directory `dir_fd` (shown as `dir`). A symbolic link,
// anything but a regular file, or a file larger than kMaxManifestBytes is an Error naming it.
NamespaceParams read_manifest_at(int dir_fd, const std::filesystem::path& dir);

}  // namespace nvfp4mla::offload
