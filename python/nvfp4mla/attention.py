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
import sys
from ctypes import byref, c_int, c_int32

from . import _lib, _tensor
from ._lib import Attention, DecodePlanC, lib
from ._tensor import CPU, CUDA, check, require_device, view
from .records import LATENT_DIM, QK_DIM, cache_geometry, resolve_stream

_BF16 = ("bfloat16", "uint16")
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
    _lib.call(lib.nvfp4mla_cuda_sm_count, int(device), byref(out))
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
        """The planner's fields as ints (PLAN_FIELDS order), for the torch ops."""
        return list(self.fields)

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
    fmt = config.format()
    if sm_count is None:
        sm_count = cuda_sm_count(0 if device is None else device)
    c_plan = DecodePlanC()
    _lib.call(lib.nvfp4mla_plan_decode, byref(fmt), int(rows), int(heads), int(topk), int(sm_count), int(splits),
              byref(c_plan))
    own = _lib.Format(fmt.cache_dtype, fmt.rope, fmt.scale_mode, fmt.layer_scale)
    return DecodePlan(c_plan, own, config.record_bytes, int(rows), int(heads), int(topk), int(sm_count))


def _problem(op, vq, vc, vi, vl, record_bytes, sm_scale, lse_base2, rows=None, heads=None, topk=None):
    """The C problem of checked views (shapes of q, cache, indices, topk_length)."""
    check(vq, op, "q", _BF16, (rows, heads, QK_DIM))
    rows, heads = vq.shape[0], vq.shape[1]
    capacity, _ = cache_geometry(op, vc, record_bytes)
    check(vi, op, "indices", ("int32",), (rows, topk))
    if vl is not None:
        check(vl, op, "topk_length", ("int32",), (rows,))
    return Attention(vq.ptr, rows, heads, vc.ptr, capacity, vi.ptr, vi.shape[1], vl.ptr if vl is not None else None,
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


def _ptr(t, Tensor, dtype, shape, device):
    """data_ptr of a contiguous torch tensor with this dtype, shape and CUDA device, else None."""
    if (isinstance(t, Tensor) and t.dtype is dtype and t.shape == shape and t.get_device() == device and
            t.is_contiguous()):
        return t.data_ptr()
    return None


def _decode_torch(torch, fmt, record_bytes, c_plan, q, cache, indices, topk_length, sm_scale, workspace, out, lse,
                  lse_base2, stream, shape):
    """The per-step path for torch tensors with caller-provided outputs: the same checks as the
    general path, read straight from the tensors (the overhead of an eager call, docs/PERF.md).
    Returns False, having done nothing, when any check fails: the general path then raises the
    precise error (or serves the case, e.g. uint16 BF16 bits)."""
    Tensor = torch.Tensor
    if not isinstance(q, Tensor) or q.dim() != 3 or not isinstance(indices, Tensor) or indices.dim() != 2:
        return False
    rows, heads, topk = shape
    rows = q.shape[0] if rows is None else rows
    heads = q.shape[1] if heads is None else heads
    topk = indices.shape[1] if topk is None else topk
    device = q.get_device()
    if device < 0 or not isinstance(cache, Tensor) or cache.dim() < 2:
        return False
    cache_shape = cache.shape
    q_ptr = _ptr(q, Tensor, torch.bfloat16, (rows, heads, QK_DIM), device)
    cache_ptr = _ptr(cache, Tensor, torch.uint8, cache_shape, device) if cache_shape[-1] == record_bytes else None
    indices_ptr = _ptr(indices, Tensor, torch.int32, (rows, topk), device)
    out_ptr = _ptr(out, Tensor, torch.bfloat16, (rows, heads, LATENT_DIM), device)
    lse_ptr = _ptr(lse, Tensor, torch.float32, (rows, heads), device)
    length_ptr = None if topk_length is None else _ptr(topk_length, Tensor, torch.int32, (rows,), device)
    ws_ptr, ws_bytes = None, 0
    if workspace is not None:
        if not isinstance(workspace, Tensor):
            return False
        ws_bytes = workspace.numel()
        ws_ptr = _ptr(workspace, Tensor, torch.uint8, workspace.shape, device)
        if ws_ptr is None:
            return False
    if (None in (q_ptr, cache_ptr, indices_ptr, out_ptr, lse_ptr) or (topk_length is not None and length_ptr is None)
            or ws_bytes < c_plan.workspace_bytes):
        return False
    s = torch._C._cuda_getCurrentRawStream(device) if stream is None else _tensor.stream_handle(stream)
    problem = Attention(q_ptr, rows, heads, cache_ptr, cache.numel() // record_bytes, indices_ptr, topk, length_ptr,
                        float(sm_scale), 1 if lse_base2 else 0)
    _lib.call(lib.nvfp4mla_cuda_sparse_decode, byref(fmt), byref(problem), byref(c_plan), ws_ptr, ws_bytes, out_ptr,
              lse_ptr, device, s)
    return True


def sparse_decode(q, cache, indices, topk_length, sm_scale, plan, workspace, out=None, lse=None, *, lse_base2=False,
                  stream=None):
    """Split-KV sparse MLA decode on the GPU (FlashMLA's sparse decode over NVFP4/FP8/BF16 records).

    plan: from :func:`plan_decode` for this format and q's rows/heads and indices' topk.
    workspace: uint8, at least ``plan.workspace_bytes``, 256-byte aligned (None when that is 0).
    Returns (out bfloat16 [rows, heads, 512], lse float32 [rows, heads]); ``lse_base2`` gives log2."""
    return decode_with(plan._format, plan.record_bytes, plan._c, q, cache, indices, topk_length, sm_scale, workspace,
                       out, lse, lse_base2, stream, (plan.rows, plan.heads, plan.topk))


def decode_with(fmt, record_bytes, c_plan, q, cache, indices, topk_length, sm_scale, workspace, out, lse,
                lse_base2=False, stream=None, shape=(None, None, None)):
    """sparse_decode with the format and plan given as C structs (what the torch ops pass); `shape`
    is the plan's (rows, heads, topk) when known."""
    torch = sys.modules.get("torch")
    if (torch is not None and out is not None and lse is not None and
            _decode_torch(torch, fmt, record_bytes, c_plan, q, cache, indices, topk_length, sm_scale, workspace, out,
                          lse, lse_base2, stream, shape)):
        return out, lse
    op = "sparse_decode"
    s = resolve_stream(stream, q)
    vq, vc, vi, vl = _views(s, q, cache, indices, topk_length)
    problem = _problem(op, vq, vc, vi, vl, record_bytes, sm_scale, lse_base2, *shape)
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
    if ws_bytes < c_plan.workspace_bytes:
        raise _lib.ArgumentError(f"{op}: the plan needs a workspace of {c_plan.workspace_bytes} bytes, got {ws_bytes}")
    device = require_device(op, named, CUDA)
    _lib.call(lib.nvfp4mla_cuda_sparse_decode, byref(fmt), byref(problem), byref(c_plan), ws_ptr, ws_bytes, vo.ptr,
              vs.ptr, device, s)
    return out, lse


def sparse_extend(q, cache, indices, topk_length, sm_scale, config, out=None, lse=None, *, lse_base2=False,
                  stream=None):
    """Sparse MLA extend/prefill on the GPU: each row (prefill chunk token, MTP verifier token)
    runs one softmax over its whole top-k list; no plan, no workspace.
    Returns (out bfloat16 [rows, heads, 512], lse float32 [rows, heads])."""
    return extend_with(config.format(), config.record_bytes, q, cache, indices, topk_length, sm_scale, out, lse,
                       lse_base2, stream)


def extend_with(fmt, record_bytes, q, cache, indices, topk_length, sm_scale, out, lse, lse_base2=False, stream=None):
    """sparse_extend with the format given as the C struct (what the torch ops pass)."""
    op = "sparse_extend"
    s = resolve_stream(stream, q)
    vq, vc, vi, vl = _views(s, q, cache, indices, topk_length)
    problem = _problem(op, vq, vc, vi, vl, record_bytes, sm_scale, lse_base2)
    rows, heads = problem.rows, problem.heads
    require_device(op, (("q", vq), ("cache", vc), ("indices", vi), ("topk_length", vl)), CUDA)
    out, vo = _output(op, "out", out, vq, (rows, heads, LATENT_DIM), _BF16, s)
    lse, vs = _output(op, "lse", lse, vq, (rows, heads), ("float32",), s)
    device = require_device(op, (("q", vq), ("out", vo), ("lse", vs)), CUDA)
    _lib.call(lib.nvfp4mla_cuda_sparse_extend, byref(fmt), byref(problem), vo.ptr, vs.ptr, device, s)
    return out, lse


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
