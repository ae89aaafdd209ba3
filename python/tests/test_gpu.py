"""GPU tests of the package (skipped without torch, CUDA and a CUDA build of the library):
the GPU writer bit-identical to the CPU encoder, sparse decode/extend/scores against the fp64
reference with the kernels' tolerances, the staged extend equal to the direct one, the torch ops
(registration, fake tensors, opcheck, torch.compile, CUDA-graph capture and replay) and argument
rejection."""
import math

import numpy as np
import pytest

import nvfp4mla
from conftest import ALL_FORMATS, format_id

torch = pytest.importorskip("torch")
if not (torch.cuda.is_available() and nvfp4mla.built_with_cuda() and nvfp4mla.cuda_device_count() > 0):
    pytest.skip("needs torch with CUDA, a GPU and a CUDA build of libnvfp4mla_c", allow_module_level=True)

import nvfp4mla.torch as nvt  # noqa: E402  (registers torch.ops.nvfp4mla)

DEV = "cuda"
U = 2.0 ** -24


def tokens(n, seed, dtype=torch.bfloat16, joint=False):
    """kv_c [n, 512], k_pe [n, 64] on the GPU with magnitudes spread over tokens; `joint` gives
    slices of one [n, 576] tensor (strided rows, as vLLM passes them)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    mags = torch.exp2(torch.randint(-6, 4, (n, 1), generator=g).float())
    kv = (torch.randn(n, 576, generator=g) * mags).to(dtype).to(DEV)
    if joint:
        return kv[:, :512], kv[:, 512:]
    return kv[:, :512].contiguous(), kv[:, 512:].contiguous()


def cache_for(cfg, blocks=16, block_size=64, fill=0):
    return torch.full((blocks, block_size, cfg.record_bytes), fill, dtype=torch.uint8, device=DEV)


# ---- writer and record copies --------------------------------------------------------------------

@pytest.mark.parametrize("f", ALL_FORMATS, ids=format_id)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_write_cache_is_bit_identical_to_the_cpu_encoder(f, dtype):
    cfg = nvfp4mla.FormatConfig(**f)
    kv_c, k_pe = tokens(300, seed=1, dtype=dtype, joint=True)
    cache = cache_for(cfg, fill=0x5A)
    slots = torch.randperm(16 * 64, device=DEV)[:300]
    slots[::7] = -1  # padded slots are skipped
    nvfp4mla.write_cache(kv_c, k_pe, cache, slots, cfg)
    torch.cuda.synchronize()
    want = nvfp4mla.encode(kv_c.cpu().contiguous(), k_pe.cpu().contiguous(), cfg).numpy()
    got = cache.view(-1, cfg.record_bytes).cpu().numpy()
    s = slots.cpu().numpy()
    assert np.array_equal(got[s[s >= 0]], want[s >= 0])
    untouched = np.setdiff1d(np.arange(16 * 64), s[s >= 0])
    assert (got[untouched] == 0x5A).all()


class _OnlyDLPack:
    """A producer that only speaks DLPack (the general path, not the torch fast path)."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_write_cache_takes_one_token_of_any_row_stride():
    cfg = nvfp4mla.FormatConfig()
    kv_c, k_pe = tokens(1, seed=3)
    slots = torch.tensor([5], device=DEV)
    want = cache_for(cfg, blocks=1, block_size=8)
    nvfp4mla.write_cache(kv_c, k_pe, want, slots, cfg)
    # Row stride 0 (as_strided keeps it; expand of a new size-1 dim may report a dense stride)
    one_kv, one_pe = kv_c[0].as_strided((1, 512), (0, 1)), k_pe[0].as_strided((1, 64), (0, 1))
    assert one_kv.stride(0) == 0 and one_pe.stride(0) == 0
    for wrap in (lambda t: t, _OnlyDLPack):
        got = cache_for(cfg, blocks=1, block_size=8)
        nvfp4mla.write_cache(wrap(one_kv), wrap(one_pe), got, slots, cfg)
        torch.cuda.synchronize()
        assert torch.equal(got, want)


