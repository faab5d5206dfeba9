"""Quantized tensor types: GGUF Q4_0 weights and Q8_1 activations (docs/OPS.md section 2).

Q4_0 block (GGUF / llama.cpp ``block_q4_0``): 18 bytes for 32 weights -- ``d`` fp16
(2 bytes) then ``qs[16]``; byte j holds element j in its low nibble and element j+16 in its
high nibble; ``x = d * (q - 8)``. A ``[N, K]`` matrix is ``[N, K/32*18]`` uint8, rows of
consecutive blocks: exactly the GGUF on-disk layout, so tensors load zero-copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QK = 32  # weights per block
Q4_0_BLOCK_BYTES = 18


def q4_0_row_bytes(k: int) -> int:
    return k // QK * Q4_0_BLOCK_BYTES


class Q4_0Weight:
    """Packed GGUF Q4_0 blocks plus the logical shape.

    ``data``: uint8 ``[..., N, K/32*18]`` on any device (CPU, CUDA, ROCm), rows contiguous.
    ``shape``: the logical ``(..., N, K)``; a leading dim makes an expert bank
    (``[E, N, K]``).
    """

    def __init__(self, data: torch.Tensor, shape: tuple[int, ...] | torch.Size):
        shape = tuple(int(s) for s in shape)
        if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
            got = data.dtype if isinstance(data, torch.Tensor) else type(data).__name__
            raise TypeError(f"data must be a uint8 tensor of Q4_0 blocks, got {got}")
        if len(shape) < 2:
            raise ValueError(f"shape must be (..., N, K), got {shape}")
        if shape[-1] % QK:
            raise ValueError(
                f"K (the last dim of shape) must be a multiple of {QK}, got {shape[-1]}"
            )
        expected = (*shape[:-1], q4_0_row_bytes(shape[-1]))
        if tuple(data.shape) != expected:
            raise ValueError(
                f"data must have shape {expected} for logical shape {shape}, got {tuple(data.shape)}"
            )
        if not data.is_contiguous():
            raise ValueError("data must be contiguous (rows of consecutive blocks)")
        self.data = data
        self.shape = torch.Size(shape)

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        """Bytes of packed blocks (what a matvec must read)."""
        return self.data.numel()

    @property
    def blocks(self) -> torch.Tensor:
        """``[..., N, K/32, 18]`` view of the blocks."""
        return self.data.view(*self.shape[:-1], self.shape[-1] // QK, Q4_0_BLOCK_BYTES)

    def scales(self) -> torch.Tensor:
        """``d`` of every block as fp16, ``[..., N, K/32]``."""
        return self.blocks[..., :2].contiguous().view(torch.float16).squeeze(-1)

    def to(self, device: torch.device | str) -> Q4_0Weight:
        return Q4_0Weight(self.data.to(device), self.shape)

    def __getitem__(self, index: int) -> Q4_0Weight:
        """One expert of a bank: ``bank[e]`` is ``[N, K]``."""
        if len(self.shape) < 3:
            raise IndexError("only an expert bank ([E, N, K]) can be indexed")
        return Q4_0Weight(self.data[index], self.shape[1:])

    def __repr__(self) -> str:
        dims = "x".join(str(s) for s in self.shape)
        return f"Q4_0Weight({dims}, {self.nbytes / 2**20:.2f} MiB, device={self.device})"


@dataclass
class Q8_1:
    """Q8_1 activations, per 32-block: ``q`` int8 ``[M, K]``, ``d`` fp32 ``[M, K/32]``
    (``amax / 127``) and ``s`` fp32 ``[M, K/32]`` (``d * sum(q)``), so that an int8 dot
    with Q4_0 weights reproduces the dot of the dequantized vectors."""

    q: torch.Tensor
    d: torch.Tensor
    s: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        m, k = self.q.shape
        return (self.q.view(m, k // QK, QK).float() * self.d[..., None]).view(m, k)
