"""The tiered KV offload store: a DRAM tier in front of a persistent, checksummed disk tier, for one
namespace named by the record ABI (docs/OFFLOAD.md). Calls release the GIL while they run."""
import os
import weakref
from collections import namedtuple
from ctypes import byref, c_char_p, c_int32, c_size_t, c_uint64, c_void_p

from . import _lib, _tensor
from ._lib import StoreOptions, StoreStatsC, lib
from .config import FormatConfig

OpResult = namedtuple("OpResult", "status error")  # status: "stored", "hit", "miss" or "failed"
_STATUS = ("stored", "hit", "miss", "failed")


def _key(key):
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise _lib.ArgumentError(f"store: a key must be bytes or str, got {type(key).__name__}")
    return bytes(key)


class Store:
    """A store for blocks of [layers_in_block][tokens_per_block][record_bytes] bytes.

    format: a FormatConfig (its native record ABI and record width name the namespace) or a native
    record identity string with ``record_bytes``. model_identity: any non-empty string naming the
    model (name + revision). Blocks written under one namespace are never read under another.

    put is write-through (durable on return unless ``durable=False``); get looks in DRAM, then on
    disk. Blocks are bytes-like objects or contiguous CPU tensors of ``block_bytes`` bytes."""

    def __init__(self, root, format, tokens_per_block, layers_in_block, model_identity, *, record_bytes=None,
                 tp_rank=0, tp_size=1, dcp_rank=0, dcp_size=1, dram_capacity_bytes=0, disk_capacity_bytes=None,
                 durable=True, io_threads=4):
        if isinstance(format, FormatConfig):
            identity, record_bytes = format.record_abi(), format.record_bytes
        elif isinstance(format, str) and record_bytes is not None:
            identity = format
        else:
            raise _lib.ArgumentError("Store: give a FormatConfig, or a record identity string with record_bytes=")

        def i32(value, name):
            return _lib.int32(value, "Store", name)

        def u64(value, name):
            return _lib.uint64(value, "Store", name)

        options = StoreOptions(identity.encode(), i32(record_bytes, "record_bytes"),
                               i32(tokens_per_block, "tokens_per_block"), i32(layers_in_block, "layers_in_block"),
                               str(model_identity).encode(), i32(tp_rank, "tp_rank"), i32(tp_size, "tp_size"),
                               i32(dcp_rank, "dcp_rank"), i32(dcp_size, "dcp_size"),
                               u64(dram_capacity_bytes, "dram_capacity_bytes"),
                               u64(disk_capacity_bytes or 0, "disk_capacity_bytes"), 1 if durable else 0,
                               i32(io_threads, "io_threads"))
        handle = c_void_p()
        _lib.call(lib.nvfp4mla_store_open, os.fsencode(root), byref(options), byref(handle))
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.nvfp4mla_store_close, handle)
        size = c_uint64()
        _lib.call(lib.nvfp4mla_store_block_bytes, handle, byref(size))
        self.block_bytes = size.value
        path = c_char_p()
        _lib.call(lib.nvfp4mla_store_dir, handle, byref(path))
        self.dir = os.fsdecode(path.value)
        self.record_identity = identity

    def close(self):
        """Finishes queued work and releases the namespace directory's lock."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _live(self):
        if not self._finalizer.alive:
            raise _lib.Error("store is closed")
        return self._handle

    def _block(self, op, block, writable):
        if isinstance(block, (bytes, bytearray, memoryview)):
            import numpy
            block = numpy.frombuffer(block, dtype=numpy.uint8)
        v = _tensor.view(block)
        if v.device != _tensor.CPU:
            raise _lib.ArgumentError(f"{op}: blocks must be in host memory, got {v.describe()}")
        if not v.contiguous():
            raise _lib.ArgumentError(f"{op}: the block must be contiguous")
        if writable and v.readonly:
            raise _lib.ArgumentError(f"{op}: the output block is read-only")
        size = _tensor.ITEMSIZE.get(v.dtype, 0)
        for extent in v.shape:
            size *= extent
        if size != self.block_bytes:
            raise _lib.ArgumentError(f"{op}: blocks of this namespace are {self.block_bytes} bytes, got {size}")
        return v

    def _new_block(self):
        import numpy
        return numpy.empty(self.block_bytes, dtype=numpy.uint8)

    def put(self, key, block):
        """Store a block under a key (bytes or str); replaces an older block with the same key."""
        k, v = _key(key), self._block("put", block, False)
        _lib.call(lib.nvfp4mla_store_put, self._live(), k, len(k), v.ptr, self.block_bytes)

    def get(self, key, out=None):
        """The block stored under ``key`` (into ``out``, else a new numpy uint8 array), or None on a
        miss. A returned block is complete and validated."""
        k = _key(key)
        out = self._new_block() if out is None else out
        v = self._block("get", out, True)
        hit = c_int32()
        _lib.call(lib.nvfp4mla_store_get, self._live(), k, len(k), v.ptr, self.block_bytes, byref(hit))
        return out if hit.value else None

    def contains(self, key):
        """Whether a block is stored under ``key`` (on disk; DRAM is write-through)."""
        k = _key(key)
        found = c_int32()
        _lib.call(lib.nvfp4mla_store_contains, self._live(), k, len(k), byref(found))
        return bool(found.value)

    def _batch(self, fn, keys, blocks):
        n = len(keys)
        if len(blocks) != n:
            raise _lib.ArgumentError(f"store batch: {n} keys but {len(blocks)} blocks")
        ks = [_key(k) for k in keys]
        key_ptrs = (c_char_p * n)(*ks)
        key_sizes = (c_size_t * n)(*(len(k) for k in ks))
        block_ptrs = (c_void_p * n)(*(v.ptr for v in blocks))
        status = (c_int32 * n)()
        _lib.call(fn, self._live(), n, key_ptrs, key_sizes, block_ptrs, status)
        return [OpResult(_STATUS[status[i]],
                         lib.nvfp4mla_store_item_error(i).decode() if status[i] == 3 else "") for i in range(n)]

    def put_many(self, keys, blocks):
        """Store many blocks in parallel on the store's I/O threads. Returns one OpResult per item
        ('stored' or 'failed' with the library's message); one failure does not stop the others."""
        views = [self._block("put_many", b, False) for b in blocks]
        return self._batch(lib.nvfp4mla_store_put_many, keys, views)

    def get_many(self, keys, outs=None):
        """Read many blocks in parallel. Returns (results, outs): per item 'hit', 'miss' or 'failed';
        outs are the given buffers or new numpy arrays (contents unspecified on a miss)."""
        outs = [self._new_block() for _ in keys] if outs is None else list(outs)
        views = [self._block("get_many", b, True) for b in outs]
        return self._batch(lib.nvfp4mla_store_get_many, keys, views), outs

    def stats(self):
        """Counters of both tiers: {'dram': {...}, 'disk': {...}}."""
        s = StoreStatsC()
        _lib.call(lib.nvfp4mla_store_stats_get, self._live(), byref(s))
        out = {"dram": {}, "disk": {}}
        for name, _ in StoreStatsC._fields_:
            tier, field = name.split("_", 1)
            out[tier][field] = getattr(s, name)
        return out
