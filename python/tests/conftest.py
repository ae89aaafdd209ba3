"""Shared helpers of the package tests: the CLI, safetensors files, BF16 bits, random tokens."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

import numpy as np  # noqa: E402
# safetensors files and BF16 bits, shared with scripts/attend_inputs.py
from tensor_files import bf16_bits, bf16_values, read_safetensors, write_safetensors  # noqa: E402,F401

import nvfp4mla  # noqa: E402,F401  (fails early, with its own message, when the library is missing)

VLLM_VARIABLES = ("VLLM_NVFP4_MLA_DYNAMIC_SCALE", "KV_FP8_ROPE", "VLLM_NVFP4_MLA_SCALES_FILE",
                  "VLLM_B12X_MLA_SPEC_EXTEND_AS_DECODE")

# (cache_dtype, rope, scale_mode, layer_scale) of every record format and scale mode.
ALL_FORMATS = [
    dict(cache_dtype="bf16"),
    dict(cache_dtype="fp8_ds_mla"),
    dict(rope="bf16", scale_mode="implicit"),
    dict(rope="fp8", scale_mode="implicit"),
    dict(rope="bf16", scale_mode="static", layer_scale=0.0125),
    dict(rope="fp8", scale_mode="static", layer_scale=3.5),
    dict(rope="fp8", scale_mode="dynamic"),
]


def format_id(f):
    return "-".join(str(v) for v in f.values())


@pytest.fixture(autouse=True)
def _clean_vllm_environment(monkeypatch):
    """Every test starts without the vLLM variables (the library reads none itself)."""
    for name in VLLM_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def cli_path():
    path = os.environ.get("NVFP4MLA_CLI", os.path.join(REPO, "build", "nvfp4mla"))
    return path if os.access(path, os.X_OK) else None


@pytest.fixture
def cli():
    """Runs the nvfp4mla command-line tool; returns its stdout (fails on a non-zero exit)."""
    path = cli_path()
    if path is None:
        pytest.skip("the nvfp4mla CLI is not built (build/nvfp4mla or $NVFP4MLA_CLI)")

    def run(*args, env=None, check=True):
        full_env = {k: v for k, v in os.environ.items() if k not in VLLM_VARIABLES}
        full_env.update(env or {})
        r = subprocess.run([path, *map(str, args)], capture_output=True, text=True, env=full_env)
        if check and r.returncode != 0:
            raise AssertionError(f"nvfp4mla {' '.join(map(str, args))} failed: {r.stderr}")
        return r
    return run


# ---- values --------------------------------------------------------------------------------------------

def random_tokens(n, seed, scale=1.0):
    """kv_c [n, 512] and k_pe [n, 64] as float32 values exact in BF16 (so BF16, FP16-free and
    float32 inputs describe the same numbers), with a spread of magnitudes per token."""
    rng = np.random.default_rng(seed)
    mags = scale * np.exp2(rng.integers(-6, 4, size=(n, 1))).astype(np.float32)
    kv_c = (rng.standard_normal((n, 512)).astype(np.float32) * mags)
    k_pe = (rng.standard_normal((n, 64)).astype(np.float32) * mags)
    return bf16_values(bf16_bits(kv_c)), bf16_values(bf16_bits(k_pe))


def config_args(f):
    """CLI flags of a format dict."""
    flags = []
    for key, flag in (("cache_dtype", "--cache-dtype"), ("rope", "--rope"), ("scale_mode", "--scale-mode"),
                      ("layer_scale", "--layer-scale")):
        if key in f:
            flags += [flag, str(f[key])]
    return flags


@pytest.fixture
def calibration_file(tmp_path):
    """A calibration file of 4 layers (nvfp4_ds_mla_outer_scale_v1)."""
    path = tmp_path / "scales.json"
    max_abs = [1.5, 12.0, 0.25, 96.0]
    path.write_text(json.dumps({"format": "nvfp4_ds_mla_outer_scale_v1", "num_layers": 4, "latent_dim": 512,
                                "denominator": 2688.0, "scales": [m / 2688.0 for m in max_abs],
                                "max_abs": max_abs}))
    return path
