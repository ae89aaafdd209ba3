"""Decode planning and the CPU attention references; GPU entry points refuse host memory."""
import numpy as np
import pytest

import nvfp4mla
from conftest import ALL_FORMATS, bf16_bits, bf16_values, format_id, random_tokens


def problem(cfg, rows, heads, topk, capacity, seed, lengths=False):
    rng = np.random.default_rng(seed)
    kv_c, k_pe = random_tokens(capacity, seed)
    cache = nvfp4mla.encode(kv_c, k_pe, cfg)
    q = bf16_bits(rng.standard_normal((rows, heads, 576)).astype(np.float32))
    indices = rng.integers(-2, capacity + 2, size=(rows, topk)).astype(np.int32)  # some invalid
    topk_length = rng.integers(0, topk + 1, size=rows).astype(np.int32) if lengths else None
    return q, cache, indices, topk_length


def numpy_reference(q, cache, indices, topk_length, sm_scale, cfg):
    """Attention in float64 over records decoded by nvfp4mla.decode."""
    kv_c, k_pe = nvfp4mla.decode(cache, cfg)
    k = np.concatenate([kv_c, k_pe], axis=1).astype(np.float64)
    qf = bf16_values(q).astype(np.float64)
    rows, heads, _ = q.shape
    out = np.zeros((rows, heads, 512))
    lse = np.full((rows, heads), -np.inf)
    for r in range(rows):
        n = indices.shape[1] if topk_length is None else topk_length[r]
        valid = [i for i in indices[r, :n] if 0 <= i < cache.shape[0]]
        if not valid:
            continue
        s = sm_scale * qf[r] @ k[valid].T  # [heads, entries]
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        out[r] = (p @ k[valid, :512]) / p.sum(axis=1, keepdims=True)
        lse[r] = (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]
    return out, lse


@pytest.mark.parametrize("f", ALL_FORMATS, ids=format_id)
def test_reference_matches_numpy(f):
    cfg = nvfp4mla.FormatConfig(**f)
    q, cache, indices, lengths = problem(cfg, rows=3, heads=8, topk=40, capacity=50, seed=21, lengths=True)
    lengths[1] = 0  # an empty row
    out, lse = nvfp4mla.sparse_mla_reference(q, cache, indices, lengths, 0.05, cfg)
    want_out, want_lse = numpy_reference(q, cache, indices, lengths, 0.05, cfg)
    assert out.dtype == np.float32 and out.shape == (3, 8, 512) and lse.shape == (3, 8)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6)
    assert not out[1].any() and np.isneginf(lse[1]).all()
    out2, lse2 = nvfp4mla.sparse_mla_reference(q, cache, indices, lengths, 0.05, cfg, lse_base2=True)
    np.testing.assert_allclose(lse2[0], lse[0] / np.log(2), rtol=1e-6)


def test_scores_reference_matches_numpy():
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    q, cache, indices, _ = problem(cfg, rows=2, heads=4, topk=16, capacity=20, seed=22)
    scores = nvfp4mla.sparse_scores_reference(q, cache, indices, None, 0.1, cfg)
    kv_c, k_pe = nvfp4mla.decode(cache, cfg)
    k = np.concatenate([kv_c, k_pe], axis=1).astype(np.float64)
    qf = bf16_values(q).astype(np.float64)
    for r in range(2):
        for p, i in enumerate(indices[r]):
            if 0 <= i < 20:
                np.testing.assert_allclose(scores[r, :, p], 0.1 * qf[r] @ k[i], rtol=1e-6)
            else:
                assert np.isneginf(scores[r, :, p]).all()


