// Without CUDA the DCP benchmark explains why it cannot run.
#include "nvfp4mla/bench.h"
#include "nvfp4mla/error.h"

#if !defined(NVFP4MLA_WITH_CUDA)
namespace nvfp4mla::bench {
std::vector<DcpResult> run_dcp(const std::vector<DcpCase>&, const Options&) {
  throw Error("benchmarks need the CUDA build of nvfp4mla and a GPU");
}
}  // namespace nvfp4mla::bench
#endif
