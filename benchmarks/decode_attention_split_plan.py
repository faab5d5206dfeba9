"""hip's one-launch decode attention, graph-replayed, 32 / 4 heads of 128, bf16, over batches and
live / slot counts: the split plan with live splits capped by ``ftlab.hip.attention.tile_want``
(now) against one tile a split up to 64 splits (want = 64, the plan before), beside torch's SDPA
with the additive mask (the models' captured path before); max |diff| against the reference.

    python benchmarks/decode_attention_split_plan.py
"""

import torch
import torch.nn.functional as F

import ftlab.hip.attention as ha
from ftlab import ops
from ftlab.bench.harness import time_graph_us

dev = torch.device("cuda")
now = ha.tile_want


def row(b: int, s: int, live: int) -> str:
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(b, 32, 128, device=dev, generator=gen).bfloat16()
    k = torch.randn(b, s, 4, 128, device=dev, generator=gen).bfloat16()
    v = torch.randn(b, s, 4, 128, device=dev, generator=gen).bfloat16()
    lengths = torch.full((b,), live, device=dev, dtype=torch.int32)
    mask = (torch.arange(s, device=dev) < live)[None, None, None, :]
    bias = torch.zeros(mask.shape, dtype=q.dtype, device=dev).masked_fill_(~mask, float("-inf"))
    want = ops.decode_attention(q, k, v, lengths, backend="reference")
    sd = time_graph_us(
        lambda: F.scaled_dot_product_attention(
            q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias, enable_gqa=True
        )
    )
    res = {}
    for name, fn in (("before", lambda *args: ha.TILE_MAX_SPLITS), ("now", now)):
        ha.tile_want = fn
        got = ops.decode_attention(q, k, v, lengths, backend="hip")
        err = (got.float() - want.float()).abs().max().item()
        again = ops.decode_attention(q, k, v, lengths, backend="hip")
        us = time_graph_us(lambda: ops.decode_attention(q, k, v, lengths, backend="hip"))
        res[name] = (us, err, torch.equal(got, again))
    ha.tile_want = now
    return (
        f"{b} | {live} / {s} | {sd:.2f} | {res['before'][0]:.2f} | {res['now'][0]:.2f} "
        f"({now(b, 4, dev, 128)}) | "
        f"{res['before'][1]:.2g} / {res['now'][1]:.2g}{'' if res['now'][2] else ' NOT REPEATED'}"
    )


def main() -> None:
    props = torch.cuda.get_device_properties(dev)
    print(
        f"# {props.name}, {props.multi_processor_count} SMs; TILE_BLOCKS_PER_SM "
        f"{ha.TILE_BLOCKS_PER_SM}"
    )
    print(
        "batch | live / slots | SDPA us | hip before us | hip now us (want) | max diff before / now"
    )
    for b, s, live in [
        (1, 520, 513),
        (2, 520, 513),
        (4, 520, 513),
        (8, 520, 513),
        (16, 520, 513),
        (1, 4096, 4000),
        (8, 4096, 4000),
        (8, 640, 100),
        (8, 4096, 500),
        (1, 33000, 32000),
        (8, 33000, 1000),
    ]:
        print(row(b, s, live), flush=True)


if __name__ == "__main__":
    main()
