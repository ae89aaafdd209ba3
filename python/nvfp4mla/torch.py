"""torch.ops.nvfp4mla: the GPU functions as torch custom ops, for engines (vLLM, SGLang).

Importing this module registers, with torch.library.custom_op, each op with its mutated
arguments declared and a fake (meta) implementation, so the ops trace under torch.compile and are
captured in CUDA graphs like built-in ones (they never allocate or synchronize). Every op writes
into caller-provided tensors and returns nothing:

  torch.ops.nvfp4mla.write_cache(kv_c, k_pe, cache!, slot_mapping, cache_dtype, rope, scale_mode,
                                 layer_scale)
  torch.ops.nvfp4mla.gather_records(cache, slots, output!)
  torch.ops.nvfp4mla.scatter_records(src, slots, cache!)
  torch.ops.nvfp4mla.sparse_decode(q, cache, indices, topk_length?, sm_scale, plan: int[], workspace!,
                                   output!, lse!, cache_dtype, rope, scale_mode, layer_scale, lse_base2)
  torch.ops.nvfp4mla.sparse_extend(q, cache, indices, topk_length?, sm_scale, output!, lse!, cache_dtype,
                                   rope, scale_mode, layer_scale, lse_base2)
  torch.ops.nvfp4mla.sparse_scores(q, cache, indices, topk_length?, sm_scale, output!, cache_dtype, rope,
                                   scale_mode, layer_scale)

  torch.ops.nvfp4mla.write_index_cache(keys, cache!, slot_mapping, invalid_count!, page_size)
  torch.ops.nvfp4mla.gather_index_records(cache, slots, output!, invalid_count!, page_size)
  torch.ops.nvfp4mla.indexer_logits(q, weights, keys, key_scales?, row_starts, row_ends, output!,
                                    invalid_count!)
  torch.ops.nvfp4mla.indexer_logits_paged(q, weights, cache, block_table, context_lens, output!,
                                          invalid_count!, next_n, page_size)
  torch.ops.nvfp4mla.topk(logits, lengths?, k, plan: int[], workspace!, indices!, topk_length!, values!,
                          error_count!, block_table?, page_size, rows_per_request, capacity, position_offset)
  torch.ops.nvfp4mla.fused_select(q, weights, cache, block_table, context_lens, plan: int[], workspace!,
                                  indices!, topk_length!, values!, invalid_count!, slot_ids)
  torch.ops.nvfp4mla.fused_select_ragged(q, weights, keys, key_scales?, row_starts, row_ends, plan: int[],
                                         workspace!, indices!, topk_length!, values!, invalid_count!)

The format travels as its names and the layer scale (FormatConfig.cache_dtype/.rope/.scale_mode/
.layer_scale), the plans as DecodePlan/TopkPlan/FusedSelectPlan.as_list() (an empty list: the CPU top-k). The functions below take a FormatConfig
or DecodePlan, allocate outputs left as None (torch.empty, fine inside a graph or compile) and
call the ops.

Mutated arguments are never optional (an optional mutated argument passed as None breaks the
version-counter bookkeeping of some torch releases): a plan that needs no workspace takes an empty
tensor, and the slot counter of nvfp4mla.write_cache(error_count=...) has no op form.
"""
from typing import List, Optional

import torch
from torch import Tensor

from . import _lib
from . import selection as _sel
from .attention import DecodePlan, _decode_torch, extend_with, scores_with
from .attention import sparse_decode as _sparse_decode
from .records import LATENT_DIM
from .records import gather_records as _gather_records
from .records import scatter_records as _scatter_records
from .records import _write_cache_torch, write_cache_format

_formats = {}
_plans = {}


