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

The format travels as its names and the layer scale (FormatConfig.cache_dtype/.rope/.scale_mode/
.layer_scale), the decode plan as DecodePlan.as_list(). The functions below take a FormatConfig
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
from .attention import PLAN_FIELDS, decode_with, extend_with, scores_with
from .records import LATENT_DIM
from .records import gather_records as _gather_records
from .records import scatter_records as _scatter_records
from .records import write_cache_format

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


def _plan(fields):
    key = tuple(fields)
    found = _plans.get(key)
    if found is None:
        if len(key) != len(PLAN_FIELDS):
            raise _lib.ArgumentError(f"plan must list {len(PLAN_FIELDS)} ints ({', '.join(PLAN_FIELDS)}), "
                                     f"got {len(key)}")
        found = _plans[key] = _lib.DecodePlanC(*key, 0)  # the library checks the workspace size
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
    fmt, rb = _format(cache_dtype, rope, scale_mode, layer_scale)
    decode_with(fmt, rb, _plan(plan), q, cache, indices, topk_length, sm_scale, workspace, output, lse, lse_base2)


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


# ---- functions over the ops ----------------------------------------------------------------------

def _names(config):
    return config.cache_dtype, config.rope, config.scale_mode, float(config.layer_scale)


def write_cache(kv_c, k_pe, cache, slot_mapping, config):
    """nvfp4mla.write_cache through torch.ops.nvfp4mla.write_cache (mutates cache)."""
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


def sparse_decode(q, cache, indices, topk_length, sm_scale, plan, workspace, out=None, lse=None, lse_base2=False):
    """nvfp4mla.sparse_decode through torch.ops.nvfp4mla.sparse_decode; returns (out, lse)."""
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
