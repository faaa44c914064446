"""A pure-numpy target for unit tests of the decoding loop.

The "model" is a fixed function of the last two tokens, so greedy decoding is
known in closed form; the engine counts its calls and checks the contract.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from banditspec.engine.contract import VerifyRequest, VerifyResult


def next_token(prev2: int, prev1: int, vocab: int, eos_id: int, eos_after: int | None, position: int) -> int:
    if eos_after is not None and position >= eos_after:
        return eos_id
    token = (prev2 * 31 + prev1 * 17 + 7) % vocab
    return token if token != eos_id else (token + 1) % vocab


class MockEngine:
    """Greedy verification against :func:`next_token`."""

    provides_hidden_states = False

    def __init__(self, vocab_size: int = 50, max_context: int = 512, eos_id: int = 0, eos_after: int | None = None):
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.eos_id = eos_id
        self.eos_after = eos_after  # emit EOS once the sequence is this long
        self.calls = 0
        self.verified_draft_tokens = 0

    def target(self, seq: Sequence[int]) -> int:
        prev2 = seq[-2] if len(seq) >= 2 else 0
        return next_token(prev2, seq[-1], self.vocab_size, self.eos_id, self.eos_after, len(seq))

    def verify(self, requests: Sequence[VerifyRequest]) -> list[VerifyResult]:
        results = []
        for req in requests:
            self.calls += 1
            seq = [int(t) for t in req.input_ids]
            draft = [int(t) for t in req.draft_ids]
            assert len(seq) + len(draft) + 1 <= self.max_context, "context overflow"
            # -1 = no hidden states, else a position of the input (the reference engine refuses others)
            assert req.hidden_from == -1 or 0 <= req.hidden_from < len(seq), "hidden_from outside the contract"
            self.verified_draft_tokens += len(draft)
            out, accepted = [], 0
            for token in draft:
                expected = self.target(seq)
                if token != expected:
                    break
                out.append(token)
                seq.append(token)
                accepted += 1
                if token == req.end_id:
                    break
            if not out or out[-1] != req.end_id:
                out.append(self.target(seq))
            results.append(VerifyResult(np.asarray(out, dtype=np.int32), accepted))
        return results

    def fresh_tokens(self, request: VerifyRequest) -> int:
        """What verifying ``request`` feeds (no prefix cache here: all of it)."""
        return int(np.asarray(request.input_ids).size + np.asarray(request.draft_ids).size)

    def vanilla(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        seq, out = list(prompt), []
        while len(out) < max_tokens:
            token = self.target(seq)
            if token == self.eos_id:
                break
            seq.append(token)
            out.append(token)
        return out
