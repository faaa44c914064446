"""Benchmark workloads: fixed, seeded prompt lists built from installed data packages.

Each workload is a named, deterministic list of user turns (the chat template of the
instruct model is applied when a prompt is tokenized: ``banditspec.text.prompt_ids(...,
chat=True)`` in process, the server's ``chat_template`` parameter through Triton).

* ``code``: HumanEval problems, "complete this function" (signature + docstring given).
* ``code-edit``: a HumanEval function *with* its canonical solution, and an instruction to
  rewrite / refactor / document it, so that the answer largely copies the input.
* ``chat``: first human turns of ShareGPT conversations from the evaluation split
  (``banditspec.datasets.sharegpt_split("eval")``), which Eagle training and the REST
  datastore never see; a turn that also occurs in the train split (ShareGPT has
  duplicates) is left out.
* ``mixed``: code, code-edit and chat prompts interleaved (its own shuffle of each source).
* ``multiturn`` (:func:`load_conversations`, not a prompt list): ShareGPT conversations of the
  evaluation split with two or more human turns; a benchmark sends turn k with turns 1..k-1
  and the model's OWN earlier answers as history.

Every workload comes in two content-disjoint splits, ``tune`` and ``heldout``
(:mod:`~banditspec_client.bench.splits`, recorded in ``splits.json``): a HumanEval function or
a ShareGPT conversation is in one split for every workload at once. The order of a list
depends only on ``seed`` and the split; ``load_workload(name, n)`` takes its first ``n``
prompts, so a shorter run is a prefix of a longer one.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from banditspec.checks import is_int
from banditspec.errors import BanditSpecValidationError

from banditspec_client.bench.splits import check_split, load_splits

if TYPE_CHECKING:
    from pathlib import Path

WORKLOADS: tuple[str, ...] = ("code", "code-edit", "chat", "mixed")
MULTITURN = "multiturn"  # conversations (load_conversations), not a list of single prompts
DEFAULT_SPLIT = "tune"
SINGLE_KINDS: tuple[str, ...] = ("code", "code-edit", "chat")
MIXED_SEED_OFFSET = 1_000  # mixed shuffles each source with its own seed

CODE_TEMPLATE = (
    "Complete the following Python function. Answer with the whole function in a code block.\n\n```python\n{code}```"
)
EDIT_TEMPLATES: tuple[str, ...] = (
    "Rewrite the following Python function with clearer variable names. Keep its behaviour. "
    "Answer with the whole rewritten function.\n\n```python\n{code}```",
    "Add type hints and comments to the following Python function. Answer with the whole function.\n\n```python\n{code}```",
    "Refactor the following Python function to be easier to read, without changing what it does. "
    "Show the complete refactored code.\n\n```python\n{code}```",
    "Add a line-by-line comment to the following Python function explaining what each step does. "
    "Return the full function.\n\n```python\n{code}```",
)
CHAT_MIN_CHARS, CHAT_MAX_CHARS = 24, 1500
CHAT_MIN_ASCII_SHARE = 0.95  # keep English-like text: the 135M model is English-only


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt.

    workload:  the list it belongs to ("code", "code-edit", "chat", "mixed")
    kind:      its source kind ("code", "code-edit", "chat"); equals workload except in mixed
    prompt_id: stable identifier, e.g. "HumanEval/12" or "sharegpt-eval/340"
    text:      the user turn (no chat template)
    """

    workload: str
    kind: str
    prompt_id: str
    text: str


def _code_prompts(split: str) -> list[tuple[str, str]]:
    from banditspec.datasets import humaneval_problems

    mine = load_splits().humaneval[split]
    return [(p["task_id"], CODE_TEMPLATE.format(code=p["prompt"])) for p in humaneval_problems() if p["task_id"] in mine]


def _code_edit_prompts(split: str) -> list[tuple[str, str]]:
    from banditspec.datasets import humaneval_problems

    mine = load_splits().humaneval[split]
    out = []
    for i, p in enumerate(humaneval_problems()):
        if p["task_id"] not in mine:
            continue
        template = EDIT_TEMPLATES[i % len(EDIT_TEMPLATES)]  # by the problem's index: the same for either split
        out.append((f"{p['task_id']}/edit", template.format(code=p["prompt"] + p["canonical_solution"])))
    return out


def _is_chat_prompt(text: str) -> bool:
    text = text.strip()
    if not CHAT_MIN_CHARS <= len(text) <= CHAT_MAX_CHARS:
        return False
    ascii_share = sum(ch.isascii() for ch in text) / len(text)
    return ascii_share >= CHAT_MIN_ASCII_SHARE


@functools.lru_cache(maxsize=1)
def _train_texts() -> frozenset[str]:
    """Every turn of the ShareGPT train split (Eagle's and REST's text), stripped."""
    from banditspec.datasets import sharegpt_split

    return frozenset(text.strip() for conversation in sharegpt_split("train") for _, text in conversation)


def _eval_conversations(split: str) -> list[tuple[int, tuple[tuple[str, str], ...]]]:
    """(index in the package's file, conversation) of the evaluation part, in ``split``."""
    from banditspec.datasets import sharegpt_conversations

    conversations = sharegpt_conversations()
    return [(i, conversations[i]) for i in sorted(load_splits().sharegpt[split])]


def _chat_prompts(split: str) -> list[tuple[str, str]]:
    # ShareGPT repeats some conversations: a first turn that also occurs anywhere in the
    # train split (Eagle's and REST's text) is left out, so no chat prompt was trained on.
    train_texts = _train_texts()
    out, seen = [], set()
    for index, conversation in _eval_conversations(split):
        role, text = conversation[0]
        if role != "human" or not _is_chat_prompt(text) or text.strip() in seen or text.strip() in train_texts:
            continue
        seen.add(text.strip())
        out.append((f"sharegpt/{index}", text.strip()))
    return out


