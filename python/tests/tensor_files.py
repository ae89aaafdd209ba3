"""safetensors files (the CLI's tensor files) and BF16 bits with numpy alone: shared by the package
tests and scripts/attend_inputs.py, which runs on GPU machines without the package built."""
import json
import struct

import numpy as np

_ST_DTYPES = {"float32": "F32", "float16": "F16", "uint8": "U8", "uint16": "BF16",  # uint16 = BF16 bits
              "int32": "I32"}
_NP_DTYPES = {"F32": np.float32, "F16": np.float16, "U8": np.uint8, "BF16": np.uint16, "I32": np.int32}


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        blob = a.tobytes()
        header[name] = {"dtype": _ST_DTYPES[a.dtype.name], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(body[begin:end], dtype=_NP_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def bf16_bits(x):
    """BF16 bits (uint16) of float32 values that are exact in BF16."""
    return (np.asarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def bf16_values(x):
    """float32 values of BF16 bits."""
    return (np.asarray(x, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
