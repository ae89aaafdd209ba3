#!/usr/bin/env python3
"""Random inputs for `nvfp4mla encode` and `nvfp4mla attend`, as safetensors files in OUT_DIR.

  scripts/attend_inputs.py OUT_DIR ROWS HEADS [--slots N] [--topk K] [--seed S]

writes latent.safetensors (F32 kv_c [slots, 512] and k_pe [slots, 64], to encode into records
with the library's own writer), q.safetensors (BF16 q [rows, heads, 576]) and
indices.safetensors (I32 indices [rows, topk] with ~5% masked entries (-1) and a ragged
topk_length [rows]). Only numpy is needed, so it runs on a bare GPU machine.
"""
import argparse
import json
import pathlib
import struct

import numpy as np


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (dtype, array) in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for data in blobs:
            f.write(data)


def bf16_bits(x):
    """Round-to-nearest-even BF16 bit patterns of finite float32 values."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


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
    write_safetensors(args.out_dir / "latent.safetensors",
                      {"kv_c": ("F32", kv_c.astype(np.float32)), "k_pe": ("F32", k_pe.astype(np.float32))})

    q = bf16_bits(rng.normal(0, 1, size=(args.rows, args.heads, 576)))
    write_safetensors(args.out_dir / "q.safetensors", {"q": ("BF16", q)})

    indices = rng.integers(0, args.slots, size=(args.rows, args.topk)).astype(np.int32)
    indices[rng.random(size=indices.shape) < 0.05] = -1
    topk_length = np.full(args.rows, args.topk, np.int32)
    topk_length[::7] = rng.integers(1, args.topk, size=len(topk_length[::7]))
    write_safetensors(args.out_dir / "indices.safetensors", {"indices": ("I32", indices), "topk_length": ("I32", topk_length)})


if __name__ == "__main__":
    main()
