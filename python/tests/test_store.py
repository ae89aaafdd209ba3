"""The offload store from Python: round trips, persistence, namespaces, batches, errors."""
import numpy as np
import pytest

import nvfp4mla


def open_store(root, cfg=None, **kwargs):
    cfg = cfg or nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    kwargs.setdefault("durable", False)
    return nvfp4mla.Store(root, cfg, tokens_per_block=4, layers_in_block=2, model_identity="toy-model@1", **kwargs)


def block(store, seed):
    return np.random.default_rng(seed).integers(0, 256, size=store.block_bytes, dtype=np.uint8)


def test_put_get_contains_and_reopen(tmp_path):
    with open_store(tmp_path, dram_capacity_bytes=1 << 20) as s:
        assert s.block_bytes == 2 * 4 * 368
        assert s.record_identity == "nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1"
        b = block(s, 1)
        s.put(b"key-1", b)
        s.put("key-2", b.tobytes())
        assert np.array_equal(s.get(b"key-1"), b) and np.array_equal(s.get("key-2"), b)
        assert s.get(b"absent") is None
        assert s.contains("key-1") and not s.contains("absent")
        assert s.stats()["dram"]["hits"] == 2
    with open_store(tmp_path) as s:  # the disk tier persists
        out = np.zeros(s.block_bytes, np.uint8)
        assert s.get(b"key-1", out=out) is out and np.array_equal(out, b)
        assert s.stats()["disk"]["hits"] == 1


def test_namespaces_are_isolated(tmp_path):
    with open_store(tmp_path) as s:
        s.put(b"k", block(s, 2))
        dir_a = s.dir
    other = nvfp4mla.FormatConfig(rope="fp8", scale_mode="implicit")
    with open_store(tmp_path, other) as s:
        assert s.dir != dir_a and s.get(b"k") is None


def test_batches(tmp_path):
    with open_store(tmp_path, io_threads=3) as s:
        keys = [f"b{i}".encode() for i in range(8)]
        blocks = [block(s, i) for i in range(8)]
        results = s.put_many(keys, blocks)
        assert [r.status for r in results] == ["stored"] * 8
        results, outs = s.get_many(keys + [b"absent"])
        assert [r.status for r in results] == ["hit"] * 8 + ["miss"]
        assert all(np.array_equal(o, b) for o, b in zip(outs, blocks))


def test_errors(tmp_path):
    s = open_store(tmp_path)
    with pytest.raises(nvfp4mla.ArgumentError, match=f"blocks of this namespace are {s.block_bytes} bytes, got 10"):
        s.put(b"k", np.zeros(10, np.uint8))
    with pytest.raises(nvfp4mla.ArgumentError, match="a key must be bytes or str"):
        s.put(3, block(s, 3))
    with pytest.raises(nvfp4mla.ArgumentError, match="2 keys but 1 blocks"):
        s.put_many([b"a", b"b"], [block(s, 4)])
    with pytest.raises(nvfp4mla.Error, match="lock|in use|held"):
        open_store(tmp_path)  # one store per namespace directory
    s.close()
    with pytest.raises(nvfp4mla.Error, match="store is closed"):
        s.get(b"k")
    with pytest.raises(nvfp4mla.Error, match="model"):
        nvfp4mla.Store(tmp_path, nvfp4mla.FormatConfig(), 4, 2, model_identity="")
    with pytest.raises(nvfp4mla.Error, match="SHA-256"):
        nvfp4mla.Store(tmp_path, nvfp4mla.FormatConfig(layer_scale=0.5), 4, 2, model_identity="m")


def test_sizes_outside_their_c_type_are_refused_not_wrapped(tmp_path):
    # ctypes wraps -1 to 2**64 - 1 bytes and keeps the low 32 bits of 2**32 + 4.
    with pytest.raises(nvfp4mla.ArgumentError, match=r"Store: dram_capacity_bytes must be in 0\.\..*, got -1"):
        open_store(tmp_path, dram_capacity_bytes=-1)
    with pytest.raises(nvfp4mla.ArgumentError, match="Store: disk_capacity_bytes"):
        open_store(tmp_path, disk_capacity_bytes=2 ** 64)
    with pytest.raises(nvfp4mla.ArgumentError, match="Store: tokens_per_block"):
        nvfp4mla.Store(tmp_path, nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic"), 2 ** 32 + 4, 2,
                       model_identity="m")
    with open_store(tmp_path, dram_capacity_bytes=2 ** 64 - 1) as s:  # the whole range is accepted
        assert s.stats()["dram"]["capacity_bytes"] == 2 ** 64 - 1
