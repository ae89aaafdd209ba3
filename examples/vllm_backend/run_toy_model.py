"""A toy two-layer MLA model step through the nvfp4mla backend on the GPU, checked against a plain
torch reference (gather the records, dequantize them, attend with einsum in float64).

  PYTHONPATH=python python3 examples/vllm_backend/run_toy_model.py [--heads 16] [--requests 4]

Format from the vLLM variables (VLLM_NVFP4_MLA_DYNAMIC_SCALE, KV_FP8_ROPE,
VLLM_NVFP4_MLA_SCALES_FILE) or --rope/--scale-mode. Exits non-zero when a check fails.
"""
import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nvfp4mla  # noqa: E402
from backend import Nvfp4MlaBackend, Nvfp4MlaImpl, Nvfp4MlaMetadataBuilder  # noqa: E402

LAYERS = 2
D_MODEL = 1024


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--kv-gib", type=float, default=1.0, help="KV cache budget (plan_capacity)")
    p.add_argument("--rope", choices=("bf16", "fp8"))
    p.add_argument("--scale-mode", choices=("implicit", "dynamic"))
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class ToyModel:
    """Two MLA layers of random weights: kv = h W_kv (512 latent + 64 RoPE), q = h W_q (heads x 576),
    h += attention(q, cache) W_o."""

    def __init__(self, heads, device, gen):
        def weight(rows, cols):
            return (torch.randn(rows, cols, generator=gen) / rows ** 0.5).to(torch.bfloat16).to(device)
        self.heads = heads
        self.w_kv = [weight(D_MODEL, 576) * 4 for _ in range(LAYERS)]
        self.w_q = [weight(D_MODEL, heads * 576) for _ in range(LAYERS)]
        self.w_o = [weight(heads * 512, D_MODEL) for _ in range(LAYERS)]

    def project(self, layer, h):
        kv = h @ self.w_kv[layer]                       # [T, 576]: kv_c and k_pe as strided slices
        q = (h @ self.w_q[layer]).view(-1, self.heads, 576)
        return kv[:, :512], kv[:, 512:], q

    def mix(self, layer, h, attn):
        return h + attn.reshape(h.shape[0], -1).to(torch.bfloat16) @ self.w_o[layer]


def reference_attention(config, kv_cache, q, indices, topk_length, sm_scale, bf16_operands=False):
    """Plain torch: gather each row's records, dequantize (the library's CPU reader), einsum in fp64."""
    rows, heads, _ = q.shape
    flat = kv_cache.view(-1, config.record_bytes)
    out = torch.zeros(rows, heads, 512, dtype=torch.float64, device=q.device)
    for r in range(rows):
        slots = indices[r, :int(topk_length[r])].long()
        slots = slots[(slots >= 0) & (slots < flat.shape[0])]
        if slots.numel() == 0:
            continue
        records = nvfp4mla.gather_records(flat, slots)            # on the GPU
        kv_c, k_pe = nvfp4mla.decode(records.cpu().numpy(), config)  # CPU reader
        k = torch.cat([torch.from_numpy(kv_c), torch.from_numpy(k_pe)], 1).to(q.device)
        # Kernels with BF16 matrix operands see the dequantized K and V rounded to BF16.
        k = (k.to(torch.bfloat16) if bf16_operands else k).double()
        s = sm_scale * torch.einsum("hd,nd->hn", q[r].double(), k)
        out[r] = torch.einsum("hn,nd->hd", torch.softmax(s, dim=-1), k[:, :512])
    return out


def compare(name, got, want, failures, limit=5e-3):
    got, want = got.double(), want.double()
    rel = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    cos = 1 - torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    ok = rel <= limit
    print(f"  {name:<34} relative L2 error {rel:.2e}, cosine difference {cos:.2e} {'ok' if ok else 'FAIL'}")
    if not ok:
        failures.append(name)


