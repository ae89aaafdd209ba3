"""Host cost of one eager sparse_decode call from Python, against the kernel time (docs/PYTHON.md).

  PYTHONPATH=python python3 python/benchmarks/sparse_decode_overhead.py [--json FILE]

Runs under torch.inference_mode(), as engines run their model. For each shape, with
caller-provided out/lse/workspace and torch tensors:
- python:    nvfp4mla.sparse_decode (argument checks + one ctypes call + the library's host launch),
- torch fn:  nvfp4mla.torch.sparse_decode (eager with autograd off: the same path, past the dispatcher),
- torch op:  torch.ops.nvfp4mla.sparse_decode (through the torch.library dispatcher, as under
             torch.compile or with autograd on),
- C call:    the bare ctypes call of nvfp4mla_cuda_sparse_decode with prebuilt structs (the library's
             host work: validation and the kernel launches),
each as the median over repeats of the mean host time per call of a burst of calls queued without
synchronizing (bursts short enough that the launch queue never fills), and the kernel time by CUDA
events over the same burst. Python overhead = python - C call.

A second table gives the host time of the selection functions (index cache writer, paged indexer
logits, top-k with the slot transform) against their kernel time, same method.
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
    print(f"{'rows':>5} {'heads':>5} {'topk':>5} {'splits':>6} | {'python us':>9} {'torch fn us':>11} "
          f"{'torch op us':>11} {'C call us':>9} {'overhead us':>11} | {'kernel us':>9}")
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

        def fn_call():
            nvt.sparse_decode(q, cache, indices, None, 0.04, plan, ws, out, lse)

        plan_ints = plan.as_list()
        names = (plan.cache_dtype, plan.rope, plan.scale_mode, float(plan.layer_scale))

        def op_call():
            torch.ops.nvfp4mla.sparse_decode(q, cache, indices, None, 0.04, plan_ints, ws, out, lse, *names, False)

        for fn in (c_call, python_call, fn_call, op_call):  # warm-up
            fn()
        burst = args.burst if rows * heads <= 2048 else 20  # keep long kernels from filling the queue
        row = dict(rows=rows, heads=heads, topk=topk, splits=plan.splits,
                   python_us=host_us(python_call, burst, args.repeats), fn_us=host_us(fn_call, burst, args.repeats),
                   op_us=host_us(op_call, burst, args.repeats), c_call_us=host_us(c_call, burst, args.repeats),
                   kernel_us=kernel_us(c_call, burst, args.repeats))
        row["overhead_us"] = row["python_us"] - row["c_call_us"]
        results.append(row)
        print(f"{rows:>5} {heads:>5} {topk:>5} {plan.splits:>6} | {row['python_us']:>9.2f} {row['fn_us']:>11.2f} "
              f"{row['op_us']:>11.2f} {row['c_call_us']:>9.2f} {row['overhead_us']:>11.2f} | "
              f"{row['kernel_us']:>9.2f}")
    selection = selection_rows(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, results=results,
                           selection=selection), f, indent=2)


def selection_rows(args):
    """Host time per call of the selection functions against their kernel time (decode shapes:
    requests x next_n rows over a paged index cache)."""
    print(f"\n{'function':>22} {'rows':>5} {'context':>8} | {'python us':>9} | {'stream us':>9}")
    rows_out = []
    for requests, context in ((1, 4096), (64, 32768)):
        pages = context // 64
        g = torch.Generator(device="cpu").manual_seed(requests)
        cache = torch.zeros(requests * pages, 64 * nvfp4mla.INDEX_KEY_RECORD_BYTES, dtype=torch.uint8, device="cuda")
        keys = torch.randn(requests, 128, generator=g).cuda()
        slots = torch.arange(requests, device="cuda") * context
        count = torch.zeros(1, dtype=torch.int64, device="cuda")
        q = torch.randint(0, 0x70, (requests, 64, 128), generator=g, dtype=torch.uint8).cuda()
        w = torch.randn(requests, 64, generator=g).cuda()
        table = torch.arange(requests * pages, dtype=torch.int32, device="cuda").view(requests, pages)
        lens = torch.full((requests,), context, dtype=torch.int32, device="cuda")
        logits = torch.empty(requests, context, device="cuda")
        plan = nvfp4mla.plan_topk(requests, context)
        ws = torch.empty(max(plan.workspace_bytes, 16), dtype=torch.uint8, device="cuda")
        indices = torch.empty(requests, 2048, dtype=torch.int32, device="cuda")
        lengths = torch.empty(requests, dtype=torch.int32, device="cuda")
        calls = {
            "write_index_cache": lambda: nvfp4mla.write_index_cache(keys, cache, slots, invalid_count=count),
            "indexer_logits_paged": lambda: nvfp4mla.indexer_logits_paged(q, w, cache, table, lens, logits,
                                                                          invalid_count=count),
            "topk (slots)": lambda: nvfp4mla.topk(logits, None, 2048, plan=plan, workspace=ws, indices=indices,
                                                  topk_length=lengths, block_table=table, page_size=64,
                                                  capacity=cache.shape[0] * 64),
        }
        for name, fn in calls.items():
            fn()
            row = dict(function=name, rows=requests, context=context,
                       python_us=host_us(fn, 20, args.repeats), stream_us=kernel_us(fn, 20, args.repeats))
            rows_out.append(row)
            print(f"{name:>22} {requests:>5} {context:>8} | {row['python_us']:>9.2f} | {row['stream_us']:>9.2f}")
    return rows_out


if __name__ == "__main__":
    with torch.inference_mode():
        main()
