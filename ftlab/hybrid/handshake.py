"""The handshakes of the hybrid executor (docs/OPS.md section 4): how a decode step's CPU routes get
from the GPU stream to the CPU and back, inside a captured CUDA/HIP graph or not.

One interface, three classes, each called as ``handshake(x, weights, ids, table, gpu_part) -> y``
where ``gpu_part(gpu_ids) -> y_gpu`` runs the GPU experts on the resident slots:

- :class:`HostFuncHandshake`: host-function nodes (``cudaLaunchHostFunc`` / ``hipLaunchHostFunc``)
  post the staged step to the CPU worker and, after the GPU experts, join it.
- :class:`StreamMemOpHandshake`: stream memory operations; the GPU publishes the step counter in
  a mapped ``ready`` word, a CPU thread polling it computes and writes ``done`` (the counter with
  a valid bit), the stream waits on it (``WaitValue32``) before the copy back.
- :class:`EagerHandshake`: no graph; split, copy to the host, compute, copy back, synchronously.

The first two run through a :class:`CpuMoeExecutor` (``ftlab/hip/csrc/handshake_launch.hip``, the
channels and the worker in ``handshake_host.h``):
pinned staging per batch size at stable addresses (so a graph can bake them in), a step counter
on the device, and the process's one worker thread running the native CPU kernel (the ``cpu``
backend of ``moe_experts``, ``ftlab/cpu``, OpenMP). The staged input and output both carry the step
counter; the combine kernel turns any answer of another step into NaN plus a recorded error, and
:meth:`check` raises :class:`HandshakeError` for it: a stale host buffer or flag is never returned
as a result.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable

import torch

from ftlab import ops
from ftlab.cpu.moe import DENSE_KINDS, job_kind
from ftlab.quant import QuantWeight

FAULTS = {"none": 0, "stale": 1, "stale_unchecked": 2}


class HandshakeError(RuntimeError):
    """A hybrid step combined an answer that was not the step's own (stale CPU output, a stale
    flag, or a failed CPU kernel); the step's output was NaN."""


def _bank_parts(w_gate_up, w_down) -> tuple[torch.Tensor, torch.Tensor, int]:
    if isinstance(w_gate_up, QuantWeight) != isinstance(w_down, QuantWeight):
        raise TypeError("w_gate_up and w_down must both be quantized banks or both dense")
    if isinstance(w_gate_up, QuantWeight):
        return w_gate_up.data.contiguous(), w_down.data.contiguous(), job_kind(w_gate_up, w_down)
    if w_gate_up.dtype != w_down.dtype or w_gate_up.dtype not in DENSE_KINDS:
        raise TypeError(
            f"dense banks must share a float32 / bfloat16 / float16 dtype, got {w_gate_up.dtype} "
            f"and {w_down.dtype}"
        )
    return w_gate_up.contiguous(), w_down.contiguous(), job_kind(w_gate_up, w_down)