def main():
    args = parse_args()
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(args.seed)
    config = nvfp4mla.FormatConfig.from_env(rope=args.rope, scale_mode=args.scale_mode)
    print(f"format: {config.describe()}; record ABI {config.record_abi()}")

    # KV cache: as many blocks as the budget holds (plan_capacity), at most what the toy needs.
    context = [min(300 + 1500 * i, 6000) for i in range(args.requests)]
    blocks_per_request = [(c + 3 + args.block_size - 1) // args.block_size for c in context]  # + decode + 2 MTP
    capacity = nvfp4mla.plan_capacity(config, layers=LAYERS, memory_gib=args.kv_gib, page_size=args.block_size)
    num_blocks = min(capacity.pages, sum(blocks_per_request) + 8)
    if num_blocks < sum(blocks_per_request):
        sys.exit(f"--kv-gib {args.kv_gib} holds {capacity.pages} blocks, the toy needs {sum(blocks_per_request)}")
    shape = Nvfp4MlaBackend.get_kv_cache_shape(num_blocks, args.block_size, config)
    kv_caches = [torch.zeros(shape, dtype=torch.uint8, device=device) for _ in range(LAYERS)]
    print(f"KV cache: {LAYERS} x {list(shape)} uint8 ({capacity.bytes_per_token} bytes/token over the layers "
          f"with the indexer keys)")

    # Block tables: each request's blocks, shuffled over the cache.
    order = torch.randperm(num_blocks, generator=gen)
    tables, start = [], 0
    for n in blocks_per_request:
        tables.append(order[start:start + n])
        start += n

    def slot(r, pos):
        return int(tables[r][pos // args.block_size]) * args.block_size + pos % args.block_size

    model = ToyModel(args.heads, device, gen)
    impls = [Nvfp4MlaImpl(config, layer, sm_scale=576 ** -0.5) for layer in range(LAYERS)]
    builder = Nvfp4MlaMetadataBuilder(config, args.heads, args.topk, max_num_seqs=args.requests,
                                      num_speculative_tokens=1, device=device)
    print(f"scratch: {builder.scratch.total_bytes} bytes for {builder.scratch.decode_rows} decode rows "
          f"x {builder.scratch.splits} splits")

    # The context ("prefill already ran"): random hidden states through the KV projections.
    for r, n in enumerate(context):
        h = (torch.randn(n, D_MODEL, generator=gen)).to(torch.bfloat16).to(device)
        slots = torch.tensor([slot(r, p) for p in range(n)], device=device)
        for layer in range(LAYERS):
            kv_c, k_pe, _ = model.project(layer, h)
            nvfp4mla.write_cache(kv_c, k_pe, kv_caches[layer], slots, impls[layer].config)

    def selection(rows_positions):
        """The toy indexer: per row, up to topk cached positions it may see, as slots (-1 padded)."""
        indices = torch.full((len(rows_positions), args.topk), -1, dtype=torch.int32)
        lengths = torch.zeros(len(rows_positions), dtype=torch.int32)
        for i, (r, visible) in enumerate(rows_positions):
            chosen = torch.randperm(visible, generator=gen)[:args.topk].sort().values
            indices[i, :chosen.numel()] = torch.tensor([slot(r, int(p)) for p in chosen], dtype=torch.int32)
            lengths[i] = chosen.numel()
        return indices.to(device), lengths.to(device)

    def run_step(title, h, positions, rows_positions, query_len):
        """One step of `query_len` tokens per request through both layers, kernel vs reference."""
        print(title)
        slot_mapping = torch.tensor([slot(r, p) for r, p in positions], device=device)
        indices, lengths = selection(rows_positions)
        meta = builder.build(slot_mapping, indices, lengths, query_len=query_len)
        print(f"  route: {meta.route} ({meta.route_reason})" + (f"; {meta.plan}" if meta.plan else ""))
        # The extend route runs the same kernel as the decode plan of its rows, with one split per row.
        plan = meta.plan or nvfp4mla.plan_decode(config, meta.num_rows, args.heads, args.topk)
        bf16_operands = plan.numerics()[0]
        h_ref = h.clone()
        for layer in range(LAYERS):
            kv_c, k_pe, q = model.project(layer, h)
            out, _ = impls[layer].forward(kv_c, k_pe, q, kv_caches[layer], meta)
            # The reference attends over the same cache with the same q (after the write).
            want = reference_attention(impls[layer].config, kv_caches[layer], q, indices, lengths, impls[layer].sm_scale,
                                       bf16_operands)
            compare(f"layer {layer} attention", out.float(), want, failures)
            h = model.mix(layer, h, out)
            # The reference model runs its own chain from its own outputs.
            _, _, q_ref = model.project(layer, h_ref)
            want_chain = reference_attention(impls[layer].config, kv_caches[layer], q_ref, indices, lengths,
                                             impls[layer].sm_scale, bf16_operands)
            h_ref = model.mix(layer, h_ref, want_chain.to(torch.bfloat16))
        torch.cuda.synchronize()
        compare("hidden state after both layers", h.float(), h_ref.float(), failures, limit=2e-2)
        return h

    failures = []
    n = args.requests
    h = torch.randn(n, D_MODEL, generator=gen).to(torch.bfloat16).to(device)
    # Decode: one new token per request at position context[r]; it sees context[r] + 1 positions.
    run_step("decode step", h, [(r, context[r]) for r in range(n)], [(r, context[r] + 1) for r in range(n)], 1)
    # MTP verification (k = 1): two tokens per request; token i sees context + 1 + i + 1 positions.
    causal, _ = nvfp4mla.verifier_rows([c + 1 for c in context], tokens_per_request=2, topk=args.topk)
    h2 = torch.randn(2 * n, D_MODEL, generator=gen).to(torch.bfloat16).to(device)
    positions = [(r, context[r] + 1 + i) for r in range(n) for i in range(2)]
    run_step("MTP verifier step (k = 1)", h2, positions, [(r, int(causal[2 * r + i])) for r in range(n)
                                                        for i in range(2)], 2)

    # Offload: the request's records under the record ABI's namespace, and back.
    with tempfile.TemporaryDirectory() as root:
        store = nvfp4mla.Store(root, config, tokens_per_block=args.block_size, layers_in_block=LAYERS,
                               model_identity="toy-mla@seed%d" % args.seed, durable=False)
        block_slots = torch.tensor([slot(0, p) for p in range(args.block_size)], device=device)
        block = torch.stack([nvfp4mla.gather_records(c, block_slots) for c in kv_caches]).cpu()
        store.put(b"request-0/block-0", block.numpy())
        back = store.get(b"request-0/block-0")
        ok = back is not None and bytes(back) == bytes(block.numpy())
        print(f"offload: namespace {Nvfp4MlaBackend.offload_namespace(config)} -> {store.dir}: "
              f"{'round trip ok' if ok else 'FAIL'}")
        if not ok:
            failures.append("offload round trip")
        store.close()

    if failures:
        sys.exit("FAILED: " + ", ".join(failures))
    print("all checks passed")


if __name__ == "__main__":
    main()
