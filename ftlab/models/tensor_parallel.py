"""Tensor and expert parallelism over ``torch.distributed`` (NCCL on NVIDIA, RCCL on ROCm under
the same ``"nccl"`` name, gloo on the CPU).

How a Qwen3-MoE layer is cut across ``N`` ranks (rank ``r``)::

    embedding  [V, H]          rows r V/N .. (r+1) V/N; ops.index with the row-range mask
                               (other ranks' tokens read zeros), then all-reduce (sum)
    q/k/v      [heads hd, H]   column-parallel: rank r holds heads r heads/N .. (its kv heads
                               likewise), so q-k norm, RoPE, the KV cache and attention are local
    o_proj     [H, heads hd]   row-parallel: the columns of its heads; partial sums all-reduced
    router     [E, H]          replicated (every rank routes every token the same way)
    experts    [E, 2I, H] ...  expert-parallel: rank r holds experts r E/N .. (r+1) E/N and
                               computes every token's contributions from them (ids of other
                               ranks' experts fall outside its bank and add nothing), then one
                               all-reduce (sum)
    lm_head    [V, H]          vocab-parallel: the rows of its vocabulary shard; the logits
                               all-gathered along the vocabulary

Expert parallelism by all-reduce rather than all-to-all: after attention every rank holds every
token's hidden state anyway (the o_proj all-reduce), so each rank runs its experts on all tokens
and one all-reduce of ``[T, H]`` combines them. At decode (T <= 8) that is one latency-bound
collective a layer and no token exchange; an all-to-all dispatch would need two collectives and
a host-known split per step. Each rank's device holds only its shard: the weights are read on
the host, sliced, and only the slices are moved to the device (the loaders read whole tensors
from the file, so each rank's host memory briefly holds the full model).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

import torch

from ftlab.quant import QTYPES, QuantWeight, quant_weight


@dataclass(frozen=True)
class TensorParallel:
    """One rank's place in a tensor-parallel group: ``rank`` of ``world`` in ``group`` (a
    ``torch.distributed`` process group; None is the default group)."""

    rank: int
    world: int
    group: object = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the ranks (in place; gloo reduces bf16 / fp16 through fp32)."""
        import torch.distributed as dist

        if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16):
            y = x.float()
            dist.all_reduce(y, group=self.group)
            x.copy_(y)
        else:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x [..., n]`` concatenated along the last dim, rank order: ``[..., N n]``."""
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def shard(self, total: int, what: str) -> tuple[int, int]:
        """``(start, stop)`` of this rank's equal part of ``total`` (ValueError naming ``what``
        when ``world`` does not divide it)."""
        if total % self.world:
            raise ValueError(f"tp = {self.world} must divide {what} ({total})")
        part = total // self.world
        return self.rank * part, (self.rank + 1) * part


def process_group(tp: int, device: torch.device) -> TensorParallel | None:
    """The tensor-parallel group of ``tp`` ranks this process belongs to (None for tp = 1).

    Uses the default process group if one is initialized, else initializes it from the
    environment ``torchrun`` sets (``env://``: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) with
    ``"nccl"`` on a GPU (RCCL on ROCm) and ``"gloo"`` on the CPU. Errors: tp not an int >= 1,
    no process group and no torchrun environment, a world size other than tp, ranks on
    different device types or two ranks on one GPU."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be an int >= 1, got {tp!r}")
    if tp == 1:
        return None
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("tp > 1 needs torch.distributed, which this torch build lacks")
    if not dist.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RuntimeError(f"tp = {tp} needs a process group: start the processes with torchrun "
                               f"(--nproc-per-node {tp}), or call torch.distributed.init_process_group "
                               f"first (the environment lacks {', '.join(missing)})")  # fmt: skip
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != tp:
        raise ValueError(f"tp = {tp} must equal the process group's world size ({world})")
    here = torch.tensor([0 if device.type == "cpu" else 1, device.index if device.index is not None else -1])
    seen = [torch.zeros_like(here) for _ in range(world)]
    dist.all_gather(seen, here.to(_collective_device(device)))
    kinds = {int(s[0]) for s in seen}
    if len(kinds) > 1:
        raise ValueError("every rank must run on the same kind of device (all CPU or all GPU); got "
                         f"{['cpu' if int(s[0]) == 0 else 'gpu' for s in seen]}")  # fmt: skip
    gpus = [int(s[1]) for s in seen]
    if kinds == {1} and len(set(gpus)) < world:
        raise ValueError(f"two ranks share a GPU (devices {gpus}): give each rank its own, e.g. "
                         "device=f'cuda:{LOCAL_RANK}'")  # fmt: skip
    return TensorParallel(rank, world)


