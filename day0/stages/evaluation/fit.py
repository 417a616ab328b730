"""A forward's rows sized to what the stage's memory budget leaves, measured, not guessed.

lm-eval hands the model a batch of rows (its batch size, chosen from batch_tokens before any
memory is known). The stage's runner kills it when its resident memory passes its budget
(day0.execution.budget), so a batch that does not fit must run in smaller chunks of rows. How much a row
costs depends on the model, the dtype, the attention kernel and the allocator; it is measured:
each chunk's peak (VmHWM, reset before it) over the memory it started from gives the cost per
token, and the next chunk holds as many rows as fit in HEADROOM of the budget at the worst cost
seen. Before anything is measured, a batch runs whole when a generous prior (activations of a
few hidden and intermediate vectors per token in float32) leaves half the room unused, as with
the default budgets: the same forwards, and the same numbers, as without fitting; else its first
chunk is one row. A bf16 forward's numbers depend on the shapes it runs at (to its rounding),
so chunked rows can differ from rows run whole in their last bits.
"""

from __future__ import annotations

import os
from typing import Callable, TypeVar

from day0.execution.memory import peak_rss_bytes, reset_peak_rss, rss_bytes

HEADROOM = 0.85  # of the budget: the runner samples memory, a chunk's peak is not exact

Part = TypeVar("Part")


class RowFitter:
    """Runs a forward of `rows` rows of `width` tokens in chunks that fit `budget_bytes`."""

    def __init__(self, budget_bytes: int | None, prior_per_token: float = 0.0):
        self.budget = budget_bytes
        self.prior = prior_per_token  # bytes per row-token assumed before any measurement
        self.per_token: float | None = None  # the worst bytes per row-token seen
        self.chunks = 0  # forwards run (a batch that fits is one chunk after the first)

    def enabled(self) -> bool:
        return self.budget is not None

    def rows_fitting(self, width: int, left: int) -> int:
        room = self.budget * HEADROOM - rss_bytes(os.getpid())
        if self.per_token is None:  # nothing measured yet: whole when the prior says so
            return left if self.prior and self.prior * width * left <= room / 2 else 1
        return max(1, min(left, int(room // max(self.per_token * width, 1.0))))

    def run(self, rows: int, width: int, forward: Callable[[int, int], Part]) -> list[Part]:
        """forward(start, stop) for consecutive chunks covering rows [0, rows)."""
        if not self.enabled() or not reset_peak_rss():
            self.chunks += 1
            return [forward(0, rows)]
        parts: list[Part] = []
        start = 0
        while start < rows:
            count = self.rows_fitting(width, rows - start)
            before = rss_bytes(os.getpid())
            reset_peak_rss()
            parts.append(forward(start, start + count))
            cost = max(peak_rss_bytes() - before, 0) / (count * max(width, 1))
            self.per_token = max(self.per_token or 0.0, cost)
            self.chunks += 1
            start += count
        return parts


def prior_per_token(config) -> float:
    """Generous bytes per row-token of a decoder forward: float32 copies of a few hidden-size
    and intermediate-size vectors (the transients of one layer, attention and MLP)."""
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    inner = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
    return 4.0 * 2 * (4 * hidden + 2 * inner)


__all__ = ["RowFitter", "HEADROOM", "prior_per_token"]