def test_write_cache_counts_out_of_range_slots():
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    kv_c, k_pe = tokens(4, seed=2)
    cache = cache_for(cfg, blocks=1, block_size=8)
    count = torch.zeros(1, dtype=torch.int64, device=DEV)
    nvfp4mla.write_cache(kv_c, k_pe, cache, torch.tensor([0, 8, 100, -1], device=DEV), cfg, error_count=count)
    assert count.item() == 2
    assert cache[0, 0].any() and not cache[0, 1:].any()


def test_gather_and_scatter_match_the_cpu():
    cache = torch.randint(0, 256, (4, 16, 432), dtype=torch.uint8, device=DEV)
    slots = torch.tensor([3, -1, 63, 64, 17], device=DEV)
    count = torch.zeros(1, dtype=torch.int64, device=DEV)
    got = nvfp4mla.gather_records(cache, slots, error_count=count)
    want = nvfp4mla.gather_records(cache.cpu().numpy(), slots.cpu().numpy())
    assert np.array_equal(got.cpu().numpy(), want) and count.item() == 1
    # Into poisoned caches, the records of the invalid slots (-1, 64: past the 64 slots) poisoned
    # differently: only the valid slots are written.
    got[1] = 0x5A
    got[3] = 0x5A
    want[1] = 0x5A
    want[3] = 0x5A
    target = torch.full_like(cache, 0xA5)
    nvfp4mla.scatter_records(got, slots, target)
    cpu_target = np.full(tuple(cache.shape), 0xA5, np.uint8)
    nvfp4mla.scatter_records(want, slots.cpu().numpy(), cpu_target)
    assert np.array_equal(target.cpu().numpy(), cpu_target)
    flat = cpu_target.reshape(-1, cache.shape[-1])
    untouched = np.setdiff1d(np.arange(flat.shape[0]), [3, 63, 17])
    assert (flat[untouched] == 0xA5).all()
    assert np.array_equal(flat[[3, 63, 17]], cache.reshape(-1, cache.shape[-1])[[3, 63, 17]].cpu().numpy())


# ---- attention against the reference ---------------------------------------------------------------

def make_problem(cfg, rows, heads, topk, seed, capacity=1024, lengths=False):
    g = torch.Generator(device="cpu").manual_seed(seed)
    kv_c, k_pe = tokens(capacity, seed)
    cache = torch.empty((capacity, cfg.record_bytes), dtype=torch.uint8, device=DEV)
    nvfp4mla.write_cache(kv_c, k_pe, cache, torch.arange(capacity, device=DEV), cfg)
    q = torch.randn(rows, heads, 576, generator=g).to(torch.bfloat16).to(DEV)
    indices = torch.randint(-4, capacity + 4, (rows, topk), generator=g, dtype=torch.int32).to(DEV)
    topk_length = None
    if lengths:
        topk_length = torch.randint(0, topk + 1, (rows,), generator=g, dtype=torch.int32)
        topk_length[0] = 0  # an empty row
        topk_length = topk_length.to(DEV)
    return q, cache, indices, topk_length


def reference(cfg, q, cache, indices, topk_length, sm_scale, bf16_operands, lse_base2=False):
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    out, lse = nvfp4mla.sparse_mla_reference(cpu(q), cpu(cache), cpu(indices), cpu(topk_length), sm_scale, cfg,
                                             bf16_operands=bf16_operands, lse_base2=lse_base2)
    return out.double().numpy(), lse.double().numpy()


