"""Server-wide speculation budget: the hook through which a load-aware controller caps
every sequence's speculation length (paper §6.2).

The decoding loop asks :meth:`gamma_cap` before drafting and reports each finished step
to :meth:`record_step`. :class:`UnlimitedBudget` is the null object (no cap)."""

from __future__ import annotations

from typing import Protocol


class SpeculationBudget(Protocol):
    def gamma_cap(self) -> int:
        """Most draft tokens any sequence may propose in its next step (0 = plain decoding)."""

    def record_step(self, gamma: int, tokens: int, seconds: float) -> None:
        """One sequence finished a step: drafted ``gamma``, produced ``tokens`` in ``seconds``."""


class UnlimitedBudget:
    def gamma_cap(self) -> int:
        return 1 << 30

    def record_step(self, gamma: int, tokens: int, seconds: float) -> None:
        return None
