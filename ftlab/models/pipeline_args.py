"""What :class:`~ftlab.models.pipeline.Pipeline` and ``ftlab run`` accept: one check per
argument, each returning the value to use or raising before any work is done -- ``TypeError``
for a value of the wrong type, ``ValueError`` for one out of range -- with a message that
names the argument, what was expected and what came::

    ValueError("top_p must be in (0, 1], got 0.0")

The CLI's option parsers call these same checks, so a rule is written once.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import torch

from ftlab import backends as ftbackends
from ftlab import platform as ftplatform

#: The ops a model's ``backends`` map names (each "auto" unless set): Qwen3-MoE's, then those the
#: hybrid models (Qwen3-Next, Qwen3.5-MoE) add.
QWEN3_MOE_OPS = (
    "index",
    "store",
    "router_topk",
    "route_topk",
    "moe_experts",
    "q4_0_matmul",
    "quant_matmul",
    "qk_norm_rope",
    "decode_attention",
    "add_rmsnorm",
)
MODEL_OPS = (
    *QWEN3_MOE_OPS,
    "causal_conv1d",
    "causal_conv1d_update",
    "gated_delta_rule",
    "gated_delta_step",
    "gated_rmsnorm",
    "output_gate",
)
#: Which file of a built-in tiny model ``Pipeline.load`` reads: its HF directory, or the GGUF
#: file with fp32 or Q4_0 weights.
TINY_QUANTS = ("hf", "f32", "q4_0")
#: The dtypes dense weights and activations can take.
MODEL_DTYPES = ftbackends.FLOAT_DTYPES
#: The paths of Q4_0 weights (see ``ops.q4_0_matmul``).
Q4_0_PATHS = ("auto", *ftbackends.Q4_0_PATHS)
#: The placements of hybrid experts (``ftlab.hybrid.PLACEMENTS``): every layer's slots least
#: recently used out, or a fixed set in every layer's slots, or whole layers on the CPU.
HYBRID_POLICIES = ("lru", "static", "layers")
#: the placement of hybrid experts when none is named: the fastest on routes that do not repeat
#: (whole layers' experts on the CPU, as llama.cpp's --n-cpu-moe; lru copies a step's missed
#: experts, static pins the same ones whatever routes come), by the committed same-run timing in
#: benchmarks/results/ (2026-12-04, nvidia-h200, model-gguf ... q4_0-hybrid-fresh-tokens)
DEFAULT_HYBRID_POLICY = "layers"
#: the device memory a pipeline's prefix cache (``ftlab.models.prefix_cache``) holds by default
DEFAULT_PREFIX_CACHE_BYTES = 1 << 30
#: ``graphs=`` values besides True and False: capture on a CUDA/ROCm device, eager on the CPU.
GRAPHS_AUTO = "auto"


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _int(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]`` (no upper bound when ``high`` is None)."""
    span = f"in [{low}, {high}]" if high is not None else f">= {low}"
    if not _is_int(value):
        raise TypeError(f"{name} must be an int {span}, got {value!r} ({type(value).__name__})")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be an int {span}, got {value}")
    return int(value)


def _real(name: str, value: object) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def temperature(value: object) -> float:
    """A finite number >= 0; 0 samples greedily."""
    t = _real("temperature", value)
    if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {t}")
    return t


def top_p(value: object) -> float:
    """The nucleus mass, in (0, 1]."""
    p = _real("top_p", value)
    if not 0 < p <= 1:  # NaN fails too
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    return p


def seed(value: object) -> int:
    """A seed of ``torch.Generator.manual_seed``: an int in [0, 2**64 - 1]."""
    return _int("seed", value, 0, 2**64 - 1)


def max_new_tokens(value: object) -> int:
    """How many tokens generate() may add: an int >= 0."""
    return _int("max_new_tokens", value, 0)


def max_seq_len(value: object) -> int:
    """The KV cache's positions (prompt and generated tokens together): an int >= 1."""
    return _int("max_seq_len", value, 1)


def prefill_chunk(value: object) -> int:
    """The most tokens a prefill forward pass takes (``Pipeline.prefill_chunk``): an int >= 1."""
    return _int("prefill_chunk", value, 1)


def prefix_cache_bytes(value: object) -> int:
    """The device memory a pipeline's prefix cache may hold (``Pipeline.prefix_cache``), in
    bytes: an int >= 0 (0 keeps no snapshots)."""
    return _int("prefix_cache_bytes", value, 0)


def snapshot_every(value: object) -> int:
    """Tokens between the snapshots a long prompt leaves in the prefix cache: an int >= 1."""
    return _int("snapshot_every", value, 1)


