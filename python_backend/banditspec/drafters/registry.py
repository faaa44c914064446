"""Drafters by name, and the argument checks every drafter shares.

The drafter modules are imported lazily inside :func:`make_drafter`, so that they can
use :func:`validated_tokens` / :func:`validated_max_len` from here without a cycle.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from banditspec.drafters.base import Draft, Drafter
from banditspec.errors import BanditSpecValidationError

DRAFTER_NAMES: tuple[str, ...] = ("pld", "suffix", "rest")
MAX_TOKEN_ID = 2**31 - 1  # token ids are INT32 in the engine contract


def validated_tokens(values: Sequence[int] | np.ndarray, field: str) -> list[int]:
    """Token ids as a list of Python ints; ``values`` must be a 1-D sequence of ints in [0, 2**31)."""
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
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 0:
        raise BanditSpecValidationError("max_len", f"must be an integer >= 0, got {max_len!r}")
    return int(max_len)


def empty_draft() -> Draft:
    return Draft(token_ids=np.zeros(0, dtype=np.int32))


def draft_of(tokens: Sequence[int], match_len: int = 0) -> Draft:
    """A deterministic draft: token_ids int32 [len(tokens)], probs None."""
    return Draft(token_ids=np.asarray(tokens, dtype=np.int32).reshape(-1), probs=None, match_len=int(match_len))


def make_drafter(name: str, *, tokenizer: Any = None, rest_datastore: Path | None = None, **options: Any) -> Drafter:
    """A drafter shared by all requests of a process.

    name: one of :data:`DRAFTER_NAMES`. options: keyword arguments of the drafter's class
    (e.g. ``max_ngram`` for pld, ``max_depth``/``alpha`` for suffix, ``max_suffix`` for rest).
    rest_datastore: the REST datastore folder (configuration, never a request); when None the
    default datastore is built once (needs ``tokenizer``, default: the SmolLM2 tokenizer).
    """
    if name == "pld":
        from banditspec.drafters.pld import PromptLookupDrafter

        factory: Any = PromptLookupDrafter
    elif name == "suffix":
        from banditspec.drafters.suffix_tree import SuffixTreeDrafter

        factory = SuffixTreeDrafter
    elif name == "rest":
        from banditspec.drafters.rest import RestDrafter
        from banditspec.drafters.rest_datastore import default_datastore

        if rest_datastore is None:
            if tokenizer is None:
                from banditspec.engine.models import load_tokenizer

                tokenizer = load_tokenizer("smollm2")
            rest_datastore = default_datastore(tokenizer)
        options = {"datastore": Path(rest_datastore), **options}
        factory = RestDrafter
    else:
        raise BanditSpecValidationError("arms", f"unknown drafter {name!r}; expected one of {', '.join(DRAFTER_NAMES)}")
    accepted = set(inspect.signature(factory).parameters)
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise BanditSpecValidationError("arms", f"drafter {name!r} takes no option(s) {', '.join(unknown)}")
    return factory(**options)
