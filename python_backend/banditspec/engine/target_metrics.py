"""What the target verifies per batch, as Prometheus metrics next to Triton's own.

Shows from outside the server that concurrent verification calls really share a forward
pass: ``verified_sequences / verify_batches`` is the mean batch size, and
``largest_batch`` the largest one seen. The families come from an injected factory
(``banditspec.metrics.triton_family_factory(pb_utils)`` in Triton), so this module needs
no Triton. Names:

* ``nv_banditspec_target_verify_batches``      counter: engine.verify calls (one batch each)
* ``nv_banditspec_target_verified_sequences``  counter: sequences verified
* ``nv_banditspec_target_mixed_draft_batches``  counter: batches whose sequences drafted different lengths
* ``nv_banditspec_target_draft_tokens``        counter: draft tokens offered for verification
* ``nv_banditspec_target_output_tokens``       counter: tokens the target produced (accepted + its own)
* ``nv_banditspec_target_largest_batch``       gauge: most sequences in one batch so far
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from banditspec.engine.contract import VerifyRequest, VerifyResult

COUNTERS = {
    "verify_batches": "Number of batches the target engine verified (one engine call each)",
    "verified_sequences": "Number of sequences the target engine verified",
    "mixed_draft_batches": "Number of verified batches whose sequences carried different numbers of draft tokens",
    "draft_tokens": "Number of draft tokens offered to the target for verification",
    "output_tokens": "Number of tokens the target produced (accepted draft tokens plus its own)",
}
LARGEST_BATCH = ("largest_batch", "Most sequences the target verified in one batch")
PREFIX = "nv_banditspec_target_"


class VerifyBatchMetrics:
    """Totals of verified batches; exported through ``factory`` when one is given.
    Thread-safe. The totals are also plain attributes (``totals``, ``largest_batch``)."""

    def __init__(self, factory: Callable[[str, str, str], Any] | None, *, model: str = "target", version: str = "1"):
        self._lock = threading.Lock()
        self.totals = {name: 0 for name in COUNTERS}
        self.largest_batch = 0
        self._families: dict[str, Any] = {}
        self._metrics: dict[str, Any] = {}
        if factory is not None:
            labels = {"model": model, "version": str(version)}
            for name, description in COUNTERS.items():
                self._families[name] = factory(PREFIX + name, description, "COUNTER")
                self._metrics[name] = self._families[name].Metric(labels=labels)
            name, description = LARGEST_BATCH
            self._families[name] = factory(PREFIX + name, description, "GAUGE")
            self._metrics[name] = self._families[name].Metric(labels=labels)

    def record(self, requests: Sequence[VerifyRequest], results: Sequence[VerifyResult]) -> None:
        """One verified batch: the requests and the results the engine returned for them."""
        if not requests:
            return
        draft_lengths = [int(np.asarray(r.draft_ids).size) for r in requests]
        increments = {
            "verify_batches": 1,
            "verified_sequences": len(requests),
            "mixed_draft_batches": int(len(set(draft_lengths)) > 1),
            "draft_tokens": sum(draft_lengths),
            "output_tokens": sum(int(np.asarray(r.output_ids).size) for r in results),
        }
        with self._lock:
            for name, value in increments.items():
                self.totals[name] += value
                if name in self._metrics and value:
                    self._metrics[name].increment(value)
            if len(requests) > self.largest_batch:
                self.largest_batch = len(requests)
                if LARGEST_BATCH[0] in self._metrics:
                    self._metrics[LARGEST_BATCH[0]].set(self.largest_batch)

    def close(self) -> None:
        with self._lock:
            self._metrics.clear()  # a family must outlive its metrics
            self._families.clear()
