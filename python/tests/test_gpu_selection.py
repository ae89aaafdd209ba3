"""GPU tests of the selection ops (skipped without torch, CUDA and a CUDA build of the library):
the index cache writer and gathers bit-identical to the CPU, indexer logits within the tolerance
of docs/SELECTION.md (bit-exact on exact data), top-k and fused selection bit-exact against the
CPU / the GPU chain, the torch ops, and a CUDA-graph capture of write_index_cache + indexer +
top-k + sparse_decode that replays to the eager bytes."""
import numpy as np
import pytest

import nvfp4mla
from test_selection import numpy_logits, random_keys, random_query, split_records

torch = pytest.importorskip("torch")
if not (torch.cuda.is_available() and nvfp4mla.built_with_cuda() and nvfp4mla.cuda_device_count() > 0):
    pytest.skip("needs torch with CUDA, a GPU and a CUDA build of libnvfp4mla_c", allow_module_level=True)

import nvfp4mla.torch as nvt  # noqa: E402  (registers torch.ops.nvfp4mla)

DEV = "cuda"
RB = nvfp4mla.INDEX_KEY_RECORD_BYTES


def gpu(a):
    return torch.from_numpy(np.ascontiguousarray(a)).to(DEV)


def exact_keys(n, seed):
    """Small-integer keys: every E4M3 value, product and logit is exact in fp32, so the GPU
    logits equal the CPU's bit for bit."""
    return np.random.default_rng(seed).integers(-3, 4, size=(n, 128)).astype(np.float32)


def exact_query(rows, heads, seed):
    rng = np.random.default_rng(seed)
    codes = np.array([0x00, 0x38, 0x40, 0xB8, 0xC0], np.uint8)  # 0, 1, 2, -1, -2 in E4M3
    q = codes[rng.integers(0, 5, size=(rows, heads, 128))]
    w = rng.integers(-2, 3, size=(rows, heads)).astype(np.float32)
    return q, w


# ---- index cache ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_write_index_cache_is_bit_identical_to_the_cpu(dtype):
    keys = torch.from_numpy(random_keys(300, seed=1) * (1e-3 if dtype == torch.float16 else 1.0)).to(dtype)
    wide = torch.zeros(300, 256, dtype=dtype)
    wide[:, :128] = keys
    slots = torch.randperm(8 * 64)[:300]
    slots[::9] = -1
    cache = torch.full((8, 64 * RB), 0x5A, dtype=torch.uint8, device=DEV)
    count = nvfp4mla.write_index_cache(wide.to(DEV)[:, :128], cache, slots.to(DEV))  # strided rows
    want = torch.full((8, 64 * RB), 0x5A, dtype=torch.uint8)
    nvfp4mla.write_index_cache(keys, want, slots)
    torch.cuda.synchronize()
    assert count.item() == 0
    assert torch.equal(cache.cpu(), want)
    live = slots[slots >= 0]
    got = nvfp4mla.gather_index_records(cache, live.to(DEV))
    values, scales = nvfp4mla.gather_index_keys(cache, live.to(DEV))
    assert torch.equal(got.cpu(), nvfp4mla.gather_index_records(want, live))
    want_values, want_scales = nvfp4mla.gather_index_keys(want, live)
    assert torch.equal(values.cpu(), want_values) and torch.equal(scales.cpu(), want_scales)


def test_write_index_cache_takes_one_key_of_any_row_stride():
    keys = torch.from_numpy(random_keys(1, seed=2)).to(DEV)
    slots = torch.tensor([70], device=DEV)
    want = torch.zeros((2, 64 * RB), dtype=torch.uint8, device=DEV)
    nvfp4mla.write_index_cache(keys, want, slots)
    one = keys[0].as_strided((1, 128), (0, 1))  # row stride 0 (expand may report a dense one)
    assert one.stride(0) == 0
    got = torch.zeros_like(want)
    count = nvfp4mla.write_index_cache(one, got, slots)
    torch.cuda.synchronize()
    assert count.item() == 0 and torch.equal(got, want)