def hybrid_slots(value: object, num_experts: int | None = None) -> int | None:
    """None (no hybrid experts) or an int in [0, num_experts] (any int >= 0 while the model,
    and so its expert count, is not known yet)."""
    if value is None:
        return None
    return _int("hybrid_slots", value, 0, num_experts)


def hybrid_policy(value: object) -> str:
    """One of :data:`HYBRID_POLICIES`."""
    if value not in HYBRID_POLICIES:
        raise ValueError(f"hybrid_policy must be one of {list(HYBRID_POLICIES)}, got {value!r}")
    return value


def tp(value: object) -> int:
    """The tensor-parallel size: an int >= 1."""
    return _int("tp", value, 1, None)


def prompt(value: object) -> str:
    """A non-empty str of Unicode text (UTF-8 encodable: no lone surrogate, as the bytes of a
    command line that are not UTF-8 become)."""
    if not isinstance(value, str):
        raise TypeError(f"prompt must be a str, got {type(value).__name__}")
    if not value:
        raise ValueError("prompt must be a non-empty string, got ''")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        where = f"character {e.start} is a lone surrogate: a byte of a command line, not UTF-8"
        raise ValueError(f"prompt must be UTF-8 text, got {value!r} ({where})") from None
    return value


def fits(name: str, tokens: int, max_seq_len: int) -> None:
    """A sequence of ``tokens`` tokens must fit in the KV cache of ``max_seq_len`` positions."""
    if tokens > max_seq_len:
        raise ValueError(
            f"{name} must fit in max_seq_len = {max_seq_len} tokens, got {tokens} tokens"
        )


def token_id(name: str, value: object, vocab_size: int) -> int:
    """A token id in [0, vocab_size), from an int or a one-element integer tensor."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_floating_point:
        value = int(value)
    if not _is_int(value):
        raise TypeError(f"{name} must be an int token id, got {value!r} ({type(value).__name__})")
    if not 0 <= value < vocab_size:
        raise ValueError(f"{name} must be a token id in [0, {vocab_size}), got {value}")
    return int(value)


def token_ids(
    name: str, value: object, vocab_size: int, max_seq_len: int, device: torch.device
) -> torch.Tensor:
    """Token ids as int64 ``[T]`` on ``device``, from a list of ints or an integer tensor ``[T]``
    or ``[1, T]``, with 1 <= T <= max_seq_len and every id in [0, vocab_size)."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer token ids, got a {value.dtype} tensor")
    elif not isinstance(value, (list, tuple)) or not all(_is_int(i) for i in value):
        raise TypeError(
            f"{name} must be a list of int token ids or an integer tensor [T], got {value!r}"
        )
    ids = torch.as_tensor(value, dtype=torch.long, device=device)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"{name} must be [T] (or [1, T]), got shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError(f"{name} must hold at least one token id, got none")
    fits(name, ids.numel(), max_seq_len)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(
            f"{name} must be token ids in [0, {vocab_size}), got {lo if lo < 0 else hi}"
        )
    return ids


def quant(value: object) -> str:
    """One of :data:`TINY_QUANTS`."""
    if value not in TINY_QUANTS:
        raise ValueError(f"quant must be one of {list(TINY_QUANTS)}, got {value!r}")
    return value


def q4_0_path(value: object) -> str:
    """One of :data:`Q4_0_PATHS`."""
    if value not in Q4_0_PATHS:
        raise ValueError(f"q4_0_path must be one of {list(Q4_0_PATHS)}, got {value!r}")
    return value


def dtype(value: object) -> torch.dtype:
    """One of :data:`MODEL_DTYPES`."""
    names = ", ".join(str(d) for d in MODEL_DTYPES)
    if not isinstance(value, torch.dtype):
        raise TypeError(
            f"dtype must be a torch.dtype ({names}), got {value!r} ({type(value).__name__})"
        )
    if value not in MODEL_DTYPES:
        raise ValueError(f"dtype must be one of {names}, got {value}")
    return value


def device(value: object) -> torch.device:
    """A CPU or CUDA/ROCm device that torch can use here (``"cpu"``, ``"cuda"``, ``"cuda:1"``)."""
    if not isinstance(value, (str, torch.device)):
        raise TypeError(
            f"device must be a str or torch.device, got {value!r} ({type(value).__name__})"
        )
    try:
        dev = torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {str(value)!r}") from None
    if dev.type not in ("cpu", "cuda"):  # ROCm devices are "cuda" devices in torch
        raise ValueError(
            f"device must be a CPU or CUDA/ROCm device ('cpu', 'cuda', 'cuda:N'), got {str(dev)!r}"
        )
    if dev.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            build = "no GPU visible" if ftplatform.torch_build() else "a CPU build"
            raise ValueError(
                f"device {str(dev)!r} needs a CUDA or ROCm GPU, got none (torch "
                f"{torch.__version__}: {build}); use device='cpu'"
            )
        if dev.index is not None and dev.index >= count:
            raise ValueError(
                f"device index must be < {count} (the GPUs torch sees), got {str(dev)!r}"
            )
    return dev


