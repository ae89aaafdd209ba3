"""encode/decode/write_cache/gather/scatter on the CPU: round trips, byte equality with the CLI,
paged-cache semantics and argument checks."""
import numpy as np
import pytest

import nvfp4mla
from conftest import (ALL_FORMATS, bf16_bits, config_args, format_id, random_tokens, read_safetensors,
                      write_safetensors)


def as_dtype(x, dtype):
    return bf16_bits(x) if dtype == "bfloat16" else x.astype(dtype)


# Each CLI run costs a process start (about a second with the CUDA libraries): every record dtype,
# RoPE encoding and scale mode, and every input type, once.
@pytest.mark.parametrize("f,dtype", [(ALL_FORMATS[0], "float32"), (ALL_FORMATS[1], "bfloat16"),
                                     (ALL_FORMATS[4], "float16"), (ALL_FORMATS[6], "bfloat16")],
                         ids=lambda v: format_id(v) if isinstance(v, dict) else v)
def test_encode_matches_the_cli_byte_for_byte(f, dtype, cli, tmp_path):
    kv_c, k_pe = random_tokens(37, seed=1, scale=1.0 if dtype != "float16" else 1e-2)
    kv_c[3, 7], k_pe[5, 1], kv_c[9, :16] = np.nan, -np.inf, 0.0  # sanitized alike; an all-zero group
    cfg = nvfp4mla.FormatConfig(**f)
    write_safetensors(tmp_path / "in.st", {"kv_c": as_dtype(kv_c, dtype), "k_pe": as_dtype(k_pe, dtype)})
    cli("encode", *config_args(f), "--input", tmp_path / "in.st", "--output", tmp_path / "out.st")
    want = read_safetensors(tmp_path / "out.st")["records"]
    got = nvfp4mla.encode(as_dtype(kv_c, dtype), as_dtype(k_pe, dtype), cfg)
    assert got.dtype == np.uint8 and got.shape == (37, cfg.record_bytes)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("f", [ALL_FORMATS[5]], ids=format_id)
def test_decode_matches_the_cli(f, cli, tmp_path):
    kv_c, k_pe = random_tokens(9, seed=2)
    cfg = nvfp4mla.FormatConfig(**f)
    records = nvfp4mla.encode(kv_c, k_pe, cfg)
    write_safetensors(tmp_path / "rec.st", {"records": records})
    cli("decode", *config_args(f), "--input", tmp_path / "rec.st", "--output", tmp_path / "dec.st")
    want = read_safetensors(tmp_path / "dec.st")
    got_kv, got_pe = nvfp4mla.decode(records, cfg)
    assert np.array_equal(got_kv, want["kv_c"]) and np.array_equal(got_pe, want["k_pe"])


@pytest.mark.parametrize("f", ALL_FORMATS, ids=format_id)
def test_round_trip_error_is_the_formats(f):
    kv_c, k_pe = random_tokens(64, seed=3)
    cfg = nvfp4mla.FormatConfig(**f)
    got_kv, got_pe = nvfp4mla.decode(nvfp4mla.encode(kv_c, k_pe, cfg), cfg)
    if cfg.cache_dtype == "bf16":  # inputs are exact in BF16
        assert np.array_equal(got_kv, kv_c) and np.array_equal(got_pe, k_pe)
        return
    rel = np.linalg.norm(got_kv - kv_c) / np.linalg.norm(kv_c)
    assert rel < (0.08 if cfg.cache_dtype == "fp8_ds_mla" else 0.25)
    if cfg.rope == "bf16":
        assert np.array_equal(got_pe, k_pe)


def test_input_types_give_the_same_records():
    kv_c, k_pe = random_tokens(16, seed=4, scale=0.01)  # exact in float16 too at this scale
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    want = nvfp4mla.encode(kv_c, k_pe, cfg)
    for dtype in ("bfloat16", "float16"):
        assert np.array_equal(nvfp4mla.encode(as_dtype(kv_c, dtype), as_dtype(k_pe, dtype), cfg), want)


def test_encode_reads_strided_rows():
    kv_c, k_pe = random_tokens(8, seed=5)
    joint = np.concatenate([kv_c, k_pe], axis=1)  # [8, 576]: vLLM's kv slices
    cfg = nvfp4mla.FormatConfig()
    assert np.array_equal(nvfp4mla.encode(joint[:, :512], joint[:, 512:], cfg), nvfp4mla.encode(kv_c, k_pe, cfg))


