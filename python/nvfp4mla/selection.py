"""DSA selection: index keys, the paged index key cache, indexer logits, exact top-k and fused
selection (docs/SELECTION.md), on the CPU (the references) or the GPU (the kernels).

Each function runs where its tensors are: CPU tensors (numpy arrays, CPU torch tensors) run the
CPU reference, CUDA tensors the kernels, on the caller's stream (torch's or CuPy's current
stream, or ``stream=``). GPU calls never synchronize and allocate only outputs left as None, so
with caller-provided outputs they can be captured in CUDA graphs. The top-k results of the GPU
equal the CPU's bit for bit, and so do the index cache bytes; indexer logits agree within the
tolerance of docs/SELECTION.md.

Shapes and dtypes (E4M3 bytes are uint8, or torch.float8_e4m3fn):
  keys (to encode/write):  [T, 128] bfloat16 (uint16 bits), float16 or float32
  index key record:        uint8 [N, 132]: 128 E4M3 bytes, then the fp32 scale (little-endian)
  index cache:             uint8 [num_pages, page_size * 132] (or [num_pages, page_size, 132]),
                           per page the page's E4M3 values first, then its fp32 scales
  q:                       E4M3 [rows, heads, 128], heads 1..64;  weights: float32 [rows, heads]
  logits:                  float32 [rows, width]; -inf past each row's length
  top-k outputs:           indices int32 [rows, k] (ascending, -1 padded; cache slots with a
                           block table), topk_length int32 [rows], values float32 [rows, k]

Device-side checks (slots outside the cache, bad metadata) cannot raise: the GPU functions set or
add to a device counter (``invalid_count`` / ``error_count``, uint64 or int64 [1]) that the caller
reads after the stream's work; the CPU references raise Error before writing anything.
"""
from ctypes import byref, memset

from . import _lib, _tensor
from ._lib import (FusedSelect, FusedSelectPlanC, FusedSelectRagged, IndexCache, IndexerPaged, IndexerRagged, Topk,
                   TopkOutputs, TopkPlanC, lib)
from ._tensor import CPU, CUDA, check, require_device, view
from .records import resolve_stream

INDEX_KEY_DIM = 128
INDEX_KEY_RECORD_BYTES = _lib.INDEX_KEY_RECORD_BYTES  # 132
DEFAULT_PAGE_SIZE = 64
MAX_K = 4096
_KEY_DTYPES = ("bfloat16", "float16", "float32", "uint16")
_E4M3 = ("uint8", "float8_e4m3fn")
_COUNTERS = ("uint64", "int64")
_NO_COUNTER = (None, None)


def _where(op, named):
    """(device kind, ordinal) shared by every (name, View) in `named`."""
    first = next(v for _, v in named if v is not None)
    kind = first.device
    return kind, require_device(op, named, kind)


def _alloc(op, name, out, ref, shape, dtype, stream, contiguous=True):
    """`out` (checked) or a new tensor beside `ref` (a View); returns (tensor, View)."""
    if out is None:
        out = _tensor.empty_like(ref, shape, dtype)
    v = view(out, stream)
    check(v, op, name, (dtype,), shape, contiguous=contiguous, writable=True)
    return out, v


def _counter(op, name, counter, ref, stream, required):
    """The device counter: the caller's, or (when `required`) a new one beside `ref`."""
    if counter is None:
        if not required:
            return None, None
        counter = _tensor.empty_like(ref, (1,), "int64")
    v = view(counter, stream)
    check(v, op, name, _COUNTERS, (1,), writable=True)
    return counter, v


def _ptr(v):
    return None if v is None else v.ptr


def _index_cache(op, v, page_size, writable=False):
    """The C view of an index cache: uint8 [num_pages, ...] with page_size * 132 bytes per page."""
    if v.dtype != "uint8" or len(v.shape) < 2:
        raise _lib.ArgumentError(f"{op}: cache must be uint8 [num_pages, page_size * 132] or [num_pages, page_size, "
                                 f"132], got {v.describe()}")
    per_page = 1
    for size in v.shape[1:]:
        per_page *= size
    page_size = _lib.int64(page_size, op, "page_size")
    if page_size < 1 or per_page != page_size * INDEX_KEY_RECORD_BYTES:
        raise _lib.ArgumentError(f"{op}: cache pages hold {per_page} bytes but page_size {page_size} needs "
                                 f"{page_size * INDEX_KEY_RECORD_BYTES} ({page_size} x 132)")
    if not v.contiguous():
        raise _lib.ArgumentError(f"{op}: cache must be contiguous, got strides {list(v.strides)} for shape "
                                 f"{list(v.shape)}")
    if writable and v.readonly:
        raise _lib.ArgumentError(f"{op}: cache is read-only")
    return IndexCache(v.ptr, v.shape[0], page_size)


