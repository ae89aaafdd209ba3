"""Sparse MLA attention over a cache of records (DeepSeek Sparse Attention), FlashMLA-style.

Shapes (rows = query tokens):
  q            bfloat16 [rows, heads, 576]  (512 latent + 64 RoPE; uint16 BF16 bits in numpy/CuPy)
  cache        uint8 [num_blocks, block_size, record_bytes] (or [slots, record_bytes]), contiguous
  indices      int32 [rows, topk]  slot ids (block * block_size + offset); < 0 or >= capacity masked
  topk_length  int32 [rows] or None: entries at positions >= length are ignored
  out          bfloat16 [rows, heads, 512]; lse float32 [rows, heads] (natural log, or log2)
Every argument must be contiguous. GPU calls run on the caller's stream (torch's or CuPy's current
stream, or ``stream=``), never synchronize, and allocate only outputs left as None: pass ``out``
and ``lse`` (and a workspace) to capture them in a CUDA graph.
"""
import ctypes
import sys
from ctypes import byref, c_int, c_int32, c_uint64

from . import _lib, _tensor
from ._lib import Attention, DecodePlanC, lib
from ._tensor import CPU, CUDA, check, require_device, view
from .records import LATENT_DIM, QK_DIM, cache_geometry, resolve_stream

_BF16 = ("bfloat16", "uint16")
_WORKSPACE_DTYPES = ("uint8", "int8")
_STAGING_ALIGNMENT = 256
PLAN_FIELDS = ("head_group", "num_head_groups", "warps", "tile_tokens", "ctas_per_sm", "stages", "num_tiles",
               "splits", "tiles_per_split", "partial_bytes")


def built_with_cuda():
    """True when the loaded library has its CUDA kernels."""
    return bool(lib.nvfp4mla_built_with_cuda())


def cuda_device_count():
    """Usable CUDA devices (0 without CUDA, a driver or a GPU)."""
    return lib.nvfp4mla_cuda_device_count()


def cuda_sm_count(device=0):
    """SM count of a CUDA device (what the decode planner divides work by)."""
    out = c_int()
    _lib.call(lib.nvfp4mla_cuda_sm_count, _lib.int32(device, "cuda_sm_count", "device"), byref(out))
    return out.value


class DecodePlan:
    """How the split-KV decode kernel divides one (format, rows, heads, topk) problem.

    ``workspace_bytes`` is the scratch sparse_decode needs (0 when it needs none: splits == 1);
    the other fields are the planner's (head_group, num_head_groups, warps, tile_tokens,
    ctas_per_sm, stages, num_tiles, splits, tiles_per_split, partial_bytes). A plan is immutable
    and can be reused for every layer and step with the same shapes."""

    def __init__(self, c_plan, fmt, record_bytes, rows, heads, topk, sm_count):
        self._c = c_plan
        self._format = fmt
        self._fast = None  # the per-call constants of the torch fast path, made on first use
        self.record_bytes = record_bytes
        self.rows, self.heads, self.topk, self.sm_count = rows, heads, topk, sm_count
        for name in PLAN_FIELDS:
            setattr(self, name, getattr(c_plan, name))
        self.fields = tuple(getattr(c_plan, name) for name in PLAN_FIELDS)  # plain ints: traceable
        self.workspace_bytes = c_plan.workspace_bytes
        # The format, by name, for the torch ops' schemas.
        self.cache_dtype = _lib.CACHE_DTYPES[fmt.cache_dtype]
        self.rope = _lib.ROPES[fmt.rope]
        self.scale_mode = _lib.SCALE_MODES[fmt.scale_mode]
        self.layer_scale = fmt.layer_scale

    def as_list(self):
        """The plan as ints, for the torch ops: the planner's fields (PLAN_FIELDS order), then rows,
        heads, topk, sm_count and workspace_bytes."""
        return list(self.fields) + [self.rows, self.heads, self.topk, self.sm_count, self.workspace_bytes]

    @classmethod
    def from_list(cls, fields, fmt, record_bytes):
        """The plan of as_list() for the format struct `fmt` (what the torch ops rebuild)."""
        fields = [int(x) for x in fields]
        if len(fields) != len(PLAN_FIELDS) + 5:
            raise _lib.ArgumentError(f"plan must list {len(PLAN_FIELDS) + 5} ints (DecodePlan.as_list()), got "
                                     f"{len(fields)}")
        c_plan = DecodePlanC(*fields[:len(PLAN_FIELDS)], fields[-1])
        rows, heads, topk, sm_count = fields[len(PLAN_FIELDS):-1]
        return cls(c_plan, fmt, record_bytes, rows, heads, topk, sm_count)

    def numerics(self):
        """(rounds_k_to_bf16, weights_are_bf16) of the kernel this plan runs: which reference a result
        is compared against (CUDA builds)."""
        k, w = c_int32(), c_int32()
        _lib.call(lib.nvfp4mla_cuda_decode_numerics, byref(self._format), byref(self._c), byref(k), byref(w))
        return bool(k.value), bool(w.value)

    def __repr__(self):
        fields = ", ".join(f"{name}={getattr(self, name)}" for name in ("rows", "heads", "topk") + PLAN_FIELDS)
        return f"DecodePlan({fields}, workspace_bytes={self.workspace_bytes})"


