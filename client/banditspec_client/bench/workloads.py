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

The order of a list depends only on ``seed``; ``load_workload(name, n)`` takes its first
``n`` prompts, so a shorter run is a prefix of a longer one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from banditspec.checks import is_int
from banditspec.errors import BanditSpecValidationError

WORKLOADS: tuple[str, ...] = ("code", "code-edit", "chat", "mixed")
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


def _code_prompts() -> list[tuple[str, str]]:
    from banditspec.datasets import humaneval_problems

    return [(p["task_id"], CODE_TEMPLATE.format(code=p["prompt"])) for p in humaneval_problems()]


def _code_edit_prompts() -> list[tuple[str, str]]:
    from banditspec.datasets import humaneval_problems

    out = []
    for i, p in enumerate(humaneval_problems()):
        template = EDIT_TEMPLATES[i % len(EDIT_TEMPLATES)]
        out.append((f"{p['task_id']}/edit", template.format(code=p["prompt"] + p["canonical_solution"])))
    return out


def _is_chat_prompt(text: str) -> bool:
    text = text.strip()
    if not CHAT_MIN_CHARS <= len(text) <= CHAT_MAX_CHARS:
        return False
    ascii_share = sum(ch.isascii() for ch in text) / len(text)
    return ascii_share >= CHAT_MIN_ASCII_SHARE


def _chat_prompts() -> list[tuple[str, str]]:
    from banditspec.datasets import sharegpt_split

    # ShareGPT repeats some conversations: a first turn that also occurs anywhere in the
    # train split (Eagle's and REST's text) is left out, so no chat prompt was trained on.
    train_texts = {text.strip() for conversation in sharegpt_split("train") for _, text in conversation}
    out, seen = [], set()
    for i, conversation in enumerate(sharegpt_split("eval")):
        role, text = conversation[0]
        if role != "human" or not _is_chat_prompt(text) or text.strip() in seen or text.strip() in train_texts:
            continue
        seen.add(text.strip())
        out.append((f"sharegpt-eval/{i}", text.strip()))
    return out


_SOURCES = {"code": _code_prompts, "code-edit": _code_edit_prompts, "chat": _chat_prompts}


def _shuffled(kind: str, seed: int) -> list[tuple[str, str]]:
    items = _SOURCES[kind]()
    random.Random(f"{kind}:{seed}").shuffle(items)
    return items


def load_workload(name: str, n: int | None = None, *, seed: int = 0) -> list[Prompt]:
    """The first ``n`` prompts (all when None) of workload ``name``, in its fixed order."""
    if name not in WORKLOADS:
        raise BanditSpecValidationError("workload", f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    if n is not None and (not is_int(n) or n < 1):
        raise BanditSpecValidationError("prompts", f"must be an integer >= 1, got {n!r}")
    if name != "mixed":
        items = _shuffled(name, seed)[:n]
        return [Prompt(name, name, pid, text) for pid, text in items]
    sources = {kind: _shuffled(kind, seed + MIXED_SEED_OFFSET) for kind in SINGLE_KINDS}
    longest = max(len(items) for items in sources.values())
    mixed: list[Prompt] = []
    for i in range(longest):
        for kind in SINGLE_KINDS:
            if i < len(sources[kind]):
                pid, text = sources[kind][i]
                mixed.append(Prompt("mixed", kind, pid, text))
    return mixed[:n]


def load_prompts_file(path) -> list[Prompt]:
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
