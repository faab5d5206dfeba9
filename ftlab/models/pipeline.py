"""Run Qwen3-MoE -- or the hybrid Qwen3.5-MoE / Qwen3-Next (:mod:`ftlab.models.qwen3_next`) -- step
by step: load, prefill, decode, generate, look at every stage, and compare backends stage by
stage.

    pipe = Pipeline.load("tiny-qwen3-moe")                 # or a HF directory, or a .gguf file
    for piece in pipe.generate("The router", max_new_tokens=16):
        print(piece, end="")
    for stage in pipe.stages("The router"):    # embed, layer i attention/router/experts, ...
        print(stage.name, {k: tuple(v.shape) for k, v in stage.tensors.items()})
    pipe.compare("The router", backends=["reference", "triton"])

On a CUDA/ROCm device the decode step replays a captured CUDA/HIP graph by default
(``graphs="auto"``; :class:`DecodeGraph`, the model then runs in its static mode); on the CPU it
runs eagerly, op by op. ``graphs=False`` asks for eager decode on a GPU: the static model's step,
its layers' kernels launched from a schedule recorded at the first step (:class:`DecodeLaunches`;
op by op where the layers do not record: :attr:`Pipeline.decode_path`). Arguments are checked
when given (:mod:`ftlab.models.pipeline_args`): a bad one raises ``TypeError`` or ``ValueError``
naming it, before any work. What a load reads is :mod:`~ftlab.models.pipeline_load`, the token
choice :mod:`~ftlab.models.sampling`, the stage comparison :mod:`~ftlab.models.stage_diff`, a
generation's loop and timing :mod:`~ftlab.models.generation`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from ftlab.models import pipeline_args as check
from ftlab.models import state_file, tiny
from ftlab.models.decode_plan import DecodePlan
from ftlab.models.decode_steps import DecodeGraph, DecodeLaunches, pipeline_step
from ftlab.models.generation import generate, timed_generate
from ftlab.models.generation_timing import Timing
from ftlab.models.layers import Stage
from ftlab.models.memory import pipeline_memory
from ftlab.models.pipeline_args import backend_map
from ftlab.models.pipeline_load import joined_group, model_file, read_model
from ftlab.models.prefix_cache import PrefixCache, cuts, restore, resume_point
from ftlab.models.qwen3_moe.config import Qwen3MoeConfig
from ftlab.models.qwen3_moe.model import Qwen3Moe
from ftlab.models.qwen3_moe.model_weights import ModelWeights
from ftlab.models.qwen3_next.config import Qwen3NextConfig
from ftlab.models.qwen3_next.model import Qwen3Next
from ftlab.models.qwen3_next.model_weights import NextWeights
from ftlab.models.sampling import sample
from ftlab.models.stage_diff import StageDiff, compare_sets, format_compare
from ftlab.models.tokenizer import Tokenizer
from ftlab.models.tp_ranges import rank_experts, rank_heads, rank_ranges

__all__ = [
    "DecodeGraph",
    "DecodeLaunches",
    "Pipeline",
    "StageDiff",
    "Timing",
    "backend_map",
    "format_compare",
    "rank_experts",
    "rank_heads",
    "rank_ranges",
    "timed_generate",
]


class Pipeline:
    """A loaded model, its tokenizer and one sequence's decoding state (batch 1).

    ``graphs``: ``"auto"`` (default) captures the decode step on a CUDA/ROCm device when every op's
    backend can run inside a capture (the reference cannot: it reads tensors on the host), and runs
    it eagerly otherwise and on the CPU; ``True`` captures (an error on the CPU, or with a backend
    that cannot be captured); ``False`` runs eagerly. When captured, the decode step replays a graph
    built at the first decode step, and the model runs in its static mode (a decode step's
    attention over every cache slot under a mask; a prompt's over the live positions only).
    Eager on a GPU with backends that can be captured, with ``launches`` (default True), the model
    is static too and the decode step launches its layers' kernels from a schedule recorded at the
    first decode step (:attr:`decode_path`); where that recording is
    refused, and with ``launches=False``, steps run op by op on the dynamic model (attention over
    the live positions). The schedule holds the kernels the model's
    :class:`~ftlab.models.decode_plan.DecodePlan` picked when it was recorded: a plan handed in
    later does not reach it.

    ``hybrid_slots``: hybrid CPU/GPU experts (``ftlab.hybrid``), for every model class: the share
    ``hybrid_slots / num_experts`` of the expert bytes stays on the GPU, the rest runs on the CPU,
    from host copies of the banks (the device banks stay loaded, for :meth:`compare`), placed by
    ``hybrid_policy``; a Qwen3-Next / Qwen3.5-MoE layer's shared expert stays on the GPU.
    Prefill runs each hybrid layer's eager schedule, a decode step its handshake. A graph is
    captured only if every layer's handshake passed its probe; otherwise decode runs eagerly,
    with the probe's warning. ``hybrid_policy`` (``ftlab.hybrid.layer_executors``):
    ``"layers"`` (the default, :data:`~ftlab.models.pipeline_args.DEFAULT_HYBRID_POLICY`: the
    fastest on routes that do not repeat): the share placed by layers, as llama.cpp's
    ``--n-cpu-moe``: every expert of the first ``ftlab.hybrid.cpu_layers`` layers on the CPU, the
    other layers' all on the GPU; ``"lru"``: each layer keeps ``hybrid_slots`` of its experts in
    GPU slots, the missed experts of a step copied in after it (least recently used out: for
    routes that repeat); ``"static"``: experts ``0 .. hybrid_slots - 1`` of every layer on the GPU
    for good, nothing copied between steps.

    :meth:`prefill` runs a prompt in chunks of :attr:`prefill_chunk` tokens (llama.cpp's ubatch):
    the first over its own tokens, each later one over the live positions before it, so a long
    prompt's scratch is a chunk's. A prompt resumes after what the pipeline holds or a snapshot of
    :attr:`prefix_cache` shares with it (:mod:`~ftlab.models.prefix_cache`)."""

    #: the most tokens a prefill forward pass takes; a longer prompt runs in chunks of this many
    prefill_chunk: int = 4096

    def __init__(
        self,
        config: Qwen3MoeConfig | Qwen3NextConfig,
        weights: ModelWeights | NextWeights,
        tokenizer: Tokenizer,
        *,
        backends: str | dict[str, str] = "auto",
        max_seq_len: int = 512,
        name: str = "",
        q4_0_path: str = "auto",
        graphs: bool | str = "auto",
        hybrid_slots: int | None = None,
        tp=None,
        launches: bool = True,
        hybrid_policy: str = check.DEFAULT_HYBRID_POLICY,
        plan: DecodePlan | None = None,
        prefix_cache_bytes: int = check.DEFAULT_PREFIX_CACHE_BYTES,
    ):
        ops = check.usable(backend_map(backends), weights.embed.device)
        if plan is not None and not isinstance(plan, DecodePlan):
            raise TypeError(
                f"plan must be a ftlab.models.DecodePlan or None, got {type(plan).__name__}"
            )
        check.flag("launches", launches)
        check.hybrid_policy(hybrid_policy)
        if tp is not None and hybrid_slots is not None:
            raise ValueError("hybrid_slots and tp > 1 do not combine yet: pick one")
        self.tp = tp
        self.model_class = Qwen3Next if isinstance(config, Qwen3NextConfig) else Qwen3Moe
        self.max_seq_len = check.max_seq_len(max_seq_len)
        #: the models' plan: ``plan``'s choices, this pipeline's backends and quantized-weight path
        self.plan = (plan or DecodePlan()).with_(
            backends=ops, quant_path=check.q4_0_path(q4_0_path)
        )
        self.graphs = check.graphs(graphs, weights.embed.device)
        used = {op: ops[op] for op in self.model_class.OPS}
        blocking = check.not_capturable(
            used, weights.embed.device, weights.embed.dtype, self.q4_0_path
        )
        if self.graphs and blocking:
            if graphs is True:
                raise ValueError(
                    f"graphs=True: {', '.join(blocking)} cannot run inside a graph capture (it "
                    "reads tensors on the host); pick other backends for them, or graphs=False"
                )
            self.graphs = False  # "auto": eager decode with these backends
        hybrid_slots = check.hybrid_slots(hybrid_slots, config.num_experts)
        self.config, self.weights, self.tokenizer, self.name = config, weights, tokenizer, name
        self.hybrid = (
            self._hybrid(hybrid_slots, ops, hybrid_policy) if hybrid_slots is not None else None
        )
        # graphs off on a GPU: the static model (no host synchronization in a step), its decode
        # steps launched from a recorded schedule (DecodeLaunches) where the layers record cleanly
        self._static_eager = (
            launches
            and not self.graphs
            and weights.embed.device.type == "cuda"
            and not blocking
            and hybrid_slots is None
            and tp is None
            and hasattr(self.model_class, "layer_stages")
        )
        self.model = self._model(ops, self.hybrid)
        self._graph: DecodeGraph | None = None
        self._launches: DecodeLaunches | None = None
        #: why decode steps run op by op though graphs are off on a GPU (the recording's refusal),
        #: else None
        self.launches_refused: str | None = None
        #: snapshots a prompt sharing their prefix resumes from (:class:`.prefix_cache.PrefixCache`)
        self.prefix_cache = PrefixCache(check.prefix_cache_bytes(prefix_cache_bytes))
        self.reused, self.position = 0, 0  # reused: the last prompt's tokens not computed again
        self._live: list[int] = []  # the tokens the live state holds (position of them)
        self._logits: torch.Tensor | None = None  # the next-token logits after them

    @property
    def q4_0_path(self) -> str:
        """The path of quantized weights (the plan's): "auto", "int8" or "dequant"."""
        return self.plan.quant_path

    @q4_0_path.setter
    def q4_0_path(self, path: str) -> None:
        """A new path for the models from here on (a captured step is captured again)."""
        self.plan = self.plan.with_(quant_path=check.q4_0_path(path))
        self.model.plan = self.model.plan.with_(quant_path=self.plan.quant_path)
        self._graph = self._launches = None

    @classmethod
    def load(
        cls,
        path_or_tiny: str | Path = tiny.DEFAULT,
        device: str | torch.device = "cpu",
        *,
        backends: str | dict[str, str] = "auto",
        dtype: torch.dtype = torch.float32,
        max_seq_len: int = 512,
        quant: str = "f32",
        graphs: bool | str = "auto",
        hybrid_slots: int | None = None,
        q4_0_path: str = "auto",
        tp: int = 1,
        launches: bool = True,
        hybrid_policy: str = check.DEFAULT_HYBRID_POLICY,
        plan: DecodePlan | None = None,
        prefix_cache_bytes: int = check.DEFAULT_PREFIX_CACHE_BYTES,
    ) -> Pipeline:
        """A tiny model by name (:data:`tiny.TINY_MODELS`; ``quant`` picks its HF directory
        ``"hf"`` or its ``"f32"`` or ``"q4_0"`` GGUF file, and is not used for a path), a HF
        directory (Qwen3-MoE, Qwen3-Next or Qwen3.5-MoE, by its config's ``model_type``), or a
        ``.gguf`` file (``qwen3moe``, ``qwen35moe`` or ``qwen3next``, by its
        ``general.architecture``; the tokenizer from its metadata), on ``device`` (``"cpu"``,
        ``"cuda"``, ``"cuda:N"``) with dense weights in ``dtype`` (float32, bfloat16 or float16);
        the other arguments are the class's. Every argument is checked before anything is read,
        but for the upper bound of ``hybrid_slots`` (the model's expert count).

        ``tp > 1``: tensor and expert parallelism over ``tp`` processes
        (:mod:`ftlab.models.tensor_parallel`), each running this call, started by ``torchrun
        --nproc-per-node tp`` (or inside an initialized default process group of that size);
        each rank keeps its shard of the weights on its device (``"cuda"`` means
        ``cuda:LOCAL_RANK``). Every model class, without ``hybrid_slots``."""
        if not isinstance(path_or_tiny, (str, Path)):
            raise TypeError(
                "path_or_tiny must be a tiny model name or a path, got "
                f"{type(path_or_tiny).__name__}"
            )
        quant, dev, dtype = check.quant(quant), check.device(device), check.dtype(dtype)
        check.usable(backend_map(backends), dev)
        check.max_seq_len(max_seq_len)
        check.graphs(graphs, dev)
        check.hybrid_slots(hybrid_slots)
        check.q4_0_path(q4_0_path)
        check.flag("launches", launches)
        check.hybrid_policy(hybrid_policy)
        check.prefix_cache_bytes(prefix_cache_bytes)
        if check.tp(tp) != 1 and hybrid_slots is not None:
            raise ValueError("hybrid_slots and tp > 1 do not combine yet: pick one")
        path, is_tiny = model_file(path_or_tiny, quant)
        with joined_group(tp, dev) as (group, dev):  # the group starts once all else is checked
            config, weights, tokenizer = read_model(path, dev, dtype, group, progress=not is_tiny)
            return cls(
                config,
                weights,
                tokenizer,
                backends=backends,
                max_seq_len=max_seq_len,
                name=str(path_or_tiny),
                graphs=graphs,
                hybrid_slots=hybrid_slots,
                q4_0_path=q4_0_path,
                tp=group,
                launches=launches,
                hybrid_policy=hybrid_policy,
                plan=plan,
                prefix_cache_bytes=prefix_cache_bytes,
            )

    def _model(self, backends: dict[str, str], hybrid: list | None = None) -> Qwen3Moe | Qwen3Next:
        """The model over ``backends``, its :class:`DecodePlan` made here once."""
        plan = self.plan.with_(backends=backends)
        return self.model_class(
            self.config,
            self.weights,
            max_seq_len=self.max_seq_len,
            plan=plan,
            static=self._static,
            hybrid=hybrid,
            tp=self.tp,
        )

    @property
    def _static(self) -> bool:
        return bool(self.graphs or self._static_eager)

    def _hybrid(self, slots: int, backends: dict[str, str], policy: str = "lru") -> list:
        from ftlab.hybrid import layer_executors

        # the routed experts
        banks = [lw.moe if self.model_class is Qwen3Next else lw for lw in self.weights.layers]
        return layer_executors(
            [(b.w_gate_up, b.w_down) for b in banks],
            slots,
            self.device,
            policy,
            backend=backends["moe_experts"],
            path=self.q4_0_path,
        )

    @property
    def executors(self) -> list:
        """The hybrid layers' executors (the layers that have one), in layer order; [] without
        hybrid experts."""
        return [ex for ex in self.hybrid or [] if ex is not None]

    @property
    def graph_capturable(self) -> bool:
        """Whether decode steps are captured: graphs on (``"auto"`` on a GPU, or ``True``) and
        every hybrid layer's handshake (if any) can run inside a graph."""
        return self.graphs and all(ex.capturable for ex in self.executors)

    @property
    def decode_path(self) -> str:
        """How a decode step runs: ``"graph"`` (a captured graph replayed), ``"launches"`` (graphs
        off on a GPU: the layers' kernels launched from a schedule recorded at the first step,
        :class:`DecodeLaunches`; before that step, what is planned: the recording may yet be
        refused), or ``"eager"`` (op by op: ``launches=False``, the CPU, backends that read tensors
        on the host, hybrid or tensor-parallel models, Qwen3-Next / Qwen3.5-MoE -- whose layers run
        torch kernels between the ops -- or a recording refused: then :attr:`launches_refused` says
        why)."""
        if self.graph_capturable:
            return "graph"
        return "launches" if self._static_eager and self.launches_refused is None else "eager"

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device

    def reset(self) -> None:
        """End the sequence: the next prompt starts at position 0 (or from a snapshot of the
        prefix cache, which this keeps: ``prefix_cache.clear()`` drops it)."""
        self.position = 0
        self._live, self._logits = [], None

    @property
    def tokens(self) -> list[int]:
        """The token ids the live decoding state holds (the prompt, then each token fed to
        :meth:`decode_step`); [] when a caller moved :attr:`position` itself."""
        return list(self._live) if len(self._live) == self.position else []

    def _prompt_ids(self, prompt: str) -> list[int]:
        """The token ids of a checked prompt: a non-empty str of at most max_seq_len tokens."""
        ids = self.tokenizer.encode(check.prompt(prompt))
        if not ids:
            raise ValueError(f"prompt must encode to at least one token, got none from {prompt!r}")
        check.fits("prompt", len(ids), self.max_seq_len)
        return ids

    def prefill(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Start a sequence with ``ids`` (int token ids, ``[T]`` or ``[1, T]``, 1 <= T <=
        max_seq_len); returns the next-token logits fp32 ``[V]``. In forward passes of at most
        :attr:`prefill_chunk` tokens (class docstring).

        A prompt that begins with the tokens the pipeline holds (a conversation's next turn) or
        with a snapshot's (:attr:`prefix_cache`) starts after them (:attr:`reused` says how many
        tokens that saved); the prompt's end, and every ``prefix_cache.every`` tokens, are
        snapshotted (:mod:`~ftlab.models.prefix_cache`)."""
        ids = check.token_ids("ids", ids, self.config.vocab_size, self.max_seq_len, self.device)
        chunk = check.prefill_chunk(self.prefill_chunk)
        tokens, cache = ids.tolist(), self.prefix_cache
        at = resume_point(
            tokens, self.tokens, self._logits, cache, bool(self.model.recurrent_state())
        )
        restore(self.model, at)
        self.position, self._live, self.reused = at.position, tokens[: at.position], at.position
        logits = self._logits = None if at.logits is None else at.logits.clone()
        for start, end in cuts(at.position, len(tokens), chunk, cache.every):
            pos = torch.arange(start, end, device=self.device)[None]
            logits = self.model.forward(ids[None, start:end], pos, last_only=True)[0, -1]
            self.model.end_step()
            self.position, self._live, self._logits = end, tokens[:end], logits
            if end == len(tokens) or end % cache.every == 0:
                cache.take(self.model, self._live, logits)
        return logits

    def decode_step(self, token: int) -> torch.Tensor:
        """Append one token id (an int); returns the next-token logits fp32 ``[V]``."""
        token = check.token_id("token", token, self.config.vocab_size)
        if self.position >= self.max_seq_len:
            raise ValueError(
                f"the sequence reached max_seq_len = {self.max_seq_len}; start another with prefill"
            )
        pos = torch.tensor([[self.position]], device=self.device)
        tok = torch.tensor([[token]], device=self.device)
        held = len(self._live) == self.position  # the live tokens known: one more now
        self.position += 1
        logits = pipeline_step(self, tok, pos)
        self.model.end_step()
        if held:
            self._live.append(token)
        self._logits = logits
        return logits

    def save_state(self, path: str | Path) -> Path:
        """Write the decoding state after :attr:`tokens` to ``path``
        (:func:`ftlab.models.state_file.save_state`)."""
        return state_file.save_state(self, path)

    def load_state(self, path: str | Path) -> int:
        """Continue from a state file of this model (:func:`ftlab.models.state_file.load_state`):
        returns the position; a file of another model, config, dtype or weights format, or a
        damaged one, is refused before anything changes."""
        return state_file.load_state(self, path)

    #: a token id from logits ``[V]``, greedy or nucleus (:func:`ftlab.models.sampling.sample`)
    sample = staticmethod(sample)

    def generate(
        self,
        prompt: str | list[int] | torch.Tensor,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        ignore_eos: bool = False,
    ) -> Iterator[str]:
        """Stream the text of up to ``max_new_tokens`` new tokens (stops at end-of-text, unless
        ``ignore_eos``, or at max_seq_len). ``prompt``: text, or its token ids (a list of ints or
        an integer tensor ``[T]`` / ``[1, T]``, as :meth:`prefill` takes them). Sampling runs on
        the model's device (:func:`~ftlab.models.sampling.sample`, a generator seeded with
        ``seed`` there): one token id a step comes to the host. The arguments are checked here,
        before the first token is asked for. A prompt that begins with what the pipeline holds
        (the last turn and its answer) or a snapshot's tokens resumes there (:meth:`prefill`)."""
        return generate(self, prompt, max_new_tokens, temperature, top_p, seed, ignore_eos)

    def stages(self, prompt: str) -> Iterator[Stage]:
        """The prefill of ``prompt``, stage by stage, then the sampled next token. The prompt is
        checked here (a non-empty str of at most max_seq_len tokens)."""
        ids = torch.tensor([self._prompt_ids(prompt)], device=self.device)
        return self._stages(ids)

    def _stages(self, ids: torch.Tensor) -> Iterator[Stage]:
        self.position, self._live, self._logits = ids.shape[1], [], None  # nothing to resume
        for stage in self.model.stages(ids, torch.arange(ids.shape[1], device=self.device)[None]):
            yield stage
            last = stage
        token = int(last.tensors["logits"][0, -1].argmax())
        yield Stage("sample", {"token": torch.tensor([token])}, "token")

    def compare(
        self,
        prompt: str,
        backends: list[str | dict[str, str]],
        reference: str | dict[str, str] = "reference",
    ) -> list[StageDiff]:
        """Per-stage max-abs and relative difference of each backend set (a name, or a dict
        ``{op: backend}``) against ``reference``, on the same prompt and weights. Every set is
        checked (names known, backends able to run on this device) before any is run."""
        ids = torch.tensor([self._prompt_ids(prompt)], device=self.device)
        sets = check.backend_sets(backends, self.device)
        base_ops = check.usable(backend_map(reference), self.device)
        return compare_sets(self._model, ids, base_ops, [(b, backend_map(b)) for b in sets])

    def memory(self) -> dict[str, int]:
        """Bytes on the device by what holds them (:func:`ftlab.models.memory.pipeline_memory`)."""
        return pipeline_memory(self)
