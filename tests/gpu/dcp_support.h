#pragma once
// Shared by the DCP GPU suites: streams for N ranks (one shared, or one per rank, with fork and
// join for graph capture), and the NCCL library the tests load.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "nvfp4mla/cuda/dcp_comm.h"

#define CUDA_CHECK_THROW(call)                                                              \
  do {                                                                                      \
    if ((call) != cudaSuccess) throw std::runtime_error(std::string(#call) + " failed");    \
  } while (0)

// Skips the test, with the loader's reason, when NCCL cannot be loaded. NVLink SHARP (NVLS) is
// kept off for every communicator the tests create (the GPU machines' rule), unless set.
#define NVFP4MLA_REQUIRE_NCCL()                                                             \
  do {                                                                                      \
    setenv("NCCL_NVLS_ENABLE", "0", 0);                                                     \
    std::string why_;                                                                       \
    if (!nvfp4mla::cuda::nccl_available(nvfp4mla::testing::test_nccl_library(), &why_))     \
      GTEST_SKIP() << "NCCL unavailable: " << why_;                                        \
  } while (0)

namespace nvfp4mla::testing {

// The NCCL library the tests load: $NVFP4MLA_TEST_NCCL_LIBRARY; else the loader's default
// when it loads; else the nvidia-nccl wheel's copy that python3 knows of (where the GPU
// machines keep NCCL); else the default (the tests then skip with the loader's reason).
inline std::string test_nccl_library() {
  static const std::string found = [] {
    if (const char* p = std::getenv("NVFP4MLA_TEST_NCCL_LIBRARY")) return std::string(p);
    if (nvfp4mla::cuda::nccl_available()) return std::string();
    std::string path;
    if (FILE* f = popen("python3 -c \"import os, nvidia.nccl; "
                        "print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))\" 2>/dev/null",
                        "r")) {
      char buf[4096];
      while (fgets(buf, sizeof buf, f)) path += buf;
      pclose(f);
    }
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    return path;
  }();
  return found;
}

// n ranks' streams: all the same created stream, or one per rank (blocking streams: they wait
// for the setup's copies and memsets on the legacy default stream).
class Streams {
 public:
  Streams(int n, bool per_rank) {
    const int count = per_rank ? n : 1;
    own_.resize(count);
    for (auto& s : own_) CUDA_CHECK_THROW(cudaStreamCreate(&s));
    for (int r = 0; r < n; ++r) streams_.push_back(own_[per_rank ? r : 0]);
    CUDA_CHECK_THROW(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    joins_.resize(count);
    for (auto& e : joins_) CUDA_CHECK_THROW(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~Streams() {
    for (auto s : own_) cudaStreamDestroy(s);
    cudaEventDestroy(event_);
    for (auto e : joins_) cudaEventDestroy(e);
  }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  const cudaStream_t* get() const { return streams_.data(); }
  cudaStream_t operator[](int r) const { return streams_[r]; }
  // The other streams wait for stream 0 (brings them into a capture that stream 0 began).
  void fork() {
    CUDA_CHECK_THROW(cudaEventRecord(event_, own_[0]));
    for (size_t i = 1; i < own_.size(); ++i) CUDA_CHECK_THROW(cudaStreamWaitEvent(own_[i], event_, 0));
  }
  // Stream 0 waits for the others (ends their part of a capture).
  void join() {
    for (size_t i = 1; i < own_.size(); ++i) {
      CUDA_CHECK_THROW(cudaEventRecord(joins_[i], own_[i]));
      CUDA_CHECK_THROW(cudaStreamWaitEvent(own_[0], joins_[i], 0));
    }
  }
  void synchronize() const {
    for (auto s : own_) CUDA_CHECK_THROW(cudaStreamSynchronize(s));
  }

 private:
  std::vector<cudaStream_t> own_, streams_;
  cudaEvent_t event_ = nullptr;
  std::vector<cudaEvent_t> joins_;
};

}  // namespace nvfp4mla::testing
