"""Serving policy and sizing: MTP verifier routing, decode scratch and KV capacity plans
(docs/ROUTING.md). Host-only; the same numbers as ``nvfp4mla plan route|scratch|capacity``."""
import os
from ctypes import byref, c_char_p, c_int32
from dataclasses import dataclass

from . import _lib
from ._lib import CapacityPlanC, CapacityRequest, ScratchPlanC, ScratchRequest, VerifierBatch, lib

SPEC_DECODE_MODE_ENV = "VLLM_B12X_MLA_SPEC_EXTEND_AS_DECODE"


def parse_spec_decode_mode(text):
    """'off', 'auto' or 'on' from the accepted spellings (0|false|off|no, auto, 1|true|on|yes)."""
    mode = c_int32()
    _lib.call(lib.nvfp4mla_parse_spec_decode_mode, str(text).encode(), byref(mode))
    return _lib.SPEC_DECODE_MODES[mode.value]


def _mode_code(mode, environ=None):
    """The mode argument, else $VLLM_B12X_MLA_SPEC_EXTEND_AS_DECODE, else auto."""
    if mode is None:
        mode = (os.environ if environ is None else environ).get(SPEC_DECODE_MODE_ENV, "auto")
    return _lib.SPEC_DECODE_MODES.index(parse_spec_decode_mode(mode))


def _spec(config):
    return (_lib.CACHE_DTYPES.index(config.cache_dtype), _lib.ROPES.index(config.rope),
            _lib.SCALE_MODES.index(config.scale_mode))


def decode_qualified(config):
    """Whether the format's decode kernel is qualified for verifier batches (the one table)."""
    out = c_int32()
    _lib.call(lib.nvfp4mla_decode_qualified, _spec(config)[0], byref(out))
    return bool(out.value)


@dataclass(frozen=True)
class RouteDecision:
    route: str   # "decode" or "extend"
    reason: str


def plan_route(config, num_speculative_tokens, max_query_len=1, any_prefill=False, max_q_per_request=8,
               decode_rows=0, decode_row_budget=None, mode=None, environ=None):
    """Which kernel a speculative-decoding verifier batch takes: sparse_decode or sparse_extend.

    mode: 'off'/'auto'/'on' (any accepted spelling); None reads $VLLM_B12X_MLA_SPEC_EXTEND_AS_DECODE
    (from ``environ``, default os.environ), else 'auto'. decode_row_budget: rows the decode
    scratch holds (default: decode_rows)."""
    op = "plan_route"
    batch = VerifierBatch(_lib.int32(num_speculative_tokens, op, "num_speculative_tokens"),
                          _lib.int32(max_query_len, op, "max_query_len"), 1 if any_prefill else 0,
                          _lib.int32(max_q_per_request, op, "max_q_per_request"),
                          _lib.int64(decode_rows, op, "decode_rows"),
                          _lib.int64(decode_rows if decode_row_budget is None else decode_row_budget, op,
                                     "decode_row_budget"))
    route, reason = c_int32(), c_char_p()
    _lib.call(lib.nvfp4mla_plan_route, _mode_code(mode, environ), _spec(config)[0], byref(batch), byref(route),
              byref(reason))
    return RouteDecision("decode" if route.value == 0 else "extend", reason.value.decode())


def decode_q_per_request(config, num_speculative_tokens, mode=None, environ=None):
    """Query rows a request contributes to the decode kernel: 1 + k when verifier batches can take
    the decode route, else 1."""
    out = c_int32()
    _lib.call(lib.nvfp4mla_decode_q_per_request, _mode_code(mode, environ), _spec(config)[0],
              _lib.int32(num_speculative_tokens, "decode_q_per_request", "num_speculative_tokens"), byref(out))
    return out.value