def _sm_count(op, sm_count, device):
    if sm_count is not None:
        return _lib.int32(sm_count, op, "sm_count")
    from .attention import cuda_sm_count
    return cuda_sm_count(0 if device is None else device)


# ---- index keys and the paged index cache ----------------------------------------------------------

def encode_index_keys(keys, out=None):
    """Encode index keys on the CPU into per-token records (what ``nvfp4mla index encode`` writes).

    keys: [N, 128] bfloat16 (uint16 bits), float16 or float32 (rows may be strided).
    Returns records: uint8 [N, 132] (``out`` if given)."""
    op = "encode_index_keys"
    vk = view(keys)
    check(vk, op, "keys", _KEY_DTYPES, (None, INDEX_KEY_DIM), contiguous=False)
    n = vk.shape[0]
    out, vo = _alloc(op, "out", out, vk, (n, INDEX_KEY_RECORD_BYTES), "uint8", None)
    require_device(op, (("keys", vk), ("out", vo)), CPU)
    _lib.call(lib.nvfp4mla_index_key_encode, _lib.INPUT_TYPES[vk.dtype], vk.ptr,
              vk.strides[0] if n > 1 else INDEX_KEY_DIM, n, vo.ptr)
    return out


def write_index_cache(keys, cache, slot_mapping, page_size=DEFAULT_PAGE_SIZE, *, invalid_count=None, stream=None):
    """Quantize T index keys into the paged index key cache through a slot mapping.

    keys: [T, 128] bfloat16, float16 or float32 (GPU: rows may be strided, 16-byte aligned);
    cache: uint8 [num_pages, page_size * 132]; slot_mapping: int64 [T], slot = page * page_size +
    offset, negative slots skipped. CPU: a slot >= capacity raises Error before anything is
    written, so a given ``invalid_count`` is set to 0; returns None. GPU: bad slots are counted in
    ``invalid_count`` (uint64/int64 [1], set by the call; allocated when None) and nothing is
    written when it is not zero; returns it."""
    op = "write_index_cache"
    s = resolve_stream(stream, keys)
    vc = view(cache, s)
    c_cache = _index_cache(op, vc, page_size, writable=True)
    on_gpu = vc.device == CUDA
    vk = view(keys, s)
    check(vk, op, "keys", _KEY_DTYPES, (None, INDEX_KEY_DIM), contiguous=not on_gpu)
    n = vk.shape[0]
    vs = view(slot_mapping, s)
    check(vs, op, "slot_mapping", ("int64",), (n,))
    named = [("cache", vc), ("keys", vk), ("slot_mapping", vs)]
    if not on_gpu:
        _, vi = _counter(op, "invalid_count", invalid_count, vc, s, False)
        require_device(op, named + [("invalid_count", vi)], CPU)
        _lib.call(lib.nvfp4mla_write_index_cache, _lib.INPUT_TYPES[vk.dtype], vk.ptr, n, vs.ptr, byref(c_cache))
        if vi is not None:  # set, as on the GPU: the CPU writer raised on any bad slot
            memset(vi.ptr, 0, 8)
        return None
    invalid_count, vi = _counter(op, "invalid_count", invalid_count, vc, s, True)
    device = require_device(op, named + [("invalid_count", vi)], CUDA)
    _lib.call(lib.nvfp4mla_cuda_write_index_cache, _lib.INPUT_TYPES[vk.dtype], vk.ptr,
              vk.strides[0] if n > 1 else INDEX_KEY_DIM, n, vs.ptr, byref(c_cache), vi.ptr, device, s)
    return invalid_count


