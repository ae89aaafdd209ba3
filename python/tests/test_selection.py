"""DSA selection on the CPU: index keys and the paged index cache, indexer logits, top-k and fused
selection, against the CLI byte for byte, independent numpy references, and argument checks."""
import numpy as np
import pytest

import nvfp4mla
from conftest import bf16_bits, bf16_values, read_safetensors, write_safetensors

RB = nvfp4mla.INDEX_KEY_RECORD_BYTES


def e4m3_values(b):
    """float64 values of E4M3 bytes (0x7F/0xFF: NaN)."""
    b = np.asarray(b, np.uint8).astype(np.int64)
    e, m = (b >> 3) & 0xF, b & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * np.exp2(e - 7.0))
    v = np.where((b & 0x7F) == 0x7F, np.nan, v)
    return np.where(b & 0x80, -v, v)


def random_keys(n, seed):
    rng = np.random.default_rng(seed)
    mags = np.exp2(rng.integers(-8, 6, size=(n, 1))).astype(np.float32)
    return bf16_values(bf16_bits(rng.standard_normal((n, 128)).astype(np.float32) * mags))


def random_query(rows, heads, seed):
    """q: E4M3 bytes without NaN codes, weights float32."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 256, size=(rows, heads, 128), dtype=np.uint8)
    q[(q & 0x7F) == 0x7F] = 0x3C
    w = rng.standard_normal((rows, heads)).astype(np.float32)
    return q, w


def split_records(records):
    return records[:, :128], records[:, 128:].copy().view(np.float32).reshape(-1)


def numpy_logits(q, w, records, starts, ends, width):
    """logit[r, j] = s * sum_h w * relu(q . k) in float64 and the bound A of docs/SELECTION.md."""
    values, scales = split_records(records)
    kv = e4m3_values(values)
    qv = e4m3_values(q)
    out = np.full((q.shape[0], width), -np.inf)
    bound = np.zeros_like(out)
    for r in range(q.shape[0]):
        keys = kv[starts[r]:ends[r]]
        dots = np.einsum("hd,nd->hn", qv[r], keys)
        out[r, :len(keys)] = scales[starts[r]:ends[r]] * (w[r].astype(np.float64) @ np.maximum(dots, 0))
        bound[r, :len(keys)] = scales[starts[r]:ends[r]] * (np.abs(w[r]).astype(np.float64) @
                                                            (np.abs(qv[r]) @ np.abs(keys).T))
    return out, bound


def numpy_topk(values, lengths, k, positions=None):
    rows = values.shape[0]
    idx = np.full((rows, k), -1, np.int32)
    count = np.zeros(rows, np.int32)
    for r in range(rows):
        n = values.shape[1] if lengths is None else lengths[r]
        v = values[r, :n]
        pos = np.arange(n) if positions is None else positions[r, :n]
        ok = ~np.isnan(v) & (v != -np.inf)
        v, pos = v[ok], pos[ok]
        order = np.lexsort((pos, -v.astype(np.float64)))[:k]
        chosen = np.sort(pos[order])
        idx[r, :len(chosen)] = chosen
        count[r] = len(chosen)
    return idx, count


# ---- index keys and the index cache ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_encode_index_keys_matches_the_cli(dtype, cli, tmp_path):
    keys = random_keys(41, seed=1)
    keys[2, 5], keys[3, 9], keys[4] = np.nan, np.inf, 0.0  # sanitized alike; an all-zero key
    given = bf16_bits(keys) if dtype == "bfloat16" else keys
    write_safetensors(tmp_path / "in.st", {"keys": given})
    cli("index", "encode", "--input", tmp_path / "in.st", "--output", tmp_path / "out.st")
    want = read_safetensors(tmp_path / "out.st")["records"]
    got = nvfp4mla.encode_index_keys(given)
    assert got.dtype == np.uint8 and got.shape == (41, RB)
    assert np.array_equal(got, want)


def test_encode_index_keys_follows_the_recipe():
    keys = random_keys(64, seed=2)
    keys[0] = 0.0
    records = nvfp4mla.encode_index_keys(keys)
    values, scales = split_records(records)
    assert scales[0] == 1.0
    amax = np.abs(keys).max(axis=1)
    # The smallest power of two with amax <= 448 p.
    assert np.all(np.log2(scales) == np.round(np.log2(scales)))
    assert np.all(amax[1:] <= 448 * scales[1:]) and np.all(amax[1:] > 224 * scales[1:])
    decoded = e4m3_values(values) * scales[:, None]
    assert np.all(np.abs(decoded - keys) <= np.abs(keys) * 2.0 ** -4 + scales[:, None] * 2.0 ** -9)
    # Strided rows and the input types give the same records.
    wide = np.zeros((64, 256), np.float32)
    wide[:, :128] = keys
    assert np.array_equal(nvfp4mla.encode_index_keys(wide[:, :128]), records)
    assert np.array_equal(nvfp4mla.encode_index_keys(bf16_bits(keys)), records)


def test_encode_index_keys_takes_one_key_of_any_row_stride():
    keys = random_keys(1, seed=30)
    one = keys[0][None]  # numpy reports a row stride of 0
    assert one.strides[0] == 0
    assert np.array_equal(nvfp4mla.encode_index_keys(one), nvfp4mla.encode_index_keys(keys))


def cache_bytes_of(records, slots, num_pages, page_size, fill):
    """The index cache a writer must leave: index_key.h's layout, built here byte by byte."""
    cache = np.full((num_pages, page_size * RB), fill, np.uint8)
    for rec, slot in zip(records, slots):
        if slot < 0:
            continue
        page, o = divmod(int(slot), page_size)
        cache[page, o * 128:(o + 1) * 128] = rec[:128]
        cache[page, page_size * 128 + 4 * o:page_size * 128 + 4 * o + 4] = rec[128:]
    return cache