def test_index_cache_bad_slots_are_counted_and_nothing_is_written():
    keys = torch.randn(3, 128, device=DEV)
    cache = torch.full((2, 64 * RB), 0x11, dtype=torch.uint8, device=DEV)
    count = torch.full((1,), 7, dtype=torch.int64, device=DEV)
    nvfp4mla.write_index_cache(keys, cache, torch.tensor([0, 128, 1], device=DEV), invalid_count=count)
    assert count.item() == 1 and (cache == 0x11).all()
    nvfp4mla.gather_index_records(cache, torch.tensor([0, -1, 500], device=DEV), invalid_count=count)
    assert count.item() == 2


# ---- indexer logits ---------------------------------------------------------------------------------

def test_indexer_logits_ragged_within_the_tolerance():
    q, w = random_query(6, 64, seed=2)
    records = nvfp4mla.encode_index_keys(random_keys(700, seed=3))
    starts = np.array([0, 100, 699, 700, 3, 0], np.int32)
    ends = np.array([700, 612, 700, 700, 4, 517], np.int32)
    values, scales = (gpu(a) for a in split_records(records))  # the GPU reads split keys
    got = nvfp4mla.indexer_logits(gpu(q), gpu(w), values, gpu(starts), gpu(ends), key_scales=scales,
                                  width=704).cpu().numpy()
    want = nvfp4mla.indexer_logits(q, w, records, starts, ends, np.empty((6, 704), np.float32))
    _, bound = numpy_logits(q, w, records, starts, ends, 704)
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    assert np.all(np.abs(got[finite] - want[finite]) <= 2.0 ** -5 * bound[finite])


@pytest.mark.parametrize("heads", [1, 16, 64])
def test_indexer_logits_equal_the_cpu_on_exact_data(heads):
    q, w = exact_query(3 * 2, heads, seed=4)
    cache = np.zeros((40, 64 * RB), np.uint8)
    nvfp4mla.write_index_cache(exact_keys(40 * 64, seed=5), cache, np.arange(40 * 64))
    table = np.random.default_rng(6).permutation(40)[:30].reshape(3, 10).astype(np.int32)
    lens = np.array([640, 65, 1], np.int32)
    want = nvfp4mla.indexer_logits_paged(q, w, cache, table, lens, next_n=2)
    got = nvfp4mla.indexer_logits_paged(gpu(q), gpu(w), gpu(cache), gpu(table), gpu(lens), next_n=2)
    assert np.array_equal(got.cpu().numpy(), want)  # values: an exact zero may carry either sign
    records = nvfp4mla.encode_index_keys(exact_keys(300, seed=7))
    starts, ends = np.array([0, 10, 300, 5, 0, 299], np.int32), np.array([300, 200, 300, 6, 0, 300], np.int32)
    want = nvfp4mla.indexer_logits(q, w, records, starts, ends, np.empty((6, 300), np.float32))
    values, scales = (gpu(a) for a in split_records(records))
    got = nvfp4mla.indexer_logits(gpu(q), gpu(w), values, gpu(starts), gpu(ends), torch.empty(6, 300, device=DEV),
                                  key_scales=scales)
    assert np.array_equal(got.cpu().numpy(), want)


def test_indexer_bad_metadata_is_counted():
    q, w = exact_query(2, 8, seed=8)
    cache = torch.zeros(4, 64 * RB, dtype=torch.uint8, device=DEV)
    logits = torch.full((2, 128), 5.0, device=DEV)
    count = torch.zeros((1,), dtype=torch.int64, device=DEV)
    out = nvfp4mla.indexer_logits_paged(gpu(q), gpu(w), cache, gpu(np.array([[0, 9]], np.int32)),
                                        gpu(np.array([100], np.int32)), logits, next_n=2, invalid_count=count)
    torch.cuda.synchronize()
    assert out is logits
    assert count.item() >= 1 and (logits == 5.0).all()  # a page outside the cache: nothing written


