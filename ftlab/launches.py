"""Launch schedules: a piece of work's native launches recorded once, then launched again from
a loop, without the Python that chose them.

A decode step of a model over ftlab's HIP kernels runs a few dozen op calls a layer. Each call's
Python -- the op's dispatch, the backend's layout decisions, its output allocations -- costs tens
of microseconds of host time, while its kernels take a few: launched op by op, the step is bound
by the host (benchmarks/NOTES.md, "Eager decode"). Where every launch of the step goes through a
tvm-ffi module of :func:`ftlab.jit.module_for` and nothing else does device work, those launches
with their arguments *are* the step: :func:`record` runs the work once and keeps them, and
:meth:`Schedule.launch` launches them again, in order, on the current stream (no graph: each is
a kernel launch from the host, as op by op). This is what a static model's decode step is
(fixed shapes and buffers: :class:`ftlab.models.kv_cache.KVCache`), and what llama.cpp's eager path
does with its pre-planned graph.

Launching a schedule again is right only where the recorded work does nothing else, so
:func:`record` watches and refuses (:class:`NotReplayable`, naming what it saw):

- a torch operation that computes (anything but views and allocations: a kernel a replay would
  not run), seen by a ``TorchDispatchMode``;
- a Triton kernel launch (Triton's ``JITFunction.run``);
- a CPU module asked for (:func:`ftlab.jit.load_cpu`);
- a recorded function that returns a value (the Python after it may have used it);
- a recorded call given an argument other than a tensor or a scalar (a container could hold a
  per-step input that no one rewrites).

The tensors a schedule reads or writes are the ones of the recorded run: buffers allocated during
it (kept alive by the schedule), and those it was given. Inputs that change from one launch to the
next must be written into the recorded input tensors in place first (what
:class:`ftlab.models.decode_steps.DecodeLaunches` does with a step's tokens and geometry).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ftlab import jit

__all__ = ["NotReplayable", "Schedule", "record"]

#: torch operations a recording allows besides views: allocations (the buffers then belong to it)
_ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


class NotReplayable(RuntimeError):
    """The recorded work did something a schedule cannot launch again; ``reasons`` names each."""

    def __init__(self, reasons: list[str]):
        self.reasons = list(reasons)
        shown = "; ".join(self.reasons[:5]) + (
            f"; and {len(self.reasons) - 5} more" if len(self.reasons) > 5 else ""
        )
        super().__init__(f"not replayable: {shown}")


class Schedule:
    """Recorded launches: ``calls`` is a list of (tvm-ffi function, argument tuple), launched in
    order by :meth:`launch`. Holds every tensor it launches with."""

    #: the CPU module whose ``make_runner`` runs a schedule from C++ (``cpu/csrc/launch_runner.cc``)
    RUNNER = "launch_runner"

    def __init__(self, calls: list[tuple[Callable, tuple]]):
        self.calls = calls
        self._runner = None  # built at the first launch; False where no C++ compiler is at hand
        anchors = [a for a in self.tensors() if a.device.type != "cpu"]
        self._anchor = anchors[0] if anchors else torch.empty(0)

    def __len__(self) -> int:
        return len(self.calls)

    def launch(self) -> None:
        """Launch every recorded call again, in order, on torch's current stream: from C++ (one
        call from Python for the whole schedule: ``cpu/csrc/launch_runner.cc``), or where that
        module cannot be built, from a Python loop (:meth:`launch_each`)."""
        if self._runner is None:
            try:
                runner = jit.load_cpu(self.RUNNER).make_runner
                self._runner = runner(
                    [fn for fn, _ in self.calls], [list(args) for _, args in self.calls]
                )
            except Exception as e:  # no compiler, a failed build: the Python loop, said once
                warnings.warn(
                    "launch schedules run from a Python loop: the C++ runner is not available "
                    f"({e})",
                    RuntimeWarning,
                    stacklevel=2,
                )
                self._runner = False
        if self._runner is False:
            self.launch_each()
        else:  # given a GPU tensor, tvm-ffi sets its device's current stream for the call
            self._on_device(lambda: self._runner(self._anchor))

    @property
    def native(self) -> bool | None:
        """Whether :meth:`launch` runs the schedule from C++ (None before the first launch)."""
        return None if self._runner is None else self._runner is not False

    def launch_each(self) -> None:
        """Launch every recorded call again from a Python loop (a tvm-ffi call each)."""

        def each() -> None:
            for fn, args in self.calls:
                fn(*args)

        self._on_device(each)

    def _on_device(self, launch: Callable[[], object]) -> None:
        """``launch()`` with the schedule's device current (its tensors' GPU, if any)."""
        if self._anchor.device.type == "cpu":
            launch()
        else:
            jit.on_device(self._anchor.device, launch)

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor argument of every call."""
        for _, args in self.calls:
            yield from (a for a in args if isinstance(a, torch.Tensor))


