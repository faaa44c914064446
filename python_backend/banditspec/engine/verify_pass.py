"""One engine pass, timed and described to its callers (:class:`~banditspec.engine.contract.VerifyPass`).

The reference target verifies what Triton's batcher hands it in passes (decoding steps
together, new sequences apart: :mod:`banditspec.engine.prefill_split`). What a pass of R
rows costs is what the controller prices a draft by under load
(:class:`~banditspec.bandits.cost_model.BatchCost`); only the target sees a pass whole, so it
says so in every answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from banditspec.engine.contract import Engine, VerifyPass, VerifyRequest, VerifyResult

SERIAL_MODULUS = 2**52  # a serial travels as a float64: exact below 2**53


class PassTimer:
    """Not thread-safe: one per target model instance (Triton calls ``execute`` from one thread)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self.serial = 0

    def verify(self, engine: Engine, batch: Sequence[VerifyRequest], *, prefill: bool) -> list[VerifyResult]:
        """``engine.verify(batch)``, each result told the pass it was verified in."""
        began = self._clock()
        results = engine.verify(batch)
        seconds = self._clock() - began
        self.serial = (self.serial + 1) % SERIAL_MODULUS
        fed = [1 + int(np.asarray(r.draft_ids).size) for r in batch]
        contexts = [int(np.asarray(r.input_ids).size) for r in batch]
        rows = sum(fed)
        # what a padded pass computed; an engine that packs its rows pads nothing (and says 0)
        ranked = [] if getattr(engine, "packs_rows", False) else sorted(fed, reverse=True)
        facts = VerifyPass(
            serial=self.serial, prefill=prefill, sequences=len(batch), rows=rows,
            produced=sum(int(np.asarray(r.output_ids).size) for r in results),
            context=sum(k * c for k, c in zip(fed, contexts)) / rows if rows else 0.0, seconds=seconds,
            longest=ranked[0] if ranked else 0, runner_up=ranked[1] if len(ranked) > 1 else 0,
            deepest=max(contexts, default=0) if ranked else 0,
        )
        for result in results:
            result.verified_in = facts
        return results