def row_value_scale(cfg, cache, indices, topk_length):
    """Largest |V| over each row's valid entries."""
    kv_c, _ = nvfp4mla.decode(cache.cpu().numpy(), cfg)
    idx = indices.cpu().numpy()
    n = idx.shape[1] if topk_length is None else None
    lengths = None if topk_length is None else topk_length.cpu().numpy()
    out = np.zeros(idx.shape[0])
    for r in range(idx.shape[0]):
        row = idx[r, :(n if lengths is None else lengths[r])]
        row = row[(row >= 0) & (row < kv_c.shape[0])]
        if row.size:
            out[r] = np.abs(kv_c[row]).max()
    return out


def assert_attention_close(out, lse, want_out, want_lse, vmax, row_cos_limit, cos_limit=5e-6):
    """FlashMLA's criteria (tests/gpu/output_compare.h)."""
    got = out.float().cpu().double().numpy()
    got_lse = lse.cpu().double().numpy()
    rows, heads, _ = got.shape
    tol = 1e-3 + (2.0 / 128.0) * np.abs(want_out) + vmax[:, None, None] / 256.0
    bad = np.argwhere(~(np.abs(got - want_out) <= tol))
    assert bad.size == 0, f"{len(bad)} elements off, first {bad[:3].tolist()}"
    dot = (got * want_out).sum(-1)
    n_got, n_want = (got * got).sum(-1), (want_out * want_out).sum(-1)
    # Per (row, head) norms, so that a uniform scale error hiding below every element's tolerance
    # fails (output_compare.h's norm bound is about 1.3-1.5% of |want|).
    norm_err = np.abs(np.sqrt(n_got) - np.sqrt(n_want))
    assert (norm_err <= 0.0125 * np.sqrt(n_want) + 1e-6).all(), f"worst relative norm error {(norm_err / np.maximum(np.sqrt(n_want), 1e-30)).max()}"
    empty = n_want == 0
    assert (n_got[empty] == 0).all(), "empty rows must give 0"
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = 1.0 - dot / np.sqrt(n_got * n_want)
    assert (cos[~empty] <= row_cos_limit).all(), f"worst (row, head) cosine difference {cos[~empty].max()}"
    if (~empty).any():
        whole = 1.0 - dot[~empty].sum() / math.sqrt(n_got[~empty].sum() * n_want[~empty].sum())
        assert whole <= cos_limit
    inf = np.isinf(want_lse)
    assert (np.isneginf(got_lse[inf])).all()
    d = np.abs(got_lse[~inf] - want_lse[~inf])
    assert ((d <= 1e-5) | (d <= (8.0 / 65536.0) * np.abs(want_lse[~inf]))).all()


@pytest.mark.parametrize("f", ALL_FORMATS, ids=format_id)
@pytest.mark.parametrize("heads", [16, 64, 128])
def test_sparse_decode_matches_the_reference(f, heads):
    cfg = nvfp4mla.FormatConfig(**f)
    q, cache, indices, lengths = make_problem(cfg, rows=5, heads=heads, topk=320, seed=heads, lengths=True)
    plan = nvfp4mla.plan_decode(cfg, 5, heads, 320)
    workspace = torch.empty(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=DEV)
    out = torch.full((5, heads, 512), float("nan"), dtype=torch.bfloat16, device=DEV)  # poisoned
    lse = torch.full((5, heads), float("nan"), dtype=torch.float32, device=DEV)
    got_out, got_lse = nvfp4mla.sparse_decode(q, cache, indices, lengths, 0.0416, plan, workspace, out, lse)
    assert got_out is out and got_lse is lse
    torch.cuda.synchronize()
    rounds_k, weights_bf16 = plan.numerics()
    want_out, want_lse = reference(cfg, q, cache, indices, lengths, 0.0416, rounds_k)
    assert_attention_close(out, lse, want_out, want_lse, row_value_scale(cfg, cache, indices, lengths),
                           5e-5 if weights_bf16 else 5e-6)