def _gather(op, cache, slots, page_size, invalid_count, stream, outputs, fns):
    """Runs a gather of `slots` out of the index cache into `outputs` ((name, tensor or None, shape,
    dtype) each, allocated when None) on the CPU or the GPU (fns); returns the output tensors."""
    s = resolve_stream(stream, cache)
    vc = view(cache, s)
    c_cache = _index_cache(op, vc, page_size)
    vs = view(slots, s)
    check(vs, op, "slots", ("int64",), (None,))
    n = vs.shape[0]
    made = [_alloc(op, name, t, vc, (n,) + shape, dtype, s) for name, t, shape, dtype in outputs]
    named = [("cache", vc), ("slots", vs)] + [(o[0], v) for o, (_, v) in zip(outputs, made)]
    ptrs = [v.ptr for _, v in made]
    if vc.device == CPU:
        require_device(op, named, CPU)
        _lib.call(fns[0], byref(c_cache), vs.ptr, n, *ptrs)
    else:
        _, vi = _counter(op, "invalid_count", invalid_count, vc, s, True)
        device = require_device(op, named + [("invalid_count", vi)], CUDA)
        _lib.call(fns[1], byref(c_cache), vs.ptr, n, *ptrs, vi.ptr, device, s)
    return [t for t, _ in made]


def gather_index_records(cache, slots, out=None, *, page_size=DEFAULT_PAGE_SIZE, invalid_count=None, stream=None):
    """The keys of ``slots`` (int64 [n], each in [0, capacity)) as per-token records uint8
    [n, 132] (``out`` if given). CPU: a bad slot raises Error; GPU: bad slots are counted in
    ``invalid_count`` (allocated when None) and nothing is written when it is not zero."""
    return _gather("gather_index_records", cache, slots, page_size, invalid_count, stream,
                   [("out", out, (INDEX_KEY_RECORD_BYTES,), "uint8")],
                   (lib.nvfp4mla_gather_index_records, lib.nvfp4mla_cuda_gather_index_records))[0]


def gather_index_keys(cache, slots, values=None, scales=None, *, page_size=DEFAULT_PAGE_SIZE, invalid_count=None,
                      stream=None):
    """The keys of ``slots`` split for the ragged indexer: values uint8 [n, 128] (E4M3) and scales
    float32 [n]. Errors as :func:`gather_index_records`. Returns (values, scales)."""
    values, scales = _gather("gather_index_keys", cache, slots, page_size, invalid_count, stream,
                             [("values", values, (INDEX_KEY_DIM,), "uint8"), ("scales", scales, (), "float32")],
                             (lib.nvfp4mla_gather_index_keys, lib.nvfp4mla_cuda_gather_index_keys))
    return values, scales


# ---- indexer logits ----------------------------------------------------------------------------------

def _query(op, q, weights, s, rows=None):
    vq, vw = view(q, s), view(weights, s)
    check(vq, op, "q", _E4M3, (rows, None, INDEX_KEY_DIM))
    check(vw, op, "weights", ("float32",), vq.shape[:2])
    return vq, vw


def _key_buffer(op, keys, key_scales, s):
    """(values view, value stride, scales pointer, scale stride, num_keys, named views) of the
    ragged key buffer: per-token records uint8 [N, 132], or values uint8 [N, 128] with
    key_scales float32 [N]."""
    vk = view(keys, s)
    if key_scales is None:
        check(vk, op, "keys", ("uint8",), (None, INDEX_KEY_RECORD_BYTES), contiguous=False)
        stride = vk.strides[0] if vk.shape[0] > 1 else INDEX_KEY_RECORD_BYTES
        if stride % 4:
            raise _lib.ArgumentError(f"{op}: keys rows must be 4-byte aligned (row stride {stride})")
        return vk, stride, vk.ptr + INDEX_KEY_DIM, stride // 4, vk.shape[0], [("keys", vk)]
    check(vk, op, "keys", _E4M3, (None, INDEX_KEY_DIM), contiguous=False)
    vsc = view(key_scales, s)
    check(vsc, op, "key_scales", ("float32",), (vk.shape[0],), contiguous=False)
    return (vk, vk.strides[0] if vk.shape[0] > 1 else INDEX_KEY_DIM, vsc.ptr,
            vsc.strides[0] if vsc.shape[0] > 1 else 1, vk.shape[0], [("keys", vk), ("key_scales", vsc)])


def _ragged(op, q, weights, keys, key_scales, row_starts, row_ends, s):
    vq, vw = _query(op, q, weights, s)
    rows, heads = vq.shape[0], vq.shape[1]
    vk, vstride, scales, sstride, num_keys, named = _key_buffer(op, keys, key_scales, s)
    vrs, vre = view(row_starts, s), view(row_ends, s)
    check(vrs, op, "row_starts", ("int32",), (rows,))
    check(vre, op, "row_ends", ("int32",), (rows,))
    args = IndexerRagged(vq.ptr, vw.ptr, rows, heads, vk.ptr, vstride, scales, sstride, num_keys, vrs.ptr, vre.ptr,
                         None, 0)
    return args, [("q", vq), ("weights", vw)] + named + [("row_starts", vrs), ("row_ends", vre)]


