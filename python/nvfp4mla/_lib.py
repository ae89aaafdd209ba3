"""Loads libnvfp4mla_c (the C ABI of include/nvfp4mla/c_api.h) and declares its functions.

The package is pure Python over this one shared library, so the same build serves every Python
version (ctypes is part of the standard library). Search order for the library:

1. ``$NVFP4MLA_LIBRARY`` (a path to the file),
2. next to this package (``nvfp4mla/libnvfp4mla_c.so``),
3. the source tree's build folder (``<repo>/build/libnvfp4mla_c.so``, for a package used from
   ``<repo>/python``),
4. the system's library path (an installed library).
"""
import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_size_t,
                    c_uint64, c_void_p)

C_API_VERSION = 4
LIBRARY_FILE = "libnvfp4mla_c.so"


class Error(RuntimeError):
    """A failure reported by nvfp4mla; the message is the library's own."""


class ArgumentError(Error, ValueError):
    """An argument the package rejected before calling the library (shape, dtype, stride, device)."""


class UnsupportedError(Error):
    """A GPU function called on a library built without CUDA."""


def _candidates():
    env = os.environ.get("NVFP4MLA_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, LIBRARY_FILE)
    yield os.path.join(os.path.dirname(os.path.dirname(here)), "build", LIBRARY_FILE)
    found = ctypes.util.find_library("nvfp4mla_c")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        lib.nvfp4mla_c_api_version.restype = c_int
        version = lib.nvfp4mla_c_api_version()
        if version != C_API_VERSION:
            raise ImportError(f"{path} implements C API version {version}, this package needs {C_API_VERSION}: "
                              "rebuild the library (cmake --build build --target nvfp4mla_c)")
        lib._nvfp4mla_path = path
        return lib
    raise ImportError(f"nvfp4mla: {LIBRARY_FILE} not found (tried: {'; '.join(tried) or 'nothing'}). Build it with "
                      "`bash scripts/test.sh` (or `cmake --build build --target nvfp4mla_c`) in the source tree, "
                      "or point NVFP4MLA_LIBRARY at the file")


# ---- structs of c_api.h --------------------------------------------------------------------------

class FormatOptions(Structure):
    _fields_ = [("cache_dtype", c_char_p), ("rope", c_char_p), ("scale_mode", c_char_p), ("scales_file", c_char_p),
                ("has_layer", c_int32), ("layer", c_int32), ("has_layer_scale", c_int32), ("layer_scale", c_float),
                ("unit_scale_for_missing_layer", c_int32), ("env_dynamic_scale", c_char_p),
                ("env_fp8_rope", c_char_p), ("env_scales_file", c_char_p)]


class Format(Structure):
    _fields_ = [("cache_dtype", c_int32), ("rope", c_int32), ("scale_mode", c_int32), ("layer_scale", c_float)]


class Attention(Structure):
    _fields_ = [("q", c_void_p), ("rows", c_int32), ("heads", c_int32), ("cache", c_void_p), ("capacity", c_int64),
                ("indices", c_void_p), ("topk", c_int32), ("topk_length", c_void_p), ("sm_scale", c_float),
                ("lse_base2", c_int32)]


class DecodePlanC(Structure):
    _fields_ = [("head_group", c_int32), ("num_head_groups", c_int32), ("warps", c_int32), ("tile_tokens", c_int32),
                ("ctas_per_sm", c_int32), ("stages", c_int32), ("num_tiles", c_int32), ("splits", c_int32),
                ("tiles_per_split", c_int32), ("partial_bytes", c_int32), ("workspace_bytes", c_uint64)]


class VerifierBatch(Structure):
    _fields_ = [("num_speculative_tokens", c_int32), ("max_query_len", c_int32), ("any_prefill", c_int32),
                ("max_q_per_request", c_int32), ("decode_rows", c_int64), ("decode_row_budget", c_int64)]


class ScratchRequest(Structure):
    _fields_ = [("cache_dtype", c_int32), ("rope", c_int32), ("scale_mode", c_int32), ("num_heads", c_int32),
                ("dcp_world_size", c_int32), ("topk", c_int32), ("max_num_seqs", c_int32),
                ("max_num_batched_tokens", c_int64), ("num_speculative_tokens", c_int32), ("mode", c_int32),
                ("partial_bf16", c_int32), ("splits", c_int32), ("sm_count", c_int32),
                ("compute_capability", c_int32)]


class ScratchPlanC(Structure):
    _fields_ = [("q_per_request", c_int32), ("decode_rows", c_int64), ("heads", c_int32), ("splits", c_int32),
                ("partial_bytes", c_int32), ("tmp_output_bytes", c_uint64), ("tmp_lse_bytes", c_uint64),
                ("output_bytes", c_uint64), ("final_lse_bytes", c_uint64), ("total_bytes", c_uint64)]


class CapacityRequest(Structure):
    _fields_ = [("cache_dtype", c_int32), ("rope", c_int32), ("scale_mode", c_int32), ("layers", c_int32),
                ("indexer_bytes_per_token", c_int32), ("page_size", c_int32), ("memory_gib", c_double),
                ("reserved_gib", c_double)]


class CapacityPlanC(Structure):
    _fields_ = [("bytes_per_token", c_int64), ("pages", c_int64), ("tokens", c_int64),
                ("max_single_request_tokens", c_int64)]


class StoreOptions(Structure):
    _fields_ = [("record_identity", c_char_p), ("record_bytes", c_int32), ("tokens_per_block", c_int32),
                ("layers_in_block", c_int32), ("model_identity", c_char_p), ("tp_rank", c_int32),
                ("tp_size", c_int32), ("dcp_rank", c_int32), ("dcp_size", c_int32),
                ("dram_capacity_bytes", c_uint64), ("disk_capacity_bytes", c_uint64), ("durable", c_int32),
                ("io_threads", c_int32)]


class SparseDecodeCall(Structure):
    _fields_ = [("format", c_void_p), ("plan", c_void_p), ("problem", Attention), ("workspace", c_void_p),
                ("workspace_bytes", c_uint64), ("out", c_void_p), ("lse", c_void_p), ("device", c_int32),
                ("stream", c_void_p)]


class IndexCache(Structure):
    _fields_ = [("data", c_void_p), ("num_pages", c_int64), ("page_size", c_int64)]


class IndexerRagged(Structure):
    _fields_ = [("q", c_void_p), ("weights", c_void_p), ("rows", c_int64), ("heads", c_int32),
                ("key_values", c_void_p), ("key_value_stride", c_int64), ("key_scales", c_void_p),
                ("key_scale_stride", c_int64), ("num_keys", c_int64), ("row_starts", c_void_p),
                ("row_ends", c_void_p), ("logits", c_void_p), ("logits_stride", c_int64)]


class IndexerPaged(Structure):
    _fields_ = [("q", c_void_p), ("weights", c_void_p), ("requests", c_int64), ("next_n", c_int32),
                ("heads", c_int32), ("cache", c_void_p), ("num_pages", c_int64), ("page_size", c_int64),
                ("block_table", c_void_p), ("block_table_stride", c_int64), ("context_lens", c_void_p),
                ("logits", c_void_p), ("logits_stride", c_int64)]


class Topk(Structure):
    _fields_ = [("values", c_void_p), ("rows", c_int32), ("k", c_int32), ("columns", c_int64), ("stride", c_int64),
                ("lengths", c_void_p), ("positions", c_void_p), ("position_offset", c_int64),
                ("block_table", c_void_p), ("requests", c_int64), ("pages", c_int64), ("table_stride", c_int64),
                ("page_size", c_int32), ("rows_per_request", c_int32), ("capacity", c_int64)]


class TopkOutputs(Structure):
    _fields_ = [("indices", c_void_p), ("topk_length", c_void_p), ("values", c_void_p)]


class TopkPlanC(Structure):
    _fields_ = [("kernel", c_int32), ("segments", c_int32), ("segment_len", c_int64), ("rows", c_int32),
                ("workspace_bytes", c_uint64), ("candidates", c_int64)]


class FusedSelect(Structure):
    _fields_ = [("keys", IndexerPaged), ("max_context", c_int64), ("k", c_int32), ("slot_ids", c_int32)]


class FusedSelectRagged(Structure):
    _fields_ = [("keys", IndexerRagged), ("max_length", c_int64), ("k", c_int32)]


class FusedSelectPlanC(Structure):
    _fields_ = [("chunk", c_int64), ("chunks", c_int64), ("logits_stride", c_int64), ("sm_count", c_int32),
                ("workspace_bytes", c_uint64)]


_STORE_STAT_FIELDS = ("dram_blocks", "dram_bytes", "dram_capacity_bytes", "dram_hits", "dram_misses", "dram_puts",
                      "dram_evictions", "dram_rejected", "disk_blocks", "disk_bytes", "disk_capacity_bytes",
                      "disk_hits", "disk_misses", "disk_corrupt", "disk_read_errors", "disk_puts",
                      "disk_put_failures", "disk_evictions", "disk_quarantined_at_open")


class StoreStatsC(Structure):
    _fields_ = [(name, c_uint64) for name in _STORE_STAT_FIELDS]


# ---- function signatures ---------------------------------------------------------------------------

P = c_void_p
_P_FORMAT = POINTER(Format)
_P_ATTN = POINTER(Attention)
_P_PLAN = POINTER(DecodePlanC)
_P_STR = POINTER(c_char_p)
_P_I32 = POINTER(c_int32)

_SIGNATURES = {
    "nvfp4mla_last_error": (c_char_p, []),
    "nvfp4mla_built_with_cuda": (c_int, []),
    "nvfp4mla_dims": (None, [POINTER(c_int32), POINTER(c_int32)]),
    "nvfp4mla_index_key_record_bytes": (c_int32, []),
    "nvfp4mla_cuda_device_count": (c_int, []),
    "nvfp4mla_cuda_sm_count": (c_int, [c_int, POINTER(c_int)]),
    "nvfp4mla_config_create": (c_int, [POINTER(FormatOptions), POINTER(P)]),
    "nvfp4mla_config_destroy": (None, [P]),
    "nvfp4mla_config_format": (c_int, [P, _P_FORMAT]),
    "nvfp4mla_config_spec": (c_int, [P, _P_FORMAT]),
    "nvfp4mla_config_layer_scale_for": (c_int, [P, c_int32, POINTER(c_float)]),
    "nvfp4mla_config_layer": (c_int, [P, _P_I32, _P_I32]),
    "nvfp4mla_config_identity": (c_int, [P, c_int32, _P_STR]),
    "nvfp4mla_config_describe": (c_int, [P, _P_STR]),
    "nvfp4mla_config_scales_file": (c_int, [P, _P_STR]),
    "nvfp4mla_format_record_bytes": (c_int, [_P_FORMAT, _P_I32]),
    "nvfp4mla_encode": (c_int, [_P_FORMAT, c_int32, P, c_int64, P, c_int64, c_int64, P]),
    "nvfp4mla_decode": (c_int, [_P_FORMAT, P, c_int64, P, P]),
    "nvfp4mla_write_cache": (c_int, [_P_FORMAT, c_int32, P, P, c_int64, P, P, c_int64]),
    "nvfp4mla_gather_records": (c_int, [c_int32, P, c_int64, P, c_int64, P, P]),
    "nvfp4mla_scatter_records": (c_int, [c_int32, P, P, c_int64, P, c_int64, P]),
    "nvfp4mla_sparse_mla_reference": (c_int, [_P_FORMAT, _P_ATTN, c_int32, P, P]),
    "nvfp4mla_sparse_scores_reference": (c_int, [_P_FORMAT, _P_ATTN, c_int32, P]),
    "nvfp4mla_plan_decode": (c_int, [_P_FORMAT, c_int32, c_int32, c_int32, c_int32, c_int32, _P_PLAN]),
    "nvfp4mla_cuda_write_cache": (c_int, [_P_FORMAT, c_int32, P, c_int64, P, c_int64, c_int64, P, P, c_int64, P,
                                          c_int32, P]),
    "nvfp4mla_cuda_gather_records": (c_int, [c_int32, P, c_int64, P, c_int64, P, P, c_int32, P]),
    "nvfp4mla_cuda_scatter_records": (c_int, [c_int32, P, P, c_int64, P, c_int64, P, c_int32, P]),
    "nvfp4mla_cuda_sparse_decode": (c_int, [_P_FORMAT, _P_ATTN, _P_PLAN, P, c_uint64, P, P, c_int32, P]),
    "nvfp4mla_cuda_sparse_extend": (c_int, [_P_FORMAT, _P_ATTN, P, P, c_int32, P]),
    "nvfp4mla_cuda_extend_staging_bytes": (c_int, [c_int64, c_int32, c_int32, POINTER(c_uint64)]),
    "nvfp4mla_cuda_sparse_extend_staged": (c_int, [_P_FORMAT, _P_ATTN, P, c_uint64, P, P, c_int32, P]),
    "nvfp4mla_cuda_sparse_scores": (c_int, [_P_FORMAT, _P_ATTN, P, c_int32, P]),
    "nvfp4mla_cuda_decode_numerics": (c_int, [_P_FORMAT, _P_PLAN, _P_I32, _P_I32]),
    "nvfp4mla_parse_spec_decode_mode": (c_int, [c_char_p, _P_I32]),
    "nvfp4mla_decode_qualified": (c_int, [c_int32, _P_I32]),
    "nvfp4mla_plan_route": (c_int, [c_int32, c_int32, POINTER(VerifierBatch), _P_I32, _P_STR]),
    "nvfp4mla_decode_q_per_request": (c_int, [c_int32, c_int32, c_int32, _P_I32]),
    "nvfp4mla_verifier_rows": (c_int, [P, c_int64, c_int32, c_int32, c_int64, P, P]),
    "nvfp4mla_plan_scratch": (c_int, [POINTER(ScratchRequest), POINTER(ScratchPlanC)]),
    "nvfp4mla_plan_capacity": (c_int, [POINTER(CapacityRequest), POINTER(CapacityPlanC)]),
    "nvfp4mla_store_open": (c_int, [c_char_p, POINTER(StoreOptions), POINTER(P)]),
    "nvfp4mla_store_close": (None, [P]),
    "nvfp4mla_store_block_bytes": (c_int, [P, POINTER(c_uint64)]),
    "nvfp4mla_store_dir": (c_int, [P, _P_STR]),
    "nvfp4mla_store_put": (c_int, [P, P, c_size_t, P, c_size_t]),
    "nvfp4mla_store_get": (c_int, [P, P, c_size_t, P, c_size_t, _P_I32]),
    "nvfp4mla_store_contains": (c_int, [P, P, c_size_t, _P_I32]),
    "nvfp4mla_store_put_many": (c_int, [P, c_int64, P, P, P, P]),
    "nvfp4mla_store_get_many": (c_int, [P, c_int64, P, P, P, P]),
    "nvfp4mla_store_item_error": (c_char_p, [c_int64]),
    "nvfp4mla_store_stats_get": (c_int, [P, POINTER(StoreStatsC)]),
    "nvfp4mla_cuda_sparse_decode_call": (c_int, [c_char_p]),  # a packed SparseDecodeCall (attention.py)
    "nvfp4mla_index_key_encode": (c_int, [c_int32, P, c_int64, c_int64, P]),
    "nvfp4mla_write_index_cache": (c_int, [c_int32, P, c_int64, P, POINTER(IndexCache)]),
    "nvfp4mla_gather_index_records": (c_int, [POINTER(IndexCache), P, c_int64, P]),
    "nvfp4mla_gather_index_keys": (c_int, [POINTER(IndexCache), P, c_int64, P, P]),
    "nvfp4mla_indexer_logits_ragged_reference": (c_int, [POINTER(IndexerRagged)]),
    "nvfp4mla_indexer_logits_paged_reference": (c_int, [POINTER(IndexerPaged)]),
    "nvfp4mla_plan_topk": (c_int, [c_int32, c_int64, c_int32, POINTER(TopkPlanC)]),
    "nvfp4mla_topk_reference": (c_int, [POINTER(Topk), POINTER(TopkOutputs)]),
    "nvfp4mla_plan_fused_select": (c_int, [c_int64, c_int32, c_int32, c_int64, c_int64, c_int32, c_int64, c_int32,
                                           POINTER(FusedSelectPlanC)]),
    "nvfp4mla_plan_fused_select_ragged": (c_int, [c_int64, c_int32, c_int64, c_int32, c_int64, c_int32,
                                                  POINTER(FusedSelectPlanC)]),
    "nvfp4mla_fused_select_reference": (c_int, [POINTER(FusedSelect), POINTER(FusedSelectPlanC),
                                                POINTER(TopkOutputs)]),
    "nvfp4mla_fused_select_ragged_reference": (c_int, [POINTER(FusedSelectRagged), POINTER(FusedSelectPlanC),
                                                       POINTER(TopkOutputs)]),
    "nvfp4mla_cuda_write_index_cache": (c_int, [c_int32, P, c_int64, c_int64, P, POINTER(IndexCache), P, c_int32,
                                                P]),
    "nvfp4mla_cuda_gather_index_records": (c_int, [POINTER(IndexCache), P, c_int64, P, P, c_int32, P]),
    "nvfp4mla_cuda_gather_index_keys": (c_int, [POINTER(IndexCache), P, c_int64, P, P, P, c_int32, P]),
    "nvfp4mla_cuda_indexer_logits_ragged": (c_int, [POINTER(IndexerRagged), P, c_int32, P]),
    "nvfp4mla_cuda_indexer_logits_paged": (c_int, [POINTER(IndexerPaged), P, c_int32, P]),
    "nvfp4mla_cuda_topk": (c_int, [POINTER(Topk), POINTER(TopkPlanC), P, c_uint64, POINTER(TopkOutputs), P, c_int32,
                                   P]),
    "nvfp4mla_cuda_fused_select": (c_int, [POINTER(FusedSelect), POINTER(FusedSelectPlanC), P, c_uint64,
                                           POINTER(TopkOutputs), P, c_int32, P]),
    "nvfp4mla_cuda_fused_select_ragged": (c_int, [POINTER(FusedSelectRagged), POINTER(FusedSelectPlanC), P,
                                                  c_uint64, POINTER(TopkOutputs), P, c_int32, P]),
}

lib = _load()
for _name, (_restype, _argtypes) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes

_ERRORS = {1: Error, 2: Error, 3: UnsupportedError}


def fail(status):
    """Raises the exception for a non-zero status of the last call on this thread."""
    message = lib.nvfp4mla_last_error().decode("utf-8", "replace")
    raise _ERRORS.get(status, Error)(message)


def call(fn, *args):
    """Calls a C API function that returns a status; raises Error with the library's message."""
    status = fn(*args)
    if status:
        fail(status)


def _ranged(value, op, name, low, high, ctype):
    # ctypes silently keeps the low bits of an int too wide for a C field or argument: check first.
    v = int(value)
    if not low <= v <= high:
        raise ArgumentError(f"{op}: {name} must be in {low}..{high} (a C {ctype}), got {v}")
    return v


def int32(value, op, name):
    """`value` as an int that fits a C int32_t; raises ArgumentError naming `op` and `name`."""
    return _ranged(value, op, name, -2 ** 31, 2 ** 31 - 1, "int32_t")


def int64(value, op, name):
    """`value` as an int that fits a C int64_t; raises ArgumentError naming `op` and `name`."""
    return _ranged(value, op, name, -2 ** 63, 2 ** 63 - 1, "int64_t")


def uint64(value, op, name):
    """`value` as an int that fits a C uint64_t; raises ArgumentError naming `op` and `name`."""
    return _ranged(value, op, name, 0, 2 ** 64 - 1, "uint64_t")


def text(ptr):
    """A handed-out C string (c_char_p value) as str."""
    return ptr.value.decode("utf-8") if isinstance(ptr, c_char_p) else ptr.decode("utf-8")


def _dims():
    latent, rope = c_int32(), c_int32()
    lib.nvfp4mla_dims(ctypes.byref(latent), ctypes.byref(rope))
    return latent.value, rope.value


# The geometry every record format shares (format.h), and the codes of c_api.h.
LATENT_DIM, ROPE_DIM = _dims()
INDEX_KEY_RECORD_BYTES = lib.nvfp4mla_index_key_record_bytes()
CACHE_DTYPES = ("bf16", "fp8_ds_mla", "nvfp4_ds_mla")
ROPES = ("bf16", "fp8")
SCALE_MODES = ("implicit", "static", "dynamic")
SPEC_DECODE_MODES = ("off", "auto", "on")
INPUT_TYPES = {"bfloat16": 0, "uint16": 0, "float16": 1, "float32": 2}