# ---- top-k ------------------------------------------------------------------------------------------------

def adversarial(rows, columns, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-50, 50, (rows, columns), generator=g).float()  # ties
    x[0, ::7] = float("nan")
    x[min(1, rows - 1), ::3] = float("-inf")
    return x


@pytest.mark.parametrize("rows,columns,k", [(64, 4096, 2048), (7, 3000, 64), (1, 300_000, 2048), (3, 70_000, 1)])
def test_topk_is_bit_identical_to_the_cpu(rows, columns, k):
    x = adversarial(rows, columns, seed=rows + k)
    lengths = torch.randint(0, columns + 1, (rows,), dtype=torch.int32)
    lengths[-1] = columns
    plan = nvfp4mla.plan_topk(rows, columns)
    ws = torch.empty(max(plan.workspace_bytes, 16), dtype=torch.uint8, device=DEV)
    values = torch.empty(rows, k, device=DEV)
    errors = torch.zeros(1, dtype=torch.int64, device=DEV)
    idx, n = nvfp4mla.topk(x.to(DEV), lengths.to(DEV), k, plan=plan, workspace=ws, values=values,
                           error_count=errors)
    want_values = np.empty((rows, k), np.float32)
    want_idx, want_n = nvfp4mla.topk(x.numpy(), lengths.numpy(), k, values=want_values)
    assert torch.equal(idx.cpu(), torch.from_numpy(want_idx)) and torch.equal(n.cpu(), torch.from_numpy(want_n))
    assert np.array_equal(values.cpu().numpy().view(np.uint32), want_values.view(np.uint32))
    assert errors.item() == 0


def test_topk_slot_transform_is_bit_identical_and_counts_bad_slots():
    x = adversarial(6, 500, seed=9)
    table = torch.tensor([[3, 0, 7, 1, 2, 4, 5, 6], [8, 9, 10, 11, 12, 13, 14, 15], [1, 2, 3, 4, 5, 6, 7, 0]],
                         dtype=torch.int32)
    args = dict(block_table=table, page_size=64, rows_per_request=2, capacity=16 * 64)
    want, want_n = nvfp4mla.topk(x.numpy(), None, 128, **{**args, "block_table": table.numpy()})
    idx, n = nvfp4mla.topk(x.to(DEV), None, 128, **{**args, "block_table": table.to(DEV)})
    assert torch.equal(idx.cpu(), torch.from_numpy(want)) and torch.equal(n.cpu(), torch.from_numpy(want_n))
    errors = torch.zeros(1, dtype=torch.int64, device=DEV)
    idx, n = nvfp4mla.topk(x.to(DEV), None, 128, error_count=errors,
                           **{**args, "block_table": table.to(DEV), "capacity": 15 * 64})
    torch.cuda.synchronize()
    bad = (torch.from_numpy(want) >= 15 * 64).sum().item()
    assert bad > 0 and errors.item() == bad
    assert ((idx.cpu() == -1) == ((torch.from_numpy(want) == -1) | (torch.from_numpy(want) >= 15 * 64))).all()


# ---- fused selection ---------------------------------------------------------------------------------------