def _format(cache_dtype, rope, scale_mode, layer_scale):
    """The C format struct and record width for the names (cached; validated by the library)."""
    key = (cache_dtype, rope, scale_mode, layer_scale)
    found = _formats.get(key)
    if found is None:
        from ctypes import byref, c_int32
        try:
            fmt = _lib.Format(_lib.CACHE_DTYPES.index(cache_dtype), _lib.ROPES.index(rope),
                              _lib.SCALE_MODES.index(scale_mode), layer_scale)
        except ValueError:
            raise _lib.ArgumentError(f"unknown format ({cache_dtype}, {rope}, {scale_mode}): use "
                                     f"{_lib.CACHE_DTYPES}, {_lib.ROPES} and {_lib.SCALE_MODES}") from None
        rb = c_int32()
        _lib.call(_lib.lib.nvfp4mla_format_record_bytes, byref(fmt), byref(rb))
        found = _formats[key] = (fmt, rb.value)
    return found


def _plan(fields, cache_dtype, rope, scale_mode, layer_scale):
    """The DecodePlan of DecodePlan.as_list() for the named format (cached)."""
    key = (tuple(fields), cache_dtype, rope, scale_mode, layer_scale)
    found = _plans.get(key)
    if found is None:
        fmt, rb = _format(cache_dtype, rope, scale_mode, layer_scale)
        found = _plans[key] = DecodePlan.from_list(fields, fmt, rb)
    return found


# ---- ops ----------------------------------------------------------------------------------------

@torch.library.custom_op("nvfp4mla::write_cache", mutates_args=("cache",))
def _write_cache_op(kv_c: Tensor, k_pe: Tensor, cache: Tensor, slot_mapping: Tensor, cache_dtype: str, rope: str,
                    scale_mode: str, layer_scale: float) -> None:
    fmt, rb = _format(cache_dtype, rope, scale_mode, layer_scale)
    write_cache_format(fmt, rb, kv_c, k_pe, cache, slot_mapping)


@_write_cache_op.register_fake
def _(kv_c, k_pe, cache, slot_mapping, cache_dtype, rope, scale_mode, layer_scale):
    return None


@torch.library.custom_op("nvfp4mla::gather_records", mutates_args=("output",))
def _gather_records_op(cache: Tensor, slots: Tensor, output: Tensor) -> None:
    _gather_records(cache, slots, output)


@_gather_records_op.register_fake
def _(cache, slots, output):
    return None


@torch.library.custom_op("nvfp4mla::scatter_records", mutates_args=("cache",))
def _scatter_records_op(src: Tensor, slots: Tensor, cache: Tensor) -> None:
    _scatter_records(src, slots, cache)


@_scatter_records_op.register_fake
def _(src, slots, cache):
    return None


@torch.library.custom_op("nvfp4mla::sparse_decode", mutates_args=("workspace", "output", "lse"))
def _sparse_decode_op(q: Tensor, cache: Tensor, indices: Tensor, topk_length: Optional[Tensor], sm_scale: float,
                      plan: List[int], workspace: Tensor, output: Tensor, lse: Tensor, cache_dtype: str,
                      rope: str, scale_mode: str, layer_scale: float, lse_base2: bool) -> None:
    _sparse_decode(q, cache, indices, topk_length, sm_scale, _plan(plan, cache_dtype, rope, scale_mode, layer_scale),
                   workspace if workspace.numel() else None, output, lse, lse_base2=lse_base2)


@_sparse_decode_op.register_fake
def _(q, cache, indices, topk_length, sm_scale, plan, workspace, output, lse, cache_dtype, rope, scale_mode,
      layer_scale, lse_base2):
    return None


@torch.library.custom_op("nvfp4mla::sparse_extend", mutates_args=("output", "lse"))
def _sparse_extend_op(q: Tensor, cache: Tensor, indices: Tensor, topk_length: Optional[Tensor], sm_scale: float,
                      output: Tensor, lse: Tensor, cache_dtype: str, rope: str, scale_mode: str, layer_scale: float,
                      lse_base2: bool) -> None:
    fmt, rb = _format(cache_dtype, rope, scale_mode, layer_scale)
    extend_with(fmt, rb, q, cache, indices, topk_length, sm_scale, output, lse, lse_base2)


@_sparse_extend_op.register_fake
def _(q, cache, indices, topk_length, sm_scale, output, lse, cache_dtype, rope, scale_mode, layer_scale, lse_base2):
    return None