def plan_decode(config, rows, heads, topk, sm_count=None, splits=0, device=None):
    """Plan sparse_decode for ``rows`` query rows of ``heads`` heads over ``topk`` entries.

    sm_count: the GPU's SM count (queried from ``device``, default 0, when None; give it on a
    machine without a GPU). splits: 0 for the planner's choice, else forced. Host-only: plan once
    per batch shape, outside CUDA-graph capture."""
    op = "plan_decode"
    fmt = config.format()
    rows, heads, topk = _lib.int32(rows, op, "rows"), _lib.int32(heads, op, "heads"), _lib.int32(topk, op, "topk")
    if sm_count is None:
        sm_count = cuda_sm_count(0 if device is None else device)
    sm_count, splits = _lib.int32(sm_count, op, "sm_count"), _lib.int32(splits, op, "splits")
    c_plan = DecodePlanC()
    _lib.call(lib.nvfp4mla_plan_decode, byref(fmt), rows, heads, topk, sm_count, splits, byref(c_plan))
    own = _lib.Format(fmt.cache_dtype, fmt.rope, fmt.scale_mode, fmt.layer_scale)
    return DecodePlan(c_plan, own, config.record_bytes, rows, heads, topk, sm_count)


def _problem(op, vq, vc, vi, vl, record_bytes, sm_scale, lse_base2, rows=None, heads=None, topk=None):
    """The C problem of checked views (shapes of q, cache, indices, topk_length)."""
    check(vq, op, "q", _BF16, (rows, heads, QK_DIM))
    rows, heads = vq.shape[0], vq.shape[1]
    capacity, _ = cache_geometry(op, vc, record_bytes)
    check(vi, op, "indices", ("int32",), (rows, topk))
    if vl is not None:
        check(vl, op, "topk_length", ("int32",), (rows,))
    return Attention(vq.ptr, _lib.int32(rows, op, "q's rows"), _lib.int32(heads, op, "q's heads"), vc.ptr, capacity,
                     vi.ptr, _lib.int32(vi.shape[1], op, "indices' topk"), vl.ptr if vl is not None else None,
                     float(sm_scale), 1 if lse_base2 else 0)


def _output(op, name, out, ref, shape, dtypes, stream):
    if out is None:
        out = _tensor.empty_like(ref, shape, dtypes[0])
    v = view(out, stream)
    check(v, op, name, dtypes, shape, writable=True)
    return out, v


def _views(stream, q, cache, indices, topk_length):
    return (view(q, stream), view(cache, stream), view(indices, stream),
            None if topk_length is None else view(topk_length, stream))


def _call_layout(struct_type):
    """A struct.Struct packing the fields of a ctypes Structure (nested ones flattened, pointers as
    unsigned 64-bit ints, padding where the C compiler puts it), checked against ctypes' layout."""
    import struct
    codes = {ctypes.c_void_p: "Q", ctypes.c_int32: "i", ctypes.c_int64: "q", ctypes.c_uint64: "Q",
             ctypes.c_float: "f"}
    parts, at = ["<"], 0

    def walk(t, base):
        nonlocal at
        for name, ftype in t._fields_:
            offset = base + getattr(t, name).offset
            parts.append("x" * (offset - at))
            if issubclass(ftype, ctypes.Structure):
                at = offset
                walk(ftype, offset)
                continue
            parts.append(codes[ftype])
            at = offset + ctypes.sizeof(ftype)

    walk(struct_type, 0)
    parts.append("x" * (ctypes.sizeof(struct_type) - at))
    layout = struct.Struct("".join(parts))
    assert layout.size == ctypes.sizeof(struct_type), (layout.format, ctypes.sizeof(struct_type))
    return layout


