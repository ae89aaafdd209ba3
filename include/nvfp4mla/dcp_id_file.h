#pragma once
// Handing a communicator's bootstrap id (e.g. the 128 bytes of an ncclUniqueId) from rank 0 to
// the other processes of a multi-process DCP run through a file on a shared file system
// (docs/DCP.md, "Multi-GPU runs"). Host only; no CUDA or NCCL needed.
#include <cstddef>
#include <string>
#include <vector>

namespace nvfp4mla {

// Rank 0: writes `bytes` to `path` atomically (a temporary file in the same folder, then a
// rename), so a reader sees either no file or the whole id. Throws Error naming `path` when it
// already exists (a stale id from an earlier run would make the other ranks join the wrong
// communicator) or cannot be written; nothing is left behind on failure.
void write_dcp_id_file(const std::string& path, const void* bytes, size_t size);

// Other ranks: waits until `path` exists (polling) and returns its `size` bytes. Throws Error
// naming `path` when it holds another number of bytes, or when it has not appeared after
// `timeout_seconds`.
std::vector<char> read_dcp_id_file(const std::string& path, size_t size, double timeout_seconds);

}  // namespace nvfp4mla