def _ragged_width(op, vrs, vre, width, on_gpu):
    if width is not None:
        return int(width)
    if on_gpu:
        raise _lib.ArgumentError(f"{op}: on the GPU give out= or width= (the longest row_ends - row_starts): the "
                                 "ranges live in device memory")
    starts, ends = vrs.obj, vre.obj
    return max([int(e) - int(b) for b, e in zip(list(starts), list(ends))] + [0])


def indexer_logits(q, weights, keys, row_starts, row_ends, out=None, *, key_scales=None, width=None,
                   invalid_count=None, stream=None):
    """Indexer logits, ragged (prefill) form: row r scores keys row_starts[r] .. row_ends[r]-1.

    logit[r, j] = s_t * sum_h weights[r, h] * max(q[r, h] . k_t, 0) for key t = row_starts[r] + j.
    q: E4M3 [rows, heads, 128]; weights: float32 [rows, heads]; keys: per-token records uint8
    [N, 132] (CPU only), or E4M3 values [N, 128] with ``key_scales`` float32 [N] (the GPU kernels
    read 16-byte aligned key rows: :func:`gather_index_keys` gives them); row_starts, row_ends: int32
    [rows]. out: float32 [rows, width] (allocated when None; ``width`` defaults on the CPU to the
    longest row), -inf past each row's length. GPU: bad ranges are counted in ``invalid_count``
    (allocated when None) and nothing is written when it is not zero. Returns out."""
    op = "indexer_logits"
    s = resolve_stream(stream, q)
    args, named = _ragged(op, q, weights, keys, key_scales, row_starts, row_ends, s)
    kind, _ = _where(op, named)
    vq = named[0][1]
    if out is None:
        out = _tensor.empty_like(vq, (args.rows, _ragged_width(op, named[-2][1], named[-1][1], width,
                                                                kind == CUDA)), "float32")
    _run_logits(op, kind, args, args.rows, named, out, invalid_count, s, (lib.nvfp4mla_indexer_logits_ragged_reference,
                                                                          lib.nvfp4mla_cuda_indexer_logits_ragged))
    return out


def _run_logits(op, kind, args, rows, named, out, invalid_count, s, fns):
    """Checks the logits output, then runs the CPU reference or the kernel (fns) on `args`."""
    vo = view(out, s)
    check(vo, op, "out", ("float32",), (rows, None), writable=True)
    args.logits, args.logits_stride = vo.ptr, vo.shape[1]
    named = named + [("out", vo)]
    if kind == CPU:
        require_device(op, named, CPU)
        _lib.call(fns[0], byref(args))
        return
    _, vi = _counter(op, "invalid_count", invalid_count, named[0][1], s, True)
    device = require_device(op, named + [("invalid_count", vi)], CUDA)
    _lib.call(fns[1], byref(args), vi.ptr, device, s)


def _paged(op, q, weights, cache, block_table, context_lens, next_n, page_size, s):
    vq, vw = _query(op, q, weights, s)
    vc = view(cache, s)
    c_cache = _index_cache(op, vc, page_size)
    vb, vl = view(block_table, s), view(context_lens, s)
    check(vb, op, "block_table", ("int32",), (None, None), contiguous=False)
    requests, pages = vb.shape
    if requests > 1 and pages and vb.strides[0] != pages:
        # The library takes the row stride for the table's width: it would read past the view's columns.
        raise _lib.ArgumentError(f"{op}: block_table rows must be contiguous, with a row stride equal to its {pages} "
                                 f"columns, got a row stride of {vb.strides[0]} (pass a contiguous copy)")
    check(vl, op, "context_lens", ("int32",), (requests,))
    next_n = _lib.int32(next_n, op, "next_n")
    if next_n < 1 or vq.shape[0] != requests * next_n:
        raise _lib.ArgumentError(f"{op}: q has {vq.shape[0]} rows but block_table has {requests} requests of next_n "
                                 f"{next_n} rows each")
    args = IndexerPaged(vq.ptr, vw.ptr, requests, next_n, vq.shape[1], c_cache.data, c_cache.num_pages,
                        c_cache.page_size, vb.ptr, pages, vl.ptr, None, 0)
    return args, [("q", vq), ("weights", vw), ("cache", vc), ("block_table", vb), ("context_lens", vl)]