def test_fused_select_equals_the_gpu_logits_then_topk():
    q, w = random_query(4 * 2, 64, seed=10)
    cache = np.zeros((64, 64 * RB), np.uint8)
    nvfp4mla.write_index_cache(random_keys(64 * 64, seed=11), cache, np.arange(64 * 64))
    table = np.random.default_rng(12).permutation(64)[:4 * 16].reshape(4, 16).astype(np.int32)
    lens = np.array([1024, 300, 2, 777], np.int32)
    tensors = [gpu(a) for a in (q, w, cache, table, lens)]
    for chunk in (0, 128):
        plan = nvfp4mla.plan_fused_select(4, 1024, 100, next_n=2, chunk=chunk)
        ws = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=DEV)
        idx, n = nvfp4mla.fused_select(*tensors, plan, ws, slot_ids=True)
        logits = nvfp4mla.indexer_logits_paged(*tensors, next_n=2, width=1024)
        lengths = torch.clamp(tensors[4].repeat_interleave(2) - 1 + torch.arange(2, device=DEV).repeat(4), min=0)
        want, want_n = nvfp4mla.topk(logits, lengths.int(), 100, block_table=tensors[3], page_size=64,
                                     rows_per_request=2, capacity=64 * 64)
        assert torch.equal(idx, want) and torch.equal(n, want_n)
    records = nvfp4mla.encode_index_keys(random_keys(900, seed=13))
    starts, ends = np.array([0, 100, 900, 5], np.int32), np.array([900, 612, 900, 6], np.int32)
    values, scales = split_records(records)
    ragged = [gpu(a) for a in (q[:4], w[:4], values, starts, ends)]
    plan = nvfp4mla.plan_fused_select_ragged(4, 900, 50, chunk=256)
    ws = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=DEV)
    idx, n = nvfp4mla.fused_select_ragged(*ragged, plan, ws, key_scales=gpu(scales))
    logits = nvfp4mla.indexer_logits(*ragged, width=900, key_scales=gpu(scales))
    want, want_n = nvfp4mla.topk(logits, ragged[4] - ragged[3], 50)
    assert torch.equal(idx, want) and torch.equal(n, want_n)


# ---- torch ops, argument checks ---------------------------------------------------------------------------

MUTATED = {"write_index_cache": {"cache", "invalid_count"}, "gather_index_records": {"output", "invalid_count"},
           "indexer_logits": {"output", "invalid_count"}, "indexer_logits_paged": {"output", "invalid_count"},
           "topk": {"workspace", "indices", "topk_length", "values", "error_count"},
           "fused_select": {"workspace", "indices", "topk_length", "values", "invalid_count"},
           "fused_select_ragged": {"workspace", "indices", "topk_length", "values", "invalid_count"}}


@pytest.mark.parametrize("name", sorted(MUTATED))
def test_selection_ops_are_registered_with_their_mutations(name):
    schema = getattr(torch.ops.nvfp4mla, name).default._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == MUTATED[name]
    assert len(schema.returns) == 0


def test_selection_opcheck():
    keys = torch.randn(8, 128, device=DEV)
    cache = torch.zeros(2, 64 * RB, dtype=torch.uint8, device=DEV)
    count = torch.zeros(1, dtype=torch.int64, device=DEV)
    torch.library.opcheck(torch.ops.nvfp4mla.write_index_cache.default,
                          (keys, cache, torch.arange(8, device=DEV) * 5, count, 64))
    q, w = (gpu(a) for a in exact_query(4, 16, seed=14))
    table = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32, device=DEV)
    lens = torch.tensor([100, 7], dtype=torch.int32, device=DEV)
    logits = torch.empty(4, 128, device=DEV)
    torch.library.opcheck(torch.ops.nvfp4mla.indexer_logits_paged.default,
                          (q, w, cache, table, lens, logits, count, 2, 64))
    plan = nvfp4mla.plan_topk(4, 128)
    empty = torch.empty(0, dtype=torch.uint8, device=DEV)
    idx = torch.empty(4, 16, dtype=torch.int32, device=DEV)
    n = torch.empty(4, dtype=torch.int32, device=DEV)
    torch.library.opcheck(torch.ops.nvfp4mla.topk.default,
                          (logits, None, 16, plan.as_list(), empty, idx, n, torch.empty(0, device=DEV),
                           torch.empty(0, dtype=torch.int64, device=DEV), table, 64, 2, 128, 0))


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    plan = nvfp4mla.plan_fused_select(3, 512, 64, next_n=2)
    with FakeTensorMode():
        logits = torch.empty(6, 512, device=DEV)
        idx, n = nvt.topk(logits, None, 64, plan=nvfp4mla.plan_topk(6, 512, sm_count=132))
        assert idx.shape == (6, 64) and idx.dtype == torch.int32 and n.shape == (6,)
        q = torch.empty(6, 64, 128, dtype=torch.uint8, device=DEV)
        w = torch.empty(6, 64, device=DEV)
        cache = torch.empty(8, 64 * RB, dtype=torch.uint8, device=DEV)
        table = torch.empty(3, 8, dtype=torch.int32, device=DEV)
        lens = torch.empty(3, dtype=torch.int32, device=DEV)
        assert nvt.indexer_logits_paged(q, w, cache, table, lens, next_n=2).shape == (6, 512)
        idx, n = nvt.fused_select(q, w, cache, table, lens, plan, torch.empty(plan.workspace_bytes,
                                                                                dtype=torch.uint8, device=DEV))
        assert idx.shape == (6, 64) and n.shape == (6,)


