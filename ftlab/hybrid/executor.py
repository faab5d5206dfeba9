"""The hybrid decode schedule, and the capability probe that picks its handshake."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable

import torch

from ftlab import ops
from ftlab.hybrid.handshake import HANDSHAKES, EagerHandshake
from ftlab.hybrid.residency import LruResidency, StaticResidency, cpu_layers
from ftlab.quant import QuantWeight, quant_weight

# The graph-capturable handshakes in the order the probe tries them (the faster first: a polling
# CPU thread answers sooner than a host-function callback wakes one; see benchmarks/NOTES.md).
PROBE_ORDER = ("stream_memop", "host_func")
ENV_MECHANISM = "FTLAB_HYBRID_MECHANISM"  # host_func | stream_memop | eager: force one
ENV_PROBE_FAIL = "FTLAB_HYBRID_PROBE_FAIL"  # comma-separated names, or "all": their probes fail
PROBE_REPLAYS = 6
PROBE_DEADLINE_S = 20.0

_probe_cache: dict[tuple, tuple[bool, str]] = {}
_warned: set[tuple] = set()


def _slot_bank(bank, slots: int, device: torch.device):
    """An empty bank of ``slots`` experts shaped like ``bank``'s experts, on ``device``."""
    if isinstance(bank, QuantWeight):
        data = torch.zeros((slots, *bank.data.shape[1:]), dtype=torch.uint8, device=device)
        return quant_weight(data, (slots, *bank.shape[1:]), bank.qtype)
    return torch.zeros((slots, *bank.shape[1:]), dtype=bank.dtype, device=device)


def _copy_expert(dst, slot: int, src, expert: int) -> None:
    if isinstance(dst, QuantWeight):
        dst.data[slot].copy_(src.data[expert], non_blocking=True)
    else:
        dst[slot].copy_(src[expert], non_blocking=True)


