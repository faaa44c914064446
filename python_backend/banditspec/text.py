"""Text <-> tokens around the decoding loop (tokenizer-agnostic helpers)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from banditspec.config import check_prompt
from banditspec.errors import BanditSpecValidationError

CHAT_ROLES = ("system", "user", "assistant")


def render_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]], *, reply: bool = True) -> str:
    """The text of a chat in the model's chat template: ``messages`` are ``{"role", "content"}``
    (role system, user or assistant; content a string); ``reply``: the assistant's turn is opened
    after them (a prompt), else the chat ends with its last message (training text).

    The one renderer of chats: the server's single-turn prompts (:func:`prompt_ids`), the OpenAI
    API's chats and the Eagle training text all go through it, so their prompts cannot drift.
    Tokenize the text with :func:`text_ids` (a rendered chat carries its own special tokens)."""
    turns = []
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise BanditSpecValidationError("messages", f"message {i}: role must be one of {', '.join(CHAT_ROLES)}, "
                                            f"got {role!r}")
        if not isinstance(content, str):
            raise BanditSpecValidationError("messages", f"message {i}: content must be a string")
        turns.append({"role": role, "content": content})
    return tokenizer.apply_chat_template(turns, add_generation_prompt=reply, tokenize=False)


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as it is: no special tokens added."""
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def prompt_ids(tokenizer: Any, text: str, *, chat: bool) -> list[int]:
    """Token ids of a prompt; with ``chat`` the text is one user turn in the model's chat template
    (when it has one), rendered by :func:`render_chat`."""
    check_prompt(text if isinstance(text, str) else None)
    if chat and getattr(tokenizer, "chat_template", None):
        text = render_chat(tokenizer, [{"role": "user", "content": text}])
    return text_ids(tokenizer, text)


def stop_sequences(tokenizer: Any, words: Sequence[str]) -> list[list[int]]:
    """Token sequences of stop words (each tokenized on its own, as TensorRT-LLM does)."""
    out = []
    for word in words:
        if not isinstance(word, str) or word == "":
            raise BanditSpecValidationError("stop_words", "stop words must be non-empty strings")
        out.append(text_ids(tokenizer, word))
    return out


def bad_word_sequences(tokenizer: Any, words: Sequence[str]) -> list[list[int]]:
    """Token sequences of bad words: each tokenized on its own without special tokens, a word
    of no tokens skipped (TensorRT-LLM's preprocessing does the same)."""
    return [ids for word in words if (ids := text_ids(tokenizer, word))]


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas whose concatenation is
    exactly ``tokenizer.decode(all ids)``. A trailing incomplete UTF-8 character
    (decoded as U+FFFD) is held back until the next token completes it."""

    def __init__(self, tokenizer: Any) -> None:
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
