"""A decode step's kernels one by one at the Qwen3-30B-A3B shape (batch 1, bf16, Q4_0 weights),
graph-replayed, each beside the time its bytes take at the copy bandwidth of the same run.

Every captured call takes the next of ``--copies`` weight sets (more bytes than the L2 holds, as
48 layers are in a real step), so weights come from DRAM, not from the previous call's L2 lines.

    python benchmarks/time_decode_kernels.py [--copies 16] [--only
    qkv,o_proj,experts,router,input,post,...]
    python benchmarks/time_decode_kernels.py --eager 3    # a few eager calls of each, for ncu
    python benchmarks/time_decode_kernels.py --eager 3 --only "experts at batch 8"  # one case
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ftlab import backends, ops
from ftlab.bench.harness import copy_bandwidth, time_graph_us
from ftlab.quant import Q4_0Weight

H, INTER, E, K_TOP, HEADS, KV_HEADS, D = 2048, 768, 128, 8, 32, 4, 128


def random_q4_0(*shape: int, device: torch.device) -> Q4_0Weight:
    """Random Q4_0 blocks with finite scales of a realistic size (~0.01)."""
    *lead, n, k = shape
    blocks = torch.randint(0, 256, (*lead, n, k // 32, 18), dtype=torch.uint8, device=device)
    d = (torch.rand(*lead, n, k // 32, device=device) * 0.02 + 0.001).half().view(torch.uint8)
    blocks[..., :2] = d.view(*lead, n, k // 32, 2)
    return Q4_0Weight(blocks.view(*lead, n, k // 32 * 18), (*lead, n, k))


def cycle(items):
    it = itertools.cycle(items)
    return lambda: next(it)


def cases(copies: int, dev: torch.device):
    """(name, bytes a call reads, {backend: fn}) for each kernel of a layer's decode step."""
    gen = torch.Generator(device=dev).manual_seed(0)
    x2k = torch.randn(1, H, device=dev, generator=gen).bfloat16()
    x4k = torch.randn(1, HEADS * D, device=dev, generator=gen).bfloat16()
    names = [
        b
        for b in ("hip", "triton")
        if b in backends.available_backends("q4_0_matmul", dev, torch.bfloat16)
    ]

    def matvec(n: int, k: int, x: torch.Tensor):
        ws = [random_q4_0(n, k, device=dev) for _ in range(copies)]
        nxt = cycle(ws)
        fns = {b: (lambda b=b: ops.q4_0_matmul(x, nxt(), backend=b)) for b in names}
        if "hip" in names:  # x's Q8_1 made before (free to the matvec), or just before
            x8 = ops.quantize_q8_1(x, backend="hip")
            fns["hip, x's Q8_1 given"] = lambda: ops.q4_0_matmul(x, nxt(), backend="hip", x_q8=x8)
            fns["hip quantize_q8_1, then the matvec given it"] = lambda: ops.q4_0_matmul(
                x, nxt(), backend="hip", x_q8=ops.quantize_q8_1(x, backend="hip")
            )
        return n * k // 32 * 18, fns

    yield ("qkv 2048 -> 5120", *matvec((HEADS + 2 * KV_HEADS) * D, H, x2k))
    yield ("o_proj 4096 -> 2048", *matvec(H, HEADS * D, x4k))

    # the decode fusions: each against the two ops it replaces, one backend each
    res = torch.randn(1, H, device=dev, generator=gen).bfloat16()
    nw = torch.ones(H, device=dev).bfloat16()
    wq = [random_q4_0((HEADS + 2 * KV_HEADS) * D, H, device=dev) for _ in range(copies)]
    nq = cycle(wq)
    fns = {}
    for b in names:
        fns[f"{b}: add_rmsnorm, then q4_0_matmul"] = lambda b=b: ops.q4_0_matmul(
            ops.add_rmsnorm(x2k, res, nw, 1e-6, backend=b)[0], nq(), backend=b
        )
        fns[f"{b}: add_rmsnorm_q4_0_matmul"] = lambda b=b: ops.add_rmsnorm_q4_0_matmul(
            x2k, res, nw, 1e-6, nq(), backend=b
        )
    yield (
        "input norm + qkv 2048 -> 5120",
        (HEADS + 2 * KV_HEADS) * D * H // 32 * 18 + 3 * H * 2,
        fns,
    )
    rw = [torch.randn(E, H, device=dev, generator=gen).bfloat16() for _ in range(copies)]
    nrw = cycle(rw)
    fns = {}
    for b in ("hip", "triton"):
        if b in backends.available_backends("add_rmsnorm_router_topk", dev, torch.bfloat16):
            fns[f"{b}: add_rmsnorm, then router_topk"] = lambda b=b: ops.router_topk(
                ops.add_rmsnorm(x2k, res, nw, 1e-6, backend=b)[0], nrw(), K_TOP, backend=b
            )
            fns[f"{b}: add_rmsnorm_router_topk"] = lambda b=b: ops.add_rmsnorm_router_topk(
                x2k, res, nw, 1e-6, nrw(), K_TOP, backend=b
            )
    yield ("post-attention norm + router", E * H * 2 + 3 * H * 2, fns)
    qkv = torch.randn(1, (HEADS + 2 * KV_HEADS) * D, device=dev, generator=gen).bfloat16()
    qh, kh = (
        qkv[:, : HEADS * D].view(1, HEADS, D),
        qkv[:, HEADS * D : (HEADS + KV_HEADS) * D].view(1, KV_HEADS, D),
    )
    vh = qkv[:, (HEADS + KV_HEADS) * D :]
    hw = torch.ones(D, device=dev).bfloat16()
    cs = torch.randn(1, D, device=dev, generator=gen).bfloat16()
    kcache = torch.zeros(520, KV_HEADS * D, device=dev).bfloat16()
    vcache = torch.zeros(520, KV_HEADS * D, device=dev).bfloat16()
    slot = torch.tensor([512], device=dev)
    fns = {}
    for b in ("hip", "triton"):
        if b in backends.available_backends("qk_norm_rope", dev, torch.bfloat16):
            fns[f"{b}: qk_norm_rope, then store"] = lambda b=b: ops.store(
                kcache,
                vcache,
                slot,
                ops.qk_norm_rope(qh, kh, hw, hw, cs, cs, 1e-6, backend=b)[1].reshape(1, -1),
                vh,
                check=False,
                backend=b,
            )
            fns[f"{b}: qk_norm_rope writing the cache"] = lambda b=b: ops.qk_norm_rope(
                qh,
                kh,
                hw,
                hw,
                cs,
                cs,
                1e-6,
                k_cache=kcache,
                v_cache=vcache,
                slots=slot,
                v=vh,
                backend=b,
            )
    yield ("qk_norm_rope + KV store", 2 * (HEADS + 2 * KV_HEADS) * D * 2, fns)

    gu = random_q4_0(E, 2 * INTER, H, device=dev)
    dn = random_q4_0(E, H, INTER, device=dev)
    picks = [torch.randperm(E, device=dev, generator=gen)[:K_TOP].int()[None] for _ in range(64)]
    wts = torch.softmax(torch.randn(1, K_TOP, device=dev, generator=gen), -1)
    nxt = cycle(picks)
    fns = {
        b: (lambda b=b: ops.moe_experts(x2k, gu, dn, wts, nxt(), backend=b))
        for b in ("hip", "triton")
        if b in backends.available_backends("moe_experts", dev, torch.bfloat16)
    }
    yield ("experts (gate/up + down, 8 of 128)", 3 * K_TOP * INTER * H // 32 * 18, fns)

    # batch 8: eight tokens, each its own 8 of 128 (experts shared between tokens read once in the
    # bytes)
    x8 = torch.randn(8, H, device=dev, generator=gen).bfloat16()
    picks8 = [
        torch.stack([torch.randperm(E, device=dev, generator=gen)[:K_TOP] for _ in range(8)]).int()
        for _ in range(64)
    ]
    wts8 = torch.softmax(torch.randn(8, K_TOP, device=dev, generator=gen), -1)
    unique = sum(int(p.unique().numel()) for p in picks8) / len(picks8)
    nxt8 = cycle(picks8)
    fns = {
        b: (lambda b=b: ops.moe_experts(x8, gu, dn, wts8, nxt8(), backend=b))
        for b in ("hip", "triton")
        if b in backends.available_backends("moe_experts", dev, torch.bfloat16)
    }
    yield (
        f"experts at batch 8 ({unique:.1f} distinct experts of 128)",
        int(unique * 3 * INTER * H // 32 * 18),
        fns,
    )

    routers = [torch.randn(E, H, device=dev, generator=gen).bfloat16() for _ in range(copies)]
    nr = cycle(routers)
    fns = {"torch linear": lambda: F.linear(x2k, nr())}
    for b in ("hip", "triton"):
        if b in backends.available_backends("route_topk", dev, torch.float32):
            fns[f"torch linear + route_topk {b}"] = lambda b=b: ops.route_topk(
                F.linear(x2k, nr()).float(), K_TOP, backend=b
            )
    for b in ("hip", "triton"):
        if b in backends.available_backends("router_topk", dev, torch.bfloat16):
            fns[f"router_topk {b}"] = lambda b=b: ops.router_topk(x2k, nr(), K_TOP, backend=b)
    yield ("router 2048 -> 128 + top-8", E * H * 2, fns)

    s, live = 520, 513
    q = torch.randn(1, HEADS, D, device=dev, generator=gen).bfloat16()
    kc = torch.randn(1, s, KV_HEADS, D, device=dev, generator=gen).bfloat16()
    vc = torch.randn(1, s, KV_HEADS, D, device=dev, generator=gen).bfloat16()
    lengths = torch.full((1,), live, device=dev, dtype=torch.int32)
    mask = (torch.arange(s, device=dev) < live)[None, None, None, :]
    fmask = torch.zeros(mask.shape, dtype=q.dtype, device=dev).masked_fill_(~mask, float("-inf"))

    def sdpa(m, kind=None):
        def call():
            if kind is None:
                return F.scaled_dot_product_attention(
                    q[:, :, None],
                    kc.transpose(1, 2),
                    vc.transpose(1, 2),
                    attn_mask=m,
                    enable_gqa=True,
                )
            with sdpa_kernel([kind]):
                return F.scaled_dot_product_attention(
                    q[:, :, None],
                    kc.transpose(1, 2),
                    vc.transpose(1, 2),
                    attn_mask=m,
                    enable_gqa=True,
                )

        return call

    fns = {
        "torch SDPA, every slot, boolean mask": sdpa(mask),
        "torch SDPA, every slot, additive mask": sdpa(fmask),
    }
    for kind in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
        fns[f"torch SDPA, additive mask, {kind.name.lower()} only"] = sdpa(fmask, kind)
    for b in ("hip", "triton"):
        if b in backends.available_backends("decode_attention", dev, torch.bfloat16):
            fns[f"decode_attention {b}"] = lambda b=b: ops.decode_attention(
                q, kc, vc, lengths, backend=b
            )
    yield (f"attention, {live} live of {s} slots", 2 * live * KV_HEADS * D * 2, fns)

    fns = {
        b: (lambda b=b: ops.add_rmsnorm(x2k, res, nw, 1e-6, backend=b))
        for b in ("hip", "triton")
        if b in backends.available_backends("add_rmsnorm", dev, torch.bfloat16)
    }
    yield ("add_rmsnorm 2048", 3 * H * 2, fns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--copies", type=int, default=16, help="weight sets cycled through (default 16)"
    )
    ap.add_argument("--only", default="", help="comma-separated name prefixes of the cases to run")
    ap.add_argument(
        "--eager", type=int, default=0, help="run each case N times eagerly instead (for ncu)"
    )
    args = ap.parse_args()
    dev = torch.device("cuda")
    only = [o for o in args.only.split(",") if o]
    bw = 0.0 if args.eager else copy_bandwidth()
    if bw:
        print(f"copy bandwidth {bw:.0f} GB/s (read + write)")
    for name, nbytes, fns in cases(args.copies, dev):
        if only and not any(name.startswith(o) for o in only):
            continue
        print(
            f"{name}: {nbytes / 1e6:.2f} MB, {nbytes / bw * 1e-3:.2f} us at the copy bandwidth"
            if bw
            else name
        )
        for label, fn in fns.items():
            if args.eager:
                for _ in range(args.eager):
                    fn()
                torch.cuda.synchronize()
                continue
            try:
                us = time_graph_us(fn, inner=16)
            except RuntimeError as e:  # an SDPA backend that cannot take these shapes (GQA, mask)
                print(f"  {'-':>8}     {'-':>7}       {label}: {str(e).splitlines()[0]}")
                continue
            print(f"  {us:8.2f} us  {nbytes / us / 1e3:7.1f} GB/s  {label}")


if __name__ == "__main__":
    main()
