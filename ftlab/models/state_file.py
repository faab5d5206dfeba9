"""A pipeline's decoding state in a file: :func:`save_state` writes what the pipeline holds after
its tokens (the token ids, every attention layer's KV cache slots, every linear-attention layer's
conv and delta state, the next-token logits), :func:`load_state` reads it back into a pipeline of
the same model, which then continues the sequence or resumes a prompt that begins with it.

The file is safetensors (tensors ``tokens``, ``logits``, ``k.J``, ``v.J``, ``recurrent.I``; CPU
copies) with metadata naming what the state belongs to: the format (:data:`FORMAT`), the model
class, its config, the dtype, the weights' formats (quant types and dtypes) and a fingerprint of
the weights' bytes, and a SHA-256 of the tensors. A file of another model, config, dtype or
weights format is refused naming the mismatch; a truncated or altered file is an error, never a
state. Every check runs before anything of the pipeline is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

__all__ = [
    "FORMAT",
    "load_state",
    "save_state",
    "weight_leaves",
    "weights_fingerprint",
    "weights_format",
]

#: the format of a state file this version writes and reads
FORMAT = "ftlab.state/1"


def weight_leaves(obj, name: str = "") -> list[tuple[str, object]]:
    """(name, tensor or packed weight) of every weight under a weights dataclass, in field order."""
    if isinstance(obj, torch.Tensor) or hasattr(obj, "qtype"):
        return [(name, obj)]
    if dataclasses.is_dataclass(obj):
        out = []
        for f in dataclasses.fields(obj):
            out += weight_leaves(getattr(obj, f.name), f"{name}.{f.name}" if name else f.name)
        return out
    if isinstance(obj, (list, tuple)):
        return [leaf for i, x in enumerate(obj) for leaf in weight_leaves(x, f"{name}.{i}")]
    return []


def _kind(w) -> str:
    return str(getattr(w, "qtype", None) or w.dtype).replace("torch.", "")


def weights_format(weights) -> str:
    """The kinds of weights a model reads, e.g. ``"Q4_0, Q8_0, float32"``: quant types and dense
    dtypes, sorted."""
    return ", ".join(sorted({_kind(w) for _, w in weight_leaves(weights)}))


def weights_fingerprint(weights) -> str:
    """SHA-256 (hex) of the first bytes (up to 256) of every weight, in field order: a different
    model's weights differ there (one device-to-host copy)."""
    parts = []
    for _, w in weight_leaves(weights):
        t = w.data if hasattr(w, "qtype") else w
        flat = t.detach().reshape(-1)[:64].contiguous()
        parts.append(flat.view(torch.uint8).reshape(-1)[:256])
    return hashlib.sha256(torch.cat(parts).cpu().numpy().tobytes()).hexdigest()


def _config(config) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(tensors):
        t = tensors[key].contiguous()
        h.update(key.encode())
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _identity(pipe) -> dict[str, str]:
    return {
        "model_class": pipe.model_class.__name__,
        "config": json.dumps(_config(pipe.config), sort_keys=True),
        "dtype": str(pipe.weights.embed.dtype).replace("torch.", ""),
        "weights_format": weights_format(pipe.weights),
        "weights_fingerprint": weights_fingerprint(pipe.weights),
    }


def save_state(pipe, path: str | Path) -> Path:
    """Write ``pipe``'s decoding state after its tokens (:attr:`Pipeline.tokens`, at least one:
    after a prefill, and any decode steps) to ``path`` (module docstring), atomically: a failed
    write leaves no file behind. Returns the path."""
    if pipe.tp is not None:
        raise ValueError("save_state: a tensor-parallel pipeline's state is sharded; not saved yet")
    tokens = pipe.tokens
    if not tokens or pipe._logits is None:
        raise ValueError(
            "save_state: the pipeline holds no sequence with its next-token logits "
            "(call prefill first)"
        )
    p, model = len(tokens), pipe.model
    tensors = {
        "tokens": torch.tensor(tokens, dtype=torch.int64),
        "logits": pipe._logits.detach().float().cpu().contiguous(),
    }
    for j, (k, v) in enumerate(zip(model.cache.k, model.cache.v, strict=True)):
        tensors[f"k.{j}"] = k[:p].cpu().contiguous()
        tensors[f"v.{j}"] = v[:p].cpu().contiguous()
    for i, t in enumerate(model.recurrent_state()):
        tensors[f"recurrent.{i}"] = t[:1].cpu().contiguous()
    meta = {"format": FORMAT, **_identity(pipe), "digest": _digest(tensors)}
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _mismatch(path: Path, what: str, got: object, want: object) -> ValueError:
    return ValueError(
        f"{path}: this state is of another {what}: the file's is {got}, this pipeline's {want}"
    )


