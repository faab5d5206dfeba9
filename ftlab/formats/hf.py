"""A HF checkpoint directory: its ``config.json`` and the safetensors shards of its tensors.

Which shards: with ``model.safetensors.index.json``, only those its ``weight_map`` names, and
each tensor must be in the shard the index says (a stale extra shard in the folder is not
read); without an index, every ``*.safetensors``. Either way a tensor found in two shards is
refused instead of one copy silently winning. Shards are memory-mapped through safetensors'
``safe_open`` and tensors read lazily, a slice of rows or columns reading only its bytes. Every
refusal is a :class:`~ftlab.formats.CheckpointError` naming the file and the key or tensor: an
index or config that is not JSON of the expected form, a missing or unreadable shard, a missing,
misshapen or non-float tensor, a stored dtype ftlab does not know.

What a model's loader checks of what it reads (its config's values, the layers and experts
stored) is the model's: :mod:`ftlab.models.qwen3_moe.hf`, :mod:`ftlab.models.qwen3_next.hf`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from ftlab.formats import CheckpointError

INDEX = "model.safetensors.index.json"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _read_json(file: Path) -> object:
    try:
        return json.loads(file.read_bytes())
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise CheckpointError(f"{file}: not valid JSON: {e}") from e


def _weight_map(index_file: Path) -> dict[str, str]:
    """``tensor -> shard file name`` of an index, each shard a plain file name."""
    index = _read_json(index_file)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(
            f"{index_file}: 'weight_map' must be a non-empty object "
            f"{{tensor: shard file}}, got {weight_map!r:.80}"
        )
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or shard in ("", ".", "..") or Path(shard).name != shard:
            raise CheckpointError(
                f"{index_file}: weight_map['{tensor}'] must be a file name in "
                f"the directory, got {shard!r}"
            )
    return weight_map


class SafetensorsShards:
    """Name -> tensor over a directory's safetensors shards (module docstring: which shards),
    read lazily."""

    def __init__(self, path: Path):
        self.path = path
        index_file = path / INDEX
        weight_map = _weight_map(index_file) if index_file.is_file() else None
        if weight_map is not None:
            names = sorted(set(weight_map.values()))
        else:
            names = sorted(f.name for f in path.glob("*.safetensors"))
            if not names:
                raise CheckpointError(f"{path}: no *.safetensors files")
        self.handles = {}
        for name in names:
            file = path / name
            if not file.is_file():
                raise CheckpointError(f"{index_file}: shard '{name}' is missing")
            try:
                self.handles[name] = safe_open(str(file), framework="pt", device="cpu")
            except Exception as e:  # SafetensorError on a truncated or corrupt header
                raise CheckpointError(f"{file}: not a readable safetensors file: {e}") from e
        self.where: dict[str, str] = {}  # tensor -> shard name
        for name, handle in self.handles.items():
            for tensor in handle.keys():
                if tensor in self.where:
                    raise CheckpointError(
                        f"{path}: tensor '{tensor}' is in two shards, "
                        f"{self.where[tensor]} and {name}"
                    )
                self.where[tensor] = name
        if weight_map is not None:
            self._check_index(index_file, weight_map)

    def _check_index(self, index_file: Path, weight_map: dict[str, str]) -> None:
        """The index and the shards agree, tensor by tensor."""
        for tensor, shard in weight_map.items():
            if self.where.get(tensor) != shard:
                found = (
                    f"it is in {self.where[tensor]}" if tensor in self.where else "no shard has it"
                )
                raise CheckpointError(
                    f"{index_file}: tensor '{tensor}' is mapped to {shard}, which "
                    f"does not hold it ({found})"
                )
        for tensor, shard in self.where.items():
            if tensor not in weight_map:
                raise CheckpointError(
                    f"{index_file}: tensor '{tensor}' of {shard} is not in "
                    f"'weight_map' (a stale index or shard?)"
                )

    def read(
        self,
        name: str,
        rows: tuple[int, int] | None = None,
        columns: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, tuple[int, ...], Path]:
        """Tensor ``name`` as stored (its dtype, on the host), its stored shape and its file.
        ``rows``: ``(start, stop)`` -- only those rows along dim 0 (``[stop - start, ...]``; fewer
        when the tensor has fewer: check the stored shape), a safetensors slice that reads only
        their bytes, copied into memory of its own (a slice may be a view of the memory-mapped
        file, which it then does not keep). ``columns``: ``(start, stop)`` -- only those columns of
        a 2-D tensor (``[:, start:stop]``), likewise. CheckpointError naming the file for a tensor
        missing or unreadable."""
        shard = self.where.get(name)
        if shard is None:
            raise CheckpointError(f"{self.path}: missing tensor {name!r}")
        file = self.path / shard
        try:
            if rows is None and columns is None:
                t = self.handles[shard].get_tensor(name)
                return t, tuple(t.shape), file
            part = self.handles[shard].get_slice(name)
            got = part[rows[0] : rows[1]] if columns is None else part[:, columns[0] : columns[1]]
            return got.clone(), tuple(part.get_shape()), file
        except Exception as e:  # SafetensorError
            raise CheckpointError(f"{file}: tensor {name!r} cannot be read: {e}") from e

    def get(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        rows: tuple[int, int] | None = None,
        columns: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """Tensor ``name``, checked to be a float tensor of ``shape``, in ``dtype`` on
        ``device``; ``rows``: ``(start, stop)``, only those rows read (:meth:`read`), ``[stop -
        start, *shape[1:]]``; ``columns`` likewise, ``[shape[0], stop - start]``."""
        t, stored, file = self.read(name, rows, columns)
        if not t.dtype.is_floating_point:
            raise CheckpointError(
                f"{file}: tensor {name!r} has dtype {t.dtype}, expected a floating-point dtype"
            )
        if stored != tuple(shape):
            raise CheckpointError(
                f"{file}: tensor {name!r} has shape {stored}, expected {tuple(shape)}"
            )
        return t.to(device=device, dtype=dtype)


def read_hf_config(path: Path) -> dict:
    """The dict of ``path/config.json`` (CheckpointError when absent, not JSON or not an object)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{path}: no config.json")
    hf = _read_json(config_file)
    if not isinstance(hf, dict):
        raise CheckpointError(f"{config_file}: must hold a JSON object, got {type(hf).__name__}")
    return hf


def stored_dtype(hf: dict, config_file: Path) -> torch.dtype:
    """The dtype a config names (``torch_dtype`` or ``dtype``; bf16 when it names none)."""
    key = "torch_dtype" if hf.get("torch_dtype") is not None else "dtype"
    stored = "bfloat16" if hf.get(key) is None else hf[key]
    if not isinstance(stored, str) or stored not in DTYPES:
        raise CheckpointError(
            f"{config_file}: {key} must be one of {sorted(DTYPES)} (or pass dtype=), got {stored!r}"
        )
    return DTYPES[stored]
