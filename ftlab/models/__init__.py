"""Models built from ftlab ops: Qwen3-MoE."""