def default_threads() -> int:
    """The CPU worker's OpenMP threads: ``FTLAB_CPU_THREADS``, else the usable cores less two."""
    env = os.environ.get("FTLAB_CPU_THREADS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"FTLAB_CPU_THREADS must be a positive integer, got {env!r}")
        return int(env)
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    return max(1, cores - 2)


class _Channel:
    """One batch size's pinned staging, device step counter and CPU worker (a C++ object)."""

    def __init__(self, module, handle: int, tokens: int, top_k: int, device: torch.device):
        self.module, self.handle, self.tokens, self.top_k = module, handle, tokens, top_k
        self.gpu_ids = torch.full((tokens, top_k), -1, dtype=torch.int32, device=device)

    def stats(self) -> dict[str, int]:
        out = torch.zeros(5, dtype=torch.int64)
        self.module.hs_stats(self.handle, out)
        jobs, cpu_ns, stale, failures, last = out.tolist()
        return {
            "jobs": jobs,
            "cpu_ns": cpu_ns,
            "stale_inputs": stale,
            "cpu_failures": failures,
            "last_step": last,
        }

    def timeline(self) -> torch.Tensor:
        out = torch.zeros(256, 4, dtype=torch.int64)
        self.module.hs_timeline(self.handle, out)
        return out


def _free_channels(module, device: torch.device, channels: dict) -> None:
    if not channels:
        return
    try:
        torch.cuda.synchronize(device)
    except Exception:
        pass
    for ch in channels.values():
        module.hs_free(ch.handle)
    channels.clear()


class CpuMoeExecutor:
    """The CPU side of the graph handshakes: the host banks, and per batch size a channel with
    pinned input ``[seq, T, k, H | ids | w | x fp32 | seq]`` and output ``[seq, status | y fp32 |
    seq]`` staging at stable addresses and a device step counter. One worker thread of the
    process serves every channel (every layer): it runs the native CPU kernel (OpenMP over the
    machine's cores) for the CPU-routed slots, job after job.

    ``mechanism`` is 0 (host-function nodes) or 1 (stream memory operations). ``threads``: the
    worker's OpenMP threads, by default ``FTLAB_CPU_THREADS`` or the usable cores less two (the
    thread that launches the GPU work and the one that waits for it keep theirs: an OpenMP
    region whose threads get preempted waits for them at every barrier). Channels are made
    on first use, which must not be inside a graph capture (it allocates): warm up each batch
    size eagerly first, as a graph capture does anyway."""

    def __init__(
        self,
        w_gate_up,
        w_down,
        mechanism: int,
        device: torch.device | str,
        threads: int | None = None,
    ):
        from ftlab import jit
        from ftlab.cpu.moe import job_entry

        self.device = torch.device(device)
        self.gate_up, self.down, self.kind = _bank_parts(w_gate_up, w_down)
        if self.gate_up.device.type != "cpu":
            raise ValueError(
                f"the CPU executor's banks must be on the host, got {self.gate_up.device}"
            )
        self.num_experts = self.gate_up.shape[0]
        self.inter = self.gate_up.shape[1] // 2
        self.hidden = self.down.shape[1]
        self.mechanism = mechanism
        self.threads = threads or default_threads()
        self.cpu_fn = job_entry()
        self.module = jit.module_for("handshake", self.device)
        self.channels: dict[tuple[int, int], _Channel] = {}
        self._finalizer = weakref.finalize(
            self, _free_channels, self.module, self.device, self.channels
        )

    def channel(self, tokens: int, top_k: int) -> _Channel:
        key = (tokens, top_k)
        ch = self.channels.get(key)
        if ch is None:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"no hybrid channel for batch size {tokens} (top_k {top_k}) yet: run the step "
                    "once eagerly before capturing it"
                )
            index = (
                self.device.index if self.device.index is not None else torch.cuda.current_device()
            )
            handle = self.module.hs_new(
                self.mechanism,
                self.cpu_fn,
                self.gate_up,
                self.down,
                self.kind,
                tokens,
                top_k,
                self.hidden,
                self.inter,
                self.num_experts,
                index,
                self.threads,
            )
            ch = self.channels[key] = _Channel(self.module, int(handle), tokens, top_k, self.device)
        return ch

    def release(self, tokens: int, top_k: int) -> None:
        """Let a stream stuck waiting on batch size ``tokens``'s done flag go on (its step's output
        is then NaN and recorded as failed): how a probe with a deadline frees a handshake that
        never answered."""
        self.module.hs_release(self.channel(tokens, top_k).handle)

    def errors(self) -> list[tuple[int, int, int]]:
        """``[(batch size, what failed, step)]`` of the channels with a recorded error."""
        out = []
        for (tokens, _), ch in self.channels.items():
            code = int(self.module.hs_errors(ch.handle))
            if code:
                out.append((tokens, code >> 32, code & 0xFFFFFFFF))
        return out

    def clear_errors(self) -> None:
        for ch in self.channels.values():
            self.module.hs_clear_errors(ch.handle)

    def inject_fault(self, mode: str, tokens: int | None = None) -> None:
        """For tests and the notebook: ``"stale"`` makes the next CPU job leave its output
        words stale (the combine check catches it), ``"stale_unchecked"`` does so with the check
        off (a broken handshake), ``"none"`` clears both."""
        if mode not in FAULTS:
            raise ValueError(f"mode must be one of {sorted(FAULTS)}, got {mode!r}")
        for (t, _), ch in self.channels.items():
            if tokens is None or t == tokens:
                self.module.hs_fault(ch.handle, FAULTS[mode])

    def close(self) -> None:
        """Synchronize the device, stop the workers, free the staging; graphs that baked this
        executor's channels in must not be replayed afterwards."""
        self._finalizer()