def flag(name: str, value: object) -> bool:
    """A bool argument (``launches``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def graphs(value: object, dev: torch.device) -> bool:
    """Whether to capture decode steps on ``dev``: ``"auto"`` on a CUDA/ROCm device, not on the
    CPU; True needs a CUDA/ROCm device."""
    if isinstance(value, str) and value == GRAPHS_AUTO:
        return dev.type == "cuda"
    if not isinstance(value, bool):
        raise TypeError(f"graphs must be 'auto', True or False, got {value!r}")
    if value and dev.type != "cuda":
        raise ValueError(f"graphs=True needs a CUDA or ROCm device, the weights are on {dev}")
    return value


def not_capturable(
    ops: dict[str, str], dev: torch.device, dtype: torch.dtype, q4_0_path: str
) -> list[str]:
    """``"op (backend)"`` for every op of ``ops`` (a :func:`backend_map`) whose backend on ``dev``
    cannot run inside a CUDA/HIP graph capture (the reference reads tensors on the host)."""
    out = []
    for op, name in ops.items():
        path = q4_0_path if q4_0_path != "auto" and ftbackends.spec(op).paths else None
        impl = ftbackends.resolve(op, name, dev, dtype, path=path)
        if not impl.caps.capturable:
            out.append(f"{op} ({impl.backend})")
    return out


def _backend_known(op: str, name: object) -> bool:
    return isinstance(name, str) and (name == "auto" or name in ftbackends.backends_of(op))


def backend_names() -> list[str]:
    """The backends that every op of Qwen3-MoE has (besides "auto")."""
    return [
        n
        for n in ftbackends.backends_of(MODEL_OPS[0])
        if all(_backend_known(op, n) for op in QWEN3_MOE_OPS)
    ]


def backend_map(value: object) -> dict[str, str]:
    """A backend for every op of the models (:data:`MODEL_OPS`): ``"triton"`` -> that backend for
    every op of Qwen3-MoE (:data:`QWEN3_MOE_OPS`, which must all have it) and for every op of the
    hybrid models that has it ("auto" for one that has not); a dict ``{op: backend}`` sets some
    ops (the rest "auto"). Each name must be "auto" or one of ``ftlab.backends.backends_of(op)``."""
    if isinstance(value, str):
        if value != "auto" and not all(_backend_known(op, value) for op in QWEN3_MOE_OPS):
            raise ValueError(
                f"backends must be 'auto', one of {backend_names()} (every op) or a dict {{op: "
                f"backend}}, got {value!r}"
            )
        return {op: value if _backend_known(op, value) else "auto" for op in MODEL_OPS}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"backends must be a backend name or a dict {{op: backend}}, got {type(value).__name__}"
        )
    unknown = set(value) - set(MODEL_OPS)
    if unknown:
        raise ValueError(
            f"backends keys must be op names among {MODEL_OPS}, got {sorted(map(str, unknown))}"
        )
    for op, name in value.items():
        if not _backend_known(op, name):
            raise ValueError(
                f"backends[{op!r}] must be 'auto' or one of {ftbackends.backends_of(op)}, got "
                f"{name!r}"
            )
    return {**dict.fromkeys(MODEL_OPS, "auto"), **value}


def usable(ops: dict[str, str], dev: torch.device) -> dict[str, str]:
    """``ops`` (a :func:`backend_map`) when every backend named in it can run on ``dev``;
    else the routing table's ``BackendUnavailable`` saying which and why, now rather than at
    the op's first call."""
    for op, name in ops.items():
        if name != "auto":
            ftbackends.resolve(op, name, dev)
    return ops


def backend_sets(value: object, dev: torch.device) -> list[str | dict[str, str]]:
    """The backend sets of ``Pipeline.compare``: a list of names or ``{op: backend}`` dicts,
    each known (:func:`backend_map`) and :func:`usable` on ``dev``."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"backends must be a list of backend sets (a name or an {{op: backend}} dict each), "
            f"got {type(value).__name__} {value!r}"
        )
    for b in value:
        usable(backend_map(b), dev)
    return list(value)