def indexer_logits_paged(q, weights, cache, block_table, context_lens, out=None, *, next_n=1,
                         page_size=DEFAULT_PAGE_SIZE, width=None, invalid_count=None, stream=None):
    """Indexer logits, paged (decode) form over the index key cache.

    q: E4M3 [requests * next_n, heads, 128]; weights: float32 [requests * next_n, heads];
    cache: uint8 [num_pages, page_size * 132]; block_table: int32 [requests, pages], contiguous
    (the library takes the row stride for the table's width, so a column slice such as
    ``table[:, :n]`` is refused: pass a contiguous copy); context_lens: int32 [requests].
    Row b * next_n + i scores the request's positions 0 .. context_lens[b] - next_n + i.
    out: float32 [rows, width] (allocated when None; width defaults to pages * page_size), -inf
    past each row's length. GPU: bad metadata is counted in ``invalid_count`` (allocated when
    None) and nothing is written when it is not zero."""
    op = "indexer_logits_paged"
    s = resolve_stream(stream, q)
    args, named = _paged(op, q, weights, cache, block_table, context_lens, next_n, page_size, s)
    vq = named[0][1]
    kind, _ = _where(op, named)
    rows = args.requests * args.next_n
    if out is None:
        w = named[3][1].shape[1] * args.page_size if width is None else int(width)
        out = _tensor.empty_like(vq, (rows, w), "float32")
    _run_logits(op, kind, args, rows, named, out, invalid_count, s, (lib.nvfp4mla_indexer_logits_paged_reference,
                                                                     lib.nvfp4mla_cuda_indexer_logits_paged))
    return out


# ---- top-k ---------------------------------------------------------------------------------------------

class TopkPlan:
    """How the GPU top-k divides (rows, columns): ``kernel`` ("row_per_cta", "split_rows" or
    "resident_rows"), ``segments`` per row, ``segment_len``, ``candidates`` (the entries a split
    row may keep for its finisher; 0: three histogram passes) and ``workspace_bytes`` (uint8,
    16-byte aligned; 0 for row_per_cta). Reusable for every call with the same rows and columns."""
    KERNELS = ("row_per_cta", "split_rows", "resident_rows")

    def __init__(self, c_plan, columns):
        self._c = c_plan
        self.rows, self.columns = c_plan.rows, columns
        self.kernel = self.KERNELS[c_plan.kernel]
        self.segments, self.segment_len = c_plan.segments, c_plan.segment_len
        self.candidates = c_plan.candidates
        self.workspace_bytes = c_plan.workspace_bytes

    def as_list(self):
        """The plan as ints (for the torch ops): rows, columns, kernel, segments, segment_len,
        workspace_bytes, candidates."""
        c = self._c
        return [c.rows, self.columns, c.kernel, c.segments, c.segment_len, c.workspace_bytes, c.candidates]

    @classmethod
    def from_list(cls, fields):
        rows, columns, kernel, segments, segment_len, ws, candidates = (int(x) for x in fields)
        return cls(TopkPlanC(kernel, segments, segment_len, rows, ws, candidates), columns)

    def __repr__(self):
        return (f"TopkPlan(rows={self.rows}, columns={self.columns}, kernel={self.kernel}, segments={self.segments}, "
                f"segment_len={self.segment_len}, candidates={self.candidates}, workspace_bytes={self.workspace_bytes})")


def plan_topk(rows, columns, sm_count=None, device=None):
    """Plan the GPU top-k of ``rows`` rows of ``columns`` entries (sm_count queried from ``device``
    when None). Host-only: plan once per shape, outside CUDA-graph capture."""
    op = "plan_topk"
    rows, columns = _lib.int32(rows, op, "rows"), _lib.int64(columns, op, "columns")
    c_plan = TopkPlanC()
    _lib.call(lib.nvfp4mla_plan_topk, rows, columns, _sm_count(op, sm_count, device), byref(c_plan))
    return TopkPlan(c_plan, columns)


def _topk_outputs(op, rows, k, ref, indices, topk_length, values, s):
    indices, vi = _alloc(op, "indices", indices, ref, (rows, k), "int32", s)
    topk_length, vl = _alloc(op, "topk_length", topk_length, ref, (rows,), "int32", s)
    vv = None
    if values is not None:
        values, vv = _alloc(op, "values", values, ref, (rows, k), "float32", s)
    out = TopkOutputs(vi.ptr, vl.ptr, _ptr(vv))
    return (indices, topk_length, values), out, [("indices", vi), ("topk_length", vl), ("values", vv)]


