"""Text <-> tokens around the decoding loop (tokenizer-agnostic helpers)."""

from __future__ import annotations

from typing import Sequence

from banditspec.config import check_prompt
from banditspec.errors import BanditSpecValidationError


def prompt_ids(tokenizer, text: str, *, chat: bool) -> list[int]:
    """Token ids of a prompt; with ``chat`` the text is one user turn in the model's chat template."""
    check_prompt(text if isinstance(text, str) else None)
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def stop_sequences(tokenizer, words: Sequence[str]) -> list[list[int]]:
    """Token sequences of stop words (each tokenized on its own, as TensorRT-LLM does)."""
    out = []
    for word in words:
        if not isinstance(word, str) or word == "":
            raise BanditSpecValidationError("stop_words", "stop words must be non-empty strings")
        out.append([int(t) for t in tokenizer(word, add_special_tokens=False)["input_ids"]])
    return out


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas whose concatenation is
    exactly ``tokenizer.decode(all ids)``. A trailing incomplete UTF-8 character
    (decoded as U+FFFD) is held back until the next token completes it."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._emitted = ""

    def push(self, new_ids: Sequence[int], final: bool = False) -> str:
        self._ids.extend(int(t) for t in new_ids)
        text = self._tokenizer.decode(self._ids, skip_special_tokens=True)
        if not final:
            text = text.rstrip("\ufffd")
        if not text.startswith(self._emitted):
            # Decoding is not prefix-stable here (rare): emit nothing until it is again.
            return "" if not final else text[len(self._emitted):]
        delta = text[len(self._emitted):]
        self._emitted = text
        return delta

    @property
    def text(self) -> str:
        return self._emitted
