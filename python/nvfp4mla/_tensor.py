"""Zero-copy views of caller tensors: torch tensors, numpy arrays and any object with __dlpack__.

A View is (data pointer, shape, strides in elements, dtype name, device) plus whatever keeps the
memory alive for the call. torch tensors and numpy arrays are read through their own attributes
(cheapest, and numpy's DLPack export refuses read-only arrays); every other object goes through
the DLPack protocol (__dlpack_device__, __dlpack__(stream=...)), borrowing the capsule without
consuming it, so its producer keeps ownership.
"""
import ctypes
import sys
from ctypes import POINTER, Structure, c_int, c_int64, c_uint8, c_uint16, c_uint64, c_void_p

from ._lib import ArgumentError

CPU, CUDA = "cpu", "cuda"

# DLPack device types and dtype codes (dlpack.h).
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_FLOAT8_E4M3FN = 0, 1, 2, 4, 10
_DL_DTYPES = {(_DL_INT, 32): "int32", (_DL_INT, 64): "int64", (_DL_UINT, 8): "uint8", (_DL_UINT, 16): "uint16",
              (_DL_UINT, 64): "uint64", (_DL_FLOAT, 16): "float16", (_DL_FLOAT, 32): "float32",
              (_DL_FLOAT, 64): "float64", (_DL_BFLOAT, 16): "bfloat16", (_DL_INT, 8): "int8",
              (_DL_INT, 16): "int16", (_DL_UINT, 32): "uint32", (_DL_FLOAT8_E4M3FN, 8): "float8_e4m3fn"}
ITEMSIZE = {"int8": 1, "uint8": 1, "float8_e4m3fn": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2, "int32": 4, "uint32": 4,
            "float32": 4, "int64": 8, "uint64": 8, "float64": 8}