def _forced_failures() -> set[str]:
    raw = os.environ.get(ENV_PROBE_FAIL, "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    return set(PROBE_ORDER) if "all" in names else names


def _wait(stream: torch.cuda.Stream, seconds: float) -> bool:
    """Whether ``stream`` drained within ``seconds`` (polling, so a stuck handshake cannot hang)."""
    event = torch.cuda.Event()
    event.record(stream)
    deadline = time.monotonic() + seconds
    while not event.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def probe(name: str, device: torch.device | str, backend: str = "auto") -> tuple[bool, str]:
    """Capture -> instantiate -> replay a small known hybrid step (8 dense experts, 4 of them
    resident, 2 tokens of top-2) through handshake ``name``, :data:`PROBE_REPLAYS` replays with
    changing inputs and CPU/GPU splits, each compared with the eager handshake's answer.
    Returns (passed, why). Cached per device, backend and forced failures."""
    device = torch.device(device)
    forced = _forced_failures()
    key = (name, str(device), backend, tuple(sorted(forced)))
    if key not in _probe_cache:
        _probe_cache[key] = _run_probe(name, device, backend, forced)
    return _probe_cache[key]


def _run_probe(name: str, device: torch.device, backend: str, forced: set[str]) -> tuple[bool, str]:
    if name in forced:
        return False, f"forced to fail by {ENV_PROBE_FAIL}"
    if device.type != "cuda":
        return False, "no GPU: graph capture needs a CUDA/HIP device"
    from ftlab import jit
    from ftlab import platform as ftplatform

    reason = jit.cpu_unavailable_reason() or jit.gpu_unavailable_reason(ftplatform.current(device))
    if reason:
        return False, reason
    gen = torch.Generator().manual_seed(1234)
    e, h, inter, k, t = 8, 64, 32, 2, 2
    gu = torch.randn(e, 2 * inter, h, generator=gen) * h**-0.5
    dn = torch.randn(e, h, inter, generator=gen) * inter**-0.5
    ex = None
    try:
        ex = HybridDecodeExecutor(
            gu, dn, 4, device, backend=backend, path="auto", mechanism=name, probe=False
        )
        ex.end_step(torch.arange(4).view(2, 2))  # experts 0..3 resident
        x = torch.randn(t, h, generator=gen).to(device)
        w = torch.rand(t, k, generator=gen).to(device)
        ids = torch.randint(0, e, (t, k), generator=gen, dtype=torch.int32).to(device)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            ex(x, w, ids)  # warm-up: the channel of this batch size
            if not _wait(stream, PROBE_DEADLINE_S):
                ex.handshake.cpu.release(t, k)
                return (
                    False,
                    f"an eager step through it did not finish within {PROBE_DEADLINE_S:.0f} s",
                )
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                y = ex(x, w, ids)
        splits = [
            torch.randint(0, 4, (t, k), generator=gen),
            torch.randint(4, e, (t, k), generator=gen),
            torch.randint(0, e, (t, k), generator=gen),
        ]
        for r in range(PROBE_REPLAYS):
            x.copy_(torch.randn(t, h, generator=gen))
            w.copy_(torch.rand(t, k, generator=gen))
            ids.copy_(splits[r % 3])
            with torch.cuda.stream(stream):
                graph.replay()
            if not _wait(stream, PROBE_DEADLINE_S):
                ex.handshake.cpu.release(t, k)
                _wait(stream, PROBE_DEADLINE_S)
                return False, f"replay {r} did not finish within {PROBE_DEADLINE_S:.0f} s"
            ex.check()
            want = ex.eager(x, w, ids)
            if not torch.allclose(y, want, rtol=1e-5, atol=1e-6):
                return (
                    False,
                    f"replay {r} differs from eager by {float((y - want).abs().max()):.3g}",
                )
        return True, f"{PROBE_REPLAYS} graph replays equal eager"
    except (RuntimeError, ValueError, TypeError) as err:  # HandshakeError is a RuntimeError
        return False, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    finally:
        if ex is not None:
            ex.close()


def reset_probes() -> None:
    """Forget the cached probe verdicts and the warnings already given, so the next executor
    probes (and warns) afresh: for tests, and after the environment changed."""
    _probe_cache.clear()
    _warned.clear()


def choose_mechanism(
    requested: str, device: torch.device, backend: str = "auto"
) -> tuple[str, str, list[tuple[str, bool, str]]]:
    """(mechanism, why, probe results) for ``requested`` in {"auto", "host_func", "stream_memop",
    "eager"}; ``FTLAB_HYBRID_MECHANISM`` overrides "auto". A capturable mechanism is used only
    if its probe passes; when none does on a GPU, "eager" and one warning per device."""
    forced = os.environ.get(ENV_MECHANISM, "").strip()
    how = "requested"
    if requested == "auto" and forced:
        requested, how = forced, f"forced by {ENV_MECHANISM}"
    if requested not in ("auto", *HANDSHAKES):
        raise ValueError(
            f"mechanism must be 'auto' or one of {sorted(HANDSHAKES)}, got {requested!r}"
        )
    if requested == "eager":
        return "eager", how, []
    results = []
    for name in PROBE_ORDER if requested == "auto" else (requested,):
        ok, why = probe(name, device, backend)
        results.append((name, ok, why))
        if ok:
            return (
                name,
                f"{how if requested != 'auto' else 'first to pass the probe'}: {why}",
                results,
            )
    why = "; ".join(f"{n}: {w}" for n, _, w in results)
    if device.type == "cuda" and (str(device), why) not in _warned:
        _warned.add((str(device), why))
        warnings.warn(
            f"hybrid MoE on {device}: no graph handshake passed its probe ({why}); graph capture "
            "is disabled for these layers, their steps run eagerly",
            RuntimeWarning,
            stacklevel=3,
        )
    return "eager", f"no handshake passed the probe ({why})", results


class HybridDecodeExecutor:
    """Routed experts with ``slots`` of them resident on ``device`` and the rest on the CPU.

    ``w_gate_up [E, 2I, H]`` and ``w_down [E, H, I]`` are the full banks on the host (dense or
    quantized of any :data:`ftlab.quant.QTYPES` types). Each call: the router ids go through the
    live slot table (``expert -> slot | -1``, int32 ``[E]`` on the device, read at run time, so a
    replayed graph sees the current residency) into GPU slot ids and CPU expert ids (-1 where the
    other side or nobody takes the route); the CPU part is handed over by the handshake, the GPU
    part runs ``ops.moe_experts`` on the slot banks, the handshake waits for the CPU, ``y = y_gpu +
    y_cpu``. :meth:`end_step` (between steps, never in a captured region) checks the handshake,
    updates the residency and copies the loaded experts into their slots.

    ``mechanism``: "auto" probes the graph handshakes (:data:`PROBE_ORDER`) and takes the first
    that passes, else "eager" with a warning; or a name. ``executor.mechanism`` is the choice,
    ``executor.mechanism_reason`` why, ``executor.probe_results`` each probe's verdict.
    ``path`` is the quantized banks' path of the GPU part (the CPU part takes the int8 path)."""

    def __init__(
        self,
        w_gate_up,
        w_down,
        slots: int,
        device: torch.device | str,
        *,
        policy: LruResidency | None = None,
        backend: str = "auto",
        path: str = "int8",
        mechanism: str = "auto",
        probe: bool = True,
    ):
        self.device = torch.device(device)
        self.host_gate_up, self.host_down = w_gate_up, w_down
        num_experts = w_gate_up.shape[0]
        self.policy = policy or LruResidency(num_experts, slots)
        if self.policy.slots != slots or self.policy.num_experts != num_experts:
            raise ValueError(f"policy must have {slots} slots over {num_experts} experts")
        self.backend, self.path = backend, path
        if probe or mechanism == "auto":
            self.mechanism, self.mechanism_reason, self.probe_results = choose_mechanism(
                mechanism, self.device, backend
            )
        else:
            if mechanism not in HANDSHAKES:
                raise ValueError(
                    f"mechanism must be 'auto' or one of {sorted(HANDSHAKES)}, got {mechanism!r}"
                )
            self.mechanism, self.mechanism_reason, self.probe_results = (
                mechanism,
                "requested, not probed",
                [],
            )
        self.slot_gate_up = _slot_bank(w_gate_up, max(slots, 1), self.device)
        self.slot_down = _slot_bank(w_down, max(slots, 1), self.device)
        # read live by every step (and by a replayed graph)
        self.table = self.policy.table(self.device)
        for slot, e in enumerate(self.policy.expert_in):  # a policy that arrives with residents
            if e >= 0:
                _copy_expert(self.slot_gate_up, slot, w_gate_up, e)
                _copy_expert(self.slot_down, slot, w_down, e)
        self._eager = EagerHandshake(w_gate_up, w_down, self.device)
        self.handshake = (
            self._eager
            if self.mechanism == "eager"
            else HANDSHAKES[self.mechanism](w_gate_up, w_down, self.device)
        )

    @property
    def capturable(self) -> bool:
        """Whether a step may be captured in a CUDA/HIP graph."""
        return self.handshake.capturable

    def split(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(GPU slot ids, CPU expert ids), both int32 ``[T, k]`` on ids' device."""
        return EagerHandshake.split(ids, self.table)

    def gpu_part(
        self, x: torch.Tensor, weights: torch.Tensor
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The step's GPU part as a function of the GPU slot ids (what a handshake calls between
        handing the CPU routes over and joining them): the resident experts through
        ``ops.moe_experts`` on the slot banks, -1 ids skipped."""

        def run(gpu_ids: torch.Tensor) -> torch.Tensor:
            return ops.moe_experts(
                x,
                self.slot_gate_up,
                self.slot_down,
                weights,
                gpu_ids,
                path=self.path,
                backend=self.backend,
            )

        return run

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x ``[T, H]`` on the device (float32 / bfloat16 / float16), router weights fp32 and ids
        int ``[T, k]`` -> ``[T, H]`` in x's dtype, through the chosen handshake."""
        return self.handshake(x, weights, ids, self.table, self.gpu_part(x, weights))

    def eager(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The same step through the eager handshake (the answer a replay must equal)."""
        return self._eager(x, weights, ids, self.table, self.gpu_part(x, weights))

    def check(self) -> None:
        """Raise ``HandshakeError`` if a step since the last check combined a CPU answer that was
        not its own (its output was NaN). Call after synchronizing; :meth:`end_step` does."""
        self.handshake.check()

    def end_step(self, ids: torch.Tensor) -> list[tuple[int, int]]:
        """Between steps: check the handshake, update the residency with the step's ids, copy
        the loaded experts into their slots, refresh the slot table in place (only when
        something was loaded: a host-to-device copy a layer a step otherwise). Returns the loads."""
        ids_host = ids.cpu()  # synchronizes the step
        self.check()
        loads = self.policy.update(ids_host)
        for e, s in loads:
            _copy_expert(self.slot_gate_up, s, self.host_gate_up, e)
            _copy_expert(self.slot_down, s, self.host_down, e)
        if loads:
            self.table.copy_(self.policy.table(self.device))
        return loads

    def close(self) -> None:
        """Free the handshake's pinned staging and worker threads (after synchronizing)."""
        self.handshake.close()


#: How ``layer_executors`` places the experts: every layer's slots following the routes, every
#: layer's slots holding a fixed set, or whole layers on the CPU.
PLACEMENTS = ("lru", "static", "layers")


def layer_executors(
    banks: list,
    slots: int,
    device: torch.device | str,
    placement: str = "lru",
    *,
    backend: str = "auto",
    path: str = "int8",
) -> list:
    """One :class:`HybridDecodeExecutor` (or None) a layer over ``banks``, every layer's
    ``(w_gate_up, w_down)`` (on any device: the executors take host copies, of the layers that get
    one only), for ``slots`` of each layer's E experts' share on the GPU:

    - ``"lru"``: every layer ``slots`` experts on the GPU, least recently used out
    (:class:`LruResidency`);
    - ``"static"``: every layer experts ``0 .. slots - 1`` on the GPU for good
    (:class:`StaticResidency`);
    - ``"layers"``: the same share placed by layers, as llama.cpp's ``--n-cpu-moe``: every expert of
      the first :func:`cpu_layers` layers on the CPU (an executor with no slots), the other layers'
      all on the GPU (None: the layer runs its experts as without hybrid experts).

    ``backend`` / ``path``: the GPU part's (``ops.moe_experts``)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {list(PLACEMENTS)}, got {placement!r}")
    if not banks:
        return []
    experts = banks[0][0].shape[0]
    if placement == "layers":
        on_cpu = cpu_layers(len(banks), experts, slots)
        return [
            HybridDecodeExecutor(
                gu.to("cpu"),
                dn.to("cpu"),
                0,
                device,
                policy=StaticResidency(experts, 0),
                backend=backend,
                path=path,
            )
            if i < on_cpu
            else None
            for i, (gu, dn) in enumerate(banks)
        ]
    kind = StaticResidency if placement == "static" else LruResidency
    return [
        HybridDecodeExecutor(
            gu.to("cpu"),
            dn.to("cpu"),
            slots,
            device,
            policy=kind(experts, slots),
            backend=backend,
            path=path,
        )
        for gu, dn in banks
    ]