def _k(op, k):
    k = int(k)
    if not 1 <= k <= MAX_K:
        raise _lib.ArgumentError(f"{op}: k must be in 1..{MAX_K}, got {k}")
    return k


def topk(logits, lengths, k, *, plan=None, workspace=None, indices=None, topk_length=None, values=None,
         positions=None, position_offset=0, block_table=None, page_size=None, rows_per_request=1, capacity=None,
         error_count=None, stream=None):
    """Exact top-k of each row (topk.h): the k largest entries, ties to the smaller position.

    logits: float32 [rows, columns] (rows may be strided, unit stride within a row); lengths:
    int32 [rows] (entries per row, each in 0..columns) or None for all columns. NaN and -inf are
    never selected. positions: int32 with logits' shape and strides (strictly increasing per row),
    else position = column + position_offset. Outputs (allocated when None): indices int32
    [rows, k], the selected positions ascending and -1 padded; topk_length int32 [rows]; values
    float32 [rows, k] only when given.

    Slot transform: with block_table (int32 [requests, pages], row r of request
    r // rows_per_request), page_size and capacity (the KV cache's slot count), each position p
    is written as block_table[request, p // page_size] * page_size + p % page_size, the indices
    sparse_decode reads. A position without a valid slot raises Error on the CPU; the GPU writes
    -1 and counts it in ``error_count`` (optional, uint64/int64 [1]; added to).

    GPU: ``plan`` from :func:`plan_topk` (made here when None, which queries the device) and a
    ``workspace`` of at least plan.workspace_bytes (required when that is not 0).
    Returns (indices, topk_length)."""
    op = "topk"
    k = _k(op, k)
    s = resolve_stream(stream, logits)
    vx = view(logits, s)
    check(vx, op, "logits", ("float32",), (None, None), contiguous=False)
    rows, columns = vx.shape
    rows = _lib.int32(rows, op, "logits' rows")
    stride = vx.strides[0] if rows > 1 else columns
    named = [("logits", vx)]
    vl = None
    if lengths is not None:
        vl = view(lengths, s)
        check(vl, op, "lengths", ("int32",), (rows,))
        named.append(("lengths", vl))
    vp = None
    if positions is not None:
        vp = view(positions, s)
        check(vp, op, "positions", ("int32",), (rows, columns), contiguous=False)
        if rows > 1 and vp.strides[0] != stride:
            raise _lib.ArgumentError(f"{op}: positions must have the row stride of logits ({stride}), got "
                                     f"{vp.strides[0]}")
        named.append(("positions", vp))
    args = Topk(vx.ptr, rows, k, columns, stride, _ptr(vl), _ptr(vp),
                _lib.int64(position_offset, op, "position_offset"))
    if block_table is not None:
        if page_size is None or capacity is None:
            raise _lib.ArgumentError(f"{op}: block_table needs page_size (positions per page) and capacity (the "
                                     "cache's slots)")
        vb = view(block_table, s)
        check(vb, op, "block_table", ("int32",), (None, None), contiguous=False)
        args.block_table, args.requests, args.pages = vb.ptr, vb.shape[0], vb.shape[1]
        args.table_stride = vb.strides[0] if vb.shape[0] > 1 else vb.shape[1]
        args.page_size = _lib.int32(page_size, op, "page_size")
        args.rows_per_request = _lib.int32(rows_per_request, op, "rows_per_request")
        args.capacity = _lib.int64(capacity, op, "capacity")
        named.append(("block_table", vb))
    kind, _ = _where(op, named)
    results, out, out_named = _topk_outputs(op, rows, k, vx, indices, topk_length, values, s)
    named += out_named
    if kind == CPU:
        require_device(op, named, CPU)
        _lib.call(lib.nvfp4mla_topk_reference, byref(args), byref(out))
        return results[0], results[1]
    device = require_device(op, named, CUDA)
    if plan is None:
        plan = plan_topk(rows, columns, device=device)
    if plan.rows != rows or plan.columns != columns:
        raise _lib.ArgumentError(f"{op}: the plan is for {plan.rows} x {plan.columns}, logits are {rows} x {columns}")
    ws_ptr, ws_bytes = _workspace(op, workspace, plan.workspace_bytes, s, device)
    _, vc = _counter(op, "error_count", error_count, vx, s, False)
    if vc is not None:
        require_device(op, [("logits", vx), ("error_count", vc)], CUDA)
    _lib.call(lib.nvfp4mla_cuda_topk, byref(args), byref(plan._c), ws_ptr, ws_bytes, byref(out), _ptr(vc), device, s)
    return results[0], results[1]