_SOURCES = {"code": _code_prompts, "code-edit": _code_edit_prompts, "chat": _chat_prompts}


def _shuffled(kind: str, seed: int, split: str) -> list[tuple[str, str]]:
    items = _SOURCES[kind](split)
    random.Random(f"{kind}:{split}:{seed}").shuffle(items)
    return items


def load_workload(name: str, n: int | None = None, *, seed: int = 0, split: str = DEFAULT_SPLIT) -> list[Prompt]:
    """The first ``n`` prompts (all when None) of workload ``name`` in ``split`` ("tune" or
    "heldout"), in its fixed order."""
    check_split(split)
    if name not in WORKLOADS:
        hint = f" ({MULTITURN}: conversations, see load_conversations)" if name == MULTITURN else ""
        raise BanditSpecValidationError("workload", f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}{hint}")
    if n is not None and (not is_int(n) or n < 1):
        raise BanditSpecValidationError("prompts", f"must be an integer >= 1, got {n!r}")
    if name != "mixed":
        items = _shuffled(name, seed, split)[:n]
        return [Prompt(name, name, pid, text) for pid, text in items]
    sources = {kind: _shuffled(kind, seed + MIXED_SEED_OFFSET, split) for kind in SINGLE_KINDS}
    longest = max(len(items) for items in sources.values())
    mixed: list[Prompt] = []
    for i in range(longest):
        for kind in SINGLE_KINDS:
            if i < len(sources[kind]):
                pid, text = sources[kind][i]
                mixed.append(Prompt("mixed", kind, pid, text))
    return mixed[:n]


@dataclass(frozen=True)
class Conversation:
    """One multi-turn conversation of the ``multiturn`` workload.

    conversation_id: stable identifier, e.g. "sharegpt/3410" (its index in the package's file)
    turns:           the user turns, in order; the recorded answers are NOT used (a benchmark
                     puts the model's own answers between them)
    """

    conversation_id: str
    turns: tuple[str, ...]


# a conversation's user turns (the first MULTITURN_TURNS) may hold at most this many characters
# in all, so history plus answers stays well inside the target's context
MULTITURN_TURNS, MULTITURN_MAX_CHARS = 3, 3000


def _is_follow_up(text: str) -> bool:
    """A later human turn: any length up to the chat bound ("continue" is a real follow-up)."""
    text = text.strip()
    return 0 < len(text) <= CHAT_MAX_CHARS and sum(ch.isascii() for ch in text) / len(text) >= CHAT_MIN_ASCII_SHARE


def _conversations(split: str, turns: int) -> list[Conversation]:
    train_texts = _train_texts()
    out, seen = [], set()
    for index, conversation in _eval_conversations(split):
        roles = [role for role, _ in conversation]
        # human, gpt, human, gpt, ...: the recorded answers only mark where a turn ends
        if roles[: 2 * turns - 1] != ["human", "gpt"] * (turns - 1) + ["human"]:
            continue
        human = tuple(text.strip() for role, text in conversation[: 2 * turns - 1] if role == "human")
        if (not _is_chat_prompt(human[0]) or not all(_is_follow_up(t) for t in human[1:])
                or sum(map(len, human)) > MULTITURN_MAX_CHARS or human[0] in seen
                or any(t in train_texts for t in human)):
            continue
        seen.add(human[0])
        out.append(Conversation(f"sharegpt/{index}", human))
    return out


def load_conversations(n: int | None = None, *, turns: int = MULTITURN_TURNS, seed: int = 0,
                       split: str = DEFAULT_SPLIT) -> list[Conversation]:
    """The first ``n`` conversations (all when None) of the ``multiturn`` workload in ``split``:
    ShareGPT evaluation conversations with at least ``turns`` human turns, cut to their first
    ``turns``, in a fixed order (a shorter run is a prefix of a longer one)."""
    check_split(split)
    if n is not None and (not is_int(n) or n < 1):
        raise BanditSpecValidationError("prompts", f"must be an integer >= 1, got {n!r}")
    if not is_int(turns) or turns < 2:
        raise BanditSpecValidationError("turns", f"must be an integer >= 2, got {turns!r}")
    items = _conversations(split, turns)
    random.Random(f"{MULTITURN}:{split}:{turns}:{seed}").shuffle(items)
    return items[:n]


def load_prompts_file(path: str | Path) -> list[Prompt]:
    """A user's own prompts: a JSONL file of ``{"kind": "...", "prompt": "..."}`` lines
    (kind optional, default "user"); each kind becomes a workload."""
    import json
    from pathlib import Path

    prompts: list[Prompt] = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BanditSpecValidationError("prompts_file", f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            raise BanditSpecValidationError("prompts_file", f'{path}:{number}: expected {{"kind": ..., "prompt": "..."}}')
        kind = str(item.get("kind") or "user")
        prompts.append(Prompt(kind, kind, f"{Path(path).name}:{number}", item["prompt"]))
    if not prompts:
        raise BanditSpecValidationError("prompts_file", f"{path}: no prompts")
    return prompts


def parse_workloads(text: str) -> list[str]:
    """``"code,chat"`` or ``"all"`` -> workload names, validated."""
    names = list(WORKLOADS) if text.strip() == "all" else [w.strip() for w in text.split(",") if w.strip()]
    if not names:
        raise BanditSpecValidationError("workload", "no workload given")
    for name in names:
        if name not in WORKLOADS:
            raise BanditSpecValidationError("workload", f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return names
