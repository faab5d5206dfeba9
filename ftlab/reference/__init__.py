"""Pure-PyTorch references: the specification every kernel is tested against."""