class _FastDecode:
    """What every eager call of one plan with torch tensors shares: the expected shapes, the torch
    dtypes, the packer of the C call's argument struct and the addresses of the plan's structs."""
    _layout = None

    def __init__(self, torch, plan):
        if _FastDecode._layout is None:
            _FastDecode._layout = _call_layout(_lib.SparseDecodeCall)
        self.tensor = torch.Tensor
        self.bf16, self.u8, self.i32, self.f32 = torch.bfloat16, torch.uint8, torch.int32, torch.float32
        rows, heads, topk = plan.rows, plan.heads, plan.topk
        self.q_shape, self.indices_shape, self.rows_shape = (rows, heads, QK_DIM), (rows, topk), (rows,)
        self.out_shape, self.lse_shape = (rows, heads, LATENT_DIM), (rows, heads)
        self.rows, self.heads, self.topk, self.record_bytes = rows, heads, topk, plan.record_bytes
        self.workspace_bytes = plan.workspace_bytes
        self.pack = self._layout.pack
        self.format_ptr, self.plan_ptr = ctypes.addressof(plan._format), ctypes.addressof(plan._c)
        self.current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # None: a CPU-only torch


def _decode_torch(plan, q, cache, indices, topk_length, sm_scale, workspace, out, lse, lse_base2, stream):
    """The per-step path for torch tensors with caller-provided outputs: the general path's checks
    read straight from the tensors and one C call with every argument in one packed struct (the
    overhead of an eager call, docs/PYTHON.md). Returns False, having done nothing, when any check
    fails: the general path then raises the precise error (or serves the case, e.g. uint16 BF16
    bits, or tensor subclasses)."""
    f = plan._fast
    if f is None:
        torch = sys.modules.get("torch")
        if torch is None or plan.rows is None:
            return False
        f = plan._fast = _FastDecode(torch, plan)
    T = f.tensor
    if not (type(q) is T and type(cache) is T and type(indices) is T and type(out) is T and type(lse) is T):
        return False
    device = q.get_device()
    if (device < 0 or q.dtype is not f.bf16 or q.shape != f.q_shape or not q.is_contiguous() or
            indices.dtype is not f.i32 or indices.shape != f.indices_shape or not indices.is_contiguous() or
            indices.get_device() != device or
            out.dtype is not f.bf16 or out.shape != f.out_shape or not out.is_contiguous() or
            out.get_device() != device or
            lse.dtype is not f.f32 or lse.shape != f.lse_shape or not lse.is_contiguous() or
            lse.get_device() != device or
            cache.dtype is not f.u8 or cache.dim() < 2 or cache.shape[-1] != f.record_bytes or
            not cache.is_contiguous() or cache.get_device() != device):
        return False
    length_ptr = 0
    if topk_length is not None:
        if not (type(topk_length) is T and topk_length.dtype is f.i32 and topk_length.shape == f.rows_shape and
                topk_length.is_contiguous() and topk_length.get_device() == device):
            return False
        length_ptr = topk_length.data_ptr()
    ws_ptr = ws_bytes = 0
    if workspace is not None:
        if not (type(workspace) is T and workspace.dtype is f.u8 and workspace.is_contiguous() and
                workspace.get_device() == device):
            return False
        ws_ptr, ws_bytes = workspace.data_ptr(), workspace.numel()
    if ws_bytes < f.workspace_bytes:
        return False
    status = lib.nvfp4mla_cuda_sparse_decode_call(f.pack(
        f.format_ptr, f.plan_ptr, q.data_ptr(), f.rows, f.heads, cache.data_ptr(), cache.numel() // f.record_bytes,
        indices.data_ptr(), f.topk, length_ptr, sm_scale, 1 if lse_base2 else 0, ws_ptr, ws_bytes, out.data_ptr(),
        lse.data_ptr(), device, f.current_stream(device) if stream is None else _tensor.stream_handle(stream)))
    if status:
        _lib.fail(status)
    return True


def sparse_decode(q, cache, indices, topk_length, sm_scale, plan, workspace, out=None, lse=None, *, lse_base2=False,
                  stream=None):
    """Split-KV sparse MLA decode on the GPU (FlashMLA's sparse decode over NVFP4/FP8/BF16 records).

    plan: from :func:`plan_decode` for this format and q's rows/heads and indices' topk.
    workspace: uint8, at least ``plan.workspace_bytes``, 256-byte aligned (None when that is 0).
    Returns (out bfloat16 [rows, heads, 512], lse float32 [rows, heads]); ``lse_base2`` gives log2.
    A given ``out`` must be 16-byte aligned, like q and the cache."""
    if (out is not None and lse is not None and
            _decode_torch(plan, q, cache, indices, topk_length, sm_scale, workspace, out, lse, lse_base2, stream)):
        return out, lse
    return _decode_checked(plan, q, cache, indices, topk_length, sm_scale, workspace, out, lse, lse_base2, stream)


