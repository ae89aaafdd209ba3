"""Records: CPU encode/decode, and the paged-cache writer and record copies on the CPU or the GPU.

Tensors are borrowed zero-copy (torch, numpy, CuPy or any __dlpack__ object). GPU calls queue
their work on the caller's stream (torch's or CuPy's current stream by default, or ``stream=``),
never allocate (except an output left as None) and never synchronize, so they can be captured in
CUDA graphs. numpy and CuPy have no bfloat16: a uint16 array is read as BF16 bits.
"""
import sys
from ctypes import byref

from . import _lib, _tensor
from ._lib import lib
from ._tensor import CPU, CUDA, check, require_device, view

LATENT_DIM = _lib.LATENT_DIM  # kv_c values per token (also V)
ROPE_DIM = _lib.ROPE_DIM      # k_pe values per token
QK_DIM = LATENT_DIM + ROPE_DIM
_INPUT_DTYPES = ("bfloat16", "float16", "float32", "uint16")
_COUNTER_DTYPES = ("uint64", "int64")


def resolve_stream(stream, first):
    """The cudaStream_t (int) for a call whose first tensor is `first`: `stream` when given, else
    torch's or CuPy's current stream on that tensor's device, else the legacy default stream."""
    if stream is not None:
        return _tensor.stream_handle(stream)
    kind = _tensor.framework(first)
    if kind == "torch":
        if not first.is_cuda:
            return 0
        import torch
        return torch._C._cuda_getCurrentRawStream(first.get_device())
    if kind == "cupy":
        import cupy
        return cupy.cuda.get_current_stream().ptr
    return 0


def cache_geometry(op, v, record_bytes=None, name="cache", writable=False):
    """(capacity, record_bytes) of a cache view: uint8 [..., record_bytes], contiguous."""
    if v.dtype != "uint8" or len(v.shape) < 2:
        raise _lib.ArgumentError(f"{op}: {name} must be uint8 [num_blocks, block_size, record_bytes] or "
                                 f"[slots, record_bytes], got {v.describe()}")
    if record_bytes is not None and v.shape[-1] != record_bytes:
        raise _lib.ArgumentError(f"{op}: {name} holds {v.shape[-1]}-byte records but the format uses "
                                 f"{record_bytes}-byte records")
    if not v.contiguous():
        raise _lib.ArgumentError(f"{op}: {name} must be contiguous (records packed slot after slot), got strides "
                                 f"{list(v.strides)} for shape {list(v.shape)}")
    if writable and v.readonly:
        raise _lib.ArgumentError(f"{op}: {name} is read-only")
    capacity = 1
    for size in v.shape[:-1]:
        capacity *= size
    return capacity, v.shape[-1]


def _counter(op, error_count, stream):
    if error_count is None:
        return None, 0
    v = view(error_count, stream)
    check(v, op, "error_count", _COUNTER_DTYPES, (1,), writable=True)
    return v, v.ptr


def _row_strides(vk, vp):
    """The row strides of kv_c and k_pe: a single row's stride is whatever its producer reports
    (0 for numpy's x[None]), so one row takes its natural width."""
    if vk.shape[0] > 1:
        return vk.strides[0], vp.strides[0]
    return LATENT_DIM, ROPE_DIM


def _tokens(op, kv_c, k_pe, stream, contiguous):
    vk, vp = view(kv_c, stream), view(k_pe, stream)
    check(vk, op, "kv_c", _INPUT_DTYPES, (None, LATENT_DIM), contiguous=contiguous)
    check(vp, op, "k_pe", _INPUT_DTYPES, (vk.shape[0], ROPE_DIM), contiguous=contiguous)
    if vk.dtype != vp.dtype:
        raise _lib.ArgumentError(f"{op}: kv_c is {vk.dtype} but k_pe is {vp.dtype}; give both in one dtype")
    return vk, vp


def encode(kv_c, k_pe, config, out=None):
    """Encode tokens into records on the CPU (bit-identical to the GPU writer).

    kv_c: [N, 512] and k_pe: [N, 64], both bfloat16 (uint16 bits), float16 or float32 on the CPU
    (rows may be strided). Returns records: uint8 [N, record_bytes] (``out`` if given)."""
    op = "encode"
    fmt = config.format()
    vk, vp = _tokens(op, kv_c, k_pe, None, contiguous=False)
    require_device(op, (("kv_c", vk), ("k_pe", vp)), CPU)
    n = vk.shape[0]
    if out is None:
        out = _tensor.empty_like(vk, (n, config.record_bytes), "uint8")
    vo = view(out)
    check(vo, op, "out", ("uint8",), (n, config.record_bytes), writable=True)
    require_device(op, (("out", vo),), CPU)
    kv_stride, pe_stride = _row_strides(vk, vp)
    _lib.call(lib.nvfp4mla_encode, byref(fmt), _lib.INPUT_TYPES[vk.dtype], vk.ptr, kv_stride, vp.ptr, pe_stride, n,
              vo.ptr)
    return out


