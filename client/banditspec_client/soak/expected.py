"""The soak's expected text: plain greedy decoding of the target in this process.

Written apart from the code the soak checks: the target engine is called one token at a time
through its verify contract (no drafter, no policy, no decoding loop of ``banditspec.decoding.session``),
and the stop rule is applied by :func:`cut_at_stop`, a separate implementation of what the
server promises: generation ends at EOS (not emitted), at the end of the first stop word (the stop
word not emitted; each stop word is tokenized on its own, as TensorRT-LLM does) or after
``max_tokens`` tokens. Only the prompt's token ids come from the server's own function,
``banditspec.text.prompt_ids``, so that both sides build the same chat-templated prompt.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any


def cut_at_stop(tokens: Sequence[int], stops: Sequence[Sequence[int]], max_tokens: int) -> list[int]:
    """``tokens`` (plain decoding, EOS already left out) as the server returns them under
    ``stops`` (token sequences) and ``max_tokens``."""
    out: list[int] = []
    for token in tokens:
        out.append(int(token))
        for stop in stops:
            if stop and len(out) >= len(stop) and out[len(out) - len(stop):] == list(stop):
                return out[: len(out) - len(stop)]
        if len(out) >= max_tokens:
            break
    return out


class VanillaReference:
    """Text of plain greedy decoding with the server's model, memoised; thread-safe."""

    def __init__(self, model: str, max_context: int = 2048) -> None:
        from banditspec.engine.reference import ReferenceEngine

        self._engine = ReferenceEngine.from_name(model, max_context=max_context)
        self._tokenizer: Any = self._engine.tokenizer
        self._lock = threading.Lock()
        self._greedy: dict[tuple[str, int], list[int]] = {}
        self._memo: dict[tuple[str, int, tuple[str, ...]], str] = {}

    def _plain_tokens(self, prompt: str, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` greedy tokens, one target call each, stopping before EOS."""
        import numpy as np
        from banditspec.engine.contract import VerifyRequest
        from banditspec.text import prompt_ids

        sequence = prompt_ids(self._tokenizer, prompt, chat=True)
        generated: list[int] = []
        no_draft = np.zeros(0, dtype=np.int32)
        while len(generated) < max_tokens:
            (result,) = self._engine.verify([VerifyRequest(np.asarray(sequence, dtype=np.int32), no_draft)])
            token = int(result.output_ids[0])
            if token == self._engine.eos_id:
                break
            sequence.append(token)
            generated.append(token)
        return generated

    def token_ids(self, prompt: str, max_tokens: int, stop_words: tuple[str, ...] = ()) -> list[int]:
        with self._lock:
            key = (prompt, max_tokens)
            if key not in self._greedy:
                self._greedy[key] = self._plain_tokens(prompt, max_tokens)
            stops = [self._tokenizer(word, add_special_tokens=False)["input_ids"] for word in stop_words]
            return cut_at_stop(self._greedy[key], stops, max_tokens)

    def text(self, prompt: str, max_tokens: int, stop_words: tuple[str, ...] = ()) -> str:
        key = (prompt, max_tokens, stop_words)
        with self._lock:
            if key in self._memo:
                return self._memo[key]
        text = self._tokenizer.decode(self.token_ids(prompt, max_tokens, stop_words), skip_special_tokens=True)
        with self._lock:
            self._memo[key] = text
        return text