def close() -> None:
    """Wait for every rank, then tear the default process group down (a process that exits with
    a gloo group still up may abort in its teardown)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _collective_device(device: torch.device) -> torch.device:
    """Where the backend's collectives take tensors: the GPU for nccl, the CPU for gloo."""
    import torch.distributed as dist

    return device if dist.get_backend() == "nccl" else torch.device("cpu")


def rows(w, start: int, stop: int):
    """Rows ``start .. stop`` of a ``[N, K]`` weight (dense or packed), copied: the full
    tensor is not kept alive by the slice."""
    if isinstance(w, QuantWeight):
        return quant_weight(w.data[start:stop].clone(), (stop - start, *w.shape[1:]), w.qtype)
    return w[start:stop].clone()


def columns(w, start: int, stop: int, what: str):
    """Columns ``start .. stop`` of a ``[N, K]`` weight, copied; a packed weight is cut between
    its blocks (ValueError naming ``what`` when the cut falls inside one)."""
    if isinstance(w, QuantWeight):
        block = QTYPES[w.qtype].block
        if start % block or stop % block:
            raise ValueError(f"{what}: a {w.qtype} weight is cut between blocks of {block}; columns "
                             f"{start}..{stop} are not (pick a tp that keeps each rank's share a multiple of {block})")  # fmt: skip
        part = w.blocks[:, start // block : stop // block].reshape(w.shape[0], -1).clone()
        return quant_weight(part, (w.shape[0], stop - start), w.qtype)
    return w[:, start:stop].clone()


def experts(bank, start: int, stop: int):
    """Experts ``start .. stop`` of a bank ``[E, ...]`` (dense or packed), copied."""
    if isinstance(bank, QuantWeight):
        return quant_weight(bank.data[start:stop].clone(), (stop - start, *bank.shape[1:]), bank.qtype)
    return bank[start:stop].clone()


def move(obj, device: torch.device):
    """A dataclass of weights (or a list of them) with every tensor and packed weight moved."""
    if isinstance(obj, list):
        return [move(o, device) for o in obj]
    if isinstance(obj, torch.Tensor | QuantWeight):
        return obj.to(device)
    if hasattr(obj, "__dataclass_fields__"):
        return replace(obj, **{f.name: move(getattr(obj, f.name), device) for f in fields(obj)})
    return obj


def shard_qwen3_moe(config, weights, tp: TensorParallel, device: torch.device):
    """This rank's shard of a Qwen3-MoE model's weights (module docstring), on ``device``.
    ValueError when tp does not divide the heads, the kv heads, the experts or the vocabulary."""
    from ftlab.models.qwen3_moe import LayerWeights, ModelWeights

    c = config
    hd = c.head_dim
    q0, q1 = tp.shard(c.num_attention_heads, "num_attention_heads")
    k0, k1 = tp.shard(c.num_key_value_heads, "num_key_value_heads")
    e0, e1 = tp.shard(c.num_experts, "num_experts")
    v0, v1 = tp.shard(c.vocab_size, "vocab_size")
    layers = []
    for i, lw in enumerate(weights.layers):
        layers.append(move(LayerWeights(
            q_proj=rows(lw.q_proj, q0 * hd, q1 * hd), k_proj=rows(lw.k_proj, k0 * hd, k1 * hd),
            v_proj=rows(lw.v_proj, k0 * hd, k1 * hd), o_proj=columns(lw.o_proj, q0 * hd, q1 * hd, f"layer {i} o_proj"),
            q_norm=lw.q_norm, k_norm=lw.k_norm, input_norm=lw.input_norm,
            post_attention_norm=lw.post_attention_norm, router=lw.router,
            w_gate_up=experts(lw.w_gate_up, e0, e1), w_down=experts(lw.w_down, e0, e1)), device))  # fmt: skip
    embed = rows(weights.embed, v0, v1)
    lm_head = embed if weights.lm_head is weights.embed else rows(weights.lm_head, v0, v1)
    embed_d = embed.to(device)
    return ModelWeights(embed=embed_d, layers=layers, norm=weights.norm.to(device),
                        lm_head=embed_d if lm_head is embed else move(lm_head, device))  # fmt: skip
