"""The drafter protocol.

A :class:`Drafter` is shared by all requests of a process (it may hold a
read-only datastore or a bounded global index). Everything that belongs to one
request lives in the :class:`DraftSession` it starts, never on the drafter.

Life of a session::

    session = drafter.start(prompt_ids)          # once per request
    loop:
        draft = session.propose(max_len)         # <= max_len tokens (may be empty)
        session.observe(new_tokens, hidden)      # tokens appended to the context this
                                                 # step (accepted draft + target token),
                                                 # for every session, chosen or not
    session.close(finished=True)                 # request ended (global indexes may learn)

A costly drafter's session (Eagle) may also offer ``preview() -> Preview | None``: the token
its next proposal would start with and its confidence in it, at a fraction of a proposal's
cost (the state it must catch up on anyway, plus one scoring of its LM head). The costaware
controller then chooses with that confidence as context, never pulls a drafter that would
decline, and learns the first token's acceptance at every round (full information).

A costly drafter's session may instead (or also) offer ``hint() -> float | None``: with no
model call, its estimate of the chance that a proposal now starts with a token the target
accepts (Eagle: a probe on the target's latest features, banditspec.eagle.probe); 0.0 when it
cannot draft now, None when it has no estimate. The controller, pulling it blind, then
uses the estimate as the pull's context and learns what each level of it really yields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from banditspec.checks import check_int
from banditspec.errors import BanditSpecValidationError

MAX_TOKEN_ID = 2**31 - 1  # token ids are INT32 in the engine contract


@dataclass
class Draft:
    """A proposal.

    token_ids: int32 [gamma]          proposed continuation of the current context
    probs:     float32 [gamma, vocab] or None: the drafter's distribution per position
               (None: deterministic drafter, q is a point mass on token_ids)
    match_len: the drafter's confidence as the length of the context match behind the
               proposal (PLD n-gram, suffix depth, REST match); the controller's context
    """

    token_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    probs: np.ndarray | None = None
    match_len: int = 0  # how long a context match the proposal came from (0: unknown)

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass(frozen=True)
class Preview:
    """The first token a costly drafter's next proposal would hold, and its confidence in it
    (the drafter's own probability, in [0, 1]); ``cut_off``: below this confidence its
    proposal would be empty (it declines)."""

    token: int
    confidence: float
    cut_off: float = 0.0

    @property
    def declines(self) -> bool:
        return self.confidence < self.cut_off


class DraftSession(Protocol):
    def propose(self, max_len: int) -> Draft:
        """Propose at most ``max_len`` tokens continuing prompt + everything observed."""

    def observe(self, new_tokens: Sequence[int], hidden_states: np.ndarray | None = None) -> None:
        """Append the tokens the target produced this step.

        hidden_states: float32 [n >= len(new_tokens), hidden] or None (see VerifyResult):
        the last len(new_tokens) rows produced new_tokens; leading rows (first step only)
        produced prompt tokens 1.. of the prompt."""

    def close(self, finished: bool) -> None:
        """End of request; ``finished`` is False when it was cancelled or failed."""


class PreviewingSession(DraftSession, Protocol):
    def preview(self) -> Preview | None:
        """The first token of the next proposal and the drafter's confidence (None: none now)."""


@dataclass(frozen=True)
class DrafterTraits:
    """What the decoding loop and the costaware controller know about a drafter, declared by
    the drafter (the defaults: a cheap text lookup proposed on the deadline thread).

    costly: a proposal costs a model call (Eagle, a draft engine): the costaware controller
        drafts with it only when it chooses it, and learns its time into the cost model.
    proposes_lazily: cheap, but its lookup costs several times the others' (REST): it proposes
        only when its most favourable context could beat what the others offer.
    previews: its sessions offer ``preview()`` and the controller should ask for it.
    needs_hidden_states: it reads the target's states (the loop asks the target for them).
    runs_inline: bounded in-process work, no I/O that could hang: proposed on the request's
        thread rather than the deadline thread (a late proposal still drops the arm).
    prompt_window: it reads the target's states of only the prompt's latest positions
        (None: the whole prompt).
    feature_layers: the target states it reads (``VerifyRequest.hidden_layers``; (): the last).
    """

    costly: bool = False
    proposes_lazily: bool = False
    previews: bool = False
    needs_hidden_states: bool = False
    runs_inline: bool = False
    prompt_window: int | None = None
    feature_layers: tuple[int, ...] = ()

    @property
    def drafts_when_chosen(self) -> bool:
        """Proposes only when chosen (a model call, or the target's states, behind each proposal)."""
        return self.costly or self.needs_hidden_states


TEXT_LOOKUP = DrafterTraits(runs_inline=True)  # an in-memory lookup: proposed without the deadline thread


class Drafter(Protocol):
    name: str  # "pld", "suffix", "rest", "copy", "eagle", "draft"

    traits: DrafterTraits

    def start(self, prompt_ids: Sequence[int]) -> DraftSession: ...


# -- helpers every drafter shares ----------------------------------------------------------


def validated_tokens(values: Sequence[int] | np.ndarray, field: str) -> list[int]:
    """Token ids as a list of Python ints; ``values`` must be a 1-D sequence of ints in [0, 2**31)."""
    if type(values) is list and all(type(v) is int for v in values):
        # the common case (a step's tokens, a prompt as a list): checked without numpy's
        # per-call overhead (~10 us against ~1 for a step's few tokens, and every drafter
        # observes every step)
        if values and (min(values) < 0 or max(values) > MAX_TOKEN_ID):
            raise BanditSpecValidationError(field, f"token ids must be in [0, {MAX_TOKEN_ID}]")
        return list(values)
    array = np.asarray(values)
    if array.size == 0:
        return []
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise BanditSpecValidationError(field, f"expected a 1-D sequence of integer token ids, got shape {array.shape} dtype {array.dtype}")
    if int(array.min()) < 0 or int(array.max()) > MAX_TOKEN_ID:
        raise BanditSpecValidationError(field, f"token ids must be in [0, {MAX_TOKEN_ID}]")
    return array.tolist()


def validated_max_len(max_len: int) -> int:
    """``max_len`` as an int >= 0 (0 asks for an empty draft)."""
    if type(max_len) is int and max_len >= 0:  # the common case, without the ABC check
        return max_len
    return check_int("max_len", max_len, 0)


def empty_draft() -> Draft:
    return Draft(token_ids=np.zeros(0, dtype=np.int32))


def draft_of(tokens: Sequence[int], match_len: int = 0) -> Draft:
    """A deterministic draft: token_ids int32 [len(tokens)], probs None."""
    return Draft(token_ids=np.asarray(tokens, dtype=np.int32).reshape(-1), probs=None, match_len=int(match_len))


def first_feature(prompt_len: int, prompt_window: int | None) -> int:
    """The first position whose target state a feature-reading drafter (Eagle) with a window
    of ``prompt_window`` positions on the prompt reads (None: the whole prompt)."""
    return 0 if prompt_window is None else max(0, prompt_len - prompt_window)