def decode(records, config, kv_c=None, k_pe=None):
    """Decode records on the CPU into float32 kv_c [N, 512] and k_pe [N, 64].

    records: uint8 [N, record_bytes] or [pages, page_size, record_bytes], contiguous.
    Returns (kv_c, k_pe) (the given buffers, if any)."""
    op = "decode"
    fmt = config.format()
    vr = view(records)
    n, _ = cache_geometry(op, vr, config.record_bytes, "records")
    require_device(op, (("records", vr),), CPU)
    kv_c = _tensor.empty_like(vr, (n, LATENT_DIM), "float32") if kv_c is None else kv_c
    k_pe = _tensor.empty_like(vr, (n, ROPE_DIM), "float32") if k_pe is None else k_pe
    vk, vp = view(kv_c), view(k_pe)
    check(vk, op, "kv_c", ("float32",), (n, LATENT_DIM), writable=True)
    check(vp, op, "k_pe", ("float32",), (n, ROPE_DIM), writable=True)
    require_device(op, (("kv_c", vk), ("k_pe", vp)), CPU)
    _lib.call(lib.nvfp4mla_decode, byref(fmt), vr.ptr, n, vk.ptr, vp.ptr)
    return kv_c, k_pe


def write_cache(kv_c, k_pe, cache, slot_mapping, config, *, error_count=None, stream=None):
    """Quantize T tokens into a paged cache through a slot mapping (vLLM's concat_and_cache_mla).

    kv_c: [T, 512], k_pe: [T, 64] (bfloat16, float16 or float32, one dtype, unit stride in the last
    dimension; on the GPU rows may be strided, e.g. slices of one [T, 576] tensor);
    cache: uint8 [num_blocks, block_size, record_bytes] (or [slots, record_bytes]), contiguous;
    slot_mapping: int64 [T] (slot = block * block_size + offset; negative slots are skipped).

    On the GPU a slot >= capacity is skipped and counted in ``error_count`` (uint64 or int64 [1]
    on the device, optional) as a kernel cannot raise; on the CPU it raises Error before anything
    is written. The GPU writer produces the same bytes as :func:`encode`."""
    write_cache_format(config.format(), config.record_bytes, kv_c, k_pe, cache, slot_mapping, error_count, stream)


def _write_cache_torch(torch, fmt, record_bytes, kv_c, k_pe, cache, slot_mapping, error_count, stream):
    """The per-step path for CUDA torch tensors: the general path's checks read straight from the
    tensors. Returns False, having done nothing, when any check fails (the general path then
    raises the precise error or serves the case)."""
    Tensor = torch.Tensor
    if not (isinstance(kv_c, Tensor) and isinstance(k_pe, Tensor) and isinstance(cache, Tensor) and
            isinstance(slot_mapping, Tensor)):
        return False
    device = cache.get_device()
    input_type = _TORCH_INPUT_TYPES.get(kv_c.dtype)
    if device < 0 or input_type is None or kv_c.dim() != 2 or cache.dim() < 2:
        return False
    n = kv_c.shape[0]
    if not (kv_c.shape[1] == LATENT_DIM and kv_c.stride(1) == 1 and kv_c.get_device() == device and
            k_pe.dtype is kv_c.dtype and k_pe.shape == (n, ROPE_DIM) and k_pe.stride(1) == 1 and
            k_pe.get_device() == device and slot_mapping.dtype is torch.int64 and slot_mapping.shape == (n,) and
            slot_mapping.is_contiguous() and slot_mapping.get_device() == device and cache.dtype is torch.uint8 and
            cache.shape[-1] == record_bytes and cache.is_contiguous()):
        return False
    counter = 0
    if error_count is not None:
        if not (isinstance(error_count, Tensor) and error_count.dtype in (torch.int64, getattr(torch, "uint64", None))
                and error_count.shape == (1,) and error_count.get_device() == device):
            return False
        counter = error_count.data_ptr()
    s = torch._C._cuda_getCurrentRawStream(device) if stream is None else _tensor.stream_handle(stream)
    kv_stride, pe_stride = (kv_c.stride(0), k_pe.stride(0)) if n > 1 else (LATENT_DIM, ROPE_DIM)
    _lib.call(lib.nvfp4mla_cuda_write_cache, byref(fmt), input_type, kv_c.data_ptr(), kv_stride, k_pe.data_ptr(),
              pe_stride, n, slot_mapping.data_ptr(), cache.data_ptr(), cache.numel() // record_bytes, counter, device,
              s)
    return True


