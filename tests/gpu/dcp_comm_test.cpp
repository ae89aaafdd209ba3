// The DCP communicators on the GPU: the in-process all-gather (1 to 8 ranks, sizes for each word
// width of its copy kernel, one stream or a stream per rank, in place, CUDA-graph capture and
// replay), the all-gather of
// TP-sharded query heads, bad arguments; the NCCL backend with a world of 1 (skips with the
// reason when libnccl cannot be loaded: set NVFP4MLA_TEST_NCCL_LIBRARY to its path, e.g. the
// nvidia-nccl wheel's nvidia/nccl/lib/libnccl.so.2).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/cuda/dcp_comm.h"
#include "nvfp4mla/error.h"
#include "gpu/dcp_support.h"
#include "support/expect_error.h"

using namespace nvfp4mla;
using nvfp4mla::testing::DeviceBuffer;
namespace nt = nvfp4mla::testing;

namespace {

// Rank r's send bytes: a pattern of (r, i, salt).
std::vector<uint8_t> pattern(int r, size_t bytes, int salt) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(r * 37 + i * 11 + salt * 101 + (i >> 8));
  return v;
}

// N ranks' send and recv buffers (recv poisoned).
struct Gather {
  int n;
  size_t bytes;
  std::vector<DeviceBuffer<uint8_t>> send, recv;
  std::vector<const void*> send_ptr;
  std::vector<void*> recv_ptr;
  Gather(int n_, size_t bytes_, int salt, bool in_place = false) : n(n_), bytes(bytes_) {
    for (int r = 0; r < n; ++r) {
      recv.emplace_back(n * bytes);
      recv.back().fill_bytes(0xEE);
      recv_ptr.push_back(recv.back().get());
      if (in_place) {
        CUDA_CHECK_THROW(cudaMemcpy(recv.back().get() + r * bytes, pattern(r, bytes, salt).data(), bytes, cudaMemcpyHostToDevice));
        send_ptr.push_back(recv.back().get() + r * bytes);
      } else {
        send.emplace_back(pattern(r, bytes, salt));
        send_ptr.push_back(send.back().get());
      }
    }
  }
  void set_sends(int salt) {
    for (int r = 0; r < n; ++r)
      CUDA_CHECK_THROW(cudaMemcpy(const_cast<void*>(send_ptr[r]), pattern(r, bytes, salt).data(), bytes, cudaMemcpyHostToDevice));
  }
  // Every rank's recv holds every rank's pattern in rank order.
  bool gathered(int salt) const {
    std::vector<uint8_t> want;
    for (int s = 0; s < n; ++s) {
      const auto p = pattern(s, bytes, salt);
      want.insert(want.end(), p.begin(), p.end());
    }
    for (int r = 0; r < n; ++r)
      if (recv[r].download() != want) return false;
    return true;
  }
};

}  // namespace

TEST(GpuDcpComm, InProcessAllGatherOneStreamAndStreamPerRank) {
  NVFP4MLA_REQUIRE_GPU();
  for (int n : {1, 2, 3, 8})
    for (size_t bytes : {size_t(1), size_t(1000), size_t(4096), size_t(4097), size_t(1) << 20})  // byte, 4- and 16-byte words
      for (bool per_rank_streams : {false, true})
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "N=" << n << " bytes " << bytes << " streams " << per_rank_streams << " in place "
                                            << in_place);
          cuda::InProcessDcpCommunicator comm(n);
          EXPECT_EQ(comm.world_size(), n);
          EXPECT_EQ(comm.local_ranks(), n);
          nt::Streams streams(n, per_rank_streams);
          Gather g(n, bytes, 3, in_place);
          comm.all_gather(g.send_ptr.data(), g.recv_ptr.data(), bytes, streams.get());
          CUDA_OK(cudaDeviceSynchronize());
          EXPECT_TRUE(g.gathered(3));
        }
}

