// Extend/prefill: the decode kernels with one split per row, so each row runs a single online
// softmax over its whole top-k list and writes its final output directly.
#include "nvfp4mla/arch.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/cuda/sparse_extend.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/error.h"

#include <string>

namespace nvfp4mla::cuda {

void sparse_extend(const RecordSpec& spec, const SparseMlaArgs& args, uint16_t* out, float* lse, cudaStream_t stream) {
  validate_sparse_mla_args(spec, args);
  if (args.rows == 0) return;
  const ArchSpec arch = current_device_arch();
  DecodePlan plan = plan_sparse_decode(spec, args.rows, args.heads, args.topk, arch, 1);
  // A kernel whose splits are capped (sm90_h16: 16384 entries) cannot take a longer row in one
  // split: then the first supported kernel that can.
  if (plan.splits > 1)
    for (DecodeKernel k : supported_decode_kernels(arch, spec, args.heads)) {
      const DecodePlan one = plan_sparse_decode(spec, args.rows, args.heads, args.topk, arch, 1, k);
      if (one.splits == 1) {
        plan = one;
        break;
      }
    }
  if (plan.splits > 1)
    throw Error("sparse extend: no kernel runs top-k " + std::to_string(args.topk) + " in one split on this device");
  sparse_decode(spec, args, plan, nullptr, 0, out, lse, stream);
}

}  // namespace nvfp4mla::cuda
