"""What a benchmark compares (methods) and what one measured run records.

Method names (``--methods``):

* ``vanilla``: plain decoding (policy ``vanilla``);
* ``pld`` | ``suffix`` | ``rest`` | ``eagle`` (optionally ``@GAMMA``): one fixed arm
  (policy ``fixed:<arm>``) drafting L tokens (or GAMMA);
* ``costaware`` | ``ucbspec`` | ``exp3spec`` (optionally ``@L`` and ``:accepted`` or
  ``:throughput``, the reward; without them ``--max-draft-len`` and ``--reward`` decide):
  the adaptive policy over every drafter arm the stack serves, each at L (``costaware@4``
  and ``costaware@8`` compare two ceilings side by side in one run).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from banditspec.bandits.registry import ADAPTIVE_POLICIES
from banditspec.config import MAX_SPECULATION_LENGTH, REWARD_CHOICES, VANILLA_ARM, split_arm
from banditspec.drafters.registry import ARM_DRAFTERS
from banditspec.errors import BanditSpecValidationError

FIXED_DRAFTERS: tuple[str, ...] = ARM_DRAFTERS  # every arm the default may use: "best fixed" is over all of them
VANILLA = VANILLA_ARM
DEFAULT_METHODS = ",".join((VANILLA, *FIXED_DRAFTERS, *ADAPTIVE_POLICIES))


@dataclass(frozen=True)
class Method:
    """One compared configuration.

    name:    the label in tables and plots, e.g. "pld", "ucbspec", "ucbspec:throughput"
    policy:  the request's policy: "vanilla", "fixed:pld" (or "fixed:pld@2"), "ucbspec", ...
    drafter: the drafter a fixed arm needs ("" for vanilla and adaptive methods)
    reward:  the request's reward ("accepted" | "throughput"); only adaptive methods learn from it
    max_draft_len: the request's L for an adaptive method named with ``@L`` (None: the run's)
    """

    name: str
    policy: str
    drafter: str = ""
    reward: str = "accepted"
    max_draft_len: int | None = None

    def draft_len(self, run_max_draft_len: int) -> int:
        """The L this method's requests ask for: its own ``@L``, else the run's."""
        return self.max_draft_len or run_max_draft_len

    @property
    def adaptive(self) -> bool:
        return self.policy in ADAPTIVE_POLICIES

    @property
    def fixed_arm(self) -> bool:
        return self.policy.startswith("fixed:")

    @property
    def needs_suffix_state(self) -> bool:
        """True when the method's requests feed the suffix drafter's global trie of past
        outputs (its results then depend on what ran before it on the same drafter)."""
        return self.adaptive or self.drafter == "suffix"


def _parse_one(text: str, reward: str) -> list[Method]:
    if text == VANILLA:
        return [Method(VANILLA, VANILLA)]
    head, _, method_reward = text.partition(":")
    policy, length = split_arm(head)
    at = "@" in head
    if policy in ADAPTIVE_POLICIES:
        if method_reward and method_reward not in REWARD_CHOICES:
            raise BanditSpecValidationError("methods", f"{text!r}: reward must be one of {REWARD_CHOICES}")
        if at and not (length.isdigit() and 1 <= int(length) <= MAX_SPECULATION_LENGTH):
            raise BanditSpecValidationError(
                "methods", f"{text!r}: L must be an integer in 1..{MAX_SPECULATION_LENGTH}")
        rewards = [method_reward] if method_reward else (list(REWARD_CHOICES) if reward == "both" else [reward])
        named = bool(method_reward) or reward == "both"
        limit = int(length) if at else None
        return [Method(f"{head}:{r}" if named else head, policy, "", r, limit) for r in rewards]
    drafter, gamma = split_arm(text)
    if drafter not in FIXED_DRAFTERS or method_reward:
        raise BanditSpecValidationError(
            "methods",
            f"unknown method {text!r}; use vanilla, {', '.join(FIXED_DRAFTERS)} (optionally @GAMMA) "
            f"or {', '.join(ADAPTIVE_POLICIES)} (optionally :accepted|:throughput)",
        )
    if gamma and not gamma.isdigit():
        raise BanditSpecValidationError("methods", f"{text!r}: the speculation length must be an integer")
    return [Method(text, f"fixed:{text}", drafter)]


def parse_methods(text: str, reward: str = "accepted") -> list[Method]:
    """``"vanilla,pld,ucbspec"`` -> methods; ``reward`` is accepted | throughput | both."""
    if reward not in (*REWARD_CHOICES, "both"):
        raise BanditSpecValidationError("reward", f"must be one of {', '.join(REWARD_CHOICES)} or both")
    methods: list[Method] = []
    for item in (t.strip() for t in text.split(",")):
        if item:
            methods.extend(_parse_one(item, reward))
    if not methods:
        raise BanditSpecValidationError("methods", "no method given")
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise BanditSpecValidationError("methods", "a method is listed twice")
    return methods


def rotated(methods: Sequence[Method], index: int) -> list[Method]:
    """The run order for prompt ``index``: the list rotated by ``index`` places, so that
    every method runs first, second, ... equally often and drift hits them alike."""
    if not methods:
        return []
    k = index % len(methods)
    return list(methods[k:]) + list(methods[:k])


def digest(values: Sequence[int] | str) -> str:
    """A short fingerprint of an output (token ids or text) for the losslessness check."""
    data = values.encode("utf-8") if isinstance(values, str) else ",".join(map(str, values)).encode()
    return hashlib.sha1(data).hexdigest()[:16]


@dataclass
class RunRecord:
    """One method on one prompt.

    seconds:  wall time of the request (in process: the decoding loop, tokenization excluded;
              through Triton: the client's request round trip)
    cpu_seconds: CPU time spent meanwhile by this process (in process) or by the server's
              processes (through Triton); unlike wall time, other load on the machine barely
              changes it
    arms, drafted, accepted, step_ms, verify_ms: per step, as in the request's speculation stats
    target_compute_ms, target_calls: through Triton, the target's own compute (see the field)
    """

    workload: str
    kind: str
    prompt_id: str
    method: str
    generated_tokens: int
    seconds: float
    steps: int
    output_digest: str
    finish_reason: str = ""
    cpu_seconds: float | None = None  # CPU time of the serving process(es) during the request
    arms: list[str] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    # through Triton: the target model's own compute during the request (its stub's execute
    # time, from Triton's statistics) and its executions; None in process
    target_compute_ms: float | None = None
    target_calls: int | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        return self.generated_tokens / self.steps if self.steps else 0.0

    @classmethod
    def from_stats(cls, *, workload: str, kind: str, prompt_id: str, method: str, seconds: float,
                   output_digest: str, stats: dict, cpu_seconds: float | None = None) -> RunRecord:
        """From a ``SpeculationStats.as_dict()`` (plus ``finish_reason`` when present)."""
        return cls(
            workload=workload,
            kind=kind,
            prompt_id=prompt_id,
            method=method,
            generated_tokens=int(stats.get("generated_tokens", 0)),
            seconds=float(seconds),
            cpu_seconds=None if cpu_seconds is None else float(cpu_seconds),
            steps=int(stats.get("steps", 0)),
            output_digest=output_digest,
            finish_reason=str(stats.get("finish_reason", "")),
            arms=[str(a) for a in stats.get("arms", [])],
            drafted=[int(d) for d in stats.get("drafted", [])],
            accepted=[int(a) for a in stats.get("accepted", [])],
            step_ms=[float(t) for t in stats.get("step_ms", [])],
            verify_ms=[float(t) for t in stats.get("verify_ms", [])],
        )
