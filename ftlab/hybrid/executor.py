"""The hybrid decode schedule (eager mechanism)."""

from __future__ import annotations

import torch

from ftlab import ops
from ftlab.hybrid.residency import LruResidency
from ftlab.quant import Q4_0Weight


def _slot_bank(bank, slots: int, device: torch.device):
    """An empty bank of ``slots`` experts shaped like ``bank``'s experts, on ``device``."""
    if isinstance(bank, Q4_0Weight):
        data = torch.zeros((slots, *bank.data.shape[1:]), dtype=torch.uint8, device=device)
        return Q4_0Weight(data, (slots, *bank.shape[1:]))
    return torch.zeros((slots, *bank.shape[1:]), dtype=bank.dtype, device=device)


def _copy_expert(dst, slot: int, src, expert: int) -> None:
    if isinstance(dst, Q4_0Weight):
        dst.data[slot].copy_(src.data[expert], non_blocking=True)
    else:
        dst[slot].copy_(src[expert], non_blocking=True)


class HybridDecodeExecutor:
    """Routed experts with ``slots`` of them resident on ``device`` and the rest on the CPU.

    ``w_gate_up [E, 2I, H]`` and ``w_down [E, H, I]`` are the full banks on the host (dense or
    Q4_0). Each call: ``split`` maps the router ids through the live slot table into GPU ids
    (slot indices; -1 for CPU-routed and invalid slots) and CPU ids (expert ids; -1 for
    GPU-routed and invalid ones); the CPU kernels (``ftlab.cpu.moe``) and ``ops.moe_experts`` on
    the slot banks each skip the other's slots; ``y = y_gpu + y_cpu``. :meth:`end_step` updates
    the residency between steps and copies the loaded experts into their slots.
    ``path`` is the Q4_0 path of the GPU part (the CPU part takes the int8 path)."""

    mechanism = "eager"

    def __init__(self, w_gate_up, w_down, slots: int, device: torch.device | str, *, policy: LruResidency | None = None,
                 backend: str = "auto", path: str = "int8"):  # fmt: skip
        self.device = torch.device(device)
        self.host_gate_up, self.host_down = w_gate_up, w_down
        num_experts = w_gate_up.shape[0]
        self.policy = policy or LruResidency(num_experts, slots)
        if self.policy.slots != slots or self.policy.num_experts != num_experts:
            raise ValueError(f"policy must have {slots} slots over {num_experts} experts")
        self.slot_gate_up = _slot_bank(w_gate_up, max(slots, 1), self.device)
        self.slot_down = _slot_bank(w_down, max(slots, 1), self.device)
        self.table = self.policy.table(self.device)  # read live by every step (and by a replayed graph)
        self.backend, self.path = backend, path
        for slot, e in enumerate(self.policy.expert_in):  # a policy that arrives with residents
            if e >= 0:
                _copy_expert(self.slot_gate_up, slot, w_gate_up, e)
                _copy_expert(self.slot_down, slot, w_down, e)

    def split(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(GPU slot ids, CPU expert ids), both int32 ``[T, k]`` on ids' device."""
        ids = ids.to(torch.int32)
        valid = (ids >= 0) & (ids < self.table.numel())
        slot = torch.where(valid, self.table.to(ids.device)[ids.clamp(0, self.table.numel() - 1).long()], -1)
        gpu = torch.where(valid & (slot >= 0), slot, -1)
        cpu = torch.where(valid & (slot < 0), ids, -1)
        return gpu, cpu

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x ``[T, H]`` on the device, router weights fp32 / ids ``[T, k]`` -> ``[T, H]``."""
        from ftlab.cpu.moe import moe_experts as cpu_experts

        gpu_ids, cpu_ids = self.split(ids.to(self.device))
        y_cpu = cpu_experts(x.cpu(), self.host_gate_up, self.host_down, weights.cpu(), cpu_ids.cpu())
        y_gpu = ops.moe_experts(x, self.slot_gate_up, self.slot_down, weights, gpu_ids, path=self.path,
                                backend=self.backend)  # fmt: skip
        return y_gpu + y_cpu.to(self.device)

    def end_step(self, ids: torch.Tensor) -> list[tuple[int, int]]:
        """Between steps: update the residency with the step's ids, copy the loaded experts
        into their slots, refresh the slot table in place. Returns the loads."""
        loads = self.policy.update(ids.cpu())
        for e, s in loads:
            _copy_expert(self.slot_gate_up, s, self.host_gate_up, e)
            _copy_expert(self.slot_down, s, self.host_down, e)
        self.table.copy_(self.policy.table(self.device))
        return loads
