"""An nvfp4mla attention backend written the way a vLLM MLA backend is (DeepSeek-V3.2 / GLM-5.x).

The pieces map onto vLLM's:
- Nvfp4MlaBackend.get_kv_cache_shape: the per-layer KV cache, [num_blocks, block_size,
  record_bytes] uint8, its width from the FormatConfig (read from the vLLM variables);
- Nvfp4MlaMetadataBuilder.build: the metadata of one batch, built once and shared by every layer:
  slot mapping, top-k indices and lengths, the decode plan, and the workspace and output buffers,
  views into one scratch arena sized at start-up by plan_scratch; for MTP verifier batches the
  route (decode or extend) from plan_route;
- Nvfp4MlaImpl.forward: per layer, write_cache for the new tokens, then sparse_decode (or
  sparse_extend on the extend route) into the preallocated output;
- offload_namespace: the record ABI names the offload store's namespace.
Every kernel call goes through torch.ops.nvfp4mla (nvfp4mla.torch), so the step can be captured
in a CUDA graph or compiled.
"""
from dataclasses import dataclass
from typing import Optional

import torch

import nvfp4mla
import nvfp4mla.torch as nvt


class Nvfp4MlaBackend:
    @staticmethod
    def get_name():
        return "NVFP4MLA"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, config):
        return (num_blocks, block_size, config.record_bytes)

    @staticmethod
    def offload_namespace(config):
        """What an offload connector keys its store by: the record ABI, never a dtype name."""
        return config.record_abi()


@dataclass
class Nvfp4MlaMetadata:
    num_rows: int                    # query rows (decode tokens, or 1 + k per request when verifying)
    slot_mapping: torch.Tensor       # int64 [num_new_tokens]: where this step's tokens are written
    indices: torch.Tensor            # int32 [num_rows, topk]: slot ids chosen by the DSA indexer
    topk_length: torch.Tensor        # int32 [num_rows]
    route: str                       # "decode" or "extend"
    route_reason: str
    plan: Optional[nvfp4mla.DecodePlan]
    workspace: Optional[torch.Tensor]
    output: torch.Tensor             # bf16 [num_rows, heads, 512], a view into the scratch arena
    lse: torch.Tensor                # fp32 [num_rows, heads]


class Nvfp4MlaMetadataBuilder:
    """Sizes one scratch arena at start-up (plan_scratch) and carves each batch's buffers from it."""

    def __init__(self, config, num_heads, topk, max_num_seqs, num_speculative_tokens, device):
        self.config = config
        self.num_heads = num_heads
        self.topk = topk
        self.num_speculative_tokens = num_speculative_tokens
        self.sm_count = nvfp4mla.cuda_sm_count(device.index or 0)
        self.scratch = nvfp4mla.plan_scratch(config, num_heads=num_heads, max_num_seqs=max_num_seqs, topk=topk,
                                             num_speculative_tokens=num_speculative_tokens,
                                             sm_count=self.sm_count)
        self.arena = torch.empty(self.scratch.total_bytes, dtype=torch.uint8, device=device)
        s = self.scratch
        self.workspace = self.arena[:s.workspace_bytes]
        self.output_region = self.arena[s.workspace_bytes:s.workspace_bytes + s.output_bytes]
        lse_start = s.workspace_bytes + s.output_bytes
        self.lse_region = self.arena[lse_start:lse_start + s.final_lse_bytes]
        self._plans = {}

    def _plan(self, rows):
        plan = self._plans.get(rows)
        if plan is None:
            plan = self._plans[rows] = nvfp4mla.plan_decode(self.config, rows, self.num_heads, self.topk,
                                                            sm_count=self.sm_count)
            assert plan.workspace_bytes <= self.scratch.workspace_bytes, "plan_scratch covers every decode plan"
        return plan

    def build(self, slot_mapping, indices, topk_length, query_len=1, any_prefill=False):
        rows = indices.shape[0]
        route, reason = "decode", "one query token per request"
        if query_len > 1:  # an MTP verifier batch: 1 + k tokens per request
            decision = nvfp4mla.plan_route(self.config, self.num_speculative_tokens, max_query_len=query_len,
                                           any_prefill=any_prefill, decode_rows=rows,
                                           decode_row_budget=self.scratch.decode_rows)
            route, reason = decision.route, decision.reason
        if route == "decode" and rows > self.scratch.decode_rows:
            raise ValueError(f"{rows} decode rows exceed the scratch's {self.scratch.decode_rows}")
        n = rows * self.num_heads
        if rows <= self.scratch.decode_rows:
            output = self.output_region.view(torch.bfloat16)[:n * 512].view(rows, self.num_heads, 512)
            lse = self.lse_region.view(torch.float32)[:n].view(rows, self.num_heads)
        else:  # an extend batch larger than the decode scratch: outputs of its own
            output = torch.empty(rows, self.num_heads, 512, dtype=torch.bfloat16, device=self.arena.device)
            lse = torch.empty(rows, self.num_heads, dtype=torch.float32, device=self.arena.device)
        plan = self._plan(rows) if route == "decode" else None
        return Nvfp4MlaMetadata(rows, slot_mapping, indices, topk_length, route, reason, plan,
                                self.workspace if plan is not None else None, output, lse)


class Nvfp4MlaImpl:
    """One attention layer: writes its new tokens' records, then attends over the cache."""

    def __init__(self, config, layer_index, sm_scale):
        # Static scales are per layer: each layer reads its own scale from the calibration file.
        self.config = config.for_layer(layer_index) if config.scales_file else config
        self.sm_scale = sm_scale

    def forward(self, kv_c, k_pe, q, kv_cache, meta):
        nvt.write_cache(kv_c, k_pe, kv_cache, meta.slot_mapping, self.config)
        if meta.route == "decode":
            return nvt.sparse_decode(q, kv_cache, meta.indices, meta.topk_length, self.sm_scale, meta.plan,
                                     meta.workspace, meta.output, meta.lse)
        return nvt.sparse_extend(q, kv_cache, meta.indices, meta.topk_length, self.sm_scale, self.config,
                                 meta.output, meta.lse)