#: argument types a recorded call may take: what a schedule can hold and pass again as it was
_ARGUMENTS = (torch.Tensor, bool, int, float, str, type(None))


class _Recorder:
    def __init__(self):
        self.calls: list[tuple[Callable, tuple]] = []
        self.reasons: list[str] = []
        self.inside = 0  # > 0 while a recorded function runs (its own torch work is its business)
        self.thread = threading.get_ident()

    def refuse(self, reason: str) -> None:
        if self.inside == 0 and threading.get_ident() == self.thread and reason not in self.reasons:
            self.reasons.append(reason)

    def view(self, module) -> _RecordingModule:
        return _RecordingModule(module, self)


class _RecordingModule:
    """A tvm-ffi module whose functions run and are recorded."""

    __slots__ = ("_module", "_recorder")

    def __init__(self, module, recorder: _Recorder):
        self._module, self._recorder = module, recorder

    def __getattr__(self, name: str):
        fn, rec = getattr(self._module, name), self._recorder

        def call(*args):
            rec.inside += 1
            try:
                out = fn(*args)
            finally:
                rec.inside -= 1
            if out is not None:
                rec.refuse(f"{name} returned a value")
            odd = sorted({type(a).__name__ for a in args if not isinstance(a, _ARGUMENTS)})
            if odd:  # a container could hold a per-step input that no one refreshes
                rec.refuse(f"{name} took arguments of type {', '.join(odd)}")
            rec.calls.append((fn, args))
            return out

        return call


class _TorchWatch(TorchDispatchMode):
    """Refuses every torch operation but views and allocations, outside recorded calls."""

    def __init__(self, recorder: _Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not (func.is_view or func.overloadpacket.__name__ in _ALLOCATIONS):
            self.recorder.refuse(f"torch {func}")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _triton_watch(recorder: _Recorder) -> Iterator[None]:
    """Triton's kernel launches refused while recording (they do not go through a module): its
    compiled kernels' and its interpreter's (``TRITON_INTERPRET=1``) launch methods, watched."""
    classes = []
    try:
        from triton.runtime.jit import JITFunction

        classes.append(JITFunction)
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # no Triton, or no interpreter: what there is is watched
        pass
    saved = [(cls, cls.run) for cls in classes]

    def watching(run):
        def watched(self, *args, **kwargs):
            recorder.refuse(f"Triton kernel {getattr(self, '__name__', self)}")
            return run(self, *args, **kwargs)

        return watched

    for cls, run in saved:
        cls.run = watching(run)
    try:
        yield
    finally:
        for cls, run in saved:
            cls.run = run


def record(work: Callable[[], object]) -> tuple[Schedule, object]:
    """Run ``work()`` once, recording its launches; returns (the :class:`Schedule`, what work
    returned). Raises :class:`NotReplayable` (after the run: its launches did happen) when it
    did anything a schedule cannot repeat (module docstring). Not reentrant.

    What is recorded is what ``work`` launches through modules it asks :func:`ftlab.jit.module_for`
    for while recording, on this thread (as every ftlab op does, per call): a module object kept
    from before (the hybrid executor's handshake keeps one) is neither recorded nor refused, so
    such work must not be recorded (:class:`ftlab.models.decode_steps.DecodeLaunches` refuses
    hybrid models). Other threads' launches and torch work are not seen."""
    rec = _Recorder()
    with jit.recording(rec), _triton_watch(rec), _TorchWatch(rec):
        out = work()
    if rec.reasons:
        raise NotReplayable(rec.reasons)
    if not rec.calls:
        raise NotReplayable(["no launches through ftlab.jit.module_for"])
    return Schedule(rec.calls), out
