"""Wall-clock times of a streamed generation (:func:`ftlab.models.pipeline.timed_generate`): the
prefill's, the first decode step's (a decode graph's warm-up and capture happen there) and the
steady decode rate after them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Timing", "timed"]


@dataclass
class Timing:
    """Wall-clock times of a generation so far: ``tokens`` generated in ``seconds``; the first
    came ``first_token_s`` after the call (the prefill), the second ``first_step_s`` after the
    first (the first decode step: a decode graph's warm-up and capture happen there)."""

    tokens: int
    seconds: float
    first_token_s: float
    first_step_s: float | None = None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """The steady decode rate: the tokens after the second over their time (None before a
        third token)."""
        if self.first_step_s is None or self.tokens < 3:
            return None
        return (self.tokens - 2) / (self.seconds - self.first_token_s - self.first_step_s)

    def summary(self) -> str:
        parts = [
            f"{self.tokens} token{'s' if self.tokens != 1 else ''}",
            f"first after {self.first_token_s:.3f} s (prefill)",
        ]
        if self.first_step_s is not None:
            parts.append(f"first decode step {self.first_step_s:.3f} s")
        if self.decode_tokens_per_s is not None:
            parts.append(f"then {self.decode_tokens_per_s:.1f} tokens/s")
        return ", ".join(parts)


def timed(pieces: Iterator[str]) -> Iterator[tuple[str, Timing]]:
    """Each piece of a streamed generation with the :class:`Timing` so far, the clock started
    when the first piece is asked for (a lazy generation's prefill runs then)."""
    start = time.perf_counter()
    first = second = None
    for n, piece in enumerate(pieces, start=1):
        now = time.perf_counter() - start
        if n == 1:
            first = now
        elif n == 2:
            second = now - first
        yield piece, Timing(n, now, first, second)