class _DLDevice(Structure):
    _fields_ = [("device_type", c_int), ("device_id", c_int)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", c_int), ("dtype", _DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class _DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class View:
    """A borrowed tensor: `ptr` (int), `shape` and `strides` (tuples, strides in elements), `dtype`
    (a name such as "bfloat16"), `device` ("cpu" or "cuda"), `index` (device ordinal, 0 on the CPU),
    `obj` (the caller's object) and `keep` (what must stay alive while the library uses `ptr`)."""
    __slots__ = ("ptr", "shape", "strides", "dtype", "device", "index", "obj", "keep", "readonly")

    def __init__(self, ptr, shape, strides, dtype, device, index, obj, keep=None, readonly=False):
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        self.device = device
        self.index = index
        self.obj = obj
        self.keep = keep
        self.readonly = readonly

    def contiguous(self):
        if 0 in self.shape:
            return True
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def describe(self):
        where = "cpu" if self.device == CPU else f"cuda:{self.index}"
        return f"{self.dtype} {list(self.shape)} on {where}"


# ---- torch ----------------------------------------------------------------------------------------

_torch_dtypes = None


def _torch_dtype_names(torch):
    global _torch_dtypes
    if _torch_dtypes is None:
        names = {}
        for name in ITEMSIZE:
            dt = getattr(torch, name, None)
            if dt is not None:
                names[dt] = name
        _torch_dtypes = names
    return _torch_dtypes


def _from_torch(t, torch):
    dtype = _torch_dtype_names(torch).get(t.dtype)
    if dtype is None:
        dtype = str(t.dtype).replace("torch.", "")
    index = t.get_device()  # -1 on the CPU
    if index >= 0 and t.is_cuda:
        device = CUDA
    elif t.is_cpu:
        device, index = CPU, 0
    else:
        raise ArgumentError(f"tensors must be on the CPU or a CUDA device, got one on {t.device}")
    return View(t.data_ptr(), tuple(t.shape), tuple(t.stride()), dtype, device, index, t)


# ---- numpy ----------------------------------------------------------------------------------------

def _from_numpy(a):
    if not a.dtype.isnative:  # the library reads native (little-endian) values; '>f4' is named float32 too
        raise ArgumentError(f"array dtype {a.dtype.str} is not in the machine's byte order: convert it with "
                            f"a.astype(a.dtype.newbyteorder('='))")
    item = a.itemsize
    strides = a.strides
    if any(s % item for s in strides):
        raise ArgumentError(f"array strides {strides} are not whole elements")
    dtype = a.dtype.name if a.dtype.name in ITEMSIZE else str(a.dtype)
    return View(a.ctypes.data, a.shape, tuple(s // item for s in strides), dtype, CPU, 0, a,
                readonly=not a.flags.writeable)


# ---- DLPack ---------------------------------------------------------------------------------------

def _dlpack_stream(stream):
    # DLPack's CUDA stream argument: 1 is the legacy default stream (0 is not allowed).
    return 1 if not stream else stream


def _from_dlpack(x, stream):
    device_type, device_id = x.__dlpack_device__()
    if device_type in (_DL_CPU, _DL_CUDA_HOST):
        capsule = x.__dlpack__()
        device, index = CPU, 0
    elif device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        capsule = x.__dlpack__(stream=_dlpack_stream(stream))
        device, index = CUDA, int(device_id)
    else:
        raise ArgumentError(f"DLPack device type {device_type} is neither the CPU nor CUDA")
    address = _capsule_pointer(capsule, b"dltensor")
    managed = _DLManagedTensor.from_address(address)
    t = managed.dl_tensor
    code = (t.dtype.code, t.dtype.bits)
    if t.dtype.lanes != 1 or code not in _DL_DTYPES:
        raise ArgumentError(f"unsupported DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits, "
                            f"{t.dtype.lanes} lanes)")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(t.ndim))
    else:  # NULL strides: compact row-major
        strides, step = [], 1
        for size in reversed(shape):
            strides.append(step)
            step *= size
        strides = tuple(reversed(strides))
    return View((t.data or 0) + t.byte_offset, shape, strides, _DL_DTYPES[code], device, index, x, keep=capsule)


def view(x, stream=None):
    """A View of `x` (torch tensor, numpy array or __dlpack__ object); `stream` is the CUDA stream
    the caller's work runs on, handed to DLPack producers so that they order their pending work
    before it."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _from_torch(x, torch)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(x, numpy.ndarray):
        return _from_numpy(x)
    if hasattr(x, "__dlpack__"):
        return _from_dlpack(x, stream)
    raise ArgumentError(f"expected a tensor (torch, numpy, CuPy or any object with __dlpack__), got "
                        f"{type(x).__name__}")


def framework(x):
    """'torch', 'numpy', 'cupy' or None: which library `x` belongs to (for allocating outputs)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch"
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(x, numpy.ndarray):
        return "numpy"
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return "cupy"
    return None


def empty_like(ref, shape, dtype):
    """A new tensor of `shape` and `dtype` in the framework and on the device of `ref` (a View).
    BF16 outputs are uint16 arrays of BF16 bits in numpy and CuPy, which have no bfloat16."""
    kind = framework(ref.obj)
    if kind == "torch":
        import torch
        return torch.empty(shape, dtype=getattr(torch, dtype), device=ref.obj.device)
    if kind == "cupy":
        import cupy
        with cupy.cuda.Device(ref.index):
            return cupy.empty(shape, dtype="uint16" if dtype == "bfloat16" else dtype)
    if ref.device == CPU:
        import numpy
        return numpy.empty(shape, dtype="uint16" if dtype == "bfloat16" else dtype)
    raise ArgumentError(f"cannot allocate an output for a {type(ref.obj).__name__}: pass it (out=...)")


def current_stream(ref):
    """The stream work on `ref` (a CUDA View) runs on by default: torch's or CuPy's current stream
    for their tensors, else the legacy default stream (0)."""
    kind = framework(ref.obj)
    if kind == "torch":
        import torch
        return torch._C._cuda_getCurrentRawStream(ref.index)
    if kind == "cupy":
        import cupy
        return cupy.cuda.get_current_stream().ptr
    return 0


def stream_handle(stream):
    """A cudaStream_t (int) from an int, a torch.cuda.Stream (.cuda_stream) or a CuPy stream (.ptr)."""
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(stream, attr, None)
        if handle is not None:
            return int(handle)
    if isinstance(stream, int):
        return stream
    raise ArgumentError(f"stream must be an int (cudaStream_t), a torch.cuda.Stream or a CuPy stream, got "
                        f"{type(stream).__name__}")


# ---- checks ---------------------------------------------------------------------------------------

def check(v, op, name, dtypes, dims, contiguous=True, writable=False):
    """Checks one argument: dtype in `dtypes`, shape matching `dims` (ints, or None for any size),
    compact row-major when `contiguous` (else the last dimension only), writable for outputs.
    Raises ArgumentError naming the operation and the argument."""
    if v.dtype not in dtypes:
        raise ArgumentError(f"{op}: {name} must be {' or '.join(dtypes)}, got {v.describe()}")
    shape = v.shape
    if len(shape) != len(dims) or not all(d is None or d == size for d, size in zip(dims, shape)):
        want = ", ".join("*" if d is None else str(d) for d in dims)
        raise ArgumentError(f"{op}: {name} must have shape [{want}], got {v.describe()}")
    if contiguous:
        if not v.contiguous():
            raise ArgumentError(f"{op}: {name} must be contiguous (row-major), got strides {list(v.strides)} "
                                f"for shape {list(v.shape)}")
    elif v.shape and v.shape[-1] != 1 and v.strides[-1] != 1 and 0 not in v.shape:
        raise ArgumentError(f"{op}: {name} must have unit stride in its last dimension, got strides "
                            f"{list(v.strides)}")
    if writable and v.readonly:
        raise ArgumentError(f"{op}: {name} is read-only")


def require_device(op, named, device):
    """Checks that every (name, View) in `named` is on `device` ("cpu" or "cuda") and that CUDA
    views share one ordinal; returns that ordinal (0 for the CPU)."""
    index = None
    for name, v in named:
        if v is None:
            continue
        if v.device != device:
            where = "the CPU" if device == CPU else "a CUDA device"
            raise ArgumentError(f"{op}: {name} must be on {where}, got {v.describe()}")
        if index is None:
            index = v.index
        elif v.index != index:
            raise ArgumentError(f"{op}: {name} is on cuda:{v.index} but the other tensors are on cuda:{index}")
    return index or 0
