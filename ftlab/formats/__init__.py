"""File formats: GGUF (through the ``gguf`` package: :mod:`ftlab.formats.gguf`,
:mod:`ftlab.formats.gguf_write`; the structure checked first: :mod:`ftlab.formats.gguf_structure`)
and HF directories (``config.json`` and safetensors shards: :mod:`ftlab.formats.hf`) -- what reads
and writes them whatever model they hold.

:class:`CheckpointError` and :class:`DequantizedWarning` live here, below every loader, so that
the model families' loaders and the tokenizer can share them without importing each other.
"""


class CheckpointError(ValueError):
    """A checkpoint ftlab cannot load; the message names the file and the tensor or key."""


class DequantizedWarning(UserWarning):
    """Some tensors of a GGUF file have a type with no ftlab kernel and were loaded dequantized
    (dense, in the model's dtype: more memory, and the dense matmul instead of the quantized
    one)."""
