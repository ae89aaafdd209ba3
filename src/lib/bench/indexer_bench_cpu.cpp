// Without CUDA the indexer benchmark explains why it cannot run.
#include "nvfp4mla/bench.h"
#include "nvfp4mla/error.h"

#if !defined(NVFP4MLA_WITH_CUDA)
namespace nvfp4mla::bench {
std::vector<IndexerResult> run_indexer(const std::vector<IndexerCase>&, const Ceilings&, const Options&) {
  throw Error("benchmarks need the CUDA build of nvfp4mla and a GPU");
}
}  // namespace nvfp4mla::bench
#endif