def test_sparse_decode_splits_and_base2():
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    q, cache, indices, _ = make_problem(cfg, rows=2, heads=128, topk=2048, seed=7, capacity=4096)
    results = []
    for splits in (1, 7, 32):
        plan = nvfp4mla.plan_decode(cfg, 2, 128, 2048, splits=splits)
        ws = torch.empty(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=DEV)
        results.append(nvfp4mla.sparse_decode(q, cache, indices, None, 0.04, plan, ws, lse_base2=True))
    rounds_k, weights_bf16 = plan.numerics()
    want_out, want_lse = reference(cfg, q, cache, indices, None, 0.04, rounds_k, lse_base2=True)
    vmax = row_value_scale(cfg, cache, indices, None)
    for out, lse in results:
        assert_attention_close(out, lse, want_out, want_lse, vmax, 5e-5 if weights_bf16 else 5e-6)


@pytest.mark.parametrize("f", [ALL_FORMATS[1], ALL_FORMATS[6]], ids=format_id)
def test_sparse_extend_matches_the_reference(f):
    cfg = nvfp4mla.FormatConfig(**f)
    q, cache, indices, lengths = make_problem(cfg, rows=6, heads=16, topk=200, seed=8, lengths=True)
    out, lse = nvfp4mla.sparse_extend(q, cache, indices, lengths, 0.05, cfg)
    torch.cuda.synchronize()
    rounds_k, weights_bf16 = nvfp4mla.plan_decode(cfg, 6, 16, 200, splits=1).numerics()
    want_out, want_lse = reference(cfg, q, cache, indices, lengths, 0.05, rounds_k)
    assert_attention_close(out, lse, want_out, want_lse, row_value_scale(cfg, cache, indices, lengths),
                           5e-5 if weights_bf16 else 5e-6)


