#pragma once
// The DCP decode step on the GPU (CUDA builds only). Semantics: dcp.h ("the decode step under
// DCP"); docs/DCP.md shows a full call.
//
// One call drives all of the communicator's local ranks: rank_steps[i], workspaces[i] and
// streams[i] belong to local rank i (comm.local_rank(i)); the in-process communicator runs all N
// ranks on one GPU, the NCCL one this process's rank. Per rank, on its stream: the local top-k
// (cuda::topk), local -> global positions, [exact: all-gather of the candidates, the global
// top-k merge (cuda::dcp_merge_topk)], the rank's cache slots (cuda::dcp_local_indices), sparse
// decode (cuda::sparse_decode, BF16 partials), all-gather of the partials, the merge
// (cuda::dcp_merge). Every collective is issued for all local ranks between the phases, so one
// thread never waits on itself.
//
// Buffers come from the caller (each workspace plan.workspace_bytes bytes, 256-byte aligned);
// nothing is allocated and nothing synchronizes with the host, so the step can be captured in a
// CUDA graph (with the in-process communicator, or NCCL's graph support). Host-visible errors
// (validate_dcp_step_args, a communicator whose world size is not the placement's ranks, a
// small workspace) throw Error before anything is launched. Device-side errors are counted in
// each rank's *errors (when given).
#include <cuda_runtime_api.h>

#include <cstddef>

#include "nvfp4mla/cuda/dcp_comm.h"
#include "nvfp4mla/dcp.h"

namespace nvfp4mla::cuda {

// `plan` from plan_dcp_step(args, sm_count) for these arguments.
void dcp_decode_step(DcpCommunicator& comm, const DcpStepArgs& args, const DcpStepPlan& plan,
                     const DcpRankStep* rank_steps, void* const* workspaces, size_t workspace_bytes,
                     const cudaStream_t* streams);

}  // namespace nvfp4mla::cuda
