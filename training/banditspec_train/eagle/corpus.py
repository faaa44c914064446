"""Training text for the Eagle head: token sequences that are in no benchmark prompt set.

* chat: ShareGPT conversations of the TRAIN split only (``sharegpt_split("train")``),
  rendered with the target's chat template (human -> user, gpt -> assistant);
* code: windows of Python's own standard library sources, starting at a top-level
  ``def``/``class``, shown as an assistant's fenced code answer. HumanEval is never used.

Everything is chosen by a seeded shuffle, so the same arguments give the same sequences.
"""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from banditspec.errors import BanditSpecValidationError
from banditspec.text import render_chat, text_ids

USER_CHARS = 1200  # long user turns are cut so that the assistant's answer fits in max_len
ROLES = {"human": "user", "gpt": "assistant"}


@dataclass(frozen=True)
class CorpusSpec:
    chat_tokens: int = 0
    code_tokens: int = 0
    max_len: int = 512
    min_len: int = 48
    seed: int = 0
    aux_layers: tuple[int, ...] = ()  # decoder layers whose outputs are kept too (EAGLE-3), as DistillSpec

    def __post_init__(self) -> None:
        for name in ("chat_tokens", "code_tokens"):
            if getattr(self, name) < 0:
                raise BanditSpecValidationError(name, "must be >= 0")
        if any(int(a) < 0 for a in self.aux_layers):
            raise BanditSpecValidationError("aux_layers", f"layer indices must be >= 0, got {self.aux_layers}")
        if self.min_len < 2 or self.max_len < self.min_len:
            raise BanditSpecValidationError("max_len", "need 2 <= min_len <= max_len")


@dataclass
class TrainingSequence:
    """One training sequence: token ids (int list) and the first pair index that counts in the loss."""

    token_ids: list[int]
    loss_from: int
    kind: str  # "chat" | "code"


def _chat_messages(conversation: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    messages = []
    for role, text in conversation:
        if role not in ROLES:
            break
        if role == "human":
            text = text[:USER_CHARS]
        messages.append({"role": ROLES[role], "content": text})
    return messages


def system_prefix_len(tokenizer: Any) -> int:
    """Tokens of the template's default system turn (identical in every chat: not trained on)."""
    probe = render_chat(tokenizer, [{"role": "user", "content": "x"}], reply=False)
    head = probe[: probe.index("<|im_start|>user")] if "<|im_start|>user" in probe else ""
    return len(text_ids(tokenizer, head))


def _sequence(tokenizer: Any, messages: list[dict[str, str]], spec: CorpusSpec, prefix: int, kind: str) -> TrainingSequence | None:
    """A finished chat as one training sequence (cut to max_len; None when under min_len); the
    template's system turn (``prefix`` tokens) is not trained on."""
    ids = text_ids(tokenizer, render_chat(tokenizer, messages, reply=False))[: spec.max_len]
    if len(ids) < spec.min_len:
        return None
    return TrainingSequence(ids, loss_from=min(prefix, len(ids) - 2), kind=kind)


def chat_sequences(tokenizer: Any, spec: CorpusSpec) -> list[TrainingSequence]:
    from banditspec.datasets import sharegpt_split

    conversations = [c for c in sharegpt_split("train") if c and c[0][0] == "human"]
    random.Random(spec.seed).shuffle(conversations)
    prefix = system_prefix_len(tokenizer)
    out, total = [], 0
    for conversation in conversations:
        if total >= spec.chat_tokens:
            break
        messages = _chat_messages(conversation)
        sequence = _sequence(tokenizer, messages, spec, prefix, "chat") if len(messages) >= 2 else None
        if sequence is not None:
            out.append(sequence)
            total += len(sequence.token_ids)
    return out


def _code_windows(source: str, max_chars: int) -> list[str]:
    lines = source.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(("def ", "class "))]
    windows = []
    for start in starts:
        text, i = "", start
        while i < len(lines) and len(text) < max_chars:
            text += lines[i] + "\n"
            i += 1
        windows.append(text)
    return windows


def code_sequences(tokenizer: Any, spec: CorpusSpec) -> list[TrainingSequence]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py"))
    files = [p for p in files if "test" not in p.parts[-2:] and not p.name.startswith("test")]
    rng = random.Random(spec.seed + 1)
    rng.shuffle(files)
    prefix = system_prefix_len(tokenizer)
    out, total = [], 0
    for path in files:
        if total >= spec.code_tokens:
            break
        windows = _code_windows(path.read_text(encoding="utf-8", errors="replace"), 4 * spec.max_len)
        if not windows:
            continue
        code = rng.choice(windows)
        first = code.splitlines()[0].rstrip(":")
        messages = [
            {"role": "user", "content": f"Write the Python `{first}` from the module {path.stem}."},
            {"role": "assistant", "content": f"```python\n{code}```"},
        ]
        sequence = _sequence(tokenizer, messages, spec, prefix, "code")
        if sequence is not None:
            out.append(sequence)
            total += len(sequence.token_ids)
    return out


def build_corpus(tokenizer: Any, spec: CorpusSpec) -> list[TrainingSequence]:
    """Chat then code sequences, deterministic for a given spec."""
    return chat_sequences(tokenizer, spec) + code_sequences(tokenizer, spec)


def token_frequencies(tokenizer: Any, seed: int, max_conversations: int = 6000) -> list[int]:
    """Counts per target id (list of vocab size) over a larger slice of training text
    (ShareGPT train conversations + stdlib code), for choosing the draft vocabulary."""
    import numpy as np
    from banditspec.datasets import sharegpt_split

    counts = np.zeros(len(tokenizer), dtype=np.int64)
    conversations = [c for c in sharegpt_split("train") if c and c[0][0] == "human"]
    random.Random(seed + 2).shuffle(conversations)
    texts = []
    for conversation in conversations[:max_conversations]:
        messages = _chat_messages(conversation)
        if messages:
            texts.append(render_chat(tokenizer, messages, reply=False))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts += [p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))]
    for ids in tokenizer(texts, add_special_tokens=False).input_ids:
        np.add.at(counts, np.asarray(ids, dtype=np.int64), 1)
    return counts.tolist()