// Captured once (one stream, then a stream per rank forked from the capturing stream), replayed
// with new send data: the replay gathers the new data, as an eager call does.
TEST(GpuDcpComm, InProcessAllGatherGraphReplayEqualsEager) {
  NVFP4MLA_REQUIRE_GPU();
  for (bool per_rank_streams : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "stream per rank " << per_rank_streams);
    const int n = 4;
    cuda::InProcessDcpCommunicator comm(n);
    nt::Streams streams(n, per_rank_streams);
    Gather g(n, 3000, 1);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(streams[0], cudaStreamCaptureModeGlobal));
    streams.fork();
    comm.all_gather(g.send_ptr.data(), g.recv_ptr.data(), g.bytes, streams.get());
    streams.join();
    CUDA_OK(cudaStreamEndCapture(streams[0], &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int salt : {5, 6}) {
      g.set_sends(salt);
      for (auto& r : g.recv) r.fill_bytes(0xEE);
      CUDA_OK(cudaGraphLaunch(exec, streams[0]));
      CUDA_OK(cudaStreamSynchronize(streams[0]));
      EXPECT_TRUE(g.gathered(salt)) << "replay with salt " << salt;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

TEST(GpuDcpComm, AllGatherOfQueryHeads) {
  NVFP4MLA_REQUIRE_GPU();
  const int n = 4, rows = 3, hpr = 2;
  const size_t head_bytes = 576 * 2;
  cuda::InProcessDcpCommunicator comm(n);
  nt::Streams streams(n, true);
  std::vector<DeviceBuffer<uint8_t>> send, staging, recv;
  std::vector<const void*> sp;
  std::vector<void*> st, rp;
  for (int r = 0; r < n; ++r) {
    send.emplace_back(pattern(r, rows * hpr * head_bytes, 0));
    staging.emplace_back(size_t(n) * rows * hpr * head_bytes);
    recv.emplace_back(size_t(n) * rows * hpr * head_bytes);
    recv.back().fill_bytes(0xEE);
    sp.push_back(send.back().get());
    st.push_back(staging.back().get());
    rp.push_back(recv.back().get());
  }
  cuda::dcp_all_gather_heads(comm, sp.data(), st.data(), rp.data(), rows, hpr, head_bytes, streams.get());
  CUDA_OK(cudaDeviceSynchronize());
  // Row i, head h of the full q = rank h / hpr's row i, head h % hpr.
  std::vector<uint8_t> want(size_t(n) * rows * hpr * head_bytes);
  for (int i = 0; i < rows; ++i)
    for (int h = 0; h < n * hpr; ++h) {
      const auto src = pattern(h / hpr, rows * hpr * head_bytes, 0);
      std::copy_n(src.begin() + (size_t(i) * hpr + h % hpr) * head_bytes, head_bytes,
                  want.begin() + (size_t(i) * n * hpr + h) * head_bytes);
    }
  for (int r = 0; r < n; ++r) EXPECT_EQ(recv[r].download(), want) << "rank " << r;
}

TEST(GpuDcpComm, BadArgumentsThrow) {
  NVFP4MLA_REQUIRE_GPU();
  EXPECT_THROW(cuda::InProcessDcpCommunicator(0), Error);
  EXPECT_THROW(cuda::InProcessDcpCommunicator(65), Error);
  cuda::InProcessDcpCommunicator comm(2);
  DeviceBuffer<uint8_t> a(8), a2(8), b(16);
  const void* send[] = {a.get(), nullptr};
  void* recv[] = {b.get(), b.get()};
  cudaStream_t s[] = {nullptr, nullptr};
  nt::expect_error_containing([&] { comm.all_gather(send, recv, 8, s); }, "a buffer of local rank 1 is null");
  // Every buffer set: the missing stream array is the only fault.
  const void* send_ok[] = {a.get(), a2.get()};
  nt::expect_error_containing([&] { comm.all_gather(send_ok, recv, 8, nullptr); }, "the per-rank arrays (buffers and streams) are required");
  comm.all_gather(nullptr, nullptr, 0, nullptr);  // nothing to move
}

// ---- NCCL ----

TEST(GpuDcpNccl, MissingLibraryGivesAClearError) {
  std::string why;
  EXPECT_FALSE(cuda::nccl_available("/nonexistent/libnccl.so.2", &why));
  EXPECT_FALSE(why.empty());
  // The message names what it tried (the names once dangled: garbage, then a crash on the H200).
  if (why.find("no NCCL support") == std::string::npos)
    EXPECT_NE(why.find("/nonexistent/libnccl.so.2"), std::string::npos) << why;
  EXPECT_THROW(cuda::nccl_unique_id("/nonexistent/libnccl.so.2"), Error);
}

TEST(GpuDcpNccl, WorldOfOneAllGatherEqualsInput) {
  NVFP4MLA_REQUIRE_GPU();
  NVFP4MLA_REQUIRE_NCCL();
  const std::string lib = nt::test_nccl_library();
  auto comm = cuda::make_nccl_communicator(cuda::nccl_unique_id(lib), 1, 0, lib);
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->local_ranks(), 1);
  EXPECT_EQ(comm->local_rank(0), 0);
  ASSERT_NE(cuda::nccl_comm_of(*comm), nullptr);
  nt::Streams streams(1, true);
  for (bool in_place : {false, true}) {
    Gather g(1, 12345, 9, in_place);
    comm->all_gather(g.send_ptr.data(), g.recv_ptr.data(), g.bytes, streams.get());
    CUDA_OK(cudaStreamSynchronize(streams[0]));
    EXPECT_TRUE(g.gathered(9)) << "in place " << in_place;
  }
  // A borrowed ncclComm_t: the same collective; the owner destroys it.
  auto borrowed = cuda::make_nccl_communicator(cuda::nccl_comm_of(*comm), lib);
  Gather g(1, 100, 2);
  borrowed->all_gather(g.send_ptr.data(), g.recv_ptr.data(), g.bytes, streams.get());
  CUDA_OK(cudaStreamSynchronize(streams[0]));
  EXPECT_TRUE(g.gathered(2));
  EXPECT_THROW(cuda::make_nccl_communicator(cuda::nccl_unique_id(lib), 1, 1, lib), Error);
}

// With a timeout the communicator is nonblocking: the same collective, the same result; a stream
// that stays busy past the timeout makes dcp_stream_synchronize abort the communicator and say so,
// after which the communicator refuses collectives. A dead peer leaves NCCL's own kernel waiting,
// which the abort stops; here a host function holds the stream instead, which the abort cannot
// stop, and ncclCommAbort waits for the device (it frees device memory). So the test releases the
// host function 3 s after the wait began: the wait must give up at the 1 s timeout, not when the
// stream drains, and return once the abort is done.
TEST(GpuDcpNccl, NonblockingCommunicatorGathersAndItsStreamWaitIsBounded) {
  NVFP4MLA_REQUIRE_GPU();
  NVFP4MLA_REQUIRE_NCCL();
  const std::string lib = nt::test_nccl_library();
  auto comm = cuda::make_nccl_communicator(cuda::nccl_unique_id(lib), 1, 0, lib, 30);
  nt::Streams streams(1, true);
  Gather g(1, 4321, 5);
  comm->all_gather(g.send_ptr.data(), g.recv_ptr.data(), g.bytes, streams.get());
  cuda::dcp_stream_synchronize(*comm, streams[0], "gather");
  EXPECT_TRUE(g.gathered(5));

  auto stalled = cuda::make_nccl_communicator(cuda::nccl_unique_id(lib), 1, 0, lib, 1);
  static std::atomic<bool> release{false};
  release = false;
  CUDA_OK(cudaLaunchHostFunc(
      streams[0], [](void*) { while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1)); }, nullptr));
  const auto start = std::chrono::steady_clock::now();
  std::thread releaser([] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    release = true;
  });
  std::string message;
  try {
    cuda::dcp_stream_synchronize(*stalled, streams[0], "step");
  } catch (const Error& e) {
    message = e.what();
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  releaser.join();
  EXPECT_NE(message.find("NCCL: step did not complete within 1 s"), std::string::npos) << message;
  EXPECT_GE(waited, std::chrono::seconds(1));
  EXPECT_LT(waited, std::chrono::seconds(30));
  CUDA_OK(cudaStreamSynchronize(streams[0]));
  EXPECT_THROW(stalled->all_gather(g.send_ptr.data(), g.recv_ptr.data(), g.bytes, streams.get()), Error);
}