def test_selection_rejects_wrong_devices_and_layouts():
    q, w = (gpu(a) for a in exact_query(2, 8, seed=15))
    cache = torch.zeros(2, 64 * RB, dtype=torch.uint8, device=DEV)
    table = torch.zeros(1, 2, dtype=torch.int32, device=DEV)
    lens = torch.ones(1, dtype=torch.int32, device=DEV)
    with pytest.raises(nvfp4mla.ArgumentError, match="indexer_logits_paged: context_lens must be on a CUDA device"):
        nvfp4mla.indexer_logits_paged(q, w, cache, table, lens.cpu(), next_n=2)
    with pytest.raises(nvfp4mla.ArgumentError, match="q must be contiguous"):
        nvfp4mla.indexer_logits_paged(torch.zeros(8, 2, 128, dtype=torch.uint8, device=DEV).transpose(0, 1), w, cache,
                                      table, lens, next_n=2)
    with pytest.raises(nvfp4mla.ArgumentError, match="width"):
        nvfp4mla.indexer_logits(q, w, torch.zeros(4, RB, dtype=torch.uint8, device=DEV),
                                torch.zeros(2, dtype=torch.int32, device=DEV), torch.ones(2, dtype=torch.int32, device=DEV))
    logits = torch.zeros(2, 64, device=DEV)
    with pytest.raises(nvfp4mla.ArgumentError, match="topk: indices must be on a CUDA device"):
        nvfp4mla.topk(logits, None, 4, indices=torch.empty(2, 4, dtype=torch.int32))
    plan = nvfp4mla.plan_topk(1, 1 << 20)
    with pytest.raises(nvfp4mla.ArgumentError, match="needs a workspace"):
        nvfp4mla.topk(torch.zeros(1, 1 << 20, device=DEV), None, 4, plan=plan)
    with pytest.raises(nvfp4mla.ArgumentError, match="the plan is for"):
        nvfp4mla.topk(logits, None, 4, plan=plan)


# ---- CUDA graphs ----------------------------------------------------------------------------------------------

