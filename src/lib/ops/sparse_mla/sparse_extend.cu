// Extend/prefill: the decode kernels with one split per row, so each row runs a single online
// softmax over its whole top-k list and writes its final output directly.
#include "nvfp4mla/arch.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/cuda/sparse_extend.h"
#include "nvfp4mla/decode_plan.h"

namespace nvfp4mla::cuda {

void sparse_extend(const RecordSpec& spec, const SparseMlaArgs& args, uint16_t* out, float* lse, cudaStream_t stream) {
  validate_sparse_mla_args(spec, args);
  if (args.rows == 0) return;
  const DecodePlan plan = plan_sparse_decode(spec, args.rows, args.heads, args.topk, current_device_arch(), 1);
  sparse_decode(spec, args, plan, nullptr, 0, out, lse, stream);
}

}  // namespace nvfp4mla::cuda
