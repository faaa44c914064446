"""Keep prefills out of the decoding batch.

A decoding step brings gamma + 1 new tokens, a new request brings its whole prompt
(hundreds). In a padded batch (:mod:`banditspec.engine.reference` on kernels other than the
panel ones) every sequence's new tokens are padded to the longest, so one new request in a
batch of sixteen decoding sequences makes the pass compute sixteen prompts' worth of
positions; in a packed one (the panel kernels) it still makes every decoding step of the
pass wait for a prompt's worth of rows. Under a steady arrival of requests nearly every
batch holds one, and throughput collapses.

:class:`ContinuationSplitter` tells the two kinds apart without looking inside the
engine: after a sequence is verified, the next call of that sequence carries exactly
``input_ids + output_ids``, so the splitter remembers the length and the last tokens of
that continuation. A request that matches is a decoding step; any other is a new sequence
(a prefill). The target then runs two passes: the continuations together, the new
sequences together. Forgetting (a bounded LRU) only costs a misplaced request, never a
wrong result: grouping does not change what a sequence gets.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from banditspec.checks import is_int
from banditspec.engine.contract import VerifyRequest, VerifyResult
from banditspec.errors import BanditSpecValidationError

TAIL = 16  # tokens of a sequence's end that identify it (with its length)


def _key(tokens: np.ndarray) -> tuple[int, bytes]:
    """(length, bytes of the last TAIL token ids as int32) of a token sequence."""
    tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
    return len(tokens), tokens[-TAIL:].tobytes()


class ContinuationSplitter:
    """Not thread-safe: one per model instance (Triton calls ``execute`` from one thread).

    capacity: how many expected continuations to remember (oldest forgotten first).
    """

    def __init__(self, capacity: int = 4096):
        if not is_int(capacity) or capacity < 1:
            raise BanditSpecValidationError("capacity", f"must be an integer >= 1, got {capacity!r}")
        self.capacity = capacity
        self._expected: OrderedDict[tuple[int, bytes], None] = OrderedDict()

    def is_continuation(self, request: VerifyRequest) -> bool:
        return _key(request.input_ids) in self._expected

    def split(self, requests: Sequence[VerifyRequest]) -> list[list[int]]:
        """Indices of ``requests`` in groups to verify separately: continuations first,
        then new sequences; empty groups left out."""
        return [group for _, group in self.passes(requests)]

    def passes(self, requests: Sequence[VerifyRequest]) -> list[tuple[bool, list[int]]]:
        """:meth:`split`'s groups, each with whether it is the group of new sequences (a
        prefill pass)."""
        continuing: list[int] = []
        fresh: list[int] = []
        for i, request in enumerate(requests):
            (continuing if self.is_continuation(request) else fresh).append(i)
        return [(prefill, group) for prefill, group in ((False, continuing), (True, fresh)) if group]

    def observe(self, request: VerifyRequest, result: VerifyResult) -> None:
        """Remember what ``request``'s sequence will look like at its next step."""
        self._expected.pop(_key(request.input_ids), None)  # that step is done
        following = np.concatenate(
            [np.asarray(request.input_ids, dtype=np.int32).reshape(-1), np.asarray(result.output_ids, dtype=np.int32).reshape(-1)]
        )
        key = _key(following)
        self._expected[key] = None
        self._expected.move_to_end(key)
        while len(self._expected) > self.capacity:
            self._expected.popitem(last=False)

    def __len__(self) -> int:
        return len(self._expected)