def _config_diff(theirs: str | None, ours: str) -> tuple[str, object, object] | None:
    """The first config field (by name) whose value differs, or None (or a file's config that is
    not a JSON object)."""
    try:
        a, b = json.loads(theirs or ""), json.loads(ours)
    except ValueError:
        return None
    if not isinstance(a, dict):
        return None
    diff = sorted(k for k in {*a, *b} if a.get(k) != b.get(k))
    return (diff[0], a.get(diff[0]), b.get(diff[0])) if diff else None


def _check_identity(path: Path, meta: dict[str, str], pipe) -> None:
    mine = _identity(pipe)
    for key, what in (("model_class", "model class"), ("config", "config")):
        if meta.get(key) != mine[key]:
            diff = _config_diff(meta.get(key), mine[key]) if key == "config" else None
            if diff:
                k, theirs, ours = diff
                raise _mismatch(path, f"config ({k})", theirs, ours)
            raise _mismatch(path, what, meta.get(key), mine[key])
    for key, what in (
        ("dtype", "dtype"),
        ("weights_format", "weights format"),
        ("weights_fingerprint", "model (its weights differ)"),
    ):
        if meta.get(key) != mine[key]:
            raise _mismatch(path, what, meta.get(key), mine[key])


def _read(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    if not path.is_file():
        raise FileNotFoundError(f"path must be a state file written by save_state, got {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors' own error types: a header or data cut short, or not one
        raise ValueError(
            f"{path} is not a whole state file (truncated or not safetensors): {e}"
        ) from e
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: format must be {FORMAT!r}, got {meta.get('format')!r}")
    return meta, tensors


def _expected(pipe, p: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    model = pipe.model
    want = {
        "tokens": ((p,), torch.int64),
        "logits": ((pipe.config.vocab_size,), torch.float32),
    }
    for j, (k, v) in enumerate(zip(model.cache.k, model.cache.v, strict=True)):
        want[f"k.{j}"] = ((p, k.shape[1]), k.dtype)
        want[f"v.{j}"] = ((p, v.shape[1]), v.dtype)
    for i, t in enumerate(model.recurrent_state()):
        want[f"recurrent.{i}"] = ((1, *t.shape[1:]), t.dtype)
    return want


def load_state(pipe, path: str | Path) -> int:
    """Read a state :func:`save_state` wrote into ``pipe`` (same model, config, dtype and weights
    format; module docstring): its live sequence becomes the file's tokens, whose snapshot also
    enters the prefix cache. Returns the position (the tokens held). Every check runs first: a
    refused file leaves the pipeline as it was."""
    path = Path(path)
    if pipe.tp is not None:
        raise ValueError("load_state: a tensor-parallel pipeline's state is sharded; not read yet")
    meta, tensors = _read(path)
    _check_identity(path, meta, pipe)
    tokens = tensors.get("tokens")
    if tokens is None or tokens.dim() != 1:
        raise ValueError(f"{path}: tokens must be a 1-d tensor, got {tokens!r:.60}")
    p = tokens.numel()
    if not 1 <= p <= pipe.max_seq_len:
        raise ValueError(
            f"{path}: the state's position must be in [1, {pipe.max_seq_len}] (max_seq_len), "
            f"got {p}"
        )
    want = _expected(pipe, p)
    if set(tensors) != set(want):
        raise ValueError(f"{path}: tensors must be {sorted(want)}, got {sorted(tensors)}")
    for key, (shape, dtype) in want.items():
        t = tensors[key]
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(
                f"{path}: {key} must be {dtype} {list(shape)}, got {t.dtype} {list(t.shape)}"
            )
    if meta.get("digest") != _digest(tensors):
        raise ValueError(f"{path}: the tensors do not match the file's digest (altered or damaged)")
    if int(tokens.min()) < 0 or int(tokens.max()) >= pipe.config.vocab_size:
        raise ValueError(f"{path}: token ids must be in [0, {pipe.config.vocab_size})")
    model, dev = pipe.model, pipe.device
    for j, (k, v) in enumerate(zip(model.cache.k, model.cache.v, strict=True)):
        k[:p].copy_(tensors[f"k.{j}"].to(dev))
        v[:p].copy_(tensors[f"v.{j}"].to(dev))
    for i, t in enumerate(model.recurrent_state()):
        t[:1].copy_(tensors[f"recurrent.{i}"].to(dev))
    pipe.reset()
    pipe.position, pipe._live = p, tokens.tolist()
    pipe._logits = tensors["logits"].to(dev)
    pipe.prefix_cache.take(model, pipe._live, pipe._logits)
    return p
