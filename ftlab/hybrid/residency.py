"""The residency policies of the hybrid executor: which experts occupy the GPU's expert slots --
least recently used out (:class:`LruResidency`), or a fixed set (:class:`StaticResidency`) -- and
:func:`cpu_layers`, the layers a placement by layers puts on the CPU for the same share."""

from __future__ import annotations

from collections import OrderedDict

import torch


class LruResidency:
    """``slots`` GPU expert slots over ``num_experts`` experts, least recently used out.

    :meth:`update` takes a step's routed ids (between steps, never inside a captured region),
    counts each distinct valid expert as a hit (resident when the step ran) or a miss, and
    makes the step's experts the most recently used, loading missed ones into free slots or
    the slots of the least recently used experts. It returns the loads ``[(expert, slot)]``
    the caller must copy into the slot banks before the next step. When a step routes to
    more experts than there are slots, the most recently seen ones (in flat order) win."""

    def __init__(self, num_experts: int, slots: int):
        if not isinstance(num_experts, int) or num_experts < 1:
            raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
        if not isinstance(slots, int) or not 0 <= slots <= num_experts:
            raise ValueError(f"slots must be an int in [0, {num_experts}], got {slots!r}")
        self.num_experts, self.slots = num_experts, slots
        self.slot_of = [-1] * num_experts  # expert -> slot or -1
        self.expert_in = [-1] * slots  # slot -> expert or -1
        self._recent: OrderedDict[int, None] = OrderedDict()  # resident experts, least recent first
        self.hits = 0
        self.misses = 0

    def resident(self) -> set[int]:
        return set(self._recent)

    def table(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """int32 ``[E]``: the slot of each expert, -1 where it is not resident."""
        return torch.tensor(self.slot_of, dtype=torch.int32, device=device)

    def update(self, ids: torch.Tensor) -> list[tuple[int, int]]:
        seen: list[int] = []
        for e in ids.reshape(-1).tolist():
            if 0 <= e < self.num_experts and e not in seen:
                seen.append(e)
        for e in seen:
            if self.slot_of[e] >= 0:
                self.hits += 1
            else:
                self.misses += 1
        window = seen[-self.slots :] if self.slots else []
        for e in window:  # the step's resident experts first become the most recent,
            if self.slot_of[e] >= 0:  # so that no miss of the step evicts one of them
                self._recent.move_to_end(e)
        loads = []
        for e in window:
            if self.slot_of[e] >= 0:
                continue
            if len(self._recent) < self.slots:
                slot = self.expert_in.index(-1)
            else:
                old, _ = self._recent.popitem(last=False)
                slot = self.slot_of[old]
                self.slot_of[old] = -1
            self.slot_of[e], self.expert_in[slot] = slot, e
            self._recent[e] = None
            loads.append((e, slot))
        return loads


class StaticResidency(LruResidency):
    """``slots`` GPU expert slots that hold one fixed set of experts for good: ``experts`` (distinct
    ids in [0, num_experts), as many as ``slots``; default the first ``slots``), in slot order.
    Nothing moves between steps -- no host-to-device copies, the split of every step set by where
    its experts live, as llama.cpp's ``--n-cpu-moe`` keeps some layers' experts on the CPU for
    good. :meth:`update` counts a step's distinct valid experts as hits (resident) or misses and
    returns no loads."""

    def __init__(self, num_experts: int, slots: int, experts: list[int] | None = None):
        super().__init__(num_experts, slots)
        chosen = list(range(slots)) if experts is None else experts
        if not isinstance(chosen, (list, tuple)) or not all(
            isinstance(e, int) and not isinstance(e, bool) for e in chosen
        ):
            raise TypeError(f"experts must be a list or tuple of ints, got {experts!r}")
        if (
            len(chosen) != slots
            or len(set(chosen)) != slots
            or not all(0 <= e < num_experts for e in chosen)
        ):
            raise ValueError(
                f"experts must be {slots} distinct ids in [0, {num_experts}), got {experts!r}"
            )
        for slot, e in enumerate(chosen):
            self.slot_of[e], self.expert_in[slot] = slot, e
            self._recent[e] = None

    def update(self, ids: torch.Tensor) -> list[tuple[int, int]]:
        for e in {int(e) for e in ids.reshape(-1).tolist() if 0 <= e < self.num_experts}:
            if self.slot_of[e] >= 0:
                self.hits += 1
            else:
                self.misses += 1
        return []


def cpu_layers(layers: int, num_experts: int, slots: int) -> int:
    """The layers whose experts all run on the CPU, in a placement by layers (llama.cpp's
    ``--n-cpu-moe``), for the same share of the expert bytes on the CPU as ``slots`` of every
    layer's ``num_experts`` on the GPU: ``layers * (num_experts - slots) / num_experts``, rounded
    half up (24 of 48 layers for 64 of 128 experts)."""
    for name, value in (("layers", layers), ("num_experts", num_experts), ("slots", slots)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if layers < 0 or num_experts < 1:
        raise ValueError(
            f"layers must be >= 0 and num_experts >= 1, got {layers} and {num_experts}"
        )
    if not 0 <= slots <= num_experts:
        raise ValueError(f"slots must be an int in [0, {num_experts}], got {slots!r}")
    return (2 * layers * (num_experts - slots) + num_experts) // (2 * num_experts)
