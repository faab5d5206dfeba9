"""The tensor-parallel process group a rank runs in: joined or started from torchrun's
environment (``"nccl"`` on GPUs -- RCCL on ROCm under the same name -- gloo on the CPU), checked
(its size, every rank on the same kind of device, no two on one GPU), the collectives a sharded
model calls (:class:`TensorParallel`), and its teardown. How the weights are cut across the
ranks is :mod:`ftlab.models.tensor_parallel`, which re-exports these names.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch

__all__ = ["TensorParallel", "close", "process_group"]


@dataclass(frozen=True)
class TensorParallel:
    """One rank's place in a tensor-parallel group: ``rank`` of ``world`` in ``group`` (a
    ``torch.distributed`` process group; None is the default group)."""

    rank: int
    world: int
    group: object = None

    def check_divides(self, **counts: int) -> None:
        """ValueError naming the first count (a model's heads, say) that ``world`` does not
        divide."""
        for name, total in counts.items():
            self.shard(total, name)

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
        """Every rank's ``x [..., n]`` concatenated along the last dim, rank order: ``[..., N n]``.
        One ``all_gather_into_tensor`` into a single buffer (the form NCCL graph capture takes; no
        list of per-rank tensors), then the rank axis moved next to ``n``."""
        import torch.distributed as dist

        x = x.contiguous()
        # the ranks' parts stacked along dim 0 (the layout gloo requires; NCCL takes any of that
        # size)
        out = torch.empty((self.world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x, group=self.group)
        return (
            out.view(self.world, *x.shape)
            .movedim(0, -2)
            .reshape(*x.shape[:-1], self.world * x.shape[-1])
        )

    def kv_heads(self, kv: int, heads: int) -> tuple[int, int]:
        """``(start, stop)`` of this rank's key/value heads of ``kv`` for its share of ``heads``
        query heads: an equal part when ``world`` divides ``kv``; when ``world`` is a multiple of
        ``kv``, the one kv head that its query heads read (replicated on ``world / kv`` ranks).
        ValueError otherwise."""
        if kv % self.world == 0:
            return self.shard(kv, "num_key_value_heads")
        self.shard(heads, "num_attention_heads")
        if self.world % kv:
            raise ValueError(
                f"tp = {self.world} must divide num_key_value_heads ({kv}) or be a multiple of it"
            )
        j = self.rank // (self.world // kv)
        return j, j + 1

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
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # NCCL's communicator uses the current device
    if not dist.is_initialized():
        missing = [
            k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
        ]
        if missing:
            raise RuntimeError(
                f"tp = {tp} needs a process group: start the processes with torchrun "
                f"(--nproc-per-node {tp}), or call torch.distributed.init_process_group "
                f"first (the environment lacks {', '.join(missing)})"
            )
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://")
        try:
            return _checked(tp, device)
        except BaseException:
            dist.destroy_process_group()  # started here: not left running after a refusal
            raise
    return _checked(tp, device)


def _checked(tp: int, device: torch.device) -> TensorParallel:
    """This rank's TensorParallel once the group's size and the ranks' devices are checked."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    if world != tp:
        raise ValueError(f"tp = {tp} must equal the process group's world size ({world})")
    seen: list = [None] * world  # (device kind, host, GPU index) of every rank
    dist.all_gather_object(seen, (device.type, socket.gethostname(), device.index))
    kinds = {s[0] for s in seen}
    if len(kinds) > 1:
        raise ValueError(
            "every rank must run on the same kind of device (all CPU or all GPU); got "
            f"{[s[0] for s in seen]}"
        )
    gpus = [(s[1], s[2]) for s in seen]
    if kinds == {"cuda"} and len(set(gpus)) < world:
        raise ValueError(
            f"two ranks share a GPU ((host, device) {gpus}): give each rank its own, e.g. "
            "device=f'cuda:{LOCAL_RANK}'"
        )
    return TensorParallel(rank, world)


def close(wait: bool = True) -> None:
    """Tear the default process group down (a process that exits with a gloo group still up may
    abort in its teardown), after every rank has arrived when ``wait`` (not on an error path,
    where the other ranks may never arrive)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()