def verifier_rows(context_lens, tokens_per_request, topk, padded_rows=0):
    """Verifier rows of a batch: request r contributes tokens_per_request rows; token i sees
    context_lens[r] + i + 1 cached tokens, so its top-k list is cut to that length. Rows past the
    real ones (up to padded_rows, e.g. for a CUDA graph) get length 0.
    Returns (causal_len int64 [rows], topk_length int32 [rows]) as numpy arrays."""
    import numpy
    op = "verifier_rows"
    tokens_per_request, topk = _lib.int32(tokens_per_request, op, "tokens_per_request"), _lib.int32(topk, op, "topk")
    padded_rows = _lib.int64(padded_rows, op, "padded_rows")
    lens = numpy.ascontiguousarray(numpy.asarray(context_lens, dtype=numpy.int64).reshape(-1))
    rows = max(lens.shape[0] * tokens_per_request, padded_rows)
    causal = numpy.zeros(rows, dtype=numpy.int64)
    lengths = numpy.zeros(rows, dtype=numpy.int32)
    _lib.call(lib.nvfp4mla_verifier_rows, lens.ctypes.data, lens.shape[0], tokens_per_request, topk, padded_rows,
              causal.ctypes.data, lengths.ctypes.data)
    return causal, lengths


@dataclass(frozen=True)
class ScratchPlan:
    """Decode scratch for a server configuration; each region aligned to 256 bytes:
    tmp_output (split partial outputs) and tmp_lse first (the decode workspace), then output and
    final_lse."""
    q_per_request: int
    decode_rows: int
    heads: int
    splits: int
    partial_bytes: int
    tmp_output_bytes: int
    tmp_lse_bytes: int
    output_bytes: int
    final_lse_bytes: int
    total_bytes: int

    @property
    def workspace_bytes(self):
        """The part sparse_decode takes as its workspace (partial outputs + partial LSE)."""
        return self.tmp_output_bytes + self.tmp_lse_bytes


def plan_scratch(config, num_heads, max_num_seqs, max_num_batched_tokens=None, topk=2048, dcp_world_size=1,
                 num_speculative_tokens=0, mode=None, partials="fp32", splits=0, sm_count=132, environ=None,
                 compute_capability=0):
    """Exact decode scratch sizes (``nvfp4mla plan scratch``). max_num_batched_tokens defaults to
    64 x max_num_seqs; splits 0 sizes for the decode planner's worst case on ``sm_count`` SMs of a
    GPU of ``compute_capability`` (10 x major + minor; 0: the GPU plan_decode plans for, the
    current one, or sm_90 without a GPU)."""
    if partials not in ("fp32", "bf16"):
        raise _lib.ArgumentError(f"plan_scratch: partials must be 'fp32' or 'bf16', got {partials!r}")
    if max_num_batched_tokens is None:
        max_num_batched_tokens = int(max_num_seqs) * 64
    dtype, rope, scale = _spec(config)
    op = "plan_scratch"

    def i32(value, name):
        return _lib.int32(value, op, name)

    request = ScratchRequest(dtype, rope, scale, i32(num_heads, "num_heads"), i32(dcp_world_size, "dcp_world_size"),
                             i32(topk, "topk"), i32(max_num_seqs, "max_num_seqs"),
                             _lib.int64(max_num_batched_tokens, op, "max_num_batched_tokens"),
                             i32(num_speculative_tokens, "num_speculative_tokens"), _mode_code(mode, environ),
                             1 if partials == "bf16" else 0, i32(splits, "splits"), i32(sm_count, "sm_count"),
                             i32(compute_capability, "compute_capability"))
    plan = ScratchPlanC()
    _lib.call(lib.nvfp4mla_plan_scratch, byref(request), byref(plan))
    return ScratchPlan(*(getattr(plan, name) for name, _ in ScratchPlanC._fields_))


@dataclass(frozen=True)
class CapacityPlan:
    bytes_per_token: int
    pages: int
    tokens: int
    max_single_request_tokens: int


def plan_capacity(config, layers, memory_gib, reserved_gib=0.0, indexer_bytes_per_token=_lib.INDEX_KEY_RECORD_BYTES, page_size=64):
    """Tokens of KV cache (records + DSA indexer keys) that fit in a memory budget."""
    dtype, rope, scale = _spec(config)
    op = "plan_capacity"
    request = CapacityRequest(dtype, rope, scale, _lib.int32(layers, op, "layers"),
                              _lib.int32(indexer_bytes_per_token, op, "indexer_bytes_per_token"),
                              _lib.int32(page_size, op, "page_size"), float(memory_gib), float(reserved_gib))
    plan = CapacityPlanC()
    _lib.call(lib.nvfp4mla_plan_capacity, byref(request), byref(plan))
    return CapacityPlan(*(getattr(plan, name) for name, _ in CapacityPlanC._fields_))