def _workspace(op, workspace, need, s, device):
    if workspace is None:
        if need:
            raise _lib.ArgumentError(f"{op}: the plan needs a workspace of {need} bytes (uint8 on the device)")
        return None, 0
    vw = view(workspace, s)
    check(vw, op, "workspace", ("uint8",), (None,) * len(vw.shape))
    require_device(op, [("workspace", vw)], CUDA)
    if vw.index != device:
        raise _lib.ArgumentError(f"{op}: workspace is on cuda:{vw.index} but the other tensors are on cuda:{device}")
    n = 1
    for size in vw.shape:
        n *= size
    if n < need:
        raise _lib.ArgumentError(f"{op}: the plan needs a workspace of {need} bytes, got {n}")
    return vw.ptr, n


# ---- fused selection -------------------------------------------------------------------------------------

class FusedSelectPlan:
    """How fused selection chunks the context: ``chunk`` positions per chunk, ``chunks``,
    ``logits_stride`` and ``workspace_bytes`` (uint8 on the device, 256-byte aligned), for the
    shapes it was made for (``ragged``, ``rows`` or ``requests`` x ``next_n``, ``page_size``,
    ``max_context`` (the longest row for ragged), ``k``, ``heads``). The GPU call plans again from
    its arguments and refuses a plan made for other shapes."""
    FIELDS = ("ragged", "requests", "next_n", "heads", "page_size", "max_context", "k", "chunk", "chunks",
              "logits_stride", "sm_count", "workspace_bytes")

    def __init__(self, c_plan, ragged, requests, next_n, heads, page_size, max_context, k):
        self._c = c_plan
        self.ragged, self.requests, self.next_n, self.heads = bool(ragged), requests, next_n, heads
        self.page_size, self.max_context, self.k = page_size, max_context, k
        self.chunk, self.chunks, self.logits_stride = c_plan.chunk, c_plan.chunks, c_plan.logits_stride
        self.sm_count, self.workspace_bytes = c_plan.sm_count, c_plan.workspace_bytes

    @property
    def rows(self):
        return self.requests * self.next_n

    def as_list(self):
        """The plan as ints in FIELDS order (for the torch ops)."""
        return [int(getattr(self, name)) for name in self.FIELDS]

    @classmethod
    def from_list(cls, fields):
        v = dict(zip(cls.FIELDS, (int(x) for x in fields)))
        c = FusedSelectPlanC(v["chunk"], v["chunks"], v["logits_stride"], v["sm_count"], v["workspace_bytes"])
        return cls(c, v["ragged"], v["requests"], v["next_n"], v["heads"], v["page_size"], v["max_context"], v["k"])

    def __repr__(self):
        return "FusedSelectPlan(" + ", ".join(f"{n}={getattr(self, n)}" for n in self.FIELDS) + ")"


def plan_fused_select(requests, max_context, k, *, next_n=1, heads=64, page_size=DEFAULT_PAGE_SIZE, chunk=0,
                      sm_count=None, device=None):
    """Plan fused selection, paged (decode) form: ``requests`` x ``next_n`` rows, contexts up to
    ``max_context`` positions, top ``k``. chunk 0: the planner's choice (one chunk while the
    logits fit 64 MiB), else a positive multiple of page_size. Host-only."""
    op = "plan_fused_select"
    requests, next_n = _lib.int64(requests, op, "requests"), _lib.int32(next_n, op, "next_n")
    heads, page_size = _lib.int32(heads, op, "heads"), _lib.int64(page_size, op, "page_size")
    max_context, k, chunk = _lib.int64(max_context, op, "max_context"), _k(op, k), _lib.int64(chunk, op, "chunk")
    c = FusedSelectPlanC()
    sms = _sm_count(op, sm_count, device)
    _lib.call(lib.nvfp4mla_plan_fused_select, requests, next_n, heads, page_size, max_context, k, chunk, sms, byref(c))
    return FusedSelectPlan(c, False, requests, next_n, heads, page_size, max_context, k)


