"""File formats: GGUF (through the ``gguf`` package) and safetensors."""