@pytest.mark.parametrize("f", [ALL_FORMATS[4], ALL_FORMATS[6]], ids=format_id)
def test_staged_sparse_extend_matches_the_direct_one(f):
    cfg = nvfp4mla.FormatConfig(**f)
    rows, heads, topk = 6, 64, 200
    q, cache, indices, lengths = make_problem(cfg, rows=rows, heads=heads, topk=topk, seed=22, lengths=True)
    need = nvfp4mla.extend_staging_bytes(cache.shape[0], rows, topk)
    workspace = torch.full((need + 256,), 0xFF, dtype=torch.uint8, device=DEV)  # poisoned
    direct_out, direct_lse = nvfp4mla.sparse_extend(q, cache, indices, lengths, 0.05, cfg)
    out = torch.full((rows, heads, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    lse = torch.full((rows, heads), float("nan"), dtype=torch.float32, device=DEV)
    got_out, got_lse = nvfp4mla.sparse_extend(q, cache, indices, lengths, 0.05, cfg, out, lse,
                                              workspace=workspace[:need])
    assert got_out is out and got_lse is lse
    torch.cuda.synchronize()
    if torch.cuda.get_device_capability() == (9, 0):
        # Both run the 64-entry Hopper kernel on the same BF16 operands: the same bits.
        assert torch.equal(out.view(torch.int16), direct_out.view(torch.int16))
        assert torch.equal(lse.view(torch.int32), direct_lse.view(torch.int32))
    else:
        want_out, want_lse = reference(cfg, q, cache, indices, lengths, 0.05, True)
        assert_attention_close(out, lse, want_out, want_lse, row_value_scale(cfg, cache, indices, lengths), 5e-5)
    with pytest.raises(nvfp4mla.ArgumentError, match=f"needs a workspace of {need} bytes"):
        nvfp4mla.sparse_extend(q, cache, indices, lengths, 0.05, cfg, workspace=workspace[:need - 1])
    with pytest.raises(nvfp4mla.ArgumentError, match="workspace must be 256-byte aligned"):
        nvfp4mla.sparse_extend(q, cache, indices, lengths, 0.05, cfg, workspace=workspace[16:need + 16])


def bf16_round(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


def test_sparse_scores_matches_the_reference():
    cfg = nvfp4mla.FormatConfig(rope="fp8")
    q, cache, indices, _ = make_problem(cfg, rows=3, heads=16, topk=100, seed=9)
    scores = nvfp4mla.sparse_scores(q, cache, indices, None, 0.07, cfg)
    torch.cuda.synchronize()
    want = nvfp4mla.sparse_scores_reference(q.cpu(), cache.cpu(), indices.cpu(), None, 0.07, cfg,
                                            bf16_operands=True).double().numpy()
    got = scores.cpu().double().numpy()
    masked = np.isneginf(want)
    assert np.isneginf(got[masked]).all() and np.isfinite(got[~masked]).all()
    kv_c, k_pe = nvfp4mla.decode(cache.cpu().numpy(), cfg)
    k = bf16_round(np.concatenate([kv_c, k_pe], axis=1)).astype(np.float64)
    qf = q.float().cpu().double().numpy()
    idx = np.clip(indices.cpu().numpy(), 0, k.shape[0] - 1)
    mag = np.einsum("rhd,rpd->rhp", np.abs(qf), np.abs(k[idx]))
    tol = 0.07 * 24 * U * mag + 2 * U * np.abs(np.where(masked, 0, want)) + 1e-30
    assert (np.abs(got - want)[~masked] <= tol[~masked]).all()


# ---- streams and other producers -----------------------------------------------------------------

def test_runs_on_the_current_and_the_given_stream():
    cfg = nvfp4mla.FormatConfig()
    q, cache, indices, _ = make_problem(cfg, rows=4, heads=16, topk=256, seed=10)
    plan = nvfp4mla.plan_decode(cfg, 4, 16, 256)
    ws = torch.empty(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=DEV)
    want, _ = nvfp4mla.sparse_decode(q, cache, indices, None, 0.05, plan, ws)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side, _ = nvfp4mla.sparse_decode(q, cache, indices, None, 0.05, plan, ws)
    torch.cuda.current_stream().wait_stream(side)
    out = torch.empty_like(want)
    lse = torch.empty(4, 16, device=DEV)
    side.wait_stream(torch.cuda.current_stream())
    nvfp4mla.sparse_decode(q, cache, indices, None, 0.05, plan, ws, out, lse, stream=side)
    side.synchronize()
    assert torch.equal(want, on_side) and torch.equal(want, out)


def test_cupy_arrays_cross_through_dlpack():
    cupy = pytest.importorskip("cupy")
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    kv_c, k_pe = tokens(64, seed=11, dtype=torch.float32)
    want = cache_for(cfg, blocks=1)
    nvfp4mla.write_cache(kv_c, k_pe, want, torch.arange(64, device=DEV), cfg)
    torch.cuda.synchronize()
    cache = cupy.zeros((1, 64, cfg.record_bytes), dtype=cupy.uint8)
    nvfp4mla.write_cache(cupy.asarray(kv_c.cpu().numpy()), cupy.asarray(k_pe.cpu().numpy()), cache,
                         cupy.arange(64, dtype=cupy.int64), cfg)
    cupy.cuda.get_current_stream().synchronize()
    assert np.array_equal(cupy.asnumpy(cache), want.cpu().numpy())


# ---- argument rejection --------------------------------------------------------------------------------

def test_non_contiguous_and_wrong_device_inputs_are_rejected():
    cfg = nvfp4mla.FormatConfig()
    q, cache, indices, _ = make_problem(cfg, rows=4, heads=16, topk=64, seed=12)
    plan = nvfp4mla.plan_decode(cfg, 4, 16, 64, splits=1)
    strided_q = torch.empty(16, 4, 576, dtype=torch.bfloat16, device=DEV).transpose(0, 1)
    with pytest.raises(nvfp4mla.ArgumentError, match="sparse_decode: q must be contiguous"):
        nvfp4mla.sparse_decode(strided_q, cache, indices, None, 0.1, plan, None)
    with pytest.raises(nvfp4mla.ArgumentError, match="sparse_decode: cache must be on a CUDA device"):
        nvfp4mla.sparse_decode(q, cache.cpu(), indices, None, 0.1, plan, None)
    with pytest.raises(nvfp4mla.ArgumentError, match="sparse_decode: indices must be int32, got int64"):
        nvfp4mla.sparse_decode(q, cache, indices.long(), None, 0.1, plan, None)
    with pytest.raises(nvfp4mla.ArgumentError, match="sparse_decode: q must be bfloat16 or uint16, got float16"):
        nvfp4mla.sparse_decode(q.half(), cache, indices, None, 0.1, plan, None)
    with pytest.raises(nvfp4mla.ArgumentError, match="out must be on a CUDA device"):
        nvfp4mla.sparse_decode(q, cache, indices, None, 0.1, plan, None,
                               out=torch.empty(4, 16, 512, dtype=torch.bfloat16))
    with pytest.raises(nvfp4mla.ArgumentError, match="write_cache: kv_c must be on a CUDA device"):
        kv_c, k_pe = tokens(2, seed=13)
        nvfp4mla.write_cache(kv_c.cpu(), k_pe, cache, torch.arange(2, device=DEV), cfg)
    with pytest.raises(nvfp4mla.ArgumentError, match="unit stride in its last dimension"):
        _, k_pe = tokens(2, seed=14)
        column_major = torch.zeros(512, 2, dtype=torch.bfloat16, device=DEV).t()
        nvfp4mla.write_cache(column_major, k_pe, cache, torch.arange(2, device=DEV), cfg)
    big = nvfp4mla.plan_decode(cfg, 4, 128, 2048, splits=8)
    q128 = torch.zeros(4, 128, 576, dtype=torch.bfloat16, device=DEV)
    idx = torch.zeros(4, 2048, dtype=torch.int32, device=DEV)
    with pytest.raises(nvfp4mla.ArgumentError, match="needs a workspace of"):
        nvfp4mla.sparse_decode(q128, cache, idx, None, 0.1, big, torch.empty(16, dtype=torch.uint8, device=DEV))


def test_library_errors_surface_as_exceptions():
    cfg = nvfp4mla.FormatConfig()
    q, cache, indices, _ = make_problem(cfg, rows=4, heads=16, topk=64, seed=15)
    p = nvfp4mla.plan_decode(cfg, 4, 16, 2048, splits=1)
    # The planner's fields of another problem under this problem's shapes: only the library can tell.
    forged = nvfp4mla.DecodePlan.from_list(p.as_list()[:10] + [4, 16, 64, p.sm_count, p.workspace_bytes], p._format,
                                           p.record_bytes)
    for decode in (nvfp4mla.sparse_decode, nvt.sparse_decode):
        with pytest.raises(nvfp4mla.Error, match="sparse decode: the plan does not match rows/heads/topk"):
            decode(q, cache, indices, None, 0.1, forged, None)


def test_eager_direct_path_equals_the_op():
    """nvfp4mla.torch's functions skip the dispatcher when eager with autograd off: same bytes as
    the op (autograd on), and the mutated tensors' versions bumped as the dispatcher does."""
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    plan, args = decode_args(cfg)
    q, cache, indices, lengths, ws = args[0], args[1], args[2], args[3], args[6]
    kv_c, k_pe = tokens(8, seed=30)
    slots = torch.arange(8, device=DEV) * 3
    results = []
    for mode in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        written = cache.clone()
        out = torch.empty(3, 16, 512, dtype=torch.bfloat16, device=DEV)
        lse = torch.empty(3, 16, device=DEV)
        versions = (written._version, out._version, lse._version)
        with mode():
            nvt.write_cache(kv_c, k_pe, written, slots, cfg)
            nvt.sparse_decode(q, written, indices, lengths, 0.05, plan, ws, out, lse)
        torch.cuda.synchronize()
        assert all(after > before for after, before in zip((written._version, out._version, lse._version), versions))
        results.append((written, out.view(torch.int16), lse))
    for got in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(got, results[0]))


# ---- torch ops ------------------------------------------------------------------------------------------

OPS = ("write_cache", "gather_records", "scatter_records", "sparse_decode", "sparse_extend", "sparse_scores")
MUTATED = {"write_cache": {"cache"}, "gather_records": {"output"},
           "scatter_records": {"cache"}, "sparse_decode": {"workspace", "output", "lse"},
           "sparse_extend": {"output", "lse"}, "sparse_scores": {"output"}}


@pytest.mark.parametrize("name", OPS)
def test_ops_are_registered_with_their_mutations(name):
    schema = getattr(torch.ops.nvfp4mla, name).default._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == MUTATED[name]
    assert len(schema.returns) == 0


def decode_args(cfg, rows=3, heads=16, topk=128, seed=16):
    q, cache, indices, lengths = make_problem(cfg, rows, heads, topk, seed, lengths=True)
    plan = nvfp4mla.plan_decode(cfg, rows, heads, topk, splits=2)
    ws = torch.empty(max(plan.workspace_bytes, 256), dtype=torch.uint8, device=DEV)
    out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device=DEV)
    lse = torch.empty(rows, heads, device=DEV)
    return plan, (q, cache, indices, lengths, 0.05, plan.as_list(), ws, out, lse, plan.cache_dtype, plan.rope,
                  plan.scale_mode, plan.layer_scale, False)


def test_opcheck():
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    kv_c, k_pe = tokens(8, seed=17)
    cache = cache_for(cfg, blocks=2, block_size=8)
    slots = torch.tensor([0, 3, 5, 7, 8, 9, -1, 15], device=DEV)
    names = (cfg.cache_dtype, cfg.rope, cfg.scale_mode, cfg.layer_scale)
    torch.library.opcheck(torch.ops.nvfp4mla.write_cache.default, (kv_c, k_pe, cache, slots, *names))
    out = torch.empty(8, cfg.record_bytes, dtype=torch.uint8, device=DEV)
    torch.library.opcheck(torch.ops.nvfp4mla.gather_records.default, (cache, slots, out))
    torch.library.opcheck(torch.ops.nvfp4mla.scatter_records.default, (out, slots, cache))
    _, args = decode_args(cfg)
    torch.library.opcheck(torch.ops.nvfp4mla.sparse_decode.default, args)
    q, cache2, indices, lengths = args[:4]
    o = torch.empty(3, 16, 512, dtype=torch.bfloat16, device=DEV)
    lse = torch.empty(3, 16, device=DEV)
    torch.library.opcheck(torch.ops.nvfp4mla.sparse_extend.default,
                          (q, cache2, indices, lengths, 0.05, o, lse, *names, False))
    scores = torch.empty(3, 16, 128, device=DEV)
    torch.library.opcheck(torch.ops.nvfp4mla.sparse_scores.default,
                          (q, cache2, indices, lengths, 0.05, scores, *names))


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    cfg = nvfp4mla.FormatConfig()
    # top-k 320, not 512: the scores' last dimension must be top-k, not the latent width
    plan = nvfp4mla.plan_decode(cfg, 6, 32, 320, splits=1)
    with FakeTensorMode():
        q = torch.empty(6, 32, 576, dtype=torch.bfloat16, device=DEV)
        cache = torch.empty(10, 64, cfg.record_bytes, dtype=torch.uint8, device=DEV)
        indices = torch.empty(6, 320, dtype=torch.int32, device=DEV)
        out, lse = nvt.sparse_decode(q, cache, indices, None, 0.1, plan, None)
        assert out.shape == (6, 32, 512) and out.dtype == torch.bfloat16 and out.device.type == "cuda"
        assert lse.shape == (6, 32) and lse.dtype == torch.float32
        out, lse = nvt.sparse_extend(q, cache, indices, None, 0.1, cfg)
        assert out.shape == (6, 32, 512) and lse.shape == (6, 32)
        assert nvt.sparse_scores(q, cache, indices, None, 0.1, cfg).shape == (6, 32, 320)
        assert nvt.gather_records(cache, torch.empty(9, dtype=torch.int64, device=DEV)).shape == (9, cfg.record_bytes)


def write_and_decode(cfg, plan, kv_c, k_pe, cache, slots, q, indices, lengths, ws, out, lse):
    nvt.write_cache(kv_c, k_pe, cache, slots, cfg)
    return nvt.sparse_decode(q, cache, indices, lengths, 0.05, plan, ws, out, lse)


def step_inputs(cfg, seed, rows=4, heads=16, topk=256, capacity=512):
    q, _, indices, lengths = make_problem(cfg, rows, heads, topk, seed, capacity=capacity, lengths=True)
    kv_c, k_pe = tokens(32, seed + 100)
    slots = torch.randperm(capacity, device=DEV)[:32]
    return kv_c, k_pe, slots, q, indices, lengths


def test_torch_compile_matches_eager():
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    plan = nvfp4mla.plan_decode(cfg, 4, 16, 256, splits=4)
    ws = torch.empty(max(plan.workspace_bytes, 256), dtype=torch.uint8, device=DEV)
    kv_c, k_pe, slots, q, indices, lengths = step_inputs(cfg, seed=18)
    base = torch.randint(0, 256, (512, cfg.record_bytes), dtype=torch.uint8, device=DEV)

    def step(cache, out, lse):
        return write_and_decode(cfg, plan, kv_c, k_pe, cache, slots, q, indices, lengths, ws, out, lse)

    results = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        cache = base.clone()
        out = torch.empty(4, 16, 512, dtype=torch.bfloat16, device=DEV)
        lse = torch.empty(4, 16, device=DEV)
        fn(cache, out, lse)
        torch.cuda.synchronize()
        results.append((cache, out, lse))
    (c0, o0, l0), (c1, o1, l1) = results
    assert torch.equal(c0, c1) and torch.equal(o0.view(torch.int16), o1.view(torch.int16)) and torch.equal(l0, l1)


def test_cuda_graph_capture_and_replay_match_eager():
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    plan = nvfp4mla.plan_decode(cfg, 4, 16, 256, splits=4)
    ws = torch.empty(max(plan.workspace_bytes, 256), dtype=torch.uint8, device=DEV)
    # Static buffers the graph reads and writes.
    kv_c, k_pe, slots, q, indices, lengths = (t.clone() for t in step_inputs(cfg, seed=19))
    cache = torch.zeros(512, cfg.record_bytes, dtype=torch.uint8, device=DEV)
    out = torch.empty(4, 16, 512, dtype=torch.bfloat16, device=DEV)
    lse = torch.empty(4, 16, device=DEV)
    args = (cfg, plan, kv_c, k_pe, cache, slots, q, indices, lengths, ws, out, lse)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph, as torch recommends
        write_and_decode(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        write_and_decode(*args)
    for seed in (20, 21):
        new = step_inputs(cfg, seed)
        start = torch.randint(0, 256, cache.shape, dtype=torch.uint8, device=DEV)
        for static, value in zip((kv_c, k_pe, slots, q, indices, lengths), new):
            static.copy_(value)
        cache.copy_(start)
        graph.replay()
        torch.cuda.synchronize()
        replayed = (cache.clone(), out.clone(), lse.clone())
        eager_cache = start.clone()
        eager_out, eager_lse = write_and_decode(cfg, plan, *new[:2], eager_cache, new[2], new[3], new[4], new[5], ws,
                                                None, None)
        torch.cuda.synchronize()
        assert torch.equal(replayed[0], eager_cache)
        assert torch.equal(replayed[1].view(torch.int16), eager_out.view(torch.int16))
        assert torch.equal(replayed[2], eager_lse)