class Step:
    """One decode step of a DSA layer: new index keys and KV records written, the indexer's paged
    logits, the top-k as cache slots, sparse decode. Static buffers, so the step can be captured."""

    def __init__(self, cfg, requests=4, next_n=1, heads=16, pages=16, k=128):
        self.cfg, self.k, self.next_n = cfg, k, next_n
        rows = requests * next_n
        self.rows, self.heads, self.pages = rows, heads, pages
        self.index_cache = torch.zeros(4 * pages, 64 * RB, dtype=torch.uint8, device=DEV)
        self.kv_cache = torch.zeros(4 * pages * 64, cfg.record_bytes, dtype=torch.uint8, device=DEV)
        self.plan = nvfp4mla.plan_decode(cfg, rows, heads, k, splits=2)
        self.topk_plan = nvfp4mla.plan_topk(rows, pages * 64)
        self.ws = torch.empty(max(self.plan.workspace_bytes, 256), dtype=torch.uint8, device=DEV)
        self.topk_ws = torch.empty(max(self.topk_plan.workspace_bytes, 16), dtype=torch.uint8, device=DEV)
        self.count = torch.zeros(1, dtype=torch.int64, device=DEV)
        self.logits = torch.empty(rows, pages * 64, device=DEV)
        self.indices = torch.empty(rows, k, dtype=torch.int32, device=DEV)
        self.lengths = torch.empty(rows, dtype=torch.int32, device=DEV)
        self.out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device=DEV)
        self.lse = torch.empty(rows, heads, device=DEV)

    def inputs(self, seed):
        g = torch.Generator().manual_seed(seed)
        requests = self.rows // self.next_n
        n = 64
        q_index, w = exact_query(self.rows, 32, seed)
        table = torch.randperm(4 * self.pages, generator=g)[:requests * self.pages].view(requests, self.pages)
        return [t.to(DEV) for t in (
            torch.randn(n, 128, generator=g), torch.randperm(4 * self.pages * 64, generator=g)[:n],
            torch.randn(n, 576, generator=g).to(torch.bfloat16), torch.from_numpy(q_index), torch.from_numpy(w),
            table.int(), torch.randint(1, self.pages * 64 + 1, (requests,), generator=g, dtype=torch.int32),
            torch.randn(self.rows, self.heads, 576, generator=g).to(torch.bfloat16))]

    def run(self, keys, slots, kv, q_index, w, table, lens, q, ops):
        ops.write_index_cache(keys, self.index_cache, slots, invalid_count=self.count)
        ops.write_cache(kv[:, :512], kv[:, 512:], self.kv_cache, slots, self.cfg)
        ops.indexer_logits_paged(q_index, w, self.index_cache, table, lens, self.logits, next_n=self.next_n,
                                 invalid_count=self.count)
        ops.topk(self.logits, None, self.k, plan=self.topk_plan, workspace=self.topk_ws, indices=self.indices,
                 topk_length=self.lengths, block_table=table, page_size=64, rows_per_request=self.next_n,
                 capacity=self.kv_cache.shape[0])
        ops.sparse_decode(q, self.kv_cache, self.indices, self.lengths, 0.05, self.plan, self.ws, self.out, self.lse)
        return (self.index_cache.clone(), self.kv_cache.clone(), self.indices.clone(), self.lengths.clone(),
                self.out.clone(), self.lse.clone())


@pytest.mark.parametrize("ops", ["nvfp4mla", "nvfp4mla.torch"])
def test_cuda_graph_capture_of_selection_and_decode_replays_eager(ops):
    ops = nvt if ops == "nvfp4mla.torch" else nvfp4mla
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    captured, eager = Step(cfg), Step(cfg)
    static = captured.inputs(20)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph, as torch recommends
        captured.run(*static, ops)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured.run(*static, ops)
    for seed in (21, 22):
        new = captured.inputs(seed)
        start_index = torch.randint(0, 256, captured.index_cache.shape, dtype=torch.uint8, device=DEV)
        start_kv = torch.randint(0, 256, captured.kv_cache.shape, dtype=torch.uint8, device=DEV)
        for buffer, value in zip(static, new):
            buffer.copy_(value)
        captured.index_cache.copy_(start_index)
        captured.kv_cache.copy_(start_kv)
        graph.replay()
        torch.cuda.synchronize()
        replayed = (captured.index_cache.clone(), captured.kv_cache.clone(), captured.indices.clone(),
                    captured.lengths.clone(), captured.out.clone(), captured.lse.clone())
        eager.index_cache.copy_(start_index)
        eager.kv_cache.copy_(start_kv)
        want = eager.run(*new, ops)
        torch.cuda.synchronize()
        assert captured.count.item() == 0
        for got, expected in zip(replayed, want):
            assert torch.equal(got.view(torch.uint8) if got.dtype == torch.bfloat16 else got,
                               expected.view(torch.uint8) if expected.dtype == torch.bfloat16 else expected)