@torch.library.custom_op("nvfp4mla::sparse_scores", mutates_args=("output",))
def _sparse_scores_op(q: Tensor, cache: Tensor, indices: Tensor, topk_length: Optional[Tensor], sm_scale: float,
                      output: Tensor, cache_dtype: str, rope: str, scale_mode: str, layer_scale: float) -> None:
    fmt, rb = _format(cache_dtype, rope, scale_mode, layer_scale)
    scores_with(fmt, rb, q, cache, indices, topk_length, sm_scale, output)


@_sparse_scores_op.register_fake
def _(q, cache, indices, topk_length, sm_scale, output, cache_dtype, rope, scale_mode, layer_scale):
    return None


# ---- selection ops --------------------------------------------------------------------------------
# Optional outputs (top-k values, the top-k error counter) and a workspace a plan does not need
# travel as empty tensors: mutated arguments are never optional.

def _given(t):
    return t if t.numel() else None


def _cached_plan(cls, fields, cache):
    key = tuple(fields)
    found = cache.get(key)
    if found is None:
        found = cache[key] = cls.from_list(key)
    return found


_topk_plans = {}
_fused_plans = {}


@torch.library.custom_op("nvfp4mla::write_index_cache", mutates_args=("cache", "invalid_count"))
def _write_index_cache_op(keys: Tensor, cache: Tensor, slot_mapping: Tensor, invalid_count: Tensor,
                          page_size: int) -> None:
    _sel.write_index_cache(keys, cache, slot_mapping, page_size, invalid_count=invalid_count)


@_write_index_cache_op.register_fake
def _(keys, cache, slot_mapping, invalid_count, page_size):
    return None


@torch.library.custom_op("nvfp4mla::gather_index_records", mutates_args=("output", "invalid_count"))
def _gather_index_records_op(cache: Tensor, slots: Tensor, output: Tensor, invalid_count: Tensor,
                             page_size: int) -> None:
    _sel.gather_index_records(cache, slots, output, page_size=page_size, invalid_count=invalid_count)


@_gather_index_records_op.register_fake
def _(cache, slots, output, invalid_count, page_size):
    return None


@torch.library.custom_op("nvfp4mla::indexer_logits", mutates_args=("output", "invalid_count"))
def _indexer_logits_op(q: Tensor, weights: Tensor, keys: Tensor, key_scales: Optional[Tensor], row_starts: Tensor,
                       row_ends: Tensor, output: Tensor, invalid_count: Tensor) -> None:
    _sel.indexer_logits(q, weights, keys, row_starts, row_ends, output, key_scales=key_scales,
                        invalid_count=invalid_count)


@_indexer_logits_op.register_fake
def _(q, weights, keys, key_scales, row_starts, row_ends, output, invalid_count):
    return None


@torch.library.custom_op("nvfp4mla::indexer_logits_paged", mutates_args=("output", "invalid_count"))
def _indexer_logits_paged_op(q: Tensor, weights: Tensor, cache: Tensor, block_table: Tensor, context_lens: Tensor,
                             output: Tensor, invalid_count: Tensor, next_n: int, page_size: int) -> None:
    _sel.indexer_logits_paged(q, weights, cache, block_table, context_lens, output, next_n=next_n,
                              page_size=page_size, invalid_count=invalid_count)


@_indexer_logits_paged_op.register_fake
def _(q, weights, cache, block_table, context_lens, output, invalid_count, next_n, page_size):
    return None


@torch.library.custom_op("nvfp4mla::topk",
                         mutates_args=("workspace", "indices", "topk_length", "values", "error_count"))
def _topk_op(logits: Tensor, lengths: Optional[Tensor], k: int, plan: List[int], workspace: Tensor, indices: Tensor,
             topk_length: Tensor, values: Tensor, error_count: Tensor, block_table: Optional[Tensor], page_size: int,
             rows_per_request: int, capacity: int, position_offset: int) -> None:
    _sel.topk(logits, lengths, k, plan=_cached_plan(_sel.TopkPlan, plan, _topk_plans) if plan else None,
              workspace=_given(workspace), indices=indices, topk_length=topk_length, values=_given(values),
              position_offset=position_offset, block_table=block_table, page_size=page_size,
              rows_per_request=rows_per_request, capacity=capacity, error_count=_given(error_count))