class _TorchInputTypes(dict):
    """torch dtype -> input type code, filled when torch is first seen."""

    def get(self, dtype, default=None):
        if not self:
            import torch
            self.update({torch.bfloat16: 0, torch.float16: 1, torch.float32: 2})
        return dict.get(self, dtype, default)


_TORCH_INPUT_TYPES = _TorchInputTypes()


def write_cache_format(fmt, record_bytes, kv_c, k_pe, cache, slot_mapping, error_count=None, stream=None):
    """write_cache with the format given as the C struct (what the torch ops pass)."""
    torch = sys.modules.get("torch")
    if torch is not None and _write_cache_torch(torch, fmt, record_bytes, kv_c, k_pe, cache, slot_mapping, error_count,
                                                stream):
        return
    op = "write_cache"
    s = resolve_stream(stream, kv_c)
    vc = view(cache, s)
    capacity, _ = cache_geometry(op, vc, record_bytes, writable=True)
    on_gpu = vc.device == CUDA
    vk, vp = _tokens(op, kv_c, k_pe, s, contiguous=not on_gpu)
    vs = view(slot_mapping, s)
    check(vs, op, "slot_mapping", ("int64",), (vk.shape[0],))
    counter, counter_ptr = _counter(op, error_count, s)
    named = (("cache", vc), ("kv_c", vk), ("k_pe", vp), ("slot_mapping", vs), ("error_count", counter))
    if on_gpu:
        device = require_device(op, named, CUDA)
        kv_stride, pe_stride = _row_strides(vk, vp)
        _lib.call(lib.nvfp4mla_cuda_write_cache, byref(fmt), _lib.INPUT_TYPES[vk.dtype], vk.ptr, kv_stride, vp.ptr,
                  pe_stride, vk.shape[0], vs.ptr, vc.ptr, capacity, counter_ptr, device, s)
    else:
        require_device(op, named, CPU)
        _lib.call(lib.nvfp4mla_write_cache, byref(fmt), _lib.INPUT_TYPES[vk.dtype], vk.ptr, vp.ptr, vk.shape[0],
                  vs.ptr, vc.ptr, capacity)


def gather_records(cache, slots, out=None, *, error_count=None, stream=None):
    """Copy the records of ``slots`` (int64 [n]) out of a cache into out: uint8 [n, record_bytes]
    (for offload and context parallelism). A negative slot gives a zero record; a slot >= capacity
    gives a zero record and is counted in ``error_count`` (optional, uint64/int64 [1]).
    Runs where the tensors are (CPU or GPU). Returns out."""
    op = "gather_records"
    s = resolve_stream(stream, cache)
    vc = view(cache, s)
    capacity, rb = cache_geometry(op, vc)
    vs = view(slots, s)
    check(vs, op, "slots", ("int64",), (None,))
    n = vs.shape[0]
    if out is None:
        out = _tensor.empty_like(vc, (n, rb), "uint8")
    vo = view(out, s)
    check(vo, op, "out", ("uint8",), (n, rb), writable=True)
    counter, counter_ptr = _counter(op, error_count, s)
    named = (("cache", vc), ("slots", vs), ("out", vo), ("error_count", counter))
    if vc.device == CUDA:
        device = require_device(op, named, CUDA)
        _lib.call(lib.nvfp4mla_cuda_gather_records, rb, vc.ptr, capacity, vs.ptr, n, vo.ptr, counter_ptr, device, s)
    else:
        require_device(op, named, CPU)
        _lib.call(lib.nvfp4mla_gather_records, rb, vc.ptr, capacity, vs.ptr, n, vo.ptr, counter_ptr)
    return out


def scatter_records(src, slots, cache, *, error_count=None, stream=None):
    """Write records src: uint8 [n, record_bytes] into the ``slots`` (int64 [n]) of a cache:
    negative slots are skipped, slots >= capacity skipped and counted in ``error_count``.
    Runs where the tensors are (CPU or GPU)."""
    op = "scatter_records"
    s = resolve_stream(stream, cache)
    vc = view(cache, s)
    capacity, rb = cache_geometry(op, vc, writable=True)
    vs = view(slots, s)
    check(vs, op, "slots", ("int64",), (None,))
    n = vs.shape[0]
    vsrc = view(src, s)
    check(vsrc, op, "src", ("uint8",), (n, rb))
    counter, counter_ptr = _counter(op, error_count, s)
    named = (("cache", vc), ("slots", vs), ("src", vsrc), ("error_count", counter))
    if vc.device == CUDA:
        device = require_device(op, named, CUDA)
        _lib.call(lib.nvfp4mla_cuda_scatter_records, rb, vsrc.ptr, vs.ptr, n, vc.ptr, capacity, counter_ptr, device,
                  s)
    else:
        require_device(op, named, CPU)
        _lib.call(lib.nvfp4mla_scatter_records, rb, vsrc.ptr, vs.ptr, n, vc.ptr, capacity, counter_ptr)