def test_plan_decode_fields_and_workspace():
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    plan = nvfp4mla.plan_decode(cfg, rows=4, heads=128, topk=2048, sm_count=132)
    assert (plan.rows, plan.heads, plan.topk, plan.record_bytes) == (4, 128, 2048, 368)
    assert plan.head_group == 64 and plan.num_head_groups == 2 and plan.num_tiles == 2048 // plan.tile_tokens
    assert plan.splits > 1  # 4 rows cannot fill 132 SMs without splitting
    # 4 x 2 x splits CTAs fit one wave: the splits merge inside the launch, with BF16 partials.
    assert plan.partial_bytes == 2
    partial_out = 4 * 128 * plan.splits * 512 * plan.partial_bytes
    partial_lse = 4 * 128 * plan.splits * 4
    align = lambda n: (n + 255) // 256 * 256  # noqa: E731
    assert plan.workspace_bytes == align(partial_out) + align(partial_lse)
    assert len(plan.as_list()) == 15
    assert nvfp4mla.DecodePlan.from_list(plan.as_list(), plan._format, plan.record_bytes).as_list() == plan.as_list()
    one = nvfp4mla.plan_decode(cfg, rows=4, heads=128, topk=2048, sm_count=132, splits=1)
    assert one.splits == 1 and one.workspace_bytes == 0
    h16 = nvfp4mla.plan_decode(cfg, rows=128, heads=16, topk=2048, sm_count=132)
    assert h16.head_group == 16


def test_plan_decode_errors():
    cfg = nvfp4mla.FormatConfig()
    with pytest.raises(nvfp4mla.Error, match="decode plan: rows >= 0, heads > 0 and topk > 0 required"):
        nvfp4mla.plan_decode(cfg, rows=1, heads=0, topk=64, sm_count=132)
    with pytest.raises(nvfp4mla.Error, match="SM count must be positive"):
        nvfp4mla.plan_decode(cfg, rows=1, heads=16, topk=64, sm_count=0)
    # Not truncated to their low 32 bits on the way to C (rows 1, topk 64).
    with pytest.raises(nvfp4mla.ArgumentError, match=r"plan_decode: rows must be in .*, got 4294967297"):
        nvfp4mla.plan_decode(cfg, rows=2 ** 32 + 1, heads=16, topk=64, sm_count=132)
    with pytest.raises(nvfp4mla.ArgumentError, match="plan_decode: topk"):
        nvfp4mla.plan_decode(cfg, rows=1, heads=16, topk=2 ** 32 + 64, sm_count=132)
    with pytest.raises(nvfp4mla.ArgumentError, match="extend_staging_bytes: rows"):
        nvfp4mla.extend_staging_bytes(1024, 2 ** 32 + 4, 64)


def test_reference_argument_checks():
    cfg = nvfp4mla.FormatConfig()
    q, cache, indices, _ = problem(cfg, rows=2, heads=8, topk=8, capacity=10, seed=23)
    with pytest.raises(nvfp4mla.ArgumentError, match=r"q must have shape \[\*, \*, 576\]"):
        nvfp4mla.sparse_mla_reference(q[:, :, :512], cache, indices, None, 0.1, cfg)
    with pytest.raises(nvfp4mla.ArgumentError, match="indices must be int32, got int64"):
        nvfp4mla.sparse_mla_reference(q, cache, indices.astype(np.int64), None, 0.1, cfg)
    with pytest.raises(nvfp4mla.ArgumentError, match=r"indices must have shape \[2, \*\]"):
        nvfp4mla.sparse_mla_reference(q, cache, indices[:1], None, 0.1, cfg)
    with pytest.raises(nvfp4mla.ArgumentError, match=r"topk_length must have shape \[2\]"):
        nvfp4mla.sparse_mla_reference(q, cache, indices, np.zeros(3, np.int32), 0.1, cfg)
    with pytest.raises(nvfp4mla.ArgumentError, match="q must be contiguous"):
        nvfp4mla.sparse_mla_reference(q[::-1], cache, indices, None, 0.1, cfg)
    with pytest.raises(nvfp4mla.Error, match="sm_scale must be finite"):
        nvfp4mla.sparse_mla_reference(q, cache, indices, None, float("nan"), cfg)