@_topk_op.register_fake
def _(logits, lengths, k, plan, workspace, indices, topk_length, values, error_count, block_table, page_size,
      rows_per_request, capacity, position_offset):
    return None


@torch.library.custom_op("nvfp4mla::fused_select",
                         mutates_args=("workspace", "indices", "topk_length", "values", "invalid_count"))
def _fused_select_op(q: Tensor, weights: Tensor, cache: Tensor, block_table: Tensor, context_lens: Tensor,
                     plan: List[int], workspace: Tensor, indices: Tensor, topk_length: Tensor, values: Tensor,
                     invalid_count: Tensor, slot_ids: bool) -> None:
    _sel.fused_select(q, weights, cache, block_table, context_lens, _cached_plan(_sel.FusedSelectPlan, plan,
                                                                                  _fused_plans),
                      _given(workspace), slot_ids=slot_ids, indices=indices, topk_length=topk_length,
                      values=_given(values), invalid_count=invalid_count)


@_fused_select_op.register_fake
def _(q, weights, cache, block_table, context_lens, plan, workspace, indices, topk_length, values, invalid_count,
      slot_ids):
    return None


@torch.library.custom_op("nvfp4mla::fused_select_ragged",
                         mutates_args=("workspace", "indices", "topk_length", "values", "invalid_count"))
def _fused_select_ragged_op(q: Tensor, weights: Tensor, keys: Tensor, key_scales: Optional[Tensor],
                            row_starts: Tensor, row_ends: Tensor, plan: List[int], workspace: Tensor, indices: Tensor,
                            topk_length: Tensor, values: Tensor, invalid_count: Tensor) -> None:
    _sel.fused_select_ragged(q, weights, keys, row_starts, row_ends,
                             _cached_plan(_sel.FusedSelectPlan, plan, _fused_plans), _given(workspace),
                             key_scales=key_scales, indices=indices, topk_length=topk_length, values=_given(values),
                             invalid_count=invalid_count)


@_fused_select_ragged_op.register_fake
def _(q, weights, keys, key_scales, row_starts, row_ends, plan, workspace, indices, topk_length, values,
      invalid_count):
    return None


# ---- functions over the ops ----------------------------------------------------------------------

def _names(config):
    return config.cache_dtype, config.rope, config.scale_mode, float(config.layer_scale)


def write_cache(kv_c, k_pe, cache, slot_mapping, config):
    """nvfp4mla.write_cache as torch.ops.nvfp4mla.write_cache (mutates cache); eager calls with
    autograd off and plain CUDA tensors go straight to the library, as sparse_decode does."""
    T = torch.Tensor
    if (_direct() and type(kv_c) is T and type(k_pe) is T and type(cache) is T and type(slot_mapping) is T and
            _write_cache_torch(torch, config.format(), config.record_bytes, kv_c, k_pe, cache, slot_mapping, None,
                               None)):
        _mutated(cache)
        return
    torch.ops.nvfp4mla.write_cache(kv_c, k_pe, cache, slot_mapping, *_names(config))


def gather_records(cache, slots, out=None):
    """Records of ``slots`` into out: uint8 [n, record_bytes] (allocated when None)."""
    if out is None:
        out = torch.empty((slots.shape[0], cache.shape[-1]), dtype=torch.uint8, device=cache.device)
    torch.ops.nvfp4mla.gather_records(cache, slots, out)
    return out


def scatter_records(src, slots, cache):
    """Records src: uint8 [n, record_bytes] into ``slots`` of the cache (mutates cache)."""
    torch.ops.nvfp4mla.scatter_records(src, slots, cache)


def _attention_outputs(q, out, lse):
    rows, heads = q.shape[0], q.shape[1]
    if out is None:
        out = torch.empty((rows, heads, LATENT_DIM), dtype=torch.bfloat16, device=q.device)
    if lse is None:
        lse = torch.empty((rows, heads), dtype=torch.float32, device=q.device)
    return out, lse


