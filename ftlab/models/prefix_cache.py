"""Snapshots of a pipeline's decoding state, so that a prompt sharing a prefix with an earlier one
resumes after it instead of computing it again (:class:`PrefixCache`).

What a sequence leaves behind at position ``p`` (``p`` tokens fed): every attention layer's KV
cache slots ``0 .. p - 1``, and for Qwen3-Next / Qwen3.5-MoE every linear-attention layer's conv
and delta state after token ``p - 1`` -- a recurrent state, which cannot be cut back to a shorter
prefix the way KV slots can. So a :class:`Snapshot` holds the recurrent state *at* its position
(and the next-token logits there), and a model with recurrent layers resumes only where a snapshot
was taken: at the end of each prompt and every :attr:`PrefixCache.every` tokens within one. A
Qwen3-MoE (attention only) resumes anywhere its cached KV slots cover.

KV copies are shared along a line of prompts: the snapshots at 4096, 8192 and the end of one
prompt read one copy of its KV slots (:class:`KVCopy`), extended in place when a longer prompt
of the same line is snapshotted. Everything lives on the model's device, within
:attr:`PrefixCache.budget` bytes: the snapshot used longest ago goes first, and a KV copy goes
(or is cut back) with the snapshots that read it.

:func:`resume_point` decides where a prompt starts, :meth:`PrefixCache.take` snapshots the
pipeline's live state, :func:`restore` writes a snapshot's state back into the model.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from ftlab.models import pipeline_args as check

__all__ = [
    "KVCopy",
    "PrefixCache",
    "Resume",
    "Snapshot",
    "common_prefix",
    "cuts",
    "resume_point",
    "restore",
]


def common_prefix(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int:
    """The length of the longest common prefix of token id sequences ``a`` and ``b``."""
    n = min(len(a), len(b))
    if tuple(a[:n]) == tuple(b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tuple(a[:mid]) == tuple(b[:mid]):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(eq=False)
class KVCopy:
    """The KV cache slots ``0 .. n - 1`` of every attention layer for ``tokens`` (length ``n``):
    ``k[j]``, ``v[j]`` ``[n, kv_width]`` in the model's dtype, on its device."""

    tokens: tuple[int, ...]
    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))