def test_gpu_functions_refuse_host_memory():
    cfg = nvfp4mla.FormatConfig()
    q, cache, indices, _ = problem(cfg, rows=2, heads=16, topk=64, capacity=70, seed=24)
    plan = nvfp4mla.plan_decode(cfg, rows=2, heads=16, topk=64, sm_count=132, splits=1)
    workspace = np.zeros(256, np.uint8)
    for call in (lambda: nvfp4mla.sparse_decode(q, cache, indices, None, 0.1, plan, None),
                 lambda: nvfp4mla.sparse_extend(q, cache, indices, None, 0.1, cfg),
                 lambda: nvfp4mla.sparse_extend(q, cache, indices, None, 0.1, cfg, workspace=workspace),
                 lambda: nvfp4mla.sparse_scores(q, cache, indices, None, 0.1, cfg)):
        with pytest.raises(nvfp4mla.ArgumentError, match=r"q must be on a CUDA device, got uint16 \[2, 16, 576\] on cpu"):
            call()


def test_staged_extend_checks_its_workspace_before_the_device():
    cfg = nvfp4mla.FormatConfig()
    q, cache, indices, _ = problem(cfg, rows=2, heads=16, topk=64, capacity=70, seed=26)
    with pytest.raises(nvfp4mla.ArgumentError, match=r"sparse_extend: workspace must be uint8 or int8, got float32"):
        nvfp4mla.sparse_extend(q, cache, indices, None, 0.1, cfg, workspace=np.zeros(64, np.float32))
    with pytest.raises(nvfp4mla.ArgumentError, match="sparse_extend: workspace must be contiguous"):
        nvfp4mla.sparse_extend(q, cache, indices, None, 0.1, cfg, workspace=np.zeros((8, 8), np.uint8)[:, ::2])


def test_extend_staging_bytes_refuses_bad_shapes():
    with pytest.raises(nvfp4mla.Error) as e:
        nvfp4mla.extend_staging_bytes(1024, 4, 0)
    if nvfp4mla.built_with_cuda():  # the arguments are checked before the device is asked anything
        assert "capacity >= 0, rows >= 0 and topk > 0 required" in str(e.value)
    else:
        assert isinstance(e.value, nvfp4mla.UnsupportedError) and "built without CUDA" in str(e.value)


def test_sparse_decode_checks_shapes_against_the_plan():
    cfg = nvfp4mla.FormatConfig()
    q, cache, indices, _ = problem(cfg, rows=2, heads=16, topk=64, capacity=70, seed=25)
    plan = nvfp4mla.plan_decode(cfg, rows=3, heads=16, topk=64, sm_count=132)
    with pytest.raises(nvfp4mla.ArgumentError, match=r"q must have shape \[3, 16, 576\]"):
        nvfp4mla.sparse_decode(q, cache, indices, None, 0.1, plan, None)


def test_cuda_entry_points_without_a_device():
    if nvfp4mla.cuda_device_count() > 0:
        pytest.skip("a CUDA device is visible")
    with pytest.raises(nvfp4mla.Error):
        nvfp4mla.cuda_sm_count(0)


def test_sparse_decode_call_packs_the_c_struct():
    """The eager torch path packs nvfp4mla_sparse_decode_call with struct: the same bytes as the
    ctypes mirror of c_api.h, padding included, and the library reads it."""
    from nvfp4mla import _lib
    from nvfp4mla.attention import _call_layout
    layout = _call_layout(_lib.SparseDecodeCall)
    c = _lib.SparseDecodeCall(11, 12, _lib.Attention(13, 14, 15, 16, 17, 18, 19, 20, 0.5, 1), 21, 22, 23, 24, 3, 25)
    assert layout.pack(11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 0.5, 1, 21, 22, 23, 24, 3, 25) == bytes(c)
    status = _lib.lib.nvfp4mla_cuda_sparse_decode_call(layout.pack(*[0] * 18))
    assert status != 0
    if nvfp4mla.built_with_cuda():
        assert b"format is required" in _lib.lib.nvfp4mla_last_error()
