// Without CUDA the benchmarks explain why they cannot run.
#include "nvfp4mla/bench.h"
#include "nvfp4mla/error.h"

namespace nvfp4mla::bench {
const char* to_string(L2Flush f) { return f == L2Flush::read ? "read" : "write"; }
}  // namespace nvfp4mla::bench

#if !defined(NVFP4MLA_WITH_CUDA)
namespace nvfp4mla::bench {
static Error no_cuda() { return Error("benchmarks need the CUDA build of nvfp4mla and a GPU"); }
Ceilings measure_ceilings(const Options&) { throw no_cuda(); }
std::vector<DecodeResult> run_decode(const std::vector<DecodeCase>&, const Ceilings&, const Options&) { throw no_cuda(); }
std::vector<WriteResult> run_write(const std::vector<WriteCase>&, const Ceilings&, const Options&) { throw no_cuda(); }
std::vector<TopkResult> run_topk(const std::vector<TopkCase>&, const Options&) { throw no_cuda(); }
}  // namespace nvfp4mla::bench
#endif