@dataclass(eq=False)
class Snapshot:
    """The decoding state after ``tokens``: KV slots ``0 .. len(tokens) - 1`` in ``kv`` (which
    may cover more), the recurrent buffers ``[1, ...]`` (as ``model.recurrent_state()`` lists
    them, sequence 0's row; [] for an attention-only model) and the next-token logits fp32
    ``[V]``."""

    tokens: tuple[int, ...]
    kv: KVCopy
    recurrent: list[torch.Tensor]
    logits: torch.Tensor
    used: int = field(default=0)

    @property
    def position(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """The bytes of its own tensors (the KV copy, shared, is counted once by the cache)."""
        return sum(t.numel() * t.element_size() for t in (*self.recurrent, self.logits))


@dataclass
class Resume:
    """Where a prompt of ``n`` tokens starts: ``position`` tokens come from ``source``
    (``"live"``: the pipeline's own state, nothing copied; ``"snapshot"``: copied from
    ``snapshot`` / ``kv``; ``None``: nothing reused, position 0). ``logits``: the next-token
    logits when the whole prompt is reused (``position == n``), else None."""

    position: int = 0
    source: str | None = None
    kv: KVCopy | None = None
    snapshot: Snapshot | None = None
    logits: torch.Tensor | None = None


def restore(model, resume: Resume) -> None:
    """Write ``resume``'s state into ``model``'s buffers, in place (a captured graph reads them):
    KV slots ``0 .. position - 1`` of sequence 0 and, from its snapshot, the recurrent state."""
    p = resume.position
    if resume.source != "snapshot" or p == 0:
        return
    kv = resume.kv
    for dst, src in zip([*model.cache.k, *model.cache.v], [*kv.k, *kv.v], strict=True):
        dst[:p].copy_(src[:p])
    if resume.snapshot is not None:
        for dst, src in zip(model.recurrent_state(), resume.snapshot.recurrent, strict=True):
            dst[:1].copy_(src)


class PrefixCache:
    """Snapshots of one pipeline's decoding state within ``budget`` bytes of the model's device
    memory (module docstring); ``every``: tokens between the snapshots a long prompt leaves (and
    the prefill's chunks are cut there too). ``budget=0`` keeps nothing.

    ``snapshots``: the snapshots kept, least recently used first; :attr:`nbytes` what they hold."""

    def __init__(self, budget: int = check.DEFAULT_PREFIX_CACHE_BYTES, every: int = 4096):
        self.budget = check.prefix_cache_bytes(budget)
        self.every = check.snapshot_every(every)
        self.snapshots: list[Snapshot] = []
        self._clock = itertools.count(1)

    def __repr__(self) -> str:
        return (
            f"PrefixCache({len(self.snapshots)} snapshots at positions "
            f"{[s.position for s in self.snapshots]}, {self.nbytes / 2**20:.1f} MiB of "
            f"{self.budget / 2**20:.0f} MiB, every {self.every} tokens)"
        )

    @property
    def copies(self) -> list[KVCopy]:
        """The KV copies the snapshots read, each once."""
        seen: dict[int, KVCopy] = {}
        for s in self.snapshots:
            seen.setdefault(id(s.kv), s.kv)
        return list(seen.values())

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.snapshots) + sum(c.nbytes for c in self.copies)

    def clear(self) -> None:
        self.snapshots = []

    def lookup(self, tokens: list[int], recurrent: bool) -> Resume:
        """The longest reusable prefix of ``tokens`` the snapshots hold: a snapshot's position
        when its tokens begin ``tokens``; for an attention-only model (``recurrent`` False) also
        any prefix a KV copy covers -- but for all of ``tokens``, which needs a snapshot's logits
        there. ``Resume()`` when nothing matches."""
        n, best = len(tokens), Resume()
        for s in self.snapshots:
            p = s.position
            if p <= n and p > best.position and tuple(tokens[:p]) == s.tokens:
                logits = s.logits if p == n else None
                best = Resume(p, "snapshot", s.kv, s, logits)
        if not recurrent:
            for kv in self.copies:
                p = min(common_prefix(kv.tokens, tokens), n - 1)
                if p > best.position:
                    best = Resume(p, "snapshot", kv)
        if best.snapshot is not None:
            best.snapshot.used = next(self._clock)
        return best

    def take(self, model, tokens: list[int], logits: torch.Tensor) -> Snapshot | None:
        """Snapshot ``model``'s live state after ``tokens`` (sequence 0's KV slots ``0 ..
        len(tokens) - 1`` and recurrent state now; ``logits`` fp32 ``[V]`` the next-token logits
        there); None when it does not fit the budget. The snapshots used longest ago make room."""
        t = tuple(tokens)
        p = len(t)
        if self.budget == 0 or p == 0:
            return None
        for s in self.snapshots:
            if s.tokens == t:  # already here: only used again
                s.used = next(self._clock)
                return s
        # what it needs alone (its recurrent state and logits, its KV slots unless a copy has
        # them): more than the budget, and it is not kept, nothing evicted for it
        need = logits.numel() * 4 + sum(
            x[:1].numel() * x.element_size() for x in model.recurrent_state()
        )
        if not any(len(c.tokens) >= p and c.tokens[:p] == t for c in self.copies):
            need += p * sum(x.shape[1] * x.element_size() for x in (*model.cache.k, *model.cache.v))
        if need > self.budget:
            return None
        kv = self._kv_for(model, t)
        snap = Snapshot(
            t,
            kv,
            [x[:1].clone() for x in model.recurrent_state()],
            logits.detach().float().clone(),
            next(self._clock),
        )
        self.snapshots.append(snap)
        self._fit(keep=snap)
        return snap if snap in self.snapshots else None

    def _kv_for(self, model, t: tuple[int, ...]) -> KVCopy:
        """A KV copy covering ``t``: one that already does, one of a prefix of ``t`` extended in
        place (its other snapshots read its first slots as before), or a new one."""
        p = len(t)
        for kv in self.copies:
            if len(kv.tokens) >= p and kv.tokens[:p] == t:
                return kv
        live_k = [k[:p].clone() for k in model.cache.k]
        live_v = [v[:p].clone() for v in model.cache.v]
        for kv in self.copies:
            if kv.tokens == t[: len(kv.tokens)]:
                kv.tokens, kv.k, kv.v = t, live_k, live_v
                return kv
        return KVCopy(t, live_k, live_v)

    def _fit(self, keep: Snapshot) -> None:
        """Evict the least recently used snapshots (``keep`` last) until within the budget."""
        while self.snapshots and self.nbytes > self.budget:
            others = [s for s in self.snapshots if s is not keep]
            victim = min(others, key=lambda s: s.used) if others else keep
            self.snapshots.remove(victim)
            self._trim(victim.kv)

    def _trim(self, kv: KVCopy) -> None:
        """Cut ``kv`` back to the longest position a snapshot still reads from it."""
        left = [s.position for s in self.snapshots if s.kv is kv]
        if left and max(left) < len(kv.tokens):
            p = max(left)
            kv.tokens = kv.tokens[:p]
            kv.k = [k[:p].clone() for k in kv.k]
            kv.v = [v[:p].clone() for v in kv.v]


def resume_point(
    tokens: list[int],
    live: list[int] | None,
    live_logits: torch.Tensor | None,
    cache: PrefixCache | None,
    recurrent: bool,
) -> Resume:
    """Where a prompt ``tokens`` starts: after the longest prefix that the pipeline's live state
    (``live``: the tokens it holds, None when unknown; ``live_logits`` its next-token logits)
    or ``cache`` can give back. The live state serves an attention-only model up to the prefix
    it shares with ``tokens``, a recurrent one only when all of ``live`` begins ``tokens``; the
    whole prompt is reused only with the logits after it. Ties go to the live state (nothing
    copied)."""
    n, best = len(tokens), Resume()
    if live:
        if recurrent:
            q = len(live) if len(live) <= n and tokens[: len(live)] == live else 0
        else:
            q = common_prefix(live, tokens)
        if q == n and (len(live) != n or live_logits is None):
            q = n - 1 if not recurrent else 0
        if q:
            best = Resume(q, "live", logits=live_logits if q == n else None)
    if cache is not None:
        got = cache.lookup(tokens, recurrent)
        if got.position > best.position:
            best = got
    return best


def cuts(start: int, n: int, chunk: int, every: int | None) -> list[tuple[int, int]]:
    """The forward passes of positions ``start .. n - 1``: at most ``chunk`` tokens each, cut
    also at every multiple of ``every`` (where a snapshot is taken)."""
    if start >= n:
        return []
    points = set(range(start + chunk, n, chunk))
    if every:
        points |= set(range((start // every + 1) * every, n, every))
    edges = [start, *sorted(points), n]
    return list(itertools.pairwise(edges))