def test_encode_takes_one_token_of_any_row_stride():
    kv_c, k_pe = random_tokens(1, seed=16)
    cfg = nvfp4mla.FormatConfig()
    want = nvfp4mla.encode(kv_c, k_pe, cfg)
    one_kv, one_pe = kv_c[0][None], k_pe[0][None]  # numpy reports a row stride of 0 for these
    assert one_kv.strides[0] == 0 and one_pe.strides[0] == 0
    assert np.array_equal(nvfp4mla.encode(one_kv, one_pe, cfg), want)


def test_decode_accepts_paged_records_and_outputs():
    cfg = nvfp4mla.FormatConfig(rope="fp8")
    kv_c, k_pe = random_tokens(12, seed=6)
    records = nvfp4mla.encode(kv_c, k_pe, cfg).reshape(3, 4, cfg.record_bytes)
    out_kv, out_pe = np.empty((12, 512), np.float32), np.empty((12, 64), np.float32)
    got = nvfp4mla.decode(records, cfg, out_kv, out_pe)
    assert got[0] is out_kv and got[1] is out_pe
    assert np.array_equal(out_kv, nvfp4mla.decode(records.reshape(12, -1), cfg)[0])


def test_write_cache_places_records_by_slot():
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    kv_c, k_pe = random_tokens(6, seed=7)
    records = nvfp4mla.encode(kv_c, k_pe, cfg)
    cache = np.full((4, 4, cfg.record_bytes), 0xAB, np.uint8)
    slots = np.array([5, -1, 0, 15, 9, 5], np.int64)  # -1 skipped; slot 5 twice: the later token wins
    nvfp4mla.write_cache(kv_c, k_pe, cache, slots, cfg)
    flat = cache.reshape(16, -1)
    assert np.array_equal(flat[0], records[2]) and np.array_equal(flat[15], records[3])
    assert np.array_equal(flat[9], records[4]) and np.array_equal(flat[5], records[5])
    untouched = [s for s in range(16) if s not in (0, 5, 9, 15)]
    assert (flat[untouched] == 0xAB).all()


def test_write_cache_out_of_range_slot_raises_before_writing():
    cfg = nvfp4mla.FormatConfig()
    kv_c, k_pe = random_tokens(3, seed=8)
    cache = np.zeros((2, 4, cfg.record_bytes), np.uint8)
    with pytest.raises(nvfp4mla.Error, match="slot 8 .entry 2. is outside the paged cache's capacity of 8"):
        nvfp4mla.write_cache(kv_c, k_pe, cache, np.array([0, 1, 8], np.int64), cfg)
    assert not cache.any()


def test_gather_and_scatter_records():
    rb = 368
    rng = np.random.default_rng(9)
    cache = rng.integers(0, 256, size=(3, 4, rb), dtype=np.uint8)
    count = np.zeros(1, np.uint64)
    slots = np.array([7, -3, 11, 12, 0], np.int64)
    got = nvfp4mla.gather_records(cache, slots, error_count=count)
    flat = cache.reshape(12, rb)
    assert np.array_equal(got[0], flat[7]) and np.array_equal(got[2], flat[11]) and np.array_equal(got[4], flat[0])
    assert not got[1].any() and not got[3].any()  # negative: zero record; >= capacity: zero and counted
    assert count[0] == 1
    target = np.zeros_like(cache)
    nvfp4mla.scatter_records(got, slots, target, error_count=count)
    tflat = target.reshape(12, rb)
    assert np.array_equal(tflat[[7, 11, 0]], flat[[7, 11, 0]])
    assert not np.delete(tflat, [7, 11, 0], axis=0).any()
    assert count[0] == 2


# ---- argument checks -------------------------------------------------------------------------------

def test_wrong_dtypes_and_shapes_are_named():
    cfg = nvfp4mla.FormatConfig()
    kv_c, k_pe = random_tokens(2, seed=10)
    with pytest.raises(nvfp4mla.ArgumentError, match=r"encode: kv_c must be bfloat16 or float16 or float32 or uint16, "
                                                     r"got float64 \[2, 512\] on cpu"):
        nvfp4mla.encode(kv_c.astype(np.float64), k_pe, cfg)
    with pytest.raises(nvfp4mla.ArgumentError, match=r"encode: kv_c must have shape \[\*, 512\], got float32 \[2, 500\]"):
        nvfp4mla.encode(kv_c[:, :500], k_pe, cfg)
    with pytest.raises(nvfp4mla.ArgumentError, match=r"k_pe must have shape \[2, 64\]"):
        nvfp4mla.encode(kv_c, k_pe[:1], cfg)
    with pytest.raises(nvfp4mla.ArgumentError, match="kv_c is float32 but k_pe is float16"):
        nvfp4mla.encode(kv_c, k_pe.astype(np.float16), cfg)
    with pytest.raises(nvfp4mla.ArgumentError, match="expected a tensor"):
        nvfp4mla.encode(kv_c.tolist(), k_pe, cfg)


