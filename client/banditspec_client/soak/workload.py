"""The soak's workload: a seeded mix of good, cancelled and invalid requests."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from banditspec_client.triton_client import GenerationOptions

PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Rewrite this function with type hints and keep the body unchanged:\n\n"
    "def area(width, height):\n    return width * height\n",
    "What are two good habits for writing clean code?",
    "Summarise in one sentence: the cache keeps the keys and values of recent sequences.",
    "List three prime numbers and explain why they are prime.",
    "Translate to French: the weather is nice today.",
)
GOOD_POLICIES = ("ucbspec", "exp3spec", "uniform", "vanilla", "fixed:pld", "fixed:suffix")
DETERMINISTIC_POLICY = "fixed:pld"  # per-request drafter: its acceptance must repeat exactly
# (options that a server must reject, the field its message must start with)
INVALID_CASES: tuple[tuple[dict[str, Any], str], ...] = (
    (dict(max_tokens=0), "max_tokens"),
    (dict(policy="best"), "policy"),
    (dict(arms=["magic"]), "arms"),
    (dict(max_draft_len=99), "max_draft_len"),
    (dict(temperature=-1.0), "temperature"),
    (dict(stop_words=[f"w{i}" for i in range(40)]), "stop_words"),
)


@dataclass(frozen=True)
class SoakCase:
    kind: str  # "good" | "cancel" | "invalid"
    prompt: str
    options: GenerationOptions
    protocol: str = "grpc"  # "grpc" | "http"
    cancel_after: int | None = None  # responses before the client cancels
    bad_field: str | None = None  # for "invalid": the field the error must name


def build_workload(n: int, *, seed: int = 0, cancel_share: float = 0.1, invalid_share: float = 0.1,
                   max_tokens: tuple[int, ...] = (8, 16, 24, 32, 40), cancel_max_tokens: int = 200) -> list[SoakCase]:
    """``n`` cases in a seeded random order; good requests draw their max_tokens from
    ``max_tokens`` (few distinct values: the references are computed once per value)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        prompt = rng.choice(PROMPTS)
        draw = rng.random()
        if draw < invalid_share:
            options, bad_field = rng.choice(INVALID_CASES)
            opts = GenerationOptions(**{"max_tokens": 8, **options})
            cases.append(SoakCase("invalid", prompt, opts, rng.choice(["grpc", "http"]), bad_field=bad_field))
        elif draw < invalid_share + cancel_share:
            opts = GenerationOptions(max_tokens=cancel_max_tokens, stream=True, policy=rng.choice(GOOD_POLICIES))
            cases.append(SoakCase("cancel", prompt, opts, "grpc", cancel_after=rng.randint(1, 3)))
        else:
            policy = rng.choice(GOOD_POLICIES)
            deterministic = policy == DETERMINISTIC_POLICY  # repeats of one setting, for the drift check
            stop = (".",) if rng.random() < 0.15 and not deterministic else ()
            opts = GenerationOptions(
                max_tokens=max_tokens[-1] if deterministic else rng.choice(max_tokens),
                stream=rng.random() < 0.4,
                policy=policy,
                stop_words=stop,
            )
            cases.append(SoakCase("good", prompt, opts, "http" if rng.random() < 0.2 else "grpc"))
    return cases