@pytest.mark.parametrize("page_size", [64, 1, 16])
def test_write_index_cache_layout(page_size):
    keys = random_keys(30, seed=3)
    num_pages = 64 // page_size + 1
    rng = np.random.default_rng(4)
    slots = rng.permutation(num_pages * page_size)[:30].astype(np.int64)
    slots[::5] = -1
    cache = np.full((num_pages, page_size * RB), 0xA5, np.uint8)
    assert nvfp4mla.write_index_cache(keys, cache, slots, page_size) is None
    want = cache_bytes_of(nvfp4mla.encode_index_keys(keys), slots, num_pages, page_size, 0xA5)
    assert np.array_equal(cache, want)
    # [num_pages, page_size, 132] is the same memory.
    cache3 = np.full((num_pages, page_size, RB), 0xA5, np.uint8)
    nvfp4mla.write_index_cache(keys, cache3, slots, page_size)
    assert np.array_equal(cache3.reshape(num_pages, -1), want)
    # Gathers read back what was written.
    live = slots[slots >= 0]
    records = nvfp4mla.encode_index_keys(keys)[slots >= 0]
    assert np.array_equal(nvfp4mla.gather_index_records(cache, live, page_size=page_size), records)
    values, scales = nvfp4mla.gather_index_keys(cache, live, page_size=page_size)
    want_values, want_scales = split_records(records)
    assert np.array_equal(values, want_values) and np.array_equal(scales, want_scales)


def test_write_index_cache_duplicate_slot_keeps_the_later_key():
    keys = random_keys(2, seed=5)
    cache = np.zeros((1, 64 * RB), np.uint8)
    nvfp4mla.write_index_cache(keys, cache, np.array([7, 7]))
    assert np.array_equal(nvfp4mla.gather_index_records(cache, np.array([7])), nvfp4mla.encode_index_keys(keys[1:]))


def test_index_cache_bad_slots_raise_and_write_nothing():
    keys = random_keys(3, seed=6)
    cache = np.full((2, 64 * RB), 0x11, np.uint8)
    with pytest.raises(nvfp4mla.Error, match="128"):
        nvfp4mla.write_index_cache(keys, cache, np.array([0, 128, 1]))
    assert (cache == 0x11).all()
    with pytest.raises(nvfp4mla.Error):
        nvfp4mla.gather_index_records(cache, np.array([0, -1]))
    with pytest.raises(nvfp4mla.Error):
        nvfp4mla.gather_index_keys(cache, np.array([200]))


