#pragma once
// Handing a communicator's bootstrap id (e.g. the 128 bytes of an ncclUniqueId) from rank 0 to
// the other processes of a multi-process DCP run through a file on a shared file system, and the
// ranks' notices that they are ready to join (or why they cannot) before any of them enters the
// join, which waits for every rank and cannot be interrupted (docs/DCP.md, "Multi-GPU runs").
// Host only; no CUDA or NCCL needed.
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

// Rank `rank`'s notice for the run whose id is `id`, in `<id_path>.rank<rank>` (written
// atomically, replacing an older notice): ready to join, with `detail` the options every rank
// must share; or failed, with `detail` the reason. A notice names the id it is for, so notices
// left by an earlier run are never read as this run's. Throws Error when it cannot be written.
void write_dcp_rank_notice(const std::string& id_path, int rank, const std::vector<char>& id, bool ready,
                           const std::string& detail);

// Waits (polling) until each other rank of `world` has left its notice for `id`, and returns when
// every one is ready with `options` equal to this rank's. Throws Error as soon as a rank's notice
// says it failed (with its reason) or that it runs with other options (both lists), and after
// `timeout_seconds` naming the ranks that left none. Rank 0 decides for the run this way, then
// leaves its own notice: ready (every rank may join) or failed (with the reason it gave up).
void await_dcp_ranks(const std::string& id_path, int world, int rank, const std::vector<char>& id,
                     const std::string& options, double timeout_seconds);

// A rank other than 0, once its ready notice is out: waits for rank 0's decision. Returns when
// rank 0's notice is ready; throws Error with rank 0's reason when it failed, and after
// `timeout_seconds` (give it more than rank 0's own wait, so that rank 0 decides first: a rank
// that left after rank 0 said ready would leave the others waiting in the join).
void await_dcp_rank_zero(const std::string& id_path, int world, int rank, const std::vector<char>& id,
                         double timeout_seconds);

// Removes rank `rank`'s notice (once every rank has joined, no one reads it any more).
void remove_dcp_rank_notice(const std::string& id_path, int rank);

}  // namespace nvfp4mla