def _decode_checked(plan, q, cache, indices, topk_length, sm_scale, workspace, out, lse, lse_base2, stream):
    """sparse_decode through the general path: any tensor type, precise errors, outputs allocated."""
    op = "sparse_decode"
    s = resolve_stream(stream, q)
    vq, vc, vi, vl = _views(s, q, cache, indices, topk_length)
    problem = _problem(op, vq, vc, vi, vl, plan.record_bytes, sm_scale, lse_base2, plan.rows, plan.heads, plan.topk)
    rows, heads = problem.rows, problem.heads
    require_device(op, (("q", vq), ("cache", vc), ("indices", vi), ("topk_length", vl)), CUDA)
    out, vo = _output(op, "out", out, vq, (rows, heads, LATENT_DIM), _BF16, s)
    lse, vs = _output(op, "lse", lse, vq, (rows, heads), ("float32",), s)
    named = [("q", vq), ("out", vo), ("lse", vs)]
    ws_ptr, ws_bytes = 0, 0
    if workspace is not None:
        vw = view(workspace, s)
        check(vw, op, "workspace", ("uint8",), (None,) * len(vw.shape))
        ws_ptr, ws_bytes = vw.ptr, _numel(vw.shape)
        named.append(("workspace", vw))
    if ws_bytes < plan.workspace_bytes:
        raise _lib.ArgumentError(f"{op}: the plan needs a workspace of {plan.workspace_bytes} bytes, got {ws_bytes}")
    device = require_device(op, named, CUDA)
    _lib.call(lib.nvfp4mla_cuda_sparse_decode, byref(plan._format), byref(problem), byref(plan._c), ws_ptr, ws_bytes,
              vo.ptr, vs.ptr, device, s)
    return out, lse


def extend_staging_bytes(capacity, rows, topk):
    """Bytes of the workspace of a staged :func:`sparse_extend` over a cache of ``capacity`` slots
    with ``rows`` query rows of ``topk`` indices (CUDA builds; host-only, launches nothing): a
    dequantized BF16 record per slot when rows * topk >= capacity, else room for rows * topk
    records with the per-slot bookkeeping and the rewritten indices."""
    size = c_uint64()
    op = "extend_staging_bytes"
    _lib.call(lib.nvfp4mla_cuda_extend_staging_bytes, _lib.int64(capacity, op, "capacity"),
              _lib.int32(rows, op, "rows"), _lib.int32(topk, op, "topk"), byref(size))
    return size.value


def sparse_extend(q, cache, indices, topk_length, sm_scale, config, out=None, lse=None, *, lse_base2=False,
                  stream=None, workspace=None):
    """Sparse MLA extend/prefill on the GPU: each row (prefill chunk token, MTP verifier token)
    runs one softmax over its whole top-k list; no plan.

    workspace: None reads the records straight from the cache. A uint8 (or int8) device buffer of
    at least :func:`extend_staging_bytes` (cache capacity, rows, topk) bytes, 256-byte aligned,
    runs the staged extend instead: each attended record is dequantized once into a BF16 record
    there, then the rows attend over those (for prefill chunks, whose rows x topk entries are many
    more than the distinct slots they attend).
    Returns (out bfloat16 [rows, heads, 512], lse float32 [rows, heads])."""
    return extend_with(config.format(), config.record_bytes, q, cache, indices, topk_length, sm_scale, out, lse,
                       lse_base2, stream, workspace)


def extend_with(fmt, record_bytes, q, cache, indices, topk_length, sm_scale, out, lse, lse_base2=False, stream=None,
                workspace=None):
    """sparse_extend with the format given as the C struct (what the torch ops pass)."""
    op = "sparse_extend"
    s = resolve_stream(stream, q)
    vq, vc, vi, vl = _views(s, q, cache, indices, topk_length)
    problem = _problem(op, vq, vc, vi, vl, record_bytes, sm_scale, lse_base2)
    rows, heads = problem.rows, problem.heads
    vw = None
    if workspace is not None:
        vw = view(workspace, s)
        check(vw, op, "workspace", _WORKSPACE_DTYPES, (None,) * len(vw.shape))
    require_device(op, (("q", vq), ("cache", vc), ("indices", vi), ("topk_length", vl), ("workspace", vw)), CUDA)
    out, vo = _output(op, "out", out, vq, (rows, heads, LATENT_DIM), _BF16, s)
    lse, vs = _output(op, "lse", lse, vq, (rows, heads), ("float32",), s)
    device = require_device(op, (("q", vq), ("out", vo), ("lse", vs)), CUDA)
    if vw is None:
        _lib.call(lib.nvfp4mla_cuda_sparse_extend, byref(fmt), byref(problem), vo.ptr, vs.ptr, device, s)
        return out, lse
    ws_bytes = _staging_workspace_bytes(op, vw, problem)
    _lib.call(lib.nvfp4mla_cuda_sparse_extend_staged, byref(fmt), byref(problem), vw.ptr, ws_bytes, vo.ptr, vs.ptr,
              device, s)
    return out, lse


