"""The one runner interface of the benchmarks: prompts and a method in, one record per prompt out.

A :class:`Runner` runs a :class:`~banditspec_client.bench.methods.Method` on a
:class:`~banditspec_client.bench.workloads.Prompt` under its :class:`RunSettings` and returns a
:class:`~banditspec_client.bench.methods.RunRecord`. Two implement it:
:class:`~banditspec_client.bench.in_process.InProcessRunner` (the reference engine and the drafters
in this process) and :class:`~banditspec_client.bench.through_triton.TritonRunner` (a real
tritonserver, gRPC requests). :func:`run_interleaved` runs a prompt list with every method.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from banditspec.config import DEFAULT_MAX_DRAFT_LEN

from banditspec_client.bench.methods import FIXED_DRAFTERS, Method, RunRecord, rotated
from banditspec_client.bench.workloads import Prompt


@dataclass(frozen=True)
class RunSettings:
    """What every request of a run shares.

    model:              target model ("smollm2" | "tiny")
    max_draft_len:      L: fixed arms draft L tokens (or their @GAMMA), adaptive arms up to L
    seed:               the requests' seed
    temperature:        the requests' sampling temperature (0: greedy)
    threads:            torch threads of the target (through Triton: its ``torch_threads``; in
                        process the command sets them for its own process)
    adaptive_drafters:  drafters the adaptive methods may choose among (those the stack serves)
    """

    model: str = "smollm2"
    max_draft_len: int = DEFAULT_MAX_DRAFT_LEN
    seed: int = 0
    temperature: float = 0.0
    threads: int = 1
    adaptive_drafters: tuple[str, ...] = FIXED_DRAFTERS


class Runner(Protocol):
    """Runs (prompt, method) pairs; records what each request produced and how long it took."""

    label: str  # "in-process" | "triton": the mode named in reports
    settings: RunSettings

    @property
    def adaptive_arms(self) -> list[str]:
        """The adaptive methods' arm set: the wanted drafters this stack serves."""
        ...

    def available(self, methods: Sequence[Method]) -> tuple[list[Method], dict[str, str]]:
        """(methods this stack can run, {skipped method: reason})."""
        ...

    def run(self, prompt: Prompt, method: Method, max_tokens: int) -> RunRecord:
        """One request: ``prompt`` with ``method``, at most ``max_tokens`` tokens."""
        ...

    def close(self) -> None:
        ...


def split_available(methods: Sequence[Method], unserved: Callable[[str], str | None], adaptive_arms: Sequence[str],
                    no_arms: str) -> tuple[list[Method], dict[str, str]]:
    """(methods a stack can run, {skipped method: reason}); ``unserved(drafter)``: why the
    stack cannot serve a fixed arm's drafter (None: it can); ``no_arms``: why an adaptive
    method is skipped when the stack serves no drafter for it."""
    usable, skipped = [], {}
    for method in methods:
        why = unserved(method.drafter) if method.fixed_arm else None
        if why is not None:
            skipped[method.name] = why
        elif method.adaptive and not adaptive_arms:
            skipped[method.name] = no_arms
        else:
            usable.append(method)
    return usable, skipped


def run_interleaved(runner: Runner, prompts: Sequence[Prompt], methods: Sequence[Method], max_tokens: int,
                    progress: Any = None) -> list[RunRecord]:
    """Every method on every prompt, the method order rotated per prompt (see
    :func:`~banditspec_client.bench.methods.rotated`); ``progress``: a tqdm bar or None."""
    records = []
    for index, prompt in enumerate(prompts):
        for method in rotated(methods, index):
            records.append(runner.run(prompt, method, max_tokens))
            if progress is not None:
                progress.set_postfix_str(f"{prompt.workload} {prompt.prompt_id} {method.name}", refresh=False)
                progress.update(1)
    return records
