"""Host cost of one eager sparse_decode call from Python, against the kernel time (docs/PERF.md).

  PYTHONPATH=python python3 python/benchmarks/sparse_decode_overhead.py [--json FILE]

For each shape, with caller-provided out/lse/workspace and torch tensors:
- python:   nvfp4mla.sparse_decode (argument checks + ctypes call + the library's host launch),
- torch op: nvfp4mla.torch.sparse_decode (adds the torch.library dispatcher),
- C call:   the bare ctypes call of nvfp4mla_cuda_sparse_decode with prebuilt structs (the library's
            host work: validation and the kernel launches),
each as the median over repeats of the mean host time per call of a burst of calls queued without
synchronizing (bursts short enough that the launch queue never fills), and the kernel time by CUDA
events over the same burst. Python overhead = python - C call.
"""
import argparse
import json
import statistics
import time
from ctypes import byref

import torch

import nvfp4mla
import nvfp4mla.torch as nvt
from nvfp4mla import _lib
from nvfp4mla.attention import _problem, _views

SHAPES = [(1, 16, 64), (128, 16, 2048), (64, 128, 2048)]  # (rows, heads, topk)


def setup(config, rows, heads, topk):
    capacity = max(4096, topk)
    g = torch.Generator(device="cpu").manual_seed(rows * heads)
    kv = torch.randn(capacity, 576, generator=g).to(torch.bfloat16).cuda()
    cache = torch.empty(capacity, config.record_bytes, dtype=torch.uint8, device="cuda")
    nvfp4mla.write_cache(kv[:, :512], kv[:, 512:], cache, torch.arange(capacity, device="cuda"), config)
    q = torch.randn(rows, heads, 576, generator=g).to(torch.bfloat16).cuda()
    indices = torch.randint(0, capacity, (rows, topk), generator=g, dtype=torch.int32).cuda()
    plan = nvfp4mla.plan_decode(config, rows, heads, topk)
    ws = torch.empty(max(plan.workspace_bytes, 256), dtype=torch.uint8, device="cuda")
    out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(rows, heads, device="cuda")
    return q, cache, indices, plan, ws, out, lse


def host_us(fn, burst, repeats):
    per_call = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(burst):
            fn()
        per_call.append((time.perf_counter() - t0) / burst * 1e6)
    torch.cuda.synchronize()
    return statistics.median(per_call)


def kernel_us(fn, burst, repeats):
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(burst):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / burst)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--burst", type=int, default=100)
    p.add_argument("--repeats", type=int, default=21)
    args = p.parse_args()
    config = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    results = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {config.describe()}")
    print(f"{'rows':>5} {'heads':>5} {'topk':>5} {'splits':>6} | {'python us':>9} {'torch op us':>11} "
          f"{'C call us':>9} {'overhead us':>11} | {'kernel us':>9}")
    for rows, heads, topk in SHAPES:
        q, cache, indices, plan, ws, out, lse = setup(config, rows, heads, topk)
        vq, vc, vi, _ = _views(0, q, cache, indices, None)
        problem = _problem("bench", vq, vc, vi, None, plan.record_bytes, 0.04, False)
        stream = torch.cuda.current_stream().cuda_stream
        fn_c = _lib.lib.nvfp4mla_cuda_sparse_decode
        fmt, c_plan = plan._format, plan._c
        ws_ptr, nbytes, out_ptr, lse_ptr = ws.data_ptr(), ws.numel(), out.data_ptr(), lse.data_ptr()

        def c_call():
            fn_c(byref(fmt), byref(problem), byref(c_plan), ws_ptr, nbytes, out_ptr, lse_ptr, 0, stream)

        def python_call():
            nvfp4mla.sparse_decode(q, cache, indices, None, 0.04, plan, ws, out, lse)

        def op_call():
            nvt.sparse_decode(q, cache, indices, None, 0.04, plan, ws, out, lse)

        for fn in (c_call, python_call, op_call):  # warm-up
            fn()
        burst = args.burst if rows * heads <= 2048 else 20  # keep long kernels from filling the queue
        row = dict(rows=rows, heads=heads, topk=topk, splits=plan.splits,
                   python_us=host_us(python_call, burst, args.repeats), op_us=host_us(op_call, burst, args.repeats),
                   c_call_us=host_us(c_call, burst, args.repeats), kernel_us=kernel_us(c_call, burst, args.repeats))
        row["overhead_us"] = row["python_us"] - row["c_call_us"]
        results.append(row)
        print(f"{rows:>5} {heads:>5} {topk:>5} {plan.splits:>6} | {row['python_us']:>9.2f} {row['op_us']:>11.2f} "
              f"{row['c_call_us']:>9.2f} {row['overhead_us']:>11.2f} | {row['kernel_us']:>9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, results=results), f, indent=2)


if __name__ == "__main__":
    main()
