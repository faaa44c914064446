"""The tuning / held-out split of every benchmark workload, by content, recorded in ONE file.

``splits.json`` (beside this module, committed) says for each source unit which split it is in:

* HumanEval: a function (``task_id``). ``code`` and ``code-edit`` are both built from HumanEval
  functions, so a function is in ``tune`` or in ``heldout`` for both workloads at once;
* ShareGPT: a conversation of the evaluation part (``banditspec.datasets.sharegpt_split("eval")``,
  which no drafter is built from), by its index in the package's file. ``chat`` uses its first
  turn, ``multiturn`` its turns; conversations that share the text of any substantial human turn
  (ShareGPT repeats conversations, and people paste the same request twice) are one group and
  land in the same split, so no such text is in both.

The rule (:func:`build_splits`) is deterministic: a group goes to ``heldout`` when the first byte
of ``sha256(SALT + key)`` is odd (key: the task id, or the group's smallest turn text), else to
``tune`` (about half each). ``mixed`` interleaves the split's own ``code``, ``code-edit`` and
``chat`` prompts. Every benchmark and replay reads the file (:func:`load_splits`) and names the
split it ran in its output. ``python -m banditspec_client.bench.splits`` rewrites the file from
the installed packages; ``tests/unit/test_splits.py`` checks that it is what the rule builds and
that no content is in both splits.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from banditspec.errors import BanditSpecValidationError

SPLITS: tuple[str, ...] = ("tune", "heldout")
SPLIT_FILE = Path(__file__).with_name("splits.json")
SALT = "banditspec-split-v1:"
# A human turn this long or longer is content (a request someone wrote); shorter ones ("continue",
# "go on", "thanks") are shared phrases and do not tie conversations together.
CONTENT_MIN_CHARS = 24


@dataclass(frozen=True)
class Splits:
    """humaneval: split -> task ids; sharegpt: split -> conversation indices (in the package's file)."""

    humaneval: dict[str, frozenset[str]]
    sharegpt: dict[str, frozenset[int]]

    def split_of_function(self, task_id: str) -> str | None:
        return next((s for s in SPLITS if task_id in self.humaneval[s]), None)

    def split_of_conversation(self, index: int) -> str | None:
        return next((s for s in SPLITS if index in self.sharegpt[s]), None)


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise BanditSpecValidationError("split", f"must be one of {', '.join(SPLITS)}, got {split!r}")
    return split


def _side(key: str) -> str:
    return "heldout" if hashlib.sha256((SALT + key).encode("utf-8")).digest()[0] % 2 else "tune"


def content_turns(conversation: Iterable[tuple[str, str]]) -> set[str]:
    """The substantial human turns of a conversation, stripped: the text that identifies it."""
    return {text.strip() for role, text in conversation if role == "human" and len(text.strip()) >= CONTENT_MIN_CHARS}


def build_splits() -> dict:
    """The split from the installed data packages, by the rule above (the content of splits.json)."""
    from banditspec.datasets import EVAL_EVERY, humaneval_problems, sharegpt_conversations

    functions: dict[str, list[str]] = {"tune": [], "heldout": []}
    for problem in humaneval_problems():
        functions[_side(problem["task_id"])].append(problem["task_id"])
    conversations = sharegpt_conversations()
    indices = list(range(0, len(conversations), EVAL_EVERY))  # the evaluation part (sharegpt_split("eval"))
    # union-find over conversations that share a substantial human turn
    parent = {i: i for i in indices}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i in indices:
        for text in content_turns(conversations[i]):
            if text in owner:
                parent[find(i)] = find(owner[text])
            else:
                owner[text] = i
    groups: dict[int, list[int]] = {}
    for i in indices:
        groups.setdefault(find(i), []).append(i)
    chats: dict[str, list[int]] = {"tune": [], "heldout": []}
    for members in groups.values():
        texts = sorted(t for i in members for t in content_turns(conversations[i]))
        key = texts[0] if texts else f"sharegpt/{min(members)}"
        chats[_side(key)].extend(members)
    return {
        "about": "Tuning / held-out split of the benchmark workloads, by content (banditspec_client/bench/splits.py "
                 "says the rule; python -m banditspec_client.bench.splits rewrites this file).",
        "salt": SALT,
        "humaneval": {s: sorted(functions[s], key=lambda t: int(t.rsplit("/", 1)[1])) for s in SPLITS},
        "sharegpt": {s: sorted(chats[s]) for s in SPLITS},
    }


@functools.lru_cache(maxsize=1)
def load_splits(path: Path = SPLIT_FILE) -> Splits:
    """The committed split (the one file every benchmark and replay reads)."""
    data = json.loads(Path(path).read_text())
    return Splits(humaneval={s: frozenset(data["humaneval"][s]) for s in SPLITS},
                  sharegpt={s: frozenset(int(i) for i in data["sharegpt"][s]) for s in SPLITS})


def write_split_file(path: Path = SPLIT_FILE) -> Path:
    data = build_splits()
    # one line per list: small, and a diff shows which unit moved
    lines = [f'"about":{json.dumps(data["about"])}', f'"salt":{json.dumps(data["salt"])}']
    for source in ("humaneval", "sharegpt"):
        parts = [f'{json.dumps(s)}:{json.dumps(data[source][s], separators=(",", ":"))}' for s in SPLITS]
        lines.append(f'"{source}":{{\n' + ",\n".join(parts) + "}")
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    return path


SPLIT_FILE_NAME = "banditspec_client/bench/splits.json"


def describe(split: str) -> str:
    """What benchmark and replay outputs say about their prompts' split."""
    return f"{split} (content-disjoint split: {SPLIT_FILE_NAME})"


if __name__ == "__main__":
    print(write_split_file())
