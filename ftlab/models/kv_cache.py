"""The static KV cache of the Qwen models' attention layers and attention over it.

The cache is slot-indexed: sequence b's position p lives in slot ``b * max_seq_len + p`` of every
attention layer's ``[slots, kv_heads * head_dim]`` buffer, so a decode step has fixed shapes and
addresses (what a captured graph needs). A forward pass computes the geometry of its positions once
(:meth:`KVCache.geometry`: RoPE tables, the slots written and read, the causal mask) and every
layer attends through :meth:`KVCache.attend`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ftlab import backends as ftbackends
from ftlab import ops
from ftlab import platform as ftplatform
from ftlab.backends import calls
from ftlab.models.decode_plan import DecodePlan
from ftlab.models.layers import rope_tables
from ftlab.quant import Q8_1

__all__ = ["KVCache", "hip_attention"]


def hip_attention(
    plan: DecodePlan, name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, geo: dict
) -> str:
    """The backend a decode step's attention takes: ``name`` when named; under "auto" "hip" on a
    GPU where ``plan.hip_attention`` holds now and the planner gives the call hip's one-launch
    kernel ("tiles"), else "auto" (SDPA). ``q [B, H, D]``, ``k, v [B, S, KVH, D]``. Once a
    forward pass (kept in ``geo``)."""
    if name != "auto" or q.device.type != "cuda":
        return name
    if "attention_backend" not in geo:
        chosen = "auto"
        if plan.now("hip_attention", q.device):
            try:
                got = ftbackends.plan("decode_attention", calls.attention(q, k, v))
                chosen = "hip" if (got.backend, got.variant) == ("hip", "tiles") else "auto"
            except ftbackends.BackendUnavailable:
                chosen = "auto"
        geo["attention_backend"] = chosen
    return geo["attention_backend"]


class KVCache:
    """The static KV cache of ``layers`` attention layers (module docstring): ``k[j]``, ``v[j]``
    ``[max_batch * max_seq_len, kv_width]``. ``static``: no host synchronization in a forward
    pass (attention reads all max_seq_len slots under a mask, index checks off)."""

    def __init__(
        self,
        layers: int,
        kv_width: int,
        max_batch: int,
        max_seq_len: int,
        static: bool,
        device: torch.device,
        dtype: torch.dtype,
    ):
        slots = max_batch * max_seq_len
        self.k = [torch.zeros(slots, kv_width, device=device, dtype=dtype) for _ in range(layers)]
        self.v = [torch.zeros(slots, kv_width, device=device, dtype=dtype) for _ in range(layers)]
        self.max_batch, self.max_seq_len, self.static = max_batch, max_seq_len, static
        self._views: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        # update_geometry's rope tables and aranges, made once
        self._tables: dict[tuple, object] = {}

    def views(self, j: int, b: int, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``j``'s static cache as ``[b, max_seq_len, kv_heads, hd]`` views of the first ``b``
        sequences (made once per (layer, batch): a decode step asks for them every layer)."""
        key = (j, b, kv_heads)
        got = self._views.get(key)
        if got is None:
            shape = (self.max_batch, self.max_seq_len, kv_heads, -1)
            got = self._views[key] = (self.k[j].view(shape)[:b], self.v[j].view(shape)[:b])
        return got

    def slots(self, batch: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Cache slots of (sequence, position) pairs: ``b * max_seq_len + p``."""
        return batch * self.max_seq_len + positions

    def geometry(
        self, positions: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype
    ) -> dict:
        """What every attention layer needs of ``positions [B, T]``, computed once a forward
        pass: rope tables (``rotary_dim`` wide), the cache slots written, the slots read, the
        causal mask (boolean; :meth:`attend` makes its additive form once when captured, in this
        dict: one forward pass's, not to be reused across captures), the positions, and for one
        token a sequence (decode) each sequence's live positions (``lengths``, int32 ``[B]``).
        ``fresh``: whether the pass is a prompt's start (every sequence at positions ``0 .. T-1``,
        T > 1, not inside a graph capture; one host read of the positions to tell): its attention
        is over its own keys only, causal, not over the cache."""
        b, t = positions.shape
        dev = positions.device
        cos, sin = rope_tables(positions, rotary_dim, theta, dtype)
        seq = torch.arange(b, device=dev)[:, None].expand(b, t)
        capturing = ftplatform.capturing(dev)
        # a prompt's start (one host read of the positions to tell) attends over its own keys:
        # no slot read back, no mask (attend)
        fresh = t > 1 and not capturing and bool((positions == torch.arange(t, device=dev)).all())
        # read back every position up to the last one written, for every sequence: of a static
        # cache every slot (no host read of the positions), but for a prompt's tokens outside a
        # capture (the live positions only)
        whole = self.static and (t == 1 or capturing)
        span = t if fresh else self.max_seq_len if whole else int(positions.max()) + 1
        geo = {
            "cos": cos,
            "sin": sin,
            "write": self.slots(seq, positions).reshape(-1),
            "span": span,
            "whole": whole,
            "fresh": fresh,
            "positions": positions,
            "rope": (rotary_dim, theta),
        }
        if not fresh:
            read = self.slots(
                torch.arange(b, device=dev)[:, None], torch.arange(span, device=dev)[None, :]
            )
            # [B, T, S]
            visible = torch.arange(span, device=dev)[None, None, :] <= positions[:, :, None]
            geo["read"], geo["mask"] = read.reshape(-1), visible[:, None]
        if t == 1:  # a decode step: each sequence's live positions, for ops.decode_attention
            geo["lengths"] = (positions[:, -1] + 1).to(torch.int32)
        return geo

    def update_geometry(self, geo: dict, positions: torch.Tensor, keys: list[str]) -> None:
        """Rewrite the entries ``keys`` of ``geo``, a static cache's :meth:`geometry` of a decode
        step (``[B, 1]`` positions), in place for new ``positions [B, 1]``: the values
        ``geometry(positions)`` gives, bit for bit, in a launch or two each (the rope rows gathered
        from tables of every position, made at the first call), for positions in ``[0,
        max_seq_len)``; one outside (which no caller checked on the device) gets the rope row of the
        nearest position instead of a failed gather. What
        :class:`ftlab.models.decode_steps.DecodeLaunches` runs before each step."""
        if not self.static or positions.shape != geo["positions"].shape or positions.shape[1] != 1:
            raise ValueError(
                "update_geometry takes a static cache's decode geometry and positions of its "
                f"shape {tuple(geo['positions'].shape)}, got {tuple(positions.shape)}"
            )
        flat = positions.reshape(-1)
        rows = None
        for key in keys:
            if key in ("cos", "sin"):
                table = self._rope_table(key, geo["rope"], geo[key].dtype, positions.device)
                # a position past the tables gathers the last row, never outside them
                if rows is None:
                    rows = flat.clamp(0, self.max_seq_len - 1)
                torch.index_select(table, 0, rows, out=geo[key].view(-1, *table.shape[1:]))
            elif key == "write":  # slot b * max_seq_len + p
                torch.add(
                    self._arange(flat.numel(), flat.device, self.max_seq_len), flat, out=geo[key]
                )
            elif key == "lengths":
                geo[key].copy_(flat + 1)
            elif key == "mask":
                torch.le(
                    self._arange(geo["span"], flat.device),
                    positions[:, :, None],
                    out=geo[key][:, 0],
                )
            elif key == "positions":
                geo[key].copy_(positions)
            elif key != "read":  # every slot of each sequence: the same for any positions
                raise ValueError(f"update_geometry cannot rewrite geometry entry {key!r}")

    def _rope_table(
        self, key: str, rope: tuple[int, float], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """``rope_tables``' cos or sin of every position ``[max_seq_len, 1, rotary_dim]``, made
        once."""
        if (rope, dtype) not in self._tables:
            every = torch.arange(self.max_seq_len, device=device)[None]
            cos, sin = rope_tables(every, rope[0], rope[1], dtype)
            self._tables[(rope, dtype)] = {"cos": cos[0], "sin": sin[0]}
        return self._tables[(rope, dtype)][key]

    def _arange(self, n: int, device: torch.device, step: int = 1) -> torch.Tensor:
        """``arange(n) * step`` (int64), made once."""
        if (n, step) not in self._tables:
            self._tables[(n, step)] = torch.arange(n, device=device) * step
        return self._tables[(n, step)]

    def attend(
        self,
        j: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        geo: dict,
        plan: DecodePlan,
        stored: bool = False,
        quantize: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, Q8_1 | None]:
        """Write ``k, v [B, T, kv_heads, hd]`` into layer ``j``'s cache at ``geo``'s slots (not when
        ``stored``: the caller's ``ops.qk_norm_rope`` wrote them), then attend ``q [B, T, heads,
        hd]`` (GQA, causal under ``geo``'s mask) over the cached positions -- a prompt's start
        (``geo["fresh"]``) over its own keys, causal, nothing read back; returns ``[B, T, heads,
        hd]``. Through torch's SDPA under the mask, except one token a sequence (decode) when
        ``plan.backends["decode_attention"]`` names a backend, or is "auto" on a GPU where
        :func:`hip_attention` picks hip's one-launch kernel: then ``ops.decode_attention`` over the
        live positions only. ``quantize``: returns ``(out, out_q8)``, ``out_q8`` the Q8_1 of ``out``
        viewed ``[B * T, heads * hd]`` where the op path made it
        (``ops.decode_attention(quantize=True)``), else None (SDPA's path makes none)."""
        b, t, kvh, hd = k.shape
        backends = plan.backends
        if not stored:
            ops.store(
                self.k[j],
                self.v[j],
                geo["write"],
                k.reshape(b * t, -1),
                v.reshape(b * t, -1),
                check=False,
                backend=backends["store"],
            )
        if geo["fresh"]:  # a prompt's start: its own keys, causal (flash kernels where there)
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                is_causal=True,
                enable_gqa=True,
            )
            out = out.transpose(1, 2)
            return (out, None) if quantize else out
        span = geo["span"]
        if geo["whole"]:  # every slot of each sequence, in order: the cache itself, no copy
            keys, vals = self.views(j, b, kvh)
        else:
            keys = ops.index(self.k[j], geo["read"], check=False, backend=backends["index"])
            vals = ops.index(self.v[j], geo["read"], check=False, backend=backends["index"])
            keys, vals = keys.view(b, span, kvh, hd), vals.view(b, span, kvh, hd)
        if t == 1:  # a decode step through the op, when named (or plan.hip_attention)
            q1 = q.view(b, -1, hd)
            op = hip_attention(plan, backends["decode_attention"], q1, keys, vals, geo)
            if op != "auto":
                res = ops.decode_attention(
                    q1,
                    keys,
                    vals,
                    geo["lengths"],
                    backend=op,
                    quantize=quantize,
                    validate=plan.checks,
                )
                if quantize:
                    return res[0].view(b, 1, -1, hd), res[1]
                return res.view(b, 1, -1, hd)
        keys = keys.reshape(b, span, kvh, hd).transpose(1, 2)  # [B, kvh, S, hd]
        vals = vals.reshape(b, span, kvh, hd).transpose(1, 2)
        mask = geo["mask"]
        if ftplatform.capturing(q.device):
            # replayed from a graph: SDPA given the additive mask takes cuDNN's kernel, the fastest
            # on the device (faster than the boolean mask, which SDPA turns into an additive one in
            # every layer); launched eagerly, cuDNN's host cost a call
            # outweighs that, so the boolean mask stays (benchmarks/NOTES.md, "Router, mask"). The
            # two paths are different kernels: in fp16 / bf16 a replayed step and an eager one
            # differ in the last bits of the attention (fp32 takes the math kernel both ways).
            if "bias" not in geo:  # once a captured forward pass (geo is one forward pass's)
                geo["bias"] = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(
                    ~mask, float("-inf")
                )
            mask = geo["bias"]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, vals, attn_mask=mask, enable_gqa=True
        )
        out = out.transpose(1, 2)  # [B, T, heads, hd]
        return (out, None) if quantize else out
