"""nvfp4mla: a 4-bit (NVFP4) KV cache and sparse MLA attention for DeepSeek-V3.2 / GLM-5.x.

Python interface to the nvfp4mla library, pure Python over its C ABI (libnvfp4mla_c.so, loaded
with ctypes; see nvfp4mla._lib for where it is looked for). Tensors cross zero-copy: torch
tensors, numpy arrays, CuPy arrays or any object with ``__dlpack__``. GPU functions run on the
caller's CUDA stream (torch's or CuPy's current stream, or ``stream=``).

- Format: :class:`FormatConfig` (``from_env()``, ``record_bytes``, ``record_abi()``, ``validate()``).
- Records: :func:`encode`, :func:`decode` (CPU); :func:`write_cache`, :func:`gather_records`,
  :func:`scatter_records` (CPU or GPU).
- Attention (GPU): :func:`plan_decode` -> :class:`DecodePlan`, :func:`sparse_decode`,
  :func:`sparse_extend` (staged with a workspace of :func:`extend_staging_bytes`),
  :func:`sparse_scores`; CPU references :func:`sparse_mla_reference`,
  :func:`sparse_scores_reference`.
- Serving: :func:`plan_route`, :func:`plan_scratch`, :func:`plan_capacity`, :func:`verifier_rows`.
- Selection (CPU or GPU): :func:`encode_index_keys`, :func:`write_index_cache`,
  :func:`gather_index_records`, :func:`gather_index_keys`, :func:`indexer_logits` (ragged),
  :func:`indexer_logits_paged`, :func:`plan_topk` -> :class:`TopkPlan`, :func:`topk` (with the
  block-table slot transform), :func:`plan_fused_select` / :func:`plan_fused_select_ragged` ->
  :class:`FusedSelectPlan`, :func:`fused_select`, :func:`fused_select_ragged`.
- Offload: :class:`Store`.
- torch: ``import nvfp4mla.torch`` registers ``torch.ops.nvfp4mla.*`` (custom ops with fake
  implementations, usable under torch.compile and CUDA-graph capture).

Errors raise :class:`Error` (a RuntimeError) carrying the library's message; arguments rejected
before the library is called raise :class:`ArgumentError` (also a ValueError).
"""
from ._lib import ArgumentError, Error, UnsupportedError
from ._lib import lib as _library
from .attention import (DecodePlan, built_with_cuda, cuda_device_count, cuda_sm_count, extend_staging_bytes,
                        plan_decode, sparse_decode, sparse_extend, sparse_mla_reference, sparse_scores,
                        sparse_scores_reference)
from .config import FormatConfig
from .offload import OpResult, Store
from .records import (LATENT_DIM, QK_DIM, ROPE_DIM, decode, encode, gather_records, scatter_records,
                      write_cache)
from .selection import (INDEX_KEY_DIM, INDEX_KEY_RECORD_BYTES, FusedSelectPlan, TopkPlan, encode_index_keys,
                        fused_select, fused_select_ragged, gather_index_keys, gather_index_records, indexer_logits,
                        indexer_logits_paged, plan_fused_select, plan_fused_select_ragged, plan_topk, topk,
                        write_index_cache)
from .serving import (CapacityPlan, RouteDecision, ScratchPlan, decode_q_per_request, decode_qualified,
                      parse_spec_decode_mode, plan_capacity, plan_route, plan_scratch, verifier_rows)

__version__ = "0.1.0"
library_path = _library._nvfp4mla_path

__all__ = [
    "ArgumentError", "CapacityPlan", "DecodePlan", "Error", "FormatConfig", "LATENT_DIM", "OpResult", "QK_DIM",
    "ROPE_DIM", "RouteDecision", "ScratchPlan", "Store", "UnsupportedError", "built_with_cuda", "cuda_device_count",
    "cuda_sm_count", "decode", "decode_q_per_request", "decode_qualified", "encode", "extend_staging_bytes",
    "gather_records", "library_path", "parse_spec_decode_mode", "plan_capacity", "plan_decode", "plan_route",
    "plan_scratch", "scatter_records", "sparse_decode", "sparse_extend", "sparse_mla_reference", "sparse_scores",
    "sparse_scores_reference", "verifier_rows", "write_cache",
    "INDEX_KEY_DIM", "INDEX_KEY_RECORD_BYTES", "FusedSelectPlan", "TopkPlan", "encode_index_keys", "fused_select",
    "fused_select_ragged", "gather_index_keys", "gather_index_records", "indexer_logits", "indexer_logits_paged",
    "plan_fused_select", "plan_fused_select_ragged", "plan_topk", "topk", "write_index_cache",
]
