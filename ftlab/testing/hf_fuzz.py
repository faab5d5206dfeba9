"""Seeded mutations of HF checkpoint directories, to fuzz the HF loaders
(``ftlab.models.loader.load_hf``) with: :class:`HFMutator` (see :mod:`ftlab.testing.checkpoint_fuzz`
for the GGUF side and how a mutator is used)."""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path

from ftlab.testing.checkpoint_fuzz import Mutation, bad_u64, flip_bytes


class HFMutator:
    """Seeded mutations of one valid HF directory (``config.json`` + ``model.safetensors``),
    written to a fresh directory per case (module docstring: which)."""

    KINDS = (
        "config-type",
        "config-value",
        "config-remove",
        "config-bytes",
        "st-header",
        "st-truncate",
        "st-bytes",
        "st-values",
        "shards",
        "unsupported",
    )
    # keys the loader reads (fields of Qwen3MoeConfig, and the switches it refuses)
    READ = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "rms_norm_eps",
        "rope_theta",
        "norm_topk_prob",
        "tie_word_embeddings",
        "max_position_embeddings",
        "model_type",
        "torch_dtype",
        "attention_bias",
        "mlp_only_layers",
        "decoder_sparse_step",
        "rope_scaling",
        "hidden_act",
    )
    INDEX = "model.safetensors.index.json"

    def __init__(self, path: str | Path):
        from safetensors.torch import load_file

        self.path = Path(path)
        self.config_bytes = (self.path / "config.json").read_bytes()
        self.config = json.loads(self.config_bytes)
        self.weights_raw = (self.path / "model.safetensors").read_bytes()
        self.header_len = struct.unpack_from("<Q", self.weights_raw)[0]
        self.header = json.loads(self.weights_raw[8 : 8 + self.header_len])
        self.tensors = load_file(self.path / "model.safetensors")

    def mutate(self, seed: int, out: str | Path) -> Mutation:
        """Write the mutated directory of ``seed`` into the (empty) directory ``out``."""
        rng, out = random.Random(seed), Path(out)
        kind = rng.choice(self.KINDS)
        config, weights = self.config_bytes, self.weights_raw
        detail = ""
        if kind.startswith("config"):
            config, detail = getattr(self, "_" + kind.replace("-", "_"))(rng)
        elif kind.startswith("st"):
            weights, detail = getattr(self, "_" + kind.replace("-", "_"))(rng)
        elif kind == "unsupported":
            config, weights, detail = self._unsupported(rng)
        (out / "config.json").write_bytes(config)
        if kind == "shards":
            detail = self._shards(rng, out)
        else:
            (out / "model.safetensors").write_bytes(weights)
        return Mutation(
            "hf." + kind, detail, values_only=kind == "st-values", unsupported=kind == "unsupported"
        )

    def _key(self, rng) -> str:
        keys = [k for k in self.READ if k in self.config]
        return rng.choice(keys if rng.random() < 0.85 else list(self.config))

    def _dump(self, config: dict) -> bytes:
        return json.dumps(config, indent=2).encode()

    def _config_type(self, rng):
        key = self._key(rng)
        v = self.config[key]
        new = rng.choice(
            [
                str(v).lower() if isinstance(v, bool) else str(v),
                None,
                [v],
                {"v": v},
                float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 1.5,
                True,
                0 if isinstance(v, bool) else "x",
            ]
        )
        return self._dump({**self.config, key: new}), f"config.json '{key}': {v!r} -> {new!r}"

    def _config_value(self, rng):
        key = self._key(rng)
        v, c = self.config[key], self.config
        choices = [0, -1, 10**12, 2**63, math.nan, math.inf, -math.inf, 1e-300, 1e300, 1.0]
        if isinstance(v, int) and not isinstance(v, bool):
            choices += [v - 1, v + 1, 2 * v]
        choices += {
            "num_experts_per_tok": [c.get("num_experts", 8) + 1],
            "num_key_value_heads": [3, c.get("num_attention_heads", 4) + 1],
            "rope_scaling": [{"rope_type": "yarn", "factor": 4.0}, {"type": "linear"}],
            "torch_dtype": ["float16", "bfloat16", "int8", "nn", "float64", ""],
            "model_type": ["llama", "qwen3_moe "],
            "attention_bias": [True],
            "mlp_only_layers": [[0]],
            "decoder_sparse_step": [2],
        }.get(key, [])
        new = rng.choice(choices)
        return self._dump({**c, key: new}), f"config.json '{key}': {v!r} -> {new!r}"

    def _unsupported(self, rng):
        """A valid copy that asks for what ftlab's models do not compute: a sliding window, an
        activation other than SiLU, attention biases by the config or by a bias tensor."""
        from safetensors.torch import save

        how = rng.choice(["sliding window", "activation", "attention_bias", "bias tensor"])
        if how == "bias tensor":
            weight = rng.choice([n for n in self.tensors if n.endswith("attn.q_proj.weight")])
            name = weight.removesuffix(".weight") + ".bias"
            bias = self.tensors[weight].new_zeros(self.tensors[weight].shape[0])
            weights = save({**self.tensors, name: bias}, metadata={"format": "pt"})
            return self.config_bytes, weights, f"safetensors: tensor '{name}' added"
        change = {
            "sliding window": {"use_sliding_window": True, "sliding_window": 2},
            "activation": {"hidden_act": rng.choice(["gelu", "relu", "gelu_pytorch_tanh"])},
            "attention_bias": {"attention_bias": True},
        }[how]
        return self._dump({**self.config, **change}), self.weights_raw, f"config.json: {change}"

    def _config_remove(self, rng):
        key = self._key(rng)
        config = {k: v for k, v in self.config.items() if k != key}
        return self._dump(config), f"config.json '{key}' removed"

    def _config_bytes(self, rng):
        raw = bytearray(self.config_bytes)
        if rng.random() < 0.3:
            end = rng.randrange(len(raw))
            return bytes(raw[:end]), f"config.json truncated to {end} bytes"
        at = flip_bytes(raw, rng, 0, len(raw), rng.randrange(1, 4))
        return bytes(raw), f"config.json bytes changed at {at}"

    def _st_header(self, rng):
        header = json.loads(json.dumps(self.header))
        name = rng.choice([k for k in header if k != "__metadata__"])
        entry = header[name]
        how = rng.choice(["dtype", "shape", "offsets", "rename", "remove", "metadata", "length"])
        if how == "dtype":
            entry["dtype"] = rng.choice(
                ["I32", "U32", "F16", "BF16", "F64", "BOOL", "U8", "I64", "F8_E4M3", "X"]
            )
        elif how == "shape":
            s = entry["shape"]
            entry["shape"] = rng.choice(
                [
                    [],
                    [0],
                    s[::-1],
                    [*s, 1],
                    [s[0] + 1, *s[1:]],
                    [-1, *s[1:]],
                    [2**64, *s[1:]],
                    [s[0] // 2, *s[1:]],
                ]
            )
        elif how == "offsets":
            a, b = entry["data_offsets"]
            entry["data_offsets"] = rng.choice(
                [[a + 1, b + 1], [a, b - 4], [b, a], [0, b - a], [a, 2**64], [a, b + 4]]
            )
        elif how == "rename":
            other = rng.choice([k for k in header if k != "__metadata__"])
            header = {(other if k == name else k): v for k, v in header.items()}
            if other != name:  # the same key twice: written by hand, as json.dumps cannot
                text = json.dumps(header)[:-1] + f', "{other}": ' + json.dumps(entry) + "}"
                return self._with_header(
                    text.encode()
                ), f"safetensors: tensor '{name}' -> '{other}'"
        elif how == "remove":
            del header[name]
        elif how == "metadata":
            header["__metadata__"] = rng.choice([[], "x", {"format": 1}, None])
        else:
            v = bad_u64(rng, self.header_len, len(self.weights_raw))
            return struct.pack("<Q", v) + self.weights_raw[8:], f"safetensors: header length -> {v}"
        return self._with_header(json.dumps(header).encode()), f"safetensors: {how} of '{name}'"

    def _with_header(self, text: bytes) -> bytes:
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text + self.weights_raw[8 + self.header_len :]

    def _st_truncate(self, rng):
        end = rng.choice(
            [
                rng.randrange(8 + self.header_len),
                rng.randrange(len(self.weights_raw)),
                len(self.weights_raw) - rng.randrange(1, 64),
            ]
        )
        return self.weights_raw[:end], f"model.safetensors truncated to {end} bytes"

    def _st_bytes(self, rng):
        data = bytearray(self.weights_raw)
        at = flip_bytes(data, rng, 0, 8 + self.header_len, rng.randrange(1, 5))
        return bytes(data), f"safetensors header bytes changed at {at}"

    def _st_values(self, rng):
        data = bytearray(self.weights_raw)
        at = flip_bytes(data, rng, 8 + self.header_len, len(data), rng.randrange(1, 9))
        return bytes(data), f"safetensors data bytes changed at {at}"

    def _shards(self, rng, out: Path) -> str:
        """Two shards (transformers' names) plus one layout fault, or none."""
        from safetensors.torch import save_file

        names = sorted(self.tensors)
        cut = rng.randrange(1, len(names))
        shards = {
            "model-00001-of-00002.safetensors": names[:cut],
            "model-00002-of-00002.safetensors": names[cut:],
        }
        weight_map = {n: s for s, ns in shards.items() for n in ns}
        index: object = {"metadata": {}, "weight_map": weight_map}
        fault = rng.choice(
            [
                "none",
                "no index",
                "stale shard",
                "stale shard, no index",
                "duplicate",
                "duplicate, no index",
                "missing shard",
                "wrong shard",
                "unlisted tensor",
                "unknown tensor",
                "index not JSON",
                "no weight_map",
                "shard outside the directory",
            ]
        )
        first, second = list(shards)
        moved = rng.choice(names)
        if fault.startswith("duplicate"):  # one tensor in both shards
            shards[second if moved in shards[first] else first] = [
                *shards[second if moved in shards[first] else first],
                moved,
            ]
        for shard, ns in shards.items():
            if not (fault == "missing shard" and shard == second):
                save_file({n: self.tensors[n] for n in ns}, str(out / shard), {"format": "pt"})
        if fault.startswith("stale shard"):  # an older copy of some tensors, left in the folder
            stale = {n: self.tensors[n] * 2 for n in rng.sample(names, 3)}
            save_file(stale, str(out / "model-00001-of-00003.safetensors"), {"format": "pt"})
        if fault == "wrong shard":
            weight_map[moved] = second if weight_map[moved] == first else first
        elif fault == "unlisted tensor":
            del weight_map[moved]
        elif fault == "unknown tensor":
            weight_map["model.layers.99.mlp.gate.weight"] = first
        elif fault == "no weight_map":
            index = rng.choice([{"metadata": {}}, {"weight_map": []}, [], {"weight_map": {}}])
        elif fault == "shard outside the directory":
            weight_map[moved] = "../" + weight_map[moved]
        if "no index" not in fault:
            text = json.dumps(index)
            if fault == "index not JSON":
                text = text[: rng.randrange(len(text))]
            (out / self.INDEX).write_text(text)
        return f"2 shards split before '{names[cut]}', fault: {fault} ('{moved}')"