# The eager shortcut past the dispatcher (see _direct).
_function_modes = getattr(torch._C, "_len_torch_function_stack", None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def _direct():
    """True when an op call may skip the dispatcher and run the library directly with the same
    effect: eager (torch.compile is not tracing), no torch function or dispatch mode active
    (fake tensors, functionalization, proxies) and autograd off (engines run their model under
    inference_mode; the op has no autograd formula either way)."""
    return (_function_modes is not None and _dispatch_modes is not None and _is_compiling is not None and
            not torch.is_grad_enabled() and not _is_compiling() and _function_modes() == 0 and
            _dispatch_modes() == 0)


def _mutated(*tensors):
    """What the dispatcher does for an op's mutated arguments, done for the direct path: bump their
    version counters (inference tensors have none)."""
    for t in tensors:
        if t is not None and not t.is_inference():
            torch.autograd.graph.increment_version(t)


def sparse_decode(q, cache, indices, topk_length, sm_scale, plan, workspace, out=None, lse=None, lse_base2=False):
    """nvfp4mla.sparse_decode as torch.ops.nvfp4mla.sparse_decode; returns (out, lse).

    Eager calls with autograd off (inference_mode, no_grad), plain CUDA tensors and caller-provided
    out/lse go straight to the library, as the op would, without the dispatcher's overhead (tens
    of microseconds for a Python custom op); traced or compiled code, and every other call, goes
    through the op."""
    if (out is not None and lse is not None and _direct() and
            _decode_torch(plan, q, cache, indices, topk_length, sm_scale, workspace, out, lse, lse_base2, None)):
        _mutated(out, lse, workspace)
        return out, lse
    out, lse = _attention_outputs(q, out, lse)
    if workspace is None:
        workspace = torch.empty(0, dtype=torch.uint8, device=q.device)
    torch.ops.nvfp4mla.sparse_decode(q, cache, indices, topk_length, float(sm_scale), plan.as_list(), workspace, out,
                                     lse, plan.cache_dtype, plan.rope, plan.scale_mode, float(plan.layer_scale),
                                     bool(lse_base2))
    return out, lse


def sparse_extend(q, cache, indices, topk_length, sm_scale, config, out=None, lse=None, lse_base2=False):
    """nvfp4mla.sparse_extend through torch.ops.nvfp4mla.sparse_extend; returns (out, lse)."""
    out, lse = _attention_outputs(q, out, lse)
    torch.ops.nvfp4mla.sparse_extend(q, cache, indices, topk_length, float(sm_scale), out, lse, *_names(config),
                                     bool(lse_base2))
    return out, lse


def sparse_scores(q, cache, indices, topk_length, sm_scale, config, out=None):
    """nvfp4mla.sparse_scores through torch.ops.nvfp4mla.sparse_scores; returns scores."""
    if out is None:
        out = torch.empty((q.shape[0], q.shape[1], indices.shape[1]), dtype=torch.float32, device=q.device)
    torch.ops.nvfp4mla.sparse_scores(q, cache, indices, topk_length, float(sm_scale), out, *_names(config))
    return out


# ---- selection functions over the ops ----------------------------------------------------------------

def _empty(ref, shape=(0,), dtype=torch.uint8):
    return torch.empty(shape, dtype=dtype, device=ref.device)


def _counter(ref, counter):
    return _empty(ref, (1,), torch.int64) if counter is None else counter


def write_index_cache(keys, cache, slot_mapping, page_size=_sel.DEFAULT_PAGE_SIZE, invalid_count=None):
    """nvfp4mla.write_index_cache through torch.ops.nvfp4mla.write_index_cache (mutates cache and
    invalid_count, allocated when None); returns invalid_count (set to 0 on the CPU, whose writer
    raises on a bad slot instead)."""
    invalid_count = _counter(cache, invalid_count)
    torch.ops.nvfp4mla.write_index_cache(keys, cache, slot_mapping, invalid_count, int(page_size))
    return invalid_count


def gather_index_records(cache, slots, out=None, page_size=_sel.DEFAULT_PAGE_SIZE, invalid_count=None):
    """Index key records uint8 [n, 132] of ``slots``; returns out."""
    if out is None:
        out = _empty(cache, (slots.shape[0], _sel.INDEX_KEY_RECORD_BYTES))
    torch.ops.nvfp4mla.gather_index_records(cache, slots, out, _counter(cache, invalid_count), int(page_size))
    return out


def indexer_logits(q, weights, keys, row_starts, row_ends, out, key_scales=None, invalid_count=None):
    """Ragged indexer logits into out: float32 [rows, width] (required: the width is the caller's)."""
    torch.ops.nvfp4mla.indexer_logits(q, weights, keys, key_scales, row_starts, row_ends, out,
                                      _counter(q, invalid_count))
    return out


def indexer_logits_paged(q, weights, cache, block_table, context_lens, out=None, next_n=1,
                         page_size=_sel.DEFAULT_PAGE_SIZE, invalid_count=None):
    """Paged indexer logits; out float32 [rows, width] (allocated as [rows, pages * page_size] when
    None); returns out."""
    if out is None:
        out = _empty(q, (q.shape[0], block_table.shape[1] * int(page_size)), torch.float32)
    torch.ops.nvfp4mla.indexer_logits_paged(q, weights, cache, block_table, context_lens, out,
                                            _counter(q, invalid_count), int(next_n), int(page_size))
    return out


def _topk_outputs(ref, rows, k, indices, topk_length, values):
    if indices is None:
        indices = _empty(ref, (rows, k), torch.int32)
    if topk_length is None:
        topk_length = _empty(ref, (rows,), torch.int32)
    return indices, topk_length, _empty(ref, (0,), torch.float32) if values is None else values


def topk(logits, lengths, k, plan=None, workspace=None, indices=None, topk_length=None, values=None,
         block_table=None, page_size=0, rows_per_request=1, capacity=0, position_offset=0, error_count=None):
    """nvfp4mla.topk through torch.ops.nvfp4mla.topk; returns (indices, topk_length). On the GPU
    give ``plan`` (plan_topk) outside graph capture: planning queries the device."""
    if plan is None and logits.is_cuda:
        plan = _sel.plan_topk(logits.shape[0], logits.shape[1], device=logits.get_device())
    indices, topk_length, values = _topk_outputs(logits, logits.shape[0], int(k), indices, topk_length, values)
    torch.ops.nvfp4mla.topk(logits, lengths, int(k), plan.as_list() if plan is not None else [],
                            _empty(logits) if workspace is None else workspace, indices, topk_length, values,
                            _empty(logits, (0,), torch.int64) if error_count is None else error_count, block_table,
                            int(page_size), int(rows_per_request), int(capacity), int(position_offset))
    return indices, topk_length


def fused_select(q, weights, cache, block_table, context_lens, plan, workspace=None, slot_ids=False, indices=None,
                 topk_length=None, values=None, invalid_count=None):
    """nvfp4mla.fused_select through torch.ops.nvfp4mla.fused_select; returns (indices, topk_length)."""
    indices, topk_length, values = _topk_outputs(q, plan.rows, plan.k, indices, topk_length, values)
    torch.ops.nvfp4mla.fused_select(q, weights, cache, block_table, context_lens, plan.as_list(),
                                    _empty(q) if workspace is None else workspace, indices, topk_length, values,
                                    _counter(q, invalid_count), bool(slot_ids))
    return indices, topk_length


def fused_select_ragged(q, weights, keys, row_starts, row_ends, plan, workspace=None, key_scales=None, indices=None,
                        topk_length=None, values=None, invalid_count=None):
    """nvfp4mla.fused_select_ragged through its op; returns (indices, topk_length)."""
    indices, topk_length, values = _topk_outputs(q, plan.rows, plan.k, indices, topk_length, values)
    torch.ops.nvfp4mla.fused_select_ragged(q, weights, keys, key_scales, row_starts, row_ends, plan.as_list(),
                                           _empty(q) if workspace is None else workspace, indices, topk_length,
                                           values, _counter(q, invalid_count))
    return indices, topk_length