def test_strides_are_checked():
    cfg = nvfp4mla.FormatConfig()
    kv_c, k_pe = random_tokens(4, seed=11)
    with pytest.raises(nvfp4mla.ArgumentError, match="unit stride in its last dimension"):
        nvfp4mla.encode(np.asfortranarray(kv_c), k_pe, cfg)
    cache = np.zeros((8, 2 * cfg.record_bytes), np.uint8)[:, :cfg.record_bytes]
    with pytest.raises(nvfp4mla.ArgumentError, match="cache must be contiguous"):
        nvfp4mla.write_cache(kv_c, k_pe, cache, np.arange(4, dtype=np.int64), cfg)
    # The CPU writer reads dense rows.
    joint = np.concatenate([kv_c, k_pe], axis=1)
    with pytest.raises(nvfp4mla.ArgumentError, match="kv_c must be contiguous"):
        nvfp4mla.write_cache(joint[:, :512], joint[:, 512:], np.zeros((8, cfg.record_bytes), np.uint8),
                             np.arange(4, dtype=np.int64), cfg)


def test_non_native_byte_order_is_refused():
    """numpy names a byte-swapped float32 'float32' too: it is refused, not read in native order."""
    cfg = nvfp4mla.FormatConfig()
    kv_c, k_pe = random_tokens(2, seed=17)
    swapped = kv_c.astype(kv_c.dtype.newbyteorder("S"))
    with pytest.raises(nvfp4mla.ArgumentError, match="byte order"):
        nvfp4mla.encode(swapped, k_pe, cfg)
    slots = np.arange(2, dtype=np.dtype(np.int64).newbyteorder("S"))
    with pytest.raises(nvfp4mla.ArgumentError, match="byte order"):
        nvfp4mla.write_cache(kv_c, k_pe, np.zeros((4, cfg.record_bytes), np.uint8), slots, cfg)
    native = swapped.astype(swapped.dtype.newbyteorder("="))
    assert np.array_equal(nvfp4mla.encode(native, k_pe, cfg), nvfp4mla.encode(kv_c, k_pe, cfg))


def test_cache_width_and_slot_dtype_are_checked():
    cfg = nvfp4mla.FormatConfig()
    kv_c, k_pe = random_tokens(2, seed=12)
    with pytest.raises(nvfp4mla.ArgumentError, match="cache holds 368-byte records but the format uses 432"):
        nvfp4mla.write_cache(kv_c, k_pe, np.zeros((4, 368), np.uint8), np.arange(2, dtype=np.int64), cfg)
    with pytest.raises(nvfp4mla.ArgumentError, match=r"slot_mapping must be int64, got int32 \[2\]"):
        nvfp4mla.write_cache(kv_c, k_pe, np.zeros((4, 432), np.uint8), np.arange(2, dtype=np.int32), cfg)
    with pytest.raises(nvfp4mla.ArgumentError, match="cache must be uint8"):
        nvfp4mla.write_cache(kv_c, k_pe, np.zeros((4, 432), np.int8), np.arange(2, dtype=np.int64), cfg)


def test_read_only_outputs_are_rejected():
    cfg = nvfp4mla.FormatConfig()
    kv_c, k_pe = random_tokens(2, seed=13)
    out = np.zeros((2, cfg.record_bytes), np.uint8)
    out.flags.writeable = False
    with pytest.raises(nvfp4mla.ArgumentError, match="out is read-only"):
        nvfp4mla.encode(kv_c, k_pe, cfg, out=out)


def test_static_config_without_layer_cannot_encode(calibration_file):
    cfg = nvfp4mla.FormatConfig(scales_file=calibration_file)
    kv_c, k_pe = random_tokens(1, seed=14)
    with pytest.raises(nvfp4mla.Error, match="choose which layer"):
        nvfp4mla.encode(kv_c, k_pe, cfg)


def test_dlpack_objects_are_borrowed():
    """Any __dlpack__ producer works (here a wrapper that only speaks DLPack)."""
    class OnlyDLPack:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    cfg = nvfp4mla.FormatConfig(rope="fp8")
    kv_c, k_pe = random_tokens(5, seed=15)
    out = np.zeros((5, cfg.record_bytes), np.uint8)
    nvfp4mla.encode(OnlyDLPack(kv_c), OnlyDLPack(k_pe), cfg, out=OnlyDLPack(out))
    assert np.array_equal(out, nvfp4mla.encode(kv_c, k_pe, cfg))
