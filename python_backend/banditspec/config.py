"""Arms, limits and the validation of a generation request.

An *arm* is a drafter with its speculation setting, written ``DRAFTER`` (speculation
length L, the request's maximum) or ``DRAFTER@GAMMA`` (e.g. ``pld@2``). ``vanilla``
is the arm that drafts nothing (gamma 0: plain decoding).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from banditspec.checks import is_int
from banditspec.errors import BanditSpecValidationError

VANILLA_ARM = "vanilla"
MAX_SPECULATION_LENGTH = 16  # upper bound for L (TensorRT-LLM engines are built with max_draft_len <= this)
# The L a request gets when it names none. The default controller chooses gamma per round
# (0..L), so L is only its ceiling: with the flat verify curve of the panel kernels, a long
# copy (code edits) pays up to 8 tokens a round.
DEFAULT_MAX_DRAFT_LEN = 8
# The one default policy: cost-aware, full-information, warm-started. Every policy name, and
# what a policy string and an arm list turn into, is in banditspec.bandits.registry.
DEFAULT_POLICY = "costaware"
REWARD_CHOICES = ("accepted", "throughput")
# A drawn seed stays below 2**53 so that every JSON reader (a double in JavaScript) reads the
# reported seed back exactly, and sending it again reproduces the text.
FRESH_SEED_BITS = 53


def fresh_seed() -> int:
    """A seed for a request that names none: drawn from the OS's randomness, so two such
    requests draw different samples (reported in speculation_stats, so the text can be reproduced)."""
    return secrets.randbits(FRESH_SEED_BITS)


def split_arm(text: str) -> tuple[str, str]:
    """The one reading of the arm syntax ``drafter[@gamma]`` (also ``policy[@L]`` for a
    benchmark's method): ``pld@2`` -> ("pld", "2"); ``pld`` -> ("pld", "")."""
    name, _, gamma = text.partition("@")
    return name, gamma


def arm_drafter(text: str) -> str:
    """``pld@2`` -> ``pld``; ``pld`` -> ``pld``."""
    return split_arm(text)[0]


def arm_text(drafter: str, gamma: int) -> str:
    """The arm ``drafter`` at ``gamma`` as the arm syntax writes it (``pld@2``)."""
    return f"{drafter}@{gamma}"


@dataclass(frozen=True)
class ArmSpec:
    """One arm: ``drafter`` proposes up to ``gamma`` tokens per step."""

    drafter: str  # "pld", "suffix", "rest", "eagle"; "" for the vanilla arm
    gamma: int

    @property
    def name(self) -> str:
        return VANILLA_ARM if not self.drafter else arm_text(self.drafter, self.gamma)


def parse_arm(text: str, max_draft_len: int, known_drafters: Sequence[str]) -> ArmSpec:
    """``pld`` -> ArmSpec("pld", L); ``pld@2`` -> ArmSpec("pld", 2); ``vanilla`` -> gamma 0."""
    text = text.strip()
    if text == VANILLA_ARM:
        return ArmSpec("", 0)
    drafter, gamma_text = split_arm(text)
    if drafter not in known_drafters:
        raise BanditSpecValidationError(
            "arms", f"unknown arm {text!r}; available drafters: {', '.join(known_drafters) or 'none'}"
        )
    if not gamma_text:
        return ArmSpec(drafter, max_draft_len)
    try:
        gamma = int(gamma_text)
    except ValueError:
        raise BanditSpecValidationError("arms", f"arm {text!r}: speculation length must be an integer") from None
    if not 1 <= gamma <= max_draft_len:
        raise BanditSpecValidationError(
            "arms", f"arm {text!r}: speculation length must be in 1..max_draft_len={max_draft_len}"
        )
    return ArmSpec(drafter, gamma)


@dataclass(frozen=True)
class Limits:
    """Server-side limits (configuration, never request input)."""

    max_tokens: int = 1024
    max_prompt_tokens: int = 4096
    max_stop_words: int = 16
    max_stop_word_tokens: int = 32
    max_bad_words: int = 64
    max_bad_word_tokens: int = 32
    max_draft_len: int = MAX_SPECULATION_LENGTH


@dataclass
class GenerationRequest:
    """What a caller asks for; validated by :func:`validate_request`.

    prompt_ids:     int token ids of the prompt (chat template already applied by the caller)
    stop_sequences: token-id sequences; generation stops before the first occurrence
    bad_words:      banned token-id sequences: the token that would complete one gets
                    probability 0 in the target's distribution (banditspec.engine.bad_words)
    seed:           the random seed of sampling and of randomized policies; explicit here (a
                    benchmark's or replay's runs stay reproducible): the serving layer draws
                    a fresh one (:func:`fresh_seed`) for a request that names none
    arms:           arm names (see module doc); None = the decoder's default arm set
    policy:         costaware (default) | vanilla | ucbspec | exp3spec | uniform | fixed:<arm>
                    (checked and resolved with the arms by banditspec.bandits.registry)
    max_draft_len:  L, the longest speculation; an arm without ``@gamma`` drafts L tokens
    reward:         accepted (paper: accepted + 1) | throughput (cost-aware: accepted + 1
                    scaled by the step's measured time against the request's fastest step)
    """

    prompt_ids: Sequence[int]
    max_tokens: int
    policy: str = DEFAULT_POLICY
    arms: Sequence[str] | None = None
    max_draft_len: int = DEFAULT_MAX_DRAFT_LEN
    temperature: float = 0.0
    seed: int = 0
    stop_sequences: Sequence[Sequence[int]] = field(default_factory=tuple)
    reward: str = "accepted"
    bad_words: Sequence[Sequence[int]] = field(default_factory=tuple)


def check_prompt(prompt: str | Sequence[int] | None) -> None:
    """``text_input`` must say something: a text that is not blank and holds no NUL
    character (before tokenization), or a non-empty list of token ids (after)."""
    if isinstance(prompt, str):
        empty = not prompt.strip()
    else:
        empty = prompt is None or len(prompt) == 0
    if empty:
        raise BanditSpecValidationError("text_input", "the prompt is empty")
    if isinstance(prompt, str) and "\x00" in prompt:
        raise BanditSpecValidationError("text_input", "contains a NUL character")


def validate_request(req: GenerationRequest, *, max_context: int, vocab_size: int, limits: Limits) -> None:
    """Raise BanditSpecValidationError naming the first bad field."""
    check_prompt(req.prompt_ids)
    if len(req.prompt_ids) > limits.max_prompt_tokens:
        raise BanditSpecValidationError(
            "text_input", f"prompt has {len(req.prompt_ids)} tokens, the limit is {limits.max_prompt_tokens}"
        )
    if any(not 0 <= int(t) < vocab_size for t in req.prompt_ids):
        raise BanditSpecValidationError("text_input", f"token ids must be in 0..{vocab_size - 1}")
    if not is_int(req.max_tokens):
        raise BanditSpecValidationError("max_tokens", "must be an integer")
    if req.max_tokens <= 0:
        raise BanditSpecValidationError("max_tokens", f"must be >= 1, got {req.max_tokens}")
    if req.max_tokens > limits.max_tokens:
        raise BanditSpecValidationError("max_tokens", f"{req.max_tokens} exceeds the limit {limits.max_tokens}")
    if len(req.prompt_ids) + req.max_tokens > max_context:
        raise BanditSpecValidationError(
            "max_tokens",
            f"prompt ({len(req.prompt_ids)} tokens) + max_tokens ({req.max_tokens}) exceeds the "
            f"context length {max_context}",
        )
    if not is_int(req.max_draft_len):
        raise BanditSpecValidationError("max_draft_len", "must be an integer")
    if not 1 <= req.max_draft_len <= limits.max_draft_len:
        raise BanditSpecValidationError("max_draft_len", f"must be in 1..{limits.max_draft_len}, got {req.max_draft_len}")
    temperature = float(req.temperature)
    if not math.isfinite(temperature) or temperature < 0:
        raise BanditSpecValidationError("temperature", f"must be a finite number >= 0, got {req.temperature}")
    if not 0 <= int(req.seed) < 2**64:
        raise BanditSpecValidationError("random_seed", "must be in 0..2^64-1")
    if len(req.stop_sequences) > limits.max_stop_words:
        raise BanditSpecValidationError("stop_words", f"at most {limits.max_stop_words} stop words")
    for seq in req.stop_sequences:
        if not 0 < len(seq) <= limits.max_stop_word_tokens:
            raise BanditSpecValidationError(
                "stop_words", f"each stop word must be 1..{limits.max_stop_word_tokens} tokens"
            )
    if len(req.bad_words) > limits.max_bad_words:
        raise BanditSpecValidationError("bad_words", f"at most {limits.max_bad_words} bad words")
    for seq in req.bad_words:
        if not 0 < len(seq) <= limits.max_bad_word_tokens:
            raise BanditSpecValidationError("bad_words", f"each bad word must be 1..{limits.max_bad_word_tokens} tokens")
        if any(not 0 <= int(t) < vocab_size for t in seq):
            raise BanditSpecValidationError("bad_words", f"token ids must be in 0..{vocab_size - 1}")
    if req.reward not in REWARD_CHOICES:
        raise BanditSpecValidationError("reward", f"unknown reward {req.reward!r}; choose from {REWARD_CHOICES}")