def _staging_workspace_bytes(op, vw, problem):
    """The size of a staged extend's workspace view, refused when short or misaligned."""
    need = extend_staging_bytes(problem.capacity, problem.rows, problem.topk)
    have = _numel(vw.shape)
    if have < need:
        raise _lib.ArgumentError(f"{op}: the staged extend needs a workspace of {need} bytes (capacity "
                                 f"{problem.capacity}, {problem.rows} rows, topk {problem.topk}), got {have}")
    if vw.ptr % _STAGING_ALIGNMENT:
        raise _lib.ArgumentError(f"{op}: workspace must be {_STAGING_ALIGNMENT}-byte aligned, got address "
                                 f"{vw.ptr:#x}")
    return have


def sparse_scores(q, cache, indices, topk_length, sm_scale, config, out=None, *, stream=None):
    """Attention logits of every index position on the GPU (for evaluation, not serving):
    scores float32 [rows, heads, topk] = sm_scale * q . K[indices], -inf where masked."""
    return scores_with(config.format(), config.record_bytes, q, cache, indices, topk_length, sm_scale, out, stream)


def scores_with(fmt, record_bytes, q, cache, indices, topk_length, sm_scale, out, stream=None):
    """sparse_scores with the format given as the C struct (what the torch ops pass)."""
    op = "sparse_scores"
    s = resolve_stream(stream, q)
    vq, vc, vi, vl = _views(s, q, cache, indices, topk_length)
    problem = _problem(op, vq, vc, vi, vl, record_bytes, sm_scale, False)
    require_device(op, (("q", vq), ("cache", vc), ("indices", vi), ("topk_length", vl)), CUDA)
    out, vo = _output(op, "out", out, vq, (problem.rows, problem.heads, problem.topk), ("float32",), s)
    device = require_device(op, (("q", vq), ("out", vo)), CUDA)
    _lib.call(lib.nvfp4mla_cuda_sparse_scores, byref(fmt), byref(problem), vo.ptr, device, s)
    return out


def sparse_mla_reference(q, cache, indices, topk_length, sm_scale, config, *, bf16_operands=False, lse_base2=False):
    """CPU reference of sparse_decode/sparse_extend (fp64 accumulation over the dequantized records).
    CPU tensors in; returns (out float32 [rows, heads, 512], lse float32 [rows, heads]).
    ``bf16_operands`` rounds K and V to BF16 first, as kernels with BF16 matrix operands do
    (see DecodePlan.numerics())."""
    op = "sparse_mla_reference"
    fmt = config.format()
    vq, vc, vi, vl = _views(None, q, cache, indices, topk_length)
    problem = _problem(op, vq, vc, vi, vl, config.record_bytes, sm_scale, lse_base2)
    require_device(op, [("q", vq), ("cache", vc), ("indices", vi), ("topk_length", vl)], CPU)
    out, vo = _output(op, "out", None, vq, (problem.rows, problem.heads, LATENT_DIM), ("float32",), None)
    lse, vs = _output(op, "lse", None, vq, (problem.rows, problem.heads), ("float32",), None)
    _lib.call(lib.nvfp4mla_sparse_mla_reference, byref(fmt), byref(problem), 1 if bf16_operands else 0, vo.ptr,
              vs.ptr)
    return out, lse


def sparse_scores_reference(q, cache, indices, topk_length, sm_scale, config, *, bf16_operands=False):
    """CPU reference of sparse_scores: float32 [rows, heads, topk], -inf where masked."""
    op = "sparse_scores_reference"
    fmt = config.format()
    vq, vc, vi, vl = _views(None, q, cache, indices, topk_length)
    problem = _problem(op, vq, vc, vi, vl, config.record_bytes, sm_scale, False)
    require_device(op, [("q", vq), ("cache", vc), ("indices", vi), ("topk_length", vl)], CPU)
    out, vo = _output(op, "out", None, vq, (problem.rows, problem.heads, problem.topk), ("float32",), None)
    _lib.call(lib.nvfp4mla_sparse_scores_reference, byref(fmt), byref(problem), 1 if bf16_operands else 0, vo.ptr)
    return out


def _numel(shape):
    n = 1
    for size in shape:
        n *= size
    return n