class EagerHandshake:
    """No graph: split on the device, the CPU routes copied to the host and computed there
    (``ops.moe_experts(..., backend="cpu")``) while nothing else runs, the result copied back and
    added."""

    name = "eager"
    capturable = False

    def __init__(self, w_gate_up, w_down, device: torch.device | str):
        self.host_gate_up, self.host_down = w_gate_up, w_down
        self.device = torch.device(device)

    @staticmethod
    def split(ids: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(GPU slot ids, CPU expert ids), both int32 ``[T, k]`` on ids' device."""
        ids = ids.to(torch.int32)
        valid = (ids >= 0) & (ids < table.numel())
        slot = torch.where(valid, table.to(ids.device)[ids.clamp(0, table.numel() - 1).long()], -1)
        return torch.where(valid & (slot >= 0), slot, -1), torch.where(valid & (slot < 0), ids, -1)

    def __call__(
        self, x, weights, ids, table, gpu_part: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "the eager handshake cannot run inside a graph capture (it synchronizes)"
            )
        gpu_ids, cpu_ids = self.split(ids.to(x.device), table)
        y_cpu = ops.moe_experts(
            x.cpu(),
            self.host_gate_up,
            self.host_down,
            weights.cpu(),
            cpu_ids.cpu(),
            path="int8",
            backend="cpu",
        )
        return gpu_part(gpu_ids) + y_cpu.to(x.device)

    def check(self) -> None:
        """Nothing to check: every step synchronizes."""

    def close(self) -> None:
        pass


class _ChannelHandshake:
    mechanism_id = -1
    name = ""
    capturable = True

    def __init__(self, w_gate_up, w_down, device: torch.device | str):
        self.cpu = CpuMoeExecutor(w_gate_up, w_down, self.mechanism_id, device)
        self.device = self.cpu.device

    def __call__(
        self,
        x,
        weights,
        ids,
        table,
        gpu_part: Callable[[torch.Tensor], torch.Tensor],
        mark: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """``mark(i)``, if given, runs before the submit (0), the GPU part (1), the join (2) and
        after it (3): where ``ftlab.hybrid.timeline`` records its events."""
        mark = mark or (lambda i: None)
        if (
            x.dim() != 2
            or ids.dim() != 2
            or ids.shape != weights.shape
            or ids.shape[0] != x.shape[0]
        ):
            raise ValueError(
                f"x must be [T, H] and ids, weights [T, k], got {tuple(x.shape)}, "
                f"{tuple(ids.shape)}, {tuple(weights.shape)}"
            )
        if x.shape[1] != self.cpu.hidden:
            raise ValueError(f"x must have hidden size {self.cpu.hidden}, got {x.shape[1]}")
        ch = self.cpu.channel(x.shape[0], ids.shape[1])
        x = x.contiguous()
        ids = ids.to(torch.int32).contiguous()
        weights = weights.to(torch.float32).contiguous()
        mark(0)
        self.cpu.module.hs_submit(ch.handle, x, ids, weights, table, ch.gpu_ids)
        mark(1)
        y_gpu = gpu_part(ch.gpu_ids).contiguous()
        y = torch.empty_like(x)
        mark(2)
        self.cpu.module.hs_join(ch.handle, y_gpu, y)
        mark(3)
        return y

    def check(self) -> None:
        """Raise :class:`HandshakeError` if a step since the last check combined an answer that
        was not its own (its output was NaN then). Call after the stream is synchronized."""
        errors = self.cpu.errors()
        if errors:
            self.cpu.clear_errors()
            what = {
                1: "output words of another step",
                2: "a CPU kernel failure",
                4: "a done flag of another step",
            }
            parts = [
                f"batch size {t}, step {s}: " + ", ".join(v for b, v in what.items() if code & b)
                for t, code, s in errors
            ]
            raise HandshakeError(
                f"{self.name} handshake returned stale or failed CPU results ("
                + "; ".join(parts)
                + "); the affected outputs are NaN"
            )

    def close(self) -> None:
        self.cpu.close()


class HostFuncHandshake(_ChannelHandshake):
    """Host-function nodes post the staged step to the CPU worker and join it (graph-capturable)."""

    mechanism_id = 0
    name = "host_func"


class StreamMemOpHandshake(_ChannelHandshake):
    """Stream memory operations with a step counter: ``ready`` (the counter, published by the GPU
    after the D2H copy), ``done`` (the counter with a valid bit, written by the CPU worker,
    cleared by the stream each step and waited on before the H2D copy) (graph-capturable)."""

    mechanism_id = 1
    name = "stream_memop"


HANDSHAKES = {cls.name: cls for cls in (HostFuncHandshake, StreamMemOpHandshake, EagerHandshake)}
