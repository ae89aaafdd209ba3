"""The torch functions on CPU tensors (skipped without a torch that has torch.library.custom_op)."""
import numpy as np
import pytest

import nvfp4mla
from test_selection import random_keys

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op"):
    pytest.skip("needs torch >= 2.4 (torch.library.custom_op)", allow_module_level=True)

import nvfp4mla.torch as nvt  # noqa: E402  (registers torch.ops.nvfp4mla)

RB = nvfp4mla.INDEX_KEY_RECORD_BYTES


def test_write_index_cache_returns_a_zero_counter_on_the_cpu():
    keys = random_keys(3, seed=1)
    want = np.zeros((2, 64 * RB), np.uint8)
    nvfp4mla.write_index_cache(keys, want, np.arange(3))
    cache = torch.zeros(2, 64 * RB, dtype=torch.uint8)
    slots = torch.arange(3, dtype=torch.int64)
    count = nvt.write_index_cache(torch.from_numpy(keys), cache, slots)
    assert count.tolist() == [0] and np.array_equal(cache.numpy(), want)
    given = torch.full((1,), 7, dtype=torch.int64)
    assert nvt.write_index_cache(torch.from_numpy(keys), cache, slots, invalid_count=given) is given
    assert given.tolist() == [0]
