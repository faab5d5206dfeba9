"""Quantized tensor types: GGUF block-quantized weights (:class:`QuantWeight`; Q4_0 as
:class:`Q4_0Weight`) and Q8_1 activations (docs/OPS.md sections 2 and 7).

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


@dataclass(frozen=True)
class QuantType:
    """A GGUF block-quantized type: ``block`` weights in ``nbytes`` bytes (llama.cpp's
    ``ggml_type_traits``), its blocks laid along the last dimension of a row."""

    name: str
    block: int
    nbytes: int

    def row_bytes(self, k: int) -> int:
        return k // self.block * self.nbytes


#: The packed types ftlab reads and computes on (docs/OPS.md sections 2 and 7).
QTYPES: dict[str, QuantType] = {
    t.name: t
    for t in (
        QuantType("Q4_0", QK, Q4_0_BLOCK_BYTES),
        QuantType("Q8_0", 32, 34),  # fp16 d, then 32 int8: x = d * q
        # fp16 d, dmin; 12 bytes of 6-bit scales / mins; 128 of nibbles
        QuantType("Q4_K", 256, 144),
        QuantType("Q5_K", 256, 176),  # as Q4_K, plus 32 bytes of fifth bits before the nibbles
        # 128 of low nibbles, 64 of high 2 bits, 16 int8 scales, fp16 d
        QuantType("Q6_K", 256, 210),
    )
}


class QuantWeight:
    """Packed GGUF blocks of one :data:`QTYPES` type plus the logical shape: exactly the GGUF
    layout, so tensors load zero-copy and write back byte for byte.

    ``data``: uint8 ``[..., N, K/block*nbytes]`` on any device, rows contiguous; ``shape``: the
    logical ``(..., N, K)`` (a leading dim makes an expert bank ``[E, N, K]``); ``qtype``: the
    type's name. Q4_0 weights are :class:`Q4_0Weight` (what the Q4_0 kernels take):
    :func:`quant_weight` picks the class."""

    def __init__(self, data: torch.Tensor, shape: tuple[int, ...] | torch.Size, qtype: str):
        if qtype not in QTYPES:
            raise ValueError(f"qtype must be one of {sorted(QTYPES)}, got {qtype!r}")
        if qtype == "Q4_0" and not isinstance(self, Q4_0Weight):
            raise TypeError("Q4_0 weights are Q4_0Weight (or quant_weight(data, shape, 'Q4_0'))")
        qt = QTYPES[qtype]
        shape = tuple(int(s) for s in shape)
        if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
            got = data.dtype if isinstance(data, torch.Tensor) else type(data).__name__
            raise TypeError(f"data must be a uint8 tensor of {qtype} blocks, got {got}")
        if len(shape) < 2 or min(shape) < 0:
            raise ValueError(f"shape must be (..., N, K), got {shape}")
        if shape[-1] % qt.block:
            raise ValueError(
                f"K (the last dim of shape) must be a multiple of {qt.block} for {qtype}, got "
                f"{shape[-1]}"
            )
        expected = (*shape[:-1], qt.row_bytes(shape[-1]))
        if tuple(data.shape) != expected:
            raise ValueError(
                f"data must have shape {expected} for logical shape {shape}, got "
                f"{tuple(data.shape)}"
            )
        if not data.is_contiguous():
            raise ValueError("data must be contiguous (rows of consecutive blocks)")
        self.data, self.shape, self.qtype = data, torch.Size(shape), qtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        """Bytes of packed blocks (what a matvec must read)."""
        return self.data.numel()

    @property
    def blocks(self) -> torch.Tensor:
        """``[..., N, K/block, nbytes]`` view of the blocks."""
        qt = QTYPES[self.qtype]
        return self.data.view(*self.shape[:-1], self.shape[-1] // qt.block, qt.nbytes)

    def to(self, device: torch.device | str) -> QuantWeight:
        return quant_weight(self.data.to(device), self.shape, self.qtype)

    def __getitem__(self, index: int) -> QuantWeight:
        """One expert of a bank: ``bank[e]`` is ``[N, K]``."""
        if len(self.shape) < 3:
            raise IndexError("only an expert bank ([E, N, K]) can be indexed")
        return quant_weight(self.data[index], self.shape[1:], self.qtype)

    def __repr__(self) -> str:
        dims = "x".join(str(s) for s in self.shape)
        size = f"{self.nbytes / 2**20:.2f} MiB"
        return f"{type(self).__name__}({self.qtype}, {dims}, {size}, device={self.device})"


class Q4_0Weight(QuantWeight):
    """Packed GGUF Q4_0 blocks plus the logical shape (see :class:`QuantWeight`)."""

    def __init__(self, data: torch.Tensor, shape: tuple[int, ...] | torch.Size):
        super().__init__(data, shape, "Q4_0")

    def scales(self) -> torch.Tensor:
        """``d`` of every block as fp16, ``[..., N, K/32]``."""
        return self.blocks[..., :2].contiguous().view(torch.float16).squeeze(-1)

    def __repr__(self) -> str:
        dims = "x".join(str(s) for s in self.shape)
        return f"Q4_0Weight({dims}, {self.nbytes / 2**20:.2f} MiB, device={self.device})"


def quant_weight(
    data: torch.Tensor, shape: tuple[int, ...] | torch.Size, qtype: str
) -> QuantWeight:
    """A :class:`QuantWeight` of ``qtype`` (a :class:`Q4_0Weight` for Q4_0)."""
    return Q4_0Weight(data, shape) if qtype == "Q4_0" else QuantWeight(data, shape, qtype)


@dataclass
class Q8_1:
    """Q8_1 activations, per 32-block: ``q`` int8 ``[M, K]``, ``d`` fp32 ``[M, K/32]``
    (``amax / 127``) and ``s`` fp32 ``[M, K/32]`` (``d * sum(q)``), so that an int8 dot
    with Q4_0 weights reproduces the dot of the dequantized vectors."""

    q: torch.Tensor
    d: torch.Tensor
    s: torch.Tensor

    @classmethod
    def empty(cls, m: int, k: int, device: torch.device | str) -> Q8_1:
        """Uninitialized buffers of ``m`` rows of ``k`` values (a kernel's output)."""
        f32 = dict(dtype=torch.float32, device=device)
        return cls(
            torch.empty((m, k), dtype=torch.int8, device=device),
            torch.empty((m, k // QK), **f32),
            torch.empty((m, k // QK), **f32),
        )

    def dequantize(self) -> torch.Tensor:
        m, k = self.q.shape
        return (self.q.view(m, k // QK, QK).float() * self.d[..., None]).view(m, k)