def plan_fused_select_ragged(rows, max_length, k, *, heads=64, chunk=0, sm_count=None, device=None):
    """Plan fused selection, ragged (prefill) form: ``rows`` rows of up to ``max_length`` keys."""
    op = "plan_fused_select_ragged"
    rows, heads = _lib.int64(rows, op, "rows"), _lib.int32(heads, op, "heads")
    max_length, k, chunk = _lib.int64(max_length, op, "max_length"), _k(op, k), _lib.int64(chunk, op, "chunk")
    c = FusedSelectPlanC()
    sms = _sm_count(op, sm_count, device)
    _lib.call(lib.nvfp4mla_plan_fused_select_ragged, rows, heads, max_length, k, chunk, sms, byref(c))
    return FusedSelectPlan(c, True, rows, 1, heads, 1, max_length, k)


def _run_fused(op, plan, args, named, ref, workspace, indices, topk_length, values, invalid_count, s, fns):
    results, out, out_named = _topk_outputs(op, plan.rows, plan.k, ref, indices, topk_length, values, s)
    named = named + out_named
    kind, _ = _where(op, named)
    if kind == CPU:
        require_device(op, named, CPU)
        _lib.call(fns[0], byref(args), byref(plan._c), byref(out))
        return results[0], results[1]
    _, vi = _counter(op, "invalid_count", invalid_count, ref, s, True)
    device = require_device(op, named + [("invalid_count", vi)], CUDA)
    ws_ptr, ws_bytes = _workspace(op, workspace, plan.workspace_bytes, s, device)
    _lib.call(fns[1], byref(args), byref(plan._c), ws_ptr, ws_bytes, byref(out), vi.ptr, device, s)
    return results[0], results[1]


def fused_select(q, weights, cache, block_table, context_lens, plan, workspace=None, *, slot_ids=False,
                 indices=None, topk_length=None, values=None, invalid_count=None, stream=None):
    """Fused DSA selection, paged (decode) form: each row's exact top-k of its indexer logits,
    equal to :func:`indexer_logits_paged` followed by :func:`topk` (with ``slot_ids`` the cache
    slots through the block table) without a [rows, context] logits buffer.

    Arguments as :func:`indexer_logits_paged` with ``plan`` from :func:`plan_fused_select` (its
    next_n, page_size, max_context and k; each context_lens entry at most max_context). GPU: a
    ``workspace`` of plan.workspace_bytes; bad metadata sets ``invalid_count`` (allocated when
    None) and every row then selects nothing. Returns (indices, topk_length)."""
    op = "fused_select"
    if plan.ragged:
        raise _lib.ArgumentError(f"{op}: the plan is for the ragged form (fused_select_ragged)")
    s = resolve_stream(stream, q)
    keys, named = _paged(op, q, weights, cache, block_table, context_lens, plan.next_n, plan.page_size, s)
    if keys.requests != plan.requests:
        raise _lib.ArgumentError(f"{op}: the plan is for {plan.requests} requests, block_table has {keys.requests}")
    args = FusedSelect(keys, plan.max_context, plan.k, 1 if slot_ids else 0)
    return _run_fused(op, plan, args, named, named[0][1], workspace, indices, topk_length, values, invalid_count, s,
                      (lib.nvfp4mla_fused_select_reference, lib.nvfp4mla_cuda_fused_select))


def fused_select_ragged(q, weights, keys, row_starts, row_ends, plan, workspace=None, *, key_scales=None,
                        indices=None, topk_length=None, values=None, invalid_count=None, stream=None):
    """Fused DSA selection, ragged (prefill) form: equal to :func:`indexer_logits` followed by
    :func:`topk` (positions are each row's columns). ``plan`` from
    :func:`plan_fused_select_ragged` (rows, max_length, k). Returns (indices, topk_length)."""
    op = "fused_select_ragged"
    if not plan.ragged:
        raise _lib.ArgumentError(f"{op}: the plan is for the paged form (fused_select)")
    s = resolve_stream(stream, q)
    keys_c, named = _ragged(op, q, weights, keys, key_scales, row_starts, row_ends, s)
    if keys_c.rows != plan.rows:
        raise _lib.ArgumentError(f"{op}: the plan is for {plan.rows} rows, q has {keys_c.rows}")
    args = FusedSelectRagged(keys_c, plan.max_context, plan.k)
    return _run_fused(op, plan, args, named, named[0][1], workspace, indices, topk_length, values, invalid_count, s,
                      (lib.nvfp4mla_fused_select_ragged_reference, lib.nvfp4mla_cuda_fused_select_ragged))