def test_write_index_cache_on_the_cpu_sets_a_given_counter():
    """The CPU writer raises on a bad slot, so a counter given to it is set to 0, as the GPU sets
    it (nvfp4mla.torch.write_index_cache returned an uninitialised one)."""
    keys, cache = random_keys(3, seed=32), np.zeros((2, 64 * RB), np.uint8)
    for dtype in (np.int64, np.uint64):
        count = np.full(1, 7, dtype)
        assert nvfp4mla.write_index_cache(keys, cache, np.arange(3), invalid_count=count) is None
        assert count.tolist() == [0]
    count = np.full(1, 7, np.int64)
    with pytest.raises(nvfp4mla.Error, match="slot"):
        nvfp4mla.write_index_cache(keys, cache, np.array([0, 128, 1]), invalid_count=count)
    assert count.tolist() == [7]
    with pytest.raises(nvfp4mla.ArgumentError, match="invalid_count must be uint64 or int64"):
        nvfp4mla.write_index_cache(keys, cache, np.arange(3), invalid_count=np.zeros(1, np.int32))


def test_index_cache_argument_checks():
    keys = random_keys(3, seed=7)
    slots = np.arange(3)
    cache = np.zeros((2, 64 * RB), np.uint8)
    with pytest.raises(nvfp4mla.ArgumentError, match="page_size 32 needs"):
        nvfp4mla.write_index_cache(keys, cache, slots, page_size=32)
    with pytest.raises(nvfp4mla.ArgumentError, match="keys must have shape"):
        nvfp4mla.write_index_cache(keys[:, :64], cache, slots)
    with pytest.raises(nvfp4mla.ArgumentError, match="slot_mapping must be int64"):
        nvfp4mla.write_index_cache(keys, cache, slots.astype(np.int32))
    with pytest.raises(nvfp4mla.ArgumentError, match="cache must be uint8"):
        nvfp4mla.write_index_cache(keys, cache.view(np.int8), slots)
    with pytest.raises(nvfp4mla.ArgumentError, match="contiguous"):
        nvfp4mla.write_index_cache(keys, np.zeros((2, 2 * 64 * RB), np.uint8)[:, ::2], slots)
    with pytest.raises(nvfp4mla.ArgumentError, match="contiguous"):  # the CPU writer reads packed rows
        nvfp4mla.write_index_cache(np.zeros((3, 256), np.float32)[:, :128], cache, slots)
    ro = cache.copy()
    ro.flags.writeable = False
    with pytest.raises(nvfp4mla.ArgumentError, match="read-only"):
        nvfp4mla.write_index_cache(keys, ro, slots)


# ---- indexer logits ----------------------------------------------------------------------------------

def test_indexer_logits_ragged_matches_numpy():
    q, w = random_query(5, 16, seed=8)
    records = nvfp4mla.encode_index_keys(random_keys(90, seed=9))
    starts = np.array([0, 10, 30, 90, 5], np.int32)
    ends = np.array([40, 10, 90, 90, 6], np.int32)
    got = nvfp4mla.indexer_logits(q, w, records, starts, ends)
    assert got.shape == (5, 60) and got.dtype == np.float32
    want, bound = numpy_logits(q, w, records, starts, ends, 60)
    assert np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    # One rounding to fp32 of an exact-to-double sum.
    assert np.all(np.abs(got[finite] - want[finite]) <= 2.0 ** -23 * np.abs(want[finite]) + 2.0 ** -40 * bound[finite])
    # Values + scales give the same logits as the records.
    values, scales = split_records(records)
    same = nvfp4mla.indexer_logits(q, w, values, starts, ends, np.empty((5, 64), np.float32), key_scales=scales)
    assert np.array_equal(same[:, :60], got) and np.all(same[:, 60:] == -np.inf)


