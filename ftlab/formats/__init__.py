"""File formats: GGUF (through the ``gguf`` package) and safetensors.

:class:`CheckpointError` lives here, below every loader, so that the model package's loaders
and tokenizer can share it without importing each other.
"""


class CheckpointError(ValueError):
    """A checkpoint ftlab cannot load; the message names the file and the tensor or key."""
