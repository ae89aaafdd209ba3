// CPU reference of the staged extend's staging (sparse_mla.h: stage_records_reference): the
// attended slots in slot order, each dequantized through the format module and written as a
// bf16-1152 record, every value rounded to BF16 once (the kernels' BF16 operands).
#include <cstdint>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/sparse_mla.h"

namespace nvfp4mla {

StagedRecordsReference stage_records_reference(const RecordSpec& spec, const SparseMlaArgs& a) {
  validate_sparse_mla_args(spec, a);
  const int64_t entries = static_cast<int64_t>(a.rows) * a.topk;
  std::vector<int32_t> position(static_cast<size_t>(a.capacity), -1);
  for (int r = 0; r < a.rows; ++r)
    for (int p = 0; p < a.topk; ++p)
      if (sparse_entry_valid(a, r, p)) position[a.indices[static_cast<int64_t>(r) * a.topk + p]] = 0;
  StagedRecordsReference s;
  for (int64_t slot = 0; slot < a.capacity; ++slot)
    if (position[slot] == 0) position[slot] = static_cast<int32_t>(s.count++);
  constexpr int kStagedBytes = layout::bf16::kRecordBytes;
  s.records.resize(static_cast<size_t>(s.count) * kStagedBytes);
  float latent[kLatentDim], rope[kRopeDim];
  for (int64_t slot = 0; slot < a.capacity; ++slot) {
    if (position[slot] < 0) continue;
    record::decode(spec, a.cache + slot * spec.record_bytes(), a.layer_scale, latent, rope);
    // Rounded to nearest even like the kernels' operands (record::encode would saturate and
    // sanitize, which differs only for values no written record holds).
    uint8_t* dst = s.records.data() + static_cast<size_t>(position[slot]) * kStagedBytes;
    for (int i = 0; i < kLatentDim; ++i)
      record::store_u16(dst + layout::bf16::kLatentOffset + 2 * i, codec::bf16_encode_rn(latent[i]));
    for (int i = 0; i < kRopeDim; ++i) record::store_u16(dst + layout::bf16::kRopeOffset + 2 * i, codec::bf16_encode_rn(rope[i]));
  }
  s.indices.assign(static_cast<size_t>(entries), -1);
  for (int r = 0; r < a.rows; ++r)
    for (int p = 0; p < a.topk; ++p)
      if (sparse_entry_valid(a, r, p)) {
        const int64_t e = static_cast<int64_t>(r) * a.topk + p;
        s.indices[e] = position[a.indices[e]];
      }
  return s;
}

}  // namespace nvfp4mla