def test_indexer_logits_paged_equals_ragged_over_the_gathered_keys():
    page_size, next_n = 16, 2
    keys = random_keys(200, seed=10)
    cache = np.zeros((16, page_size * RB), np.uint8)
    nvfp4mla.write_index_cache(keys, cache, np.arange(200) + 40, page_size)  # slots 40..239
    q, w = random_query(3 * next_n, 8, seed=11)
    table = np.array([[2, 3, 4, 5, 6, 7, 8, 9], [14, 13, 12, 11, 0, 0, 0, 0], [5, 6, 7, 8, 9, 10, 11, 12]], np.int32)
    lens = np.array([120, 50, 0], np.int32)
    got = nvfp4mla.indexer_logits_paged(q, w, cache, table, lens, next_n=next_n, page_size=page_size)
    assert got.shape == (6, 8 * page_size)
    for b in range(3):
        slots = (table[b, np.arange(lens[b]) // page_size].astype(np.int64) * page_size +
                 np.arange(lens[b]) % page_size)
        records = nvfp4mla.gather_index_records(cache, slots, page_size=page_size)
        rows = slice(b * next_n, (b + 1) * next_n)
        length = np.maximum(0, lens[b] - next_n + np.arange(next_n) + 1).astype(np.int32)
        want = nvfp4mla.indexer_logits(q[rows], w[rows], records, np.zeros(next_n, np.int32), length,
                                       np.empty((next_n, 8 * page_size), np.float32))
        assert np.array_equal(got[rows], want)


def test_indexer_argument_checks():
    q, w = random_query(2, 4, seed=12)
    records = nvfp4mla.encode_index_keys(random_keys(8, seed=13))
    r = np.zeros(2, np.int32), np.full(2, 8, np.int32)
    with pytest.raises(nvfp4mla.ArgumentError, match="q must be uint8 or float8_e4m3fn"):
        nvfp4mla.indexer_logits(q.astype(np.float32), w, records, *r)
    with pytest.raises(nvfp4mla.ArgumentError, match=r"weights must have shape \[2, 4\]"):
        nvfp4mla.indexer_logits(q, w[:, :3], records, *r)
    with pytest.raises(nvfp4mla.ArgumentError, match="row_ends must be int32"):
        nvfp4mla.indexer_logits(q, w, records, r[0], r[1].astype(np.int64))
    with pytest.raises(nvfp4mla.Error, match="row 1"):  # the library names the bad range
        nvfp4mla.indexer_logits(q, w, records, r[0], np.array([8, 9], np.int32), np.zeros((2, 9), np.float32))
    q65, w65 = random_query(1, 65, seed=14)
    with pytest.raises(nvfp4mla.Error, match="heads"):
        nvfp4mla.indexer_logits(q65, w65, records, r[0][:1], r[1][:1])
    cache = np.zeros((2, 64 * RB), np.uint8)
    with pytest.raises(nvfp4mla.ArgumentError, match="next_n"):
        nvfp4mla.indexer_logits_paged(q, w, cache, np.zeros((1, 2), np.int32), np.ones(1, np.int32), next_n=1)
    with pytest.raises(nvfp4mla.Error, match="block_table"):
        nvfp4mla.indexer_logits_paged(q, w, cache, np.array([[0], [5]], np.int32), np.full(2, 10, np.int32))


# ---- top-k ---------------------------------------------------------------------------------------------

def adversarial_logits(rows, columns, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-8, 8, size=(rows, columns)).astype(np.float32)  # many ties
    x[0, ::7] = np.nan
    x[1, ::3] = -np.inf
    x[2, 5], x[2, 9] = np.inf, -0.0
    x[3] = 0.0
    return x


def test_topk_matches_numpy():
    x = adversarial_logits(6, 300, seed=15)
    lengths = np.array([300, 300, 17, 300, 0, 250], np.int32)
    for k in (1, 16, 256, 400):
        idx, count = nvfp4mla.topk(x, lengths, k)
        want_idx, want_count = numpy_topk(x, lengths, k)
        assert np.array_equal(idx, want_idx) and np.array_equal(count, want_count)
    idx, count = nvfp4mla.topk(x, None, 20)
    assert np.array_equal(idx, numpy_topk(x, None, 20)[0])


def test_topk_values_positions_and_offset():
    x = adversarial_logits(4, 64, seed=16)
    values = np.empty((4, 8), np.float32)
    idx, _ = nvfp4mla.topk(x, None, 8, values=values, position_offset=1000)
    base, _ = nvfp4mla.topk(x, None, 8)
    assert np.array_equal(idx[base >= 0], base[base >= 0] + 1000)
    rows = np.arange(4)[:, None]
    chosen = np.where(base >= 0, x[rows, np.maximum(base, 0)], -np.inf)
    assert np.array_equal(values.view(np.uint32), chosen.astype(np.float32).view(np.uint32))
    positions = (np.arange(64, dtype=np.int32) * 3)[None].repeat(4, 0)
    idx, _ = nvfp4mla.topk(x, None, 8, positions=positions)
    assert np.array_equal(idx[base >= 0], base[base >= 0] * 3)
    with pytest.raises(nvfp4mla.Error, match="positions"):
        nvfp4mla.topk(x, None, 8, positions=positions[:, ::-1].copy())


def run_select(cli, tmp_path, tensors, *flags):
    write_safetensors(tmp_path / "sel.st", tensors)
    cli("select", "--input", tmp_path / "sel.st", "--output", tmp_path / "out.st", *flags)
    return read_safetensors(tmp_path / "out.st")


def test_topk_matches_the_cli_with_the_slot_transform(cli, tmp_path):
    x = adversarial_logits(6, 200, seed=17)
    lengths = np.array([200, 150, 17, 200, 0, 130], np.int32)
    table = np.array([[3, 0, 7, 1], [6, 5, 4, 2], [8, 9, 10, 11]], np.int32)
    want = run_select(cli, tmp_path, {"logits": x, "lengths": lengths, "block_table": table}, "--k", 64,
                      "--page-size", 64, "--rows-per-request", 2, "--capacity", 12 * 64)
    idx, count = nvfp4mla.topk(x, lengths, 64, block_table=table, page_size=64, rows_per_request=2,
                               capacity=12 * 64)
    assert np.array_equal(idx, want["indices"]) and np.array_equal(count, want["topk_length"])
    # The slots are the positions through the table.
    pos, _ = nvfp4mla.topk(x, lengths, 64)
    req = (np.arange(6) // 2)[:, None]
    mapped = table[req, np.maximum(pos, 0) // 64] * 64 + np.maximum(pos, 0) % 64
    assert np.array_equal(idx, np.where(pos >= 0, mapped, -1))
    with pytest.raises(nvfp4mla.Error, match="block_table"):  # a slot past the cache
        nvfp4mla.topk(x, lengths, 64, block_table=table, page_size=64, rows_per_request=2, capacity=8 * 64)
    with pytest.raises(nvfp4mla.ArgumentError, match="capacity"):
        nvfp4mla.topk(x, lengths, 64, block_table=table, page_size=64)


def test_logits_and_selection_match_the_cli_scores_form(cli, tmp_path):
    q, w = random_query(4, 8, seed=18)
    records = nvfp4mla.encode_index_keys(random_keys(300, seed=19))
    lengths = np.array([300, 120, 0, 299], np.int32)
    want = run_select(cli, tmp_path, {"q": q, "weights": w, "records": records, "lengths": lengths}, "--k", 50,
                      "--logits-out")
    logits = nvfp4mla.indexer_logits(q, w, records, np.zeros(4, np.int32), lengths,
                                     np.empty((4, 300), np.float32))
    assert np.array_equal(logits.view(np.uint32), want["logits"].view(np.uint32))
    idx, count = nvfp4mla.topk(logits, lengths, 50)
    assert np.array_equal(idx, want["indices"]) and np.array_equal(count, want["topk_length"])


def test_topk_argument_checks():
    x = adversarial_logits(4, 32, seed=20)
    with pytest.raises(nvfp4mla.ArgumentError, match="k must be in 1..4096"):
        nvfp4mla.topk(x, None, 0)
    with pytest.raises(nvfp4mla.ArgumentError, match="logits must be float32"):
        nvfp4mla.topk(x.astype(np.float64), None, 4)
    with pytest.raises(nvfp4mla.ArgumentError, match="lengths must have shape"):
        nvfp4mla.topk(x, np.zeros(3, np.int32), 4)
    with pytest.raises(nvfp4mla.Error, match="length"):
        nvfp4mla.topk(x, np.array([1, 2, 33, 4], np.int32), 4)
    with pytest.raises(nvfp4mla.ArgumentError, match="indices must have shape"):
        nvfp4mla.topk(x, None, 4, indices=np.zeros((4, 5), np.int32))
    with pytest.raises(nvfp4mla.ArgumentError, match="unit stride"):
        nvfp4mla.topk(np.zeros((4, 64), np.float32)[:, ::2], None, 4)
    # Strided rows are read in place.
    wide = np.full((4, 48), 99, np.float32)
    wide[:, :32] = x
    assert np.array_equal(nvfp4mla.topk(wide[:, :32], None, 6)[0], nvfp4mla.topk(x, None, 6)[0])


def test_plan_topk():
    small = nvfp4mla.plan_topk(64, 4096, sm_count=132)
    assert small.kernel == "row_per_cta" and small.workspace_bytes == 0
    big = nvfp4mla.plan_topk(1, 1 << 20, sm_count=132)
    assert big.kernel == "resident_rows" and big.segments > 1 and big.workspace_bytes > 0
    many = nvfp4mla.plan_topk(16, 1 << 20, sm_count=132)
    assert many.kernel == "split_rows" and many.segments > 1 and many.workspace_bytes > 0
    assert nvfp4mla.TopkPlan.from_list(big.as_list()).as_list() == big.as_list()
    with pytest.raises(nvfp4mla.Error, match="SM"):
        nvfp4mla.plan_topk(1, 10, sm_count=0)


# ---- fused selection ---------------------------------------------------------------------------------

def paged_problem(seed, requests=3, next_n=2, page_size=16, heads=8):
    keys = random_keys(300, seed=seed)
    cache = np.zeros((24, page_size * RB), np.uint8)
    slots = np.random.default_rng(seed).permutation(24 * page_size)[:300].astype(np.int64)
    nvfp4mla.write_index_cache(keys, cache, slots, page_size)
    q, w = random_query(requests * next_n, heads, seed + 1)
    table = np.random.default_rng(seed + 2).permutation(24)[:requests * 8].reshape(requests, 8).astype(np.int32)
    lens = np.array([128, 37, 1][:requests], np.int32)
    return q, w, cache, table, lens


@pytest.mark.parametrize("chunk", [0, 16, 48])
def test_fused_select_equals_logits_then_topk(chunk):
    q, w, cache, table, lens = paged_problem(21)
    plan = nvfp4mla.plan_fused_select(3, 128, 20, next_n=2, heads=8, page_size=16, chunk=chunk, sm_count=132)
    assert chunk == 0 or plan.chunk == chunk
    logits = nvfp4mla.indexer_logits_paged(q, w, cache, table, lens, next_n=2, page_size=16)
    lengths = np.maximum(0, lens.repeat(2) - 2 + np.tile(np.arange(2), 3) + 1).astype(np.int32)
    want_pos, want_count = nvfp4mla.topk(logits, lengths, 20)
    idx, count = nvfp4mla.fused_select(q, w, cache, table, lens, plan)
    assert np.array_equal(idx, want_pos) and np.array_equal(count, want_count)
    slots, _ = nvfp4mla.fused_select(q, w, cache, table, lens, plan, slot_ids=True)
    want_slots, _ = nvfp4mla.topk(logits, lengths, 20, block_table=table, page_size=16, rows_per_request=2,
                                  capacity=24 * 16)
    assert np.array_equal(slots, want_slots)


def test_fused_select_ragged_equals_logits_then_topk():
    q, w = random_query(4, 8, seed=22)
    records = nvfp4mla.encode_index_keys(random_keys(200, seed=23))
    starts, ends = np.array([0, 50, 200, 10], np.int32), np.array([200, 90, 200, 11], np.int32)
    plan = nvfp4mla.plan_fused_select_ragged(4, 200, 30, heads=8, chunk=64, sm_count=132)
    logits = nvfp4mla.indexer_logits(q, w, records, starts, ends)
    want = nvfp4mla.topk(logits, ends - starts, 30)
    values = np.empty((4, 30), np.float32)
    got = nvfp4mla.fused_select_ragged(q, w, records, starts, ends, plan, values=values)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_paged_block_table_rows_must_be_contiguous():
    """The library takes a block table's row stride for its width: a column slice of a wider table
    would have it read pages outside the view, so it is refused; one request may be any view."""
    q, w, cache, table, lens = paged_problem(25)
    wide = np.full((3, 12), 23, np.int32)
    wide[:, :8] = table
    plan = nvfp4mla.plan_fused_select(3, 128, 20, next_n=2, heads=8, page_size=16, sm_count=132)
    match = r"block_table rows must be contiguous, with a row stride equal to its 8 columns, got a row stride of 12"
    with pytest.raises(nvfp4mla.ArgumentError, match=match):
        nvfp4mla.indexer_logits_paged(q, w, cache, wide[:, :8], lens, next_n=2, page_size=16)
    with pytest.raises(nvfp4mla.ArgumentError, match=match):
        nvfp4mla.fused_select(q, w, cache, wide[:, :8], lens, plan)
    # A one-page view of a [2, 4] table with two-page contexts: read outside the view before.
    q2, w2 = q[:2], w[:2]
    parent = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], np.int32)
    with pytest.raises(nvfp4mla.ArgumentError, match="block_table rows must be contiguous"):
        nvfp4mla.indexer_logits_paged(q2, w2, cache, parent[:, :1], np.array([20, 30], np.int32), page_size=16,
                                      width=64)
    want = nvfp4mla.indexer_logits_paged(q, w, cache, table, lens, next_n=2, page_size=16)
    copy = np.ascontiguousarray(wide[:, :8])
    assert np.array_equal(nvfp4mla.indexer_logits_paged(q, w, cache, copy, lens, next_n=2, page_size=16), want)
    one = nvfp4mla.indexer_logits_paged(q[:2], w[:2], cache, wide[:1, :8], lens[:1], next_n=2, page_size=16)
    assert np.array_equal(one, want[:2])
    plan1 = nvfp4mla.plan_fused_select(1, 128, 20, next_n=2, heads=8, page_size=16, sm_count=132)
    got = nvfp4mla.fused_select(q[:2], w[:2], cache, wide[:1, :8], lens[:1], plan1)
    want1 = nvfp4mla.fused_select(q[:2], w[:2], cache, table[:1].copy(), lens[:1], plan1)
    assert np.array_equal(got[0], want1[0]) and np.array_equal(got[1], want1[1])


def test_integers_outside_their_c_type_are_refused_not_truncated():
    # ctypes keeps the low bits of an int: 2**32 + 3 rows were 3 rows.
    with pytest.raises(nvfp4mla.ArgumentError, match=r"plan_topk: rows must be in .*, got 4294967299"):
        nvfp4mla.plan_topk(2 ** 32 + 3, 100, sm_count=132)
    with pytest.raises(nvfp4mla.ArgumentError, match="plan_topk: sm_count"):
        nvfp4mla.plan_topk(4, 100, sm_count=2 ** 32 + 132)
    with pytest.raises(nvfp4mla.ArgumentError, match="plan_fused_select: next_n"):
        nvfp4mla.plan_fused_select(3, 128, 20, next_n=2 ** 32 + 2, sm_count=132)
    with pytest.raises(nvfp4mla.ArgumentError, match="plan_fused_select_ragged: heads"):
        nvfp4mla.plan_fused_select_ragged(4, 128, 20, heads=2 ** 32 + 8, sm_count=132)
    x = np.zeros((4, 128), np.float32)
    table = np.zeros((4, 2), np.int32)
    with pytest.raises(nvfp4mla.ArgumentError, match="topk: page_size"):
        nvfp4mla.topk(x, None, 4, block_table=table, page_size=2 ** 32 + 64, capacity=128)
    with pytest.raises(nvfp4mla.ArgumentError, match="topk: rows_per_request"):
        nvfp4mla.topk(x, None, 4, block_table=table, page_size=64, capacity=128, rows_per_request=2 ** 32 + 1)
    with pytest.raises(nvfp4mla.ArgumentError, match="topk: position_offset"):
        nvfp4mla.topk(x, None, 4, position_offset=2 ** 64)
    q, w, cache, table, lens = paged_problem(26)
    with pytest.raises(nvfp4mla.ArgumentError, match="indexer_logits_paged: next_n"):
        nvfp4mla.indexer_logits_paged(q, w, cache, table, lens, next_n=2 ** 32 + 2, page_size=16)


def test_fused_select_checks():
    q, w, cache, table, lens = paged_problem(24)
    plan = nvfp4mla.plan_fused_select(3, 100, 20, next_n=2, heads=8, page_size=16, sm_count=132)
    with pytest.raises(nvfp4mla.Error, match="max_context"):  # context 128 > 100
        nvfp4mla.fused_select(q, w, cache, table, lens, plan)
    other = nvfp4mla.plan_fused_select(2, 128, 20, next_n=2, heads=8, page_size=16, sm_count=132)
    with pytest.raises(nvfp4mla.ArgumentError, match="2 requests"):
        nvfp4mla.fused_select(q, w, cache, table, lens, other)
    with pytest.raises(nvfp4mla.Error, match="chunk"):
        nvfp4mla.plan_fused_select(3, 128, 20, page_size=16, chunk=20, sm_count=132)
    ragged = nvfp4mla.plan_fused_select_ragged(6, 128, 20, sm_count=132)
    with pytest.raises(nvfp4mla.ArgumentError, match="ragged"):
        nvfp4mla.fused_select(q, w, cache, table, lens, ragged)
    assert nvfp4mla.FusedSelectPlan.from_list(plan.as_list()).as_list() == plan.as_list()
