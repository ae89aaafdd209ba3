#!/usr/bin/env python3
"""Random inputs for `nvfp4mla encode` and `nvfp4mla attend`, as safetensors files in OUT_DIR.

  scripts/attend_inputs.py OUT_DIR ROWS HEADS [--slots N] [--topk K] [--seed S]

writes latent.safetensors (F32 kv_c [slots, 512] and k_pe [slots, 64], to encode into records
with the library's own writer), q.safetensors (BF16 q [rows, heads, 576]) and
indices.safetensors (I32 indices [rows, topk] with ~5% masked entries (-1) and a ragged
topk_length [rows]). Only numpy is needed, so it runs on a bare GPU machine.
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python" / "tests"))
from tensor_files import bf16_bits, write_safetensors  # noqa: E402  (numpy alone: no package build needed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=pathlib.Path)
    parser.add_argument("rows", type=int)
    parser.add_argument("heads", type=int)
    parser.add_argument("--slots", type=int, default=16384)
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    args.out_dir.mkdir(parents=True, exist_ok=True)

    # Latent rows with per-token magnitudes over three decades and a few outlier channels, so that
    # group scales and outer scales both vary.
    magnitude = 10.0 ** rng.uniform(-1.5, 1.5, size=(args.slots, 1))
    kv_c = rng.normal(0, 1, size=(args.slots, 512)) * magnitude
    kv_c[:, rng.choice(512, 8, replace=False)] *= 8.0
    k_pe = rng.normal(0, 1, size=(args.slots, 64)) * magnitude
    write_safetensors(args.out_dir / "latent.safetensors", {"kv_c": kv_c.astype(np.float32), "k_pe": k_pe.astype(np.float32)})

    q = bf16_bits(rng.normal(0, 1, size=(args.rows, args.heads, 576)))  # truncated to BF16: any values do
    write_safetensors(args.out_dir / "q.safetensors", {"q": q})

    indices = rng.integers(0, args.slots, size=(args.rows, args.topk)).astype(np.int32)
    indices[rng.random(size=indices.shape) < 0.05] = -1
    topk_length = np.full(args.rows, args.topk, np.int32)
    topk_length[::7] = rng.integers(1, args.topk, size=len(topk_length[::7]))
    write_safetensors(args.out_dir / "indices.safetensors", {"indices": indices, "topk_length": topk_length})


if __name__ == "__main__":
    main()
