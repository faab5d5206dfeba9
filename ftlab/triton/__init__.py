"""Triton kernels: one source for NVIDIA, AMD and the CPU interpreter (TRITON_INTERPRET=1)."""
